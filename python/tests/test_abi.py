"""The ctypes structs of moea2a/_capi.py against moea2a.h: a C program compiled here
prints every struct's size and every field's offset."""
import ctypes
import os
import subprocess
import tempfile

import pytest

from moea2a import _capi as C

STRUCTS = {"moea2a_config_t": C.Config, "moea2a_payload_desc_t": C.PayloadDesc, "moea2a_wire_t": C.Wire,
           "moea2a_moe_config_t": C.MoeConfig, "moea2a_moe_workspace_sizes_t": C.WorkspaceSizes,
           "moea2a_dispatch_result_t": C.DispatchResult, "moea2a_unique_id_t": C.UniqueId,
           "moea2a_expert_gemm_t": C.ExpertGemm, "moea2a_comm_traffic_t": C.Traffic}
# moea2a_moe_config_t.flags, as moea2a/_capi.py spells them without the MOEA2A_ prefix
FLAGS = ["MOE_NO_SANITIZE", "MOE_REWRITE_NONLOCAL", "MOE_CARRY_WEIGHTS", "MOE_NO_NVLINK", "MOE_WEIGHTED_COMBINE",
         "MOE_ZERO_PADDING", "MOE_HOST_EXPERT_COUNTS", "MOE_COPY_ENGINE"]


def c_layout():
    inc = os.environ.get("MOEA2A_INCLUDE", "")
    if not inc:
        pytest.skip("MOEA2A_INCLUDE (the directories holding moea2a.h and moea2a_version.h) is not set")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "moea2a.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("{cname} SIZEOF %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    for name in FLAGS:
        lines.append(f'printf("FLAG {name} %lu\\n", (unsigned long)MOEA2A_{name});')
    lines.append("return 0; }")
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        open(src, "w").write("\n".join(lines))
        cmd = [os.environ.get("CC", "cc"), src, "-o", exe] + [f"-I{p}" for p in inc.split(":") if p]
        subprocess.run(cmd, check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return {tuple(l.split()[:2]): int(l.split()[2]) for l in out.splitlines()}


def test_struct_layouts_match_the_header():
    layout = c_layout()
    for cname, cls in STRUCTS.items():
        assert ctypes.sizeof(cls) == layout[(cname, "SIZEOF")], cname
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == layout[(cname, field)], f"{cname}.{field}"


def test_flags_match_the_header():
    layout = c_layout()
    for name in FLAGS:
        assert getattr(C, name) == layout[("FLAG", name)], name

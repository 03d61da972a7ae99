"""The C API of libmoea2a through ctypes: the structs of moea2a.h, field for field,
and the prototypes of the functions this package calls. tests/test_abi.py compiles a
C program against moea2a.h and checks every size and offset here against it."""
import ctypes
import ctypes.util
import os
import subprocess

MAX_PAYLOADS = 8
UNIQUE_ID_BYTES = 128

# moea2a_datatype_t
INT8, UINT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT8_E4M3, NVFP4 = range(9)
DTYPES = {"int8": INT8, "uint8": UINT8, "int32": INT32, "int64": INT64, "fp16": FLOAT16, "bf16": BFLOAT16,
          "fp32": FLOAT32, "fp8_e4m3": FLOAT8_E4M3, "nvfp4": NVFP4}
# moea2a_memory_t, moea2a_placement_t
MEMORY_AUTO, MEMORY_HOST, MEMORY_CUDA = 0, 1, 2
PLACEMENT_CONTIGUOUS, PLACEMENT_MAP = 0, 1
# moea2a_moe_config_t.flags
MOE_NO_SANITIZE, MOE_REWRITE_NONLOCAL, MOE_CARRY_WEIGHTS, MOE_NO_NVLINK = 1, 2, 4, 8
MOE_WEIGHTED_COMBINE, MOE_ZERO_PADDING, MOE_HOST_EXPERT_COUNTS, MOE_COPY_ENGINE = 16, 32, 64, 128
MOE_EXPERT_WIRE_SCALES = 256
MOE_EXPERT_LOAD = 512
MOE_GENERAL_PLACEMENT = 1024
LAYOUT_RANK_MAJOR, LAYOUT_EXPERT_MAJOR = 0, 1
# quantize on dispatch and the scale layouts
WIRE_AS_IS, WIRE_FP8, WIRE_NVFP4 = 0, 1, 2
FP8_SCALES_ROW_MAJOR, FP8_SCALES_MN_MAJOR = 0, 1
FP8_UE8M0 = 1
SF_LINEAR, SF_128X4, SF_8X4 = 0, 1, 2
# the FP4 expert GEMM (moea2a_expert(3))
GEMM_ROWS_EXPERT_MAJOR, GEMM_ROWS_RANK_MAJOR = 0, 1
GEMM_SWIGLU = 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class Traffic(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint),
                ("host_same_node", ctypes.c_int64), ("host_other_nodes", ctypes.c_int64),
                ("cuda_same_node", ctypes.c_int64), ("cuda_other_nodes", ctypes.c_int64)]


class Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint), ("timeout_s", ctypes.c_double),
                ("transport", ctypes.c_char_p), ("cuda_device", ctypes.c_int)]


class PayloadDesc(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("elems_per_token", ctypes.c_size_t)]


class Wire(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("scale_layout", ctypes.c_int), ("flags", ctypes.c_uint)]


class MoeConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint), ("num_experts", ctypes.c_int),
                ("top_k", ctypes.c_int), ("max_tokens_per_rank", ctypes.c_int), ("num_payloads", ctypes.c_int),
                ("payloads", PayloadDesc * MAX_PAYLOADS), ("combine_dtype", ctypes.c_int), ("hidden", ctypes.c_size_t),
                ("invalid_expert_id", ctypes.c_int32), ("placement", ctypes.c_int),
                ("expert_to_rank", ctypes.POINTER(ctypes.c_int32)), ("flags", ctypes.c_uint), ("memory", ctypes.c_int),
                ("num_sms", ctypes.c_int), ("wire", Wire * MAX_PAYLOADS),
                ("layout", ctypes.c_int), ("expert_alignment", ctypes.c_int), ("max_expert_rows", ctypes.c_int64),
                ("combine_wire", Wire), ("max_local_experts", ctypes.c_int)]


class WorkspaceSizes(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint), ("workspace_bytes", ctypes.c_size_t),
                ("staging_bytes", ctypes.c_size_t), ("device_bytes", ctypes.c_size_t),
                ("pinned_host_bytes", ctypes.c_size_t), ("host_bytes", ctypes.c_size_t), ("total_bytes", ctypes.c_size_t),
                ("aux_bytes", ctypes.c_size_t), ("payload_bytes", ctypes.c_size_t * MAX_PAYLOADS),
                ("ids_bytes", ctypes.c_size_t), ("weights_bytes", ctypes.c_size_t), ("combine_bytes", ctypes.c_size_t),
                ("record_bytes", ctypes.c_size_t), ("staged_peers", ctypes.c_int), ("nvlink_peers", ctypes.c_int),
                ("numa_node", ctypes.c_int), ("gpu", ctypes.c_int), ("nic", ctypes.c_char * 32),
                ("expert_bytes", ctypes.c_size_t)]


class ExpertGemm(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint), ("num_experts", ctypes.c_int),
                ("n", ctypes.c_size_t),
                ("k", ctypes.c_size_t), ("rows_layout", ctypes.c_int), ("flags", ctypes.c_uint),
                ("a", ctypes.c_void_p), ("lda", ctypes.c_size_t), ("rows", ctypes.c_int64),
                ("counts", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("ids", ctypes.c_void_p),
                ("slots", ctypes.c_int), ("first_expert", ctypes.c_int32), ("w", ctypes.c_void_p),
                ("w_scales", ctypes.c_void_p), ("w_global", ctypes.c_void_p), ("c", ctypes.c_void_p),
                ("c_type", ctypes.c_int), ("ldc", ctypes.c_size_t), ("workspace", ctypes.c_void_p),
                ("workspace_size", ctypes.c_size_t)]


class DispatchResult(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint), ("ep", ctypes.c_int), ("stride", ctypes.c_int),
                ("top_k", ctypes.c_int), ("recv_counts", ctypes.POINTER(ctypes.c_int32)),
                ("payloads", ctypes.c_void_p * MAX_PAYLOADS), ("payload_row_bytes", ctypes.c_size_t * MAX_PAYLOADS),
                ("topk_ids", ctypes.POINTER(ctypes.c_int32)), ("topk_weights", ctypes.POINTER(ctypes.c_float)),
                ("src_token_index", ctypes.POINTER(ctypes.c_int32)), ("total_recv", ctypes.c_int64),
                ("invalid_entries", ctypes.c_int64), ("sent_rows", ctypes.c_int64), ("deduplicated", ctypes.c_int64),
                ("device_stats", ctypes.POINTER(ctypes.c_int64)), ("nvlink", ctypes.c_int),
                ("internode_rows", ctypes.c_int64), ("internode_bytes", ctypes.c_int64),
                ("payload_scales", ctypes.c_void_p * MAX_PAYLOADS),
                ("payload_scale_bytes", ctypes.c_size_t * MAX_PAYLOADS),
                ("payload_global_scales", ctypes.POINTER(ctypes.c_float) * MAX_PAYLOADS),
                ("num_local_experts", ctypes.c_int), ("expert_counts", ctypes.POINTER(ctypes.c_int32)),
                ("expert_offsets", ctypes.POINTER(ctypes.c_int32)), ("expert_rows", ctypes.c_int64),
                ("expert_payloads", ctypes.c_void_p * MAX_PAYLOADS), ("expert_ids", ctypes.POINTER(ctypes.c_int32)),
                ("expert_src_rank", ctypes.POINTER(ctypes.c_int32)), ("expert_src_token", ctypes.POINTER(ctypes.c_int32)),
                ("expert_topk_slot", ctypes.POINTER(ctypes.c_int32)), ("expert_weights", ctypes.POINTER(ctypes.c_float)),
                ("expert_counts_host", ctypes.POINTER(ctypes.c_int32)),
                ("expert_offsets_host", ctypes.POINTER(ctypes.c_int32)),
                ("expert_payload_scales", ctypes.c_void_p * MAX_PAYLOADS),
                ("expert_global_scales", ctypes.POINTER(ctypes.c_float) * MAX_PAYLOADS),
                ("network_rows", ctypes.c_int64), ("network_bytes", ctypes.c_int64),
                ("dropped_entries", ctypes.c_int64), ("device_dropped", ctypes.POINTER(ctypes.c_int64))]


def _candidates():
    """Where libmoea2a is looked for: MOEA2A_LIBRARY (a file), MOEA2A_HOME/lib*, the
    libdir pkg-config names, then the dynamic loader's search."""
    if os.environ.get("MOEA2A_LIBRARY"):
        yield os.environ["MOEA2A_LIBRARY"]
    home = os.environ.get("MOEA2A_HOME")
    if home:
        for sub in ("lib", "lib64"):
            yield os.path.join(home, sub, "libmoea2a.so.1")
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "moea2a"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        if libdir:
            yield os.path.join(libdir, "libmoea2a.so.1")
    except (OSError, subprocess.SubprocessError):
        pass
    yield ctypes.util.find_library("moea2a") or "libmoea2a.so.1"


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise ImportError("moea2a: cannot load libmoea2a (set MOEA2A_LIBRARY or MOEA2A_HOME, or install it where "
                          "pkg-config finds it): " + "; ".join(errors))
    P, I, SZ, C = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    proto = {
        "moea2a_strerror": (C, [I]),
        "moea2a_last_error": (C, [P]),
        "moea2a_get_version": (I, [ctypes.POINTER(I)] * 3),
        "moea2a_get_build_config": (C, []),
        "moea2a_datatype_size": (I, [I, ctypes.POINTER(SZ)]),
        "moea2a_get_unique_id": (I, [ctypes.POINTER(UniqueId)]),
        "moea2a_comm_init_rank": (I, [ctypes.POINTER(P), I, UniqueId, I, ctypes.POINTER(Config)]),
        "moea2a_comm_init_env": (I, [ctypes.POINTER(P), ctypes.POINTER(Config)]),
        "moea2a_comm_destroy": (I, [P]),
        "moea2a_comm_abort": (I, [P]),
        "moea2a_comm_shrink": (I, [P, ctypes.POINTER(I), I, ctypes.POINTER(P)]),
        "moea2a_comm_grow": (I, [P, I, ctypes.POINTER(UniqueId), I, ctypes.POINTER(P)]),
        "moea2a_comm_rank": (I, [P, ctypes.POINTER(I)]),
        "moea2a_comm_size": (I, [P, ctypes.POINTER(I)]),
        "moea2a_comm_traffic": (I, [P, ctypes.POINTER(Traffic)]),
        "moea2a_moe_workspace_size": (I, [P, ctypes.POINTER(MoeConfig), ctypes.POINTER(WorkspaceSizes)]),
        "moea2a_moe_create": (I, [ctypes.POINTER(P), P, ctypes.POINTER(MoeConfig)]),
        "moea2a_moe_destroy": (I, [P]),
        "moea2a_moe_max_recv_rows": (I, [P, ctypes.POINTER(SZ)]),
        "moea2a_moe_set_placement": (I, [P, ctypes.POINTER(ctypes.c_int32), P]),
        "moea2a_moe_set_replicas": (I, [P, I, ctypes.POINTER(ctypes.c_int32), P]),
        "moea2a_moe_expert_load": (I, [P, ctypes.POINTER(ctypes.c_int64), I]),
        "moea2a_moe_retarget": (I, [P, P, ctypes.POINTER(ctypes.c_int32)]),
        "moea2a_moe_combine_buffer": (I, [P, ctypes.POINTER(P)]),
        "moea2a_dispatch": (I, [P, I, P, P, ctypes.POINTER(P), I, ctypes.POINTER(DispatchResult), P]),
        "moea2a_combine": (I, [P, P, P, P]),
        "moea2a_fp4_global_scale": (I, [P, I, SZ, P, P]),
        "moea2a_fp4_sf_bytes": (I, [I, SZ, SZ, ctypes.POINTER(SZ)]),
        "moea2a_fp4_quantize": (I, [P, I, SZ, SZ, P, P, P, I, P]),
        "moea2a_fp4_dequantize": (I, [P, P, I, P, SZ, SZ, P, I, P]),
        "moea2a_expert_gemm_workspace_size": (I, [ctypes.POINTER(ExpertGemm), ctypes.POINTER(SZ)]),
        "moea2a_expert_gemm": (I, [ctypes.POINTER(ExpertGemm), P]),
        "moea2a_fp8_scale_bytes": (I, [I, ctypes.c_uint, SZ, SZ, ctypes.POINTER(SZ)]),
        "moea2a_fp8_quantize": (I, [P, I, SZ, SZ, P, P, I, ctypes.c_uint, P]),
        "moea2a_fp8_dequantize": (I, [P, P, I, ctypes.c_uint, SZ, SZ, P, I, P]),
    }
    for name, (res, args) in proto.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib

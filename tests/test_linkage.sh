#!/bin/sh
# The core library links libc, libm, pthread, dl, rt and hwloc only, whatever configure
# found: CUDA, NCCL and UCX live in modules (the packaging issue: one core package for
# GPU and CPU-only nodes). The same test on the CUDA module shows it sees CUDA. And the
# public header's *_INITIALIZER macros compile clean as C and as C++, with -Wall -Wextra
# -Werror (-Wmissing-field-initializers among them). TAP.
build=${top_builddir:-.}
core="$build/lib/.libs/libmoea2a.so"
cudamod="$build/cuda/.libs/libmoea2a-cuda.so"
needed() { objdump -p "$1" 2>/dev/null | awk '$1 == "NEEDED" {print $2}'; }
# (the sanitizer runtimes of an instrumented build are the build's, not dependencies)
foreign() {
    needed "$1" | grep -vE '^(libc|libm|libpthread|libdl|librt)\.so\.[0-9]+$|^libhwloc\.so\.[0-9]+$|^ld-linux' |
        grep -vE '^lib(asan|ubsan|tsan|lsan)\.so\.[0-9]+$'
}
echo "1..4"
if [ ! -f "$core" ] || ! command -v objdump >/dev/null 2>&1; then
    echo "ok 1 # SKIP no shared library or no objdump"
else
    extra=$(foreign "$core" | tr '\n' ' ')
    [ -n "$(needed "$core")" ] && [ -z "$extra" ] && r=ok || r="not ok"
    echo "$r 1 - libmoea2a.so needs only libc, libm, pthread, dl, rt and hwloc ($(needed "$core" | tr '\n' ' '))${extra:+; also: $extra}"
fi
if [ -f "$cudamod" ]; then
    foreign "$cudamod" | grep -q '^libcudart\.so' && r=ok || r="not ok"
    echo "$r 2 - the same check finds the CUDA runtime in the CUDA module (it can fail)"
else
    echo "ok 2 # SKIP built without CUDA"
fi
src=${top_srcdir:-.}
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
cat >"$t/init.c" <<'EOC'
#include <moea2a.h>
int main(void)
{
    moea2a_config_t a = MOEA2A_CONFIG_INITIALIZER;
    moea2a_moe_config_t b = MOEA2A_MOE_CONFIG_INITIALIZER;
    moea2a_moe_workspace_sizes_t c = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_moe_layout_t e = MOEA2A_MOE_LAYOUT_INITIALIZER;
    moea2a_expert_gemm_t f = MOEA2A_EXPERT_GEMM_INITIALIZER;
    /* the documented defaults, the same in both languages */
    return !(a.size == sizeof(a) && a.timeout_s < 0 && a.cuda_device == -1 && b.invalid_expert_id == -1 &&
             b.combine_dtype == MOEA2A_BFLOAT16 && b.hidden == 0 && c.size == sizeof(c) && d.version == MOEA2A_VERSION_CODE &&
             e.ep == 1 && f.size == sizeof(f) && f.num_experts == 0);
}
EOC
cp "$t/init.c" "$t/init.cpp"
inc="-I$src/include -I$build/include"
if ${CC:-cc} -std=c99 -Wall -Wextra -Werror -pedantic $inc "$t/init.c" -o "$t/c" 2>"$t/c.log" && "$t/c"; then
    echo "ok 3 - the *_INITIALIZER macros compile clean as C99 with -Wall -Wextra -Werror -pedantic, defaults right"
else
    echo "not ok 3 - the *_INITIALIZER macros as C99: $(head -3 "$t/c.log" | tr '\n' ' ')"
fi
if ! command -v ${CXX:-c++} >/dev/null 2>&1; then
    echo "ok 4 # SKIP no C++ compiler"
elif ${CXX:-c++} -std=c++11 -Wall -Wextra -Werror -pedantic $inc "$t/init.cpp" -o "$t/cxx" 2>"$t/cxx.log" && "$t/cxx"; then
    echo "ok 4 - the *_INITIALIZER macros compile clean as C++11 with -Wall -Wextra -Werror -pedantic, defaults right"
else
    echo "not ok 4 - the *_INITIALIZER macros as C++11: $(head -3 "$t/cxx.log" | tr '\n' ' ')"
fi

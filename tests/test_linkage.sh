#!/bin/sh
# The core library links libc, libm, pthread, dl, rt and hwloc only, whatever configure
# found: CUDA, NCCL and UCX live in modules (the packaging issue: one core package for
# GPU and CPU-only nodes). The same test on the CUDA module shows it sees CUDA. TAP.
build=${top_builddir:-.}
core="$build/lib/.libs/libmoea2a.so"
cudamod="$build/cuda/.libs/libmoea2a-cuda.so"
needed() { objdump -p "$1" 2>/dev/null | awk '$1 == "NEEDED" {print $2}'; }
# (the sanitizer runtimes of an instrumented build are the build's, not dependencies)
foreign() {
    needed "$1" | grep -vE '^(libc|libm|libpthread|libdl|librt)\.so\.[0-9]+$|^libhwloc\.so\.[0-9]+$|^ld-linux' |
        grep -vE '^lib(asan|ubsan|tsan|lsan)\.so\.[0-9]+$'
}
echo "1..2"
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

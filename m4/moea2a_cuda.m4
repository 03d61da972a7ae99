# MOEA2A_CHECK_CUDA: --with-cuda[=DIR] and --with-cuda-arch=LIST.
# Finds the runtime (cuda_runtime.h + libcudart) with MOEA2A_WITH_PKG, then nvcc in
# DIR/bin (or next to the headers that were found, or on PATH). Sets NVCC,
# NVCC_ARCH_FLAGS, CUDA_VERSION_STR, CUDA_ARCHS and have_cuda.
AC_DEFUN([MOEA2A_CHECK_CUDA], [
MOEA2A_WITH_PKG([cuda], [], [cuda_runtime.h], [cudaPointerGetAttributes], [-lcudart],
                [/usr/local/cuda /opt/cuda])
AC_ARG_VAR([NVCC], [CUDA compiler])
AC_ARG_VAR([NVCCFLAGS], [extra flags for nvcc (after moea2a's own)])
AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST],
                    [compute capabilities to build for, e.g. "80 90" (default: 80 90, plus 100 when nvcc knows it; 90 is built as sm_90a with CUDA 12 or later)])],
    [], [with_cuda_arch=default])
CUDA_VERSION_STR=none; CUDA_ARCHS=none; NVCC_ARCH_FLAGS=""
AS_IF([test "x$have_cuda" = xyes], [
    moea2a_cuda_root=""
    AS_CASE(["$with_cuda"], [guess|yes], [], [moea2a_cuda_root="$with_cuda"])
    AS_IF([test -z "$moea2a_cuda_root"], [
        for moea2a_d in /usr/local/cuda /opt/cuda; do
            AS_IF([test -x "$moea2a_d/bin/nvcc"], [moea2a_cuda_root=$moea2a_d; break])
        done])
    AS_IF([test -z "$NVCC" && test -n "$moea2a_cuda_root" && test -x "$moea2a_cuda_root/bin/nvcc"],
          [NVCC="$moea2a_cuda_root/bin/nvcc"])
    AS_IF([test -z "$NVCC"], [AC_PATH_PROG([NVCC], [nvcc])])
    AS_IF([test -z "$NVCC"], [
        AS_IF([test "x$with_cuda" = xguess],
              [AC_MSG_WARN([CUDA headers found but no nvcc: building without CUDA]); have_cuda=no],
              [AC_MSG_ERROR([--with-cuda was requested but nvcc was not found (set NVCC=)])])])
])
AS_IF([test "x$have_cuda" = xyes], [
    MOEA2A_HEADER_INT([moea2a_cudart], [CUDART_VERSION], [cuda_runtime_api.h], [$CUDA_CPPFLAGS])
    AS_IF([test "x$moea2a_cudart" != xunknown],
          [CUDA_VERSION_STR="$(( moea2a_cudart / 1000 )).$(( (moea2a_cudart % 1000) / 10 ))"])
    AS_IF([test "x$with_cuda_arch" = xdefault], [
        CUDA_ARCHS="80 90"
        AS_IF([$NVCC --list-gpu-arch 2>/dev/null | grep -q 'compute_100$'], [CUDA_ARCHS="$CUDA_ARCHS 100"])
    ], [CUDA_ARCHS=`echo "$with_cuda_arch" | tr ',;' '  '`])
    # Hopper is built as sm_90a (CUDA 12 and later): the same GPUs, plus the warpgroup
    # MMA the FP4 expert GEMM uses there.
    moea2a_archs=$CUDA_ARCHS; CUDA_ARCHS=""
    for moea2a_a in $moea2a_archs; do
        AS_IF([test "x$moea2a_a" = x90 && test "x$moea2a_cudart" != xunknown && test "$moea2a_cudart" -ge 12000],
              [moea2a_a=90a])
        AS_IF([test "x$moea2a_a" = x90a],
              [AC_DEFINE([MOEA2A_HAVE_SM90A], [1], [CUDA kernels built for sm_90a (Hopper's wgmma)])])
        NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode=arch=compute_$moea2a_a,code=sm_$moea2a_a"
        CUDA_ARCHS="${CUDA_ARCHS:+$CUDA_ARCHS }$moea2a_a"
    done
    AC_DEFINE([MOEA2A_HAVE_CUDA], [1], [Built with CUDA])
    # CUPTI, for moea2a_perf's kernel times only: its headers at build time (with the
    # runtime's, or in extras/CUPTI), the library loaded at run time (no link dependency)
    moea2a_save_CPPFLAGS=$CPPFLAGS; CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
    AC_CHECK_HEADER([cupti.h], [have_cupti=yes], [have_cupti=no])
    CPPFLAGS=$moea2a_save_CPPFLAGS
    AS_IF([test "x$have_cupti" = xno && test -n "$moea2a_cuda_root" && test -f "$moea2a_cuda_root/extras/CUPTI/include/cupti.h"],
          [CUPTI_CPPFLAGS="-I$moea2a_cuda_root/extras/CUPTI/include"; have_cupti=yes])
    AS_IF([test "x$have_cupti" = xyes], [
        AC_DEFINE([MOEA2A_HAVE_CUPTI], [1], [CUPTI headers found (moea2a_perf's kernel times)])
        AC_DEFINE_UNQUOTED([MOEA2A_CUPTI_DIRS], ["${moea2a_cuda_root:+$moea2a_cuda_root/extras/CUPTI/lib64:$moea2a_cuda_root/lib64}"],
                           [where moea2a_perf looks for libcupti.so after the library path])])
])
AC_SUBST([CUPTI_CPPFLAGS])
AC_SUBST([NVCC_ARCH_FLAGS])
AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = xyes])
])

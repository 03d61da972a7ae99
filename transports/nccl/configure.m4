# NCCL transport: CUDA-memory collectives; needs CUDA.
AC_DEFUN([MOEA2A_TRANSPORT_NCCL_CONFIGURE], [
AS_IF([test "x$have_cuda" != xyes && test "x$with_nccl" != xno], [
    AS_CASE(["x$with_nccl"], [x|xguess], [with_nccl=no],
            [AC_MSG_ERROR([--with-nccl needs CUDA (see --with-cuda)])])])
MOEA2A_WITH_PKG([nccl], [nccl], [nccl.h], [ncclCommInitRank], [-lnccl],
                [/usr/local/cuda /usr/local/nccl /opt/nccl], [$CUDA_CPPFLAGS])
NCCL_VERSION_STR=none
AS_IF([test "x$have_nccl" = xyes], [
    MOEA2A_HEADER_INT([moea2a_nccl_code], [NCCL_VERSION_CODE], [nccl.h], [$NCCL_CPPFLAGS $CUDA_CPPFLAGS])
    AS_IF([test "x$moea2a_nccl_code" != xunknown],
          [NCCL_VERSION_STR="$(( moea2a_nccl_code / 10000 )).$(( (moea2a_nccl_code % 10000) / 100 )).$(( moea2a_nccl_code % 100 ))"])
    moea2a_transports="$moea2a_transports nccl"
    AC_DEFINE([MOEA2A_HAVE_NCCL], [1], [Built with NCCL])])
AM_CONDITIONAL([BUILD_TRANSPORT_NCCL], [test "x$have_nccl" = xyes])
])

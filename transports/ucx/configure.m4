# UCX transport: host-memory collectives (and CUDA memory where UCX supports it).
AC_DEFUN([MOEA2A_TRANSPORT_UCX_CONFIGURE], [
MOEA2A_WITH_PKG([ucx], [ucx], [ucp/api/ucp.h], [ucp_init_version], [-lucp -lucs], [/opt/ucx /usr/local/ucx])
UCX_VERSION_STR=none
AS_IF([test "x$have_ucx" = xyes], [
    MOEA2A_HEADER_INT([moea2a_ucx_major], [UCP_API_MAJOR], [ucp/api/ucp_version.h], [$UCX_CPPFLAGS])
    MOEA2A_HEADER_INT([moea2a_ucx_minor], [UCP_API_MINOR], [ucp/api/ucp_version.h], [$UCX_CPPFLAGS])
    UCX_VERSION_STR="$moea2a_ucx_major.$moea2a_ucx_minor"
    moea2a_transports="$moea2a_transports ucx"])
AM_CONDITIONAL([BUILD_TRANSPORT_UCX], [test "x$have_ucx" = xyes])
])

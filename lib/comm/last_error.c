/* The communicator's last error (last_error.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "comm/comm.h"
#include "comm/last_error.h"

static void keep(moea2a_comm_t comm, moea2a_result_t result)
{
    if (comm) snprintf(comm->last_error, sizeof(comm->last_error), "%s", m2a_thread_error());
    M2A_LOG(M2A_LOG_INFO, M2A_SUBSYS_ALL, "%s (%s)", m2a_thread_error(), moea2a_strerror(result));
}

moea2a_result_t m2a_verror(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, va_list ap)
{
    m2a_vfail(result, fmt, ap);
    keep(comm, result);
    return result;
}

moea2a_result_t m2a_error(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    m2a_verror(comm, result, fmt, ap);
    va_end(ap);
    return result;
}

moea2a_result_t m2a_comm_record(moea2a_comm_t comm, moea2a_result_t r)
{
    if (r != MOEA2A_SUCCESS) keep(comm, r);
    return r;
}

const char *moea2a_last_error(moea2a_comm_t comm)
{
    return comm ? comm->last_error : m2a_thread_error();
}

/* The thread's last error and the names of the result codes (error.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"

static __thread char thread_error[M2A_ERRMSG_LEN];

static const char *const result_names[] = {
    [MOEA2A_SUCCESS] = "MOEA2A_SUCCESS: no error",
    [MOEA2A_ERR_INVALID_ARGUMENT] = "MOEA2A_ERR_INVALID_ARGUMENT: invalid argument",
    [MOEA2A_ERR_NO_MEMORY] = "MOEA2A_ERR_NO_MEMORY: out of memory",
    [MOEA2A_ERR_SYSTEM] = "MOEA2A_ERR_SYSTEM: operating-system call failed",
    [MOEA2A_ERR_TIMEOUT] = "MOEA2A_ERR_TIMEOUT: a peer did not answer in time",
    [MOEA2A_ERR_PEER_FAILED] = "MOEA2A_ERR_PEER_FAILED: a peer failed or disconnected",
    [MOEA2A_ERR_MISMATCH] = "MOEA2A_ERR_MISMATCH: ranks passed disagreeing arguments",
    [MOEA2A_ERR_UNAVAILABLE] = "MOEA2A_ERR_UNAVAILABLE: transport or feature not available",
    [MOEA2A_ERR_TRANSPORT] = "MOEA2A_ERR_TRANSPORT: transport error",
    [MOEA2A_ERR_CAPACITY] = "MOEA2A_ERR_CAPACITY: size exceeds the configured capacity",
    [MOEA2A_ERR_STATE] = "MOEA2A_ERR_STATE: call out of order",
    [MOEA2A_ERR_CUDA] = "MOEA2A_ERR_CUDA: CUDA error",
    [MOEA2A_ERR_ABORTED] = "MOEA2A_ERR_ABORTED: communicator aborted or broken",
    [MOEA2A_ERR_INTERNAL] = "MOEA2A_ERR_INTERNAL: internal error (please report)",
};

const char *moea2a_strerror(moea2a_result_t result)
{
    if ((unsigned)result < sizeof(result_names) / sizeof(result_names[0]) && result_names[result])
        return result_names[result];
    return "MOEA2A_ERR_UNKNOWN: unknown result code";
}

moea2a_result_t m2a_vfail(moea2a_result_t result, const char *fmt, va_list ap)
{
    vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
    return result;
}

moea2a_result_t m2a_fail(moea2a_result_t result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    m2a_vfail(result, fmt, ap);
    va_end(ap);
    return result;
}

const char *m2a_thread_error(void) { return thread_error; }

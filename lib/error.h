/* Error reporting: every failing path records a detailed message (per communicator
 * and per thread) and returns a specific moea2a_result_t. */
#ifndef M2A_ERROR_H
#define M2A_ERROR_H
#include <stdarg.h>

#include "moea2a.h"

#define M2A_ERRMSG_LEN 1024

/* Records the message for comm (may be NULL) and the calling thread, logs it at
 * INFO, and returns result, so call sites read `return m2a_error(comm, ERR, ...)`. */
moea2a_result_t m2a_error(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with a va_list (for transports reporting through the core). */
moea2a_result_t m2a_verror(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, va_list ap);

/* A failed exchange with a peer (timed out, or the peer died): the ranks are out of
 * step, so nothing may wait on them again. Other errors are agreed by every rank. */
static inline int m2a_peer_lost(moea2a_result_t r)
{
    return r == MOEA2A_ERR_TIMEOUT || r == MOEA2A_ERR_PEER_FAILED;
}

#define M2A_CHECK_ARG(comm, cond, ...) \
    do { if (!(cond)) return m2a_error((comm), MOEA2A_ERR_INVALID_ARGUMENT, __VA_ARGS__); } while (0)
#define M2A_TRY(expr) \
    do { moea2a_result_t m2a_r_ = (expr); if (m2a_r_ != MOEA2A_SUCCESS) return m2a_r_; } while (0)
#endif

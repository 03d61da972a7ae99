/* Error reporting of the lowest layer: a failing path records a detailed message for
 * the calling thread and returns a specific moea2a_result_t. The communicator layer
 * (comm/comm.h: m2a_error) also records the message in a communicator, for
 * moea2a_last_error(comm), and logs it. */
#ifndef M2A_ERROR_H
#define M2A_ERROR_H
#include <stdarg.h>

#include "moea2a.h"

#define M2A_ERRMSG_LEN 1024

/* Records the message for the calling thread and returns result, so call sites read
 * `return m2a_fail(MOEA2A_ERR_..., ...)`. */
moea2a_result_t m2a_fail(moea2a_result_t result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
moea2a_result_t m2a_vfail(moea2a_result_t result, const char *fmt, va_list ap);
/* The calling thread's last message. */
const char *m2a_thread_error(void);

/* A failed exchange with a peer (timed out, or the peer died): the ranks are out of
 * step, so nothing may wait on them again. Other errors are agreed by every rank. */
static inline int m2a_peer_lost(moea2a_result_t r)
{
    return r == MOEA2A_ERR_TIMEOUT || r == MOEA2A_ERR_PEER_FAILED;
}

#define M2A_CHECK(cond, ...) \
    do { if (!(cond)) return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, __VA_ARGS__); } while (0)
#define M2A_TRY(expr) \
    do { moea2a_result_t m2a_r_ = (expr); if (m2a_r_ != MOEA2A_SUCCESS) return m2a_r_; } while (0)
#endif

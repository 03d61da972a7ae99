/* The last error of a communicator (last_error.c): the communicator layer and the
 * layers above record each failure for the calling thread (base/error.h) and for the
 * communicator it happened on, where moea2a_last_error(comm) finds it, and log it. */
#ifndef M2A_LAST_ERROR_H
#define M2A_LAST_ERROR_H
#include <stdarg.h>

#include "base/error.h"
#include "moea2a.h"

/* Records the message for the thread and for comm (may be NULL), logs it at INFO, and
 * returns result: `return m2a_error(comm, MOEA2A_ERR_..., ...)`. */
moea2a_result_t m2a_error(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with a va_list (the transports report through it). */
moea2a_result_t m2a_verror(moea2a_comm_t comm, moea2a_result_t result, const char *fmt, va_list ap);
/* After a lower layer failed (its message is the thread's): records that message for
 * comm too and returns r; MOEA2A_SUCCESS passes through. */
moea2a_result_t m2a_comm_record(moea2a_comm_t comm, moea2a_result_t r);

#define M2A_CHECK_ARG(comm, cond, ...) \
    do { if (!(cond)) return m2a_error((comm), MOEA2A_ERR_INVALID_ARGUMENT, __VA_ARGS__); } while (0)
#endif

/* The one table of environment variables moea2a reads (lib/base/params.c). Reading a
 * name that is not in the table is a bug and aborts in debug builds. */
#ifndef M2A_PARAMS_H
#define M2A_PARAMS_H
#include <stddef.h>

#include "moea2a.h"

/* The variable's value, or its default from the table ("" for no default). */
const char *m2a_param_str(const char *name);
/* Reads a number; a malformed value (or an integer out of its range) is
 * MOEA2A_ERR_INVALID_ARGUMENT with a message naming the variable (the thread's last
 * error: the communicator layer records it for a communicator). */
moea2a_result_t m2a_param_double(const char *name, double *out);
moea2a_result_t m2a_param_int(const char *name, long *out);
/* 0 when value (NULL or "": unset) is one the variable may take, else -1 with why:
 * its type, and its range or words (moea2a_param_check). */
int m2a_param_why(const char *name, const char *value, char *why, size_t len);
/* Parses text as a number the way the param readers do (exposed for tests/tools). */
int m2a_parse_double(const char *text, double *out);
int m2a_parse_long(const char *text, long *out);
#endif

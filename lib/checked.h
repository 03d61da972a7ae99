/* Overflow-checked size arithmetic: every size built from a caller's counts, shapes
 * or row sizes goes through these, so a product past SIZE_MAX is an error instead of
 * a small wrapped value. Each returns 1 and writes *out when the result fits. */
#ifndef M2A_CHECKED_H
#define M2A_CHECKED_H
#include <stddef.h>

static inline int m2a_mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int m2a_add_ok(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
/* a * b * c */
static inline int m2a_mul3_ok(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return m2a_mul_ok(a, b, &ab) && m2a_mul_ok(ab, c, out);
}
#endif

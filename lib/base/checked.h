/* Overflow-checked size arithmetic: every size built from a caller's counts, shapes
 * or row sizes goes through these, so a product past SIZE_MAX is an error instead of
 * a small wrapped value. Each returns 1 and writes *out when the result fits. */
#ifndef M2A_CHECKED_H
#define M2A_CHECKED_H
#include <stddef.h>
#include <stdint.h>

static inline int m2a_mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline int m2a_add_ok(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
/* a * b * c */
static inline int m2a_mul3_ok(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return m2a_mul_ok(a, b, &ab) && m2a_mul_ok(ab, c, out);
}

/* Whether [p, p + bytes) can lie in a process's address space: user addresses end
 * below 2^56 on every 64-bit system Linux runs on (x86-64 with 5-level paging has the
 * most), the bits above are tags where hardware allows them (top-byte ignore), and no
 * object is larger than PTRDIFF_MAX. A range past that comes from a count that cannot
 * be right, and is refused before any copy or transport touches it. */
#if UINTPTR_MAX > 0xffffffffu
#define M2A_USER_ADDRESS_LIMIT ((uintptr_t)1 << 56)
#else
#define M2A_USER_ADDRESS_LIMIT ((uintptr_t)0)
#endif
static inline int m2a_range_ok(const void *p, size_t bytes)
{
    if (bytes > PTRDIFF_MAX) return 0;
    if (!M2A_USER_ADDRESS_LIMIT) return bytes <= UINTPTR_MAX - (uintptr_t)p;
    const uintptr_t a = (uintptr_t)p & (M2A_USER_ADDRESS_LIMIT - 1);
    return bytes <= M2A_USER_ADDRESS_LIMIT - a;
}
#endif

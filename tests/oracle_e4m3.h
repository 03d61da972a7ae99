/* An E4M3 ("fn": bias 7, max 448, no infinities, 0x7F NaN) oracle written from the
 * format's definition, not from the library: the nearest representable value found by
 * search, ties to the even code. Shared by the NVFP4 and FP8 tests. */
#ifndef MOEA2A_TEST_ORACLE_E4M3_H
#define MOEA2A_TEST_ORACLE_E4M3_H
#include <math.h>

static inline double e4m3_value(unsigned code) /* 0..0x7e, positive */
{
    unsigned e = code >> 3, m = code & 7;
    return e == 0 ? m / 512.0 : ldexp(1.0 + m / 8.0, (int)e - 7);
}

/* nearest finite E4M3 (ties to the even code), saturating at 448; NaN -> 0x7f */
static inline unsigned oracle_e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    double a = fabs((double)f);
    unsigned best = 0;
    for (unsigned c = 1; c <= 0x7e; c++) {
        double d = fabs(a - e4m3_value(c)), db = fabs(a - e4m3_value(best));
        if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return best | (signbit(f) ? 0x80u : 0u);
}

static inline float oracle_e4m3_float(unsigned code)
{
    if ((code & 0x7f) == 0x7f) return NAN;
    float v = (float)e4m3_value(code & 0x7f);
    return code & 0x80 ? -v : v;
}
#endif

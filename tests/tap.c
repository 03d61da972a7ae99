#include <stdio.h>
#include <stdlib.h>

#include "tap.h"

static int tap_count, tap_failed;

int tap_selected(void)
{
    const char *s = getenv("TAP_POINTS");
    if (!s || !*s) return 1;
    int next = tap_count + 1;
    while (*s) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s) return 1; /* not a list of ranges: select everything */
        if (*end == '-') {
            s = end + 1;
            hi = strtol(s, &end, 10);
            if (end == s) hi = 1L << 30; /* "20-": to the end */
        }
        if (next >= lo && next <= hi) return 1;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 1;
    }
    return 0;
}

static void vskip(const char *why, const char *fmt, va_list ap)
{
    printf("ok %d - ", ++tap_count);
    vprintf(fmt, ap);
    printf(" # SKIP %s\n", why);
    fflush(stdout);
}

int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!tap_selected()) {
        vskip("not in TAP_POINTS", fmt, ap);
        va_end(ap);
        return 1;
    }
    printf("%sok %d - ", cond ? "" : "not ", ++tap_count);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    tap_failed += !cond;
    return cond;
}

void tap_skip(const char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vskip(why, fmt, ap);
    va_end(ap);
}

void tap_diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

int tap_done(void)
{
    printf("1..%d\n", tap_count);
    return tap_failed ? 1 : 0;
}

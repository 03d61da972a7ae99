#include <stdio.h>

#include "tap.h"

static int tap_count, tap_failed;

int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
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
    printf("ok %d - ", ++tap_count);
    vprintf(fmt, ap);
    printf(" # SKIP %s\n", why);
    va_end(ap);
    fflush(stdout);
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

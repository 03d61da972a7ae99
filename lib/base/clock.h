#ifndef M2A_CLOCK_H
#define M2A_CLOCK_H
#include <time.h>
/* Monotonic seconds: every timeout in moea2a is a deadline on this clock. */
static inline double m2a_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

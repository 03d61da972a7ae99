/* The tests' clock is the library's (CLOCK_MONOTONIC seconds, the same in every process
 * of a host), so forked ranks compare times they note on a shared board. */
#ifndef MOEA2A_TEST_CLOCK_H
#define MOEA2A_TEST_CLOCK_H
#include "base/clock.h"
static inline double now(void) { return m2a_now(); }
#endif

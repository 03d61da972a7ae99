/* The tests' deterministic random numbers: splitmix64's finalizer, so that a case is
 * named by its seed and any failure reproduces. */
#ifndef MOEA2A_TEST_MIX_H
#define MOEA2A_TEST_MIX_H
#include <stdint.h>

static inline uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
#endif

/* Placements of man moea2a_moe, as the tests that check them compute them on their
 * own: the contiguous one of a create, and the one moea2a_moe_retarget derives after a
 * shrink. */
#ifndef MOEA2A_TEST_DERIVED_PLACEMENT_H
#define MOEA2A_TEST_DERIVED_PLACEMENT_H
#include <stdint.h>

/* The tests' largest communicator */
#define DERIVED_MAX_RANKS 64

/* The contiguous placement of experts on n ranks: the first experts mod n ranks hold one
 * expert more than the others. */
static inline int contiguous_owner(int e, int experts, int n)
{
    const int q = experts / n, rem = experts % n;
    return e < rem * (q + 1) ? e / (q + 1) : rem + (e - rem * (q + 1)) / q;
}

/* old: one holder per expert on n ranks (-1: none); rank `dead` gone. Each expert stays
 * with its holder, renumbered as the shrink renumbers the ranks; the dead rank's experts
 * and those no rank held go in ascending id each to the rank of the n - 1 left that
 * holds fewest at that point (the lowest such rank). */
static inline void derived_placement(const int32_t *old, int experts, int n, int dead, int32_t *map)
{
    int held[DERIVED_MAX_RANKS] = {0};
    for (int e = 0; e < experts; e++) {
        map[e] = old[e] < 0 || old[e] == dead ? -1 : old[e] - (old[e] > dead);
        if (map[e] >= 0) held[map[e]]++;
    }
    for (int e = 0; e < experts; e++) {
        if (map[e] >= 0) continue;
        int least = 0;
        for (int q = 1; q < n - 1; q++) least = held[q] < held[least] ? q : least;
        map[e] = least, held[least]++;
    }
}
#endif

/* The experts' load (moea2a_moe(3), "Expert load"): per expert, the entries this rank
 * took for it, counted from what each dispatch delivered, what load balancers read. */
#ifndef M2A_MOE_LOAD_H
#define M2A_MOE_LOAD_H
#include "moe/core.h"

/* After a dispatch's receive half succeeded on host memory: adds the entries of every
 * valid slot that the placement gives this rank (each expert once per token) to
 * moe->h_load. */
void m2a_moe_count_load(moea2a_moe_t moe);
#endif

/* The experts' load (moea2a_moe(3), "Expert load"): per expert, the entries this rank
 * took for it, counted from what each dispatch delivered, what load balancers read. */
#ifndef M2A_MOE_LOAD_H
#define M2A_MOE_LOAD_H
#include "moe/core.h"

/* After a dispatch's receive half succeeded: adds the entries of every valid slot that
 * the placement gives this rank (each expert once per token) to the counts: on host
 * memory to moe->h_load, on CUDA memory (MOEA2A_MOE_EXPERT_LOAD) to the device's, in
 * order on stream. */
moea2a_result_t m2a_moe_count_load(moea2a_moe_t moe, void *stream);
/* The device's counts (a CUDA context with MOEA2A_MOE_EXPERT_LOAD) added to
 * moe->h_load and zeroed there: before a read, and before the memory goes (a retarget),
 * so h_load always holds every count taken off the device. */
moea2a_result_t m2a_moe_fold_load(moea2a_moe_t moe, const char *fn);
#endif

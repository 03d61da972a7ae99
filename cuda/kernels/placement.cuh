/* The placement rule on the device, moe/layout.h's m2a_expert_rank: which rank takes a
 * token's entry naming a valid expert. One holder per expert (owner[]), or, while the
 * device's nrep[E] says the placement is general (replicas, or experts no rank holds),
 * holder number (src + t) mod nrep[e] of expert e for token t of rank src (nrep[e] = 0:
 * none, -1). The rule in force is read from the device because a placement changes on
 * the stream. While general, every word of owner[] is -1: the load/store dispatch,
 * which copies that table to shared memory anyway, sees the rule there. */
#ifndef M2A_PLACEMENT_CUH
#define M2A_PLACEMENT_CUH
#include "comm/cuda_module.h"

__device__ __forceinline__ bool m2a_general(const m2a_kparams_t &p) { return p.nrep[p.num_experts] != 0; }

/* Holder (src + t) mod nrep[e] of expert e, from the [E][ep] table; -1: none. */
__device__ __forceinline__ int m2a_holder_in(const int32_t *holders, const int32_t *nrep, int ep, int32_t e, int src,
                                             int t)
{
    const int n = nrep[e];
    return n ? holders[(size_t)e * (size_t)ep + (size_t)((src + t) % n)] : -1;
}

__device__ __forceinline__ int m2a_holder(const m2a_kparams_t &p, int32_t e, int src, int t)
{
    return m2a_holder_in(p.holders, p.nrep, p.ep, e, src, t);
}

__device__ __forceinline__ int m2a_expert_rank(const m2a_kparams_t &p, bool general, int32_t e, int src, int t)
{
    return general ? m2a_holder(p, e, src, t) : p.owner[e];
}
#endif

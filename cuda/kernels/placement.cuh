/* The placement rule on the device, moe/layout.h's m2a_expert_rank: which rank takes a
 * token's entry naming a valid expert. One holder per expert (owner[], -1: none), or,
 * while the device's nrep[E] says the placement has replicas, holder number
 * (src + t) mod nrep[e] of expert e for token t of rank src (nrep[e] = 0: none). The
 * rule in force is read from the device because a placement changes on the stream. */
#ifndef M2A_PLACEMENT_CUH
#define M2A_PLACEMENT_CUH
#include "comm/cuda_module.h"

__device__ __forceinline__ bool m2a_replicated(const m2a_kparams_t &p) { return p.nrep[p.num_experts] != 0; }

__device__ __forceinline__ int m2a_holder(const m2a_kparams_t &p, int32_t e, int src, int t)
{
    const int n = p.nrep[e];
    return n ? p.holders[(size_t)e * (size_t)p.ep + (size_t)((src + t) % n)] : -1;
}

__device__ __forceinline__ int m2a_expert_rank(const m2a_kparams_t &p, bool replicated, int32_t e, int src, int t)
{
    return replicated ? m2a_holder(p, e, src, t) : p.owner[e];
}
#endif

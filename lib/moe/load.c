#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "comm/last_error.h"
#include "moe/backend.h"
#include "moe/load.h"

static void count_on_host(moea2a_moe_t moe)
{
    const m2a_route_t *r = &moe->route;
    const m2a_moe_layout_t *l = &moe->l;
    const int32_t *counts = (const int32_t *)(moe->ws + l->recv_counts), *ids = (const int32_t *)(moe->ws + l->ids);
    const int32_t *src_index = (const int32_t *)(moe->ws + l->src_index);
    for (int src = 0; src < r->ep; src++)
        for (int i = 0; i < counts[src]; i++) {
            const size_t slot = (size_t)src * (size_t)moe->stride + (size_t)i;
            const int32_t *row = ids + slot * (size_t)r->k;
            for (int j = 0; j < r->k; j++) {
                const int32_t e = row[j];
                if (m2a_expert_invalid(r, e) || m2a_expert_rank(r, e, src, src_index[slot]) != r->me) continue;
                int repeat = 0; /* a token's expert counts once, as its one expert-major row */
                for (int p = 0; p < j; p++) repeat |= row[p] == e;
                moe->h_load[e] += !repeat;
            }
        }
}

moea2a_result_t m2a_moe_count_load(moea2a_moe_t moe, void *stream)
{
    if (!moe->cuda) {
        count_on_host(moe);
        return MOEA2A_SUCCESS;
    }
    return moe->cfg.flags & MOEA2A_MOE_EXPERT_LOAD ? moe->backend->count_load(moe, stream) : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_fold_load(moea2a_moe_t moe, const char *fn)
{
    if (!moe->cuda || !(moe->cfg.flags & MOEA2A_MOE_EXPERT_LOAD)) return MOEA2A_SUCCESS;
    const int E = moe->cfg.num_experts;
    int64_t *now = malloc(sizeof(int64_t) * (size_t)E);
    if (!now) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    moea2a_result_t r = moe->backend->take_load(moe, now);
    for (int e = 0; r == MOEA2A_SUCCESS && e < E; e++) moe->h_load[e] += now[e];
    free(now);
    return r;
}

moea2a_result_t moea2a_moe_expert_load(moea2a_moe_t moe, int64_t *load, int reset)
{
    static const char fn[] = "moea2a_moe_expert_load";
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_CHECK_ARG(moe->comm, load, "%s: load is NULL", fn);
    M2A_TRY(m2a_moe_usable(moe, fn));
    const size_t bytes = sizeof(int64_t) * (size_t)moe->cfg.num_experts;
    if (moe->cuda && !(moe->cfg.flags & MOEA2A_MOE_EXPERT_LOAD))
        return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE, "%s: a context in CUDA memory counts the experts' load "
                         "where it was created with MOEA2A_MOE_EXPERT_LOAD (the expert-major layout's expert_counts "
                         "give each call's)", fn);
    M2A_TRY(m2a_moe_fold_load(moe, fn));
    memcpy(load, moe->h_load, bytes);
    if (reset) memset(moe->h_load, 0, bytes);
    return MOEA2A_SUCCESS;
}

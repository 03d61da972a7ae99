/* The expert-major layout around the backends (moe_expert.h). The arithmetic is the
 * host reference's (moe_host.c); this file orders it, agrees on capacity and fills the
 * result. */
#include <string.h>

#include "bootstrap.h"
#include "moe_expert.h"

/* Whether some rank could be sent more rows than the bound: a bound below the worst
 * case (the config's default) must be agreed on after each dispatch. */
static int bound_can_bind(const moea2a_moe_t moe)
{
    return moe->cfg.max_expert_rows < m2a_moe_expert_worst_rows(&moe->cfg, moe->comm->nranks);
}

/* Every rank's rows this call (-1: over the bound); CAPACITY on every rank when one
 * rank is over its bound. */
static moea2a_result_t agree_rows(moea2a_moe_t moe, int64_t mine)
{
    moea2a_comm_t comm = moe->comm;
    int n = comm->nranks;
    int64_t *all = (int64_t *)(moe->ws + moe->l.ex_scratch); /* the scratch's first words (moe_layout.h) */
    memset(all, 0, sizeof(int64_t) * (size_t)n);
    all[comm->rank] = mine;
    moea2a_result_t r = m2a_bootstrap_allgather(comm, comm->bs, all, sizeof(int64_t));
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (all[q] < 0)
            r = m2a_error(comm, MOEA2A_ERR_CAPACITY,
                          "moea2a_dispatch: rank %d received more expert-major rows (alignment gaps included) than "
                          "max_expert_rows=%lld: raise max_expert_rows (0: the worst case)", q,
                          (long long)moe->cfg.max_expert_rows);
    }
    return r;
}

moea2a_result_t m2a_moe_expert_dispatch(moea2a_moe_t moe, moea2a_dispatch_result_t *result)
{
    const m2a_moe_layout_t *l = &moe->l;
    int num_local = 0;
    int64_t rows = m2a_host_expert_expand(&moe->route, &moe->cfg, l, moe->stride, moe->ws, &num_local);
    /* at the worst-case bound no rank can be over it: no round trip for the agreement */
    if (bound_can_bind(moe)) M2A_TRY(agree_rows(moe, rows));
    else if (rows < 0)
        return m2a_error(moe->comm, MOEA2A_ERR_INTERNAL, "moea2a_dispatch: expert-major rows over the worst case");
    if (!result) return MOEA2A_SUCCESS;
    /* the fields sit past what a caller built against an earlier header has */
    moea2a_dispatch_result_t full;
    size_t have = result->size < sizeof(full) ? result->size : sizeof(full);
    memset(&full, 0, sizeof(full));
    memcpy(&full, result, have);
    unsigned char *ws = moe->ws;
    full.num_local_experts = num_local;
    full.expert_counts = (const int32_t *)(ws + l->ex_counts);
    full.expert_offsets = (const int32_t *)(ws + l->ex_offsets);
    full.expert_rows = rows;
    for (int i = 0; i < moe->cfg.num_payloads; i++) full.expert_payloads[i] = ws + l->ex_payload[i];
    full.expert_ids = (const int32_t *)(ws + l->ex_ids);
    full.expert_src_rank = (const int32_t *)(ws + l->ex_src_rank);
    full.expert_src_token = (const int32_t *)(ws + l->ex_src_token);
    full.expert_topk_slot = (const int32_t *)(ws + l->ex_slot);
    full.expert_weights = l->ex_weights ? (const float *)(ws + l->ex_weights) : NULL;
    memcpy(result, &full, have);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_expert_combine(moea2a_moe_t moe, const void *expert_out)
{
    const unsigned char *rows = expert_out ? expert_out : moe->ws + moe->l.ex_combine;
    if (m2a_host_expert_fold(&moe->route, &moe->cfg, &moe->l, moe->stride, rows, moe->ws))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    return MOEA2A_SUCCESS;
}

/* The expert-major layout around the backends (expert.h). The arithmetic is the
 * backend's (the host reference, or the CUDA kernels: the same bits), reached through
 * its table; this file orders it, agrees on capacity and fills the result. */
#include <stdlib.h>
#include <string.h>

#include "moe/backend.h"
#include "moe/expert.h"

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
    int64_t *all = calloc((size_t)n, sizeof(int64_t)); /* 8 bytes a rank: peers time out if this fails */
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    all[comm->rank] = mine;
    moea2a_result_t r = m2a_comm_allgather(comm, all, sizeof(int64_t));
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (all[q] < 0)
            r = m2a_error(comm, MOEA2A_ERR_CAPACITY,
                          "moea2a_dispatch: rank %d received more expert-major rows (alignment gaps included) than "
                          "max_expert_rows=%lld: raise max_expert_rows (0: the worst case)", q,
                          (long long)moe->cfg.max_expert_rows);
    }
    free(all);
    return r;
}

/* This rank's experts, replicas included (ascending global id are its local indexes). */
static int local_experts(const moea2a_moe_t moe)
{
    int el = 0;
    for (int e = 0; e < moe->cfg.num_experts; e++) el += m2a_expert_held(&moe->route, e, moe->comm->rank);
    return el;
}

moea2a_result_t m2a_moe_expert_check_stream(moea2a_moe_t moe, const char *fn, void *stream)
{
    if (!moe->backend->capturing || !m2a_moe_expert_major(moe) || !bound_can_bind(moe)) return MOEA2A_SUCCESS;
    int capturing = 0;
    M2A_TRY(moe->backend->capturing(moe, stream, &capturing));
    if (!capturing) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE,
                     "%s: the stream is being captured into a CUDA graph, but max_expert_rows=%lld (below the worst case) "
                     "makes the host wait for each dispatch's rows: capture with max_expert_rows=0 (the worst case)",
                     fn, (long long)moe->cfg.max_expert_rows);
}

moea2a_result_t m2a_moe_expert_dispatch(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    int num_local = local_experts(moe);
    const int binds = bound_can_bind(moe);
    m2a_expert_view_t view;
    M2A_TRY(moe->backend->expert_expand(moe, num_local, binds, stream, &view));
    /* at the worst-case bound no rank can be over it: no round trip for the agreement */
    if (binds) {
        moea2a_result_t r = agree_rows(moe, view.rows);
        if (r == MOEA2A_ERR_CAPACITY && moe->backend->drop) /* on every rank: no combine follows */
            (void)moe->backend->drop(moe, stream);
        if (r != MOEA2A_SUCCESS) return r;
    }
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
    full.expert_rows = view.rows;
    for (int i = 0; i < moe->cfg.num_payloads; i++) {
        full.expert_payloads[i] = ws + l->ex_payload[i];
        full.expert_payload_scales[i] = l->ex_scales_wire[i] ? ws + l->ex_scales_wire[i]
                                        : l->ex_scales[i]    ? ws + l->ex_scales[i]
                                                             : NULL;
        full.expert_global_scales[i] = l->ex_global[i] ? (const float *)(ws + l->ex_global[i]) : NULL;
    }
    full.expert_ids = (const int32_t *)(ws + l->ex_ids);
    full.expert_src_rank = (const int32_t *)(ws + l->ex_src_rank);
    full.expert_src_token = (const int32_t *)(ws + l->ex_src_token);
    full.expert_topk_slot = (const int32_t *)(ws + l->ex_slot);
    full.expert_weights = l->ex_weights ? (const float *)(ws + l->ex_weights) : NULL;
    full.expert_counts_host = view.counts_host, full.expert_offsets_host = view.offsets_host;
    memcpy(result, &full, have);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_expert_combine(moea2a_moe_t moe, const void *expert_out, void *stream)
{
    const unsigned char *rows = expert_out ? expert_out : moe->ws + moe->l.ex_combine;
    return moe->backend->expert_fold(moe, local_experts(moe), rows, stream);
}

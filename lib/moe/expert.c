/* The expert-major layout around the backends (moe_expert.h). The arithmetic is the
 * host reference's (moe_host.c) on host memory and the CUDA kernels' (moe_cuda.h,
 * kernels/expert_kernels.cu: the same bits) on CUDA memory; this file orders it,
 * agrees on capacity and fills the result. */
#include <stdlib.h>
#include <string.h>

#include "wireup/bootstrap.h"
#include "moe/backend/cuda_steps.h"
#include "moe/expert.h"
#include "moe/backend/host_kernels.h"

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

/* This rank's experts (ascending global id are its local indexes). */
static int local_experts(const moea2a_moe_t moe)
{
    int el = 0;
    for (int e = 0; e < moe->cfg.num_experts; e++) el += moe->h_owner[e] == moe->comm->rank;
    return el;
}

moea2a_result_t m2a_moe_expert_check_stream(moea2a_moe_t moe, const char *fn, void *stream)
{
    if (!moe->cuda || !m2a_moe_expert_major(moe) || !bound_can_bind(moe)) return MOEA2A_SUCCESS;
    int capturing = 0;
    M2A_TRY(m2a_moe_cuda_capturing(moe, stream, &capturing));
    if (!capturing) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE,
                     "%s: the stream is being captured into a CUDA graph, but max_expert_rows=%lld (below the worst case) "
                     "makes the host wait for each dispatch's rows: capture with max_expert_rows=0 (the worst case)",
                     fn, (long long)moe->cfg.max_expert_rows);
}

/* The layout on the stream; the rows only where the agreement needs them (-1: not
 * known on the host). */
static moea2a_result_t expand_cuda(moea2a_moe_t moe, int num_local, void *stream, int64_t *rows)
{
    *rows = -1;
    M2A_TRY(m2a_moe_cuda_expert_expand(moe, num_local, moe->stride, stream));
    return bound_can_bind(moe) ? m2a_moe_cuda_expert_rows(moe, stream, rows) : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_expert_dispatch(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    int num_local = local_experts(moe);
    int64_t rows;
    if (moe->cuda) {
        M2A_TRY(expand_cuda(moe, num_local, stream, &rows));
    } else {
        rows = m2a_host_expert_expand(&moe->route, &moe->cfg, l, moe->stride, moe->ws, &num_local);
    }
    /* at the worst-case bound no rank can be over it: no round trip for the agreement */
    if (bound_can_bind(moe)) {
        moea2a_result_t r = agree_rows(moe, rows);
        if (r == MOEA2A_ERR_CAPACITY && moe->backend->drop) /* on every rank: no combine follows */
            (void)moe->backend->drop(moe, stream);
        if (r != MOEA2A_SUCCESS) return r;
    }
    else if (!moe->cuda && rows < 0)
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
    for (int i = 0; i < moe->cfg.num_payloads; i++) {
        full.expert_payloads[i] = ws + l->ex_payload[i];
        full.expert_payload_scales[i] = l->ex_scales[i] ? ws + l->ex_scales[i] : NULL;
        full.expert_global_scales[i] = l->ex_global[i] ? (const float *)(ws + l->ex_global[i]) : NULL;
    }
    full.expert_ids = (const int32_t *)(ws + l->ex_ids);
    full.expert_src_rank = (const int32_t *)(ws + l->ex_src_rank);
    full.expert_src_token = (const int32_t *)(ws + l->ex_src_token);
    full.expert_topk_slot = (const int32_t *)(ws + l->ex_slot);
    full.expert_weights = l->ex_weights ? (const float *)(ws + l->ex_weights) : NULL;
    if (!moe->cuda) {
        full.expert_counts_host = full.expert_counts, full.expert_offsets_host = full.expert_offsets;
    } else if (moe->cfg.flags & MOEA2A_MOE_HOST_EXPERT_COUNTS) { /* moe_cuda.h: rows, counts, offsets */
        const unsigned char *h = moe->pinned + l->pinned_expert;
        full.expert_counts_host = (const int32_t *)(h + 8);
        full.expert_offsets_host = (const int32_t *)(h + 8 + 4 * l->ex_experts);
    }
    memcpy(result, &full, have);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_expert_combine(moea2a_moe_t moe, const void *expert_out, void *stream)
{
    const unsigned char *rows = expert_out ? expert_out : moe->ws + moe->l.ex_combine;
    if (moe->cuda) return m2a_moe_cuda_expert_fold(moe, local_experts(moe), rows, stream);
    if (m2a_host_expert_fold(&moe->route, &moe->cfg, &moe->l, moe->stride, rows, moe->ws))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    return MOEA2A_SUCCESS;
}

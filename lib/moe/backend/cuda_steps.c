/* The CUDA pieces of the MoE backends (moe_cuda.h): device memory, the pinned mirror,
 * kernel launches, and the one host synchronization of a dispatch on the generic
 * (NCCL) path, which reads the per-peer counts NCCL needs on the host. The CUDA calls
 * go through the CUDA module (cuda_module.h), loaded by begin. */
#include "config.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "moe/backend/cuda_steps.h"

#include "comm/cuda.h"

/* Every path here runs after m2a_moe_cuda_free_memory (plan) or begin loaded the module. */
#define OPS (m2a_cuda_loaded())

static moea2a_result_t cuda_fail(moea2a_comm_t comm, int err, const char *what)
{
    return m2a_error(comm, MOEA2A_ERR_CUDA, "%s: %s", what, OPS->error_string(err));
}

moea2a_result_t m2a_moe_cuda_check(moea2a_comm_t comm, int err, const char *what)
{
    return err == 0 ? MOEA2A_SUCCESS : cuda_fail(comm, err, what);
}

#define CU(comm, call) \
    do { int e_ = (call); if (e_ != 0) return cuda_fail((comm), e_, #call); } while (0)

static moea2a_result_t set_device(moea2a_comm_t comm)
{
    if (comm->cuda_device >= 0) CU(comm, OPS->set_device(comm->cuda_device));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_free_memory(moea2a_comm_t comm, size_t *free_bytes)
{
    const moea2a_cuda_v1_t *ops;
    size_t total;
    M2A_TRY(m2a_cuda_require(comm, "moea2a_moe_create", &ops));
    M2A_TRY(set_device(comm));
    CU(comm, ops->mem_info(free_bytes, &total));
    return MOEA2A_SUCCESS;
}

_Static_assert(M2A_K_MAX_ARRAYS == M2A_MOE_MAX_ARRAYS, "the kernels' arrays and the layout's differ");

static int is_byte_array(int kind)
{
    return kind == M2A_ARR_PAYLOAD || kind == M2A_ARR_SCALES || kind == M2A_ARR_GLOBAL;
}

static void fill_kparams(const moea2a_moe_t moe, m2a_kparams_t *kp)
{
    const m2a_moe_layout_t *l = &moe->l;
    const moea2a_moe_config_t *c = &moe->cfg;
    memset(kp, 0, sizeof(*kp));
    kp->ep = moe->comm->nranks, kp->me = moe->comm->rank, kp->k = c->top_k, kp->num_experts = c->num_experts;
    kp->cap = c->max_tokens_per_rank;
    for (int a = 0; a < l->narrays; a++) kp->num_payloads += is_byte_array(l->array[a].kind); /* they come first */
    kp->weights = (c->flags & MOEA2A_MOE_CARRY_WEIGHTS) != 0, kp->narrays = l->narrays;
    kp->invalid_id = c->invalid_expert_id;
    kp->owner = (const int32_t *)(moe->ws + l->owner);
    kp->holders = (const int32_t *)(moe->ws + l->holders), kp->nrep = (const int32_t *)(moe->ws + l->nrep);
    kp->dropped_sums = (unsigned long long *)(moe->ws + l->dropped_sums);
    kp->stage_index = (const int32_t *)(moe->ws + l->stage_index);
    kp->node = (const int32_t *)(moe->ws + l->node);
    kp->nodes = moe->comm->nodes.nnodes;
    kp->record = l->record;
    for (int a = 0; a < l->narrays; a++)
        kp->width[a] = l->array[a].width, kp->ws_off[a] = l->array[a].ws, kp->rec_off[a] = l->array[a].rec;
}

/* The device's tables of the placement (placement.cuh): with one holder per expert the
 * owner of each expert, and the word that says so; while the placement is general
 * (replicas, or experts no rank holds) the holders [E][ep], their counts [E + 1] (the
 * last nonzero) and an owner table of -1 (the load/store dispatch sees the rule in the
 * copy of it that it makes anyway). In the expert-major layout each local expert's
 * global id, ascending (in the host reference's cursor words, which a CUDA context
 * never uses). In order on stream. */
static moea2a_result_t placement_tables(moea2a_moe_t moe, const char *fn, void *stream)
{
    const int E = moe->cfg.num_experts, ep = moe->comm->nranks, R = moe->max_rep;
    int el = 0;
    int32_t *words = malloc(sizeof(int32_t) * ((size_t)E * (size_t)ep + (size_t)E + 1));
    if (!words) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    int32_t *holders = words, *nrep = words + (size_t)E * (size_t)ep;
    nrep[E] = 0;
    for (int e = 0; e < E; e++) {
        nrep[e] = moe->h_nrep ? moe->h_nrep[e] : moe->h_owner[e] >= 0;
        nrep[E] |= nrep[e] != 1;
    }
    int rc = 0;
    if (nrep[E]) { /* the holders table only where it is read */
        for (int e = 0; e < E; e++)
            for (int j = 0; j < ep; j++)
                holders[(size_t)e * ep + j] = j >= nrep[e]    ? -1
                                              : moe->h_nrep ? moe->h_holders[(size_t)e * R + j]
                                                            : moe->h_owner[e];
        rc = OPS->write_words((int32_t *)(moe->ws + moe->l.holders), holders, E * ep, stream);
        if (!rc) rc = OPS->write_words((int32_t *)(moe->ws + moe->l.nrep), nrep, E + 1, stream);
        for (int e = 0; e < E; e++) words[e] = -1; /* the owner table (the holders are written) */
        if (!rc) rc = OPS->write_words((int32_t *)(moe->ws + moe->l.owner), words, E, stream);
    } else {
        rc = OPS->write_words((int32_t *)(moe->ws + moe->l.nrep) + E, nrep + E, 1, stream);
        if (!rc) rc = OPS->write_words((int32_t *)(moe->ws + moe->l.owner), moe->h_owner, E, stream);
    }
    for (int e = 0; !rc && moe->cfg.layout == MOEA2A_LAYOUT_EXPERT_MAJOR && e < E; e++)
        if (m2a_expert_held(&moe->route, e, moe->comm->rank)) words[el++] = e; /* the tables are written */
    if (!rc && el) rc = OPS->write_words((int32_t *)(moe->ws + moe->l.ex_cursors), words, el, stream);
    free(words);
    CU(moe->comm, rc);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_placement(moea2a_moe_t moe, void *stream)
{
    M2A_TRY(set_device(moe->comm));
    return placement_tables(moe, "moea2a_moe_set_placement", stream);
}

moea2a_result_t m2a_moe_cuda_count_load(moea2a_moe_t moe, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    CU(moe->comm, OPS->count_load(moe->kparams, moe->stride, (const int32_t *)(moe->ws + l->recv_counts),
                                  (const int32_t *)(moe->ws + l->ids), (const int32_t *)(moe->ws + l->src_index),
                                  (int64_t *)(moe->ws + l->load), stream));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_take_load(moea2a_moe_t moe, int64_t *load)
{
    const size_t bytes = sizeof(int64_t) * (size_t)moe->cfg.num_experts;
    M2A_TRY(set_device(moe->comm));
    CU(moe->comm, OPS->device_synchronize()); /* the dispatches on any stream */
    CU(moe->comm, OPS->copy(load, moe->ws + moe->l.load, bytes, M2A_CUDA_D2H));
    CU(moe->comm, OPS->set(moe->ws + moe->l.load, 0, bytes));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_begin(moea2a_moe_t moe)
{
    moea2a_comm_t comm = moe->comm;
    const moea2a_cuda_v1_t *ops;
    M2A_TRY(m2a_cuda_require(comm, "moea2a_moe_create", &ops));
    M2A_TRY(set_device(comm));
    CU(comm, ops->get_device(&moe->device));
    /* loaded now: loaded at a first launch, a kernel would wait for the context's running
     * ones, which may be waiting for this rank (a peer sharing the GPU, a quantization
     * alongside the dispatch) */
    CU(comm, ops->load_kernels());
    /* mapped: the load/store kernels write their error record there */
    CU(comm, ops->host_alloc_mapped((void **)&moe->pinned, moe->l.pinned));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_finish(moea2a_moe_t moe)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    int ep = comm->nranks;
    if (l->staging) CU(comm, OPS->malloc((void **)&moe->stage, l->staging));
    /* the mirror: send counts, receive counts, headers out and in, stats */
    size_t a4 = m2a_align(4 * (size_t)ep), a16 = m2a_align(sizeof(m2a_moe_header_t) * (size_t)ep);
    moe->h_send_counts = (int32_t *)moe->pinned;
    moe->h_recv_counts = (int32_t *)(moe->pinned + a4);
    moe->h_hdr_send = (m2a_moe_header_t *)(moe->pinned + 2 * a4);
    moe->h_hdr_recv = (m2a_moe_header_t *)(moe->pinned + 2 * a4 + a16);
    m2a_kparams_t *kp = malloc(sizeof(*kp));
    if (!kp) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    moe->kparams = kp;
    fill_kparams(moe, kp);
    /* tables, then every slot as padding: sanitized ids, source index -1 */
    M2A_TRY(placement_tables(moe, "moea2a_moe_create", NULL));
    if (moe->cfg.flags & MOEA2A_MOE_EXPERT_LOAD)
        CU(comm, OPS->set(moe->ws + l->load, 0, sizeof(int64_t) * (size_t)moe->cfg.num_experts));
    CU(comm, OPS->copy(moe->ws + l->stage_index, moe->stage_index, 4 * (size_t)ep, M2A_CUDA_H2D));
    CU(comm, OPS->copy(moe->ws + l->node, moe->comm->nodes.node, 4 * (size_t)ep, M2A_CUDA_H2D));
    CU(comm, OPS->set(moe->ws + l->recv_counts, 0, 4 * (size_t)ep));
    CU(comm, OPS->sanitize(kp, moe->cfg.max_tokens_per_rank, (const int32_t *)(moe->ws + l->recv_counts),
                                            (int32_t *)(moe->ws + l->ids), (int32_t *)(moe->ws + l->src_index), 1, 0, NULL));
    CU(comm, OPS->device_synchronize());
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_alloc_workspace(moea2a_moe_t moe)
{
    CU(moe->comm, OPS->malloc((void **)&moe->ws, moe->l.workspace));
    return MOEA2A_SUCCESS;
}

void m2a_moe_cuda_free_workspace(moea2a_moe_t moe)
{
    if (moe->ws) OPS->free(moe->ws);
    moe->ws = NULL;
}

void m2a_moe_cuda_end(moea2a_moe_t moe)
{
    if (moe->stage) OPS->free(moe->stage);
    if (moe->pinned) OPS->host_free(moe->pinned);
    free(moe->kparams);
    moe->stage = moe->pinned = NULL, moe->kparams = NULL;
}

/* Waits for the stream, bounded by the timeout and by the peer watcher's news. Expiry
 * means device work is stuck (most likely NCCL waiting for a dead peer), a death that
 * it will be: the CUDA transport is aborted, which ends such kernels, and the
 * communicator is broken. */
static moea2a_result_t bounded_sync(moea2a_moe_t moe, void *s, const char *what)
{
    moea2a_comm_t comm = moe->comm;
    double deadline = m2a_now() + comm->timeout_s;
    int e;
    while ((e = OPS->stream_query(s)) == M2A_CUDA_NOT_READY) {
        M2A_TRY(m2a_comm_check_peers(comm, what));
        if (m2a_now() > deadline) {
            m2a_transport_t *t = m2a_transport_for(comm, MOEA2A_MEM_CUDA);
            if (t && t->ops->abort) t->ops->abort(t->tc);
            return m2a_comm_fail(comm, m2a_error(comm, MOEA2A_ERR_TIMEOUT,
                                                 "%s: the stream did not get there within %.1f s (MOEA2A_TIMEOUT_S); "
                                                 "device work is stuck, most likely on a dead peer",
                                                 what, comm->timeout_s));
        }
        sched_yield();
    }
    if (e != 0) return cuda_fail(comm, e, what);
    m2a_transport_t *t = m2a_transport_for(comm, MOEA2A_MEM_CUDA);
    return t && t->ops->check ? m2a_comm_fail(comm, (moea2a_result_t)t->ops->check(t->tc)) : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_route(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                   int64_t *dedup)
{
    return m2a_moe_cuda_route_map(moe, n, ids, stream, invalid, dedup, NULL);
}

moea2a_result_t m2a_moe_cuda_route_map(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                       int64_t *dedup, int32_t *map_host)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    void *s = stream;
    unsigned long long *stats = (unsigned long long *)(moe->ws + l->stats);
    unsigned long long *h_stats = (unsigned long long *)(moe->pinned + l->pinned_stats);
    CU(comm, OPS->set_async(stats, 0, 24, s));
    CU(comm, OPS->route(moe->kparams, n, ids, (int32_t *)(moe->ws + l->send_counts),
                                         (int32_t *)(moe->ws + l->send_map), stats, s));
    CU(comm, OPS->copy_async(moe->h_send_counts, moe->ws + l->send_counts, 4 * (size_t)comm->nranks, M2A_CUDA_D2H, s));
    CU(comm, OPS->copy_async(h_stats, stats, 24, M2A_CUDA_D2H, s));
    if (map_host && n > 0)
        CU(comm, OPS->copy_async(map_host, moe->ws + l->send_map, 4 * (size_t)n * (size_t)moe->cfg.top_k, M2A_CUDA_D2H, s));
    M2A_TRY(bounded_sync(moe, s, "moea2a_dispatch (counts)"));
    *invalid = (int64_t)h_stats[0], *dedup = (int64_t)h_stats[1];
    moe->pending_dropped = (int64_t)h_stats[2]; /* held by no rank: the route's own count, as the host's */
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_quantize_alongside(moea2a_moe_t moe, int n, const void *const *payloads,
                                                const m2a_quant_overlap_t *ov)
{
    const m2a_moe_layout_t *l = &moe->l;
    const moea2a_moe_config_t *c = &moe->cfg;
    for (int i = 0; i < c->num_payloads; i++) {
        const moea2a_wire_t *w = &c->wire[i];
        if (w->format == MOEA2A_WIRE_AS_IS) continue;
        if (w->format != MOEA2A_WIRE_FP8)
            return m2a_error(moe->comm, MOEA2A_ERR_INTERNAL, "moea2a_dispatch: only FP8 is quantized alongside");
        CU(moe->comm, OPS->fp8_quantize_ready(payloads[i], c->payloads[i].dtype, (size_t)n, c->payloads[i].elems_per_token,
                                              moe->ws + l->send_codes[i], moe->ws + l->send_scales[i],
                                              (w->flags & MOEA2A_FP8_UE8M0) != 0, ov->ready, (uint32_t)ov->rows,
                                              ov->blocks, ov->stream));
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_sources(moea2a_moe_t moe, int n, const void *const *payloads, void *stream,
                                     int quantize, unsigned in_copy, m2a_kpayloads_t *pay)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    const moea2a_moe_config_t *c = &moe->cfg;
    memset(pay, 0, sizeof(*pay));
    if (!payloads) return MOEA2A_SUCCESS;
    for (int i = 0; i < c->num_payloads && n > 0 && quantize; i++) {
        const moea2a_wire_t *w = &c->wire[i];
        if (w->format == MOEA2A_WIRE_AS_IS || ((in_copy >> i) & 1)) continue;
        size_t e = c->payloads[i].elems_per_token;
        moea2a_datatype_t t = c->payloads[i].dtype;
        unsigned char *codes = moe->ws + l->send_codes[i], *scales = moe->ws + l->send_scales[i];
        if (w->format == MOEA2A_WIRE_FP8) {
            CU(comm, OPS->fp8_quantize(payloads[i], t, (size_t)n, e, codes, scales, MOEA2A_FP8_SCALES_ROW_MAJOR,
                                       (w->flags & MOEA2A_FP8_UE8M0) != 0, stream));
            continue;
        }
        /* NVFP4: one global scale over the call's tokens, carried by each row (written
         * by the quantization: one launch less) */
        float *g = (float *)(moe->ws + l->send_global[i]);
        CU(comm, OPS->fp4_global_scale(payloads[i], t, (size_t)n * e, g, stream));
        CU(comm, OPS->fp4_quantize(payloads[i], t, (size_t)n, e, g, codes, scales, MOEA2A_SF_LINEAR, g, stream));
    }
    for (int a = 0; a < l->narrays; a++) {
        const m2a_moe_array_t *ar = &l->array[a];
        int i = ar->payload, as_is = ar->kind == M2A_ARR_PAYLOAD && c->wire[i].format == MOEA2A_WIRE_AS_IS;
        if (!is_byte_array(ar->kind)) break;
        if ((in_copy >> i) & 1) { /* the kernel reads the caller's rows and writes the scales */
            pay->p[a] = ar->kind == M2A_ARR_PAYLOAD ? payloads[i] : NULL;
            continue;
        }
        pay->p[a] = as_is                          ? payloads[i]
                    : ar->kind == M2A_ARR_PAYLOAD ? (const void *)(moe->ws + l->send_codes[i])
                    : ar->kind == M2A_ARR_SCALES  ? (const void *)(moe->ws + l->send_scales[i])
                                                  : (const void *)(moe->ws + l->send_global[i]);
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_wire_finish(moea2a_moe_t moe, int stride, unsigned done, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    const moea2a_moe_config_t *c = &moe->cfg;
    const int32_t *counts = (const int32_t *)(moe->ws + l->recv_counts);
    int ep = comm->nranks;
    for (int i = 0; i < c->num_payloads; i++) {
        const moea2a_wire_t *w = &c->wire[i];
        if (w->format == MOEA2A_WIRE_AS_IS || ((done >> i) & 1)) continue;
        int nvfp4 = w->format == MOEA2A_WIRE_NVFP4;
        m2a_kwire_t kw = {l->wire_scale_row[i], moe->ws + l->wire_scales[i],
                          !nvfp4 && w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR ? moe->ws + l->wire_final[i] : NULL,
                          nvfp4 ? (const float *)(moe->ws + l->wire_global_rows[i]) : NULL,
                          nvfp4 ? (float *)(moe->ws + l->wire_global[i]) : NULL};
        CU(comm, OPS->wire_finish(&kw, ep, stride, counts, stream));
        if (nvfp4 && w->scale_layout != MOEA2A_SF_LINEAR)
            CU(comm, OPS->fp4_sf_convert(kw.rows, MOEA2A_SF_LINEAR, moe->ws + l->wire_final[i], w->scale_layout,
                                         (size_t)ep * (size_t)stride, c->payloads[i].elems_per_token, counts, stride,
                                         stream));
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_pack(moea2a_moe_t moe, const m2a_dispatch_args_t *a, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    void *s = stream;
    m2a_kpayloads_t pay;
    M2A_TRY(m2a_moe_cuda_sources(moe, a->n, a->payloads, s, 1, 0, &pay));
    CU(comm, OPS->copy_async(moe->ws + l->recv_counts, moe->h_recv_counts, 4 * (size_t)comm->nranks, M2A_CUDA_H2D, s));
    CU(comm, OPS->pack(moe->kparams, a->n, a->stride, pay, a->ids, a->weights,
                                        (const int32_t *)(moe->ws + l->send_map), moe->ws,
                                        moe->stage ? moe->stage + l->stage_send : NULL, comm->rank, NULL, s));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_sanitize(moea2a_moe_t moe, int stride, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    CU(moe->comm, OPS->sanitize(moe->kparams, stride, (const int32_t *)(moe->ws + l->recv_counts),
                                                 (int32_t *)(moe->ws + l->ids), (int32_t *)(moe->ws + l->src_index),
                                                 !(moe->cfg.flags & MOEA2A_MOE_NO_SANITIZE),
                                                 (moe->cfg.flags & MOEA2A_MOE_REWRITE_NONLOCAL) != 0, stream));
    return m2a_moe_cuda_wire_finish(moe, stride, 0, stream);
}

int m2a_moe_cuda_combine_wire(const moea2a_moe_config_t *c)
{
    return c->combine_wire.format == MOEA2A_WIRE_AS_IS       ? M2A_FAST_AS_IS
           : (c->combine_wire.flags & MOEA2A_FP8_UE8M0) ? M2A_FAST_FP8_UE8M0
                                                         : M2A_FAST_FP8;
}

moea2a_result_t m2a_moe_cuda_combine_rows(moea2a_moe_t moe, const unsigned char *in, const unsigned char **rows,
                                          void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    *rows = in;
    if (moe->cfg.combine_wire.format == MOEA2A_WIRE_AS_IS) return MOEA2A_SUCCESS;
    unsigned char *wire = moe->stage + l->stage_cwire;
    CU(moe->comm, OPS->combine_quantize(moe->comm->nranks, moe->stride, (const int32_t *)(moe->ws + l->recv_counts),
                                        moe->cfg.combine_dtype, moe->cfg.hidden, m2a_moe_cuda_combine_wire(&moe->cfg),
                                        in, l->combine_row, wire, l->combine_wire, stream));
    *rows = wire;
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_combine(moea2a_moe_t moe, const unsigned char *in, void *out, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    size_t row = l->combine_wire;
    return m2a_moe_cuda_reduce(moe, moe->kparams, moe->num_tokens, (const int32_t *)(moe->ws + l->send_map),
                               in + (size_t)moe->comm->rank * (size_t)moe->stride * row,
                               moe->stage ? moe->stage + l->stage_recv : NULL, out, 0, stream);
}

moea2a_result_t m2a_moe_cuda_reduce(moea2a_moe_t moe, const m2a_kparams_t *kp, int n, const int32_t *map,
                                    const unsigned char *self_rows, const unsigned char *landing, void *out, int how,
                                    void *stream)
{
    const int wire = m2a_moe_cuda_combine_wire(&moe->cfg);
    int rc = OPS->combine(kp, n, map, moe->cfg.combine_dtype, moe->cfg.hidden, wire == M2A_FAST_AS_IS ? wire : wire | how,
                          self_rows, landing, out, stream);
    if (rc == M2A_CUDA_NOT_SUPPORTED)
        return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE, "moea2a_combine: tokens with more than 64 destination ranks");
    CU(moe->comm, rc);
    return MOEA2A_SUCCESS;
}

void m2a_moe_cuda_wait(void *stream)
{
    (void)OPS->stream_synchronize(stream);
}

/* The expert-major kernels' view of the workspace. */
static void fill_kexpert(const moea2a_moe_t moe, int num_local, m2a_kexpert_t *x)
{
    const m2a_moe_layout_t *l = &moe->l;
    const moea2a_moe_config_t *c = &moe->cfg;
    unsigned char *ws = moe->ws;
    memset(x, 0, sizeof(*x));
    x->ep = moe->comm->nranks, x->me = moe->comm->rank, x->k = c->top_k, x->num_experts = c->num_experts;
    x->num_local = num_local;
    x->holders = (const int32_t *)(ws + l->holders), x->nrep = (const int32_t *)(ws + l->nrep);
    x->align = c->expert_alignment;
    x->zero_padding = (c->flags & MOEA2A_MOE_ZERO_PADDING) != 0;
    x->invalid_id = c->invalid_expert_id, x->max_rows = (int64_t)l->ex_rows;
    x->recv_counts = (const int32_t *)(ws + l->recv_counts);
    x->ids = (const int32_t *)(ws + l->ids), x->src_index = (const int32_t *)(ws + l->src_index);
    x->weights = l->weights ? (const float *)(ws + l->weights) : NULL;
    x->global_of = (const int32_t *)(ws + l->ex_cursors);
    x->part_counts = (int32_t *)(ws + l->ex_parts);
    x->counts = (int32_t *)(ws + l->ex_counts), x->offsets = (int32_t *)(ws + l->ex_offsets);
    x->rows = (int64_t *)(ws + l->ex_used);
    x->map = (int32_t *)(ws + l->ex_map);
    x->xid = (int32_t *)(ws + l->ex_ids), x->xrank = (int32_t *)(ws + l->ex_src_rank);
    x->xtok = (int32_t *)(ws + l->ex_src_token), x->xslot = (int32_t *)(ws + l->ex_slot);
    x->xw = l->ex_weights ? (float *)(ws + l->ex_weights) : NULL;
    x->num_arrays = l->ex_narrays;
    for (int a = 0; a < l->ex_narrays; a++) {
        const m2a_moe_ex_array_t *e = &l->ex_array[a];
        x->src[a] = ws + e->src, x->dst[a] = ws + e->dst, x->width[a] = e->width, x->always_zero[a] = e->always_zero;
    }
}

_Static_assert(M2A_EXPERT_MAX_PARTS == M2A_EXPERT_PARTS, "the kernels' parts and the layout's differ");
_Static_assert(M2A_EXPERT_MAX_ARRAYS == M2A_MOE_MAX_EX_ARRAYS, "the kernels' byte arrays and the layout's differ");

moea2a_result_t m2a_moe_cuda_expert_expand(moea2a_moe_t moe, int num_local, int stride, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    m2a_kexpert_t x;
    fill_kexpert(moe, num_local, &x);
    int rc = OPS->expert_expand(&x, stride, stream);
    if (rc == M2A_CUDA_NOT_SUPPORTED)
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "moea2a_dispatch: %d local experts: the expert-major kernels take "
                         "at most 65535", num_local);
    CU(comm, rc);
    if (moe->cfg.flags & MOEA2A_MOE_HOST_EXPERT_COUNTS) { /* rows, counts, offsets: one copy each */
        unsigned char *h = moe->pinned + l->pinned_expert;
        size_t el = (size_t)num_local;
        CU(comm, OPS->copy_async(h, moe->ws + l->ex_used, 8, M2A_CUDA_D2H, stream));
        if (el) CU(comm, OPS->copy_async(h + 8, moe->ws + l->ex_counts, 4 * el, M2A_CUDA_D2H, stream));
        CU(comm, OPS->copy_async(h + 8 + 4 * l->ex_experts, moe->ws + l->ex_offsets, 4 * (el + 1), M2A_CUDA_D2H, stream));
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_sync(moea2a_moe_t moe, void *stream, const char *what)
{
    return bounded_sync(moe, stream, what);
}

moea2a_result_t m2a_moe_cuda_capturing(moea2a_moe_t moe, void *stream, int *capturing)
{
    CU(moe->comm, OPS->stream_capturing(stream, capturing));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_expert_rows(moea2a_moe_t moe, void *stream, int64_t *rows)
{
    M2A_TRY(bounded_sync(moe, stream, "moea2a_dispatch (expert-major rows)"));
    CU(moe->comm, OPS->copy(rows, moe->ws + moe->l.ex_used, 8, M2A_CUDA_D2H));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_expand_view(moea2a_moe_t moe, int num_local, int need_rows, void *stream,
                                         m2a_expert_view_t *out)
{
    out->rows = -1, out->counts_host = out->offsets_host = NULL;
    M2A_TRY(m2a_moe_cuda_expert_expand(moe, num_local, moe->stride, stream));
    if (moe->cfg.flags & MOEA2A_MOE_HOST_EXPERT_COUNTS) { /* the mirror: rows, counts, offsets */
        const unsigned char *h = moe->pinned + moe->l.pinned_expert;
        out->counts_host = (const int32_t *)(h + 8);
        out->offsets_host = (const int32_t *)(h + 8 + 4 * moe->l.ex_experts);
    }
    return need_rows ? m2a_moe_cuda_expert_rows(moe, stream, &out->rows) : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_cuda_expert_fold(moea2a_moe_t moe, int num_local, const unsigned char *rows, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    m2a_kexpert_t x;
    fill_kexpert(moe, num_local, &x);
    CU(moe->comm, OPS->expert_fold(&x, moe->stride, moe->cfg.combine_dtype, moe->cfg.hidden,
                                   (moe->cfg.flags & MOEA2A_MOE_WEIGHTED_COMBINE) != 0, rows, moe->ws + l->combine,
                                   stream));
    return MOEA2A_SUCCESS;
}

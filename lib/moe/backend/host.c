/* The host backend: host memory. Workspace and staging are bound to the rank's NUMA
 * node; the generic flow (lib/moe/backend/generic.c) moves headers and packed rows over the host
 * transport, with the local steps of lib/moe/backend/host_kernels.c, which complete before they return. */
#include <stdlib.h>
#include <string.h>

#include "moe/backend.h"
#include "moe/backend/generic.h"
#include "moe/backend/host.h"
#include "moe/backend/host_kernels.h"
#include "quant/quant_host.h"

/* Route, then this rank's tokens straight into their slots and the staged peers'
 * packed per peer and array, in slot order. */
static moea2a_result_t host_route(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                  int64_t *dedup)
{
    (void)stream;
    moe->pending_dropped = 0;
    m2a_host_route(&moe->route, n, ids, moe->h_send_counts, (int32_t *)(moe->ws + moe->l.send_map), invalid, dedup,
                   &moe->pending_dropped);
    return MOEA2A_SUCCESS;
}

m2a_wire_token_t *m2a_host_wire_begin(moea2a_moe_t moe, const m2a_dispatch_args_t *a, m2a_wire_token_t *w, int *fail)
{
    const moea2a_moe_config_t *c = &moe->cfg;
    const m2a_moe_layout_t *l = &moe->l;
    size_t bytes = 0;
    for (int i = 0; i < c->num_payloads; i++)
        if (c->wire[i].format != MOEA2A_WIRE_AS_IS) bytes += l->row_bytes[i] + l->wire_scale_row[i];
    memset(w, 0, sizeof(*w));
    *fail = 0;
    if (!bytes) return NULL;
    unsigned char *buf = w->buffer = malloc(bytes);
    if (!buf) return *fail = 1, NULL;
    for (int i = 0; i < c->num_payloads; i++) {
        if (c->wire[i].format == MOEA2A_WIRE_AS_IS) continue;
        w->codes[i] = buf, buf += l->row_bytes[i];
        w->scales[i] = buf, buf += l->wire_scale_row[i];
        if (c->wire[i].format == MOEA2A_WIRE_NVFP4) /* over every token of the call, as moea2a_fp4_global_scale */
            w->global[i] = m2a_fp4_global_scale_host(a->payloads[i], c->payloads[i].dtype,
                                                     (size_t)a->n * c->payloads[i].elems_per_token);
    }
    return w;
}

void m2a_host_wire_end(m2a_wire_token_t *w)
{
    if (w) free(w->buffer);
}

static moea2a_result_t host_pack(moea2a_moe_t moe, const m2a_dispatch_args_t *a, void *stream)
{
    (void)stream;
    const m2a_moe_layout_t *l = &moe->l;
    const int32_t *send_map = (const int32_t *)(moe->ws + l->send_map);
    int cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k, fail;
    unsigned char *self_base[M2A_MOE_MAX_ARRAYS], *peer_base[M2A_MOE_MAX_ARRAYS];
    for (int i = 0; i < l->narrays; i++) self_base[i] = moe->ws + l->array[i].ws;
    m2a_wire_token_t wt, *w = m2a_host_wire_begin(moe, a, &wt, &fail);
    if (fail) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    for (int t = 0; t < a->n; t++) {
        /* a quantized payload: once per token, whatever the number of destinations */
        if (w && send_map[(size_t)t * k] >= 0) m2a_host_quantize_token(&moe->cfg, t, a->payloads, w);
        for (int d = 0; d < k && send_map[(size_t)t * k + d] >= 0; d++) {
            int e = send_map[(size_t)t * k + d], dest = e / cap, slot = e % cap, s = moe->stage_index[dest];
            if (s < 0) {
                m2a_host_put_token(&moe->route, l, t, a->payloads, a->ids, a->weights, w, self_base,
                                   (size_t)dest * (size_t)a->stride + (size_t)slot);
                continue;
            }
            unsigned char *region = moe->stage + l->stage_send + (size_t)s * (size_t)cap * l->record;
            for (int i = 0; i < l->narrays; i++) peer_base[i] = region + (size_t)cap * l->array[i].rec;
            m2a_host_put_token(&moe->route, l, t, a->payloads, a->ids, a->weights, w, peer_base, (size_t)slot);
        }
    }
    m2a_host_wire_end(w);
    return MOEA2A_SUCCESS;
}

static moea2a_result_t host_sanitize(moea2a_moe_t moe, int stride, void *stream)
{
    (void)stream;
    m2a_host_sanitize(&moe->route, &moe->l, stride, !(moe->cfg.flags & MOEA2A_MOE_NO_SANITIZE),
                      (moe->cfg.flags & MOEA2A_MOE_REWRITE_NONLOCAL) != 0, moe->ws);
    m2a_host_wire_finish(&moe->cfg, &moe->l, moe->comm->nranks, stride, moe->ws);
    return MOEA2A_SUCCESS;
}

const unsigned char *m2a_host_combine_rows(moea2a_moe_t moe, const unsigned char *in)
{
    const m2a_moe_layout_t *l = &moe->l;
    if (moe->cfg.combine_wire.format == MOEA2A_WIRE_AS_IS) return in;
    m2a_crow_t f;
    m2a_host_crow(&moe->cfg, &f);
    unsigned char *wire = moe->stage + l->stage_cwire;
    for (int q = 0; q < moe->comm->nranks; q++) {
        const size_t first = (size_t)q * (size_t)moe->stride;
        m2a_host_crow_pack(&f, in + first * l->combine_row, (size_t)moe->h_recv_counts[q], wire + first * f.bytes);
    }
    return wire;
}

static moea2a_result_t host_combine_rows(moea2a_moe_t moe, const unsigned char *in, const unsigned char **rows,
                                         void *stream)
{
    (void)stream;
    *rows = m2a_host_combine_rows(moe, in);
    return MOEA2A_SUCCESS;
}

static moea2a_result_t host_reduce(moea2a_moe_t moe, const unsigned char *in, void *out, void *stream)
{
    (void)stream;
    const m2a_moe_layout_t *l = &moe->l;
    const unsigned char *landing = moe->stage ? moe->stage + l->stage_recv : NULL;
    m2a_crow_t f;
    m2a_host_crow(&moe->cfg, &f);
    if (m2a_host_combine_reduce(&moe->route, moe->num_tokens, (const int32_t *)(moe->ws + l->send_map), &f,
                                in + (size_t)moe->comm->rank * (size_t)moe->stride * l->combine_wire, landing,
                                moe->stage_index, moe->comm->nodes.node, moe->comm->nodes.nnodes, out))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    return MOEA2A_SUCCESS;
}

static const m2a_generic_steps_t steps = {
    .route = host_route, .pack = host_pack, .sanitize = host_sanitize, .combine_rows = host_combine_rows,
    .reduce = host_reduce,
};

void m2a_host_release(moea2a_moe_t moe)
{
    m2a_topo_free(moe->ws, moe->l.workspace);
    m2a_topo_free(moe->stage, moe->l.staging);
    moe->ws = moe->stage = NULL;
}

moea2a_result_t m2a_host_memory(moea2a_moe_t moe)
{
    const m2a_moe_layout_t *l = &moe->l;
    moe->ws = m2a_topo_alloc(l->workspace, moe->numa);
    moe->stage = l->staging ? m2a_topo_alloc(l->staging, moe->numa) : NULL;
    if (!moe->ws || (l->staging && !moe->stage))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: cannot allocate %zu + %zu bytes",
                         l->workspace, l->staging);
    moe->h_send_counts = (int32_t *)(moe->ws + l->send_counts);
    moe->h_recv_counts = (int32_t *)(moe->ws + l->recv_counts);
    moe->h_hdr_send = (m2a_moe_header_t *)(moe->ws + l->hdr_send);
    moe->h_hdr_recv = (m2a_moe_header_t *)(moe->ws + l->hdr_recv);
    memset(moe->h_recv_counts, 0, 4 * (size_t)moe->comm->nranks);
    memcpy(moe->ws + l->node, moe->comm->nodes.node, 4 * (size_t)moe->comm->nranks);
    m2a_host_sanitize(&moe->route, l, moe->cfg.max_tokens_per_rank, 1, 0, moe->ws);
    return MOEA2A_SUCCESS;
}

static moea2a_result_t host_alloc(moea2a_moe_t moe)
{
    moe->steps = &steps;
    return m2a_host_memory(moe);
}

/* The expert-major layout: the host reference does it all at once, rows included. */
moea2a_result_t m2a_host_expert_expand_op(moea2a_moe_t moe, int num_local, int need_rows, void *stream,
                                          m2a_expert_view_t *out)
{
    (void)need_rows, (void)stream;
    const m2a_moe_layout_t *l = &moe->l;
    out->rows = m2a_host_expert_expand(&moe->route, &moe->cfg, l, moe->stride, moe->ws, &num_local);
    if (out->rows >= 0) m2a_host_expert_wire_scales(&moe->cfg, l, moe->ws, out->rows);
    out->counts_host = (const int32_t *)(moe->ws + l->ex_counts);
    out->offsets_host = (const int32_t *)(moe->ws + l->ex_offsets);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_host_expert_fold_op(moea2a_moe_t moe, int num_local, const unsigned char *rows, void *stream)
{
    (void)num_local, (void)stream;
    if (m2a_host_expert_fold(&moe->route, &moe->cfg, &moe->l, moe->stride, rows, moe->ws))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    return MOEA2A_SUCCESS;
}

/* by role: the context's memory; the collectives; the expert-major pass */
const m2a_moe_backend_t m2a_moe_backend_host = {
    .name = "host",
    .alloc = host_alloc, .release = m2a_host_release,
    .dispatch = m2a_generic_dispatch, .combine = m2a_generic_combine,
    .expert_expand = m2a_host_expert_expand_op, .expert_fold = m2a_host_expert_fold_op,
    .fp8_combine_hidden = SIZE_MAX,
};

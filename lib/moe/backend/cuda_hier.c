/* The hierarchical backend for CUDA memory: the plan of lib/moe/hier_plan.h on the
 * device, host-driven like the generic NCCL path. A dispatch sends each token once to
 * each other node it reaches, to its rail peer there, and directly to the ranks of its
 * own node (one NCCL group); the rail peers relay what they got to their node's
 * destinations (a second group, inside the node: NCCL's peer-to-peer transport, over
 * NVLink where the GPUs have it). A combine goes back the same way: the relayed rows
 * return to their rail peer, which sums each token's rows of its node into one partial
 * (fp32, ascending rank, rounded to the combine dtype, or with the FP8 combine wire
 * quantized by its block rule) and sends that one row; the source adds the partials in
 * ascending node order (the combine kernel's node-grouped sum). The receive layout, the
 * slots and the combine's bits are the flat path's for the same node map.
 *
 * One host synchronization per dispatch, where the generic path has its own: the
 * routing's counts and send map come back to the host with it, which plans both
 * stages from them. The source also plans the relay: with each row it sends to a rail
 * peer go the row's destinations in that node and its slot at each (the flat path's
 * codes, which the source's send map holds), so a rail peer relays with one kernel and
 * no wait, and every count the relay moves is one of the flat path's counts, which
 * every rank learns from one allgather of them after the headers. A combine waits for
 * nothing on the host. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/coll.h"
#include "comm/cuda.h"
#include "moe/backend/cuda_steps.h"
#include "moe/backend/generic.h"
#include "moe/hier_plan.h"

#define OPS (m2a_cuda_loaded())
#define CU(call) M2A_TRY(m2a_moe_cuda_check(moe->comm, (call), #call))

/* The backend's staging on the device, after the generic path's (whose staged blocks
 * carry the first stage and bring the home rows and partials back), with S the most
 * sources a rank serves as their rail peer and M the ranks of the largest node, so that
 * every rank's regions lie alike and its workspace has one size (an NCCL window takes
 * the same size from every rank; nodes may differ in size):
 *   map       cap x k int32            the first stage's send map (moe_kernels.h's codes)
 *   nidx      ep int32                 each rank's block in the relay regions, -1 outside
 *   codes_out nnodes x cap x k int32   per other node, the codes of each row sent there
 *   codes_in  S x cap x k int32        the codes of the rows this rank relays
 *   fwd_in    S x cap records          the rows it relays (array-major)
 *   s2_send   S x (M-1) x cap records  those rows, per source and rank of the node (blocks)
 *   c2_recv   S x (M-1) x cap rows     their combine rows as they come back (blocks)
 *   parts     S x cap combine rows     one partial per row it relayed
 * (combine rows as they travel: of the combine dtype, or the FP8 wire's) */
typedef struct {
    size_t map, nidx, codes_out, codes_in, fwd_in, s2_send, c2_recv, parts, end;
} regions_t;

static void regions(const moea2a_moe_config_t *c, size_t record, size_t crow, int ep, const m2a_moe_nodes_t *nd,
                    regions_t *g)
{
    const size_t cap = (size_t)c->max_tokens_per_rank, k = (size_t)c->top_k, S = (size_t)nd->most_served;
    const size_t M1 = (size_t)(nd->widest - 1), codes = 4 * cap * k;
    size_t at = 0;
    g->map = at, at += m2a_align(codes);
    g->nidx = at, at += m2a_align(4 * (size_t)ep);
    g->codes_out = at, at += m2a_align((size_t)nd->nnodes * codes);
    g->codes_in = at, at += m2a_align(S * codes);
    g->fwd_in = at, at += m2a_align(S * cap * record);
    g->s2_send = at, at += m2a_align(S * M1 * cap * record);
    g->c2_recv = at, at += m2a_align(S * M1 * cap * crow);
    g->parts = at, at += m2a_align(S * cap * crow);
    g->end = at;
}

static void cuda_hier_size(const moea2a_moe_config_t *c, int ep, const m2a_moe_nodes_t *nodes,
                           m2a_moe_backend_size_t *out)
{
    const m2a_moe_backend_size_t none = {0};
    m2a_moe_layout_t l; /* the record and combine row of this config */
    m2a_moe_layout(c, ep, 0, &none, &l);
    regions_t g;
    regions(c, l.record, l.combine_wire, ep, nodes, &g);
    out->staging_bytes = g.end;
    /* the routing's send map, the first stage's, and the codes, as the host writes them */
    out->pinned_bytes = m2a_align(4 * (size_t)c->max_tokens_per_rank * (size_t)c->top_k) * (2 + (size_t)nodes->nnodes);
    out->quantized_rows = 1; /* the sender's quantized rows (the pack kernel copies them as bytes) */
    out->device_load = 1, out->device_tables = 1;
}

typedef struct {
    m2a_hier_t h;
    regions_t g;
    int S, M, ids_array, src_array;
    int *served, *sidx;           /* the sources served, ascending; each rank's index among them or -1 */
    int *nidx;                    /* [ep] each rank's block in the relay regions (this node but me), else -1 */
    int32_t *s1_send, *s1_recv;   /* [ep] rows of the first stage to and from each rank */
    int32_t *flat;                /* [ep][ep] the flat path's counts: rows source s sends rank q */
    int32_t *mark, *pos;          /* [nnodes] the token last sent to each node; [ep] rows so far to each rank */
    int64_t *v;                   /* [16][ep] move vectors, scratch */
    int32_t *map_host, *fs_host, *codes_host; /* the pinned mirror's (cuda_hier_size) */
    m2a_kparams_t relay;          /* the kernels' view for relaying and partials: nidx blocks, one node */
} hier_state_t;

static unsigned char *dev(moea2a_moe_t moe, size_t off)
{
    return moe->stage + moe->l.stage_backend + off;
}

/* ---- dispatch -------------------------------------------------------------------------- */

/* From the routing's send map: the first stage's map (this node's destinations as the
 * flat path has them, one entry per other node reached, to its rail peer, in token
 * order), the codes each row to a rail peer carries, and the rows per rank. Returns
 * the rows that cross nodes. */
static int64_t plan_first(moea2a_moe_t moe, int n)
{
    hier_state_t *st = moe->state;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    const int *node = st->h.node;
    int64_t across = 0;
    memset(st->pos, 0, sizeof(int32_t) * (size_t)ep);
    for (int q = 0; q < st->h.nnodes; q++) st->mark[q] = -1;
    for (int t = 0; t < n; t++) {
        const int32_t *flat = st->map_host + (size_t)t * k;
        int32_t *fs = st->fs_host + (size_t)t * k;
        int j = 0;
        for (int d = 0; d < k && flat[d] >= 0; d++) {
            const int dest = flat[d] / cap, x = node[dest];
            if (x == node[me]) {
                fs[j++] = flat[d];
                continue;
            }
            if (st->mark[x] == t) continue;
            st->mark[x] = t;
            const int rail = m2a_hier_rail(&st->h, me, x), row = st->pos[rail]++;
            fs[j++] = rail * cap + row, across++;
            int32_t *code = st->codes_host + ((size_t)x * cap + (size_t)row) * k;
            int c = 0;
            for (int e = d; e < k && flat[e] >= 0; e++)
                if (node[flat[e] / cap] == x) code[c++] = flat[e];
            while (c < k) code[c++] = -1;
        }
        while (j < k) fs[j++] = -1;
    }
    for (int q = 0; q < ep; q++)
        st->s1_send[q] = node[q] == node[me] ? moe->h_send_counts[q] : st->pos[q];
    return across;
}

/* The planned maps and codes to the device, then the first stage's records: this rank's
 * own into its slots, the home peers' and rail peers' into their staging blocks. */
static moea2a_result_t pack_first(moea2a_moe_t moe, const m2a_dispatch_args_t *a, void *stream)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const size_t cap = (size_t)moe->cfg.max_tokens_per_rank, k = (size_t)moe->cfg.top_k;
    if (a->n > 0) CU(OPS->copy_async(dev(moe, st->g.map), st->fs_host, 4 * (size_t)a->n * k, M2A_CUDA_H2D, stream));
    for (int x = 0; x < st->h.nnodes; x++) {
        const int rail = m2a_hier_rail(&st->h, moe->comm->rank, x);
        if (x != st->h.node[moe->comm->rank] && st->pos[rail] > 0)
            CU(OPS->copy_async(dev(moe, st->g.codes_out) + 4 * (size_t)x * cap * k, st->codes_host + (size_t)x * cap * k,
                               4 * (size_t)st->pos[rail] * k, M2A_CUDA_H2D, stream));
    }
    m2a_kpayloads_t pay;
    M2A_TRY(m2a_moe_cuda_sources(moe, a->n, a->payloads, stream, 1, 0, &pay));
    CU(OPS->pack(moe->kparams, a->n, a->stride, pay, a->ids, a->weights, (const int32_t *)dev(moe, st->g.map), moe->ws,
                 moe->stage + l->stage_send, moe->comm->rank, NULL, stream));
    return MOEA2A_SUCCESS;
}

/* The first stage moved (one group): home peers' rows into this rank's slots, the
 * rows of the sources it serves (and their codes) into fwd_in and codes_in. */
static moea2a_result_t move_first(moea2a_moe_t moe, int stride, void *stream)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, cap = moe->cfg.max_tokens_per_rank, na = l->narrays;
    m2a_move_side_t pairs[6];
    M2A_TRY(m2a_generic_first_stage(moe, st->h.node, st->s1_send, st->s1_recv, st->sidx, stride,
                                    dev(moe, st->g.fwd_in), (size_t)st->S * (size_t)cap, st->v, pairs));
    /* the codes with the rows to the rail peers: from codes_out's block of their node */
    int64_t *crow = st->v + 5 * ep;
    for (int q = 0; q < ep; q++) crow[q] = (int64_t)st->h.node[q] * cap;
    pairs[4] = (m2a_move_side_t){.rows = pairs[2].rows, .row0 = crow};
    pairs[5] = (m2a_move_side_t){.rows = pairs[3].rows, .row0 = pairs[3].row0};
    pairs[4].buf[na] = dev(moe, st->g.codes_out), pairs[5].buf[na] = dev(moe, st->g.codes_in);
    size_t width[M2A_MOE_MAX_ARRAYS + 1];
    for (int i = 0; i < na; i++) width[i] = l->array[i].width;
    width[na] = 4 * (size_t)moe->cfg.top_k;
    return m2a_generic_move(moe, "moea2a_dispatch", pairs, 3, na + 1, width, stream);
}

/* The rows of each served source relayed by the pack kernel: this rank's into its slots
 * (source block s), the others' into s2_send's blocks at their slots there. */
static moea2a_result_t relay_pack(moea2a_moe_t moe, int stride, void *stream)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const size_t cap = (size_t)moe->cfg.max_tokens_per_rank, k = (size_t)moe->cfg.top_k, nfwd = (size_t)st->S * cap;
    const m2a_kparams_t *kp = &st->relay;
    unsigned char *fwd = dev(moe, st->g.fwd_in);
    for (int i = 0; i < st->S; i++) {
        const int s = st->served[i];
        if (st->s1_recv[s] == 0) continue;
        m2a_kpayloads_t pay;
        memset(&pay, 0, sizeof(pay));
        for (int a = 0; a < kp->num_payloads; a++) pay.p[a] = fwd + nfwd * l->array[a].rec + (size_t)i * cap * l->array[a].width;
        const unsigned char *ids = fwd + nfwd * l->array[st->ids_array].rec + (size_t)i * cap * 4 * k;
        const unsigned char *w = kp->weights ? fwd + nfwd * l->array[st->ids_array + 1].rec + (size_t)i * cap * 4 * k : NULL;
        const unsigned char *src = fwd + nfwd * l->array[st->src_array].rec + (size_t)i * cap * 4;
        CU(OPS->pack(kp, st->s1_recv[s], stride, pay, (const int32_t *)(const void *)ids, (const float *)(const void *)w,
                     (const int32_t *)dev(moe, st->g.codes_in + 4 * (size_t)i * cap * k), moe->ws,
                     dev(moe, st->g.s2_send + (size_t)i * (size_t)(st->M - 1) * cap * l->record), s, src, stream));
    }
    return MOEA2A_SUCCESS;
}

/* One pair per source on another node, ascending: the rows this rank relays for it to
 * each rank of the node (from s2_send) and the rows its rail peer here relays to this
 * rank (into its slots). Also the combine's way back, reversed (back: the combine rows
 * from this rank's slots into c2_recv). */
static moea2a_result_t move_relay(moea2a_moe_t moe, const char *fn, const unsigned char *in, int stride, int back,
                                  void *stream)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, *node = st->h.node;
    const int far = ep - st->M, na = back ? 1 : l->narrays;
    const size_t unit = back ? l->combine_wire : l->record; /* a relay block's bytes per row */
    int32_t *rows = malloc(sizeof(int32_t) * 2 * (size_t)ep * (size_t)(far + 1));
    int64_t *off = malloc(sizeof(int64_t) * 2 * (size_t)ep * (size_t)(far + 1));
    m2a_move_side_t *pairs = calloc(2 * (size_t)(far + 1), sizeof(*pairs));
    if (!rows || !off || !pairs) {
        free(rows), free(off), free(pairs);
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    int np = 0;
    for (int s = 0; s < ep; s++) {
        if (node[s] == node[me]) continue;
        const int i = st->sidx[s], rail = m2a_hier_rail(&st->h, s, node[me]);
        int32_t *blk = rows + 2 * (size_t)ep * np, *mine = blk + ep; /* relay blocks; this rank's slots */
        int64_t *bo = off + 2 * (size_t)ep * np, *so = bo + ep;
        for (int q = 0; q < ep; q++) {
            blk[q] = i >= 0 && st->nidx[q] >= 0 ? st->flat[(size_t)s * ep + q] : 0;
            bo[q] = i >= 0 && st->nidx[q] >= 0 ? ((int64_t)i * (st->M - 1) + st->nidx[q]) * cap * (int64_t)unit : 0;
            mine[q] = q == rail && q != me ? st->flat[(size_t)s * ep + me] : 0;
            so[q] = (int64_t)s * stride;
        }
        m2a_move_side_t *relay = &pairs[2 * np + (back ? 1 : 0)], *slots = &pairs[2 * np + (back ? 0 : 1)];
        relay->rows = blk, relay->byte0 = bo, slots->rows = mine, slots->row0 = so;
        for (int a = 0; a < na; a++) {
            relay->buf[a] = back ? dev(moe, st->g.c2_recv) : dev(moe, st->g.s2_send) + (size_t)cap * l->array[a].rec;
            slots->buf[a] = back ? (unsigned char *)in : moe->ws + l->array[a].ws;
        }
        np++;
    }
    size_t width[M2A_MOE_MAX_ARRAYS];
    for (int a = 0; a < na; a++) width[a] = back ? l->combine_wire : l->array[a].width;
    moea2a_result_t r = m2a_generic_move(moe, fn, pairs, np, na, width, stream);
    free(rows), free(off), free(pairs);
    return r;
}

static moea2a_result_t dispatch_send(moea2a_moe_t moe, moea2a_result_t mine, const m2a_dispatch_args_t *a,
                                     void *stream)
{
    hier_state_t *st = moe->state;
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, me = comm->rank;
    int64_t invalid = 0, dedup = 0, across = 0;
    if (mine == MOEA2A_SUCCESS)
        mine = m2a_moe_cuda_route_map(moe, a->n, a->ids, stream, &invalid, &dedup, st->map_host);
    if (mine != MOEA2A_SUCCESS && comm->broken != MOEA2A_SUCCESS) return mine;
    if (mine == MOEA2A_SUCCESS) {
        across = plan_first(moe, a->n);
    } else {
        memset(moe->h_send_counts, 0, sizeof(int32_t) * (size_t)ep);
        memset(st->s1_send, 0, sizeof(int32_t) * (size_t)ep);
    }
    M2A_TRY(m2a_generic_headers(moe, mine, a->n, a->stride, st->s1_send, st->s1_recv));
    /* the flat counts of every rank: what the relay moves, and this rank's receive counts */
    M2A_TRY(m2a_allgather("moea2a_dispatch (counts)", moe->h_send_counts, st->flat, (size_t)ep, MOEA2A_INT32, comm, NULL));
    for (int s = 0; s < ep; s++) moe->h_recv_counts[s] = st->flat[(size_t)s * ep + me];
    M2A_TRY(pack_first(moe, a, stream));
    M2A_TRY(move_first(moe, a->stride, stream));
    M2A_TRY(relay_pack(moe, a->stride, stream));
    M2A_TRY(move_relay(moe, "moea2a_dispatch (relay)", NULL, a->stride, 0, stream));
    CU(OPS->copy_async(moe->ws + moe->l.recv_counts, moe->h_recv_counts, 4 * (size_t)ep, M2A_CUDA_H2D, stream));
    moe->num_tokens = a->n, moe->stride = a->stride;
    moe->pending_invalid = invalid, moe->pending_dedup = dedup, moe->network_rows = across;
    return MOEA2A_SUCCESS;
}

static moea2a_result_t cuda_hier_dispatch(moea2a_moe_t moe, moea2a_result_t status, const m2a_dispatch_args_t *a,
                                          moea2a_dispatch_result_t *result, int phases, void *stream)
{
    if (phases & M2A_MOE_SEND) M2A_TRY(dispatch_send(moe, status, a, stream));
    if (phases & M2A_MOE_RECV) {
        M2A_TRY(m2a_moe_cuda_sanitize(moe, moe->stride, stream));
        m2a_moe_fill_result(moe, NULL, result);
    }
    return MOEA2A_SUCCESS;
}

/* ---- combine --------------------------------------------------------------------------- */

/* The send half: the rows quantized for an FP8 wire; the relayed rows' combine rows back
 * to their rail peers and the home rows to their sources (one group); each rail peer's
 * partials (the combine kernel over the codes, one node; as wire rows); the partials to
 * their sources (a second group). */
static moea2a_result_t combine_send(moea2a_moe_t moe, moea2a_result_t mine, const void *expert_out, void *stream)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    const int *node = st->h.node, stride = moe->stride;
    const size_t crow = l->combine_wire; /* rows as they travel */
    M2A_TRY(m2a_generic_combine_agree(moe, mine));
    const unsigned char *in = expert_out ? expert_out : moe->ws + l->combine;
    M2A_TRY(m2a_moe_cuda_combine_rows(moe, in, &in, stream));
    unsigned char *landing = moe->stage + l->stage_recv, *parts = dev(moe, st->g.parts);
    /* home rows back to their sources, with the relayed rows back to their rail peers */
    int32_t *hs = (int32_t *)st->v, *hr = hs + ep, *ps = hr + ep, *pr = ps + ep;
    int64_t *hfirst = st->v + 2 * ep, *pfirst = hfirst + ep, *dblk = pfirst + ep;
    for (int q = 0; q < ep; q++) {
        const int home = node[q] == node[me] && q != me;
        hs[q] = home ? st->s1_recv[q] : 0, hr[q] = home ? st->s1_send[q] : 0;
        ps[q] = st->sidx[q] >= 0 ? st->s1_recv[q] : 0, pr[q] = node[q] != node[me] ? st->s1_send[q] : 0;
        hfirst[q] = (int64_t)q * stride, pfirst[q] = st->sidx[q] >= 0 ? (int64_t)st->sidx[q] * cap : 0;
        dblk[q] = moe->stage_index[q] < 0 ? 0 : (int64_t)moe->stage_index[q] * cap * (int64_t)crow;
    }
    m2a_move_side_t home[2] = {{.buf = {(unsigned char *)in}, .rows = hs, .row0 = hfirst},
                               {.buf = {landing}, .rows = hr, .byte0 = dblk}};
    M2A_TRY(m2a_generic_move(moe, "moea2a_combine", home, 1, 1, &crow, stream));
    M2A_TRY(move_relay(moe, "moea2a_combine (relay)", in, stride, 1, stream));
    for (int i = 0; i < st->S; i++) {
        const int s = st->served[i];
        if (st->s1_recv[s] == 0) continue;
        M2A_TRY(m2a_moe_cuda_reduce(moe, &st->relay, st->s1_recv[s],
                                    (const int32_t *)dev(moe, st->g.codes_in + 4 * (size_t)i * cap * k),
                                    in + (size_t)s * stride * crow,
                                    dev(moe, st->g.c2_recv + (size_t)i * (size_t)(st->M - 1) * cap * crow),
                                    parts + (size_t)i * cap * crow, M2A_FAST_WIRE_OUT, stream));
    }
    m2a_move_side_t back[2] = {{.buf = {parts}, .rows = ps, .row0 = pfirst}, {.buf = {landing}, .rows = pr, .byte0 = dblk}};
    M2A_TRY(m2a_generic_move(moe, "moea2a_combine", back, 1, 1, &crow, stream));
    moe->combine_in = in;
    return MOEA2A_SUCCESS;
}

/* The receive half: each token's home rows and partials, by the first stage's map, in
 * the node-grouped order (an FP8 wire's partials added as they came). */
static moea2a_result_t cuda_hier_combine(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out,
                                         int phases, void *stream)
{
    hier_state_t *st = moe->state;
    if (phases & M2A_MOE_SEND) M2A_TRY(combine_send(moe, status, expert_out, stream));
    if (phases & M2A_MOE_RECV)
        M2A_TRY(m2a_moe_cuda_reduce(moe, moe->kparams, moe->num_tokens, (const int32_t *)dev(moe, st->g.map),
                                    moe->combine_in + (size_t)moe->comm->rank * (size_t)moe->stride * moe->l.combine_wire,
                                    moe->stage + moe->l.stage_recv, out, M2A_FAST_WIRE_PARTIALS, stream));
    return MOEA2A_SUCCESS;
}

/* ---- the context's memory ---------------------------------------------------------- */

static void cuda_hier_release(moea2a_moe_t moe)
{
    hier_state_t *st = moe->state;
    if (st) {
        m2a_hier_free(&st->h);
        free(st->served), free(st->sidx), free(st->nidx), free(st->s1_send), free(st->s1_recv), free(st->flat);
        free(st->mark), free(st->pos), free(st->v);
        free(st);
        moe->state = NULL;
    }
    m2a_moe_cuda_free_workspace(moe);
    m2a_moe_cuda_end(moe);
}

static moea2a_result_t cuda_hier_alloc(moea2a_moe_t moe)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, me = comm->rank;
    M2A_TRY(m2a_moe_cuda_begin(moe));
    M2A_TRY(m2a_moe_cuda_alloc_workspace(moe));
    M2A_TRY(m2a_moe_cuda_finish(moe));
    hier_state_t *st = moe->state = calloc(1, sizeof(hier_state_t));
    m2a_moe_nodes_t nodes;
    if (!st || m2a_hier_init(&st->h, &comm->nodes, ep) || m2a_hier_nodes(&comm->nodes, ep, me, &nodes))
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    st->S = nodes.served, st->M = nodes.node_size;
    regions(&moe->cfg, moe->l.record, moe->l.combine_wire, ep, &nodes, &st->g);
    st->served = malloc(sizeof(int) * (size_t)(st->S + 1)), st->sidx = malloc(sizeof(int) * (size_t)ep);
    st->nidx = malloc(sizeof(int) * (size_t)ep);
    st->s1_send = calloc((size_t)ep, sizeof(int32_t)), st->s1_recv = calloc((size_t)ep, sizeof(int32_t));
    st->flat = calloc((size_t)ep * ep, sizeof(int32_t));
    st->mark = malloc(sizeof(int32_t) * (size_t)st->h.nnodes), st->pos = calloc((size_t)ep, sizeof(int32_t));
    st->v = malloc(sizeof(int64_t) * 16 * (size_t)ep);
    if (!st->served || !st->sidx || !st->nidx || !st->s1_send || !st->s1_recv || !st->flat || !st->mark || !st->pos ||
        !st->v)
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    m2a_hier_sources(&st->h, me, st->served, st->sidx);
    for (int q = 0, b = 0; q < ep; q++)
        st->nidx[q] = st->h.node[q] == st->h.node[me] && q != me ? b++ : -1;
    st->ids_array = m2a_moe_array_of(&moe->l, M2A_ARR_IDS), st->src_array = m2a_moe_array_of(&moe->l, M2A_ARR_INDEX);
    if (st->ids_array < 0 || st->src_array != moe->l.narrays - 1) /* every record carries both (layout.c) */
        return m2a_error(comm, MOEA2A_ERR_INTERNAL, "moea2a_moe_create: a record without ids or source index");
    const size_t codes = m2a_align(4 * (size_t)moe->cfg.max_tokens_per_rank * (size_t)moe->cfg.top_k);
    unsigned char *pin = moe->pinned + moe->l.pinned_backend;
    st->map_host = (int32_t *)pin, st->fs_host = (int32_t *)(pin + codes), st->codes_host = (int32_t *)(pin + 2 * codes);
    CU(OPS->copy(dev(moe, st->g.nidx), st->nidx, 4 * (size_t)ep, M2A_CUDA_H2D));
    st->relay = *(const m2a_kparams_t *)moe->kparams;
    st->relay.stage_index = (const int32_t *)dev(moe, st->g.nidx), st->relay.nodes = 1;
    moe->network_own = 1;
    M2A_INFO(M2A_SUBSYS_MOE, "hierarchical path (CUDA memory): %d nodes, rank %d relays for %d source(s) of other nodes",
             st->h.nnodes, me, st->S);
    return MOEA2A_SUCCESS;
}

/* by role: the context's memory; the collectives; the expert-major pass; capture */
const m2a_moe_backend_t m2a_moe_backend_cuda_hier = {
    .name = "cuda-hier",
    .size = cuda_hier_size, .alloc = cuda_hier_alloc, .release = cuda_hier_release,
    .dispatch = cuda_hier_dispatch, .combine = cuda_hier_combine,
    .expert_expand = m2a_moe_cuda_expand_view, .expert_fold = m2a_moe_cuda_expert_fold,
    .capturing = m2a_moe_cuda_capturing, .placement = m2a_moe_cuda_placement,
    .count_load = m2a_moe_cuda_count_load, .take_load = m2a_moe_cuda_take_load,
    .fp8_combine_hidden = M2A_FAST_FP8_MAX_HIDDEN, /* the generic path's kernels */
    .not_capturable = "the hierarchical path cannot be captured in a CUDA graph (a dispatch waits on the host for "
                      "the counts): call dispatch and combine outside the capture and capture what runs between them",
    .fallback = &m2a_moe_backend_cuda,
};

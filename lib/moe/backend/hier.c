/* The hierarchical backend: host memory across nodes, following the plan of
 * lib/moe/hier_plan.h. A dispatch sends each token once to each other node it reaches, to
 * its rail peer there, and directly to the ranks of its own node; each rail peer
 * relays the rows it got to its node's destinations, in the slots the flat path gives
 * them. A combine goes back the same way: the destinations return the relayed rows to
 * their rail peer, which sums each token's rows of its node into one partial (fp32,
 * ascending rank, rounded to the combine dtype) and sends that one row; the source
 * adds the partials in ascending node order. Host-driven over the host transport, on
 * the host backend's memory, quantization and expert-major pass: the receive layout,
 * the slots, the stats and the combine's bits are the flat path's for the same node
 * map, with one network row per (token, other node) instead of one per (token, rank
 * on another node). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "comm/coll.h"
#include "comm/transport.h"
#include "moe/backend/generic.h"
#include "moe/backend/host.h"
#include "moe/hier_plan.h"

/* The backend's staging, after the staged peers' blocks (which carry the first stage
 * and bring the home rows and partials back), in rows of cap:
 *   fwd_in    S x cap records        the rows of each source this rank serves
 *   s2_send   D x S x cap records    those rows relayed, packed per rank of the node
 *   s2_recv   R x cap records        the rows its node's rail peers relay to it
 *   c2_send   R x cap combine rows   their combine rows, back to the rail peers
 *   c2_recv   D x S x cap comb. rows the combine rows of the rows it relayed
 *   p_out     S x cap combine rows   one partial per row it relayed
 * with S the sources served, R the ranks on other nodes, D = min(k, ranks of the node).
 * A record region of N rows holds array a from N x rec[a] (array-major). */
typedef struct {
    size_t fwd_in, s2_send, s2_recv, c2_send, c2_recv, p_out, end;
    size_t n_fwd, n_s2s, n_s2r; /* rows of the record regions */
} regions_t;

static void regions(const moea2a_moe_config_t *c, size_t record, size_t crow, int ep, const m2a_moe_nodes_t *nd,
                    regions_t *g)
{
    const size_t cap = (size_t)c->max_tokens_per_rank, S = (size_t)nd->served, R = (size_t)(ep - nd->node_size);
    const size_t D = (size_t)(c->top_k < nd->node_size ? c->top_k : nd->node_size);
    g->n_fwd = S * cap, g->n_s2s = D * S * cap, g->n_s2r = R * cap;
    size_t at = 0;
    g->fwd_in = at, at += m2a_align(g->n_fwd * record);
    g->s2_send = at, at += m2a_align(g->n_s2s * record);
    g->s2_recv = at, at += m2a_align(g->n_s2r * record);
    g->c2_send = at, at += m2a_align(g->n_s2r * crow);
    g->c2_recv = at, at += m2a_align(g->n_s2s * crow);
    g->p_out = at, at += m2a_align(g->n_fwd * crow);
    g->end = at;
}

static void hier_size(const moea2a_moe_config_t *c, int ep, const m2a_moe_nodes_t *nodes, m2a_moe_backend_size_t *out)
{
    const m2a_moe_backend_size_t none = {0};
    m2a_moe_layout_t l; /* the record and combine row of this config */
    m2a_moe_layout(c, ep, 0, &none, &l);
    regions_t g;
    regions(c, l.record, l.combine_wire, ep, nodes, &g);
    out->staging_bytes = g.end;
}

typedef struct {
    m2a_hier_t h;
    regions_t g;
    int S, ids_array, index_array;
    int *served, *sidx;         /* the sources served, ascending; each rank's index among them or -1 */
    int32_t *s1_send, *s1_recv; /* [ep] rows of the first stage to and from each rank */
    int32_t *fwd;               /* [S][cap][k] the relayed rows' codes (rank x cap + slot) */
    int32_t *c2s, *c2r;         /* [ep][ep] rows of source s relayed to / by rank q of the node ([q][s]) */
    int32_t *mark;              /* [nnodes] scratch: the token last sent to each node */
    int64_t *v;                 /* [8][ep] all-to-all vectors, scratch */
    unsigned char *scratch;     /* a partial row and hidden floats */
    const unsigned char **rows, **parts; /* [k] a token's rows of one node, [nnodes] its partials */
} hier_state_t;

/* Row `row` of a record region of n rows (array-major), array a. */
static unsigned char *rec_row(const m2a_moe_layout_t *l, unsigned char *region, size_t n, int a, size_t row)
{
    return region + n * l->array[a].rec + row * l->array[a].width;
}

/* Copies rows [from, from + count) of region src (ns rows) to rows [to, ...) of dst (nd
 * rows; NULL dst: the workspace's arrays, whose row to is slot src x stride + i). */
static void copy_records(const m2a_moe_layout_t *l, unsigned char *ws, unsigned char *src, size_t ns, size_t from,
                         unsigned char *dst, size_t nd, size_t to, size_t count)
{
    for (int a = 0; a < l->narrays; a++)
        memcpy(dst ? rec_row(l, dst, nd, a, to) : ws + l->array[a].ws + to * l->array[a].width,
               rec_row(l, src, ns, a, from), count * l->array[a].width);
}

/* ---- dispatch -------------------------------------------------------------------------- */

/* The first stage's records: this rank's own rows into its slots, the home peers' and
 * the rail peers' into their staging blocks (a token once per other node, in token
 * order). */
static moea2a_result_t pack_first(moea2a_moe_t moe, const m2a_dispatch_args_t *a)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int32_t *send_map = (const int32_t *)(moe->ws + l->send_map);
    const int cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k, me = moe->comm->rank, *node = st->h.node;
    int fail;
    m2a_wire_token_t wt, *w = m2a_host_wire_begin(moe, a, &wt, &fail);
    if (fail) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    unsigned char *base[M2A_MOE_MAX_ARRAYS];
    int32_t *pos = (int32_t *)st->v; /* rows so far to each rail peer (scratch) */
    memset(pos, 0, sizeof(int32_t) * (size_t)moe->comm->nranks);
    for (int q = 0; q < st->h.nnodes; q++) st->mark[q] = -1;
    for (int t = 0; t < a->n; t++) {
        if (w && send_map[(size_t)t * k] >= 0) m2a_host_quantize_token(&moe->cfg, t, a->payloads, w);
        for (int d = 0; d < k && send_map[(size_t)t * k + d] >= 0; d++) {
            const int e = send_map[(size_t)t * k + d], dest = e / cap;
            int to = dest, slot = e % cap;
            if (node[dest] != node[me]) { /* once per node, to the rail peer, in token order */
                if (st->mark[node[dest]] == t) continue;
                st->mark[node[dest]] = t;
                to = m2a_hier_rail(&st->h, me, node[dest]), slot = pos[to]++;
            }
            if (to == me) {
                for (int i = 0; i < l->narrays; i++) base[i] = moe->ws + l->array[i].ws;
                slot += me * a->stride;
            } else {
                unsigned char *block = moe->stage + l->stage_send + (size_t)moe->stage_index[to] * (size_t)cap * l->record;
                for (int i = 0; i < l->narrays; i++) base[i] = block + (size_t)cap * l->array[i].rec;
            }
            m2a_host_put_token(&moe->route, l, t, a->payloads, a->ids, a->weights, w, base, (size_t)slot);
        }
    }
    m2a_host_wire_end(w);
    return MOEA2A_SUCCESS;
}

/* Widths of the record's arrays. */
static void widths(const m2a_moe_layout_t *l, size_t *width)
{
    for (int a = 0; a < l->narrays; a++) width[a] = l->array[a].width;
}

/* The first stage moved: home peers' rows into this rank's slots, the rows of the
 * sources it serves into fwd_in. */
static moea2a_result_t move_first(moea2a_moe_t moe, int stride)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    m2a_move_side_t pairs[4];
    M2A_TRY(m2a_generic_first_stage(moe, st->h.node, st->s1_send, st->s1_recv, st->sidx, stride,
                                    moe->stage + l->stage_backend + st->g.fwd_in, st->g.n_fwd, st->v, pairs));
    size_t width[M2A_MOE_MAX_ARRAYS];
    widths(l, width);
    return m2a_generic_move(moe, "moea2a_dispatch", pairs, 2, l->narrays, width, NULL);
}

/* Rows of each served source per rank of this node (m2a_hier_forward), told to those
 * ranks; their receive counts for the sources of other nodes follow. */
static moea2a_result_t plan_relay(moea2a_moe_t moe)
{
    hier_state_t *st = moe->state;
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = comm->nranks, me = comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    const int *node = st->h.node;
    memset(st->c2s, 0, sizeof(int32_t) * (size_t)ep * (size_t)ep);
    unsigned char *fwd = moe->stage + l->stage_backend + st->g.fwd_in;
    int32_t *next = (int32_t *)st->v;
    for (int i = 0; i < st->S; i++) {
        const int s = st->served[i];
        memset(next, 0, sizeof(int32_t) * (size_t)ep);
        const unsigned char *ids = rec_row(l, fwd, st->g.n_fwd, st->ids_array, (size_t)i * cap);
        const unsigned char *tokens = rec_row(l, fwd, st->g.n_fwd, st->index_array, (size_t)i * cap);
        m2a_hier_forward(&moe->route, &st->h, node[me], s, st->s1_recv[s], ids, tokens, st->fwd + (size_t)i * cap * k,
                         next);
        for (int q = 0; q < ep; q++) st->c2s[(size_t)q * ep + s] = next[q];
    }
    int64_t *sc = st->v, *sd = sc + ep, *rc = sd + ep, *rd = rc + ep;
    for (int q = 0; q < ep; q++) {
        sc[q] = rc[q] = node[q] == node[me] && q != me ? 4 * (int64_t)ep : 0;
        sd[q] = rd[q] = 4 * (int64_t)q * ep;
    }
    memcpy(st->c2r + (size_t)me * ep, st->c2s + (size_t)me * ep, sizeof(int32_t) * (size_t)ep);
    M2A_TRY(m2a_alltoallv("moea2a_dispatch (relay counts)", st->c2s, sc, sd, st->c2r, rc, rd, MOEA2A_UINT8, comm, NULL));
    for (int s = 0; s < ep; s++) {
        if (node[s] == node[me]) continue;
        int32_t c = 0;
        for (int p = 0; p < ep; p++) c += node[p] == node[me] ? st->c2r[(size_t)p * ep + s] : 0;
        moe->h_recv_counts[s] = c;
    }
    return MOEA2A_SUCCESS;
}

/* Rows of rank q's block in a relay region, [q][s] counts summed over s; and each
 * block's first row (the ranks of this node, ascending; 0 rows for the others). */
static void blocks(const moea2a_moe_t moe, const int32_t *counts, int32_t *rows, int64_t *first)
{
    hier_state_t *st = moe->state;
    const int ep = moe->comm->nranks, me = moe->comm->rank;
    int64_t at = 0;
    for (int q = 0; q < ep; q++) {
        int32_t c = 0;
        for (int s = 0; q != me && st->h.node[q] == st->h.node[me] && s < ep; s++) c += counts[(size_t)q * ep + s];
        rows[q] = c, first[q] = at, at += c;
    }
}

/* The second stage: the served sources' rows relayed to the ranks of this node (this
 * rank's own into its slots), then what this rank's node relays to it into its slots. */
static moea2a_result_t relay(moea2a_moe_t moe, int stride)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    unsigned char *stage = moe->stage + l->stage_backend;
    unsigned char *fwd = stage + st->g.fwd_in, *out = stage + st->g.s2_send, *in = stage + st->g.s2_recv;
    int32_t *srows = (int32_t *)st->v, *rrows = srows + ep;
    int64_t *sfirst = st->v + ep, *rfirst = st->v + 2 * ep, *cur = st->v + 3 * ep;
    blocks(moe, st->c2s, srows, sfirst);
    blocks(moe, st->c2r, rrows, rfirst);
    memcpy(cur, sfirst, sizeof(int64_t) * (size_t)ep);
    for (int i = 0; i < st->S; i++) /* sources ascending, each one's rows in order: the receiver's order */
        for (int r = 0; r < st->s1_recv[st->served[i]]; r++) {
            const int32_t *code = st->fwd + ((size_t)i * cap + (size_t)r) * k;
            for (int d = 0; d < k && code[d] >= 0; d++) {
                const int q = code[d] / cap, slot = code[d] % cap;
                if (q == me)
                    copy_records(l, moe->ws, fwd, st->g.n_fwd, (size_t)i * cap + r, NULL, 0,
                                 (size_t)st->served[i] * stride + slot, 1);
                else
                    copy_records(l, moe->ws, fwd, st->g.n_fwd, (size_t)i * cap + r, out, st->g.n_s2s, (size_t)cur[q]++, 1);
            }
        }
    m2a_move_side_t pairs[2] = {{.rows = srows, .row0 = sfirst}, {.rows = rrows, .row0 = rfirst}};
    for (int a = 0; a < l->narrays; a++)
        pairs[0].buf[a] = out + st->g.n_s2s * l->array[a].rec, pairs[1].buf[a] = in + st->g.n_s2r * l->array[a].rec;
    size_t width[M2A_MOE_MAX_ARRAYS];
    widths(l, width);
    M2A_TRY(m2a_generic_move(moe, "moea2a_dispatch (relay)", pairs, 1, l->narrays, width, NULL));
    for (int p = 0; p < ep; p++) { /* from each rank of the node: sources ascending, each in slot order */
        int64_t at = rfirst[p];
        for (int s = 0; rrows[p] && s < ep; s++) {
            const int32_t c = st->c2r[(size_t)p * ep + s];
            if (c) copy_records(l, moe->ws, in, st->g.n_s2r, (size_t)at, NULL, 0, (size_t)s * stride, (size_t)c);
            at += c;
        }
    }
    return MOEA2A_SUCCESS;
}

static moea2a_result_t hier_dispatch(moea2a_moe_t moe, moea2a_result_t mine, const m2a_dispatch_args_t *a,
                                     moea2a_dispatch_result_t *result, int phases, void *stream)
{
    (void)stream;
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank;
    if (phases & M2A_MOE_SEND) {
        int32_t *send_map = (int32_t *)(moe->ws + l->send_map);
        int64_t invalid = 0, dedup = 0, dropped = 0, across = 0;
        int64_t *rows = st->v;
        memset(rows, 0, sizeof(int64_t) * (size_t)ep);
        memset(moe->h_send_counts, 0, sizeof(int32_t) * (size_t)ep);
        if (mine == MOEA2A_SUCCESS) {
            m2a_host_route(&moe->route, a->n, a->ids, moe->h_send_counts, send_map, &invalid, &dedup, &dropped);
            across = m2a_hier_first_stage(&st->h, me, a->n, moe->cfg.top_k, moe->cfg.max_tokens_per_rank, send_map, rows);
        }
        for (int q = 0; q < ep; q++) st->s1_send[q] = (int32_t)rows[q];
        M2A_TRY(m2a_generic_headers(moe, mine, a->n, a->stride, st->s1_send, st->s1_recv));
        moea2a_result_t r = pack_first(moe, a);
        for (int q = 0; q < ep; q++) moe->h_recv_counts[q] = st->h.node[q] == st->h.node[me] ? st->s1_recv[q] : 0;
        if (r == MOEA2A_SUCCESS) r = move_first(moe, a->stride);
        if (r == MOEA2A_SUCCESS) r = plan_relay(moe);
        if (r == MOEA2A_SUCCESS) r = relay(moe, a->stride);
        if (r != MOEA2A_SUCCESS) return r;
        moe->num_tokens = a->n, moe->stride = a->stride;
        moe->pending_invalid = invalid, moe->pending_dedup = dedup, moe->pending_dropped = dropped;
        moe->network_rows = across;
    }
    if (phases & M2A_MOE_RECV) {
        m2a_host_sanitize(&moe->route, l, moe->stride, !(moe->cfg.flags & MOEA2A_MOE_NO_SANITIZE),
                          (moe->cfg.flags & MOEA2A_MOE_REWRITE_NONLOCAL) != 0, moe->ws);
        m2a_host_wire_finish(&moe->cfg, l, ep, moe->stride, moe->ws);
        m2a_moe_fill_result(moe, NULL, result);
    }
    return MOEA2A_SUCCESS;
}

/* ---- combine --------------------------------------------------------------------------- */

/* The send half: the relayed rows' combine rows back to their rail peers, which sum
 * each into its node's partial; then the home rows and the partials to the sources. */
static moea2a_result_t combine_send(moea2a_moe_t moe, moea2a_result_t mine, const void *expert_out)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    const int *node = st->h.node, stride = moe->stride;
    M2A_TRY(m2a_generic_combine_agree(moe, mine));
    /* the rows as they travel (quantized here with an FP8 combine wire) */
    unsigned char *in = (unsigned char *)m2a_host_combine_rows(moe, expert_out ? expert_out : moe->ws + l->combine);
    unsigned char *stage = moe->stage + l->stage_backend;
    unsigned char *back = stage + st->g.c2_send, *got = stage + st->g.c2_recv, *parts = stage + st->g.p_out;
    const size_t crow = l->combine_wire;
    m2a_crow_t f;
    m2a_host_crow(&moe->cfg, &f);
    int32_t *srows = (int32_t *)st->v, *rrows = srows + ep;
    int64_t *sfirst = st->v + ep, *rfirst = st->v + 2 * ep, *cur = st->v + 3 * ep;
    blocks(moe, st->c2r, srows, sfirst); /* back to the rank that relayed them, in the order they came */
    blocks(moe, st->c2s, rrows, rfirst);
    for (int p = 0; p < ep; p++) {
        int64_t at = sfirst[p];
        for (int s = 0; srows[p] && s < ep; s++) {
            const int32_t c = st->c2r[(size_t)p * ep + s];
            if (c) memcpy(back + (size_t)at * crow, in + (size_t)s * stride * crow, (size_t)c * crow);
            at += c;
        }
    }
    m2a_move_side_t pairs[4] = {{.buf = {back}, .rows = srows, .row0 = sfirst}, {.buf = {got}, .rows = rrows, .row0 = rfirst}};
    M2A_TRY(m2a_generic_move(moe, "moea2a_combine (relay)", pairs, 1, 1, &crow, NULL));
    /* each relayed row: its node's rows in ascending rank order (the code order) */
    memcpy(cur, rfirst, sizeof(int64_t) * (size_t)ep);
    float *acc = (float *)(st->scratch + m2a_align(crow));
    const unsigned char **rows = st->rows;
    for (int i = 0; i < st->S; i++) {
        const int s = st->served[i];
        for (int r = 0; r < st->s1_recv[s]; r++) {
            const int32_t *code = st->fwd + ((size_t)i * cap + (size_t)r) * k;
            int nr = 0;
            for (int d = 0; d < k && code[d] >= 0; d++) {
                const int q = code[d] / cap, slot = code[d] % cap;
                rows[nr++] = q == me ? in + ((size_t)s * stride + slot) * crow : got + (size_t)cur[q]++ * crow;
            }
            m2a_host_sum_rows(&f, rows, nr, acc, parts + ((size_t)i * cap + (size_t)r) * crow, 1);
        }
    }
    /* home rows from this rank's slots, partials from parts, into the senders' blocks */
    int32_t *hs = (int32_t *)(st->v + 4 * ep), *hr = hs + ep, *ps = hr + ep, *pr = ps + ep;
    int64_t *hfirst = st->v, *pfirst = hfirst + ep, *dblk = pfirst + ep;
    for (int q = 0; q < ep; q++) {
        const int home = node[q] == node[me] && q != me;
        hs[q] = home ? st->s1_recv[q] : 0, hr[q] = home ? st->s1_send[q] : 0;
        ps[q] = st->sidx[q] >= 0 ? st->s1_recv[q] : 0, pr[q] = node[q] != node[me] ? st->s1_send[q] : 0;
        hfirst[q] = (int64_t)q * stride, pfirst[q] = st->sidx[q] >= 0 ? (int64_t)st->sidx[q] * cap : 0;
        dblk[q] = moe->stage_index[q] < 0 ? 0 : (int64_t)moe->stage_index[q] * cap * (int64_t)crow;
    }
    unsigned char *landing = moe->stage + l->stage_recv;
    m2a_move_side_t back_pairs[4] = {{.buf = {in}, .rows = hs, .row0 = hfirst}, {.buf = {landing}, .rows = hr, .byte0 = dblk},
                            {.buf = {parts}, .rows = ps, .row0 = pfirst}, {.buf = {landing}, .rows = pr, .byte0 = dblk}};
    M2A_TRY(m2a_generic_move(moe, "moea2a_combine", back_pairs, 2, 1, &crow, NULL));
    moe->combine_in = in;
    return MOEA2A_SUCCESS;
}

/* The receive half: out[t] = the token's partials (its home node's from the rows, each
 * other node's as it came) summed in ascending node order. */
static moea2a_result_t combine_recv(moea2a_moe_t moe, void *out)
{
    hier_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    const int me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k, *node = st->h.node;
    const int32_t *send_map = (const int32_t *)(moe->ws + l->send_map);
    const size_t crow = l->combine_wire; /* rows as they travel; out's rows are l->combine_row */
    const unsigned char *landing = moe->stage + l->stage_recv, *self = moe->combine_in + (size_t)me * moe->stride * crow;
    m2a_crow_t f;
    m2a_host_crow(&moe->cfg, &f);
    unsigned char *home = st->scratch;
    float *acc = (float *)(st->scratch + m2a_align(crow));
    int32_t *pos = st->mark; /* partials so far from each node */
    memset(pos, 0, sizeof(int32_t) * (size_t)st->h.nnodes);
    const unsigned char **rows = st->rows, **parts = st->parts;
    for (int t = 0; t < moe->num_tokens; t++) {
        const int32_t *map = send_map + (size_t)t * k;
        int np = 0;
        for (int q = 0; q < st->h.nnodes; q++) {
            int nr = 0, reached = 0;
            for (int d = 0; d < k && map[d] >= 0; d++) {
                const int dest = map[d] / cap, slot = map[d] % cap;
                if (node[dest] != q) continue;
                reached = 1;
                if (q == node[me])
                    rows[nr++] = dest == me ? self + (size_t)slot * crow
                                            : landing + ((size_t)moe->stage_index[dest] * cap + slot) * crow;
            }
            if (!reached) continue;
            if (q == node[me]) {
                m2a_host_sum_rows(&f, rows, nr, acc, home, 1);
                parts[np++] = home;
            } else {
                const int p = m2a_hier_rail(&st->h, me, q);
                parts[np++] = landing + ((size_t)moe->stage_index[p] * cap + (size_t)pos[q]++) * crow;
            }
        }
        m2a_host_sum_rows(&f, parts, np, acc, (unsigned char *)out + (size_t)t * l->combine_row, 0);
    }
    return MOEA2A_SUCCESS;
}

static moea2a_result_t hier_combine(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out,
                                    int phases, void *stream)
{
    (void)stream;
    if (phases & M2A_MOE_SEND) M2A_TRY(combine_send(moe, status, expert_out));
    if (phases & M2A_MOE_RECV) M2A_TRY(combine_recv(moe, out));
    return MOEA2A_SUCCESS;
}

/* ---- the context's memory ---------------------------------------------------------- */

static void hier_release(moea2a_moe_t moe)
{
    hier_state_t *st = moe->state;
    if (st) {
        m2a_hier_free(&st->h);
        free(st->served), free(st->sidx), free(st->s1_send), free(st->s1_recv), free(st->fwd);
        free(st->c2s), free(st->c2r), free(st->mark), free(st->v), free(st->scratch), free(st->rows), free(st->parts);
        free(st);
        moe->state = NULL;
    }
    m2a_host_release(moe);
}

static moea2a_result_t hier_alloc(moea2a_moe_t moe)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, me = comm->rank, cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    M2A_TRY(m2a_host_memory(moe));
    hier_state_t *st = moe->state = calloc(1, sizeof(hier_state_t));
    if (!st || m2a_hier_init(&st->h, &comm->nodes, ep))
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    st->S = m2a_hier_served(&st->h, me);
    const m2a_moe_nodes_t nodes = {comm->nodes.nnodes, comm->nodes.size[comm->nodes.node[me]], st->S, 0, 0};
    regions(&moe->cfg, moe->l.record, moe->l.combine_wire, ep, &nodes, &st->g);
    st->served = malloc(sizeof(int) * (size_t)(st->S + 1)), st->sidx = malloc(sizeof(int) * (size_t)ep);
    st->s1_send = malloc(sizeof(int32_t) * (size_t)ep), st->s1_recv = calloc((size_t)ep, sizeof(int32_t));
    st->fwd = malloc(sizeof(int32_t) * ((size_t)st->S * cap * k + 1));
    st->c2s = calloc((size_t)ep * ep, sizeof(int32_t)), st->c2r = calloc((size_t)ep * ep, sizeof(int32_t));
    st->mark = malloc(sizeof(int32_t) * (size_t)(ep + st->h.nnodes));
    st->v = malloc(sizeof(int64_t) * 8 * (size_t)ep);
    st->scratch = malloc(m2a_align(moe->l.combine_wire) + sizeof(float) * (moe->cfg.hidden + 1));
    st->rows = malloc(sizeof(*st->rows) * (size_t)k), st->parts = malloc(sizeof(*st->parts) * (size_t)st->h.nnodes);
    if (!st->served || !st->sidx || !st->s1_send || !st->s1_recv || !st->fwd || !st->c2s || !st->c2r || !st->mark ||
        !st->v || !st->scratch || !st->rows || !st->parts)
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    m2a_hier_sources(&st->h, me, st->served, st->sidx);
    st->ids_array = m2a_moe_array_of(&moe->l, M2A_ARR_IDS);
    st->index_array = m2a_moe_array_of(&moe->l, M2A_ARR_INDEX);
    if (st->ids_array < 0 || st->index_array < 0) /* every record carries them (layout.c) */
        return m2a_error(comm, MOEA2A_ERR_INTERNAL, "moea2a_moe_create: a record without ids or source index");
    moe->network_own = 1;
    M2A_INFO(M2A_SUBSYS_MOE, "hierarchical path: %d nodes, rank %d relays for %d source(s) of other nodes",
             st->h.nnodes, me, st->S);
    return MOEA2A_SUCCESS;
}

/* by role: the context's memory; the collectives; the expert-major pass (the host's) */
const m2a_moe_backend_t m2a_moe_backend_hier = {
    .name = "hier",
    .size = hier_size, .alloc = hier_alloc, .release = hier_release,
    .dispatch = hier_dispatch, .combine = hier_combine,
    .expert_expand = m2a_host_expert_expand_op, .expert_fold = m2a_host_expert_fold_op,
    .fp8_combine_hidden = SIZE_MAX,
};

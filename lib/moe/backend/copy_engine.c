/* Copy-engine mode of the load/store path (moe_copy_engine.h has the flow). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "comm/cuda.h"
#include "base/log.h"
#include "moe/backend/copy_engine.h"
#include "moe/backend/cuda_steps.h"
#include "base/params.h"

/* The CUDA module is loaded: the nvlink backend's create began with it. */
#define OPS (m2a_cuda_loaded())

struct m2a_ce {
    const m2a_fast_t *f;   /* the load/store kernels' parameters (the peers' windows) */
    m2a_fast_t route;      /* the same without payload arrays: the send half routes and moves no row */
    const int32_t *index;  /* device [ep]: each peer's block of the landing (-1: this rank) */
    unsigned char *landing; /* [ep - 1][cap][combine row] */
    int32_t *map;          /* pinned [cap][k]: the send map of the last dispatch */
    void **dst;            /* pinned: the copy list, max_copies entries each */
    const void **src;
    size_t *bytes, max_copies;
    int32_t sent[M2A_FAST_MAX_PEERS]; /* rows the last dispatch sent each rank: what its combine pulls */
    int blocks;                       /* the context's SM budget */
    /* Lanes: one copy engine moves about 150 GB/s over NVLink (half the link), so a
     * large batch is cut into nlanes parts of equal bytes, each on its own stream
     * forked from the caller's and joined back: the driver spreads streams over the
     * engines. The cut list (copies split at the parts' edges) is host memory. */
    int nlanes;
    void *lane[M2A_CE_MAX_LANES], *lane_done[M2A_CE_MAX_LANES], *fork;
    void **cut_dst;
    const void **cut_src;
    size_t *cut_bytes;
};

static size_t max_copies(const moea2a_moe_config_t *c, int ep)
{
    const size_t d = (size_t)(c->top_k < ep ? c->top_k : ep);
    /* a run starts at most once per (token, destination), for every payload; one pull per peer */
    return (size_t)c->max_tokens_per_rank * d * (size_t)c->num_payloads + (size_t)ep;
}

void m2a_ce_size(const moea2a_moe_config_t *c, int ep, m2a_moe_backend_size_t *out)
{
    size_t es = 0;
    if (c->hidden) moea2a_datatype_size(c->combine_dtype, &es);
    const size_t cap = (size_t)c->max_tokens_per_rank;
    out->pinned_bytes = m2a_align(out->pinned_bytes) + m2a_align(4 * cap * (size_t)c->top_k) +
                        m2a_align(3 * 8 * max_copies(c, ep));
    out->staging_bytes = m2a_align(4 * (size_t)ep) + m2a_align((size_t)(ep - 1) * cap * c->hidden * es);
}

static moea2a_result_t cuda_fail(moea2a_comm_t comm, int e, const char *what)
{
    return m2a_error(comm, MOEA2A_ERR_CUDA, "moea2a (copy-engine mode): %s: %s", what, OPS->error_string(e));
}

/* Below this many bytes a batch stays on the caller's stream: the fork and join
 * cost more than a second engine saves. */
#define M2A_CE_LANE_MIN_BYTES ((size_t)4 << 20)

/* The copy list's first nc entries, on the lanes: part j is bytes [j B / L, (j + 1) B / L)
 * of the list's concatenation, its copies cut at the edges. */
static int issue(m2a_ce_t *ce, size_t nc, void *stream)
{
    size_t total = 0;
    for (size_t i = 0; i < nc; i++) total += ce->bytes[i];
    if (ce->nlanes == 1 || total < M2A_CE_LANE_MIN_BYTES) return OPS->copy_batch(ce->dst, ce->src, ce->bytes, nc, stream);
    const int L = ce->nlanes;
    size_t first[M2A_CE_MAX_LANES + 1], m = 0, at = 0, i = 0, done = 0; /* done: bytes of copy i already cut */
    for (int j = 0; j < L; j++) {
        const size_t end = total / (size_t)L * (size_t)(j + 1) + (j == L - 1 ? total % (size_t)L : 0);
        first[j] = m;
        while (at < end) {
            const size_t take = ce->bytes[i] - done < end - at ? ce->bytes[i] - done : end - at;
            ce->cut_dst[m] = (unsigned char *)ce->dst[i] + done;
            ce->cut_src[m] = (const unsigned char *)ce->src[i] + done;
            ce->cut_bytes[m++] = take;
            at += take, done += take;
            if (done == ce->bytes[i]) i++, done = 0;
        }
    }
    first[L] = m;
    int e = OPS->event_record(ce->fork, stream);
    for (int j = 0; j < L && !e; j++) {
        e = OPS->stream_wait_event(ce->lane[j], ce->fork);
        if (!e) e = OPS->copy_batch(ce->cut_dst + first[j], ce->cut_src + first[j], ce->cut_bytes + first[j],
                                    first[j + 1] - first[j], ce->lane[j]);
        if (!e) e = OPS->event_record(ce->lane_done[j], ce->lane[j]);
        if (!e) e = OPS->stream_wait_event(stream, ce->lane_done[j]);
    }
    return e;
}

void m2a_ce_destroy(m2a_ce_t *ce)
{
    if (!ce) return;
    for (int j = 0; j < M2A_CE_MAX_LANES; j++) {
        if (ce->lane[j]) OPS->stream_destroy(ce->lane[j]);
        if (ce->lane_done[j]) OPS->event_destroy(ce->lane_done[j]);
    }
    if (ce->fork) OPS->event_destroy(ce->fork);
    free(ce->cut_dst), free(ce->cut_src), free(ce->cut_bytes);
    free(ce);
}

/* MOEA2A_CE_LANES streams and events, and the cut list (max_copies + lanes entries:
 * each edge between parts splits at most one copy). */
static moea2a_result_t lanes_create(moea2a_moe_t moe, m2a_ce_t *ce)
{
    long n = 0;
    M2A_TRY(m2a_comm_record(moe->comm, m2a_param_int("MOEA2A_CE_LANES", &n)));
    if (n < 1 || n > M2A_CE_MAX_LANES)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT,
                         "moea2a_moe_create: MOEA2A_CE_LANES=%ld is outside 1..%d", n, M2A_CE_MAX_LANES);
    ce->nlanes = (int)n;
    if (n == 1) return MOEA2A_SUCCESS;
    const size_t cap = ce->max_copies + (size_t)n;
    ce->cut_dst = malloc(cap * sizeof(*ce->cut_dst)), ce->cut_src = malloc(cap * sizeof(*ce->cut_src));
    ce->cut_bytes = malloc(cap * sizeof(*ce->cut_bytes));
    if (!ce->cut_dst || !ce->cut_src || !ce->cut_bytes)
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    int e = OPS->event_create(&ce->fork);
    for (int j = 0; j < n && !e; j++) {
        e = OPS->stream_create(&ce->lane[j]);
        if (!e) e = OPS->event_create(&ce->lane_done[j]);
    }
    return e ? cuda_fail(moe->comm, e, "the copy lanes' streams") : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_ce_create(moea2a_moe_t moe, const m2a_fast_t *f, int blocks, size_t pinned_off, m2a_ce_t **out)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = comm->nranks, me = comm->rank;
    m2a_ce_t *ce = calloc(1, sizeof(*ce));
    if (!ce) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    ce->f = f, ce->blocks = blocks;
    /* the routing launch: arrays renumbered without the payloads (ids, weights and the
     * source index keep their offsets), so that it has no row to copy */
    ce->route = *f;
    m2a_kparams_t *p = &ce->route.p;
    const int P = p->num_payloads;
    for (int a = P; a < p->narrays; a++)
        p->width[a - P] = p->width[a], p->ws_off[a - P] = p->ws_off[a], p->rec_off[a - P] = p->rec_off[a];
    p->narrays -= P, p->num_payloads = 0;
    ce->index = (const int32_t *)(moe->stage + l->stage_backend);
    ce->landing = moe->stage + l->stage_backend + m2a_align(4 * (size_t)ep);
    unsigned char *pin = moe->pinned + l->pinned_backend + m2a_align(pinned_off);
    ce->map = (int32_t *)pin;
    pin += m2a_align(4 * (size_t)moe->cfg.max_tokens_per_rank * (size_t)moe->cfg.top_k);
    ce->max_copies = max_copies(&moe->cfg, ep);
    ce->dst = (void **)pin, ce->src = (const void **)(pin + 8 * ce->max_copies);
    ce->bytes = (size_t *)(pin + 16 * ce->max_copies);
    int32_t index[M2A_FAST_MAX_PEERS];
    for (int q = 0; q < ep; q++) index[q] = q < me ? q : q == me ? -1 : q - 1;
    int e = OPS->copy((void *)ce->index, index, 4 * (size_t)ep, M2A_CUDA_H2D);
    moea2a_result_t r = e ? cuda_fail(comm, e, "the landing index") : lanes_create(moe, ce);
    if (r != MOEA2A_SUCCESS) {
        m2a_ce_destroy(ce);
        return r;
    }
    *out = ce;
    return MOEA2A_SUCCESS;
}

static moea2a_result_t refuse_capture(moea2a_moe_t moe, void *stream, const char *fn)
{
    int capturing = 0;
    M2A_TRY(m2a_moe_cuda_capturing(moe, stream, &capturing));
    if (capturing)
        return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE,
                         "%s: copy-engine mode (MOEA2A_MOE_COPY_ENGINE) waits on the host for the routing and cannot "
                         "be captured in a CUDA graph", fn);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_ce_dispatch_route(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride, int status,
                                      const int32_t *ids, const float *weights, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    M2A_TRY(refuse_capture(moe, stream, "moea2a_dispatch"));
    m2a_kpayloads_t none;
    memset(&none, 0, sizeof(none));
    memset(ce->sent, 0, sizeof(ce->sent));
    int e = OPS->fast_dispatch(&ce->route, ce->blocks, status ? 0 : n, stride, status, none, status ? NULL : ids,
                               status ? NULL : weights, M2A_FAST_SEND | M2A_FAST_QUIET, stream);
    if (e) return cuda_fail(comm, e, "the routing launch");
    if (status) { /* the peers learn this rank's failure from its header, after the signal */
        e = OPS->fast_signal(ce->f, ce->blocks, stream);
        return e ? cuda_fail(comm, e, "the signal launch") : MOEA2A_SUCCESS;
    }
    const size_t map_bytes = 4 * (size_t)n * (size_t)moe->cfg.top_k;
    if (map_bytes && (e = OPS->copy_async(ce->map, moe->ws + moe->l.send_map, map_bytes, M2A_CUDA_D2H, stream)))
        return cuda_fail(comm, e, "the send map's copy to the host");
    return m2a_moe_cuda_sync(moe, stream, "moea2a_dispatch (copy-engine mode, the routing)");
}

/* A run of len tokens from token t, to rank q's slots from s: a copy per payload. */
static void add_run(m2a_ce_t *ce, const m2a_kparams_t *p, const m2a_kpayloads_t *pay, int stride, int q, int t, int s,
                    int len, size_t *nc)
{
    for (int a = 0; a < p->num_payloads && len; a++, (*nc)++) {
        ce->dst[*nc] = ce->f->peer[q] + p->ws_off[a] + ((size_t)p->me * stride + (size_t)s) * p->width[a];
        ce->src[*nc] = (const unsigned char *)pay->p[a] + (size_t)t * p->width[a];
        ce->bytes[*nc] = (size_t)len * p->width[a];
    }
}

moea2a_result_t m2a_ce_dispatch_rows(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride,
                                     m2a_kpayloads_t pay, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_kparams_t *p = (const m2a_kparams_t *)moe->kparams;
    const int ep = p->ep, k = p->k, cap = p->cap;
    /* each destination's open run: its first token and slot, its length */
    int run_t[M2A_FAST_MAX_PEERS], run_s[M2A_FAST_MAX_PEERS], run_n[M2A_FAST_MAX_PEERS] = {0};
    size_t nc = 0;
    for (int t = 0; t < n; t++) {
        for (int d = 0; d < k; d++) {
            const int32_t code = ce->map[(size_t)t * k + d];
            if (code < 0) break;
            const int q = code / cap, s = code % cap;
            if (q >= ep || s >= stride || s != ce->sent[q])
                return m2a_error(comm, MOEA2A_ERR_INTERNAL,
                                 "moea2a_dispatch (copy-engine mode): token %d's route (rank %d, slot %d) is not the "
                                 "next slot there (%d)", t, q, s, ce->sent[q]);
            ce->sent[q] = s + 1;
            if (run_n[q] && run_t[q] + run_n[q] == t) { /* the token after the run: its slot is the next one */
                run_n[q]++;
                continue;
            }
            add_run(ce, p, &pay, stride, q, run_t[q], run_s[q], run_n[q], &nc);
            run_t[q] = t, run_s[q] = s, run_n[q] = 1;
        }
    }
    for (int q = 0; q < ep; q++) add_run(ce, p, &pay, stride, q, run_t[q], run_s[q], run_n[q], &nc);
    int e = issue(ce, nc, stream);
    if (e) return cuda_fail(comm, e, "the rows' copies");
    e = OPS->fast_signal(ce->f, ce->blocks, stream);
    return e ? cuda_fail(comm, e, "the signal launch") : MOEA2A_SUCCESS;
}

moea2a_result_t m2a_ce_combine_check(moea2a_moe_t moe, void *stream)
{
    return refuse_capture(moe, stream, "moea2a_combine");
}

moea2a_result_t m2a_ce_combine_rows(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride, void *out, void *stream)
{
    const m2a_fast_t *f = ce->f;
    const int ep = f->p.ep, me = f->p.me;
    const size_t row = f->combine_row, cap = (size_t)f->p.cap;
    size_t nc = 0;
    for (int q = 0; q < ep; q++) { /* the rows rank q computed for this rank's tokens: [me][0, sent) there */
        if (q == me || ce->sent[q] == 0) continue;
        ce->dst[nc] = ce->landing + (size_t)(q < me ? q : q - 1) * cap * row;
        ce->src[nc] = f->peer[q] + f->combine + (size_t)me * stride * row;
        ce->bytes[nc++] = (size_t)ce->sent[q] * row;
    }
    int e = issue(ce, nc, stream);
    if (e) return cuda_fail(moe->comm, e, "the combine rows' copies");
    e = OPS->fast_landing_reduce(f, ce->blocks, n, stride, ce->landing, ce->index, out, stream);
    return e ? cuda_fail(moe->comm, e, "the combine's sum") : MOEA2A_SUCCESS;
}

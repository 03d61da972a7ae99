/* The host-driven flow of the generic backends (moe_generic.h). */
#include <stdlib.h>
#include <string.h>

#include "comm/coll.h"
#include "base/log.h"
#include "comm/agree.h"
#include "moe/core.h"
#include "moe/backend/generic.h"

/* After the header exchange: the first failing rank's error, or a runtime_max
 * disagreement, becomes every rank's result. */
static moea2a_result_t judge_headers(moea2a_moe_t moe, moea2a_result_t mine, const m2a_moe_header_t *in, int rt)
{
    moea2a_comm_t comm = moe->comm;
    int failed = mine != MOEA2A_SUCCESS;
    for (int q = 0; q < comm->nranks; q++) failed |= in[q].status != MOEA2A_SUCCESS;
    /* every rank saw the same statuses: all of them learn the failed ranks' reasons */
    if (failed)
        return m2a_comm_tell_failures(comm, "moea2a_dispatch", mine, &in[0].status,
                                     sizeof(m2a_moe_header_t) / sizeof(int32_t));
    for (int q = 0; q < comm->nranks; q++) {
        if (in[q].runtime_max != rt)
            return m2a_error(comm, MOEA2A_ERR_MISMATCH,
                             "moea2a_dispatch: ranks passed different runtime_max_tokens_per_rank: rank %d passed %d, "
                             "rank %d passed %d (0 means max_tokens_per_rank); every rank must pass the same value",
                             comm->rank, rt, q, in[q].runtime_max);
        if (in[q].count < 0 || in[q].count > rt)
            return m2a_error(comm, MOEA2A_ERR_MISMATCH, "moea2a_dispatch: rank %d announced %d tokens for a stride of %d",
                             q, in[q].count, rt);
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_generic_headers(moea2a_moe_t moe, moea2a_result_t mine, int n, int rt, const int32_t *send,
                                    int32_t *recv)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks;
    m2a_moe_header_t *hs = moe->h_hdr_send, *hr = moe->h_hdr_recv;
    for (int q = 0; q < ep; q++) hs[q] = (m2a_moe_header_t){mine == MOEA2A_SUCCESS ? send[q] : 0, rt, mine, n};
    int64_t hc[512] = {0}, *hcv = ep <= 256 ? hc : malloc(sizeof(int64_t) * 2 * (size_t)ep);
    if (!hcv) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    for (int q = 0; q < ep; q++) hcv[q] = 4, hcv[ep + q] = 4 * (int64_t)q;
    moea2a_result_t r = m2a_alltoallv("moea2a_dispatch (headers)", hs, hcv, hcv + ep, hr, hcv, hcv + ep, MOEA2A_INT32,
                                      comm, NULL);
    if (hcv != hc) free(hcv);
    if (r != MOEA2A_SUCCESS) return r;
    M2A_TRY(judge_headers(moe, mine, hr, rt));
    for (int q = 0; q < ep; q++) recv[q] = hr[q].count;
    return MOEA2A_SUCCESS;
}

/* Byte counts and displacements of one all-to-all with the staged peers (this rank
 * and load/store peers are served directly): send_rows[q] rows of `width` bytes go to
 * q, recv_rows[q] come from q. Peer q's send block starts at index x send_peer_bytes
 * + soff and its receive block at index x recv_peer_bytes, where the send side is
 * indexed by staging slot and the receive side by rank (dispatch: staging to
 * workspace), or the other way round when send_by_rank is set (combine: workspace
 * to staging). */
typedef struct {
    int64_t *sc, *sd, *rc, *rd;
} exchange_t;

static void exchange_plan(const moea2a_moe_t moe, exchange_t *x, const int32_t *send_rows, const int32_t *recv_rows,
                          size_t width, size_t send_peer_bytes, size_t soff, size_t recv_peer_bytes, int send_by_rank)
{
    for (int q = 0; q < moe->comm->nranks; q++) {
        int s = moe->stage_index[q];
        x->sc[q] = s < 0 ? 0 : (int64_t)send_rows[q] * (int64_t)width;
        x->sd[q] = s < 0 ? 0 : (int64_t)((size_t)(send_by_rank ? q : s) * send_peer_bytes + soff);
        x->rc[q] = s < 0 ? 0 : (int64_t)recv_rows[q] * (int64_t)width;
        x->rd[q] = s < 0 ? 0 : (int64_t)((size_t)(send_by_rank ? s : q) * recv_peer_bytes);
    }
}

static int64_t *vectors(int n, int count)
{
    return malloc(sizeof(int64_t) * 4 * (size_t)n * (size_t)count);
}

/* Sends every array of the dispatched tokens to the staged peers, each as its own
 * non-blocking all-to-all, all in flight together (one NCCL group on CUDA memory),
 * landing straight in the workspace's [ep][stride][width] arrays. */
static moea2a_result_t exchange_arrays(moea2a_moe_t moe, int stride, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    int n = moe->comm->nranks;
    size_t cap = (size_t)moe->cfg.max_tokens_per_rank;
    int64_t *v = vectors(n, l->narrays);
    moea2a_request_t req[M2A_MOE_MAX_ARRAYS] = {0};
    if (!v) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    unsigned mem = moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
    moea2a_result_t r = m2a_comm_fail(moe->comm, m2a_transport_group(moe->comm, mem, 1));
    for (int a = 0; a < l->narrays && r == MOEA2A_SUCCESS; a++) {
        const m2a_moe_array_t *ar = &l->array[a];
        exchange_t x = {v + 4 * n * a, v + 4 * n * a + n, v + 4 * n * a + 2 * n, v + 4 * n * a + 3 * n};
        exchange_plan(moe, &x, moe->h_send_counts, moe->h_recv_counts, ar->width, cap * l->record, cap * ar->rec,
                      (size_t)stride * ar->width, 0);
        r = m2a_ialltoallv("moea2a_dispatch", moe->stage ? moe->stage + l->stage_send : NULL, x.sc, x.sd,
                           moe->ws + ar->ws, x.rc, x.rd, MOEA2A_UINT8, moe->comm, stream, &req[a]);
    }
    moea2a_result_t g = m2a_comm_fail(moe->comm, m2a_transport_group(moe->comm, mem, 0));
    if (r == MOEA2A_SUCCESS) r = g;
    for (int a = 0; a < l->narrays; a++) {
        moea2a_result_t w = req[a] ? moea2a_wait(&req[a]) : MOEA2A_SUCCESS;
        if (r == MOEA2A_SUCCESS) r = w;
    }
    free(v);
    return r;
}

moea2a_result_t m2a_generic_move(moea2a_moe_t moe, const char *fn, const m2a_move_side_t *pairs, int npairs,
                                 int narrays, const size_t *width, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, nmax = npairs * narrays;
    const unsigned mem = moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
    int64_t *vv = malloc(sizeof(int64_t) * 4 * (size_t)ep * (size_t)(nmax > 0 ? nmax : 1));
    moea2a_request_t *req = calloc((size_t)(nmax > 0 ? nmax : 1), sizeof(*req));
    if (!vv || !req) {
        free(vv), free(req);
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    moea2a_result_t r = m2a_comm_fail(comm, m2a_transport_group(comm, mem, 1));
    int nreq = 0;
    for (int i = 0; i < npairs && r == MOEA2A_SUCCESS; i++)
        for (int a = 0; a < narrays && r == MOEA2A_SUCCESS; a++) {
            const m2a_move_side_t *s = &pairs[2 * i], *d = &pairs[2 * i + 1];
            if (!s->buf[a]) continue;
            int64_t *sc = vv + 4 * (size_t)ep * (size_t)nreq, *sd = sc + ep, *rc = sd + ep, *rd = rc + ep, any = 0;
            for (int q = 0; q < ep; q++) {
                sc[q] = (int64_t)s->rows[q] * (int64_t)width[a];
                sd[q] = (s->byte0 ? s->byte0[q] : 0) + (s->row0 ? s->row0[q] : 0) * (int64_t)width[a];
                rc[q] = (int64_t)d->rows[q] * (int64_t)width[a];
                rd[q] = (d->byte0 ? d->byte0[q] : 0) + (d->row0 ? d->row0[q] : 0) * (int64_t)width[a];
                any |= sc[q] | rc[q];
            }
            /* NCCL's sends and receives pair up by peer, so on CUDA memory a move with no
             * rows here is left out (its buffers may be empty regions, past an allocation) */
            if (!any && mem == MOEA2A_MEM_CUDA) continue;
            r = m2a_ialltoallv(fn, s->buf[a], sc, sd, d->buf[a], rc, rd, MOEA2A_UINT8, comm, stream, &req[nreq++]);
        }
    moea2a_result_t g = m2a_comm_fail(comm, m2a_transport_group(comm, mem, 0));
    if (r == MOEA2A_SUCCESS) r = g;
    for (int i = 0; i < nreq; i++) {
        moea2a_result_t w = req[i] ? moea2a_wait(&req[i]) : MOEA2A_SUCCESS;
        if (r == MOEA2A_SUCCESS) r = w;
    }
    free(vv), free(req);
    return r;
}

moea2a_result_t m2a_generic_first_stage(moea2a_moe_t moe, const int *node, const int32_t *s1_send,
                                        const int32_t *s1_recv, const int *index, int stride, unsigned char *fwd,
                                        size_t n_fwd, int64_t *v, m2a_move_side_t *pairs)
{
    const m2a_moe_layout_t *l = &moe->l;
    const int ep = moe->comm->nranks, me = moe->comm->rank, cap = moe->cfg.max_tokens_per_rank;
    int32_t *hs = (int32_t *)v, *hr = hs + ep, *xs = hr + ep, *xr = xs + ep; /* 2 ep int64 words */
    int64_t *sblk = v + 2 * ep, *wrow = sblk + ep, *frow = wrow + ep;
    for (int q = 0; q < ep; q++) {
        const int home = node[q] == node[me] && q != me, far = node[q] != node[me];
        hs[q] = home ? s1_send[q] : 0, hr[q] = home ? s1_recv[q] : 0;
        xs[q] = far ? s1_send[q] : 0, xr[q] = far ? s1_recv[q] : 0;
        if (xr[q] && index[q] < 0)
            return m2a_error(moe->comm, MOEA2A_ERR_INTERNAL, "moea2a_dispatch: rank %d relays rows through rank %d, "
                             "which is not its rail peer", q, me);
        sblk[q] = moe->stage_index[q] < 0 ? 0 : (int64_t)moe->stage_index[q] * cap * (int64_t)l->record;
        wrow[q] = (int64_t)q * stride, frow[q] = index[q] < 0 ? 0 : (int64_t)index[q] * cap;
    }
    memset(pairs, 0, 4 * sizeof(*pairs));
    pairs[0].rows = hs, pairs[0].byte0 = sblk, pairs[1].rows = hr, pairs[1].row0 = wrow;
    pairs[2].rows = xs, pairs[2].byte0 = sblk, pairs[3].rows = xr, pairs[3].row0 = frow;
    unsigned char *send = moe->stage + l->stage_send;
    for (int a = 0; a < l->narrays; a++) {
        pairs[0].buf[a] = pairs[2].buf[a] = send + (size_t)cap * l->array[a].rec;
        pairs[1].buf[a] = moe->ws + l->array[a].ws;
        pairs[3].buf[a] = fwd + n_fwd * l->array[a].rec;
    }
    return MOEA2A_SUCCESS;
}

/* The send half: route locally, exchange headers, pack and move every array. */
static moea2a_result_t dispatch_send(moea2a_moe_t moe, const m2a_generic_steps_t *st, moea2a_result_t mine,
                                     const m2a_dispatch_args_t *a, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    int ep = comm->nranks, n = a->n, rt = a->stride;

    m2a_phase_t ph;
    m2a_phase_start(&ph, st->wait, stream);
    /* 1. Route locally; the outcome of the checks travels with the headers. */
    int64_t invalid = 0, dedup = 0;
    if (mine == MOEA2A_SUCCESS) mine = st->route(moe, n, a->ids, stream, &invalid, &dedup);
    /* A failure that broke the communicator (device work stuck on a dead peer) has
     * no headers to travel with: return it, not the ABORTED of the exchange. */
    if (mine != MOEA2A_SUCCESS && comm->broken != MOEA2A_SUCCESS) return mine;
    if (mine != MOEA2A_SUCCESS) memset(moe->h_send_counts, 0, sizeof(int32_t) * (size_t)ep);
    m2a_phase_mark(&ph, stream, "route");

    /* 2. Headers. */
    M2A_TRY(m2a_generic_headers(moe, mine, n, rt, moe->h_send_counts, moe->h_recv_counts));
    m2a_phase_mark(&ph, stream, "headers");

    /* 3. Pack and move every array. */
    moea2a_result_t r = st->pack(moe, a, stream);
    m2a_phase_mark(&ph, stream, "pack");
    if (r == MOEA2A_SUCCESS) r = exchange_arrays(moe, rt, stream);
    if (r != MOEA2A_SUCCESS) return r;
    m2a_phase_mark(&ph, stream, "exchange");
    m2a_phase_report(&ph, "dispatch send");
    moe->num_tokens = n, moe->stride = rt;
    moe->pending_invalid = invalid, moe->pending_dedup = dedup;
    return MOEA2A_SUCCESS;
}

/* The receive half: sanitize the padding slots. */
static moea2a_result_t dispatch_recv(moea2a_moe_t moe, const m2a_generic_steps_t *st,
                                     moea2a_dispatch_result_t *result, void *stream)
{
    m2a_phase_t ph;
    m2a_phase_start(&ph, st->wait, stream);
    M2A_TRY(st->sanitize(moe, moe->stride, stream));
    m2a_phase_mark(&ph, stream, "sanitize");
    m2a_phase_report(&ph, "dispatch receive");
    m2a_moe_fill_result(moe, NULL, result);
    M2A_TRACE(M2A_SUBSYS_MOE, "dispatch: %d tokens, sent %lld rows, received %lld, %lld invalid entries",
              moe->num_tokens, (long long)result->sent_rows, (long long)result->total_recv,
              (long long)moe->pending_invalid);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_generic_dispatch(moea2a_moe_t moe, moea2a_result_t status, const m2a_dispatch_args_t *a,
                                     moea2a_dispatch_result_t *result, int phases, void *stream)
{
    const m2a_generic_steps_t *st = moe->steps;
    if (phases & M2A_MOE_SEND) M2A_TRY(dispatch_send(moe, st, status, a, stream));
    if (phases & M2A_MOE_RECV) M2A_TRY(dispatch_recv(moe, st, result, stream));
    return MOEA2A_SUCCESS;
}

/* The send half of a combine: everyone learns whether everyone can go on, then the
 * expert side sends back each source's rows from [src][stride][hidden]; the token
 * side lands them per staged peer. */
moea2a_result_t m2a_generic_combine_agree(moea2a_moe_t moe, moea2a_result_t mine)
{
    moea2a_comm_t comm = moe->comm;
    int ep = comm->nranks;
    int32_t *st = calloc((size_t)ep, sizeof(int32_t));
    if (!st) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    int32_t me = mine;
    moea2a_result_t r = m2a_allgather("moea2a_combine", &me, st, 1, MOEA2A_INT32, comm, NULL);
    int failed = 0;
    for (int q = 0; r == MOEA2A_SUCCESS && q < ep; q++) failed |= st[q] != MOEA2A_SUCCESS;
    if (failed) r = m2a_comm_tell_failures(comm, "moea2a_combine", mine, st, 1);
    free(st);
    return r;
}

static moea2a_result_t combine_send(moea2a_moe_t moe, moea2a_result_t mine, const void *expert_out, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    int ep = comm->nranks;
    moea2a_result_t r = m2a_generic_combine_agree(moe, mine);
    if (r != MOEA2A_SUCCESS) return r;

    const unsigned char *in = expert_out ? expert_out : moe->ws + l->combine;
    const m2a_generic_steps_t *st = moe->steps;
    if (st->combine_rows) M2A_TRY(st->combine_rows(moe, in, &in, stream));
    size_t row = l->combine_wire;
    int64_t *v = vectors(ep, 1);
    if (!v) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    exchange_t x = {v, v + ep, v + 2 * ep, v + 3 * ep};
    exchange_plan(moe, &x, moe->h_recv_counts, moe->h_send_counts, row, (size_t)moe->stride * row, 0,
                  (size_t)moe->cfg.max_tokens_per_rank * row, 1);
    unsigned char *landing = moe->stage ? moe->stage + l->stage_recv : NULL;
    r = m2a_alltoallv("moea2a_combine", in, x.sc, x.sd, landing, x.rc, x.rd, MOEA2A_UINT8, comm, stream);
    free(v);
    if (r == MOEA2A_SUCCESS) moe->combine_in = in;
    return r;
}

moea2a_result_t m2a_generic_combine(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out,
                                    int phases, void *stream)
{
    const m2a_generic_steps_t *st = moe->steps;
    m2a_phase_t ph;
    m2a_phase_start(&ph, st->wait, stream);
    if (phases & M2A_MOE_SEND) M2A_TRY(combine_send(moe, status, expert_out, stream));
    m2a_phase_mark(&ph, stream, "exchange");
    if (phases & M2A_MOE_RECV) M2A_TRY(st->reduce(moe, moe->combine_in, out, stream));
    m2a_phase_mark(&ph, stream, "reduce");
    m2a_phase_report(&ph, "combine");
    return MOEA2A_SUCCESS;
}

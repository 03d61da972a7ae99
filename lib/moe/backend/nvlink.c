/* The nvlink backend: CUDA memory on ranks that all reach each other by load/store.
 * The workspace is symmetric memory (every rank's reachable from every GPU); each half
 * of a dispatch or combine is one kernel launch that never waits on the host; errors
 * found on the device land in a record the host polls (cuda/kernels/moe_fast.cu has the
 * protocol). In copy-engine mode (MOEA2A_MOE_COPY_ENGINE) the same kernels route,
 * signal, check and sanitize, and lib/moe/backend/copy_engine.c moves the rows. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "moe/backend.h"
#include "moe/core.h"
#include "comm/cuda.h"
#include "moe/backend/copy_engine.h"
#include "moe/backend/cuda_steps.h"
#include "comm/cuda_module.h"
#include "moe/backend/symmetric.h"
#include "base/params.h"

/* signals peers write, block scratch, counters, a failed check's reason (the formula:
 * A(16 ep) + A(1024) + A(384) + A(256)), and the device error record's host copy;
 * copy-engine mode's share after it */
static void nvlink_size(const moea2a_moe_config_t *c, int ep, const m2a_moe_nodes_t *nodes, m2a_moe_backend_size_t *out)
{
    (void)nodes; /* one node */
    out->ctl_bytes = m2a_align(M2A_FAST_SIG_BYTES(ep)) + m2a_align(M2A_FAST_BLOCK_BYTES) + m2a_align(M2A_FAST_CTL_BYTES) +
                     m2a_align(M2A_FAST_REASON_BYTES);
    out->pinned_bytes = sizeof(m2a_fast_error_t);
    out->quantized_rows = 1;
    out->combine_wire_in_place = 1; /* the FP8 combine's rows: quantized in the combine buffer */
    out->device_load = 1, out->device_tables = 1;
    if (c->flags & MOEA2A_MOE_COPY_ENGINE) m2a_ce_size(c, ep, out);
}

/* The CUDA calls go through the CUDA module: nvlink_alloc loads it (m2a_moe_cuda_begin)
 * before anything else here runs. */
#define OPS (m2a_cuda_loaded())

_Static_assert((int)M2A_FAST_SEND == (int)M2A_MOE_SEND && (int)M2A_FAST_RECV == (int)M2A_MOE_RECV &&
                   (int)M2A_FAST_BOTH == (int)M2A_MOE_BOTH,
               "the kernels' phases and the MoE layer's differ");

typedef struct {
    m2a_fast_t f;
    int blocks;
    m2a_symm_t symm; /* the workspace */
    size_t bytes;    /* allocated */
    moea2a_result_t poisoned;
    m2a_ce_t *ce; /* copy-engine mode, else NULL */
    /* quantize on dispatch alongside the dispatch kernel (FP8 payloads; NULL: never):
     * the context's stream, and the events that fork it from the caller's and join back */
    void *qstream, *fork, *join;
    /* quantize on dispatch inside the dispatch's copies: the payloads it applies to
     * (bit i: payload i), and the kernels' view of them (m2a_fast_t.qfuse...), set in
     * the parameters of a call that sends */
    unsigned in_copy;
    uint32_t qfuse, qfuse_ue8m0, qfuse_f16;
    unsigned fp8_finished; /* bit i: payload i is FP8, finished by the in-copy kernels (f.qfin) */
    int sms; /* the GPU's */
    size_t reason;                           /* workspace offset of the reason region */
    char reason_text[M2A_FAST_REASON_BYTES]; /* what this rank last wrote there */
} fast_state_t;

static moea2a_result_t cuda_fail(moea2a_comm_t comm, int e, const char *what)
{
    return m2a_error(comm, MOEA2A_ERR_CUDA, "moea2a (load/store path): %s: %s", what, OPS->error_string(e));
}

/* The kernels' parameters, once the kernel tables exist; even_tokens: the dispatch's
 * few-token bound (MOEA2A_DISPATCH_EVEN_TOKENS). */
static void fast_params(moea2a_moe_t moe, int even_tokens)
{
    const m2a_moe_layout_t *l = &moe->l;
    fast_state_t *st = moe->state;
    m2a_fast_t *f = &st->f;
    f->p = *(const m2a_kparams_t *)moe->kparams;
    f->sig = l->backend_ctl; /* the regions of nvlink_size, in order */
    f->blocks = f->sig + m2a_align(M2A_FAST_SIG_BYTES(moe->comm->nranks));
    f->ctl = f->blocks + m2a_align(M2A_FAST_BLOCK_BYTES);
    st->reason = f->ctl + m2a_align(M2A_FAST_CTL_BYTES);
    f->general = (moe->cfg.flags & MOEA2A_MOE_GENERAL_PLACEMENT) != 0;
    f->recv_counts = l->recv_counts, f->send_map = l->send_map, f->combine = l->combine;
    f->combine_row = l->combine_row, f->combine_dtype = moe->cfg.combine_dtype, f->hidden = moe->cfg.hidden;
    f->combine_fp8 = m2a_moe_cuda_combine_wire(&moe->cfg);
    f->sanitize = !(moe->cfg.flags & MOEA2A_MOE_NO_SANITIZE);
    f->rewrite = (moe->cfg.flags & MOEA2A_MOE_REWRITE_NONLOCAL) != 0;
    f->timeout_ns = (unsigned long long)(moe->comm->timeout_s * 1e9);
    f->even_tokens = even_tokens;
    /* FP8 payloads' receive finish, done by the in-copy kernels' receive half (one
     * launch for the whole dispatch) */
    f->nqfin = 0;
    for (int a = 0; a < l->narrays; a++) {
        const int i = l->array[a].payload;
        if (l->array[a].kind != M2A_ARR_SCALES || moe->cfg.wire[i].format != MOEA2A_WIRE_FP8) continue;
        f->qfin[f->nqfin].arr = a;
        f->qfin[f->nqfin++].mn = moe->cfg.wire[i].scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR ? l->wire_final[i] : 0;
        st->fp8_finished |= 1u << i;
    }
}

/* Says how the combine (copy-engine mode's sum too) reduces past the even split: bulk
 * copies, or 16-byte loads and why, with a warning where an sm_90+ GPU refused the bulk
 * copies their shared memory (that combine is several times slower at few SMs). */
static void log_combine_way(moea2a_moe_t moe)
{
    const fast_state_t *st = moe->state;
    const int ep = moe->comm->nranks, k = moe->cfg.top_k, rows = k < ep ? k : ep;
    size_t unit = 0, smem = 0;
    int stages = 0;
    switch (OPS->fast_bulk(&st->f, &unit, &stages, &smem)) {
    case M2A_FAST_BULK_OK:
        M2A_INFO(M2A_SUBSYS_MOE,
                 "combine: past the even split, bulk copies into shared memory (units of %zu bytes from each rank a "
                 "token reaches, at most %d; %d units in flight per warp)", unit, rows, stages);
        break;
    case M2A_FAST_BULK_ROWS:
        M2A_INFO(M2A_SUBSYS_MOE, "combine: 16-byte loads (a token may reach %d ranks, more than a bulk-copy stage holds)",
                 rows);
        break;
    case M2A_FAST_BULK_ARCH: M2A_INFO(M2A_SUBSYS_MOE, "combine: 16-byte loads (bulk copies need sm_90 or later)"); break;
    default:
        M2A_WARN(M2A_SUBSYS_MOE,
                 "combine: 16-byte loads: the GPU refused the bulk-copy kernels %zu bytes of shared memory per block, so "
                 "the combine past the even split is slower at few SMs", smem);
    }
}

/* Collective: the workspace as symmetric memory, the SM budget, the error record;
 * MOEA2A_ERR_UNAVAILABLE on every rank when some rank does not reach every other by
 * load/store. */
static moea2a_result_t fast_alloc(moea2a_moe_t moe)
{
    moea2a_comm_t comm = moe->comm;
    int ep = comm->nranks;
    fast_state_t *st = calloc(1, sizeof(*st));
    unsigned char **peers = calloc((size_t)ep, sizeof(*peers));
    if (!st || !peers) {
        free(st), free(peers);
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    }
    moea2a_result_t r = ep <= M2A_FAST_MAX_PEERS ? MOEA2A_SUCCESS
                                                 : m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                                                             "the load/store kernels serve at most %d ranks",
                                                             M2A_FAST_MAX_PEERS);
    /* 1. local: the device, the kernels, the SM budget */
    st->bytes = (moe->l.workspace + 4095) / 4096 * 4096;
    int blocks = moe->cfg.num_sms, sms = 0;
    if (r == MOEA2A_SUCCESS && comm->cuda_device >= 0 && OPS->set_device(comm->cuda_device) != 0)
        r = m2a_error(comm, MOEA2A_ERR_CUDA, "moea2a_moe_create: cudaSetDevice(%d) failed", comm->cuda_device);
    if (r == MOEA2A_SUCCESS && OPS->sm_count(moe->device, &sms) == 0 && sms < blocks)
        blocks = sms; /* every block must be resident: they wait for each other's peers */
    /* 2. collective: the workspace, every rank's address of it */
    r = m2a_symm_open(comm, r, st->bytes, (void **)peers, &st->symm);
    /* ranks that share a GPU share its SMs: all their blocks must be resident at once */
    if (r == MOEA2A_SUCCESS && st->symm.gpu_ranks > 1 && blocks > sms / st->symm.gpu_ranks)
        blocks = sms / st->symm.gpu_ranks > 0 ? sms / st->symm.gpu_ranks : 1;
    void *ws = st->symm.ptr;
    if (r == MOEA2A_SUCCESS && OPS->malloc((void **)&st->f.err, sizeof(m2a_fast_error_t)) != 0)
        r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: cudaMalloc of the error record failed");
    if (r == MOEA2A_SUCCESS) {
        int e = OPS->set(st->f.err, 0, sizeof(m2a_fast_error_t));
        m2a_fast_error_t *h = (m2a_fast_error_t *)(moe->pinned + moe->l.pinned_backend);
        memset(h, 0, sizeof(*h));
        if (e == 0) e = OPS->host_device_pointer((void **)&st->f.host_err, h);
        if (e == 0) r = m2a_comm_watch(comm, &h->dead); /* the device waits read it (M2A_FAST_DEAD_LOOK_NS) */
        if (e == 0) e = OPS->set(ws, 0, st->bytes); /* counters and epochs start at 0 */
        if (e == 0) e = OPS->device_synchronize();
        if (e != 0) r = cuda_fail(comm, e, "workspace set-up");
    }
    /* 3. collective again: a peer's first kernel writes into this workspace, so none
     * may run before every rank's is zeroed (a late zeroing erased a peer's signal);
     * and every rank's kernels take the same number of blocks */
    r = m2a_moe_agree(comm, r, &blocks);
    if (r != MOEA2A_SUCCESS) {
        m2a_comm_unwatch(comm, &((m2a_fast_error_t *)(moe->pinned + moe->l.pinned_backend))->dead);
        (void)OPS->device_synchronize();
        m2a_symm_close(comm, &st->symm, !m2a_peer_lost(r));
        if (st->f.err) OPS->free(st->f.err);
        free(st), free(peers);
        return r;
    }
    moe->ws = ws;
    st->blocks = blocks, st->sms = sms;
    moe->state = st;
    for (int q = 0; q < ep; q++) st->f.peer[q] = peers[q];
    free(peers);
    M2A_INFO(M2A_SUBSYS_MOE, "MoE context on the load/store path: %d ranks over NVLink (%s), %d SMs per kernel", ep,
             st->symm.way->name, blocks);
    return MOEA2A_SUCCESS;
}

static void fast_release(moea2a_moe_t moe)
{
    fast_state_t *st = moe->state;
    if (!st) return;
    moea2a_comm_t comm = moe->comm;
    /* Peers may still read this workspace: every rank's kernels end first (they are
     * bounded), then all meet, then the workspace goes. */
    (void)OPS->device_synchronize();
    m2a_comm_unwatch(comm, &((m2a_fast_error_t *)(moe->pinned + moe->l.pinned_backend))->dead);
    if (OPS->fast_profile_report) OPS->fast_profile_report(moe->comm->rank);
    m2a_symm_close(comm, &st->symm, !moe->leaving);
    moe->ws = NULL;
    OPS->free(st->f.err);
    m2a_ce_destroy(st->ce);
    if (st->join) OPS->event_destroy(st->join);
    if (st->fork) OPS->event_destroy(st->fork);
    if (st->qstream) OPS->stream_destroy(st->qstream);
    free(st);
    moe->state = NULL;
}

/* After a failure the context is unusable; every later call returns r. */
static void fast_poison(moea2a_moe_t moe, moea2a_result_t r)
{
    fast_state_t *st = moe->state;
    if (st && st->poisoned == MOEA2A_SUCCESS) st->poisoned = r;
}

static const char *step_name(int what)
{
    switch (what) {
    case M2A_FAST_AT_GATE: return "waiting for rank %d to begin its previous combine";
    case M2A_FAST_AT_ARRIVE: return "waiting for rank %d's dispatched rows";
    case M2A_FAST_AT_HEADER: return "in the header of rank %d's dispatch";
    case M2A_FAST_AT_COMBINE: return "waiting for rank %d's combine rows";
    case M2A_FAST_AT_COMBINE_HEADER: return "in the combine of rank %d";
    case M2A_FAST_AT_QUANTIZE: return "waiting for this rank's quantization alongside the dispatch (rank %d)";
    default: return "waiting for this rank's own blocks (rank %d)";
    }
}

/* The call a device wait belongs to, for an error that names another rank than the
 * one waited on. */
static const char *step_phase(int what)
{
    switch (what) {
    case M2A_FAST_AT_COMBINE:
    case M2A_FAST_AT_COMBINE_HEADER: return "in a combine";
    default: return "in a dispatch";
    }
}

/* Before the launch that tells the peers this rank's checks failed: its message (the
 * call's name left out, the peers name the call) into its workspace's reason region,
 * in order on the stream. */
static void publish_reason(moea2a_moe_t moe, void *stream)
{
    fast_state_t *st = moe->state;
    const char *m = moea2a_last_error(moe->comm), *colon = strstr(m, ": ");
    if (!strncmp(m, "moea2a_", 7) && colon) m = colon + 2;
    snprintf(st->reason_text, sizeof(st->reason_text), "%s", m);
    (void)OPS->copy_async(moe->ws + st->reason, st->reason_text, strlen(st->reason_text) + 1, M2A_CUDA_H2D, stream);
}

/* Why rank peer's call failed, as it wrote it into its workspace (publish_reason). */
static void peer_reason(moea2a_moe_t moe, int peer, char *why, size_t len)
{
    const fast_state_t *st = moe->state;
    char text[M2A_FAST_REASON_BYTES] = "";
    if (peer >= 0 && peer < moe->comm->nranks &&
        OPS->copy(text, (const unsigned char *)st->f.peer[peer] + st->reason, sizeof(text), M2A_CUDA_D2H) == 0 &&
        (text[sizeof(text) - 1] = 0, text[0]))
        snprintf(why, len, "rank %d: %s", peer, text);
    else
        snprintf(why, len, "that rank's arguments failed its checks");
}

/* The context's state: an earlier failure, or an error a kernel recorded. */
static moea2a_result_t fast_status(moea2a_moe_t moe)
{
    fast_state_t *st = moe->state;
    moea2a_comm_t comm = moe->comm;
    if (st->poisoned != MOEA2A_SUCCESS)
        return m2a_error(comm, st->poisoned, "moea2a: this MoE context failed earlier (%s) and must be destroyed",
                         moea2a_strerror(st->poisoned));
    volatile m2a_fast_error_t *h = (volatile m2a_fast_error_t *)(moe->pinned + moe->l.pinned_backend);
    int code = h->code;
    if (code == 0) return MOEA2A_SUCCESS;
    __sync_synchronize();
    int peer = h->peer, what = h->what;
    st->poisoned = (moea2a_result_t)code;
    char step[96], why[M2A_FAST_REASON_BYTES + 64];
    snprintf(step, sizeof(step), step_name(what), peer);
    if (code == MOEA2A_ERR_PEER_FAILED) {
        char how[160];
        m2a_comm_dead_how(comm, how, sizeof(how));
        return m2a_error(comm, MOEA2A_ERR_PEER_FAILED,
                         "moea2a (load/store path): MOEA2A_ERR_PEER_FAILED: rank %d is gone (%s, as this rank's peer "
                         "watcher saw), seen by a device wait %s; the context must be destroyed", peer, how,
                         step_phase(what));
    }
    if (code == MOEA2A_ERR_TIMEOUT) snprintf(why, sizeof(why), "no progress within MOEA2A_TIMEOUT_S");
    else if (code == MOEA2A_ERR_MISMATCH) snprintf(why, sizeof(why), "it passed a different runtime_max_tokens_per_rank");
    else peer_reason(moe, peer, why, sizeof(why));
    return m2a_error(comm, (moea2a_result_t)code,
                     "moea2a (load/store path): %s %s (%s, after %.1f s at most); the context must be destroyed",
                     moea2a_strerror((moea2a_result_t)code), step, why, comm->timeout_s);
}

/* Quantize on dispatch alongside the dispatch kernel, when the payloads sent quantized
 * are all FP8 (its kernels count finished rows per chunk), the batch takes the
 * counter's path (over MOEA2A_DISPATCH_EVEN_TOKENS per block) and the GPU has SMs the
 * dispatch does not hold: one row-major quantization per payload on the context's stream, forked from
 * the caller's after the counters are zeroed, on the SMs the dispatch leaves; the
 * dispatch copies a chunk of n / M2A_FAST_QCHUNKS tokens once it is quantized. */
static int quant_alongside(const moea2a_moe_t moe, int n, int phases, const void *const *payloads)
{
    const fast_state_t *st = moe->state;
    if (!st->qstream || st->ce || !(phases & M2A_FAST_SEND) || !payloads ||
        (long long)n <= (long long)st->f.even_tokens * st->blocks) /* the few-token kernel waits for no chunk */
        return 0;
    return st->sms - st->blocks >= 8;
}

static int quant_groups(const moea2a_moe_t moe)
{
    int g = 0;
    for (int i = 0; i < moe->cfg.num_payloads; i++)
        if (moe->cfg.wire[i].format == MOEA2A_WIRE_FP8) g += (int)(moe->cfg.payloads[i].elems_per_token / 16);
    return g;
}

/* The context's stream for it, at create: where FP8 is the only quantized wire format
 * and MOEA2A_QUANT_OVERLAP allows: by default where the context spans 2+ GPUs (2 x
 * H200, 4096 tokens: 131 against 142 us; with one rank, every row an HBM copy, the two
 * kernels share one memory and it cost 17% on an H100); without it (or its events)
 * dispatch quantizes first. Not where the dispatch quantizes in its copies
 * (quant_in_copy_open, run before). */
static void quant_stream_open(moea2a_moe_t moe)
{
    fast_state_t *st = moe->state;
    int fp8 = 0, other = 0;
    long on = -1;
    for (int i = 0; i < moe->cfg.num_payloads; i++) {
        fp8 |= moe->cfg.wire[i].format == MOEA2A_WIRE_FP8;
        other |= moe->cfg.wire[i].format != MOEA2A_WIRE_FP8 && moe->cfg.wire[i].format != MOEA2A_WIRE_AS_IS;
    }
    if (!fp8 || other || st->in_copy || m2a_comm_record(moe->comm, m2a_param_int("MOEA2A_QUANT_OVERLAP", &on)) != MOEA2A_SUCCESS)
        return;
    if (on == 0 || (on < 0 && moe->comm->nranks < 2)) return;
    if (OPS->stream_create(&st->qstream) || OPS->event_create(&st->fork) ||
        OPS->event_create(&st->join)) {
        M2A_INFO(M2A_SUBSYS_MOE, "quantize on dispatch: no stream of its own (%s); it runs before the dispatch",
                 OPS->error_string(OPS->clear_error()));
        if (st->join) OPS->event_destroy(st->join);
        if (st->fork) OPS->event_destroy(st->fork);
        if (st->qstream) OPS->stream_destroy(st->qstream);
        st->qstream = st->fork = st->join = NULL;
    }
}

/* The default quantizes FP8 inside the copies where it was measured fastest: 2 ranks
 * whose kernels have this many SMs or more (2 x H200, 48 SMs, dispatch kernel time at
 * 1 / 128 / 1024 / 4096 tokens: 13.8 / 16.2 / 44.7 / 120.1 us, against 15.6 / 18.4 /
 * 50.6 / 124.4 quantizing alongside). On 4 GPUs (4 x H100) quantizing alongside led at
 * 4096 tokens (292.6 against 312.3 us), and one GPU at 24 SMs lost 25% in the copies. */
#define M2A_IN_COPY_MIN_SMS 48

/* Quantize on dispatch inside the dispatch's copies, decided at create where
 * MOEA2A_QUANT_IN_COPY allows: each FP8 payload from bf16 or fp16 rows whose codes
 * start a multiple of 512 bytes into a token's arrays laid end to end (so the kernel's
 * units hold whole UE8M0 scale words; the first payload always does). Not in
 * copy-engine mode, where the copy engines move the rows. The rows' 16-byte alignment
 * the kernel needs is checked for every payload quantized on dispatch (moe.c). */
static void quant_in_copy_open(moea2a_moe_t moe)
{
    fast_state_t *st = moe->state;
    const m2a_moe_layout_t *l = &moe->l;
    long on = -1;
    if (st->ce || m2a_comm_record(moe->comm, m2a_param_int("MOEA2A_QUANT_IN_COPY", &on)) != MOEA2A_SUCCESS) return;
    if (on < 0) on = moe->comm->nranks == 2 && st->blocks >= M2A_IN_COPY_MIN_SMS;
    if (!on) return;
    size_t start = 0; /* of array a in the concatenation, each array 16-byte aligned in it */
    /* the byte arrays (payloads, scales, global scales) come first */
    for (int a = 0; a < l->narrays && l->array[a].kind <= M2A_ARR_GLOBAL; start += (l->array[a].width + 15) / 16 * 16, a++) {
        const int i = l->array[a].payload;
        const moea2a_datatype_t t = moe->cfg.payloads[i].dtype;
        if (l->array[a].kind != M2A_ARR_PAYLOAD || moe->cfg.wire[i].format != MOEA2A_WIRE_FP8 || start % 512 ||
            (t != MOEA2A_BFLOAT16 && t != MOEA2A_FLOAT16))
            continue;
        st->in_copy |= 1u << i, st->qfuse |= 1u << a;
        if (moe->cfg.wire[i].flags & MOEA2A_FP8_UE8M0) st->qfuse_ue8m0 |= 1u << a;
        if (t == MOEA2A_FLOAT16) st->qfuse_f16 |= 1u << a;
    }
    if (st->in_copy) M2A_INFO(M2A_SUBSYS_MOE, "quantize on dispatch: FP8 payloads 0x%x inside the dispatch's copies", st->in_copy);
}

/* Copy-engine mode's send half: the routing launch, its error record once the host
 * has waited for it, then the rows and the signal. */
static moea2a_result_t ce_send(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights, m2a_kpayloads_t pay,
                               int stride, moea2a_result_t status, void *stream)
{
    fast_state_t *st = moe->state;
    M2A_TRY(m2a_ce_dispatch_route(moe, st->ce, n, stride, (int)status, ids, weights, stream));
    if (status != MOEA2A_SUCCESS) return MOEA2A_SUCCESS;
    M2A_TRY(fast_status(moe));
    return m2a_ce_dispatch_rows(moe, st->ce, n, stride, pay, stream);
}

/* One dispatch launch; status != MOEA2A_SUCCESS: this rank's checks failed, it tells
 * its peers and sends nothing. */
static moea2a_result_t fast_dispatch(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                     const void *const *payloads, int stride, moea2a_result_t status, int phases,
                                     void *stream)
{
    fast_state_t *st = moe->state;
    m2a_kpayloads_t pay;
    const m2a_fast_t *fp = &st->f;
    m2a_fast_t f; /* with the quantization's chunks when it runs alongside, or the arrays quantized in the copies */
    /* the quantization's blocks: 8 of 256 threads per SM the dispatch leaves (launched
     * after the dispatch, they find its SMs full: each block of it holds most of an SM's
     * registers) */
    m2a_quant_overlap_t ov = {st->qstream, (uint32_t *)(fp->peer[moe->comm->rank] + fp->ctl + M2A_FAST_CTL_QREADY),
                              (n + M2A_FAST_QCHUNKS - 1) / M2A_FAST_QCHUNKS, 8 * (st->sms - st->blocks)};
    const int along = status == MOEA2A_SUCCESS && quant_alongside(moe, n, phases, payloads);
    const unsigned in_copy = status == MOEA2A_SUCCESS && (phases & M2A_FAST_SEND) && payloads ? st->in_copy : 0;
    (void)OPS->clear_error(); /* an earlier call's error is not this launch's */
    if (along) { /* the counters zeroed, then the context's stream forked from the caller's */
        int e = OPS->set_async(ov.ready, 0, 4 * M2A_FAST_QCHUNKS, stream);
        if (!e) e = OPS->event_record(st->fork, stream);
        if (!e) e = OPS->stream_wait_event(st->qstream, st->fork);
        if (e) {
            st->poisoned = MOEA2A_ERR_CUDA;
            return cuda_fail(moe->comm, e, "quantize on dispatch: the fork of its stream");
        }
        f = st->f, f.qrows = ov.rows, f.qgroups = (uint32_t)quant_groups(moe), fp = &f;
    }
    if (in_copy) f = st->f, f.qfuse = st->qfuse, f.qfuse_ue8m0 = st->qfuse_ue8m0, f.qfuse_f16 = st->qfuse_f16, fp = &f;
    moea2a_result_t r =
        m2a_moe_cuda_sources(moe, n, status == MOEA2A_SUCCESS ? payloads : NULL, stream, !along, in_copy, &pay);
    if (r != MOEA2A_SUCCESS) { /* the peers wait for this launch: it goes, as a failed rank's */
        status = r;
        memset(&pay, 0, sizeof(pay));
    }
    if (status != MOEA2A_SUCCESS && (phases & M2A_FAST_SEND)) publish_reason(moe, stream);
    if (st->ce && (phases & M2A_FAST_SEND)) {
        moea2a_result_t c = ce_send(moe, n, ids, weights, pay, stride, status, stream);
        if (c != MOEA2A_SUCCESS) { /* the peers wait for rows or a signal that will not come */
            st->poisoned = c;
            return c;
        }
        if (!(phases &= ~M2A_FAST_SEND)) {
            if (r != MOEA2A_SUCCESS) st->poisoned = r;
            return r;
        }
    }
    int e = OPS->fast_dispatch(fp, st->blocks, status ? 0 : n, stride, (int)status, pay, status ? NULL : ids,
                              status ? NULL : weights, phases, stream);
    if (e) {
        st->poisoned = MOEA2A_ERR_CUDA;
        return cuda_fail(moe->comm, e, "dispatch kernel launch");
    }
    if (along) { /* the quantization, then the caller's stream waits for it */
        moea2a_result_t q = m2a_moe_cuda_quantize_alongside(moe, n, payloads, &ov);
        e = OPS->event_record(st->join, st->qstream);
        if (!e) e = OPS->stream_wait_event(stream, st->join);
        if (q == MOEA2A_SUCCESS && e) q = cuda_fail(moe->comm, e, "quantize on dispatch: the join of its stream");
        if (q != MOEA2A_SUCCESS) { /* this rank's dispatch then times out waiting for its rows: final */
            st->poisoned = q;
            return q;
        }
    }
    if (r != MOEA2A_SUCCESS) st->poisoned = r;
    if (r == MOEA2A_SUCCESS && status == MOEA2A_SUCCESS && (phases & M2A_FAST_RECV))
        r = m2a_moe_cuda_wire_finish(moe, stride, in_copy ? st->fp8_finished : 0, stream);
    return r;
}

/* One combine launch; status != MOEA2A_SUCCESS: this rank's checks failed; its peers'
 * kernels record that error instead of reading its rows. */
static moea2a_result_t fast_combine(moea2a_moe_t moe, const void *expert_out, void *out, moea2a_result_t status,
                                    int phases, void *stream)
{
    fast_state_t *st = moe->state;
    const unsigned char *rows = expert_out;
    /* The kernel sees this workspace through the window's mapping, not the allocation's:
     * the same memory at another address. Rows the caller passes at the combine buffer
     * (moea2a_moe_combine_buffer's pointer) must be recognized as in place there, not
     * copied onto themselves. */
    if (rows >= moe->ws && rows < moe->ws + st->bytes) rows = st->f.peer[moe->comm->rank] + (rows - moe->ws);
    /* copy-engine mode: the receive launch only waits for the peers' rows (no tokens);
     * then the copy engines pull them and the sum runs here */
    const int ce = st->ce && (phases & M2A_FAST_RECV);
    if (ce) M2A_TRY(m2a_ce_combine_check(moe, stream));
    const int n = out && !status && !ce ? moe->num_tokens : 0;
    (void)OPS->clear_error();
    if (status != MOEA2A_SUCCESS && (phases & M2A_FAST_SEND)) publish_reason(moe, stream);
    int e = OPS->fast_combine(&st->f, st->blocks, n, moe->stride, status ? NULL : rows, status || ce ? NULL : out,
                              (int)status, phases, stream);
    if (e) {
        st->poisoned = MOEA2A_ERR_CUDA;
        return cuda_fail(moe->comm, e, "combine kernel launch");
    }
    if (ce && out && !status) {
        moea2a_result_t r = m2a_ce_combine_rows(moe, st->ce, moe->num_tokens, moe->stride, out, stream);
        if (r != MOEA2A_SUCCESS) st->poisoned = r;
        return r;
    }
    return MOEA2A_SUCCESS;
}

/* [4] device stats of the last dispatch. */
static const int64_t *fast_stats(moea2a_moe_t moe)
{
    return (const int64_t *)(moe->ws + ((fast_state_t *)moe->state)->f.ctl + M2A_FAST_CTL_STATS);
}

/* ---- the backend's operations -------------------------------------------------------- */

static void nvlink_release(moea2a_moe_t moe)
{
    fast_release(moe); /* frees the symmetric workspace */
    m2a_moe_cuda_end(moe);
}

static moea2a_result_t nvlink_alloc(moea2a_moe_t moe)
{
    /* fast_alloc is collective: a rank whose device set-up (or a variable) failed must
     * not skip it alone */
    long even = 0;
    moea2a_result_t r = m2a_moe_cuda_begin(moe);
    if (r == MOEA2A_SUCCESS) r = m2a_comm_record(moe->comm, m2a_param_int("MOEA2A_DISPATCH_EVEN_TOKENS", &even));
    r = m2a_moe_agree(moe->comm, r, NULL);
    if (r == MOEA2A_SUCCESS) r = fast_alloc(moe);
    if (r == MOEA2A_SUCCESS) r = m2a_moe_cuda_finish(moe);
    if (r == MOEA2A_SUCCESS) fast_params(moe, (int)even), log_combine_way(moe);
    if (moe->cfg.flags & MOEA2A_MOE_COPY_ENGINE) { /* every rank takes this branch (the config is agreed) */
        fast_state_t *st = moe->state;
        if (r == MOEA2A_SUCCESS) r = m2a_ce_create(moe, &st->f, st->blocks, sizeof(m2a_fast_error_t), &st->ce);
        r = m2a_moe_agree(moe->comm, r, NULL);
    }
    if (r == MOEA2A_SUCCESS) quant_in_copy_open(moe), quant_stream_open(moe); /* after the copy engines: not with them */
    return r;
}

/* The checks travel to the peers inside the launch (a rank whose checks failed sends
 * its status instead of rows), so a rejection is final for the context everywhere. */
static moea2a_result_t nvlink_dispatch(moea2a_moe_t moe, moea2a_result_t status, const m2a_dispatch_args_t *a,
                                       moea2a_dispatch_result_t *result, int phases, void *stream)
{
    M2A_TRY(fast_status(moe));
    if (phases & M2A_MOE_SEND) {
        const int stride = status == MOEA2A_SUCCESS ? a->stride : moe->cfg.max_tokens_per_rank; /* every slot fits */
        moea2a_result_t r = fast_dispatch(moe, a->n, a->ids, a->weights, a->payloads, stride, status, phases, stream);
        if (status != MOEA2A_SUCCESS) {
            fast_poison(moe, status);
            return status;
        }
        M2A_TRY(r);
        moe->num_tokens = a->n, moe->stride = a->stride;
    } else {
        M2A_TRY(fast_dispatch(moe, moe->num_tokens, NULL, NULL, NULL, moe->stride, MOEA2A_SUCCESS, phases, stream));
    }
    if (phases & M2A_MOE_RECV) m2a_moe_fill_result(moe, fast_stats(moe), result);
    return MOEA2A_SUCCESS;
}

/* A rank whose checks failed launches its send half too, so that its peers' kernels
 * record the failure instead of reading its rows; its context is poisoned. */
static moea2a_result_t nvlink_combine(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out,
                                      int phases, void *stream)
{
    M2A_TRY(fast_status(moe));
    moea2a_result_t r = fast_combine(moe, expert_out, out, status, phases, stream);
    if (status == MOEA2A_SUCCESS) status = r;
    if (status != MOEA2A_SUCCESS && (phases & M2A_MOE_SEND)) fast_poison(moe, status);
    return status;
}

/* A dispatch's peers wait, before writing here again, for this rank's combine to have
 * begun (the gate): a combine of no tokens passes it without reading a row. */
static moea2a_result_t nvlink_drop(moea2a_moe_t moe, void *stream)
{
    return nvlink_combine(moe, MOEA2A_SUCCESS, NULL, NULL, M2A_MOE_BOTH, stream);
}

/* by role: the context's memory; the collectives and their status; the expert-major
 * pass; capture; where a context goes when its peers cannot be mapped; modes */
const m2a_moe_backend_t m2a_moe_backend_nvlink = {
    .name = "nvlink",
    .size = nvlink_size, .alloc = nvlink_alloc, .release = nvlink_release,
    .dispatch = nvlink_dispatch, .combine = nvlink_combine, .status = fast_status, .drop = nvlink_drop,
    .expert_expand = m2a_moe_cuda_expand_view, .expert_fold = m2a_moe_cuda_expert_fold,
    .capturing = m2a_moe_cuda_capturing, .placement = m2a_moe_cuda_placement,
    .count_load = m2a_moe_cuda_count_load, .take_load = m2a_moe_cuda_take_load,
    .fallback = &m2a_moe_backend_cuda,
    .copy_engine = 1,
    .fp8_combine_hidden = M2A_FAST_FP8_MAX_HIDDEN, /* a warp's scales of a row in shared memory */
};


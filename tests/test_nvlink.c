/* The load/store (NVLink) path on 2 to 4 GPUs (or 2 ranks on one), against an oracle that each rank
 * computes from every rank's inputs (all derived from the seed, the rank and the
 * iteration, so any rank can regenerate any other's):
 *  - a CUDA graph of dispatch + combine, captured once and replayed with new inputs;
 *  - a soak of 10,000 iterations with random routing, token counts, strides and idle
 *    ranks, every one checked (counts, source indexes, payload rows, combine); then a
 *    fifth of them in copy-engine mode (MOEA2A_MOE_COPY_ENGINE);
 *  - a peer that never dispatches: the kernel ends with MOEA2A_ERR_TIMEOUT naming it,
 *    nothing hangs; mismatched strides and a peer's failed checks are reported.
 * With one GPU, 2 ranks share it over CUDA IPC (no NCCL; fewer soak iterations).
 * SKIP without a GPU, or where the load/store path is not available. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local_ranks.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"

#if defined(MOEA2A_HAVE_CUDA) && defined(MOEA2A_HAVE_NCCL)
#include "gpu_util.h"

#define WATCHDOG 900.0
#define HID 32 /* bf16 payload elements = combine elements */
#define NEXP 32
#define TOPK 4
#define CAP 64

/* One GPU: 2 ranks share it, over CUDA IPC without NCCL (NCCL refuses two ranks on
 * one GPU), each process in its turn on the GPU. Set before the ranks fork. */
static int shared_gpu;

/* Ranks sharing a GPU take turns on it, a few milliseconds each: fewer iterations. */
static int soak_iters(void)
{
    const char *s = getenv("TEST_NVLINK_ITERS");
    return s && *s ? atoi(s) : shared_gpu ? 1000 : 10000;
}

static uint16_t bf16_of(int v) /* small integers and their sums are exact in bf16 */
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static int pay_value(int src, int t, int h) { return (src * 5 + t * 3 + h) % 23 - 11; }
static int ret_value(int src, int t, int dst, int h) { return (src + 2 * t + 7 * dst + h) % 13 - 6; }
static int owner(int e, int ep) { return e / (NEXP / ep); } /* NEXP divisible by ep here */

/* Rank src's inputs of one iteration: n tokens (some ranks idle), ids with invalid
 * entries and repeats. */
static int inputs(uint64_t seed, int src, int iter, int32_t *ids)
{
    uint64_t s = mix(seed ^ ((uint64_t)src << 40) ^ (uint64_t)iter * 0x9e37);
    int mode = (int)(s % 10), n = mode == 0 ? 0 : mode == 1 ? CAP : (int)(mix(s) % (CAP + 1));
    for (int i = 0; i < n * TOPK; i++) {
        uint64_t v = mix(s + (uint64_t)i + 1);
        ids[i] = v % 17 == 0 ? -1 : (int32_t)(v % NEXP);
    }
    return n;
}

/* A stride every rank derives alike: cap, or the iteration's largest n. */
static int stride_of(uint64_t seed, int ep, int iter, int32_t *scratch)
{
    if (iter % 2 == 0) return 0;
    int m = 1;
    for (int q = 0; q < ep; q++) {
        int n = inputs(seed, q, iter, scratch);
        m = n > m ? n : m;
    }
    return m;
}

typedef struct {
    int rank, ep;
    moea2a_moe_t moe;
    cudaStream_t s;
    int32_t *d_ids;
    uint16_t *d_pay, *d_out;
    void *cbuf;
    /* host scratch */
    int32_t ids[CAP * TOPK], other[CAP * TOPK], counts[64], src[64 * CAP], want_src[64 * CAP], want_counts[64];
    uint16_t pay[CAP * HID], rows[64 * CAP * HID], out[CAP * HID];
} ctx_t;

static int setup(ctx_t *c, moea2a_comm_t comm, unsigned flags)
{
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = NEXP, m.top_k = TOPK, m.max_tokens_per_rank = CAP, m.num_payloads = 1;
    m.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, HID};
    m.hidden = HID, m.combine_dtype = MOEA2A_BFLOAT16, m.memory = MOEA2A_MEMORY_CUDA, m.flags = flags;
    /* 6 blocks and the few-token bound at 4 per block (read at create): a rank routes
     * up to 24 of the 0..CAP tokens here in every block and more through the counter,
     * so the soak checks both ways */
    m.num_sms = 6;
    setenv("MOEA2A_DISPATCH_EVEN_TOKENS", "4", 1);
    if (moea2a_moe_create(&c->moe, comm, &m)) return -1;
    cudaStreamCreate(&c->s);
    cudaMalloc((void **)&c->d_ids, sizeof(c->ids));
    cudaMalloc((void **)&c->d_pay, sizeof(c->pay));
    cudaMalloc((void **)&c->d_out, sizeof(c->out));
    moea2a_moe_combine_buffer(c->moe, &c->cbuf);
    return 0;
}

static void teardown(ctx_t *c)
{
    cudaFree(c->d_ids), cudaFree(c->d_pay), cudaFree(c->d_out);
    cudaStreamDestroy(c->s);
    moea2a_moe_destroy(c->moe);
}

/* This rank's inputs of iteration `iter` into the device buffers; returns n. */
static int upload_inputs(ctx_t *c, uint64_t seed, int iter)
{
    int n = inputs(seed, c->rank, iter, c->ids);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < HID; h++) c->pay[t * HID + h] = bf16_of(pay_value(c->rank, t, h));
    cudaMemcpy(c->d_ids, c->ids, sizeof(int32_t) * (size_t)(n * TOPK), cudaMemcpyHostToDevice);
    cudaMemcpy(c->d_pay, c->pay, sizeof(uint16_t) * (size_t)(n * HID), cudaMemcpyHostToDevice);
    return n;
}

static int goes_to(const int32_t *ids, int t, int r, int ep)
{
    for (int j = 0; j < TOPK; j++)
        if (ids[t * TOPK + j] >= 0 && owner(ids[t * TOPK + j], ep) == r) return 1;
    return 0;
}

/* The oracle of what this rank receives, and the expert rows it will return. */
static void expect_and_fill(ctx_t *c, uint64_t seed, int iter, int stride)
{
    memset(c->rows, 0, sizeof(uint16_t) * (size_t)c->ep * stride * HID);
    for (int q = 0; q < c->ep; q++) {
        int n = inputs(seed, q, iter, c->other), i = 0;
        for (int t = 0; t < n; t++) {
            if (!goes_to(c->other, t, c->rank, c->ep)) continue;
            c->want_src[q * stride + i] = t;
            for (int h = 0; h < HID; h++) c->rows[((size_t)q * stride + i) * HID + h] = bf16_of(ret_value(q, t, c->rank, h));
            i++;
        }
        c->want_counts[q] = i;
        for (int j = i; j < stride; j++) c->want_src[q * stride + j] = -1;
    }
}

/* The expert rows into the combine buffer, ordered on stream (NULL: now). */
static void upload_rows(ctx_t *c, int stride, cudaStream_t s)
{
    size_t bytes = sizeof(uint16_t) * (size_t)c->ep * stride * HID;
    if (s) cudaMemcpyAsync(c->cbuf, c->rows, bytes, cudaMemcpyHostToDevice, s);
    else cudaMemcpy(c->cbuf, c->rows, bytes, cudaMemcpyHostToDevice);
}

/* Checks what a completed dispatch delivered against the oracle; returns wrong values.
 * (Before this rank's combine: from then on peers may overwrite them.) */
static long check_received(ctx_t *c, const moea2a_dispatch_result_t *d, int stride)
{
    long wrong = 0;
    int ep = c->ep;
    cudaMemcpy(c->counts, d->recv_counts, sizeof(int32_t) * (size_t)ep, cudaMemcpyDeviceToHost);
    cudaMemcpy(c->src, d->src_token_index, sizeof(int32_t) * (size_t)ep * stride, cudaMemcpyDeviceToHost);
    static uint16_t got[64 * CAP * HID];
    cudaMemcpy(got, d->payloads[0], sizeof(uint16_t) * (size_t)ep * stride * HID, cudaMemcpyDeviceToHost);
    for (int q = 0; q < ep; q++) {
        wrong += c->counts[q] != c->want_counts[q];
        for (int i = 0; i < stride; i++) {
            wrong += c->src[q * stride + i] != c->want_src[q * stride + i];
            if (i >= c->want_counts[q]) continue;
            for (int h = 0; h < HID; h++)
                wrong += got[((size_t)q * stride + i) * HID + h] != bf16_of(pay_value(q, c->want_src[q * stride + i], h));
        }
    }
    return wrong;
}

/* Checks a completed combine against the oracle. */
static long check_combined(ctx_t *c, int n)
{
    long wrong = 0;
    int ep = c->ep;
    cudaMemcpy(c->out, c->d_out, sizeof(uint16_t) * (size_t)n * HID, cudaMemcpyDeviceToHost);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < HID; h++) {
            int sum = 0;
            for (int r = 0; r < ep; r++)
                if (goes_to(c->ids, t, r, ep)) sum += ret_value(c->rank, t, r, h);
            wrong += c->out[t * HID + h] != bf16_of(sum);
        }
    return wrong;
}

static int nvlink_or_skip(int rank, const moea2a_dispatch_result_t *d)
{
    if (!d->nvlink && rank == 0) printf("# the load/store path is not available here\n");
    return d->nvlink;
}

/* ---- the soak, and a graph captured once ------------------------------------------ */

/* A rank's GPU and communicator, with MOEA2A_TIMEOUT_S = timeout. */
static int start_rank(int rank, int n_ranks, moea2a_unique_id_t id, int ndev, const char *timeout, moea2a_comm_t *comm)
{
    if (shared_gpu) without_nccl();
    cudaSetDevice(rank % ndev);
    setenv("MOEA2A_TIMEOUT_S", timeout, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % ndev;
    return moea2a_comm_init_rank(comm, n_ranks, id, rank, &cfg) ? -1 : 0;
}

typedef struct {
    int ndev, copy_engine;
} soak_arg_t;

static int soak_rank(int rank, int n_ranks, moea2a_unique_id_t id, void *arg)
{
    const soak_arg_t *a = arg;
    int fails = 0;
    moea2a_comm_t comm; /* a failing rank must not hold the others long: 30 s */
    if (start_rank(rank, n_ranks, id, a->ndev, "30", &comm)) return 1;
    static ctx_t c;
    c.rank = rank, c.ep = n_ranks;
    if (setup(&c, comm, a->copy_engine ? MOEA2A_MOE_COPY_ENGINE : 0))
        return printf("# rank %d: create: %s\n", rank, moea2a_last_error(comm)), 1;
    uint64_t seed = 20261121 + (uint64_t)a->copy_engine;
    int iters = a->copy_engine ? soak_iters() / 5 : soak_iters();
    long wrong = 0;
    for (int it = 0; it < iters && fails == 0; it++) {
        int stride = stride_of(seed, n_ranks, it, c.other), n = upload_inputs(&c, seed, it);
        int rt = stride ? stride : CAP;
        moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        const void *pays[1] = {c.d_pay};
        expect_and_fill(&c, seed, it, rt);
        moea2a_result_t r = moea2a_dispatch(c.moe, n, c.d_ids, NULL, pays, stride, &d, c.s);
        cudaStreamSynchronize(c.s);
        if (!r) r = moea2a_moe_status(c.moe);
        if (it == 0 && !r && !nvlink_or_skip(rank, &d)) {
            teardown(&c);
            moea2a_comm_destroy(comm);
            return 77;
        }
        long w = r ? 0 : check_received(&c, &d, rt);
        /* the expert side writes its rows after the dispatch (peers may read this
         * combine buffer until their previous combine ends) */
        if (!r) upload_rows(&c, rt, c.s);
        if (!r) r = moea2a_combine(c.moe, NULL, c.d_out, c.s);
        cudaStreamSynchronize(c.s);
        if (!r) r = moea2a_moe_status(c.moe);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "iteration %d: %s", it, moea2a_last_error(comm));
        if (r) break;
        w += check_combined(&c, n);
        RANK_EXPECT(fails, rank, w == 0, "iteration %d (n %d, stride %d): %ld wrong values", it, n, rt, w);
        wrong += w;
        if (rank == 0 && (it + 1) % 2500 == 0) printf("# %d iterations checked\n", it + 1), fflush(stdout);
    }
    if (rank == 0 && fails == 0) printf("# %d iterations checked on %d ranks\n", iters, n_ranks);
    if (a->copy_engine) { /* not capturable (test_gpu checks the refusal) */
        teardown(&c);
        moea2a_comm_destroy(comm);
        return fails;
    }

    /* a graph of dispatch + combine, captured once, replayed with new inputs */
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int n = upload_inputs(&c, seed, -1); /* the token count the graph keeps */
    const void *pays[1] = {c.d_pay};
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    const size_t recv_bytes = sizeof(uint16_t) * (size_t)n_ranks * CAP * HID;
    uint16_t *d_seen = NULL;
    cudaMalloc((void **)&d_seen, recv_bytes);
    cudaStreamBeginCapture(c.s, cudaStreamCaptureModeGlobal);
    /* the expert side's reading of the received rows, captured with them: the receive
     * arrays are the caller's only until combine begins (moea2a_moe(3)) */
    moea2a_result_t r = moea2a_dispatch(c.moe, n, c.d_ids, NULL, pays, 0, &d, c.s);
    if (!r) cudaMemcpyAsync(d_seen, d.payloads[0], recv_bytes, cudaMemcpyDeviceToDevice, c.s);
    moea2a_result_t r2 = r ? r : moea2a_combine(c.moe, NULL, c.d_out, c.s);
    cudaError_t ce = cudaStreamEndCapture(c.s, &graph);
    if (ce == cudaSuccess) ce = cudaGraphInstantiate(&exec, graph, 0);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS && ce == cudaSuccess, "capture: %s / %s",
                moea2a_last_error(comm), cudaGetErrorString(ce));
    /* replay only where every rank captured */
    int32_t mine = exec != NULL && fails == 0, all[64];
    moea2a_allgather(&mine, all, 1, MOEA2A_INT32, comm, NULL);
    for (int q = 0; q < n_ranks; q++)
        if (!all[q] && exec) cudaGraphExecDestroy(exec), exec = NULL;
    for (int replay = 0; exec && replay < 5; replay++) {
        /* every rank's previous replay is over (peers read this rank's combine buffer) */
        moea2a_barrier(comm);
        for (int t = 0; t < n; t++) /* new payload values each replay, same routing */
            for (int h = 0; h < HID; h++) c.pay[t * HID + h] = bf16_of(pay_value(rank, t, h) + (replay % 3) - 1);
        cudaMemcpy(c.d_pay, c.pay, sizeof(uint16_t) * (size_t)n * HID, cudaMemcpyHostToDevice);
        expect_and_fill(&c, seed, -1, CAP);
        upload_rows(&c, CAP, NULL);
        cudaGraphLaunch(exec, c.s);
        cudaStreamSynchronize(c.s);
        RANK_EXPECT(fails, rank, moea2a_moe_status(c.moe) == MOEA2A_SUCCESS, "replay %d: %s", replay, moea2a_last_error(comm));
        /* the oracle's payload values moved by the same offset */
        int32_t counts[64];
        cudaMemcpy(counts, d.recv_counts, sizeof(int32_t) * (size_t)n_ranks, cudaMemcpyDeviceToHost);
        static uint16_t got[64 * CAP * HID];
        cudaMemcpy(got, d_seen, recv_bytes, cudaMemcpyDeviceToHost);
        long w = 0;
        for (int q = 0; q < n_ranks; q++) {
            w += counts[q] != c.want_counts[q];
            for (int i = 0; i < c.want_counts[q]; i++)
                for (int h = 0; h < HID; h++)
                    w += got[((size_t)q * CAP + i) * HID + h] !=
                         bf16_of(pay_value(q, c.want_src[q * CAP + i], h) + (replay % 3) - 1);
        }
        cudaMemcpy(c.out, c.d_out, sizeof(uint16_t) * (size_t)n * HID, cudaMemcpyDeviceToHost);
        for (int t = 0; t < n; t++)
            for (int h = 0; h < HID; h++) {
                int sum = 0;
                for (int q = 0; q < n_ranks; q++)
                    if (goes_to(c.ids, t, q, n_ranks)) sum += ret_value(rank, t, q, h);
                w += c.out[t * HID + h] != bf16_of(sum);
            }
        RANK_EXPECT(fails, rank, w == 0, "graph replay %d: %ld wrong values", replay, w);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaFree(d_seen);
    teardown(&c);
    moea2a_comm_destroy(comm);
    return fails;
}

/* ---- failures: a peer that never comes, strides that differ, a peer's bad input ---- */

static int fault_rank(int rank, int n_ranks, moea2a_unique_id_t id, void *arg)
{
    int fails = 0;
    moea2a_comm_t comm;
    if (start_rank(rank, n_ranks, id, *(int *)arg, "3", &comm)) return printf("# rank %d: init failed\n", rank), 1;
    static ctx_t c;
    c.rank = rank, c.ep = n_ranks;
    const void *pays[1];
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    /* 1. rank 1 never dispatches: rank 0's kernel gives up after the timeout */
    if (setup(&c, comm, 0)) return printf("# rank %d: create: %s\n", rank, moea2a_last_error(comm)), 1;
    pays[0] = c.d_pay;
    int n = upload_inputs(&c, 7, 3);
    if (rank == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        moea2a_result_t r = moea2a_dispatch(c.moe, n, c.d_ids, NULL, pays, 0, &d, c.s);
        cudaError_t ce = cudaStreamSynchronize(c.s);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        moea2a_result_t st = moea2a_moe_status(c.moe);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && ce == cudaSuccess && st == MOEA2A_ERR_TIMEOUT &&
                                     strstr(moea2a_last_error(comm), "rank 1") && secs < 30,
                    "missing peer: dispatch %d, stream %s, status %s after %.1f s: %s", r, cudaGetErrorString(ce),
                    moea2a_strerror(st), secs, moea2a_last_error(comm));
        RANK_EXPECT(fails, rank, moea2a_combine(c.moe, NULL, c.d_out, c.s) == MOEA2A_ERR_TIMEOUT,
                    "the context stays failed after a device timeout");
    } else {
        /* never dispatches; meets rank 0 again in the collective destroy, which waits
         * MOEA2A_TIMEOUT_S (3 s) at most. Rank 0 gets there 3 s (its kernel's timeout)
         * after its dispatch, plus however late that kernel started, which other tests'
         * kernels on the same GPU can make a second or more: waiting 3 s here keeps the
         * two arrivals that close, not that plus 2 s apart */
        sleep(3);
    }
    teardown(&c);
    /* 2. strides that differ, then 3. a peer whose checks fail */
    for (int round = 0; round < 2; round++) {
        if (setup(&c, comm, 0)) return printf("# rank %d: create: %s\n", rank, moea2a_last_error(comm)), fails + 1;
        pays[0] = c.d_pay;
        n = upload_inputs(&c, 11, round);
        int rt = round == 0 ? (rank == 0 ? CAP : CAP - 1) : 0, nn = round == 1 && rank == 1 ? CAP + 1 : n;
        if (round == 0 && n > CAP - 1) n = CAP - 1, nn = n;
        moea2a_result_t r = moea2a_dispatch(c.moe, nn, c.d_ids, NULL, pays, rt, &d, c.s);
        cudaStreamSynchronize(c.s);
        moea2a_result_t st = moea2a_moe_status(c.moe);
        if (round == 0)
            RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && st == MOEA2A_ERR_MISMATCH,
                        "different strides: dispatch %d, status %s: %s", r, moea2a_strerror(st), moea2a_last_error(comm));
        else if (rank == 1)
            RANK_EXPECT(fails, rank, r == MOEA2A_ERR_CAPACITY, "num_tokens over cap: %s", moea2a_strerror(r));
        else
            RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && st == MOEA2A_ERR_CAPACITY && strstr(moea2a_last_error(comm), "rank 1"),
                        "a peer's failed checks reach this rank: status %s: %s", moea2a_strerror(st), moea2a_last_error(comm));
        teardown(&c);
    }
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    int ndev = gpu_count();
    shared_gpu = ndev == 1 && have_ucx();
    if (ndev < 2 && !shared_gpu) {
        const char *why = ndev ? "one CUDA device and no ucx transport to share it without NCCL" : "no CUDA device";
        tap_skip(why, "load/store path: soak and CUDA graph");
        tap_skip(why, "copy-engine mode: soak");
        tap_skip(why, "load/store path: failures");
        return tap_done();
    }
    int n = ndev >= 4 ? 4 : 2;
    const char *gpus = shared_gpu ? "2 ranks sharing one GPU over CUDA IPC" : ndev >= 4 ? "4 GPUs" : "2 GPUs";
    local_ranks_result_t res;
    soak_arg_t sa = {ndev, 0};
    local_ranks_run(n, soak_rank, &sa, WATCHDOG, &res);
    if (res.exit_codes[0] == 77) {
        tap_skip("no load/store path between these GPUs", "load/store path: soak and CUDA graph");
        tap_skip("no load/store path between these GPUs", "copy-engine mode: soak");
        tap_skip("no load/store path between these GPUs", "load/store path: failures");
        return tap_done();
    }
    tap_ok(res.failed == 0, "load/store path, %s: %d iterations of random routing checked each time; a CUDA "
           "graph of dispatch + combine replayed 5 times", gpus, soak_iters());
    sa.copy_engine = 1;
    local_ranks_run(n, soak_rank, &sa, WATCHDOG, &res);
    tap_ok(res.failed == 0, "copy-engine mode, %s: %d iterations of random routing checked each time", gpus,
           soak_iters() / 5);
    if (getenv("TEST_GPU_QUICK")) { /* under compute-sanitizer: its 3 s timeouts do not hold */
        tap_skip("timing-based, not under compute-sanitizer", "load/store path: failures");
        return tap_done();
    }
    local_ranks_run(2, fault_rank, &ndev, WATCHDOG, &res);
    tap_ok(res.failed == 0, "load/store path, %s: a missing peer ends in MOEA2A_ERR_TIMEOUT (no hang); different "
           "strides and a peer's failed checks are reported on the device", shared_gpu ? "2 ranks sharing one GPU" : "2 GPUs");
    return tap_done();
}
#else
int main(void)
{
    tap_skip("built without CUDA or NCCL", "load/store path");
    return tap_done();
}
#endif

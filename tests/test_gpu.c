/* CUDA memory end to end, on as many GPUs as the machine has (1, 2 and 4 ranks, one
 * GPU each): generic collectives on device buffers through NCCL, and the MoE path
 * against the host reference, bit for bit, on the same random inputs: every array
 * dispatch delivers, the stats, and combine. Then a communicator built on a caller's
 * NCCL communicator. Without a GPU every test reports SKIP. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "derived_placement.h"
#include "gpu_util.h"
#include "moe_roundtrip.h"
#include "local_ranks.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"

#if defined(MOEA2A_HAVE_CUDA) && defined(MOEA2A_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

#define WATCHDOG 600.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int urand(uint64_t *s, int lo, int hi) { return lo + (int)((*s = mix(*s)) % (uint64_t)(hi - lo + 1)); }

static int use_device(int rank, int ndev)
{
    return cudaSetDevice(rank % ndev) == cudaSuccess ? 0 : 1;
}

static void *to_device(const void *h, size_t bytes)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (bytes) cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void *to_host(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    return h;
}

/* ---- generic collectives on device memory ---------------------------------------- */

static int coll_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int ndev = *(int *)arg, fails = 0;
    if (use_device(rank, ndev)) return 1;
    moea2a_comm_t comm;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % ndev;
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cfg)) {
        printf("# rank %d: init: %s\n", rank, moea2a_last_error(NULL));
        return 1;
    }
    int64_t sc[8], sd[8], rc[8], rd[8], st = 0, rt = 0;
    for (int p = 0; p < n; p++) {
        /* every rank's block to itself is not empty: it is copied locally on the stream */
        sc[p] = ((rank * 7 + p * 3) % 5 + (p == rank)) * 1000, rc[p] = ((p * 7 + rank * 3) % 5 + (p == rank)) * 1000;
        sd[p] = st, rd[p] = rt, st += sc[p], rt += rc[p];
    }
    int32_t *hs = malloc(sizeof(int32_t) * (size_t)(st + 1)), *hr;
    for (int p = 0; p < n; p++)
        for (int64_t i = 0; i < sc[p]; i++) hs[sd[p] + i] = rank * 1000000 + p * 10000 + (int32_t)i;
    int32_t *ds = to_device(hs, sizeof(int32_t) * (size_t)st), *dr = NULL;
    cudaMalloc((void **)&dr, sizeof(int32_t) * (size_t)(rt + 1));
    cudaStream_t s;
    cudaStreamCreate(&s);
    moea2a_result_t r = moea2a_alltoallv(ds, sc, sd, dr, rc, rd, MOEA2A_INT32, comm, s);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "alltoallv on CUDA memory: %s", moea2a_last_error(comm));
    cudaStreamSynchronize(s);
    hr = to_host(dr, sizeof(int32_t) * (size_t)rt);
    size_t bad = 0;
    for (int p = 0; p < n; p++)
        for (int64_t i = 0; i < rc[p]; i++) bad += hr[rd[p] + i] != p * 1000000 + rank * 10000 + (int32_t)i;
    RANK_EXPECT(fails, rank, bad == 0, "alltoallv: %zu wrong", bad);
    int32_t mine[3] = {rank, rank * 2, rank * 3}, all[24];
    int32_t *dm = to_device(mine, sizeof(mine)), *da;
    cudaMalloc((void **)&da, sizeof(all));
    r = moea2a_allgather(dm, da, 3, MOEA2A_INT32, comm, s);
    r = r ? r : moea2a_bcast(dm, 3, MOEA2A_INT32, n - 1, comm, s);
    cudaStreamSynchronize(s);
    cudaMemcpy(all, da, sizeof(int32_t) * 3 * (size_t)n, cudaMemcpyDeviceToHost);
    cudaMemcpy(mine, dm, sizeof(mine), cudaMemcpyDeviceToHost);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "allgather/bcast: %s", moea2a_last_error(comm));
    for (int p = 0; p < n; p++) RANK_EXPECT(fails, rank, all[3 * p + 2] == 3 * p, "allgather[%d]", p);
    RANK_EXPECT(fails, rank, mine[1] == 2 * (n - 1), "bcast from rank %d", n - 1);
    /* host and device buffers mixed in one call are refused */
    RANK_EXPECT(fails, rank, moea2a_allgather(mine, da, 3, MOEA2A_INT32, comm, s) == MOEA2A_ERR_INVALID_ARGUMENT,
                "mixed memory refused");
    cudaFree(ds), cudaFree(dr), cudaFree(dm), cudaFree(da), free(hs), free(hr);
    cudaStreamDestroy(s);
    moea2a_comm_destroy(comm);
    return fails;
}

/* ---- MoE: CUDA context == host context ---------------------------------------------- */

typedef struct {
    moea2a_moe_config_t cfg;
    int n, rt;
    int32_t *ids;
    float *w;
    unsigned char *pay[3];
    size_t row[3];
} moe_case_t;

static const moea2a_datatype_t pay_types[] = {MOEA2A_UINT8, MOEA2A_BFLOAT16, MOEA2A_INT32, MOEA2A_FLOAT32,
                                               MOEA2A_INT64, MOEA2A_NVFP4, MOEA2A_FLOAT16};
static const moea2a_datatype_t comb_types[] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};

/* Cases large enough that copy-engine mode cuts its batches over several lanes
 * (MOEA2A_CE_LANES; batches of 4 MiB or more): every rank sends all its tokens,
 * bf16 rows of 6-8 KiB, fp32 combine rows of 14-16 KiB (8 segments of 2 KB). On the
 * load/store path they take the combine's reduce past its even split (moea2a_moe(3):
 * over 8 segments per warp, 768 tokens x 8 at 48 SMs) through bulk copies, at 16, 24
 * and 48 SMs, where the random cases' few segments take the even split; in copy-engine
 * mode the sum takes bulk copies too. */
static int large_case = 0;

static moe_case_t make_case(uint64_t seed, int rank, int ep)
{
    moe_case_t c;
    memset(&c, 0, sizeof(c));
    uint64_t s = seed;
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = urand(&s, 1, 300);
    m.top_k = urand(&s, 1, 22);
    m.max_tokens_per_rank = urand(&s, 1, 700);
    m.num_payloads = urand(&s, 0, 3);
    for (int i = 0; i < m.num_payloads; i++)
        m.payloads[i] = (moea2a_payload_desc_t){pay_types[urand(&s, 0, 6)], (size_t)urand(&s, 1, 300)};
    m.combine_dtype = comb_types[urand(&s, 0, 2)];
    m.hidden = (size_t)urand(&s, 1, 700);
    m.invalid_expert_id = urand(&s, 0, 1) ? -1 : m.num_experts;
    m.flags = (urand(&s, 0, 3) == 0 ? MOEA2A_MOE_REWRITE_NONLOCAL : 0) | (urand(&s, 0, 1) ? MOEA2A_MOE_CARRY_WEIGHTS : 0) |
              (urand(&s, 0, 5) == 0 ? MOEA2A_MOE_NO_SANITIZE : 0);
    int skew = urand(&s, 0, 3) == 0;
    c.rt = urand(&s, 0, 1) ? 0 : m.max_tokens_per_rank;
    if (large_case) {
        m.max_tokens_per_rank = urand(&s, 1800, 2200), m.num_payloads = 2, m.hidden = (size_t)urand(&s, 3600, 4000);
        m.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, (size_t)urand(&s, 3072, 4096)};
        m.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT32, (size_t)urand(&s, 1, 64)};
        m.combine_dtype = MOEA2A_FLOAT32, c.rt = 0;
    }
    c.cfg = m;
    /* this rank's inputs: some ranks idle, invalid ids of every kind */
    uint64_t r = mix(seed ^ (uint64_t)(rank + 1) * 0x51ed27);
    int mode = urand(&r, 0, 4);
    c.n = mode == 0 ? 0 : mode == 1 ? m.max_tokens_per_rank : urand(&r, 0, m.max_tokens_per_rank);
    if (large_case) c.n = m.max_tokens_per_rank;
    c.ids = malloc(sizeof(int32_t) * (size_t)(c.n * m.top_k + 1));
    c.w = malloc(sizeof(float) * (size_t)(c.n * m.top_k + 1));
    for (int i = 0; i < c.n * m.top_k; i++) {
        int u = urand(&r, 0, 99);
        c.ids[i] = u < 3 ? -2 : u < 5 ? m.num_experts + 1 : u < 7 ? m.invalid_expert_id
                 : skew ? urand(&r, 0, m.num_experts < 3 ? m.num_experts - 1 : 2) : urand(&r, 0, m.num_experts - 1);
        c.w[i] = (float)urand(&r, 0, 1000) / 7.0f;
    }
    for (int i = 0; i < m.num_payloads; i++) {
        size_t es;
        moea2a_datatype_size(m.payloads[i].dtype, &es);
        c.row[i] = es * m.payloads[i].elems_per_token;
        c.pay[i] = malloc(c.row[i] * (size_t)c.n + 1);
        for (size_t b = 0; b < c.row[i] * (size_t)c.n; b++) c.pay[i][b] = (unsigned char)mix(r + b);
    }
    (void)ep;
    return c;
}

static void free_case(moe_case_t *c)
{
    free(c->ids), free(c->w);
    for (int i = 0; i < 3; i++) free(c->pay[i]);
}

/* Rows of random finite values in the combine dtype, for every slot of [ep][stride];
 * with specials, one value in 8 is instead one that two of overflow (2^emax: 2^127,
 * or 2^15 in fp16, either sign), an infinity or a NaN of either sign with a payload,
 * so that combines make NaNs (moea2a_moe(3): written as the one canonical NaN). */
static void fill_rows(unsigned char *rows, size_t count, moea2a_datatype_t dt, uint64_t seed, int specials)
{
    const int f32 = dt == MOEA2A_FLOAT32, f16 = dt == MOEA2A_FLOAT16;
    const uint32_t sign = f32 ? 0x80000000u : 0x8000u, inf = f32 ? 0x7f800000u : f16 ? 0x7c00u : 0x7f80u;
    const uint32_t big = f32 ? 0x7f000000u : f16 ? 0x7800u : 0x7f00u;
    for (size_t i = 0; i < count; i++) {
        uint64_t v = mix(seed + i);
        if (specials && v % 8 == 0) {
            const uint32_t kind = (uint32_t)(v >> 8) % 3, neg = (v >> 16) & 1 ? sign : 0;
            const uint32_t payload = (uint32_t)(v >> 20) & (f32 ? 0x3fffffu : f16 ? 0x1ffu : 0x3fu);
            const uint32_t b = neg | (kind == 0 ? big : kind == 1 ? inf : inf | (inf >> 1 & ~inf) | payload);
            memcpy(rows + (f32 ? 4 : 2) * i, &b, f32 ? 4 : 2); /* little-endian: the low bytes */
            continue;
        }
        if (f32) {
            float f = (float)((int64_t)(v % 2000001) - 1000000) / 1237.0f;
            memcpy(rows + 4 * i, &f, 4);
        } else { /* a finite 16-bit pattern: exponent below all ones */
            uint16_t h = (uint16_t)v;
            if (dt == MOEA2A_BFLOAT16 && (h & 0x7f80) == 0x7f80) h &= 0xbfff;
            if (dt == MOEA2A_FLOAT16 && (h & 0x7c00) == 0x7c00) h &= 0xbfff;
            memcpy(rows + 2 * i, &h, 2);
        }
    }
}

/* Which path CUDA dispatches must take: 1 load/store, 0 generic, -1 either (set per
 * run by moe_rank; the load/store path is required only where
 * MOEA2A_TEST_EXPECT_NVLINK=1 says the machine has it). */
static int expect_nvlink = -1;
/* Copy-engine mode (MOEA2A_MOE_COPY_ENGINE) for the device contexts of this run: the
 * same bits as the host reference, and no CUDA graph (refused while capturing). */
static int copy_engine = 0;

/* The four halves of a round trip captured in one CUDA graph and replayed: every
 * replay is a new dispatch and combine of the same tokens and expert rows (din: the
 * combine buffer or a caller's rows, which no replay changes), so out must equal the
 * host reference every time. */
static int graph_replays(moea2a_moe_t dm, int rank, const moe_case_t *c, const int32_t *dids, const float *dw,
                         const void *const *dp, const void *din, unsigned char *dout, const unsigned char *hout,
                         size_t rowb, cudaStream_t s)
{
    int fails = 0;
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (!s) return 0; /* the legacy default stream is never captured */
    moea2a_result_t r = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) ? MOEA2A_ERR_CUDA : MOEA2A_SUCCESS;
    if (copy_engine) { /* it waits on the host: refused before anything is captured (the context is done) */
        r = r ? r : moea2a_dispatch_send(dm, c->n, dids, dw, dp, c->rt, s);
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(NULL), "CUDA graph"),
                    "copy-engine mode under capture: %s: %s", moea2a_strerror(r), moea2a_last_error(NULL));
        if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        return fails;
    }
    r = r ? r : moea2a_dispatch_send(dm, c->n, dids, dw, dp, c->rt, s);
    r = r ? r : moea2a_dispatch_recv(dm, &res, s);
    r = r ? r : moea2a_combine_send(dm, din, s);
    r = r ? r : moea2a_combine_recv(dm, dout, s);
    if (cudaStreamEndCapture(s, &g) != cudaSuccess && !r) r = MOEA2A_ERR_CUDA;
    if (!r && cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) r = MOEA2A_ERR_CUDA;
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "capturing the split halves: %s", moea2a_strerror(r));
    for (int rep = 0; !r && rep < 3 && !fails; rep++) {
        cudaMemsetAsync(dout, 0xee, rowb * (size_t)c->n, s);
        cudaGraphLaunch(ge, s);
        RANK_EXPECT(fails, rank, cudaStreamSynchronize(s) == cudaSuccess && moea2a_moe_status(dm) == MOEA2A_SUCCESS,
                    "graph replay %d: %s", rep, moea2a_last_error(NULL));
        unsigned char *got = to_host(dout, rowb * (size_t)c->n);
        RANK_EXPECT(fails, rank, !memcmp(got, hout, rowb * (size_t)c->n), "graph replay %d of the split halves differs", rep);
        free(got);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return fails;
}

/* A placement that moves the experts of the contiguous one among the ranks (each
 * rank keeps its count of experts, so the create's bound holds): the same on every
 * rank, from the case's seed. */
static void moved_placement(int E, int ep, uint64_t seed, int32_t *map)
{
    int q = E / ep, rem = E % ep, e = 0;
    for (int r = 0; r < ep; r++)
        for (int j = 0; j < q + (r < rem); j++) map[e++] = r;
    uint64_t s = mix(seed ^ 0x9e3779b97f4a7c15ull);
    for (int i = E - 1; i > 0; i--) {
        int j = urand(&s, 0, i), t = map[i];
        map[i] = map[j], map[j] = t;
    }
}

static int compare_case(moea2a_comm_t comm, int rank, int ep, uint64_t seed)
{
    int fails = 0;
    moe_case_t c = make_case(seed, rank, ep);
    moea2a_moe_config_t hc = c.cfg, dc = c.cfg;
    hc.memory = MOEA2A_MEMORY_HOST, dc.memory = MOEA2A_MEMORY_CUDA;
    /* half of the cases move the experts in place before the calls: a moved map, the
     * same with experts no rank holds, or replicas (room for them in the bound) */
    const int moved = (seed / 3) % 2 == 1, flavor = (int)((seed / 6) % 3);
    if (moved && flavor == 2) hc.max_local_experts = dc.max_local_experts = c.cfg.num_experts;
    /* the kernels of the general rule where the move needs them (replicas, -1), and in a
     * quarter of the other cases, where they must give the one-holder kernels' bits */
    if ((moved && flavor != 0) || seed % 4 == 3) dc.flags |= MOEA2A_MOE_GENERAL_PLACEMENT;
    /* the load/store kernels at several SM budgets: few blocks reduce the combine
     * through bulk copies, more through loads; both must give the same bits */
    static const int sms[3] = {16, 24, 48};
    dc.num_sms = sms[seed % 3];
    if (copy_engine) dc.flags |= MOEA2A_MOE_COPY_ENGINE;
    const int count_load = seed % 2 == 0; /* the experts' load counted on the device */
    if (count_load) dc.flags |= MOEA2A_MOE_EXPERT_LOAD;
    moea2a_moe_t hm, dm;
    moea2a_result_t r = moea2a_moe_create(&hm, comm, &hc);
    moea2a_result_t r2 = r ? r : moea2a_moe_create(&dm, comm, &dc);
    if (copy_engine && expect_nvlink == 0 && r == MOEA2A_SUCCESS) { /* no load/store path: no copy-engine mode */
        RANK_EXPECT(fails, rank, r2 == MOEA2A_ERR_UNAVAILABLE, "copy-engine mode without the load/store path: %s",
                    moea2a_strerror(r2));
        if (!r2) moea2a_moe_destroy(dm);
        moea2a_moe_destroy(hm);
        free_case(&c);
        return fails;
    }
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "create (seed %llu): %s",
                (unsigned long long)seed, moea2a_last_error(comm));
    if (r || r2) {
        if (!r) moea2a_moe_destroy(hm);
        free_case(&c);
        return fails;
    }
    int k = c.cfg.top_k, np = c.cfg.num_payloads;
    const void *hp[3] = {c.pay[0], c.pay[1], c.pay[2]}, *dp[3] = {0};
    for (int i = 0; i < np; i++) dp[i] = to_device(c.pay[i], c.row[i] * (size_t)c.n);
    int32_t *dids = to_device(c.ids, sizeof(int32_t) * (size_t)(c.n * k));
    float *dw = to_device(c.w, sizeof(float) * (size_t)(c.n * k));
    /* copy-engine mode on odd seeds: the legacy default stream, where it copies row runs
     * one cudaMemcpyAsync at a time (no batches there) */
    cudaStream_t s = NULL;
    if (!(copy_engine && seed % 2 == 1)) cudaStreamCreate(&s);
    moea2a_dispatch_result_t hres = MOEA2A_DISPATCH_RESULT_INITIALIZER, dres = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    /* the experts moved in place, on both contexts (the CUDA context's tables change on
     * its stream): every fifth expert held by no rank (flavor 1), or each expert by 0
     * to 3 ranks in turn from its moved owner (flavor 2) */
    if (moved) {
        const int E = c.cfg.num_experts, R = ep < 3 ? ep : 3;
        int32_t *map = malloc(sizeof(int32_t) * (size_t)E), *hold = malloc(sizeof(int32_t) * (size_t)E * (size_t)R);
        moved_placement(E, ep, seed, map);
        for (int e = 0; e < E; e++) {
            const uint64_t z = mix(seed * 7 + (uint64_t)e);
            if (flavor == 1 && z % 5 == 0) map[e] = -1;
            const int nrep = (int)((z >> 8) % (uint64_t)(R + 1));
            for (int j = 0; j < R; j++) hold[(size_t)e * R + j] = j < nrep ? (map[e] + j) % ep : -1;
        }
        if (flavor == 2) {
            r = moea2a_moe_set_replicas(hm, R, hold, NULL);
            r2 = r ? r : moea2a_moe_set_replicas(dm, R, hold, s);
        } else {
            r = moea2a_moe_set_placement(hm, map, NULL);
            r2 = r ? r : moea2a_moe_set_placement(dm, map, s);
        }
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "%s (seed %llu): %s",
                    flavor == 2 ? "set_replicas" : "set_placement", (unsigned long long)seed, moea2a_last_error(comm));
        free(map), free(hold);
    }
    /* a quarter of the cases through the split halves, after a one-call round trip (the
     * epochs of both forms interleave), with other work on the stream between them */
    const int split = seed % 4 == 3;
    void *busy = NULL;
    r = moea2a_dispatch(hm, c.n, c.ids, c.w, hp, c.rt, &hres, NULL);
    if (split) {
        void *warm = NULL;
        cudaMalloc(&busy, 1 << 20), cudaMalloc(&warm, 16 + 4 * (size_t)c.cfg.hidden * (size_t)c.n);
        r2 = r ? r : moea2a_dispatch(dm, c.n, dids, dw, dp, c.rt, &dres, s);
        r2 = r2 ? r2 : moea2a_combine(dm, NULL, warm, s);
        r2 = r2 ? r2 : moea2a_dispatch_send(dm, c.n, dids, dw, dp, c.rt, s);
        cudaMemsetAsync(busy, 0x5a, 1 << 20, s);
        r2 = r2 ? r2 : moea2a_dispatch_recv(dm, &dres, s);
        cudaStreamSynchronize(s);
        cudaFree(warm);
    } else {
        r2 = r ? r : moea2a_dispatch(dm, c.n, dids, dw, dp, c.rt, &dres, s);
    }
    cudaStreamSynchronize(s);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "dispatch (seed %llu): %s",
                (unsigned long long)seed, moea2a_last_error(comm));
    if (r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS) {
        size_t slots = (size_t)ep * (size_t)hres.stride;
        int32_t *counts = to_host(dres.recv_counts, 4 * (size_t)ep);
        int32_t *ids = to_host(dres.topk_ids, 4 * slots * (size_t)k), *src = to_host(dres.src_token_index, 4 * slots);
        RANK_EXPECT(fails, rank, !memcmp(counts, hres.recv_counts, 4 * (size_t)ep), "recv_counts differ");
        RANK_EXPECT(fails, rank, !memcmp(ids, hres.topk_ids, 4 * slots * (size_t)k), "topk_ids differ (sanitized)");
        RANK_EXPECT(fails, rank, !memcmp(src, hres.src_token_index, 4 * slots), "source indexes differ");
        if (dres.total_recv < 0) { /* load/store path: the counts stay on the device */
            int64_t st[4];
            cudaMemcpy(st, dres.device_stats, sizeof(st), cudaMemcpyDeviceToHost);
            dres.total_recv = st[0], dres.invalid_entries = st[1], dres.sent_rows = st[2], dres.deduplicated = st[3];
            RANK_EXPECT(fails, rank, dres.dropped_entries == -1 && dres.device_dropped,
                        "load/store path: dropped_entries %lld, device_dropped %p", (long long)dres.dropped_entries,
                        (const void *)dres.device_dropped);
            if (dres.device_dropped)
                cudaMemcpy(&dres.dropped_entries, dres.device_dropped, sizeof(int64_t), cudaMemcpyDeviceToHost);
        }
        if (expect_nvlink >= 0)
            RANK_EXPECT(fails, rank, dres.nvlink == expect_nvlink, "dispatch took the %s path, expected the %s one",
                        dres.nvlink ? "load/store" : "generic", expect_nvlink ? "load/store" : "generic");
        RANK_EXPECT(fails, rank, dres.invalid_entries == hres.invalid_entries && dres.deduplicated == hres.deduplicated &&
                                     dres.sent_rows == hres.sent_rows && dres.total_recv == hres.total_recv &&
                                     dres.dropped_entries == hres.dropped_entries,
                    "stats differ: invalid %lld/%lld merged %lld/%lld dropped %lld/%lld", (long long)dres.invalid_entries,
                    (long long)hres.invalid_entries, (long long)dres.deduplicated, (long long)hres.deduplicated,
                    (long long)dres.dropped_entries, (long long)hres.dropped_entries);
        /* the host context takes the same path across nodes: the same rows cross */
        RANK_EXPECT(fails, rank, dres.internode_rows == hres.internode_rows && dres.network_rows == hres.network_rows,
                    "rows across nodes differ: internode %lld/%lld network %lld/%lld", (long long)dres.internode_rows,
                    (long long)hres.internode_rows, (long long)dres.network_rows, (long long)hres.network_rows);
        /* valid rows of payloads and weights (padding is left untouched: not compared) */
        for (int i = 0; i < np; i++) {
            unsigned char *got = to_host(dres.payloads[i], c.row[i] * slots);
            for (int q = 0; q < ep; q++)
                RANK_EXPECT(fails, rank,
                            !memcmp(got + (size_t)q * hres.stride * c.row[i],
                                    (unsigned char *)hres.payloads[i] + (size_t)q * hres.stride * c.row[i],
                                    c.row[i] * (size_t)hres.recv_counts[q]),
                            "payload %d rows from rank %d differ", i, q);
            free(got);
        }
        if (hres.topk_weights) {
            float *gw = to_host(dres.topk_weights, 4 * slots * (size_t)k);
            for (int q = 0; q < ep; q++)
                RANK_EXPECT(fails, rank,
                            !memcmp(gw + (size_t)q * hres.stride * k, hres.topk_weights + (size_t)q * hres.stride * k,
                                    4 * (size_t)k * (size_t)hres.recv_counts[q]),
                            "weights from rank %d differ", q);
            free(gw);
        }
        /* combine: the same expert rows on both sides, through the device combine
         * buffer (zero copy: NULL or its pointer), a caller buffer, or the receive
         * arrays (free once combine begins; the rows are copied out of them first) */
        size_t es;
        moea2a_datatype_size(c.cfg.combine_dtype, &es);
        size_t rowb = es * c.cfg.hidden, total = slots * c.cfg.hidden;
        unsigned char *rows = malloc(rowb * slots + 1), *hout = malloc(rowb * (size_t)c.n + 1), *dout;
        fill_rows(rows, total, c.cfg.combine_dtype, seed * 31 + (uint64_t)rank, seed % 5 == 0);
        void *dbuf, *cbuf;
        moea2a_moe_combine_buffer(dm, &cbuf);
        unsigned char *recv0 = np ? (unsigned char *)dres.payloads[0] : (unsigned char *)dres.topk_ids;
        const int zero_copy = seed % 3 == 1;
        const int in_recv = seed % 3 == 2 && (unsigned char *)cbuf - recv0 >= (ptrdiff_t)(rowb * slots); /* fits before */
        dbuf = zero_copy ? cbuf : in_recv ? recv0 : NULL;
        if (dbuf) cudaMemcpy(dbuf, rows, rowb * slots, cudaMemcpyHostToDevice);
        else dbuf = to_device(rows, rowb * slots);
        cudaMalloc((void **)&dout, rowb * (size_t)c.n + 1);
        r = moea2a_combine(hm, rows, hout, NULL);
        const void *din = zero_copy && seed % 2 ? NULL : dbuf;
        if (split) {
            r2 = r ? r : moea2a_combine_send(dm, din, s);
            cudaMemsetAsync(busy, 0xa5, 1 << 20, s);
            r2 = r2 ? r2 : moea2a_combine_recv(dm, dout, s);
        } else {
            r2 = r ? r : moea2a_combine(dm, din, dout, s);
        }
        cudaStreamSynchronize(s);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "combine%s: %s", split ? " (split)" : "",
                    moea2a_last_error(comm));
        unsigned char *got = to_host(dout, rowb * (size_t)c.n);
        size_t bad = 0, first = 0;
        for (size_t i = 0; !r && !r2 && i < rowb * (size_t)c.n; i++)
            if (got[i] != hout[i] && !bad++) first = i;
        RANK_EXPECT(fails, rank, !r && !r2 && !bad,
                    "combine output differs (%s, rows %s): %zu bytes, first at token %zu byte %zu (0x%02x, want 0x%02x)",
                    moea2a_datatype_name(c.cfg.combine_dtype), zero_copy ? "in place" : in_recv ? "in the receive arrays" : "copied",
                    bad, first / rowb, first % rowb, bad ? got[first] : 0, bad ? hout[first] : 0);
        if (count_load && !r && !r2) { /* before the graph's replays count more on the device */
            const int E = c.cfg.num_experts;
            int64_t *hl = calloc((size_t)E, sizeof(int64_t)), *dl = calloc((size_t)E, sizeof(int64_t));
            moea2a_result_t lr = moea2a_moe_expert_load(hm, hl, 0), ld = moea2a_moe_expert_load(dm, dl, 1);
            int e = 0;
            while (!lr && !ld && e < E && hl[e] == dl[e]) e++;
            RANK_EXPECT(fails, rank, !lr && !ld && e == E, "expert load on the device: %s / %s; expert %d: %lld, host %lld",
                        moea2a_strerror(lr), moea2a_strerror(ld), e, e < E ? (long long)dl[e] : 0,
                        e < E ? (long long)hl[e] : 0);
            free(hl), free(dl);
        }
        if (split && !in_recv && !r && !r2 && dres.nvlink) fails += graph_replays(dm, rank, &c, dids, dw, dp, din, dout, hout, rowb, s);
        if (!zero_copy && !in_recv) cudaFree(dbuf);
        cudaFree(dout), free(rows), free(hout), free(got), free(counts), free(ids), free(src);
    }
    if (fails)
        printf("# rank %d: seed %llu: E %d k %d cap %d np %d hidden %zu flags 0x%x n %d rt %d\n", rank,
               (unsigned long long)seed, c.cfg.num_experts, k, c.cfg.max_tokens_per_rank, np, c.cfg.hidden, c.cfg.flags,
               c.n, c.rt);
    for (int i = 0; i < np; i++) cudaFree((void *)dp[i]);
    cudaFree(dids), cudaFree(dw);
    if (s) cudaStreamDestroy(s);
    cudaFree(busy);
    moea2a_moe_destroy(hm);
    moea2a_moe_destroy(dm);
    free_case(&c);
    return fails;
}

typedef struct {
    int ndev, cases;
    uint64_t seed;
    int nvlink;    /* MOEA2A_NVLINK for this run */
    int node_size; /* MOEA2A_NODE_SIZE for this run (emulated nodes; 0: hosts) */
    int copy_engine;
    int large; /* large_case */
    int ipc;   /* no NCCL: UCX for the host side, CUDA IPC for the symmetric memory */
    int flat;  /* with node_size: MOEA2A_HIERARCHICAL=0 (else 1: the hierarchical path, on any node size) */
    int hosts; /* with node_size: each emulated node its own NCCL_HOSTID, so NCCL joins them
                  through its network transport (sockets on loopback), as separate hosts */
} moe_arg_t;


static int moe_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const moe_arg_t *a = arg;
    int fails = 0;
    if (use_device(rank, a->ndev)) return 1;
    setenv("MOEA2A_NVLINK", a->nvlink ? "1" : "0", 1);
    const char *want = getenv("MOEA2A_TEST_EXPECT_NVLINK");
    /* MOEA2A_TEST_EXPECT_NVLINK: 1 the load/store path must be taken, 0 the generic
     * path must be (NCCL forced onto its network transport; one rank still reaches
     * itself by load/store), unset either */
    expect_nvlink = !a->nvlink ? 0 : want && *want == '1' ? 1 : want && *want == '0' && n > 1 ? 0 : -1;
    copy_engine = a->copy_engine, large_case = a->large;
    if (a->ipc) { /* the load/store path is the only one without NCCL */
        without_nccl();
        expect_nvlink = 1;
    }
    if (a->node_size) { /* ranks on several (emulated) nodes: the generic path, node-grouped combine */
        char v[16];
        snprintf(v, sizeof(v), "%d", a->node_size);
        setenv("MOEA2A_NODE_SIZE", v, 1);
        expect_nvlink = 0;
        setenv("MOEA2A_HIERARCHICAL", a->flat ? "0" : "1", 1);
        /* ranks sharing a GPU are apart for NCCL whatever their node */
        if (a->hosts) nccl_hosts_apart(rank, n > a->ndev ? 1 : a->node_size);
    }
    moea2a_comm_t comm;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % a->ndev;
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cfg)) {
        printf("# rank %d: init: %s\n", rank, moea2a_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < a->cases && fails < 5; i++) fails += compare_case(comm, rank, n, a->seed + (uint64_t)i);
    /* host pointers to a CUDA context are refused on every rank (without NCCL a CUDA
     * context needs the load/store path, hence a combine) */
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = 8, m.top_k = 2, m.max_tokens_per_rank = 4, m.memory = MOEA2A_MEMORY_CUDA;
    m.hidden = a->ipc ? 8 : 0;
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &m) == MOEA2A_SUCCESS) {
        int32_t ids[8] = {0};
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        RANK_EXPECT(fails, rank, moea2a_dispatch(moe, 4, ids, NULL, NULL, 0, &res, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                    "host ids to a CUDA context");
        moea2a_moe_destroy(moe);
    } else {
        RANK_EXPECT(fails, rank, 0, "create: %s", moea2a_last_error(comm));
    }
    /* a CUDA context without MOEA2A_MOE_GENERAL_PLACEMENT refuses an expert held by no
     * rank and replicas on every rank, naming the entry and the flag; without
     * MOEA2A_MOE_EXPERT_LOAD it says which flag counts the load */
    m.hidden = 8;
    if (moea2a_moe_create(&moe, comm, &m) == MOEA2A_SUCCESS) {
        const int R = n > 1 ? 2 : 1; /* max_replicas: at most the ranks */
        int32_t map[8], holders[16];
        for (int e = 0; e < 8; e++) map[e] = e % n, holders[R * e] = e % n, holders[R * e + R - 1] = R > 1 ? -1 : e % n;
        map[4] = -1;
        moea2a_result_t r = moea2a_moe_set_placement(moe, map, NULL);
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(comm), "expert_to_rank[4]=-1") &&
                                     strstr(moea2a_last_error(comm), "MOEA2A_MOE_GENERAL_PLACEMENT"),
                    "CUDA set_placement with -1: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
        r = moea2a_moe_set_replicas(moe, R, holders, NULL); /* one holder each: the one-holder rule, allowed */
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "CUDA set_replicas of one holder each: %s: %s", moea2a_strerror(r),
                    moea2a_last_error(comm));
        holders[R * 3 + R - 1] = R > 1 ? (3 + 1) % n : -1; /* two holders, or (one rank) none */
        r = moea2a_moe_set_replicas(moe, R, holders, NULL);
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(comm), R > 1 ? "expert 3 has 2" : "expert 3 has 0"),
                    "CUDA set_replicas with %d holders for expert 3: %s: %s", R > 1 ? 2 : 0, moea2a_strerror(r),
                    moea2a_last_error(comm));
        int64_t load[8];
        r = moea2a_moe_expert_load(moe, load, 0); /* local */
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(comm), "MOEA2A_MOE_EXPERT_LOAD"),
                    "CUDA expert_load without MOEA2A_MOE_EXPERT_LOAD: %s: %s", moea2a_strerror(r),
                    moea2a_last_error(comm));
        moea2a_moe_destroy(moe);
    } else {
        RANK_EXPECT(fails, rank, 0, "create: %s", moea2a_last_error(comm));
    }
    /* a combine refused on rank 0 alone (host memory for out) fails every rank: at once
     * on the generic path, through the device record on the load/store path; never a
     * sum of rows rank 0 did not provide */
    m.hidden = 8;
    if (n > 1 && moea2a_moe_create(&moe, comm, &m) == MOEA2A_SUCCESS) {
        int32_t ids[8] = {0, 7, 1, 6, 2, 5, 3, 4}, *d_ids = to_device(ids, sizeof(ids));
        void *d_out = NULL, *h_out = malloc(4 * 8 * 2);
        cudaMalloc(&d_out, 4 * 8 * 2);
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        moea2a_result_t r = moea2a_dispatch(moe, 4, d_ids, NULL, NULL, 0, &res, NULL);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
        if (r == MOEA2A_SUCCESS) r = moea2a_combine(moe, NULL, rank == 0 ? h_out : d_out, NULL);
        cudaDeviceSynchronize();
        if (r == MOEA2A_SUCCESS) r = moea2a_moe_status(moe);
        /* the peers name rank 0 and give its reason */
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_INVALID_ARGUMENT &&
                                     (rank == 0 || (strstr(moea2a_last_error(comm), "rank 0") &&
                                                    strstr(moea2a_last_error(comm), "out must be in CUDA memory"))),
                    "combine refused on rank 0 (%s path): %s: %s", res.nvlink ? "load/store" : "generic",
                    moea2a_strerror(r), moea2a_last_error(comm));
        cudaFree(d_ids), cudaFree(d_out), free(h_out);
        moea2a_moe_destroy(moe);
    }
    moea2a_comm_destroy(comm);
    return fails > 100 ? 100 : fails;
}

/* A caller's NCCL communicator, adopted: made here with an id sent over a moea2a
 * host communicator, then handed to moea2a_comm_init_nccl. */
/* The generic NCCL path on a stream being captured into a CUDA graph: dispatch, and
 * after an uncaptured dispatch the combine, are MOEA2A_ERR_UNAVAILABLE on every rank
 * with the reason, before anything is enqueued (the captured graph is empty); the
 * context then takes the same calls outside the capture (moea2a_moe(3), CUDA graphs). */
static int capture_generic_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int ndev = *(int *)arg, fails = 0;
    if (use_device(rank, ndev)) return 1;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = 4 * n, mc.top_k = 2, mc.max_tokens_per_rank = 8, mc.hidden = 64;
    mc.num_payloads = 1, mc.payloads[0].dtype = MOEA2A_BFLOAT16, mc.payloads[0].elems_per_token = 64;
    mc.memory = MOEA2A_MEMORY_CUDA, mc.flags = MOEA2A_MOE_NO_NVLINK;
    moea2a_moe_t moe;
    moea2a_result_t r = moea2a_moe_create(&moe, comm, &mc);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "create: %s", moea2a_last_error(comm));
    if (r != MOEA2A_SUCCESS) {
        moea2a_comm_destroy(comm);
        return fails;
    }
    int32_t ids[16];
    uint16_t pay[8 * 64];
    for (int i = 0; i < 16; i++) ids[i] = (rank + 3 * i) % (4 * n);
    for (int i = 0; i < 8 * 64; i++) pay[i] = 0x3f80; /* bf16 1.0 */
    void *d_ids = to_device(ids, sizeof(ids)), *d_pay = to_device(pay, sizeof(pay)), *d_out = NULL;
    cudaMalloc(&d_out, sizeof(pay));
    const void *pays[1] = {d_pay};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    cudaStream_t s;
    cudaStreamCreate(&s);
    for (int call = 0; call < 2; call++) { /* 0: dispatch, 1: combine */
        cudaGraph_t g = NULL;
        size_t nodes = 1;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        r = call == 0 ? moea2a_dispatch(moe, 8, d_ids, NULL, pays, 0, &res, s) : moea2a_combine(moe, NULL, d_out, s);
        const char *why = moea2a_last_error(comm);
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_UNAVAILABLE && strstr(why, "cannot be captured"),
                    "captured %s: %s (%s)", call ? "combine" : "dispatch", moea2a_strerror(r), why);
        RANK_EXPECT(fails, rank, cudaStreamEndCapture(s, &g) == cudaSuccess && g &&
                                     cudaGraphGetNodes(g, NULL, &nodes) == cudaSuccess && nodes == 0,
                    "the refused %s left %zu node(s) in the capture", call ? "combine" : "dispatch", nodes);
        if (g) cudaGraphDestroy(g);
        r = call == 0 ? moea2a_dispatch(moe, 8, d_ids, NULL, pays, 0, &res, s) : moea2a_combine(moe, NULL, d_out, s);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && cudaStreamSynchronize(s) == cudaSuccess,
                    "the same %s outside the capture: %s", call ? "combine" : "dispatch", moea2a_last_error(comm));
    }
    cudaStreamDestroy(s);
    cudaFree(d_ids), cudaFree(d_pay), cudaFree(d_out);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

static int adopt_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int ndev = *(int *)arg, fails = 0;
    if (use_device(rank, ndev)) return 1;
    moea2a_comm_t boot, comm;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.transport = "ucx";
    if (moea2a_comm_init_rank(&boot, n, id, rank, &cfg)) return 1;
    ncclUniqueId nid;
    if (rank == 0) ncclGetUniqueId(&nid);
    moea2a_bcast(&nid, sizeof(nid), MOEA2A_UINT8, 0, boot, NULL);
    moea2a_comm_destroy(boot);
    ncclComm_t nc;
    if (ncclCommInitRank(&nc, n, nid, rank) != ncclSuccess) return 1;
    moea2a_result_t r = moea2a_comm_init_nccl(&comm, nc, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "moea2a_comm_init_nccl: %s", moea2a_last_error(NULL));
    if (r == MOEA2A_SUCCESS) {
        int rr = -1, nn = -1;
        moea2a_comm_rank(comm, &rr), moea2a_comm_size(comm, &nn);
        RANK_EXPECT(fails, rank, rr == rank && nn == n, "rank/size %d/%d", rr, nn);
        fails += compare_case(comm, rank, n, 4242);
        moea2a_comm_destroy(comm);
    }
    ncclCommDestroy(nc);
    return fails;
}

/* NVFP4 on the device equals the host reference bit for bit: quantize (bf16, fp16
 * and fp32 inputs, every layout), dequantize, conversions, global scale. */
static int fp4_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)n, (void)id;
    int fails = 0;
    if (use_device(rank, *(int *)arg)) return 1;
    static const moea2a_datatype_t types[] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};
    /* rounds 6..8: degenerate global scales (inf, 0, subnormal), where products are
     * infinite or 0 x inf and the NaN policy of the reference decides the bits */
    static const float odd_g[3] = {INFINITY, 0.0f, 1e-40f};
    for (int round = 0; round < 9; round++) {
        size_t m = 1 + (size_t)(mix((uint64_t)round) % 300), k = 16 * (1 + (size_t)(mix((uint64_t)round + 99) % 40));
        moea2a_datatype_t t = types[round % 3];
        moea2a_sf_layout_t layout = (moea2a_sf_layout_t)(round % 3);
        size_t es, sfb;
        moea2a_datatype_size(t, &es);
        moea2a_fp4_sf_bytes(layout, m, k, &sfb);
        unsigned char *x = malloc(m * k * es);
        for (size_t i = 0; i < m * k * es; i += 2) { /* finite 16-bit patterns, some NaN/inf blocks */
            uint16_t h = (uint16_t)mix((uint64_t)round * 1000003 + i);
            if (t != MOEA2A_FLOAT32) h &= (uint16_t)(i % 4096 == 0 ? 0xffff : 0xbfff);
            memcpy(x + i, &h, 2);
        }
        float g = 0, *dg;
        moea2a_fp4_global_scale(x, t, m * k, &g, NULL);
        if (!isfinite(g) || g == 0) g = 1.0f;
        if (round >= 6) g = odd_g[round - 6];
        unsigned char *hq = malloc(m * k / 2), *hs = malloc(sfb), *dq_h = malloc(m * k / 2), *ds_h = malloc(sfb);
        moea2a_fp4_quantize(x, t, m, k, &g, hq, hs, layout, NULL);
        void *dx = to_device(x, m * k * es), *dq, *ds, *dout;
        dg = to_device(&g, sizeof(g));
        cudaMalloc(&dq, m * k / 2), cudaMalloc(&ds, sfb), cudaMalloc(&dout, m * k * 4);
        moea2a_result_t r = moea2a_fp4_quantize(dx, t, m, k, dg, dq, ds, layout, NULL);
        cudaDeviceSynchronize();
        cudaMemcpy(dq_h, dq, m * k / 2, cudaMemcpyDeviceToHost), cudaMemcpy(ds_h, ds, sfb, cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(hq, dq_h, m * k / 2) && !memcmp(hs, ds_h, sfb),
                    "quantize %s %zux%zu layout %d: device differs from host", moea2a_datatype_name(t), m, k, (int)layout);
        float *hout = malloc(m * k * 4), *dout_h = malloc(m * k * 4);
        moea2a_fp4_dequantize(hq, hs, layout, &g, m, k, hout, t, NULL);
        r = moea2a_fp4_dequantize(dq, ds, layout, dg, m, k, dout, t, NULL);
        cudaMemcpy(dout_h, dout, m * k * es, cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(hout, dout_h, m * k * es), "dequantize %s differs",
                    moea2a_datatype_name(t));
        float dgv = 0;
        moea2a_fp4_global_scale(dx, t, m * k, dg, NULL);
        cudaMemcpy(&dgv, dg, 4, cudaMemcpyDeviceToHost);
        float hg;
        moea2a_fp4_global_scale(x, t, m * k, &hg, NULL);
        RANK_EXPECT(fails, rank, (isnan(dgv) && isnan(hg)) || !memcmp(&dgv, &hg, 4), "global scale differs (%g vs %g)",
                    (double)dgv, (double)hg);
        /* conversion of the device scales to 8x4 and back */
        size_t b8;
        moea2a_fp4_sf_bytes(MOEA2A_SF_8X4, m, k, &b8);
        void *d8, *dl;
        cudaMalloc(&d8, b8), cudaMalloc(&dl, m * k / 16);
        moea2a_fp4_sf_convert(ds, layout, d8, MOEA2A_SF_8X4, m, k, NULL);
        moea2a_fp4_sf_convert(d8, MOEA2A_SF_8X4, dl, MOEA2A_SF_LINEAR, m, k, NULL);
        unsigned char *lin_d = malloc(m * k / 16), *lin_h = malloc(m * k / 16);
        cudaMemcpy(lin_d, dl, m * k / 16, cudaMemcpyDeviceToHost);
        moea2a_fp4_sf_convert(hs, layout, lin_h, MOEA2A_SF_LINEAR, m, k, NULL);
        RANK_EXPECT(fails, rank, !memcmp(lin_d, lin_h, m * k / 16), "scale conversions differ");
        /* linear scales to each tiled layout on the device, padding included, against the
         * host (rows with a multiple of 4 blocks take the word kernel, the others bytes) */
        for (int tl = MOEA2A_SF_128X4; tl <= MOEA2A_SF_8X4; tl++) {
            size_t tb;
            moea2a_fp4_sf_bytes((moea2a_sf_layout_t)tl, m, k, &tb);
            unsigned char *th = malloc(tb), *td = malloc(tb);
            void *dt;
            cudaMalloc(&dt, tb);
            cudaMemset(dt, 0xee, tb);
            moea2a_fp4_sf_convert(lin_h, MOEA2A_SF_LINEAR, th, (moea2a_sf_layout_t)tl, m, k, NULL);
            r = moea2a_fp4_sf_convert(dl, MOEA2A_SF_LINEAR, dt, (moea2a_sf_layout_t)tl, m, k, NULL);
            cudaMemcpy(td, dt, tb, cudaMemcpyDeviceToHost);
            RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(th, td, tb),
                        "linear scales to layout %d on the device (%zu x %zu blocks) differ from the host's", tl, m,
                        k / 16);
            cudaFree(dt), free(th), free(td);
        }
        cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree(dout), cudaFree(dg), cudaFree(d8), cudaFree(dl);
        free(x), free(hq), free(hs), free(dq_h), free(ds_h), free(hout), free(dout_h), free(lin_d), free(lin_h);
    }
    return fails;
}

/* FP8 block quantization on the device equals the host reference bit for bit (the host
 * is held to the oracle in tests/test_fp8.c): bf16, fp16 and fp32 inputs with NaN, inf,
 * zero and tiny blocks; both layouts and both scale kinds, padding included; dequantize. */
static int fp8_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)n, (void)id;
    int fails = 0;
    if (use_device(rank, *(int *)arg)) return 1;
    static const moea2a_datatype_t types[] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};
    for (int round = 0; round < 12; round++) {
        size_t m = 1 + (size_t)(mix((uint64_t)round + 7) % 300), k = 128 * (1 + (size_t)(mix((uint64_t)round + 77) % 60));
        moea2a_datatype_t t = types[round % 3];
        moea2a_fp8_scale_layout_t layout = (moea2a_fp8_scale_layout_t)((round / 3) % 2);
        unsigned flags = (round / 6) % 2 ? MOEA2A_FP8_UE8M0 : 0;
        size_t es, sb;
        moea2a_datatype_size(t, &es);
        moea2a_fp8_scale_bytes(layout, flags, m, k, &sb);
        unsigned char *x = malloc(m * k * es);
        for (size_t i = 0; i < m * k * es; i += 2) { /* random patterns; some blocks zero, some non-finite */
            uint16_t h = (uint16_t)mix((uint64_t)round * 1000003 + i);
            if (t != MOEA2A_FLOAT32) h &= (uint16_t)(i % 8192 == 0 ? 0xffff : 0xbfff);
            if ((i / (128 * es)) % 11 == 3) h = 0;
            memcpy(x + i, &h, 2);
        }
        unsigned char *hq = malloc(m * k), *hs = malloc(sb), *dq_h = malloc(m * k), *ds_h = malloc(sb);
        moea2a_fp8_quantize(x, t, m, k, hq, hs, layout, flags, NULL);
        void *dx = to_device(x, m * k * es), *dq, *ds, *dout;
        cudaMalloc(&dq, m * k), cudaMalloc(&ds, sb), cudaMalloc(&dout, m * k * 4);
        cudaMemset(ds, 0xAB, sb); /* padding must be written */
        moea2a_result_t r = moea2a_fp8_quantize(dx, t, m, k, dq, ds, layout, flags, NULL);
        cudaDeviceSynchronize();
        cudaMemcpy(dq_h, dq, m * k, cudaMemcpyDeviceToHost), cudaMemcpy(ds_h, ds, sb, cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(hq, dq_h, m * k) && !memcmp(hs, ds_h, sb),
                    "fp8 quantize %s %zux%zu layout %d flags %u: device differs from host (%s)", moea2a_datatype_name(t),
                    m, k, (int)layout, flags, moea2a_last_error(NULL));
        unsigned char *hout = malloc(m * k * es), *dout_h = malloc(m * k * es);
        moea2a_fp8_dequantize(hq, hs, layout, flags, m, k, hout, t, NULL);
        r = moea2a_fp8_dequantize(dq, ds, layout, flags, m, k, dout, t, NULL);
        cudaMemcpy(dout_h, dout, m * k * es, cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(hout, dout_h, m * k * es), "fp8 dequantize %s differs",
                    moea2a_datatype_name(t));
        cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree(dout);
        free(x), free(hq), free(hs), free(dq_h), free(ds_h), free(hout), free(dout_h);
    }
    return fails;
}

/* ---- a soak of the hierarchical path ------------------------------------------------ */

typedef struct {
    int ndev, node_size, iters;
} soak_arg_t;

/* Round trips on emulated nodes, each with a fresh routing (some ranks idle, some full,
 * a few invalid ids) and payload; the expert rows are the dispatched rows themselves,
 * so every combine output is a node-grouped sum the host context computes too. Both
 * outputs, the receive counts and the rows across nodes must agree in every round. */
static int soak_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const soak_arg_t *a = arg;
    int fails = 0;
    if (use_device(rank, a->ndev)) return 1;
    char v[16];
    snprintf(v, sizeof(v), "%d", a->node_size);
    setenv("MOEA2A_NODE_SIZE", v, 1);
    setenv("MOEA2A_HIERARCHICAL", "1", 1); /* also on nodes of one GPU */
    if (n > a->ndev) nccl_hosts_apart(rank, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % a->ndev;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cfg)) return 1;
    enum { E = 64, K = 6, CAP = 96, H = 136 };
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = E, mc.top_k = K, mc.max_tokens_per_rank = CAP, mc.hidden = H;
    mc.num_payloads = 1, mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, H};
    moea2a_moe_config_t hc = mc;
    hc.memory = MOEA2A_MEMORY_HOST, mc.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_t hm = NULL, dm = NULL;
    if (moea2a_moe_create(&hm, comm, &hc) || moea2a_moe_create(&dm, comm, &mc)) {
        printf("# rank %d: create: %s\n", rank, moea2a_last_error(comm));
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * CAP * K);
    uint16_t *x = malloc(2 * CAP * H), *hout = malloc(2 * CAP * H), *dout_h = malloc(2 * CAP * H);
    void *d_ids = NULL, *d_x = NULL, *d_out = NULL;
    cudaMalloc(&d_ids, sizeof(int32_t) * CAP * K), cudaMalloc(&d_x, 2 * CAP * H), cudaMalloc(&d_out, 2 * CAP * H);
    uint64_t st = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    int64_t across = 0;
    for (int it = 0; it < a->iters && fails < 3; it++) {
        /* every rank draws the same round shape, then its own tokens */
        const int shape = it % 5, cnt = shape == 0 ? 0 : shape == 1 ? CAP : 1 + (int)((unsigned)(it * 2654435761u + rank * 97u) % CAP);
        for (int i = 0; i < cnt * K; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(st >> 33);
            ids[i] = r % 97 == 0 ? -1 : (int32_t)(r % E);
        }
        for (int i = 0; i < cnt * H; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (uint16_t)(0x3c00 + (int)((st >> 40) % 0x800) - 0x400); /* bf16 about 2^-7..2^1, both signs */
            x[i] ^= (uint16_t)((st >> 20) & 0x8000);
        }
        if (cnt) cudaMemcpy(d_ids, ids, sizeof(int32_t) * cnt * K, cudaMemcpyHostToDevice);
        if (cnt) cudaMemcpy(d_x, x, 2 * (size_t)cnt * H, cudaMemcpyHostToDevice);
        const void *hp[1] = {x}, *dp[1] = {d_x};
        moea2a_dispatch_result_t hr = MOEA2A_DISPATCH_RESULT_INITIALIZER, dr = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        moea2a_comm_traffic_t t0 = MOEA2A_COMM_TRAFFIC_INITIALIZER, t1 = t0, t2 = t0;
        moea2a_result_t r = moea2a_dispatch(hm, cnt, ids, NULL, hp, 0, &hr, NULL);
        if (!r) r = moea2a_comm_traffic(comm, &t0);
        if (!r) r = moea2a_dispatch(dm, cnt, d_ids, NULL, dp, 0, &dr, NULL);
        if (!r) r = moea2a_comm_traffic(comm, &t1);
        if (!r) r = moea2a_combine(hm, hr.payloads[0], hout, NULL);
        if (!r) r = moea2a_combine(dm, dr.payloads[0], d_out, NULL);
        if (!r) r = moea2a_comm_traffic(comm, &t2);
        if (!r && cnt) r = cudaMemcpy(dout_h, d_out, 2 * (size_t)cnt * H, cudaMemcpyDeviceToHost) ? MOEA2A_ERR_CUDA : r;
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "round %d: %s", it, moea2a_last_error(comm));
        if (r) break;
        int32_t got[8];
        cudaMemcpy(got, dr.recv_counts, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, !memcmp(got, hr.recv_counts, sizeof(int32_t) * (size_t)n), "round %d: receive counts differ", it);
        RANK_EXPECT(fails, rank, dr.network_rows == hr.network_rows && dr.total_recv == hr.total_recv,
                    "round %d: network rows %lld / %lld, received %lld / %lld", it, (long long)dr.network_rows,
                    (long long)hr.network_rows, (long long)dr.total_recv, (long long)hr.total_recv);
        RANK_EXPECT(fails, rank, !memcmp(dout_h, hout, 2 * (size_t)cnt * H), "round %d: combine output differs", it);
        /* What NCCL was handed for other nodes, from the transport's count: the routing's
         * node-dedup rows, each a record (payload, ids, source index) and its relay codes
         * (k ids); back, one partial row per relayed row, summed over the ranks. */
        int64_t dedup = 0;
        for (int tk = 0; tk < cnt; tk++) {
            unsigned seen = 0;
            for (int j = 0; j < K; j++)
                if (ids[tk * K + j] >= 0) {
                    const int node = ids[tk * K + j] / (E / n) / a->node_size;
                    if (node != rank / a->node_size) seen |= 1u << node;
                }
            dedup += __builtin_popcount(seen);
        }
        const int64_t row_bytes = 2 * H + 4 * K + 4 + 4 * K, sent = t1.cuda_other_nodes - t0.cuda_other_nodes;
        RANK_EXPECT(fails, rank, dr.network_rows == dedup && sent == dedup * row_bytes,
                    "round %d: NCCL was handed %lld bytes for other nodes, the routing's %lld rows make %lld (the "
                    "path counted %lld rows)", it, (long long)sent, (long long)dedup, (long long)(dedup * row_bytes),
                    (long long)dr.network_rows);
        int64_t mine[2] = {dedup, t2.cuda_other_nodes - t1.cuda_other_nodes}, all[16];
        if (moea2a_allgather(mine, all, 2, MOEA2A_INT64, comm, NULL) == MOEA2A_SUCCESS) {
            int64_t rows = 0, back = 0;
            for (int q = 0; q < n; q++) rows += all[2 * q], back += all[2 * q + 1];
            RANK_EXPECT(fails, rank, back == rows * 2 * H, "round %d: the combines handed NCCL %lld bytes for other "
                        "nodes, %lld partial rows make %lld", it, (long long)back, (long long)rows,
                        (long long)(rows * 2 * H));
        }
        across += dr.network_rows;
    }
    printf("# rank %d: %d rounds, %lld rows sent across nodes\n", rank, a->iters, (long long)across);
    cudaFree(d_ids), cudaFree(d_x), cudaFree(d_out);
    free(ids), free(x), free(hout), free(dout_h);
    moea2a_moe_destroy(dm), moea2a_moe_destroy(hm);
    moea2a_comm_destroy(comm);
    return fails;
}

/* ---- a dead peer on CUDA memory ---------------------------------------------------- */

typedef struct {
    int ndev, nvlink;
    volatile double *kill_time; /* shared with the parent (MAP_SHARED) */
    int ipc;                    /* as moe_arg_t.ipc */
    int node_size;              /* MOEA2A_NODE_SIZE (emulated nodes: the hierarchical path), 0: none */
    int hosts;                  /* each rank a host of its own for NCCL (ranks sharing a GPU) */
} kill_arg_t;

static void *kill_later(void *arg)
{
    kill_arg_t *a = arg;
    usleep(200000);
    *a->kill_time = now_s();
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Rank 1 dies (SIGKILL) in the middle of a loop of dispatch and combine on CUDA
 * memory; every survivor must get MOEA2A_ERR_PEER_FAILED naming rank 1 within 1 s of
 * the kill (the peer watcher's news: a device wait that ends the kernel, or a host
 * wait that aborts the NCCL communicator), never hang, and destroy cleanly. On the
 * load/store path the timeout is 30 s, so it cannot be what tells them. On the NCCL
 * paths a death that lands inside the NCCL transport's own wait (a group it launches)
 * is bounded by the timeout there (3 s), which may tell first. */
#define KILL_BOUND_S 1.0
/* The dead-peer points' set-up: the device, the path, a communicator with timeout_s
 * and a small MoE context, 64 tokens' ids and a payload on the device; 1 on failure. */
typedef struct {
    moea2a_comm_t comm;
    moea2a_moe_t moe;
    void *ids, *x, *y;
} kill_ctx_t;

/* kill_setup's experts, and the id of its rank's entry i (64 tokens of 4 entries) */
#define KILL_EXPERTS 16
#define KILL_ID(rank, i) (((i) * 7 + (rank)) % KILL_EXPERTS)

static int kill_setup(int rank, int n, moea2a_unique_id_t id, const kill_arg_t *a, double timeout_s, kill_ctx_t *k)
{
    if (use_device(rank, a->ndev)) return 1;
    setenv("MOEA2A_NVLINK", a->nvlink ? "1" : "0", 1);
    if (a->ipc) without_nccl();
    if (a->node_size) { /* the hierarchical path, also on nodes of one GPU */
        char v[16];
        snprintf(v, sizeof(v), "%d", a->node_size);
        setenv("MOEA2A_NODE_SIZE", v, 1);
        setenv("MOEA2A_HIERARCHICAL", "1", 1);
    }
    if (a->hosts) nccl_hosts_apart(rank, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = timeout_s, cfg.cuda_device = rank % a->ndev;
    if (moea2a_comm_init_rank(&k->comm, n, id, rank, &cfg)) return 1;
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = KILL_EXPERTS, mc.top_k = 4, mc.max_tokens_per_rank = 64, mc.hidden = 256;
    mc.memory = MOEA2A_MEMORY_CUDA;
    mc.num_payloads = 1, mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, 256};
    if (moea2a_moe_create(&k->moe, k->comm, &mc)) {
        printf("# rank %d: create: %s\n", rank, moea2a_last_error(k->comm));
        return 1;
    }
    int32_t ids[64 * 4];
    for (int i = 0; i < 64 * 4; i++) ids[i] = KILL_ID(rank, i);
    k->ids = to_device(ids, sizeof(ids)), k->x = k->y = NULL;
    cudaMalloc(&k->x, 64 * 256 * 2), cudaMalloc(&k->y, 64 * 256 * 2);
    cudaMemset(k->x, 0, 64 * 256 * 2);
    return moea2a_barrier(k->comm) != MOEA2A_SUCCESS;
}

/* A bf16 value of a small whole number: sums of up to 4 of them are exact in fp32 and
 * in bf16, so a combine's output is known bit for bit whatever order it adds in. */
static uint16_t bf16_small(int v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* A dispatch of kill_setup's 64 tokens (their ids as rank `old_rank` made them) with a
 * payload of small whole numbers, and a combine of the rows received. A token's rows
 * meet once per rank holding one of its experts under `map` (the placement in force),
 * so its output is the payload times that number of ranks. 1 when every bit agrees. */
static int round_trip_checked(moea2a_moe_t moe, kill_ctx_t *k, int old_rank, const int32_t *map)
{
    uint16_t h[64 * 256], back[64 * 256];
    for (int i = 0; i < 64 * 256; i++) h[i] = bf16_small(i % 17 - 8);
    cudaMemcpy(k->x, h, sizeof(h), cudaMemcpyHostToDevice);
    cudaMemset(k->y, 0xff, sizeof(back));
    const void *pl[1] = {k->x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    if (moea2a_dispatch(moe, 64, k->ids, NULL, pl, 0, &res, NULL) != MOEA2A_SUCCESS) return 0;
    if (moea2a_combine(moe, res.payloads[0], k->y, NULL) != MOEA2A_SUCCESS) return 0;
    if (cudaMemcpy(back, k->y, sizeof(back), cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    if (moea2a_moe_status(moe) != MOEA2A_SUCCESS) return 0;
    for (int t = 0; t < 64; t++) {
        unsigned seen = 0; /* the ranks the token's rows went to */
        for (int j = 0; j < 4; j++) seen |= 1u << map[KILL_ID(old_rank, t * 4 + j)];
        const int times = __builtin_popcount(seen);
        for (int c = 0; c < 256; c++)
            if (back[t * 256 + c] != bf16_small(times * ((t * 256 + c) % 17 - 8))) return 0;
    }
    return 1;
}

/* What every survivor does next (moea2a_recovery(7)): shrink to the ranks alive (all
 * of them call it), move the context there (placement derived) and make checked round
 * trips; *newcomm for the caller to destroy after the context. */
static int recover_survivors(int rank, int n, kill_ctx_t *k, const char *path, moea2a_comm_t *newcomm)
{
    int fails = 0;
    const double t0 = now_s();
    moea2a_result_t r = moea2a_comm_shrink(k->comm, NULL, 0, newcomm);
    if (r == MOEA2A_SUCCESS) r = moea2a_moe_retarget(k->moe, *newcomm, NULL);
    const double took = now_s() - t0;
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "shrink + retarget after the death: %s: %s", moea2a_strerror(r),
                moea2a_last_error(*newcomm ? *newcomm : k->comm));
    /* kill_setup's contiguous placement, rank 1 gone */
    int32_t old[KILL_EXPERTS], map[KILL_EXPERTS];
    for (int e = 0; e < KILL_EXPERTS; e++) old[e] = contiguous_owner(e, KILL_EXPERTS, n);
    derived_placement(old, KILL_EXPERTS, n, 1, map);
    int good = 0;
    for (int i = 0; r == MOEA2A_SUCCESS && i < 3; i++) good += round_trip_checked(k->moe, k, rank, map);
    RANK_EXPECT(fails, rank, r != MOEA2A_SUCCESS || good == 3, "%d of 3 round trips on the shrunk communicator right: %s",
                good, moea2a_last_error(*newcomm));
    printf("# rank %d (%s path): shrink to %d + retarget %.3f s, then %d of 3 round trips checked\n", rank, path, n - 1,
           took, good);
    return fails;
}

static int killed_peer_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    kill_arg_t *a = arg;
    int fails = 0;
    const int nccl_path = !a->nvlink || a->node_size;
    const double timeout_s = nccl_path ? 3.0 : 30.0;
    kill_ctx_t k;
    if (kill_setup(rank, n, id, a, timeout_s, &k)) return 1;
    moea2a_comm_t comm = k.comm;
    moea2a_moe_t moe = k.moe;
    void *d_ids = k.ids, *x = k.x, *y = k.y;
    pthread_t t;
    if (rank == 1) pthread_create(&t, NULL, kill_later, a);
    const void *pl[1] = {x};
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int it = 0; r == MOEA2A_SUCCESS && it < 2000000; it++) {
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        r = moea2a_dispatch(moe, 64, d_ids, NULL, pl, 0, &res, NULL);
        if (r == MOEA2A_SUCCESS) r = moea2a_combine(moe, NULL, y, NULL);
        if (r == MOEA2A_SUCCESS && it % 16 == 0) {
            /* Let the stream drain a little (never an unbounded wait: a generic-path
             * kernel may be stuck on the dead peer until moea2a aborts NCCL), then ask
             * for a device error the load/store kernels recorded. */
            for (double t0 = now_s(); cudaStreamQuery(NULL) == cudaErrorNotReady && now_s() - t0 < 0.5 &&
                                      (r = moea2a_moe_status(moe)) == MOEA2A_SUCCESS;)
                usleep(100);
            if (r == MOEA2A_SUCCESS) r = moea2a_moe_status(moe);
        }
    }
    if (rank == 1) pause();
    double after = now_s() - *a->kill_time;
    const int named = r == MOEA2A_ERR_PEER_FAILED && strstr(moea2a_last_error(comm), "rank 1 ") && after < KILL_BOUND_S;
    /* every path, NCCL's host waits included (they read the peer watcher's word) */
    RANK_EXPECT(fails, rank, *a->kill_time > 0 && named,
                "expected MOEA2A_ERR_PEER_FAILED naming rank 1 within %.1f s of the kill, got %s after %.2f s",
                KILL_BOUND_S, moea2a_strerror(r), after);
    printf("# rank %d (%s path): %s %.2f s after the kill: %s\n", rank,
           a->node_size ? "hierarchical" : a->nvlink ? "default" : "generic", moea2a_strerror(r), after,
           moea2a_last_error(comm));
    fflush(stdout);
    moea2a_comm_t alone = NULL;
    const char *path = a->node_size ? "hierarchical" : a->nvlink ? "default" : "generic";
    if (named) fails += recover_survivors(rank, n, &k, path, &alone);
    double t0 = now_s();
    moea2a_moe_destroy(moe);
    if (alone) moea2a_comm_destroy(alone);
    moea2a_comm_destroy(comm);
    RANK_EXPECT(fails, rank, now_s() - t0 < 10.0, "destroy after the failure took %.1f s", now_s() - t0);
    return fails;
}

/* Every rank shrinks by choice, leaving nobody out, with no failure: the transports are
 * made from the communicator's (NCCL: ncclCommShrink where NCCL has it), the context
 * moves there and its round trips (one rank) are right; then the old communicator goes
 * first, the new one after. */
static int shrink_by_choice_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    kill_arg_t *a = arg;
    int fails = 0;
    kill_ctx_t k;
    if (kill_setup(rank, n, id, a, 30.0, &k)) return 1;
    moea2a_comm_t nc = NULL;
    moea2a_result_t r = moea2a_comm_shrink(k.comm, NULL, 0, &nc);
    if (r == MOEA2A_SUCCESS) r = moea2a_moe_retarget(k.moe, nc, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "shrink by choice + retarget: %s", moea2a_last_error(k.comm));
    moea2a_comm_destroy(k.comm);
    int good = 0;
    int32_t all_here[KILL_EXPERTS] = {0};
    for (int i = 0; r == MOEA2A_SUCCESS && i < 3; i++) good += round_trip_checked(k.moe, &k, rank, all_here);
    RANK_EXPECT(fails, rank, r != MOEA2A_SUCCESS || good == 3, "%d of 3 round trips right after the shrink: %s", good,
                moea2a_last_error(nc));
    moea2a_moe_destroy(k.moe);
    if (nc) moea2a_comm_destroy(nc);
    return fails;
}

/* Rank 1 dies while rank 0's dispatch kernel waits for its rows, and rank 0 waits in
 * cudaStreamSynchronize: no moea2a call looks at anything, so the kernel itself must
 * end within 1 s of the death (its waits read the peer watcher's news), whatever the
 * timeout (30 s); moea2a_moe_status then names rank 1 as a device wait saw it. */
static int stalled_kernel_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    kill_arg_t *a = arg;
    int fails = 0;
    kill_ctx_t k;
    if (kill_setup(rank, n, id, a, 30.0, &k)) return 1;
    if (rank == 1) {
        usleep(300000);
        *a->kill_time = now_s();
        kill(getpid(), SIGKILL);
    }
    const void *pl[1] = {k.x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_dispatch(k.moe, 64, k.ids, NULL, pl, 0, &res, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(k.comm));
    cudaError_t e = cudaStreamSynchronize(NULL);
    const double after = now_s() - *a->kill_time;
    moea2a_result_t st = moea2a_moe_status(k.moe);
    const char *msg = moea2a_last_error(k.comm);
    RANK_EXPECT(fails, rank, e == cudaSuccess && *a->kill_time > 0 && after < KILL_BOUND_S,
                "the stream ended %.2f s after the kill (%s); want the kernel to end within %.1f s", after,
                cudaGetErrorString(e), KILL_BOUND_S);
    RANK_EXPECT(fails, rank, st == MOEA2A_ERR_PEER_FAILED && strstr(msg, "rank 1 ") && strstr(msg, "device wait"),
                "status: %s: %s (want MOEA2A_ERR_PEER_FAILED naming rank 1, seen by a device wait)",
                moea2a_strerror(st), msg);
    printf("# rank 0 (%s): the kernel ended %.3f s after the kill: %s\n", a->ipc ? "CUDA IPC" : "NCCL window", after,
           msg);
    double t0 = now_s();
    moea2a_moe_destroy(k.moe);
    moea2a_comm_destroy(k.comm);
    RANK_EXPECT(fails, rank, now_s() - t0 < 10.0, "destroy after the failure took %.1f s", now_s() - t0);
    return fails;
}

/* Rank 1 dies instead of taking part in an alltoallv over NCCL that rank 0 enqueued,
 * and rank 0 waits in cudaStreamSynchronize: NCCL's kernels wait on rank 1 and nothing
 * of moea2a runs, so the nccl module's guard must end them within 1 s of the death
 * (whatever the timeout, 30 s); the next call names rank 1. On one GPU the two ranks
 * are NCCL_HOSTID apart. */
static int stalled_nccl_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    kill_arg_t *a = arg;
    int fails = 0;
    if (use_device(rank, a->ndev)) return 1;
    if (a->hosts) nccl_hosts_apart(rank, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = 30.0, cfg.cuda_device = rank % a->ndev;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cfg)) return 1;
    enum { COUNT = 1 << 20 };
    int64_t sc[2] = {0, COUNT}, sd[2] = {0, 0}, rc[2] = {0, COUNT}, rd[2] = {0, 0};
    if (rank == 1) sc[0] = rc[0] = COUNT, sc[1] = rc[1] = 0;
    void *sb = NULL, *rb = NULL;
    cudaMalloc(&sb, 4 * COUNT), cudaMalloc(&rb, 4 * COUNT);
    cudaStream_t s;
    cudaStreamCreate(&s);
    /* one exchange first, so that NCCL's connection between the two exists */
    moea2a_result_t r = moea2a_alltoallv(sb, sc, sd, rb, rc, rd, MOEA2A_INT32, comm, s);
    if (r || cudaStreamSynchronize(s) != cudaSuccess || moea2a_barrier(comm)) return 1;
    if (rank == 1) {
        usleep(300000);
        *a->kill_time = now_s();
        kill(getpid(), SIGKILL);
    }
    r = moea2a_alltoallv(sb, sc, sd, rb, rc, rd, MOEA2A_INT32, comm, s);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "alltoallv enqueued: %s", moea2a_last_error(comm));
    const cudaError_t e = cudaStreamSynchronize(s);
    const double after = now_s() - *a->kill_time;
    RANK_EXPECT(fails, rank, *a->kill_time > 0 && after < KILL_BOUND_S,
                "the stream ended %.2f s after the kill (%s); want NCCL's kernels ended within %.1f s", after,
                cudaGetErrorString(e), KILL_BOUND_S);
    (void)cudaGetLastError();
    r = moea2a_barrier(comm);
    const char *msg = moea2a_last_error(comm);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_PEER_FAILED && strstr(msg, "rank 1 "),
                "the next call: %s: %s (want MOEA2A_ERR_PEER_FAILED naming rank 1)", moea2a_strerror(r), msg);
    printf("# rank 0 (generic NCCL, %s): the stream ended %.3f s after the kill; then %s\n",
           a->hosts ? "NCCL_HOSTID apart" : "a GPU each", after, msg);
    double t0 = now_s();
    cudaStreamDestroy(s), cudaFree(sb), cudaFree(rb);
    moea2a_comm_destroy(comm);
    RANK_EXPECT(fails, rank, now_s() - t0 < 10.0, "destroy after the failure took %.1f s", now_s() - t0);
    return fails;
}

/* MOEA2A_SYMMETRIC_MEMORY without NCCL: a value that names no way and the transport's
 * way (there is none) fail create on every rank with the reason; cuda_ipc serves. */
static int symmetric_choice_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int ndev = *(int *)arg, fails = 0;
    if (use_device(rank, ndev)) return 1;
    without_nccl();
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % ndev;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cfg)) return 1;
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = 8, m.top_k = 2, m.max_tokens_per_rank = 16, m.hidden = 64, m.memory = MOEA2A_MEMORY_CUDA;
    static const struct {
        const char *value;
        moea2a_result_t want;
        const char *says;
    } runs[] = {{"nvshmem", MOEA2A_ERR_INVALID_ARGUMENT, "expected auto, transport or cuda_ipc"},
                {"transport", MOEA2A_ERR_UNAVAILABLE, "transport: no CUDA transport"},
                {"cuda_ipc", MOEA2A_SUCCESS, ""},
                {"auto", MOEA2A_SUCCESS, ""}};
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        setenv("MOEA2A_SYMMETRIC_MEMORY", runs[i].value, 1);
        moea2a_moe_t moe = NULL;
        moea2a_result_t r = moea2a_moe_create(&moe, comm, &m);
        RANK_EXPECT(fails, rank, r == runs[i].want && (!*runs[i].says || strstr(moea2a_last_error(comm), runs[i].says)),
                    "MOEA2A_SYMMETRIC_MEMORY=%s: %s (%s), expected %s", runs[i].value, moea2a_strerror(r),
                    r ? moea2a_last_error(comm) : "", moea2a_strerror(runs[i].want));
        if (moe) moea2a_moe_destroy(moe);
    }
    moea2a_comm_destroy(comm);
    return fails;
}

/* One rank of several threads in one process (thread_ranks): CUDA memory, no NCCL, so
 * the load/store path over CUDA IPC reaches the other threads' ranks directly. Besides
 * the checked payload, two more go quantized to FP8 and NVFP4, quantized before the
 * dispatch (MOEA2A_QUANT_OVERLAP=0): the ranks share one CUDA context, where a kernel's
 * first launch would wait for the peers' kernels that wait for this rank (their bits
 * are test_wire's business; here every call must complete). */
static int thread_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const int ndev = *(int *)arg;
    int fails = 0, took_nvlink = 0;
    long wrong = 0;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % ndev, cfg.transport = "ucx";
    moea2a_comm_t comm = NULL;
    rt_state_t *s = calloc(1, sizeof(*s));
    moea2a_moe_config_t mc = rt_config();
    mc.memory = MOEA2A_MEMORY_CUDA, mc.num_payloads = 3;
    mc.payloads[1] = mc.payloads[2] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, 128};
    mc.wire[1].format = MOEA2A_WIRE_FP8, mc.wire[2].format = MOEA2A_WIRE_NVFP4;
    void *dids = NULL, *dx = NULL, *dout = NULL, *dq = NULL;
    cudaStream_t st = NULL;
    cudaSetDevice(rank % ndev);
    moea2a_result_t r = s ? moea2a_comm_init_rank(&comm, n, id, rank, &cfg) : MOEA2A_ERR_NO_MEMORY;
    if (r == MOEA2A_SUCCESS) {
        s->ep = n, s->seed = 0x5eed + (uint64_t)rank;
        r = moea2a_moe_create(&s->moe, comm, &mc);
    }
    if (r == MOEA2A_SUCCESS && (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) ||
                                cudaMalloc(&dids, sizeof(s->ids)) || cudaMalloc(&dx, sizeof(s->x)) ||
                                cudaMalloc(&dout, sizeof(s->out)) || cudaMalloc(&dq, RT_CAP * 128 * 2) ||
                                cudaMemset(dq, 0, RT_CAP * 128 * 2)))
        r = MOEA2A_ERR_CUDA;
    for (long it = 0; it < 300 && r == MOEA2A_SUCCESS; it++) {
        int nt = rt_inputs(s, it);
        cudaMemcpy(dids, s->ids, sizeof(int32_t) * (size_t)(nt * RT_K), cudaMemcpyHostToDevice);
        cudaMemcpy(dx, s->x, sizeof(uint16_t) * (size_t)(nt * RT_H), cudaMemcpyHostToDevice);
        const void *pl[3] = {dx, dq, dq};
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        r = moea2a_dispatch(s->moe, nt, dids, NULL, pl, 0, &res, st);
        if (r == MOEA2A_SUCCESS) r = moea2a_combine(s->moe, res.payloads[0], dout, st);
        if (r == MOEA2A_SUCCESS) r = cudaStreamSynchronize(st) ? MOEA2A_ERR_CUDA : moea2a_moe_status(s->moe);
        if (r == MOEA2A_SUCCESS && cudaMemcpy(s->out, dout, sizeof(uint16_t) * (size_t)(nt * RT_H), cudaMemcpyDeviceToHost))
            r = MOEA2A_ERR_CUDA;
        if (r == MOEA2A_SUCCESS) wrong += rt_mismatches(s, it, nt);
        took_nvlink = res.nvlink;
    }
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && wrong == 0 && took_nvlink,
                "thread rank: %s (%s), %ld values wrong, load/store path %d", moea2a_strerror(r),
                r ? moea2a_last_error(comm) : "", wrong, took_nvlink);
    if (s && s->moe) moea2a_moe_destroy(s->moe);
    if (comm) moea2a_comm_destroy(comm);
    cudaFree(dids), cudaFree(dx), cudaFree(dout), cudaFree(dq);
    if (st) cudaStreamDestroy(st);
    free(s);
    return fails;
}

/* 2 ranks as threads of a launched rank (so that the test process itself never touches
 * CUDA), all on GPU 0 where there is one GPU: their kernels run at once, each on its
 * share of the SMs. */
static int thread_ranks(int rank, int n_procs, moea2a_unique_id_t unused, void *arg)
{
    (void)rank, (void)n_procs, (void)unused;
    setenv("MOEA2A_QUANT_OVERLAP", "0", 1);
    setenv("MOEA2A_TIMEOUT_S", "20", 1); /* a rank stuck on its peers fails in 20 s, not 300 */
    local_ranks_result_t res;
    return local_ranks_run_threads(2, thread_rank, arg, &res);
}

/* The load/store path without NCCL: UCX for the host side, CUDA IPC for the symmetric
 * memory, 2 and 4 ranks; where the machine has fewer GPUs than ranks, ranks share them
 * (on one GPU this is what tests the kernels' exchange between ranks: each process
 * in its turn on the GPU, so slowly). */
/* The expert-major layout with replicas (0 to 2 holders an expert, so some none): the
 * CUDA context's expert-major rows, made by the same calls on ranks sharing the GPUs
 * over CUDA IPC, equal a host context's, and so do the combine's outputs. */
/* One rank of the points over CUDA IPC without NCCL: its GPU (rank % ndev) and its
 * communicator; nonzero on failure. */
static int ipc_comm(int rank, int n, moea2a_unique_id_t id, int ndev, moea2a_comm_t *comm)
{
    if (use_device(rank, ndev)) return 1;
    without_nccl();
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.cuda_device = rank % ndev;
    return moea2a_comm_init_rank(comm, n, id, rank, &cfg) != MOEA2A_SUCCESS;
}

/* E experts, top-k, cap tokens, one bf16 payload of H elements (the combine's rows
 * too), room for every expert on a rank, made for the general placement. */
static moea2a_moe_config_t general_config(int E, int K, int cap, int H)
{
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = E, m.top_k = K, m.max_tokens_per_rank = cap, m.hidden = (size_t)H, m.max_local_experts = E;
    m.num_payloads = 1, m.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, (size_t)H};
    m.combine_dtype = MOEA2A_BFLOAT16, m.flags = MOEA2A_MOE_GENERAL_PLACEMENT;
    return m;
}

static int expert_replicas_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    enum { E = 12, K = 4, CAP = 32, H = 16 };
    int ndev = *(int *)arg, fails = 0;
    moea2a_comm_t comm;
    if (ipc_comm(rank, n, id, ndev, &comm)) return 1;
    moea2a_moe_config_t m = general_config(E, K, CAP, H);
    m.layout = MOEA2A_LAYOUT_EXPERT_MAJOR, m.invalid_expert_id = -1;
    moea2a_moe_config_t hc = m, dc = m;
    hc.memory = MOEA2A_MEMORY_HOST, dc.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_t hm = NULL, dm = NULL;
    moea2a_result_t r = moea2a_moe_create(&hm, comm, &hc);
    if (!r) r = moea2a_moe_create(&dm, comm, &dc);
    int32_t hold[E * 2], ids[CAP * K];
    uint16_t pay[CAP * H];
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 2; j++) hold[e * 2 + j] = j < e % 3 ? (e + j) % n : -1;
    for (int i = 0; i < CAP * K; i++) ids[i] = (i / K * 5 + i % K * 3 + rank) % E;
    for (int i = 0; i < CAP * H; i++) pay[i] = (uint16_t)(0x3c00 + (i * 7 + rank * 131) % 0x300);
    if (!r) r = moea2a_moe_set_replicas(hm, 2, hold, NULL);
    if (!r) r = moea2a_moe_set_replicas(dm, 2, hold, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "create and set_replicas: %s", moea2a_last_error(comm));
    void *d_ids = to_device(ids, sizeof(ids)), *d_pay = to_device(pay, sizeof(pay));
    const void *hp[1] = {pay}, *dp[1] = {d_pay};
    moea2a_dispatch_result_t hr = MOEA2A_DISPATCH_RESULT_INITIALIZER, dr = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    if (!r) r = moea2a_dispatch(hm, CAP, ids, NULL, hp, 0, &hr, NULL);
    if (!r) r = moea2a_dispatch(dm, CAP, d_ids, NULL, dp, 0, &dr, NULL);
    cudaDeviceSynchronize();
    if (!r) r = moea2a_moe_status(dm);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
    const int el = hr.num_local_experts;
    RANK_EXPECT(fails, rank, r || dr.num_local_experts == el, "local experts: %d on CUDA memory, %d on host memory",
                dr.num_local_experts, el);
    if (!r && dr.num_local_experts == el && el > 0) {
        int32_t *cnt = to_host(dr.expert_counts, 4 * (size_t)el), *off = to_host(dr.expert_offsets, 4 * (size_t)(el + 1));
        const size_t rows = (size_t)hr.expert_offsets[el];
        RANK_EXPECT(fails, rank, !memcmp(cnt, hr.expert_counts, 4 * (size_t)el) &&
                                     !memcmp(off, hr.expert_offsets, 4 * (size_t)(el + 1)),
                    "expert counts or offsets differ (%zu rows on host memory)", rows);
        const int32_t *harr[4] = {hr.expert_ids, hr.expert_src_rank, hr.expert_src_token, hr.expert_topk_slot};
        const int32_t *darr[4] = {dr.expert_ids, dr.expert_src_rank, dr.expert_src_token, dr.expert_topk_slot};
        for (int a = 0; a < 4 && (size_t)off[el] == rows; a++) {
            int32_t *got = to_host(darr[a], 4 * rows);
            RANK_EXPECT(fails, rank, !memcmp(got, harr[a], 4 * rows), "expert-major array %d differs", a);
            free(got);
        }
        unsigned char *gp = to_host(dr.expert_payloads[0], 2 * H * rows);
        RANK_EXPECT(fails, rank, (size_t)off[el] != rows || !memcmp(gp, hr.expert_payloads[0], 2 * H * rows),
                    "expert-major payload rows differ");
        free(cnt), free(off), free(gp);
    }
    if (!r) { /* each row back as the expert output: the same sums on both */
        uint16_t hout[CAP * H], dout_h[CAP * H];
        void *dout = NULL;
        cudaMalloc(&dout, sizeof(dout_h));
        r = moea2a_combine(hm, hr.expert_payloads[0], hout, NULL);
        if (!r) r = moea2a_combine(dm, dr.expert_payloads[0], dout, NULL);
        cudaMemcpy(dout_h, dout, sizeof(dout_h), cudaMemcpyDeviceToHost);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(hout, dout_h, sizeof(hout)), "combine: %s%s",
                    moea2a_strerror(r), r ? "" : " (outputs differ)");
        cudaFree(dout);
    }
    cudaFree(d_ids), cudaFree(d_pay);
    if (dm) moea2a_moe_destroy(dm);
    if (hm) moea2a_moe_destroy(hm);
    moea2a_comm_destroy(comm);
    return fails;
}

/* A context created with MOEA2A_MOE_GENERAL_PLACEMENT routes by the general rule's
 * kernels under either kind of placement, so a CUDA graph captured under one kind and
 * replayed after a move to the other gives the bits of an eager round trip of the new
 * placement: captured with replicas, replayed after a one-holder move; captured with
 * one holder per expert, replayed after set_replicas (1 or 2 holders an expert). */
static int general_graph_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    enum { E = 8, K = 2, CAP = 16, H = 64 };
    int ndev = *(int *)arg, fails = 0;
    moea2a_comm_t comm;
    if (ipc_comm(rank, n, id, ndev, &comm)) return 1;
    moea2a_moe_config_t m = general_config(E, K, CAP, H);
    m.memory = MOEA2A_MEMORY_CUDA;
    int32_t ids[CAP * K], hold[E * 2], map[E];
    uint16_t pay[CAP * H];
    for (int i = 0; i < CAP * K; i++) ids[i] = (i / K * 3 + i % K * 5 + rank) % E;
    for (int i = 0; i < CAP * H; i++) pay[i] = (uint16_t)(0x3c00 + (i * 13 + rank * 57) % 0x200);
    for (int e = 0; e < E; e++) {
        map[e] = (e + 1) % n;
        for (int j = 0; j < 2; j++) hold[e * 2 + j] = j <= e % 2 ? (e + j) % n : -1; /* 1 or 2 holders */
    }
    void *d_ids = to_device(ids, sizeof(ids)), *d_pay = to_device(pay, sizeof(pay)), *out = NULL;
    const void *dp[1] = {d_pay};
    cudaMalloc(&out, 2 * H * CAP);
    cudaStream_t s;
    cudaStreamCreate(&s);
    unsigned char want[2 * H * CAP], got[2 * H * CAP];
    for (int way = 0; way < 2; way++) { /* 0: captured general, replayed one-holder; 1: the other way */
        moea2a_moe_t dm = NULL;
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        moea2a_result_t r = moea2a_moe_create(&dm, comm, &m);
        if (!r && way == 0) r = moea2a_moe_set_replicas(dm, 2, hold, s);
        cudaStreamSynchronize(s);
        /* the rows to combine are the received ones: their pointer is the context's */
        if (!r) r = moea2a_dispatch(dm, CAP, d_ids, NULL, dp, 0, &res, s);
        if (!r) r = moea2a_combine(dm, res.payloads[0], out, s);
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        if (!r) r = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) ? MOEA2A_ERR_CUDA : MOEA2A_SUCCESS;
        if (!r) {
            r = moea2a_dispatch(dm, CAP, d_ids, NULL, dp, 0, &res, s);
            if (!r) r = moea2a_combine(dm, res.payloads[0], out, s);
            if (cudaStreamEndCapture(s, &g) != cudaSuccess && !r) r = MOEA2A_ERR_CUDA;
        }
        if (!r && cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) r = MOEA2A_ERR_CUDA;
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "way %d: create, eager round trip and capture: %s", way,
                    moea2a_last_error(comm));
        if (!r) r = way == 0 ? moea2a_moe_set_placement(dm, map, s) : moea2a_moe_set_replicas(dm, 2, hold, s);
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "way %d: the move: %s", way, moea2a_last_error(comm));
        if (!r) {
            cudaMemsetAsync(out, 0xee, sizeof(got), s);
            cudaGraphLaunch(ge, s);
            RANK_EXPECT(fails, rank, cudaStreamSynchronize(s) == cudaSuccess, "way %d: replay", way);
            moea2a_result_t st = moea2a_moe_status(dm);
            cudaMemcpy(got, out, sizeof(got), cudaMemcpyDeviceToHost);
            /* the eager round trip of the new placement gives the same bits */
            r = st ? st : moea2a_dispatch(dm, CAP, d_ids, NULL, dp, 0, &res, s);
            if (!r) r = moea2a_combine(dm, res.payloads[0], out, s);
            cudaStreamSynchronize(s);
            cudaMemcpy(want, out, sizeof(want), cudaMemcpyDeviceToHost);
            RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS && !memcmp(got, want, sizeof(got)),
                        "a graph captured %s, replayed after %s: %s%s", way ? "with one holder per expert" : "with replicas",
                        way ? "set_replicas" : "a one-holder move", moea2a_strerror(r),
                        r ? "" : " (outputs differ from the eager round trip)");
        }
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        if (dm) moea2a_moe_destroy(dm);
    }
    cudaStreamDestroy(s);
    cudaFree(d_ids), cudaFree(d_pay), cudaFree(out);
    moea2a_comm_destroy(comm);
    return fails;
}

/* One test point's ranks; nothing runs when TAP_POINTS leaves the point out (tap_ok
 * then reports it as skipped), so compute-sanitizer can take the suite in parts. */
static void point_run(int n, local_rank_fn fn, void *arg, double watchdog_s, local_ranks_result_t *res)
{
    if (!tap_selected()) {
        memset(res, 0, sizeof(*res));
        return;
    }
    local_ranks_run(n, fn, arg, watchdog_s, res);
}

/* n ranks in 2 emulated nodes of n/2 (MOEA2A_NODE_SIZE): the node-grouped combine order
 * on the hierarchical and the flat path, the nodes' NCCL apart (NCCL_HOSTID) or not.
 * Two ranks also share one GPU, NCCL seeing them as two hosts. */
static void emulated_node_points(int n, int ndev, int quick)
{
    for (int v = 0; v < 4; v++) {
        const int flat = v & 1, hosts = v >> 1;
        const char *what = flat ? "flat generic path" : "hierarchical path";
        const int gpus = n > ndev ? ndev : n;
        if (n > 1 && !quick && (n <= ndev || (hosts && n == 2))) {
            local_ranks_result_t res;
            moe_arg_t a = {ndev, hosts ? 10 : 20, 991u * (uint64_t)n + (uint64_t)v, 1, n / 2, 0, 0, 0, flat, hosts};
            point_run(n, moe_rank, &a, WATCHDOG, &res);
            tap_ok(res.failed == 0, "MoE, %d ranks on %d GPU(s) in 2 emulated nodes%s, %s: %d random configs equal the "
                                    "host reference (node-grouped combine, rows across nodes) bit for bit", n, gpus,
                   hosts ? " joined by NCCL's network transport" : "", what, a.cases);
        } else {
            tap_skip(n == 1 ? "one rank is one node" : quick ? "quick mode" : "not enough GPUs",
                     "MoE, %d ranks in 2 emulated nodes, %s%s", n, what, hosts ? " (NCCL_HOSTID apart)" : "");
        }
    }
}

/* Nodes of different sizes (the last of MOEA2A_NODE_SIZE's blocks smaller, as after a
 * shrink): the hierarchical path's workspace has one size on every rank (its NCCL
 * window takes no other), and its results are the host reference's. */
static void unequal_node_points(int ndev, int quick)
{
    static const int shapes[2][2] = {{3, 2}, {4, 3}}; /* ranks, node size */
    for (int i = 0; i < 2; i++) {
        const int n = shapes[i][0], size = shapes[i][1];
        if (quick || n > ndev) {
            tap_skip(quick ? "quick mode" : "not enough GPUs", "MoE, %d ranks in emulated nodes of %d and %d, hierarchical "
                     "path", n, size, n - size);
            continue;
        }
        local_ranks_result_t res;
        moe_arg_t a = {ndev, 10, 4241u * (uint64_t)n, 1, size, 0, 0, 0, 0, 0};
        point_run(n, moe_rank, &a, WATCHDOG, &res);
        tap_ok(res.failed == 0, "MoE, %d ranks on %d GPUs in emulated nodes of %d and %d, hierarchical path: %d random "
               "configs equal the host reference bit for bit", n, n, size, n - size, a.cases);
    }
}

static void ipc_tests(int ndev, int quick)
{
    static const char *const what[] = {"load/store path", "load/store path, large configs", "copy-engine mode",
                                       "a peer killed in a dispatch/combine loop", "the expert-major layout with replicas",
                                       "graphs across placement rules"};
    if (have_ucx()) {
        local_ranks_result_t res;
        point_run(2, symmetric_choice_rank, &ndev, WATCHDOG, &res);
        tap_ok(res.failed == 0, "without NCCL, MOEA2A_SYMMETRIC_MEMORY: an unknown way is MOEA2A_ERR_INVALID_ARGUMENT "
               "and the transport's MOEA2A_ERR_UNAVAILABLE on every rank, saying why; cuda_ipc and auto serve");
        point_run(1, thread_ranks, &ndev, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, 2 ranks as threads of one process on %d GPU(s): 300 round trips "
               "each, checked, with FP8 and NVFP4 payloads quantized before each dispatch", ndev < 2 ? 1 : 2);
    } else {
        tap_skip("no ucx transport", "without NCCL, MOEA2A_SYMMETRIC_MEMORY");
        tap_skip("no ucx transport", "CUDA IPC, 2 ranks as threads of one process");
    }
    int sizes[2] = {2, quick ? 2 : 4};
    for (int i = 0; i < (quick ? 1 : 2); i++) {
        int n = sizes[i];
        if (!have_ucx()) {
            for (int w = 0; w < 6; w++) tap_skip("no ucx transport", "CUDA IPC, %d ranks: %s", n, what[w]);
            continue;
        }
        local_ranks_result_t res;
        moe_arg_t a = {ndev, quick ? 3 : 10, 4242u * (uint64_t)n, 1, 0, 0, 0, 1};
        point_run(n, moe_rank, &a, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, %d ranks on %d GPU(s), %s: %d random configs equal the host "
               "reference bit for bit", n, ndev < n ? ndev : n, what[0], a.cases);
        moe_arg_t big = {ndev, 1, 4343u * (uint64_t)n, 1, 0, 0, 1, 1};
        point_run(n, moe_rank, &big, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, %d ranks on %d GPU(s), %s: 1,800-2,200 tokens at 16 / 24 / 48 "
               "SMs equal the host reference bit for bit", n, ndev < n ? ndev : n, what[1]);
        moe_arg_t ce = {ndev, quick ? 2 : 6, 4444u * (uint64_t)n, 1, 0, 1, 0, 1};
        point_run(n, moe_rank, &ce, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, %d ranks on %d GPU(s), %s: %d random configs equal the host "
               "reference bit for bit", n, ndev < n ? ndev : n, what[2], ce.cases);
        point_run(n, expert_replicas_rank, &ndev, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, %d ranks on %d GPU(s), the expert-major layout with replicas "
               "and experts no rank holds: rows and combine equal a host context's", n, ndev < n ? ndev : n);
        point_run(n, general_graph_rank, &ndev, WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA IPC without NCCL, %d ranks on %d GPU(s), %s: a context made for the general "
               "rule replays them bit for bit after moves between one holder per expert and replicas", n,
               ndev < n ? ndev : n, what[5]);
        volatile double *kill_time = n == 2 && !quick ? mmap(NULL, sizeof(double), PROT_READ | PROT_WRITE,
                                                             MAP_SHARED | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
        if (kill_time == MAP_FAILED) {
            tap_skip(n != 2 ? "2 ranks only" : quick ? "quick mode" : "no shared memory", "CUDA IPC, %d ranks: %s", n,
                     what[3]);
            continue;
        }
        *kill_time = 0;
        kill_arg_t ka = {ndev, 1, kill_time, 1};
        point_run(2, killed_peer_rank, &ka, 120.0, &res);
        tap_ok(res.hung == 0 && res.exit_codes[0] == 0 && res.exit_codes[1] == 128 + SIGKILL,
               "CUDA IPC without NCCL, 2 ranks on %d GPU(s), %s: the survivor fails in time, shrinks, retargets, "
               "makes checked round trips alone and destroys cleanly (exits %d, %d)", ndev < 2 ? 1 : 2, what[3], res.exit_codes[0], res.exit_codes[1]);
        munmap((void *)kill_time, sizeof(double));
    }
}

int main(void)
{
    int ndev = gpu_count();
    if (ndev == 0) {
        tap_skip("no CUDA device", "collectives and MoE on CUDA memory");
        return tap_done();
    }
    tap_diag("%d CUDA device(s)", ndev);
    /* TEST_GPU_QUICK (under compute-sanitizer): fewer configurations, 1 and 2 ranks */
    int quick = getenv("TEST_GPU_QUICK") != NULL;
    int sizes[3] = {1, 2, quick ? 2 : 4};
    for (int i = 0; i < 3; i++) {
        int n = sizes[i];
        if (n > ndev) {
            tap_skip("not enough GPUs", "%d ranks on %d GPUs", n, n);
            tap_skip("not enough GPUs", "MoE on %d GPUs, load/store path", n);
            tap_skip("not enough GPUs", "MoE on %d GPUs, load/store path, large configs", n);
            tap_skip("not enough GPUs", "MoE on %d GPUs, generic path", n);
            tap_skip("not enough GPUs", "MoE on %d GPUs, copy-engine mode", n);
            tap_skip("not enough GPUs", "MoE on %d GPUs, copy-engine mode, MOEA2A_CE_LANES=3", n);
            emulated_node_points(n, ndev, quick);
            continue;
        }
        local_ranks_result_t res;
        point_run(n, coll_rank, &ndev, WATCHDOG, &res);
        tap_ok(res.failed == 0, "alltoallv, allgather, bcast on CUDA memory over NCCL, %d GPU(s)", n);
        if (quick && i == 2) break;
        for (int nvlink = 1; nvlink >= 0; nvlink--) {
            moe_arg_t a = {ndev, quick ? 4 : n == 1 ? 30 : 20, 777u * (uint64_t)n + (uint64_t)nvlink, nvlink, 0, 0};
            point_run(n, moe_rank, &a, WATCHDOG, &res);
            tap_ok(res.failed == 0, "MoE on %d GPU(s), %s path: %d random configs equal the host reference bit for bit",
                   n, nvlink ? "load/store (NVLink)" : "generic NCCL", a.cases);
        }
        { /* the combine's reduce through the counter and through bulk copies */
            moe_arg_t big = {ndev, quick ? 1 : 3, 333u * (uint64_t)n, 1, 0, 0, 1};
            point_run(n, moe_rank, &big, WATCHDOG, &res);
            tap_ok(res.failed == 0, "MoE on %d GPU(s), load/store path, large configs: %d of 1,800-2,200 tokens at 16 / 24 / "
                                    "48 SMs equal the host reference bit for bit", n, big.cases);
        }
        { /* the same cases with the rows moved by the copy engines */
            moe_arg_t a = {ndev, quick ? 4 : n == 1 ? 30 : 20, 777u * (uint64_t)n + 1, 1, 0, 1};
            point_run(n, moe_rank, &a, WATCHDOG, &res);
            tap_ok(res.failed == 0, "MoE on %d GPU(s), copy-engine mode: %d random configs equal the host reference bit "
                                    "for bit; capture refused", n, a.cases);
            /* batches of 4 MiB and more, cut over three lanes (edges inside copies) */
            moe_arg_t big = {ndev, quick ? 1 : 3, 555u * (uint64_t)n, 1, 0, 1, 1};
            setenv("MOEA2A_CE_LANES", "3", 1);
            point_run(n, moe_rank, &big, WATCHDOG, &res);
            unsetenv("MOEA2A_CE_LANES");
            tap_ok(res.failed == 0, "MoE on %d GPU(s), copy-engine mode, MOEA2A_CE_LANES=3: %d configs with batches of "
                                    "4 MiB or more equal the host reference bit for bit", n, big.cases);
        }
        emulated_node_points(n, ndev, quick);
    }
    local_ranks_result_t res;
    for (int nvlink = 1; nvlink >= 0; nvlink--) {
        kill_arg_t ka = {ndev, nvlink};
        point_run(1, shrink_by_choice_rank, &ka, WATCHDOG, &res);
        tap_ok(res.failed == 0, "one rank over NCCL (%s path) shrinks by choice (the NCCL communicator through "
               "ncclCommShrink where NCCL has it), its context retargeted: round trips right after the old communicator "
               "is gone", nvlink ? "default" : "generic");
    }
    ipc_tests(ndev, quick);
    point_run(1, fp4_rank, &ndev, WATCHDOG, &res);
    tap_ok(res.failed == 0, "NVFP4 quantize, dequantize, global scale and scale layouts: device equals host bit for bit");
    point_run(1, fp8_rank, &ndev, WATCHDOG, &res);
    tap_ok(res.failed == 0, "FP8 block quantize and dequantize, both layouts and scale kinds: device equals host bit for bit");
    int n = ndev >= 2 ? 2 : 1;
    point_run(n, adopt_rank, &ndev, WATCHDOG, &res);
    tap_ok(res.failed == 0, "moea2a_comm_init_nccl adopts a caller's NCCL communicator (%d GPU(s))", n);
    point_run(n, capture_generic_rank, &ndev, WATCHDOG, &res);
    tap_ok(res.failed == 0, "generic NCCL path, %d GPU(s): a captured dispatch or combine is MOEA2A_ERR_UNAVAILABLE on "
                            "every rank with nothing enqueued; the same calls outside the capture succeed", n);
    volatile double *kill_time = mmap(NULL, sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    for (int nvlink = 1; nvlink >= 0; nvlink--) {
        /* the generic path's 2 ranks may share a GPU (NCCL_HOSTID apart) */
        if ((ndev < 2 && nvlink) || quick || kill_time == MAP_FAILED) {
            tap_skip(ndev < 2 && nvlink ? "not enough GPUs" : "quick mode", "a dead peer on CUDA memory (%s path)",
                     nvlink ? "default" : "generic");
            continue;
        }
        *kill_time = 0;
        kill_arg_t ka = {ndev, nvlink, kill_time, .hosts = ndev < 2};
        point_run(2, killed_peer_rank, &ka, 120.0, &res);
        tap_ok(res.hung == 0 && res.exit_codes[0] == 0 && res.exit_codes[1] == 128 + SIGKILL,
               "a peer killed in a dispatch/combine loop on CUDA memory (%s path): the survivor fails in time, "
               "shrinks, retargets, makes checked round trips alone and destroys cleanly (exits %d, %d)", nvlink ? "default" : "generic NCCL", res.exit_codes[0],
               res.exit_codes[1]);
    }
    for (int ipc = 0; ipc <= 1; ipc++) {
        if (ndev < 2 || quick || kill_time == MAP_FAILED || (ipc && !have_ucx())) {
            tap_skip(ndev < 2 ? "not enough GPUs" : quick ? "quick mode" : "no UCX", "a dead peer under a waiting "
                     "kernel (%s)", ipc ? "CUDA IPC" : "NCCL window");
            continue;
        }
        *kill_time = 0;
        kill_arg_t ka = {ndev, 1, kill_time, ipc};
        point_run(2, stalled_kernel_rank, &ka, 120.0, &res);
        tap_ok(res.hung == 0 && res.exit_codes[0] == 0 && res.exit_codes[1] == 128 + SIGKILL,
               "load/store path (%s), 2 GPUs: a peer killed while a dispatch kernel waits for it and the host waits "
               "on the stream: the kernel ends within %.0f s by itself and the status names the rank (exits %d, %d)",
               ipc ? "CUDA IPC" : "NCCL window", KILL_BOUND_S, res.exit_codes[0], res.exit_codes[1]);
    }
    if (quick || kill_time == MAP_FAILED) {
        tap_skip("quick mode", "a dead peer under NCCL's waiting kernels");
    } else {
        *kill_time = 0;
        kill_arg_t ka = {ndev, 0, kill_time, .hosts = ndev < 2};
        point_run(2, stalled_nccl_rank, &ka, 120.0, &res);
        tap_ok(res.hung == 0 && res.exit_codes[0] == 0 && res.exit_codes[1] == 128 + SIGKILL,
               "generic NCCL path, 2 ranks on %d GPU(s): a peer killed while NCCL's kernels of an alltoallv wait for it "
               "and the host waits on the stream: the stream ends within %.0f s and the next call names the rank "
               "(exits %d, %d)", ndev < 2 ? 1 : 2, KILL_BOUND_S, res.exit_codes[0], res.exit_codes[1]);
    }
    /* the hierarchical path: 2 emulated nodes (of 2 GPUs, or 1; on one GPU its 2 ranks
     * NCCL_HOSTID apart), rank 1 killed */
    const int kn = ndev >= 4 ? 4 : 2;
    if (quick || kill_time == MAP_FAILED) {
        tap_skip("quick mode", "a dead peer on CUDA memory (hierarchical path)");
    } else {
        *kill_time = 0;
        kill_arg_t ka = {ndev, 1, kill_time, 0, kn / 2, ndev < 2};
        point_run(kn, killed_peer_rank, &ka, 120.0, &res);
        int others = 1;
        for (int q = 2; q < kn; q++) others &= res.exit_codes[q] == 0;
        tap_ok(res.hung == 0 && res.exit_codes[0] == 0 && res.exit_codes[1] == 128 + SIGKILL && others,
               "a peer killed in a dispatch/combine loop, %d ranks on %d GPU(s) in 2 emulated nodes (hierarchical "
               "path): every survivor fails in time, shrinks with the others, retargets, makes checked round trips and "
               "destroys cleanly (exits %d, %d%s)", kn, ndev < kn ? ndev : kn,
               res.exit_codes[0],
               res.exit_codes[1], others ? "" : ", a third rank failed");
    }
    if (quick) {
        tap_skip("quick mode", "hierarchical path soak");
    } else {
        soak_arg_t sa = {ndev, kn / 2, 2000};
        point_run(kn, soak_rank, &sa, WATCHDOG, &res);
        tap_ok(res.failed == 0, "hierarchical path, %d ranks on %d GPU(s) in 2 emulated nodes: %d round trips of fresh random "
                                "routings (idle and full ranks, invalid ids) equal the host reference bit for bit; "
                                "the bytes handed to NCCL for other nodes are the routing's node-dedup rows",
               kn, ndev < kn ? ndev : kn, sa.iters);
    }
    unequal_node_points(ndev, quick);
    return tap_done();
}

#else
int main(void)
{
    tap_skip("no CUDA device (built without CUDA or NCCL)", "collectives and MoE on CUDA memory");
    return tap_done();
}
#endif

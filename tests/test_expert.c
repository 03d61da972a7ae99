/* The expert-major layout on host memory, against an oracle that works from every
 * rank's inputs (regenerated here from a shared seed), not from the library's results:
 * which local expert rows each rank must hold, in which order and at which aligned
 * offsets, their per-row arrays and payloads, the padding rows; then the weighted
 * combine, whose sums the oracle forms in the order moea2a_moe(3) fixes (products
 * rounded to fp32, ascending top-k slot, each rank's row rounded to the combine dtype,
 * the ranks' rows added in ascending rank order). Random configurations (1-4 ranks,
 * tokens naming several experts of one rank, repeated and invalid ids, idle ranks,
 * alignments 1, 8, 64, 128, weights on and off, zero padding, bf16 and fp32 combine,
 * contiguous placement and an explicit expert -> rank map,
 * the split halves of dispatch and combine, the context's expert buffer or the
 * caller's); a bound on expert
 * rows that one rank exceeds (MOEA2A_ERR_CAPACITY on every rank, the next call fine);
 * the config checks; the workspace formula. The same cases run on CUDA memory, on the
 * load/store and the NCCL paths, on as many GPUs as the machine has (one per rank;
 * SKIP without one), with the layout's counts copied to the host, a binding bound, and
 * dispatch and combine captured into CUDA graphs and replayed. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctx_mem.h"
#include "derived_placement.h"
#include "local_ranks.h"
#include "mix.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"
#ifdef MOEA2A_HAVE_CUDA
#include "gpu_util.h"
#endif

#define WATCHDOG 300.0
#define A(x) (((size_t)(x) + 127) / 128 * 128)
#define MAX_ELEMS 64 /* payload 0: bf16 x 6 (rows of 12 bytes) or x 64 (16-byte aligned) */

static const int aligns[] = {1, 8, 64, 128};

typedef enum { ON_HOST, ON_NVLINK, ON_NCCL } memory_path_t;

typedef struct {
    int ep, E, k, cap, align, weights, weighted, zero, split, own_buffer, max_rows;
    moea2a_datatype_t cdt;
    size_t hidden;
    uint64_t seed;
    /* CUDA memory: which path, the counts copied to the host, dispatch and combine
     * captured into graphs and replayed; payload 0's elements */
    memory_path_t path;
    int host_counts, graph, elems;
    int placed; /* MOEA2A_PLACEMENT_MAP with map_of's placement, else contiguous */
    int32_t map[64];
} cfg_t;

static int urand(uint64_t *s, int lo, int hi) { return lo + (int)((*s = mix(*s)) % (uint64_t)(hi - lo + 1)); }

/* rank q's inputs: n tokens; ids (invalid and repeated ones), weights, payload values */
static int tokens_of(const cfg_t *c, int q)
{
    uint64_t s = c->seed * 977 + (uint64_t)q;
    int n = urand(&s, 0, c->cap);
    return q == 1 && c->seed % 3 == 0 ? 0 : n; /* an idle rank sometimes */
}
static int32_t id_of(const cfg_t *c, int q, int t, int j)
{
    uint64_t s = c->seed * 1315423911u + (uint64_t)q * 100003 + (uint64_t)t * 131 + (uint64_t)j;
    int v = urand(&s, -1, c->E + 1); /* -1 and E, E + 1: invalid */
    if (j > 0 && v % 5 == 0) return id_of(c, q, t, j - 1); /* a repeat of the previous slot */
    return v;
}
static float weight_of(const cfg_t *c, int q, int t, int j)
{
    uint64_t s = c->seed * 31 + (uint64_t)q * 7919 + (uint64_t)t * 17 + (uint64_t)j;
    return (float)((int)(mix(s) % 2001) - 1000) / 337.0f;
}
static uint16_t pay_of(int q, int t, int h) { return (uint16_t)(q * 1000 + t * 10 + h); }

/* An explicit placement: experts dealt out of order, some ranks with none. */
static int32_t map_of(const cfg_t *c, int e) { return (int32_t)(((uint64_t)e * 5 + c->seed) % 7 % (uint64_t)c->ep); }

static int owner_of(const cfg_t *c, int e)
{
    return c->placed ? c->map[e] : contiguous_owner(e, c->E, c->ep);
}
static int valid(const cfg_t *c, int32_t e) { return e >= 0 && e < c->E; }
/* slot j names e for the first time in the token */
static int first(const cfg_t *c, int q, int t, int j)
{
    for (int p = 0; p < j; p++)
        if (id_of(c, q, t, p) == id_of(c, q, t, j)) return 0;
    return 1;
}

/* what the expert side writes for (expert e, source rank, source token): exact in bf16 */
static float y_of(int e, int src, int tok, size_t h)
{
    return (float)((int)((h * 31 + (size_t)e * 17 + (size_t)src * 7 + (size_t)tok * 3) % 97) - 48) / 8.0f;
}

static float to_dtype(moea2a_datatype_t dt, float f)
{
    if (dt == MOEA2A_FLOAT32) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (finite values here) */
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static void put(moea2a_datatype_t dt, unsigned char *row, size_t h, float f)
{
    if (dt == MOEA2A_FLOAT32) {
        memcpy(row + 4 * h, &f, 4);
        return;
    }
    uint32_t u;
    f = to_dtype(dt, f);
    memcpy(&u, &f, 4);
    uint16_t v = (uint16_t)(u >> 16);
    memcpy(row + 2 * h, &v, 2);
}
static float get(moea2a_datatype_t dt, const unsigned char *row, size_t h)
{
    float f;
    if (dt == MOEA2A_FLOAT32) {
        memcpy(&f, row + 4 * h, 4);
        return f;
    }
    uint16_t v;
    memcpy(&v, row + 2 * h, 2);
    uint32_t u = (uint32_t)v << 16;
    memcpy(&f, &u, 4);
    return f;
}

static moea2a_moe_config_t config_of(const cfg_t *c)
{
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = c->E, m.top_k = c->k, m.max_tokens_per_rank = c->cap;
    m.memory = c->path == ON_HOST ? MOEA2A_MEMORY_HOST : MOEA2A_MEMORY_CUDA;
    m.num_payloads = 1;
    m.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, (size_t)(c->elems ? c->elems : 6)};
    m.hidden = c->hidden, m.combine_dtype = c->cdt, m.invalid_expert_id = -1;
    m.flags = (c->weights ? MOEA2A_MOE_CARRY_WEIGHTS : 0) | (c->weighted ? MOEA2A_MOE_WEIGHTED_COMBINE : 0) |
              (c->zero ? MOEA2A_MOE_ZERO_PADDING : 0) | (c->path == ON_NCCL ? MOEA2A_MOE_NO_NVLINK : 0) |
              (c->host_counts ? MOEA2A_MOE_HOST_EXPERT_COUNTS : 0);
    m.layout = MOEA2A_LAYOUT_EXPERT_MAJOR, m.expert_alignment = c->align, m.max_expert_rows = c->max_rows;
    if (c->placed) m.placement = MOEA2A_PLACEMENT_MAP, m.expert_to_rank = c->map;
    return m;
}

/* One expert-major row the oracle expects. */
typedef struct {
    int src, tok, slot;
    int32_t e;
} row_t;

/* ---- memory of the context's kind (ctx_mem.h) ----------------------------------- */

static int on_cuda(const cfg_t *c) { return c->path != ON_HOST; }

/* A dispatch or combine call, as the case makes it: one call or its halves, on the
 * default stream or captured into a graph that is then launched. */
typedef struct {
    int dispatch;
    int n;
    const int32_t *ids;
    const float *w;
    const void *const *pays;
    moea2a_dispatch_result_t *r;
    const void *expert_out;
    void *out;
} call_t;

static moea2a_result_t issue(const cfg_t *c, moea2a_moe_t moe, const call_t *a, void *stream)
{
    moea2a_result_t rc;
    if (a->dispatch) {
        if (!c->split) return moea2a_dispatch(moe, a->n, a->ids, a->w, a->pays, 0, a->r, stream);
        rc = moea2a_dispatch_send(moe, a->n, a->ids, a->w, a->pays, 0, stream);
        return rc ? rc : moea2a_dispatch_recv(moe, a->r, stream);
    }
    if (!c->split) return moea2a_combine(moe, a->expert_out, a->out, stream);
    rc = moea2a_combine_send(moe, a->expert_out, stream);
    return rc ? rc : moea2a_combine_recv(moe, a->out, stream);
}

static moea2a_result_t run_call(const cfg_t *c, moea2a_moe_t moe, const call_t *a)
{
#ifdef MOEA2A_HAVE_CUDA
    if (c->graph) {
        cudaStream_t s;
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        if (cudaStreamCreate(&s) != cudaSuccess) return MOEA2A_ERR_CUDA;
        moea2a_result_t rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) ? MOEA2A_ERR_CUDA : 0;
        if (!rc) rc = issue(c, moe, a, s);
        if (cudaStreamEndCapture(s, &g) != cudaSuccess && !rc) rc = MOEA2A_ERR_CUDA;
        if (!rc && cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) rc = MOEA2A_ERR_CUDA;
        if (!rc && (cudaGraphLaunch(ge, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess))
            rc = MOEA2A_ERR_CUDA;
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        cudaStreamDestroy(s);
        return rc;
    }
    if (on_cuda(c)) {
        moea2a_result_t rc = issue(c, moe, a, NULL);
        return rc ? rc : cudaDeviceSynchronize() != cudaSuccess ? MOEA2A_ERR_CUDA : MOEA2A_SUCCESS;
    }
#endif
    return issue(c, moe, a, NULL);
}

/* A graph case on a context that took the generic path (NCCL kept off the load/store
 * path, as ranks on two nodes see it): the call is refused on every rank before
 * anything is enqueued (moea2a_moe(3), CUDA graphs), and the context takes the same
 * call outside the capture. Where the load/store path is expected
 * (MOEA2A_TEST_EXPECT_NVLINK=1) the refusal is a failure. */
static moea2a_result_t run_call_or_plain(moea2a_comm_t comm, const cfg_t *c, moea2a_moe_t moe, const call_t *a, int me,
                                         int *fails)
{
    moea2a_result_t rc = run_call(c, moe, a);
    if (rc != MOEA2A_ERR_UNAVAILABLE || !c->graph || !strstr(moea2a_last_error(comm), "cannot be captured")) return rc;
    const char *want = getenv("MOEA2A_TEST_EXPECT_NVLINK");
    RANK_EXPECT(*fails, me, !(want && *want == '1'), "capture refused where the load/store path was expected: %s",
                moea2a_last_error(comm));
    cfg_t plain = *c;
    plain.graph = 0;
    return run_call(&plain, moe, a);
}

/* The layout as the host reads it. */
typedef struct {
    int32_t *counts, *offsets, *ids, *src, *tok, *slot;
    float *w;
    unsigned char *pay;
    int64_t rows;
} got_t;

static void got_free(got_t *g)
{
    free(g->counts), free(g->offsets), free(g->ids), free(g->src), free(g->tok), free(g->slot), free(g->w);
    free(g->pay);
}

/* The combine of a case whose dispatch delivered g (want_rows rows): the expert side's
 * rows (padding rows hold NaN: they must be ignored), then every token's output against
 * the oracle: per destination rank the fp32 sum of its experts' products in slot order,
 * rounded to the combine dtype, then the ranks' rows summed in rank order. */
static int check_combine(moea2a_comm_t comm, const cfg_t *c, moea2a_moe_t moe, const got_t *g, int64_t want_rows, int n,
                         int me)
{
    int fails = 0, ep = c->ep, k = c->k;
    size_t crow = c->hidden * (c->cdt == MOEA2A_FLOAT32 ? 4 : 2), nb = crow * (size_t)(want_rows + 1);
    unsigned char *mine = malloc(nb), *dst = NULL;
    void *buf;
    for (int64_t row = 0; row < want_rows; row++)
        for (size_t h = 0; h < c->hidden; h++) {
            int src = g->src[row];
            put(c->cdt, mine + (size_t)row * crow, h, src < 0 ? NAN : y_of(g->ids[row], src, g->tok[row], h));
        }
    if (c->own_buffer) dst = mem_put(on_cuda(c), mine, nb);
    else moea2a_moe_combine_buffer(moe, &buf), mem_copy_in(on_cuda(c), buf, mine, (size_t)want_rows * crow);
    unsigned char *d_out = mem_put(on_cuda(c), NULL, crow * (size_t)(n + 1));
    call_t cc = {0, 0, NULL, NULL, NULL, NULL, c->own_buffer ? dst : NULL, d_out};
    moea2a_result_t rc = run_call_or_plain(comm, c, moe, &cc, me, &fails); /* the split halves fold in the send half */
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS, "combine: %s", moea2a_last_error(comm));
    unsigned char *out = mem_get(on_cuda(c), d_out, crow * (size_t)(n + 1));
    int wrong = 0;
    /* MOEA2A_NODE_SIZE=N: nodes of N consecutive ranks, whose sums are rounded to the
     * combine dtype and then added in ascending node order (moea2a_moe(3), Combine) */
    const char *ns = getenv("MOEA2A_NODE_SIZE");
    const int per = ns && atoi(ns) > 0 && atoi(ns) < ep ? atoi(ns) : ep;
    for (int t = 0; rc == MOEA2A_SUCCESS && t < n; t++)
        for (size_t h = 0; h < c->hidden; h++) {
            float total = 0.0f;
            for (int q0 = 0; q0 < ep; q0 += per) {
                float node_sum = 0.0f;
                for (int q = q0; q < q0 + per && q < ep; q++) { /* each destination rank's row, ascending */
                    float acc = 0.0f;
                    int hit = 0;
                    for (int s = 0; s < k; s++) {
                        int32_t e = id_of(c, me, t, s);
                        if (!valid(c, e) || owner_of(c, e) != q) continue;
                        float p = (c->weighted ? weight_of(c, me, t, s) : 1.0f) * y_of(e, me, t, h);
                        acc += p, hit = 1;
                    }
                    if (hit) node_sum += to_dtype(c->cdt, acc);
                }
                total += per < ep ? to_dtype(c->cdt, node_sum) : node_sum;
            }
            float want = to_dtype(c->cdt, total), got = get(c->cdt, out + (size_t)t * crow, h);
            wrong += memcmp(&want, &got, 4) != 0;
        }
    RANK_EXPECT(fails, me, wrong == 0, "%d combined values differ from the oracle", wrong);
    free(out), free(mine);
    mem_drop(on_cuda(c), d_out);
    if (dst) mem_drop(on_cuda(c), dst);
    return fails;
}

static int run_case(moea2a_comm_t comm, const cfg_t *c, int me)
{
    int fails = 0, ep = c->ep, k = c->k, n = tokens_of(c, me), elems = c->elems ? c->elems : 6;
    size_t prow = 2 * (size_t)elems;
    moea2a_moe_config_t mc = config_of(c);
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) {
        RANK_EXPECT(fails, me, 0, "create: %s", moea2a_last_error(comm));
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(c->cap * k + 1));
    float *w = malloc(sizeof(float) * (size_t)(c->cap * k + 1));
    uint16_t *pay = malloc(prow * (size_t)(c->cap + 1));
    for (int t = 0; t < n; t++) {
        for (int j = 0; j < k; j++) ids[t * k + j] = id_of(c, me, t, j), w[t * k + j] = weight_of(c, me, t, j);
        for (int h = 0; h < elems; h++) pay[t * elems + h] = pay_of(me, t, h);
    }
    int32_t *d_ids = mem_put(on_cuda(c), ids, 4 * (size_t)(n * k));
    float *d_w = mem_put(on_cuda(c), w, 4 * (size_t)(n * k));
    void *d_pay = mem_put(on_cuda(c), pay, prow * (size_t)n);
    const void *pays[1] = {d_pay};
    moea2a_dispatch_result_t r = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    got_t g = {0};
    row_t *rows = NULL;
    int *cnt = NULL;
    call_t dc = {1, n, d_ids, c->weights ? d_w : NULL, pays, &r, NULL, NULL};
    moea2a_result_t rc = run_call_or_plain(comm, c, moe, &dc, me, &fails);
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
    if (rc != MOEA2A_SUCCESS) goto done;

    /* the oracle: this rank's local experts, their rows in (source rank, token) order */
    int el = 0, local[64];
    for (int e = 0; e < c->E; e++)
        if (owner_of(c, e) == me) local[el++] = e;
    int64_t want_rows = 0;
    rows = malloc(sizeof(row_t) * (size_t)(ep * c->cap * k + 1));
    cnt = calloc((size_t)el + 1, sizeof(int));
    int nrows = 0;
    for (int j = 0; j < el; j++) {
        int32_t e = local[j];
        for (int q = 0; q < ep; q++)
            for (int t = 0; t < tokens_of(c, q); t++)
                for (int s = 0; s < k; s++)
                    if (id_of(c, q, t, s) == e && first(c, q, t, s)) rows[nrows++] = (row_t){q, t, s, e}, cnt[j]++;
        want_rows += (cnt[j] + c->align - 1) / c->align * c->align;
    }
    /* CUDA memory: the rows are known on the host only where the host waited for them */
    int64_t want_reported = on_cuda(c) && !c->max_rows ? -1 : want_rows;
    RANK_EXPECT(fails, me, r.num_local_experts == el && r.expert_rows == want_reported,
                "%d local experts and %lld rows reported, expected %d and %lld", r.num_local_experts,
                (long long)r.expert_rows, el, (long long)want_reported);
    if (r.num_local_experts != el) goto done;
    g.counts = mem_get(on_cuda(c), r.expert_counts, 4 * (size_t)el);
    g.offsets = mem_get(on_cuda(c), r.expert_offsets, 4 * (size_t)(el + 1));
    g.rows = g.offsets[el];
    RANK_EXPECT(fails, me, g.rows == want_rows, "offsets[%d] = %lld rows, expected %lld", el, (long long)g.rows,
                (long long)want_rows);
    if (g.rows != want_rows) goto done;
    if (c->host_counts || !on_cuda(c)) /* the host's copies: the same counts and offsets */
        RANK_EXPECT(fails, me,
                    r.expert_counts_host && r.expert_offsets_host &&
                        !memcmp(r.expert_counts_host, g.counts, 4 * (size_t)el) &&
                        !memcmp(r.expert_offsets_host, g.offsets, 4 * (size_t)(el + 1)),
                    "host counts and offsets %s", r.expert_counts_host ? "differ" : "missing");
    else
        RANK_EXPECT(fails, me, !r.expert_counts_host && !r.expert_offsets_host, "host counts without the flag");
    size_t R = (size_t)want_rows;
    g.ids = mem_get(on_cuda(c), r.expert_ids, 4 * R), g.src = mem_get(on_cuda(c), r.expert_src_rank, 4 * R);
    g.tok = mem_get(on_cuda(c), r.expert_src_token, 4 * R), g.slot = mem_get(on_cuda(c), r.expert_topk_slot, 4 * R);
    g.w = r.expert_weights ? mem_get(on_cuda(c), r.expert_weights, 4 * R) : NULL;
    g.pay = mem_get(on_cuda(c), r.expert_payloads[0], prow * R);
    {
        int at = 0, bad_rows = 0, bad_pad = 0;
        int64_t off = 0;
        for (int j = 0; j < el; j++) {
            RANK_EXPECT(fails, me, g.counts[j] == cnt[j] && g.offsets[j] == off,
                        "expert %d: count %d offset %d, expected %d and %lld", local[j], g.counts[j], g.offsets[j], cnt[j],
                        (long long)off);
            for (int i = 0; i < cnt[j]; i++, at++) {
                const row_t *x = &rows[at];
                size_t row = (size_t)off + (size_t)i;
                bad_rows += g.ids[row] != x->e || g.src[row] != x->src || g.tok[row] != x->tok || g.slot[row] != x->slot;
                if (c->weights && g.w) {
                    float ww = weight_of(c, x->src, x->tok, x->slot);
                    bad_rows += memcmp(&g.w[row], &ww, 4) != 0;
                }
                for (int h = 0; h < elems; h++) {
                    uint16_t v;
                    memcpy(&v, g.pay + row * prow + 2 * (size_t)h, 2);
                    bad_rows += v != pay_of(x->src, x->tok, h);
                }
            }
            int64_t end = off + (cnt[j] + c->align - 1) / c->align * c->align;
            for (int64_t row = off + cnt[j]; row < end; row++) {
                bad_pad += g.ids[row] != -1 || g.src[row] != -1 || g.tok[row] != -1 || g.slot[row] != -1;
                if (g.w) bad_pad += g.w[row] != 0.0f;
                for (int h = 0; c->zero && h < elems; h++) {
                    uint16_t v;
                    memcpy(&v, g.pay + (size_t)row * prow + 2 * (size_t)h, 2);
                    bad_pad += v != 0;
                }
            }
            off = end;
        }
        RANK_EXPECT(fails, me, bad_rows == 0, "%d expert-major row fields differ from the oracle", bad_rows);
        RANK_EXPECT(fails, me, bad_pad == 0, "%d padding row fields wrong", bad_pad);
        RANK_EXPECT(fails, me, (r.expert_weights != NULL) == (c->weights != 0), "expert_weights %s",
                    r.expert_weights ? "set" : "NULL");
    }

    fails += check_combine(comm, c, moe, &g, want_rows, n, me);
done:
    got_free(&g);
    free(rows), free(cnt);
    moea2a_moe_destroy(moe);
    mem_drop(on_cuda(c), d_ids), mem_drop(on_cuda(c), d_w), mem_drop(on_cuda(c), d_pay);
    free(ids), free(w), free(pay);
    return fails;
}

/* Set before the ranks fork: more ranks than GPUs, sharing them over CUDA IPC without
 * NCCL (the load/store path only). */
static int share_gpus;

/* A rank's communicator, on GPU me % (GPUs) for the CUDA paths; 0 on success. */
static int rank_comm(int me, int ep, moea2a_unique_id_t id, memory_path_t path, moea2a_comm_t *comm)
{
#ifdef MOEA2A_HAVE_CUDA
    int ndev = 0;
    if (path != ON_HOST && (cudaGetDeviceCount(&ndev) != cudaSuccess || cudaSetDevice(me % ndev) != cudaSuccess))
        return 1;
#else
    (void)path;
#endif
    return moea2a_comm_init_rank(comm, ep, id, me, NULL) != MOEA2A_SUCCESS;
}

static int random_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const memory_path_t path = *(const memory_path_t *)arg;
    moea2a_comm_t comm;
    if (share_gpus) without_nccl();
    if (rank_comm(me, ep, id, path, &comm)) return 1;
    int fails = 0;
    for (uint64_t seed = 1; seed <= 24 && fails < 5; seed++) {
        uint64_t s = seed * 7 + (uint64_t)ep;
        cfg_t c = {ep, 0, 0, 0, aligns[seed % 4], 0, 0, 0, 0, 0, 0, MOEA2A_BFLOAT16, 0, seed, path, 0, 0, 6};
        c.E = urand(&s, 1, 6 * ep), c.k = urand(&s, 1, 8), c.cap = urand(&s, 1, 24);
        c.weights = seed % 2, c.weighted = c.weights && seed % 4 != 1, c.zero = seed % 3 == 0;
        c.split = seed % 5 == 2, c.own_buffer = seed % 2 == 0;
        c.cdt = seed % 3 == 1 ? MOEA2A_FLOAT32 : MOEA2A_BFLOAT16, c.hidden = (size_t)urand(&s, 1, 40);
        c.elems = seed % 4 < 2 ? 6 : MAX_ELEMS;
        c.host_counts = path != ON_HOST && seed % 2 == 1;
        c.graph = path == ON_NVLINK && seed % 3 == 2;
        if (seed > 20) /* larger: several parts of the slots on the device, 16-byte rows */
            c.cap = 4200 + urand(&s, 0, 900), c.E = 8 * ep + urand(&s, 0, 8), c.k = 8, c.elems = MAX_ELEMS;
        c.placed = seed % 4 == 3; /* an explicit expert -> rank map */
        for (int e = 0; c.placed && e < c.E; e++) c.map[e] = map_of(&c, e);
        fails += run_case(comm, &c, me);
    }
    moea2a_comm_destroy(comm);
    return fails > 100 ? 100 : fails;
}

/* One rank is sent more rows than max_expert_rows: CAPACITY on every rank, naming it;
 * the context then serves a call that fits; on CUDA memory the same call captured into
 * a graph is refused on every rank (the bound makes the host wait). */
static int capacity_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const memory_path_t path = *(const memory_path_t *)arg;
    moea2a_comm_t comm;
    if (rank_comm(me, ep, id, path, &comm)) return 1;
    int fails = 0;
    cfg_t c = {ep, 2 * ep, 2, 8, 4, 0, 0, 0, 0, 0, 8, MOEA2A_BFLOAT16, 8, 5, path, 0, 0, 6};
    moea2a_moe_config_t mc = config_of(&c);
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) return 1;
    size_t bound = 0;
    moea2a_moe_max_recv_rows(moe, &bound);
    RANK_EXPECT(fails, me, bound == 8, "max_recv_rows %zu, expected max_expert_rows 8", bound);
    int32_t ids[16];
    uint16_t pay[8 * 6] = {0};
    for (int t = 0; t < 8; t++) ids[2 * t] = 0, ids[2 * t + 1] = 1; /* every rank: 8 tokens to experts 0, 1 of rank 0 */
    int32_t *d_ids = mem_put(on_cuda(&c), ids, sizeof(ids));
    void *d_pay = mem_put(on_cuda(&c), pay, sizeof(pay));
    const void *pays[1] = {d_pay};
    moea2a_dispatch_result_t r = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    call_t dc = {1, 8, d_ids, NULL, pays, &r, NULL, NULL};
    moea2a_result_t rc = run_call(&c, moe, &dc);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_CAPACITY && strstr(moea2a_last_error(comm), "rank 0") &&
                               strstr(moea2a_last_error(comm), "max_expert_rows"),
                "over max_expert_rows on rank 0: %s (%s)", moea2a_strerror(rc), moea2a_last_error(comm));
    dc.n = 1; /* rank 0: ep = 3 rows per expert, 4 aligned: 8 fit */
    rc = run_call(&c, moe, &dc);
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS && r.expert_rows == (me == 0 ? 2 * c.align : 0), "a call that fits, after: %s (%lld rows)",
                moea2a_last_error(comm), (long long)r.expert_rows);
    unsigned char *d_out = mem_put(on_cuda(&c), NULL, 2 * c.hidden);
    call_t cc = {0, 0, NULL, NULL, NULL, NULL, NULL, d_out}; /* back to idle */
    if (rc == MOEA2A_SUCCESS) {
        rc = run_call(&c, moe, &cc);
        RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS, "its combine: %s", moea2a_last_error(comm));
    }
    if (path == ON_NVLINK) {
        c.graph = 1;
        rc = run_call(&c, moe, &dc);
        RANK_EXPECT(fails, me, rc == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(comm), "graph"),
                    "a binding bound inside graph capture: %s (%s)", moea2a_strerror(rc), moea2a_last_error(comm));
        c.graph = 0;
        rc = run_call(&c, moe, &dc);
        RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS, "the same call outside capture, after: %s", moea2a_last_error(comm));
        if (rc == MOEA2A_SUCCESS) run_call(&c, moe, &cc);
    }
    mem_drop(on_cuda(&c), d_ids), mem_drop(on_cuda(&c), d_pay), mem_drop(on_cuda(&c), d_out);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

static int checks_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    int fails = 0;
    cfg_t c = {ep, 10, 3, 16, 8, 1, 1, 0, 0, 0, 0, MOEA2A_BFLOAT16, 32, 1};
    moea2a_moe_workspace_sizes_t sz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_moe_config_t m = config_of(&c);
    RANK_EXPECT(fails, me, moea2a_moe_workspace_size(comm, &m, &sz) == MOEA2A_SUCCESS, "sizes: %s",
                moea2a_last_error(comm));
    /* the formula: R = ep cap min(k, local experts) + local experts (alignment - 1) */
    size_t el = (size_t)(10 + ep - 1) / (size_t)ep, R = (size_t)ep * 16 * 3 + el * 7;
    size_t want = A(4 * (size_t)ep * 16 * 3) + A(4 * el) + A(4 * (el + 1)) + A(8 + 4 * 10 + 4 * (el + 1) + 4 * 16 * el) +
                  A(R * 2 * 6) + 5 * A(4 * R) + A(R * 32 * 2);
    RANK_EXPECT(fails, me, sz.expert_bytes == want, "expert_bytes %zu, the formula says %zu", sz.expert_bytes, want);
    m = config_of(&c), m.expert_alignment = 2000;
    moea2a_result_t rc = moea2a_moe_workspace_size(comm, &m, &sz);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "expert_alignment"),
                "alignment 2000: %s", moea2a_last_error(comm));
    m = config_of(&c), m.flags &= ~MOEA2A_MOE_CARRY_WEIGHTS;
    rc = moea2a_moe_workspace_size(comm, &m, &sz);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "CARRY_WEIGHTS"),
                "weighted combine without weights: %s", moea2a_last_error(comm));
    m = config_of(&c), m.layout = MOEA2A_LAYOUT_RANK_MAJOR;
    rc = moea2a_moe_workspace_size(comm, &m, &sz);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "EXPERT_MAJOR"),
                "expert-major settings on the rank-major layout: %s", moea2a_last_error(comm));
    m = config_of(&c), m.layout = (moea2a_recv_layout_t)7;
    rc = moea2a_moe_workspace_size(comm, &m, &sz);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_INVALID_ARGUMENT, "an unknown layout: %s", moea2a_last_error(comm));
    m = config_of(&c), m.max_expert_rows = -3;
    rc = moea2a_moe_workspace_size(comm, &m, &sz);
    RANK_EXPECT(fails, me, rc == MOEA2A_ERR_INVALID_ARGUMENT, "negative max_expert_rows: %s", moea2a_last_error(comm));
    /* a payload quantized on dispatch: its codes, row scales [and global scales] per row */
    m = config_of(&c), m.payloads[0].elems_per_token = 128, m.wire[0].format = MOEA2A_WIRE_FP8;
    moea2a_moe_workspace_sizes_t qz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    rc = moea2a_moe_workspace_size(comm, &m, &qz);
    size_t qwant = want - A(R * 2 * 6) + A(R * 128) + A(R * 4);
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS && qz.expert_bytes == qwant,
                "with a payload quantized on dispatch (FP8): %s, expert_bytes %zu, the formula says %zu",
                moea2a_strerror(rc), qz.expert_bytes, qwant);
    m.wire[0].format = MOEA2A_WIRE_NVFP4;
    rc = moea2a_moe_workspace_size(comm, &m, &qz);
    qwant = want - A(R * 2 * 6) + A(R * 64) + A(R * 8) + A(R * 4);
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS && qz.expert_bytes == qwant,
                "with a payload quantized on dispatch (NVFP4): %s, expert_bytes %zu, the formula says %zu",
                moea2a_strerror(rc), qz.expert_bytes, qwant);
    /* CUDA memory, on a machine layout with GPUs: sized, with the counts' pinned copy */
    m = config_of(&c), m.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    const char *top = getenv("top_srcdir");
    char xml[1024];
    snprintf(xml, sizeof(xml), "%s/tests/topologies/4gpu-nvlink.xml", top ? top : ".");
    lay.ep = 4, lay.topology_xml = xml;
    moea2a_moe_workspace_sizes_t cz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER, rz = cz;
    rc = moea2a_moe_workspace_size_layout(&lay, &m, &cz);
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS, "on CUDA memory: %s (%s)", moea2a_strerror(rc), moea2a_last_error(NULL));
    m.layout = MOEA2A_LAYOUT_RANK_MAJOR, m.expert_alignment = 0, m.flags &= ~MOEA2A_MOE_WEIGHTED_COMBINE;
    rc = moea2a_moe_workspace_size_layout(&lay, &m, &rz);
    size_t el4 = (size_t)(10 + 3) / 4;
    RANK_EXPECT(fails, me, rc == MOEA2A_SUCCESS && cz.pinned_host_bytes == rz.pinned_host_bytes + A(8 + 4 * el4 + 4 * (el4 + 1)),
                "pinned bytes %zu, rank-major %zu: the counts' copy is A(8 + 4 el + 4 (el + 1))", cz.pinned_host_bytes,
                rz.pinned_host_bytes);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    const memory_path_t host = ON_HOST;
    /* TEST_GPU_QUICK (the GPU runs under compute-sanitizer): the CUDA cases only */
    const int quick = getenv("TEST_GPU_QUICK") != NULL;
    for (int ep = 1; ep <= 4 && quick; ep++)
        tap_skip("TEST_GPU_QUICK", "expert-major layout on %d rank(s), host memory", ep);
    for (int ep = 1; ep <= 4 && !quick; ep++) {
        local_ranks_result_t res;
        local_ranks_run(ep, random_rank, (void *)&host, WATCHDOG, &res);
        tap_ok(res.failed == 0, "expert-major layout on %d rank(s): rows, offsets, per-row arrays, padding and the "
                                "weighted combine equal the oracle bit for bit (24 random configurations)", ep);
    }
    for (int flat = 0; flat < 2 && quick; flat++) tap_skip("TEST_GPU_QUICK", "expert-major layout across nodes, host memory");
    for (int flat = 0; flat < 2 && !quick; flat++) { /* across nodes: the node-grouped combine of both paths */
        local_ranks_result_t res;
        setenv("MOEA2A_NODE_SIZE", "2", 1); /* the ranks inherit them */
        setenv("MOEA2A_HIERARCHICAL", flat ? "0" : "1", 1);
        local_ranks_run(4, random_rank, (void *)&host, WATCHDOG, &res);
        unsetenv("MOEA2A_HIERARCHICAL"), unsetenv("MOEA2A_NODE_SIZE");
        tap_ok(res.failed == 0, "the same on 4 ranks in emulated nodes of 2 (MOEA2A_NODE_SIZE), %s path",
               flat ? "flat" : "hierarchical");
    }
    local_ranks_result_t res;
    local_ranks_run(3, capacity_rank, (void *)&host, WATCHDOG, &res);
    tap_ok(res.failed == 0, "more expert rows than max_expert_rows on one rank: MOEA2A_ERR_CAPACITY on every rank, "
                            "then a call that fits");
    local_ranks_run(2, checks_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "config checks (alignment, weights, layout, bound, quantized payloads) and the workspace "
                            "formula, host and CUDA memory");
    static const memory_path_t paths[] = {ON_NVLINK, ON_NCCL};
    static const char *const names[] = {"load/store", "NCCL"};
#ifdef MOEA2A_HAVE_CUDA
    int ndev = gpu_count();
#else
    int ndev = 0;
#endif
    for (int i = 0; i < 2; i++) {
        for (int ep = 1; ep <= 4; ep *= 2) {
            /* the load/store path with fewer GPUs than ranks: ranks share them */
            share_gpus = ep > ndev && ndev > 0 && paths[i] == ON_NVLINK && have_ucx();
            if (ep > ndev && !share_gpus) {
                tap_skip(ndev ? "not enough GPUs" : "no CUDA device",
                         "expert-major layout on CUDA memory, %s path, %d rank(s)", names[i], ep);
                continue;
            }
            local_ranks_run(ep, random_rank, (void *)&paths[i], WATCHDOG, &res);
            tap_ok(res.failed == 0, "expert-major layout on CUDA memory, %s path, %d rank(s)%s: the oracle's bits "
                                    "(24 random configurations%s)", names[i], ep,
                   share_gpus ? " sharing GPUs over CUDA IPC" : "", i == 0 ? ", graphs among them" : "");
            share_gpus = 0;
        }
        if (ndev < 1) {
            tap_skip("no CUDA device", "CAPACITY on CUDA memory, %s path", names[i]);
            continue;
        }
        int ep = ndev < 3 ? ndev : 3;
        local_ranks_run(ep, capacity_rank, (void *)&paths[i], WATCHDOG, &res);
        tap_ok(res.failed == 0, "CUDA memory, %s path, %d rank(s): over max_expert_rows is MOEA2A_ERR_CAPACITY on every "
                                "rank, then a call that fits%s", names[i], ep,
               i == 0 ? "; a binding bound inside graph capture UNAVAILABLE" : "");
    }
    return tap_done();
}

/* MoE dispatch, sanitize and combine on host memory, checked against an independent
 * oracle: every rank regenerates every rank's inputs from a shared seed and works out,
 * token by token, what it must receive and what combine must return. Nothing here
 * calls the library's own routing code.
 *
 * Random configurations: ep 1..8 (one process per rank), E not divisible by ep,
 * k 1..22, odd row sizes, several payloads of different dtypes, n from 0 to cap,
 * idle ranks, skewed routing, invalid ids, explicit maps, every flag. Then each
 * semantic rule on its own: capacity, runtime_max agreement, call order,
 * determinism, zero-copy combine, config mismatch, memory fail-fast. */
#include <hwloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "local_ranks.h"
#include "moea2a.h"
#include "mix.h"
#include "tap.h"

#define WATCHDOG 300.0

/* ---- deterministic inputs --------------------------------------------------------- */

static uint64_t rnd(uint64_t *s) { return *s = mix(*s); }
static int urand(uint64_t *s, int lo, int hi) { return lo + (int)(rnd(s) % (uint64_t)(hi - lo + 1)); }

typedef struct {
    int ep, E, k, cap, np, flags, rt, skew, map_mode;
    int32_t invalid;
    moea2a_payload_desc_t pay[3];
    moea2a_datatype_t cdt;
    size_t hidden;
    int32_t map[64];
} cfg_t;

static const moea2a_datatype_t pay_types[] = {MOEA2A_UINT8, MOEA2A_BFLOAT16, MOEA2A_INT32, MOEA2A_FLOAT32,
                                               MOEA2A_INT64, MOEA2A_NVFP4, MOEA2A_FLOAT8_E4M3};
static const moea2a_datatype_t comb_types[] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};

static size_t dsize(moea2a_datatype_t d)
{
    size_t s = 0;
    moea2a_datatype_size(d, &s);
    return s;
}

static cfg_t make_cfg(uint64_t seed, int ep)
{
    cfg_t c;
    memset(&c, 0, sizeof(c));
    uint64_t s = seed;
    c.ep = ep;
    c.E = urand(&s, 1, 40);
    if (c.E % ep == 0 && ep > 1) c.E++; /* mostly not divisible */
    c.k = urand(&s, 1, 22);
    c.cap = urand(&s, 1, 40);
    c.np = urand(&s, 0, 3);
    for (int i = 0; i < c.np; i++) {
        c.pay[i].dtype = pay_types[urand(&s, 0, 6)];
        c.pay[i].elems_per_token = (size_t)urand(&s, 1, 37);
    }
    c.cdt = comb_types[urand(&s, 0, 2)];
    c.hidden = (size_t)urand(&s, 0, 4) == 0 ? 0 : (size_t)urand(&s, 1, 29);
    c.invalid = urand(&s, 0, 1) ? -1 : c.E;
    c.flags = (urand(&s, 0, 3) == 0 ? MOEA2A_MOE_REWRITE_NONLOCAL : 0) | (urand(&s, 0, 1) ? MOEA2A_MOE_CARRY_WEIGHTS : 0) |
              (urand(&s, 0, 5) == 0 ? MOEA2A_MOE_NO_SANITIZE : 0);
    c.rt = urand(&s, 0, 2) == 0 ? 0 : c.cap; /* 0 = cap; set again below to >= every n */
    c.skew = urand(&s, 0, 4) == 0;
    c.map_mode = c.E <= 64 && urand(&s, 0, 3) == 0;
    for (int e = 0; c.map_mode && e < c.E; e++) c.map[e] = urand(&s, 0, ep - 1);
    return c;
}

/* Tokens of rank r for this config: some ranks idle, some full. */
static int tokens_of(const cfg_t *c, uint64_t seed, int r)
{
    uint64_t s = mix(seed ^ (uint64_t)(r + 1) * 7919);
    int mode = urand(&s, 0, 5);
    return mode == 0 ? 0 : mode == 1 ? c->cap : urand(&s, 0, c->cap);
}

/* Expert id of (rank r, token t, slot j): mostly valid, some invalid of each kind;
 * skewed configs send everything to the experts of rank 0 (or the lowest ones). */
static int32_t expert_of(const cfg_t *c, uint64_t seed, int r, int t, int j)
{
    uint64_t s = mix(seed ^ mix((uint64_t)r << 40 ^ (uint64_t)t << 20 ^ (uint64_t)j));
    int u = urand(&s, 0, 99);
    if (u < 4) return -1 - urand(&s, 0, 5);
    if (u < 7) return c->E + urand(&s, 0, 3);
    if (u < 9) return c->invalid;
    if (c->skew) return urand(&s, 0, c->E < 2 ? 0 : 1);
    return urand(&s, 0, c->E - 1);
}

static unsigned char payload_byte(uint64_t seed, int r, int p, int t, size_t b)
{
    return (unsigned char)mix(seed ^ (uint64_t)r * 1000003 ^ (uint64_t)p * 10007 ^ (uint64_t)t * 131 ^ b);
}

static float weight_of(uint64_t seed, int r, int t, int j)
{
    return (float)(mix(seed + (uint64_t)r * 31 + (uint64_t)t * 17 + (uint64_t)j) % 1000) / 1000.0f;
}

/* ---- the oracle ------------------------------------------------------------------- */

/* Owner of expert e: walk the ranks, each taking its share (independent of the
 * library's table). */
static int owner(const cfg_t *c, int e)
{
    if (c->map_mode) return c->map[e];
    for (int r = 0, first = 0; r < c->ep; r++) {
        int share = c->E / c->ep + (r < c->E % c->ep ? 1 : 0);
        if (e < first + share) return r;
        first += share;
    }
    return -1;
}

static int valid(const cfg_t *c, int32_t e) { return e >= 0 && e < c->E && e != c->invalid; }

/* Does rank r's token t go to rank dst? */
static int goes_to(const cfg_t *c, uint64_t seed, int r, int t, int dst)
{
    for (int j = 0; j < c->k; j++) {
        int32_t e = expert_of(c, seed, r, t, j);
        if (valid(c, e) && owner(c, e) == dst) return 1;
    }
    return 0;
}

/* The combine row value rank `expert_rank` returns for (source rank, token, h):
 * exact in every combine dtype, so sums are exact too, except for fp32, where
 * arbitrary values test the fixed accumulation order. */
static float row_value(const cfg_t *c, uint64_t seed, int src, int t, int expert_rank, size_t h)
{
    uint64_t v = mix(seed ^ (uint64_t)src << 32 ^ (uint64_t)t << 16 ^ (uint64_t)expert_rank << 8 ^ h);
    if (c->cdt == MOEA2A_FLOAT32) return (float)(int64_t)(v % 2000001 - 1000000) / 997.0f;
    return (float)((int)(v % 33) - 16) / 4.0f; /* multiples of 1/4 in [-4, 4] */
}

static void put_value(moea2a_datatype_t dt, unsigned char *row, size_t h, float f)
{
    if (dt == MOEA2A_FLOAT32) {
        memcpy(row + 4 * h, &f, 4);
    } else if (dt == MOEA2A_BFLOAT16) { /* exact for the values above: truncate */
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t b = (uint16_t)(u >> 16);
        memcpy(row + 2 * h, &b, 2);
    } else { /* fp16 of a multiple of 1/4 with |x| <= 64: build it from the parts */
        uint16_t b = 0;
        if (f != 0.0f) {
            float a = f < 0 ? -f : f;
            int e = 0;
            while (a >= 2.0f) a /= 2.0f, e++;
            while (a < 1.0f) a *= 2.0f, e--;
            b = (uint16_t)((f < 0 ? 0x8000 : 0) | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0f) * 1024.0f));
        }
        memcpy(row + 2 * h, &b, 2);
    }
}

static int same_value(moea2a_datatype_t dt, const unsigned char *row, size_t h, float want)
{
    unsigned char tmp[4];
    put_value(dt, tmp, 0, want);
    return !memcmp(row + h * dsize(dt), tmp, dsize(dt));
}

/* ---- one configuration on one rank ---------------------------------------------- */

static moea2a_moe_config_t moe_config(const cfg_t *c)
{
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = c->E, m.top_k = c->k, m.max_tokens_per_rank = c->cap, m.num_payloads = c->np;
    for (int i = 0; i < c->np; i++) m.payloads[i] = c->pay[i];
    m.combine_dtype = c->cdt, m.hidden = c->hidden, m.invalid_expert_id = c->invalid, m.flags = (unsigned)c->flags;
    m.memory = MOEA2A_MEMORY_HOST;
    if (c->map_mode) m.placement = MOEA2A_PLACEMENT_MAP, m.expert_to_rank = c->map;
    return m;
}

typedef struct {
    int32_t *ids;
    float *w;
    unsigned char *pay[3];
    int n;
} inputs_t;

static inputs_t make_inputs(const cfg_t *c, uint64_t seed, int r)
{
    inputs_t in;
    in.n = tokens_of(c, seed, r);
    in.ids = malloc(sizeof(int32_t) * (size_t)(in.n * c->k + 1));
    in.w = malloc(sizeof(float) * (size_t)(in.n * c->k + 1));
    for (int t = 0; t < in.n; t++)
        for (int j = 0; j < c->k; j++)
            in.ids[t * c->k + j] = expert_of(c, seed, r, t, j), in.w[t * c->k + j] = weight_of(seed, r, t, j);
    for (int p = 0; p < c->np; p++) {
        size_t row = dsize(c->pay[p].dtype) * c->pay[p].elems_per_token;
        in.pay[p] = malloc(row * (size_t)in.n + 1);
        for (int t = 0; t < in.n; t++)
            for (size_t b = 0; b < row; b++) in.pay[p][(size_t)t * row + b] = payload_byte(seed, r, p, t, b);
    }
    return in;
}

static void free_inputs(const cfg_t *c, inputs_t *in)
{
    free(in->ids), free(in->w);
    for (int p = 0; p < c->np; p++) free(in->pay[p]);
}

#define POISON 0xC3

/* Checks every slot of the dispatch result against the oracle; returns failures. */
static int check_dispatch(const cfg_t *c, uint64_t seed, int me, int stride, const moea2a_dispatch_result_t *res,
                          int n_me, int64_t *expect_invalid)
{
    int fails = 0, k = c->k;
    RANK_EXPECT(fails, me, res->ep == c->ep && res->stride == stride && res->top_k == k, "result shape %d/%d/%d",
                res->ep, res->stride, res->top_k);
    *expect_invalid = 0;
    for (int t = 0; t < n_me; t++)
        for (int j = 0; j < k; j++) *expect_invalid += !valid(c, expert_of(c, seed, me, t, j));
    RANK_EXPECT(fails, me, res->invalid_entries == *expect_invalid, "invalid entries %lld, expected %lld",
                (long long)res->invalid_entries, (long long)*expect_invalid);
    /* rows to other nodes: MOEA2A_NODE_SIZE=N makes nodes of N consecutive ranks (all
     * ranks here share a host), and a row carries every array of the record */
    const char *ns = getenv("MOEA2A_NODE_SIZE");
    const int per = ns && atoi(ns) > 0 ? atoi(ns) : c->ep;
    int64_t internode = 0, record = 4 * k + ((c->flags & MOEA2A_MOE_CARRY_WEIGHTS) ? 4 * k : 0) + 4;
    for (int p = 0; p < c->np; p++) record += (int64_t)res->payload_row_bytes[p];
    for (int t = 0; t < n_me; t++)
        for (int dst = 0; dst < c->ep; dst++) internode += dst / per != me / per && goes_to(c, seed, me, t, dst);
    RANK_EXPECT(fails, me, res->internode_rows == internode && res->internode_bytes == internode * record,
                "rows to other nodes %lld (%lld bytes), expected %lld (%lld)", (long long)res->internode_rows,
                (long long)res->internode_bytes, (long long)internode, (long long)(internode * record));
    /* what crossed the network: across nodes on host memory the hierarchical path (unless
     * MOEA2A_HIERARCHICAL=0) sends a token once per other node it reaches, else a row per
     * destination rank there */
    const char *hv = getenv("MOEA2A_HIERARCHICAL");
    const int hier = per < c->ep && !(hv && !strcmp(hv, "0"));
    int64_t per_node = 0;
    for (int t = 0; t < n_me; t++)
        for (int nd = 0; nd * per < c->ep; nd++) {
            int reached = 0;
            for (int dst = nd * per; dst < (nd + 1) * per && dst < c->ep && nd != me / per; dst++)
                reached |= goes_to(c, seed, me, t, dst);
            per_node += reached;
        }
    const int64_t network = hier ? per_node : internode;
    RANK_EXPECT(fails, me, res->network_rows == network && res->network_bytes == network * record,
                "network rows %lld (%lld bytes), expected %lld (%s path)", (long long)res->network_rows,
                (long long)res->network_bytes, (long long)network, hier ? "hierarchical" : "flat");
    int sanitize = !(c->flags & MOEA2A_MOE_NO_SANITIZE);
    for (int src = 0; src < c->ep && fails < 5; src++) {
        int n_src = tokens_of(c, seed, src), i = 0;
        for (int t = 0; t < n_src; t++) {
            if (!goes_to(c, seed, src, t, me)) continue;
            size_t slot = (size_t)src * (size_t)stride + (size_t)i;
            RANK_EXPECT(fails, me, i < res->recv_counts[src], "from %d: token %d should be slot %d, count %d", src, t,
                        i, res->recv_counts[src]);
            if (i >= res->recv_counts[src]) break;
            RANK_EXPECT(fails, me, res->src_token_index[slot] == t, "slot (%d,%d) source index %d, expected %d", src,
                        i, res->src_token_index[slot], t);
            for (int j = 0; j < k; j++) {
                int32_t e = expert_of(c, seed, src, t, j), want = e;
                if (sanitize && (!valid(c, e) || ((c->flags & MOEA2A_MOE_REWRITE_NONLOCAL) && owner(c, e) != me)))
                    want = c->invalid;
                RANK_EXPECT(fails, me, res->topk_ids[slot * k + j] == want, "slot (%d,%d) id[%d] = %d, expected %d",
                            src, i, j, res->topk_ids[slot * k + j], want);
                if (c->flags & MOEA2A_MOE_CARRY_WEIGHTS)
                    RANK_EXPECT(fails, me, res->topk_weights[slot * k + j] == weight_of(seed, src, t, j),
                                "slot (%d,%d) weight[%d]", src, i, j);
            }
            for (int p = 0; p < c->np; p++) {
                size_t row = res->payload_row_bytes[p], bad = 0;
                for (size_t b = 0; b < row; b++)
                    bad += ((unsigned char *)res->payloads[p])[slot * row + b] != payload_byte(seed, src, p, t, b);
                RANK_EXPECT(fails, me, bad == 0, "slot (%d,%d) payload %d: %zu wrong bytes", src, i, p, bad);
            }
            i++;
        }
        RANK_EXPECT(fails, me, res->recv_counts[src] == i, "recv_counts[%d] = %d, expected %d", src, res->recv_counts[src], i);
        /* Padding: ids sanitized (or untouched), source index -1, payload rows untouched. */
        for (int pad = i; pad < stride; pad++) {
            size_t slot = (size_t)src * (size_t)stride + (size_t)pad;
            RANK_EXPECT(fails, me, res->src_token_index[slot] == -1, "padding (%d,%d) source index %d", src, pad,
                        res->src_token_index[slot]);
            for (int j = 0; sanitize && j < k; j++)
                RANK_EXPECT(fails, me, res->topk_ids[slot * k + j] == c->invalid, "padding (%d,%d) id %d not sanitized",
                            src, pad, res->topk_ids[slot * k + j]);
            for (int p = 0; p < c->np; p++) {
                size_t row = res->payload_row_bytes[p], touched = 0;
                for (size_t b = 0; b < row; b++) touched += ((unsigned char *)res->payloads[p])[slot * row + b] != POISON;
                RANK_EXPECT(fails, me, touched == 0, "padding (%d,%d) payload %d: %zu bytes written", src, pad, p, touched);
            }
        }
    }
    return fails;
}

/* Expert side: one row per valid slot; token side: checks out[t] bit for bit. */
static int check_combine(const cfg_t *c, uint64_t seed, int me, moea2a_moe_t moe, const moea2a_dispatch_result_t *res,
                         int n_me, int zero_copy, int split)
{
    int fails = 0, stride = res->stride;
    size_t es = dsize(c->cdt), row = es * c->hidden;
    unsigned char *expert = NULL;
    if (zero_copy) moea2a_moe_combine_buffer(moe, (void **)&expert);
    else expert = malloc(row * (size_t)c->ep * (size_t)stride + 1);
    for (int src = 0; src < c->ep; src++)
        for (int i = 0; i < res->recv_counts[src]; i++) {
            int t = res->src_token_index[(size_t)src * (size_t)stride + (size_t)i];
            for (size_t h = 0; h < c->hidden; h++)
                put_value(c->cdt, expert + ((size_t)src * (size_t)stride + (size_t)i) * row, h,
                          row_value(c, seed, src, t, me, h));
        }
    unsigned char *out = malloc(row * (size_t)n_me + 1);
    memset(out, POISON, row * (size_t)n_me + 1);
    moea2a_result_t r;
    if (split) {
        r = moea2a_combine_send(moe, zero_copy ? NULL : expert, NULL);
        if (r == MOEA2A_SUCCESS) r = moea2a_combine_recv(moe, out, NULL);
    } else {
        r = moea2a_combine(moe, zero_copy ? NULL : expert, out, NULL);
    }
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "combine%s: %s", split ? " (split)" : "", moea2a_last_error(NULL));
    /* MOEA2A_NODE_SIZE=N: nodes of N consecutive ranks; across nodes each node's partial
     * (ascending ranks, fp32) is rounded to the combine dtype (exact for the bf16/fp16
     * values here) and the partials are added in ascending node order */
    const char *ns = getenv("MOEA2A_NODE_SIZE");
    const int per = ns && atoi(ns) > 0 && atoi(ns) < c->ep ? atoi(ns) : c->ep;
    for (int t = 0; r == MOEA2A_SUCCESS && t < n_me && fails < 5; t++)
        for (size_t h = 0; h < c->hidden; h++) {
            float acc = 0.0f;
            for (int node0 = 0; node0 < c->ep; node0 += per) {
                float partial = 0.0f;
                for (int dst = node0; dst < node0 + per && dst < c->ep; dst++) /* ascending rank order, fp32 */
                    if (goes_to(c, seed, me, t, dst)) partial += row_value(c, seed, me, t, dst, h);
                acc = per == c->ep ? partial : acc + partial;
            }
            /* bf16/fp16: sums of quarters in [-32, 32] are exact; fp32: the same adds in the same order */
            int ok = same_value(c->cdt, out + (size_t)t * row, h, acc);
            RANK_EXPECT(fails, me, ok, "combine out[%d][%zu] wrong (expected %g)", t, h, (double)acc);
            if (!ok) break;
        }
    free(out);
    if (!zero_copy) free(expert);
    return fails;
}

static int run_config(moea2a_comm_t comm, int me, int ep, uint64_t seed)
{
    cfg_t c = make_cfg(seed, ep);
    int fails = 0, max_n = 0, split = seed % 3 == 1; /* a third of the configurations through the split halves */
    for (int r = 0; r < ep; r++) max_n = tokens_of(&c, seed, r) > max_n ? tokens_of(&c, seed, r) : max_n;
    if (c.rt) c.rt = max_n + (c.cap - max_n) / 2; /* a runtime stride between the largest n and cap */
    moea2a_moe_config_t mc = moe_config(&c);
    moea2a_moe_t moe;
    moea2a_result_t r = moea2a_moe_create(&moe, comm, &mc);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "create (seed %llu): %s", (unsigned long long)seed, moea2a_last_error(comm));
    if (r) return fails;
    inputs_t in = make_inputs(&c, seed, me);
    /* Poison the receive payloads so that writes to padding show. */
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    size_t rows;
    moea2a_moe_max_recv_rows(moe, &rows);
    RANK_EXPECT(fails, me, rows == (size_t)ep * (size_t)c.cap, "max_recv_rows %zu", rows);
    const void *pays[3] = {in.pay[0], in.pay[1], in.pay[2]};
    /* A first dispatch + combine fills the workspace; poison it, then the real one. */
    r = moea2a_dispatch(moe, in.n, in.ids, in.w, (const void *const *)pays, c.rt, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "dispatch (seed %llu): %s", (unsigned long long)seed, moea2a_last_error(comm));
    if (r == MOEA2A_SUCCESS) {
        if (c.hidden) {
            unsigned char *tmp = malloc(dsize(c.cdt) * c.hidden * (size_t)in.n + 1);
            moea2a_combine(moe, NULL, tmp, NULL);
            free(tmp);
        } else {
            RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                        "combine without hidden is refused");
            moea2a_moe_destroy(moe);
            r = moea2a_moe_create(&moe, comm, &mc);
        }
        for (int p = 0; r == MOEA2A_SUCCESS && p < c.np; p++)
            memset(res.payloads[p], POISON, res.payload_row_bytes[p] * (size_t)ep * (size_t)c.cap);
        if (split) { /* the two halves, against the same oracle */
            r = r ? r : moea2a_dispatch_send(moe, in.n, in.ids, in.w, (const void *const *)pays, c.rt, NULL);
            r = r ? r : moea2a_dispatch_recv(moe, &res, NULL);
        } else {
            r = r ? r : moea2a_dispatch(moe, in.n, in.ids, in.w, (const void *const *)pays, c.rt, &res, NULL);
        }
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "second dispatch%s: %s", split ? " (split)" : "",
                    moea2a_last_error(comm));
    }
    int64_t inv;
    if (r == MOEA2A_SUCCESS) fails += check_dispatch(&c, seed, me, c.rt ? c.rt : c.cap, &res, in.n, &inv);
    if (r == MOEA2A_SUCCESS && c.hidden) fails += check_combine(&c, seed, me, moe, &res, in.n, (int)(seed % 2), split);
    free_inputs(&c, &in);
    moea2a_moe_destroy(moe);
    if (fails) printf("# rank %d: seed %llu: E %d k %d cap %d np %d hidden %zu flags 0x%x rt %d skew %d map %d\n", me,
                      (unsigned long long)seed, c.E, c.k, c.cap, c.np, c.hidden, c.flags, c.rt, c.skew, c.map_mode);
    return fails;
}

typedef struct {
    uint64_t first_seed;
    int configs;
    int node_size; /* MOEA2A_NODE_SIZE for the run (0: hosts) */
    int flat;      /* MOEA2A_HIERARCHICAL=0 */
} sweep_t;

static int sweep_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const sweep_t *s = arg;
    moea2a_comm_t comm;
    int fails = 0;
    if (s->node_size) {
        char v[16];
        snprintf(v, sizeof(v), "%d", s->node_size);
        setenv("MOEA2A_NODE_SIZE", v, 1);
    }
    if (s->flat) setenv("MOEA2A_HIERARCHICAL", "0", 1);
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    for (int i = 0; i < s->configs && fails < 10; i++) fails += run_config(comm, rank, n, s->first_seed + (uint64_t)i);
    moea2a_comm_destroy(comm);
    return fails > 100 ? 100 : fails;
}

/* ---- the allocation is what the formula says, where it says -------------------------- */

static int check_allocation(moea2a_comm_t comm, int me, int ep, const moea2a_moe_config_t *mc, moea2a_moe_t moe,
                            const moea2a_dispatch_result_t *res)
{
    int fails = 0;
    moea2a_moe_workspace_sizes_t sz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_result_t r = moea2a_moe_workspace_size(comm, mc, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "workspace_size: %s", moea2a_last_error(comm));
    unsigned char *base = (unsigned char *)res->payloads[0] - sz.aux_bytes, *comb;
    moea2a_moe_combine_buffer(moe, (void **)&comb);
    RANK_EXPECT(fails, me, (unsigned char *)res->topk_ids == (unsigned char *)res->payloads[0] + sz.payload_bytes[0],
                "ids follow the payload in the workspace");
    RANK_EXPECT(fails, me, comb + sz.combine_bytes == base + sz.workspace_bytes,
                "the combine buffer ends the %zu-byte workspace", sz.workspace_bytes);
    RANK_EXPECT(fails, me, sz.staged_peers == ep - 1 && sz.nvlink_peers == 0 && sz.host_bytes == sz.total_bytes &&
                               sz.device_bytes == 0 && sz.total_bytes == sz.workspace_bytes + sz.staging_bytes,
                "host sizes: staged %d, host %zu, total %zu", sz.staged_peers, sz.host_bytes, sz.total_bytes);
    /* The pages sit on the NUMA node the plan named. */
    hwloc_topology_t t;
    hwloc_topology_init(&t);
    hwloc_topology_load(t);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (sz.numa_node >= 0 && !hwloc_get_area_memlocation(t, base, 4096, set, HWLOC_MEMBIND_BYNODESET))
        RANK_EXPECT(fails, me, hwloc_bitmap_isset(set, (unsigned)sz.numa_node), "workspace not on NUMA node %d", sz.numa_node);
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(t);
    return fails;
}

/* ---- semantic rules one by one ---------------------------------------------------- */

static moea2a_moe_config_t small_config(int E, int k, int cap)
{
    moea2a_moe_config_t m = MOEA2A_MOE_CONFIG_INITIALIZER;
    m.num_experts = E, m.top_k = k, m.max_tokens_per_rank = cap, m.num_payloads = 1;
    m.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, 8};
    m.hidden = 8;
    m.combine_dtype = MOEA2A_FLOAT32;
    m.memory = MOEA2A_MEMORY_HOST;
    return m;
}

/* The combine order across nodes, where rounding decides: rank 3 sends one token to
 * ranks 0, 1, 2, whose bf16 rows hold 1, 2^-8, 2^-8. On one node the fp32 sum
 * 1 + 2^-7 is a bf16; with nodes {0,1} and {2,3} (MOEA2A_NODE_SIZE=2) node 0's
 * partial 1 + 2^-8 rounds (a tie, to even) to 1 before it travels, and 1 + 2^-8
 * rounds to 1 again: the node-grouped order of moea2a_moe(3). */
/* Joins the 4 ranks, in nodes {0,1} and {2,3} when *grouped (MOEA2A_NODE_SIZE=2,
 * read at init), else on one node; nonzero when the init failed. */
static int join_nodes(int me, int ep, moea2a_unique_id_t id, const int *grouped, moea2a_comm_t *comm)
{
    if (*grouped) setenv("MOEA2A_NODE_SIZE", "2", 1);
    return moea2a_comm_init_rank(comm, ep, id, me, NULL) != MOEA2A_SUCCESS;
}

static int node_order_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const int grouped = *(const int *)arg;
    moea2a_comm_t comm;
    if (join_nodes(me, ep, id, &grouped, &comm)) return 1;
    int fails = 0;
    moea2a_moe_config_t mc = small_config(4, 3, 2); /* expert e lives on rank e */
    mc.combine_dtype = MOEA2A_BFLOAT16;
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) return 1;
    int32_t ids[3] = {0, 1, 2};
    uint16_t pay[8] = {0}, out[8] = {0};
    const void *pays[1] = {pay};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_dispatch(moe, me == 3 ? 1 : 0, ids, NULL, pays, 0, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
    uint16_t *rows;
    moea2a_moe_combine_buffer(moe, (void **)&rows);
    const uint16_t value = me == 0 ? 0x3f80 : 0x3b80; /* bf16 1.0 on rank 0, 2^-8 on ranks 1 and 2 */
    for (int i = 0; r == MOEA2A_SUCCESS && i < res.recv_counts[3]; i++)
        for (int h = 0; h < 8; h++) rows[((size_t)3 * res.stride + (size_t)i) * 8 + (size_t)h] = value;
    r = moea2a_combine(moe, NULL, out, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "combine: %s", moea2a_last_error(comm));
    const uint16_t want = grouped ? 0x3f80 : 0x3f81; /* 1.0, or 1 + 2^-7 */
    for (int h = 0; me == 3 && h < 8; h++)
        RANK_EXPECT(fails, me, out[h] == want, "out[%d] = 0x%04x, want 0x%04x", h, out[h], want);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* Combine outputs a NaN as the one canonical NaN (fp32 0x7fc00000, bf16 0x7fc0, fp16
 * 0x7e00) whatever made it: rank 3 sends one token to ranks 0..3 (expert e on rank e),
 * whose rows hold the values of a case below, in each combine dtype. */
enum { NAN_OVERFLOW, NAN_INFINITIES, NAN_PAYLOAD, NAN_CASES };
static const char *const nan_case_name[NAN_CASES] = {"rows +B +B -B -B, B + B past the dtype's largest",
                                                     "rows +inf -inf 1 1", "rows NaN(-, payload) 1 1 1"};

/* Bits of the value rank `rank` returns in case cs and dtype dt (2 or 4 bytes). */
static uint32_t nan_row_bits(int cs, moea2a_datatype_t dt, int rank)
{
    const int f16 = dt == MOEA2A_FLOAT16, f32 = dt == MOEA2A_FLOAT32;
    const uint32_t one = f32 ? 0x3f800000u : f16 ? 0x3c00u : 0x3f80u;
    const uint32_t big = f32 ? 0x7f000000u : f16 ? 0x7800u : 0x7f00u; /* 2^127, 2^15 */
    const uint32_t inf = f32 ? 0x7f800000u : f16 ? 0x7c00u : 0x7f80u, sign = f32 ? 0x80000000u : 0x8000u;
    const uint32_t nan = f32 ? 0xffc00123u : f16 ? 0xfe01u : 0xffc1u; /* negative, with a payload */
    switch (cs) {
    case NAN_OVERFLOW: return rank < 2 ? big : big | sign;
    case NAN_INFINITIES: return rank == 0 ? inf : rank == 1 ? inf | sign : one;
    default: return rank == 0 ? nan : one;
    }
}

/* What out must hold: NaN everywhere but the overflow case on one node, where the fp32
 * sum from 0 in rank order is (2B + -B) + -B: inf for fp32 and bf16 (2^128 overflows
 * fp32), 0 for fp16 (2^16 does not). */
static uint32_t nan_want(int cs, moea2a_datatype_t dt, int grouped)
{
    const int f16 = dt == MOEA2A_FLOAT16, f32 = dt == MOEA2A_FLOAT32;
    if (cs == NAN_OVERFLOW && !grouped) return f16 ? 0u : f32 ? 0x7f800000u : 0x7f80u;
    return f32 ? 0x7fc00000u : f16 ? 0x7e00u : 0x7fc0u;
}

static int canonical_nan_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const int grouped = *(const int *)arg;
    moea2a_comm_t comm;
    if (join_nodes(me, ep, id, &grouped, &comm)) return 1;
    int fails = 0;
    for (int d = 0; d < 3; d++)
        for (int cs = 0; cs < NAN_CASES; cs++) {
            const moea2a_datatype_t dt = comb_types[d];
            const size_t es = dsize(dt);
            moea2a_moe_config_t mc = small_config(4, 4, 2); /* expert e lives on rank e */
            mc.combine_dtype = dt;
            moea2a_moe_t moe;
            if (moea2a_moe_create(&moe, comm, &mc)) return fails + 1;
            int32_t ids[4] = {0, 1, 2, 3};
            uint16_t pay[8] = {0};
            unsigned char out[8 * 4] = {0};
            const void *pays[1] = {pay};
            moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
            moea2a_result_t r = moea2a_dispatch(moe, me == 3 ? 1 : 0, ids, NULL, pays, 0, &res, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
            unsigned char *rows;
            moea2a_moe_combine_buffer(moe, (void **)&rows);
            const uint32_t v = nan_row_bits(cs, dt, me);
            for (int i = 0; r == MOEA2A_SUCCESS && i < res.recv_counts[3]; i++)
                for (size_t h = 0; h < 8; h++)
                    memcpy(rows + (((size_t)3 * (size_t)res.stride + (size_t)i) * 8 + h) * es, &v, es);
            r = moea2a_combine(moe, NULL, out, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "combine: %s", moea2a_last_error(comm));
            const uint32_t want = nan_want(cs, dt, grouped);
            uint32_t got = want;
            size_t h = 0;
            for (; me == 3 && h < 8 && got == want; h++) memcpy(&got, out + h * es, es);
            RANK_EXPECT(fails, me, got == want, "%s, %s%s: out[%zu] = 0x%x, want 0x%x", moea2a_datatype_name(dt),
                        nan_case_name[cs], grouped ? ", nodes {0,1} {2,3}" : "", h - 1, got, want);
            moea2a_moe_destroy(moe);
        }
    moea2a_comm_destroy(comm);
    return fails;
}

/* The split halves' order rules, and that they give the one-call form's bits
 * (out2: that form's result for the same dispatch and rows). */
static int split_order(moea2a_comm_t comm, int me, int ep, moea2a_moe_t moe, const int32_t *ids,
                       const void *const *pays, const float *out2)
{
    int fails = 0;
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    float out[64 * 8];
    RANK_EXPECT(fails, me, moea2a_dispatch_recv(moe, &res, NULL) == MOEA2A_ERR_STATE &&
                               strstr(moea2a_last_error(comm), "dispatch_send"),
                "receive without send: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_combine_send(moe, NULL, NULL) == MOEA2A_ERR_STATE, "combine_send without dispatch");
    RANK_EXPECT(fails, me, moea2a_combine_recv(moe, out, NULL) == MOEA2A_ERR_STATE, "combine_recv without send");
    /* rejected on one rank: every rank fails, nothing pending */
    moea2a_result_t r = moea2a_dispatch_send(moe, 4, me == 0 ? NULL : ids, NULL, pays, 0, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT, "dispatch_send with NULL ids on rank 0: %s",
                moea2a_strerror(r));
    RANK_EXPECT(fails, me, moea2a_dispatch_send(moe, 4, ids, NULL, pays, 0, NULL) == MOEA2A_SUCCESS,
                "dispatch_send: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_dispatch_send(moe, 4, ids, NULL, pays, 0, NULL) == MOEA2A_ERR_STATE &&
                               strstr(moea2a_last_error(comm), "dispatch_recv"),
                "two sends: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_dispatch(moe, 4, ids, NULL, pays, 0, &res, NULL) == MOEA2A_ERR_STATE,
                "one-call dispatch between the halves");
    RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, out, NULL) == MOEA2A_ERR_STATE, "combine between the halves");
    /* a rejected receive is local and can be repeated */
    RANK_EXPECT(fails, me, moea2a_dispatch_recv(moe, me == 0 ? NULL : &res, NULL) == (me == 0 ? MOEA2A_ERR_INVALID_ARGUMENT : MOEA2A_SUCCESS),
                "dispatch_recv with a NULL result on rank 0 only");
    if (me == 0)
        RANK_EXPECT(fails, me, moea2a_dispatch_recv(moe, &res, NULL) == MOEA2A_SUCCESS, "dispatch_recv again: %s",
                    moea2a_last_error(comm));
    RANK_EXPECT(fails, me, res.total_recv >= 0 && res.stride == 16, "split dispatch results (stride %d)", res.stride);
    float *buf;
    moea2a_moe_combine_buffer(moe, (void **)&buf);
    for (int i = 0; i < ep * 16 * 8; i++) buf[i] = 1.0f / (float)(i % 13 + 1) + (float)(i % 7) * 1e-3f;
    RANK_EXPECT(fails, me, moea2a_combine_send(moe, NULL, NULL) == MOEA2A_SUCCESS, "combine_send: %s",
                moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_combine_send(moe, NULL, NULL) == MOEA2A_ERR_STATE, "two combine sends");
    RANK_EXPECT(fails, me, moea2a_dispatch_send(moe, 4, ids, NULL, pays, 0, NULL) == MOEA2A_ERR_STATE &&
                               strstr(moea2a_last_error(comm), "combine_recv"),
                "dispatch between the combine's halves: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_combine_recv(moe, NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "combine_recv: NULL out");
    memset(out, 0xA5, sizeof(out));
    RANK_EXPECT(fails, me, moea2a_combine_recv(moe, out, NULL) == MOEA2A_SUCCESS, "combine_recv: %s",
                moea2a_last_error(comm));
    RANK_EXPECT(fails, me, !memcmp(out, out2, sizeof(float) * 4 * 8), "split combine gives the one-call bits");
    RANK_EXPECT(fails, me, moea2a_combine_recv(moe, out, NULL) == MOEA2A_ERR_STATE, "two combine receives");
    return fails;
}

static int rules_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    moea2a_comm_t comm;
    int fails = 0;
    /* Host transport only, so that "CUDA memory without a CUDA transport" holds on GPU
     * machines too (with MOEA2A_MOE_NO_NVLINK: see there). */
    moea2a_config_t cc = MOEA2A_CONFIG_INITIALIZER;
    cc.transport = "ucx";
    if (moea2a_comm_init_rank(&comm, ep, id, me, &cc)) return 1;
    moea2a_moe_config_t mc = small_config(10, 3, 16);
    moea2a_moe_t moe;
    moea2a_result_t r = moea2a_moe_create(&moe, comm, &mc);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "create: %s", moea2a_last_error(comm));
    if (r) return 1;
    int32_t ids[64 * 3];
    uint16_t pay[64 * 8];
    float out[64 * 8];
    for (int i = 0; i < 64 * 3; i++) ids[i] = (i * 7 + me) % 10;
    for (int i = 0; i < 64 * 8; i++) pay[i] = (uint16_t)i;
    const void *pays[1] = {pay};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;

    /* n > cap on the last rank: every rank fails with MOEA2A_ERR_CAPACITY, no hang. */
    int n = me == ep - 1 ? 17 : 4;
    r = moea2a_dispatch(moe, n, ids, NULL, pays, 0, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_CAPACITY, "n > cap on rank %d: got %s", ep - 1, moea2a_strerror(r));
    RANK_EXPECT(fails, me, strstr(moea2a_last_error(comm), "max_tokens_per_rank") && strstr(moea2a_last_error(comm), "17"),
                "capacity message names the value to raise: %s", moea2a_last_error(comm));
    /* runtime_max > cap */
    r = moea2a_dispatch(moe, 4, ids, NULL, pays, 32, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_CAPACITY && strstr(moea2a_last_error(comm), "at least 32"),
                "runtime_max > cap: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
    /* n > runtime_max */
    r = moea2a_dispatch(moe, 9, ids, NULL, pays, 8, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_CAPACITY, "n > runtime_max: %s", moea2a_strerror(r));
    /* ranks passing different runtime_max: detected on every rank */
    if (ep > 1) {
        r = moea2a_dispatch(moe, 4, ids, NULL, pays, me == 0 ? 8 : 12, &res, NULL);
        RANK_EXPECT(fails, me, r == MOEA2A_ERR_MISMATCH && strstr(moea2a_last_error(comm), "runtime_max"),
                    "different runtime_max: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
    }
    /* bad pointers are errors on every rank, never a crash */
    r = moea2a_dispatch(moe, 4, me == 0 ? NULL : ids, NULL, pays, 0, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT, "NULL topk_ids on rank 0: %s", moea2a_strerror(r));
    RANK_EXPECT(fails, me, moea2a_dispatch(moe, 4, ids, NULL, pays, 0, NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "NULL result");
    /* order: combine before dispatch, dispatch twice */
    RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, out, NULL) == MOEA2A_ERR_STATE, "combine without dispatch");
    r = moea2a_dispatch(moe, 4, ids, NULL, pays, 0, &res, NULL);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "dispatch after refused calls: %s", moea2a_last_error(comm));
    if (r == MOEA2A_SUCCESS) fails += check_allocation(comm, me, ep, &mc, moe, &res);
    int32_t first_count = res.recv_counts[0];
    RANK_EXPECT(fails, me, moea2a_dispatch(moe, 4, ids, NULL, pays, 0, &res, NULL) == MOEA2A_ERR_STATE &&
                               strstr(moea2a_last_error(comm), "moea2a_combine"),
                "second dispatch before combine is MOEA2A_ERR_STATE");
    RANK_EXPECT(fails, me, res.recv_counts[0] == first_count, "a refused dispatch leaves the results alone");
    /* Determinism: ranks reach combine at different times; results are identical. */
    float *rows;
    moea2a_moe_combine_buffer(moe, (void **)&rows);
    for (int i = 0; i < ep * 16 * 8; i++) rows[i] = 1.0f / (float)(i % 13 + 1) + (float)(i % 7) * 1e-3f;
    float out2[64 * 8];
    usleep((useconds_t)(me * 3000));
    RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, out, NULL) == MOEA2A_SUCCESS, "combine: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_dispatch(moe, 4, ids, NULL, pays, 0, &res, NULL) == MOEA2A_SUCCESS, "dispatch again");
    for (int i = 0; i < ep * 16 * 8; i++) rows[i] = 1.0f / (float)(i % 13 + 1) + (float)(i % 7) * 1e-3f;
    usleep((useconds_t)((ep - me) * 3000));
    RANK_EXPECT(fails, me, moea2a_combine(moe, rows, out2, NULL) == MOEA2A_SUCCESS, "combine 2");
    RANK_EXPECT(fails, me, !memcmp(out, out2, sizeof(float) * 4 * 8), "combine is bit-identical across runs");
    RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, out, NULL) == MOEA2A_ERR_STATE, "combine twice");
    fails += split_order(comm, me, ep, moe, ids, pays, out2);
    moea2a_moe_destroy(moe);

    /* A config that differs on one rank is MOEA2A_ERR_MISMATCH everywhere. */
    moea2a_moe_config_t odd = small_config(me == ep - 1 && ep > 1 ? 11 : 10, 3, 16);
    r = moea2a_moe_create(&moe, comm, &odd);
    RANK_EXPECT(fails, me, ep == 1 ? r == MOEA2A_SUCCESS : r == MOEA2A_ERR_MISMATCH, "mismatched config: %s",
                moea2a_strerror(r));
    if (r == MOEA2A_SUCCESS) moea2a_moe_destroy(moe);
    /* A bad config on one rank fails every rank. */
    moea2a_moe_config_t bad = small_config(10, me == 0 ? 0 : 3, 16);
    r = moea2a_moe_create(&moe, comm, &bad);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT, "top_k 0 on rank 0: %s", moea2a_strerror(r));
    /* Fail fast on memory: a cap no machine has memory for. */
    moea2a_moe_config_t huge = small_config(10, 8, 1 << 28);
    huge.hidden = 7168;
    huge.payloads[0].elems_per_token = 7168;
    r = moea2a_moe_create(&moe, comm, &huge);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_NO_MEMORY && strstr(moea2a_last_error(comm), "max_tokens_per_rank <="),
                "memory fail-fast: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
    /* CUDA memory without a CUDA transport, on the generic path (the load/store path
     * needs none where ranks map each other's memory over CUDA IPC: test_gpu) */
    moea2a_moe_config_t gpu = small_config(10, 3, 16);
    gpu.memory = MOEA2A_MEMORY_CUDA, gpu.flags |= MOEA2A_MOE_NO_NVLINK;
    r = moea2a_moe_create(&moe, comm, &gpu);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_UNAVAILABLE, "CUDA MoE without CUDA transport: %s: %s", moea2a_strerror(r),
                moea2a_last_error(comm));
    RANK_EXPECT(fails, me, moea2a_moe_create(NULL, comm, &mc) == MOEA2A_ERR_INVALID_ARGUMENT, "NULL moe");
    RANK_EXPECT(fails, me, moea2a_dispatch(NULL, 0, NULL, NULL, NULL, 0, &res, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "NULL moe");

    /* All ranks idle still works. */
    mc = small_config(10, 3, 16);
    r = moea2a_moe_create(&moe, comm, &mc);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "create: %s", moea2a_last_error(comm));
    if (r == MOEA2A_SUCCESS) {
        RANK_EXPECT(fails, me, moea2a_dispatch(moe, 0, NULL, NULL, NULL, 0, &res, NULL) == MOEA2A_SUCCESS &&
                                   res.total_recv == 0,
                    "all ranks idle: %s", moea2a_last_error(comm));
        RANK_EXPECT(fails, me, moea2a_combine(moe, NULL, NULL, NULL) == MOEA2A_SUCCESS, "idle combine: %s",
                    moea2a_last_error(comm));
        /* a caller built against the header before internode_rows: its shorter result
         * is filled, nothing past its size is written */
        const size_t old_size = offsetof(moea2a_dispatch_result_t, internode_rows);
        union {
            moea2a_dispatch_result_t r;
            unsigned char b[sizeof(moea2a_dispatch_result_t)];
        } old;
        memset(&old, 0xA5, sizeof(old));
        old.r.size = old_size, old.r.version = MOEA2A_VERSION_CODE;
        RANK_EXPECT(fails, me, moea2a_dispatch(moe, 4, ids, NULL, pays, 0, &old.r, NULL) == MOEA2A_SUCCESS,
                    "dispatch into an older, shorter result: %s", moea2a_last_error(comm));
        int untouched = 1;
        for (size_t i = old_size; i < sizeof(old); i++) untouched &= old.b[i] == 0xA5;
        RANK_EXPECT(fails, me, untouched && old.r.size == old_size && old.r.stride == 16,
                    "a shorter result is filled up to its size only");
        moea2a_combine(moe, NULL, out, NULL);
        moea2a_moe_destroy(moe);
    }
    RANK_EXPECT(fails, me, moea2a_comm_destroy(comm) == MOEA2A_SUCCESS, "destroy: %s", moea2a_last_error(NULL));
    return fails;
}

int main(void)
{
    static const int sizes[] = {1, 2, 3, 4, 5, 8};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        sweep_t s = {1000u * (uint64_t)sizes[i], sizes[i] <= 4 ? 40 : 20, 0, 0};
        local_ranks_result_t res;
        local_ranks_run(sizes[i], sweep_rank, &s, WATCHDOG, &res);
        tap_ok(res.failed == 0, "%d random configurations on %d ranks match the oracle (dispatch, sanitize, combine)",
               s.configs, sizes[i]);
    }
    /* emulated nodes (MOEA2A_NODE_SIZE): every rank of another node is remote; the same
     * results on the flat path and on the hierarchical one, whose rail peers relay inside
     * equal and unequal nodes (the last node smaller, a rank relaying for several) */
    static const struct {
        int ranks, node_size, flat;
    } nodes[] = {{4, 2, 1}, {4, 2, 0}, {5, 2, 0}, {6, 4, 0}, {8, 3, 0}};
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
        sweep_t s = {77000 + 100u * (uint64_t)i, 20, nodes[i].node_size, nodes[i].flat};
        local_ranks_result_t res;
        local_ranks_run(nodes[i].ranks, sweep_rank, &s, WATCHDOG, &res);
        tap_ok(res.failed == 0, "%d random configurations on %d ranks in emulated nodes of %d (MOEA2A_NODE_SIZE), %s "
                                "path, match the oracle, network rows included",
               s.configs, nodes[i].ranks, nodes[i].node_size, nodes[i].flat ? "flat (MOEA2A_HIERARCHICAL=0)" : "hierarchical");
    }
    for (int grouped = 0; grouped < 2; grouped++) {
        local_ranks_result_t res;
        local_ranks_run(4, node_order_rank, &grouped, WATCHDOG, &res);
        tap_ok(res.failed == 0, "combine order %s: bf16 rows 1, 2^-8, 2^-8 from ranks 0, 1, 2 sum to %s", grouped
               ? "across 2 emulated nodes (node partials rounded to bf16, then added)" : "on one node (fp32, rounded once)",
               grouped ? "1" : "1 + 2^-7");
    }
    for (int grouped = 0; grouped < 2; grouped++) {
        local_ranks_result_t res;
        local_ranks_run(4, canonical_nan_rank, &grouped, WATCHDOG, &res);
        tap_ok(res.failed == 0, "combine writes every NaN it makes as the canonical NaN (fp32 0x7fc00000, bf16 0x7fc0, "
               "fp16 0x7e00): overflowing sums, +inf + -inf, a NaN row with sign and payload; %s",
               grouped ? "across 2 emulated nodes" : "on one node");
    }
    static const int rule_sizes[] = {1, 2, 4};
    for (size_t i = 0; i < sizeof(rule_sizes) / sizeof(rule_sizes[0]); i++) {
        local_ranks_result_t res;
        local_ranks_run(rule_sizes[i], rules_rank, NULL, WATCHDOG, &res);
        tap_ok(res.failed == 0, "capacity, runtime_max agreement, call order (one call and split halves), determinism, config mismatch, "
                                "memory fail-fast, idle ranks on %d ranks", rule_sizes[i]);
    }
    return tap_done();
}

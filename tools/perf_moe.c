/* moea2a_perf --moe: dispatch, combine and the round trip, one row each per token
 * count, and with --baseline the same done the way a user would without moea2a
 * (pack rows per destination, exchange counts, all-to-all the packed rows; back
 * again and sum), measured in the same run.
 *
 * Columns: "bytes" is the payload one rank moves (rows x row bytes, its own share
 * included); algbw = bytes / time; busbw = the bytes that cross to other ranks / time
 * (nccl-tests' "bus" notion for an all-to-all). Times are the slowest rank's mean. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); return 1; } while (0)
#define TRY(call) do { moea2a_result_t r_ = (call); if (r_) FAIL("rank %d: %s: %s: %s\n", rank, #call, \
                        moea2a_strerror(r_), moea2a_last_error(comm)); } while (0)

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Owner of expert e under contiguous placement (the benchmark's own copy). */
static int owner_of(int e, int E, int ep)
{
    int q = E / ep, rem = E % ep;
    return e < rem * (q + 1) ? e / (q + 1) : rem + (e - rem * (q + 1)) / (q ? q : 1);
}

/* k distinct experts per token; with probability skew an expert comes from rank 0's. */
static void route(int32_t *ids, int T, int k, int E, int ep, double skew, int rank, uint64_t iter)
{
    int hot = E / ep + (E % ep ? 1 : 0);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            uint64_t s = mix((uint64_t)rank << 48 ^ (uint64_t)t << 16 ^ (uint64_t)j ^ iter * 0x1234567);
            int32_t e;
            for (int tries = 0;; tries++, s = mix(s)) {
                int from_hot = (double)(s % 1000000) / 1e6 < skew;
                e = (int32_t)(from_hot ? (s >> 20) % (uint64_t)hot : (s >> 20) % (uint64_t)E);
                int dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
                if (!dup || tries > 64 || k > E) break;
            }
            ids[t * k + j] = e;
        }
}

/* Small integers are exact in bf16 and so are their sums: checks can be bit-exact. */
static uint16_t bf16_of_int(int v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static int pay_value(int src, int t, size_t h) { return (int)((src * 131 + t * 7 + (int)h) % 17) - 8; }
static int ret_value(int src, int t, int expert_rank, size_t h) { return (int)((src + 3 * t + 5 * expert_rank + (int)h) % 9) - 4; }

typedef struct {
    int rank, ep, T, k;
    size_t row, crow; /* payload and combine row bytes */
    int32_t *ids;
    unsigned char *pay;
} bench_t;

/* ---- the baseline: what one would write without moea2a ------------------------- */

typedef struct {
    int64_t *sc, *sd, *rc, *rd, *counts_in, *one, *offs;
    int32_t *pos;     /* [T][k]: row index in the packed send buffer of each destination */
    unsigned char *sbuf, *rbuf, *cback, *cland;
    uint16_t *out;
} base_t;

static int base_alloc(const bench_t *b, base_t *x)
{
    size_t rows = (size_t)b->T * (size_t)(b->k < b->ep ? b->k : b->ep) + 1, n = (size_t)b->ep;
    x->sc = calloc(7 * n, sizeof(int64_t));
    x->pos = malloc(sizeof(int32_t) * (size_t)b->T * (size_t)b->k + 4);
    x->sbuf = malloc(rows * b->row);
    x->rbuf = malloc(n * (size_t)b->T * b->row + 1);
    x->cback = malloc(n * (size_t)b->T * b->crow + 1);
    x->cland = malloc(rows * b->crow);
    x->out = malloc((size_t)b->T * b->crow + 2);
    if (!x->sc || !x->pos || !x->sbuf || !x->rbuf || !x->cback || !x->cland || !x->out) return -1;
    x->sd = x->sc + n, x->rc = x->sc + 2 * n, x->rd = x->sc + 3 * n, x->counts_in = x->sc + 4 * n;
    x->one = x->sc + 5 * n, x->offs = x->sc + 6 * n;
    return 0;
}

static void base_free(base_t *x)
{
    free(x->sc), free(x->pos), free(x->sbuf), free(x->rbuf), free(x->cback), free(x->cland), free(x->out);
}

/* Destinations of token t, deduplicated, ascending; returns how many. */
static int dests(const bench_t *b, int E, int t, int *d)
{
    int nd = 0;
    for (int j = 0; j < b->k; j++) {
        int r = owner_of(b->ids[t * b->k + j], E, b->ep), i = nd;
        int seen = 0;
        for (int q = 0; q < nd; q++) seen |= d[q] == r;
        if (seen) continue;
        while (i > 0 && d[i - 1] > r) d[i] = d[i - 1], i--;
        d[i] = r, nd++;
    }
    return nd;
}

static moea2a_result_t base_dispatch(moea2a_comm_t comm, const bench_t *b, int E, base_t *x)
{
    int n = b->ep, d[64];
    for (int p = 0; p < n; p++) x->sc[p] = 0, x->one[p] = 1, x->offs[p] = p;
    for (int t = 0; t < b->T; t++) {
        int nd = dests(b, E, t, d);
        for (int i = 0; i < nd; i++) x->sc[d[i]]++;
    }
    for (int p = 0, o = 0; p < n; p++) x->sd[p] = o, o += (int)x->sc[p];
    int64_t fill[64] = {0};
    for (int t = 0; t < b->T; t++) { /* pack rows per destination */
        int nd = dests(b, E, t, d);
        for (int i = 0; i < nd; i++) {
            int64_t at = x->sd[d[i]] + fill[d[i]]++;
            x->pos[t * b->k + i] = (int32_t)at;
            memcpy(x->sbuf + (size_t)at * b->row, b->pay + (size_t)t * b->row, b->row);
        }
    }
    moea2a_result_t r = moea2a_alltoallv(x->sc, x->one, x->offs, x->counts_in, x->one, x->offs, MOEA2A_INT64, comm, NULL);
    for (int p = 0; p < n; p++) x->rc[p] = x->counts_in[p], x->rd[p] = (int64_t)p * b->T;
    int64_t sdb[64], rdb[64], scb[64], rcb[64];
    for (int p = 0; p < n; p++)
        scb[p] = x->sc[p] * (int64_t)b->row, sdb[p] = x->sd[p] * (int64_t)b->row, rcb[p] = x->rc[p] * (int64_t)b->row,
        rdb[p] = x->rd[p] * (int64_t)b->row;
    return r ? r : moea2a_alltoallv(x->sbuf, scb, sdb, x->rbuf, rcb, rdb, MOEA2A_UINT8, comm, NULL);
}

/* The expert side returns one combine row per received row; the token side sums. */
static moea2a_result_t base_combine(moea2a_comm_t comm, const bench_t *b, int E, base_t *x)
{
    int n = b->ep, d[64];
    int64_t sc[64], sd[64], rc[64], rd[64];
    for (int p = 0; p < n; p++)
        sc[p] = x->rc[p] * (int64_t)b->crow, sd[p] = x->rd[p] * (int64_t)b->crow, rc[p] = x->sc[p] * (int64_t)b->crow,
        rd[p] = x->sd[p] * (int64_t)b->crow;
    moea2a_result_t r = moea2a_alltoallv(x->cback, sc, sd, x->cland, rc, rd, MOEA2A_UINT8, comm, NULL);
    size_t hidden = b->crow / 2;
    for (int t = 0; r == MOEA2A_SUCCESS && t < b->T; t++) {
        int nd = dests(b, E, t, d);
        for (size_t h = 0; h < hidden; h++) {
            float acc = 0;
            for (int i = 0; i < nd; i++) {
                uint16_t v;
                memcpy(&v, x->cland + (size_t)x->pos[t * b->k + i] * b->crow + 2 * h, 2);
                uint32_t u = (uint32_t)v << 16;
                float f;
                memcpy(&f, &u, 4);
                acc += f;
            }
            uint32_t u;
            memcpy(&u, &acc, 4);
            x->out[(size_t)t * hidden + h] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
    }
    return r;
}

/* ---- moea2a ---------------------------------------------------------------------- */

static moea2a_moe_config_t config_of(const perf_opts_t *o, int T)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = o->experts, c.top_k = o->topk, c.max_tokens_per_rank = T > 0 ? T : 1;
    c.num_payloads = 1;
    c.payloads[0] = (moea2a_payload_desc_t){o->dtype, (size_t)o->hidden};
    if (o->dtype == MOEA2A_NVFP4) { /* packed values, and their E4M3 scales per 16 */
        c.payloads[0].elems_per_token = (size_t)o->hidden / 2;
        c.num_payloads = 2;
        c.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT8_E4M3, (size_t)o->hidden / 16};
    }
    c.hidden = (size_t)o->hidden, c.combine_dtype = MOEA2A_BFLOAT16;
    c.memory = strcmp(o->mem, "cuda") ? MOEA2A_MEMORY_HOST : MOEA2A_MEMORY_CUDA;
    if (o->weights) c.flags |= MOEA2A_MOE_CARRY_WEIGHTS;
    return c;
}

/* One dispatch + combine checked exactly; returns wrong elements on this rank. */
static long check_round(moea2a_comm_t comm, moea2a_moe_t moe, const bench_t *b, const perf_opts_t *o,
                        const void *const *pays, const float *w, uint16_t *out, moea2a_result_t *res)
{
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    long wrong = 0;
    if ((*res = moea2a_dispatch(moe, b->T, b->ids, w, pays, 0, &d, NULL))) return 0;
    int bf16 = o->dtype == MOEA2A_BFLOAT16;
    uint16_t *rows;
    moea2a_moe_combine_buffer(moe, (void **)&rows);
    size_t hidden = (size_t)o->hidden;
    for (int src = 0; src < b->ep; src++)
        for (int i = 0; i < d.recv_counts[src]; i++) {
            size_t slot = (size_t)src * (size_t)d.stride + (size_t)i;
            int t = d.src_token_index[slot];
            const unsigned char *got = (const unsigned char *)d.payloads[0] + slot * d.payload_row_bytes[0];
            for (size_t h = 0; bf16 && h < hidden; h++) {
                uint16_t v;
                memcpy(&v, got + 2 * h, 2);
                wrong += v != bf16_of_int(pay_value(src, t, h));
            }
            for (size_t h = 0; h < hidden; h++) rows[slot * hidden + h] = bf16_of_int(ret_value(src, t, b->rank, h));
        }
    if ((*res = moea2a_combine(moe, NULL, out, NULL))) return wrong;
    int dd[64];
    for (int t = 0; t < b->T; t++) {
        int nd = dests(b, o->experts, t, dd);
        for (size_t h = 0; h < hidden; h++) {
            int sum = 0;
            for (int i = 0; i < nd; i++) sum += ret_value(b->rank, t, dd[i], h);
            wrong += out[(size_t)t * hidden + h] != bf16_of_int(sum);
        }
    }
    return wrong;
}

typedef struct {
    double td, tc, bd, bc; /* dispatch, combine, baseline dispatch, baseline combine (s) */
    double bytes_d, remote_d, bytes_c, remote_c;
    long wrong;
} row_t;

static void print_row(int T, const char *op, double bytes, double remote, double t, double vs, const char *wrong)
{
    char ratio[16] = "";
    if (vs > 0) snprintf(ratio, sizeof(ratio), "%.2fx", vs / t);
    printf("  %8d %-15s %13.0f %10.2f %11.3f %11.3f %7s %8s\n", T, op, bytes, t * 1e6, bytes / t / 1e9, remote / t / 1e9,
           wrong, ratio);
}

int perf_moe(moea2a_comm_t comm, const perf_opts_t *o)
{
    int rank, ep;
    moea2a_comm_rank(comm, &rank);
    moea2a_comm_size(comm, &ep);
    if (ep > 64) FAIL("moea2a_perf --moe: at most 64 ranks\n");
    if (rank == 0) {
        printf("# moea2a_perf --moe: %d ranks, %s memory, hidden %d, top-%d of %d experts, %s payload%s, skew %.2f, "
               "%d iterations (%d warm-up)\n",
               ep, o->mem, o->hidden, o->topk, o->experts, moea2a_datatype_name(o->dtype), o->weights ? " + weights" : "",
               o->skew, o->iters, o->warmup);
        printf("#\n# %8s %-15s %13s %10s %11s %11s %7s %8s\n", "tokens", "op", "bytes", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "#wrong", "vs base");
    }
    double busbw_sum = 0;
    int rows_out = 0, any_wrong = 0;
    for (int ti = 0; ti < o->ntokens; ti++) {
        int T = o->tokens[ti];
        moea2a_moe_config_t cfg = config_of(o, T);
        moea2a_moe_t moe;
        TRY(moea2a_moe_create(&moe, comm, &cfg));
        bench_t b = {rank, ep, T, o->topk, 0, (size_t)o->hidden * 2, NULL, NULL};
        for (int i = 0; i < cfg.num_payloads; i++) {
            size_t es;
            moea2a_datatype_size(cfg.payloads[i].dtype, &es);
            b.row += es * cfg.payloads[i].elems_per_token;
        }
        b.ids = malloc(sizeof(int32_t) * (size_t)(T * o->topk + 1));
        b.pay = malloc(b.row * (size_t)T + 1);
        float *w = malloc(sizeof(float) * (size_t)(T * o->topk + 1));
        uint16_t *out = malloc(b.crow * (size_t)T + 2);
        if (!b.ids || !b.pay || !w || !out) FAIL("rank %d: out of memory\n", rank);
        route(b.ids, T, o->topk, o->experts, ep, o->skew, rank, (uint64_t)ti);
        for (int i = 0; i < T * o->topk; i++) w[i] = 1.0f / (float)o->topk;
        for (int t = 0; t < T; t++)
            for (size_t h = 0; h < b.row / 2; h++) {
                uint16_t v = bf16_of_int(pay_value(rank, t, h));
                memcpy(b.pay + (size_t)t * b.row + 2 * h, &v, 2);
            }
        /* payload 0 is read as [T][its row]; NVFP4's scales are a second array */
        const void *pays[2] = {b.pay, NULL};
        if (cfg.num_payloads == 2) {
            pays[1] = malloc((size_t)T * (size_t)o->hidden / 16 + 1);
            if (!pays[1]) FAIL("rank %d: out of memory\n", rank);
            memset((void *)pays[1], 0x38, (size_t)T * (size_t)o->hidden / 16 + 1);
        }
        row_t r = {0};
        moea2a_result_t res = MOEA2A_SUCCESS;
        if (o->check) r.wrong = check_round(comm, moe, &b, o, pays, w, out, &res);
        TRY(res);
        moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        for (int i = 0; i < o->warmup + o->iters; i++) {
            double t0 = perf_now();
            TRY(moea2a_dispatch(moe, T, b.ids, w, pays, 0, &d, NULL));
            double t1 = perf_now();
            TRY(moea2a_combine(moe, NULL, out, NULL));
            double t2 = perf_now();
            if (i >= o->warmup) r.td += t1 - t0, r.tc += t2 - t1;
        }
        r.td /= o->iters, r.tc /= o->iters;
        r.bytes_d = (double)d.sent_rows * (double)b.row;
        r.remote_d = (double)(d.sent_rows - d.recv_counts[rank]) * (double)b.row;
        r.bytes_c = (double)d.total_recv * (double)b.crow;
        r.remote_c = (double)(d.total_recv - d.recv_counts[rank]) * (double)b.crow;
        if (o->baseline) {
            base_t x;
            if (base_alloc(&b, &x)) FAIL("rank %d: out of memory for the baseline\n", rank);
            memset(x.cback, 0, (size_t)ep * (size_t)T * b.crow + 1);
            for (int i = 0; i < o->warmup + o->iters; i++) {
                double t0 = perf_now();
                TRY(base_dispatch(comm, &b, o->experts, &x));
                double t1 = perf_now();
                TRY(base_combine(comm, &b, o->experts, &x));
                double t2 = perf_now();
                if (i >= o->warmup) r.bd += t1 - t0, r.bc += t2 - t1;
            }
            r.bd /= o->iters, r.bc /= o->iters;
            base_free(&x);
        }
        /* Slowest rank's times; bytes averaged over ranks; wrong values summed. */
        double td, tc, bd, bc, bytes_d, remote_d, bytes_c, remote_c, wrong, tmp;
        TRY(perf_reduce(comm, r.td, r.bytes_d, &td, &bytes_d));
        TRY(perf_reduce(comm, r.tc, r.bytes_c, &tc, &bytes_c));
        TRY(perf_reduce(comm, r.bd, r.remote_d, &bd, &remote_d));
        TRY(perf_reduce(comm, r.bc, r.remote_c, &bc, &remote_c));
        TRY(perf_reduce(comm, 0, (double)r.wrong, &tmp, &wrong));
        bytes_d /= ep, remote_d /= ep, bytes_c /= ep, remote_c /= ep;
        if (rank == 0) {
            char wcol[24] = "N/A";
            if (o->check) snprintf(wcol, sizeof(wcol), "%.0f", wrong);
            print_row(T, "dispatch", bytes_d, remote_d, td, bd, wcol);
            print_row(T, "combine", bytes_c, remote_c, tc, bc, wcol);
            print_row(T, "roundtrip", bytes_d + bytes_c, remote_d + remote_c, td + tc, bd + bc, wcol);
            if (o->baseline) {
                print_row(T, "base-dispatch", bytes_d, remote_d, bd, 0, "");
                print_row(T, "base-combine", bytes_c, remote_c, bc, 0, "");
                print_row(T, "base-roundtrip", bytes_d + bytes_c, remote_d + remote_c, bd + bc, 0, "");
            }
        }
        busbw_sum += (remote_d + remote_c) / (td + tc) / 1e9;
        rows_out++;
        any_wrong |= wrong > 0;
        if (cfg.num_payloads == 2) free((void *)pays[1]);
        free(b.ids), free(b.pay), free(w), free(out);
        TRY(moea2a_moe_destroy(moe));
    }
    if (rank == 0) {
        printf("# Out of bounds values : %d %s\n", any_wrong, any_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4f\n", rows_out ? busbw_sum / rows_out : 0.0);
    }
    return any_wrong ? 3 : 0;
}

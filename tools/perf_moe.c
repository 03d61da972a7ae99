/* moea2a_perf --moe: dispatch, combine and the round trip, one row each per token
 * count, on host or CUDA memory; with --baseline the same done the way a user would
 * without moea2a, measured in the same run: pack rows per destination, exchange
 * counts, all-to-all the packed rows (NCCL on CUDA memory); back again, then sum.
 * The baseline counts rows per destination on the device and reads the counts back
 * (what any caller must do to size an all-to-all), inside its timed region; its
 * row-ordering plan is computed once, outside it, which favours the baseline.
 *
 * Columns: "bytes" is the payload one rank moves (rows x row bytes, its own share
 * included); algbw = bytes / time; busbw = the bytes that cross to other ranks / time
 * (nccl-tests' "bus" notion for an all-to-all). Times are the slowest rank's mean,
 * measured by events on the stream around each call (a dispatch on the generic path
 * includes its count synchronization; the baseline its count read-back). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "perf_gpu.h"
#include "perf_kernel_time.h"
#include "perf_mem.h"

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
    int rank, ep, T, k, E;
    size_t row, crow, hidden; /* payload row bytes, combine row bytes, combine elements */
    int32_t *ids;             /* host */
    int32_t *nd, *dests;      /* host: destinations per token, ascending, [T][k] */
} bench_t;

static void plan_dests(bench_t *b)
{
    for (int t = 0; t < b->T; t++) {
        int *d = b->dests + (size_t)t * b->k, nd = 0;
        for (int j = 0; j < b->k; j++) {
            int r = perf_owner(b->ids[t * b->k + j], b->E, b->ep), seen = 0, i = nd;
            for (int q = 0; q < nd; q++) seen |= d[q] == r;
            if (seen) continue;
            while (i > 0 && d[i - 1] > r) d[i] = d[i - 1], i--;
            d[i] = r, nd++;
        }
        b->nd[t] = nd;
    }
}

/* ---- the baseline -------------------------------------------------------------- */

typedef struct {
    int64_t sc[64], sd[64], rc[64], rd[64], cnt_in[64], one[64], offs[64];
    int64_t rows_out, rows_in;
    int32_t *d_index, *d_pos, *d_nd; /* device (or host) copies of the plan */
    int64_t *d_counts;                /* scratch for the per-destination counts */
    unsigned char *sbuf, *rbuf, *cback, *cland;
    uint16_t *out;
} base_t;

static int base_setup(const perf_mem_t *m, const bench_t *b, base_t *x)
{
    int n = b->ep;
    memset(x, 0, sizeof(*x));
    for (int t = 0; t < b->T; t++)
        for (int i = 0; i < b->nd[t]; i++) x->sc[b->dests[(size_t)t * b->k + i]]++;
    for (int p = 0; p < n; p++) x->sd[p] = x->rows_out, x->rows_out += x->sc[p], x->one[p] = 1, x->offs[p] = p;
    int32_t *index = malloc(sizeof(int32_t) * (size_t)(x->rows_out + 1)), *pos = malloc(sizeof(int32_t) * (size_t)(b->T * b->k + 1));
    int64_t fill[64] = {0};
    for (int t = 0; t < b->T; t++)
        for (int i = 0; i < b->nd[t]; i++) {
            int dst = b->dests[(size_t)t * b->k + i];
            int64_t at = x->sd[dst] + fill[dst]++;
            index[at] = t, pos[t * b->k + i] = (int32_t)at;
        }
    x->d_index = perf_alloc(m, sizeof(int32_t) * (size_t)(x->rows_out + 1));
    x->d_pos = perf_alloc(m, sizeof(int32_t) * (size_t)(b->T * b->k + 1));
    x->d_nd = perf_alloc(m, sizeof(int32_t) * (size_t)(b->T + 1));
    x->d_counts = perf_alloc(m, sizeof(int64_t) * 64);
    size_t maxrows = (size_t)b->T * (size_t)(b->k < n ? b->k : n) + 1;
    x->sbuf = perf_alloc(m, maxrows * b->row);
    x->rbuf = perf_alloc(m, (size_t)n * (size_t)b->T * b->row + 1);
    x->cback = perf_alloc(m, (size_t)n * (size_t)b->T * b->crow + 1);
    x->cland = perf_alloc(m, maxrows * b->crow);
    x->out = perf_alloc(m, (size_t)b->T * b->crow + 2);
    int ok = index && pos && x->d_index && x->d_pos && x->d_nd && x->sbuf && x->rbuf && x->cback && x->cland && x->out;
    if (ok) {
        perf_upload(m, x->d_index, index, sizeof(int32_t) * (size_t)x->rows_out);
        perf_upload(m, x->d_pos, pos, sizeof(int32_t) * (size_t)(b->T * b->k));
        perf_upload(m, x->d_nd, b->nd, sizeof(int32_t) * (size_t)b->T);
    }
    free(index), free(pos);
    return ok ? 0 : -1;
}

static void base_free(const perf_mem_t *m, base_t *x)
{
    void *p[] = {x->d_index, x->d_pos, x->d_nd, x->d_counts, x->sbuf, x->rbuf, x->cback, x->cland, x->out};
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
        if (p[i]) perf_free(m, p[i]);
}

static moea2a_result_t base_dispatch(moea2a_comm_t comm, const perf_mem_t *m, const bench_t *b,
                                     const unsigned char *d_pay, const int32_t *d_ids, base_t *x)
{
    int n = b->ep;
    /* split sizes from the device's top-k ids, back on the host */
    perf_count_dests(m, x->sc, x->d_counts, d_ids, b->T, b->k, b->E, n);
    perf_gather_rows(m, x->sbuf, d_pay, x->d_index, x->rows_out, b->row); /* pack per destination */
    moea2a_result_t r = moea2a_alltoallv(x->sc, x->one, x->offs, x->cnt_in, x->one, x->offs, MOEA2A_INT64, comm, NULL);
    int64_t sc[64], sd[64], rc[64], rd[64];
    x->rows_in = 0;
    for (int p = 0; p < n; p++) {
        x->rc[p] = x->cnt_in[p], x->rd[p] = x->rows_in, x->rows_in += x->rc[p];
        sc[p] = x->sc[p] * (int64_t)b->row, sd[p] = x->sd[p] * (int64_t)b->row;
        rc[p] = x->rc[p] * (int64_t)b->row, rd[p] = x->rd[p] * (int64_t)b->row;
    }
    if (r == MOEA2A_SUCCESS) r = moea2a_alltoallv(x->sbuf, sc, sd, x->rbuf, rc, rd, MOEA2A_UINT8, comm, m->stream);
    if (r == MOEA2A_SUCCESS && perf_sync(m)) r = MOEA2A_ERR_CUDA;
    return r;
}

/* The expert side returns one combine row per received row; the token side sums. */
static moea2a_result_t base_combine(moea2a_comm_t comm, const perf_mem_t *m, const bench_t *b, base_t *x)
{
    int n = b->ep;
    int64_t sc[64], sd[64], rc[64], rd[64];
    for (int p = 0; p < n; p++)
        sc[p] = x->rc[p] * (int64_t)b->crow, sd[p] = x->rd[p] * (int64_t)b->crow, rc[p] = x->sc[p] * (int64_t)b->crow,
        rd[p] = x->sd[p] * (int64_t)b->crow;
    moea2a_result_t r = moea2a_alltoallv(x->cback, sc, sd, x->cland, rc, rd, MOEA2A_UINT8, comm, m->stream);
    if (r == MOEA2A_SUCCESS) perf_sum_rows(m, x->out, x->cland, x->d_pos, x->d_nd, b->T, b->k, b->hidden);
    if (r == MOEA2A_SUCCESS && perf_sync(m)) r = MOEA2A_ERR_CUDA;
    return r;
}

/* ---- --wire: quantize on dispatch, and its baseline ------------------------------------ */

static moea2a_wire_t wire_of(int wire)
{
    switch (wire) {
    case PERF_WIRE_FP8: return (moea2a_wire_t){MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, 0};
    case PERF_WIRE_FP8_UE8M0: return (moea2a_wire_t){MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, MOEA2A_FP8_UE8M0};
    case PERF_WIRE_NVFP4: return (moea2a_wire_t){MOEA2A_WIRE_NVFP4, MOEA2A_SF_128X4, 0};
    default: return (moea2a_wire_t){MOEA2A_WIRE_AS_IS, 0, 0};
    }
}

/* A token's codes and its scales as the standalone calls write one row (row-major /
 * linear): what travels. */
static size_t wire_code_row(int wire, size_t hidden) { return wire == PERF_WIRE_NVFP4 ? hidden / 2 : hidden; }
static size_t wire_scale_row(int wire, size_t hidden)
{
    if (wire == PERF_WIRE_NVFP4) return hidden / 16;
    return 4 * (wire == PERF_WIRE_FP8_UE8M0 ? (hidden / 128 + 3) / 4 : hidden / 128);
}

/* n bf16 rows quantized with the standalone calls (row-major / linear scales); g: the
 * NVFP4 global scale, computed into *g (in the memory of the call). */
static moea2a_result_t wire_quantize(int wire, const void *x, size_t n, size_t hidden, float *g, void *q, void *s,
                                     void *stream)
{
    if (wire != PERF_WIRE_NVFP4)
        return moea2a_fp8_quantize(x, MOEA2A_BFLOAT16, n, hidden, q, s, MOEA2A_FP8_SCALES_ROW_MAJOR,
                                   wire == PERF_WIRE_FP8_UE8M0 ? MOEA2A_FP8_UE8M0 : 0, stream);
    moea2a_result_t r = moea2a_fp4_global_scale(x, MOEA2A_BFLOAT16, n * hidden, g, stream);
    return r ? r : moea2a_fp4_quantize(x, MOEA2A_BFLOAT16, n, hidden, g, q, s, MOEA2A_SF_LINEAR, stream);
}

/* The baseline of --wire: the caller quantizes its T rows with the standalone calls,
 * then dispatches codes and scales as plain payloads on a dispatch-only context (and,
 * for NVFP4, shares the global scales: an allgather of ep floats). *t: the mean time
 * of the pair over iters calls, after the warm-up. */
static int wire_baseline(moea2a_comm_t comm, perf_mem_t *m, const perf_opts_t *o, int T, const void *d_pay,
                         const int32_t *d_ids, const float *d_w, int iters, double *t)
{
    int ep;
    moea2a_comm_size(comm, &ep);
    size_t hidden = (size_t)o->hidden, cr = wire_code_row(o->wire, hidden), sr = wire_scale_row(o->wire, hidden);
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = o->experts, c.top_k = o->topk, c.max_tokens_per_rank = T > 0 ? T : 1, c.num_payloads = 2;
    c.payloads[0] = (moea2a_payload_desc_t){MOEA2A_UINT8, cr};
    c.payloads[1] = (moea2a_payload_desc_t){MOEA2A_UINT8, sr};
    c.memory = m->cuda ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    if (o->weights) c.flags |= MOEA2A_MOE_CARRY_WEIGHTS;
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &c)) return 1;
    void *q = perf_alloc(m, cr * (size_t)T + 16), *s = perf_alloc(m, sr * (size_t)T + 16);
    float *g = perf_alloc(m, 4), *gall = perf_alloc(m, 4 * (size_t)ep);
    int rc = !q || !s || !g || !gall;
    const void *pays[2] = {q, s};
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    *t = 0;
    for (int i = 0; !rc && i < o->warmup + iters; i++) {
        perf_mark(m, 0);
        rc = wire_quantize(o->wire, d_pay, (size_t)T, hidden, g, q, s, m->stream) != MOEA2A_SUCCESS;
        if (!rc && o->wire == PERF_WIRE_NVFP4) rc = moea2a_allgather(g, gall, 4, MOEA2A_UINT8, comm, m->stream) != MOEA2A_SUCCESS;
        if (!rc) rc = moea2a_dispatch(moe, T, d_ids, d_w, pays, 0, &d, m->stream) != MOEA2A_SUCCESS;
        perf_mark(m, 1);
        if (i >= o->warmup) *t += perf_span(m, 0, 1);
    }
    *t /= iters;
    if (perf_sync(m)) rc = 1;
    perf_free(m, q), perf_free(m, s), perf_free(m, g), perf_free(m, gall);
    moea2a_moe_destroy(moe);
    return rc;
}

/* ---- moea2a ---------------------------------------------------------------------- */

static moea2a_moe_config_t config_of(const perf_opts_t *o, int T, int cuda)
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
    c.wire[0] = wire_of(o->wire);
    if (o->combine_wire)
        c.combine_wire = (moea2a_wire_t){MOEA2A_WIRE_FP8, 0, o->combine_wire == 2 ? MOEA2A_FP8_UE8M0 : 0u};
    if (o->expert_align) c.layout = MOEA2A_LAYOUT_EXPERT_MAJOR, c.expert_alignment = o->expert_align;
    c.hidden = (size_t)o->hidden, c.combine_dtype = MOEA2A_BFLOAT16;
    c.memory = cuda ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    if (o->weights) c.flags |= MOEA2A_MOE_CARRY_WEIGHTS;
    if (o->copy_engine) c.flags |= MOEA2A_MOE_COPY_ENGINE;
    if (o->general) c.flags |= MOEA2A_MOE_GENERAL_PLACEMENT;
    return c;
}

/* --wire: the codes of received row (src, t) against the standalone quantization of
 * what that source sent (NVFP4 with the global scale it computed over its T rows,
 * which must arrive in payload_global_scales too). Returns the codes that differ. */
static long check_wire_row(const perf_opts_t *o, const bench_t *b, int src, int t, const unsigned char *got,
                           float got_g)
{
    size_t hidden = b->hidden, cr = wire_code_row(o->wire, hidden), sr = wire_scale_row(o->wire, hidden);
    uint16_t *row = malloc(2 * hidden * (size_t)(o->wire == PERF_WIRE_NVFP4 ? b->T : 1));
    unsigned char *q = malloc(cr), *s = malloc(sr);
    long wrong = 0;
    float g = 1.0f;
    if (!row || !q || !s) return (long)cr;
    if (o->wire == PERF_WIRE_NVFP4) { /* the source's global scale, over all its rows */
        for (int u = 0; u < b->T; u++)
            for (size_t h = 0; h < hidden; h++) row[(size_t)u * hidden + h] = bf16_of_int(pay_value(src, u, h));
        moea2a_fp4_global_scale(row, MOEA2A_BFLOAT16, (size_t)b->T * hidden, &g, NULL);
        wrong += memcmp(&g, &got_g, 4) != 0;
        memmove(row, row + (size_t)t * hidden, 2 * hidden);
    } else {
        for (size_t h = 0; h < hidden; h++) row[h] = bf16_of_int(pay_value(src, t, h));
    }
    wire_quantize(o->wire, row, 1, hidden, &g, q, s, NULL);
    for (size_t i = 0; i < cr; i++) wrong += q[i] != got[i];
    free(row), free(q), free(s);
    return wrong;
}

/* The expert-major rows of a dispatch: on CUDA memory the host is not told (-1), the
 * last offset on the device holds them. */
static int64_t expert_rows_of(const perf_mem_t *m, const moea2a_dispatch_result_t *d)
{
    if (d->expert_rows >= 0 || !d->expert_offsets) return d->expert_rows;
    int32_t rows = 0;
    perf_sync(m);
    perf_download(m, &rows, d->expert_offsets + d->num_local_experts, 4);
    return rows;
}

/* --combine-wire: twice the error bound of moea2a_moe(3), "FP8 combine", of element h
 * of token t (exact sum `sum`): per row max(2^-4 |v|, 2^-10 s), s its block's scale,
 * doubled for the partials across nodes, plus bf16's rounding. */
static double fp8_combine_bound(const bench_t *b, const perf_opts_t *o, int t, size_t h, int sum)
{
    double rows = 0, mag = fabs((double)sum);
    for (int i = 0; i < b->nd[t]; i++) {
        const int dest = b->dests[(size_t)t * b->k + i];
        double amax = 1e-4;
        for (size_t x = h / 128 * 128; x < h / 128 * 128 + 128; x++)
            amax = fmax(amax, fabs((double)ret_value(b->rank, t, dest, x)));
        double s = amax / 448.0, v = fabs((double)ret_value(b->rank, t, dest, h));
        if (o->combine_wire == 2) s = ldexp(1.0, (int)ceil(log2(s)));
        rows += fmax(ldexp(v, -4), ldexp(s, -10)), mag += v;
    }
    return 2 * rows + ldexp(mag + 2 * rows, -8);
}

/* One dispatch + combine checked exactly (results read back to the host); returns
 * wrong elements on this rank. */
static long check_round(moea2a_moe_t moe, const perf_mem_t *m, const bench_t *b, const perf_opts_t *o,
                        const void *const *pays, const int32_t *d_ids, const float *d_w, void *d_out,
                        moea2a_result_t *res)
{
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    long wrong = 0;
    if ((*res = moea2a_dispatch(moe, b->T, d_ids, d_w, pays, 0, &d, m->stream))) return 0;
    size_t slots = (size_t)b->ep * (size_t)d.stride, hidden = b->hidden;
    int32_t *counts = malloc(4 * (size_t)b->ep), *src = malloc(4 * slots + 4);
    unsigned char *got = malloc(slots * d.payload_row_bytes[0] + 1);
    uint16_t *rows = calloc(slots * hidden + 1, 2), *out = malloc(b->crow * (size_t)b->T + 2);
    if (!counts || !src || !got || !rows || !out) {
        *res = MOEA2A_ERR_NO_MEMORY;
        return 0;
    }
    perf_download(m, counts, d.recv_counts, 4 * (size_t)b->ep);
    perf_download(m, src, d.src_token_index, 4 * slots);
    perf_download(m, got, d.payloads[0], slots * d.payload_row_bytes[0]);
    int bf16 = o->dtype == MOEA2A_BFLOAT16 && !o->wire;
    float *g = calloc((size_t)b->ep, sizeof(float));
    if (!g) {
        *res = MOEA2A_ERR_NO_MEMORY;
        return 0;
    }
    if (d.payload_global_scales[0]) perf_download(m, g, d.payload_global_scales[0], 4 * (size_t)b->ep);
    for (int q = 0; q < b->ep; q++)
        for (int i = 0; i < counts[q]; i++) {
            size_t slot = (size_t)q * (size_t)d.stride + (size_t)i;
            int t = src[slot];
            for (size_t h = 0; bf16 && h < hidden; h++) {
                uint16_t v;
                memcpy(&v, got + slot * d.payload_row_bytes[0] + 2 * h, 2);
                wrong += v != bf16_of_int(pay_value(q, t, h));
            }
            if (o->wire && i < 4) /* the first rows of each source: quantizing on the host is slow */
                wrong += check_wire_row(o, b, q, t, got + slot * d.payload_row_bytes[0], g[q]);
            for (size_t h = 0; h < hidden; h++) rows[slot * hidden + h] = bf16_of_int(ret_value(q, t, b->rank, h));
        }
    void *cbuf;
    moea2a_moe_combine_buffer(moe, &cbuf);
    int64_t expert_rows = o->expert_align ? expert_rows_of(m, &d) : -1;
    if (expert_rows >= 0) { /* one row per expert row: the token's value on its first, 0 after */
        size_t er = (size_t)expert_rows;
        int32_t *xr = malloc(4 * er + 4), *xt = malloc(4 * er + 4);
        unsigned char *seen = calloc(slots + (size_t)b->ep * (size_t)b->T + 1, 1);
        uint16_t *xrows = calloc(er * hidden + 1, 2);
        if (!xr || !xt || !seen || !xrows) {
            *res = MOEA2A_ERR_NO_MEMORY;
            return 0;
        }
        perf_download(m, xr, d.expert_src_rank, 4 * er);
        perf_download(m, xt, d.expert_src_token, 4 * er);
        for (size_t x = 0; x < er; x++) {
            if (xr[x] < 0 || seen[(size_t)xr[x] * (size_t)b->T + (size_t)xt[x]]++) continue;
            for (size_t h = 0; h < hidden; h++) xrows[x * hidden + h] = bf16_of_int(ret_value(xr[x], xt[x], b->rank, h));
        }
        perf_upload(m, cbuf, xrows, er * hidden * 2);
        free(xr), free(xt), free(seen), free(xrows);
    } else {
        perf_upload(m, cbuf, rows, slots * hidden * 2);
    }
    if (!(*res = moea2a_combine(moe, NULL, d_out, m->stream))) {
        perf_download(m, out, d_out, b->crow * (size_t)b->T);
        for (int t = 0; t < b->T; t++)
            for (size_t h = 0; h < hidden; h++) {
                int sum = 0;
                for (int i = 0; i < b->nd[t]; i++) sum += ret_value(b->rank, t, b->dests[(size_t)t * b->k + i], h);
                const uint16_t got = out[(size_t)t * hidden + h];
                if (!o->combine_wire) {
                    wrong += got != bf16_of_int(sum);
                    continue;
                }
                uint32_t u = (uint32_t)got << 16;
                float f;
                memcpy(&f, &u, 4);
                wrong += fabs((double)f - sum) > fp8_combine_bound(b, o, t, h, sum);
            }
    }
    free(counts), free(src), free(got), free(rows), free(out), free(g);
    return wrong;
}

typedef struct {
    double td, tc, bd, bc; /* dispatch, combine, baseline dispatch, baseline combine (s) */
    double tp;             /* dispatch + combine back to back, no event between them (s) */
    double hd, hc;         /* the host's time in each call of those pairs (s): where it exceeds the
                              GPU's time per call, the GPU waits for the launches */
    double tg;             /* one round trip of a CUDA graph of iters round trips (s); 0: none */
    double kd, kc;         /* kernel time of each call: first start to last end of its GPU work (s; 0: none) */
    double ka;             /* kernel time of one round trip as a CUDA graph replayed alone (s; 0: none) */
    char parts[2][600];    /* --kernels: this rank's GPU work of a dispatch call and of a combine call */
    double qd;             /* --wire --baseline: quantize with the standalone calls, then dispatch (s) */
    double sd, sc;         /* --split: each call as its two halves, back to back (s) */
    double gemm, ovl[2];   /* --split: the GEMM alone; a round trip overlapped with two GEMMs launched
                              between the halves / after them (s) */
    int gemm_m, gemm_sms;  /* the GEMM's M (N = K = 4096; 0: none) and its SM target */
    double bytes_d, remote_d, bytes_c, remote_c;
    long wrong;
} row_t;

/* "rank-": the rank-major rows printed next to --layout expert's (a thread's own: with
 * --threads every rank sets it) */
static __thread const char *row_tag = "";

/* --layout expert: what the expert-major run of a size measured, for the line that sets
 * it against the rank-major run of the same size (the bound it is held to: rank-major time + 1.25 x
 * the extra local bytes / the copy bandwidth measured in the same run) */
static struct {
    double td, tc, extra_d, extra_c, rows, pairs, recv;
} expert_run;

/* The copy bandwidth of this rank's memory (GB/s, bytes read + written), measured once
 * per run: perf_copy of 256 MiB (memcpy on the host, device to device on the GPU),
 * the mean of 5 after each buffer is written once. */
static double copy_gbs(perf_mem_t *m)
{
    static double bw = -1;
    if (bw >= 0) return bw;
    size_t bytes = (size_t)256 << 20;
    void *a = perf_alloc(m, bytes), *b = perf_alloc(m, bytes);
    bw = 0;
    if (a && b) {
        perf_copy(m, a, b, bytes); /* both written once: fresh host pages would read as the zero page */
        perf_copy(m, b, a, bytes);
        perf_mark(m, 0);
        for (int i = 0; i < 5; i++) perf_copy(m, b, a, bytes);
        perf_mark(m, 1);
        double t = perf_span(m, 0, 1) / 5;
        bw = t > 0 ? 2.0 * (double)bytes / t / 1e9 : 0;
    }
    if (a) perf_free(m, a);
    if (b) perf_free(m, b);
    return bw;
}

static void print_row(int T, const char *op_in, double bytes, double remote, double t, double vs, const char *wrong)
{
    char ratio[16] = "", op[40];
    snprintf(op, sizeof(op), "%s%s", row_tag, op_in);
    if (vs > 0) snprintf(ratio, sizeof(ratio), "%.2fx", vs / t);
    printf("  %8d %-20s %13.0f %10.2f %11.3f %11.3f %7s %8s\n", T, op, bytes, t * 1e6, bytes / t / 1e9, remote / t / 1e9,
           wrong, ratio);
}

/* pairs round trips captured in one CUDA graph; NULL when the capture failed, with the
 * calls' result in *r. */
static void *capture_pairs(moea2a_moe_t moe, perf_mem_t *m, int pairs, int T, const int32_t *ids, const float *w,
                           const void *const *pays, void *out, moea2a_result_t *r)
{
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    *r = MOEA2A_SUCCESS;
    if (perf_graph_begin(m->stream)) return NULL;
    for (int i = 0; i < pairs && !*r; i++) {
        *r = moea2a_dispatch(moe, T, ids, w, pays, 0, &d, m->stream);
        if (!*r) *r = moea2a_combine(moe, NULL, out, m->stream);
    }
    return perf_graph_end(m->stream);
}

/* iters round trips captured in one CUDA graph (load/store path: nothing waits on the
 * host), launched once untimed, then timed: the kernels back to back, without a
 * launch gap between calls, as peers' benchmarks report them. 0 when capture fails. */
static double graph_time(moea2a_moe_t moe, perf_mem_t *m, int iters, int T, const int32_t *ids, const float *w,
                         const void *const *pays, void *out)
{
    moea2a_result_t r;
    void *g = capture_pairs(moe, m, iters, T, ids, w, pays, out, &r);
    double t = 0;
    if (g && !r && !perf_graph_launch(g, m->stream) && !perf_sync(m)) {
        perf_mark(m, 0);
        perf_graph_launch(g, m->stream);
        perf_mark(m, 1);
        t = perf_span(m, 0, 1) / iters;
    }
    perf_graph_free(g);
    return perf_sync(m) || moea2a_moe_status(moe) ? 0 : t;
}

/* One round trip through the split halves; with gemm, a GEMM on the second stream
 * (joined before the next call) during each call, as the other micro-batch's expert
 * GEMM of a two-batch overlap: launched between the halves (after the send half), or
 * with concurrent set after both halves, so that it takes only the SMs they leave. */
static moea2a_result_t split_round(moea2a_moe_t moe, perf_mem_t *m, int T, const int32_t *ids, const float *w,
                                   const void *const *pays, void *out, perf_gemm_t *gemm, void *s2, int concurrent,
                                   int mark)
{
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    if (gemm) perf_stream_after(s2, m->stream);
    moea2a_result_t r = moea2a_dispatch_send(moe, T, ids, w, pays, 0, m->stream);
    if (gemm && !concurrent) perf_gemm_run(gemm);
    if (!r) r = moea2a_dispatch_recv(moe, &d, m->stream);
    if (gemm && concurrent) perf_gemm_run(gemm);
    if (gemm) perf_stream_after(m->stream, s2), perf_stream_after(s2, m->stream);
    if (mark >= 0) perf_mark(m, mark);
    if (!r) r = moea2a_combine_send(moe, NULL, m->stream);
    if (gemm && !concurrent) perf_gemm_run(gemm);
    if (!r) r = moea2a_combine_recv(moe, out, m->stream);
    if (gemm && concurrent) perf_gemm_run(gemm);
    if (gemm) perf_stream_after(m->stream, s2);
    return r;
}

/* --split: the halves back to back (r->sd, r->sc), then a GEMM sized to half the
 * exchange and the round trip overlapped with two of them (r->gemm, r->ovl). */
static int split_times(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, int iters, int T, const int32_t *ids,
                       const float *w, const void *const *pays, void *out, int sms, row_t *r)
{
    int rank;
    moea2a_comm_rank(comm, &rank);
    for (int i = 0; i < iters; i++) {
        perf_mark(m, 3 * i);
        TRY(split_round(moe, m, T, ids, w, pays, out, NULL, NULL, 0, 3 * i + 1));
        perf_mark(m, 3 * i + 2);
    }
    for (int i = 0; i < iters; i++) r->sd += perf_span(m, 3 * i, 3 * i + 1), r->sc += perf_span(m, 3 * i + 1, 3 * i + 2);
    r->sd /= iters, r->sc /= iters;
    if (!m->cuda) return 0;
    void *s2 = perf_stream_new();
    char why[128] = "";
    int M = 4096;
    /* the GEMM gets the SMs the collective does not hold (num_sms, else the variable, else the default) */
    const char *env = getenv("MOEA2A_NUM_SMS");
    int ep = 1;
    moea2a_comm_size(comm, &ep);
    int held = sms ? sms : env && atoi(env) > 0 ? atoi(env) : MOEA2A_MOE_DEFAULT_SMS(ep), free_sms = perf_device_sms() - held;
    r->gemm_sms = free_sms > 0 ? free_sms : 0;
    perf_gemm_t *g = s2 ? perf_gemm_open(s2, M, 4096, 4096, r->gemm_sms, why, sizeof(why)) : NULL;
    for (int pass = 0; g && pass < 2; pass++) { /* time it; resize it once to half the exchange */
        for (int i = 0; i < 3; i++) perf_gemm_run(g);
        perf_stream_after(m->stream, s2);
        perf_mark(m, 0);
        for (int i = 0; i < 10; i++) perf_stream_after(s2, m->stream), perf_gemm_run(g), perf_stream_after(m->stream, s2);
        perf_mark(m, 1);
        r->gemm = perf_span(m, 0, 1) / 10;
        if (pass) break;
        int want = (int)((double)M * (r->sd + r->sc) / 2 / r->gemm / 64 + 0.5) * 64;
        perf_gemm_close(g);
        M = want < 64 ? 64 : want;
        g = perf_gemm_open(s2, M, 4096, 4096, r->gemm_sms, why, sizeof(why));
    }
    if (!g) {
        if (rank == 0) printf("#   overlap: not measured: %s\n", s2 ? why : "no second stream");
        perf_stream_free(s2);
        r->gemm = 0;
        return 0;
    }
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < 3; i++) TRY(split_round(moe, m, T, ids, w, pays, out, g, s2, c, -1));
        perf_mark(m, 0);
        for (int i = 0; i < iters; i++) TRY(split_round(moe, m, T, ids, w, pays, out, g, s2, c, -1));
        perf_mark(m, 1);
        r->ovl[c] = perf_span(m, 0, 1) / iters;
    }
    r->gemm_m = M;
    perf_gemm_close(g);
    perf_stream_free(s2);
    if (perf_sync(m) || moea2a_moe_status(moe)) FAIL("rank %d: %s\n", rank, moea2a_last_error(comm));
    return 0;
}

/* One size's inputs: the routing and rows on the host, and their copies where the
 * benchmark runs (host or this rank's GPU). */
typedef struct {
    float *w;
    unsigned char *pay;
    int32_t *d_ids;
    float *d_w;
    unsigned char *d_pay, *d_scales;
    void *d_out;
    const void *pays[2];
} inputs_t;

static void inputs_free(perf_mem_t *m, bench_t *b, inputs_t *in)
{
    if (in->d_ids) perf_free(m, in->d_ids);
    if (in->d_w) perf_free(m, in->d_w);
    if (in->d_pay) perf_free(m, in->d_pay);
    if (in->d_out) perf_free(m, in->d_out);
    if (in->d_scales) perf_free(m, in->d_scales);
    free(b->ids), free(b->nd), free(b->dests), free(in->w), free(in->pay);
}

/* b's routing (token count ti's seed) and payload rows of known values, and their
 * copies where the benchmark runs; an NVFP4 payload's scales as a second payload. */
static int inputs_make(const moea2a_moe_config_t *cfg, perf_mem_t *m, const perf_opts_t *o, int ti, bench_t *b,
                       inputs_t *in)
{
    int rank = b->rank, T = b->T, pairs = T * o->topk;
    memset(in, 0, sizeof(*in));
    b->ids = malloc(sizeof(int32_t) * (size_t)(pairs + 1));
    b->nd = malloc(sizeof(int32_t) * (size_t)(T + 1));
    b->dests = malloc(sizeof(int32_t) * (size_t)(pairs + 1));
    in->w = malloc(sizeof(float) * (size_t)(pairs + 1));
    in->pay = malloc(b->row * (size_t)T + 2);
    if (!b->ids || !b->nd || !b->dests || !in->w || !in->pay) FAIL("rank %d: out of memory\n", rank);
    route(b->ids, T, o->topk, o->experts, b->ep, o->skew, rank, (uint64_t)ti);
    plan_dests(b);
    for (int i = 0; i < pairs; i++) in->w[i] = 1.0f / (float)o->topk;
    for (int t = 0; t < T; t++)
        for (size_t h = 0; h < b->row / 2; h++) {
            uint16_t v = bf16_of_int(pay_value(rank, t, h));
            memcpy(in->pay + (size_t)t * b->row + 2 * h, &v, 2);
        }
    in->d_ids = perf_alloc(m, sizeof(int32_t) * (size_t)(pairs + 1));
    in->d_w = perf_alloc(m, sizeof(float) * (size_t)(pairs + 1));
    in->d_pay = perf_alloc(m, b->row * (size_t)T + 2);
    in->d_out = perf_alloc(m, b->crow * (size_t)T + 2);
    if (!in->d_ids || !in->d_w || !in->d_pay || !in->d_out) FAIL("rank %d: out of memory for inputs\n", rank);
    perf_upload(m, in->d_ids, b->ids, sizeof(int32_t) * (size_t)pairs);
    perf_upload(m, in->d_w, in->w, sizeof(float) * (size_t)pairs);
    perf_upload(m, in->d_pay, in->pay, b->row * (size_t)T);
    in->pays[0] = in->d_pay;
    if (cfg->num_payloads == 2) { /* NVFP4 scales: their own array */
        size_t sb = (size_t)T * (size_t)o->hidden / 16 + 1;
        unsigned char *tmp = malloc(sb);
        in->d_scales = perf_alloc(m, sb);
        if (!tmp || !in->d_scales) {
            free(tmp);
            FAIL("rank %d: out of memory for scales\n", rank);
        }
        memset(tmp, 0x38, sb);
        perf_upload(m, in->d_scales, tmp, sb);
        free(tmp);
        in->pays[1] = in->d_scales;
    }
    return 0;
}

/* Kernel-time tags: the call's kind in the high bits, the iteration in the low ones */
enum { KT_DISPATCH = 1, KT_COMBINE = 2, KT_ALONE = 3 };
#define KT_TAG(kind, i) ((uint64_t)(kind) << 32 | (uint64_t)(i))

/* The mean span of iters tagged calls of one kind; 0 when any of them has no record. */
static double kt_mean(int kind, int iters)
{
    double sum = 0;
    for (int i = 0; i < iters; i++) {
        double t = perf_kt_span(KT_TAG(kind, i));
        if (t <= 0) return 0;
        sum += t;
    }
    return sum / iters;
}

/* --kernels: the GPU work of iters tagged calls of one kind, "name start+duration" per
 * piece in µs (the first KT_PARTS pieces), means over the calls whose pieces have the
 * names of the first call's. */
#define KT_PARTS 16
static void kt_list(int kind, int iters, char *out, size_t len)
{
    perf_kt_part_t first[KT_PARTS], p[KT_PARTS];
    double start[KT_PARTS] = {0}, dur[KT_PARTS] = {0};
    int n = perf_kt_parts(KT_TAG(kind, 0), first, KT_PARTS), calls = 0;
    if (n > KT_PARTS) n = KT_PARTS;
    for (int i = 0; i < iters; i++) {
        int got = perf_kt_parts(KT_TAG(kind, i), p, KT_PARTS), same = (got < KT_PARTS ? got : KT_PARTS) == n;
        for (int j = 0; same && j < n; j++) same = !strcmp(p[j].name, first[j].name);
        for (int j = 0; same && j < n; j++) start[j] += p[j].start, dur[j] += p[j].dur;
        calls += same;
    }
    size_t at = (size_t)snprintf(out, len, "%d of %d calls alike:", calls, iters);
    for (int j = 0; calls && j < n && at < len; j++)
        at += (size_t)snprintf(out + at, len - at, " %s %.2f+%.2f", first[j].name, start[j] / calls * 1e6,
                               dur[j] / calls * 1e6);
}

/* The gated loops hold at most this many pairs: the launch queue must take them all
 * while the gate holds the stream (the host would wait on a full queue forever). */
#define KT_MAX_GATED 64

/* Agrees on a moment a millisecond from now on every rank (the latest rank's clock
 * reading + 1 ms) and waits for it: the ranks of one host leave together (one
 * monotonic clock); across hosts the skew of one exchange over the communicator stays. */
static moea2a_result_t meet(moea2a_comm_t comm)
{
    double deadline = 0, sum;
    moea2a_result_t r = perf_reduce(comm, perf_now() + 1e-3, 0, &deadline, &sum);
    while (!r && perf_now() < deadline) {
    }
    return r;
}

/* One round trip captured as a CUDA graph and replayed iters times alone: each replay
 * enqueued behind a closed gate once the stream is idle, the gate opened on every rank
 * at one moment, so that its span holds no earlier call's tail, no launch latency and
 * no peer's late start. Nothing recorded when the pair cannot be captured. */
static moea2a_result_t alone_replays(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, perf_gate_t *gate,
                                     int iters, int T, const inputs_t *in)
{
    moea2a_result_t r;
    void *g = capture_pairs(moe, m, 1, T, in->d_ids, in->d_w, in->pays, in->d_out, &r);
    double none = 0, sum;
    if (!r) r = perf_reduce(comm, g ? 0 : 1, 0, &none, &sum); /* every rank replays, or none */
    if (!g || r || none > 0) {
        perf_graph_free(g);
        return r;
    }
    for (int i = 0; i < iters && !r; i++) {
        if (perf_sync(m) || perf_gate_close(gate, m->stream)) r = MOEA2A_ERR_CUDA;
        perf_kt_tag(KT_TAG(KT_ALONE, i));
        if (!r && perf_graph_launch(g, m->stream)) r = MOEA2A_ERR_CUDA;
        perf_kt_untag();
        moea2a_result_t met = meet(comm); /* the gate opens even when the launch failed */
        perf_gate_open(gate);
        if (!r) r = met;
    }
    if (perf_sync(m) && !r) r = MOEA2A_ERR_CUDA;
    perf_graph_free(g);
    return r;
}

/* iters dispatch + combine pairs, each call tagged; with a gate, all enqueued behind it
 * and released on every rank at one moment, after one untagged pair that takes up what
 * skew remains: the GPU then runs them back to back, never waiting for the host. */
static moea2a_result_t tagged_pairs(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, perf_gate_t *gate,
                                    int iters, int T, const inputs_t *in, moea2a_dispatch_result_t *d)
{
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (gate && perf_gate_close(gate, m->stream)) return MOEA2A_ERR_CUDA;
    for (int i = gate ? -1 : 0; i < iters && !r; i++) {
        if (i >= 0) perf_kt_tag(KT_TAG(KT_DISPATCH, i));
        r = moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, d, m->stream);
        if (i >= 0) perf_kt_untag();
        if (i >= 0) perf_kt_tag(KT_TAG(KT_COMBINE, i));
        if (!r) r = moea2a_combine(moe, NULL, in->d_out, m->stream);
        if (i >= 0) perf_kt_untag();
    }
    if (gate) {
        moea2a_result_t met = meet(comm);
        perf_gate_open(gate);
        if (!r) r = met;
    }
    if (perf_sync(m) && !r) r = MOEA2A_ERR_CUDA;
    return r;
}

/* The kernel times (perf_kernel_time.h) of back-to-back round trips, each call tagged,
 * and, where a round trip can be a CUDA graph (no host synchronization inside the calls,
 * so the gate cannot hold what the host waits for), of its replays alone. Without CUPTI
 * the reason is printed once and the rows are left out. */
static int kernel_times(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, int iters, int T, const inputs_t *in,
                        moea2a_dispatch_result_t *d, int graph, int kernels, row_t *r)
{
    static int said;
    int rank;
    char why[1400] = "";
    moea2a_comm_rank(comm, &rank);
    perf_gate_t *gate = NULL;
    int unable = perf_kt_open(why, sizeof(why)) != 0;
    if (!unable && graph && !(gate = perf_gate_new())) unable = 1, snprintf(why, sizeof(why), "no mapped host memory");
    if (!unable && perf_kt_begin()) unable = 1, snprintf(why, sizeof(why), "CUPTI refused to record");
    /* the loops below meet over the communicator: every rank takes them, or none */
    double any = 0, sum;
    TRY(perf_reduce(comm, unable, 0, &any, &sum));
    if (any > 0) {
        if (!unable) perf_kt_end();
        perf_gate_free(gate);
        if (rank == 0 && !said++) printf("#   no kernel times: %s\n", unable ? why : "a rank could not take them");
        return 0;
    }
    if (gate && iters > KT_MAX_GATED) iters = KT_MAX_GATED;
    /* a first pair with tracing on, untimed: the tracer's own set-up stays out */
    moea2a_result_t res = moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, d, m->stream);
    if (!res) res = moea2a_combine(moe, NULL, in->d_out, m->stream);
    if (perf_sync(m) && !res) res = MOEA2A_ERR_CUDA;
    if (!res) res = tagged_pairs(comm, moe, m, gate, iters, T, in, d);
    if (!res && gate) res = alone_replays(comm, moe, m, gate, iters, T, in);
    int ended = perf_kt_end();
    perf_gate_free(gate);
    if (res || moea2a_moe_status(moe)) FAIL("rank %d: the kernel-timed calls: %s\n", rank, moea2a_last_error(comm));
    if (!ended) r->kd = kt_mean(KT_DISPATCH, iters), r->kc = kt_mean(KT_COMBINE, iters);
    if (!ended && kernels) {
        kt_list(KT_DISPATCH, iters, r->parts[0], sizeof(r->parts[0]));
        kt_list(KT_COMBINE, iters, r->parts[1], sizeof(r->parts[1]));
    }
    if (!ended && gate) r->ka = kt_mean(KT_ALONE, iters);
    return 0;
}

/* The timed calls: dispatch and combine back to back on the stream, as an application
 * issues them, with events between them timing each one (up to 255 timed pairs); the
 * same pairs with no event between the calls (what an application sees: the events add
 * to each call's time) and the host's time in each call; one CUDA graph of them; with
 * --split, the halves. d: the last dispatch's result. */
static int time_calls(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, const perf_opts_t *o, int T, int sms,
                      const inputs_t *in, moea2a_dispatch_result_t *d, row_t *r)
{
    int rank;
    moea2a_comm_rank(comm, &rank);
    int iters = o->iters < (PERF_MARKS - 1) / 2 ? o->iters : (PERF_MARKS - 1) / 2;
    for (int i = 0; i < o->warmup; i++) {
        TRY(moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, d, m->stream));
        TRY(moea2a_combine(moe, NULL, in->d_out, m->stream));
    }
    for (int i = 0; i < iters; i++) {
        perf_mark(m, 2 * i);
        TRY(moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, d, m->stream));
        perf_mark(m, 2 * i + 1);
        TRY(moea2a_combine(moe, NULL, in->d_out, m->stream));
    }
    perf_mark(m, 2 * iters);
    for (int i = 0; i < iters; i++) r->td += perf_span(m, 2 * i, 2 * i + 1), r->tc += perf_span(m, 2 * i + 1, 2 * i + 2);
    if (perf_sync(m) || moea2a_moe_status(moe)) FAIL("rank %d: %s\n", rank, moea2a_last_error(comm));
    r->td /= iters, r->tc /= iters;
    perf_mark(m, 0);
    for (int i = 0; i < iters; i++) {
        double h0 = perf_now();
        TRY(moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, d, m->stream));
        double h1 = perf_now();
        TRY(moea2a_combine(moe, NULL, in->d_out, m->stream));
        r->hd += h1 - h0, r->hc += perf_now() - h1;
    }
    perf_mark(m, 1);
    r->tp = perf_span(m, 0, 1) / iters;
    r->hd /= iters, r->hc /= iters;
    if (perf_sync(m) || moea2a_moe_status(moe)) FAIL("rank %d: %s\n", rank, moea2a_last_error(comm));
    int graph = m->cuda && d->nvlink && !o->copy_engine;
    if (graph) r->tg = graph_time(moe, m, iters, T, in->d_ids, in->d_w, in->pays, in->d_out);
    if (m->cuda && o->kernel_times && kernel_times(comm, moe, m, iters, T, in, d, graph, o->kernels, r)) return 1;
    if (o->split && split_times(comm, moe, m, iters < PERF_MARKS / 3 ? iters : PERF_MARKS / 3, T, in->d_ids, in->d_w,
                                in->pays, in->d_out, sms, r))
        return 1;
    return 0;
}

/* The bytes the last dispatch and combine moved (all, and those to other ranks), from
 * the dispatch's result; with --layout expert, the rows the expert-major pass adds
 * (for the line that sets it against the rank-major run of the same size). */
static int count_bytes(moea2a_comm_t comm, perf_mem_t *m, const perf_opts_t *o, const bench_t *b, int num_payloads,
                       moea2a_dispatch_result_t *d, row_t *r)
{
    int rank = b->rank, ep = b->ep;
    size_t total_row = b->row + (num_payloads == 2 ? (size_t)o->hidden / 16 : 0);
    if (o->wire) /* what travels: codes, scales [, the global scale] */
        total_row = wire_code_row(o->wire, b->hidden) + wire_scale_row(o->wire, b->hidden) +
                    (o->wire == PERF_WIRE_NVFP4 ? 4 : 0);
    int32_t self_rows = 0;
    if (d->device_stats) { /* the load/store path keeps its counts on the device */
        int64_t st[4];
        perf_download(m, st, d->device_stats, sizeof(st));
        d->total_recv = st[0], d->sent_rows = st[2];
    }
    if (m->cuda) perf_download(m, &self_rows, d->recv_counts + rank, 4);
    else self_rows = d->recv_counts[rank];
    if (o->expert_align) { /* the (token, expert) rows written and read once more with their per-row
                              arrays; in the combine, read and folded into the received tokens' rows */
        double rows = (double)expert_rows_of(m, d), recv = (double)d->total_recv, pairs = 0, tmp;
        int32_t *cnt = malloc(4 * (size_t)(d->num_local_experts + 1));
        if (!cnt) FAIL("rank %d: out of memory\n", rank);
        perf_download(m, cnt, d->expert_counts, 4 * (size_t)d->num_local_experts);
        for (int j = 0; j < d->num_local_experts; j++) pairs += cnt[j];
        free(cnt);
        TRY(perf_reduce(comm, 0, rows, &tmp, &expert_run.rows));
        TRY(perf_reduce(comm, 0, pairs, &tmp, &expert_run.pairs));
        TRY(perf_reduce(comm, 0, recv, &tmp, &expert_run.recv));
        expert_run.rows /= ep, expert_run.pairs /= ep, expert_run.recv /= ep;
        expert_run.extra_d = 2.0 * expert_run.pairs * ((double)b->row + 20.0);
        expert_run.extra_c = expert_run.pairs * (double)b->crow + expert_run.recv * (double)b->crow;
    }
    r->bytes_d = (double)d->sent_rows * (double)total_row;
    r->remote_d = (double)(d->sent_rows - self_rows) * (double)total_row;
    /* a combine row as it travels: bf16, or FP8 codes and their scales */
    const size_t nkb = b->hidden / 128;
    const double wire_c = !o->combine_wire ? (double)b->crow
                                           : (double)(b->hidden + 4 * (o->combine_wire == 2 ? (nkb + 3) / 4 : nkb));
    r->bytes_c = (double)d->total_recv * wire_c;
    r->remote_c = (double)(d->total_recv - self_rows) * wire_c;
    return 0;
}

/* --baseline: the same exchange done the way a user would without moea2a, timed the
 * same way; with --wire, quantizing first with the standalone calls, then dispatching. */
static int time_baseline(moea2a_comm_t comm, perf_mem_t *m, const perf_opts_t *o, const bench_t *b,
                         const inputs_t *in, row_t *r)
{
    int rank = b->rank;
    base_t x;
    if (base_setup(m, b, &x)) FAIL("rank %d: out of memory for the baseline\n", rank);
    for (int i = 0; i < o->warmup + o->iters; i++) {
        perf_mark(m, 0);
        TRY(base_dispatch(comm, m, b, in->d_pay, in->d_ids, &x));
        perf_mark(m, 1);
        TRY(base_combine(comm, m, b, &x));
        perf_mark(m, 2);
        if (i >= o->warmup) r->bd += perf_span(m, 0, 1), r->bc += perf_span(m, 1, 2);
    }
    r->bd /= o->iters, r->bc /= o->iters;
    base_free(m, &x);
    int iters = o->iters < (PERF_MARKS - 1) / 2 ? o->iters : (PERF_MARKS - 1) / 2;
    if (o->wire && wire_baseline(comm, m, o, b->T, in->d_pay, in->d_ids, in->d_w, iters, &r->qd))
        FAIL("rank %d: the quantize-then-dispatch baseline: %s\n", rank, moea2a_last_error(comm));
    return 0;
}

/* Across nodes: the rows this rank's routing sends to other nodes, one per destination
 * rank (flat: what moea2a's result says it sent, checked: a disagreement counts as
 * wrong) and one per destination node (aware: what a node-aware scheme sends); the
 * result's network rows, what this path sent, must be one of the two. */
static int count_internode(moea2a_comm_t comm, const bench_t *b, const moea2a_dispatch_result_t *d, int *nodes,
                           double *flat, double *aware, row_t *r)
{
    int rank = b->rank, my_node = 0;
    *nodes = 1, *flat = *aware = 0;
    moea2a_comm_node(comm, &my_node, nodes, NULL, NULL);
    if (*nodes <= 1) return 0;
    int32_t *node_of = malloc(sizeof(int32_t) * (size_t)b->ep), mine = my_node;
    if (!node_of) FAIL("rank %d: out of memory\n", rank);
    moea2a_result_t res = moea2a_allgather(&mine, node_of, 1, MOEA2A_INT32, comm, NULL);
    if (res) {
        free(node_of);
        TRY(res);
    }
    for (int t = 0; t < b->T; t++) {
        uint64_t seen = 0; /* remote nodes of this token (node numbers < 64: ranks <= 64) */
        for (int i = 0; i < b->nd[t]; i++) {
            int q = b->dests[(size_t)t * b->k + i], nq = node_of[q];
            if (nq == my_node) continue;
            (*flat)++;
            *aware += !((seen >> nq) & 1);
            seen |= 1ull << nq;
        }
    }
    free(node_of);
    if ((double)d->internode_rows != *flat) r->wrong++;
    if ((double)d->network_rows != *flat && (double)d->network_rows != *aware) r->wrong++;
    return 0;
}

/* Every rank's measurements into one set of rows on rank 0: the slowest rank's times,
 * bytes averaged over ranks, wrong values summed. */
typedef struct {
    double td, tc, tp, tg, kd, kc, ka, sd, sc, gemm, ovl[2], bd, bc, qd, hd, hc;
    double bytes_d, remote_d, bytes_c, remote_c, wrong, flat, aware, sent, net;
} totals_t;

static int reduce_row(moea2a_comm_t comm, int ep, const row_t *r, double flat, double aware, double sent, double net,
                      totals_t *s)
{
    int rank;
    double tmp;
    moea2a_comm_rank(comm, &rank);
    const struct {
        double mine, sum_in, *max, *sum;
    } each[] = {
        {r->tp, 0, &s->tp, &tmp},         {r->hd, 0, &s->hd, &tmp},         {r->hc, 0, &s->hc, &tmp},
        {r->kd, 0, &s->kd, &tmp},         {r->kc, 0, &s->kc, &tmp},         {r->ka, 0, &s->ka, &tmp},
        {r->qd, 0, &s->qd, &tmp},         {r->tg, 0, &s->tg, &tmp},         {r->sd, 0, &s->sd, &tmp},
        {r->sc, 0, &s->sc, &tmp},         {r->gemm, 0, &s->gemm, &tmp},     {r->ovl[0], 0, &s->ovl[0], &tmp},
        {r->ovl[1], 0, &s->ovl[1], &tmp}, {r->td, r->bytes_d, &s->td, &s->bytes_d},
        {r->tc, r->bytes_c, &s->tc, &s->bytes_c}, {r->bd, r->remote_d, &s->bd, &s->remote_d},
        {r->bc, r->remote_c, &s->bc, &s->remote_c}, {0, (double)r->wrong, &tmp, &s->wrong},
        {0, flat, &tmp, &s->flat},       {0, aware, &tmp, &s->aware},       {0, sent, &tmp, &s->sent},
        {0, net, &tmp, &s->net},
    };
    for (size_t i = 0; i < sizeof(each) / sizeof(each[0]); i++)
        TRY(perf_reduce(comm, each[i].mine, each[i].sum_in, each[i].max, each[i].sum));
    s->bytes_d /= ep, s->remote_d /= ep, s->bytes_c /= ep, s->remote_c /= ep;
    return 0;
}

/* Rank 0's rows for one size (the table's columns: print_row). */
static void print_size(const perf_opts_t *o, perf_mem_t *m, int T, int ti, int sms, int ep, int nodes, int nvlink,
                       const row_t *r, const totals_t *s)
{
    char wcol[24] = "N/A";
    double bd = s->bd, bc = s->bc, qd = s->qd;
    if (ti == 0 && sms) printf("#   num_sms: %d\n", sms);
    if (ti == 0)
        printf("#   path: %s\n", !nvlink          ? "generic"
                                : o->copy_engine ? "load/store (NVLink), rows by the copy engines (--engine ce)"
                                                 : "load/store (NVLink), fused kernels");
    if (nodes > 1)
        printf("#   network %d tokens, %d nodes: rows to other nodes per rank: %.1f one per destination rank "
               "(flat), %.1f one per destination node (hierarchical): %.3fx; this path sent %.1f\n",
               T, nodes, s->sent / ep, s->aware / ep, s->flat > 0 ? s->aware / s->flat : 0.0, s->net / ep);
    if (o->check) snprintf(wcol, sizeof(wcol), "%.0f", s->wrong);
    double bytes = s->bytes_d + s->bytes_c, remote = s->remote_d + s->remote_c;
    /* quantizing on dispatch is measured against quantizing first, then dispatching */
    print_row(T, "dispatch", s->bytes_d, s->remote_d, s->td, qd > 0 ? qd : bd, wcol);
    print_row(T, "combine", s->bytes_c, s->remote_c, s->tc, bc, wcol);
    print_row(T, "roundtrip", bytes, remote, s->td + s->tc, bd + bc, wcol);
    print_row(T, "roundtrip-b2b", bytes, remote, s->tp, bd + bc, wcol);
    if (s->tg > 0) print_row(T, "roundtrip-graph", bytes, remote, s->tg, bd + bc, wcol);
    if (s->kd > 0 && s->kc > 0) {
        print_row(T, "dispatch-kernel", s->bytes_d, s->remote_d, s->kd, 0, wcol);
        print_row(T, "combine-kernel", s->bytes_c, s->remote_c, s->kc, 0, wcol);
    }
    if (s->ka > 0) print_row(T, "roundtrip-graph-alone", bytes, remote, s->ka, 0, wcol);
    for (int c = 0; o->kernels && c < 2; c++) /* rank 0's own */
        if (r->parts[c][0])
            printf("#   %s %d tokens, rank 0's GPU work (us, start+duration): %s\n", c ? "combine" : "dispatch", T,
                   r->parts[c]);
    printf("#   host %d tokens: %.2f us in a dispatch call, %.2f in a combine call (slowest rank)\n", T, s->hd * 1e6,
           s->hc * 1e6);
    if (o->split) {
        print_row(T, "split-dispatch", s->bytes_d, s->remote_d, s->sd, bd, wcol);
        print_row(T, "split-combine", s->bytes_c, s->remote_c, s->sc, bc, wcol);
    }
    double ex = s->sd + s->sc;
    for (int c = 0; o->split && c < 2 && s->ovl[c] > 0; c++) /* hidden = (T_sequential - T_overlapped) / T_exchange */
        printf("#   overlap %d tokens, GEMM launched %s: exchange %.1f us (split halves), GEMM %.1f us x 2 "
               "(%d x 4096 x 4096 bf16 on %d SMs), sequential %.1f us, overlapped %.1f us: %.0f%% of the exchange "
               "hidden\n",
               T, c ? "after both halves" : "between the halves", ex * 1e6, s->gemm * 1e6, r->gemm_m, r->gemm_sms,
               (ex + 2 * s->gemm) * 1e6, s->ovl[c] * 1e6, 100.0 * (ex + 2 * s->gemm - s->ovl[c]) / ex);
    if (qd > 0) print_row(T, "q+dispatch", s->bytes_d, s->remote_d, qd, 0, "");
    if (o->expert_align) { /* kept for the rank-major run of this size, which follows */
        expert_run.td = s->td, expert_run.tc = s->tc;
    } else if (*row_tag && expert_run.td > 0) {
        double bw = copy_gbs(m);
        if (bw > 0)
            printf("#   expert-major %d tokens: %.0f rows per rank with the alignment gaps, %.0f (token, expert) "
                   "rows (%.2f per received token); extra local bytes dispatch %.0f, combine %.0f; copy %.1f "
                   "GB/s; dispatch %.2f us against rank-major + 1.25 x extra / copy = %.2f us, combine %.2f us "
                   "against %.2f us\n",
                   T, expert_run.rows, expert_run.pairs, expert_run.recv > 0 ? expert_run.pairs / expert_run.recv : 0.0,
                   expert_run.extra_d, expert_run.extra_c, bw, expert_run.td * 1e6,
                   (s->td + 1.25 * expert_run.extra_d / (bw * 1e9)) * 1e6, expert_run.tc * 1e6,
                   (s->tc + 1.25 * expert_run.extra_c / (bw * 1e9)) * 1e6);
        expert_run.td = 0;
    }
    if (o->baseline) {
        print_row(T, "base-dispatch", s->bytes_d, s->remote_d, bd, 0, "");
        print_row(T, "base-combine", s->bytes_c, s->remote_c, bc, 0, "");
        print_row(T, "base-roundtrip", bytes, remote, bd + bc, 0, "");
    }
    fflush(stdout);
}

/* Change i of --moves: expert e goes to the rank of block pi(e) of the create's bound,
 * pi(e) = (e x a + i + 1) mod E with a odd and prime to E, so every rank holds at most
 * the bound and each change moves most experts. */
static int gcd(int x, int y) { return y ? gcd(y, x % y) : x; }

static void move_map(int i, int E, int ep, int32_t *map)
{
    const int per = (E + ep - 1) / ep;
    int a = 3;
    while (E > 1 && gcd(a, E) != 1) a += 2;
    for (int e = 0; e < E; e++) map[e] = (int32_t)((((int64_t)e * a + i + 1) % E) / per);
}

/* A dispatch of in's rows and a combine of the rows received into out: each token's
 * output the sum of its rows, one per rank holding one of its experts, in the
 * context's fixed order. */
static moea2a_result_t plain_round_trip(moea2a_moe_t moe, perf_mem_t *m, int T, const inputs_t *in, void *out)
{
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_dispatch(moe, T, in->d_ids, in->d_w, in->pays, 0, &d, m->stream);
    return r ? r : moea2a_combine(moe, d.payloads[0], out, m->stream);
}

/* --moves: the warm-up's and then o->moves timed changes of the placement, each the host's
 * time in moea2a_moe_set_placement (the agreement among the ranks and the enqueue) and
 * its time on the stream (marks around the call; the clock on host memory), means over
 * the changes; then the moved context's round trip against that of a context created with
 * the last map: the output elements that differ, *wrong. */
static int time_moves(moea2a_comm_t comm, moea2a_moe_t moe, perf_mem_t *m, const perf_opts_t *o,
                      const moea2a_moe_config_t *cfg, const bench_t *b, const inputs_t *in, double *host, double *stream,
                      long *wrong)
{
    const int E = cfg->num_experts, n = o->moves, T = b->T;
    int32_t *map = malloc(sizeof(int32_t) * (size_t)E);
    size_t out_bytes = b->crow * (size_t)T + 2;
    void *d_fresh = perf_alloc(m, out_bytes);
    unsigned char *got = malloc(out_bytes), *want = malloc(out_bytes);
    if (!map || !d_fresh || !got || !want) {
        free(map), free(got), free(want);
        if (d_fresh) perf_free(m, d_fresh);
        FAIL("rank %d: out of memory for --moves\n", b->rank);
    }
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int i = 0; i < o->warmup && !r; i++) {
        move_map(n + i, E, b->ep, map);
        r = moea2a_moe_set_placement(moe, map, m->stream);
    }
    *host = 0;
    for (int i = 0; i < n && !r; i++) {
        move_map(i, E, b->ep, map);
        perf_mark(m, 2 * i);
        const double h0 = perf_now();
        r = moea2a_moe_set_placement(moe, map, m->stream);
        *host += perf_now() - h0;
        perf_mark(m, 2 * i + 1);
    }
    *stream = 0;
    for (int i = 0; i < n && !r; i++) *stream += perf_span(m, 2 * i, 2 * i + 1);
    *host /= n, *stream /= n;
    moea2a_moe_t fresh = NULL;
    moea2a_moe_config_t fc = *cfg;
    fc.placement = MOEA2A_PLACEMENT_MAP, fc.expert_to_rank = map;
    if (!r) r = plain_round_trip(moe, m, T, in, in->d_out);
    if (!r) r = moea2a_moe_create(&fresh, comm, &fc);
    if (!r) r = plain_round_trip(fresh, m, T, in, d_fresh);
    if (!r && (perf_sync(m) || moea2a_moe_status(moe) || moea2a_moe_status(fresh))) r = MOEA2A_ERR_CUDA;
    *wrong = 0;
    if (!r) {
        perf_download(m, got, in->d_out, b->crow * (size_t)T);
        perf_download(m, want, d_fresh, b->crow * (size_t)T);
        for (size_t j = 0; j < b->crow * (size_t)T; j += 2) *wrong += memcmp(got + j, want + j, 2) != 0;
    }
    if (r) fprintf(stderr, "rank %d: --moves: %s: %s\n", b->rank, moea2a_strerror(r), moea2a_last_error(comm));
    if (fresh) moea2a_moe_destroy(fresh);
    perf_free(m, d_fresh);
    free(map), free(got), free(want);
    return r != MOEA2A_SUCCESS;
}

/* One token count (o->tokens[ti]) with sms SMs: a context, the checked round, the timed
 * calls, the bytes, the baseline, the placement changes (--moves), then rank 0's rows. */
static int run_tokens(moea2a_comm_t comm, perf_mem_t *m, const perf_opts_t *o, int ti, int sms, double *busbw,
                      int *any_wrong)
{
    int rank, ep, T = o->tokens[ti];
    moea2a_comm_rank(comm, &rank);
    moea2a_comm_size(comm, &ep);
    moea2a_moe_config_t cfg = config_of(o, T, m->cuda);
    cfg.num_sms = sms;
    moea2a_moe_t moe;
    TRY(moea2a_moe_create(&moe, comm, &cfg));
    bench_t b = {rank, ep, T, o->topk, o->experts, 0, (size_t)o->hidden * 2, (size_t)o->hidden, NULL, NULL, NULL};
    moea2a_datatype_size(cfg.payloads[0].dtype, &b.row);
    b.row *= cfg.payloads[0].elems_per_token;
    inputs_t in;
    row_t r;
    memset(&r, 0, sizeof(r));
    moea2a_dispatch_result_t d = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t res = MOEA2A_SUCCESS;
    int failed = inputs_make(&cfg, m, o, ti, &b, &in);
    if (!failed && o->check) r.wrong = check_round(moe, m, &b, o, in.pays, in.d_ids, in.d_w, in.d_out, &res);
    if (!failed && res) {
        fprintf(stderr, "rank %d: the checked round: %s: %s\n", rank, moea2a_strerror(res), moea2a_last_error(comm));
        failed = 1;
    }
    failed = failed || time_calls(comm, moe, m, o, T, sms, &in, &d, &r) || count_bytes(comm, m, o, &b, cfg.num_payloads,
                                                                                          &d, &r);
    failed = failed || (o->baseline && time_baseline(comm, m, o, &b, &in, &r));
    double mh = 0, ms = 0, mh_max = 0, ms_max = 0, mwrong = 0;
    long mw = 0;
    if (!failed && o->moves) {
        failed = time_moves(comm, moe, m, o, &cfg, &b, &in, &mh, &ms, &mw);
        double sum;
        failed = failed || perf_reduce(comm, mh, (double)mw, &mh_max, &mwrong) || perf_reduce(comm, ms, 0, &ms_max, &sum);
        r.wrong += mw;
    }
    int nodes = 1;
    double flat = 0, aware = 0;
    failed = failed || count_internode(comm, &b, &d, &nodes, &flat, &aware, &r);
    totals_t s;
    memset(&s, 0, sizeof(s));
    failed = failed || reduce_row(comm, ep, &r, flat, aware, (double)d.internode_rows, (double)d.network_rows, &s);
    if (!failed) {
        if (rank == 0) print_size(o, m, T, ti, sms, ep, nodes, d.nvlink, &r, &s);
        if (rank == 0 && o->moves)
            printf("#   placement %d tokens: %d changes of %d experts, per change %.2f us in the call on the host "
                   "(the agreement and the enqueue), %.2f us on the %s (slowest rank's means); the moved context's "
                   "round trip against one created with the last map: %.0f elements differ\n",
                   T, o->moves, o->experts, mh_max * 1e6, ms_max * 1e6, m->cuda ? "stream" : "clock", mwrong);
        *busbw += (s.remote_d + s.remote_c) / (s.td + s.tc) / 1e9;
        *any_wrong |= s.wrong > 0;
    }
    inputs_free(m, &b, &in);
    res = moea2a_moe_destroy(moe);
    if (failed) return 1;
    TRY(res);
    return 0;
}

int perf_moe(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m)
{
    int rank, ep;
    moea2a_comm_rank(comm, &rank);
    moea2a_comm_size(comm, &ep);
    if (ep > 64) FAIL("moea2a_perf --moe: at most 64 ranks\n");
    if (rank == 0) {
        printf("# moea2a_perf --moe: %d ranks, %s memory, hidden %d, top-%d of %d experts, %s payload%s, skew %.2f, "
               "%d iterations (%d warm-up)\n",
               ep, m->cuda ? "cuda" : "host", o->hidden, o->topk, o->experts, moea2a_datatype_name(o->dtype),
               o->weights ? " + weights" : "", o->skew, o->iters, o->warmup);
        printf("#\n# %8s %-20s %13s %10s %11s %11s %7s %8s\n", "tokens", "op", "bytes", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "#wrong", "vs base");
    }
    double busbw_sum = 0;
    int any_wrong = 0, nsms = o->nsms ? o->nsms : 1;
    perf_opts_t rank_major = *o;
    rank_major.expert_align = 0;
    for (int si = 0; si < nsms; si++)
        for (int ti = 0; ti < o->ntokens; ti++) {
            row_tag = "";
            if (run_tokens(comm, m, o, ti, o->nsms ? o->sms[si] : 0, &busbw_sum, &any_wrong)) return 1;
            if (!o->expert_align) continue;
            row_tag = "rank-"; /* the same size in the rank-major layout, same run */
            if (run_tokens(comm, m, &rank_major, ti, o->nsms ? o->sms[si] : 0, &busbw_sum, &any_wrong)) return 1;
        }
    row_tag = "";
    if (rank == 0) {
        printf("#\n# time: the slowest rank's mean per call, CUDA events between calls (host memory: the clock);\n"
               "#   roundtrip-b2b: the pairs with no event between them; roundtrip-graph: one CUDA graph of every\n"
               "#   iteration, per iteration; split-*: each call as its send and receive halves\n"
               "# *-kernel: CUPTI's kernel time of each call, from the first start to the last end of the GPU\n"
               "#   work it enqueued (kernels, copies, memsets), back to back; roundtrip-graph-alone: the same for\n"
               "#   one round trip as a CUDA graph replayed with the stream idle and every rank launching at once\n"
               "# bytes: payload rows one rank moves (its own included); algbw = bytes / time; busbw = the bytes\n"
               "#   that cross to other ranks / time; #wrong: elements that differed in the checked round\n"
               "# vs base: the baseline's time over the row's (above 1: moea2a is faster); path: the\n"
               "#   load/store (NVLink) kernels or the generic path (host transport, NCCL send/receive)\n");
        printf("# Out of bounds values : %d %s\n", any_wrong, any_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4f\n", o->ntokens ? busbw_sum / (o->ntokens * nsms) : 0.0);
    }
    return any_wrong ? 3 : 0;
}

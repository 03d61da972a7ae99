/* moea2a_expert_gemm against an oracle written from moea2a_expert(3) and the NVFP4
 * format alone: each weight dequantized in fp32 as e2m1(q) x SF x (1/g), products
 * with the bf16 activations summed in fp64; every output within 2^-8 x sum |a w|
 * plus the rounding of the output type (NaN where the oracle has NaN). Host memory
 * always, CUDA memory where there is a device (SKIP otherwise): shapes whose n and k
 * are not multiples of the tiles, k % 32 == 16, 0-, 1- and many-row experts, every
 * E2M1 code with zero, subnormal, 448 and NaN scales, SwiGLU, rank-major rows with
 * invalid and non-local ids, and C rows that are not an expert's (alignment gaps,
 * skipped ids) left untouched. On CUDA also shapes with more tiles than the grid has
 * blocks (each block's next tile copied while it computes the last stages of the one
 * before), and a call captured into a graph that follows counts changed on the device
 * between replays. The CUDA shapes run three times: by default (on an sm_90 wgmma, fed
 * by TMA where the operands allow it), with MOEA2A_GEMM_WGMMA=1 (wgmma without TMA) and
 * with MOEA2A_GEMM_WGMMA=0 (mma.sync, as other GPUs run). Then the argument checks. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx_mem.h"
#include "mix.h"
#include "moea2a.h"
#include "oracle_e4m3.h"
#include "tap.h"
#ifdef MOEA2A_HAVE_CUDA
#include "gpu_util.h"
#endif

#define SENTINEL 0x5a /* every byte of C before the call */
#define MAX_E 16

typedef struct {
    const char *name;
    int experts;
    size_t n, k;
    int rank_major, slots;
    int32_t first_expert;
    int64_t id_rows;     /* rank-major: rows of ids */
    int32_t counts[MAX_E]; /* expert-major */
    int swiglu, fp32, special;
    uint64_t seed;
    int gpu_only; /* large enough that blocks take several tiles; its oracle runs on the host */
    int ldc_pad;  /* ldc = C's columns + this (the columns past them must stay untouched) */
} case_t;

/* the CUDA passes' suffixes (main: MOEA2A_GEMM_WGMMA unset, then 1, then 0) */
static const char *const pass_names[3] = {"", ", MOEA2A_GEMM_WGMMA=1", ", MOEA2A_GEMM_WGMMA=0"};

static const case_t cases[] = {
    {"expert-major, n=200 and k=272 (k % 32 == 16), 0/1/37 rows", 3, 200, 272, 0, 0, 0, 0, {0, 1, 37}, 0, 0, 0, 1},
    {"expert-major, every code, zero/subnormal/448/NaN scales, fp32 C", 4, 256, 384, 0, 0, 0, 0, {70, 8, 0, 5}, 0, 1,
     1, 2},
    {"expert-major, SwiGLU, n=272", 2, 272, 160, 0, 0, 0, 0, {9, 64}, 1, 0, 0, 3},
    {"expert-major, several token tiles per expert", 2, 384, 256, 0, 0, 0, 0, {150, 130}, 0, 0, 0, 4},
    {"rank-major, 4 ids per row, invalid and non-local ids", 3, 130, 96, 1, 4, 5, 40, {0}, 0, 0, 0, 5},
    {"rank-major, one id per row, SwiGLU, fp32 C", 2, 64, 64, 1, 1, 0, 50, {0}, 1, 1, 0, 6},
    /* more tiles than a grid's blocks: each block goes on to further tiles, their first
     * stages copied while the last ones of the tile before are computed */
    {"16 experts of 9-16 rows, n=2560, k=512: several small tiles per block", 16, 2560, 512, 0, 0, 0, 0,
     {9, 16, 12, 10, 16, 11, 9, 13, 14, 16, 10, 9, 15, 12, 16, 11}, 0, 0, 0, 7, 1},
    {"4 experts of 600 rows, n=1024, k=512: several large tiles per block", 4, 1024, 512, 0, 0, 0, 0,
     {600, 600, 600, 600}, 0, 0, 0, 8, 1},
    /* Hopper's TMA boxes: SwiGLU's gate and up rows in boxes of their own (n/2 % 128 ==
     * 0), and n and k ending inside a box and inside a 64-k group of scales */
    {"expert-major, SwiGLU, n=512, 12/40 rows", 2, 512, 256, 0, 0, 0, 0, {12, 40}, 1, 0, 0, 9},
    {"expert-major, n=200 and k=288, 20/70 rows", 2, 200, 288, 0, 0, 0, 0, {20, 70}, 0, 0, 0, 10},
    /* how Hopper's TMA kernel writes C: bf16 rows 16-byte aligned through shared memory
     * (n % 8 != 0: the last columns one at a time), else each value where it lies */
    {"expert-major, n=196 and ldc=200, 12/70 rows", 2, 196, 256, 0, 0, 0, 0, {12, 70}, 0, 0, 0, 11, 0, 4},
    {"expert-major, SwiGLU, n=512, ldc=264, 12/70 rows", 2, 512, 256, 0, 0, 0, 0, {12, 70}, 1, 0, 0, 12, 0, 8},
    {"expert-major, n=256 and ldc=257 (rows not 16-byte aligned), 12/70 rows", 2, 256, 256, 0, 0, 0, 0, {12, 70}, 0,
     0, 0, 13, 0, 1},
    {"expert-major, SwiGLU, n=512, fp32 C, 12/70 rows", 2, 512, 256, 0, 0, 0, 0, {12, 70}, 1, 1, 0, 14},
};

static float bf16_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const double e2m1_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
static double e2m1(unsigned c) { return c & 8 ? -e2m1_mag[c & 7] : e2m1_mag[c & 7]; }

/* the 128x4 layout's offset of (row r, block kb) for kbs blocks per row */
static size_t sf_at(size_t r, size_t kb, size_t kbs)
{
    size_t nkt = (kbs + 3) / 4;
    return (r / 128) * nkt * 512 + (kb / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + kb % 4;
}

/* Everything a case needs, on the host. */
typedef struct {
    const case_t *c;
    int64_t rows, crows; /* A rows; C rows */
    size_t cols, ldc, sf_stride;
    uint16_t *a;
    unsigned char *w, *sf;
    float *g;
    int32_t *counts, *offsets, *ids;
} data_t;

static void build(const case_t *c, data_t *d)
{
    memset(d, 0, sizeof(*d));
    d->c = c;
    size_t n = c->n, k = c->k, kbs = k / 16;
    d->cols = c->swiglu ? n / 2 : n;
    d->ldc = d->cols + (size_t)c->ldc_pad;
    d->sf_stride = (n + 127) / 128 * 128 * ((kbs + 3) / 4 * 4);
    uint64_t s = c->seed * 1000003u;
    d->counts = calloc(MAX_E, 4), d->offsets = calloc(MAX_E, 4);
    if (c->rank_major) {
        d->rows = c->id_rows;
        d->crows = c->id_rows * c->slots;
        d->ids = malloc(4 * (size_t)d->crows);
        for (int64_t i = 0; i < d->crows; i++) { /* local, non-local and invalid ids */
            int v = (int)(mix(s++) % (size_t)(c->experts + 4));
            d->ids[i] = v < c->experts ? c->first_expert + v : v == c->experts ? -1 : c->first_expert + c->experts + v;
        }
    } else { /* offsets aligned to 8, a 3-row gap after each expert, 5 rows past the last */
        int64_t at = 0;
        for (int e = 0; e < c->experts; e++) {
            d->counts[e] = c->counts[e];
            d->offsets[e] = (int32_t)at;
            at = (at + c->counts[e] + 3 + 7) / 8 * 8;
        }
        d->rows = d->crows = at + 5;
    }
    d->a = malloc(2 * (size_t)d->rows * k);
    for (size_t i = 0; i < (size_t)d->rows * k; i++) { /* +-[2^-4, 2^4), some zeros and subnormals */
        uint64_t r = mix(s++);
        uint16_t h = (uint16_t)(((r >> 8) & 0x8000) | (0x3b80 + (r % 0x0800)) /* exponents 119..134 */);
        if (r % 97 == 0) h = 0;
        if (r % 89 == 0) h = (uint16_t)(((r >> 8) & 0x8000) | (1 + r % 0x7f)); /* subnormal */
        d->a[i] = h;
    }
    if (!c->rank_major) /* gap rows hold NaN: a read of them would show */
        for (int e = 0; e < c->experts; e++)
            for (int64_t r = d->offsets[e] + c->counts[e]; r < (e + 1 < c->experts ? d->offsets[e + 1] : d->rows); r++)
                for (size_t i = 0; i < k; i++) d->a[(size_t)r * k + i] = 0x7fc0;
    size_t wb = (size_t)c->experts * n * (k / 2), sb = (size_t)c->experts * d->sf_stride;
    d->w = malloc(wb), d->sf = calloc(1, sb), d->g = malloc(4 * (size_t)c->experts);
    for (size_t i = 0; i < wb; i++) d->w[i] = (unsigned char)mix(s++); /* every code */
    for (int e = 0; e < c->experts; e++) {
        d->g[e] = e % 2 ? 3.0f : 0.4375f;
        for (size_t r = 0; r < n; r++)
            for (size_t kb = 0; kb < kbs; kb++) {
                uint64_t v = mix(s++);
                unsigned b = 0x28 + (unsigned)(v % 0x20); /* 0.25 .. 7.5 */
                if (c->special) {
                    switch (v % 11) {
                    case 0: b = 0; break;                        /* zero scale */
                    case 1: b = 1 + (unsigned)(v >> 8) % 7; break; /* subnormal */
                    case 2: b = 0x7e; break;                     /* 448 */
                    }
                    if (r == 7 && kb == 1) b = 0x7f; /* NaN: row 7's outputs are NaN */
                }
                d->sf[(size_t)e * d->sf_stride + sf_at(r, kb, kbs)] = (unsigned char)b;
            }
    }
}

static void drop(data_t *d) { free(d->a), free(d->w), free(d->sf), free(d->g), free(d->counts), free(d->offsets), free(d->ids); }

/* The oracle's G[row][col] (fp64) and its sum of |a w|. */
static void oracle(const data_t *d, int e, int64_t arow, size_t col, double *v, double *mag)
{
    const case_t *c = d->c;
    size_t k = c->k, kbs = k / 16;
    double s = 0, m = 0;
    float inv = 1.0f / d->g[e];
    for (size_t i = 0; i < k; i++) {
        unsigned char b = d->w[(size_t)e * c->n * (k / 2) + col * (k / 2) + i / 2];
        unsigned code = i % 2 ? b >> 4 : b & 15;
        float sf = oracle_e4m3_float(d->sf[(size_t)e * d->sf_stride + sf_at(col, i / 16, kbs)]);
        float w = (float)e2m1(code) * sf * inv; /* moea2a_fp4(3)'s dequantization, fp32 */
        double p = (double)bf16_float(d->a[(size_t)arow * k + i]) * (double)w;
        s += p, m += fabs(p);
    }
    *v = s, *mag = m;
}

/* Checks one output row; returns the number of wrong elements. */
static long check_row(const data_t *d, int e, int64_t arow, const unsigned char *crow, char *why, size_t why_len)
{
    const case_t *c = d->c;
    long wrong = 0;
    double round = c->fp32 ? 0x1p-22 : 0x1p-8;
    for (size_t j = 0; j < d->cols; j++) {
        double want, tol, got;
        double gv, gm;
        oracle(d, e, arow, j, &gv, &gm);
        if (c->swiglu) {
            double uv, um;
            oracle(d, e, arow, j + c->n / 2, &uv, &um);
            double eg = 0x1p-8 * gm, eu = 0x1p-8 * um, silu = gv / (1.0 + exp(-gv));
            want = silu * uv;
            tol = 1.1 * eg * fabs(uv) + fabs(silu) * eu + 1.1 * eg * eu;
        } else {
            want = gv, tol = 0x1p-8 * gm;
        }
        tol += round * fabs(want) + 1e-30;
        if (c->fp32) {
            float f;
            memcpy(&f, crow + 4 * j, 4);
            got = f;
        } else {
            uint16_t h;
            memcpy(&h, crow + 2 * j, 2);
            got = bf16_float(h);
        }
        int ok = isnan(want) ? isnan(got) : fabs(got - want) <= tol;
        if (!ok && !wrong++) snprintf(why, why_len, "col %zu: got %.9g want %.9g (tol %.3g)", j, got, want, tol);
    }
    return wrong;
}

static moea2a_expert_gemm_t describe(const data_t *d, const void *a, const void *w, const void *sf, const float *g,
                                     const int32_t *counts, const int32_t *offsets, const int32_t *ids, void *cbuf)
{
    const case_t *c = d->c;
    moea2a_expert_gemm_t x = MOEA2A_EXPERT_GEMM_INITIALIZER;
    x.num_experts = c->experts;
    x.n = c->n, x.k = c->k;
    x.rows_layout = c->rank_major ? MOEA2A_GEMM_ROWS_RANK_MAJOR : MOEA2A_GEMM_ROWS_EXPERT_MAJOR;
    x.flags = c->swiglu ? MOEA2A_GEMM_SWIGLU : 0;
    x.a = a, x.lda = c->k, x.rows = d->rows;
    x.counts = counts, x.offsets = offsets;
    x.ids = ids, x.slots = c->slots, x.first_expert = c->first_expert;
    x.w = w, x.w_scales = sf, x.w_global = g;
    x.c = cbuf, x.c_type = c->fp32 ? MOEA2A_FLOAT32 : MOEA2A_BFLOAT16, x.ldc = d->ldc;
    return x;
}

/* A case's buffers in one memory space; C filled with the sentinel. */
typedef struct {
    int cuda;
    size_t cbytes;
    void *a, *w, *sf, *c;
    float *g;
    int32_t *counts, *offsets, *ids;
} placed_t;

static void place(const data_t *d, int cuda, placed_t *p)
{
    const case_t *c = d->c;
    size_t k = c->k;
    p->cuda = cuda;
    p->cbytes = d->ldc * (c->fp32 ? 4 : 2) * (size_t)d->crows;
    unsigned char *hc = malloc(p->cbytes);
    memset(hc, SENTINEL, p->cbytes);
    p->a = mem_put(cuda, d->a, 2 * (size_t)d->rows * k);
    p->w = mem_put(cuda, d->w, (size_t)c->experts * c->n * (k / 2));
    p->sf = mem_put(cuda, d->sf, (size_t)c->experts * d->sf_stride);
    p->g = mem_put(cuda, d->g, 4 * (size_t)c->experts);
    p->counts = mem_put(cuda, d->counts, 4 * MAX_E), p->offsets = mem_put(cuda, d->offsets, 4 * MAX_E);
    p->ids = c->rank_major ? mem_put(cuda, d->ids, 4 * (size_t)d->crows) : NULL;
    p->c = mem_put(cuda, hc, p->cbytes);
    free(hc);
}

static void unplace(placed_t *p)
{
    void *all[] = {p->a, p->w, p->sf, p->g, p->counts, p->offsets, p->ids, p->c};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i]) mem_drop(p->cuda, all[i]);
}

static moea2a_expert_gemm_t describe_placed(const data_t *d, const placed_t *p)
{
    return describe(d, p->a, p->w, p->sf, p->g, p->counts, p->offsets, p->ids, p->c);
}

/* Every C row: an expert's rows against the oracle, the others still the sentinel. */
static long verify(const data_t *d, const unsigned char *cc, char *why, size_t why_len)
{
    const case_t *c = d->c;
    size_t rb = d->ldc * (c->fp32 ? 4 : 2), used = d->cols * (c->fp32 ? 4 : 2);
    long wrong = 0;
    for (int64_t r = 0; r < d->crows; r++) {
        int e = -1;
        int64_t arow = r;
        if (c->rank_major) {
            int64_t v = (int64_t)d->ids[r] - c->first_expert;
            if (v >= 0 && v < c->experts) e = (int)v, arow = r / c->slots;
        } else {
            for (int x = 0; x < c->experts; x++)
                if (r >= d->offsets[x] && r < d->offsets[x] + d->counts[x]) e = x;
        }
        const unsigned char *row = cc + (size_t)r * rb;
        for (size_t b = used; b < rb; b++) /* past the columns (ldc > cols) */
            if (row[b] != SENTINEL) {
                if (!wrong++) snprintf(why, why_len, "row %lld: byte %zu past its columns was written", (long long)r, b);
                break;
            }
        if (e < 0) {
            for (size_t b = 0; b < rb; b++)
                if (row[b] != SENTINEL) {
                    if (!wrong++) snprintf(why, why_len, "row %lld is no expert's but was written", (long long)r);
                    break;
                }
            continue;
        }
        char w2[160];
        long bad = check_row(d, e, arow, row, w2, sizeof(w2));
        if (bad && !wrong) snprintf(why, why_len, "row %lld (expert %d): %s", (long long)r, e, w2);
        wrong += bad;
    }
    return wrong;
}

static void run_case(const case_t *c, int cuda)
{
    data_t d;
    placed_t pl;
    build(c, &d);
    place(&d, cuda, &pl);
    moea2a_expert_gemm_t x = describe_placed(&d, &pl);
    size_t ws = 0;
    moea2a_result_t rc = moea2a_expert_gemm_workspace_size(&x, &ws);
    void *wsp = ws ? mem_put(cuda, NULL, ws) : NULL;
    x.workspace = wsp, x.workspace_size = ws;
    if (rc == MOEA2A_SUCCESS) rc = moea2a_expert_gemm(&x, NULL);
#ifdef MOEA2A_HAVE_CUDA
    if (cuda && rc == MOEA2A_SUCCESS && cudaDeviceSynchronize() != cudaSuccess) rc = MOEA2A_ERR_CUDA;
#endif
    char why[256] = "";
    long wrong = -1;
    if (rc == MOEA2A_SUCCESS) {
        unsigned char *got = mem_get(cuda, pl.c, pl.cbytes);
        wrong = verify(&d, got, why, sizeof(why));
        free(got);
    } else {
        snprintf(why, sizeof(why), "%s", moea2a_last_error(NULL));
    }
    if (wrong) tap_diag("%s", why);
    const char *kernel = getenv("MOEA2A_GEMM_WGMMA");
    tap_ok(wrong == 0, "%s memory: %s%s%s (%ld wrong)", cuda ? "CUDA" : "host", c->name,
           kernel ? ", MOEA2A_GEMM_WGMMA=" : "", kernel ? kernel : "", wrong);
    if (wsp) mem_drop(cuda, wsp);
    unplace(&pl);
    drop(&d);
}

#ifdef MOEA2A_HAVE_CUDA
/* Captured once, replayed after the counts and offsets changed on the device: the
 * replay follows them (nothing about the rows was fixed at capture). */
static void graph_case(void)
{
    const case_t *c = &cases[0];
    data_t d;
    placed_t pl;
    build(c, &d);
    place(&d, 1, &pl);
    size_t k = c->k;
    moea2a_expert_gemm_t x = describe_placed(&d, &pl);
    cudaStream_t s;
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = cudaStreamCreate(&s) == cudaSuccess && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == 0;
    moea2a_result_t rc = ok ? moea2a_expert_gemm(&x, s) : MOEA2A_ERR_CUDA;
    ok = ok && cudaStreamEndCapture(s, &gr) == cudaSuccess && rc == MOEA2A_SUCCESS &&
         cudaGraphInstantiate(&ge, gr, 0) == cudaSuccess;
    /* new rows: the experts' counts and offsets move (the data stays) */
    d.counts[0] = 2, d.counts[1] = 0, d.counts[2] = 30;
    d.offsets[0] = 0, d.offsets[1] = 8, d.offsets[2] = 8;
    for (int64_t r = 0; r < d.rows; r++)
        for (size_t i = 0; i < k; i++)
            if ((r >= 2 && r < 8) || r >= 38) d.a[(size_t)r * k + i] = 0x7fc0;
            else d.a[(size_t)r * k + i] = (uint16_t)(0x3c00 + (mix((uint64_t)r * k + i) % 0x0300));
    ok = ok && cudaMemcpy(pl.a, d.a, 2 * (size_t)d.rows * k, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(pl.counts, d.counts, 4 * MAX_E, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(pl.offsets, d.offsets, 4 * MAX_E, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    char why[256] = "";
    long wrong = -1;
    if (ok) {
        unsigned char *got = mem_get(1, pl.c, pl.cbytes);
        wrong = verify(&d, got, why, sizeof(why));
        free(got);
    } else {
        snprintf(why, sizeof(why), "capture or replay failed: %s", moea2a_last_error(NULL));
    }
    if (wrong) tap_diag("%s", why);
    tap_ok(wrong == 0, "CUDA graph: a captured call replayed after counts and offsets changed on the device follows "
                       "them (%ld wrong)", wrong);
    if (ge) cudaGraphExecDestroy(ge);
    if (gr) cudaGraphDestroy(gr);
    cudaStreamDestroy(s);
    unplace(&pl);
    drop(&d);
}
#endif

/* Each bad description fails with MOEA2A_ERR_INVALID_ARGUMENT and writes nothing. */
static void bad_inputs(int cuda)
{
    const case_t *c = &cases[4]; /* rank-major: the workspace matters on CUDA */
    data_t d;
    placed_t pl;
    build(c, &d);
    place(&d, cuda, &pl);
    size_t k = c->k;
    float host_g[3] = {1, 1, 1};
    const moea2a_expert_gemm_t good = describe_placed(&d, &pl);
    size_t ws = 0;
    moea2a_expert_gemm_workspace_size(&good, &ws);
    void *wsp = ws ? mem_put(cuda, NULL, ws) : NULL;
    int fails = 0, n = 0;
    for (int t = 0;; t++) {
        moea2a_expert_gemm_t x = good;
        x.workspace = wsp, x.workspace_size = ws;
        switch (t) {
        case 0: x.size = sizeof(x) - 8; break;
        case 1: x.num_experts = 0; break;
        case 2: x.num_experts = 1025; break;
        case 3: x.k = 0; break;
        case 4: x.k = 24; x.lda = 24; break;
        case 5: x.n = 0; break;
        case 6: x.flags = MOEA2A_GEMM_SWIGLU; x.n = 129; break;
        case 7: x.flags = 1u << 5; break;
        case 8: x.rows_layout = (moea2a_gemm_rows_t)7; break;
        case 9: x.rows = -1; break;
        case 10: x.c_type = MOEA2A_FLOAT16; break;
        case 11: x.lda = k - 16; break;
        case 12: x.ldc = d.cols - 1; break;
        case 13: x.a = NULL; break;
        case 14: x.w_global = NULL; break;
        case 15: x.ids = NULL; break;
        case 16: x.slots = 0; break;
        case 17: x.rows = INT32_MAX; break; /* rows x slots past an int32 */
        case 18: x.rows_layout = MOEA2A_GEMM_ROWS_EXPERT_MAJOR, x.counts = NULL; break; /* no counts */
        case 19: x.first_expert = INT32_MAX - 1; break;
        case 20: x.n = (size_t)1 << 31; x.ldc = x.n; break; /* n past an int32 */
        case 21:
            if (!cuda) continue;
            x.w_global = host_g; /* mixed memory */
            break;
        case 22:
            if (!cuda) continue;
            x.workspace_size = ws - 4; /* too little workspace */
            break;
        case 23:
            if (!cuda) continue;
            x.a = (const char *)pl.a + 2; /* misaligned */
            break;
        case 24: x.k = (size_t)1 << 25; x.lda = x.k; break; /* k past 2^24 */
        case 25: x.lda = (size_t)1 << 62; break;             /* rows x lda overflows */
        default: goto done;
        }
        n++;
        moea2a_result_t rc = moea2a_expert_gemm(&x, NULL);
        const char *msg = moea2a_last_error(NULL);
        if (rc != MOEA2A_ERR_INVALID_ARGUMENT || !msg || !strstr(msg, "moea2a_expert_gemm")) {
            tap_diag("bad input %d: result %d (%s)", t, (int)rc, msg ? msg : "no message");
            fails++;
        }
    }
done:;
    unsigned char *got = mem_get(cuda, pl.c, pl.cbytes);
    for (size_t i = 0; i < pl.cbytes; i++)
        if (got[i] != SENTINEL) {
            tap_diag("a refused call wrote C");
            fails++;
            break;
        }
    free(got);
    /* zero rows: nothing to do, nothing launched, success */
    moea2a_expert_gemm_t x = good;
    x.workspace = wsp, x.workspace_size = ws, x.rows = 0;
    if (moea2a_expert_gemm(&x, NULL) != MOEA2A_SUCCESS) fails++, tap_diag("rows = 0 failed");
    size_t b = 1;
    if (moea2a_expert_gemm_workspace_size(NULL, &b) != MOEA2A_ERR_INVALID_ARGUMENT) fails++;
    tap_ok(fails == 0, "%s memory: %d bad descriptions each MOEA2A_ERR_INVALID_ARGUMENT naming the call, C untouched; "
                       "0 rows succeed", cuda ? "CUDA" : "host", n);
    if (wsp) mem_drop(cuda, wsp);
    unplace(&pl);
    drop(&d);
}

int main(void)
{
    const int nc = (int)(sizeof(cases) / sizeof(cases[0]));
#ifdef MOEA2A_HAVE_CUDA
    int ndev = gpu_count(); /* before any call: a call initializes CUDA, and a child forked after it cannot */
#else
    int ndev = 0;
#endif
    for (int i = 0; i < nc; i++) /* the GPU-only shapes' point is the GPU's tiling */
        if (!cases[i].gpu_only) run_case(&cases[i], 0);
    bad_inputs(0);
    if (ndev < 1) {
        for (int pass = 0; pass < 3; pass++)
            for (int i = 0; i < nc; i++)
                tap_skip("no CUDA device", "CUDA memory: %s%s", cases[i].name, pass_names[pass]);
        tap_skip("no CUDA device", "CUDA graph capture");
        tap_skip("no CUDA device", "CUDA memory: bad descriptions");
        return tap_done();
    }
#ifdef MOEA2A_HAVE_CUDA
    for (int i = 0; i < nc; i++) run_case(&cases[i], 1);
    /* on Hopper, wgmma with the copies issued by the MMA warps (what runs where TMA cannot
     * describe the operands), then the mma.sync kernels, which other GPUs run */
    setenv("MOEA2A_GEMM_WGMMA", "1", 1);
    for (int i = 0; i < nc; i++) run_case(&cases[i], 1);
    setenv("MOEA2A_GEMM_WGMMA", "0", 1);
    for (int i = 0; i < nc; i++) run_case(&cases[i], 1);
    unsetenv("MOEA2A_GEMM_WGMMA");
    graph_case();
    bad_inputs(1);
#endif
    return tap_done();
}

/* moea2a_perf --op fp4 | fp8: quantize and dequantize of an M x K bf16 tensor, next to a
 * plain copy of the same tensor measured in the same run (the device-memory ceiling).
 * One table row per variant of the format (NVFP4 with 128x4 scales; FP8 with fp32 and
 * with UE8M0 scales, MN-major as FP8 GEMMs read them). Bytes count every byte read
 * and written once. One checked round compares each variant's output with the host
 * reference (#wrong: bytes that differ). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "perf_mem.h"

/* One variant of a format: NVFP4 (128x4 scales, global scale g in the memory of the
 * call), or FP8 with fp32 or UE8M0 scales, MN-major. */
typedef struct {
    const char *name;
    int fp8;
    unsigned flags; /* FP8: MOEA2A_FP8_UE8M0 or 0 */
} variant_t;

static size_t code_bytes(const variant_t *v, size_t M, size_t K) { return v->fp8 ? M * K : M * K / 2; }

static size_t scale_bytes(const variant_t *v, size_t M, size_t K)
{
    size_t b = 0;
    if (v->fp8) moea2a_fp8_scale_bytes(MOEA2A_FP8_SCALES_MN_MAJOR, v->flags, M, K, &b);
    else moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, M, K, &b);
    return b;
}

static moea2a_result_t quantize(const variant_t *v, const void *x, size_t M, size_t K, const float *g, void *q,
                                void *s, void *st)
{
    return v->fp8 ? moea2a_fp8_quantize(x, MOEA2A_BFLOAT16, M, K, q, s, MOEA2A_FP8_SCALES_MN_MAJOR, v->flags, st)
                  : moea2a_fp4_quantize(x, MOEA2A_BFLOAT16, M, K, g, q, s, MOEA2A_SF_128X4, st);
}

static moea2a_result_t dequantize(const variant_t *v, const void *q, const void *s, const float *g, size_t M, size_t K,
                                  void *out, void *st)
{
    return v->fp8 ? moea2a_fp8_dequantize(q, s, MOEA2A_FP8_SCALES_MN_MAJOR, v->flags, M, K, out, MOEA2A_BFLOAT16, st)
                  : moea2a_fp4_dequantize(q, s, MOEA2A_SF_128X4, g, M, K, out, MOEA2A_BFLOAT16, st);
}

static const variant_t fp4_variants[] = {{"nvfp4", 0, 0}};
static const variant_t fp8_variants[] = {{"fp8", 1, 0}, {"fp8-ue8m0", 1, MOEA2A_FP8_UE8M0}};

static void row(const char *op, const char *variant, double bytes, double t, double copy_bw, const char *wrong)
{
    char name[40];
    snprintf(name, sizeof(name), "%s%s%s", op, *variant ? " " : "", variant);
    double bw = bytes / t / 1e9;
    printf("  %-22s %14.0f %10.2f %10.1f %9.1f%% %7s\n", name, bytes, t * 1e6, bw,
           copy_bw > 0 ? 100.0 * bw / copy_bw : 100.0, wrong);
}

int perf_quant(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m)
{
    int rank;
    moea2a_comm_rank(comm, &rank);
    if (rank != 0) return 0; /* a single-device benchmark */
    const int fp8 = o->op == OP_FP8;
    const variant_t *vs = fp8 ? fp8_variants : fp4_variants;
    const int nv = fp8 ? 2 : 1;
    const char *op = fp8 ? "fp8" : "fp4";
    size_t M = (size_t)o->fp4_rows, K = (size_t)o->hidden, n = M * K;
    uint16_t *hx = malloc(2 * n);
    if (!hx) return fprintf(stderr, "moea2a_perf --op %s: out of memory\n", op), 1;
    for (size_t i = 0; i < n; i++) { /* finite bf16 values over a wide range */
        uint16_t h = (uint16_t)perf_mix(i);
        hx[i] = (uint16_t)((h & 0x807f) | (0x3800 + (h >> 4 & 0x07ff) % 0x0700));
    }
    void *x = perf_alloc(m, 2 * n), *x2 = perf_alloc(m, 2 * n);
    float *g = perf_alloc(m, sizeof(float)), hg = 1.0f;
    if (!x || !x2 || !g) return fprintf(stderr, "moea2a_perf --op %s: out of device memory\n", op), 1;
    perf_upload(m, x, hx, 2 * n);
    if (!fp8) moea2a_fp4_global_scale(hx, MOEA2A_BFLOAT16, n, &hg, NULL);
    perf_upload(m, g, &hg, sizeof(hg));
    printf("# moea2a_perf --op %s: %zu x %zu bf16, %s memory, %d iterations (%d warm-up)%s\n", op, M, K,
           m->cuda ? "cuda" : "host", o->iters, o->warmup, fp8 ? "; scales MN-major" : "; scales 128x4");
    printf("#\n# %-22s %14s %10s %10s %10s %7s\n", "op", "bytes", "time(us)", "GB/s", "of copy", "#wrong");
    /* the copy first: the ceiling every row is compared with */
    for (int it = 0; it < o->warmup; it++) perf_copy(m, x2, x, 2 * n);
    perf_mark(m, 0);
    for (int it = 0; it < o->iters; it++) perf_copy(m, x2, x, 2 * n);
    perf_mark(m, 1);
    double copy_bytes = 4.0 * (double)n, t_copy = perf_span(m, 0, 1) / o->iters, copy_bw = copy_bytes / t_copy / 1e9;
    row("copy", "", copy_bytes, t_copy, copy_bw, "");
    long wrong_all = 0;
    for (int v = 0; v < nv; v++) {
        const variant_t *V = &vs[v];
        size_t cb = code_bytes(V, M, K), sb = scale_bytes(V, M, K);
        void *q = perf_alloc(m, cb), *s = perf_alloc(m, sb);
        unsigned char *hq = malloc(cb), *hs = malloc(sb), *cq = malloc(cb), *cs = malloc(sb);
        if (!q || !s || !hq || !hs || !cq || !cs) return fprintf(stderr, "moea2a_perf --op %s: out of memory\n", op), 1;
        /* checked round: device (or host) against the host reference */
        long wrong = 0;
        quantize(V, hx, M, K, &hg, hq, hs, NULL);
        if (quantize(V, x, M, K, g, q, s, m->stream) != MOEA2A_SUCCESS)
            return fprintf(stderr, "%s quantize: %s\n", V->name, moea2a_last_error(NULL)), 1;
        perf_download(m, cq, q, cb);
        perf_download(m, cs, s, sb);
        for (size_t i = 0; i < cb; i++) wrong += cq[i] != hq[i];
        for (size_t i = 0; i < sb; i++) wrong += cs[i] != hs[i];
        /* each call iters times back to back after its warm-up, timed by events on the
         * stream (launch gaps included, host round trips not) */
        for (int it = 0; it < o->warmup; it++) {
            quantize(V, x, M, K, g, q, s, m->stream);
            dequantize(V, q, s, g, M, K, x2, m->stream);
        }
        perf_mark(m, 0);
        for (int it = 0; it < o->iters; it++) quantize(V, x, M, K, g, q, s, m->stream);
        perf_mark(m, 1);
        for (int it = 0; it < o->iters; it++) dequantize(V, q, s, g, M, K, x2, m->stream);
        perf_mark(m, 2);
        double t_q = perf_span(m, 0, 1) / o->iters, t_d = perf_span(m, 1, 2) / o->iters;
        double bytes = 2.0 * (double)n + (double)cb + (double)sb;
        char w[24];
        snprintf(w, sizeof(w), "%ld", wrong);
        row("quantize", V->name, bytes, t_q, copy_bw, w);
        row("dequantize", V->name, bytes, t_d, copy_bw, "");
        wrong_all += wrong;
        perf_free(m, q), perf_free(m, s);
        free(hq), free(hs), free(cq), free(cs);
    }
    printf("# Out of bounds values : %d %s\n", wrong_all > 0, wrong_all ? "FAILED" : "OK");
    perf_free(m, x), perf_free(m, x2), perf_free(m, g);
    free(hx);
    return wrong_all ? 3 : 0;
}

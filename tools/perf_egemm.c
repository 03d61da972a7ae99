/* moea2a_perf --op expert-gemm: moea2a_expert_gemm (NVFP4 weights, bf16 activations,
 * expert-major rows) next to cuBLAS's bf16 grouped GEMM on the same shapes in the same
 * run, and a device copy (the memory ceiling the weight bytes are compared with). Per
 * shape (n, k) and rows per expert: times, TFLOP/s, the weight bytes' rate; at the
 * largest rows per expert also a call whose experts hold half as many rows (the rest
 * alignment padding), to show that padding costs nothing. One checked round compares a
 * sample of outputs with an fp64 reference (#wrong: outside 2^-8 x sum |a w|). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "perf_gpu.h"
#include "perf_mem.h"

static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double e4m3_value(unsigned b)
{
    unsigned e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m / 512.0 : ldexp(1.0 + m / 8.0, (int)e - 7);
    return (b & 0x7f) == 0x7f ? NAN : b & 0x80 ? -v : v;
}

typedef struct {
    int experts, rows_max;
    size_t n, k, sf_stride;
    uint16_t *ha;   /* [experts * rows_max][k] */
    unsigned char *hw, *hs;
    float *hg;
    void *a, *w, *s, *c, *wb, *cb; /* device (or host) copies; wb/cb: cuBLAS's bf16 W and C */
    float *g;
    int32_t *counts, *offsets;
} bench_t;

/* fp64 reference of C[row][col] for expert e, and the tolerance */
static int sample_ok(const bench_t *b, int e, int64_t row, size_t col, double got)
{
    size_t k = b->k, kbs = k / 16, nkt = (kbs + 3) / 4;
    double sum = 0, mag = 0;
    float inv = 1.0f / b->hg[e];
    for (size_t i = 0; i < k; i++) {
        unsigned char byte = b->hw[(size_t)e * b->n * (k / 2) + col * (k / 2) + i / 2];
        unsigned code = i % 2 ? byte >> 4 : byte & 15;
        static const double mag8[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        size_t kb = i / 16;
        size_t off = (col / 128) * nkt * 512 + (kb / 4) * 512 + (col % 32) * 16 + ((col % 128) / 32) * 4 + kb % 4;
        float w = (float)((code & 8 ? -1 : 1) * mag8[code & 7]) * (float)e4m3_value(b->hs[(size_t)e * b->sf_stride + off]) *
                  inv;
        double p = bf16_value(b->ha[(size_t)row * k + i]) * (double)w;
        sum += p, mag += fabs(p);
    }
    return fabs(got - sum) <= 0x1p-8 * mag + 0x1p-8 * fabs(sum) + 1e-30;
}

static moea2a_result_t run_gemm(const bench_t *b, int rows_per_expert, void *stream)
{
    moea2a_expert_gemm_t x = MOEA2A_EXPERT_GEMM_INITIALIZER;
    x.num_experts = b->experts;
    x.n = b->n, x.k = b->k;
    x.rows_layout = MOEA2A_GEMM_ROWS_EXPERT_MAJOR;
    x.a = b->a, x.lda = b->k, x.rows = (int64_t)b->experts * rows_per_expert;
    x.counts = b->counts, x.offsets = b->offsets;
    x.w = b->w, x.w_scales = b->s, x.w_global = b->g;
    x.c = b->c, x.c_type = MOEA2A_BFLOAT16, x.ldc = b->n;
    return moea2a_expert_gemm(&x, stream);
}

/* counts[e] = used, offsets[e] = e * stride */
static void set_rows(const perf_mem_t *m, const bench_t *b, int used, int stride)
{
    int32_t *h = malloc(8 * (size_t)b->experts);
    for (int e = 0; e < b->experts; e++) h[e] = used, h[b->experts + e] = e * stride;
    perf_upload(m, b->counts, h, 4 * (size_t)b->experts);
    perf_upload(m, b->offsets, h + b->experts, 4 * (size_t)b->experts);
    free(h);
}

static double time_gemm(perf_mem_t *m, const perf_opts_t *o, const bench_t *b, int rows_per_expert)
{
    for (int i = 0; i < o->warmup; i++) run_gemm(b, rows_per_expert, m->stream);
    perf_mark(m, 0);
    for (int i = 0; i < o->iters; i++) run_gemm(b, rows_per_expert, m->stream);
    perf_mark(m, 1);
    return perf_span(m, 0, 1) / o->iters;
}

static double time_cublas(perf_mem_t *m, const perf_opts_t *o, perf_grouped_t *g, int one_group)
{
    if (!g) return 0;
    for (int i = 0; i < o->warmup; i++) perf_grouped_run(g, one_group);
    perf_mark(m, 0);
    for (int i = 0; i < o->iters; i++) perf_grouped_run(g, one_group);
    perf_mark(m, 1);
    return perf_span(m, 0, 1) / o->iters;
}

static int shape(perf_mem_t *m, const perf_opts_t *o, int experts, size_t n, size_t k, double copy_bw)
{
    bench_t b;
    memset(&b, 0, sizeof(b));
    b.experts = experts, b.n = n, b.k = k;
    for (int i = 0; i < o->ntokens; i++) b.rows_max = o->tokens[i] > b.rows_max ? o->tokens[i] : b.rows_max;
    moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, n, k, &b.sf_stride);
    size_t arows = (size_t)experts * (size_t)b.rows_max, wbytes = (size_t)experts * n * (k / 2);
    size_t sbytes = (size_t)experts * b.sf_stride;
    b.ha = malloc(2 * arows * k), b.hw = malloc(wbytes), b.hs = malloc(sbytes), b.hg = malloc(4 * (size_t)experts);
    if (!b.ha || !b.hw || !b.hs || !b.hg) return fprintf(stderr, "moea2a_perf --op expert-gemm: out of memory\n"), 1;
    for (size_t i = 0; i < arows * k; i++) { /* +-[0.5, 2) */
        uint64_t r = perf_mix(i * 3 + 1);
        b.ha[i] = (uint16_t)(((r >> 20) & 0x8000) | (0x3f00 + (r % 0x100)));
    }
    for (size_t i = 0; i < wbytes; i += 8) {
        uint64_t r = perf_mix(i + 7);
        memcpy(b.hw + i, &r, wbytes - i < 8 ? wbytes - i : 8);
    }
    for (size_t i = 0; i < sbytes; i++) b.hs[i] = (unsigned char)(0x30 + perf_mix(i + 11) % 0x10); /* 0.5 .. 0.94 */
    for (int e = 0; e < experts; e++) b.hg[e] = 1.0f + (float)(e % 3);
    b.a = perf_alloc(m, 2 * arows * k), b.w = perf_alloc(m, wbytes), b.s = perf_alloc(m, sbytes);
    b.g = perf_alloc(m, 4 * (size_t)experts), b.c = perf_alloc(m, 2 * arows * n);
    b.counts = perf_alloc(m, 4 * (size_t)experts), b.offsets = perf_alloc(m, 4 * (size_t)experts);
    if (!b.a || !b.w || !b.s || !b.g || !b.c || !b.counts || !b.offsets)
        return fprintf(stderr, "moea2a_perf --op expert-gemm: out of device memory\n"), 1;
    perf_upload(m, b.a, b.ha, 2 * arows * k);
    perf_upload(m, b.w, b.hw, wbytes);
    perf_upload(m, b.s, b.hs, sbytes);
    perf_upload(m, b.g, b.hg, 4 * (size_t)experts);
    /* cuBLAS's operands: bf16 weights (contents do not change its time) and its own C */
    if (m->cuda) {
        b.wb = perf_alloc(m, 2 * (size_t)experts * n * k), b.cb = perf_alloc(m, 2 * arows * n);
        for (size_t at = 0, wb = 2 * (size_t)experts * n * k, ab = 2 * arows * k; b.wb && at < wb; at += ab)
            perf_copy(m, (char *)b.wb + at, b.a, wb - at < ab ? wb - at : ab); /* finite bf16 values */
    }
    double wbytes_all = (double)wbytes + (double)sbytes + 4.0 * experts;
    long wrong_all = 0;
    int *rows = malloc(sizeof(int) * (size_t)experts);
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)experts);
    for (int ti = 0; ti < o->ntokens; ti++) {
        int R = o->tokens[ti];
        for (int pad = 0; pad < 2; pad++) {
            if (pad && (R < 2 || R != b.rows_max)) continue;
            int used = pad ? R / 2 : R;
            set_rows(m, &b, used, R);
            /* checked round */
            long wrong = 0;
            uint16_t *hc = NULL;
            if (o->check) {
                if (run_gemm(&b, R, m->stream) != MOEA2A_SUCCESS || perf_sync(m))
                    return fprintf(stderr, "moea2a_expert_gemm: %s\n", moea2a_last_error(NULL)), 1;
                size_t cb = 2 * (size_t)experts * (size_t)R * n;
                hc = malloc(cb);
                perf_download(m, hc, b.c, cb);
                for (int sidx = 0; sidx < 64; sidx++) {
                    uint64_t r = perf_mix((uint64_t)sidx * 977 + (uint64_t)R);
                    int e = (int)(r % (uint64_t)experts);
                    int64_t row = (int64_t)e * R + (int64_t)((r >> 16) % (uint64_t)used);
                    size_t col = (size_t)((r >> 32) % n);
                    wrong += !sample_ok(&b, e, row, col, bf16_value(hc[(size_t)row * n + col]));
                }
                free(hc);
            }
            double t = time_gemm(m, o, &b, R);
            double t_grp = 0, t_bat = 0;
            if (m->cuda && b.wb && b.cb && !pad) {
                char why[160];
                for (int e = 0; e < experts; e++) rows[e] = R, offs[e] = (int64_t)e * R;
                perf_grouped_t *g =
                    perf_grouped_open(m->stream, experts, (int)n, (int)k, b.wb, b.a, b.cb, (int)k, (int)n, rows, offs,
                                      why, sizeof(why));
                if (!g) printf("# cuBLAS: %s\n", why);
                t_grp = time_cublas(m, o, g, 0);
                t_bat = time_cublas(m, o, g, 1);
                perf_grouped_close(g);
            }
            double flops = 2.0 * experts * used * (double)n * (double)k, wbw = wbytes_all / t / 1e9;
            double best = t_grp > 0 && (t_bat <= 0 || t_grp < t_bat) ? t_grp : t_bat;
            char rlabel[32], grp[24] = "-", bat[24] = "-", sp[24] = "-", wr[24] = "-";
            snprintf(rlabel, sizeof(rlabel), pad ? "%d/%d" : "%d", used, R);
            if (t_grp > 0) snprintf(grp, sizeof(grp), "%.1f", t_grp * 1e6);
            if (t_bat > 0) snprintf(bat, sizeof(bat), "%.1f", t_bat * 1e6);
            if (best > 0) snprintf(sp, sizeof(sp), "%.2fx", best / t);
            if (o->check) snprintf(wr, sizeof(wr), "%ld", wrong);
            printf("  %6zu %6zu %10s %11.1f %8.1f %10.1f %8.1f%% %12s %12s %8s %7s\n", n, k, rlabel, t * 1e6,
                   flops / t / 1e12, wbw, copy_bw > 0 ? 100.0 * wbw / copy_bw : 0.0, grp, bat, sp, wr);
            fflush(stdout); /* progress, line by line, also through a pipe */
            wrong_all += wrong;
        }
    }
    free(rows), free(offs);
    perf_free(m, b.a), perf_free(m, b.w), perf_free(m, b.s), perf_free(m, b.g), perf_free(m, b.c);
    perf_free(m, b.counts), perf_free(m, b.offsets);
    if (b.wb) perf_free(m, b.wb);
    if (b.cb) perf_free(m, b.cb);
    free(b.ha), free(b.hw), free(b.hs), free(b.hg);
    return wrong_all ? 3 : 0;
}

int perf_egemm(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m)
{
    int rank;
    moea2a_comm_rank(comm, &rank);
    if (rank != 0) return 0; /* a single-device benchmark */
    /* the copy ceiling: 256 MiB device to device (memcpy on the host), buffers written first */
    size_t cbytes = (size_t)256 << 20;
    void *x = perf_alloc(m, cbytes), *y = perf_alloc(m, cbytes);
    if (!x || !y) return fprintf(stderr, "moea2a_perf --op expert-gemm: out of memory\n"), 1;
    perf_copy(m, x, y, cbytes);
    perf_copy(m, y, x, cbytes);
    perf_mark(m, 0);
    for (int i = 0; i < 5; i++) perf_copy(m, y, x, cbytes);
    perf_mark(m, 1);
    double copy_bw = 2.0 * (double)cbytes * 5 / perf_span(m, 0, 1) / 1e9;
    perf_free(m, x), perf_free(m, y);
    printf("# moea2a_perf --op expert-gemm: %d experts, NVFP4 weights (128x4 scales), bf16 rows and C, %s memory, "
           "%d iterations (%d warm-up)\n", o->gemm_experts, m->cuda ? "cuda" : "host", o->iters, o->warmup);
    printf("# copy: %.1f GB/s (read + written); weight GB/s: codes, scales and global scales / time\n", copy_bw);
    printf("# cuBLAS bf16: cublasGemmGroupedBatchedEx, one group per expert (grouped) and one group of all (batched);"
           " speedup over the faster\n#\n");
    if (!m->cuda)
        printf("# host memory: the host reference path, which checks the CUDA kernels' math rather than a benchmark "
               "(minutes for the default shapes: --gemm-shapes and --tokens make it shorter); one line per shape and "
               "row count as each finishes\n");
    printf("# %6s %6s %10s %11s %8s %10s %9s %12s %12s %8s %7s\n", "n", "k", "rows/exp", "time(us)", "TFLOP/s",
           "weight GB/s", "of copy", "grouped(us)", "batched(us)", "speedup", "#wrong");
    fflush(stdout);
    int rc = 0;
    for (int s = 0; s < o->gemm_nshapes; s++) {
        int r = shape(m, o, o->gemm_experts, (size_t)o->gemm_n[s], (size_t)o->gemm_k[s], copy_bw);
        rc = r > rc ? r : rc;
    }
    printf("# Out of bounds values : %d %s\n", rc == 3, rc == 3 ? "FAILED" : "OK");
    return rc;
}

/* moea2a_perf --op fp4: NVFP4 quantize and dequantize of an M x K bf16 tensor, next
 * to a plain copy of the same tensor measured in the same run (the device-memory
 * ceiling). Bytes count every byte read and written once. One checked round
 * compares the result with the host reference (#wrong: bytes that differ). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"
#include "perf_mem.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 31);
}

static void row(const char *op, double bytes, double t, double copy_bw, const char *wrong)
{
    double bw = bytes / t / 1e9;
    printf("  %-12s %14.0f %10.2f %10.1f %9.1f%% %7s\n", op, bytes, t * 1e6, bw, copy_bw > 0 ? 100.0 * bw / copy_bw : 100.0, wrong);
}

int perf_fp4(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m)
{
    int rank;
    moea2a_comm_rank(comm, &rank);
    if (rank != 0) return 0; /* a single-device benchmark */
    size_t M = (size_t)o->fp4_rows, K = (size_t)o->hidden, n = M * K, sfb;
    moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, M, K, &sfb);
    uint16_t *hx = malloc(2 * n);
    unsigned char *hq = malloc(n / 2), *hs = malloc(sfb), *cq = malloc(n / 2), *cs = malloc(sfb);
    if (!hx || !hq || !hs || !cq || !cs) return fprintf(stderr, "moea2a_perf --op fp4: out of memory\n"), 1;
    for (size_t i = 0; i < n; i++) { /* finite bf16 values over a wide range */
        uint16_t h = (uint16_t)mix(i);
        hx[i] = (uint16_t)((h & 0x807f) | (0x3800 + (h >> 4 & 0x07ff) % 0x0700));
    }
    void *x = perf_alloc(m, 2 * n), *x2 = perf_alloc(m, 2 * n), *q = perf_alloc(m, n / 2), *sf = perf_alloc(m, sfb);
    float *g = perf_alloc(m, sizeof(float));
    if (!x || !x2 || !q || !sf || !g) return fprintf(stderr, "moea2a_perf --op fp4: out of device memory\n"), 1;
    perf_upload(m, x, hx, 2 * n);
    float hg;
    moea2a_fp4_global_scale(hx, MOEA2A_BFLOAT16, n, &hg, NULL);
    perf_upload(m, g, &hg, sizeof(hg));
    /* checked round: device (or host) against the host reference */
    long wrong = 0;
    moea2a_fp4_quantize(hx, MOEA2A_BFLOAT16, M, K, &hg, hq, hs, MOEA2A_SF_128X4, NULL);
    if (moea2a_fp4_quantize(x, MOEA2A_BFLOAT16, M, K, g, q, sf, MOEA2A_SF_128X4, m->stream) != MOEA2A_SUCCESS)
        return fprintf(stderr, "quantize: %s\n", moea2a_last_error(NULL)), 1;
    perf_download(m, cq, q, n / 2);
    perf_download(m, cs, sf, sfb);
    for (size_t i = 0; i < n / 2; i++) wrong += cq[i] != hq[i];
    for (size_t i = 0; i < sfb; i++) wrong += cs[i] != hs[i];
    /* Each operation runs iters times back to back after its warm-up, timed by events
     * on the stream (launch gaps included, host round trips not). */
    for (int it = 0; it < o->warmup; it++) {
        perf_copy(m, x2, x, 2 * n);
        moea2a_fp4_quantize(x, MOEA2A_BFLOAT16, M, K, g, q, sf, MOEA2A_SF_128X4, m->stream);
        moea2a_fp4_dequantize(q, sf, MOEA2A_SF_128X4, g, M, K, x2, MOEA2A_BFLOAT16, m->stream);
    }
    perf_mark(m, 0);
    for (int it = 0; it < o->iters; it++) perf_copy(m, x2, x, 2 * n);
    perf_mark(m, 1);
    for (int it = 0; it < o->iters; it++) moea2a_fp4_quantize(x, MOEA2A_BFLOAT16, M, K, g, q, sf, MOEA2A_SF_128X4, m->stream);
    perf_mark(m, 2);
    for (int it = 0; it < o->iters; it++) moea2a_fp4_dequantize(q, sf, MOEA2A_SF_128X4, g, M, K, x2, MOEA2A_BFLOAT16, m->stream);
    perf_mark(m, 3);
    double t_copy = perf_span(m, 0, 1), t_q = perf_span(m, 1, 2), t_d = perf_span(m, 2, 3);
    t_copy /= o->iters, t_q /= o->iters, t_d /= o->iters;
    double copy_bytes = 4.0 * (double)n, fp4_bytes = 2.0 * (double)n + (double)n / 2 + (double)sfb;
    double copy_bw = copy_bytes / t_copy / 1e9;
    char w[24];
    snprintf(w, sizeof(w), "%ld", wrong);
    printf("# moea2a_perf --op fp4: %zu x %zu bf16 <-> NVFP4 (128x4 scales), %s memory, %d iterations (%d warm-up)\n", M,
           K, m->cuda ? "cuda" : "host", o->iters, o->warmup);
    printf("#\n# %-12s %14s %10s %10s %10s %7s\n", "op", "bytes", "time(us)", "GB/s", "of copy", "#wrong");
    row("copy", copy_bytes, t_copy, copy_bw, "");
    row("quantize", fp4_bytes, t_q, copy_bw, w);
    row("dequantize", fp4_bytes, t_d, copy_bw, "");
    printf("# Out of bounds values : %d %s\n", wrong > 0, wrong ? "FAILED" : "OK");
    perf_free(m, x), perf_free(m, x2), perf_free(m, q), perf_free(m, sf), perf_free(m, g);
    free(hx), free(hq), free(hs), free(cq), free(cs);
    return wrong ? 3 : 0;
}

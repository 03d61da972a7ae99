/* Where moea2a_perf keeps its buffers: host memory, or the GPU of this rank. One
 * small interface so the benchmarks read the same for both. */
#ifndef MOEA2A_PERF_MEM_H
#define MOEA2A_PERF_MEM_H
#include <stddef.h>
#include <stdint.h>

/* Owner of expert e under contiguous placement: ranks 0..E%ep-1 own E/ep+1 experts. */
static inline int perf_owner(int e, int experts, int ep)
{
    int q = experts / ep, rem = experts % ep;
    return e < rem * (q + 1) ? e / (q + 1) : rem + (e - rem * (q + 1)) / (q ? q : 1);
}

#define PERF_MARKS 512

typedef struct {
    int cuda;     /* 0: host memory */
    void *stream; /* cudaStream_t */
    void *event[PERF_MARKS]; /* CUDA: timing events */
    double host_mark[PERF_MARKS];
} perf_mem_t;

/* Picks this rank's GPU (rank mod device count) and makes a stream; -1 if none. */
int perf_mem_open(perf_mem_t *m, int cuda, int rank);
void perf_mem_close(perf_mem_t *m);
void *perf_alloc(const perf_mem_t *m, size_t bytes);
void perf_free(const perf_mem_t *m, void *p);
void perf_upload(const perf_mem_t *m, void *dst, const void *src, size_t bytes);
void perf_download(const perf_mem_t *m, void *dst, const void *src, size_t bytes);
/* dst <- src within the benchmark's memory, on its stream. */
void perf_copy(const perf_mem_t *m, void *dst, const void *src, size_t bytes);
/* Waits for the stream (no-op on host memory); 0 or -1 on a CUDA error. */
int perf_sync(const perf_mem_t *m);
/* Timing on the stream: perf_mark records mark i (a CUDA event, or the host clock on
 * host memory); perf_span waits for mark b and returns the seconds from a to b. */
void perf_mark(perf_mem_t *m, int i);
double perf_span(perf_mem_t *m, int a, int b);

/* Rows per destination rank from the top-k ids (contiguous placement, each token
 * once per rank), into host `counts`: on CUDA memory a kernel, a copy back and a
 * wait, as a caller needs before sizing an all-to-all. d_counts: scratch [ep]. */
void perf_count_dests(const perf_mem_t *m, int64_t *counts, int64_t *d_counts, const int32_t *ids, int tokens, int k,
                      int experts, int ep);
/* Baseline kernels (host loops on host memory): pack rows[i] = src[index[i]], and
 * out[t] = bf16(sum over j < nd[t] of bf16 rows[pos[t][j]]) in order. */
void perf_gather_rows(const perf_mem_t *m, unsigned char *dst, const unsigned char *src, const int32_t *index,
                      int64_t rows, size_t row_bytes);
void perf_sum_rows(const perf_mem_t *m, uint16_t *out, const unsigned char *rows, const int32_t *pos,
                   const int32_t *nd, int tokens, int k, size_t hidden);
#endif

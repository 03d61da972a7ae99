/* moea2a_perf's GPU-only helpers (perf_gpu.c): streams, graphs, a cuBLAS GEMM. */
#ifndef MOEA2A_PERF_GPU_H
#define MOEA2A_PERF_GPU_H
#include <stddef.h>
#include <stdint.h>

void *perf_stream_new(void); /* a non-blocking stream of the least priority; NULL on failure */
void perf_stream_free(void *s);
/* Work enqueued on waiter from now on starts after what signaller has so far. */
int perf_stream_after(void *waiter, void *signaller);

/* Captures what is enqueued on stream between begin and end into a graph (NULL on
 * failure, the capture ended either way). */
int perf_graph_begin(void *stream);
void *perf_graph_end(void *stream);
int perf_graph_launch(void *graph, void *stream);
void perf_graph_free(void *graph);

int perf_device_sms(void); /* SMs of the current device; 0 without CUDA */

/* A gate on a stream: what is enqueued after perf_gate_close waits until perf_gate_open
 * (a one-thread kernel polls a flag in mapped host memory), so that the host enqueues a
 * whole timed loop before the GPU starts it: no launch gaps inside the loop, whatever
 * the host's time per call (a profiler's tracing included). NULL without CUDA. */
typedef struct perf_gate perf_gate_t;
perf_gate_t *perf_gate_new(void);
int perf_gate_close(perf_gate_t *g, void *stream);
void perf_gate_open(perf_gate_t *g);
void perf_gate_free(perf_gate_t *g);

/* C[m][n] = A[m][k] B[k][n], bf16 in and out, fp32 accumulation, on stream, on sms SMs
 * (cublasSetSmCountTarget; 0: all). NULL with the reason in why when cuBLAS cannot be
 * loaded. */
typedef struct perf_gemm perf_gemm_t;
perf_gemm_t *perf_gemm_open(void *stream, int m, int n, int k, int sms, char *why, size_t why_len);
int perf_gemm_run(perf_gemm_t *g);
void perf_gemm_close(perf_gemm_t *g);

/* cuBLAS's bf16 grouped GEMM (cublasGemmGroupedBatchedEx), the baseline of --op
 * expert-gemm: per expert e, C rows [offsets[e], + rows[e]) = A's same rows x W_e^T,
 * W [experts][n][k] bf16, row strides lda and ldc (elements), fp32 accumulation. */
typedef struct perf_grouped perf_grouped_t;
perf_grouped_t *perf_grouped_open(void *stream, int experts, int n, int k, const void *w, const void *a, void *c,
                                  int lda, int ldc, const int *rows, const int64_t *offsets, char *why, size_t why_len);
/* one_group: the experts as one group of equal problems; else a group per expert */
int perf_grouped_run(perf_grouped_t *g, int one_group);
void perf_grouped_close(perf_grouped_t *g);
#endif

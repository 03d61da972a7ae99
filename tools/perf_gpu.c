/* moea2a_perf's GPU-only helpers: a second stream with cross-stream ordering, CUDA
 * graph capture of back-to-back calls, and a cuBLAS bf16 GEMM (loaded with dlopen,
 * so the tool has no link-time cuBLAS dependency) as the compute that --split
 * overlaps with the exchange. Without CUDA every call reports that it cannot. */
#include "config.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_gpu.h"

#ifdef MOEA2A_HAVE_CUDA
#include <cuda_runtime_api.h>

void *perf_stream_new(void)
{
    cudaStream_t s = NULL;
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    return cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least) == cudaSuccess ? s : NULL;
}

void perf_stream_free(void *s)
{
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

int perf_stream_after(void *waiter, void *signaller)
{
    /* One event, recorded again each time: a wait takes the record made just before it,
     * so the timed loops create and destroy nothing (one rank per process, one thread) */
    static cudaEvent_t e;
    if (!e && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return e = NULL, -1;
    return cudaEventRecord(e, (cudaStream_t)signaller) == cudaSuccess &&
                   cudaStreamWaitEvent((cudaStream_t)waiter, e, 0) == cudaSuccess
               ? 0
               : -1;
}

int perf_graph_begin(void *stream)
{
    return cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeRelaxed) == cudaSuccess ? 0 : -1;
}

void *perf_graph_end(void *stream)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    return e == cudaSuccess ? x : NULL;
}

int perf_graph_launch(void *graph, void *stream)
{
    return cudaGraphLaunch((cudaGraphExec_t)graph, (cudaStream_t)stream) == cudaSuccess ? 0 : -1;
}

void perf_graph_free(void *graph)
{
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---- the gate ---------------------------------------------------------------------- */

int perf_cuda_hold(const int *flag, void *stream); /* perf_kernels.cu */

struct perf_gate {
    volatile int *host; /* mapped: the hold kernel reads it through dev */
    int *dev;
};

perf_gate_t *perf_gate_new(void)
{
    perf_gate_t *g = calloc(1, sizeof(*g));
    void *h = NULL, *d = NULL;
    if (!g || cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
        if (h) cudaFreeHost(h);
        free(g);
        cudaGetLastError();
        return NULL;
    }
    g->host = h, g->dev = d;
    return g;
}

int perf_gate_close(perf_gate_t *g, void *stream)
{
    *g->host = 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return perf_cuda_hold(g->dev, stream);
}

void perf_gate_open(perf_gate_t *g)
{
    __atomic_store_n(g->host, 1, __ATOMIC_RELEASE);
}

void perf_gate_free(perf_gate_t *g)
{
    if (!g) return;
    cudaFreeHost((void *)g->host);
    free(g);
}

/* ---- cuBLAS through dlopen ---------------------------------------------------------- */

/* The few cuBLAS values used (cublas_api.h): CUBLAS_OP_N, CUDA_R_16BF,
 * CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT. */
enum { OP_N = 0, R_16BF = 14, COMPUTE_32F = 68, GEMM_DEFAULT = -1 };
typedef int (*create_fn)(void **);
typedef int (*destroy_fn)(void *);
typedef int (*stream_fn)(void *, void *);
typedef int (*sms_fn)(void *, int);
typedef int (*gemm_fn)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int,
                       const void *, void *, int, int, int, int);

typedef int (*grouped_fn)(void *, const int *, const int *, const int *, const int *, const int *, const void *,
                          const void *const *, int, const int *, const void *const *, int, const int *, const void *,
                          void *const *, int, const int *, int, const int *, int);

/* cuBLAS loaded and a handle on stream (on sms SMs where sms > 0). */
typedef struct {
    void *lib, *handle;
    destroy_fn destroy;
} cublas_t;

struct perf_gemm {
    cublas_t cb;
    void *a, *b, *c;
    int m, n, k;
    gemm_fn gemm;
};

int perf_device_sms(void)
{
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms;
}

static int cublas_open(cublas_t *cb, void *stream, int sms, char *why, size_t why_len)
{
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !cb->lib; i++) cb->lib = dlopen(names[i], RTLD_NOW);
    create_fn create = cb->lib ? (create_fn)dlsym(cb->lib, "cublasCreate_v2") : NULL;
    stream_fn set_stream = cb->lib ? (stream_fn)dlsym(cb->lib, "cublasSetStream_v2") : NULL;
    cb->destroy = cb->lib ? (destroy_fn)dlsym(cb->lib, "cublasDestroy_v2") : NULL;
    if (!create || !set_stream || !cb->destroy) {
        snprintf(why, why_len, "cuBLAS not found (libcublas.so.13 on the library path)");
        return -1;
    }
    /* cuBLAS's Hopper kernels are persistent (one block per SM for the whole GEMM): on
     * its own it takes every SM and the collective waits for it to end */
    sms_fn set_sms = (sms_fn)dlsym(cb->lib, "cublasSetSmCountTarget");
    if (create(&cb->handle) || set_stream(cb->handle, stream) || (sms > 0 && (!set_sms || set_sms(cb->handle, sms)))) {
        snprintf(why, why_len, "cuBLAS set-up failed");
        return -1;
    }
    return 0;
}

static void cublas_close(cublas_t *cb)
{
    if (cb->handle && cb->destroy) cb->destroy(cb->handle);
    if (cb->lib) dlclose(cb->lib);
}

perf_gemm_t *perf_gemm_open(void *stream, int m, int n, int k, int sms, char *why, size_t why_len)
{
    perf_gemm_t *g = calloc(1, sizeof(*g));
    if (!g) return snprintf(why, why_len, "out of memory"), NULL;
    if (cublas_open(&g->cb, stream, sms, why, why_len) || !(g->gemm = (gemm_fn)dlsym(g->cb.lib, "cublasGemmEx"))) {
        if (g->cb.lib && !g->gemm) snprintf(why, why_len, "cuBLAS has no cublasGemmEx");
        perf_gemm_close(g);
        return NULL;
    }
    g->m = m, g->n = n, g->k = k;
    int ok = cudaMalloc(&g->a, 2 * (size_t)m * (size_t)k) == cudaSuccess &&
             cudaMalloc(&g->b, 2 * (size_t)k * (size_t)n) == cudaSuccess &&
             cudaMalloc(&g->c, 2 * (size_t)m * (size_t)n) == cudaSuccess;
    /* 0x3c00 pairs: bf16 1.0078 (finite sums whatever the size) */
    ok = ok && cudaMemset(g->a, 0x3c, 2 * (size_t)m * (size_t)k) == cudaSuccess &&
         cudaMemset(g->b, 0x3c, 2 * (size_t)k * (size_t)n) == cudaSuccess;
    if (!ok) {
        snprintf(why, why_len, "GEMM buffers (%d x %d x %d) failed", m, n, k);
        perf_gemm_close(g);
        return NULL;
    }
    return g;
}

int perf_gemm_run(perf_gemm_t *g)
{
    const float one = 1.0f, zero = 0.0f;
    return g->gemm(g->cb.handle, OP_N, OP_N, g->m, g->n, g->k, &one, g->a, R_16BF, g->m, g->b, R_16BF, g->k, &zero, g->c,
                   R_16BF, g->m, COMPUTE_32F, GEMM_DEFAULT) == 0
               ? 0
               : -1;
}

void perf_gemm_close(perf_gemm_t *g)
{
    if (!g) return;
    cudaFree(g->a), cudaFree(g->b), cudaFree(g->c);
    cublas_close(&g->cb);
    free(g);
}

/* ---- the grouped GEMM baseline of --op expert-gemm ------------------------------------- */

enum { OP_T = 1 };

struct perf_grouped {
    cublas_t cb;
    grouped_fn grouped;
    int experts, n, k;
    int *ops_t, *ops_n, *ms, *ns, *ks, *ldas, *ldbs, *ldcs, *ones;
    float *alpha, *beta;
    void **ptrs; /* device: A, B and C pointer arrays, experts each */
};

perf_grouped_t *perf_grouped_open(void *stream, int experts, int n, int k, const void *w, const void *a, void *c,
                                  int lda, int ldc, const int *rows, const int64_t *offsets, char *why, size_t why_len)
{
    perf_grouped_t *g = calloc(1, sizeof(*g));
    if (!g) return snprintf(why, why_len, "out of memory"), NULL;
    if (cublas_open(&g->cb, stream, 0, why, why_len) ||
        !(g->grouped = (grouped_fn)dlsym(g->cb.lib, "cublasGemmGroupedBatchedEx"))) {
        if (g->cb.lib && !g->grouped) snprintf(why, why_len, "cuBLAS has no cublasGemmGroupedBatchedEx (12.5+)");
        perf_grouped_close(g);
        return NULL;
    }
    g->experts = experts, g->n = n, g->k = k;
    int **arrays[] = {&g->ops_t, &g->ops_n, &g->ms, &g->ns, &g->ks, &g->ldas, &g->ldbs, &g->ldcs, &g->ones};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        if (!(*arrays[i] = calloc((size_t)experts, sizeof(int)))) return perf_grouped_close(g), NULL;
    g->alpha = calloc((size_t)experts, sizeof(float)), g->beta = calloc((size_t)experts, sizeof(float));
    void **h = calloc(3 * (size_t)experts, sizeof(void *));
    if (!g->alpha || !g->beta || !h || cudaMalloc((void **)&g->ptrs, 3 * (size_t)experts * sizeof(void *))) {
        free(h);
        snprintf(why, why_len, "out of memory");
        return perf_grouped_close(g), NULL;
    }
    /* column-major view: C_e^T [n][rows] = W_e ([k][n] column-major, transposed) x A_e^T */
    for (int e = 0; e < experts; e++) {
        g->ops_t[e] = OP_T, g->ops_n[e] = OP_N, g->ms[e] = n, g->ns[e] = rows[e], g->ks[e] = k;
        g->ldas[e] = k, g->ldbs[e] = lda, g->ldcs[e] = ldc, g->ones[e] = 1, g->alpha[e] = 1.0f;
        h[e] = (char *)(uintptr_t)w + 2 * (size_t)e * (size_t)n * (size_t)k;
        h[experts + e] = (char *)(uintptr_t)a + 2 * (size_t)offsets[e] * (size_t)lda;
        h[2 * experts + e] = (char *)c + 2 * (size_t)offsets[e] * (size_t)ldc;
    }
    int rc = cudaMemcpy(g->ptrs, h, 3 * (size_t)experts * sizeof(void *), cudaMemcpyHostToDevice);
    free(h);
    if (rc) return snprintf(why, why_len, "cudaMemcpy failed"), perf_grouped_close(g), NULL;
    return g;
}

int perf_grouped_run(perf_grouped_t *g, int one_group)
{
    /* one_group: the experts as one group of equal problems (a batched GEMM); else one
     * group per expert, as a caller with unequal counts must call it */
    int groups = one_group ? 1 : g->experts, size = g->experts;
    return g->grouped(g->cb.handle, g->ops_t, g->ops_n, g->ms, g->ns, g->ks, g->alpha,
                      (const void *const *)g->ptrs, R_16BF, g->ldas, (const void *const *)(g->ptrs + g->experts),
                      R_16BF, g->ldbs, g->beta, g->ptrs + 2 * g->experts, R_16BF, g->ldcs, groups,
                      one_group ? &size : g->ones, COMPUTE_32F) == 0
               ? 0
               : -1;
}

void perf_grouped_close(perf_grouped_t *g)
{
    if (!g) return;
    int **arrays[] = {&g->ops_t, &g->ops_n, &g->ms, &g->ns, &g->ks, &g->ldas, &g->ldbs, &g->ldcs, &g->ones};
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) free(*arrays[i]);
    free(g->alpha), free(g->beta);
    cudaFree(g->ptrs);
    cublas_close(&g->cb);
    free(g);
}

#else /* no CUDA */

void *perf_stream_new(void) { return NULL; }
void perf_stream_free(void *s) { (void)s; }
int perf_stream_after(void *waiter, void *signaller) { (void)waiter, (void)signaller; return -1; }
int perf_graph_begin(void *stream) { (void)stream; return -1; }
void *perf_graph_end(void *stream) { (void)stream; return NULL; }
int perf_graph_launch(void *graph, void *stream) { (void)graph, (void)stream; return -1; }
void perf_graph_free(void *graph) { (void)graph; }
int perf_device_sms(void) { return 0; }
perf_gate_t *perf_gate_new(void) { return NULL; }
int perf_gate_close(perf_gate_t *g, void *stream) { (void)g, (void)stream; return -1; }
void perf_gate_open(perf_gate_t *g) { (void)g; }
void perf_gate_free(perf_gate_t *g) { (void)g; }
perf_gemm_t *perf_gemm_open(void *stream, int m, int n, int k, int sms, char *why, size_t why_len)
{
    (void)stream, (void)m, (void)n, (void)k, (void)sms;
    snprintf(why, why_len, "this build has no CUDA");
    return NULL;
}
int perf_gemm_run(perf_gemm_t *g) { (void)g; return -1; }
void perf_gemm_close(perf_gemm_t *g) { (void)g; }
perf_grouped_t *perf_grouped_open(void *stream, int experts, int n, int k, const void *w, const void *a, void *c,
                                  int lda, int ldc, const int *rows, const int64_t *offsets, char *why, size_t why_len)
{
    (void)stream, (void)experts, (void)n, (void)k, (void)w, (void)a, (void)c, (void)lda, (void)ldc, (void)rows;
    (void)offsets;
    snprintf(why, why_len, "this build has no CUDA");
    return NULL;
}
int perf_grouped_run(perf_grouped_t *g, int one_group) { (void)g, (void)one_group; return -1; }
void perf_grouped_close(perf_grouped_t *g) { (void)g; }
#endif

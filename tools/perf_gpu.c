/* moea2a_perf's GPU-only helpers: a second stream with cross-stream ordering, CUDA
 * graph capture of back-to-back calls, and a cuBLAS bf16 GEMM (loaded with dlopen,
 * so the tool has no link-time cuBLAS dependency) as the compute that --split
 * overlaps with the exchange. Without CUDA every call reports that it cannot. */
#include "config.h"

#include <dlfcn.h>
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

struct perf_gemm {
    void *lib, *handle, *a, *b, *c;
    int m, n, k;
    destroy_fn destroy;
    gemm_fn gemm;
};

int perf_device_sms(void)
{
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms;
}

perf_gemm_t *perf_gemm_open(void *stream, int m, int n, int k, int sms, char *why, size_t why_len)
{
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    perf_gemm_t *g = calloc(1, sizeof(*g));
    if (!g) return snprintf(why, why_len, "out of memory"), NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !g->lib; i++) g->lib = dlopen(names[i], RTLD_NOW);
    create_fn create = g->lib ? (create_fn)dlsym(g->lib, "cublasCreate_v2") : NULL;
    stream_fn set_stream = g->lib ? (stream_fn)dlsym(g->lib, "cublasSetStream_v2") : NULL;
    g->destroy = g->lib ? (destroy_fn)dlsym(g->lib, "cublasDestroy_v2") : NULL;
    g->gemm = g->lib ? (gemm_fn)dlsym(g->lib, "cublasGemmEx") : NULL;
    if (!create || !set_stream || !g->destroy || !g->gemm) {
        snprintf(why, why_len, "cuBLAS not found (libcublas.so.13 on the library path)");
        perf_gemm_close(g);
        return NULL;
    }
    /* cuBLAS's Hopper kernels are persistent (one block per SM for the whole GEMM): on
     * its own it takes every SM and the collective waits for it to end */
    sms_fn set_sms = (sms_fn)dlsym(g->lib, "cublasSetSmCountTarget");
    g->m = m, g->n = n, g->k = k;
    int ok = create(&g->handle) == 0 && set_stream(g->handle, stream) == 0 &&
             (sms <= 0 || (set_sms && set_sms(g->handle, sms) == 0)) &&
             cudaMalloc(&g->a, 2 * (size_t)m * (size_t)k) == cudaSuccess &&
             cudaMalloc(&g->b, 2 * (size_t)k * (size_t)n) == cudaSuccess &&
             cudaMalloc(&g->c, 2 * (size_t)m * (size_t)n) == cudaSuccess;
    /* 0x3c00 pairs: bf16 1.0078 (finite sums whatever the size) */
    ok = ok && cudaMemset(g->a, 0x3c, 2 * (size_t)m * (size_t)k) == cudaSuccess &&
         cudaMemset(g->b, 0x3c, 2 * (size_t)k * (size_t)n) == cudaSuccess;
    if (!ok) {
        snprintf(why, why_len, "cuBLAS set-up or GEMM buffers (%d x %d x %d) failed", m, n, k);
        perf_gemm_close(g);
        return NULL;
    }
    return g;
}

int perf_gemm_run(perf_gemm_t *g)
{
    const float one = 1.0f, zero = 0.0f;
    return g->gemm(g->handle, OP_N, OP_N, g->m, g->n, g->k, &one, g->a, R_16BF, g->m, g->b, R_16BF, g->k, &zero, g->c,
                   R_16BF, g->m, COMPUTE_32F, GEMM_DEFAULT) == 0
               ? 0
               : -1;
}

void perf_gemm_close(perf_gemm_t *g)
{
    if (!g) return;
    if (g->handle && g->destroy) g->destroy(g->handle);
    cudaFree(g->a), cudaFree(g->b), cudaFree(g->c);
    if (g->lib) dlclose(g->lib);
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
perf_gemm_t *perf_gemm_open(void *stream, int m, int n, int k, int sms, char *why, size_t why_len)
{
    (void)stream, (void)m, (void)n, (void)k, (void)sms;
    snprintf(why, why_len, "this build has no CUDA");
    return NULL;
}
int perf_gemm_run(perf_gemm_t *g) { (void)g; return -1; }
void perf_gemm_close(perf_gemm_t *g) { (void)g; }
#endif

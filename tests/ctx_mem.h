/* Buffers of the MoE tests in a context's kind of memory: host memory, or CUDA device
 * memory (cuda != 0, builds with CUDA). The tests keep their own data on the host:
 * mem_put copies an input where the context wants it, mem_get a result back. */
#ifndef MOEA2A_TEST_CTX_MEM_H
#define MOEA2A_TEST_CTX_MEM_H
#include <stdlib.h>
#include <string.h>
#ifdef MOEA2A_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* bytes holding a copy of h (h NULL: zeros on the host, uninitialized on the device) */
static inline void *mem_put(int cuda, const void *h, size_t bytes)
{
    void *p = NULL;
#ifdef MOEA2A_HAVE_CUDA
    if (cuda) {
        if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
        if (h && bytes) cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice);
        return p;
    }
#endif
    (void)cuda;
    p = calloc(1, bytes ? bytes : 1);
    if (p && h && bytes) memcpy(p, h, bytes);
    return p;
}

static inline void mem_drop(int cuda, void *p)
{
#ifdef MOEA2A_HAVE_CUDA
    if (cuda) {
        cudaFree(p);
        return;
    }
#endif
    (void)cuda;
    free(p);
}

/* host bytes into the context's memory at dst */
static inline void mem_copy_in(int cuda, void *dst, const void *src, size_t bytes)
{
#ifdef MOEA2A_HAVE_CUDA
    if (cuda) {
        cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
        return;
    }
#endif
    (void)cuda;
    memcpy(dst, src, bytes);
}

/* a host copy of bytes of the context's memory (free it; zeros where p is NULL) */
static inline void *mem_get(int cuda, const void *p, size_t bytes)
{
    void *h = calloc(1, bytes ? bytes : 1);
    if (!h || !p || !bytes) return h;
#ifdef MOEA2A_HAVE_CUDA
    if (cuda) {
        cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost);
        return h;
    }
#endif
    (void)cuda;
    memcpy(h, p, bytes);
    return h;
}
#endif

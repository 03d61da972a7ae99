#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "base/convert.h"
#include "perf.h"
#include "perf_mem.h"

#ifdef MOEA2A_HAVE_CUDA
#include <cuda_runtime_api.h>
void perf_cuda_count_dests(int64_t *counts, const int32_t *ids, int tokens, int k, int experts, int ep, void *stream);
void perf_cuda_gather_rows(unsigned char *dst, const unsigned char *src, const int32_t *index, int64_t rows,
                           size_t row_bytes, void *stream);
void perf_cuda_sum_rows(uint16_t *out, const unsigned char *rows, const int32_t *pos, const int32_t *nd, int tokens,
                        int k, size_t hidden, void *stream);
#endif

int perf_mem_open(perf_mem_t *m, int cuda, int rank)
{
    memset(m, 0, sizeof(*m));
    m->cuda = cuda;
    if (!cuda) return 0;
#ifdef MOEA2A_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return -1;
    if (cudaSetDevice(rank % n) != cudaSuccess) return -1;
    /* the greatest priority, as communication streams have: blocks of the calls timed
     * here are scheduled ahead of compute queued on other streams (--split) */
    cudaStream_t s;
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest) != cudaSuccess) return -1;
    m->stream = s;
    for (int i = 0; i < PERF_MARKS; i++)
        if (cudaEventCreate((cudaEvent_t *)&m->event[i]) != cudaSuccess) return -1;
    return rank % n;
#else
    (void)rank;
    return -1;
#endif
}

void perf_mem_close(perf_mem_t *m)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->stream) cudaStreamDestroy((cudaStream_t)m->stream);
    for (int i = 0; i < PERF_MARKS; i++)
        if (m->event[i]) cudaEventDestroy((cudaEvent_t)m->event[i]);
#endif
    m->stream = NULL;
}

void *perf_alloc(const perf_mem_t *m, size_t bytes)
{
    void *p = NULL;
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
#endif
    p = malloc(bytes ? bytes : 1);
    return p;
}

void perf_free(const perf_mem_t *m, void *p)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

/* A copy between host and the benchmark's memory; host memory is plain memcpy. */
static void transfer(const perf_mem_t *m, void *dst, const void *src, size_t bytes, int to_host)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        if (to_host) cudaStreamSynchronize((cudaStream_t)m->stream);
        cudaMemcpy(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice);
        return;
    }
#endif
    (void)to_host;
    memcpy(dst, src, bytes);
}

void perf_upload(const perf_mem_t *m, void *dst, const void *src, size_t bytes) { transfer(m, dst, src, bytes, 0); }
void perf_download(const perf_mem_t *m, void *dst, const void *src, size_t bytes) { transfer(m, dst, src, bytes, 1); }

void perf_copy(const perf_mem_t *m, void *dst, const void *src, size_t bytes)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)m->stream);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

int perf_sync(const perf_mem_t *m)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) return cudaStreamSynchronize((cudaStream_t)m->stream) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

void perf_mark(perf_mem_t *m, int i)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        cudaEventRecord((cudaEvent_t)m->event[i], (cudaStream_t)m->stream);
        return;
    }
#endif
    m->host_mark[i] = perf_now();
}

double perf_span(perf_mem_t *m, int a, int b)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        float ms = 0;
        cudaEventSynchronize((cudaEvent_t)m->event[b]);
        cudaEventElapsedTime(&ms, (cudaEvent_t)m->event[a], (cudaEvent_t)m->event[b]);
        return ms * 1e-3;
    }
#endif
    return m->host_mark[b] - m->host_mark[a];
}

void perf_gather_rows(const perf_mem_t *m, unsigned char *dst, const unsigned char *src, const int32_t *index,
                      int64_t rows, size_t row_bytes)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        perf_cuda_gather_rows(dst, src, index, rows, row_bytes, m->stream);
        return;
    }
#endif
    for (int64_t i = 0; i < rows; i++) memcpy(dst + (size_t)i * row_bytes, src + (size_t)index[i] * row_bytes, row_bytes);
}

void perf_count_dests(const perf_mem_t *m, int64_t *counts, int64_t *d_counts, const int32_t *ids, int tokens, int k,
                      int experts, int ep)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        perf_cuda_count_dests(d_counts, ids, tokens, k, experts, ep, m->stream);
        cudaMemcpyAsync(counts, d_counts, sizeof(int64_t) * (size_t)ep, cudaMemcpyDeviceToHost, (cudaStream_t)m->stream);
        cudaStreamSynchronize((cudaStream_t)m->stream);
        return;
    }
#endif
    (void)d_counts;
    memset(counts, 0, sizeof(int64_t) * (size_t)ep);
    for (int t = 0; t < tokens; t++) {
        int seen[64], nd = 0;
        for (int j = 0; j < k; j++) {
            int r = perf_owner(ids[t * k + j], experts, ep), dup = 0;
            for (int i = 0; i < nd; i++) dup |= seen[i] == r;
            if (dup || nd == 64) continue;
            seen[nd++] = r;
            counts[r]++;
        }
    }
}

void perf_sum_rows(const perf_mem_t *m, uint16_t *out, const unsigned char *rows, const int32_t *pos,
                   const int32_t *nd, int tokens, int k, size_t hidden)
{
#ifdef MOEA2A_HAVE_CUDA
    if (m->cuda) {
        perf_cuda_sum_rows(out, rows, pos, nd, tokens, k, hidden, m->stream);
        return;
    }
#endif
    for (int t = 0; t < tokens; t++)
        for (size_t h = 0; h < hidden; h++) {
            float acc = 0;
            for (int j = 0; j < nd[t]; j++) {
                uint16_t v;
                memcpy(&v, rows + ((size_t)pos[t * k + j] * hidden + h) * 2, 2);
                acc += m2a_bf16_to_f32(v);
            }
            out[(size_t)t * hidden + h] = m2a_f32_to_bf16(acc);
        }
}

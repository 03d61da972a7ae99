/* The baseline's two kernels: what a framework would launch around a plain NCCL
 * all-to-all (pack rows per destination; gather-sum the rows that come back); and the
 * gate's hold kernel (perf_gpu.h). */
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void gather_rows(unsigned char *dst, const unsigned char *src, const int32_t *index, int64_t rows,
                            size_t row_bytes)
{
    bool vec = (row_bytes & 15) == 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const unsigned char *s = src + (size_t)index[r] * row_bytes;
        unsigned char *d = dst + (size_t)r * row_bytes;
        if (vec)
            for (size_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
                reinterpret_cast<int4 *>(d)[i] = reinterpret_cast<const int4 *>(s)[i];
        else
            for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
    }
}

__global__ void sum_rows(uint16_t *out, const unsigned char *rows, const int32_t *pos, const int32_t *nd, int tokens,
                         int k, size_t hidden)
{
    for (int t = blockIdx.x; t < tokens; t += gridDim.x)
        for (size_t h = threadIdx.x; h < hidden; h += blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < nd[t]; j++) {
                uint16_t v = reinterpret_cast<const uint16_t *>(rows)[(size_t)pos[t * k + j] * hidden + h];
                acc += __uint_as_float((uint32_t)v << 16);
            }
            uint32_t u = __float_as_uint(acc);
            out[(size_t)t * hidden + h] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
}

/* Rows per destination rank, as a caller must compute them on the GPU (each token
 * once per rank that owns one of its experts) before sizing an all-to-all. */
__global__ void count_dests(int64_t *counts, const int32_t *ids, int tokens, int k, int experts, int ep)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    int q = experts / ep, rem = experts % ep, seen[64], nd = 0;
    for (int j = 0; j < k; j++) {
        int e = ids[t * k + j];
        int r = e < rem * (q + 1) ? e / (q + 1) : rem + (e - rem * (q + 1)) / (q ? q : 1);
        bool dup = false;
        for (int i = 0; i < nd; i++) dup |= seen[i] == r;
        if (dup || nd == 64) continue;
        seen[nd++] = r;
        atomicAdd((unsigned long long *)&counts[r], 1ull);
    }
}

extern "C" void perf_cuda_count_dests(int64_t *counts, const int32_t *ids, int tokens, int k, int experts, int ep,
                                      void *stream)
{
    cudaMemsetAsync(counts, 0, sizeof(int64_t) * (size_t)ep, (cudaStream_t)stream);
    if (tokens > 0) count_dests<<<(tokens + 255) / 256, 256, 0, (cudaStream_t)stream>>>(counts, ids, tokens, k, experts, ep);
}

extern "C" void perf_cuda_gather_rows(unsigned char *dst, const unsigned char *src, const int32_t *index, int64_t rows,
                                      size_t row_bytes, void *stream)
{
    if (rows > 0) gather_rows<<<(unsigned)(rows < 65535 ? rows : 65535), 256, 0, (cudaStream_t)stream>>>(dst, src, index, rows, row_bytes);
}

extern "C" void perf_cuda_sum_rows(uint16_t *out, const unsigned char *rows, const int32_t *pos, const int32_t *nd,
                                   int tokens, int k, size_t hidden, void *stream)
{
    if (tokens > 0) sum_rows<<<(unsigned)(tokens < 65535 ? tokens : 65535), 256, 0, (cudaStream_t)stream>>>(out, rows, pos, nd, tokens, k, hidden);
}

/* One thread polls a flag in mapped host memory until the host sets it. */
__global__ void hold(const volatile int *flag)
{
    while (!*flag) __nanosleep(256);
}

extern "C" int perf_cuda_hold(const int *flag, void *stream)
{
    hold<<<1, 1, 0, (cudaStream_t)stream>>>(flag);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

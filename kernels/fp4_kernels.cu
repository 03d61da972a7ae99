/* NVFP4 kernels: one thread per block of 16 values, running the arithmetic of
 * lib/fp4_math.h (shared with the host reference, hence the same bits). On sm_90
 * there is no hardware E2M1 conversion, so that code path is the software one. */
#include <cuda_runtime.h>

#include "fp4_kernels.h"
#include "fp4_math.h"

namespace {

template <moea2a_datatype_t T> struct In;
template <> struct In<MOEA2A_BFLOAT16> {
    static __device__ float at(const void *x, size_t i) { return m2a_bf16_to_f32(static_cast<const uint16_t *>(x)[i]); }
    static __device__ void put(void *x, size_t i, float f) { static_cast<uint16_t *>(x)[i] = m2a_f32_to_bf16(f); }
};
template <> struct In<MOEA2A_FLOAT16> {
    static __device__ float at(const void *x, size_t i) { return m2a_f16_to_f32(static_cast<const uint16_t *>(x)[i]); }
    static __device__ void put(void *x, size_t i, float f) { static_cast<uint16_t *>(x)[i] = m2a_f32_to_f16(f); }
};
template <> struct In<MOEA2A_FLOAT32> {
    static __device__ float at(const void *x, size_t i) { return static_cast<const float *>(x)[i]; }
    static __device__ void put(void *x, size_t i, float f) { static_cast<float *>(x)[i] = f; }
};

/* P consecutive blocks of a row per thread (P = 2 when a row has an even number of
 * blocks): more bytes in flight per thread and 16-byte stores of the packed values. */
template <moea2a_datatype_t T, int P>
__global__ void quantize(const void *x, size_t m, size_t k, const float *g, unsigned char *q, unsigned char *sf, int layout)
{
    const size_t kb_n = k / 16, units = m * kb_n / P;
    const float gs = *g;
    for (size_t u = blockIdx.x * (size_t)blockDim.x + threadIdx.x; u < units; u += (size_t)gridDim.x * blockDim.x) {
        size_t b0 = u * P, r = b0 / kb_n, kb0 = b0 % kb_n;
        float v[P][M2A_FP4_BLOCK];
        if (T == MOEA2A_BFLOAT16 || T == MOEA2A_FLOAT16) { /* 32 bytes a block: 16-byte loads */
            const int4 *src = reinterpret_cast<const int4 *>(static_cast<const uint16_t *>(x) + r * k + kb0 * 16);
            int4 raw[2 * P];
#pragma unroll
            for (int i = 0; i < 2 * P; i++) raw[i] = src[i];
#pragma unroll
            for (int p = 0; p < P; p++) {
                const uint16_t *h = reinterpret_cast<const uint16_t *>(&raw[2 * p]);
#pragma unroll
                for (int i = 0; i < 16; i++) v[p][i] = T == MOEA2A_BFLOAT16 ? m2a_bf16_to_f32(h[i]) : m2a_f16_to_f32(h[i]);
            }
        } else {
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int i = 0; i < M2A_FP4_BLOCK; i++) v[p][i] = In<T>::at(x, r * k + (kb0 + p) * 16 + i);
        }
        __align__(16) uint8_t packed[8 * P];
        uint8_t s[P];
#pragma unroll
        for (int p = 0; p < P; p++) s[p] = m2a_fp4_block(v[p], gs, packed + 8 * p);
        unsigned char *qd = q + r * (k / 2) + kb0 * 8;
        if (P == 2) *reinterpret_cast<int4 *>(qd) = *reinterpret_cast<const int4 *>(packed);
        else *reinterpret_cast<uint2 *>(qd) = *reinterpret_cast<const uint2 *>(packed);
#pragma unroll
        for (int p = 0; p < P; p++) sf[m2a_sf_offset(layout, r, kb0 + p, kb_n)] = s[p];
    }
}

template <moea2a_datatype_t T>
__global__ void dequantize(const unsigned char *q, const unsigned char *sf, int layout, const float *g, size_t m,
                           size_t k, void *out)
{
    const size_t kb_n = k / 16, blocks = m * kb_n;
    const float inv_g = 1.0f / *g;
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < blocks; b += (size_t)gridDim.x * blockDim.x) {
        size_t r = b / kb_n, kb = b % kb_n;
        float s = m2a_e4m3_to_f32(sf[m2a_sf_offset(layout, r, kb, kb_n)]);
        uint2 raw = *reinterpret_cast<const uint2 *>(q + r * (k / 2) + kb * 8);
        const uint8_t *bytes = reinterpret_cast<const uint8_t *>(&raw);
        if (T == MOEA2A_BFLOAT16 || T == MOEA2A_FLOAT16) { /* 32 bytes out in two stores */
            __align__(16) uint16_t h[M2A_FP4_BLOCK];
#pragma unroll
            for (int i = 0; i < M2A_FP4_BLOCK; i++) {
                float f = m2a_fp4_value((uint8_t)(i % 2 ? bytes[i / 2] >> 4 : bytes[i / 2] & 15), s, inv_g);
                h[i] = T == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(f) : m2a_f32_to_f16(f);
            }
            int4 *dst = reinterpret_cast<int4 *>(static_cast<uint16_t *>(out) + r * k + kb * 16);
            dst[0] = *reinterpret_cast<const int4 *>(h);
            dst[1] = *reinterpret_cast<const int4 *>(h + 8);
        } else {
#pragma unroll
            for (int i = 0; i < M2A_FP4_BLOCK; i++)
                In<T>::put(out, r * k + kb * 16 + i,
                           m2a_fp4_value((uint8_t)(i % 2 ? bytes[i / 2] >> 4 : bytes[i / 2] & 15), s, inv_g));
        }
    }
}

/* One thread per destination byte, padding included (written 0). */
__global__ void sf_convert(const unsigned char *src, int sl, unsigned char *dst, int dl, size_t m, size_t kb_n,
                           const int32_t *counts, int stride, size_t dst_bytes)
{
    const size_t rows = dl == 1 ? (m + 127) / 128 * 128 : dl == 2 ? (m + 7) / 8 * 8 : m;
    const size_t kb4 = dl == 0 ? kb_n : (kb_n + 3) / 4 * 4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * kb4; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / kb4, kb = i % kb4;
        bool real = r < m && kb < kb_n && (!counts || (int)(r % stride) < counts[r / stride]);
        size_t o = m2a_sf_offset(dl, r, kb, kb_n);
        if (o < dst_bytes) dst[o] = real ? src[m2a_sf_offset(sl, r, kb, kb_n)] : 0;
    }
}

/* amax over |x| by the bits (NaN ranks above inf, as on the host), then g. */
template <moea2a_datatype_t T> __global__ void amax_bits(const void *x, size_t n, unsigned int *amax)
{
    unsigned int local = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local = max(local, __float_as_uint(In<T>::at(x, i)) & 0x7fffffffu);
    for (int off = 16; off > 0; off /= 2) local = max(local, __shfl_down_sync(0xffffffffu, local, off));
    if ((threadIdx.x & 31) == 0 && local) atomicMax(amax, local);
}

__global__ void global_from_amax(const unsigned int *amax, float *g)
{
    *g = *amax == 0 ? 1.0f : (M2A_E4M3_MAX * 6.0f) / __uint_as_float(*amax);
}

int grid_for(size_t work)
{
    size_t b = (work + 255) / 256;
    return (int)(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b);
}

} // namespace

extern "C" int m2a_cuda_fp4_global_scale(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned int *amax = reinterpret_cast<unsigned int *>(g); /* g doubles as the scratch word */
    cudaMemsetAsync(amax, 0, sizeof(unsigned int), s);
    if (count) {
        switch (xtype) {
        case MOEA2A_BFLOAT16: amax_bits<MOEA2A_BFLOAT16><<<grid_for(count), 256, 0, s>>>(x, count, amax); break;
        case MOEA2A_FLOAT16: amax_bits<MOEA2A_FLOAT16><<<grid_for(count), 256, 0, s>>>(x, count, amax); break;
        default: amax_bits<MOEA2A_FLOAT32><<<grid_for(count), 256, 0, s>>>(x, count, amax); break;
        }
    }
    global_from_amax<<<1, 1, 0, s>>>(amax, g);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q,
                                     void *sf, int layout, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    size_t blocks = m * (k / 16);
    unsigned char *qb = static_cast<unsigned char *>(q), *sfb = static_cast<unsigned char *>(sf);
    if (layout != 0) cudaMemsetAsync(sf, 0, m2a_sf_bytes(layout, m, k / 16), s); /* tile padding */
    bool pair = (k / 16) % 2 == 0 && ((uintptr_t)q & 15) == 0;
#define M2A_QUANT(T) \
    (pair ? quantize<T, 2><<<grid_for(blocks / 2), 256, 0, s>>>(x, m, k, g, qb, sfb, layout) \
          : quantize<T, 1><<<grid_for(blocks), 256, 0, s>>>(x, m, k, g, qb, sfb, layout))
    switch (xtype) {
    case MOEA2A_BFLOAT16: M2A_QUANT(MOEA2A_BFLOAT16); break;
    case MOEA2A_FLOAT16: M2A_QUANT(MOEA2A_FLOAT16); break;
    default: M2A_QUANT(MOEA2A_FLOAT32); break;
    }
#undef M2A_QUANT
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_dequantize(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k,
                                       void *out, moea2a_datatype_t otype, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    size_t blocks = m * (k / 16);
    const unsigned char *qb = static_cast<const unsigned char *>(q), *sfb = static_cast<const unsigned char *>(sf);
    switch (otype) {
    case MOEA2A_BFLOAT16: dequantize<MOEA2A_BFLOAT16><<<grid_for(blocks), 256, 0, s>>>(qb, sfb, layout, g, m, k, out); break;
    case MOEA2A_FLOAT16: dequantize<MOEA2A_FLOAT16><<<grid_for(blocks), 256, 0, s>>>(qb, sfb, layout, g, m, k, out); break;
    default: dequantize<MOEA2A_FLOAT32><<<grid_for(blocks), 256, 0, s>>>(qb, sfb, layout, g, m, k, out); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_sf_convert(const void *src, int src_layout, void *dst, int dst_layout, size_t m, size_t k,
                                       const int32_t *counts, int stride, void *stream)
{
    size_t kb_n = k / 16, bytes = m2a_sf_bytes(dst_layout, m, kb_n);
    size_t work = dst_layout == 0 ? m * kb_n : bytes;
    sf_convert<<<grid_for(work), 256, 0, (cudaStream_t)stream>>>(static_cast<const unsigned char *>(src), src_layout,
                                                                 static_cast<unsigned char *>(dst), dst_layout, m, kb_n,
                                                                 counts, stride, bytes);
    return (int)cudaGetLastError();
}

/* NVFP4 kernels: one thread per half block (8 values), running the arithmetic of
 * lib/fp4_math.h (shared with the host reference, hence the same bits). On sm_90
 * there is no hardware E2M1 conversion, so that code path is the software one. */
#include <cuda_runtime.h>

#include "fp4_kernels.h"
#include "fp4_math.h"

namespace {

template <moea2a_datatype_t T> struct In;
template <> struct In<MOEA2A_BFLOAT16> {
    static __device__ float at(const void *x, size_t i) { return m2a_bf16_to_f32(static_cast<const uint16_t *>(x)[i]); }
};
template <> struct In<MOEA2A_FLOAT16> {
    static __device__ float at(const void *x, size_t i) { return m2a_f16_to_f32(static_cast<const uint16_t *>(x)[i]); }
};
template <> struct In<MOEA2A_FLOAT32> {
    static __device__ float at(const void *x, size_t i) { return static_cast<const float *>(x)[i]; }
};

/* Eight 16-bit inputs as fp32. */
template <moea2a_datatype_t T> __device__ __forceinline__ void widen8(uint4 raw, float *v)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint16_t lo = (uint16_t)(w[i] & 0xffffu), hi = (uint16_t)(w[i] >> 16);
        v[2 * i] = T == MOEA2A_BFLOAT16 ? m2a_bf16_to_f32(lo) : m2a_f16_to_f32(lo);
        v[2 * i + 1] = T == MOEA2A_BFLOAT16 ? m2a_bf16_to_f32(hi) : m2a_f16_to_f32(hi);
    }
}

/* Quantize, one thread per half block (8 inputs, 16 bytes in, 4 bytes out): a warp
 * reads 512 contiguous bytes and writes 128, and the two halves of a block meet by
 * a shuffle. Loops are warp-uniform so every lane reaches every shuffle. When a row
 * has a multiple of 4 blocks, the scales of 4 consecutive blocks (4 adjacent bytes in
 * every layout) leave as one 32-bit store. */
template <moea2a_datatype_t T, typename I>
__global__ void __launch_bounds__(256) quantize_halves(const void *x, I halves, I kb_n, const float *g,
                                                       uint32_t *q, unsigned char *sf, int layout)
{
    const float gs = *g;
    const int lane = threadIdx.x & 31;
    const bool words = kb_n % 4 == 0;
    const I step = (I)gridDim.x * blockDim.x;
    for (I base = (I)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); base < halves; base += step) {
        const I h = base + lane;
        const bool live = h < halves;
        float v[8];
        if (T == MOEA2A_FLOAT32) {
            const float4 *src = reinterpret_cast<const float4 *>(x) + 2 * h;
            float4 a = live ? __ldcs(src) : make_float4(0, 0, 0, 0), b = live ? __ldcs(src + 1) : make_float4(0, 0, 0, 0);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
            uint4 raw = live ? __ldcs(reinterpret_cast<const uint4 *>(x) + h) : make_uint4(0, 0, 0, 0);
            widen8<T>(raw, v);
        }
        float amax = 0.0f;
        int finite = 1;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            finite &= isfinite(v[i]) ? 1 : 0;
            amax = fmaxf(amax, m2a_abs_f32(v[i]));
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        finite &= __shfl_xor_sync(0xffffffffu, finite, 1);
        float inv;
        uint8_t s = m2a_fp4_scale(amax, finite, gs, &inv);
        if (live) __stcs(q + h, m2a_fp4_encode8(v, inv, finite));
        const I b = h / 2, r = b / kb_n, kb = b - r * kb_n;
        if (words) {
            uint32_t w = s | (uint32_t)__shfl_down_sync(0xffffffffu, s, 2) << 8 |
                         (uint32_t)__shfl_down_sync(0xffffffffu, s, 4) << 16 |
                         (uint32_t)__shfl_down_sync(0xffffffffu, s, 6) << 24;
            if (live && lane % 8 == 0)
                *reinterpret_cast<uint32_t *>(sf + m2a_sf_offset(layout, r, kb, kb_n)) = w;
        } else if (live && lane % 2 == 0) {
            sf[m2a_sf_offset(layout, r, kb, kb_n)] = s;
        }
    }
}

/* Dequantize, one thread per half block: 4 bytes of codes in, 8 values out (16
 * bytes for bf16/fp16, 32 for fp32), contiguous across the warp. */
template <moea2a_datatype_t T, typename I>
__global__ void __launch_bounds__(256) dequantize_halves(const uint32_t *q, const unsigned char *sf, int layout,
                                                         const float *g, I halves, I kb_n, void *out)
{
    const float inv_g = 1.0f / *g;
    const I step = (I)gridDim.x * blockDim.x;
    for (I h = (I)blockIdx.x * blockDim.x + threadIdx.x; h < halves; h += step) {
        const I b = h / 2, r = b / kb_n;
        const uint32_t codes = __ldcs(q + h);
        const float s = m2a_e4m3_to_f32(sf[m2a_sf_offset(layout, r, b - r * kb_n, kb_n)]);
        float f[8];
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = m2a_fp4_value((uint8_t)((codes >> (4 * i)) & 15u), s, inv_g);
        if (T == MOEA2A_FLOAT32) {
            float4 *dst = reinterpret_cast<float4 *>(out) + 2 * h;
            __stcs(dst, make_float4(f[0], f[1], f[2], f[3]));
            __stcs(dst + 1, make_float4(f[4], f[5], f[6], f[7]));
        } else {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint16_t lo = T == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(f[2 * i]) : m2a_f32_to_f16(f[2 * i]);
                uint16_t hi = T == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(f[2 * i + 1]) : m2a_f32_to_f16(f[2 * i + 1]);
                w[i] = lo | (uint32_t)hi << 16;
            }
            __stcs(reinterpret_cast<uint4 *>(out) + h, make_uint4(w[0], w[1], w[2], w[3]));
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

/* The half-block kernels read 16-byte vectors and write 4-byte words: lib/fp4.c
 * has checked that the buffers are aligned for them (rows are, k being a multiple
 * of 16 elements). */
extern "C" int m2a_cuda_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q,
                                     void *sf, int layout, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    size_t kb_n = k / 16, halves = m * kb_n * 2;
    unsigned char *sfb = static_cast<unsigned char *>(sf);
    /* tile padding, where the tiled layouts have any */
    if (m2a_sf_bytes(layout, m, kb_n) != m * kb_n) cudaMemsetAsync(sf, 0, m2a_sf_bytes(layout, m, kb_n), s);
    int grid = grid_for(halves);
    uint32_t *qw = static_cast<uint32_t *>(q);
    /* 32-bit index arithmetic where it fits: divisions by kb_n are much cheaper */
    bool narrow = halves + 256u * (size_t)grid < (1ull << 32);
#define M2A_Q(T)                                                                                            \
    (narrow ? quantize_halves<T, uint32_t><<<grid, 256, 0, s>>>(x, (uint32_t)halves, (uint32_t)kb_n, g, qw, sfb, layout) \
            : quantize_halves<T, size_t><<<grid, 256, 0, s>>>(x, halves, kb_n, g, qw, sfb, layout))
    switch (xtype) {
    case MOEA2A_BFLOAT16: M2A_Q(MOEA2A_BFLOAT16); break;
    case MOEA2A_FLOAT16: M2A_Q(MOEA2A_FLOAT16); break;
    default: M2A_Q(MOEA2A_FLOAT32); break;
    }
#undef M2A_Q
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_dequantize(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k,
                                       void *out, moea2a_datatype_t otype, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    size_t kb_n = k / 16, halves = m * kb_n * 2;
    const uint32_t *qw = static_cast<const uint32_t *>(q);
    const unsigned char *sfb = static_cast<const unsigned char *>(sf);
    int grid = grid_for(halves);
    bool narrow = halves + 256u * (size_t)grid < (1ull << 32);
#define M2A_D(T)                                                                                                \
    (narrow ? dequantize_halves<T, uint32_t><<<grid, 256, 0, s>>>(qw, sfb, layout, g, (uint32_t)halves, (uint32_t)kb_n, out) \
            : dequantize_halves<T, size_t><<<grid, 256, 0, s>>>(qw, sfb, layout, g, halves, kb_n, out))
    switch (otype) {
    case MOEA2A_BFLOAT16: M2A_D(MOEA2A_BFLOAT16); break;
    case MOEA2A_FLOAT16: M2A_D(MOEA2A_FLOAT16); break;
    default: M2A_D(MOEA2A_FLOAT32); break;
    }
#undef M2A_D
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

/* FP8 block quantization kernels: one warp per block of 128 values of a row, each lane
 * four consecutive values (one 8- or 16-byte load, one 4-byte store of codes). The
 * arithmetic is lib/fp8_math.h's, the host reference's, so the bits are the same;
 * tests/test_fp8.c compares them. */
#include <cuda_runtime.h>

#include "fp8_kernels.h"
#include "fp8_math.h"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

/* Four consecutive values in and out as fp32: bf16 and fp16 through the reference
 * conversions (lib/convert.h), so the bits are the host's. */
template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float)> struct Io16 {
    static __device__ void load4(const void *x, size_t i, float *v)
    {
        const uint2 w = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(x) + i);
        v[0] = ToF32((uint16_t)w.x), v[1] = ToF32((uint16_t)(w.x >> 16));
        v[2] = ToF32((uint16_t)w.y), v[3] = ToF32((uint16_t)(w.y >> 16));
    }
    static __device__ void store4(void *o, size_t i, const float *v)
    {
        uint2 w;
        w.x = FromF32(v[0]) | (uint32_t)FromF32(v[1]) << 16;
        w.y = FromF32(v[2]) | (uint32_t)FromF32(v[3]) << 16;
        *reinterpret_cast<uint2 *>(static_cast<uint16_t *>(o) + i) = w;
    }
};
template <moea2a_datatype_t T> struct Io;
template <> struct Io<MOEA2A_BFLOAT16> : Io16<m2a_bf16_to_f32, m2a_f32_to_bf16> {};
template <> struct Io<MOEA2A_FLOAT16> : Io16<m2a_f16_to_f32, m2a_f32_to_f16> {};
template <> struct Io<MOEA2A_FLOAT32> {
    static __device__ void load4(const void *x, size_t i, float *v)
    {
        const float4 w = *reinterpret_cast<const float4 *>(static_cast<const float *>(x) + i);
        v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
    }
    static __device__ void store4(void *o, size_t i, const float *v)
    {
        *reinterpret_cast<float4 *>(static_cast<float *>(o) + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
};

/* Units are (row, block) pairs in row order; a warp takes every kWarps x gridDim.x-th. */
template <moea2a_datatype_t T>
__global__ void __launch_bounds__(kThreads) quantize(const void *x, size_t m, size_t k, uint32_t *q,
                                                     unsigned char *scales, int layout, int ue8m0)
{
    const int lane = threadIdx.x & 31;
    const size_t nkb = k / M2A_FP8_BLOCK, units = m * nkb, m_pad = (m + 3) / 4 * 4;
    for (size_t u = (size_t)blockIdx.x * kWarps + threadIdx.x / 32; u < units; u += (size_t)gridDim.x * kWarps) {
        const size_t r = u / nkb, kb = u - r * nkb, at = r * k + kb * M2A_FP8_BLOCK + 4 * (size_t)lane;
        float v[4];
        Io<T>::load4(x, at, v);
        uint32_t amax_bits = 0; /* |v| as bits: ordered like the values for non-NaN */
        int finite = 1;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            finite &= isfinite(v[i]) != 0;
            amax_bits = max(amax_bits, m2a_f32_bits(v[i]) & 0x7fffffffu);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, o));
        finite = __all_sync(0xffffffffu, finite);
        float mul;
        const uint32_t s = m2a_fp8_scale(m2a_bits_f32(amax_bits), finite, ue8m0, &mul);
        uint32_t codes = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) codes |= (uint32_t)m2a_fp8_code(v[i], mul, finite) << (8 * i);
        q[at / 4] = codes;
        if (lane == 0) {
            unsigned char *dst = scales + m2a_fp8_scale_offset(layout, ue8m0, r, kb, nkb, m_pad);
            if (ue8m0) *dst = (unsigned char)s;
            else *reinterpret_cast<uint32_t *>(dst) = s;
        }
    }
}

template <moea2a_datatype_t T>
__global__ void __launch_bounds__(kThreads) dequantize(const uint32_t *q, const unsigned char *scales, int layout,
                                                       int ue8m0, size_t m, size_t k, void *out)
{
    const int lane = threadIdx.x & 31;
    const size_t nkb = k / M2A_FP8_BLOCK, units = m * nkb, m_pad = (m + 3) / 4 * 4;
    for (size_t u = (size_t)blockIdx.x * kWarps + threadIdx.x / 32; u < units; u += (size_t)gridDim.x * kWarps) {
        const size_t r = u / nkb, kb = u - r * nkb, at = r * k + kb * M2A_FP8_BLOCK + 4 * (size_t)lane;
        const unsigned char *src = scales + m2a_fp8_scale_offset(layout, ue8m0, r, kb, nkb, m_pad);
        const float s = m2a_fp8_scale_value(ue8m0 ? *src : *reinterpret_cast<const uint32_t *>(src), ue8m0);
        const uint32_t codes = q[at / 4];
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = m2a_fp8_value((uint8_t)(codes >> (8 * i)), s);
        Io<T>::store4(out, at, v);
    }
}

/* Enough warps to fill the device (8 blocks of 256 per SM), fewer for small tensors. */
int grid_for(size_t units)
{
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const size_t b = (units + kWarps - 1) / kWarps, cap = (size_t)sms * 8;
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

} // namespace

/* lib/fp8.c has checked the alignment (values and codes 16 bytes, scales 4) and k. */
extern "C" int m2a_cuda_fp8_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                                     int layout, int ue8m0, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t nkb = k / M2A_FP8_BLOCK, bytes = m2a_fp8_scale_bytes(layout, ue8m0, m, nkb);
    /* padding rows (MN-major) and unused bytes of UE8M0 words are 0 */
    if (bytes != m * nkb * (ue8m0 ? 1 : 4)) cudaMemsetAsync(scales, 0, bytes, s);
    const int grid = grid_for(m * nkb);
    uint32_t *qw = static_cast<uint32_t *>(q);
    unsigned char *sb = static_cast<unsigned char *>(scales);
    switch (xtype) {
    case MOEA2A_BFLOAT16: quantize<MOEA2A_BFLOAT16><<<grid, kThreads, 0, s>>>(x, m, k, qw, sb, layout, ue8m0); break;
    case MOEA2A_FLOAT16: quantize<MOEA2A_FLOAT16><<<grid, kThreads, 0, s>>>(x, m, k, qw, sb, layout, ue8m0); break;
    default: quantize<MOEA2A_FLOAT32><<<grid, kThreads, 0, s>>>(x, m, k, qw, sb, layout, ue8m0); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp8_dequantize(const void *q, const void *scales, int layout, int ue8m0, size_t m, size_t k,
                                       void *out, moea2a_datatype_t otype, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int grid = grid_for(m * (k / M2A_FP8_BLOCK));
    const uint32_t *qw = static_cast<const uint32_t *>(q);
    const unsigned char *sb = static_cast<const unsigned char *>(scales);
    switch (otype) {
    case MOEA2A_BFLOAT16: dequantize<MOEA2A_BFLOAT16><<<grid, kThreads, 0, s>>>(qw, sb, layout, ue8m0, m, k, out); break;
    case MOEA2A_FLOAT16: dequantize<MOEA2A_FLOAT16><<<grid, kThreads, 0, s>>>(qw, sb, layout, ue8m0, m, k, out); break;
    default: dequantize<MOEA2A_FLOAT32><<<grid, kThreads, 0, s>>>(qw, sb, layout, ue8m0, m, k, out); break;
    }
    return (int)cudaGetLastError();
}

/* FP8 block quantization kernels: one thread per 16 consecutive values of a row (32
 * or 64 bytes in, 16 bytes of codes out), eight threads per block of 128. They give
 * the bits of the host reference (lib/quant/fp8_math.h) with the arithmetic of
 * fp8_device.cuh, and the hardware 16-bit conversions for dequantized values (NaN
 * results in the reference's canonical pattern). tests/test_gpu.c compares the bits. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fp8_device.cuh"
#include "fp8_kernels.h"
#include "load.cuh"
#include "warp.cuh"

namespace {

/* Values [N x group, N x group + N) of x (N = 8 or 16: whole 16-byte vectors, x
 * 16-byte aligned) as fp32 into v; returns the fp32 bits of their largest magnitude (at
 * or above the infinity pattern: a non-finite value). live == false: zeros, nothing read. */
template <moea2a_datatype_t T, int N>
__device__ __forceinline__ uint32_t m2a_fp8_load(const void *x, size_t group, bool live, float *v)
{
    constexpr int NV = N * (T == MOEA2A_FLOAT32 ? 4 : 2) / 16;
    const uint4 *src = reinterpret_cast<const uint4 *>(x) + NV * group;
    uint4 raw[NV];
#pragma unroll
    for (int c = 0; c < NV; c++) raw[c] = live ? __ldcs(src + c) : make_uint4(0, 0, 0, 0);
    return m2a_fp8_unpack<T, NV>(raw, v);
}

constexpr int kThreads = 256;
constexpr int kGroup = 16;                            /* values per thread */
constexpr int kPerBlock = M2A_FP8_BLOCK / kGroup;     /* threads per block of 128: 8 */
constexpr uint32_t kMaxGroups = 1u << 30;             /* per launch: 32-bit indices */

/* Group b = (row r, 16-value group gi of g_n per row); the grid strides by a multiple
 * of 8 groups, so the 8 threads of a block of 128 are adjacent lanes, and (r, gi)
 * advance by the constant stride without divisions. Loops are warp-uniform so every
 * lane reaches every shuffle. READY (quantize on dispatch, overlapped with the
 * dispatch kernel): each warp adds the groups it wrote to ready[row / chunk_rows]
 * once they are visible, which the dispatch waits for before copying those rows. */
template <moea2a_datatype_t T, bool READY = false>
__global__ void __launch_bounds__(kThreads) quantize(const void *x, uint32_t groups, uint32_t g_n, uint4 *q,
                                               unsigned char *scales, int layout, int ue8m0, size_t r0, size_t m_pad,
                                               uint32_t *ready = nullptr, uint32_t chunk_rows = 1)
{
    const int lane = threadIdx.x % kWarpSize;
    const uint32_t step = gridDim.x * blockDim.x, step_r = step / g_n, step_g = step % g_n, nkb = g_n / kPerBlock;
    uint32_t b = blockIdx.x * blockDim.x + threadIdx.x, r = b / g_n, gi = b % g_n;
    for (; b - lane < groups; b += step, r += step_r, gi += step_g) {
        if (gi >= g_n) gi -= g_n, r++;
        const bool live = b < groups;
        float v[kGroup];
        uint32_t am = m2a_fp8_load<T, kGroup>(x, b, live, v);
#pragma unroll
        for (int o = kPerBlock / 2; o; o >>= 1) am = max(am, __shfl_xor_sync(kAllLanes, am, o));
        const bool finite = am < 0x7f800000u;
        float mul;
        const uint32_t s = m2a_fp8_scale(__uint_as_float(am), finite, ue8m0, &mul);
        uint32_t w[4];
        m2a_fp8_encode<kGroup>(v, mul, finite, w);
        if (live) {
            __stcs(q + b, make_uint4(w[0], w[1], w[2], w[3]));
            if (gi % kPerBlock == 0) {
                unsigned char *dst = scales + m2a_fp8_scale_offset(layout, ue8m0, r0 + r, gi / kPerBlock, nkb, m_pad);
                if (ue8m0) *dst = (unsigned char)s;
                else *reinterpret_cast<uint32_t *>(dst) = s;
            }
        }
        if (READY) { /* one add per chunk the warp's groups fall in, after their writes (fence) */
            const uint32_t chunk = live ? (uint32_t)((r0 + r) / chunk_rows) : 0xffffffffu;
            const unsigned same = __match_any_sync(kAllLanes, chunk);
            __syncwarp();
            if (live && lane == __ffs(same) - 1) {
                __threadfence();
                atomicAdd(ready + chunk, (uint32_t)__popc(same));
            }
        }
    }
}

/* 16-bit results: the hardware's round to nearest even, NaN as the reference writes
 * the canonical NaN (lib/base/convert.h). */
template <moea2a_datatype_t T> __device__ __forceinline__ uint32_t pack2(float a, float b)
{
    uint16_t h[2];
    const float f[2] = {a, b};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (T == MOEA2A_BFLOAT16) h[i] = f[i] != f[i] ? (uint16_t)0x7fc0u : __bfloat16_as_ushort(__float2bfloat16_rn(f[i]));
        else h[i] = f[i] != f[i] ? (uint16_t)0x7e00u : __half_as_ushort(__float2half_rn(f[i]));
    }
    return h[0] | (uint32_t)h[1] << 16;
}

/* Dequantize, one thread per 8 codes (8 bytes in; 16 or 32 out): the warp's loads and
 * stores are contiguous (with 16 codes per thread the 32-byte stores of 16-bit values
 * left the writes at 60% of copy bandwidth). */
constexpr int kDeq = 8, kDeqPerBlock = M2A_FP8_BLOCK / kDeq;
template <moea2a_datatype_t T>
__global__ void __launch_bounds__(kThreads) dequantize(const uint2 *q, const unsigned char *scales, int layout, int ue8m0,
                                                       uint32_t groups, uint32_t g_n, size_t r0, size_t m_pad, void *out)
{
    const uint32_t step = gridDim.x * blockDim.x, step_r = step / g_n, step_g = step % g_n, nkb = g_n / kDeqPerBlock;
    uint32_t b = blockIdx.x * blockDim.x + threadIdx.x, r = b / g_n, gi = b % g_n;
    for (; b < groups; b += step, r += step_r, gi += step_g) {
        if (gi >= g_n) gi -= g_n, r++;
        const unsigned char *src = scales + m2a_fp8_scale_offset(layout, ue8m0, r0 + r, gi / kDeqPerBlock, nkb, m_pad);
        const float s = m2a_fp8_scale_value(ue8m0 ? *src : *reinterpret_cast<const uint32_t *>(src), ue8m0);
        const uint2 c2 = __ldcs(q + b);
        const uint32_t c[2] = {c2.x, c2.y};
        float v[kDeq];
#pragma unroll
        for (int i = 0; i < kDeq / 2; i++) { /* E4M3 -> fp16 is exact; one rounding: the product */
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c[i / 2] >> (16 * (i % 2))), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
            v[2 * i] = f.x * s, v[2 * i + 1] = f.y * s;
        }
        if (T == MOEA2A_FLOAT32) {
            float4 *o = reinterpret_cast<float4 *>(out) + 2 * (size_t)b;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float t[4];
#pragma unroll
                for (int j = 0; j < 4; j++) t[j] = v[4 * i + j] != v[4 * i + j] ? __uint_as_float(M2A_FP8_NAN_SCALE) : v[4 * i + j];
                __stcs(o + i, make_float4(t[0], t[1], t[2], t[3]));
            }
        } else {
            __stcs(reinterpret_cast<uint4 *>(out) + b,
                   make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7])));
        }
    }
}

/* Enough threads to fill the device (8 blocks of 256 per SM), fewer for small tensors. */
int grid_for(uint32_t groups)
{
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const uint32_t b = (groups + kThreads - 1) / kThreads, cap = (uint32_t)sms * 8;
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

/* A tensor in launches of at most kMaxGroups groups of `group` values (whole rows): row
 * r0 of a launch is the tensor's row r0 for the scales; values, codes and outputs are
 * offset. */
template <typename Launch> int by_rows(size_t m, size_t k, size_t group, Launch launch)
{
    const size_t g_n = k / group, step = kMaxGroups / g_n;
    if (step == 0) return (int)cudaErrorInvalidValue; /* a row of over 2^30 groups */
    for (size_t r0 = 0; r0 < m; r0 += step) {
        const uint32_t groups = (uint32_t)((m - r0 < step ? m - r0 : step) * g_n);
        launch(r0, groups, (uint32_t)g_n, grid_for(groups));
    }
    return (int)cudaGetLastError();
}

/* Both quantize entry points: by_rows' launches of the READY variant or not, in `blocks`
 * blocks (0: as many as the rows need, up to 8 per SM). */
template <bool READY>
int quantize_rows(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales, int layout,
                         int ue8m0, uint32_t *ready, uint32_t chunk_rows, int blocks, cudaStream_t s)
{
    const size_t m_pad = (m + 3) / 4 * 4, esz = xtype == MOEA2A_FLOAT32 ? 4 : 2;
    unsigned char *sb = static_cast<unsigned char *>(scales);
    return by_rows(m, k, kGroup, [&](size_t r0, uint32_t groups, uint32_t g_n, int grid) {
        const void *xs = static_cast<const char *>(x) + r0 * k * esz;
        uint4 *qs = reinterpret_cast<uint4 *>(static_cast<unsigned char *>(q) + r0 * k);
        const int g = blocks > 0 ? blocks : grid;
        switch (xtype) {
        case MOEA2A_BFLOAT16:
            quantize<MOEA2A_BFLOAT16, READY><<<g, kThreads, 0, s>>>(xs, groups, g_n, qs, sb, layout, ue8m0, r0, m_pad,
                                                                    ready, chunk_rows);
            break;
        case MOEA2A_FLOAT16:
            quantize<MOEA2A_FLOAT16, READY><<<g, kThreads, 0, s>>>(xs, groups, g_n, qs, sb, layout, ue8m0, r0, m_pad,
                                                                   ready, chunk_rows);
            break;
        default:
            quantize<MOEA2A_FLOAT32, READY><<<g, kThreads, 0, s>>>(xs, groups, g_n, qs, sb, layout, ue8m0, r0, m_pad,
                                                                   ready, chunk_rows);
        }
    });
}

} // namespace

/* lib/quant/fp8.c has checked the alignment (values and codes 16 bytes, scales 4) and k. */
extern "C" int m2a_cuda_fp8_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                                     int layout, int ue8m0, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t nkb = k / M2A_FP8_BLOCK, bytes = m2a_fp8_scale_bytes(layout, ue8m0, m, nkb);
    /* padding rows (MN-major) and unused bytes of UE8M0 words are 0 */
    if (bytes != m * nkb * (ue8m0 ? 1 : 4)) cudaMemsetAsync(scales, 0, bytes, s);
    return quantize_rows<false>(x, xtype, m, k, q, scales, layout, ue8m0, nullptr, 1, 0, s);
}

extern "C" int m2a_cuda_fp8_quantize_ready(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q,
                                           void *scales, int ue8m0, uint32_t *ready, uint32_t chunk_rows, int blocks,
                                           void *stream)
{
    return quantize_rows<true>(x, xtype, m, k, q, scales, MOEA2A_FP8_SCALES_ROW_MAJOR, ue8m0, ready, chunk_rows, blocks,
                               (cudaStream_t)stream);
}

extern "C" int m2a_cuda_fp8_load(void)
{
    int e = 0;
    e = m2a_load_kernel(quantize<MOEA2A_BFLOAT16, false>, e), e = m2a_load_kernel(quantize<MOEA2A_BFLOAT16, true>, e);
    e = m2a_load_kernel(quantize<MOEA2A_FLOAT16, false>, e), e = m2a_load_kernel(quantize<MOEA2A_FLOAT16, true>, e);
    e = m2a_load_kernel(quantize<MOEA2A_FLOAT32, false>, e), e = m2a_load_kernel(quantize<MOEA2A_FLOAT32, true>, e);
    return M2A_LOAD_FLOATS(dequantize, e);
}

extern "C" int m2a_cuda_fp8_dequantize(const void *q, const void *scales, int layout, int ue8m0, size_t m, size_t k,
                                       void *out, moea2a_datatype_t otype, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t m_pad = (m + 3) / 4 * 4, esz = otype == MOEA2A_FLOAT32 ? 4 : 2;
    const unsigned char *sb = static_cast<const unsigned char *>(scales);
    return by_rows(m, k, kDeq, [&](size_t r0, uint32_t groups, uint32_t g_n, int grid) {
        const uint2 *qs = reinterpret_cast<const uint2 *>(static_cast<const unsigned char *>(q) + r0 * k);
        void *o = static_cast<char *>(out) + r0 * k * esz;
        switch (otype) {
        case MOEA2A_BFLOAT16:
            dequantize<MOEA2A_BFLOAT16><<<grid, kThreads, 0, s>>>(qs, sb, layout, ue8m0, groups, g_n, r0, m_pad, o);
            break;
        case MOEA2A_FLOAT16:
            dequantize<MOEA2A_FLOAT16><<<grid, kThreads, 0, s>>>(qs, sb, layout, ue8m0, groups, g_n, r0, m_pad, o);
            break;
        default: dequantize<MOEA2A_FLOAT32><<<grid, kThreads, 0, s>>>(qs, sb, layout, ue8m0, groups, g_n, r0, m_pad, o);
        }
    });
}

/* NVFP4 kernels. They produce the bits of the host reference (lib/quant/fp4_math.h) by
 * cheaper means: a lookup table for E2M1 (sm_90 has no E2M1 conversion; sm_100a's
 * is used where built for it), the hardware E4M3 and 16-bit conversions, amax from
 * the bits. tests/test_gpu.c checks every path against the reference. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fp4_kernels.h"
#include "quant/fp4_math.h"
#include "load.cuh"
#include "warp.cuh"

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

/* E2M1 code (sign included) of every fp32 by its top bits and a sticky bit: entry
 * 2 x (u >> 21) + (u's low 21 bits != 0). Every rounding threshold (0.25 0.75 1.25
 * 1.75 2.5 3.5 5) has its low 21 bits 0, so the code is constant between thresholds
 * and the sticky bit separates a value that is exactly on one (a tie) from those
 * above it. Built at compile time with integer compares on the magnitude's bits
 * (ordered like the values); NaN gives 0, as m2a_e2m1_from_f32. */
struct E2m1Table {
    unsigned char v[4096];
};
constexpr unsigned char e2m1_code_of_bits(uint32_t u)
{
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0;
    const unsigned c = (a > 0x3e800000u) + (a >= 0x3f400000u) + (a > 0x3fa00000u) + (a >= 0x3fe00000u) +
                       (a > 0x40200000u) + (a >= 0x40600000u) + (a > 0x40a00000u);
    return (unsigned char)(((u >> 31) << 3) | c);
}
constexpr E2m1Table make_e2m1_table()
{
    E2m1Table t{};
    for (uint32_t i = 0; i < 4096; i++) t.v[i] = e2m1_code_of_bits(((i >> 1) << 21) | (i & 1));
    return t;
}
__device__ const E2m1Table kE2m1 = make_e2m1_table();

__device__ __forceinline__ uint32_t e2m1_lookup(const unsigned char *tbl, float p)
{
    const uint32_t u = __float_as_uint(p);
    return tbl[((u >> 20) & 0xffeu) | min(u & 0x1fffffu, 1u)];
}

/* Sixteen values' codes (lo: elements 0-7, hi: 8-15). sm_100a has a conversion
 * instruction (round to nearest even, saturating to 6); inv is finite there, so no
 * product is NaN. Elsewhere the table. */
__device__ __forceinline__ uint2 encode16(const float *v, float inv, const unsigned char *tbl)
{
    uint32_t w[2] = {0, 0};
#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL)
    if (isfinite(inv)) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            unsigned short b;
            asm("{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, %1, %2; cvt.u16.u8 %0, t; }"
                : "=h"(b) : "f"(v[2 * i + 1] * inv), "f"(v[2 * i] * inv));
            w[i / 4] |= (uint32_t)b << (8 * (i % 4));
        }
        return make_uint2(w[0], w[1]);
    }
#endif
#pragma unroll
    for (int i = 0; i < 16; i++) w[i / 8] += e2m1_lookup(tbl, v[i] * inv) << (4 * (i % 8));
    return make_uint2(w[0], w[1]);
}

/* m2a_fp4_scale with the hardware E4M3 conversions of sm_89 and later (round to
 * nearest even, saturating; the same bits as the reference). */
__device__ __forceinline__ uint8_t block_scale(float amax, bool finite, float g, float *inv)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (!finite) {
        *inv = 0.0f;
        return M2A_E4M3_NAN;
    }
    const float x = g * (amax / M2A_E2M1_MAX);
    const uint8_t sf = x != x ? (uint8_t)M2A_E4M3_NAN : (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    const float sff = __half2float(__half(__nv_cvt_fp8_to_halfraw(sf, __NV_E4M3)));
    *inv = sff == 0.0f ? 0.0f : g / sff;
    return sf;
#else
    return m2a_fp4_scale(amax, finite, g, inv);
#endif
}

/* Quantize, one thread per block of 16 (32 or 64 bytes in, 8 out), a warp on 32
 * consecutive blocks. amax comes from the bits: |x| orders like its bit pattern, so
 * an integer max (16-bit SIMD for bf16/fp16) gives it exactly, and a maximum at or
 * above the infinity pattern means a non-finite input. The scales of 4 consecutive
 * blocks (4 adjacent bytes in every layout when a row has a multiple of 4 blocks)
 * leave as one 32-bit store. Loops are warp-uniform so every lane reaches every
 * shuffle; (row, block) advance by the constant grid stride, without divisions. */
template <moea2a_datatype_t T>
__global__ void __launch_bounds__(256) quantize_blocks(const void *x, uint32_t nblocks, uint32_t kb_n, const float *g,
                                                       uint2 *q, unsigned char *sf, int layout, float *g_rows)
{
    __shared__ uint4 tbl4[4096 / 16];
    const unsigned char *tbl = reinterpret_cast<const unsigned char *>(tbl4);
    for (int i = threadIdx.x; i < 4096 / 16; i += blockDim.x) tbl4[i] = reinterpret_cast<const uint4 *>(kE2m1.v)[i];
    __syncthreads();
    constexpr int NV = T == MOEA2A_FLOAT32 ? 4 : 2; /* 16-byte loads per block */
    const float gs = *g;
    const int lane = threadIdx.x % kWarpSize;
    const bool words = kb_n % 4 == 0;
    const uint32_t step = gridDim.x * blockDim.x, step_r = step / kb_n, step_kb = step % kb_n;
    uint32_t b = blockIdx.x * blockDim.x + threadIdx.x, r = b / kb_n, kb = b % kb_n;
    for (; b - lane < nblocks; b += step, r += step_r, kb += step_kb) {
        if (kb >= kb_n) kb -= kb_n, r++;
        const bool live = b < nblocks;
        uint4 raw[NV];
        const uint4 *src = reinterpret_cast<const uint4 *>(x) + NV * (size_t)b;
#pragma unroll
        for (int c = 0; c < NV; c++) raw[c] = live ? __ldcs(src + c) : make_uint4(0, 0, 0, 0);
        float v[16], amax;
        bool finite;
        if (T == MOEA2A_FLOAT32) {
            uint32_t am = 0;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
                for (int i = 0; i < 4; i++) v[4 * c + i] = __uint_as_float(w[i]), am = max(am, w[i] & 0x7fffffffu);
            }
            finite = am < 0x7f800000u, amax = __uint_as_float(am);
        } else {
            const uint32_t w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
            uint32_t m = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) m = __vmaxu2(m, w[i] & 0x7fff7fffu);
            const uint32_t a16 = max(m & 0xffffu, m >> 16);
            finite = a16 < (T == MOEA2A_BFLOAT16 ? 0x7f80u : 0x7c00u);
            amax = T == MOEA2A_BFLOAT16 ? __uint_as_float(a16 << 16) : m2a_f16_to_f32((uint16_t)a16);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint16_t lo = (uint16_t)(w[i] & 0xffffu), hi = (uint16_t)(w[i] >> 16);
                v[2 * i] = T == MOEA2A_BFLOAT16 ? __uint_as_float(w[i] << 16) : m2a_f16_to_f32(lo);
                v[2 * i + 1] = T == MOEA2A_BFLOAT16 ? __uint_as_float(w[i] & 0xffff0000u) : m2a_f16_to_f32(hi);
            }
        }
        float inv;
        const uint8_t s = block_scale(amax, finite, gs, &inv);
        const uint2 codes = finite ? encode16(v, inv, tbl) : make_uint2(0, 0);
        if (live) __stcs(q + b, codes);
        if (g_rows && live && kb == 0) g_rows[r] = gs; /* the same bits where g_rows is g */
        if (words) {
            const uint32_t w = s | (uint32_t)__shfl_down_sync(kAllLanes, s, 1) << 8 |
                               (uint32_t)__shfl_down_sync(kAllLanes, s, 2) << 16 |
                               (uint32_t)__shfl_down_sync(kAllLanes, s, 3) << 24;
            if (live && lane % 4 == 0) *reinterpret_cast<uint32_t *>(sf + m2a_sf_offset(layout, r, kb, kb_n)) = w;
        } else if (live) {
            sf[m2a_sf_offset(layout, r, kb, kb_n)] = s;
        }
    }
}

/* Eight codes (a 32-bit word) times the block scale: each E2M1 code placed in fp16
 * bits is E x 2^-14 exactly (code 1 is an fp16 subnormal), so two codes become a
 * half2 with a multiply and two masked shifts; widened, times scale x 2^14 (exact:
 * E x scale), times 1/g (the one rounding of the reference). */
__device__ __forceinline__ void decode8(uint32_t codes, float sc, float inv_g, float *f)
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t v = __byte_perm(codes, 0, 0x4440 | j) * 0x1001u; /* byte j at bits 0 and 12 */
        uint32_t h2 = ((v << 9) & 0x0e000e00u) | ((v << 12) & 0x80008000u);
        const float2 t = __half22float2(*reinterpret_cast<__half2 *>(&h2));
        f[2 * j] = t.x * sc * inv_g;
        f[2 * j + 1] = t.y * sc * inv_g;
    }
}

/* Dequantize, one thread per half block: 4 bytes of codes in, 8 values out (16 bytes
 * for bf16/fp16, 32 for fp32), contiguous across the warp. Rounded by the hardware
 * conversions (nearest even, as the reference); NaN results take the canonical
 * pattern of the reference: a NaN scale gives it for the whole block, and when 1/g
 * is not finite (0 x inf) each value is checked. */
template <moea2a_datatype_t T>
__global__ void __launch_bounds__(256) dequantize_halves(const uint32_t *q, const unsigned char *sf, int layout,
                                                         const float *g, uint32_t halves, uint32_t kb_n, void *out)
{
    const float inv_g = 1.0f / *g;
    const bool odd = !isfinite(inv_g);
    const uint32_t step = gridDim.x * blockDim.x;
    for (uint32_t h = blockIdx.x * blockDim.x + threadIdx.x; h < halves; h += step) {
        const uint32_t b = h / 2, r = b / kb_n;
        const uint32_t codes = __ldcs(q + h);
        const uint8_t sb = sf[m2a_sf_offset(layout, r, b - r * kb_n, kb_n)];
        const bool nan = (sb & 0x7f) == M2A_E4M3_NAN;
        float f[8];
        decode8(codes, m2a_e4m3_to_f32(sb) * 16384.0f, inv_g, f);
        if (odd) { /* the reference's own conversions, which keep the canonical NaN */
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = f[i] != f[i] ? __uint_as_float(0x7fc00000u) : f[i];
            if (T != MOEA2A_FLOAT32) {
                uint32_t w[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    w[i] = T == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(f[2 * i]) | (uint32_t)m2a_f32_to_bf16(f[2 * i + 1]) << 16
                                                : m2a_f32_to_f16(f[2 * i]) | (uint32_t)m2a_f32_to_f16(f[2 * i + 1]) << 16;
                __stcs(reinterpret_cast<uint4 *>(out) + h, make_uint4(w[0], w[1], w[2], w[3]));
                continue;
            }
        }
        if (T == MOEA2A_FLOAT32) {
            float4 *dst = reinterpret_cast<float4 *>(out) + 2 * (size_t)h;
            const float n = __uint_as_float(0x7fc00000u);
            __stcs(dst, nan ? make_float4(n, n, n, n) : make_float4(f[0], f[1], f[2], f[3]));
            __stcs(dst + 1, nan ? make_float4(n, n, n, n) : make_float4(f[4], f[5], f[6], f[7]));
        } else {
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (T == MOEA2A_BFLOAT16) {
                    __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
                    w[i] = nan ? 0x7fc07fc0u : *reinterpret_cast<uint32_t *>(&p);
                } else {
                    __half2 p = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
                    w[i] = nan ? 0x7e007e00u : *reinterpret_cast<uint32_t *>(&p);
                }
            }
            __stcs(reinterpret_cast<uint4 *>(out) + h, make_uint4(w[0], w[1], w[2], w[3]));
        }
    }
}

/* One thread per destination byte, padding included (written 0). */
__global__ void sf_convert(const unsigned char *src, int sl, unsigned char *dst, int dl, size_t m, size_t kb_n,
                           const int32_t *counts, int stride, size_t dst_bytes)
{
    const size_t rows = dl == MOEA2A_SF_128X4 ? (m + M2A_SF128_ROWS - 1) / M2A_SF128_ROWS * M2A_SF128_ROWS
                        : dl == MOEA2A_SF_8X4 ? (m + M2A_SF8_ROWS - 1) / M2A_SF8_ROWS * M2A_SF8_ROWS : m;
    const size_t kb4 = dl == 0 ? kb_n : (kb_n + 3) / 4 * 4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < rows * kb4; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / kb4, kb = i % kb4;
        bool real = r < m && kb < kb_n && (!counts || (int)(r % stride) < counts[r / stride]);
        size_t o = m2a_sf_offset(dl, r, kb, kb_n);
        if (o < dst_bytes) dst[o] = real ? src[m2a_sf_offset(sl, r, kb, kb_n)] : 0;
    }
}

/* Linear scales into a tiled layout (128x4 or 8x4), padding included. A block of 128
 * threads per 128 rows (grid-strided), a thread per row, looping over the row's words
 * of 4 scales (4 adjacent bytes in both tiled layouts: kb % 4 is an offset's lowest
 * term; one 32-bit load each when a row has a multiple of 4 blocks). Thread t takes the
 * row whose word lands t words into the 128 rows' run of the 128x4 tile ((t % 4) x 32 +
 * t / 4; in 8x4, row t), so a warp's stores are contiguous, and the row's counts are
 * looked up once. This is the receive side's conversion of its [ep][stride] rows: one
 * thread per byte with three 64-bit divisions took 25 us for 2 x 4096 rows of 448
 * scales on an H200, a block per row with scattered word stores 15 us. Words of a row
 * are split over blockIdx.y where there are few rows. */
constexpr int kTileThreads = M2A_SF128_ROWS;
constexpr size_t kTileBlocks = 1024; /* enough to fill an H100's or H200's SMs several times */
__global__ void __launch_bounds__(kTileThreads) sf_tile_words(const uint32_t *src, uint32_t *dst, int dl, uint32_t m,
                                                              uint32_t rows, uint32_t kb_n, const int32_t *counts,
                                                              uint32_t stride)
{
    const uint32_t kw = kb_n / M2A_SF_TILE_BLOCKS, t = threadIdx.x;
    const uint32_t in_run = dl == MOEA2A_SF_128X4 ? (t % 4) * 32 + t / 4 : t;
    const uint32_t per = (kw + gridDim.y - 1) / gridDim.y, w0 = blockIdx.y * per, w1 = min(kw, w0 + per);
    for (uint32_t base = blockIdx.x * kTileThreads; base < rows; base += gridDim.x * kTileThreads) {
        const uint32_t r = base + in_run;
        if (r >= rows) continue;
        const bool real = r < m && (!counts || r % stride < (uint32_t)counts[r / stride]);
#pragma unroll 4
        for (uint32_t w = w0; w < w1; w++)
            dst[m2a_sf_offset(dl, r, M2A_SF_TILE_BLOCKS * w, kb_n) / 4] = real ? __ldg(src + (size_t)r * kw + w) : 0u;
    }
}

/* amax over |x| by the bits (NaN ranks above inf, as on the host), then g: 16-byte
 * loads (8 values of 16 bits with a SIMD max, or 4 of fp32) where x is aligned, the
 * rest one by one; a block's maximum leaves as one atomic (one per warp took ~650 us
 * for 4096 x 7168 values on an H100: 900,000 atomics on one word). 16-bit maxima
 * widen at the end: the widening orders like the bits, NaNs included. */
template <moea2a_datatype_t T> __global__ void __launch_bounds__(256) amax_bits(const void *x, size_t n, unsigned int *amax)
{
    constexpr size_t per = T == MOEA2A_FLOAT32 ? 4 : 8;
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    const size_t nv = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? n / per : 0;
    unsigned int local = 0, m16 = 0;
    for (size_t i = tid; i < nv; i += step) {
        const uint4 w = __ldcs(reinterpret_cast<const uint4 *>(x) + i);
        if (T == MOEA2A_FLOAT32)
            local = max(local, max(max(w.x & 0x7fffffffu, w.y & 0x7fffffffu), max(w.z & 0x7fffffffu, w.w & 0x7fffffffu)));
        else
            m16 = __vmaxu2(m16, __vmaxu2(__vmaxu2(w.x & 0x7fff7fffu, w.y & 0x7fff7fffu),
                                         __vmaxu2(w.z & 0x7fff7fffu, w.w & 0x7fff7fffu)));
    }
    if (T != MOEA2A_FLOAT32 && m16) {
        const uint16_t a16 = (uint16_t)max(m16 & 0xffffu, m16 >> 16);
        local = T == MOEA2A_BFLOAT16 ? (uint32_t)a16 << 16 : __float_as_uint(m2a_f16_to_f32(a16));
    }
    for (size_t i = nv * per + tid; i < n; i += step)
        local = max(local, __float_as_uint(In<T>::at(x, i)) & 0x7fffffffu);
    for (int off = 16; off > 0; off /= 2) local = max(local, __shfl_down_sync(kAllLanes, local, off));
    __shared__ unsigned int warp_max[8];
    if ((threadIdx.x % kWarpSize) == 0) warp_max[threadIdx.x / kWarpSize] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / kWarpSize; w++) local = max(local, warp_max[w]);
        if (local) atomicMax(amax, local);
    }
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

/* Resident blocks: the quantize kernel loads its table once per block, then strides. */
static int resident_grid(size_t work)
{
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    size_t b = (work + 255) / 256, cap = (size_t)sms * 8;
    return (int)(b < 1 ? 1 : b > cap ? cap : b);
}

extern "C" int m2a_cuda_fp4_global_scale(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned int *amax = reinterpret_cast<unsigned int *>(g); /* g doubles as the scratch word */
    cudaMemsetAsync(amax, 0, sizeof(unsigned int), s);
    if (count) {
        switch (xtype) {
        case MOEA2A_BFLOAT16: amax_bits<MOEA2A_BFLOAT16><<<resident_grid(count / 8), 256, 0, s>>>(x, count, amax); break;
        case MOEA2A_FLOAT16: amax_bits<MOEA2A_FLOAT16><<<resident_grid(count / 8), 256, 0, s>>>(x, count, amax); break;
        default: amax_bits<MOEA2A_FLOAT32><<<resident_grid(count / 8), 256, 0, s>>>(x, count, amax); break;
        }
    }
    global_from_amax<<<1, 1, 0, s>>>(amax, g);
    return (int)cudaGetLastError();
}

/* Rows per launch, a multiple of 128 (a whole number of scale tiles in every layout,
 * so a launch's scales start at the offset of its first row) that keeps the kernels'
 * 32-bit indices (halves, plus a grid stride) in range; 0 when a single row is
 * already too long. */
static size_t rows_per_launch(size_t kb_n)
{
    const size_t per_tile = 128 * kb_n * 2, limit = (size_t)1 << 31;
    return per_tile > limit ? 0 : limit / per_tile * 128;
}

/* lib/quant/fp4.c has checked that the buffers are 16-byte aligned (rows are: k is a
 * multiple of 16 elements). */
extern "C" int m2a_cuda_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q,
                                     void *sf, int layout, float *g_rows, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t kb_n = k / 16, chunk = rows_per_launch(kb_n), es = xtype == MOEA2A_FLOAT32 ? 4 : 2;
    if (!chunk) return (int)cudaErrorInvalidValue;
    /* tile padding, where the tiled layouts have any */
    if (m2a_sf_bytes(layout, m, kb_n) != m * kb_n) cudaMemsetAsync(sf, 0, m2a_sf_bytes(layout, m, kb_n), s);
    for (size_t r0 = 0; r0 < m; r0 += chunk) {
        const size_t rows = m - r0 < chunk ? m - r0 : chunk;
        const uint32_t nb = (uint32_t)(rows * kb_n);
        const void *xs = static_cast<const unsigned char *>(x) + r0 * k * es;
        uint2 *qs = reinterpret_cast<uint2 *>(static_cast<unsigned char *>(q) + r0 * k / 2);
        unsigned char *ss = static_cast<unsigned char *>(sf) + m2a_sf_offset(layout, r0, 0, kb_n);
        float *gr = g_rows ? g_rows + r0 : nullptr;
        const int grid = resident_grid(nb);
        switch (xtype) {
        case MOEA2A_BFLOAT16: quantize_blocks<MOEA2A_BFLOAT16><<<grid, 256, 0, s>>>(xs, nb, (uint32_t)kb_n, g, qs, ss, layout, gr); break;
        case MOEA2A_FLOAT16: quantize_blocks<MOEA2A_FLOAT16><<<grid, 256, 0, s>>>(xs, nb, (uint32_t)kb_n, g, qs, ss, layout, gr); break;
        default: quantize_blocks<MOEA2A_FLOAT32><<<grid, 256, 0, s>>>(xs, nb, (uint32_t)kb_n, g, qs, ss, layout, gr); break;
        }
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_dequantize(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k,
                                       void *out, moea2a_datatype_t otype, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t kb_n = k / 16, chunk = rows_per_launch(kb_n), es = otype == MOEA2A_FLOAT32 ? 4 : 2;
    if (!chunk) return (int)cudaErrorInvalidValue;
    for (size_t r0 = 0; r0 < m; r0 += chunk) {
        const size_t rows = m - r0 < chunk ? m - r0 : chunk;
        const uint32_t halves = (uint32_t)(rows * kb_n * 2);
        const uint32_t *qs = reinterpret_cast<const uint32_t *>(static_cast<const unsigned char *>(q) + r0 * k / 2);
        const unsigned char *ss = static_cast<const unsigned char *>(sf) + m2a_sf_offset(layout, r0, 0, kb_n);
        void *os = static_cast<unsigned char *>(out) + r0 * k * es;
        const int grid = grid_for(halves);
        switch (otype) {
        case MOEA2A_BFLOAT16: dequantize_halves<MOEA2A_BFLOAT16><<<grid, 256, 0, s>>>(qs, ss, layout, g, halves, (uint32_t)kb_n, os); break;
        case MOEA2A_FLOAT16: dequantize_halves<MOEA2A_FLOAT16><<<grid, 256, 0, s>>>(qs, ss, layout, g, halves, (uint32_t)kb_n, os); break;
        default: dequantize_halves<MOEA2A_FLOAT32><<<grid, 256, 0, s>>>(qs, ss, layout, g, halves, (uint32_t)kb_n, os); break;
        }
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_sf_convert(const void *src, int src_layout, void *dst, int dst_layout, size_t m, size_t k,
                                       const int32_t *counts, int stride, void *stream)
{
    size_t kb_n = k / 16, bytes = m2a_sf_bytes(dst_layout, m, kb_n);
    size_t work = dst_layout == 0 ? m * kb_n : bytes;
    const size_t rows = kb_n ? bytes / kb_n : 0; /* the tiled layouts' padded rows */
    if (src_layout == MOEA2A_SF_LINEAR && dst_layout != MOEA2A_SF_LINEAR && kb_n % M2A_SF_TILE_BLOCKS == 0 &&
        reinterpret_cast<uintptr_t>(src) % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 4 == 0 && rows <= UINT32_MAX &&
        kb_n <= UINT32_MAX && (counts == nullptr || stride > 0)) {
        /* a row's words split over blockIdx.y until there are about kTileBlocks blocks */
        const size_t runs = (rows + kTileThreads - 1) / kTileThreads, kw = kb_n / M2A_SF_TILE_BLOCKS;
        size_t split = runs && runs < kTileBlocks ? kTileBlocks / runs : 1;
        if (split > kw) split = kw;
        const dim3 grid((unsigned)(runs < 65535 ? runs : 65535), (unsigned)split);
        if (runs && kw) sf_tile_words<<<grid, kTileThreads, 0, (cudaStream_t)stream>>>(
            static_cast<const uint32_t *>(src), static_cast<uint32_t *>(dst), dst_layout, (uint32_t)(m < rows ? m : rows),
            (uint32_t)rows, (uint32_t)kb_n, counts, (uint32_t)stride);
        return (int)cudaGetLastError();
    }
    sf_convert<<<grid_for(work), 256, 0, (cudaStream_t)stream>>>(static_cast<const unsigned char *>(src), src_layout,
                                                                 static_cast<unsigned char *>(dst), dst_layout, m, kb_n,
                                                                 counts, stride, bytes);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_fp4_load(void)
{
    int e = M2A_LOAD_FLOATS(quantize_blocks, 0);
    e = M2A_LOAD_FLOATS(dequantize_halves, e);
    e = M2A_LOAD_FLOATS(amax_bits, e);
    return m2a_load_kernel(global_from_amax, m2a_load_kernel(sf_tile_words, m2a_load_kernel(sf_convert, e)));
}

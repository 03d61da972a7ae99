/* The FP8 combine wire's device arithmetic (moea2a_moe(3), "FP8 combine"), shared by the
 * load/store path (moe_fast_fp8c.cuh) and the generic path's kernels (moe_kernels.cu):
 * a row quantized by the block rule of fp8_device.cuh, the codes then the row-major
 * scales, in place where asked; a wire row's values dequantized (code x scale, fp32) and
 * added; a node's partial quantized again as it travels between nodes. The bits are
 * those of the host reference (lib/moe/backend/host_kernels.c). */
#ifndef M2A_FP8C_DEVICE_CUH
#define M2A_FP8C_DEVICE_CUH
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "elem.cuh"
#include "fp8_device.cuh"
#include "warp.cuh"

namespace m2a_fp8c {

using m2a_elem::Elem;

constexpr int kQv = 16;                      /* values of a row per lane and group */
constexpr int kQLanes = M2A_FP8_BLOCK / kQv; /* adjacent lanes per block of 128 values: 8 */
constexpr int kQSpan = kWarpSize * kQv;      /* values of one group of the warp: 512 */
/* Groups a lane loads before it stores any: 4 KB of a bf16 row in flight per warp. */
#ifndef M2A_FP8C_AHEAD
#define M2A_FP8C_AHEAD 4
#endif
constexpr int kQAhead = M2A_FP8C_AHEAD;

/* 16 bytes at p (vec: 16-byte aligned; else byte by byte). */
static __device__ __forceinline__ uint4 load16(const unsigned char *p, bool vec)
{
    if (vec) return *reinterpret_cast<const uint4 *>(p);
    uint4 r;
    unsigned char *b = reinterpret_cast<unsigned char *>(&r);
#pragma unroll
    for (int i = 0; i < 16; i++) b[i] = p[i];
    return r;
}

/* 16 bytes to p (vec: 16-byte aligned; else byte by byte). */
static __device__ __forceinline__ void store16(unsigned char *p, const uint4 &v, bool vec)
{
    if (vec) {
        *reinterpret_cast<uint4 *>(p) = v;
        return;
    }
    const unsigned char *b = reinterpret_cast<const unsigned char *>(&v);
#pragma unroll
    for (int i = 0; i < 16; i++) p[i] = b[i];
}

/* A block of 128 values held by kQLanes adjacent lanes, kQv each (v, of which am is the
 * fp32 bits of this lane's largest magnitude): this lane's codes into w and the block's
 * scale bits returned (every lane of the warp calls it: the shuffles). */
static __device__ __forceinline__ uint32_t fp8c_encode(const float *v, uint32_t am, bool ue8m0, uint32_t *w)
{
#pragma unroll
    for (int o = kQLanes / 2; o; o >>= 1) am = max(am, __shfl_xor_sync(kAllLanes, am, o));
    const bool finite = am < 0x7f800000u;
    float mul;
    const uint32_t s = m2a_fp8_scale(__uint_as_float(am), finite, ue8m0, &mul);
    m2a_fp8_encode<kQv>(v, mul, finite, w);
    return s;
}

/* One warp: the row of `hidden` values of DT at src as an FP8 wire row at dst (hidden
 * codes, then the scales: fp32 words or, with ue8m0, bytes padded to a word). dst may be
 * src: codes of values [h, h + n) overwrite bytes that held values below h + n, all
 * read by then (the __syncwarp after each pass's loads), and the scales go last. sc: the
 * warp's hidden / 128 words of shared memory; vec, dvec: src, dst 16-byte aligned (dst
 * always 4-byte aligned). */
template <moea2a_datatype_t DT>
__device__ void fp8c_quantize_row(const unsigned char *src, unsigned char *dst, int hidden, bool ue8m0, bool vec,
                                  bool dvec, uint32_t *sc)
{
    constexpr int es = (int)Elem<DT>::size, NV = kQv * es / 16;
    const int lane = threadIdx.x % kWarpSize, nkb = hidden / M2A_FP8_BLOCK;
    for (int base = 0; base < hidden; base += kQAhead * kQSpan) {
        uint4 raw[kQAhead][NV];
#pragma unroll
        for (int a = 0; a < kQAhead; a++) {
            const int h = base + a * kQSpan + lane * kQv;
#pragma unroll
            for (int c = 0; c < NV; c++)
                raw[a][c] = h < hidden ? load16(src + (size_t)h * es + 16 * c, vec) : make_uint4(0, 0, 0, 0);
        }
        __syncwarp();
#pragma unroll
        for (int a = 0; a < kQAhead; a++) {
            const int h = base + a * kQSpan + lane * kQv;
            if (base + a * kQSpan >= hidden) break; /* warp-uniform */
            float v[kQv];
            uint32_t w[kQv / 4];
            const uint32_t am = m2a_fp8_unpack<DT, NV>(raw[a], v);
            const uint32_t s = fp8c_encode(v, am, ue8m0, w);
            if (h < hidden) {
                store16(dst + h, make_uint4(w[0], w[1], w[2], w[3]), dvec);
                if (lane % kQLanes == 0) sc[h / M2A_FP8_BLOCK] = s;
            }
        }
    }
    __syncwarp(); /* every lane's values read and scales in sc */
    if (ue8m0) {
        for (int kb = lane; kb < (nkb + 3) / 4 * 4; kb += kWarpSize) dst[hidden + kb] = kb < nkb ? (unsigned char)sc[kb] : 0;
    } else {
        for (int kb = lane; kb < nkb; kb += kWarpSize) reinterpret_cast<uint32_t *>(dst + hidden)[kb] = sc[kb];
    }
    __syncwarp(); /* sc read before the warp's next row writes it */
}

/* Every valid row (slot i of source q, i < counts[q]) of the ep x stride rows at src
 * (src_row bytes apart) quantized into dst (dst_row bytes apart; dst may be src, rows
 * in place), a row per warp of the launch; hidden / 128 words of dynamic shared memory
 * per warp. */
template <moea2a_datatype_t DT>
__device__ void fp8c_quantize(const unsigned char *src, size_t src_row, unsigned char *dst, size_t dst_row,
                              const int32_t *counts, int ep, int stride, int hidden, bool ue8m0)
{
    extern __shared__ __align__(128) unsigned char dsm[]; /* as reduce_bulk declares it: one per file */
    const int wpb = (int)(blockDim.x / kWarpSize);
    uint32_t *sc = reinterpret_cast<uint32_t *>(dsm) + (size_t)(threadIdx.x / kWarpSize) * (hidden / M2A_FP8_BLOCK);
    const bool vec = (uintptr_t)src % 16 == 0 && src_row % 16 == 0, dvec = (uintptr_t)dst % 16 == 0 && dst_row % 16 == 0;
    int q = 0, slot = (int)(blockIdx.x * wpb + threadIdx.x / kWarpSize); /* warp-uniform */
    const int step = (int)gridDim.x * wpb;
    for (; q < ep; slot += step) {
        while (q < ep && slot >= stride) slot -= stride, q++;
        if (q >= ep) break;
        if (slot >= counts[q]) continue;
        const size_t i = (size_t)q * stride + slot;
        fp8c_quantize_row<DT>(src + i * src_row, dst + i * dst_row, hidden, ue8m0, vec, dvec, sc);
    }
}

/* acc[v] += the 16 values of codes c (E4M3) times scale s: each product rounded to fp32,
 * a NaN product the canonical one, then added (m2a_fp8_value's arithmetic; no fused
 * multiply-add). */
static __device__ __forceinline__ void fp8c_add(float *acc, const uint4 &c, float s)
{
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const float2 x = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
        float p0 = __fmul_rn(x.x, s), p1 = __fmul_rn(x.y, s);
        p0 = p0 != p0 ? __uint_as_float(M2A_FP8_NAN_SCALE) : p0;
        p1 = p1 != p1 ? __uint_as_float(M2A_FP8_NAN_SCALE) : p1;
        acc[2 * i] = __fadd_rn(acc[2 * i], p0), acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], p1);
    }
}

/* The word of the wire row at r that holds block kb's scale (a UE8M0 byte shares it
 * with three others). Loads of many rows' words go out before any is used: the
 * conversion (fp8c_scale_of) comes after, so that it does not wait on each load in
 * turn (over NVLink that made the UE8M0 combine 1.7x the fp32-scale one). */
static __device__ __forceinline__ uint32_t fp8c_scale_word(const unsigned char *r, int hidden, int kb, bool ue8m0)
{
    return reinterpret_cast<const uint32_t *>(r + hidden)[ue8m0 ? kb / 4 : kb];
}

/* Block kb's scale as fp32, from its word. */
static __device__ __forceinline__ float fp8c_scale_of(uint32_t word, int kb, bool ue8m0)
{
    return ue8m0 ? m2a_fp8_scale_value((word >> (8 * (kb % 4))) & 0xffu, 1) : __uint_as_float(word);
}

/* Block kb's scale of the wire row at r, as fp32. */
static __device__ __forceinline__ float fp8c_scale(const unsigned char *r, int hidden, int kb, bool ue8m0)
{
    return fp8c_scale_of(fp8c_scale_word(r, hidden, kb, ue8m0), kb, ue8m0);
}

} // namespace m2a_fp8c
#endif

/* The FP8 block quantization's device arithmetic, shared by the standalone kernels
 * (fp8_kernels.cu) and the dispatch that quantizes inside its copies (moe_fast.cu), so
 * that both give the bits of the host reference (lib/quant/fp8_math.h) by the same cheaper
 * means: the amax from the values' bits (|x| orders like its bit pattern), the
 * hardware E4M3 conversion (round to nearest even, saturating: the reference's
 * rounding). */
#ifndef M2A_FP8_DEVICE_CUH
#define M2A_FP8_DEVICE_CUH
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "quant/fp8_math.h"
#include "moea2a.h"

/* The NV 16-byte vectors raw[] of values of type T as fp32 into v (4 or 8 per vector);
 * returns the fp32 bits of their largest magnitude (at or above the infinity pattern:
 * a non-finite value). */
template <moea2a_datatype_t T, int NV>
__device__ __forceinline__ uint32_t m2a_fp8_unpack(const uint4 *raw, float *v)
{
    uint32_t am = 0, m = 0;
#pragma unroll
    for (int c = 0; c < NV; c++) {
        const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (T == MOEA2A_FLOAT32) {
                v[4 * c + i] = __uint_as_float(w[i]), am = max(am, w[i] & 0x7fffffffu);
            } else if (T == MOEA2A_BFLOAT16) {
                m = __vmaxu2(m, w[i] & 0x7fff7fffu);
                v[8 * c + 2 * i] = __uint_as_float(w[i] << 16), v[8 * c + 2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else { /* exact widening; a NaN's payload does not matter (its block's codes are 0) */
                m = __vmaxu2(m, w[i] & 0x7fff7fffu);
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
                v[8 * c + 2 * i] = f.x, v[8 * c + 2 * i + 1] = f.y;
            }
        }
    }
    if (T == MOEA2A_FLOAT32) return am;
    const uint32_t a16 = max(m & 0xffffu, m >> 16);
    if (T == MOEA2A_BFLOAT16) return a16 << 16;
    return a16 >= 0x7c00u ? 0x7f800000u | (a16 & 0x3ffu) << 13
                          : __float_as_uint(__half2float(__ushort_as_half((unsigned short)a16)));
}

/* N codes (N / 4 little-endian words) of v x mul, or zeros for a non-finite block. */
template <int N> __device__ __forceinline__ void m2a_fp8_encode(const float *v, float mul, bool finite, uint32_t *w)
{
#pragma unroll
    for (int i = 0; i < N / 4; i++) w[i] = 0;
    if (!finite) return;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const __nv_fp8x2_storage_t c =
            __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i] * mul, v[2 * i + 1] * mul), __NV_SATFINITE, __NV_E4M3);
        w[i / 2] |= (uint32_t)c << (16 * (i % 2));
    }
}

#endif

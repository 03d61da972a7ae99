/* Exact conversions between fp32 and the 16-bit float formats, round to nearest even,
 * NaN kept NaN (sign and payload kept as far as the format holds them), and the
 * canonical NaN of combine outputs. The host reference kernels and the tests use these; the CUDA kernels
 * must produce the same bits. */
#ifndef M2A_CONVERT_H
#define M2A_CONVERT_H
#include <stdint.h>
#include <string.h>

/* The same code runs on the host and, compiled by nvcc, in kernels. */
#ifdef __CUDACC__
#define M2A_HD __host__ __device__ __forceinline__
#else
#define M2A_HD static inline
#endif

M2A_HD uint32_t m2a_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
M2A_HD float m2a_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The one NaN a combine writes, whatever NaN its arithmetic made: fp32 0x7fc00000
 * (positive, quiet, no payload), which the conversions below turn into bf16 0x7fc0 and
 * fp16 0x7e00. Arithmetic NaNs differ between machines (x86 makes 0xffc00000, a GPU
 * 0x7fffffff) and an input NaN's payload survives an add on one and not the other, so
 * a computed output is only the same everywhere once its NaNs are this one. */
#define M2A_CANONICAL_NAN_BITS 0x7fc00000u
M2A_HD float m2a_canonical(float f)
{
    return (m2a_f32_bits(f) & 0x7fffffffu) > 0x7f800000u ? m2a_bits_f32(M2A_CANONICAL_NAN_BITS) : f;
}

M2A_HD float m2a_bf16_to_f32(uint16_t h) { return m2a_bits_f32((uint32_t)h << 16); }

M2A_HD uint16_t m2a_f32_to_bf16(float f)
{
    uint32_t u = m2a_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

M2A_HD float m2a_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return m2a_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return m2a_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

M2A_HD uint16_t m2a_f32_to_f16(float f)
{
    uint32_t x = m2a_f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or inf): inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (a <= 0x33000000u) return (uint16_t)sign;         /* <= 2^-25 rounds to 0 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
#endif

/* FP8 block quantization arithmetic (DeepSeek-V3 / DeepGEMM activations), exactly as
 * moea2a_fp8(3) specifies it, shared by the host reference and the CUDA kernels so
 * that both produce the same bits. Blocks of 128 values of a row; E4M3 "fn" codes
 * (lib/quant/fp4_math.h); one scale per block: fp32 (amax / 448) or, with UE8M0, a power of
 * two stored as its biased exponent byte. */
#ifndef M2A_FP8_MATH_H
#define M2A_FP8_MATH_H
#include <stdint.h>

#include "quant/fp4_math.h"

#define M2A_FP8_BLOCK 128
#define M2A_FP8_AMAX_MIN 1e-4f /* the floor of a block's amax: all-zero blocks get scale 1e-4/448 */
#define M2A_FP8_NAN_SCALE 0x7fc00000u /* fp32 scale of a block with non-finite input */
#define M2A_FP8_NAN_UE8M0 0xffu

/* A block's scale from its amax (max |x| over the block, fp32) and whether every
 * value was finite: the scale's bits (fp32 bits, or the UE8M0 byte) and *mul, the
 * factor each value is multiplied by before rounding to E4M3 (0 for a non-finite
 * block, whose codes are all 0). */
M2A_HD uint32_t m2a_fp8_scale(float amax, int finite, int ue8m0, float *mul)
{
    if (!finite) {
        *mul = 0.0f;
        return ue8m0 ? M2A_FP8_NAN_UE8M0 : M2A_FP8_NAN_SCALE;
    }
    amax = amax > M2A_FP8_AMAX_MIN ? amax : M2A_FP8_AMAX_MIN;
    if (!ue8m0) {
        *mul = M2A_E4M3_MAX / amax;
        return m2a_f32_bits(amax / M2A_E4M3_MAX);
    }
    /* e = ceil(log2(q)) from q's bits: q = 2^E x 1.f is normal (amax >= 1e-4 keeps it
     * above 2^-23), so e = E, or E + 1 when f != 0. 2^-e is then exact and normal
     * (-22 <= e <= 120 for finite amax >= 1e-4). */
    uint32_t q = m2a_f32_bits(amax / M2A_E4M3_MAX);
    int e = (int)(q >> 23) - 127 + ((q & 0x7fffffu) != 0);
    *mul = m2a_bits_f32((uint32_t)(127 - e) << 23);
    return (uint32_t)(e + 127);
}

/* One value's code: E4M3 of x * mul, round to nearest even, saturating; the sign of
 * the product (a negative that rounds to zero is 0x80); 0 in a non-finite block. */
M2A_HD uint8_t m2a_fp8_code(float x, float mul, int finite)
{
    return finite ? m2a_e4m3_from_f32(x * mul) : (uint8_t)0;
}

/* A scale as fp32: the fp32 scale itself, or 2^(byte - 127) (byte 0xFF: NaN). */
M2A_HD float m2a_fp8_scale_value(uint32_t bits, int ue8m0)
{
    if (!ue8m0) return m2a_bits_f32(bits);
    if (bits == M2A_FP8_NAN_UE8M0) return m2a_bits_f32(M2A_FP8_NAN_SCALE);
    return bits ? m2a_bits_f32(bits << 23) : m2a_bits_f32(0x00400000u); /* byte 0: 2^-127, subnormal */
}

/* One dequantized value, fp32: e4m3(code) x scale; every NaN result is the canonical
 * quiet NaN, so host and device agree on its bits. */
M2A_HD float m2a_fp8_value(uint8_t code, float scale)
{
    float v = m2a_e4m3_to_f32(code) * scale;
    return v != v ? m2a_bits_f32(M2A_FP8_NAN_SCALE) : v;
}

/* Where block kb of row r keeps its scale, in bytes from the start of the scale
 * buffer (layout 0 row-major, 1 MN-major; nkb = k / 128 blocks per row, m_pad = m
 * rounded up to 4). fp32 scales take 4 bytes; UE8M0 scales one byte, four per
 * little-endian uint32 along k. */
M2A_HD size_t m2a_fp8_scale_offset(int layout, int ue8m0, size_t r, size_t kb, size_t nkb, size_t m_pad)
{
    size_t words = ue8m0 ? (nkb + 3) / 4 : nkb, w = ue8m0 ? kb / 4 : kb;
    size_t word = layout ? w * m_pad + r : r * words + w;
    return ue8m0 ? 4 * word + kb % 4 : 4 * word;
}

/* Bytes of the scale buffer for m rows of nkb blocks (padding included). */
M2A_HD size_t m2a_fp8_scale_bytes(int layout, int ue8m0, size_t m, size_t nkb)
{
    size_t words = ue8m0 ? (nkb + 3) / 4 : nkb, rows = layout ? (m + 3) / 4 * 4 : m;
    return 4 * words * rows;
}
#endif

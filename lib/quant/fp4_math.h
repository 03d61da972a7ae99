/* NVFP4 arithmetic, exactly as moea2a_fp4(3) specifies it, shared by the host
 * reference and the CUDA kernels (the same code runs on both, so the same bits).
 *
 * E2M1 codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign; two per byte, even
 * element in the low nibble. FP8 E4M3 "fn" block scales: bias 7, max 448, no
 * infinities, 0x7F NaN, subnormals m * 2^-9. All arithmetic in fp32. */
#ifndef M2A_FP4_MATH_H
#define M2A_FP4_MATH_H
#include <stdint.h>

#include "base/convert.h"
#include "moea2a.h"

#define M2A_FP4_BLOCK 16
#define M2A_E4M3_NAN 0x7f
#define M2A_E4M3_MAX 448.0f
#define M2A_E2M1_MAX 6.0f /* the largest E2M1 magnitude: a block's amax maps onto it */

#ifdef __CUDACC__
#define M2A_RINT(x) rintf(x)
#define M2A_ISFINITE(x) isfinite(x)
#else
#include <math.h>
#define M2A_RINT(x) nearbyintf(x) /* current rounding mode: round to nearest even */
#define M2A_ISFINITE(x) isfinite(x)
#endif

/* fp32 -> E4M3, round to nearest even, saturating to +-448; NaN -> 0x7F. */
M2A_HD uint8_t m2a_e4m3_from_f32(float f)
{
    uint32_t u = m2a_f32_bits(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return M2A_E4M3_NAN;
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (and inf): the largest finite */
    int e = (int)(a >> 23) - 127;
    uint32_t code;
    if (e < -6) { /* subnormal in E4M3: units of 2^-9, exact scaling then RNE */
        code = (uint32_t)M2A_RINT(m2a_bits_f32(a) * 512.0f);
    } else {
        uint32_t mant = a & 0x7fffffu, q = mant >> 20, rem = mant & 0xfffffu;
        if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) q++;
        if (q == 8) q = 0, e++;
        code = ((uint32_t)(e + 7) << 3) | q;
        if (code > 0x7e) code = 0x7e; /* rounding reached the NaN pattern: saturate */
    }
    return (uint8_t)(sign | code);
}

M2A_HD float m2a_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = b & 0x80u, e = (b >> 3) & 0xfu, m = b & 7u;
    if ((b & 0x7f) == M2A_E4M3_NAN) return m2a_bits_f32(0x7fc00000u | (sign << 24));
    float v = e == 0 ? (float)m * (1.0f / 512.0f) : m2a_bits_f32(((e + 120u) << 23) | (m << 20));
    return sign ? -v : v;
}

/* fp32 -> E2M1 code, round to nearest, ties to the even code, clamped to +-6; the
 * sign bit is the sign of v (so -0 and small negatives give 0x8). NaN gives 0: a
 * product is NaN only when g is zero or not finite, and host and GPU disagree on the
 * sign of the NaN that 0 x inf returns. */
M2A_HD uint8_t m2a_e2m1_from_f32(float v)
{
    if ((m2a_f32_bits(v) & 0x7fffffffu) > 0x7f800000u) return 0;
    float a = m2a_bits_f32(m2a_f32_bits(v) & 0x7fffffffu);
    uint8_t sign = (uint8_t)((m2a_f32_bits(v) >> 31) << 3);
    /* the code is the number of rounding thresholds a passes; "<=" where the tie goes
     * down to the even code, "<" where it goes up: 0.25 1 | 0.75 2 | 1.25 2 | 1.75 4 |
     * 2.5 4 | 3.5 6 | 5 6; beyond 5: 7 (6.0, saturating, inf included) */
    uint8_t c = (uint8_t)((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                          (a > 5.0f));
    return (uint8_t)(sign | c);
}

M2A_HD float m2a_e2m1_to_f32(uint8_t c)
{
    /* codes 2..7 are 2^((c>>1)-1) x (1 + (c&1)/2): build the fp32 bits; 1 is 0.5 */
    uint32_t m = c & 7u;
    uint32_t bits = m < 2 ? (m ? 0x3f000000u : 0u) : (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
    return m2a_bits_f32(bits | ((uint32_t)(c & 8u) << 28));
}

/* One dequantized value: e2m1(code) x scale x (1/g), fp32. Every NaN result (a NaN
 * scale: the block held non-finite input; or 0 x inf when 1/g is not finite) is the
 * canonical quiet NaN, so host and device agree on its bits (hardware differs in
 * which NaN an operation returns). */
M2A_HD float m2a_fp4_value(uint8_t code, float scale, float inv_g)
{
    float v = m2a_e2m1_to_f32(code) * scale * inv_g;
    return v != v ? m2a_bits_f32(0x7fc00000u) : v;
}

/* A block's scale from its amax (over the 16 inputs, already fp32) and whether all
 * 16 were finite; *inv receives the factor that maps an input onto the E2M1 grid.
 * Non-finite input gives the NaN scale (and inv 0, so its codes encode as zeros). */
M2A_HD uint8_t m2a_fp4_scale(float amax, int finite, float g, float *inv)
{
    if (!finite) {
        *inv = 0.0f;
        return M2A_E4M3_NAN;
    }
    uint8_t sf = m2a_e4m3_from_f32(g * (amax / M2A_E2M1_MAX));
    float sff = m2a_e4m3_to_f32(sf);
    *inv = sff == 0.0f ? 0.0f : g / sff;
    return sf;
}

/* Eight inputs of a block as packed nibbles (element 0 in the lowest); finite == 0
 * gives zero codes, the policy for blocks with non-finite input. */
M2A_HD uint32_t m2a_fp4_encode8(const float *x, float inv, int finite)
{
    uint32_t packed = 0;
    for (int i = 0; i < 8; i++) packed |= (uint32_t)m2a_e2m1_from_f32(x[i] * inv) << (4 * i);
    return finite ? packed : 0u;
}

M2A_HD float m2a_abs_f32(float x) { return m2a_bits_f32(m2a_f32_bits(x) & 0x7fffffffu); }

/* One block of 16 inputs (already fp32): its scale and 8 packed bytes. */
M2A_HD uint8_t m2a_fp4_block(const float *x, float g, uint8_t *packed)
{
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < M2A_FP4_BLOCK; i++) {
        finite &= M2A_ISFINITE(x[i]) ? 1 : 0;
        float a = m2a_abs_f32(x[i]);
        amax = a > amax ? a : amax;
    }
    float inv;
    uint8_t sf = m2a_fp4_scale(amax, finite, g, &inv);
    for (int h = 0; h < 2; h++) {
        uint32_t w = m2a_fp4_encode8(x + 8 * h, inv, finite);
        for (int i = 0; i < 4; i++) packed[4 * h + i] = (uint8_t)(w >> (8 * i));
    }
    return sf;
}

/* The swizzled scale layouts (moea2a_fp4(3)). 128x4: tiles of 128 rows x 4 blocks, 512
 * bytes each, in row-tile-major order (nkt tiles of 4 blocks per row tile); inside a
 * tile, row m % 32 at 16 bytes per row, its group of 32 rows ((m % 128) / 32) at 4 bytes
 * per group, block kb % 4 at its byte. 8x4: tiles of 8 rows x 4 blocks, 32 bytes, row
 * m % 8 at 4 bytes per row. */
#define M2A_SF128_ROWS 128
#define M2A_SF128_TILE 512
#define M2A_SF8_ROWS 8
#define M2A_SF8_TILE 32
#define M2A_SF_TILE_BLOCKS 4 /* scale blocks per tile row */
M2A_HD size_t m2a_sf_128x4(size_t m, size_t kb, size_t nkt)
{
    return (m / M2A_SF128_ROWS) * nkt * M2A_SF128_TILE + (kb / M2A_SF_TILE_BLOCKS) * M2A_SF128_TILE + (m % 32) * 16 +
           ((m % M2A_SF128_ROWS) / 32) * 4 + kb % M2A_SF_TILE_BLOCKS;
}
M2A_HD size_t m2a_sf_8x4(size_t m, size_t kb, size_t nkt)
{
    return (m / M2A_SF8_ROWS) * nkt * M2A_SF8_TILE + (kb / M2A_SF_TILE_BLOCKS) * M2A_SF8_TILE + (m % M2A_SF8_ROWS) * 4 +
           kb % M2A_SF_TILE_BLOCKS;
}

/* Scale-factor offsets of (row m, block kb) for kblocks = K/16 blocks per row. */
M2A_HD size_t m2a_sf_offset(int layout, size_t m, size_t kb, size_t kblocks)
{
    size_t nkt = (kblocks + M2A_SF_TILE_BLOCKS - 1) / M2A_SF_TILE_BLOCKS;
    if (layout == MOEA2A_SF_128X4) return m2a_sf_128x4(m, kb, nkt);
    if (layout == MOEA2A_SF_8X4) return m2a_sf_8x4(m, kb, nkt);
    return m * kblocks + kb;
}

/* Bytes of a scale-factor buffer for m rows (padding included). */
M2A_HD size_t m2a_sf_bytes(int layout, size_t m, size_t kblocks)
{
    size_t k4 = (kblocks + M2A_SF_TILE_BLOCKS - 1) / M2A_SF_TILE_BLOCKS * M2A_SF_TILE_BLOCKS;
    if (layout == MOEA2A_SF_128X4) return (m + M2A_SF128_ROWS - 1) / M2A_SF128_ROWS * M2A_SF128_ROWS * k4;
    if (layout == MOEA2A_SF_8X4) return (m + M2A_SF8_ROWS - 1) / M2A_SF8_ROWS * M2A_SF8_ROWS * k4;
    return m * kblocks;
}
#endif

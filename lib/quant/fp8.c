/* FP8 block quantization calls: argument checks, then the host reference loops
 * (lib/quant/fp8_math.h) or the CUDA module's kernels, chosen by where the pointers live. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "base/checked.h"
#include "quant/fp8_math.h"
#include "quant/quant.h"
#include "quant/quant_host.h"

static int layout_ok(moea2a_fp8_scale_layout_t l)
{
    return l == MOEA2A_FP8_SCALES_ROW_MAJOR || l == MOEA2A_FP8_SCALES_MN_MAJOR;
}

/* The scale buffer's size, or 0 when an m x k fp32 tensor or its scales would not
 * fit in a size_t: then every size derived from m and k below is exact. */
static int shape_fits(moea2a_fp8_scale_layout_t layout, unsigned flags, size_t m, size_t k, size_t *bytes)
{
    size_t elems, x_bytes, rows;
    if (!m2a_mul_ok(m, k, &elems) || !m2a_mul_ok(elems, 4, &x_bytes) || !m2a_add_ok(m, 3, &rows)) return 0;
    *bytes = m2a_fp8_scale_bytes((int)layout, (flags & MOEA2A_FP8_UE8M0) != 0, m, k / M2A_FP8_BLOCK);
    return 1;
}

/* The checks quantize and dequantize share: the type of the bf16/fp16/fp32 side
 * (named tname), whole 128-value blocks, a known layout, no unknown flag. */
static moea2a_result_t check_shape(const char *fn, const char *tname, moea2a_datatype_t t, size_t m, size_t k,
                                   moea2a_fp8_scale_layout_t layout, unsigned flags)
{
    size_t bytes;
    M2A_CHECK_ARG(NULL, m2a_quant_float_type(t), "%s: %s must be bf16, fp16 or fp32", fn, tname);
    M2A_CHECK_ARG(NULL, k % M2A_FP8_BLOCK == 0, "%s: k=%zu must be a multiple of 128 (one scale per 128 values)", fn,
                  k);
    M2A_CHECK_ARG(NULL, layout_ok(layout), "%s: unknown scale layout %d", fn, (int)layout);
    M2A_CHECK_ARG(NULL, !(flags & ~MOEA2A_FP8_UE8M0), "%s: unknown flags 0x%x", fn, flags & ~MOEA2A_FP8_UE8M0);
    M2A_CHECK_ARG(NULL, shape_fits(layout, flags, m, k, &bytes), "%s: m=%zu x k=%zu overflows a size", fn, m, k);
    return MOEA2A_SUCCESS;
}

/* Everything quantize and dequantize check before they work: buffers (values: the
 * bf16/fp16/fp32 side, named tname by its type), shape, one memory space, alignment
 * on the device. *cuda: 1 device, 0 host, -1 nothing to do (m or k is 0). */
static moea2a_result_t prepare(const char *fn, const char *tname, const void *values, const void *codes,
                               const void *scales, moea2a_datatype_t t, size_t m, size_t k,
                               moea2a_fp8_scale_layout_t layout, unsigned flags, int *cuda)
{
    M2A_CHECK_ARG(NULL, (values && codes && scales) || m == 0, "%s: no buffer may be NULL", fn);
    M2A_TRY(check_shape(fn, tname, t, m, k, layout, flags));
    const void *p[3] = {values, codes, scales};
    *cuda = m2a_quant_space(p, 3);
    M2A_QUANT_CHECK_SPACE(*cuda, fn);
    if (m == 0 || k == 0) {
        *cuda = -1;
        return MOEA2A_SUCCESS;
    }
    M2A_QUANT_CHECK_ALIGNED(*cuda, fn, values, codes, scales);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp8_scale_bytes(moea2a_fp8_scale_layout_t layout, unsigned flags, size_t m, size_t k,
                                       size_t *bytes)
{
    static const char fn[] = "moea2a_fp8_scale_bytes";
    M2A_CHECK_ARG(NULL, bytes, "%s: bytes must not be NULL", fn);
    M2A_CHECK_ARG(NULL, k % M2A_FP8_BLOCK == 0, "%s: k=%zu must be a multiple of 128", fn, k);
    M2A_CHECK_ARG(NULL, layout_ok(layout), "%s: unknown scale layout %d", fn, (int)layout);
    M2A_CHECK_ARG(NULL, !(flags & ~MOEA2A_FP8_UE8M0), "%s: unknown flags 0x%x", fn, flags & ~MOEA2A_FP8_UE8M0);
    M2A_CHECK_ARG(NULL, shape_fits(layout, flags, m, k, bytes), "%s: m=%zu x k=%zu overflows a size", fn, m, k);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp8_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                                    moea2a_fp8_scale_layout_t layout, unsigned flags, void *stream)
{
    static const char fn[] = "moea2a_fp8_quantize";
    int cuda;
    M2A_TRY(prepare(fn, "xtype", x, q, scales, xtype, m, k, layout, flags, &cuda));
    if (cuda < 0) return MOEA2A_SUCCESS;
    const int ue8m0 = (flags & MOEA2A_FP8_UE8M0) != 0;
    if (cuda) M2A_QUANT_CUDA_OR(fp8_quantize(x, xtype, m, k, q, scales, (int)layout, ue8m0, stream));
    m2a_fp8_quantize_host(x, xtype, m, k, q, scales, (int)layout, ue8m0);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp8_dequantize(const void *q, const void *scales, moea2a_fp8_scale_layout_t layout,
                                      unsigned flags, size_t m, size_t k, void *out, moea2a_datatype_t otype,
                                      void *stream)
{
    static const char fn[] = "moea2a_fp8_dequantize";
    int cuda;
    M2A_TRY(prepare(fn, "otype", out, q, scales, otype, m, k, layout, flags, &cuda));
    if (cuda < 0) return MOEA2A_SUCCESS;
    const int ue8m0 = (flags & MOEA2A_FP8_UE8M0) != 0;
    if (cuda) M2A_QUANT_CUDA_OR(fp8_dequantize(q, scales, (int)layout, ue8m0, m, k, out, otype, stream));
    size_t nkb = k / M2A_FP8_BLOCK, m_pad = (m + 3) / 4 * 4;
    const unsigned char *qb = q, *sb = scales;
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < nkb; kb++) {
            const unsigned char *src = sb + m2a_fp8_scale_offset((int)layout, ue8m0, r, kb, nkb, m_pad);
            uint32_t bits = *src;
            if (!ue8m0) memcpy(&bits, src, 4);
            float s = m2a_fp8_scale_value(bits, ue8m0);
            for (int i = 0; i < M2A_FP8_BLOCK; i++) {
                size_t at = r * k + kb * M2A_FP8_BLOCK + (size_t)i;
                m2a_quant_store(out, otype, at, m2a_fp8_value(qb[at], s));
            }
        }
    return MOEA2A_SUCCESS;
}

/* ---- the host loop (quant_host.h) ------------------------------------------------------ */

void m2a_fp8_quantize_host(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales, int layout,
                           int ue8m0)
{
    size_t nkb = k / M2A_FP8_BLOCK, m_pad = (m + 3) / 4 * 4;
    unsigned char *sb = scales, *qb = q;
    memset(sb, 0, m2a_fp8_scale_bytes(layout, ue8m0, m, nkb)); /* padding rows and bytes */
    float v[M2A_FP8_BLOCK];
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < nkb; kb++) {
            float amax = 0.0f;
            int finite = 1;
            for (int i = 0; i < M2A_FP8_BLOCK; i++) {
                v[i] = m2a_quant_load(x, xtype, r * k + kb * M2A_FP8_BLOCK + (size_t)i);
                finite &= M2A_ISFINITE(v[i]) != 0;
                float a = m2a_abs_f32(v[i]);
                amax = a > amax ? a : amax;
            }
            float mul;
            uint32_t s = m2a_fp8_scale(amax, finite, ue8m0, &mul);
            unsigned char *dst = sb + m2a_fp8_scale_offset(layout, ue8m0, r, kb, nkb, m_pad);
            if (ue8m0) *dst = (unsigned char)s;
            else memcpy(dst, &s, 4);
            for (int i = 0; i < M2A_FP8_BLOCK; i++) qb[r * k + kb * M2A_FP8_BLOCK + (size_t)i] = m2a_fp8_code(v[i], mul, finite);
        }
}

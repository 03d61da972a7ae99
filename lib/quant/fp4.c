/* NVFP4 calls: argument checks, then the host reference loops (lib/quant/fp4_math.h) or
 * the CUDA kernels, chosen by where the pointers live (quant.h). */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "base/checked.h"
#include "base/error.h"
#include "quant/fp4_math.h"

#include "quant/quant.h"
#include "quant/quant_host.h"

static int layout_ok(moea2a_sf_layout_t l)
{
    return l == MOEA2A_SF_LINEAR || l == MOEA2A_SF_128X4 || l == MOEA2A_SF_8X4;
}

/* The scale buffer's size, or 0 when an m x k tensor (fp32, the widest input) or its
 * tiled scales would not fit in a size_t: then every size derived below is exact. */
static int shape_fits(moea2a_sf_layout_t layout, size_t m, size_t k, size_t *sf_bytes)
{
    size_t elems, x_bytes, rows = m, kb4 = (k / 16 + 3) / 4 * 4, tile = layout == MOEA2A_SF_128X4 ? 128 : 8;
    if (!m2a_mul_ok(m, k, &elems) || !m2a_mul_ok(elems, 4, &x_bytes)) return 0;
    if (layout != MOEA2A_SF_LINEAR && !m2a_add_ok(m, tile - 1, &rows)) return 0;
    return m2a_mul_ok(rows, kb4, sf_bytes) && (*sf_bytes = m2a_sf_bytes((int)layout, m, k / 16), 1);
}

/* The checks quantize and dequantize share, in order: the four buffers p (named by
 * names) not NULL unless m is 0; the type of the bf16/fp16/fp32 side (named tname),
 * whole 16-value blocks, a known scale layout, sizes that fit; the buffers all in one
 * memory, which *cuda says. */
static moea2a_result_t check_call(const char *fn, const char *names, const void *const p[4], const char *tname,
                                  moea2a_datatype_t t, size_t m, size_t k, moea2a_sf_layout_t layout, int *cuda)
{
    size_t sf;
    M2A_CHECK_ARG(NULL, (p[0] && p[1] && p[2] && p[3]) || m == 0, "%s: %s must not be NULL", fn, names);
    M2A_CHECK_ARG(NULL, m2a_quant_float_type(t), "%s: %s must be bf16, fp16 or fp32", fn, tname);
    M2A_CHECK_ARG(NULL, k % 16 == 0, "%s: k=%zu must be a multiple of 16 (one scale per 16 values)", fn, k);
    M2A_CHECK_ARG(NULL, layout_ok(layout), "%s: unknown scale layout %d", fn, (int)layout);
    M2A_CHECK_ARG(NULL, shape_fits(layout, m, k, &sf), "%s: m=%zu x k=%zu overflows a size", fn, m, k);
    *cuda = m2a_quant_space(p, 4);
    M2A_QUANT_CHECK_SPACE(*cuda, fn);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_sf_bytes(moea2a_sf_layout_t layout, size_t m, size_t k, size_t *bytes)
{
    M2A_CHECK_ARG(NULL, bytes && layout_ok(layout) && k % 16 == 0,
                  "moea2a_fp4_sf_bytes: bytes must not be NULL, the layout known, k a multiple of 16 (k=%zu)", k);
    M2A_CHECK_ARG(NULL, shape_fits(layout, m, k, bytes), "moea2a_fp4_sf_bytes: m=%zu x k=%zu overflows a size", m, k);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_global_scale(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream)
{
    static const char fn[] = "moea2a_fp4_global_scale";
    M2A_CHECK_ARG(NULL, g && (x || count == 0), "%s: x and g must not be NULL", fn);
    M2A_CHECK_ARG(NULL, m2a_quant_float_type(xtype), "%s: xtype must be bf16, fp16 or fp32", fn);
    size_t bytes;
    M2A_CHECK_ARG(NULL, m2a_mul_ok(count, 4, &bytes), "%s: count=%zu overflows a size", fn, count);
    const void *p[2] = {x, g};
    int cuda = m2a_quant_space(p, 2);
    M2A_QUANT_CHECK_SPACE(cuda, fn);
    if (cuda) M2A_QUANT_CUDA_OR(fp4_global_scale(x, xtype, count, g, stream));
    *g = m2a_fp4_global_scale_host(x, xtype, count);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q,
                                    void *sf, moea2a_sf_layout_t layout, void *stream)
{
    static const char fn[] = "moea2a_fp4_quantize";
    const void *p[4] = {x, g, q, sf};
    int cuda;
    M2A_TRY(check_call(fn, "x, g, q and sf", p, "xtype", xtype, m, k, layout, &cuda));
    if (m == 0 || k == 0) return MOEA2A_SUCCESS;
    M2A_QUANT_CHECK_ALIGNED(cuda, fn, x, q, sf);
    if (cuda) M2A_QUANT_CUDA_OR(fp4_quantize(x, xtype, m, k, g, q, sf, (int)layout, NULL, stream));
    m2a_fp4_quantize_host(x, xtype, m, k, *g, q, sf, (int)layout);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_dequantize(const void *q, const void *sf, moea2a_sf_layout_t layout, const float *g, size_t m,
                                      size_t k, void *out, moea2a_datatype_t otype, void *stream)
{
    static const char fn[] = "moea2a_fp4_dequantize";
    const void *p[4] = {q, sf, g, out};
    int cuda;
    M2A_TRY(check_call(fn, "q, sf, g and out", p, "otype", otype, m, k, layout, &cuda));
    if (m == 0 || k == 0) return MOEA2A_SUCCESS;
    M2A_QUANT_CHECK_ALIGNED(cuda, fn, out, q, sf);
    if (cuda) M2A_QUANT_CUDA_OR(fp4_dequantize(q, sf, (int)layout, g, m, k, out, otype, stream));
    size_t kb_n = k / 16;
    float inv_g = 1.0f / *g;
    const unsigned char *qb = q, *sfb = sf;
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < kb_n; kb++) {
            float s = m2a_e4m3_to_f32(sfb[m2a_sf_offset((int)layout, r, kb, kb_n)]);
            for (int i = 0; i < M2A_FP4_BLOCK; i++) {
                unsigned char byte = qb[r * (k / 2) + kb * 8 + (size_t)i / 2];
                uint8_t code = (uint8_t)(i % 2 ? byte >> 4 : byte & 15);
                m2a_quant_store(out, otype, r * k + kb * 16 + (size_t)i, m2a_fp4_value(code, s, inv_g));
            }
        }
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_sf_convert(const void *src, moea2a_sf_layout_t src_layout, void *dst,
                                      moea2a_sf_layout_t dst_layout, size_t m, size_t k, void *stream)
{
    static const char fn[] = "moea2a_fp4_sf_convert";
    M2A_CHECK_ARG(NULL, (src && dst) || m == 0, "%s: src and dst must not be NULL", fn);
    M2A_CHECK_ARG(NULL, k % 16 == 0, "%s: k=%zu must be a multiple of 16", fn, k);
    M2A_CHECK_ARG(NULL, layout_ok(src_layout) && layout_ok(dst_layout), "%s: unknown scale layout", fn);
    size_t sf;
    M2A_CHECK_ARG(NULL, shape_fits(src_layout, m, k, &sf) && shape_fits(dst_layout, m, k, &sf),
                  "%s: m=%zu x k=%zu overflows a size", fn, m, k);
    M2A_CHECK_ARG(NULL, src != dst || src_layout == dst_layout, "%s: cannot convert in place", fn);
    const void *p[2] = {src, dst};
    int cuda = m2a_quant_space(p, 2);
    M2A_QUANT_CHECK_SPACE(cuda, fn);
    if (m == 0 || k == 0) return MOEA2A_SUCCESS;
    if (cuda) M2A_QUANT_CUDA_OR(fp4_sf_convert(src, (int)src_layout, dst, (int)dst_layout, m, k, NULL, 0, stream));
    m2a_fp4_convert_host(src, (int)src_layout, dst, (int)dst_layout, m, k / 16, NULL, 0);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_fp4_sf_convert_padded(const void *src, void *dst, moea2a_sf_layout_t dst_layout,
                                             const int32_t *recv_counts, int ep, int stride, size_t k, void *stream)
{
    static const char fn[] = "moea2a_fp4_sf_convert_padded";
    M2A_CHECK_ARG(NULL, src && dst && recv_counts, "%s: src, dst and recv_counts must not be NULL", fn);
    M2A_CHECK_ARG(NULL, ep >= 1 && stride >= 1, "%s: ep=%d and stride=%d must be >= 1", fn, ep, stride);
    M2A_CHECK_ARG(NULL, k % 16 == 0, "%s: k=%zu must be a multiple of 16", fn, k);
    M2A_CHECK_ARG(NULL, layout_ok(dst_layout), "%s: unknown scale layout", fn);
    size_t m = (size_t)ep * (size_t)stride, sf;
    M2A_CHECK_ARG(NULL, shape_fits(dst_layout, m, k, &sf), "%s: ep x stride x k overflows a size", fn);
    const void *p[3] = {src, dst, recv_counts};
    int cuda = m2a_quant_space(p, 3);
    M2A_QUANT_CHECK_SPACE(cuda, fn);
    if (cuda) M2A_QUANT_CUDA_OR(fp4_sf_convert(src, MOEA2A_SF_LINEAR, dst, (int)dst_layout, m, k, recv_counts, stride, stream));
    m2a_fp4_convert_host(src, MOEA2A_SF_LINEAR, dst, (int)dst_layout, m, k / 16, recv_counts, stride);
    return MOEA2A_SUCCESS;
}

/* ---- the host loops (quant_host.h) ---------------------------------------------------- */

float m2a_fp4_global_scale_host(const void *x, moea2a_datatype_t xtype, size_t count)
{
    /* amax by the bits of |x|: NaN ranks above inf, as on the device */
    uint32_t amax = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t a = m2a_f32_bits(m2a_quant_load(x, xtype, i)) & 0x7fffffffu;
        amax = a > amax ? a : amax;
    }
    return amax == 0 ? 1.0f : (M2A_E4M3_MAX * 6.0f) / m2a_bits_f32(amax);
}

void m2a_fp4_quantize_host(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, float g, void *q, void *sf,
                           int layout)
{
    size_t kb_n = k / 16;
    unsigned char *sfb = sf, *qb = q;
    memset(sfb, 0, m2a_sf_bytes(layout, m, kb_n)); /* padding of the tiled layouts */
    float block[M2A_FP4_BLOCK];
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < kb_n; kb++) {
            for (int i = 0; i < M2A_FP4_BLOCK; i++) block[i] = m2a_quant_load(x, xtype, r * k + kb * 16 + (size_t)i);
            sfb[m2a_sf_offset(layout, r, kb, kb_n)] = m2a_fp4_block(block, g, qb + r * (k / 2) + kb * 8);
        }
}

/* dst over m rows: row r's block kb from src, or 0 for padding (and for rows that
 * counts mark as unused). */
void m2a_fp4_convert_host(const unsigned char *src, int sl, unsigned char *dst, int dl, size_t m, size_t kb_n,
                          const int32_t *counts, int stride)
{
    memset(dst, 0, m2a_sf_bytes(dl, m, kb_n));
    for (size_t r = 0; r < m; r++) {
        if (counts && (int)(r % (size_t)stride) >= counts[r / (size_t)stride]) continue;
        for (size_t kb = 0; kb < kb_n; kb++) dst[m2a_sf_offset(dl, r, kb, kb_n)] = src[m2a_sf_offset(sl, r, kb, kb_n)];
    }
}

/* moea2a_expert_gemm: argument checks, then the CUDA module's kernel
 * (cuda/kernels/fp4_gemm.cu) on device memory or the host reference below on host memory.
 *
 * The host reference computes what the kernel computes, in more precision: per output,
 * the exact products a x (e2m1 x SF) summed in double, rounded to fp32, times 1/g
 * (taken as (256 / g) / 256, the kernel's factor); SwiGLU in fp32 on the rounded
 * gate and up values. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/error.h"
#include "base/params.h"
#include "comm/cuda_module.h"
#include "quant/fp4_math.h"
#include "quant/quant.h"

/* Output columns: n, or n / 2 with SwiGLU. */
static size_t out_cols(const moea2a_expert_gemm_t *g) { return g->flags & MOEA2A_GEMM_SWIGLU ? g->n / 2 : g->n; }

/* A's rows feeding C: expert-major rows, rank-major pairs (C rows). */
static int64_t c_rows(const moea2a_expert_gemm_t *g)
{
    return g->rows_layout == MOEA2A_GEMM_ROWS_RANK_MAJOR ? g->rows * g->slots : g->rows;
}

static moea2a_result_t check(const char *fn, const moea2a_expert_gemm_t *g, size_t *sf_stride)
{
    M2A_CHECK_ARG(NULL, g, "%s: g must not be NULL", fn);
    /* a caller's struct from this version or a later one (whose added fields this one
     * does not read) */
    M2A_CHECK_ARG(NULL, g->size >= sizeof(moea2a_expert_gemm_t) && g->size <= 65536 && g->version >= 100,
                  "%s: size=%zu, version=%u: start from MOEA2A_EXPERT_GEMM_INITIALIZER (this moea2a's "
                  "moea2a_expert_gemm_t has %zu bytes)", fn, g->size, g->version, sizeof(moea2a_expert_gemm_t));
    M2A_CHECK_ARG(NULL, g->num_experts >= 1 && g->num_experts <= M2A_GEMM_MAX_EXPERTS,
                  "%s: num_experts=%d must be 1..%d", fn, g->num_experts, M2A_GEMM_MAX_EXPERTS);
    M2A_CHECK_ARG(NULL, g->k > 0 && g->k % 16 == 0 && g->k <= (1u << 24),
                  "%s: k=%zu must be a positive multiple of 16, at most 2^24", fn, g->k);
    M2A_CHECK_ARG(NULL, !(g->flags & ~MOEA2A_GEMM_SWIGLU), "%s: unknown flags 0x%x", fn, g->flags);
    M2A_CHECK_ARG(NULL, g->n > 0 && g->n <= INT32_MAX && (!(g->flags & MOEA2A_GEMM_SWIGLU) || g->n % 2 == 0),
                  "%s: n=%zu must be 1..2^31-1 (and even with MOEA2A_GEMM_SWIGLU)", fn, g->n);
    M2A_CHECK_ARG(NULL, g->rows_layout == MOEA2A_GEMM_ROWS_EXPERT_MAJOR || g->rows_layout == MOEA2A_GEMM_ROWS_RANK_MAJOR,
                  "%s: unknown rows_layout %d", fn, (int)g->rows_layout);
    M2A_CHECK_ARG(NULL, g->rows >= 0 && g->rows <= INT32_MAX, "%s: rows=%lld must be 0..2^31-1", fn,
                  (long long)g->rows);
    M2A_CHECK_ARG(NULL, g->c_type == MOEA2A_BFLOAT16 || g->c_type == MOEA2A_FLOAT32,
                  "%s: c_type must be MOEA2A_BFLOAT16 or MOEA2A_FLOAT32", fn);
    M2A_CHECK_ARG(NULL, g->lda >= g->k, "%s: lda=%zu must be >= k=%zu", fn, g->lda, g->k);
    M2A_CHECK_ARG(NULL, g->ldc >= out_cols(g), "%s: ldc=%zu must be >= %zu (the output columns)", fn, g->ldc,
                  out_cols(g));
    M2A_CHECK_ARG(NULL, g->a && g->w && g->w_scales && g->w_global && g->c,
                  "%s: a, w, w_scales, w_global and c must not be NULL", fn);
    if (g->rows_layout == MOEA2A_GEMM_ROWS_EXPERT_MAJOR) {
        M2A_CHECK_ARG(NULL, g->counts && g->offsets, "%s: expert-major rows need counts and offsets", fn);
    } else {
        M2A_CHECK_ARG(NULL, g->ids && g->slots >= 1, "%s: rank-major rows need ids and slots >= 1 (slots=%d)", fn,
                      g->slots);
        M2A_CHECK_ARG(NULL, g->rows <= INT32_MAX / g->slots, "%s: rows=%lld x slots=%d must fit an int32", fn,
                      (long long)g->rows, g->slots);
        M2A_CHECK_ARG(NULL, (int64_t)g->first_expert + g->num_experts <= INT32_MAX,
                      "%s: first_expert=%d + num_experts overflows an int32", fn, (int)g->first_expert);
    }
    /* every byte the call may touch has a size_t offset */
    size_t w_bytes, a_elems, c_elems, sf;
    M2A_CHECK_ARG(NULL,
                  m2a_mul_ok(g->n, g->k / 2, &w_bytes) && m2a_mul_ok(w_bytes, (size_t)g->num_experts, &w_bytes) &&
                      m2a_mul_ok((size_t)g->rows, g->lda, &a_elems) && m2a_mul_ok(a_elems, 2, &a_elems) &&
                      m2a_mul_ok((size_t)c_rows(g), g->ldc, &c_elems) && m2a_mul_ok(c_elems, 4, &c_elems) &&
                      moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, g->n, g->k, &sf) == MOEA2A_SUCCESS &&
                      m2a_mul_ok(sf, (size_t)g->num_experts, &w_bytes),
                  "%s: the sizes (n=%zu, k=%zu, rows=%lld, lda=%zu, ldc=%zu) overflow a size", fn, g->n, g->k,
                  (long long)g->rows, g->lda, g->ldc);
    *sf_stride = sf;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_expert_gemm_workspace_size(const moea2a_expert_gemm_t *g, size_t *bytes)
{
    static const char fn[] = "moea2a_expert_gemm_workspace_size";
    size_t sf;
    M2A_CHECK_ARG(NULL, bytes, "%s: bytes must not be NULL", fn);
    M2A_TRY(check(fn, g, &sf));
    const void *p[1] = {g->w};
    int cuda = m2a_quant_space(p, 1) == 1;
    *bytes = cuda ? m2a_gemm_workspace_bytes(g->num_experts, g->rows,
                                             g->rows_layout == MOEA2A_GEMM_ROWS_RANK_MAJOR ? g->slots : 0)
                  : 0;
    return MOEA2A_SUCCESS;
}

/* ---- the host reference ----------------------------------------------------------- */

/* Expert e's C rows and their A rows, in order (rows clipped as on the device). */
static int64_t host_rows(const moea2a_expert_gemm_t *g, int e, int64_t *arow, int64_t *crow)
{
    int64_t n = 0;
    if (g->rows_layout == MOEA2A_GEMM_ROWS_EXPERT_MAJOR) {
        int64_t o = g->offsets[e], c = g->counts[e];
        if (o < 0 || o > g->rows || c < 0) c = 0;
        if (c > g->rows - o) c = g->rows - o;
        for (int64_t i = 0; i < c; i++) arow[n] = crow[n] = o + i, n++;
        return n;
    }
    for (int64_t p = 0; p < g->rows * g->slots; p++)
        if ((int64_t)g->ids[p] - g->first_expert == e) arow[n] = p / g->slots, crow[n] = p, n++;
    return n;
}

static moea2a_result_t host_gemm(const char *fn, const moea2a_expert_gemm_t *g, size_t sf_stride)
{
    const size_t n = g->n, k = g->k, kb_n = k / 16, cols = out_cols(g);
    const int64_t most = c_rows(g);
    float *wrow = malloc(k * sizeof(float));
    int64_t *arow = malloc((size_t)(most ? most : 1) * sizeof(int64_t));
    int64_t *crow = malloc((size_t)(most ? most : 1) * sizeof(int64_t));
    float *out = NULL;
    moea2a_result_t rc = MOEA2A_SUCCESS;
    if (!wrow || !arow || !crow) {
        rc = m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "%s: out of host memory", fn);
        goto done;
    }
    const unsigned char *codes = g->w, *scales = g->w_scales;
    for (int e = 0; e < g->num_experts; e++) {
        int64_t cnt = host_rows(g, e, arow, crow);
        if (cnt == 0) continue;
        free(out);
        out = malloc((size_t)cnt * n * sizeof(float));
        if (!out) {
            rc = m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "%s: out of host memory", fn);
            goto done;
        }
        const float s = M2A_GEMM_UNSCALE / g->w_global[e];
        const unsigned char *we = codes + (size_t)e * n * (k / 2), *se = scales + (size_t)e * sf_stride;
        for (size_t r = 0; r < n; r++) {
            for (size_t kb = 0; kb < kb_n; kb++) { /* e2m1 x SF: exact in fp32 */
                float sfv = m2a_e4m3_to_f32(se[m2a_sf_offset(MOEA2A_SF_128X4, r, kb, kb_n)]);
                for (size_t i = 0; i < 16; i++) {
                    unsigned char b = we[r * (k / 2) + kb * 8 + i / 2];
                    wrow[kb * 16 + i] = m2a_e2m1_to_f32((uint8_t)(i % 2 ? b >> 4 : b & 15)) * sfv;
                }
            }
            for (int64_t t = 0; t < cnt; t++) {
                const uint16_t *a = (const uint16_t *)g->a + (size_t)arow[t] * g->lda;
                double sum = 0.0;
                for (size_t i = 0; i < k; i++) sum += (double)m2a_bf16_to_f32(a[i]) * (double)wrow[i];
                out[(size_t)t * n + r] = (float)(sum / M2A_GEMM_UNSCALE) * s;
            }
        }
        for (int64_t t = 0; t < cnt; t++)
            for (size_t j = 0; j < cols; j++) {
                const float *o = out + (size_t)t * n;
                float v = o[j];
                if (g->flags & MOEA2A_GEMM_SWIGLU) v = v / (1.0f + expf(-v)) * o[j + n / 2];
                m2a_quant_store(g->c, g->c_type, (size_t)crow[t] * g->ldc + j, v);
            }
    }
done:
    free(wrow), free(arow), free(crow), free(out);
    return rc;
}

moea2a_result_t moea2a_expert_gemm(const moea2a_expert_gemm_t *g, void *stream)
{
    static const char fn[] = "moea2a_expert_gemm";
    size_t sf_stride;
    M2A_TRY(check(fn, g, &sf_stride));
    const int rank_major = g->rows_layout == MOEA2A_GEMM_ROWS_RANK_MAJOR;
    const void *p[8] = {g->a, g->w, g->w_scales, g->w_global, g->c, rank_major ? g->ids : g->counts,
                        rank_major ? NULL : g->offsets, rank_major ? g->workspace : NULL};
    int cuda = m2a_quant_space(p, 8);
    M2A_QUANT_CHECK_SPACE(cuda, fn);
    if (!cuda) return g->rows == 0 ? MOEA2A_SUCCESS : host_gemm(fn, g, sf_stride);
    M2A_CHECK_ARG(NULL, (((uintptr_t)g->a | (uintptr_t)g->w | (uintptr_t)g->w_scales) & 15) == 0 && g->lda % 8 == 0,
                  "%s: on CUDA memory a, w and w_scales must be 16-byte aligned and lda a multiple of 8", fn);
    size_t need = m2a_gemm_workspace_bytes(g->num_experts, g->rows, rank_major ? g->slots : 0);
    M2A_CHECK_ARG(NULL, !need || (g->workspace && g->workspace_size >= need && ((uintptr_t)g->workspace & 3) == 0),
                  "%s: rank-major rows on CUDA memory need a 4-byte aligned workspace of %zu bytes "
                  "(moea2a_expert_gemm_workspace_size; workspace_size=%zu)", fn, need, g->workspace_size);
    if (g->rows == 0) return MOEA2A_SUCCESS;
    long wgmma = 2;
    M2A_TRY(m2a_param_int("MOEA2A_GEMM_WGMMA", &wgmma));
    int32_t *ws = g->workspace;
    size_t pairs = rank_major ? (size_t)g->rows * (size_t)g->slots : 0;
    m2a_kgemm_t k = {
        .num_experts = g->num_experts,
        .swiglu = !!(g->flags & MOEA2A_GEMM_SWIGLU),
        .out_fp32 = g->c_type == MOEA2A_FLOAT32,
        .slots = rank_major ? g->slots : 0,
        .first_expert = g->first_expert,
        .no_wgmma = wgmma == 0,
        .no_ws = wgmma < 2,
        .n = (int64_t)g->n,
        .k = (int64_t)g->k,
        .rows = g->rows,
        .lda = (int64_t)g->lda,
        .ldc = (int64_t)g->ldc,
        .a = g->a,
        .counts = g->counts,
        .offsets = g->offsets,
        .ids = g->ids,
        .list = rank_major ? ws : NULL,
        .list_counts = rank_major ? ws + pairs : NULL,
        .list_offsets = rank_major ? ws + pairs + g->num_experts : NULL,
        .w = g->w,
        .sf = g->w_scales,
        .sf_stride = sf_stride,
        .g = g->w_global,
        .c = g->c,
    };
    M2A_QUANT_CUDA_OR(expert_gemm(&k, stream));
}

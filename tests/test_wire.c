/* Quantize on dispatch: a payload given in bf16, fp16 or fp32 and sent as FP8 (both
 * scale kinds, both layouts) or NVFP4 (three scale layouts) arrives bit for bit as if
 * each rank had quantized its tokens with the standalone calls (on the host) and
 * dispatched the codes and row scales as plain payloads: codes, scales in the wire's
 * layout with padding rows 0, NVFP4's per-source global scales, next to a payload sent
 * as is; one call and the split halves; random routings with invalid ids, idle ranks,
 * several strides; the sizes of the arrays against the formula of moea2a_moe(3); a
 * wire mismatch between ranks; and the config checks. On host memory always; on CUDA
 * memory, load/store and generic paths, on as many GPUs as the machine has (SKIP
 * without one). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "ctx_mem.h"
#include "local_ranks.h"
#include "mix.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"

#if defined(MOEA2A_HAVE_CUDA) && defined(MOEA2A_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#define WITH_CUDA 1
#else
#define WITH_CUDA 0
#endif

#define WATCHDOG 300.0
#define A(x) (((size_t)(x) + 127) / 128 * 128)

typedef struct {
    int format, layout;
    unsigned flags;
    moea2a_datatype_t dtype;
    size_t elems;
} wire_case_t;

static const wire_case_t cases[] = {
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_ROW_MAJOR, 0, MOEA2A_BFLOAT16, 640},
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, 0, MOEA2A_FLOAT32, 256},
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, MOEA2A_FLOAT16, 640},
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, MOEA2A_FP8_UE8M0, MOEA2A_BFLOAT16, 1152},
    {MOEA2A_WIRE_NVFP4, MOEA2A_SF_LINEAR, 0, MOEA2A_BFLOAT16, 96},
    {MOEA2A_WIRE_NVFP4, MOEA2A_SF_128X4, 0, MOEA2A_FLOAT32, 64},
    {MOEA2A_WIRE_NVFP4, MOEA2A_SF_8X4, 0, MOEA2A_FLOAT16, 208},
    /* rows past one of the load/store dispatch's units (4096 bytes; with few tokens
     * 2048 FP8 codes, one pass of the copying warp, when MOEA2A_QUANT_IN_COPY is on):
     * full units, a partial one, UE8M0 words with unused bytes */
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, MOEA2A_BFLOAT16, 4736},
    {MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, 0, MOEA2A_FLOAT16, 4224},
};
#define NCASES ((int)(sizeof(cases) / sizeof(cases[0])))

static size_t dsize(moea2a_datatype_t t) { return t == MOEA2A_FLOAT32 ? 4 : 2; }

/* Where a run keeps the context's buffers: host memory, or CUDA memory on the
 * load/store (nvlink) or the generic path (ctx_mem.h moves the test's data). */
typedef struct {
    int cuda, nvlink, ndev;
    int ipc; /* more ranks than GPUs: they share them over CUDA IPC, without NCCL */
} where_t;

/* Scale bytes of one row as the standalone calls write them (row-major / linear). */
static size_t scale_row(const wire_case_t *w)
{
    size_t nkb = w->elems / 128;
    if (w->format == MOEA2A_WIRE_NVFP4) return w->elems / 16;
    return 4 * (w->flags & MOEA2A_FP8_UE8M0 ? (nkb + 3) / 4 : nkb);
}
static size_t code_row(const wire_case_t *w) { return w->format == MOEA2A_WIRE_FP8 ? w->elems : w->elems / 2; }

/* finite values with some zero rows: 16-bit patterns with the top exponent bit clear */
static void *make_values(const wire_case_t *w, int me, uint64_t seed, int n)
{
    size_t bytes = (size_t)n * w->elems * dsize(w->dtype);
    unsigned char *x = malloc(bytes + 16);
    for (size_t i = 0; i + 1 < bytes + 1; i += 2) {
        uint16_t h = (uint16_t)mix(seed * 1315423911u + (uint64_t)me * 7919 + i) & 0xbfff;
        memcpy(x + i, &h, 2);
    }
    if (n > 2) memset(x + w->elems * dsize(w->dtype), 0, w->elems * dsize(w->dtype)); /* row 1: zeros */
    return x;
}

static moea2a_moe_config_t config_for(const wire_case_t *w, int E, int k, int cap, int quantized)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = E, c.top_k = k, c.max_tokens_per_rank = cap, c.memory = MOEA2A_MEMORY_HOST;
    c.hidden = 64, c.combine_dtype = MOEA2A_BFLOAT16; /* a combine: the load/store path's gate */
    if (quantized) {
        c.num_payloads = 2;
        c.payloads[0] = (moea2a_payload_desc_t){w->dtype, w->elems};
        c.wire[0] = (moea2a_wire_t){(moea2a_wire_format_t)w->format, w->layout, w->flags};
    } else { /* the same, quantized by the caller: codes, row scales [, global scale] as bytes */
        c.num_payloads = w->format == MOEA2A_WIRE_NVFP4 ? 4 : 3;
        c.payloads[0] = (moea2a_payload_desc_t){MOEA2A_UINT8, code_row(w)};
        c.payloads[2] = (moea2a_payload_desc_t){MOEA2A_UINT8, scale_row(w)};
        if (w->format == MOEA2A_WIRE_NVFP4) c.payloads[3] = (moea2a_payload_desc_t){MOEA2A_FLOAT32, 1};
    }
    c.payloads[1] = (moea2a_payload_desc_t){MOEA2A_INT32, 3}; /* a payload sent as is, next to it */
    return c;
}

/* What the wire's layout makes of the row scales that arrived (rows [ep][stride]),
 * from the layouts' definitions; NVFP4 tiles through the public conversion. */
static unsigned char *expected_scales(const wire_case_t *w, const unsigned char *rows, const int32_t *counts, int ep,
                                      int stride, size_t *bytes)
{
    size_t srow = scale_row(w), nrows = (size_t)ep * (size_t)stride;
    unsigned char *padded = calloc(nrows, srow);
    for (int src = 0; src < ep; src++)
        for (int r = 0; r < counts[src]; r++)
            memcpy(padded + ((size_t)src * stride + r) * srow, rows + ((size_t)src * stride + r) * srow, srow);
    if (w->format == MOEA2A_WIRE_FP8 && w->layout == MOEA2A_FP8_SCALES_MN_MAJOR) {
        size_t words = srow / 4, pad = ((size_t)stride + 3) / 4 * 4;
        *bytes = (size_t)ep * words * pad * 4;
        unsigned char *mn = calloc(1, *bytes);
        for (int src = 0; src < ep; src++)
            for (size_t wd = 0; wd < words; wd++)
                for (int r = 0; r < stride; r++)
                    memcpy(mn + (((size_t)src * words + wd) * pad + (size_t)r) * 4,
                           padded + ((size_t)src * stride + r) * srow + 4 * wd, 4);
        free(padded);
        return mn;
    }
    if (w->format == MOEA2A_WIRE_NVFP4 && w->layout != MOEA2A_SF_LINEAR) {
        moea2a_fp4_sf_bytes((moea2a_sf_layout_t)w->layout, nrows, w->elems, bytes);
        unsigned char *t = malloc(*bytes);
        moea2a_fp4_sf_convert_padded(padded, t, (moea2a_sf_layout_t)w->layout, counts, ep, stride, w->elems, NULL);
        free(padded);
        return t;
    }
    *bytes = nrows * srow;
    return padded;
}

/* Rows rows of row-major scales (srow bytes each) in the wire's tiled layout, as
 * MOEA2A_MOE_EXPERT_WIRE_SCALES promises: FP8 MN-major, word w of row r at w x R4 + r
 * (R4: rows rounded up to 4, padding 0); NVFP4 through moea2a_fp4_sf_convert (its own
 * tests hold it to the tile layout). */
static unsigned char *tiled_scales(const wire_case_t *w, const unsigned char *rows_sc, size_t rows, size_t srow,
                                   size_t *bytes)
{
    if (w->format == MOEA2A_WIRE_NVFP4) {
        moea2a_fp4_sf_bytes((moea2a_sf_layout_t)w->layout, rows, w->elems, bytes);
        unsigned char *t = calloc(*bytes + 1, 1);
        moea2a_fp4_sf_convert(rows_sc, MOEA2A_SF_LINEAR, t, (moea2a_sf_layout_t)w->layout, rows, w->elems, NULL);
        return t;
    }
    const size_t words = srow / 4, r4 = (rows + 3) / 4 * 4;
    *bytes = 4 * words * r4;
    unsigned char *t = calloc(*bytes + 1, 1);
    for (size_t wd = 0; wd < words; wd++)
        for (size_t r = 0; r < rows; r++) memcpy(t + 4 * (wd * r4 + r), rows_sc + r * srow + 4 * wd, 4);
    return t;
}

/* The expert-major rows of the quantizing context (rq) against those of the context that
 * dispatched the caller's codes, row scales [and global scales] as plain payloads (rp):
 * the same rows, codes, scales and global scales; gap rows' scales 0. tiled: rq's
 * scales come in the wire's tiled layout (MOEA2A_MOE_EXPERT_WIRE_SCALES). */
static int check_expert(const where_t *m, const wire_case_t *w, int me, int ci, const moea2a_dispatch_result_t *rq,
                        const moea2a_dispatch_result_t *rp, int tiled)
{
    int fails = 0, el = rq->num_local_experts;
    int32_t *oq = mem_get(m->cuda, rq->expert_offsets, 4 * (size_t)(el + 1)), *op = mem_get(m->cuda, rp->expert_offsets, 4 * (size_t)(el + 1));
    RANK_EXPECT(fails, me, el == rp->num_local_experts && !memcmp(oq, op, 4 * (size_t)(el + 1)),
                "case %d: expert-major offsets differ", ci);
    size_t R = (size_t)op[el], cr = code_row(w), sr = scale_row(w);
    int nv = w->format == MOEA2A_WIRE_NVFP4;
    int32_t *src = mem_get(m->cuda, rp->expert_src_rank, 4 * R);
    unsigned char *cq = mem_get(m->cuda, rq->expert_payloads[0], R * cr), *cp = mem_get(m->cuda, rp->expert_payloads[0], R * cr);
    unsigned char *sp = mem_get(m->cuda, rp->expert_payloads[2], R * sr), *sq;
    if (tiled) { /* rp's row scales put in the tiled layout must be rq's bytes; then compare rows as before */
        size_t tb = 0;
        unsigned char *want = tiled_scales(w, sp, R, sr, &tb), *got = mem_get(m->cuda, rq->expert_payload_scales[0], tb);
        RANK_EXPECT(fails, me, !memcmp(want, got, tb), "case %d: expert-major scales in the wire's layout differ", ci);
        free(want), free(got);
        sq = malloc(R * sr + 1), memcpy(sq, sp, R * sr);
    } else {
        sq = mem_get(m->cuda, rq->expert_payload_scales[0], R * sr);
    }
    unsigned char *xq = mem_get(m->cuda, rq->expert_payloads[1], R * 12), *xp = mem_get(m->cuda, rp->expert_payloads[1], R * 12);
    float *gq = nv ? mem_get(m->cuda, rq->expert_global_scales[0], 4 * R) : NULL, *gp = nv ? mem_get(m->cuda, rp->expert_payloads[3], 4 * R) : NULL;
    int bad = 0, gap = 0;
    for (size_t r = 0; r < R; r++) {
        if (src[r] < 0) { /* a gap row */
            for (size_t b = 0; b < sr; b++) gap += sq[r * sr + b] != 0;
            if (nv) gap += gq[r] != 0.0f;
            continue;
        }
        bad += memcmp(cq + r * cr, cp + r * cr, cr) != 0 || memcmp(sq + r * sr, sp + r * sr, sr) != 0 ||
               memcmp(xq + r * 12, xp + r * 12, 12) != 0 || (nv && memcmp(&gq[r], &gp[r], 4) != 0);
    }
    RANK_EXPECT(fails, me, rq->expert_payload_scales[0] && (!nv || rq->expert_global_scales[0]) && !rq->expert_payload_scales[1] &&
                               !rp->expert_payload_scales[0],
                "case %d: expert-major scale arrays present where quantized only", ci);
    RANK_EXPECT(fails, me, bad == 0, "case %d: %d expert-major rows differ from quantize-then-dispatch", ci, bad);
    RANK_EXPECT(fails, me, gap == 0, "case %d: %d gap-row scale bytes not 0", ci, gap);
    free(oq), free(op), free(src), free(cq), free(cp), free(sq), free(sp), free(xq), free(xp), free(gq), free(gp);
    return fails;
}

static int run_case(moea2a_comm_t comm, const where_t *m, int me, int ep, int ci, uint64_t seed)
{
    const wire_case_t *w = &cases[ci];
    int fails = 0, E = 4 * ep + (int)(seed % 5), k = 1 + (int)(seed % 4), cap = 9;
    moea2a_moe_config_t cq = config_for(w, E, k, cap, 1), cp = config_for(w, E, k, cap, 0);
    cq.memory = cp.memory = m->cuda ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    /* every other seed: the expert-major layout too, for both contexts */
    const int expert = (seed / 101) % 2 == 0;
    if (expert) {
        cq.layout = cp.layout = MOEA2A_LAYOUT_EXPERT_MAJOR;
        cq.expert_alignment = cp.expert_alignment = 8;
    }
    /* host memory, every other expert-major seed: the scales in the wire's tiled layout
     * (NVFP4's tiles: every expert starts one) */
    const int nv_tiles = w->format == MOEA2A_WIRE_NVFP4 && w->layout != MOEA2A_SF_LINEAR;
    const int tiled = expert && !m->cuda && (seed / 11) % 2 == 0 &&
                      (nv_tiles || (w->format == MOEA2A_WIRE_FP8 && w->layout == MOEA2A_FP8_SCALES_MN_MAJOR));
    if (tiled) {
        cq.flags |= MOEA2A_MOE_EXPERT_WIRE_SCALES;
        if (nv_tiles) cq.expert_alignment = cp.expert_alignment = w->layout == MOEA2A_SF_128X4 ? 128 : 8;
    }
    if (m->cuda && !m->nvlink) cq.flags |= MOEA2A_MOE_NO_NVLINK, cp.flags |= MOEA2A_MOE_NO_NVLINK;
    /* every other seed on CUDA: one block per kernel, so that more than 4 tokens take
     * the load/store dispatch's counter path; and, independently, FP8 from 16-bit rows
     * quantized inside the dispatch's copies (MOEA2A_QUANT_IN_COPY, read at create) or
     * not, then alongside the dispatch on the counter path (MOEA2A_QUANT_OVERLAP=1,
     * set for the CUDA runs) */
    if (m->cuda && (seed / 7) % 2 == 0) cq.num_sms = cp.num_sms = 1;
    if (m->cuda) setenv("MOEA2A_QUANT_IN_COPY", (seed / 3) % 2 == 0 ? "1" : "0", 1);
    moea2a_moe_t mq, mp;
    if (moea2a_moe_create(&mq, comm, &cq) || moea2a_moe_create(&mp, comm, &cp)) {
        RANK_EXPECT(fails, me, 0, "create: %s", moea2a_last_error(comm));
        return 1;
    }
    /* the arrays' sizes: codes, row scales [, per-row and per-source global scales]
     * [, the scales in the wire's layout] [, CUDA: the sender's quantized rows] */
    moea2a_moe_workspace_sizes_t sz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_moe_workspace_size(comm, &cq, &sz);
    size_t slots = (size_t)ep * cap, want = A(slots * code_row(w)) + A(slots * scale_row(w));
    if (w->format == MOEA2A_WIRE_NVFP4) {
        want += A(slots * 4) + A(4 * (size_t)ep);
        if (w->layout != MOEA2A_SF_LINEAR) {
            size_t t;
            moea2a_fp4_sf_bytes((moea2a_sf_layout_t)w->layout, slots, w->elems, &t);
            want += A(t);
        }
    } else if (w->layout == MOEA2A_FP8_SCALES_MN_MAJOR) {
        want += A((size_t)ep * scale_row(w) * ((cap + 3) / 4 * 4));
    }
    if (m->cuda) /* the sender's quantized rows */
        want += A((size_t)cap * code_row(w)) + A((size_t)cap * scale_row(w)) +
                (w->format == MOEA2A_WIRE_NVFP4 ? A((size_t)cap * 4) : 0);
    RANK_EXPECT(fails, me, sz.payload_bytes[0] == want && sz.payload_bytes[1] == A(slots * 12),
                "case %d: payload bytes %zu, the formula says %zu", ci, sz.payload_bytes[0], want);
    if (expert) { /* codes, row scales [, global scales] per expert row: the caller-quantized context's rows */
        moea2a_moe_workspace_sizes_t szp = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
        moea2a_moe_workspace_size(comm, &cp, &szp);
        /* tiled: plus the scales in the wire's layout over max_expert_rows (the worst
         * case: ep x cap x min(k, local experts) + the local experts' alignment gaps) */
        size_t extra = 0;
        if (tiled) {
            const size_t el = (size_t)(E + ep - 1) / (size_t)ep, per = (size_t)k < el ? (size_t)k : el;
            const size_t R = (size_t)ep * cap * per + el * (size_t)(cq.expert_alignment - 1);
            if (w->format == MOEA2A_WIRE_NVFP4) moea2a_fp4_sf_bytes((moea2a_sf_layout_t)w->layout, R, w->elems, &extra);
            else extra = scale_row(w) * ((R + 3) / 4 * 4);
            extra = A(extra);
        }
        RANK_EXPECT(fails, me, sz.expert_bytes == szp.expert_bytes + extra && sz.expert_bytes > 0,
                    "case %d: expert-major bytes %zu, with the caller's quantized rows %zu (+ %zu in the wire's "
                    "layout)", ci, sz.expert_bytes, szp.expert_bytes, extra);
    }

    /* this rank's tokens: idle ranks, invalid ids, a smaller stride sometimes */
    int n = (int)(mix(seed + (uint64_t)me) % (uint64_t)(cap + 1));
    if (me == 1 && seed % 3 == 0) n = 0;
    int stride = seed % 2 ? cap : (n > 6 ? n : 6);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * k + 1)), *side = malloc(12 * (size_t)cap);
    for (int i = 0; i < n * k; i++) ids[i] = (int32_t)(mix(seed * 31 + (uint64_t)me * 1000 + (uint64_t)i) % (uint64_t)(E + 2)) - 1;
    for (int i = 0; i < 3 * cap; i++) side[i] = me * 100000 + i;
    /* every rank must agree on the stride: the largest token count, at least 6 */
    int64_t mine = stride, all[64];
    moea2a_allgather(&mine, all, 8, MOEA2A_UINT8, comm, NULL);
    for (int q = 0; q < ep; q++) stride = all[q] > stride ? (int)all[q] : stride;
    void *x = make_values(w, me, seed, n);
    /* quantized by the caller, with the standalone calls on the host, as one tensor of n rows */
    unsigned char *q = malloc(code_row(w) * (size_t)n + 16), *s = malloc(scale_row(w) * (size_t)n + 16);
    float g = 1.0f, *gs = malloc(4 * (size_t)(n + 1));
    if (w->format == MOEA2A_WIRE_FP8) {
        moea2a_fp8_quantize(x, w->dtype, (size_t)n, w->elems, q, s, MOEA2A_FP8_SCALES_ROW_MAJOR, w->flags, NULL);
    } else {
        moea2a_fp4_global_scale(x, w->dtype, (size_t)n * w->elems, &g, NULL);
        moea2a_fp4_quantize(x, w->dtype, (size_t)n, w->elems, &g, q, s, MOEA2A_SF_LINEAR, NULL);
    }
    for (int i = 0; i < n; i++) gs[i] = g;
    size_t xbytes = (size_t)n * w->elems * dsize(w->dtype);
    void *dx = mem_put(m->cuda, x, xbytes), *dside = mem_put(m->cuda, side, 12 * (size_t)cap), *dq = mem_put(m->cuda, q, code_row(w) * (size_t)n);
    void *ds = mem_put(m->cuda, s, scale_row(w) * (size_t)n), *dgs = mem_put(m->cuda, gs, 4 * (size_t)n);
    int32_t *dids = mem_put(m->cuda, ids, sizeof(int32_t) * (size_t)(n * k));
    const void *pq[2] = {dx, dside}, *pp[4] = {dq, dside, ds, dgs};
    moea2a_dispatch_result_t rq = MOEA2A_DISPATCH_RESULT_INITIALIZER, rp = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    /* a first dispatch of cap tokens fills rows that the second one leaves as padding:
     * their scales must read 0 again */
    int32_t *all_ids = malloc(sizeof(int32_t) * (size_t)(cap * k));
    for (int i = 0; i < cap * k; i++) all_ids[i] = i % E;
    void *xf = make_values(w, me, seed + 99, cap);
    void *dall = mem_put(m->cuda, all_ids, sizeof(int32_t) * (size_t)(cap * k)), *dxf = mem_put(m->cuda, xf, (size_t)cap * w->elems * dsize(w->dtype));
    moea2a_result_t r0 = moea2a_dispatch(mq, cap, dall, NULL, (const void *[2]){dxf, dside}, cap, &rq, NULL);
    RANK_EXPECT(fails, me, r0 == MOEA2A_SUCCESS, "case %d: first dispatch: %s", ci, moea2a_last_error(comm));
    if (r0 == MOEA2A_SUCCESS) { /* the load/store path: the next dispatch follows a combine */
        void *zero = calloc(slots, 128), *dzero = mem_put(m->cuda, zero, slots * 128), *out = calloc((size_t)cap, 128);
        void *dout = mem_put(m->cuda, out, (size_t)cap * 128);
        r0 = moea2a_combine(mq, expert ? NULL : dzero, dout, NULL);
        RANK_EXPECT(fails, me, r0 == MOEA2A_SUCCESS, "case %d: combine: %s", ci, moea2a_last_error(comm));
        mem_drop(m->cuda, dzero), mem_drop(m->cuda, dout), free(zero), free(out);
    }
    free(all_ids), free(xf);
    moea2a_result_t r1;
    if (seed % 4 == 1) { /* the split halves: quantized in the send half, finished in the receive half */
        r1 = moea2a_dispatch_send(mq, n, dids, NULL, pq, stride, NULL);
        if (r1 == MOEA2A_SUCCESS) r1 = moea2a_dispatch_recv(mq, &rq, NULL);
    } else {
        r1 = moea2a_dispatch(mq, n, dids, NULL, pq, stride, &rq, NULL);
    }
    moea2a_result_t r2 = moea2a_dispatch(mp, n, dids, NULL, pp, stride, &rp, NULL);
    RANK_EXPECT(fails, me, r1 == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "case %d: dispatch: %s", ci,
                moea2a_last_error(comm));
    if (r1 == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS) {
        size_t rows = (size_t)ep * (size_t)stride;
        int32_t *cq_ = mem_get(m->cuda, rq.recv_counts, 4 * (size_t)ep), *cp_ = mem_get(m->cuda, rp.recv_counts, 4 * (size_t)ep);
        unsigned char *codes_q = mem_get(m->cuda, rq.payloads[0], rows * code_row(w)), *codes_p = mem_get(m->cuda, rp.payloads[0], rows * code_row(w));
        unsigned char *side_q = mem_get(m->cuda, rq.payloads[1], rows * 12), *side_p = mem_get(m->cuda, rp.payloads[1], rows * 12);
        unsigned char *rows_p = mem_get(m->cuda, rp.payloads[2], rows * scale_row(w));
        RANK_EXPECT(fails, me, !memcmp(cq_, cp_, 4 * (size_t)ep), "case %d: counts differ", ci);
        RANK_EXPECT(fails, me, rq.payload_row_bytes[0] == code_row(w), "case %d: code row %zu", ci, rq.payload_row_bytes[0]);
        int codes = 1, side_ok = 1;
        for (int src = 0; src < ep; src++)
            for (int i = 0; i < cp_[src]; i++) {
                size_t slot = (size_t)src * stride + (size_t)i;
                codes &= !memcmp(codes_q + slot * code_row(w), codes_p + slot * code_row(w), code_row(w));
                side_ok &= !memcmp(side_q + slot * 12, side_p + slot * 12, 12);
            }
        RANK_EXPECT(fails, me, codes, "case %d: codes differ from quantize-then-dispatch", ci);
        RANK_EXPECT(fails, me, side_ok, "case %d: the payload sent as is differs", ci);
        size_t eb = 0;
        unsigned char *es = expected_scales(w, rows_p, cp_, ep, stride, &eb);
        unsigned char *got = mem_get(m->cuda, rq.payload_scales[0], eb);
        RANK_EXPECT(fails, me, rq.payload_scales[0] && rq.payload_scale_bytes[0] == eb && !memcmp(got, es, eb),
                    "case %d: scales (%zu bytes, expected %zu) differ from quantize-then-dispatch in the wire's layout", ci,
                    rq.payload_scale_bytes[0], eb);
        free(es), free(got);
        if (w->format == MOEA2A_WIRE_NVFP4) {
            float *gq = mem_get(m->cuda, rq.payload_global_scales[0], 4 * (size_t)ep), *gp = mem_get(m->cuda, rp.payloads[3], 4 * rows);
            int gok = rq.payload_global_scales[0] != NULL;
            for (int src = 0; gok && src < ep; src++) {
                float want_g = cp_[src] > 0 ? gp[(size_t)src * stride] : 0.0f;
                gok &= !memcmp(&gq[src], &want_g, 4);
            }
            RANK_EXPECT(fails, me, gok, "case %d: global scales per source differ", ci);
            free(gq), free(gp);
        } else {
            RANK_EXPECT(fails, me, rq.payload_global_scales[0] == NULL, "case %d: FP8 has no global scales", ci);
        }
        RANK_EXPECT(fails, me, rq.payload_scales[1] == NULL && rq.payload_scale_bytes[1] == 0,
                    "case %d: a payload sent as is has no scales", ci);
        free(cq_), free(cp_), free(codes_q), free(codes_p), free(side_q), free(side_p), free(rows_p);
        if (expert) fails += check_expert(m, w, me, ci, &rq, &rp, tiled);
    }
    moea2a_moe_destroy(mq), moea2a_moe_destroy(mp);
    mem_drop(m->cuda, dx), mem_drop(m->cuda, dside), mem_drop(m->cuda, dq), mem_drop(m->cuda, ds), mem_drop(m->cuda, dgs), mem_drop(m->cuda, dids), mem_drop(m->cuda, dall), mem_drop(m->cuda, dxf);
    free(ids), free(side), free(x), free(q), free(s), free(gs);
    return fails;
}

static int wire_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const where_t *m = arg;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
#if WITH_CUDA
    if (m->cuda) {
        if (cudaSetDevice(me % m->ndev) != cudaSuccess) return 1;
        cfg.cuda_device = me % m->ndev;
        setenv("MOEA2A_QUANT_OVERLAP", "1", 1); /* FP8 quantized alongside the dispatch where it can */
        if (m->ipc) without_nccl();
    }
#endif
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, &cfg)) return 1;
    int fails = 0;
    for (int ci = 0; ci < NCASES && fails < 5; ci++)
        for (uint64_t seed = 1; seed <= 4; seed++) fails += run_case(comm, m, me, ep, ci, seed * 101 + (uint64_t)ci);
    if (m->cuda) { /* the kernels read 16-byte vectors: a misaligned payload is refused, on every rank */
        moea2a_moe_config_t c = config_for(&cases[0], 4 * ep, 2, 4, 1);
        c.memory = MOEA2A_MEMORY_CUDA;
        if (!m->nvlink) c.flags |= MOEA2A_MOE_NO_NVLINK;
        moea2a_moe_t moe;
        if (moea2a_moe_create(&moe, comm, &c) == MOEA2A_SUCCESS) {
            int32_t hids[8] = {0, 1, 2, 3, 0, 1, 2, 3};
            unsigned char *zeros = calloc(1, 4 * 640 * 2 + 64);
            unsigned char *dx = mem_put(m->cuda, zeros, 4 * 640 * 2 + 64), *dside = mem_put(m->cuda, zeros, 4 * 12);
            int32_t *dids = mem_put(m->cuda, hids, sizeof(hids));
            moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
            moea2a_result_t r = moea2a_dispatch(moe, 4, dids, NULL, (const void *[2]){dx + 2, dside}, 0, &res, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "aligned"),
                        "a misaligned quantized payload: %s (%s)", moea2a_strerror(r), moea2a_last_error(comm));
            moea2a_moe_destroy(moe);
            mem_drop(m->cuda, dx), mem_drop(m->cuda, dside), mem_drop(m->cuda, dids), free(zeros);
        } else {
            RANK_EXPECT(fails, me, 0, "create: %s", moea2a_last_error(comm));
        }
    }
    moea2a_comm_destroy(comm);
    return fails > 100 ? 100 : fails;
}

/* Config checks, no peers needed beyond a communicator of one. */
static int config_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    int fails = 0;
    moea2a_moe_workspace_sizes_t sz = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    struct {
        wire_case_t w;
        const char *what, *says;
    } bad[] = {
        {{MOEA2A_WIRE_FP8, 0, 0, MOEA2A_BFLOAT16, 200}, "FP8 with elems not a multiple of 128", "multiple of 128"},
        {{MOEA2A_WIRE_NVFP4, 0, 0, MOEA2A_BFLOAT16, 40}, "NVFP4 with elems not a multiple of 16", "multiple of 16"},
        {{MOEA2A_WIRE_FP8, 0, 0, MOEA2A_INT32, 128}, "a quantized int32 payload", "bf16, fp16 or fp32"},
        {{MOEA2A_WIRE_FP8, 5, 0, MOEA2A_BFLOAT16, 128}, "an unknown FP8 scale layout", "scale layout"},
        {{MOEA2A_WIRE_FP8, 0, 0x8, MOEA2A_BFLOAT16, 128}, "an unknown FP8 flag", "flags"},
        {{MOEA2A_WIRE_NVFP4, 0, MOEA2A_FP8_UE8M0, MOEA2A_BFLOAT16, 128}, "UE8M0 on NVFP4", "NVFP4 takes none"},
        {{7, 0, 0, MOEA2A_BFLOAT16, 128}, "an unknown wire format", "unknown"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        moea2a_moe_config_t c = config_for(&bad[i].w, 8, 2, 4, 1);
        moea2a_result_t r = moea2a_moe_workspace_size(comm, &c, &sz);
        RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), bad[i].says),
                    "%s: %s (%s)", bad[i].what, moea2a_strerror(r), moea2a_last_error(comm));
    }
    moea2a_moe_config_t c = config_for(&cases[0], 8, 2, 4, 1);
    c.wire[3].format = MOEA2A_WIRE_FP8; /* payload 3 does not exist */
    moea2a_result_t r = moea2a_moe_workspace_size(comm, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "no such payload"),
                "wire set on a payload that does not exist: %s", moea2a_last_error(comm));
    c = config_for(&cases[0], 8, 2, 4, 1);
    c.wire[1].flags = MOEA2A_FP8_UE8M0; /* payload 1 goes as is */
    r = moea2a_moe_workspace_size(comm, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT, "flags on a payload sent as is: %s", moea2a_last_error(comm));
    /* CUDA memory, sized on a machine layout with GPUs: the sender's quantized rows
     * (A(cap code) + A(cap srow) [+ A(cap 4) NVFP4]) on top of what host memory needs */
    c = config_for(&cases[4], 8, 2, 4, 1);
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    const char *top = getenv("top_srcdir");
    char xml[1024];
    snprintf(xml, sizeof(xml), "%s/tests/topologies/4gpu-nvlink.xml", top ? top : ".");
    lay.ep = 4, lay.topology_xml = xml;
    moea2a_moe_workspace_sizes_t host = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    c.memory = MOEA2A_MEMORY_HOST;
    moea2a_result_t rh = moea2a_moe_workspace_size_layout(&lay, &c, &host);
    c.memory = MOEA2A_MEMORY_CUDA;
    r = moea2a_moe_workspace_size_layout(&lay, &c, &sz);
    RANK_EXPECT(fails, me, rh == MOEA2A_SUCCESS && r == MOEA2A_SUCCESS &&
                               sz.payload_bytes[0] == host.payload_bytes[0] + A(4 * code_row(&cases[4])) +
                                                          A(4 * scale_row(&cases[4])) + A(4 * 4),
                "quantize on dispatch on CUDA memory, sized: %s (%s); payload bytes %zu, host %zu", moea2a_strerror(r),
                moea2a_last_error(NULL), sz.payload_bytes[0], host.payload_bytes[0]);
    c = config_for(&cases[0], 8, 2, 4, 1);
    c.memory = MOEA2A_MEMORY_HOST;
    rh = moea2a_moe_workspace_size_layout(&lay, &c, &host);
    c.memory = MOEA2A_MEMORY_CUDA;
    r = moea2a_moe_workspace_size_layout(&lay, &c, &sz);
    RANK_EXPECT(fails, me, rh == MOEA2A_SUCCESS && r == MOEA2A_SUCCESS &&
                               sz.payload_bytes[0] == host.payload_bytes[0] + A(4 * code_row(&cases[0])) +
                                                          A(4 * scale_row(&cases[0])),
                "FP8 on CUDA memory, sized: payload bytes %zu, host %zu", sz.payload_bytes[0], host.payload_bytes[0]);
    /* MOEA2A_MOE_EXPERT_WIRE_SCALES: expert-major only; NVFP4's tiles need every expert
     * to start one; host memory in this release */
    c = config_for(&cases[1], 8, 2, 4, 1);
    c.flags |= MOEA2A_MOE_EXPERT_WIRE_SCALES, c.memory = MOEA2A_MEMORY_HOST;
    r = moea2a_moe_workspace_size(comm, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "EXPERT_MAJOR"),
                "MOEA2A_MOE_EXPERT_WIRE_SCALES on the rank-major layout: %s", moea2a_last_error(comm));
    c = config_for(&cases[5], 8, 2, 4, 1);
    c.flags |= MOEA2A_MOE_EXPERT_WIRE_SCALES, c.memory = MOEA2A_MEMORY_HOST;
    c.layout = MOEA2A_LAYOUT_EXPERT_MAJOR, c.expert_alignment = 64;
    r = moea2a_moe_workspace_size(comm, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "multiple of 128"),
                "NVFP4 128x4 expert scales at alignment 64: %s", moea2a_last_error(comm));
    c.expert_alignment = 256;
    r = moea2a_moe_workspace_size(comm, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "NVFP4 128x4 expert scales at alignment 256: %s", moea2a_last_error(comm));
    c.memory = MOEA2A_MEMORY_CUDA;
    r = moea2a_moe_workspace_size_layout(&lay, &c, &sz);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(NULL), "host memory"),
                "MOEA2A_MOE_EXPERT_WIRE_SCALES on CUDA memory: %s (%s)", moea2a_strerror(r), moea2a_last_error(NULL));
    moea2a_comm_destroy(comm);
    return fails;
}

/* Ranks that disagree on a payload's wire format: MOEA2A_ERR_MISMATCH on every rank,
 * naming the payload, before anything is allocated. */
static int mismatch_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    int fails = 0;
    wire_case_t w = cases[0];
    if (me == 1) w.flags = MOEA2A_FP8_UE8M0;
    moea2a_moe_config_t c = config_for(&w, 8, 2, 4, 1);
    moea2a_moe_t moe;
    moea2a_result_t r = moea2a_moe_create(&moe, comm, &c);
    RANK_EXPECT(fails, me, r == MOEA2A_ERR_MISMATCH && strstr(moea2a_last_error(comm), "payload 0"),
                "different wire flags on rank 1: %s (%s)", moea2a_strerror(r), moea2a_last_error(comm));
    if (r == MOEA2A_SUCCESS) moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* On CUDA memory: 1, 2 and 4 ranks, one GPU each, both CUDA paths. */
static void cuda_runs(void)
{
#if WITH_CUDA
    int ndev = gpu_count();
    for (int n = 1; n <= 4; n *= 2)
        for (int nvlink = 1; nvlink >= 0; nvlink--) {
            const char *path = nvlink ? "load/store" : "generic NCCL";
            /* the load/store path with fewer GPUs than ranks: ranks share them */
            int share = n > ndev && ndev > 0 && nvlink && have_ucx();
            if (n > ndev && !share) {
                tap_skip(ndev ? "not enough GPUs" : "no CUDA device", "quantize on dispatch on %d GPU(s), %s path", n, path);
                continue;
            }
            where_t m = {1, nvlink, ndev, share};
            local_ranks_result_t res;
            local_ranks_run(n, wire_rank, &m, WATCHDOG, &res);
            char where[64];
            snprintf(where, sizeof(where), share ? "%d ranks sharing %d GPU(s) over CUDA IPC" : "%d GPU(s)", n, ndev);
            tap_ok(res.failed == 0, "quantize on dispatch on %s, %s path, equals quantize-then-dispatch (host "
                                    "quantization) bit for bit: FP8 and NVFP4, every scale layout%s; a misaligned payload refused",
                   where, path, nvlink ? ", FP8 quantized first, alongside and inside the copies" : "");
        }
#else
    tap_skip("no CUDA device (built without CUDA or NCCL)", "quantize on dispatch on CUDA memory");
#endif
}

int main(void)
{
    static const int sizes[] = {1, 2, 3, 4};
    where_t host = {0, 0, 0};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        local_ranks_result_t res;
        local_ranks_run(sizes[i], wire_rank, &host, WATCHDOG, &res);
        tap_ok(res.failed == 0, "quantize on dispatch equals quantize-then-dispatch bit for bit on %d rank(s): FP8 (fp32 "
                                "and UE8M0 scales, row- and MN-major), NVFP4 (linear, 128x4, 8x4 scales, global scales); "
                                "expert-major rows, their scales row-major or in the wire's layout",
               sizes[i]);
    }
    { /* across nodes: the rail peers relay the codes, scales and global scales as they came */
        local_ranks_result_t res;
        setenv("MOEA2A_NODE_SIZE", "2", 1); /* the ranks inherit it */
        local_ranks_run(5, wire_rank, &host, WATCHDOG, &res);
        unsetenv("MOEA2A_NODE_SIZE");
        tap_ok(res.failed == 0, "the same on 5 ranks in emulated nodes of 2 (MOEA2A_NODE_SIZE), hierarchical path");
    }
    local_ranks_result_t res;
    local_ranks_run(2, mismatch_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "ranks that disagree on a payload's wire format: MOEA2A_ERR_MISMATCH on every rank");
    local_ranks_run(1, config_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "config checks: block multiples, float dtypes, layouts, flags, unused wire entries, expert "
                            "scales in the wire's layout; CUDA "
                            "memory's sizes");
    cuda_runs();
    return tap_done();
}

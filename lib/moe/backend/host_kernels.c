#include <stdlib.h>
#include <string.h>

#include "base/convert.h"
#include "quant/fp4_math.h"
#include "quant/fp8_math.h"
#include "moe/backend/host_kernels.h"
#include "quant/quant_host.h"

void m2a_host_route(const m2a_route_t *r, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                    int64_t *invalid_entries, int64_t *deduplicated, int64_t *dropped_entries)
{
    int k = r->k;
    memset(send_counts, 0, sizeof(int32_t) * (size_t)r->ep);
    for (int t = 0; t < n; t++) {
        int32_t *map = send_map + (size_t)t * k;
        int nd = 0;
        for (int j = 0; j < k; j++) {
            int32_t e = ids[(size_t)t * k + j];
            if (m2a_expert_invalid(r, e)) {
                (*invalid_entries)++;
                continue;
            }
            int dest = m2a_expert_rank(r, e, r->me, t), seen = 0;
            if (dest < 0) { /* held by no rank (moea2a_moe_set_placement) */
                (*dropped_entries)++;
                continue;
            }
            for (int d = 0; d < nd; d++) seen |= map[d] == dest;
            if (seen) {
                (*deduplicated)++;
                continue;
            }
            /* insertion keeps the token's ranks ascending: the combine order */
            int d = nd++;
            while (d > 0 && map[d - 1] > dest) map[d] = map[d - 1], d--;
            map[d] = dest;
        }
        for (int d = 0; d < nd; d++) map[d] = map[d] * r->cap + send_counts[map[d]]++;
        for (int d = nd; d < k; d++) map[d] = -1;
    }
}

void m2a_host_quantize_token(const moea2a_moe_config_t *c, int t, const void *const *payloads, m2a_wire_token_t *w)
{
    for (int i = 0; i < c->num_payloads; i++) {
        const moea2a_wire_t *wi = &c->wire[i];
        if (wi->format == MOEA2A_WIRE_AS_IS) continue;
        size_t es, e = c->payloads[i].elems_per_token;
        moea2a_datatype_size(c->payloads[i].dtype, &es);
        const unsigned char *row = (const unsigned char *)payloads[i] + (size_t)t * e * es;
        if (wi->format == MOEA2A_WIRE_FP8)
            m2a_fp8_quantize_host(row, c->payloads[i].dtype, 1, e, w->codes[i], w->scales[i],
                                  MOEA2A_FP8_SCALES_ROW_MAJOR, (wi->flags & MOEA2A_FP8_UE8M0) != 0);
        else
            m2a_fp4_quantize_host(row, c->payloads[i].dtype, 1, e, w->global[i], w->codes[i], w->scales[i],
                                  MOEA2A_SF_LINEAR);
    }
}

void m2a_host_put_token(const m2a_route_t *r, const m2a_moe_layout_t *l, int t, const void *const *payloads,
                        const int32_t *ids, const float *weights, const m2a_wire_token_t *w,
                        unsigned char *const *base, size_t slot)
{
    int32_t index = t;
    for (int a = 0; a < l->narrays; a++) {
        const m2a_moe_array_t *ar = &l->array[a];
        size_t width = ar->width;
        const void *src;
        switch (ar->kind) {
        case M2A_ARR_PAYLOAD:
            src = w && w->codes[ar->payload] ? (const void *)w->codes[ar->payload]
                                             : (const unsigned char *)payloads[ar->payload] + (size_t)t * width;
            break;
        case M2A_ARR_SCALES: src = w->scales[ar->payload]; break;
        case M2A_ARR_GLOBAL: src = &w->global[ar->payload]; break;
        case M2A_ARR_IDS: src = ids + (size_t)t * r->k; break;
        case M2A_ARR_WEIGHTS: src = weights + (size_t)t * r->k; break;
        default: src = &index; break;
        }
        memcpy(base[a] + slot * width, src, width);
    }
}

/* FP8 MN-major scales: word w of row r (rows of `words` 32-bit words, fp32 scales or
 * UE8M0 bytes alike) at w x pad + r in dst, 0 for the rows from nrows to pad. */
static void mn_major_words(const unsigned char *rows, size_t nrows, size_t words, size_t pad, unsigned char *dst)
{
    for (size_t w = 0; w < words; w++)
        for (size_t r = 0; r < pad; r++) {
            uint32_t v = 0;
            if (r < nrows) memcpy(&v, rows + (r * words + w) * 4, 4);
            memcpy(dst + (w * pad + r) * 4, &v, 4);
        }
}

void m2a_host_wire_finish(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int ep, int stride,
                          unsigned char *ws)
{
    const int32_t *counts = (const int32_t *)(ws + l->recv_counts);
    for (int i = 0; i < c->num_payloads; i++) {
        const moea2a_wire_t *w = &c->wire[i];
        if (w->format == MOEA2A_WIRE_AS_IS) continue;
        size_t srow = l->wire_scale_row[i];
        unsigned char *rows = ws + l->wire_scales[i], *final = ws + l->wire_final[i];
        for (int src = 0; src < ep; src++) /* padding rows: scale 0 */
            for (int r = counts[src]; r < stride; r++) memset(rows + ((size_t)src * stride + (size_t)r) * srow, 0, srow);
        if (w->format == MOEA2A_WIRE_FP8 && w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR) {
            size_t words = srow / 4, pad = ((size_t)stride + 3) / 4 * 4;
            for (int src = 0; src < ep; src++)
                mn_major_words(rows + (size_t)src * (size_t)stride * srow, (size_t)stride, words, pad,
                               final + (size_t)src * words * pad * 4);
        }
        if (w->format != MOEA2A_WIRE_NVFP4) continue;
        const float *g_rows = (const float *)(ws + l->wire_global_rows[i]);
        float *g = (float *)(ws + l->wire_global[i]);
        for (int src = 0; src < ep; src++) g[src] = counts[src] > 0 ? g_rows[(size_t)src * stride] : 0.0f;
        if (w->scale_layout != MOEA2A_SF_LINEAR)
            m2a_fp4_convert_host(rows, MOEA2A_SF_LINEAR, final, w->scale_layout, (size_t)ep * (size_t)stride, srow,
                                 counts, stride);
    }
}

void m2a_host_sanitize(const m2a_route_t *r, const m2a_moe_layout_t *l, int stride, int sanitize,
                       int rewrite_nonlocal, unsigned char *ws)
{
    const int32_t *counts = (const int32_t *)(ws + l->recv_counts);
    int32_t *ids = (int32_t *)(ws + l->ids), *src_index = (int32_t *)(ws + l->src_index);
    for (int src = 0; src < r->ep; src++)
        for (int i = 0; i < stride; i++) {
            size_t slot = (size_t)src * (size_t)stride + (size_t)i;
            int32_t *row = ids + slot * (size_t)r->k;
            if (i >= counts[src]) src_index[slot] = -1;
            if (!sanitize) continue;
            for (int j = 0; j < r->k; j++) {
                int32_t e = row[j];
                if (i >= counts[src] || m2a_expert_invalid(r, e) ||
                    (rewrite_nonlocal && m2a_expert_rank(r, e, src, src_index[slot]) != r->me))
                    row[j] = r->invalid_id;
            }
        }
}

/* acc[h] += row[h] converted to fp32, for a whole row. */
static void accumulate(moea2a_datatype_t dt, const unsigned char *row, size_t hidden, float *acc)
{
    if (dt == MOEA2A_FLOAT32) {
        for (size_t h = 0; h < hidden; h++) {
            float f;
            memcpy(&f, row + 4 * h, 4);
            acc[h] += f;
        }
        return;
    }
    const int bf16 = dt == MOEA2A_BFLOAT16;
    for (size_t h = 0; h < hidden; h++) {
        uint16_t v;
        memcpy(&v, row + 2 * h, 2);
        acc[h] += bf16 ? m2a_bf16_to_f32(v) : m2a_f16_to_f32(v);
    }
}

void m2a_host_crow(const moea2a_moe_config_t *c, m2a_crow_t *f)
{
    f->dtype = c->combine_dtype, f->hidden = c->hidden, f->bytes = m2a_combine_wire_bytes(c);
    f->fp8 = c->combine_wire.format == MOEA2A_WIRE_FP8, f->ue8m0 = (c->combine_wire.flags & MOEA2A_FP8_UE8M0) != 0;
}

/* acc[h] += a wire row's values: the dtype's, or FP8 codes times their block's scale. */
static void accumulate_wire(const m2a_crow_t *f, const unsigned char *row, float *acc)
{
    if (!f->fp8) {
        accumulate(f->dtype, row, f->hidden, acc);
        return;
    }
    const size_t nkb = f->hidden / M2A_FP8_BLOCK;
    for (size_t kb = 0; kb < nkb; kb++) {
        const unsigned char *sb = row + f->hidden + m2a_fp8_scale_offset(0, f->ue8m0, 0, kb, nkb, 1);
        uint32_t bits = *sb;
        if (!f->ue8m0) memcpy(&bits, sb, 4);
        const float scale = m2a_fp8_scale_value(bits, f->ue8m0);
        for (size_t i = kb * M2A_FP8_BLOCK; i < (kb + 1) * M2A_FP8_BLOCK; i++) acc[i] += m2a_fp8_value(row[i], scale);
    }
}

void m2a_host_crow_pack(const m2a_crow_t *f, const unsigned char *rows, size_t n, unsigned char *wire)
{
    const size_t es = f->dtype == MOEA2A_FLOAT32 ? 4 : 2;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = rows + i * f->hidden * es;
        unsigned char *dst = wire + i * f->bytes;
        if (f->fp8) m2a_fp8_quantize_host(src, f->dtype, 1, f->hidden, dst, dst + f->hidden, 0, f->ue8m0);
        else memcpy(dst, src, f->bytes);
    }
}

/* A combine output row: acc rounded to dt, every NaN the canonical one (convert.h). */
static void store_row(moea2a_datatype_t dt, const float *acc, size_t hidden, unsigned char *out)
{
    for (size_t h = 0; h < hidden; h++) {
        const float a = m2a_canonical(acc[h]);
        uint16_t v;
        if (dt == MOEA2A_FLOAT32) {
            memcpy(out + 4 * h, &a, 4);
            continue;
        }
        v = dt == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(a) : m2a_f32_to_f16(a);
        memcpy(out + 2 * h, &v, 2);
    }
}

/* A wire row from fp32 values: rounded to the dtype, or quantized to FP8 by the block
 * rule of moea2a_fp8(3) (row-major scales after the codes). */
static void store_wire(const m2a_crow_t *f, const float *acc, unsigned char *out)
{
    if (f->fp8) m2a_fp8_quantize_host(acc, MOEA2A_FLOAT32, 1, f->hidden, out, out + f->hidden, 0, f->ue8m0);
    else store_row(f->dtype, acc, f->hidden, out);
}

/* total[h] += the partial as it travels between nodes (rounded to the dtype, or
 * quantized to FP8 into wire, a row of scratch, and read back), as fp32. */
static void add_rounded(const m2a_crow_t *f, const float *partial, unsigned char *wire, float *total)
{
    if (f->fp8) {
        store_wire(f, partial, wire);
        accumulate_wire(f, wire, total);
        return;
    }
    for (size_t h = 0; h < f->hidden; h++) {
        float p = partial[h];
        if (f->dtype == MOEA2A_BFLOAT16) p = m2a_bf16_to_f32(m2a_f32_to_bf16(p));
        else if (f->dtype == MOEA2A_FLOAT16) p = m2a_f16_to_f32(m2a_f32_to_f16(p));
        total[h] += p;
    }
}

/* acc[h] += the rows of the token's destinations (map[0..nd)) on node `only` (all of
 * them when only < 0), in the map's ascending rank order. */
static void add_token_rows(const m2a_route_t *r, const int32_t *map, int nd, const int *node, int only,
                           const m2a_crow_t *f, const unsigned char *self_rows, const unsigned char *landing,
                           const int *stage_index, float *acc)
{
    for (int d = 0; d < nd; d++) {
        int rank = map[d] / r->cap, slot = map[d] % r->cap;
        if (only >= 0 && node[rank] != only) continue;
        const unsigned char *row = rank == r->me
                                       ? self_rows + (size_t)slot * f->bytes
                                       : landing + ((size_t)stage_index[rank] * (size_t)r->cap + (size_t)slot) * f->bytes;
        accumulate_wire(f, row, acc);
    }
}

void m2a_host_sum_rows(const m2a_crow_t *f, const unsigned char *const *rows, int nrows, float *acc, void *out,
                       int wire)
{
    memset(acc, 0, sizeof(float) * f->hidden);
    for (int i = 0; i < nrows; i++) accumulate_wire(f, rows[i], acc);
    if (wire) store_wire(f, acc, out);
    else store_row(f->dtype, acc, f->hidden, out);
}

int m2a_host_combine_reduce(const m2a_route_t *r, int n, const int32_t *send_map, const m2a_crow_t *f,
                            const unsigned char *self_rows, const unsigned char *landing, const int *stage_index,
                            const int *node, int nodes, void *out)
{
    const size_t hidden = f->hidden, row_bytes = (f->dtype == MOEA2A_FLOAT32 ? 4 : 2) * hidden, h1 = hidden ? hidden : 1;
    float *acc = malloc(sizeof(float) * h1 * 2 + f->bytes + 1), *total = acc + h1;
    unsigned char *wire = (unsigned char *)(total + h1); /* a partial as it travels */
    if (!acc) return -1;
    for (int t = 0; t < n; t++) {
        const int32_t *map = send_map + (size_t)t * r->k;
        int nd = 0;
        while (nd < r->k && map[nd] >= 0) nd++;
        memset(total, 0, sizeof(float) * hidden);
        if (nodes <= 1) { /* one node: the ranks in ascending order, rounded once */
            add_token_rows(r, map, nd, node, -1, f, self_rows, landing, stage_index, total);
        } else { /* per node holding rows of t, in ascending node order: the node-grouped order of moea2a_moe(3) */
            for (int cur = -1;;) {
                int next = -1; /* the smallest node above cur among the token's ranks */
                for (int d = 0; d < nd; d++) {
                    int q = node[map[d] / r->cap];
                    if (q > cur && (next < 0 || q < next)) next = q;
                }
                if (next < 0) break;
                memset(acc, 0, sizeof(float) * hidden);
                add_token_rows(r, map, nd, node, next, f, self_rows, landing, stage_index, acc);
                add_rounded(f, acc, wire, total);
                cur = next;
            }
        }
        store_row(f->dtype, total, hidden, (unsigned char *)out + (size_t)t * row_bytes);
    }
    free(acc);
    return 0;
}

/* ---- the expert-major layout ------------------------------------------------------ */

/* The local expert a valid slot's top-k entry s names, or -1 (invalid, another rank's,
 * or an expert the token named in an earlier slot, whose row it shares). The slot
 * holds token t of rank src (which replica takes it). */
static int local_entry(const m2a_route_t *r, const int32_t *ids, const int32_t *local_of, int s, int src, int t)
{
    int32_t e = ids[s];
    if (m2a_expert_invalid(r, e) || m2a_expert_rank(r, e, src, t) != r->me) return -1;
    for (int p = 0; p < s; p++)
        if (ids[p] == e) return -1;
    return local_of[e];
}

int64_t m2a_host_expert_expand(const m2a_route_t *r, const moea2a_moe_config_t *c, const m2a_moe_layout_t *l,
                               int stride, unsigned char *ws, int *num_local)
{
    const int32_t *counts = (const int32_t *)(ws + l->recv_counts), *ids = (const int32_t *)(ws + l->ids);
    const int32_t *src_index = (const int32_t *)(ws + l->src_index);
    const float *w = l->weights ? (const float *)(ws + l->weights) : NULL;
    int32_t *ecount = (int32_t *)(ws + l->ex_counts), *eoff = (int32_t *)(ws + l->ex_offsets);
    int32_t *map = (int32_t *)(ws + l->ex_map), *xid = (int32_t *)(ws + l->ex_ids);
    int32_t *xrank = (int32_t *)(ws + l->ex_src_rank), *xtok = (int32_t *)(ws + l->ex_src_token);
    int32_t *xslot = (int32_t *)(ws + l->ex_slot);
    float *xw = l->ex_weights ? (float *)(ws + l->ex_weights) : NULL;
    int32_t *local_of = (int32_t *)(ws + l->ex_local_of), el = 0, k = r->k;
    for (int e = 0; e < r->num_experts; e++) local_of[e] = m2a_expert_held(r, e, r->me) ? el++ : -1;
    *num_local = el;
    /* counts, then aligned offsets */
    memset(ecount, 0, sizeof(int32_t) * (size_t)el);
    for (int src = 0; src < r->ep; src++)
        for (int i = 0; i < counts[src]; i++) {
            const size_t slot = (size_t)src * (size_t)stride + (size_t)i;
            const int32_t *t = ids + slot * (size_t)k;
            for (int s = 0; s < k; s++) {
                int j = local_entry(r, t, local_of, s, src, src_index[slot]);
                if (j >= 0) ecount[j]++;
            }
        }
    const int64_t align = c->expert_alignment;
    int64_t total = 0;
    for (int j = 0; j < el; j++) total += (ecount[j] + align - 1) / align * align;
    if (total > (int64_t)l->ex_rows) return -1;
    eoff[0] = 0;
    for (int j = 0; j < el; j++) eoff[j + 1] = eoff[j] + (int32_t)((ecount[j] + align - 1) / align * align);
    /* the rows, in ascending (source rank, source token) order within each expert */
    int32_t *cursor = (int32_t *)(ws + l->ex_cursors);
    memcpy(cursor, eoff, sizeof(int32_t) * (size_t)el);
    for (int src = 0; src < r->ep; src++)
        for (int i = 0; i < counts[src]; i++) {
            size_t slot = (size_t)src * (size_t)stride + (size_t)i;
            const int32_t *t = ids + slot * (size_t)k;
            int32_t *m = map + slot * (size_t)k;
            for (int s = 0; s < k; s++) {
                int j = local_entry(r, t, local_of, s, src, src_index[slot]);
                m[s] = -1;
                if (j < 0) { /* a repeat of an earlier slot's local expert shares that row */
                    for (int p = 0; p < s; p++)
                        if (t[p] == t[s] && m[p] >= 0) m[s] = m[p];
                    continue;
                }
                int32_t row = cursor[j]++;
                m[s] = row, xid[row] = t[s], xrank[row] = src, xtok[row] = src_index[slot], xslot[row] = s;
                if (xw) xw[row] = w[slot * (size_t)k + (size_t)s];
                for (int a = 0; a < l->ex_narrays; a++) {
                    const m2a_moe_ex_array_t *x = &l->ex_array[a];
                    memcpy(ws + x->dst + (size_t)row * x->width, ws + x->src + slot * x->width, x->width);
                }
            }
        }
    /* alignment gaps: invalid id, no source; scales 0, payloads 0 if asked */
    for (int j = 0; j < el; j++)
        for (int32_t row = eoff[j] + ecount[j]; row < eoff[j + 1]; row++) {
            xid[row] = r->invalid_id, xrank[row] = -1, xtok[row] = -1, xslot[row] = -1;
            if (xw) xw[row] = 0.0f;
            for (int a = 0; a < l->ex_narrays; a++) {
                const m2a_moe_ex_array_t *x = &l->ex_array[a];
                if (x->always_zero || (c->flags & MOEA2A_MOE_ZERO_PADDING))
                    memset(ws + x->dst + (size_t)row * x->width, 0, x->width);
            }
        }
    return total;
}

/* Products rounded to fp32 before each add (the library builds with -ffp-contract=off:
 * configure.ac), as the devices and moea2a_moe(3) round them. */
static void add_weighted(moea2a_datatype_t dt, const unsigned char *row, size_t hidden, float w, float *acc)
{
    /* a loop per dtype, so that the compiler can vectorize each */
    if (dt == MOEA2A_FLOAT32) {
        for (size_t h = 0; h < hidden; h++) {
            float x;
            memcpy(&x, row + 4 * h, 4);
            float p = w * x;
            acc[h] += p;
        }
    } else if (dt == MOEA2A_BFLOAT16) {
        for (size_t h = 0; h < hidden; h++) {
            uint16_t v;
            memcpy(&v, row + 2 * h, 2);
            float p = w * m2a_bf16_to_f32(v);
            acc[h] += p;
        }
    } else {
        for (size_t h = 0; h < hidden; h++) {
            uint16_t v;
            memcpy(&v, row + 2 * h, 2);
            float p = w * m2a_f16_to_f32(v);
            acc[h] += p;
        }
    }
}

int m2a_host_expert_fold(const m2a_route_t *r, const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int stride,
                         const unsigned char *rows, unsigned char *ws)
{
    const int32_t *counts = (const int32_t *)(ws + l->recv_counts), *map = (const int32_t *)(ws + l->ex_map);
    const float *w = (c->flags & MOEA2A_MOE_WEIGHTED_COMBINE) ? (const float *)(ws + l->weights) : NULL;
    size_t hidden = c->hidden, k = (size_t)r->k;
    float *acc = malloc(sizeof(float) * (hidden ? hidden : 1));
    if (!acc) return -1;
    for (int src = 0; src < r->ep; src++)
        for (int i = 0; i < counts[src]; i++) {
            size_t slot = (size_t)src * (size_t)stride + (size_t)i;
            memset(acc, 0, sizeof(float) * hidden);
            for (size_t s = 0; s < k; s++) { /* ascending top-k slot */
                int32_t row = map[slot * k + s];
                if (row >= 0)
                    add_weighted(c->combine_dtype, rows + (size_t)row * l->combine_row, hidden,
                                 w ? w[slot * k + s] : 1.0f, acc);
            }
            store_row(c->combine_dtype, acc, hidden, ws + l->combine + slot * l->combine_row);
        }
    free(acc);
    return 0;
}

void m2a_host_expert_wire_scales(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, unsigned char *ws,
                                 int64_t rows)
{
    for (int i = 0; i < c->num_payloads; i++) {
        if (!l->ex_scales_wire[i]) continue;
        const unsigned char *src = ws + l->ex_scales[i];
        unsigned char *dst = ws + l->ex_scales_wire[i];
        if (c->wire[i].format == MOEA2A_WIRE_NVFP4)
            m2a_fp4_convert_host(src, MOEA2A_SF_LINEAR, dst, c->wire[i].scale_layout, (size_t)rows,
                                 c->payloads[i].elems_per_token / 16, NULL, 0);
        else /* FP8 MN-major over R4 rows */
            mn_major_words(src, (size_t)rows, l->wire_scale_row[i] / 4, ((size_t)rows + 3) / 4 * 4, dst);
    }
}

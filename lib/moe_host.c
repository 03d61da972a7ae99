#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "moe_host.h"

void m2a_host_route(const m2a_route_t *r, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                    int64_t *invalid_entries, int64_t *deduplicated)
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
            int dest = r->owner[e], seen = 0;
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

void m2a_host_pack_record(const m2a_route_t *r, const m2a_moe_layout_t *l, int t, const void *const *payloads,
                          const int32_t *ids, const float *weights, unsigned char *rec)
{
    for (int i = 0; i < r->num_payloads; i++) {
        memcpy(rec, (const unsigned char *)payloads[i] + (size_t)t * l->row_bytes[i], l->row_bytes[i]);
        rec += l->row_bytes[i];
    }
    memcpy(rec, ids + (size_t)t * r->k, 4 * (size_t)r->k);
    rec += 4 * (size_t)r->k;
    if (r->weights) {
        memcpy(rec, weights + (size_t)t * r->k, 4 * (size_t)r->k);
        rec += 4 * (size_t)r->k;
    }
    int32_t idx = t;
    memcpy(rec, &idx, 4);
}

void m2a_host_unpack_record(const m2a_route_t *r, const m2a_moe_layout_t *l, int stride, int src, int i,
                            const unsigned char *rec, unsigned char *ws)
{
    size_t slot = (size_t)src * (size_t)stride + (size_t)i;
    for (int p = 0; p < r->num_payloads; p++) {
        memcpy(ws + l->payload[p] + slot * l->row_bytes[p], rec, l->row_bytes[p]);
        rec += l->row_bytes[p];
    }
    memcpy(ws + l->ids + slot * 4 * (size_t)r->k, rec, 4 * (size_t)r->k);
    rec += 4 * (size_t)r->k;
    if (r->weights) {
        memcpy(ws + l->weights + slot * 4 * (size_t)r->k, rec, 4 * (size_t)r->k);
        rec += 4 * (size_t)r->k;
    }
    memcpy(ws + l->src_index + slot * 4, rec, 4);
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
                if (i >= counts[src] || m2a_expert_invalid(r, e) || (rewrite_nonlocal && r->owner[e] != r->me))
                    row[j] = r->invalid_id;
            }
        }
}

static float load_f32(moea2a_datatype_t dt, const unsigned char *row, size_t h)
{
    uint16_t v;
    switch (dt) {
    case MOEA2A_BFLOAT16: memcpy(&v, row + 2 * h, 2); return m2a_bf16_to_f32(v);
    case MOEA2A_FLOAT16: memcpy(&v, row + 2 * h, 2); return m2a_f16_to_f32(v);
    default: { float f; memcpy(&f, row + 4 * h, 4); return f; }
    }
}

static void store_f32(moea2a_datatype_t dt, unsigned char *row, size_t h, float f)
{
    uint16_t v;
    switch (dt) {
    case MOEA2A_BFLOAT16: v = m2a_f32_to_bf16(f); memcpy(row + 2 * h, &v, 2); break;
    case MOEA2A_FLOAT16: v = m2a_f32_to_f16(f); memcpy(row + 2 * h, &v, 2); break;
    default: memcpy(row + 4 * h, &f, 4); break;
    }
}

int m2a_host_combine_reduce(const m2a_route_t *r, int n, const int32_t *send_map, moea2a_datatype_t dtype,
                            size_t hidden, const unsigned char *self_rows, const unsigned char *landing,
                            const int *stage_index, void *out)
{
    size_t es = dtype == MOEA2A_FLOAT32 ? 4 : 2, row_bytes = es * hidden;
    const unsigned char **rows = malloc(sizeof(*rows) * (size_t)r->k);
    if (!rows) return -1;
    for (int t = 0; t < n; t++) {
        const int32_t *map = send_map + (size_t)t * r->k;
        int nd = 0;
        for (int d = 0; d < r->k && map[d] >= 0; d++) {
            int rank = map[d] / r->cap, slot = map[d] % r->cap;
            rows[nd++] = rank == r->me ? self_rows + (size_t)slot * row_bytes
                                       : landing + ((size_t)stage_index[rank] * (size_t)r->cap + (size_t)slot) * row_bytes;
        }
        unsigned char *o = (unsigned char *)out + (size_t)t * row_bytes;
        for (size_t h = 0; h < hidden; h++) {
            float acc = 0.0f; /* fixed order: ascending rank, as the map holds them */
            for (int d = 0; d < nd; d++) acc += load_f32(dtype, rows[d], h);
            store_f32(dtype, o, h, acc);
        }
    }
    free(rows);
    return 0;
}

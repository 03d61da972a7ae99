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

void m2a_host_put_token(const m2a_route_t *r, const m2a_moe_layout_t *l, int t, const void *const *payloads,
                        const int32_t *ids, const float *weights, unsigned char *const *base, size_t slot)
{
    int32_t index = t;
    for (int a = 0; a < l->narrays; a++) {
        size_t w = l->array[a].width;
        const void *src = a < r->num_payloads ? (const unsigned char *)payloads[a] + (size_t)t * w
                        : a == r->num_payloads ? (const void *)(ids + (size_t)t * r->k)
                        : a == l->narrays - 1  ? (const void *)&index
                                               : (const void *)(weights + (size_t)t * r->k);
        memcpy(base[a] + slot * w, src, w);
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
                if (i >= counts[src] || m2a_expert_invalid(r, e) || (rewrite_nonlocal && r->owner[e] != r->me))
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

static void store_row(moea2a_datatype_t dt, const float *acc, size_t hidden, unsigned char *out)
{
    for (size_t h = 0; h < hidden; h++) {
        uint16_t v;
        if (dt == MOEA2A_FLOAT32) {
            memcpy(out + 4 * h, &acc[h], 4);
            continue;
        }
        v = dt == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(acc[h]) : m2a_f32_to_f16(acc[h]);
        memcpy(out + 2 * h, &v, 2);
    }
}

int m2a_host_combine_reduce(const m2a_route_t *r, int n, const int32_t *send_map, moea2a_datatype_t dtype,
                            size_t hidden, const unsigned char *self_rows, const unsigned char *landing,
                            const int *stage_index, void *out)
{
    size_t row_bytes = (dtype == MOEA2A_FLOAT32 ? 4 : 2) * hidden;
    float *acc = malloc(sizeof(float) * (hidden ? hidden : 1));
    if (!acc) return -1;
    for (int t = 0; t < n; t++) {
        const int32_t *map = send_map + (size_t)t * r->k;
        memset(acc, 0, sizeof(float) * hidden);
        /* the map holds the token's ranks in ascending order: the fixed summation order */
        for (int d = 0; d < r->k && map[d] >= 0; d++) {
            int rank = map[d] / r->cap, slot = map[d] % r->cap;
            const unsigned char *row =
                rank == r->me ? self_rows + (size_t)slot * row_bytes
                              : landing + ((size_t)stage_index[rank] * (size_t)r->cap + (size_t)slot) * row_bytes;
            accumulate(dtype, row, hidden, acc);
        }
        store_row(dtype, acc, hidden, (unsigned char *)out + (size_t)t * row_bytes);
    }
    free(acc);
    return 0;
}

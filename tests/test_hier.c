/* The hierarchical plan across nodes (lib/moe/hier_plan.c) against the flat path, on the
 * host with no peers. For random routings (invalid ids, repeated experts, idle ranks)
 * and node maps (equal and unequal nodes; nodes of consecutive ranks, as
 * MOEA2A_NODE_SIZE makes them, and of interleaved ranks, as hosts may): every rank's
 * received rows (source, slot, token), through the rail peers, equal the flat route's;
 * the rows that cross nodes are the node-dedup count of the routing, never more than
 * the flat path's; and the combine through one partial per (token, node) equals the
 * host reference's node-grouped combine (m2a_host_combine_reduce) bit for bit in
 * bf16, fp16 and fp32. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/convert.h"
#include "moe/backend/host_kernels.h"
#include "moe/hier_plan.h"
#include "tap.h"

#define MAX_EP 12
#define MAX_CAP 24
#define MAX_K 8
#define MAX_HIDDEN 9
#define MAP_RANKS 32 /* node maps up to this many ranks (the DeepSeek-V3 case below) */

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int below(uint64_t *s, int n) { return (int)(next(s) % (uint64_t)n); }

/* A node map of ep ranks: nodes of `size` consecutive ranks (the last one may be
 * smaller), or, with size 0, each rank on one of `nnodes` nodes at random. Nodes are
 * numbered in the order of their lowest rank, ranks indexed in rank order within
 * theirs, as m2a_nodemap_build numbers them. */
typedef struct {
    int node[MAP_RANKS], local[MAP_RANKS], size[MAP_RANKS];
    m2a_nodemap_t map;
} nodes_t;

static void make_nodes(nodes_t *m, int ep, int size, int nnodes, uint64_t *rng)
{
    int raw[MAP_RANKS], id[MAP_RANKS];
    for (int r = 0; r < ep; r++) raw[r] = size ? r / size : below(rng, nnodes);
    for (int i = 0; i < MAP_RANKS; i++) id[i] = -1, m->size[i] = 0;
    int count = 0;
    for (int r = 0; r < ep; r++) {
        if (id[raw[r]] < 0) id[raw[r]] = count++;
        m->node[r] = id[raw[r]];
        m->local[r] = m->size[m->node[r]]++;
    }
    m->map = (m2a_nodemap_t){.nnodes = count, .node = m->node, .local = m->local, .size = m->size};
}

/* A value of dtype: a random sign and mantissa over a wide range of exponents (so that
 * the roundings of the partials decide bits), now and then an infinity or a NaN. */
static void put_value(moea2a_datatype_t dt, uint64_t *rng, unsigned char *at)
{
    int pick = below(rng, 400);
    float v = pick == 0 ? INFINITY : pick == 1 ? NAN : ldexpf(1.0f + (float)below(rng, 1 << 20) / (1 << 20), below(rng, 24) - 12);
    if (below(rng, 2)) v = -v;
    if (dt == MOEA2A_FLOAT32) memcpy(at, &v, 4);
    else {
        uint16_t h = dt == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(v) : m2a_f32_to_f16(v);
        memcpy(at, &h, 2);
    }
}

typedef struct {
    long cases, layout_bad, rail_bad, rows_bad, combine_bad, more_than_flat;
    int64_t across_hier, across_flat, forwarded_twice; /* rows a rail peer handed to 2+ ranks */
} tally_t;

/* One random case: routes every rank's tokens flat (m2a_host_route) and through the
 * plan, and compares. */
static void one_case(uint64_t seed, tally_t *tl)
{
    uint64_t rng = seed;
    const int ep = 2 + below(&rng, MAX_EP - 1);
    nodes_t nm;
    if (below(&rng, 2)) make_nodes(&nm, ep, 1 + below(&rng, ep), 0, &rng);
    else make_nodes(&nm, ep, 0, 1 + below(&rng, ep), &rng);
    const int k = 1 + below(&rng, MAX_K), cap = 1 + below(&rng, MAX_CAP), E = ep * (1 + below(&rng, 6));
    const int hidden = 1 + below(&rng, MAX_HIDDEN);
    const moea2a_datatype_t dt = (moea2a_datatype_t[]){MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32}[below(&rng, 3)];
    const size_t row_bytes = (dt == MOEA2A_FLOAT32 ? 4 : 2) * (size_t)hidden;
    int32_t owner[MAX_EP * 6];
    const int blocks = below(&rng, 2); /* E / ep experts per rank in blocks, or each expert anywhere */
    for (int e = 0; e < E; e++) owner[e] = blocks ? e / (E / ep) : below(&rng, ep);
    const int32_t invalid = E + 3;

    m2a_hier_t h;
    if (m2a_hier_init(&h, &nm.map, ep)) {
        tl->rail_bad++;
        return;
    }
    for (int src = 0; src < ep; src++) /* the rails: in the node asked, src itself at home, index modulo size */
        for (int q = 0; q < nm.map.nnodes; q++) {
            const int p = m2a_hier_rail(&h, src, q);
            tl->rail_bad += p < 0 || p >= ep || nm.node[p] != q ||
                            (q == nm.node[src] ? p != src : nm.local[p] != nm.local[src] % nm.size[q]);
        }

    static int32_t ids[MAX_EP][MAX_CAP * MAX_K], map[MAX_EP][MAX_CAP * MAX_K], counts[MAX_EP][MAX_EP];
    static int flat_tok[MAX_EP][MAX_EP][MAX_CAP], hier_tok[MAX_EP][MAX_EP][MAX_CAP]; /* [dst][src][slot] */
    static int32_t fwd[MAX_EP][MAX_EP][MAX_CAP * MAX_K];                             /* [src][node]: the rail's codes */
    static int list[MAX_EP][MAX_EP][MAX_CAP], nlist[MAX_EP][MAX_EP];                 /* [src][node]: tokens sent there */
    int n[MAX_EP];
    m2a_route_t r[MAX_EP];
    for (int s = 0; s < ep; s++) {
        n[s] = below(&rng, 4) == 0 ? 0 : below(&rng, cap + 1); /* some ranks idle */
        for (int i = 0; i < n[s] * k; i++) {
            const int pick = below(&rng, 20);
            ids[s][i] = pick == 0 ? -1 : pick == 1 ? E + below(&rng, 3) : pick == 2 ? invalid : below(&rng, E);
        }
        r[s] = (m2a_route_t){.ep = ep, .me = s, .k = k, .num_experts = E, .cap = cap, .invalid_id = invalid, .owner = owner};
        int64_t inv = 0, dedup = 0, dropped = 0;
        m2a_host_route(&r[s], n[s], ids[s], counts[s], map[s], &inv, &dedup, &dropped);
    }
    memset(flat_tok, 0xff, sizeof(flat_tok)), memset(hier_tok, 0xff, sizeof(hier_tok)); /* -1: no row */

    /* flat: the send map's codes; across: its rows to other nodes; dedup: the distinct
     * other nodes of each token, counted from the ids */
    int64_t across_flat = 0, dedup_count = 0, across_plan = 0;
    for (int s = 0; s < ep; s++)
        for (int t = 0; t < n[s]; t++) {
            int seen[MAX_EP] = {0};
            for (int j = 0; j < k; j++) {
                const int32_t e = ids[s][t * k + j];
                if (e < 0 || e >= E || e == invalid) continue;
                const int q = nm.node[owner[e]];
                if (q != nm.node[s] && !seen[q]) seen[q] = 1, dedup_count++;
            }
            for (int d = 0; d < k && map[s][t * k + d] >= 0; d++) {
                const int q = map[s][t * k + d] / cap, slot = map[s][t * k + d] % cap;
                flat_tok[q][s][slot] = t;
                across_flat += nm.node[q] != nm.node[s];
            }
        }

    /* the first stage: direct rows at home, one row per other node to its rail peer */
    for (int s = 0; s < ep; s++) {
        int64_t rows[MAX_EP] = {0}, want[MAX_EP] = {0};
        across_plan += m2a_hier_first_stage(&h, s, n[s], k, cap, map[s], rows);
        for (int q = 0; q < nm.map.nnodes; q++) nlist[s][q] = 0;
        for (int t = 0; t < n[s]; t++) {
            int seen[MAX_EP] = {0};
            for (int d = 0; d < k && map[s][t * k + d] >= 0; d++) {
                const int dst = map[s][t * k + d] / cap, q = nm.node[dst];
                if (q == nm.node[s]) {
                    hier_tok[dst][s][map[s][t * k + d] % cap] = t, want[dst]++;
                } else if (!seen[q]) {
                    seen[q] = 1, want[m2a_hier_rail(&h, s, q)]++;
                    list[s][q][nlist[s][q]++] = t;
                }
            }
        }
        tl->rows_bad += memcmp(rows, want, sizeof(rows)) != 0;
    }
    tl->rows_bad += across_plan != dedup_count;
    tl->more_than_flat += across_plan > across_flat;
    tl->across_hier += across_plan, tl->across_flat += across_flat;

    /* the second stage: each rail peer forwards one source's rows to its node's ranks */
    for (int s = 0; s < ep; s++)
        for (int q = 0; q < nm.map.nnodes; q++) {
            if (q == nm.node[s] || !nlist[s][q]) continue;
            int32_t rows_ids[MAX_CAP * MAX_K], rows_tok[MAX_CAP], next_slot[MAX_EP] = {0};
            for (int i = 0; i < nlist[s][q]; i++) {
                memcpy(rows_ids + i * k, ids[s] + list[s][q][i] * k, sizeof(int32_t) * k);
                rows_tok[i] = list[s][q][i];
            }
            const int p = m2a_hier_rail(&h, s, q);
            m2a_route_t rp = r[p];
            m2a_hier_forward(&rp, &h, q, s, nlist[s][q], rows_ids, rows_tok, fwd[s][q], next_slot);
            for (int i = 0; i < nlist[s][q]; i++) {
                int nd = 0;
                for (int d = 0; d < k && fwd[s][q][i * k + d] >= 0; d++, nd++) {
                    const int dst = fwd[s][q][i * k + d] / cap, slot = fwd[s][q][i * k + d] % cap;
                    if (nm.node[dst] != q || slot >= cap || hier_tok[dst][s][slot] >= 0) tl->layout_bad++;
                    else hier_tok[dst][s][slot] = list[s][q][i];
                }
                tl->forwarded_twice += nd >= 2;
            }
        }
    tl->layout_bad += memcmp(flat_tok, hier_tok, sizeof(flat_tok)) != 0;

    /* the combine: every (dst, src, slot) holds a row; the reference sums them by node;
     * the plan sums each node's at its rail peer (home: at the source), then the partials */
    static unsigned char rows_at[MAX_EP][MAX_EP][MAX_CAP][MAX_HIDDEN * 4]; /* [dst][src][slot] */
    for (int q = 0; q < ep; q++)
        for (int s = 0; s < ep; s++)
            for (int i = 0; i < cap; i++)
                for (int x = 0; x < hidden; x++) put_value(dt, &rng, rows_at[q][s][i] + x * (row_bytes / hidden));
    static unsigned char landing[MAX_EP * MAX_CAP * MAX_HIDDEN * 4], want[MAX_CAP * MAX_HIDDEN * 4],
        got[MAX_CAP * MAX_HIDDEN * 4], partial[MAX_EP][MAX_HIDDEN * 4];
    float acc[MAX_HIDDEN];
    int stage_index[MAX_EP];
    const m2a_crow_t f = {dt, (size_t)hidden, row_bytes, 0, 0}; /* the combine dtype on the wire */
    for (int s = 0; s < ep; s++) {
        for (int q = 0; q < ep; q++) {
            stage_index[q] = q;
            for (int i = 0; i < cap; i++) memcpy(landing + ((size_t)q * cap + i) * row_bytes, rows_at[q][s][i], row_bytes);
        }
        if (m2a_host_combine_reduce(&r[s], n[s], map[s], &f, landing + (size_t)s * cap * row_bytes,
                                    landing, stage_index, nm.node, nm.map.nnodes, want)) {
            tl->combine_bad++;
            continue;
        }
        int pos[MAX_EP] = {0}; /* each node's next row in list[s][node] */
        for (int t = 0; t < n[s]; t++) {
            const unsigned char *parts[MAX_EP];
            int np = 0;
            for (int q = 0; q < nm.map.nnodes; q++) {
                const unsigned char *rows[MAX_K];
                int nr = 0;
                if (q == nm.node[s]) {
                    for (int d = 0; d < k && map[s][t * k + d] >= 0; d++) {
                        const int dst = map[s][t * k + d] / cap;
                        if (nm.node[dst] == q) rows[nr++] = rows_at[dst][s][map[s][t * k + d] % cap];
                    }
                } else if (pos[q] < nlist[s][q] && list[s][q][pos[q]] == t) {
                    const int32_t *c = fwd[s][q] + pos[q]++ * k;
                    for (int d = 0; d < k && c[d] >= 0; d++) rows[nr++] = rows_at[c[d] / cap][s][c[d] % cap];
                }
                if (!nr) continue;
                m2a_host_sum_rows(&f, rows, nr, acc, partial[np], 1);
                parts[np] = partial[np], np++;
            }
            unsigned char *out = got + (size_t)t * row_bytes;
            if (nm.map.nnodes > 1 || np == 0) m2a_host_sum_rows(&f, parts, np, acc, out, 0);
            else memcpy(out, parts[0], row_bytes); /* one node: its sum rounded once */
        }
        tl->combine_bad += memcmp(want, got, (size_t)n[s] * row_bytes) != 0;
    }
    m2a_hier_free(&h);
    tl->cases++;
}

int main(void)
{
    tally_t tl = {0};
    for (uint64_t seed = 1; seed <= 600; seed++) one_case(seed * 7919, &tl);
    tap_ok(tl.rail_bad == 0, "rail peers: in the node asked, the source itself at home, the source's index modulo the "
                             "node's size (%ld random node maps, %ld wrong)", tl.cases, tl.rail_bad);
    tap_ok(tl.layout_bad == 0, "dispatch through the rail peers: every rank's rows (source, slot, token) equal the flat "
                               "route's (%ld cases, %ld differ; %lld rows handed to 2 or more ranks by a rail peer)",
           tl.cases, tl.layout_bad, (long long)tl.forwarded_twice);
    tap_ok(tl.rows_bad == 0 && tl.more_than_flat == 0 && tl.forwarded_twice > 0 && tl.across_hier < tl.across_flat,
           "rows across nodes: the first stage hands each rank the rows expected, the node-dedup count of the routing "
           "crosses, never more than flat (%lld against %lld flat; %ld cases wrong)",
           (long long)tl.across_hier, (long long)tl.across_flat, tl.rows_bad + tl.more_than_flat);
    tap_ok(tl.combine_bad == 0, "combine through one partial per (token, node), summed in ascending node order, equals "
                                "the host reference's node-grouped combine bit for bit, bf16 / fp16 / fp32 (%ld cases "
                                "differ)", tl.combine_bad);

    /* DeepSeek-V3 routing (top-8 of 256) on 4 nodes x 8 ranks, uniform: the rows that
     * cross nodes per token, flat against the plan's */
    nodes_t nm;
    uint64_t rng = 42;
    make_nodes(&nm, 32, 8, 0, &rng);
    m2a_hier_t h;
    int ok = m2a_hier_init(&h, &nm.map, 32) == 0;
    int32_t owner[256], ids[1024 * 8], map[1024 * 8], counts[32];
    for (int e = 0; e < 256; e++) owner[e] = e / 8;
    m2a_route_t r = {.ep = 32, .me = 3, .k = 8, .num_experts = 256, .cap = 1024, .invalid_id = -1, .owner = owner};
    for (int t = 0; t < 1024; t++)
        for (int j = 0; j < 8; j++) {
            int e, dup;
            do { /* 8 distinct experts */
                e = below(&rng, 256), dup = 0;
                for (int i = 0; i < j; i++) dup |= ids[t * 8 + i] == e;
            } while (dup);
            ids[t * 8 + j] = e;
        }
    int64_t inv = 0, dedup = 0, dropped = 0, rows[32] = {0}, flat = 0;
    m2a_host_route(&r, 1024, ids, counts, map, &inv, &dedup, &dropped);
    for (int q = 0; q < 32; q++) flat += nm.node[q] != nm.node[3] ? counts[q] : 0;
    const int64_t across = ok ? m2a_hier_first_stage(&h, 3, 1024, 8, 1024, map, rows) : -1;
    tap_ok(ok && across > 0 && across * 10 < flat * 6,
           "top-8 of 256 on 4 nodes x 8 ranks: %.2f rows per token cross nodes through the rails against %.2f flat",
           (double)across / 1024, (double)flat / 1024);
    if (ok) m2a_hier_free(&h);
    return tap_done();
}

/* The hierarchical plan across nodes (hier_plan.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "moe/hier_plan.h"

int m2a_hier_init(m2a_hier_t *h, const m2a_nodemap_t *m, int ep)
{
    h->ep = ep, h->nnodes = m->nnodes, h->node = m->node;
    h->rail = malloc(sizeof(int) * (size_t)ep * (size_t)(m->nnodes > 0 ? m->nnodes : 1));
    int *at = calloc((size_t)(m->nnodes > 0 ? m->nnodes : 1), sizeof(int)); /* rank of each index, per node */
    int *by = malloc(sizeof(int) * (size_t)ep);                               /* ranks grouped by node, in index order */
    if (!h->rail || !at || !by) {
        free(h->rail), free(at), free(by);
        h->rail = NULL;
        return -1;
    }
    for (int q = 0, off = 0; q < m->nnodes; off += m->size[q], q++) at[q] = off; /* where node q's ranks start in by */
    for (int r = 0; r < ep; r++) by[at[m->node[r]] + m->local[r]] = r;
    for (int src = 0; src < ep; src++)
        for (int q = 0; q < m->nnodes; q++)
            h->rail[(size_t)src * m->nnodes + q] = q == m->node[src] ? src : by[at[q] + m->local[src] % m->size[q]];
    free(at), free(by);
    return 0;
}

void m2a_hier_free(m2a_hier_t *h)
{
    free(h->rail);
    h->rail = NULL;
}

int m2a_hier_served(const m2a_hier_t *h, int rank)
{
    return m2a_hier_sources(h, rank, NULL, NULL);
}

int m2a_hier_sources(const m2a_hier_t *h, int rank, int *served, int *index)
{
    int n = 0;
    for (int src = 0; src < h->ep; src++) {
        const int serve = h->node[src] != h->node[rank] && m2a_hier_rail(h, src, h->node[rank]) == rank;
        if (index) index[src] = serve ? n : -1;
        if (serve && served) served[n] = src;
        n += serve;
    }
    return n;
}

int m2a_hier_staged(const m2a_nodemap_t *m, int ep, int rank, int *stage_index)
{
    m2a_hier_t h;
    if (m2a_hier_init(&h, m, ep)) return -1;
    for (int q = 0; q < ep; q++) stage_index[q] = q != rank && m->node[q] == m->node[rank];
    for (int x = 0; x < m->nnodes; x++)
        if (x != m->node[rank]) stage_index[m2a_hier_rail(&h, rank, x)] = 1;
    int n = 0;
    for (int q = 0; q < ep; q++) stage_index[q] = stage_index[q] ? n++ : -1;
    m2a_hier_free(&h);
    return n;
}

int m2a_hier_nodes(const m2a_nodemap_t *m, int ep, int rank, m2a_moe_nodes_t *out)
{
    m2a_hier_t h;
    if (m2a_hier_init(&h, m, ep)) return -1;
    int widest = 0, most = 0;
    for (int x = 0; x < m->nnodes; x++) widest = m->size[x] > widest ? m->size[x] : widest;
    for (int q = 0; q < ep; q++) {
        const int s = m2a_hier_served(&h, q);
        most = s > most ? s : most;
    }
    *out = (m2a_moe_nodes_t){m->nnodes, m->size[m->node[rank]], m2a_hier_served(&h, rank), widest, most};
    m2a_hier_free(&h);
    return 0;
}

int m2a_hier_nodes_blocks(int ep, int rpn, int rank, m2a_moe_nodes_t *out)
{
    const int per = rpn > 0 && rpn < ep ? rpn : ep, nnodes = (ep + per - 1) / per;
    int *node = malloc(sizeof(int) * (size_t)ep * 2), *size = malloc(sizeof(int) * (size_t)nnodes);
    if (!node || !size) {
        free(node), free(size);
        return -1;
    }
    for (int q = 0; q < nnodes; q++) size[q] = ep - q * per < per ? ep - q * per : per;
    for (int r = 0; r < ep; r++) node[r] = r / per, node[ep + r] = r % per;
    const m2a_nodemap_t m = {.nnodes = nnodes, .node = node, .local = node + ep, .size = size};
    const int e = m2a_hier_nodes(&m, ep, rank, out);
    free(node), free(size);
    return e;
}

int64_t m2a_hier_first_stage(const m2a_hier_t *h, int src, int n, int k, int cap, const int32_t *send_map, int64_t *rows)
{
    int64_t across = 0;
    const int home = h->node[src];
    for (int t = 0; t < n; t++) {
        const int32_t *map = send_map + (size_t)t * k;
        for (int d = 0; d < k && map[d] >= 0; d++) {
            const int dst = map[d] / cap, q = h->node[dst];
            if (q == home) {
                rows[dst]++;
                continue;
            }
            int seen = 0; /* the token went to node q already (its ranks need not be consecutive) */
            for (int e = 0; e < d && !seen; e++) seen = h->node[map[e] / cap] == q;
            if (seen) continue;
            rows[m2a_hier_rail(h, src, q)]++;
            across++;
        }
    }
    return across;
}

int64_t m2a_hier_forward(const m2a_route_t *r, const m2a_hier_t *h, int node, int src, int nrows, const void *ids,
                         const void *tokens, int32_t *fwd, int32_t *next)
{
    int64_t pairs = 0;
    for (int i = 0; i < nrows; i++) {
        const unsigned char *row = (const unsigned char *)ids + (size_t)i * r->k * 4;
        int32_t *out = fwd + (size_t)i * r->k;
        int nd = 0;
        for (int j = 0; j < r->k; j++) { /* insert each owner in this node once, keeping ascending rank */
            int32_t e;
            memcpy(&e, row + 4 * (size_t)j, 4); /* rows packed in a record need not be 4-byte aligned */
            if (m2a_expert_invalid(r, e)) continue;
            int32_t t;
            memcpy(&t, (const unsigned char *)tokens + 4 * (size_t)i, 4);
            const int q = m2a_expert_rank(r, e, src, t);
            if (q < 0 || h->node[q] != node) continue; /* q < 0: held by no rank */
            int at = 0;
            while (at < nd && out[at] < q) at++;
            if (at < nd && out[at] == q) continue;
            for (int s = nd; s > at; s--) out[s] = out[s - 1];
            out[at] = q, nd++;
        }
        for (int d = 0; d < nd; d++) {
            const int q = out[d];
            out[d] = q * r->cap + next[q]++;
        }
        for (int d = nd; d < r->k; d++) out[d] = -1;
        pairs += nd;
    }
    return pairs;
}

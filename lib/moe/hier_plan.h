/* The hierarchical plan of a dispatch and combine across nodes: a token crosses the
 * network once for each other node that holds one of its destinations, to its rail
 * peer there (the rank of that node with the sender's index in its node), which
 * forwards it to that node's destinations; destinations in the sender's node get it
 * directly. The combine goes back the same way: the rail peer sums the rows its node
 * holds for a token (fp32, ascending rank, rounded to the combine dtype: the node's
 * partial of DESIGN.md's "Combine order across nodes") and sends that one row; the
 * sender adds the partials in ascending node order. So the receive layout, the slots
 * and the combine's bits are the flat path's for the same node map, with one network
 * row per (token, other node) instead of one per (token, rank on another node).
 * Host code, no communication: what a hierarchical backend executes, and what
 * tests/test_hier.c checks against the flat path. */
#ifndef M2A_MOE_HIER_PLAN_H
#define M2A_MOE_HIER_PLAN_H
#include <stdint.h>

#include "comm/nodemap.h"
#include "moe/layout.h"

typedef struct {
    int ep, nnodes;
    const int *node; /* [ep]: each rank's node (the node map's) */
    int *rail;       /* [ep][nnodes]: the rank of node n that serves rank src there */
} m2a_hier_t;

/* The rails of a node map of ep ranks: src's rail peer in node n is the rank of n whose
 * index in n is src's index in its own node modulo n's size (nodes may differ in size);
 * in src's own node it is src. -1 when out of memory. */
int m2a_hier_init(m2a_hier_t *h, const m2a_nodemap_t *m, int ep);
void m2a_hier_free(m2a_hier_t *h);

static inline int m2a_hier_rail(const m2a_hier_t *h, int src, int node) { return h->rail[(size_t)src * h->nnodes + node]; }

/* The first stage of src's dispatch, from its send map (m2a_host_route: per token k
 * codes rank x cap + slot in ascending rank, then -1): rows[dst] += the rows src hands
 * the transport for rank dst: one per token for each destination in src's node
 * (direct), one per token for each other node the token reaches, to src's rail peer
 * there. Returns the rows that cross nodes. */
int64_t m2a_hier_first_stage(const m2a_hier_t *h, int src, int n, int k, int cap, const int32_t *send_map,
                             int64_t *rows);

/* Where rank sits among the nodes of map m (ep ranks), or among nodes of rpn
 * consecutive ranks (the last one may be smaller): -1 when out of memory. */
int m2a_hier_nodes(const m2a_nodemap_t *m, int ep, int rank, m2a_moe_nodes_t *out);
/* The peers a hierarchical path stages (the other ranks of rank's node, and its rail
 * peer in every other node), each given a staging slot in rank order in stage_index[ep]
 * (-1: not staged); returns how many (node_size - 1 + nnodes - 1), -1 out of memory. */
int m2a_hier_staged(const m2a_nodemap_t *m, int ep, int rank, int *stage_index);
int m2a_hier_nodes_blocks(int ep, int rpn, int rank, m2a_moe_nodes_t *out);

/* The second stage at a rail peer of node `node`: the rows of source rank src that
 * reached it across the network, in that source's token order, row i's k ids (int32,
 * any alignment: they may sit packed in a record) at byte i x k x 4 of ids and its
 * source token index at byte 4 i of tokens (which replica takes an entry). For each
 * row its destinations in this node (the ranks that take its valid ids there, each
 * once, ascending rank) and its slot at each: fwd[i x k + d] = rank x cap + slot, -1
 * after. next[ep]: that source's next slot at each rank, zero before its first row
 * (its rows reach a rank of this node only through here, in token order, so the count
 * so far is the flat path's slot). Returns the (row, destination) pairs. */
int64_t m2a_hier_forward(const m2a_route_t *r, const m2a_hier_t *h, int node, int src, int nrows, const void *ids,
                         const void *tokens, int32_t *fwd, int32_t *next);

/* The sources on other nodes that `rank` serves as their rail peer: how many; with
 * m2a_hier_sources also which, ascending, in served[] and each rank's index among them
 * (or -1) in index[ep] (either may be NULL). */
int m2a_hier_served(const m2a_hier_t *h, int rank);
int m2a_hier_sources(const m2a_hier_t *h, int rank, int *served, int *index);
#endif

/* The communicator's node map: which ranks share a node. A node is a host (the host
 * names the bootstrap collected), or with MOEA2A_NODE_SIZE=N, N consecutive ranks of
 * a host (emulated nodes, for tests and benchmarks on one machine). Nodes are numbered
 * in the order of their lowest rank. */
#ifndef M2A_NODEMAP_H
#define M2A_NODEMAP_H
#include "moea2a.h"

typedef struct {
    int nnodes;
    int *node;  /* [nranks]: node of each rank */
    int *local; /* [nranks]: index of each rank within its node, in rank order */
    int *size;  /* [nnodes]: ranks of each node */
    /* the real hosts, whatever the emulation: placement (GPU, NUMA, shared memory) follows them */
    int *host_local; /* [nranks]: index of each rank among its host's ranks, in rank order */
    int *host_size;  /* [nranks]: ranks on each rank's host */
} m2a_nodemap_t;

/* Collective (over the bootstrap): builds comm's map, after checking that every rank
 * uses the same MOEA2A_NODE_SIZE (MOEA2A_ERR_MISMATCH naming the first that does not). */
moea2a_result_t m2a_nodemap_build(moea2a_comm_t comm, m2a_nodemap_t *map);
void m2a_nodemap_free(m2a_nodemap_t *map);
#endif

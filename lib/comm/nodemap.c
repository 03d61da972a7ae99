/* The communicator's node map (nodemap.h). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "base/log.h"
#include "comm/nodemap.h"
#include "base/params.h"

typedef struct {
    const char *host;
    int rank;
} host_rank_t;

static int by_host_then_rank(const void *a, const void *b)
{
    const host_rank_t *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

moea2a_result_t m2a_nodemap_build(moea2a_comm_t comm, m2a_nodemap_t *map)
{
    const int n = comm->nranks;
    memset(map, 0, sizeof(*map));
    long want = 0;
    M2A_TRY(m2a_comm_record(comm, m2a_param_int("MOEA2A_NODE_SIZE", &want)));
    /* every rank must split the same way, or ranks would disagree on who is local */
    int32_t *all = calloc((size_t)n, sizeof(int32_t));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    all[comm->rank] = want < 0 || want > n ? -1 : (int32_t)want;
    moea2a_result_t r = n > 1 ? m2a_comm_allgather(comm, all, sizeof(int32_t)) : MOEA2A_SUCCESS;
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (all[q] < 0)
            r = m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                          "moea2a_comm_init: MOEA2A_NODE_SIZE on rank %d is outside 0..%d (0: a node is a host)", q, n);
        else if (all[q] != all[0])
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "moea2a_comm_init: ranks set different MOEA2A_NODE_SIZE: rank 0 has %d, rank %d has %d", all[0],
                          q, all[q]);
    }
    free(all);
    if (r != MOEA2A_SUCCESS) return r;
    map->node = calloc((size_t)n, sizeof(int));
    map->local = calloc((size_t)n, sizeof(int));
    map->size = calloc((size_t)n, sizeof(int));
    map->host_local = calloc((size_t)n, sizeof(int));
    map->host_size = calloc((size_t)n, sizeof(int));
    host_rank_t *by_host = calloc((size_t)n, sizeof(*by_host));
    int *lowest = calloc((size_t)n, sizeof(int));
    if (!map->node || !map->local || !map->size || !map->host_local || !map->host_size || !by_host || !lowest) {
        free(by_host), free(lowest), m2a_nodemap_free(map);
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    }
    /* Ranks grouped by host, ascending within a host (n log n: communicators may be
     * large). The i-th rank of a host belongs to its slice i / want; a node is named
     * by its lowest rank, the first of its slice. */
    for (int q = 0; q < n; q++) by_host[q] = (host_rank_t){comm->bs->peers[q].host, q};
    qsort(by_host, (size_t)n, sizeof(*by_host), by_host_then_rank);
    for (int g = 0; g < n;) {
        int end = g;
        while (end < n && !strcmp(by_host[end].host, by_host[g].host)) end++;
        for (int i = g; i < end; i++) {
            const int q = by_host[i].rank;
            map->host_local[q] = i - g, map->host_size[q] = end - g;
            lowest[q] = by_host[g + (want ? (i - g) / want * want : 0)].rank;
        }
        g = end;
    }
    for (int q = 0; q < n; q++) { /* nodes numbered in the order of their lowest rank */
        map->node[q] = lowest[q] == q ? map->nnodes++ : map->node[lowest[q]];
        map->local[q] = map->size[map->node[q]]++;
    }
    free(by_host), free(lowest);
    M2A_INFO(M2A_SUBSYS_INIT, "node map: %d node(s)%s; rank %d is rank %d of %d on node %d", map->nnodes,
             want ? " (MOEA2A_NODE_SIZE emulation)" : "", comm->rank, map->local[comm->rank],
             map->size[map->node[comm->rank]], map->node[comm->rank]);
    return MOEA2A_SUCCESS;
}

void m2a_nodemap_free(m2a_nodemap_t *map)
{
    free(map->node), free(map->local), free(map->size), free(map->host_local), free(map->host_size);
    memset(map, 0, sizeof(*map));
}

/* The communicator's node map (nodemap.h). */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "log.h"
#include "nodemap.h"
#include "params.h"

moea2a_result_t m2a_nodemap_build(moea2a_comm_t comm, m2a_nodemap_t *map)
{
    const int n = comm->nranks;
    memset(map, 0, sizeof(*map));
    long want = 0;
    M2A_TRY(m2a_param_int(comm, "MOEA2A_NODE_SIZE", &want));
    /* every rank must split the same way, or ranks would disagree on who is local */
    int32_t *all = calloc((size_t)n, sizeof(int32_t));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    all[comm->rank] = want < 0 || want > n ? -1 : (int32_t)want;
    moea2a_result_t r = n > 1 ? m2a_bootstrap_allgather(comm, comm->bs, all, sizeof(int32_t)) : MOEA2A_SUCCESS;
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
    int *first = calloc((size_t)n, sizeof(int)), *on_host = calloc((size_t)n, sizeof(int));
    if (!map->node || !map->local || !map->size || !first || !on_host) {
        free(first), free(on_host), m2a_nodemap_free(map);
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    }
    /* rank q is the on_host[q]-th rank of the host whose lowest rank is first[q]; its
     * node is that host's (on_host[q] / want)-th slice */
    for (int q = 0; q < n; q++) {
        first[q] = q, on_host[q] = 0;
        for (int p = 0; p < q; p++)
            if (!strcmp(comm->bs->peers[p].host, comm->bs->peers[q].host)) {
                if (first[q] == q) first[q] = p;
                on_host[q]++;
            }
    }
    for (int q = 0; q < n; q++) {
        int p = 0; /* the lowest rank of q's node: same host, same slice */
        while (p < q && !(first[p] == first[q] && (want ? on_host[p] / want == on_host[q] / want : 1))) p++;
        map->node[q] = p == q ? map->nnodes++ : map->node[p];
        map->local[q] = map->size[map->node[q]]++;
    }
    free(first), free(on_host);
    M2A_INFO(M2A_SUBSYS_INIT, "node map: %d node(s)%s; rank %d is rank %d of %d on node %d", map->nnodes,
             want ? " (MOEA2A_NODE_SIZE emulation)" : "", comm->rank, map->local[comm->rank],
             map->size[map->node[comm->rank]], map->node[comm->rank]);
    return MOEA2A_SUCCESS;
}

void m2a_nodemap_free(m2a_nodemap_t *map)
{
    free(map->node), free(map->local), free(map->size);
    memset(map, 0, sizeof(*map));
}

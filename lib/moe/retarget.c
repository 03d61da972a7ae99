/* A MoE context follows its communicator (moea2a_moe(3), "Recovery"): after a shrink
 * or a grow, the context is made anew on the new communicator from the config it was
 * created with, keeping its handle and the experts' load counts, with the placement the
 * caller gives or, after a shrink, one derived from the old placement. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "moe/core.h"
#include "moe/load.h"

/* The experts' holders on newcomm, made by moea2a_comm_shrink of the context's
 * communicator: each expert stays with its holder (the first surviving one among
 * replicas), renumbered; the others (their holders left, or none held them) go in
 * ascending id each to the new rank holding fewest, the lowest such rank: from new
 * rank 0's view of the old placement. */
static moea2a_result_t derive_map(moea2a_moe_t moe, moea2a_comm_t nc, const char *fn, int32_t *map)
{
    const int old_n = moe->comm->nranks, n = nc->nranks, E = moe->cfg.num_experts;
    M2A_CHECK_ARG(nc, nc->parent == moe->comm,
                  "%s: expert_to_rank is NULL, which derives the placement only on a communicator shrunk from "
                  "the context's (moea2a_comm_shrink); give the map", fn);
    int *to_new = malloc(sizeof(int) * (size_t)old_n), *held = calloc((size_t)n, sizeof(int));
    if (!to_new || !held) {
        free(to_new), free(held);
        return m2a_error(nc, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    for (int q = 0; q < old_n; q++) to_new[q] = -1;
    for (int q = 0; q < n; q++) to_new[nc->parent_rank[q]] = q;
    for (int e = 0; e < E; e++) {
        map[e] = -1;
        if (moe->h_nrep) {
            for (int j = 0; j < moe->h_nrep[e] && map[e] < 0; j++) map[e] = to_new[moe->h_holders[(size_t)e * moe->max_rep + j]];
        } else if (moe->h_owner[e] >= 0) {
            map[e] = to_new[moe->h_owner[e]];
        }
        if (map[e] >= 0) held[map[e]]++;
    }
    for (int e = 0; e < E; e++) {
        if (map[e] >= 0) continue;
        int least = 0;
        for (int q = 1; q < n; q++) least = held[q] < held[least] ? q : least;
        map[e] = least, held[least]++;
    }
    free(to_new), free(held);
    /* A placement change that a death cut short may have taken effect on some
     * survivors only: all take the map new rank 0 derived. */
    int32_t *all = calloc((size_t)n * (size_t)E, sizeof(int32_t));
    if (!all) return m2a_error(nc, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    memcpy(all + (size_t)nc->rank * (size_t)E, map, sizeof(int32_t) * (size_t)E);
    moea2a_result_t r = m2a_comm_allgather(nc, all, sizeof(int32_t) * (size_t)E);
    if (r == MOEA2A_SUCCESS) memcpy(map, all, sizeof(int32_t) * (size_t)E);
    free(all);
    return r == MOEA2A_SUCCESS || !m2a_peer_lost(r) ? r : m2a_comm_fail(nc, r);
}

moea2a_result_t moea2a_moe_retarget(moea2a_moe_t moe, moea2a_comm_t newcomm, const int32_t *expert_to_rank)
{
    static const char fn[] = "moea2a_moe_retarget";
    M2A_CHECK_ARG(NULL, moe && newcomm, "%s: moe and newcomm must not be NULL", fn);
    M2A_TRY(m2a_comm_check(newcomm, fn));
    M2A_CHECK_ARG(newcomm, moe->backend, "%s: an earlier retarget of this context failed: destroy it", fn);
    M2A_CHECK_ARG(newcomm, newcomm != moe->comm, "%s: the context is on this communicator already", fn);
    /* a dispatch or combine left pending (by a failure, say) is dropped: its results
     * were the old communicator's */
    const int E = moe->cfg.num_experts;
    int32_t *map = malloc(sizeof(int32_t) * (size_t)E);
    if (!map) return m2a_error(newcomm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (expert_to_rank) memcpy(map, expert_to_rank, sizeof(int32_t) * (size_t)E);
    else r = derive_map(moe, newcomm, fn, map);
    if (r != MOEA2A_SUCCESS) {
        free(map);
        return r;
    }
    /* the counts outlive the memory: experts keep their ids (what the device counted
     * is lost with a device that failed) */
    if (m2a_moe_fold_load(moe, fn) != MOEA2A_SUCCESS)
        M2A_INFO(M2A_SUBSYS_MOE, "%s: the device's load counts are lost: %s", fn, moea2a_last_error(moe->comm));
    int64_t *load = moe->h_load;
    moe->h_load = NULL;
    moea2a_moe_config_t cfg = moe->given;
    cfg.placement = MOEA2A_PLACEMENT_MAP, cfg.expert_to_rank = map;
    M2A_INFO(M2A_SUBSYS_MOE, "%s: from %d ranks to %d (rank %d here)", fn, moe->comm->nranks, newcomm->nranks,
             newcomm->rank);
    moe->leaving = 1;
    m2a_moe_release(moe);
    memset(moe, 0, sizeof(*moe));
    r = m2a_moe_build(moe, newcomm, &cfg);
    moe->comm = newcomm;
    if (r == MOEA2A_SUCCESS) {
        memcpy(moe->h_load, load, sizeof(int64_t) * (size_t)E);
    }
    free(load), free(map);
    return r;
}

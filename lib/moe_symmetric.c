/* Symmetric memory for the load/store path: which way, agreed by every rank, and the
 * order of its release (moe_symmetric.h has the ways). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "log.h"
#include "moe_core.h"
#include "moe_symmetric.h"
#include "params.h"

enum { WAY_TRANSPORT, WAY_CUDA_IPC, NWAYS };
static const m2a_symm_way_t *const ways[NWAYS] = {&m2a_symm_transport, &m2a_symm_cuda_ipc};

/* The ways MOEA2A_SYMMETRIC_MEMORY allows, a bit each. auto: the CUDA transport's
 * wherever there is one with symmetric memory, and its answer stands (NCCL's smaller
 * load/store team may be a caller's NCCL_P2P_DISABLE on a machine whose peer access
 * is broken: not a reason to map peers another way); CUDA IPC where there is none. */
static moea2a_result_t allowed(moea2a_comm_t comm, unsigned *mask)
{
    const char *v = m2a_param_str("MOEA2A_SYMMETRIC_MEMORY");
    *mask = 0;
    if (!*v || !strcmp(v, "auto")) {
        m2a_transport_t *t = m2a_transport_for(comm, MOEA2A_MEM_CUDA);
        *mask = 1u << (t && t->ops->mem_register ? WAY_TRANSPORT : WAY_CUDA_IPC);
    }
    for (int i = 0; i < NWAYS; i++)
        if (!strcmp(v, ways[i]->name)) *mask = 1u << i;
    if (*mask) return MOEA2A_SUCCESS;
    return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_SYMMETRIC_MEMORY=%s: expected auto, %s or %s", v,
                     ways[WAY_TRANSPORT]->name, ways[WAY_CUDA_IPC]->name);
}

moea2a_result_t m2a_symm_open(moea2a_comm_t comm, moea2a_result_t status, size_t bytes, void **peers, m2a_symm_t *s)
{
    memset(s, 0, sizeof(*s));
    unsigned mask = 0;
    moea2a_result_t r = status;
    if (r == MOEA2A_SUCCESS) r = allowed(comm, &mask);
    /* The first way every rank can use: one agreement per way, so every rank stops at
     * the same one (or none). */
    char why[NWAYS][200];
    int pick = -1;
    for (int i = 0; i < NWAYS && pick < 0; i++) {
        snprintf(why[i], sizeof(why[i]), "%s", (mask >> i & 1) ? "not on every rank" : "not tried (MOEA2A_SYMMETRIC_MEMORY)");
        int ok = r == MOEA2A_SUCCESS && (mask >> i & 1) && ways[i]->usable(comm, why[i], sizeof(why[i]));
        r = m2a_moe_agree(comm, r, &ok);
        if (r == MOEA2A_SUCCESS && ok) pick = i;
    }
    if (r == MOEA2A_SUCCESS && pick < 0)
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "no symmetric memory for the load/store path: %s: %s; %s: %s",
                         ways[WAY_TRANSPORT]->name, why[WAY_TRANSPORT], ways[WAY_CUDA_IPC]->name, why[WAY_CUDA_IPC]);
    if (r != MOEA2A_SUCCESS) return r;
    r = ways[pick]->open(comm, bytes, peers, s);
    if (r == MOEA2A_SUCCESS) {
        s->way = ways[pick];
        M2A_INFO(M2A_SUBSYS_MOE, "load/store path: symmetric memory by %s, %zu bytes per rank, %d rank(s) on this GPU",
                 s->way->name, bytes, s->gpu_ranks);
    }
    return r;
}

void m2a_symm_close(moea2a_comm_t comm, m2a_symm_t *s, int peers_alive)
{
    if (!s->way) return;
    if (s->way->unmap) s->way->unmap(comm, s);
    /* A peer may still read this allocation until every rank has dropped its view. */
    int healthy = peers_alive && !comm->broken && m2a_bootstrap_barrier(comm, comm->bs) == MOEA2A_SUCCESS;
    s->way->release(comm, s, healthy);
    memset(s, 0, sizeof(*s));
}

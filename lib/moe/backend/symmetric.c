/* Symmetric memory for the load/store path: which way, agreed by every rank, and the
 * order of its release (moe_symmetric.h has the ways). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "base/log.h"
#include "moe/core.h"
#include "moe/backend/symmetric.h"
#include "base/params.h"

enum { WAY_TRANSPORT, WAY_CUDA_IPC, NWAYS };
static const m2a_symm_way_t *const ways[NWAYS] = {&m2a_symm_transport, &m2a_symm_cuda_ipc};

/* The way MOEA2A_SYMMETRIC_MEMORY names, or -1 for a name no way has. auto: the CUDA
 * transport's wherever there is one with symmetric memory, and its answer stands
 * (NCCL's smaller load/store team may be a caller's NCCL_P2P_DISABLE on a machine whose
 * peer access is broken: not a reason to map peers another way); CUDA IPC where there
 * is none. */
static int way_named(moea2a_comm_t comm)
{
    const char *v = m2a_param_str("MOEA2A_SYMMETRIC_MEMORY");
    if (!*v || !strcmp(v, "auto")) return m2a_symm_cuda_transport(comm) ? WAY_TRANSPORT : WAY_CUDA_IPC;
    for (int way = 0; way < NWAYS; way++)
        if (!strcmp(v, ways[way]->name)) return way;
    return -1;
}

static moea2a_result_t chosen(moea2a_comm_t comm, int *way)
{
    if ((*way = way_named(comm)) >= 0) return MOEA2A_SUCCESS;
    *way = 0; /* a way still, though no rank goes on to use it */
    return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_SYMMETRIC_MEMORY=%s: expected auto, %s or %s",
                     m2a_param_str("MOEA2A_SYMMETRIC_MEMORY"), ways[WAY_TRANSPORT]->name, ways[WAY_CUDA_IPC]->name);
}

int m2a_symm_usable(moea2a_comm_t comm, char *why, size_t len)
{
    const int way = way_named(comm);
    if (way < 0) return 1; /* create names the value */
    if (ways[way]->usable(comm, why, len)) return 1;
    char reason[200];
    snprintf(reason, sizeof(reason), "%s", why);
    snprintf(why, len, "no symmetric memory by %s: %s", ways[way]->name, reason);
    return 0;
}

moea2a_result_t m2a_symm_open(moea2a_comm_t comm, moea2a_result_t status, size_t bytes, void **peers, m2a_symm_t *s)
{
    memset(s, 0, sizeof(*s));
    int way = 0;
    moea2a_result_t r = status;
    if (r == MOEA2A_SUCCESS) r = chosen(comm, &way);
    /* Every rank on the same way, and able to use it: the smallest way (-1 where a rank
     * cannot) and the smallest NWAYS - 1 - way, i.e. the largest, agree with this
     * rank's only where every rank chose it and can. */
    char why[200] = "not on every rank";
    int ok = r == MOEA2A_SUCCESS && ways[way]->usable(comm, why, sizeof(why));
    int lo = ok ? way : -1, hi = ok ? NWAYS - 1 - way : -1;
    r = m2a_moe_agree(comm, r, &lo);
    r = m2a_moe_agree(comm, r, &hi);
    if (r == MOEA2A_SUCCESS && (lo < 0 || hi < 0))
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "no symmetric memory for the load/store path by %s: %s",
                         ways[way]->name, why);
    if (r == MOEA2A_SUCCESS && (lo != way || hi != NWAYS - 1 - way))
        return m2a_error(comm, MOEA2A_ERR_MISMATCH, "the ranks chose different symmetric memory (%s here; "
                         "MOEA2A_SYMMETRIC_MEMORY must be the same on every rank)", ways[way]->name);
    if (r != MOEA2A_SUCCESS) return r;
    r = ways[way]->open(comm, bytes, peers, s);
    if (r == MOEA2A_SUCCESS) {
        s->way = ways[way];
        M2A_INFO(M2A_SUBSYS_MOE, "load/store path: symmetric memory by %s, %zu bytes per rank, %d rank(s) on this GPU",
                 s->way->name, bytes, s->gpu_ranks);
    }
    return r;
}

void m2a_symm_close(moea2a_comm_t comm, m2a_symm_t *s, int peers_alive)
{
    if (!s->way) return;
    if (s->way->unmap) s->way->unmap(comm, s);
    /* A peer may still read this allocation until every rank has dropped its view (a
     * rank seen dead reads nothing, and would hold the meeting up) */
    int healthy = peers_alive && !comm->broken && m2a_comm_dead_peer(comm) < 0 &&
                  m2a_comm_barrier(comm) == MOEA2A_SUCCESS;
    s->way->release(comm, s, healthy);
    memset(s, 0, sizeof(*s));
}

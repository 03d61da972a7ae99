/* Symmetric memory from the CUDA transport (NCCL: ncclMemAlloc, and a window on its
 * device communicator), where the transport's load/store team holds every rank. */
#include "config.h"

#include <stdio.h>

#include "comm/comm.h"
#include "moe/core.h"
#include "moe/backend/symmetric.h"

m2a_transport_t *m2a_symm_cuda_transport(moea2a_comm_t comm)
{
    m2a_transport_t *t = m2a_transport_for(comm, MOEA2A_MEM_CUDA);
    return t && t->ops->mem_register ? t : NULL;
}

static int usable(moea2a_comm_t comm, char *why, size_t len)
{
    m2a_transport_t *t = m2a_symm_cuda_transport(comm);
    if (!t) return snprintf(why, len, "no CUDA transport with symmetric memory (nccl)"), 0;
    /* asked before anything collective touches its device API: NCCL on its network
     * transport within one host has a smaller team */
    int reach = 1;
    if (t->ops->lsa_reachable && t->ops->lsa_reachable(t->tc, &reach) != MOEA2A_SUCCESS)
        return snprintf(why, len, "%s", moea2a_last_error(comm)), 0;
    if (!reach) snprintf(why, len, "the %s transport's load/store team is smaller than the communicator", t->name);
    return reach;
}

static moea2a_result_t open_window(moea2a_comm_t comm, size_t bytes, void **peers, m2a_symm_t *s)
{
    m2a_transport_t *t = m2a_symm_cuda_transport(comm);
    void *ptr = NULL, *window = NULL;
    moea2a_result_t r = (moea2a_result_t)t->ops->mem_alloc(t->tc, bytes, &ptr);
    r = m2a_moe_agree(comm, r, NULL); /* registration is collective: all allocated, or none goes on */
    if (r == MOEA2A_SUCCESS) r = (moea2a_result_t)t->ops->mem_register(t->tc, ptr, bytes, peers, &window);
    r = m2a_moe_agree(comm, r, NULL);
    if (r != MOEA2A_SUCCESS) {
        if (window) t->ops->mem_deregister(t->tc, window);
        if (ptr) t->ops->mem_free(t->tc, ptr);
        return r;
    }
    s->ptr = ptr, s->state = window;
    s->gpu_ranks = 1; /* NCCL refuses two ranks on one GPU */
    return MOEA2A_SUCCESS;
}

static void release(moea2a_comm_t comm, m2a_symm_t *s, int healthy)
{
    m2a_transport_t *t = m2a_symm_cuda_transport(comm);
    if (healthy) t->ops->mem_deregister(t->tc, s->state); /* collective */
    t->ops->mem_free(t->tc, s->ptr);
}

const m2a_symm_way_t m2a_symm_transport = {
    .name = "transport", .usable = usable, .open = open_window, .release = release,
};

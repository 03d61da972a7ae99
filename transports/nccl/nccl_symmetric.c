/* Symmetric memory for moea2a's load/store path: ncclMemAlloc'ed buffers registered
 * as NCCL windows (collective), whose peers' addresses the kernels use directly.
 * Reachability comes from NCCL's device communicator: the path is available when
 * its load/store (LSA) team holds every rank. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>

#include "moea2a.h"
#include "nccl_internal.h"

typedef struct {
    ncclWindow_t win;
} nccl_window_t;

int m2a_nccl_mem_alloc(void *tcomm, size_t bytes, void **ptr)
{
    nccl_comm_t *c = tcomm;
    ncclResult_t rc = ncclMemAlloc(ptr, bytes);
    if (rc != ncclSuccess)
        return fail(c, MOEA2A_ERR_NO_MEMORY, "nccl: ncclMemAlloc(%zu bytes): %s", bytes, ncclGetErrorString(rc));
    return MOEA2A_SUCCESS;
}

void m2a_nccl_mem_free(void *tcomm, void *ptr)
{
    (void)tcomm;
    if (ptr) ncclMemFree(ptr);
}

/* Creates the device communicator once and learns whether every rank is in its
 * load/store team. Collective. */
static int probe_lsa(nccl_comm_t *c)
{
    if (c->lsa) return MOEA2A_SUCCESS;
    int r = m2a_nccl_settle(c, m2a_nccl_devcomm_create(c->nc, &c->devcomm), "ncclDevCommCreate");
    if (r != MOEA2A_SUCCESS) {
        free(c->devcomm);
        c->devcomm = NULL;
        c->lsa = -1;
        return c->failed ? r : MOEA2A_SUCCESS; /* no symmetric memory support: not load/store */
    }
    c->lsa = m2a_nccl_devcomm_lsa_size(c->devcomm) == c->nranks ? 1 : -1;
    return MOEA2A_SUCCESS;
}

static int lsa_reachable_locked(void *tcomm, int *reachable)
{
    nccl_comm_t *c = tcomm;
    if (c->failed) return fail(c, MOEA2A_ERR_ABORTED, "nccl: the communicator was aborted after an earlier failure");
    int team = m2a_nccl_lsa_team_size(c->nc);
    *reachable = team == c->nranks;
    if (!*reachable) {
        c->lsa = -1;
    }
    return MOEA2A_SUCCESS;
}

static int register_locked(void *tcomm, void *ptr, size_t bytes, void **peers, void **handle)
{
    nccl_comm_t *c = tcomm;
    *handle = NULL;
    if (c->failed) return fail(c, MOEA2A_ERR_ABORTED, "nccl: the communicator was aborted after an earlier failure");
    int r = probe_lsa(c);
    if (r != MOEA2A_SUCCESS) return r;
    if (c->lsa < 0)
        return fail(c, MOEA2A_ERR_UNAVAILABLE, "nccl: not every rank is reachable by load/store (NCCL's LSA team of "
                                               "the device communicator does not hold all %d ranks)", c->nranks);
    nccl_window_t *w = calloc(1, sizeof(*w));
    void **d_peers = NULL;
    if (!w) return MOEA2A_ERR_NO_MEMORY;
    r = m2a_nccl_settle(c, ncclCommWindowRegister(c->nc, ptr, bytes, &w->win, NCCL_WIN_COLL_SYMMETRIC),
                        "ncclCommWindowRegister");
    if (r != MOEA2A_SUCCESS) {
        free(w);
        return r;
    }
    cudaError_t e = cudaMalloc((void **)&d_peers, sizeof(void *) * (size_t)c->nranks);
    if (e == cudaSuccess) e = (cudaError_t)m2a_nccl_window_peers(w->win, c->nranks, d_peers);
    if (e == cudaSuccess) e = cudaMemcpy(peers, d_peers, sizeof(void *) * (size_t)c->nranks, cudaMemcpyDeviceToHost);
    if (d_peers) cudaFree(d_peers);
    *handle = w;
    c->windows++;
    if (e != cudaSuccess)
        return fail(c, MOEA2A_ERR_CUDA, "nccl: peer addresses of a window: %s", cudaGetErrorString(e));
    return MOEA2A_SUCCESS;
}

void m2a_nccl_mem_deregister(void *tcomm, void *handle)
{
    nccl_comm_t *c = tcomm;
    nccl_window_t *w = handle;
    if (!w) return;
    m2a_nccl_lock(c);
    c->windows--;
    if (!c->failed) m2a_nccl_settle(c, ncclCommWindowDeregister(c->nc, w->win), "ncclCommWindowDeregister");
    m2a_nccl_unlock(c);
    free(w);
}

/* The entries on nc, under the communicator's lock (nccl_guard.c). */
int m2a_nccl_lsa_reachable(void *tcomm, int *reachable)
{
    M2A_NCCL_LOCKED(tcomm, lsa_reachable_locked(tcomm, reachable));
}

int m2a_nccl_mem_register(void *tcomm, void *ptr, size_t bytes, void **peers, void **handle)
{
    M2A_NCCL_LOCKED(tcomm, register_locked(tcomm, ptr, bytes, peers, handle));
}

void m2a_nccl_sym_finalize(nccl_comm_t *c)
{
    if (c->devcomm) m2a_nccl_devcomm_destroy(c->nc, c->devcomm);
    c->devcomm = NULL;
}

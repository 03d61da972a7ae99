/* Symmetric memory for the load/store path: one allocation per rank, every rank's
 * reachable by this GPU's loads and stores. The ways to get it, one table:
 *   transport  the CUDA transport's symmetric memory (NCCL: ncclMemAlloc and a window
 *              registered on its device communicator), where its load/store team
 *              holds every rank (moe_symmetric_transport.c)
 *   cuda_ipc   cudaMalloc, with CUDA IPC handles exchanged over the bootstrap: every
 *              rank on one host, GPUs that reach each other (or the same GPU, shared
 *              by ranks in one process or several) (lib/moe/backend/symmetric_ipc.c)
 * MOEA2A_SYMMETRIC_MEMORY picks one; auto takes the transport's where there is a CUDA
 * transport with symmetric memory, else CUDA IPC. A new way is a new file and a line
 * in the table (moe_symmetric.c). */
#ifndef M2A_MOE_SYMMETRIC_H
#define M2A_MOE_SYMMETRIC_H
#include <stddef.h>

#include "comm/comm.h"
#include "moea2a.h"

typedef struct m2a_symm_way m2a_symm_way_t;

typedef struct {
    const m2a_symm_way_t *way;
    void *ptr;     /* this rank's allocation */
    void *state;   /* the way's */
    int gpu_ranks; /* ranks of the communicator on this rank's GPU, this one included */
} m2a_symm_t;

struct m2a_symm_way {
    const char *name;
    /* Local: 1 when this way can serve the communicator as far as this rank sees (the
     * caller agrees on it across ranks); 0 with the reason in why, untouched otherwise. */
    int (*usable)(moea2a_comm_t comm, char *why, size_t len);
    /* Collective: bytes on every rank; fills s->ptr, s->state, s->gpu_ranks and
     * peers[r], the address at which this GPU reaches rank r's allocation. Every rank
     * gets the same result; on failure nothing is left allocated. */
    moea2a_result_t (*open)(moea2a_comm_t comm, size_t bytes, void **peers, m2a_symm_t *s);
    /* Local, once this rank's kernels have ended: drops this rank's view of its peers'
     * allocations (NULL: nothing to drop). */
    void (*unmap)(moea2a_comm_t comm, m2a_symm_t *s);
    /* After every rank's unmap where healthy (the ranks met), else at once: frees this
     * rank's allocation (collective where healthy, for ways that register). */
    void (*release)(moea2a_comm_t comm, m2a_symm_t *s, int healthy);
};

extern const m2a_symm_way_t m2a_symm_transport, m2a_symm_cuda_ipc;

/* The communicator's CUDA transport where it has symmetric memory (NCCL), else NULL:
 * the transport way's, and what auto looks for. */
m2a_transport_t *m2a_symm_cuda_transport(moea2a_comm_t comm);

/* Local: 1 when the way MOEA2A_SYMMETRIC_MEMORY chooses can serve the communicator as
 * far as this rank sees; 0 with the reason in why. Planning asks this before it picks
 * the load/store path, so that sizing, create and every mode follow one rule. */
int m2a_symm_usable(moea2a_comm_t comm, char *why, size_t len);

/* Collective: the workspace of bytes as symmetric memory, by the way every rank chose
 * (status: this rank's result so far; a failure anywhere fails every rank:
 * MOEA2A_ERR_UNAVAILABLE where the way cannot serve every rank, MOEA2A_ERR_MISMATCH
 * where the ranks chose different ways). The current CUDA device must be the
 * communicator's. */
moea2a_result_t m2a_symm_open(moea2a_comm_t comm, moea2a_result_t status, size_t bytes, void **peers, m2a_symm_t *s);
/* Collective where the communicator is healthy and peers_alive (0: a peer is known
 * dead or out of step, so nobody waits for it): every rank's kernels must have ended. */
void m2a_symm_close(moea2a_comm_t comm, m2a_symm_t *s, int peers_alive);
#endif

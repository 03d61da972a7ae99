/* What the NCCL transport's files share: the communicator and its bounded wait. */
#ifndef M2A_NCCL_INTERNAL_H
#define M2A_NCCL_INTERNAL_H
#include <nccl.h>
#include <pthread.h>

#include "moea2a_transport_v3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const moea2a_core_v1_t *core;
    ncclComm_t nc; /* NULL once aborted */
    int owned;  /* created here (else the caller's, never destroyed here) */
    int failed;  /* aborted after a timeout or error, or revoked */
    int revoked; /* revoked (m2a_nccl_end, m2a_nccl_abort_once): nc still holds its memory */
    int rank, nranks;
    /* the core's word of a dead peer (rank + 1; moea2a_transport_v3_t.watch), NULL: none
     * (or a shrink under way, which expects the dead) */
    const volatile int32_t *dead;
    int windows; /* symmetric windows registered (load/store kernels may run on them) */
    /* the guard (nccl_guard.c): its thread, and the lock every operation on nc holds */
    pthread_mutex_t lock;
    pthread_t guard;
    int guarded, guard_stop;
    /* symmetric memory (nccl_symmetric.c): the device communicator, made on first use */
    int lsa;     /* 0 not probed, 1 every rank load/store reachable, -1 not */
    void *devcomm; /* ncclDevComm_t */
} nccl_comm_t;

#define fail(c, result, ...) moea2a_core_fail((c)->core, (result), __VA_ARGS__)

/* Waits until NCCL finished what it was doing on c (ncclInProgress), bounded by the
 * core's timeout; on expiry aborts the communicator. */
int m2a_nccl_settle(nccl_comm_t *c, ncclResult_t rc, const char *what);
/* Aborts the NCCL communicator once (it is gone afterwards; a caller's is revoked
 * instead where NCCL can) and marks c failed. */
void m2a_nccl_abort_once(nccl_comm_t *c);
/* Ends the communicator's work after a failure: revoked where symmetric windows are
 * registered, else as m2a_nccl_abort_once (nccl_transport.c says why); marks c failed. */
void m2a_nccl_end(nccl_comm_t *c);

/* nccl_guard.c: c's lock (made by guard_init, recursive) and the thread that ends c on
 * the dead word's news (started by the watch, stopped before a shrink reads the parent
 * and at finalize). init returns 0, or -1 when the lock cannot be made. */
int m2a_nccl_guard_init(nccl_comm_t *c);
int m2a_nccl_guard_start(nccl_comm_t *c);
void m2a_nccl_guard_stop(nccl_comm_t *c);
void m2a_nccl_guard_fini(nccl_comm_t *c);
void m2a_nccl_lock(nccl_comm_t *c);
void m2a_nccl_unlock(nccl_comm_t *c);
/* The body of a table entry on nc: returns call's result, made under tcomm's lock. */
#define M2A_NCCL_LOCKED(tcomm, call)   \
    do {                               \
        m2a_nccl_lock(tcomm);          \
        const int r_ = (call);         \
        m2a_nccl_unlock(tcomm);        \
        return r_;                     \
    } while (0)

/* nccl_symmetric.c */
int m2a_nccl_mem_alloc(void *tcomm, size_t bytes, void **ptr);
void m2a_nccl_mem_free(void *tcomm, void *ptr);
int m2a_nccl_mem_register(void *tcomm, void *ptr, size_t bytes, void **peers, void **handle);
void m2a_nccl_mem_deregister(void *tcomm, void *handle);
void m2a_nccl_sym_finalize(nccl_comm_t *c);
int m2a_nccl_lsa_reachable(void *tcomm, int *reachable);

/* nccl_device_api.cu: the parts that need NCCL's device API (C++). */
/* Starts creating a device communicator with no extra resources (collective; may
 * return ncclInProgress on a non-blocking communicator: settle it, then read). */
ncclResult_t m2a_nccl_devcomm_create(ncclComm_t nc, void **devcomm);
/* The size of NCCL's load/store team of nc, from the host, before any device
 * communicator exists. */
int m2a_nccl_lsa_team_size(ncclComm_t nc);
/* The load/store team of a created device communicator: its size. */
int m2a_nccl_devcomm_lsa_size(const void *devcomm);
void m2a_nccl_devcomm_destroy(ncclComm_t nc, void *devcomm);
/* d_peers[r] = the window's load/store address of rank r (a device array of nranks
 * pointers), through ncclGetPeerPointer on the device. Returns a cudaError_t. */
int m2a_nccl_window_peers(ncclWindow_t win, int nranks, void **d_peers);

#ifdef __cplusplus
}
#endif
#endif

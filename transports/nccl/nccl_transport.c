/* NCCL transport: collectives on CUDA memory, ordered on the caller's stream.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0) so that every wait
 * inside NCCL calls is a loop here, bounded by the moea2a timeout; on expiry the
 * NCCL communicator is aborted, which also releases kernels stuck on a dead peer.
 * It is created through the moea2a bootstrap (rank 0's ncclUniqueId is its address
 * blob), or adopted from the caller (moea2a_comm_init_nccl). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moea2a.h"
#include "moea2a_transport_v3.h"
#include "nccl_internal.h"

/* Revokes c's NCCL communicator where NCCL can (2.28 and later): every later operation
 * on it fails, its memory stays mapped and the handle valid. 1 when revoked. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#pragma weak ncclCommRevoke
#endif
static int revoke_once(nccl_comm_t *c)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    if (ncclCommRevoke && c->nc && !c->failed) {
        const ncclResult_t rc = ncclCommRevoke(c->nc, NCCL_REVOKE_DEFAULT);
        if (rc == ncclSuccess || rc == ncclInProgress) {
            c->failed = c->revoked = 1;
            return 1;
        }
    }
#endif
    return 0;
}

/* Aborts c's NCCL communicator once: ncclCommAbort frees it, so a second abort (at
 * finalize, after a timeout had aborted it) would touch freed memory. A caller's
 * communicator (moea2a_comm_init_nccl) is revoked instead where NCCL can: never freed
 * here, as the caller still holds it; it aborts it after destroying the moea2a one. */
void m2a_nccl_abort_once(nccl_comm_t *c)
{
    if (!c->owned && revoke_once(c)) return;
    if (c->nc) ncclCommAbort(c->nc);
    c->nc = NULL;
    c->failed = 1;
}

/* Waits until NCCL finished what it was doing on c (ncclInProgress), bounded by the
 * timeout, and ended at once when the core's peer watcher names a dead rank: NCCL's
 * work waits on every peer, so it would never finish. Then, as at the timeout, the
 * communicator is ended by m2a_nccl_end. */
int m2a_nccl_settle(nccl_comm_t *c, ncclResult_t rc, const char *what)
{
    double deadline = moea2a_transport_now() + c->core->timeout_s;
    while (rc == ncclSuccess || rc == ncclInProgress) {
        const int32_t dead = c->dead ? __atomic_load_n(c->dead, __ATOMIC_ACQUIRE) : 0;
        if (dead && !c->failed) {
            m2a_nccl_end(c);
            return fail(c, MOEA2A_ERR_PEER_FAILED, "nccl: %s: rank %d is gone (the peer watcher saw it); the NCCL "
                        "communicator is %s", what, dead - 1, c->revoked ? "revoked" : "aborted");
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c->nc, &st) != ncclSuccess) break;
        if (st == ncclSuccess) return MOEA2A_SUCCESS;
        if (st != ncclInProgress) {
            rc = st;
            break;
        }
        if (moea2a_transport_now() > deadline) {
            m2a_nccl_abort_once(c);
            return fail(c, MOEA2A_ERR_TIMEOUT, "nccl: %s did not complete within %.1f s (MOEA2A_TIMEOUT_S); a peer may have died",
                        what, c->core->timeout_s);
        }
        sched_yield();
    }
    const char *last = c->nc ? ncclGetLastError(c->nc) : NULL;
    return fail(c, rc == ncclRemoteError ? MOEA2A_ERR_PEER_FAILED : MOEA2A_ERR_TRANSPORT, "nccl: %s: %s%s%s", what,
                ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

static int select_device(const moea2a_core_v1_t *core, nccl_comm_t *c)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        return fail(c, MOEA2A_ERR_UNAVAILABLE, "nccl: no CUDA device (%s)", cudaGetErrorString(e));
    }
    if (core->cuda_device >= 0 && (e = cudaSetDevice(core->cuda_device)) != cudaSuccess)
        return fail(c, MOEA2A_ERR_CUDA, "nccl: cudaSetDevice(%d): %s", core->cuda_device, cudaGetErrorString(e));
    return MOEA2A_SUCCESS;
}

/* A communicator's state, its lock made (nccl_guard.c); NULL when out of memory. */
static nccl_comm_t *comm_new(const moea2a_core_v1_t *core)
{
    nccl_comm_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    if (m2a_nccl_guard_init(c)) {
        free(c);
        return NULL;
    }
    c->core = core, c->rank = core->rank, c->nranks = core->nranks;
    return c;
}

static int nccl_init_local(const moea2a_core_v1_t *core, void **tcomm, void **addr, size_t *addr_len,
                           unsigned *mem_types)
{
    nccl_comm_t *c = comm_new(core);
    if (!c) return MOEA2A_ERR_NO_MEMORY;
    *tcomm = c;
    *mem_types = MOEA2A_MEM_CUDA;
    int r = select_device(core, c);
    if (r != MOEA2A_SUCCESS) return r;
    if (core->external_comm) { /* adopted: nothing to exchange */
        c->nc = (ncclComm_t)core->external_comm;
        *addr = NULL, *addr_len = 0;
        return MOEA2A_SUCCESS;
    }
    /* Rank 0's unique id is the one address every rank needs; the others send none. */
    *addr_len = core->rank == 0 ? sizeof(ncclUniqueId) : 0;
    *addr = malloc(sizeof(ncclUniqueId));
    if (!*addr) return MOEA2A_ERR_NO_MEMORY;
    ncclResult_t rc = core->rank == 0 ? ncclGetUniqueId((ncclUniqueId *)*addr) : ncclSuccess;
    if (rc != ncclSuccess) return fail(c, MOEA2A_ERR_TRANSPORT, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(rc));
    return MOEA2A_SUCCESS;
}

static int nccl_connect(void *tcomm, const void *const *addrs, const size_t *lens)
{
    nccl_comm_t *c = tcomm;
    if (c->nc) return MOEA2A_SUCCESS; /* adopted */
    if (lens[0] != sizeof(ncclUniqueId)) return fail(c, MOEA2A_ERR_TRANSPORT, "nccl: rank 0 sent no unique id");
    ncclUniqueId id;
    memcpy(&id, addrs[0], sizeof(id));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&c->nc, c->nranks, id, c->rank, &cfg);
    c->owned = 1;
    return m2a_nccl_settle(c, rc, "ncclCommInitRankConfig");
}

static void nccl_finalize(void *tcomm, int force)
{
    nccl_comm_t *c = tcomm;
    m2a_nccl_guard_stop(c); /* nothing ends c from aside any more */
    if (c->nc && !force && !c->failed) m2a_nccl_sym_finalize(c); /* the device communicator, if made */
    if (c->nc && c->owned) {
        /* Healthy: finalize (flushes outstanding work), wait for it within the timeout,
         * destroy. Broken, forced, or not settling in time: abort. */
        ncclResult_t st = ncclInternalError;
        if (!force && !c->failed) {
            double deadline = moea2a_transport_now() + c->core->timeout_s;
            st = ncclCommFinalize(c->nc);
            while (st == ncclSuccess || st == ncclInProgress) {
                if (ncclCommGetAsyncError(c->nc, &st) != ncclSuccess) st = ncclInternalError;
                if (st != ncclInProgress || moea2a_transport_now() > deadline) break;
                sched_yield();
            }
        }
        if (st == ncclSuccess) ncclCommDestroy(c->nc);
        else ncclCommAbort(c->nc);
    }
    m2a_nccl_guard_fini(c);
    free(c);
}

/* A shrink through ncclCommShrink (NCCL 2.27 and later): the survivors' communicator
 * made from the parent's, with no new unique id; with nobody left out (a shrink by
 * choice that keeps every rank), ncclCommSplit of one color, which ncclCommShrink
 * refuses to be. The symbols are weak, so that this module still loads with an older
 * libnccl.so at run time, where can_shrink then says no and the core makes a new
 * communicator. A parent revoked (m2a_nccl_end) is waited for until quiescent first. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#pragma weak ncclCommShrink
static int nccl_can_shrink(void *parent)
{
    const nccl_comm_t *p = parent;
    return ncclCommShrink != NULL && p->nc && (!p->failed || p->revoked);
}

static int nccl_shrink(void *parent, const moea2a_core_v1_t *core, const int *parent_rank, int dead, void **tcomm,
                       unsigned *mem_types)
{
    nccl_comm_t *p = parent, *c = comm_new(core);
    int *excl = malloc(sizeof(int) * (size_t)p->nranks), n = 0;
    if (!c || !excl) {
        if (c) m2a_nccl_guard_fini(c);
        free(c), free(excl);
        return MOEA2A_ERR_NO_MEMORY;
    }
    *tcomm = c;
    *mem_types = MOEA2A_MEM_CUDA;
    for (int q = 0, i = 0; q < p->nranks; q++) {
        if (i < c->nranks && parent_rank[i] == q) i++;
        else excl[n++] = q;
    }
    int r = select_device(core, c);
    m2a_nccl_guard_stop(p); /* the parent is the shrink's now */
    m2a_nccl_lock(p);
    p->dead = NULL; /* the shrink leaves the dead out: its waits are for the survivors */
    if (r == MOEA2A_SUCCESS && !nccl_can_shrink(p)) /* aborted since can_shrink said yes: made anew instead */
        r = fail(c, MOEA2A_ERR_TRANSPORT, "nccl: the parent communicator was aborted before its shrink");
    if (r == MOEA2A_SUCCESS && p->revoked) r = m2a_nccl_settle(p, ncclInProgress, "ncclCommRevoke");
    if (r == MOEA2A_SUCCESS) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        /* with ranks dead and the parent not revoked, what it has in flight is ended first */
        const int flags = dead && !p->revoked ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
        const char *what = n ? "ncclCommShrink" : "ncclCommSplit";
        ncclResult_t rc = n ? ncclCommShrink(p->nc, excl, n, &c->nc, &cfg, flags)
                            : ncclCommSplit(p->nc, 0, c->rank, &c->nc, &cfg);
        c->owned = 1;
        /* on a non-blocking parent the call is the parent's work in progress, which
         * writes the child's handle when it ends: the parent first, then the child */
        r = m2a_nccl_settle(p, rc, what);
        if (r == MOEA2A_SUCCESS)
            r = c->nc ? m2a_nccl_settle(c, ncclInProgress, what)
                      : fail(c, MOEA2A_ERR_TRANSPORT, "nccl: %s made no communicator", what);
        if (dead) p->failed = 1; /* its work was ended: released by abort, not finalize */
    }
    m2a_nccl_unlock(p);
    free(excl);
    return r;
}
#define NCCL_SHRINK_MEMBERS .can_shrink = nccl_can_shrink, .shrink = nccl_shrink,
#else
#define NCCL_SHRINK_MEMBERS
#endif

static int check_usable(nccl_comm_t *c)
{
    return c->failed ? fail(c, MOEA2A_ERR_ABORTED, "nccl: the communicator was aborted after an earlier failure")
                     : MOEA2A_SUCCESS;
}

static int nccl_alltoallv_locked(void *tcomm, const void *sbuf, const size_t *sc, const size_t *sd, void *rbuf,
                                 const size_t *rc, const size_t *rd, unsigned mem, void *stream, void **op)
{
    nccl_comm_t *c = tcomm;
    (void)mem;
    *op = NULL; /* stream-ordered: nothing left to progress */
    int r = check_usable(c);
    if (r) return r;
    cudaStream_t s = (cudaStream_t)stream;
    ncclResult_t res = ncclGroupStart();
    for (int p = 0; p < c->nranks && (res == ncclSuccess || res == ncclInProgress); p++) {
        if (sc[p]) res = ncclSend((const char *)sbuf + sd[p], sc[p], ncclUint8, p, c->nc, s);
        if (rc[p] && (res == ncclSuccess || res == ncclInProgress))
            res = ncclRecv((char *)rbuf + rd[p], rc[p], ncclUint8, p, c->nc, s);
    }
    ncclResult_t end = ncclGroupEnd();
    return m2a_nccl_settle(c, res == ncclSuccess || res == ncclInProgress ? end : res, "send/receive group");
}

static int nccl_allgather_locked(void *tcomm, const void *sbuf, void *rbuf, size_t bytes, unsigned mem, void *stream,
                                 void **op)
{
    nccl_comm_t *c = tcomm;
    (void)mem;
    *op = NULL;
    int r = check_usable(c);
    return r ? r : m2a_nccl_settle(c, ncclAllGather(sbuf, rbuf, bytes, ncclUint8, c->nc, (cudaStream_t)stream), "ncclAllGather");
}

static int nccl_bcast_locked(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **op)
{
    nccl_comm_t *c = tcomm;
    (void)mem;
    *op = NULL;
    int r = check_usable(c);
    return r ? r : m2a_nccl_settle(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->nc, (cudaStream_t)stream), "ncclBroadcast");
}

/* A barrier with no stream: a one-element all-reduce on a private stream, waited for
 * with the timeout. Only used when the communicator has no host transport. */
static int nccl_barrier_locked(void *tcomm, void **op)
{
    nccl_comm_t *c = tcomm;
    *op = NULL;
    int r = check_usable(c);
    if (r) return r;
    cudaStream_t s;
    int *buf;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return fail(c, MOEA2A_ERR_CUDA, "nccl barrier: stream");
    if (cudaMalloc((void **)&buf, sizeof(int)) != cudaSuccess) {
        cudaStreamDestroy(s);
        return fail(c, MOEA2A_ERR_NO_MEMORY, "nccl barrier: cudaMalloc");
    }
    r = m2a_nccl_settle(c, ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c->nc, s), "barrier");
    double deadline = moea2a_transport_now() + c->core->timeout_s;
    while (r == MOEA2A_SUCCESS && cudaStreamQuery(s) == cudaErrorNotReady) {
        if (moea2a_transport_now() > deadline) {
            m2a_nccl_abort_once(c);
            r = fail(c, MOEA2A_ERR_TIMEOUT, "nccl barrier: not every rank arrived within %.1f s", c->core->timeout_s);
        }
        sched_yield();
    }
    cudaFree(buf);
    cudaStreamDestroy(s);
    return r;
}

static int nccl_test(void *tcomm, void *op, int *done)
{
    (void)tcomm, (void)op;
    *done = 1;
    return MOEA2A_SUCCESS;
}

static void nccl_describe(void *tcomm, void *op, char *buf, size_t len)
{
    (void)tcomm, (void)op;
    snprintf(buf, len, "the NCCL group (stream-ordered)");
}

static void nccl_op_free(void *tcomm, void *op) { (void)tcomm, (void)op; }

/* A group holds the communicator's lock from its start to its end, on the same thread:
 * the core calls group_end after every group_start, whatever either returns. */
static int nccl_group_start(void *tcomm)
{
    m2a_nccl_lock(tcomm);
    return ncclGroupStart() == ncclSuccess ? MOEA2A_SUCCESS : MOEA2A_ERR_TRANSPORT;
}

static int nccl_group_end(void *tcomm)
{
    const int r = m2a_nccl_settle(tcomm, ncclGroupEnd(), "group");
    m2a_nccl_unlock(tcomm);
    return r;
}

static int nccl_check_locked(void *tcomm)
{
    nccl_comm_t *c = tcomm;
    ncclResult_t st = ncclSuccess;
    if (c->failed) return check_usable(c);
    if (ncclCommGetAsyncError(c->nc, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress))
        return m2a_nccl_settle(c, st, "earlier stream work");
    return MOEA2A_SUCCESS;
}

/* Aborted: ncclCommAbort ends NCCL's kernels, those of a send or receive stuck on a
 * dead peer included, and frees the communicator. Where symmetric windows are
 * registered and NCCL can (2.28 and later) it is revoked instead: every later NCCL
 * operation fails but the memory stays mapped, so that a load/store kernel still
 * running on a window (it ends by itself once it sees the dead peer) never touches
 * unmapped memory, and the communicator can still be shrunk; it is aborted at
 * finalize. A revoke alone does not end a network send or receive waiting on the dead
 * rank, hence the abort everywhere else (but of a caller's communicator, which
 * m2a_nccl_abort_once revokes: the caller's own abort ends its kernels). */
void m2a_nccl_end(nccl_comm_t *c)
{
    if (!(c->windows && revoke_once(c))) m2a_nccl_abort_once(c);
}

static void nccl_abort(void *tcomm)
{
    m2a_nccl_lock(tcomm);
    m2a_nccl_end(tcomm);
    m2a_nccl_unlock(tcomm);
}

/* The operations on nc under the communicator's lock (nccl_guard.c). */
static int nccl_alltoallv(void *tcomm, const void *sbuf, const size_t *sc, const size_t *sd, void *rbuf,
                          const size_t *rc, const size_t *rd, unsigned mem, void *stream, void **op)
{
    M2A_NCCL_LOCKED(tcomm, nccl_alltoallv_locked(tcomm, sbuf, sc, sd, rbuf, rc, rd, mem, stream, op));
}

static int nccl_allgather(void *tcomm, const void *sbuf, void *rbuf, size_t bytes, unsigned mem, void *stream, void **op)
{
    M2A_NCCL_LOCKED(tcomm, nccl_allgather_locked(tcomm, sbuf, rbuf, bytes, mem, stream, op));
}

static int nccl_bcast(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **op)
{
    M2A_NCCL_LOCKED(tcomm, nccl_bcast_locked(tcomm, buf, bytes, root, mem, stream, op));
}

static int nccl_barrier(void *tcomm, void **op) { M2A_NCCL_LOCKED(tcomm, nccl_barrier_locked(tcomm, op)); }

static int nccl_check(void *tcomm) { M2A_NCCL_LOCKED(tcomm, nccl_check_locked(tcomm)); }

static int nccl_external_rank(void *external, int *rank, int *nranks)
{
    ncclComm_t nc = (ncclComm_t)external;
    return ncclCommUserRank(nc, rank) == ncclSuccess && ncclCommCount(nc, nranks) == ncclSuccess
               ? MOEA2A_SUCCESS
               : MOEA2A_ERR_INVALID_ARGUMENT;
}

/* Broadcast over a caller's NCCL communicator, before moea2a has one: the bytes go
 * through a scratch device buffer on a private stream, waited for with the timeout. */
static int nccl_external_bcast(void *external, void *buf, size_t bytes, int root, double timeout_s)
{
    ncclComm_t nc = (ncclComm_t)external;
    int dev;
    if (ncclCommCuDevice(nc, &dev) != ncclSuccess || cudaSetDevice(dev) != cudaSuccess) return MOEA2A_ERR_CUDA;
    cudaStream_t s;
    void *d = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return MOEA2A_ERR_CUDA;
    int r = MOEA2A_SUCCESS;
    if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, s) != cudaSuccess)
        r = MOEA2A_ERR_CUDA;
    ncclResult_t nr = r ? ncclSuccess : ncclBroadcast(d, d, bytes, ncclUint8, root, nc, s);
    if (nr != ncclSuccess && nr != ncclInProgress) r = MOEA2A_ERR_TRANSPORT;
    if (!r && cudaMemcpyAsync(buf, d, bytes, cudaMemcpyDeviceToHost, s) != cudaSuccess) r = MOEA2A_ERR_CUDA;
    double deadline = moea2a_transport_now() + timeout_s;
    while (!r && cudaStreamQuery(s) == cudaErrorNotReady) {
        if (moea2a_transport_now() > deadline) r = MOEA2A_ERR_TIMEOUT;
        sched_yield();
    }
    if (r != MOEA2A_ERR_TIMEOUT) { /* a stream stuck in NCCL must not be freed under it */
        cudaFree(d);
        cudaStreamDestroy(s);
    }
    return r;
}

/* The dead word for the bounded waits, and the guard that ends c on its news while no
 * call runs (without a thread, the waits alone read it). */
static void nccl_watch(void *tcomm, const volatile int32_t *dead)
{
    nccl_comm_t *c = tcomm;
    __atomic_store_n(&c->dead, dead, __ATOMIC_RELEASE);
    if (dead) (void)m2a_nccl_guard_start(c);
}

__attribute__((visibility("default"))) const moea2a_transport_v3_t moea2a_transport_v3 = {
    .v2 = {
        .v1 = {
            .name = "nccl", .abi_version = MOEA2A_TRANSPORT_V3_ABI_VERSION,
            /* setup */
            .init_local = nccl_init_local, .connect = nccl_connect, .finalize = nccl_finalize,
            /* collectives, and the operations they return */
            .alltoallv = nccl_alltoallv, .allgather = nccl_allgather, .bcast = nccl_bcast, .barrier = nccl_barrier,
            .test = nccl_test, .describe = nccl_describe, .op_free = nccl_op_free,
            /* grouped sends and receives; asynchronous errors and abort */
            .group_start = nccl_group_start, .group_end = nccl_group_end, .check = nccl_check, .abort = nccl_abort,
            /* a communicator of an external launcher (torch.distributed's NCCL) */
            .external_rank = nccl_external_rank, .external_bcast = nccl_external_bcast,
            /* symmetric memory: windows every rank maps */
            .mem_alloc = m2a_nccl_mem_alloc, .mem_free = m2a_nccl_mem_free, .mem_register = m2a_nccl_mem_register,
            .mem_deregister = m2a_nccl_mem_deregister, .lsa_reachable = m2a_nccl_lsa_reachable,
        },
        /* the survivors' communicator from the parent's (ncclCommShrink) */
        NCCL_SHRINK_MEMBERS
    },
    /* the peer watcher's news for the bounded waits */
    .watch = nccl_watch,
};

/* The interface between the moea2a core and a transport module, version 1: everything
 * a transport includes of moea2a besides moea2a.h.
 *
 * A module (libmoea2a-<name>.so) exports one symbol, MOEA2A_TRANSPORT_SYMBOL, of type
 * moea2a_transport_v1_t. The core calls init_local, exchanges the returned address
 * blobs over its bootstrap, then calls connect: modules never talk to the bootstrap
 * themselves, so a rank whose module fails cannot leave the others hanging.
 * Collectives are non-blocking: start returns an op, test progresses it; the core
 * owns timeouts. Counts are in bytes. Results are moea2a_result_t values; details go
 * through core->error so moea2a_last_error() shows them.
 *
 * The struct is fixed: any change, an appended member included, makes
 * moea2a_transport_v2_t with a symbol and ABI version of its own, and the core may keep
 * loading v1 modules beside it. man moea2a_transport documents every member.
 */
#ifndef MOEA2A_TRANSPORT_V1_H
#define MOEA2A_TRANSPORT_V1_H
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#define MOEA2A_TRANSPORT_ABI_VERSION 1
#define MOEA2A_TRANSPORT_SYMBOL "moea2a_transport_v1"

enum { MOEA2A_MEM_HOST = 1u << 0, MOEA2A_MEM_CUDA = 1u << 1 };

/* Monotonic seconds, the clock of the core's deadlines: a module that bounds a wait of
 * its own (core->timeout_s) measures it on this clock. */
static inline double moea2a_transport_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What the core offers a module. */
typedef struct {
    int rank, nranks;
    double timeout_s;
    int cuda_device;
    void *ctx; /* pass back to the callbacks */
    /* Records a detailed message for moea2a_last_error and returns result. */
    int (*error)(void *ctx, int result, const char *fmt, va_list ap);
    void (*log)(int level, const char *fmt, va_list ap); /* level: 1 WARN, 2 INFO, 3 TRACE */
    void *external_comm; /* a caller's communicator to adopt (e.g. an ncclComm_t), or NULL */
} moea2a_core_v1_t;

/* For modules: records a detailed message through the core and returns result. */
static inline int moea2a_core_fail(const moea2a_core_v1_t *core, int result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int moea2a_core_fail(const moea2a_core_v1_t *core, int result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = core->error(core->ctx, result, fmt, ap);
    va_end(ap);
    return r;
}

typedef struct moea2a_transport_v1 {
    const char *name;
    int abi_version; /* MOEA2A_TRANSPORT_ABI_VERSION */

    /* Local setup, no communication. *addr (malloc'ed by the module, freed by the
     * core) is what every peer needs to reach this rank; *mem_types the memory it
     * can move. */
    int (*init_local)(const moea2a_core_v1_t *core, void **tcomm, void **addr, size_t *addr_len,
                      unsigned *mem_types);
    /* addrs[r] / lens[r]: every rank's blob (including this rank's). */
    int (*connect)(void *tcomm, const void *const *addrs, const size_t *lens);
    /* force != 0: peers may be dead; release without waiting for them. */
    void (*finalize)(void *tcomm, int force);

    int (*alltoallv)(void *tcomm, const void *sbuf, const size_t *scounts, const size_t *sdispls,
                     void *rbuf, const size_t *rcounts, const size_t *rdispls, unsigned mem,
                     void *stream, void **op);
    int (*allgather)(void *tcomm, const void *sbuf, void *rbuf, size_t bytes, unsigned mem,
                     void *stream, void **op);
    int (*bcast)(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **op);
    int (*barrier)(void *tcomm, void **op);

    /* Progresses op: *done = 1 when finished. A non-success result ends op too. */
    int (*test)(void *tcomm, void *op, int *done);
    /* Writes which peers op still waits for ("ranks 2,3") for timeout messages. */
    void (*describe)(void *tcomm, void *op, char *buf, size_t len);
    /* Frees op; one that did not finish is cancelled. */
    void (*op_free)(void *tcomm, void *op);

    /* Optional, NULL when absent. */
    /* Operations between group_start and group_end are issued together (NCCL groups);
     * the core calls group_end after every group_start, from the same thread, whatever
     * group_start returned. */
    int (*group_start)(void *tcomm);
    int (*group_end)(void *tcomm);
    /* Reports an asynchronous failure of earlier stream-ordered work (a dead peer). */
    int (*check)(void *tcomm);
    /* Stops everything in flight at once (e.g. device work stuck on a dead peer);
     * afterwards every operation fails. */
    void (*abort)(void *tcomm);
    /* Before any moea2a communicator exists, on a caller's communicator `external`:
     * this process's rank and size, and a broadcast of bytes from root. */
    int (*external_rank)(void *external, int *rank, int *nranks);
    int (*external_bcast)(void *external, void *buf, size_t bytes, int root, double timeout_s);

    /* Symmetric memory for the load/store path (optional). mem_alloc and mem_free are
     * local; mem_register and mem_deregister are collective, every rank passing the
     * same size, and the core calls mem_register only once every rank's mem_alloc
     * succeeded. mem_register fills peers[r] (nranks entries) with the device address
     * at which this GPU's kernels load from and store to rank r's allocation, or
     * returns MOEA2A_ERR_UNAVAILABLE when some rank is not reachable by load/store
     * (every rank gets the same answer). */
    int (*mem_alloc)(void *tcomm, size_t bytes, void **ptr);
    void (*mem_free)(void *tcomm, void *ptr);
    int (*mem_register)(void *tcomm, void *ptr, size_t bytes, void **peers, void **handle);
    void (*mem_deregister)(void *tcomm, void *handle);
    /* Local, no communication, optional: *reachable = 1 when this rank reaches every
     * rank by load/store as the transport sees it (NCCL: its LSA team holds all
     * ranks). The core agrees on the answer across ranks before it calls
     * mem_register, so no rank starts a device communicator that would fail and
     * leave an error on the communicator the generic path then uses. */
    int (*lsa_reachable)(void *tcomm, int *reachable);
} moea2a_transport_v1_t;
#endif

/* The communicator (comm.c): the object the core's upper layers share, its entry
 * checks, and its out-of-band collectives over the bootstrap. */
#ifndef M2A_COMM_H
#define M2A_COMM_H
#include <stddef.h>

#include "base/error.h"
#include "comm/last_error.h"
#include "comm/nodemap.h"
#include "comm/transport.h"
#include "moea2a.h"
#include "moea2a_transport_v1.h"
#include "wireup/bootstrap.h"
#include "wireup/watch.h"

struct moea2a_comm {
    int rank, nranks;
    double timeout_s;
    int cuda_device;
    m2a_bootstrap_t *bs;
    m2a_watch_t *watch; /* peers' liveness (wireup/watch.h); NULL when MOEA2A_WATCH=0 or alone */
    char *spec;         /* the transport list it was made with (moea2a_comm_shrink makes the same) */
    /* Made by moea2a_comm_shrink of parent (compared, never dereferenced: parent may be
     * gone): parent_rank[q] is rank q's rank there (what a retarget derives a placement
     * from). NULL / NULL otherwise. */
    const struct moea2a_comm *parent;
    int *parent_rank;
    m2a_nodemap_t nodes; /* which ranks share a node */
    /* bytes handed to transports by all-to-all: [host, CUDA][same node, other nodes] */
    int64_t traffic[2][2];
    m2a_transport_t tr[M2A_MAX_TRANSPORTS];
    int ntr;
    moea2a_core_v1_t core;
    /* != MOEA2A_SUCCESS after a failure that leaves peers out of step (timeout,
     * dead peer, abort): every later call returns MOEA2A_ERR_ABORTED. */
    moea2a_result_t broken;
    int peer_lost; /* a failure here said a peer was gone (kept through a later abort) */
    /* a dead rank + 1 once the peer watcher saw one, for the transports' waits
     * (moea2a_transport_v3_t.watch) */
    volatile int32_t dead_word;
    char broken_why[M2A_ERRMSG_LEN]; /* the message of the failure that broke it */
    char last_error[M2A_ERRMSG_LEN];  /* moea2a_last_error(comm): last_error.c */
};

/* The first watched rank seen dead, or -1 (wireup/watch.h), and how it was seen. */
static inline int m2a_comm_dead_peer(moea2a_comm_t comm) { return m2a_watch_dead(comm->watch); }
/* Seconds since the watcher's news of the first death, or -1 (m2a_watch_dead_since). */
static inline double m2a_comm_dead_since(moea2a_comm_t comm) { return m2a_watch_dead_since(comm->watch); }
static inline void m2a_comm_dead_how(moea2a_comm_t comm, char *buf, size_t len) { m2a_watch_how(comm->watch, buf, len); }
/* *word gets the dead rank + 1 once the watcher sees a death (host memory the caller
 * keeps until m2a_comm_unwatch). */
static inline moea2a_result_t m2a_comm_watch(moea2a_comm_t comm, volatile int32_t *word)
{
    return m2a_comm_record(comm, m2a_watch_add(comm->watch, word));
}
static inline void m2a_comm_unwatch(moea2a_comm_t comm, volatile int32_t *word) { m2a_watch_remove(comm->watch, word); }
/* MOEA2A_ERR_PEER_FAILED naming the dead rank once the watcher saw a death (the
 * message recorded, nothing else done), else MOEA2A_SUCCESS. */
moea2a_result_t m2a_comm_peer_error(moea2a_comm_t comm, const char *fn);
/* The same, and the communicator broken (its transports
 * aborted, which ends device work stuck on that rank), once the watcher saw a death;
 * else MOEA2A_SUCCESS. fn names the call. */
moea2a_result_t m2a_comm_check_peers(moea2a_comm_t comm, const char *fn);

/* Entry check of every call on a communicator. A peer seen dead is not checked here:
 * a rank that stayed out of a collective would leave its neighbours in it waiting on a
 * live rank; the waits themselves consult the watcher. */
moea2a_result_t m2a_comm_check(moea2a_comm_t comm, const char *fn);
/* Marks comm broken when r means the peers may be out of step; returns r. */
moea2a_result_t m2a_comm_fail(moea2a_comm_t comm, moea2a_result_t r);

/* The bootstrap's collectives on this communicator's ranks, a failure recorded for it
 * (not for the communicator's health: callers decide what a failure means). */
static inline moea2a_result_t m2a_comm_allgather(moea2a_comm_t comm, void *data, size_t size)
{
    return m2a_comm_record(comm, m2a_bootstrap_allgather(comm->bs, data, size));
}
static inline moea2a_result_t m2a_comm_barrier(moea2a_comm_t comm)
{
    return m2a_comm_record(comm, m2a_bootstrap_barrier(comm->bs));
}
#endif

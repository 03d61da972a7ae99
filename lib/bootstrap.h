/* TCP bootstrap: the rendezvous behind moea2a_unique_id_t, then a ring of sockets
 * between the ranks for small out-of-band collectives (allgather, barrier) used at
 * init, by transports to exchange addresses, and by MoE argument checks. */
#ifndef M2A_BOOTSTRAP_H
#define M2A_BOOTSTRAP_H
#include <stdint.h>

#include "auth.h"
#include "moea2a.h"
#include "socket.h"

#define M2A_ID_MAGIC 0x6d6f65613261ULL /* "moea2a" */
#define M2A_HOST_LEN 64
#define M2A_ID_FROM_ENV 1u

/* What a moea2a_unique_id_t holds. */
typedef struct {
    uint64_t magic;
    uint64_t tag; /* random per id (public): names the rendezvous, so a stale id is told apart */
    uint32_t flags; /* M2A_ID_FROM_ENV: made by moea2a_comm_init_env, not by moea2a_get_unique_id */
    m2a_sockaddr_t root;
    uint8_t key[M2A_KEY_BYTES]; /* secret: proves a rank holds the id; never sent */
} m2a_id_t;

typedef struct {
    m2a_sockaddr_t addr;
    char host[M2A_HOST_LEN];
} m2a_peer_info_t;

typedef struct m2a_bootstrap {
    int rank, nranks;
    int listen_fd, next_fd, prev_fd;
    uint64_t tag;
    uint8_t key[M2A_KEY_BYTES];
    uint32_t seq;
    double timeout_s;
    m2a_peer_info_t *peers; /* [nranks]: address and host name of every rank */
} m2a_bootstrap_t;

/* rendezvous.c: starts the rendezvous service of id (a detached thread) listening
 * on id->root (port 0 picks one, written back). It admits ranks that prove they hold
 * id->key, and ends once every rank joined, or at the timeout. *in_use (may be NULL):
 * 1 when it failed because something already listens at that address. */
moea2a_result_t m2a_bootstrap_serve(m2a_id_t *id, double timeout_s, int *in_use);

/* The rendezvous messages, shared by the service and the joining ranks. */
typedef struct { /* rank -> root, after the root's challenge */
    uint64_t magic, tag;
    int32_t rank, nranks;
    uint8_t challenge[16]; /* the rank's, for the root's reply */
    m2a_peer_info_t self;
    uint8_t mac[M2A_MAC_BYTES];
} m2a_hello_t;

typedef struct { /* root -> rank; on success followed by nranks m2a_peer_info_t */
    int32_t result;
    int32_t nranks;
    char msg[512];
    uint8_t mac[M2A_MAC_BYTES]; /* over the reply before it and the peer table after it */
} m2a_reply_t;

/* The MAC of a reply (and its peer table, NULL when it has none) to hello h. */
void m2a_reply_mac(const uint8_t *key, const m2a_hello_t *h, const m2a_reply_t *rep, const m2a_peer_info_t *peers,
                   uint8_t out[M2A_MAC_BYTES]);
/* Joins the rendezvous of id as rank of nranks, then links the ring. */
moea2a_result_t m2a_bootstrap_join(moea2a_comm_t comm, const m2a_id_t *id, int rank, int nranks,
                                   double timeout_s, m2a_bootstrap_t **out);
/* data holds nranks blocks of size bytes; this rank's block is filled in. */
moea2a_result_t m2a_bootstrap_allgather(moea2a_comm_t comm, m2a_bootstrap_t *bs, void *data, size_t size);
moea2a_result_t m2a_bootstrap_barrier(moea2a_comm_t comm, m2a_bootstrap_t *bs);
void m2a_bootstrap_close(m2a_bootstrap_t *bs);
#endif

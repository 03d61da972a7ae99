/* TCP bootstrap: the rendezvous behind moea2a_unique_id_t, then a ring of sockets
 * between the ranks for small out-of-band collectives (allgather, barrier) used at
 * init, by transports to exchange addresses, and by MoE argument checks. */
#ifndef M2A_BOOTSTRAP_H
#define M2A_BOOTSTRAP_H
#include <netinet/in.h>
#include <stdint.h>

#include "moea2a.h"

#define M2A_ID_MAGIC 0x6d6f65613261ULL /* "moea2a" */
#define M2A_HOST_LEN 64

/* What a moea2a_unique_id_t holds. */
typedef struct {
    uint64_t magic;
    uint64_t nonce; /* random per id, so a stale or foreign connection is rejected */
    struct sockaddr_in root;
} m2a_id_t;

typedef struct {
    struct sockaddr_in addr;
    char host[M2A_HOST_LEN];
} m2a_peer_info_t;

typedef struct m2a_bootstrap {
    int rank, nranks;
    int listen_fd, next_fd, prev_fd;
    uint64_t nonce;
    uint32_t seq;
    double timeout_s;
    m2a_peer_info_t *peers; /* [nranks]: address and host name of every rank */
} m2a_bootstrap_t;

/* Starts a rendezvous service (a detached thread) listening on *root (port 0 picks
 * one) and fills id. The service ends once every rank joined, or at the timeout. */
moea2a_result_t m2a_bootstrap_serve(m2a_id_t *id, const struct sockaddr_in *root, uint64_t nonce,
                                    double timeout_s);
/* Joins the rendezvous of id as rank of nranks, then links the ring. */
moea2a_result_t m2a_bootstrap_join(moea2a_comm_t comm, const m2a_id_t *id, int rank, int nranks,
                                   double timeout_s, m2a_bootstrap_t **out);
/* data holds nranks blocks of size bytes; this rank's block is filled in. */
moea2a_result_t m2a_bootstrap_allgather(moea2a_comm_t comm, m2a_bootstrap_t *bs, void *data, size_t size);
moea2a_result_t m2a_bootstrap_barrier(moea2a_comm_t comm, m2a_bootstrap_t *bs);
void m2a_bootstrap_close(m2a_bootstrap_t *bs);
#endif

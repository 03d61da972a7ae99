/* TCP bootstrap (bootstrap.c): joining the rendezvous of an id (rendezvous.h), then a
 * ring of sockets between the ranks for small out-of-band collectives (allgather,
 * barrier), used at init, by transports to exchange addresses, and by MoE argument
 * checks. Failures are the thread's last error (base/error.h). */
#ifndef M2A_BOOTSTRAP_H
#define M2A_BOOTSTRAP_H
#include <stdint.h>

#include "moea2a.h"
#include "wireup/rendezvous.h"

/* A peer watcher's news of a death, as the bootstrap's waits read it: the first rank
 * seen dead, -1 while none (atomic loads), and when it was seen (m2a_now(), written
 * before dead): the grace of M2A_WATCH_GRACE_S counts from then, once per death, not
 * from each wait's first look. */
typedef struct m2a_death_news {
    int dead;
    double at;
} m2a_death_news_t;

typedef struct m2a_bootstrap {
    int rank, nranks;
    int listen_fd, next_fd, prev_fd;
    uint64_t tag;
    uint8_t key[M2A_KEY_BYTES];
    uint32_t seq;
    double timeout_s;
    m2a_peer_info_t *peers; /* [nranks]: address and host name of every rank */
    /* The peer watcher's news (wireup/watch.h m2a_watch_news), or NULL: a collective's
     * wait on a live neighbour ends once any rank died, which would not take part. */
    const struct m2a_death_news *news;
} m2a_bootstrap_t;

/* Joins the rendezvous of id as rank of nranks, then links the ring. */
moea2a_result_t m2a_bootstrap_join(const m2a_id_t *id, int rank, int nranks, double timeout_s, m2a_bootstrap_t **out);
/* The ring of the ranks alive[q] != 0 of old's ring (this rank among them), renumbered
 * in rank order, linked over the listeners they already have: no rendezvous. A rank
 * whose alive[] differs is refused at the handshake (the ring's tag hashes alive[]);
 * the others then time out naming it. */
moea2a_result_t m2a_bootstrap_shrink(const m2a_bootstrap_t *old, const unsigned char *alive, m2a_bootstrap_t **out);
/* data holds nranks blocks of size bytes; this rank's block is filled in. */
moea2a_result_t m2a_bootstrap_allgather(m2a_bootstrap_t *bs, void *data, size_t size);
moea2a_result_t m2a_bootstrap_barrier(m2a_bootstrap_t *bs);
void m2a_bootstrap_close(m2a_bootstrap_t *bs);
#endif

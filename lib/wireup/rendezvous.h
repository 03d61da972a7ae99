/* The rendezvous behind a unique id (rendezvous.c): what an id holds, the service a
 * thread of the process that made the id runs, and the messages between it and the
 * joining ranks (bootstrap.c joins). */
#ifndef M2A_RENDEZVOUS_H
#define M2A_RENDEZVOUS_H
#include <stdint.h>

#include "moea2a.h"
#include "wireup/auth.h"
#include "wireup/socket.h"

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

/* Where a rank listens for the ring, and its host name. */
typedef struct {
    m2a_sockaddr_t addr;
    char host[M2A_HOST_LEN];
} m2a_peer_info_t;

/* Starts the rendezvous service of id (a detached thread) listening on id->root (port
 * 0 picks one, written back). It admits ranks that prove they hold id->key, and ends
 * once every rank joined, or at the timeout. *in_use (may be NULL): 1 when it failed
 * because something already listens at that address. */
moea2a_result_t m2a_rendezvous_serve(m2a_id_t *id, double timeout_s, int *in_use);

/* The messages, shared by the service and the joining ranks. */
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
#endif

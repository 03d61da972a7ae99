#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "clock.h"
#include "error.h"
#include "handshake.h"
#include "log.h"
#include "socket.h"

/* rank -> next rank, when the ring is linked (after the next rank's challenge) */
typedef struct {
    uint64_t magic, tag;
    int32_t rank, pad;
    uint8_t mac[M2A_MAC_BYTES];
} ring_hello_t;

/* precedes every block of a bootstrap collective, to catch size or order mismatches */
typedef struct {
    uint32_t seq;
    uint32_t pad;
    uint64_t len;
} block_hdr_t;

/* ---- joining --------------------------------------------------------------------- */

static moea2a_result_t sock_error(moea2a_comm_t comm, m2a_sock_status_t st, const char *what, int peer)
{
    switch (st) {
    case M2A_SOCK_TIMEOUT:
        return m2a_error(comm, MOEA2A_ERR_TIMEOUT, "%s: timed out waiting for rank %d (MOEA2A_TIMEOUT_S)", what, peer);
    case M2A_SOCK_CLOSED:
        return m2a_error(comm, MOEA2A_ERR_PEER_FAILED, "%s: rank %d closed its connection (process exited?)", what, peer);
    default:
        return m2a_error(comm, MOEA2A_ERR_SYSTEM, "%s: socket error with rank %d: %s", what, peer, strerror(errno));
    }
}

static moea2a_result_t join_root(moea2a_comm_t comm, m2a_bootstrap_t *bs, const m2a_id_t *id, double deadline)
{
    char a[64], why[256];
    m2a_sock_format_addr(&id->root, a, sizeof(a));
    m2a_hello_t h = {.magic = M2A_ID_MAGIC, .tag = id->tag, .rank = bs->rank, .nranks = bs->nranks};
    h.self = bs->peers[bs->rank];
    M2A_TRY(m2a_random(h.challenge, sizeof(h.challenge)));
    m2a_handshake_t hs = {id->key, id->tag, "join", sizeof(h)};
    m2a_sock_status_t st;
    int fd = m2a_handshake_connect(&id->root, &hs, &h, deadline, &st, why, sizeof(why));
    if (fd < 0)
        return m2a_error(comm, st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_INVALID_ARGUMENT,
                         "rendezvous at %s: %s; is the unique id stale, or did the process that made it exit?", a, why);
    m2a_reply_t rep;
    uint8_t mac[M2A_MAC_BYTES];
    moea2a_result_t r = MOEA2A_SUCCESS;
    if ((st = m2a_sock_recv(fd, &rep, sizeof(rep), deadline + 5.0)) != M2A_SOCK_OK) {
        r = st == M2A_SOCK_TIMEOUT
                ? m2a_error(comm, MOEA2A_ERR_TIMEOUT, "rendezvous at %s timed out (not every rank joined)", a)
                : m2a_error(comm, MOEA2A_ERR_PEER_FAILED,
                            "rendezvous at %s: the root closed the connection before answering (did its process exit?)", a);
    } else if (rep.result == MOEA2A_SUCCESS && rep.nranks != bs->nranks) {
        r = m2a_error(comm, MOEA2A_ERR_MISMATCH, "rendezvous reported %d ranks, expected %d", rep.nranks, bs->nranks);
    } else if (rep.result == MOEA2A_SUCCESS &&
               (st = m2a_sock_recv(fd, bs->peers, sizeof(*bs->peers) * (size_t)bs->nranks, deadline + 5.0)) !=
                   M2A_SOCK_OK) {
        r = m2a_error(comm, st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_PEER_FAILED,
                      "rendezvous at %s: the peer table did not arrive (%s)", a,
                      st == M2A_SOCK_TIMEOUT ? "timed out" : "connection closed");
    }
    if (r == MOEA2A_SUCCESS) {
        m2a_reply_mac(id->key, &h, &rep, rep.result == MOEA2A_SUCCESS ? bs->peers : NULL, mac);
        if (!m2a_equal_ct(mac, rep.mac, sizeof(mac)))
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "rendezvous at %s: the answer failed authentication (a process without this id's key "
                          "answers there); nothing of it was used", a);
        else if (rep.result != MOEA2A_SUCCESS)
            rep.msg[sizeof(rep.msg) - 1] = 0, r = m2a_error(comm, (moea2a_result_t)rep.result, "%s", rep.msg);
    }
    close(fd);
    return r;
}

/* Who accepts on the ring: the one connection from the previous rank. */
typedef struct {
    m2a_bootstrap_t *bs;
    int prev;
} ring_accept_t;

static int ring_admit(void *ctx, int fd, const void *msg, const uint8_t *challenge)
{
    ring_accept_t *ra = ctx;
    const ring_hello_t *h = msg;
    (void)challenge;
    if (h->rank != ra->prev || ra->bs->prev_fd >= 0) return 0;
    ra->bs->prev_fd = fd;
    return 1;
}

static int ring_linked(void *ctx) { return ((ring_accept_t *)ctx)->bs->prev_fd >= 0; }

/* Every rank connects to the next and admits the previous. Rank 0 admits first and
 * every other rank connects first, so no two ranks wait on each other's challenge. */
static moea2a_result_t link_ring(moea2a_comm_t comm, m2a_bootstrap_t *bs, double deadline)
{
    int next = (bs->rank + 1) % bs->nranks, prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    m2a_handshake_t hs = {bs->key, bs->tag, "ring", sizeof(ring_hello_t)};
    ring_accept_t ra = {bs, prev};
    for (int step = 0; step < 2; step++) {
        if ((step == 0) == (bs->rank == 0)) {
            if (m2a_handshake_serve(bs->listen_fd, &hs, deadline, ring_admit, ring_linked, &ra))
                return m2a_error(comm, MOEA2A_ERR_TIMEOUT,
                                 "bootstrap ring: rank %d did not connect in time (MOEA2A_TIMEOUT_S)", prev);
        } else {
            ring_hello_t h = {M2A_ID_MAGIC, bs->tag, bs->rank, 0, {0}};
            char why[256];
            m2a_sock_status_t st;
            bs->next_fd = m2a_handshake_connect(&bs->peers[next].addr, &hs, &h, deadline, &st, why, sizeof(why));
            if (bs->next_fd < 0)
                return m2a_error(comm, st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_PEER_FAILED,
                                 "bootstrap ring: cannot link to rank %d: %s", next, why);
        }
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_bootstrap_join(moea2a_comm_t comm, const m2a_id_t *id, int rank, int nranks,
                                   double timeout_s, m2a_bootstrap_t **out)
{
    double deadline = m2a_now() + timeout_s;
    m2a_bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (!bs || !(bs->peers = calloc((size_t)nranks, sizeof(*bs->peers)))) {
        free(bs);
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "bootstrap: out of memory for %d ranks", nranks);
    }
    bs->rank = rank;
    bs->nranks = nranks;
    bs->tag = id->tag;
    memcpy(bs->key, id->key, sizeof(bs->key));
    bs->timeout_s = timeout_s;
    bs->listen_fd = bs->next_fd = bs->prev_fd = -1;

    /* Our ring listener goes on the same network as the root. */
    m2a_peer_info_t *self = &bs->peers[rank];
    char why[128];
    if (id->root.sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
        self->addr = id->root;
        self->addr.sin_port = 0;
    } else if (m2a_sock_pick_addr(&self->addr, why, sizeof(why))) {
        m2a_bootstrap_close(bs);
        return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "bootstrap: %s", why);
    }
    gethostname(self->host, sizeof(self->host) - 1);
    bs->listen_fd = m2a_sock_listen(&self->addr);
    if (bs->listen_fd < 0) {
        m2a_bootstrap_close(bs);
        return m2a_error(comm, MOEA2A_ERR_SYSTEM, "bootstrap: cannot listen: %s", strerror(errno));
    }
    moea2a_result_t r = join_root(comm, bs, id, deadline);
    if (r == MOEA2A_SUCCESS && nranks > 1) r = link_ring(comm, bs, deadline);
    if (r != MOEA2A_SUCCESS) {
        m2a_bootstrap_close(bs);
        return r;
    }
    M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "bootstrap: rank %d of %d joined", rank, nranks);
    *out = bs;
    return MOEA2A_SUCCESS;
}

/* ---- ring collectives ------------------------------------------------------------ */

moea2a_result_t m2a_bootstrap_allgather(moea2a_comm_t comm, m2a_bootstrap_t *bs, void *data, size_t size)
{
    int n = bs->nranks, next = (bs->rank + 1) % n, prev = (bs->rank + n - 1) % n;
    double deadline = m2a_now() + bs->timeout_s;
    for (int s = 0; s < n - 1; s++) {
        int sblk = (bs->rank - s + n) % n, rblk = (bs->rank - s - 1 + n) % n;
        block_hdr_t out = {bs->seq, 0, size}, in;
        int which;
        m2a_sock_status_t st = m2a_sock_sendrecv(bs->next_fd, &out, sizeof(out), bs->prev_fd, &in,
                                                 sizeof(in), deadline, &which);
        if (st == M2A_SOCK_OK && (in.seq != bs->seq || in.len != size))
            return m2a_error(comm, MOEA2A_ERR_MISMATCH,
                             "bootstrap allgather: rank %d sent %llu bytes for call %u, this rank expected %zu "
                             "for call %u (ranks called collectives in a different order?)",
                             prev, (unsigned long long)in.len, in.seq, size, bs->seq);
        if (st == M2A_SOCK_OK)
            st = m2a_sock_sendrecv(bs->next_fd, (char *)data + (size_t)sblk * size, size, bs->prev_fd,
                                   (char *)data + (size_t)rblk * size, size, deadline, &which);
        if (st != M2A_SOCK_OK) return sock_error(comm, st, "bootstrap allgather", which ? prev : next);
    }
    bs->seq++;
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_bootstrap_barrier(moea2a_comm_t comm, m2a_bootstrap_t *bs)
{
    char *tmp = calloc((size_t)bs->nranks, 1);
    if (!tmp) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "bootstrap barrier: out of memory");
    moea2a_result_t r = m2a_bootstrap_allgather(comm, bs, tmp, 1);
    free(tmp);
    return r;
}

void m2a_bootstrap_close(m2a_bootstrap_t *bs)
{
    if (!bs) return;
    if (bs->listen_fd >= 0) close(bs->listen_fd);
    if (bs->next_fd >= 0) close(bs->next_fd);
    if (bs->prev_fd >= 0) close(bs->prev_fd);
    free(bs->peers);
    memset(bs->key, 0, sizeof(bs->key));
    free(bs);
}

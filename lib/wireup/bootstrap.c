#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wireup/bootstrap.h"
#include "base/clock.h"
#include "base/error.h"
#include "wireup/handshake.h"
#include "base/log.h"
#include "wireup/socket.h"
#include "wireup/watch.h"

/* rank -> next rank, when the ring is linked (after the next rank's challenge) */
typedef struct {
    uint64_t magic, tag;
    int32_t rank, pad;
    uint8_t mac[M2A_MAC_BYTES];
} ring_hello_t;

/* Precedes every block of a bootstrap collective, to catch size or order mismatches.
 * A header with a nonzero status is an abort notice instead, and no block follows: a
 * rank that lost a peer tells the next rank which rank failed and how, so the news
 * goes round the ring with the blocks that cannot come, and every rank names the rank
 * that failed at once rather than the neighbour that gave up. */
typedef struct {
    uint32_t seq;
    int32_t status; /* 0: a block of len bytes follows; else a moea2a_result_t */
    uint64_t len;   /* the block's bytes; in a notice, failed rank << 32 | rank that saw it */
} block_hdr_t;

/* ---- joining --------------------------------------------------------------------- */

static moea2a_result_t sock_error(m2a_sock_status_t st, const char *what, int peer)
{
    switch (st) {
    case M2A_SOCK_TIMEOUT:
        return m2a_fail(MOEA2A_ERR_TIMEOUT, "%s: timed out waiting for rank %d (MOEA2A_TIMEOUT_S)", what, peer);
    case M2A_SOCK_CLOSED:
        return m2a_fail(MOEA2A_ERR_PEER_FAILED, "%s: rank %d closed its connection (process exited?)", what, peer);
    default:
        return m2a_fail(MOEA2A_ERR_SYSTEM, "%s: socket error with rank %d: %s", what, peer, strerror(errno));
    }
}

/* How long a rank tries to reach the rendezvous before it says it is still waiting:
 * ranks start in any order, so waiting is right, but a wrong address should not look
 * like a hang for MOEA2A_TIMEOUT_S. */
#define JOIN_NOTICE_S 10.0

static moea2a_result_t join_root(m2a_bootstrap_t *bs, const m2a_id_t *id, double deadline)
{
    char a[80], why[256];
    m2a_sock_format_addr(&id->root, a, sizeof(a));
    const int env = (id->flags & M2A_ID_FROM_ENV) != 0;
    m2a_hello_t h = {.magic = M2A_ID_MAGIC, .tag = id->tag, .rank = bs->rank, .nranks = bs->nranks};
    h.self = bs->peers[bs->rank];
    M2A_TRY(m2a_random(h.challenge, sizeof(h.challenge)));
    m2a_handshake_t hs = {id->key, id->tag, "join", sizeof(h)};
    m2a_sock_status_t st;
    const double start = m2a_now();
    int fd;
    for (;;) { /* in steps of JOIN_NOTICE_S, saying so after each */
        const double step = m2a_now() + JOIN_NOTICE_S < deadline ? m2a_now() + JOIN_NOTICE_S : deadline;
        fd = m2a_handshake_connect(&id->root, &hs, &h, step, &st, why, sizeof(why));
        if (fd >= 0 || st != M2A_SOCK_TIMEOUT || m2a_now() >= deadline) break;
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: no rendezvous at %s after %.0f s (%s); still trying for %.0f s "
                 "(MOEA2A_TIMEOUT_S)%s", bs->rank, a, m2a_now() - start, why, deadline - m2a_now(),
                 env ? ": is rank 0 running, and is MOEA2A_ROOT_ADDR its node's address?" : "");
    }
    if (fd < 0)
        return m2a_fail(st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_INVALID_ARGUMENT,
                         "rendezvous at %s: %s; %s", a, why,
                         env ? "is rank 0 running (it serves the rendezvous), is MOEA2A_ROOT_ADDR the address of its "
                               "node, and do all ranks have the same MOEA2A_ROOT_ADDR and key?"
                             : "is the unique id stale, or did the process that made it exit?");
    m2a_reply_t rep;
    uint8_t mac[M2A_MAC_BYTES];
    moea2a_result_t r = MOEA2A_SUCCESS;
    if ((st = m2a_sock_recv(fd, &rep, sizeof(rep), deadline + 5.0)) != M2A_SOCK_OK) {
        r = st == M2A_SOCK_TIMEOUT
                ? m2a_fail(MOEA2A_ERR_TIMEOUT, "rendezvous at %s timed out (not every rank joined)", a)
                : m2a_fail(MOEA2A_ERR_PEER_FAILED,
                            "rendezvous at %s: the root closed the connection before answering (did its process exit?)", a);
    } else if (rep.result == MOEA2A_SUCCESS && rep.nranks != bs->nranks) {
        r = m2a_fail(MOEA2A_ERR_MISMATCH, "rendezvous reported %d ranks, expected %d", rep.nranks, bs->nranks);
    } else if (rep.result == MOEA2A_SUCCESS &&
               (st = m2a_sock_recv(fd, bs->peers, sizeof(*bs->peers) * (size_t)bs->nranks, deadline + 5.0)) !=
                   M2A_SOCK_OK) {
        r = m2a_fail(st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_PEER_FAILED,
                      "rendezvous at %s: the peer table did not arrive (%s)", a,
                      st == M2A_SOCK_TIMEOUT ? "timed out" : "connection closed");
    }
    if (r == MOEA2A_SUCCESS) {
        m2a_reply_mac(id->key, &h, &rep, rep.result == MOEA2A_SUCCESS ? bs->peers : NULL, mac);
        if (!m2a_equal_ct(mac, rep.mac, sizeof(mac)))
            r = m2a_fail(MOEA2A_ERR_MISMATCH,
                          "rendezvous at %s: the answer failed authentication (a process without this id's key "
                          "answers there); nothing of it was used", a);
        else if (rep.result != MOEA2A_SUCCESS)
            rep.msg[sizeof(rep.msg) - 1] = 0, r = m2a_fail((moea2a_result_t)rep.result, "%s", rep.msg);
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
static moea2a_result_t link_ring(m2a_bootstrap_t *bs, double deadline)
{
    int next = (bs->rank + 1) % bs->nranks, prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    m2a_handshake_t hs = {bs->key, bs->tag, "ring", sizeof(ring_hello_t)};
    ring_accept_t ra = {bs, prev};
    for (int step = 0; step < 2; step++) {
        if ((step == 0) == (bs->rank == 0)) {
            if (m2a_handshake_serve(bs->listen_fd, &hs, deadline, ring_admit, ring_linked, &ra))
                return m2a_fail(MOEA2A_ERR_TIMEOUT,
                                 "bootstrap ring: rank %d did not connect in time (MOEA2A_TIMEOUT_S)", prev);
        } else {
            ring_hello_t h = {M2A_ID_MAGIC, bs->tag, bs->rank, 0, {0}};
            char why[256];
            m2a_sock_status_t st;
            bs->next_fd = m2a_handshake_connect(&bs->peers[next].addr, &hs, &h, deadline, &st, why, sizeof(why));
            if (bs->next_fd < 0)
                return m2a_fail(st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_PEER_FAILED,
                                 "bootstrap ring: cannot link to rank %d: %s", next, why);
        }
    }
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_bootstrap_join(const m2a_id_t *id, int rank, int nranks,
                                   double timeout_s, m2a_bootstrap_t **out)
{
    double deadline = m2a_now() + timeout_s;
    m2a_bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (!bs || !(bs->peers = calloc((size_t)nranks, sizeof(*bs->peers)))) {
        free(bs);
        return m2a_fail(MOEA2A_ERR_NO_MEMORY, "bootstrap: out of memory for %d ranks", nranks);
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
    if (m2a_sock_is_loopback(&id->root)) {
        self->addr = id->root;
        m2a_sock_set_port(&self->addr, 0);
    } else if (m2a_sock_pick_addr(&self->addr, id->root.sa.sa_family, why, sizeof(why))) {
        m2a_bootstrap_close(bs);
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "bootstrap: %s", why);
    }
    gethostname(self->host, sizeof(self->host) - 1);
    bs->listen_fd = m2a_sock_listen(&self->addr);
    if (bs->listen_fd < 0) {
        m2a_bootstrap_close(bs);
        return m2a_fail(MOEA2A_ERR_SYSTEM, "bootstrap: cannot listen: %s", strerror(errno));
    }
    moea2a_result_t r = join_root(bs, id, deadline);
    if (r == MOEA2A_SUCCESS && nranks > 1) r = link_ring(bs, deadline);
    if (r != MOEA2A_SUCCESS) {
        m2a_bootstrap_close(bs);
        return r;
    }
    M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "bootstrap: rank %d of %d joined", rank, nranks);
    *out = bs;
    return MOEA2A_SUCCESS;
}

/* The tag of the ring that the ranks alive[] form out of the ring of tag: the same on
 * every survivor that agrees on alive[], another for any other set, so that a rank with
 * another view is refused at the handshake rather than joined. */
static uint64_t shrunk_tag(uint64_t tag, const unsigned char *alive, int n)
{
    uint64_t h = tag ^ 0x736872696e6bull; /* "shrink" */
    for (int q = 0; q < n; q++) h = (h ^ (uint64_t)(alive[q] != 0)) * 1099511628211ull;
    return h;
}

moea2a_result_t m2a_bootstrap_shrink(const m2a_bootstrap_t *old, const unsigned char *alive, m2a_bootstrap_t **out)
{
    *out = NULL;
    int n = 0, me = -1;
    for (int q = 0; q < old->nranks; q++) {
        if (q == old->rank) me = alive[q] ? n : -1;
        n += alive[q] != 0;
    }
    if (me < 0) return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "bootstrap: this rank is not among the survivors");
    m2a_bootstrap_t *bs = calloc(1, sizeof(*bs));
    if (!bs || !(bs->peers = calloc((size_t)n, sizeof(*bs->peers)))) {
        free(bs);
        return m2a_fail(MOEA2A_ERR_NO_MEMORY, "bootstrap: out of memory for %d ranks", n);
    }
    for (int q = 0, i = 0; q < old->nranks; q++)
        if (alive[q]) bs->peers[i++] = old->peers[q];
    bs->rank = me, bs->nranks = n, bs->timeout_s = old->timeout_s;
    bs->tag = shrunk_tag(old->tag, alive, old->nranks);
    memcpy(bs->key, old->key, sizeof(bs->key));
    bs->next_fd = bs->prev_fd = -1;
    /* the same listener, which the survivors' addresses name: a descriptor of its own,
     * so that either communicator may be destroyed first */
    bs->listen_fd = dup(old->listen_fd);
    moea2a_result_t r = bs->listen_fd < 0 ? m2a_fail(MOEA2A_ERR_SYSTEM, "bootstrap: dup: %s", strerror(errno))
                        : n > 1          ? link_ring(bs, m2a_now() + bs->timeout_s)
                                         : MOEA2A_SUCCESS;
    if (r != MOEA2A_SUCCESS) {
        m2a_bootstrap_close(bs);
        return r;
    }
    M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "bootstrap: rank %d of %d after a shrink (rank %d of %d before)", me, n,
             old->rank, old->nranks);
    *out = bs;
    return MOEA2A_SUCCESS;
}

/* ---- ring collectives ------------------------------------------------------------ */

/* What a failed socket says of its peer: a code, and words for the code. */
static moea2a_result_t lost(m2a_sock_status_t st)
{
    return st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : st == M2A_SOCK_CLOSED ? MOEA2A_ERR_PEER_FAILED
                                                                               : MOEA2A_ERR_SYSTEM;
}

static const char *what_failed(moea2a_result_t code)
{
    return code == MOEA2A_ERR_TIMEOUT ? "did not answer in time (MOEA2A_TIMEOUT_S)"
           : code == MOEA2A_ERR_PEER_FAILED ? "closed its connection (process exited?)"
                                            : "failed";
}

/* After this rank failed in a collective: finish the step's message it was sending
 * (header hdr, hs bytes of it sent, then the block, bs bytes sent: both valid, and the
 * next rank is reading them), then tell the next rank that `failed` failed. Best
 * effort within a second: the next rank may be gone too. */
static void notify_next(m2a_bootstrap_t *bs, const block_hdr_t *hdr, size_t hs, const void *block, size_t bs_sent,
                        moea2a_result_t code, int failed)
{
    const double deadline = m2a_now() + 1.0;
    int which;
    size_t got = 0;
    if (bs->next_fd < 0 || failed == (bs->rank + 1) % bs->nranks) return;
    if (m2a_sock_sendrecv_from(bs->next_fd, hdr, sizeof(*hdr), &hs, -1, NULL, 0, &got, deadline, &which) ||
        m2a_sock_sendrecv_from(bs->next_fd, block, (size_t)hdr->len, &bs_sent, -1, NULL, 0, &got, deadline, &which))
        return;
    block_hdr_t notice = {bs->seq, (int32_t)code, (uint64_t)(uint32_t)failed << 32 | (uint32_t)bs->rank};
    (void)m2a_sock_send(bs->next_fd, &notice, sizeof(notice), deadline);
}

/* How often a collective's wait looks at the peer watcher's news. */
#define DEAD_LOOK_S 0.02

/* One transfer of a ring step, in slices of DEAD_LOOK_S where a watcher is set: past
 * M2A_WATCH_GRACE_S from the watcher's news of a dead rank (once per death, however
 * many waits follow it) it ends as a timeout with *dead set (else *dead = -1); the dead
 * neighbour's socket and the abort notices tell sooner. */
static m2a_sock_status_t ring_xfer(m2a_bootstrap_t *bs, const void *sbuf, size_t slen, size_t *sent, void *rbuf,
                                   size_t rlen, size_t *got, double deadline, int *which, int *dead)
{
    *dead = -1;
    for (;;) {
        const double step = bs->news && m2a_now() + DEAD_LOOK_S < deadline ? m2a_now() + DEAD_LOOK_S : deadline;
        m2a_sock_status_t st =
            m2a_sock_sendrecv_from(bs->next_fd, sbuf, slen, sent, bs->prev_fd, rbuf, rlen, got, step, which);
        if (st != M2A_SOCK_TIMEOUT || m2a_now() >= deadline) return st;
        const int d = __atomic_load_n(&bs->news->dead, __ATOMIC_ACQUIRE);
        if (d >= 0 && m2a_now() - bs->news->at > M2A_WATCH_GRACE_S) return *dead = d, st;
    }
}

/* A step's block of up to this many bytes leaves in one send with its header, so the
 * next rank finds it there once the header has come: a step takes one message's
 * latency instead of two (the header's, then the block's; the agreements of a
 * placement change are such steps). It fits the smallest socket send buffer, so every
 * rank's send completes while it waits for its own header. A larger block goes after
 * the headers have crossed, so that a ring of ranks sending at once never waits on
 * full buffers. */
#define BLOCK_INLINE_BYTES 4096

moea2a_result_t m2a_bootstrap_allgather(m2a_bootstrap_t *bs, void *data, size_t size)
{
    int n = bs->nranks, next = (bs->rank + 1) % n, prev = (bs->rank + n - 1) % n;
    double deadline = m2a_now() + bs->timeout_s;
    const block_hdr_t out = {bs->seq, 0, size};
    const int inline_block = size <= BLOCK_INLINE_BYTES;
    unsigned char msg[sizeof(block_hdr_t) + BLOCK_INLINE_BYTES]; /* the header, then the block */
    memcpy(msg, &out, sizeof(out));
    for (int s = 0; s < n - 1; s++) {
        int sblk = (bs->rank - s + n) % n, rblk = (bs->rank - s - 1 + n) % n;
        const char *sbuf = (const char *)data + (size_t)sblk * size;
        block_hdr_t in;
        size_t hs = 0, hg = 0, ds = 0, dg = 0;
        int which, dead;
        m2a_sock_status_t st;
        if (inline_block) { /* the whole message out; the header in */
            size_t sent = 0;
            memcpy(msg + sizeof(out), sbuf, size);
            st = ring_xfer(bs, msg, sizeof(out) + size, &sent, &in, sizeof(in), &hg, deadline, &which, &dead);
            hs = sent < sizeof(out) ? sent : sizeof(out), ds = sent - hs;
        } else {
            st = ring_xfer(bs, &out, sizeof(out), &hs, &in, sizeof(in), &hg, deadline, &which, &dead);
        }
        if (st == M2A_SOCK_OK && in.status != 0) { /* a notice: prev lost a rank */
            int failed = (int)(in.len >> 32), saw = (int)(uint32_t)in.len;
            notify_next(bs, &out, hs, sbuf, ds, (moea2a_result_t)in.status, failed);
            return m2a_fail((moea2a_result_t)in.status, "bootstrap allgather: rank %d %s (seen by rank %d)",
                             failed, what_failed((moea2a_result_t)in.status), saw);
        }
        if (st == M2A_SOCK_OK && (in.seq != bs->seq || in.len != size))
            return m2a_fail(MOEA2A_ERR_MISMATCH,
                             "bootstrap allgather: rank %d sent %llu bytes for call %u, this rank expected %zu "
                             "for call %u (ranks called collectives in a different order?)",
                             prev, (unsigned long long)in.len, in.seq, size, bs->seq);
        if (st == M2A_SOCK_OK)
            st = ring_xfer(bs, sbuf, size, &ds, (char *)data + (size_t)rblk * size, size, &dg, deadline, &which, &dead);
        if (dead >= 0) {
            notify_next(bs, &out, hs, sbuf, ds, MOEA2A_ERR_PEER_FAILED, dead);
            return m2a_fail(MOEA2A_ERR_PEER_FAILED, "bootstrap allgather: rank %d died (as this rank's peer watcher "
                            "saw)", dead);
        }
        if (st != M2A_SOCK_OK) {
            const int peer = which ? prev : next;
            notify_next(bs, &out, hs, sbuf, ds, lost(st), peer);
            return sock_error(st, "bootstrap allgather", peer);
        }
    }
    bs->seq++;
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_bootstrap_barrier(m2a_bootstrap_t *bs)
{
    char *tmp = calloc((size_t)bs->nranks, 1);
    if (!tmp) return m2a_fail(MOEA2A_ERR_NO_MEMORY, "bootstrap barrier: out of memory");
    moea2a_result_t r = m2a_bootstrap_allgather(bs, tmp, 1);
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

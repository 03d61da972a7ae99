#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "clock.h"
#include "error.h"
#include "log.h"
#include "socket.h"

/* rank -> root */
typedef struct {
    uint64_t magic, nonce;
    int32_t rank, nranks;
    m2a_peer_info_t self;
} hello_t;

/* root -> rank; on success followed by nranks m2a_peer_info_t */
typedef struct {
    int32_t result;
    int32_t nranks;
    char msg[512];
} reply_t;

/* rank -> next rank, when the ring is linked */
typedef struct {
    uint64_t magic, nonce;
    int32_t rank;
} ring_hello_t;

/* precedes every block of a bootstrap collective, to catch size or order mismatches */
typedef struct {
    uint32_t seq;
    uint32_t pad;
    uint64_t len;
} block_hdr_t;

/* ---- rendezvous service -------------------------------------------------------- */

typedef struct {
    int listen_fd;
    uint64_t nonce;
    double deadline;
} root_args_t;

static void root_reply_all(const int *fds, int n, const reply_t *rep, const m2a_peer_info_t *peers,
                           double deadline)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        if (m2a_sock_send(fds[i], rep, sizeof(*rep), deadline) == M2A_SOCK_OK && peers)
            m2a_sock_send(fds[i], peers, sizeof(*peers) * (size_t)rep->nranks, deadline);
    }
}

/* Reads one hello, rejecting connections that do not carry this id. */
static int root_read_hello(int fd, const root_args_t *a, hello_t *h)
{
    double d = m2a_now() + 5.0 < a->deadline ? m2a_now() + 5.0 : a->deadline;
    if (m2a_sock_recv(fd, h, sizeof(*h), d) != M2A_SOCK_OK) return -1;
    if (h->magic != M2A_ID_MAGIC || h->nonce != a->nonce || h->nranks <= 0 || h->nranks > (1 << 20)) {
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rendezvous: rejected a connection that does not carry this unique id");
        return -1;
    }
    return 0;
}

static void *root_main(void *arg)
{
    root_args_t a = *(root_args_t *)arg;
    free(arg);
    int nranks = -1, joined = 0, failed = 0;
    int *fds = NULL;
    m2a_peer_info_t *peers = NULL;
    reply_t rep = {0};

    while (failed || nranks < 0 || joined < nranks) {
        m2a_sock_status_t st;
        int fd = m2a_sock_accept(a.listen_fd, a.deadline, &st);
        if (fd < 0) break; /* timeout: reported below */
        hello_t h;
        if (root_read_hello(fd, &a, &h)) { close(fd); continue; }
        if (failed) { /* a late rank of a failed rendezvous learns why at once */
            root_reply_all(&fd, 1, &rep, NULL, m2a_now() + 1.0);
            close(fd);
            continue;
        }
        if (nranks < 0) {
            nranks = h.nranks;
            fds = malloc(sizeof(int) * (size_t)nranks);
            peers = calloc((size_t)nranks, sizeof(*peers));
            if (!fds || !peers) { close(fd); break; }
            for (int i = 0; i < nranks; i++) fds[i] = -1;
        }
        if (h.nranks != nranks || h.rank < 0 || h.rank >= nranks || fds[h.rank] >= 0) {
            rep.result = MOEA2A_ERR_MISMATCH;
            if (h.nranks != nranks)
                snprintf(rep.msg, sizeof(rep.msg), "rank %d passed nranks=%d but an earlier rank passed nranks=%d",
                         h.rank, h.nranks, nranks);
            else
                snprintf(rep.msg, sizeof(rep.msg), "rank %d joined the rendezvous twice (or is out of range 0..%d)",
                         h.rank, nranks - 1);
            root_reply_all(fds, nranks, &rep, NULL, m2a_now() + 1.0);
            root_reply_all(&fd, 1, &rep, NULL, m2a_now() + 1.0);
            for (int i = 0; i < nranks; i++) if (fds[i] >= 0) close(fds[i]), fds[i] = -1;
            close(fd);
            failed = 1;
            continue;
        }
        fds[h.rank] = fd;
        peers[h.rank] = h.self;
        joined++;
    }

    if (!failed && nranks > 0 && joined == nranks) {
        rep.result = MOEA2A_SUCCESS;
        rep.nranks = nranks;
        root_reply_all(fds, nranks, &rep, peers, a.deadline + 5.0);
    } else if (!failed && nranks > 0) {
        char missing[256] = "";
        size_t o = 0;
        for (int i = 0; i < nranks && o < sizeof(missing) - 16; i++)
            if (fds[i] < 0) o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? "," : "", i);
        rep.result = MOEA2A_ERR_TIMEOUT;
        snprintf(rep.msg, sizeof(rep.msg), "rendezvous timed out: %d of %d ranks joined; missing ranks %s",
                 joined, nranks, missing);
        root_reply_all(fds, nranks, &rep, NULL, m2a_now() + 1.0);
    }
    if (fds)
        for (int i = 0; i < nranks; i++) if (fds[i] >= 0) close(fds[i]);
    free(fds);
    free(peers);
    close(a.listen_fd);
    return NULL;
}

moea2a_result_t m2a_bootstrap_serve(m2a_id_t *id, const struct sockaddr_in *root, uint64_t nonce,
                                    double timeout_s)
{
    struct sockaddr_in addr = *root;
    int fd = m2a_sock_listen(&addr);
    char a[64];
    m2a_sock_format_addr(root, a, sizeof(a));
    if (fd < 0)
        return m2a_error(NULL, MOEA2A_ERR_SYSTEM, "cannot listen on %s for the rendezvous: %s", a, strerror(errno));
    root_args_t *args = malloc(sizeof(*args));
    if (!args) { close(fd); return m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "rendezvous: out of memory"); }
    args->listen_fd = fd;
    args->nonce = nonce;
    args->deadline = m2a_now() + timeout_s;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, root_main, args);
    pthread_attr_destroy(&attr);
    if (rc) {
        close(fd);
        free(args);
        return m2a_error(NULL, MOEA2A_ERR_SYSTEM, "rendezvous: cannot start its thread: %s", strerror(rc));
    }
    memset(id, 0, sizeof(*id));
    id->magic = M2A_ID_MAGIC;
    id->nonce = nonce;
    id->root = addr;
    m2a_sock_format_addr(&addr, a, sizeof(a));
    M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "rendezvous serving on %s for %.0f s", a, timeout_s);
    return MOEA2A_SUCCESS;
}

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
    char a[64];
    m2a_sock_format_addr(&id->root, a, sizeof(a));
    m2a_sock_status_t st;
    int fd = m2a_sock_connect(&id->root, deadline, &st);
    if (fd < 0)
        return m2a_error(comm, st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_SYSTEM,
                         "rendezvous: no answer from %s (%s); is the unique id stale, or did the process "
                         "that made it exit?", a, st == M2A_SOCK_TIMEOUT ? "timed out" : strerror(errno));
    hello_t h = {.magic = M2A_ID_MAGIC, .nonce = id->nonce, .rank = bs->rank, .nranks = bs->nranks};
    h.self = bs->peers[bs->rank];
    reply_t rep;
    moea2a_result_t r = MOEA2A_SUCCESS;
    if ((st = m2a_sock_send(fd, &h, sizeof(h), deadline)) != M2A_SOCK_OK ||
        (st = m2a_sock_recv(fd, &rep, sizeof(rep), deadline + 5.0)) != M2A_SOCK_OK) {
        r = st == M2A_SOCK_TIMEOUT
                ? m2a_error(comm, MOEA2A_ERR_TIMEOUT, "rendezvous at %s timed out (not every rank joined)", a)
                : m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                            "rendezvous at %s closed the connection: the unique id is stale or foreign", a);
    } else if (rep.result != MOEA2A_SUCCESS) {
        rep.msg[sizeof(rep.msg) - 1] = 0;
        r = m2a_error(comm, (moea2a_result_t)rep.result, "%s", rep.msg);
    } else if (rep.nranks != bs->nranks) {
        r = m2a_error(comm, MOEA2A_ERR_MISMATCH, "rendezvous reported %d ranks, expected %d", rep.nranks, bs->nranks);
    } else if ((st = m2a_sock_recv(fd, bs->peers, sizeof(*bs->peers) * (size_t)bs->nranks, deadline + 5.0)) !=
               M2A_SOCK_OK) {
        r = sock_error(comm, st, "rendezvous", -1);
    }
    close(fd);
    return r;
}

static moea2a_result_t link_ring(moea2a_comm_t comm, m2a_bootstrap_t *bs, double deadline)
{
    int next = (bs->rank + 1) % bs->nranks, prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    m2a_sock_status_t st;
    bs->next_fd = m2a_sock_connect(&bs->peers[next].addr, deadline, &st);
    if (bs->next_fd < 0) return sock_error(comm, st, "bootstrap ring connect", next);
    ring_hello_t h = {M2A_ID_MAGIC, bs->nonce, bs->rank};
    if ((st = m2a_sock_send(bs->next_fd, &h, sizeof(h), deadline)) != M2A_SOCK_OK)
        return sock_error(comm, st, "bootstrap ring", next);
    while (bs->prev_fd < 0) {
        int fd = m2a_sock_accept(bs->listen_fd, deadline, &st);
        if (fd < 0) return sock_error(comm, st, "bootstrap ring accept", prev);
        ring_hello_t in;
        if (m2a_sock_recv(fd, &in, sizeof(in), deadline) == M2A_SOCK_OK && in.magic == M2A_ID_MAGIC &&
            in.nonce == bs->nonce && in.rank == prev)
            bs->prev_fd = fd;
        else {
            M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "bootstrap: rejected a stray connection on the ring listener");
            close(fd);
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
    bs->nonce = id->nonce;
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
    free(bs);
}

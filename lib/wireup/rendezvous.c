/* The rendezvous service behind a unique id: a thread of the process that made the
 * id admits every rank that proves it holds the id's key (lib/wireup/handshake.c), then
 * hands each the table of all ranks' addresses, authenticated with the same key. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wireup/rendezvous.h"
#include "base/clock.h"
#include "base/error.h"
#include "wireup/handshake.h"
#include "base/log.h"
#include "wireup/socket.h"

typedef struct {
    m2a_id_t id;
    int listen_fd;
    double deadline;
    int nranks, joined, failed;
    int *fds;                /* [nranks]: the admitted ranks' connections, -1 until joined */
    m2a_hello_t *hellos;     /* [nranks] */
    m2a_reply_t fail_reply;  /* once failed: what every rank is told */
} root_t;

void m2a_reply_mac(const uint8_t *key, const m2a_hello_t *h, const m2a_reply_t *rep, const m2a_peer_info_t *peers,
                   uint8_t out[M2A_MAC_BYTES])
{
    static const char label[] = "reply";
    m2a_part_t parts[5] = {{label, sizeof(label)},
                           {&h->tag, sizeof(h->tag)},
                           {h->challenge, sizeof(h->challenge)},
                           {rep, offsetof(m2a_reply_t, mac)},
                           {peers, peers ? sizeof(*peers) * (size_t)rep->nranks : 0}};
    m2a_hmac(key, parts, 5, out);
}

/* Sends rep (and peers) to the rank that sent h on fd. */
static void reply(const root_t *root, int fd, const m2a_hello_t *h, const m2a_reply_t *rep,
                  const m2a_peer_info_t *peers, double deadline)
{
    m2a_reply_t r = *rep;
    m2a_reply_mac(root->id.key, h, &r, peers, r.mac);
    if (m2a_sock_send(fd, &r, sizeof(r), deadline) == M2A_SOCK_OK && peers)
        m2a_sock_send(fd, peers, sizeof(*peers) * (size_t)r.nranks, deadline);
}

static void reply_all(root_t *root, const m2a_reply_t *rep, const m2a_peer_info_t *peers, double deadline)
{
    for (int i = 0; i < root->nranks; i++)
        if (root->fds[i] >= 0) reply(root, root->fds[i], &root->hellos[i], rep, peers, deadline);
}

static void close_all(root_t *root)
{
    for (int i = 0; root->fds && i < root->nranks; i++)
        if (root->fds[i] >= 0) close(root->fds[i]), root->fds[i] = -1;
}

/* An authenticated hello: admit the rank, or fail the rendezvous for everyone. */
static int admit(void *ctx, int fd, const void *msg, const uint8_t *challenge)
{
    root_t *root = ctx;
    m2a_hello_t h;
    memcpy(&h, msg, sizeof(h));
    (void)challenge;
    if (root->failed) { /* a late rank of a failed rendezvous learns why at once */
        reply(root, fd, &h, &root->fail_reply, NULL, m2a_now() + 1.0);
        return 0;
    }
    if (h.nranks <= 0 || h.nranks > (1 << 20)) return 0;
    if (root->nranks < 0) {
        root->fds = malloc(sizeof(int) * (size_t)h.nranks);
        root->hellos = calloc((size_t)h.nranks, sizeof(*root->hellos));
        if (!root->fds || !root->hellos) return 0;
        root->nranks = h.nranks;
        for (int i = 0; i < h.nranks; i++) root->fds[i] = -1;
    }
    if (h.nranks == root->nranks && h.rank >= 0 && h.rank < root->nranks && root->fds[h.rank] < 0) {
        root->fds[h.rank] = fd;
        root->hellos[h.rank] = h;
        root->joined++;
        return 1;
    }
    m2a_reply_t *rep = &root->fail_reply;
    rep->result = MOEA2A_ERR_MISMATCH;
    if (h.nranks != root->nranks)
        snprintf(rep->msg, sizeof(rep->msg), "rank %d passed nranks=%d but an earlier rank passed nranks=%d", h.rank,
                 h.nranks, root->nranks);
    else
        snprintf(rep->msg, sizeof(rep->msg), h.rank >= 0 && h.rank < root->nranks
                 ? "two processes joined the rendezvous as rank %d (each rank must be started once)"
                 : "a process joined the rendezvous as rank %d, out of range 0..%d", h.rank, root->nranks - 1);
    reply_all(root, rep, NULL, m2a_now() + 1.0);
    reply(root, fd, &h, rep, NULL, m2a_now() + 1.0);
    close_all(root);
    root->failed = 1;
    return 0;
}

static int all_joined(void *ctx)
{
    const root_t *root = ctx;
    return !root->failed && root->nranks > 0 && root->joined == root->nranks;
}

static void *root_main(void *arg)
{
    root_t *root = arg;
    m2a_handshake_t hs = {root->id.key, root->id.tag, "join", sizeof(m2a_hello_t)};
    int ok = m2a_handshake_serve(root->listen_fd, &hs, root->deadline, admit, all_joined, root) == 0;
    m2a_reply_t rep = {0};
    if (ok) {
        m2a_peer_info_t *peers = calloc((size_t)root->nranks, sizeof(*peers));
        rep.result = peers ? MOEA2A_SUCCESS : MOEA2A_ERR_NO_MEMORY;
        rep.nranks = root->nranks;
        if (!peers) snprintf(rep.msg, sizeof(rep.msg), "rendezvous: the root ran out of memory");
        for (int i = 0; peers && i < root->nranks; i++) peers[i] = root->hellos[i].self;
        reply_all(root, &rep, peers, root->deadline + 5.0);
        free(peers);
    } else if (!root->failed && root->nranks > 0) {
        char missing[256] = "";
        size_t o = 0;
        for (int i = 0; i < root->nranks && o < sizeof(missing) - 16; i++)
            if (root->fds[i] < 0) o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? "," : "", i);
        rep.result = MOEA2A_ERR_TIMEOUT;
        snprintf(rep.msg, sizeof(rep.msg), "rendezvous timed out: %d of %d ranks joined; missing ranks %s",
                 root->joined, root->nranks, missing);
        reply_all(root, &rep, NULL, m2a_now() + 1.0);
    }
    close_all(root);
    free(root->fds);
    free(root->hellos);
    close(root->listen_fd);
    memset(root->id.key, 0, sizeof(root->id.key));
    free(root);
    return NULL;
}

moea2a_result_t m2a_rendezvous_serve(m2a_id_t *id, double timeout_s, int *in_use)
{
    char a[80];
    m2a_sock_format_addr(&id->root, a, sizeof(a));
    int fd = m2a_sock_listen(&id->root);
    if (in_use) *in_use = fd < 0 && errno == EADDRINUSE;
    if (fd < 0)
        return m2a_fail(MOEA2A_ERR_SYSTEM, "cannot listen on %s for the rendezvous: %s", a, strerror(errno));
    root_t *root = calloc(1, sizeof(*root));
    if (!root) {
        close(fd);
        return m2a_fail(MOEA2A_ERR_NO_MEMORY, "rendezvous: out of memory");
    }
    root->id = *id;
    root->listen_fd = fd;
    root->nranks = -1;
    root->deadline = m2a_now() + timeout_s;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, root_main, root);
    pthread_attr_destroy(&attr);
    if (rc) {
        close(fd);
        free(root);
        return m2a_fail(MOEA2A_ERR_SYSTEM, "rendezvous: cannot start its thread: %s", strerror(rc));
    }
    m2a_sock_format_addr(&id->root, a, sizeof(a));
    M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "rendezvous serving on %s for %.0f s", a, timeout_s);
    return MOEA2A_SUCCESS;
}

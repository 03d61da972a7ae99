#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wireup/watch.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "wireup/handshake.h"

/* The one byte a link ever carries: its sender leaves cleanly. */
#define BYE 0x5a

/* rank -> a lower rank it watches */
typedef struct {
    uint64_t magic, tag;
    int32_t rank, pad;
    uint8_t mac[M2A_MAC_BYTES];
} watch_hello_t;

struct m2a_watch {
    int rank, nranks;
    int *fd;          /* [nranks]: the link to each watched rank, -1 for none (or closed) */
    int wake[2];      /* a pipe: m2a_watch_stop writes to it to end the thread */
    pthread_t thread;
    int running;
    int dead;         /* -1, or the first rank seen dead (written under mu, read atomically) */
    pthread_mutex_t mu;
    volatile int32_t *words[M2A_WATCH_MAX_WORDS];
    int nwords;
};

/* Who accepts: a link from each watched rank above this one. */
typedef struct {
    m2a_watch_t *w;
    const unsigned char *watched;
    int missing;
} watch_accept_t;

static int watch_admit(void *ctx, int fd, const void *msg, const uint8_t *challenge)
{
    watch_accept_t *a = ctx;
    const watch_hello_t *h = msg;
    (void)challenge;
    if (h->rank <= a->w->rank || h->rank >= a->w->nranks || !a->watched[h->rank] || a->w->fd[h->rank] >= 0) return 0;
    a->w->fd[h->rank] = fd;
    a->missing--;
    return 1;
}

static int watch_linked(void *ctx) { return ((watch_accept_t *)ctx)->missing == 0; }

/* Records rank q's death once and tells every word. */
static void saw_death(m2a_watch_t *w, int q, const char *how)
{
    pthread_mutex_lock(&w->mu);
    if (w->dead < 0) {
        __atomic_store_n(&w->dead, q, __ATOMIC_RELEASE);
        for (int i = 0; i < w->nwords; i++) *w->words[i] = q + 1;
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: peer rank %d is gone (%s): calls that wait on it fail with "
                 "MOEA2A_ERR_PEER_FAILED", w->rank, q, how);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Blocks in poll() until a link ends or m2a_watch_stop wakes it; a link's end without
 * its goodbye is a death. After the first death there is nothing more to tell. */
static void *watch_loop(void *arg)
{
    m2a_watch_t *w = arg;
    struct pollfd *p = calloc((size_t)w->nranks + 1, sizeof(*p));
    int *who = calloc((size_t)w->nranks + 1, sizeof(*who));
    if (!p || !who) {
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: the peer watcher has no memory; dead peers are noticed at "
                 "MOEA2A_TIMEOUT_S only", w->rank);
        free(p), free(who);
        return NULL;
    }
    for (;;) {
        int n = 0;
        p[n++] = (struct pollfd){.fd = w->wake[0], .events = POLLIN};
        for (int q = 0; q < w->nranks; q++)
            if (w->fd[q] >= 0) who[n] = q, p[n++] = (struct pollfd){.fd = w->fd[q], .events = POLLIN};
        if (n == 1 && w->dead >= 0) break;
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR) continue;
            M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: the peer watcher stopped: poll: %s", w->rank, strerror(errno));
            break;
        }
        if (p[0].revents) break;
        for (int i = 1; i < n; i++) {
            if (!p[i].revents) continue;
            const int q = who[i];
            unsigned char b[16];
            ssize_t got = recv(w->fd[q], b, sizeof(b), MSG_DONTWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            close(w->fd[q]);
            w->fd[q] = -1;
            if (got > 0 && b[0] == BYE) {
                M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "rank %d: peer rank %d left cleanly", w->rank, q);
                continue;
            }
            saw_death(w, q, got == 0 ? "its process exited: its connection closed"
                           : got < 0 ? strerror(errno)
                                     : "its watch link carried something else than a goodbye");
        }
    }
    free(p), free(who);
    return NULL;
}

static moea2a_result_t link_all(m2a_watch_t *w, m2a_bootstrap_t *bs, const unsigned char *watched, double deadline)
{
    m2a_handshake_t hs = {bs->key, bs->tag, "watch", sizeof(watch_hello_t)};
    /* Every rank first links to the watched ranks below it, then admits those above;
     * rank 0 only admits, so each rank's connects meet a rank that serves or soon will. */
    for (int q = 0; q < w->rank; q++) {
        if (!watched[q]) continue;
        watch_hello_t h = {M2A_ID_MAGIC, bs->tag, w->rank, 0, {0}};
        char why[256];
        m2a_sock_status_t st;
        w->fd[q] = m2a_handshake_connect(&bs->peers[q].addr, &hs, &h, deadline, &st, why, sizeof(why));
        if (w->fd[q] < 0)
            return m2a_fail(st == M2A_SOCK_TIMEOUT ? MOEA2A_ERR_TIMEOUT : MOEA2A_ERR_PEER_FAILED,
                            "peer watcher: cannot link to rank %d: %s", q, why);
    }
    watch_accept_t a = {w, watched, 0};
    for (int q = w->rank + 1; q < w->nranks; q++) a.missing += watched[q] != 0;
    if (a.missing && m2a_handshake_serve(bs->listen_fd, &hs, deadline, watch_admit, watch_linked, &a)) {
        int q = w->rank + 1;
        while (q < w->nranks && (!watched[q] || w->fd[q] >= 0)) q++;
        return m2a_fail(MOEA2A_ERR_TIMEOUT, "peer watcher: rank %d did not link in time (MOEA2A_TIMEOUT_S)", q);
    }
    return MOEA2A_SUCCESS;
}

static void close_all(m2a_watch_t *w)
{
    for (int q = 0; q < w->nranks; q++)
        if (w->fd[q] >= 0) close(w->fd[q]);
    if (w->wake[0] >= 0) close(w->wake[0]), close(w->wake[1]);
    pthread_mutex_destroy(&w->mu);
    free(w->fd);
    free(w);
}

moea2a_result_t m2a_watch_start(m2a_bootstrap_t *bs, const unsigned char *watched, double timeout_s,
                                m2a_watch_t **out)
{
    *out = NULL;
    m2a_watch_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->fd = malloc(sizeof(int) * (size_t)bs->nranks))) {
        free(w);
        return m2a_fail(MOEA2A_ERR_NO_MEMORY, "peer watcher: out of memory for %d ranks", bs->nranks);
    }
    w->rank = bs->rank, w->nranks = bs->nranks, w->dead = -1;
    for (int q = 0; q < w->nranks; q++) w->fd[q] = -1;
    w->wake[0] = w->wake[1] = -1;
    pthread_mutex_init(&w->mu, NULL);
    moea2a_result_t r = pipe(w->wake) ? m2a_fail(MOEA2A_ERR_SYSTEM, "peer watcher: pipe: %s", strerror(errno))
                                      : link_all(w, bs, watched, m2a_now() + timeout_s);
    if (r == MOEA2A_SUCCESS && pthread_create(&w->thread, NULL, watch_loop, w))
        r = m2a_fail(MOEA2A_ERR_SYSTEM, "peer watcher: cannot start its thread");
    if (r != MOEA2A_SUCCESS) {
        close_all(w);
        return r;
    }
    w->running = 1;
    *out = w;
    return MOEA2A_SUCCESS;
}

int m2a_watch_dead(const m2a_watch_t *w) { return w ? __atomic_load_n(&w->dead, __ATOMIC_ACQUIRE) : -1; }

moea2a_result_t m2a_watch_add(m2a_watch_t *w, volatile int32_t *word)
{
    if (!w) return MOEA2A_SUCCESS;
    moea2a_result_t r = MOEA2A_SUCCESS;
    pthread_mutex_lock(&w->mu);
    if (w->nwords == M2A_WATCH_MAX_WORDS)
        r = m2a_fail(MOEA2A_ERR_NO_MEMORY, "peer watcher: more than %d contexts on one communicator",
                     M2A_WATCH_MAX_WORDS);
    else
        w->words[w->nwords++] = word, *word = w->dead + 1;
    pthread_mutex_unlock(&w->mu);
    return r;
}

void m2a_watch_remove(m2a_watch_t *w, volatile int32_t *word)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nwords; i++)
        if (w->words[i] == word) w->words[i--] = w->words[--w->nwords];
    pthread_mutex_unlock(&w->mu);
}

void m2a_watch_stop(m2a_watch_t *w)
{
    if (!w) return;
    if (w->running) {
        const char c = 0;
        if (write(w->wake[1], &c, 1) != 1) M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "peer watcher: cannot wake its thread");
        pthread_join(w->thread, NULL);
    }
    const unsigned char bye = BYE;
    for (int q = 0; q < w->nranks; q++)
        if (w->fd[q] >= 0) (void)send(w->fd[q], &bye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    close_all(w);
}

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wireup/watch.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "wireup/handshake.h"

/* The bytes a link carries: its sender leaves cleanly; its sender's watcher is alive
 * (every M2A_WATCH_BEAT_S, whatever either end's bound, so that a host that went down
 * or was cut off, whose sockets never close, is noticed after the silence bound). */
#define BYE 0x5a
#define BEAT 0x42

/* rank -> a lower rank it watches */
typedef struct {
    uint64_t magic, tag;
    int32_t rank, pad;
    uint8_t mac[M2A_MAC_BYTES];
} watch_hello_t;

/* A rank's mark on its host: a robust, process-shared mutex that its watcher thread
 * holds from start to stop. The kernel releases a dead thread's robust mutexes as its
 * exit begins, before the process's memory and files go (closing a CUDA context's
 * files took a second with NCCL's resources), and wakes a waiter with EOWNERDEAD; a
 * rank that leaves sets left before it lets go. */
typedef struct {
    pthread_mutex_t m;
    volatile int left;
} mark_t;

/* How often a thread waiting on a peer's mark looks whether the watch stops: a
 * clean stop lets go of the marks together, so this bounds only a stop beside a peer
 * that stays. */
#define MARK_LOOK_NS 50000000L

typedef struct {
    struct m2a_watch *w;
    int rank;
    mark_t *mark; /* the peer's, mapped */
    pthread_t thread;
} observer_t;

struct m2a_watch {
    int rank, nranks;
    int *fd;          /* [nranks]: the link to each watched rank, -1 for none (or closed) */
    int wake[2];      /* a pipe: m2a_watch_stop writes to it to end the thread */
    pthread_t thread;
    int running;
    m2a_death_news_t news; /* the first rank seen dead and when (written under mu, dead read atomically) */
    unsigned char *gone; /* [nranks]: every rank seen dead (under mu) */
    char how[160];       /* how the first death was seen (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int holding, linked; /* the thread holds its mark; the links are made (under mu) */
    volatile int32_t *words[M2A_WATCH_MAX_WORDS];
    int nwords;
    double silence_s;    /* a link silent this long is a peer gone (0: never) */
    double *heard;       /* [nranks]: when each link last carried a byte (the thread's) */
    mark_t *mark;        /* this rank's, or NULL */
    char mark_name[64];  /* its shared-memory name while it is linked */
    observer_t *obs;     /* one per watched rank of this host whose mark could be mapped */
    int nobs;
    volatile int stopping;
};

/* A link stays this process's: a program it starts (fork and exec) would otherwise
 * keep the link open after this process died, and hide the death. Returns fd. */
static int keep_private(int fd)
{
    if (fd >= 0) (void)fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
    return fd;
}

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
    a->w->fd[h->rank] = keep_private(fd);
    a->missing--;
    return 1;
}

static int watch_linked(void *ctx) { return ((watch_accept_t *)ctx)->missing == 0; }

/* Records rank q's death once and tells every word. */
static void saw_death(m2a_watch_t *w, int q, const char *how)
{
    pthread_mutex_lock(&w->mu);
    w->gone[q] = 1;
    if (w->news.dead < 0) {
        snprintf(w->how, sizeof(w->how), "%s", how);
        w->news.at = m2a_now();
        __atomic_store_n(&w->news.dead, q, __ATOMIC_RELEASE);
        for (int i = 0; i < w->nwords; i++) *w->words[i] = q + 1;
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: peer rank %d is gone (%s): calls that wait on it fail with "
                 "MOEA2A_ERR_PEER_FAILED", w->rank, q, how);
    }
    pthread_mutex_unlock(&w->mu);
}

static void poll_links(m2a_watch_t *w);

/* The watcher thread: holds this rank's mark, waits for the links, polls them, and
 * lets go of the mark (left set) when the watch stops. */
static void *watch_loop(void *arg)
{
    m2a_watch_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->holding = !w->mark || pthread_mutex_lock(&w->mark->m) == 0 ? 1 : -1;
    pthread_cond_broadcast(&w->cv);
    while (!w->linked) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    if (w->linked > 0) poll_links(w);
    if (w->mark && w->holding > 0) {
        w->mark->left = 1;
        pthread_mutex_unlock(&w->mark->m);
    }
    return NULL;
}

/* A beat on every link, and with a silence bound the links silent past it closed as
 * deaths (a peer's watcher beats while its process lives and runs). */
static void beat_and_listen(m2a_watch_t *w, double now)
{
    const unsigned char b = BEAT;
    for (int q = 0; q < w->nranks; q++) {
        if (w->fd[q] < 0) continue;
        (void)send(w->fd[q], &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT); /* a full buffer: the peer is behind anyway */
        if (w->silence_s <= 0 || now - w->heard[q] <= w->silence_s) continue;
        char how[128];
        snprintf(how, sizeof(how), "its watch link was silent for %.1f s (MOEA2A_WATCH_SILENCE_S): its host is down, "
                 "cut off, or the process stopped", now - w->heard[q]);
        close(w->fd[q]);
        w->fd[q] = -1;
        saw_death(w, q, how);
    }
}

/* Blocks in poll() until a link ends, m2a_watch_stop wakes it, or a beat is due; a
 * link's end without its goodbye is a death. */
static void poll_links(m2a_watch_t *w)
{
    struct pollfd *p = calloc((size_t)w->nranks + 1, sizeof(*p));
    int *who = calloc((size_t)w->nranks + 1, sizeof(*who));
    if (!p || !who) {
        M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: the peer watcher has no memory; dead peers are noticed at "
                 "MOEA2A_TIMEOUT_S only", w->rank);
        free(p), free(who);
        return;
    }
    const int beat_ms = (int)(1000 * M2A_WATCH_BEAT_S);
    double last_beat = 0;
    for (int q = 0; q < w->nranks; q++) w->heard[q] = m2a_now();
    for (;;) {
        const double now = m2a_now();
        if (now - last_beat >= M2A_WATCH_BEAT_S) beat_and_listen(w, last_beat = now);
        int n = 0;
        p[n++] = (struct pollfd){.fd = w->wake[0], .events = POLLIN};
        for (int q = 0; q < w->nranks; q++)
            if (w->fd[q] >= 0) who[n] = q, p[n++] = (struct pollfd){.fd = w->fd[q], .events = POLLIN};
        if (n == 1 && w->news.dead >= 0) break;
        if (poll(p, (nfds_t)n, beat_ms) < 0) {
            if (errno == EINTR) continue;
            M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "rank %d: the peer watcher stopped: poll: %s", w->rank, strerror(errno));
            break;
        }
        if (p[0].revents) break;
        for (int i = 1; i < n; i++) {
            if (!p[i].revents) continue;
            const int q = who[i];
            unsigned char b[64];
            ssize_t got = recv(w->fd[q], b, sizeof(b), MSG_DONTWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            int beats = 0, bye = 0;
            for (ssize_t j = 0; j < got; j++) beats += b[j] == BEAT, bye |= b[j] == BYE;
            if (got > 0 && beats == got) { /* alive */
                w->heard[q] = m2a_now();
                continue;
            }
            close(w->fd[q]);
            w->fd[q] = -1;
            if (bye && beats + 1 == got) {
                M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "rank %d: peer rank %d left cleanly", w->rank, q);
                continue;
            }
            saw_death(w, q, got == 0 ? "its process exited: its connection closed"
                           : got < 0 ? strerror(errno)
                                     : "its watch link carried something else than a goodbye");
        }
    }
    free(p), free(who);
}

/* Waits on a peer's mark until the peer dies (EOWNERDEAD, or the mark given up
 * without its left) or leaves, or the watch stops. */
static void *observe(void *arg)
{
    observer_t *o = arg;
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += MARK_LOOK_NS;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        const int e = pthread_mutex_timedlock(&o->mark->m, &t);
        if (e == ETIMEDOUT || e == EINTR) {
            if (o->w->stopping) return NULL;
            continue;
        }
        if (e == EOWNERDEAD) pthread_mutex_consistent(&o->mark->m);
        if (e == 0 || e == EOWNERDEAD) pthread_mutex_unlock(&o->mark->m);
        if (!o->mark->left) saw_death(o->w, o->rank, "its process died: the kernel released its mark");
        return NULL;
    }
}

/* The shared-memory name of a rank's mark: the job's tag, the rank and its pid. */
static void mark_name(char *buf, size_t len, uint64_t tag, int rank, int pid)
{
    snprintf(buf, len, "/moea2a-watch-%016llx-%d-%d", (unsigned long long)tag, rank, pid);
}

/* This rank's mark: a page of shared memory, named for the job and rank, that the
 * peers of its host map before it is unlinked again (m2a_watch_start). */
static int make_mark(m2a_watch_t *w, uint64_t tag)
{
    mark_name(w->mark_name, sizeof(w->mark_name), tag, w->rank, (int)getpid());
    int fd = shm_open(w->mark_name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return -1;
    void *m = ftruncate(fd, sizeof(mark_t)) ? MAP_FAILED
                                              : mmap(NULL, sizeof(mark_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(w->mark_name);
        return -1;
    }
    w->mark = m;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&w->mark->m, &a);
    pthread_mutexattr_destroy(&a);
    return 0;
}

/* Maps the mark of each watched rank of this host (by the pids the ranks exchanged)
 * and starts a thread on it; a mark that cannot be mapped (another IPC namespace)
 * leaves that rank to the links. */
static void map_marks(m2a_watch_t *w, const m2a_bootstrap_t *bs, const unsigned char *watched, const int32_t *pid,
                      uint64_t tag)
{
    w->obs = calloc((size_t)w->nranks, sizeof(*w->obs));
    for (int q = 0; w->obs && q < w->nranks; q++) {
        if (!watched[q] || pid[q] <= 0 || strcmp(bs->peers[q].host, bs->peers[w->rank].host)) continue;
        char name[64];
        mark_name(name, sizeof(name), tag, q, (int)pid[q]);
        int fd = shm_open(name, O_RDWR, 0);
        void *m = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(mark_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        if (m == MAP_FAILED) {
            M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "peer watcher: rank %d's mark (%s) is not reachable: %s; its link alone "
                     "tells", q, name, strerror(errno));
            continue;
        }
        observer_t *o = &w->obs[w->nobs];
        *o = (observer_t){w, q, m, 0};
        if (pthread_create(&o->thread, NULL, observe, o)) {
            munmap(m, sizeof(mark_t));
            continue;
        }
        w->nobs++;
    }
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
        w->fd[q] = keep_private(m2a_handshake_connect(&bs->peers[q].addr, &hs, &h, deadline, &st, why, sizeof(why)));
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

/* Ends the threads (the watcher's first: it lets go of this rank's mark, so peers
 * stopping too release theirs), says goodbye on the links when bye, and frees
 * everything. */
static void close_all(m2a_watch_t *w, int bye)
{
    w->stopping = 1;
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        if (!w->linked) w->linked = -1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        const char c = 0;
        if (write(w->wake[1], &c, 1) != 1) M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "peer watcher: cannot wake its thread");
        pthread_join(w->thread, NULL);
    }
    const unsigned char b = BYE;
    for (int q = 0; bye && q < w->nranks; q++)
        if (w->fd[q] >= 0) (void)send(w->fd[q], &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    for (int i = 0; i < w->nobs; i++) {
        pthread_join(w->obs[i].thread, NULL);
        munmap(w->obs[i].mark, sizeof(mark_t));
    }
    if (w->mark) {
        if (w->mark_name[0]) shm_unlink(w->mark_name);
        munmap(w->mark, sizeof(mark_t));
    }
    for (int q = 0; q < w->nranks; q++)
        if (w->fd[q] >= 0) close(w->fd[q]);
    if (w->wake[0] >= 0) close(w->wake[0]), close(w->wake[1]);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->obs);
    free(w->heard);
    free(w->gone);
    free(w->fd);
    free(w);
}

moea2a_result_t m2a_watch_start(m2a_bootstrap_t *bs, const unsigned char *watched, double timeout_s,
                                double silence_s, m2a_watch_t **out)
{
    *out = NULL;
    m2a_watch_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->fd = malloc(sizeof(int) * (size_t)bs->nranks)) || !(w->gone = calloc((size_t)bs->nranks, 1)) ||
        !(w->heard = calloc((size_t)bs->nranks, sizeof(double)))) {
        if (w) free(w->fd), free(w->gone);
        free(w);
        return m2a_fail(MOEA2A_ERR_NO_MEMORY, "peer watcher: out of memory for %d ranks", bs->nranks);
    }
    w->rank = bs->rank, w->nranks = bs->nranks, w->news.dead = -1, w->silence_s = silence_s;
    for (int q = 0; q < w->nranks; q++) w->fd[q] = -1;
    w->wake[0] = w->wake[1] = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    /* 1. this rank's mark, held by the watcher thread before any peer looks at it */
    if (make_mark(w, bs->tag))
        M2A_INFO(M2A_SUBSYS_BOOTSTRAP, "peer watcher: no mark in shared memory (%s); the links alone tell",
                 strerror(errno));
    moea2a_result_t r = pipe2(w->wake, O_CLOEXEC) ? m2a_fail(MOEA2A_ERR_SYSTEM, "peer watcher: pipe: %s", strerror(errno))
                        : pthread_create(&w->thread, NULL, watch_loop, w)
                            ? m2a_fail(MOEA2A_ERR_SYSTEM, "peer watcher: cannot start its thread")
                            : MOEA2A_SUCCESS;
    w->running = r == MOEA2A_SUCCESS;
    pthread_mutex_lock(&w->mu);
    while (w->running && !w->holding) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    /* 2. every rank's pid (0: no mark), which names its mark; after this allgather
     * every mark exists and is held. Then the host's marks mapped, a barrier, and
     * each mark unlinked: a rank killed later leaves no name behind. */
    int32_t *pid = calloc((size_t)w->nranks, sizeof(int32_t));
    if (r == MOEA2A_SUCCESS && !pid) r = m2a_fail(MOEA2A_ERR_NO_MEMORY, "peer watcher: out of memory");
    if (r == MOEA2A_SUCCESS) {
        pid[w->rank] = w->mark && w->holding > 0 ? (int32_t)getpid() : 0;
        r = m2a_bootstrap_allgather(bs, pid, sizeof(int32_t));
    }
    if (r == MOEA2A_SUCCESS) map_marks(w, bs, watched, pid, bs->tag);
    free(pid);
    if (r == MOEA2A_SUCCESS) r = m2a_bootstrap_barrier(bs);
    if (w->mark) shm_unlink(w->mark_name), w->mark_name[0] = 0;
    /* 3. the links, then the watcher thread polls them */
    if (r == MOEA2A_SUCCESS) r = link_all(w, bs, watched, m2a_now() + timeout_s);
    if (r != MOEA2A_SUCCESS) {
        close_all(w, 0);
        return r;
    }
    pthread_mutex_lock(&w->mu);
    w->linked = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    *out = w;
    return MOEA2A_SUCCESS;
}

int m2a_watch_dead(const m2a_watch_t *w) { return w ? __atomic_load_n(&w->news.dead, __ATOMIC_ACQUIRE) : -1; }

const m2a_death_news_t *m2a_watch_news(const m2a_watch_t *w) { return w ? &w->news : NULL; }

double m2a_watch_dead_since(const m2a_watch_t *w)
{
    return m2a_watch_dead(w) >= 0 ? m2a_now() - w->news.at : -1.0;
}

void m2a_watch_how(m2a_watch_t *w, char *buf, size_t len)
{
    if (!w) {
        snprintf(buf, len, "no peer watcher");
        return;
    }
    pthread_mutex_lock(&w->mu);
    snprintf(buf, len, "%s", w->how);
    pthread_mutex_unlock(&w->mu);
}

int m2a_watch_is_dead(m2a_watch_t *w, int q)
{
    if (!w || q < 0 || q >= w->nranks) return 0;
    pthread_mutex_lock(&w->mu);
    const int g = w->gone[q];
    pthread_mutex_unlock(&w->mu);
    return g;
}

moea2a_result_t m2a_watch_add(m2a_watch_t *w, volatile int32_t *word)
{
    if (!w) return MOEA2A_SUCCESS;
    moea2a_result_t r = MOEA2A_SUCCESS;
    pthread_mutex_lock(&w->mu);
    if (w->nwords == M2A_WATCH_MAX_WORDS)
        r = m2a_fail(MOEA2A_ERR_NO_MEMORY, "peer watcher: more than %d contexts on one communicator",
                     M2A_WATCH_MAX_WORDS);
    else
        w->words[w->nwords++] = word, *word = w->news.dead + 1;
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
    if (w) close_all(w, 1);
}

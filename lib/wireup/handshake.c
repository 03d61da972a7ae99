#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wireup/bootstrap.h"
#include "base/clock.h"
#include "wireup/handshake.h"
#include "base/log.h"

/* A connection that has this long to send its message: an honest rank answers the
 * challenge at once, so this only bounds what an idle connection holds. */
#define HANDSHAKE_S 5.0
/* Connections in handshake at once; past this the oldest is shed (it can retry). */
#define MAX_PENDING 256
/* Sent once a message passed authentication, so that a client tells "shed or
 * refused" (closed before it) from "accepted" and retries only the former. */
#define ACCEPTED_WORD (M2A_ID_MAGIC ^ 0xacceULL)

typedef struct {
    uint64_t magic, tag;
    uint8_t challenge[M2A_CHALLENGE_BYTES];
} challenge_t;

typedef struct {
    int fd;
    double deadline;
    size_t got;
    uint8_t challenge[M2A_CHALLENGE_BYTES];
    unsigned char *msg;
} pending_t;

void m2a_handshake_mac(const m2a_handshake_t *hs, const uint8_t *challenge, const void *msg, size_t len,
                       uint8_t out[M2A_MAC_BYTES])
{
    m2a_part_t parts[4] = {{hs->label, strlen(hs->label) + 1},
                           {&hs->tag, sizeof(hs->tag)},
                           {challenge, M2A_CHALLENGE_BYTES},
                           {msg, len}};
    m2a_hmac(hs->key, parts, 4, out);
}

static void drop(pending_t *p)
{
    close(p->fd);
    free(p->msg);
    p->fd = -1;
    p->msg = NULL;
}

/* Drops the connection that has waited longest, the one whose deadline comes first
 * (it may connect again). */
static void shed_oldest(pending_t *pend, int *npend)
{
    int o = 0;
    for (int i = 1; i < *npend; i++)
        if (pend[i].deadline < pend[o].deadline) o = i;
    drop(&pend[o]);
    pend[o] = pend[--(*npend)];
}

/* Accepts what the listener has and challenges it; 0 while the listener is healthy. */
static int take_new(int listen_fd, const m2a_handshake_t *hs, pending_t *pend, int *npend, double deadline)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            /* Out of descriptors with a connection waiting: shed the oldest pending one
             * so the newcomer gets its turn; with none to shed, let poll's next round
             * (after a short pause, not a spin) try again. */
            if (*npend == 0) {
                usleep(10000);
                return 0;
            }
            shed_oldest(pend, npend);
            continue;
        }
        if (fd < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) ? 0 : -1;
        if (*npend == MAX_PENDING) shed_oldest(pend, npend);
        pending_t *p = &pend[*npend];
        challenge_t c = {M2A_ID_MAGIC, hs->tag, {0}};
        p->fd = fd;
        p->got = 0;
        p->deadline = m2a_now() + HANDSHAKE_S < deadline ? m2a_now() + HANDSHAKE_S : deadline;
        p->msg = malloc(hs->msg_len);
        /* A fresh socket's send buffer takes 32 bytes at once. */
        if (!p->msg || m2a_random(c.challenge, sizeof(c.challenge)) ||
            send(fd, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(c)) {
            drop(p);
            continue;
        }
        memcpy(p->challenge, c.challenge, sizeof(c.challenge));
        (*npend)++;
    }
}

/* Reads what p's peer sent; 1 when the message is complete, -1 to drop it, 0 for more. */
static int read_some(pending_t *p, const m2a_handshake_t *hs)
{
    ssize_t r = recv(p->fd, p->msg + p->got, hs->msg_len - p->got, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return -1;
    if (r > 0) p->got += (size_t)r;
    return p->got == hs->msg_len;
}

static int authentic(const pending_t *p, const m2a_handshake_t *hs)
{
    uint8_t mac[M2A_MAC_BYTES];
    size_t body = hs->msg_len - M2A_MAC_BYTES;
    m2a_handshake_mac(hs, p->challenge, p->msg, body, mac);
    return m2a_equal_ct(mac, p->msg + body, M2A_MAC_BYTES);
}

int m2a_handshake_serve(int listen_fd, const m2a_handshake_t *hs, double deadline,
                        int (*accepted)(void *ctx, int fd, const void *msg, const uint8_t *challenge),
                        int (*done)(void *ctx), void *ctx)
{
    pending_t *pend = calloc(MAX_PENDING, sizeof(*pend));
    struct pollfd *pfd = calloc(MAX_PENDING + 1, sizeof(*pfd));
    int npend = 0, rc = -1, rejected = 0;
    while (pend && pfd && !done(ctx)) {
        double t = m2a_now();
        if (t >= deadline) break;
        /* Expire, then wait for the listener or any pending connection. */
        double next = deadline;
        for (int i = 0; i < npend; i++) {
            if (pend[i].deadline <= t) {
                drop(&pend[i]);
                pend[i--] = pend[--npend];
                continue;
            }
            if (pend[i].deadline < next) next = pend[i].deadline;
        }
        pfd[0] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
        for (int i = 0; i < npend; i++) pfd[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        int ms = (int)((next - t) * 1000.0) + 1;
        int n = poll(pfd, (nfds_t)npend + 1, ms);
        if (n < 0 && errno != EINTR) break;
        if (n <= 0) continue;
        /* Pending ones first: their slots move when one completes. */
        for (int i = npend - 1; i >= 0; i--) {
            if (!pfd[i + 1].revents) continue;
            int st = read_some(&pend[i], hs);
            if (st == 0) continue;
            uint64_t ack = ACCEPTED_WORD;
            const int genuine = st > 0 && authentic(&pend[i], hs);
            if (st > 0 && !genuine && !rejected++)
                M2A_WARN(M2A_SUBSYS_BOOTSTRAP, "%s: dropped a connection that failed authentication (another "
                         "job's id or key, or not a moea2a rank)", hs->label);
            if (genuine && send(pend[i].fd, &ack, sizeof(ack), MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(ack) &&
                accepted(ctx, pend[i].fd, pend[i].msg, pend[i].challenge))
                free(pend[i].msg); /* the fd now belongs to the caller */
            else
                drop(&pend[i]);
            pend[i] = pend[--npend];
        }
        if ((pfd[0].revents & POLLIN) && take_new(listen_fd, hs, pend, &npend, deadline)) break;
    }
    if (pend && done(ctx)) rc = 0;
    for (int i = 0; pend && i < npend; i++) drop(&pend[i]);
    free(pend);
    free(pfd);
    return rc;
}

#define REFUSED \
    "timed out; every answer to its challenge was refused (the key differs: MOEA2A_KEY or MOEA2A_KEY_FILE not " \
    "the same on every rank, or a stale id?)"

int m2a_handshake_connect(const m2a_sockaddr_t *addr, const m2a_handshake_t *hs, void *msg, double deadline,
                          m2a_sock_status_t *st, char *why, size_t whylen)
{
    size_t body = hs->msg_len - M2A_MAC_BYTES;
    int refused = 0;
    for (int delay_ms = 1;; delay_ms = delay_ms < 100 ? 2 * delay_ms : 100) {
        int fd = m2a_sock_connect(addr, deadline, st);
        if (fd < 0) {
            snprintf(why, whylen, "%s", *st != M2A_SOCK_TIMEOUT ? strerror(errno) : refused ? REFUSED : "timed out");
            return -1;
        }
        challenge_t c;
        *st = m2a_sock_recv(fd, &c, sizeof(c), deadline);
        if (*st == M2A_SOCK_OK && (c.magic != M2A_ID_MAGIC || c.tag != hs->tag)) {
            close(fd);
            *st = M2A_SOCK_ERROR;
            snprintf(why, whylen, "it serves another unique id (a stale id, or another job's)");
            return -1;
        }
        if (*st == M2A_SOCK_OK) {
            m2a_handshake_mac(hs, c.challenge, msg, body, (uint8_t *)msg + body);
            uint64_t ack = 0;
            *st = m2a_sock_send(fd, msg, hs->msg_len, deadline);
            if (*st == M2A_SOCK_OK) *st = m2a_sock_recv(fd, &ack, sizeof(ack), deadline);
            if (*st == M2A_SOCK_OK && ack == ACCEPTED_WORD) return fd;
            refused += *st == M2A_SOCK_CLOSED;
        }
        close(fd);
        if (*st == M2A_SOCK_TIMEOUT || m2a_now() >= deadline) {
            *st = M2A_SOCK_TIMEOUT;
            snprintf(why, whylen, "%s", refused ? REFUSED : "timed out");
            return -1;
        }
        /* Closed before accepting: a busy server shed us, or our answer was refused;
         * ask again until the deadline. */
        usleep((useconds_t)delay_ms * 1000);
    }
}

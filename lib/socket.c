#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "params.h"
#include "socket.h"

static int remaining_ms(double deadline)
{
    double left = deadline - m2a_now();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

int m2a_sock_pick_addr(struct sockaddr_in *addr, char *why, size_t whylen)
{
    const char *want = m2a_param_str("MOEA2A_SOCKET_IFNAME");
    struct ifaddrs *ifs, *chosen = NULL;
    memset(addr, 0, sizeof(*addr));
    addr->sin_family = AF_INET;
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (getifaddrs(&ifs)) {
        snprintf(why, whylen, "getifaddrs failed (%s); using 127.0.0.1", strerror(errno));
        return 0;
    }
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        if (*want ? !strncmp(i->ifa_name, want, strlen(want)) : !(i->ifa_flags & IFF_LOOPBACK)) {
            chosen = i;
            break;
        }
    }
    int rc = 0;
    if (chosen) {
        addr->sin_addr = ((struct sockaddr_in *)chosen->ifa_addr)->sin_addr;
        snprintf(why, whylen, "interface %s", chosen->ifa_name);
    } else if (*want) {
        snprintf(why, whylen, "no IPv4 interface matches MOEA2A_SOCKET_IFNAME='%s'", want);
        rc = -1;
    } else {
        snprintf(why, whylen, "no non-loopback interface is up; using 127.0.0.1");
    }
    freeifaddrs(ifs);
    return rc;
}

int m2a_sock_parse_addr(const char *text, struct sockaddr_in *addr)
{
    char host[256];
    const char *colon = strrchr(text, ':');
    long port = 0;
    size_t hl = colon ? (size_t)(colon - text) : strlen(text);
    if (hl == 0 || hl >= sizeof(host)) return -1;
    memcpy(host, text, hl);
    host[hl] = 0;
    if (colon) {
        char *end;
        port = strtol(colon + 1, &end, 10);
        if (*end || port < 0 || port > 65535 || end == colon + 1) return -1;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, NULL, &hints, &res)) return -1;
    memcpy(addr, res->ai_addr, sizeof(*addr));
    freeaddrinfo(res);
    addr->sin_port = htons((uint16_t)port);
    return 0;
}

void m2a_sock_format_addr(const struct sockaddr_in *addr, char *buf, size_t len)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &addr->sin_addr, ip, sizeof(ip));
    snprintf(buf, len, "%s:%u", ip, ntohs(addr->sin_port));
}

static void set_nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int m2a_sock_listen(struct sockaddr_in *addr)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    if (addr->sin_port) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t sl = sizeof(*addr);
    if (bind(fd, (struct sockaddr *)addr, sizeof(*addr)) || listen(fd, 1024) ||
        getsockname(fd, (struct sockaddr *)addr, &sl)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    set_nonblocking(fd);
    return fd;
}

/* On loopback, a connect to a port nobody listens on yet can pick that very port as
 * its ephemeral source and connect to itself (TCP simultaneous open). Such a socket
 * must be treated as "refused", or the rank would read its own messages. */
static int is_self_connected(int fd)
{
    struct sockaddr_in self, peer;
    socklen_t sl = sizeof(self), pl = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&self, &sl) || getpeername(fd, (struct sockaddr *)&peer, &pl)) return 0;
    return self.sin_port == peer.sin_port && self.sin_addr.s_addr == peer.sin_addr.s_addr;
}

int m2a_sock_connect(const struct sockaddr_in *addr, double deadline, m2a_sock_status_t *status)
{
    int delay_ms = 1;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { *status = M2A_SOCK_ERROR; return -1; }
        set_nonblocking(fd);
        int rc = connect(fd, (const struct sockaddr *)addr, sizeof(*addr));
        if (rc && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof(err);
            if (poll(&p, 1, remaining_ms(deadline)) == 1 &&
                !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) && err == 0)
                rc = 0;
            else
                errno = err ? err : ETIMEDOUT;
        }
        if (rc == 0 && !is_self_connected(fd)) { *status = M2A_SOCK_OK; return fd; }
        int e = rc == 0 ? ECONNREFUSED : errno;
        close(fd);
        /* The listener may not be up yet (rendezvous races); retry until the deadline. */
        if (e != ECONNREFUSED && e != ETIMEDOUT && e != ECONNRESET && e != EAGAIN) {
            errno = e;
            *status = M2A_SOCK_ERROR;
            return -1;
        }
        if (m2a_now() >= deadline) { *status = M2A_SOCK_TIMEOUT; return -1; }
        usleep((useconds_t)delay_ms * 1000);
        if (delay_ms < 100) delay_ms *= 2;
    }
}

int m2a_sock_accept(int listen_fd, double deadline, m2a_sock_status_t *status)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            set_nonblocking(fd);
            *status = M2A_SOCK_OK;
            return fd;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
            *status = M2A_SOCK_ERROR;
            return -1;
        }
        struct pollfd p = {.fd = listen_fd, .events = POLLIN};
        int ms = remaining_ms(deadline);
        if (ms == 0 || poll(&p, 1, ms) == 0) { *status = M2A_SOCK_TIMEOUT; return -1; }
    }
}

m2a_sock_status_t m2a_sock_sendrecv(int send_fd, const void *sbuf, size_t slen, int recv_fd,
                                    void *rbuf, size_t rlen, double deadline, int *which)
{
    size_t sent = 0, got = 0;
    while (sent < slen || got < rlen) {
        struct pollfd p[2];
        int n = 0, si = -1, ri = -1;
        if (sent < slen) { si = n; p[n].fd = send_fd; p[n].events = POLLOUT; n++; }
        if (got < rlen) { ri = n; p[n].fd = recv_fd; p[n].events = POLLIN; n++; }
        int ms = remaining_ms(deadline);
        int rc = ms ? poll(p, (nfds_t)n, ms) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) { *which = si >= 0 ? 0 : 1; return M2A_SOCK_ERROR; }
        if (rc == 0) { *which = got < rlen ? 1 : 0; return M2A_SOCK_TIMEOUT; }
        if (ri >= 0 && p[ri].revents) {
            ssize_t r = recv(recv_fd, (char *)rbuf + got, rlen - got, 0);
            if (r == 0) { *which = 1; return M2A_SOCK_CLOSED; }
            if (r < 0 && errno != EAGAIN && errno != EINTR) {
                *which = 1;
                return errno == ECONNRESET ? M2A_SOCK_CLOSED : M2A_SOCK_ERROR;
            }
            if (r > 0) got += (size_t)r;
        }
        if (si >= 0 && p[si].revents) {
            ssize_t r = send(send_fd, (const char *)sbuf + sent, slen - sent, MSG_NOSIGNAL);
            if (r < 0 && errno != EAGAIN && errno != EINTR) {
                *which = 0;
                return (errno == EPIPE || errno == ECONNRESET) ? M2A_SOCK_CLOSED : M2A_SOCK_ERROR;
            }
            if (r > 0) sent += (size_t)r;
        }
    }
    return M2A_SOCK_OK;
}

m2a_sock_status_t m2a_sock_send(int fd, const void *buf, size_t len, double deadline)
{
    int which;
    return m2a_sock_sendrecv(fd, buf, len, -1, NULL, 0, deadline, &which);
}

m2a_sock_status_t m2a_sock_recv(int fd, void *buf, size_t len, double deadline)
{
    int which;
    return m2a_sock_sendrecv(-1, NULL, 0, fd, buf, len, deadline, &which);
}

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

#include "base/clock.h"
#include "base/params.h"
#include "wireup/socket.h"

static int remaining_ms(double deadline)
{
    double left = deadline - m2a_now();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

socklen_t m2a_sock_len(const m2a_sockaddr_t *a)
{
    return a->sa.sa_family == AF_INET6 ? (socklen_t)sizeof(a->in6) : (socklen_t)sizeof(a->in4);
}

uint16_t m2a_sock_port(const m2a_sockaddr_t *a)
{
    return ntohs(a->sa.sa_family == AF_INET6 ? a->in6.sin6_port : a->in4.sin_port);
}

void m2a_sock_set_port(m2a_sockaddr_t *a, uint16_t port)
{
    if (a->sa.sa_family == AF_INET6) a->in6.sin6_port = htons(port);
    else a->in4.sin_port = htons(port);
}

int m2a_sock_is_loopback(const m2a_sockaddr_t *a)
{
    if (a->sa.sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&a->in6.sin6_addr);
    return (ntohl(a->in4.sin_addr.s_addr) >> 24) == 127;
}

static void loopback(m2a_sockaddr_t *a, int family)
{
    memset(a, 0, sizeof(*a));
    if (family == AF_INET6) {
        a->in6.sin6_family = AF_INET6;
        a->in6.sin6_addr = in6addr_loopback;
    } else {
        a->in4.sin_family = AF_INET;
        a->in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
}

int m2a_sock_pick_addr(m2a_sockaddr_t *addr, int family, char *why, size_t whylen)
{
    const char *want = m2a_param_str("MOEA2A_SOCKET_IFNAME"), *fam = family == AF_INET6 ? "IPv6" : "IPv4";
    struct ifaddrs *ifs, *chosen = NULL;
    loopback(addr, family);
    if (getifaddrs(&ifs)) {
        snprintf(why, whylen, "getifaddrs failed (%s); using loopback", strerror(errno));
        return 0;
    }
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != family || !(i->ifa_flags & IFF_UP)) continue;
        if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) continue;
        if (*want ? !strncmp(i->ifa_name, want, strlen(want)) : !(i->ifa_flags & IFF_LOOPBACK)) {
            chosen = i;
            break;
        }
    }
    int rc = 0;
    if (chosen) {
        memcpy(addr, chosen->ifa_addr, family == AF_INET6 ? sizeof(addr->in6) : sizeof(addr->in4));
        m2a_sock_set_port(addr, 0);
        snprintf(why, whylen, "interface %s", chosen->ifa_name);
    } else if (*want) {
        snprintf(why, whylen, "no %s interface matches MOEA2A_SOCKET_IFNAME='%s'", fam, want);
        rc = -1;
    } else {
        snprintf(why, whylen, "no non-loopback %s interface is up; using loopback", fam);
    }
    freeifaddrs(ifs);
    return rc;
}

int m2a_sock_parse_addr(const char *text, m2a_sockaddr_t *addr, char *why, size_t whylen)
{
    char host[256];
    const char *h = text, *port_text = NULL;
    size_t hl;
    if (*text == '[') { /* [ipv6]:port */
        const char *close = strchr(text, ']');
        if (!close || (close[1] && close[1] != ':'))
            return snprintf(why, whylen, "'%s' is not [IPv6 address]:port", text), -1;
        h = text + 1, hl = (size_t)(close - h), port_text = close[1] ? close + 2 : NULL;
    } else {
        const char *colon = strrchr(text, ':');
        if (colon && strchr(text, ':') != colon)
            return snprintf(why, whylen, "'%s': write an IPv6 address in brackets, [address]:port", text), -1;
        hl = colon ? (size_t)(colon - text) : strlen(text), port_text = colon ? colon + 1 : NULL;
    }
    if (hl == 0 || hl >= sizeof(host)) return snprintf(why, whylen, "'%s' has no host", text), -1;
    memcpy(host, h, hl);
    host[hl] = 0;
    long port = 0;
    if (port_text) {
        char *end;
        port = strtol(port_text, &end, 10);
        if (*end || port < 0 || port > 65535 || end == port_text)
            return snprintf(why, whylen, "'%s': the port '%s' is not a number 0..65535", text, port_text), -1;
    }
    struct addrinfo hints = {.ai_family = *text == '[' ? AF_INET6 : AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e) return snprintf(why, whylen, "the host '%s' does not resolve (%s)", host, gai_strerror(e)), -1;
    /* IPv4 first where a name has both: the ranks' listeners pick IPv4 by default */
    const struct addrinfo *pick = res;
    for (const struct addrinfo *r = res; r; r = r->ai_next)
        if (r->ai_family == AF_INET) { pick = r; break; }
    memset(addr, 0, sizeof(*addr));
    memcpy(addr, pick->ai_addr, pick->ai_addrlen < sizeof(*addr) ? pick->ai_addrlen : sizeof(*addr));
    freeaddrinfo(res);
    m2a_sock_set_port(addr, (uint16_t)port);
    return 0;
}

void m2a_sock_format_addr(const m2a_sockaddr_t *addr, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (addr->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &addr->in6.sin6_addr, ip, sizeof(ip));
        snprintf(buf, len, "[%s]:%u", ip, m2a_sock_port(addr));
    } else {
        inet_ntop(AF_INET, &addr->in4.sin_addr, ip, sizeof(ip));
        snprintf(buf, len, "%s:%u", ip, m2a_sock_port(addr));
    }
}

static void set_nonblocking(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int m2a_sock_listen(m2a_sockaddr_t *addr)
{
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    if (m2a_sock_port(addr)) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (addr->sa.sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    socklen_t sl = sizeof(*addr);
    if (bind(fd, &addr->sa, m2a_sock_len(addr)) || listen(fd, 1024) || getsockname(fd, &addr->sa, &sl)) {
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
    m2a_sockaddr_t self, peer;
    socklen_t sl = sizeof(self), pl = sizeof(peer);
    memset(&self, 0, sizeof(self)), memset(&peer, 0, sizeof(peer));
    if (getsockname(fd, &self.sa, &sl) || getpeername(fd, &peer.sa, &pl)) return 0;
    return sl == pl && !memcmp(&self, &peer, sl);
}

int m2a_sock_connect(const m2a_sockaddr_t *addr, double deadline, m2a_sock_status_t *status)
{
    int delay_ms = 1;
    for (;;) {
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { *status = M2A_SOCK_ERROR; return -1; }
        set_nonblocking(fd);
        int rc = connect(fd, &addr->sa, m2a_sock_len(addr));
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
    return m2a_sock_sendrecv_from(send_fd, sbuf, slen, &sent, recv_fd, rbuf, rlen, &got, deadline, which);
}

m2a_sock_status_t m2a_sock_sendrecv_from(int send_fd, const void *sbuf, size_t slen, size_t *sent_io, int recv_fd,
                                         void *rbuf, size_t rlen, size_t *got_io, double deadline, int *which)
{
    size_t sent = *sent_io, got = *got_io;
    m2a_sock_status_t st = M2A_SOCK_OK;
#define M2A_SOCK_END(s) do { st = (s); goto out; } while (0)
    while (sent < slen || got < rlen) {
        struct pollfd p[2];
        int n = 0, si = -1, ri = -1;
        if (sent < slen) { si = n; p[n].fd = send_fd; p[n].events = POLLOUT; n++; }
        if (got < rlen) { ri = n; p[n].fd = recv_fd; p[n].events = POLLIN; n++; }
        int ms = remaining_ms(deadline);
        int rc = ms ? poll(p, (nfds_t)n, ms) : 0;
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) { *which = si >= 0 ? 0 : 1; M2A_SOCK_END(M2A_SOCK_ERROR); }
        if (rc == 0) { *which = got < rlen ? 1 : 0; M2A_SOCK_END(M2A_SOCK_TIMEOUT); }
        if (ri >= 0 && p[ri].revents) {
            ssize_t r = recv(recv_fd, (char *)rbuf + got, rlen - got, 0);
            if (r == 0) { *which = 1; M2A_SOCK_END(M2A_SOCK_CLOSED); }
            if (r < 0 && errno != EAGAIN && errno != EINTR) {
                *which = 1;
                M2A_SOCK_END(errno == ECONNRESET ? M2A_SOCK_CLOSED : M2A_SOCK_ERROR);
            }
            if (r > 0) got += (size_t)r;
        }
        if (si >= 0 && p[si].revents) {
            ssize_t r = send(send_fd, (const char *)sbuf + sent, slen - sent, MSG_NOSIGNAL);
            if (r < 0 && errno != EAGAIN && errno != EINTR) {
                *which = 0;
                M2A_SOCK_END((errno == EPIPE || errno == ECONNRESET) ? M2A_SOCK_CLOSED : M2A_SOCK_ERROR);
            }
            if (r > 0) sent += (size_t)r;
        }
    }
out:
    *sent_io = sent, *got_io = got;
    return st;
#undef M2A_SOCK_END
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

/* TCP helpers for the rendezvous: IPv4 and IPv6 addresses, listening, connecting with
 * retry, and full-duplex transfers, every one bounded by a deadline (m2a_now()
 * seconds). */
#ifndef M2A_SOCKET_H
#define M2A_SOCKET_H
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef enum {
    M2A_SOCK_OK = 0,
    M2A_SOCK_TIMEOUT,
    M2A_SOCK_CLOSED, /* the peer closed the connection (or reset it) */
    M2A_SOCK_ERROR   /* errno says why */
} m2a_sock_status_t;

/* An IPv4 or IPv6 address and port (sa.sa_family says which); fixed size, so it can
 * travel in a unique id and in the ranks' address table. */
typedef union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
} m2a_sockaddr_t;

socklen_t m2a_sock_len(const m2a_sockaddr_t *a);
uint16_t m2a_sock_port(const m2a_sockaddr_t *a);
void m2a_sock_set_port(m2a_sockaddr_t *a, uint16_t port);
int m2a_sock_is_loopback(const m2a_sockaddr_t *a);

/* The address to listen on, of family AF_INET or AF_INET6: MOEA2A_SOCKET_IFNAME
 * (prefix), else the first non-loopback interface of that family that is up (IPv6:
 * not link-local), else loopback. Port 0. */
int m2a_sock_pick_addr(m2a_sockaddr_t *addr, int family, char *why, size_t whylen);
/* "host:port", "[ipv6]:port" (or without ":port", port 0) to an address; -1 with the
 * reason in why (malformed, or a host that does not resolve). */
int m2a_sock_parse_addr(const char *text, m2a_sockaddr_t *addr, char *why, size_t whylen);
/* "1.2.3.4:5" or "[::1]:5" */
void m2a_sock_format_addr(const m2a_sockaddr_t *addr, char *buf, size_t len);

/* Binds and listens on *addr (port 0: any); *addr gets the port chosen. -1 on error. */
int m2a_sock_listen(m2a_sockaddr_t *addr);
/* Connects, retrying refused connections until deadline. -1 with *status set. */
int m2a_sock_connect(const m2a_sockaddr_t *addr, double deadline, m2a_sock_status_t *status);
/* Accepts one connection; -1 with *status set on timeout or error. */
int m2a_sock_accept(int listen_fd, double deadline, m2a_sock_status_t *status);

m2a_sock_status_t m2a_sock_send(int fd, const void *buf, size_t len, double deadline);
m2a_sock_status_t m2a_sock_recv(int fd, void *buf, size_t len, double deadline);
/* Sends to send_fd while receiving from recv_fd (they may be the same socket), so
 * that a ring of ranks all sending large blocks at once cannot deadlock.
 * *which is set to 0 if the send side failed, 1 if the receive side did. */
m2a_sock_status_t m2a_sock_sendrecv(int send_fd, const void *sbuf, size_t slen, int recv_fd,
                                    void *rbuf, size_t rlen, double deadline, int *which);
/* The same, resuming from and keeping the bytes already sent (*sent) and received
 * (*got): after a failure they say how far each side got. */
m2a_sock_status_t m2a_sock_sendrecv_from(int send_fd, const void *sbuf, size_t slen, size_t *sent, int recv_fd,
                                         void *rbuf, size_t rlen, size_t *got, double deadline, int *which);
#endif

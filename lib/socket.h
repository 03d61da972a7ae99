/* TCP helpers for the rendezvous: IPv4 addresses, listening, connecting with retry,
 * and full-duplex transfers, every one bounded by a deadline (m2a_now() seconds). */
#ifndef M2A_SOCKET_H
#define M2A_SOCKET_H
#include <netinet/in.h>
#include <stddef.h>

typedef enum {
    M2A_SOCK_OK = 0,
    M2A_SOCK_TIMEOUT,
    M2A_SOCK_CLOSED, /* the peer closed the connection (or reset it) */
    M2A_SOCK_ERROR   /* errno says why */
} m2a_sock_status_t;

/* The address to listen on: MOEA2A_SOCKET_IFNAME (prefix), else the first
 * non-loopback IPv4 interface that is up, else 127.0.0.1. Port 0. */
int m2a_sock_pick_addr(struct sockaddr_in *addr, char *why, size_t whylen);
/* "host:port" (or "host", port 0) to an address. */
int m2a_sock_parse_addr(const char *text, struct sockaddr_in *addr);
void m2a_sock_format_addr(const struct sockaddr_in *addr, char *buf, size_t len);

/* Binds and listens on *addr (port 0: any); *addr gets the port chosen. -1 on error. */
int m2a_sock_listen(struct sockaddr_in *addr);
/* Connects, retrying refused connections until deadline. -1 with *status set. */
int m2a_sock_connect(const struct sockaddr_in *addr, double deadline, m2a_sock_status_t *status);
/* Accepts one connection; -1 with *status set on timeout or error. */
int m2a_sock_accept(int listen_fd, double deadline, m2a_sock_status_t *status);

m2a_sock_status_t m2a_sock_send(int fd, const void *buf, size_t len, double deadline);
m2a_sock_status_t m2a_sock_recv(int fd, void *buf, size_t len, double deadline);
/* Sends to send_fd while receiving from recv_fd (they may be the same socket), so
 * that a ring of ranks all sending large blocks at once cannot deadlock.
 * *which is set to 0 if the send side failed, 1 if the receive side did. */
m2a_sock_status_t m2a_sock_sendrecv(int send_fd, const void *sbuf, size_t slen, int recv_fd,
                                    void *rbuf, size_t rlen, double deadline, int *which);
#endif

/* Authenticated TCP handshakes for the bootstrap (rendezvous and ring links).
 *
 * The side that accepts sends a challenge (the id's public tag and 16 random bytes)
 * as soon as a connection arrives; the side that connects answers with one fixed-size
 * message whose last M2A_MAC_BYTES are HMAC-SHA256(key, label | tag | challenge |
 * message). The key never travels. The server serves every pending connection at
 * once (poll), each with its own deadline, so silent or junk connections are dropped
 * without delaying anyone; a message that fails authentication gets nothing back. */
#ifndef M2A_HANDSHAKE_H
#define M2A_HANDSHAKE_H
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "wireup/auth.h"
#include "wireup/socket.h"

#define M2A_CHALLENGE_BYTES 16

typedef struct {
    const uint8_t *key;  /* M2A_KEY_BYTES */
    uint64_t tag;        /* the unique id's public tag: names which rendezvous this is */
    const char *label;   /* what the message is for ("join", "ring"): a MAC for one is no MAC for another */
    size_t msg_len;      /* the client's message, its MAC in the last M2A_MAC_BYTES */
} m2a_handshake_t;

/* Serves listen_fd until done(ctx) or deadline. For each authenticated message,
 * accepted(ctx, fd, msg, challenge) takes the connection (returns 1) or lets it be
 * closed (0). Returns 0 when done, -1 at the deadline. */
int m2a_handshake_serve(int listen_fd, const m2a_handshake_t *hs, double deadline,
                        int (*accepted)(void *ctx, int fd, const void *msg, const uint8_t *challenge),
                        int (*done)(void *ctx), void *ctx);

/* Connects to addr, takes its challenge, and sends msg (msg_len bytes; its MAC is
 * filled in here). Retries, until deadline, a server that is not up yet or that shed
 * the connection before its challenge. Returns the socket, or -1 with *st set and a
 * reason in why (a challenge of another id: *st = M2A_SOCK_ERROR). */
int m2a_handshake_connect(const m2a_sockaddr_t *addr, const m2a_handshake_t *hs, void *msg, double deadline,
                          m2a_sock_status_t *st, char *why, size_t whylen);

/* MAC of parts under hs's key and label, as both sides compute it. */
void m2a_handshake_mac(const m2a_handshake_t *hs, const uint8_t *challenge, const void *msg, size_t len,
                       uint8_t out[M2A_MAC_BYTES]);
#endif

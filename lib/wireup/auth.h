/* Keys and message authentication for the rendezvous: SHA-256 and HMAC-SHA256
 * (FIPS 180-4, RFC 2104), a constant-time comparison, random bytes, and the key of
 * moea2a_comm_init_env (MOEA2A_KEY or MOEA2A_KEY_FILE). Self-contained so the core
 * library needs no crypto library; nothing here is secret-dependent in its timing. */
#ifndef M2A_AUTH_H
#define M2A_AUTH_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

#define M2A_KEY_BYTES 32
#define M2A_MAC_BYTES 32

void m2a_sha256(const void *data, size_t len, uint8_t out[32]);

/* HMAC-SHA256 over the concatenation of n parts. */
typedef struct {
    const void *data;
    size_t len;
} m2a_part_t;
void m2a_hmac(const uint8_t key[M2A_KEY_BYTES], const m2a_part_t *parts, int n, uint8_t out[M2A_MAC_BYTES]);

/* 1 when a and b are equal; the time taken does not depend on where they differ. */
int m2a_equal_ct(const void *a, const void *b, size_t len);

/* len bytes from the kernel's random source; MOEA2A_ERR_SYSTEM if it has none. */
moea2a_result_t m2a_random(void *buf, size_t len);

/* The shared key of moea2a_comm_init_env: SHA-256 of MOEA2A_KEY, or of the contents of
 * MOEA2A_KEY_FILE (a regular file of this user that no one else may read: mode 0600
 * or stricter). *have_key = 0 when neither is set; the key is then unusable. */
moea2a_result_t m2a_env_key(uint8_t key[M2A_KEY_BYTES], int *have_key);
#endif

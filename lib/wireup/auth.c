#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wireup/auth.h"
#include "base/error.h"
#include "base/params.h"

/* ---- SHA-256 (FIPS 180-4) ---------------------------------------------------------- */

typedef struct {
    uint32_t h[8];
    uint64_t bits;
    uint8_t block[64];
    size_t used;
} sha256_t;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(sha256_t *s, const uint8_t *p)
{
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, s->h, sizeof(v));
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + K[i] + w[i];
        uint32_t t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof(uint32_t));
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += v[i];
}

static void sha256_init(sha256_t *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->bits = 0;
    s->used = 0;
}

static void sha256_update(sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->bits += (uint64_t)len * 8;
    while (len) {
        size_t take = 64 - s->used < len ? 64 - s->used : len;
        memcpy(s->block + s->used, p, take);
        s->used += take, p += take, len -= take;
        if (s->used == 64) sha256_block(s, s->block), s->used = 0;
    }
}

static void sha256_final(sha256_t *s, uint8_t out[32])
{
    uint64_t bits = s->bits;
    uint8_t pad = 0x80, zero = 0, len[8];
    sha256_update(s, &pad, 1);
    while (s->used != 56) sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (uint8_t)(s->h[i] >> 24), out[4 * i + 1] = (uint8_t)(s->h[i] >> 16),
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8), out[4 * i + 3] = (uint8_t)s->h[i];
}

void m2a_sha256(const void *data, size_t len, uint8_t out[32])
{
    sha256_t s;
    sha256_init(&s);
    sha256_update(&s, data, len);
    sha256_final(&s, out);
}

/* ---- HMAC (RFC 2104) with a 32-byte key --------------------------------------------- */

void m2a_hmac(const uint8_t key[M2A_KEY_BYTES], const m2a_part_t *parts, int n, uint8_t out[M2A_MAC_BYTES])
{
    uint8_t pad[64], inner[32];
    sha256_t s;
    memset(pad, 0x36, sizeof(pad));
    for (int i = 0; i < M2A_KEY_BYTES; i++) pad[i] ^= key[i];
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    for (int i = 0; i < n; i++) sha256_update(&s, parts[i].data, parts[i].len);
    sha256_final(&s, inner);
    memset(pad, 0x5c, sizeof(pad));
    for (int i = 0; i < M2A_KEY_BYTES; i++) pad[i] ^= key[i];
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, inner, sizeof(inner));
    sha256_final(&s, out);
}

int m2a_equal_ct(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < len; i++) d |= x[i] ^ y[i];
    return d == 0;
}

moea2a_result_t m2a_random(void *buf, size_t len)
{
    for (size_t got = 0; got < len;) {
        ssize_t r = getrandom((char *)buf + got, len - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return m2a_fail(MOEA2A_ERR_SYSTEM, "no random bytes for the rendezvous key: getrandom: %s",
                             strerror(errno));
        got += (size_t)r;
    }
    return MOEA2A_SUCCESS;
}

/* ---- the key of init_env -------------------------------------------------------------- */

static moea2a_result_t key_file(const char *path, uint8_t key[M2A_KEY_BYTES])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_KEY_FILE='%s' cannot be opened: %s", path,
                         strerror(errno));
    struct stat st;
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode))
        r = m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_KEY_FILE='%s' is not a regular file", path);
    else if (st.st_uid != geteuid() || (st.st_mode & 077))
        r = m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT,
                      "MOEA2A_KEY_FILE='%s' must belong to this user and be readable by no one else (mode %03o; "
                      "chmod 600 it)", path, (unsigned)(st.st_mode & 0777));
    else if (st.st_size <= 0 || st.st_size > (1 << 20))
        r = m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_KEY_FILE='%s' must hold 1 byte to 1 MiB (%lld bytes)",
                      path, (long long)st.st_size);
    char *buf = r == MOEA2A_SUCCESS ? malloc((size_t)st.st_size) : NULL;
    if (r == MOEA2A_SUCCESS && !buf) r = m2a_fail(MOEA2A_ERR_NO_MEMORY, "MOEA2A_KEY_FILE: out of memory");
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (buf && got != (size_t)st.st_size)
        r = m2a_fail(MOEA2A_ERR_SYSTEM, "MOEA2A_KEY_FILE='%s': short read", path);
    if (r == MOEA2A_SUCCESS) m2a_sha256(buf, got, key);
    if (buf) memset(buf, 0, got), free(buf);
    close(fd);
    return r;
}

moea2a_result_t m2a_env_key(uint8_t key[M2A_KEY_BYTES], int *have_key)
{
    const char *k = m2a_param_str("MOEA2A_KEY"), *f = m2a_param_str("MOEA2A_KEY_FILE");
    *have_key = 0;
    memset(key, 0, M2A_KEY_BYTES);
    if (*k && *f)
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "set MOEA2A_KEY or MOEA2A_KEY_FILE, not both");
    if (*k) {
        m2a_sha256(k, strlen(k), key);
        *have_key = 1;
        return MOEA2A_SUCCESS;
    }
    if (*f) {
        M2A_TRY(key_file(f, key));
        *have_key = 1;
    }
    return MOEA2A_SUCCESS;
}

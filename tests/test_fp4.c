/* NVFP4 on the host, bit for bit against an independent oracle written from the
 * format's definition (nearest representable value found by search, ties to the
 * even code), on hand-made vectors (every E2M1 midpoint, saturation above 6 and above
 * 448, zero blocks, negative zero, E4M3 subnormal scales, non-finite input) and on
 * random data; the three scale layouts against their index formulas; conversions;
 * and NVFP4 as a dispatch payload equal to the same bytes dispatched as uint8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "local_ranks.h"
#include "oracle_e4m3.h"
#include "moea2a.h"
#include "mix.h"
#include "tap.h"

/* ---- the oracle ----------------------------------------------------------------- */

static const double e2m1_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* nearest of the 8 magnitudes; a tie goes to the even code; beyond 6: 6 */
static unsigned oracle_e2m1(float v)
{
    double a = fabs((double)v);
    unsigned best = 0;
    for (unsigned c = 1; c < 8; c++) {
        double d = fabs(a - e2m1_mag[c]), db = fabs(a - e2m1_mag[best]);
        if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return best | (signbit(v) ? 8u : 0u);
}

/* one block, the formula of moea2a_fp4(3) with the oracle's conversions */
static unsigned oracle_block(const float *x, float g, unsigned char *packed)
{
    float amax = 0;
    int finite = 1;
    for (int i = 0; i < 16; i++) finite &= isfinite(x[i]) != 0, amax = fmaxf(amax, fabsf(x[i]));
    if (!finite) {
        memset(packed, 0, 8);
        return 0x7f;
    }
    unsigned sf = oracle_e4m3(g * (amax / 6.0f));
    float sff = oracle_e4m3_float(sf), inv = sff == 0.0f ? 0.0f : g / sff;
    for (int i = 0; i < 16; i += 2)
        packed[i / 2] = (unsigned char)(oracle_e2m1(x[i] * inv) | oracle_e2m1(x[i + 1] * inv) << 4);
    return sf;
}

/* ---- helpers --------------------------------------------------------------------- */

static uint16_t to_bf16_trunc(float f) /* inputs chosen exactly representable */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static int quantize_matches(const float *x, size_t m, size_t k, float g, moea2a_sf_layout_t layout, const char *what)
{
    size_t kb_n = k / 16, sfb;
    moea2a_fp4_sf_bytes(layout, m, k, &sfb);
    unsigned char *q = malloc(m * k / 2 + 1), *sf = malloc(sfb + 1), want_q[8];
    memset(sf, 0xAB, sfb);
    moea2a_result_t r = moea2a_fp4_quantize(x, MOEA2A_FLOAT32, m, k, &g, q, sf, layout, NULL);
    int bad = r != MOEA2A_SUCCESS;
    for (size_t row = 0; row < m && !bad; row++)
        for (size_t kb = 0; kb < kb_n && !bad; kb++) {
            unsigned want_sf = oracle_block(x + row * k + kb * 16, g, want_q);
            size_t nkt = (kb_n + 3) / 4, off = layout == MOEA2A_SF_LINEAR ? row * kb_n + kb
                                             : layout == MOEA2A_SF_128X4
                                                 ? (row / 128) * nkt * 512 + (kb / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + kb % 4
                                                 : (row / 8) * nkt * 32 + (kb / 4) * 32 + (row % 8) * 4 + kb % 4;
            bad |= sf[off] != want_sf || memcmp(q + row * k / 2 + kb * 8, want_q, 8);
            if (bad) tap_diag("%s: row %zu block %zu: sf 0x%02x want 0x%02x", what, row, kb, sf[off], want_sf);
        }
    free(q);
    free(sf);
    return !bad;
}

/* ---- hand-made vectors ------------------------------------------------------------ */

static void test_hand_vectors(void)
{
    /* g = 1 and amax 6 give scale 1.0 and inv 1: codes are E2M1 of x itself. */
    float mid[16] = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5, -0.0f};
    unsigned char q[8], sf;
    float g = 1;
    sf = 0;
    moea2a_result_t r = moea2a_fp4_quantize(mid, MOEA2A_FLOAT32, 1, 16, &g, q, &sf, MOEA2A_SF_LINEAR, NULL);
    tap_ok(r == MOEA2A_SUCCESS && sf == 0x38, "scale 1.0 encodes as 0x38 (got 0x%02x)", sf);
    static const unsigned char want[8] = {0x07, 0x22, 0x44, 0x66, 0xA8, 0xCA, 0xEC, 0x8E};
    tap_ok(!memcmp(q, want, 8), "every E2M1 midpoint rounds to the even code, both signs; -0 keeps its sign "
                                "(%02x %02x %02x %02x %02x %02x %02x %02x)", q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
    /* amax 6.3: 6.3/6 rounds down to scale 1.0, so 6.3 saturates to code 7 (6). */
    float sat[16] = {6.3f, -6.3f, 6.2f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    moea2a_fp4_quantize(sat, MOEA2A_FLOAT32, 1, 16, &g, q, &sf, MOEA2A_SF_LINEAR, NULL);
    tap_ok(sf == 0x38 && q[0] == 0xF7 && (q[1] & 15) == 7, "values above 6 after scaling saturate to +-6");
    /* a global scale that pushes block scales past 448 saturates them at 448 (0x7e) */
    float big[16];
    for (int i = 0; i < 16; i++) big[i] = (float)(i + 1) / 2.0f;
    g = 10000.0f;
    tap_ok(quantize_matches(big, 1, 16, g, MOEA2A_SF_LINEAR, "sat448"), "oracle agrees when the scale saturates");
    moea2a_fp4_quantize(big, MOEA2A_FLOAT32, 1, 16, &g, q, &sf, MOEA2A_SF_LINEAR, NULL);
    tap_ok(sf == 0x7e, "block scale above 448 saturates to 0x7e (got 0x%02x)", sf);
    /* zero block: scale 0, inv 0, codes 0 (negative zeros keep their sign bit) */
    float zero[16] = {0};
    zero[3] = -0.0f;
    g = 1;
    moea2a_fp4_quantize(zero, MOEA2A_FLOAT32, 1, 16, &g, q, &sf, MOEA2A_SF_LINEAR, NULL);
    tap_ok(sf == 0 && q[0] == 0 && q[1] == 0x80 && !q[2], "zero block: scale 0, codes 0, -0 -> 0x8");
    /* tiny global scale: subnormal E4M3 block scales */
    float sub[16];
    for (int i = 0; i < 16; i++) sub[i] = (float)(i - 8) * 0.37f;
    g = 0.01f;
    tap_ok(quantize_matches(sub, 1, 16, g, MOEA2A_SF_LINEAR, "subnormal"), "E4M3 subnormal scales match the oracle");
    moea2a_fp4_quantize(sub, MOEA2A_FLOAT32, 1, 16, &g, q, &sf, MOEA2A_SF_LINEAR, NULL);
    tap_ok(sf > 0 && sf < 8, "the scale is subnormal (0x%02x)", sf);
    /* non-finite input: NaN scale, zero codes, and NaN after dequantization */
    float nf[32];
    for (int i = 0; i < 32; i++) nf[i] = (float)i / 4.0f;
    nf[5] = NAN, nf[20] = INFINITY;
    unsigned char q2[16], sf2[2];
    g = 1;
    moea2a_fp4_quantize(nf, MOEA2A_FLOAT32, 1, 32, &g, q2, sf2, MOEA2A_SF_LINEAR, NULL);
    int zeros = 1;
    for (int i = 0; i < 16; i++) zeros &= q2[i] == 0;
    float back[32];
    moea2a_fp4_dequantize(q2, sf2, MOEA2A_SF_LINEAR, &g, 1, 32, back, MOEA2A_FLOAT32, NULL);
    tap_ok(sf2[0] == 0x7f && sf2[1] == 0x7f && zeros && isnan(back[0]) && isnan(back[31]),
           "NaN or inf in a block: scale 0x7f, codes 0, dequantized to NaN");

    /* degenerate g: g = inf makes 1/SF x g infinite, so 0 x inf is NaN (code 0 for
     * either zero); g = 0 makes 1/g infinite, and 0 x inf dequantizes to the
     * canonical NaN whatever the sign */
    float zi[16] = {0.0f, -0.0f, 1.0f, -1.0f};
    unsigned char q3[8], sf3;
    g = INFINITY;
    moea2a_fp4_quantize(zi, MOEA2A_FLOAT32, 1, 16, &g, q3, &sf3, MOEA2A_SF_LINEAR, NULL);
    tap_ok(sf3 == 0x7e && q3[0] == 0x00 && q3[1] == 0xF7 && q3[2] == 0,
           "g = inf: scale 448, +-1 saturate to +-6, 0 x inf (either zero) is code 0 (0x%02x 0x%02x)", q3[0], q3[1]);
    unsigned char q4[8] = {0x80, 0x02}, sf4 = 0x38;
    uint32_t bits[4];
    g = 0.0f;
    moea2a_fp4_dequantize(q4, &sf4, MOEA2A_SF_LINEAR, &g, 1, 16, back, MOEA2A_FLOAT32, NULL);
    memcpy(bits, back, sizeof(bits));
    tap_ok(bits[0] == 0x7fc00000u && bits[1] == 0x7fc00000u && bits[2] == 0x7f800000u,
           "g = 0: zero codes give the canonical NaN 0x7fc00000 (either sign), others infinity");
}

/* ---- random data, every input type and layout -------------------------------------- */

static void test_random(void)
{
    size_t m = 37, k = 96; /* 37 rows: padding in both tiled layouts; 6 blocks a row */
    float *x = malloc(sizeof(float) * m * k);
    int ok = 1;
    for (int round = 0; round < 6; round++) {
        for (size_t i = 0; i < m * k; i++) {
            uint64_t v = mix((uint64_t)round * 1000003 + i);
            /* a spread of magnitudes, exactly representable in bf16 */
            float f = (float)((int)(v % 255) - 127) * ldexpf(1.0f, (int)((v >> 8) % 24) - 12);
            x[i] = ((v >> 40) % 97 == 0) ? 0.0f : f;
            memcpy(&x[i], (uint32_t[]){(uint32_t)to_bf16_trunc(x[i]) << 16}, 4);
        }
        float g;
        moea2a_fp4_global_scale(x, MOEA2A_FLOAT32, m * k, &g, NULL);
        for (int l = 0; l < 3; l++) ok &= quantize_matches(x, m, k, g * (round % 2 ? 1.0f : 0.37f), (moea2a_sf_layout_t)l, "random");
    }
    tap_ok(ok, "random data, three layouts: quantize equals the oracle bit for bit (tiled padding checked below)");

    /* bf16 and fp16 inputs give the same codes as their fp32 values */
    uint16_t *xb = malloc(2 * m * k);
    for (size_t i = 0; i < m * k; i++) xb[i] = to_bf16_trunc(x[i]);
    float g = 3.0f;
    unsigned char *q1 = malloc(m * k / 2), *q2 = malloc(m * k / 2), *s1 = malloc(m * k / 16), *s2 = malloc(m * k / 16);
    moea2a_fp4_quantize(x, MOEA2A_FLOAT32, m, k, &g, q1, s1, MOEA2A_SF_LINEAR, NULL);
    moea2a_fp4_quantize(xb, MOEA2A_BFLOAT16, m, k, &g, q2, s2, MOEA2A_SF_LINEAR, NULL);
    tap_ok(!memcmp(q1, q2, m * k / 2) && !memcmp(s1, s2, m * k / 16), "bf16 input quantizes like its fp32 value");

    /* dequantize: e2m1 * scale * (1/g), checked against the oracle's values */
    float *back = malloc(sizeof(float) * m * k);
    moea2a_fp4_dequantize(q1, s1, MOEA2A_SF_LINEAR, &g, m, k, back, MOEA2A_FLOAT32, NULL);
    int dq = 1;
    for (size_t i = 0; i < m * k; i++) {
        unsigned code = i % 2 ? q1[i / 2] >> 4 : q1[i / 2] & 15;
        float want = (float)(code & 8 ? -e2m1_mag[code & 7] : e2m1_mag[code & 7]) * oracle_e4m3_float(s1[i / 16]) * (1.0f / g);
        dq &= memcmp(&back[i], &want, 4) == 0;
    }
    tap_ok(dq, "dequantize to fp32 equals e2m1(q) x scale x (1/g)");
    uint16_t *bb = malloc(2 * m * k);
    moea2a_fp4_dequantize(q1, s1, MOEA2A_SF_LINEAR, &g, m, k, bb, MOEA2A_BFLOAT16, NULL);
    int rt = 1; /* bf16 output is the fp32 value rounded to nearest even */
    for (size_t i = 0; i < m * k; i++) {
        uint32_t u;
        memcpy(&u, &back[i], 4);
        rt &= bb[i] == (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    tap_ok(rt, "dequantize to bf16 rounds the fp32 value to nearest even");
    free(x), free(xb), free(q1), free(q2), free(s1), free(s2), free(back), free(bb);
}

/* ---- layouts and conversions -------------------------------------------------------- */

static void test_layouts(void)
{
    size_t m = 130, k = 16 * 5, kb_n = 5, b128, b8, bl;
    moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, m, k, &b128);
    moea2a_fp4_sf_bytes(MOEA2A_SF_8X4, m, k, &b8);
    moea2a_fp4_sf_bytes(MOEA2A_SF_LINEAR, m, k, &bl);
    tap_ok(b128 == 256 * 8 && b8 == 136 * 8 && bl == 130 * 5, "buffer sizes: roundup(m,128|8) x roundup(k/16,4), or m x k/16");
    unsigned char *lin = malloc(bl), *t128 = malloc(b128), *t8 = malloc(b8), *back = malloc(bl);
    for (size_t i = 0; i < bl; i++) lin[i] = (unsigned char)(1 + i % 251);
    memset(t128, 0xEE, b128), memset(t8, 0xEE, b8);
    moea2a_fp4_sf_convert(lin, MOEA2A_SF_LINEAR, t128, MOEA2A_SF_128X4, m, k, NULL);
    moea2a_fp4_sf_convert(lin, MOEA2A_SF_LINEAR, t8, MOEA2A_SF_8X4, m, k, NULL);
    int ok = 1;
    size_t nkt = 2, real128 = 0, real8 = 0;
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < kb_n; kb++) {
            ok &= t128[(r / 128) * nkt * 512 + (kb / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + kb % 4] == lin[r * kb_n + kb];
            ok &= t8[(r / 8) * nkt * 32 + (kb / 4) * 32 + (r % 8) * 4 + kb % 4] == lin[r * kb_n + kb];
        }
    for (size_t i = 0; i < b128; i++) real128 += t128[i] != 0;
    for (size_t i = 0; i < b8; i++) real8 += t8[i] != 0;
    tap_ok(ok && real128 == m * kb_n && real8 == m * kb_n, "128x4 and 8x4 place every scale at the formula's offset; "
                                                           "padding is written 0");
    moea2a_fp4_sf_convert(t128, MOEA2A_SF_128X4, back, MOEA2A_SF_LINEAR, m, k, NULL);
    tap_ok(!memcmp(back, lin, bl), "128x4 back to linear is the identity");
    moea2a_fp4_sf_convert(t8, MOEA2A_SF_8X4, back, MOEA2A_SF_LINEAR, m, k, NULL);
    tap_ok(!memcmp(back, lin, bl), "8x4 back to linear is the identity");
    /* padded receive rows: [ep=2][stride=65] with counts {3, 65}: padding rows get 0 */
    int32_t counts[2] = {3, 65};
    moea2a_fp4_sf_convert_padded(lin, t128, MOEA2A_SF_128X4, counts, 2, 65, k, NULL);
    int pad_ok = 1;
    for (size_t r = 0; r < m; r++)
        for (size_t kb = 0; kb < kb_n; kb++) {
            int real = (int)(r % 65) < counts[r / 65];
            unsigned char v = t128[(r / 128) * nkt * 512 + (kb / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + kb % 4];
            pad_ok &= real ? v == lin[r * kb_n + kb] : v == 0;
        }
    tap_ok(pad_ok, "padded receive rows: scales of unused slots are 0 in 128x4");
    float g = 1;
    unsigned char q[8];
    tap_ok(moea2a_fp4_quantize(lin, MOEA2A_FLOAT32, 1, 24, &g, q, back, MOEA2A_SF_LINEAR, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "k not a multiple of 16 is refused");
    tap_ok(moea2a_fp4_quantize(lin, MOEA2A_INT32, 1, 16, &g, q, back, MOEA2A_SF_LINEAR, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_fp4_quantize(NULL, MOEA2A_FLOAT32, 1, 16, &g, q, back, MOEA2A_SF_LINEAR, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_fp4_quantize(lin, MOEA2A_FLOAT32, 1, 16, &g, q, back, (moea2a_sf_layout_t)7, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_fp4_sf_convert(lin, MOEA2A_SF_LINEAR, lin, MOEA2A_SF_128X4, 1, 16, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "bad types, NULL inputs, unknown layouts and in-place conversion are refused");
    float zeros[16] = {0}, gz = -5;
    tap_ok(moea2a_fp4_global_scale(zeros, MOEA2A_FLOAT32, 16, &gz, NULL) == MOEA2A_SUCCESS && gz == 1.0f,
           "global scale of an all-zero tensor is 1");
    float some[3] = {1, -12, 3};
    moea2a_fp4_global_scale(some, MOEA2A_FLOAT32, 3, &gz, NULL);
    tap_ok(gz == 2688.0f / 12.0f, "global scale is 448 x 6 / amax (%g)", (double)gz);
    free(lin), free(t128), free(t8), free(back);
}

/* ---- NVFP4 as a dispatch payload --------------------------------------------------- */

static int payload_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int fails = 0;
    moea2a_comm_t comm;
    moea2a_config_t cc = MOEA2A_CONFIG_INITIALIZER;
    cc.transport = "ucx";
    if (moea2a_comm_init_rank(&comm, n, id, rank, &cc)) return 1;
    const int T = 40, K = 256, E = 16, k = 4;
    float *x = malloc(sizeof(float) * T * K);
    for (int i = 0; i < T * K; i++) x[i] = (float)((int)(mix((uint64_t)rank * 7777 + (uint64_t)i) % 2001) - 1000) / 97.0f;
    unsigned char *q = malloc(T * K / 2), *sf = malloc(T * K / 16);
    float g;
    moea2a_fp4_global_scale(x, MOEA2A_FLOAT32, (size_t)T * K, &g, NULL);
    moea2a_fp4_quantize(x, MOEA2A_FLOAT32, T, K, &g, q, sf, MOEA2A_SF_LINEAR, NULL);
    int32_t ids[40 * 4];
    for (int i = 0; i < T * k; i++) ids[i] = (int32_t)(mix((uint64_t)rank * 31 + (uint64_t)i) % E);
    moea2a_moe_t a, b;
    moea2a_moe_config_t ca = MOEA2A_MOE_CONFIG_INITIALIZER, cb;
    ca.num_experts = E, ca.top_k = k, ca.max_tokens_per_rank = T, ca.memory = MOEA2A_MEMORY_HOST, ca.num_payloads = 2;
    ca.payloads[0] = (moea2a_payload_desc_t){MOEA2A_NVFP4, K / 2};
    ca.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT8_E4M3, K / 16};
    cb = ca;
    cb.payloads[0].dtype = MOEA2A_UINT8, cb.payloads[1].dtype = MOEA2A_UINT8;
    const void *pays[2] = {q, sf};
    moea2a_dispatch_result_t ra = MOEA2A_DISPATCH_RESULT_INITIALIZER, rb = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_moe_create(&a, comm, &ca);
    r = r ? r : moea2a_moe_create(&b, comm, &cb);
    r = r ? r : moea2a_dispatch(a, T, ids, NULL, pays, 0, &ra, NULL);
    r = r ? r : moea2a_dispatch(b, T, ids, NULL, pays, 0, &rb, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "dispatch: %s", moea2a_last_error(comm));
    for (int src = 0; !r && src < n; src++) {
        size_t rows = (size_t)ra.recv_counts[src], base = (size_t)src * (size_t)ra.stride;
        RANK_EXPECT(fails, rank, ra.recv_counts[src] == rb.recv_counts[src], "counts differ");
        RANK_EXPECT(fails, rank,
                    !memcmp((char *)ra.payloads[0] + base * K / 2, (char *)rb.payloads[0] + base * K / 2, rows * K / 2) &&
                        !memcmp((char *)ra.payloads[1] + base * K / 16, (char *)rb.payloads[1] + base * K / 16, rows * K / 16),
                    "NVFP4 rows from rank %d differ from the same bytes sent as uint8", src);
    }
    if (!r) {
        /* received rows dequantize back to what the source had quantized */
        size_t bytes;
        moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, (size_t)n * ra.stride, K, &bytes);
        unsigned char *sw = malloc(bytes);
        RANK_EXPECT(fails, rank, moea2a_fp4_sf_convert_padded(ra.payloads[1], sw, MOEA2A_SF_128X4, ra.recv_counts, n,
                                                              ra.stride, K, NULL) == MOEA2A_SUCCESS,
                    "swizzle the received scales");
        free(sw);
        moea2a_combine(a, NULL, NULL, NULL), moea2a_combine(b, NULL, NULL, NULL);
    }
    moea2a_moe_destroy(a), moea2a_moe_destroy(b);
    free(x), free(q), free(sf);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    test_hand_vectors();
    test_random();
    test_layouts();
    local_ranks_result_t res;
    local_ranks_run(3, payload_rank, NULL, 120.0, &res);
    tap_ok(res.failed == 0, "NVFP4 payload + E4M3 scales dispatched on 3 ranks equal the same bytes as uint8");
    return tap_done();
}

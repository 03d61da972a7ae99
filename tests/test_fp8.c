/* FP8 block quantization on the host, bit for bit against an oracle written from the
 * arithmetic in moea2a_fp8(3) (E4M3 by search, ceil(log2) through frexp, the layouts
 * from their index formulas): random data in bf16, fp16 and fp32; zeros, subnormals,
 * +-inf, NaN, all-equal blocks, blocks whose products land on the E4M3 limit, amax
 * below the 1e-4 floor; both scale kinds, both layouts, padding; dequantize; and the
 * argument checks. The CUDA kernels are held to the same bits in tests/test_gpu.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moea2a.h"
#include "oracle_e4m3.h"
#include "mix.h"
#include "tap.h"

#define BLK 128

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- the oracle --------------------------------------------------------------------- */

/* One block of 128 fp32 inputs: its codes, and the scale as stored (fp32 bits or the
 * UE8M0 byte). */
static uint32_t oracle_block(const float *x, int ue8m0, unsigned char *codes)
{
    float amax = 0;
    int finite = 1;
    for (int i = 0; i < BLK; i++) finite &= isfinite(x[i]) != 0, amax = fmaxf(amax, fabsf(x[i]));
    if (!finite) {
        memset(codes, 0, BLK);
        return ue8m0 ? 0xffu : 0x7fc00000u;
    }
    amax = fmaxf(amax, 1e-4f);
    float mul;
    uint32_t scale;
    if (ue8m0) {
        int e2;
        float f = frexpf(amax / 448.0f, &e2); /* q = f x 2^e2, f in [0.5, 1) */
        int e = f == 0.5f ? e2 - 1 : e2;      /* ceil(log2(q)), exactly */
        mul = ldexpf(1.0f, -e);
        scale = (uint32_t)(e + 127);
    } else {
        mul = 448.0f / amax;
        scale = bits(amax / 448.0f);
    }
    for (int i = 0; i < BLK; i++) codes[i] = (unsigned char)oracle_e4m3(x[i] * mul);
    return scale;
}

/* Byte offset of block kb of row r's scale, from the layouts' definitions. */
static size_t oracle_offset(int mn, int ue8m0, size_t m, size_t r, size_t kb, size_t nkb)
{
    size_t m_pad = (m + 3) / 4 * 4;
    if (!ue8m0) return 4 * (mn ? kb * m_pad + r : r * nkb + kb);
    size_t words = (nkb + 3) / 4;
    return 4 * (mn ? (kb / 4) * m_pad + r : r * words + kb / 4) + kb % 4;
}

static size_t oracle_scale_bytes(int mn, int ue8m0, size_t m, size_t nkb)
{
    size_t rows = mn ? (m + 3) / 4 * 4 : m;
    return 4 * rows * (ue8m0 ? (nkb + 3) / 4 : nkb);
}

static float oracle_scale_value(uint32_t s, int ue8m0)
{
    if (!ue8m0) return from_bits(s);
    return s == 0xffu ? NAN : ldexpf(1.0f, (int)s - 127);
}

/* ---- inputs --------------------------------------------------------------------------- */

/* bf16 and fp16 of a float, round to nearest even (the inputs are then taken exactly) */
static uint16_t to_bf16(float f)
{
    uint32_t u = bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) { return from_bits((uint32_t)h << 16); }

static uint16_t to_f16(float f) /* finite |f| < 65504, or inf/NaN */
{
    uint32_t u = bits(f), sign = (u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f)); /* subnormal: 2^-24 units */
    int e;
    float fr = frexpf(a, &e); /* a = fr x 2^e, fr in [0.5, 1) */
    long mant = lrintf((fr * 2.0f - 1.0f) * 1024.0f);
    if (mant == 1024) mant = 0, e++;
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)mant);
}
static float from_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf(1.0f + m / 1024.0f, e - 15);
    return h & 0x8000 ? -v : v;
}

/* The input in its type, and the fp32 values the library will see. */
static void *make_input(moea2a_datatype_t t, const float *src, size_t n, float *seen)
{
    size_t es = t == MOEA2A_FLOAT32 ? 4 : 2;
    unsigned char *buf = malloc(n * es + 16);
    for (size_t i = 0; i < n; i++) {
        if (t == MOEA2A_FLOAT32) {
            memcpy(buf + 4 * i, &src[i], 4), seen[i] = src[i];
        } else {
            uint16_t h = t == MOEA2A_BFLOAT16 ? to_bf16(src[i]) : to_f16(src[i]);
            memcpy(buf + 2 * i, &h, 2);
            seen[i] = t == MOEA2A_BFLOAT16 ? from_bf16(h) : from_f16(h);
        }
    }
    return buf;
}

/* ---- one case ----------------------------------------------------------------------- */

static int check_case(const float *src, size_t m, size_t k, moea2a_datatype_t t, int mn, int ue8m0, const char *what)
{
    size_t n = m * k, nkb = k / BLK, sb;
    unsigned flags = ue8m0 ? MOEA2A_FP8_UE8M0 : 0;
    moea2a_fp8_scale_layout_t layout = mn ? MOEA2A_FP8_SCALES_MN_MAJOR : MOEA2A_FP8_SCALES_ROW_MAJOR;
    float *seen = malloc(n * 4 + 4);
    void *x = make_input(t, src, n, seen);
    int bad = moea2a_fp8_scale_bytes(layout, flags, m, k, &sb) != MOEA2A_SUCCESS || sb != oracle_scale_bytes(mn, ue8m0, m, nkb);
    unsigned char *q = malloc(n + 1), *s = malloc(sb + 4), *want_s = calloc(1, sb + 4), codes[BLK];
    memset(s, 0xAB, sb + 4);
    memset(q, 0xAB, n + 1);
    moea2a_result_t r = moea2a_fp8_quantize(x, t, m, k, q, s, layout, flags, NULL);
    bad |= r != MOEA2A_SUCCESS;
    for (size_t row = 0; row < m && !bad; row++)
        for (size_t kb = 0; kb < nkb && !bad; kb++) {
            uint32_t want = oracle_block(seen + row * k + kb * BLK, ue8m0, codes);
            size_t off = oracle_offset(mn, ue8m0, m, row, kb, nkb);
            if (ue8m0) want_s[off] = (unsigned char)want;
            else memcpy(want_s + off, &want, 4);
            for (int i = 0; i < BLK && !bad; i++)
                if (q[row * k + kb * BLK + (size_t)i] != codes[i]) {
                    tap_diag("%s: row %zu block %zu value %d (%g): code 0x%02x, want 0x%02x", what, row, kb, i,
                             (double)seen[row * k + kb * BLK + (size_t)i], q[row * k + kb * BLK + (size_t)i], codes[i]);
                    bad = 1;
                }
        }
    /* every scale byte, padding (0) included, and nothing past the buffer */
    if (!bad && (memcmp(s, want_s, sb) || s[sb] != 0xAB)) {
        for (size_t i = 0; i < sb; i++)
            if (s[i] != want_s[i]) {
                tap_diag("%s: scale byte %zu is 0x%02x, want 0x%02x", what, i, s[i], want_s[i]);
                break;
            }
        bad = 1;
    }
    /* dequantize to fp32: e4m3(q) x scale, NaN canonical */
    float *out = malloc(n * 4 + 4);
    r = bad ? MOEA2A_SUCCESS : moea2a_fp8_dequantize(q, s, layout, flags, m, k, out, MOEA2A_FLOAT32, NULL);
    bad |= r != MOEA2A_SUCCESS;
    for (size_t i = 0; i < n && !bad; i++) {
        size_t row = i / k, kb = (i % k) / BLK, off = oracle_offset(mn, ue8m0, m, row, kb, nkb);
        uint32_t sbits = 0;
        if (ue8m0) sbits = s[off];
        else memcpy(&sbits, s + off, 4);
        float want = oracle_e4m3_float(q[i]) * oracle_scale_value(sbits, ue8m0);
        uint32_t wb = isnan(want) ? 0x7fc00000u : bits(want);
        if (bits(out[i]) != wb) {
            tap_diag("%s: dequantized %zu is %a, want %a", what, i, (double)out[i], (double)want);
            bad = 1;
        }
    }
    free(out), free(seen), free(x), free(q), free(s), free(want_s);
    return !bad;
}

static float rnd_normal(uint64_t *st, float scale)
{
    *st = mix(*st);
    double u1 = ((*st >> 11) + 1) * (1.0 / 9007199254740993.0);
    *st = mix(*st);
    double u2 = (*st >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) * scale;
}

/* Rows of 128-value blocks, each block one of the hard cases in turn. */
static void fill_hard(float *x, size_t m, size_t k, uint64_t seed)
{
    uint64_t st = seed;
    for (size_t row = 0; row < m; row++)
        for (size_t kb = 0; kb < k / BLK; kb++) {
            float *b = x + row * k + kb * BLK;
            int kind = (int)((row * (k / BLK) + kb + seed) % 9);
            float scale = ldexpf(1.0f, (int)(mix(st) % 40) - 20);
            for (int i = 0; i < BLK; i++) b[i] = rnd_normal(&st, scale);
            switch (kind) {
            case 0: memset(b, 0, BLK * 4); break;                               /* all zero: amax floor */
            case 1: for (int i = 0; i < BLK; i++) b[i] = 3.0f; break;          /* all equal */
            case 2: b[(int)(mix(st) % BLK)] = INFINITY; break;
            case 3: b[(int)(mix(st) % BLK)] = -INFINITY; break;
            case 4: b[(int)(mix(st) % BLK)] = NAN; break;
            case 5: for (int i = 0; i < BLK; i++) b[i] = rnd_normal(&st, 1e-6f); break; /* amax below 1e-4 */
            case 6: for (int i = 0; i < BLK; i++) b[i] = ldexpf((float)(i % 7) - 3.0f, -140); break; /* subnormal */
            case 7: b[0] = 448.0f, b[1] = -448.0f, b[2] = 447.9f, b[3] = -0.0f; break; /* the E4M3 limit */
            default: break;                                                    /* plain random */
            }
        }
}

static void test_random(void)
{
    static const moea2a_datatype_t types[3] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};
    static const char *names[3] = {"bf16", "fp16", "fp32"};
    static const size_t ms[4] = {1, 3, 4, 17}, ks[3] = {128, 640, 1024};
    for (int ti = 0; ti < 3; ti++)
        for (int lay = 0; lay < 2; lay++)
            for (int ue = 0; ue < 2; ue++) {
                int ok = 1;
                char what[96];
                for (int mi = 0; mi < 4 && ok; mi++)
                    for (int ki = 0; ki < 3 && ok; ki++) {
                        size_t m = ms[mi], k = ks[ki];
                        float *x = malloc(m * k * 4);
                        fill_hard(x, m, k, 1000u * (uint64_t)(ti * 4 + lay * 2 + ue) + m * 31 + k);
                        if (ti == 1) /* fp16 holds |x| < 65504 */
                            for (size_t i = 0; i < m * k; i++)
                                if (isfinite(x[i]) && fabsf(x[i]) > 60000.0f) x[i] = 60000.0f;
                        snprintf(what, sizeof(what), "%s %s %s m=%zu k=%zu", names[ti], lay ? "MN-major" : "row-major",
                                 ue ? "UE8M0" : "fp32 scales", m, k);
                        ok = check_case(x, m, k, types[ti], lay, ue, what);
                        free(x);
                    }
                tap_ok(ok, "%s input, %s, %s scales: codes, scales with their padding and dequantized values "
                           "equal the oracle (m 1..17, k 128..1024, zeros, equal blocks, +-inf, NaN, tiny and "
                           "subnormal blocks, the 448 limit)",
                       names[ti], lay ? "MN-major" : "row-major", ue ? "UE8M0" : "fp32");
            }
}

/* Hand-made values whose answers are known without the oracle. */
static void test_hand(void)
{
    float x[BLK];
    unsigned char q[BLK];
    uint32_t s;
    /* amax 448: scale 1.0 (fp32 scales), codes are E4M3 of x itself */
    for (int i = 0; i < BLK; i++) x[i] = 0;
    x[0] = 448.0f, x[1] = -1.0f, x[2] = 0.0009f, x[3] = -0.0001f, x[4] = 0.001f;
    moea2a_result_t r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &s, MOEA2A_FP8_SCALES_ROW_MAJOR, 0, NULL);
    tap_ok(r == MOEA2A_SUCCESS && s == bits(1.0f) && q[0] == 0x7e && q[1] == 0xb8 && q[2] == 0x00 && q[3] == 0x80 && q[4] == 0x01,
           "amax 448: scale 1.0; 448 -> 0x7e, -1 -> 0xb8, 0.0009 -> 0x00 (below half of 2^-9), 0.001 -> 0x01, a negative rounding to zero -> 0x80 "
           "(scale %08x, codes %02x %02x %02x %02x)", s, q[0], q[1], q[2], q[3]);
    /* UE8M0: amax 448 gives q = 1 = 2^0 exactly: e = 0, byte 127; amax 449 gives e = 1 */
    uint32_t w = 0;
    r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &w, MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, NULL);
    int ok = r == MOEA2A_SUCCESS && w == 127u;
    x[0] = 449.0f;
    r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &w, MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, NULL);
    ok &= r == MOEA2A_SUCCESS && w == 128u && q[0] == 0x76; /* 224.5 -> 224 */
    tap_ok(ok, "UE8M0: amax 448 -> 2^0 (byte 127); amax 449 -> 2^1 (byte 128), 449/2 -> 224 (0x76)");
    /* a zero block: amax floored at 1e-4, codes 0 */
    memset(x, 0, sizeof(x));
    r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &s, MOEA2A_FP8_SCALES_ROW_MAJOR, 0, NULL);
    int zeros = 1;
    for (int i = 0; i < BLK; i++) zeros &= q[i] == 0;
    tap_ok(r == MOEA2A_SUCCESS && s == bits(1e-4f / 448.0f) && zeros, "a zero block: scale 1e-4/448, codes 0");
    /* non-finite: NaN scale, zero codes */
    x[5] = INFINITY, x[6] = 1.0f;
    r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &s, MOEA2A_FP8_SCALES_ROW_MAJOR, 0, NULL);
    tap_ok(r == MOEA2A_SUCCESS && s == 0x7fc00000u && q[5] == 0 && q[6] == 0, "an inf in a block: scale 0x7fc00000, codes 0");
    w = 0;
    r = moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, BLK, q, &w, MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, NULL);
    tap_ok(r == MOEA2A_SUCCESS && w == 0xffu, "... and its UE8M0 scale byte 0xff, padding bytes of the word 0 (0x%08x)", w);
}

static void test_args(void)
{
    float x[256] = {0};
    unsigned char q[256];
    uint32_t s[8];
    size_t b = 0;
    tap_ok(moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, 200, q, s, 0, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "multiple of 128"),
           "k not a multiple of 128: MOEA2A_ERR_INVALID_ARGUMENT (%s)", moea2a_last_error(NULL));
    tap_ok(moea2a_fp8_quantize(x, MOEA2A_INT32, 1, 128, q, s, 0, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "an integer input type is refused");
    tap_ok(moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, 128, q, s, (moea2a_fp8_scale_layout_t)7, 0, NULL) ==
               MOEA2A_ERR_INVALID_ARGUMENT, "an unknown layout is refused");
    tap_ok(moea2a_fp8_quantize(x, MOEA2A_FLOAT32, 1, 128, q, s, 0, 0x10, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "an unknown flag is refused");
    tap_ok(moea2a_fp8_quantize(NULL, MOEA2A_FLOAT32, 1, 128, q, s, 0, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_fp8_dequantize(q, NULL, 0, 0, 1, 128, x, MOEA2A_FLOAT32, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "NULL buffers are refused");
    tap_ok(moea2a_fp8_quantize(x, MOEA2A_FLOAT32, SIZE_MAX / 64, 128, q, s, 0, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_fp8_scale_bytes(0, 0, SIZE_MAX / 2, 128, &b) == MOEA2A_ERR_INVALID_ARGUMENT,
           "sizes that overflow are refused");
    tap_ok(moea2a_fp8_quantize(NULL, MOEA2A_FLOAT32, 0, 128, NULL, NULL, 0, 0, NULL) == MOEA2A_SUCCESS,
           "m = 0 is a no-op");
    int ok = moea2a_fp8_scale_bytes(MOEA2A_FP8_SCALES_ROW_MAJOR, 0, 5, 7168, &b) == MOEA2A_SUCCESS && b == 5 * 56 * 4;
    ok &= moea2a_fp8_scale_bytes(MOEA2A_FP8_SCALES_MN_MAJOR, 0, 5, 7168, &b) == MOEA2A_SUCCESS && b == 8 * 56 * 4;
    ok &= moea2a_fp8_scale_bytes(MOEA2A_FP8_SCALES_ROW_MAJOR, MOEA2A_FP8_UE8M0, 5, 7168, &b) == MOEA2A_SUCCESS &&
          b == 5 * 14 * 4;
    ok &= moea2a_fp8_scale_bytes(MOEA2A_FP8_SCALES_MN_MAJOR, MOEA2A_FP8_UE8M0, 5, 640, &b) == MOEA2A_SUCCESS &&
          b == 8 * 2 * 4;
    tap_ok(ok, "scale_bytes: [m][k/128] x 4, [k/128][m_pad] x 4, UE8M0 words of four");
}

int main(void)
{
    test_hand();
    test_random();
    test_args();
    return tap_done();
}

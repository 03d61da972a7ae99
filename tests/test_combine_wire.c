/* The FP8 combine wire (moea2a_moe_config_t.combine_wire) on host memory and on the
 * load/store and generic paths in CUDA memory (SKIP without a GPU). Each rank's
 * expert rows are functions of (source rank, token, expert rank), so a token's source
 * knows every row its combine adds and checks the output twice:
 *   - its bits against a reference built from the public FP8 calls (moea2a_fp8_quantize,
 *     moea2a_fp8_dequantize, themselves checked against an E4M3 oracle in test_fp8):
 *     each row quantized, the dequantized rows summed in fp32 from 0 in ascending rank
 *     order, across nodes each node's partial quantized again, rounded once;
 *   - the error bound of moea2a_moe(3), "FP8 combine", against the exact sum of the
 *     rows: per element and row max(2^-4 |v|, 2^-10 s) (s the block's scale), summed
 *     over the rows (and the partials across nodes), plus the final rounding.
 * Random, skewed (rows of very different magnitudes) and outlier-heavy rows (a few
 * large values beside many small ones in a block), fp32 and UE8M0 scales, bf16 and fp32
 * outputs, on 1 to 4 ranks and on 4 ranks in emulated nodes of 2, where the
 * hierarchical and the flat path give the same bits; in CUDA memory on 1, 2 and 4 GPUs
 * (ranks sharing GPUs over CUDA IPC where there are fewer), the rows written into the
 * combine buffer (quantized there in place) and passed from the caller's own buffer, the
 * load/store and generic paths giving the same bits, and in emulated nodes the flat
 * generic path beside the hierarchical CUDA path, each node's partial quantized again
 * on the GPU (ranks sharing a GPU there apart for NCCL by their NCCL_HOSTID). Then the
 * config's refusals, and copy-engine mode's. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx_mem.h"
#include "local_ranks.h"
#include "mix.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"

#if defined(MOEA2A_HAVE_CUDA) && defined(MOEA2A_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#define WITH_CUDA 1
#else
#define WITH_CUDA 0
#endif

#define WATCHDOG 300.0
enum { E = 16, K = 4, CAP = 24, NKIND = 3, HMAX = 8192 };

typedef struct {
    int node_size; /* MOEA2A_NODE_SIZE, 0: one node */
    int ue8m0, fp32_out, hidden;
    /* CUDA memory on ndev GPUs (ipc: ranks share them, without NCCL); caller_rows: the
     * expert rows passed from a buffer of the caller's, else written into the combine
     * buffer */
    int cuda, ndev, ipc, caller_rows;
} arg_t;

static double unit(uint64_t h) { return (double)(h >> 11) / 9007199254740992.0; } /* [0, 1) */

static float to_bf16(float x) /* round to nearest even, finite values */
{
    uint32_t b;
    memcpy(&b, &x, 4);
    b += 0x7fffu + ((b >> 16) & 1u), b &= 0xffff0000u;
    memcpy(&x, &b, 4);
    return x;
}

/* Expert rank `dest`'s output row value h for token t of rank src, in the output dtype. */
static float row_value(int kind, int src, int t, int dest, int h, int fp32_out)
{
    uint64_t r = mix((uint64_t)src << 48 ^ (uint64_t)t << 32 ^ (uint64_t)dest << 24 ^ (uint64_t)h ^ (uint64_t)kind << 60);
    double v = 2.0 * unit(r) - 1.0;
    if (kind == 1) v *= ldexp(1.0, 4 * dest - 6); /* skewed: each expert rank its own magnitude */
    if (kind == 2) v = (r & 63) == 0 ? 300.0 * v : 1e-3 * v; /* outliers among small values */
    float f = (float)v;
    return fp32_out ? f : to_bf16(f);
}

static int owner(int e, int ep)
{
    int per = E / ep, rem = E % ep; /* ranks 0..rem-1 own per + 1 experts */
    return e < rem * (per + 1) ? e / (per + 1) : rem + (e - rem * (per + 1)) / per;
}

static void token_ids(int me, int t, int32_t *ids)
{
    for (int j = 0; j < K; j++) {
        uint64_t r = mix((uint64_t)me * 7919 + (uint64_t)t * 104729 + (uint64_t)j);
        ids[j] = r % 11 == 0 ? -1 : (int32_t)(r % E);
    }
}

/* The block scale of 128 values (the documented rule: amax floored at 1e-4, / 448,
 * UE8M0 rounded up to a power of two). */
static double block_scale(const float *v, int ue8m0)
{
    double amax = 1e-4;
    for (int i = 0; i < 128; i++) amax = fabs(v[i]) > amax ? fabs(v[i]) : amax;
    double s = amax / 448.0;
    return ue8m0 ? ldexp(1.0, (int)ceil(log2(s))) : s;
}

/* row (H floats) -> its FP8 round trip through the public calls, fp32 */
static int fp8_round_trip(const float *row, int H, int ue8m0, float *out)
{
    unsigned char q[HMAX], s[HMAX / 32];
    unsigned flags = ue8m0 ? MOEA2A_FP8_UE8M0 : 0;
    return moea2a_fp8_quantize(row, MOEA2A_FLOAT32, 1, (size_t)H, q, s, MOEA2A_FP8_SCALES_ROW_MAJOR, flags, NULL) ||
           moea2a_fp8_dequantize(q, s, MOEA2A_FP8_SCALES_ROW_MAJOR, flags, 1, (size_t)H, out, MOEA2A_FLOAT32, NULL);
}

/* One dispatch and combine of this rank's tokens with rows of `kind`; out as fp32. The
 * dispatch's results and the rows live in the context's memory (ctx_mem.h). */
static moea2a_result_t round_trip(moea2a_moe_t moe, int me, int n, int kind, const arg_t *a, float *out)
{
    int32_t ids[CAP * K];
    for (int t = 0; t < n; t++) token_ids(me, t, ids + t * K);
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    void *buf = NULL, *dids = mem_put(a->cuda, ids, sizeof(ids));
    moea2a_result_t r = moea2a_dispatch(moe, n, dids, NULL, NULL, 0, &res, NULL);
    if (r == MOEA2A_SUCCESS) r = moea2a_moe_combine_buffer(moe, &buf);
    if (r != MOEA2A_SUCCESS) return mem_drop(a->cuda, dids), r;
    const int H = a->hidden, es = a->fp32_out ? 4 : 2;
    const size_t slots = (size_t)res.ep * (size_t)res.stride, bytes = slots * (size_t)H * (size_t)es;
    int32_t *counts = mem_get(a->cuda, res.recv_counts, 4 * (size_t)res.ep);
    int32_t *index = mem_get(a->cuda, res.src_token_index, 4 * slots);
    unsigned char *rows = calloc(1, bytes), *o = malloc((size_t)CAP * (size_t)H * 4);
    for (int src = 0; rows && src < res.ep; src++)
        for (int i = 0; i < counts[src]; i++) {
            const size_t slot = (size_t)src * (size_t)res.stride + (size_t)i;
            for (int h = 0; h < H; h++) {
                float v = row_value(kind, src, index[slot], me, h, a->fp32_out);
                memcpy(rows + (slot * (size_t)H + (size_t)h) * (size_t)es, (unsigned char *)&v + (a->fp32_out ? 0 : 2),
                       (size_t)es);
            }
        }
    void *mine = a->caller_rows ? mem_put(a->cuda, rows, bytes) : NULL, *dout = mem_put(a->cuda, NULL, (size_t)CAP * (size_t)H * 4);
    if (!a->caller_rows && rows) mem_copy_in(a->cuda, buf, rows, bytes);
    r = rows && o && dout && (mine || !a->caller_rows) ? moea2a_combine(moe, mine, dout, NULL) : MOEA2A_ERR_NO_MEMORY;
    unsigned char *got = r == MOEA2A_SUCCESS ? mem_get(a->cuda, dout, (size_t)n * (size_t)H * (size_t)es) : NULL;
    for (int i = 0; got && i < n * H; i++) {
        uint32_t b = 0;
        memcpy((unsigned char *)&b + (a->fp32_out ? 0 : 2), got + (size_t)i * (size_t)es, (size_t)es);
        memcpy(&out[i], &b, 4);
    }
    if (r == MOEA2A_SUCCESS && !got) r = MOEA2A_ERR_NO_MEMORY;
    free(got), free(o), free(rows), free(counts), free(index);
    mem_drop(a->cuda, dids), mem_drop(a->cuda, dout);
    if (mine) mem_drop(a->cuda, mine);
    return r;
}

/* The checks of one token's output row: bits against the public-call reference, error
 * against the exact sum within the bound. Returns 0 or 1 (a message printed). */
static int check_token(int me, int t, int ep, int node_size, int kind, const arg_t *a, const float *got)
{
    const int H = a->hidden, nn = node_size ? (ep + node_size - 1) / node_size : 1;
    int32_t ids[K], dest[K], nd = 0;
    token_ids(me, t, ids);
    for (int j = 0; j < K; j++) {
        if (ids[j] < 0) continue;
        int d = owner(ids[j], ep), seen = 0;
        for (int i = 0; i < nd; i++) seen |= dest[i] == d;
        if (!seen) dest[nd++] = d;
    }
    for (int i = 1; i < nd; i++) /* ascending rank */
        for (int j = i; j > 0 && dest[j - 1] > dest[j]; j--) { int x = dest[j]; dest[j] = dest[j - 1], dest[j - 1] = x; }
    static float row[HMAX], rt[HMAX], part[HMAX], total[HMAX], prt[HMAX];
    static double exact[HMAX], bound[HMAX], pexact[HMAX], perr[HMAX];
    for (int h = 0; h < H; h++) total[h] = 0.0f, exact[h] = 0.0, bound[h] = 0.0;
    for (int x = 0; x < nn; x++) {
        int any = 0;
        for (int h = 0; h < H; h++) part[h] = 0.0f, pexact[h] = 0.0, perr[h] = 0.0;
        for (int i = 0; i < nd; i++) {
            if (node_size && dest[i] / node_size != x) continue;
            any = 1;
            for (int h = 0; h < H; h++) row[h] = row_value(kind, me, t, dest[i], h, a->fp32_out);
            if (fp8_round_trip(row, H, a->ue8m0, rt)) return printf("# rank %d: the FP8 calls failed\n", me), 1;
            for (int b = 0; b < H / 128; b++) {
                double s = block_scale(row + 128 * b, a->ue8m0);
                for (int h = 128 * b; h < 128 * (b + 1); h++) {
                    part[h] += rt[h], pexact[h] += row[h];
                    perr[h] += fmax(ldexp(fabs(row[h]), -4), ldexp(s, -10));
                }
            }
        }
        if (!any) continue;
        if (nn > 1) { /* the partial travels as FP8 again */
            if (fp8_round_trip(part, H, a->ue8m0, prt)) return printf("# rank %d: the FP8 calls failed\n", me), 1;
            for (int b = 0; b < H / 128; b++) {
                float up[128];
                for (int i = 0; i < 128; i++) up[i] = (float)(fabs(pexact[128 * b + i]) + perr[128 * b + i]);
                double s = 2.0 * block_scale(up, a->ue8m0);
                for (int h = 128 * b; h < 128 * (b + 1); h++)
                    perr[h] += fmax(ldexp(fabs(pexact[h]) + perr[h], -4), ldexp(s, -10));
            }
            memcpy(part, prt, sizeof(float) * (size_t)H);
        }
        for (int h = 0; h < H; h++) total[h] += part[h], exact[h] += pexact[h], bound[h] += perr[h];
    }
    for (int h = 0; h < H; h++) {
        const float want = a->fp32_out ? total[h] : to_bf16(total[h]);
        uint32_t gb, wb;
        memcpy(&gb, &got[h], 4), memcpy(&wb, &want, 4);
        if (gb != wb)
            return printf("# rank %d token %d h %d (kind %d): %a, the public-call reference %a\n", me, t, h, kind,
                          (double)got[h], (double)want), 1;
        const double lim = bound[h] + ldexp(fabs(exact[h]) + bound[h], a->fp32_out ? -23 : -8) + 1e-30 +
                           ldexp(fabs(exact[h]) + bound[h], -20) * nd; /* fp32 sums */
        if (fabs((double)got[h] - exact[h]) > lim)
            return printf("# rank %d token %d h %d (kind %d): %g off the exact sum %g, the bound %g\n", me, t, h, kind,
                          fabs((double)got[h] - exact[h]), exact[h], lim), 1;
    }
    return 0;
}

static moea2a_moe_config_t config_of(const arg_t *a, unsigned wire_format)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = E, c.top_k = K, c.max_tokens_per_rank = CAP, c.hidden = (size_t)a->hidden;
    c.combine_dtype = a->fp32_out ? MOEA2A_FLOAT32 : MOEA2A_BFLOAT16;
    c.memory = a->cuda ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    c.combine_wire.format = (moea2a_wire_format_t)wire_format;
    c.combine_wire.flags = a->ue8m0 ? MOEA2A_FP8_UE8M0 : 0;
    return c;
}

static int wire_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const arg_t *a = arg;
    int fails = 0;
    char v[16];
    if (a->node_size) snprintf(v, sizeof(v), "%d", a->node_size), setenv("MOEA2A_NODE_SIZE", v, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
#if WITH_CUDA
    if (a->cuda) {
        if (cudaSetDevice(me % a->ndev) != cudaSuccess) return 1;
        cfg.cuda_device = me % a->ndev;
        if (a->ipc) without_nccl();
        if (a->node_size && ep > a->ndev) nccl_hosts_apart(me, 1); /* ranks sharing a GPU */
    }
#endif
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, &cfg)) return 1;
    moea2a_moe_config_t c = config_of(a, MOEA2A_WIRE_FP8);
    /* flat: a second path whose bits must equal the first's: across nodes the flat path
     * beside the hierarchical one (in CUDA memory the flat generic path, and the
     * hierarchical path also on nodes of one rank); on one node in CUDA memory the
     * generic path (NCCL) beside the load/store one. */
    moea2a_moe_t moe = NULL, flat = NULL;
    if (a->cuda && a->node_size) setenv("MOEA2A_HIERARCHICAL", "1", 1);
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_SUCCESS, "create: %s", moea2a_last_error(comm));
    moea2a_moe_config_t g = c;
    if (a->cuda) g.flags |= MOEA2A_MOE_NO_NVLINK;
    if (a->node_size || (a->cuda && !a->ipc)) {
        setenv("MOEA2A_HIERARCHICAL", "0", 1);
        RANK_EXPECT(fails, me, moea2a_moe_create(&flat, comm, &g) == MOEA2A_SUCCESS, "create (second path): %s",
                    moea2a_last_error(comm));
    }
    unsetenv("MOEA2A_HIERARCHICAL");
    float *out = malloc(sizeof(float) * CAP * (size_t)a->hidden), *out2 = malloc(sizeof(float) * CAP * (size_t)a->hidden);
    for (int kind = 0; !fails && kind < NKIND; kind++) {
        const int n = CAP - (me + kind) % 5;
        arg_t ak = *a;
        ak.caller_rows = a->cuda && kind % 2; /* in CUDA memory both ways in */
        moea2a_result_t r = round_trip(moe, me, n, kind, &ak, out);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "round trip: %s", moea2a_last_error(comm));
        for (int t = 0; !r && !fails && t < n; t++)
            fails += check_token(me, t, ep, a->node_size, kind, a, out + (size_t)t * (size_t)a->hidden);
        if (flat && !fails) {
            r = round_trip(flat, me, n, kind, &ak, out2);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS && !memcmp(out, out2, sizeof(float) * (size_t)n * (size_t)a->hidden),
                        "the %s path's output differs from the %s path's (%s)", a->node_size || !a->cuda ? "flat" : "generic",
                        a->node_size ? "hierarchical" : "load/store", moea2a_strerror(r));
        }
    }
    free(out), free(out2);
    if (flat) moea2a_moe_destroy(flat);
    if (moe) moea2a_moe_destroy(moe);
    if (a->cuda && !a->node_size) { /* refused on every rank: copy-engine mode */
        moea2a_moe_config_t x_c = config_of(a, MOEA2A_WIRE_FP8);
        x_c.flags |= MOEA2A_MOE_COPY_ENGINE;
        moea2a_moe_t x = NULL;
        moea2a_result_t r = moea2a_moe_create(&x, comm, &x_c);
        RANK_EXPECT(fails, me, r == MOEA2A_ERR_UNAVAILABLE && strstr(moea2a_last_error(comm), "combine_wire FP8") &&
                                   strstr(moea2a_last_error(comm), "copy-engine"),
                    "copy-engine mode: %s (%s)", moea2a_strerror(r), moea2a_last_error(comm));
        if (r == MOEA2A_SUCCESS) moea2a_moe_destroy(x);
    }
    moea2a_comm_destroy(comm);
    return fails;
}

/* Refusals: an unknown or NVFP4 format, stray flags or scale layout, hidden not a
 * multiple of 128 (every rank, at create); ranks that disagree (MOEA2A_ERR_MISMATCH
 * on every rank, naming the other). */
static int refuse_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    const arg_t a = {0, 0, 0, 256};
    moea2a_moe_t moe;
    moea2a_moe_config_t c = config_of(&a, MOEA2A_WIRE_NVFP4);
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_ERR_INVALID_ARGUMENT &&
                               strstr(moea2a_last_error(comm), "combine_wire.format"), "NVFP4: %s", moea2a_last_error(comm));
    c = config_of(&a, MOEA2A_WIRE_FP8), c.combine_wire.flags = 0x10;
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_ERR_INVALID_ARGUMENT, "flags 0x10: %s",
                moea2a_last_error(comm));
    c = config_of(&a, MOEA2A_WIRE_FP8), c.combine_wire.scale_layout = MOEA2A_FP8_SCALES_MN_MAJOR;
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_ERR_INVALID_ARGUMENT, "MN-major: %s",
                moea2a_last_error(comm));
    c = config_of(&a, MOEA2A_WIRE_FP8), c.hidden = 200;
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_ERR_INVALID_ARGUMENT &&
                               strstr(moea2a_last_error(comm), "hidden=200"), "hidden 200: %s", moea2a_last_error(comm));
    c = config_of(&a, me == 0 ? MOEA2A_WIRE_FP8 : MOEA2A_WIRE_AS_IS);
    RANK_EXPECT(fails, me, moea2a_moe_create(&moe, comm, &c) == MOEA2A_ERR_MISMATCH &&
                               strstr(moea2a_last_error(comm), "combine_wire"), "disagreement: %s", moea2a_last_error(comm));
    moea2a_comm_destroy(comm);
    return fails;
}

/* CUDA memory, the load/store path: 1, 2 and 4 ranks, a GPU each or sharing them. Rows
 * of more than one pass of the in-place quantization (2048 values), a partial last pass,
 * UE8M0 scales with a padded last word. */
static void cuda_runs(void)
{
#if WITH_CUDA
    static const struct { int ranks, node_size, ue8m0, fp32_out, hidden; } pts[] = {
        {1, 0, 0, 0, 7168}, {2, 0, 1, 0, 2176}, {4, 0, 0, 1, 4224}, {2, 1, 0, 0, 2048}, {4, 2, 1, 0, 1152}};
    const int ndev = gpu_count();
    for (size_t i = 0; i < sizeof(pts) / sizeof(pts[0]); i++) {
        const int n = pts[i].ranks, nodes = pts[i].node_size != 0;
        /* fewer GPUs than ranks: on one node the ranks share them over CUDA IPC; in
         * emulated nodes NCCL sees each rank as a host of its own */
        const int share = n > ndev && ndev > 0 && !nodes && have_ucx();
        if (n > ndev && !share && !(nodes && ndev > 0)) {
            tap_skip(ndev ? "not enough GPUs" : "no CUDA device", "FP8 combine wire on %d GPU(s)%s", n,
                     nodes ? " in emulated nodes" : "");
            continue;
        }
        const arg_t a = {pts[i].node_size, pts[i].ue8m0, pts[i].fp32_out, pts[i].hidden, 1, ndev, share, 0};
        local_ranks_result_t res;
        local_ranks_run(n, wire_rank, (void *)&a, WATCHDOG, &res);
        char where[64];
        if (share) snprintf(where, sizeof(where), "%d ranks sharing %d GPU(s) over CUDA IPC", n, ndev);
        else if (n > ndev) snprintf(where, sizeof(where), "%d ranks on %d GPU(s), NCCL_HOSTID apart", n, ndev);
        else snprintf(where, sizeof(where), "%d GPU(s)", n);
        if (nodes)
            tap_ok(res.failed == 0, "FP8 combine wire on %s in emulated nodes of %d, the hierarchical and the flat generic "
                                    "path (%s scales, hidden %d): each node's partial quantized again on the GPU (at its "
                                    "rail peer on the hierarchical path), equal to the public FP8 calls' reference bit for "
                                    "bit, within the bound, the two paths the same bits",
                   where, a.node_size, a.ue8m0 ? "UE8M0" : "fp32", a.hidden);
        else
            tap_ok(res.failed == 0, "FP8 combine wire on %s, load/store path%s (%s scales, %s out, hidden %d): rows in "
                                    "the combine buffer and from the caller's buffer equal the reference of the public FP8 "
                                    "calls bit for bit, within the bound; copy-engine mode refuses it",
                   where, share ? "" : " and the generic path, the same bits", a.ue8m0 ? "UE8M0" : "fp32",
                   a.fp32_out ? "fp32" : "bf16", a.hidden);
    }
#else
    tap_skip("no CUDA device (built without CUDA or NCCL)", "FP8 combine wire in CUDA memory");
#endif
}

int main(void)
{
    static const int sizes[] = {1, 2, 3, 4};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        local_ranks_result_t res;
        const arg_t a = {0, (int)i % 2, (int)i == 2, i == 3 ? 640 : 256};
        local_ranks_run(sizes[i], wire_rank, (void *)&a, WATCHDOG, &res);
        tap_ok(res.failed == 0, "FP8 combine wire on %d rank(s) (%s scales, %s out, hidden %d): random, skewed and "
                                "outlier rows equal the reference of the public FP8 calls bit for bit, within the "
                                "documented bound of the exact sum", sizes[i], a.ue8m0 ? "UE8M0" : "fp32",
               a.fp32_out ? "fp32" : "bf16", a.hidden);
    }
    for (int ue8m0 = 0; ue8m0 <= 1; ue8m0++) {
        local_ranks_result_t res;
        const arg_t a = {2, ue8m0, 0, 384};
        local_ranks_run(4, wire_rank, (void *)&a, WATCHDOG, &res);
        tap_ok(res.failed == 0, "FP8 combine wire on 4 ranks in emulated nodes of 2 (%s scales): each node's partial "
                                "quantized again, within the bound; the hierarchical and flat paths give the same bits",
               ue8m0 ? "UE8M0" : "fp32");
    }
    cuda_runs();
    local_ranks_result_t res;
    local_ranks_run(2, refuse_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "combine_wire refusals: NVFP4, stray flags, a scale layout, hidden not a multiple of 128; "
                            "ranks that disagree: MOEA2A_ERR_MISMATCH on every rank");
    return tap_done();
}

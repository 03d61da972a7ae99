/* The dispatch's copies: rows in (token, segment) units into the peers' slots, FP8
 * quantized inside them where asked. Part of moe_fast.cu, which includes the parts in
 * order: one translation unit, so that every kernel keeps its inlining. */
namespace {

/* ---- copies --------------------------------------------------------------------------- */

/* Bytes of a row a warp copies per unit, all in flight (8 vectors per lane). On 2 x H200
 * (dispatch at 16 / 24 / 48 SMs, 4096 tokens; 128 tokens at 48 SMs): 2 KB 268.6 / 194.7 /
 * 186.8 us, 23.0 us; 4 KB 207.5 / 186.3 / 186.7 us, 22.5 us; 8 KB 196.6 / 190.2 / 190.8 us,
 * 24.1 us. */
#ifndef M2A_DISPATCH_SEG
#define M2A_DISPATCH_SEG 4096
#endif
constexpr size_t kSeg = M2A_DISPATCH_SEG;
static_assert(kSeg % 512 == 0, "a dispatch unit is whole vectors of every lane");

struct Shared {
    int base[M2A_FAST_MAX_PEERS];  /* next slot at each destination */
    int warp_count[kWarps][M2A_FAST_MAX_PEERS];
    int nd[T];                     /* destinations of each token of the piece */
    unsigned char rank[kPieceSlots];
    int row[kPieceSlots];          /* receive row (src * stride + slot) at that rank */
    unsigned long long pre[T];     /* few tokens: the block's tokens' masks, from the count */
    long long red[kWarps];
    uint32_t epoch;
    int recv_count[M2A_FAST_MAX_PEERS]; /* rows each source sent here (the receive step) */
    unsigned long long pending[2];      /* block 0: the invalid and merged entries of every block */
    unsigned char owner[kOwnerSmem > 0 ? kOwnerSmem : 1]; /* expert -> rank (Owners) */
};

/* One warp copies len bytes (a segment of a row) to nd destinations: 16-byte vectors
 * when the addresses and len allow, else 4-byte words or bytes. Four vectors in
 * flight per lane; stores to peers are posted and need not wait. */
template <bool CG = false>
__device__ void copy_row(const unsigned char *src, unsigned char *const *dst, int nd, size_t len, int lane)
{
    bool vec = ((uintptr_t)src | len) % 16 == 0;
    for (int d = 0; d < nd; d++) vec = vec && (uintptr_t)dst[d] % 16 == 0;
    if (vec) {
        constexpr int U = (int)(kSeg / 16 / kWarpSize); /* the unit's vectors per lane, all in flight */
        const int C = (int)(len / 16);
        const int4 *s4 = reinterpret_cast<const int4 *>(src);
        for (int i0 = lane; i0 < C; i0 += kWarpSize * U) {
            int4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (i0 + kWarpSize * u < C) v[u] = CG ? __ldcg(s4 + i0 + kWarpSize * u) : __ldg(s4 + i0 + kWarpSize * u);
            for (int d = 0; d < nd; d++) {
                int4 *d4 = reinterpret_cast<int4 *>(dst[d]);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (i0 + kWarpSize * u < C) d4[i0 + kWarpSize * u] = v[u];
            }
        }
        return;
    }
    bool words = len % 4 == 0 && (uintptr_t)src % 4 == 0;
    for (int d = 0; d < nd; d++) words = words && (uintptr_t)dst[d] % 4 == 0;
    const size_t unit = words ? 4 : 1, C = len / unit;
    for (size_t i = lane; i < C; i += kWarpSize) {
        uint32_t v = words ? (CG ? __ldcg(reinterpret_cast<const uint32_t *>(src) + i) : reinterpret_cast<const uint32_t *>(src)[i])
                           : src[i];
        for (int d = 0; d < nd; d++) {
            if (words) reinterpret_cast<uint32_t *>(dst[d])[i] = v;
            else dst[d][i] = (unsigned char)v;
        }
    }
}

/* No system fence before the signals' releases: they are cumulative over the block's
 * barrier, and a fence cost about 0.5 us per call at decode sizes. No prefetch of the
 * few-token units into L1 either: the gate's acquire load invalidates L1 anyway. */

constexpr int kDst = 8;         /* destinations a warp writes per pass over a segment */
/* Up to m2a_fast_t.even_tokens tokens per block (MOEA2A_DISPATCH_EVEN_TOKENS), the
 * dispatch's units are split evenly over the warps (no counter); past it, warps take
 * them from a counter, whose balance across SMs that the links serve unevenly pays for
 * its set-up once every warp has several units. The default is measured: see the
 * variable's entry in lib/base/params.c. */

/* The copy units: kSeg-byte segments of a token's payload rows, all byte arrays laid
 * end to end, so that a unit may span arrays. A payload quantized on dispatch carries
 * a short scale row (and NVFP4 a 4-byte global scale) next to its codes; as units of
 * their own they tripled the units of such a payload, and each unit costs a counter
 * grab and a map read. Each array starts 16-byte aligned in that concatenation, so a
 * piece of it starts 16-byte aligned in its row (16-byte copies where rows allow). */
__device__ __forceinline__ size_t span16(size_t width) { return (width + 15) / 16 * 16; }

/* How the rows of payloads sent quantized come to be: by the standalone kernels before
 * the launch (or none is quantized), by them alongside the dispatch kernel (each chunk
 * of tokens waited for, f.qrows), or inside the dispatch's copies (f.qfuse). */
enum QuantWay { kBefore, kAlongside, kInCopy };

/* Bytes of a unit. Quantizing in the copies with few tokens (the even split of
 * m2a_fast_t.even_tokens), a unit is 2048 codes, one pass of the warp (quantize_piece): in 4096-code
 * units each warp made two passes one after the other while most warps had no unit.
 * On one H100, 128 / 1024 / 4096 tokens: 2048 17.8 / 40.2 / 106.7 us, 4096 19.0 / 37.5
 * / 93.8. */
#ifndef M2A_QUANT_COPY_SMALL_SEG
#define M2A_QUANT_COPY_SMALL_SEG 2048
#endif
static_assert(M2A_QUANT_COPY_SMALL_SEG % 512 == 0, "in-copy units hold whole UE8M0 scale words");
template <QuantWay Q, bool SMALL> __host__ __device__ constexpr size_t unit_bytes()
{
    return Q == kInCopy && SMALL ? (size_t)M2A_QUANT_COPY_SMALL_SEG : kSeg;
}

template <QuantWay Q, bool SMALL> __device__ uint32_t segments_per_token(const m2a_kparams_t &p)
{
    size_t bytes = 0;
    for (int a = 0; a < p.num_payloads; a++) bytes += span16(p.width[a]);
    return (uint32_t)((bytes + unit_bytes<Q, SMALL>() - 1) / unit_bytes<Q, SMALL>());
}

/* Calls piece(a, t, off, len) for each payload array a that unit u (token t = u /
 * per_token, the bytes [lo, lo + unit_bytes) of its arrays end to end) overlaps: [off,
 * off + len) the unit's bytes of the token's row of a. */
template <QuantWay Q, bool SMALL, typename Piece>
__device__ __forceinline__ void unit_pieces(const m2a_kparams_t &p, unsigned long long u, uint32_t per_token, Piece piece)
{
    const int t = (int)(u / per_token);
    const size_t lo = (size_t)(u % per_token) * unit_bytes<Q, SMALL>(), hi = lo + unit_bytes<Q, SMALL>();
    size_t start = 0; /* of array a, end to end */
    for (int a = 0; a < p.num_payloads && start < hi; start += span16(p.width[a]), a++) {
        const size_t width = p.width[a];
        if (start + width <= lo) continue;
        const size_t off = lo > start ? lo - start : 0, len = (start + width < hi ? start + width : hi) - start - off;
        piece(a, t, off, len);
    }
}

/* The largest of each lane's a[0..7] over the 16 lanes of its half-warp, transposed:
 * lane q of a half (q = lane % 16) returns that of a[q / 2]. Each butterfly step
 * trades half of the values still held, so 4 + 2 + 1 + 1 shuffles do the work of 8 x 4. */
__device__ __forceinline__ uint32_t half_max_transposed(const uint32_t *a, int lane)
{
    const bool b3 = lane & 8, b2 = lane & 4, b1 = lane & 2;
    uint32_t x[4], y[2];
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = max(b3 ? a[i + 4] : a[i], __shfl_xor_sync(kAllLanes, b3 ? a[i] : a[i + 4], 8));
#pragma unroll
    for (int i = 0; i < 2; i++) y[i] = max(b2 ? x[i + 2] : x[i], __shfl_xor_sync(kAllLanes, b2 ? x[i] : x[i + 2], 4));
    uint32_t z = max(b1 ? y[1] : y[0], __shfl_xor_sync(kAllLanes, b1 ? y[0] : y[1], 2));
    return max(z, __shfl_xor_sync(kAllLanes, z, 1));
}

/* FP8 quantized inside the copies (m2a_fast_t.qfuse): the codes [off, off + len) of a
 * token's row of array a (whole 128-value blocks; off a multiple of 512, so that UE8M0
 * scale words are whole) from its 16-bit row src (2 bytes per code), stored with their
 * row-major scales (array a + 1) at nd destinations by one warp: each token is read
 * and quantized once, whatever its destinations. The arithmetic of the standalone
 * quantize kernel (fp8_device.cuh), so the same bits. A pass is 8 16-byte vectors per
 * lane in flight, 16 blocks of 128 values (block 2u + h: vector u of half-warp h);
 * each block's amax is reduced into one lane pair (half_max_transposed), which alone
 * computes its scale (the divisions cost more than the rest of the arithmetic when
 * every lane made every scale: 4096 tokens on one H200 took 116 against 93 us without
 * them; 91 with this) and stores it, and hands the multiplier back to its 16 lanes.
 * (Loading the next pass before quantizing this one spilled registers and cost 16%:
 * one H200.) */
template <moea2a_datatype_t SRC, typename Dest>
__device__ void quantize_piece(const m2a_fast_t &f, int a, const unsigned char *src, size_t off, size_t len, bool ue8m0,
                               int nd, Dest dest)
{
    const m2a_kparams_t &p = f.p;
    constexpr int U = 8;
    const int lane = threadIdx.x % kWarpSize, h = lane >> 4, C = (int)(len / 8); /* source vectors of 8 values */
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src + 2 * off);
    const size_t kb0 = off / M2A_FP8_BLOCK;
    for (int v0 = 0; v0 < C; v0 += kWarpSize * U) { /* warp-uniform: every lane shuffles */
        const int i0 = v0 + lane;
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) raw[u] = i0 + kWarpSize * u < C ? __ldg(s4 + i0 + kWarpSize * u) : make_uint4(0, 0, 0, 0);
        uint32_t am[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float v[8]; /* unused here: the compiler drops it */
            am[u] = m2a_fp8_unpack<SRC, 1>(&raw[u], v);
        }
        /* this lane's block: vector u = (lane % 16) / 2 of half h, the lane pair's */
        const uint32_t bam = half_max_transposed(am, lane);
        const bool blive = v0 + kWarpSize * ((lane & 15) >> 1) + 16 * h < C;
        float bmul; /* 0 for a non-finite block (finite ones get at least 448 / FLT_MAX) */
        const uint32_t sc = m2a_fp8_scale(__uint_as_float(bam), bam < 0x7f800000u, ue8m0, &bmul);
        uint2 code[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const float mul = __shfl_sync(kAllLanes, bmul, 16 * h + 2 * u);
            float v[8];
            m2a_fp8_unpack<SRC, 1>(&raw[u], v);
            uint32_t w[2];
            m2a_fp8_encode<8>(v, mul, mul != 0.0f, w);
            code[u] = make_uint2(w[0], w[1]);
        }
        /* UE8M0: blocks 4j..4j+3 of the pass (lanes 4j, 16 + 4j, 4j + 2, 18 + 4j) make word j,
         * packed by lane 4j; bytes of blocks past the row's end 0 */
        uint32_t word = 0;
        if (ue8m0) {
            const int from[4] = {0, 16, 2, 18};
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const uint32_t byte = __shfl_sync(kAllLanes, sc, (lane + from[b]) % kWarpSize);
                if (v0 + 64 * (lane >> 2) + 16 * b < C) word |= byte << (8 * b);
            }
        }
        const size_t kb = kb0 + (size_t)(v0 / 16); /* the pass's first block */
        for (int d = 0; d < nd; d++) {
            int rank;
            size_t row;
            dest(d, &rank, &row);
            unsigned char *base = f.peer[rank];
            uint2 *dc = reinterpret_cast<uint2 *>(base + p.ws_off[a] + row * p.width[a] + off);
            uint32_t *ds = reinterpret_cast<uint32_t *>(base + p.ws_off[a + 1] + row * p.width[a + 1]);
#pragma unroll
            for (int u = 0; u < U; u++)
                if (i0 + kWarpSize * u < C) dc[i0 + kWarpSize * u] = code[u];
            if (ue8m0) {
                if (lane < 16 && (lane & 3) == 0 && v0 + 64 * (lane >> 2) < C) ds[kb / 4 + (lane >> 2)] = word;
            } else if ((lane & 1) == 0 && blive) {
                ds[kb + 2 * ((lane & 15) >> 1) + h] = sc;
            }
        }
    }
}

/* Copies unit u to the token's nd destinations, kDst at a time; dest(d, &rank, &row)
 * gives destination d's rank and receive row. One warp, warp-uniform arguments.
 * kAlongside: loads through L2 only (the source rows are being written while the kernel
 * runs: the read-only path may keep a stale line of a neighbour's scales). kInCopy: the
 * arrays of f.qfuse are quantized here (quantize_piece), their scale arrays written with
 * them. */
template <QuantWay Q, bool SMALL, typename Dest>
__device__ void copy_unit(const m2a_fast_t &f, const m2a_kpayloads_t &pay, unsigned long long u, uint32_t per_token,
                          int nd, Dest dest)
{
    const m2a_kparams_t &p = f.p;
    constexpr bool FUSE = Q == kInCopy;
    unit_pieces<Q, SMALL>(p, u, per_token, [&](int a, int t, size_t off, size_t len) {
        const size_t width = p.width[a];
        if (FUSE && ((f.qfuse >> a) & 1)) {
            const unsigned char *src = static_cast<const unsigned char *>(pay.p[a]) + (size_t)t * 2 * width;
            const bool ue8m0 = (f.qfuse_ue8m0 >> a) & 1;
            if ((f.qfuse_f16 >> a) & 1) quantize_piece<MOEA2A_FLOAT16>(f, a, src, off, len, ue8m0, nd, dest);
            else quantize_piece<MOEA2A_BFLOAT16>(f, a, src, off, len, ue8m0, nd, dest);
            return;
        }
        if (FUSE && a > 0 && ((f.qfuse >> (a - 1)) & 1)) return; /* scales: written with their codes */
        const unsigned char *src_row = static_cast<const unsigned char *>(pay.p[a]) + (size_t)t * width;
        for (int d0 = 0; d0 < nd; d0 += kDst) {
            unsigned char *dst[kDst];
            const int m = nd - d0 < kDst ? nd - d0 : kDst;
            for (int d = 0; d < m; d++) {
                int rank;
                size_t row;
                dest(d0 + d, &rank, &row);
                dst[d] = f.peer[rank] + p.ws_off[a] + row * width + off;
            }
            copy_row<Q == kAlongside>(src_row + off, dst, m, len, threadIdx.x % kWarpSize);
        }
    });
}

/* The first of this warp's share of total units, split evenly over every warp of the
 * grid (the next warp's first ends the share). */
__device__ long long warp_share(long long total, long long gw)
{
    return total * gw / ((long long)gridDim.x * kWarps);
}

/* The payload rows, in units of (token, kSeg segment of its rows end to end) that warps
 * take from a counter: an SM that the links serve faster takes more units, so all
 * blocks end at about the same time (a static split left the links idle while the
 * slowest blocks finished), and a few tokens still spread over every SM. A token's
 * slots come from its send map, written by the block that routed it. Q: how payloads
 * sent quantized become their rows (QuantWay). */
template <QuantWay Q>
__device__ bool copy_payloads(const m2a_fast_t &f, unsigned long long *next, const Ctl &c, const m2a_kpayloads_t &pay,
                              int n, int stride, const int32_t *send_map, uint32_t e, int G)
{
    const m2a_kparams_t &p = f.p;
    const int lane = threadIdx.x % kWarpSize, D = p.k < p.ep ? p.k : p.ep;
    const uint32_t per_token = segments_per_token<Q, false>(p);
    const unsigned long long units = (unsigned long long)n * per_token;
    int ready = -1;  /* the last block whose send map this warp saw complete */
    int quantized = -1; /* kAlongside: the last chunk this warp saw quantized */
    /* the warp's next unit, asked for while it copies the current one: one round trip to
     * the counter less per unit */
    unsigned long long ahead = 0;
    if (lane == 0) ahead = atomicAdd(next, 1ull);
    for (;;) {
        unsigned long long u = 0;
        if (lane == 0) u = ahead;
        u = __shfl_sync(kAllLanes, u, 0);
        if (u >= units) return true;
        if (lane == 0) ahead = atomicAdd(next, 1ull);
        const int t = (int)(u / per_token);
        const int owner = (int)(((long long)(t + 1) * G - 1) / n); /* the block whose chunk holds t */
        if (owner != ready) {
            bool ok = true;
            if (lane == 0) ok = wait_for(f, &c.routed[owner], e, p.me, M2A_FAST_AT_PREFIX);
            if (!__shfl_sync(kAllLanes, ok, 0)) return false;
            ready = owner;
        }
        if (Q == kAlongside && t / f.qrows != quantized) {
            const int q = t / f.qrows, rows = n - q * f.qrows < f.qrows ? n - q * f.qrows : f.qrows;
            bool ok = true;
            if (lane == 0) ok = wait_for(f, c.qready + q, (uint32_t)rows * f.qgroups, p.me, M2A_FAST_AT_QUANTIZE);
            if (!__shfl_sync(kAllLanes, ok, 0)) return false;
            quantized = q;
        }
        __syncwarp();
        /* the token's (rank, slot) codes, ascending by rank, then -1: D <= 64 */
        const int32_t *map = send_map + (size_t)t * p.k;
        const int32_t lo = lane < D ? __ldcg(map + lane) : -1, hi = lane + kWarpSize < D ? __ldcg(map + lane + kWarpSize) : -1;
        const int nd = __popc(__ballot_sync(kAllLanes, lo >= 0)) + __popc(__ballot_sync(kAllLanes, hi >= 0));
        copy_unit<Q, false>(f, pay, u, per_token, nd, [&](int d, int *rank, size_t *row) {
            const int32_t cd = d < kWarpSize ? __shfl_sync(kAllLanes, lo, d) : __shfl_sync(kAllLanes, hi, d - kWarpSize);
            *rank = cd / p.cap, *row = (size_t)p.me * stride + cd % p.cap;
        });
    }
}

/* Entry j of token t's ids (sanitized for the destination rank) and weights into
 * receive row row at rank, and with entry 0 the row's source index. */
template <class O>
__device__ __forceinline__ void put_entry(const m2a_fast_t &f, const O &owner, const int32_t *ids,
                                          const float *weights, int t, int j, int rank, size_t row)
{
    const m2a_kparams_t &p = f.p;
    const int k = p.k, P = p.num_payloads;
    unsigned char *base = f.peer[rank];
    int32_t e = ids[(size_t)t * k + j];
    if (f.sanitize && (invalid_id(p, e) || (f.rewrite && owner(p, e, t) != rank))) e = p.invalid_id;
    reinterpret_cast<int32_t *>(base + p.ws_off[P])[row * k + j] = e;
    if (p.weights) reinterpret_cast<float *>(base + p.ws_off[P + 1])[row * k + j] = weights[(size_t)t * k + j];
    if (j == 0) reinterpret_cast<int32_t *>(base + p.ws_off[p.narrays - 1])[row] = t;
}

/* ids (sanitized for each destination), weights and the source index of the piece's
 * tokens tl0..tl1-1 (indices in the piece that starts at token first). */
template <class O>
__device__ void copy_small(const m2a_fast_t &f, const Shared &s, const O &owner, int D, int first, int tl0, int tl1,
                           const int32_t *ids, const float *weights)
{
    const int k = f.p.k;
    const int items = (tl1 - tl0) * D * k; /* piece x D <= kPieceSlots, k <= 1024 */
    for (int i = threadIdx.x; i < items; i += T) {
        const int tl = tl0 + i / (D * k), d = i / k % D, j = i % k;
        if (d >= s.nd[tl]) continue;
        const int slot = tl * D + d;
        put_entry(f, owner, ids, weights, first + tl, j, s.rank[slot], (size_t)s.row[slot]);
    }
}

/* ---- a block's few tokens routed by each warp alone ------------------------------------
 * Where a block's tokens fit one warp's lanes (the few-token dispatch's range, hi - lo
 * <= 32, at the default bound up to 17 tokens), no block-wide routing pass is needed:
 * a token's slot at rank r is the base there (s.base, from the count) plus the block's
 * earlier tokens that go to r (their masks are s.pre, from the count), which any warp
 * reads from shared memory. So each warp routes just the tokens of its own units, in
 * registers, and starts its copies at once; the block's own tokens' send map rows and
 * ids, weights and source index are spread over its warps. The slots, the send
 * map and every byte are those of route_piece + copy_small + copy_units. */

/* Token tl (of the block's range)'s destinations, as send map codes (rank x cap +
 * slot, ascending rank): destination d in lane d's lo (d < 32) or hi (d - 32), -1 past
 * the last. */
struct TokenCodes {
    int nd;
    int32_t lo, hi;
};
__device__ __forceinline__ int32_t nth_code(const m2a_fast_t &f, const Shared &s, unsigned long long m, int tl, int d)
{
    if (d >= __popcll(m)) return -1;
    for (int i = 0; i < d; i++) m &= m - 1; /* the d-th destination: the lowest bit left */
    const int r = __ffsll((long long)m) - 1;
    int slot = s.base[r];
    for (int l = 0; l < tl; l++) slot += (int)((s.pre[l] >> r) & 1);
    return r * f.p.cap + slot;
}
__device__ __forceinline__ TokenCodes token_codes(const m2a_fast_t &f, const Shared &s, int tl)
{
    const int lane = threadIdx.x % kWarpSize;
    const unsigned long long m = s.pre[tl];
    return {__popcll(m), nth_code(f, s, m, tl, lane), nth_code(f, s, m, tl, lane + kWarpSize)};
}
__device__ __forceinline__ int32_t code_at(const TokenCodes &c, int d)
{
    const int32_t lo = __shfl_sync(kAllLanes, c.lo, d % kWarpSize), hi = __shfl_sync(kAllLanes, c.hi, d % kWarpSize);
    return d < kWarpSize ? lo : hi;
}

/* The send map row and entries of the block's own token t (its range starts at lo),
 * by one warp. */
template <class O>
__device__ void tiny_entries(const m2a_fast_t &f, const Shared &s, const O &owner, const int32_t *ids,
                             const float *weights, int32_t *send_map, size_t mine, int lo, int t)
{
    const m2a_kparams_t &p = f.p;
    const int lane = threadIdx.x % kWarpSize, k = p.k;
    const TokenCodes c = token_codes(f, s, t - lo);
    int32_t *map = send_map + (size_t)t * k;
    for (int j0 = 0; j0 < k; j0 += kWarpSize) { /* warp-uniform: code_at shuffles */
        const int j = j0 + lane;
        const int32_t code = code_at(c, j % M2A_FAST_MAX_PEERS);
        if (j < k) map[j] = j < c.nd ? code : -1;
    }
    for (int i0 = 0; i0 < c.nd * k; i0 += kWarpSize) {
        const int i = i0 + lane, d = i / k;
        const int32_t code = code_at(c, d < c.nd ? d : 0);
        if (i < c.nd * k) put_entry(f, owner, ids, weights, t, i % k, code / p.cap, mine + code % p.cap);
    }
}

/* One warp: the block's own tokens [own_lo, own_hi) from own_lo + warp on, every
 * kWarps-th (their send map rows and entries), then its share [u0, u1) of the grid's
 * even split of n x S units (S per token, per_token of them with payload bytes, 0:
 * none) in the block's range, which starts at token lo. The entries and a unit each
 * begin with a read of memory (the ids and weights, the row): given to the warp that
 * holds the token's first unit, they cost 0.5 us at 1 token on 2 GPUs; spread this way
 * they go to other warps where the block has few tokens. Entries first (4 x H200,
 * dispatch at 128 tokens, 4 GPUs: 2.6 us less than the block-wide routing; with the
 * entries after the payload, 0.4). Choosing warps without units for the entries cost
 * more in arithmetic (0.5 us at 1 token) than it saved. */
template <QuantWay Q, class O>
__device__ void copy_tiny(const m2a_fast_t &f, const Shared &s, const O &owner, const m2a_kpayloads_t &pay,
                          const int32_t *ids, const float *weights, int32_t *send_map, int stride, int lo, int own_lo,
                          int own_hi, long long u0, long long u1, uint32_t per_token, uint32_t S)
{
    const m2a_kparams_t &p = f.p;
    const size_t mine = (size_t)p.me * stride;
    for (int t = own_lo + (int)(threadIdx.x / kWarpSize); t < own_hi; t += kWarps)
        tiny_entries(f, s, owner, ids, weights, send_map, mine, lo, t);
    int t_prev = -1;
    TokenCodes c = {0, -1, -1};
    for (long long u = u0; u < u1 && per_token; u++) {
        const int t = (int)(u / S);
        if (t != t_prev) c = token_codes(f, s, t - lo), t_prev = t;
        copy_unit<Q, true>(f, pay, (unsigned long long)u, per_token, c.nd, [&](int d, int *rank, size_t *row) {
            const int32_t code = code_at(c, d);
            *rank = code / p.cap, *row = mine + code % p.cap;
        });
    }
}

} // namespace

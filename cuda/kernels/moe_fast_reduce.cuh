/* The combine's reductions: a token's rows summed in fp32 in ascending rank order, by
 * 16-byte loads and through the bulk copy engine (sm_90+). Part of moe_fast.cu, which
 * includes the parts in order: one translation unit, so that every kernel keeps its
 * inlining. */
namespace {

/* ---- combine ---------------------------------------------------------------------------- */

/* A value of DT at a time (Elem), 16-byte vectors rounded by the pair instruction (pack_vec):
 * elem.cuh, shared with the other kernels. */
using m2a_elem::Elem;
using m2a_elem::pack_vec;

/* acc[v] += value v of a 16-byte vector of DT (16 / size of them). bf16 words split by a
 * shift and a mask (one instruction each, where the element-wise get takes two). */
template <moea2a_datatype_t DT> __device__ __forceinline__ void add_vec(float *acc, const int4 &r)
{
    if constexpr (DT == MOEA2A_BFLOAT16) {
        const uint32_t w[4] = {(uint32_t)r.x, (uint32_t)r.y, (uint32_t)r.z, (uint32_t)r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[2 * i] += __uint_as_float(w[i] << 16);
            acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int v = 0; v < (int)(16 / Elem<DT>::size); v++) acc[v] += Elem<DT>::load(reinterpret_cast<const unsigned char *>(&r), v);
    }
}

constexpr size_t kSegC = 1024; /* bytes of an output row a warp reduces per unit: 2 vectors per lane */
/* Up to kEvenUnitsPerWarp units of kSegEven bytes per warp: larger units, split evenly,
 * 4 vectors per lane of 2 rows at a time (on one H200, one rank,
 * 48 SMs, the counter's 1 KB loads took 16.4 / 23.0 / 42.0 us at 256 / 512 / 1024 tokens,
 * this one 11.4 / 15.2 / 27.8). Past the bound the bulk-copy way takes over, whose
 * counter also balances the SMs that the links serve unevenly. Since that way's loop lost
 * half its instructions (one H100, one rank, combine us at 256 / 512 / 1024 tokens),
 * a bound of 8 beats 16 where more units per warp would follow: 48 SMs 10.2 / 13.5 /
 * 21.3 against 10.1 / 12.9 / 24.2, 16 SMs 14.4 / 20.3 / 34.0 against 14.4 / 23.6 / 34.0;
 * 4 and 2 lose at 256-512 tokens (48 SMs 512 tokens 14.6, 24 SMs 256 tokens 14.3). */
constexpr size_t kSegEven = 2048;
#ifndef M2A_COMBINE_EVEN_UNITS
#define M2A_COMBINE_EVEN_UNITS 8
#endif
constexpr int kEvenUnitsPerWarp = M2A_COMBINE_EVEN_UNITS;

/* Row d of a token, held by lane d (row_lo) or lane d - 32 (row_hi). */
__device__ __forceinline__ const unsigned char *row_of(const unsigned char *row_lo, const unsigned char *row_hi, int d)
{
    return d < kWarpSize ? reinterpret_cast<const unsigned char *>(__shfl_sync(kAllLanes, (unsigned long long)row_lo, d))
                  : reinterpret_cast<const unsigned char *>(__shfl_sync(kAllLanes, (unsigned long long)row_hi, d - kWarpSize));
}

/* One warp: out bytes [off, off + len) = the sum of the token's nd rows (those bytes),
 * from 0.0f in ascending rank order, rounded once: the host reference's arithmetic.
 * Every row's vectors are loaded before any is added (up to R rows at a time, U
 * vectors per lane: len <= U x 512): NVLink reads have long latency and need many in
 * flight. */
template <moea2a_datatype_t DT, int U = (int)(kSegC / 16 / kWarpSize), int R = 4>
__device__ void reduce_unit(const unsigned char *row_lo, const unsigned char *row_hi, int nd, size_t off, size_t len,
                            unsigned char *out, bool vec)
{
    const int lane = threadIdx.x % kWarpSize;
    if (vec) {
        constexpr int V = (int)(16 / Elem<DT>::size);
        const int C = (int)(len / 16);
        int4 r[U][R];
        float acc[U][V];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int v = 0; v < V; v++) acc[u][v] = 0.0f;
        for (int d0 = 0; d0 < nd; d0 += R) {
#pragma unroll
            for (int d = 0; d < R; d++) {
                const unsigned char *src = d0 + d < nd ? row_of(row_lo, row_hi, d0 + d) + off : nullptr;
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (src && lane + kWarpSize * u < C) r[u][d] = reinterpret_cast<const int4 *>(src)[lane + kWarpSize * u];
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int d = 0; d < R; d++)
                    if (d0 + d < nd)
                        add_vec<DT>(acc[u], r[u][d]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (lane + kWarpSize * u < C) reinterpret_cast<int4 *>(out + off)[lane + kWarpSize * u] = pack_vec<DT>(acc[u]);
        return;
    }
    const int h0 = (int)(off / Elem<DT>::size), h1 = (int)((off + len) / Elem<DT>::size);
    for (int h = h0; h < h1; h += kWarpSize) { /* warp-uniform trips: every lane reaches the shuffles */
        float acc = 0.0f;
        for (int d = 0; d < nd; d++) {
            const unsigned char *src = row_of(row_lo, row_hi, d);
            if (h + lane < h1) acc += Elem<DT>::load(src, h + lane);
        }
        if (h + lane < h1) Elem<DT>::store(out, h + lane, acc);
    }
}

/* Consecutive units a warp takes per grab of the combine's counter, mostly one
 * token's, so that the token's map is read once for them. Fewer SMs keep fewer reads
 * in flight and lose more to the counter's round trip and those reads (best at 4096
 * tokens on 4 x H200: 2 units at 48 SMs, 4 at 24, 6-7 at 16); more blocks balance
 * better with 1, and few tokens need every warp busy: at least two grabs per warp. */
__device__ unsigned units_per_grab(unsigned long long units, int G)
{
    const unsigned long long per_warp = units / (2ull * G * kWarps);
    unsigned take = 96u / (unsigned)G;
    if (take > 8u) take = 8u;
    if (take > per_warp) take = (unsigned)per_warp;
    return take ? take : 1u;
}

/* ---- the combine's reduce through the bulk copy engine (sm_90+) ------------------------
 * With few SMs, 16-byte loads cannot keep enough reads in flight to fill NVLink (154
 * GB/s per GPU from 16 SMs on 2 x H200), while bulk copies issued by one lane reach
 * the load ceiling from the same SMs. A unit is tma_seg(D) bytes of a token's output
 * row; its rows (one per source rank, D <= kTmaRows of them) land in a stage of the
 * warp's shared memory, an mbarrier counts their bytes, and the warp reduces them from
 * there in the same order as reduce_unit (ascending rank, fp32 from 0, rounded once):
 * the same bits. Each warp keeps as many stages in flight as kTmaWarpBytes holds, at
 * most kTmaMaxStages, and loads the next unit's map while it waits for a stage.
 * What a unit costs apart from its bytes (the counter, the map, the barrier) decides
 * the time at few SMs, so units are as large as two stages allow. On 2 x H200 at 4096
 * tokens (2 rows per unit; 16 / 24 SMs), before the loop lost half its instructions: 3 stages of 2 KB 365 / 252 us; 2 of 1 KB 465 / 319; 4 of 1 KB 474 / 325;
 * 6 of 1 KB 516 / 355; 16-byte loads 513 / 359; copying this rank's own row with the
 * lanes (cp.async) instead of the bulk engine, 4 of 1 KB, 525 / 360. On one H100 (1 row
 * per unit, 16 / 24 / 32 / 48 SMs, after it): 2 KB units 174 / 123 / 97 / 72 us, 4 KB
 * 157 / 104 / 86 / 64. With 2 and 4 rows per unit (bench/device/combine_check.cu, the
 * peers' rows in one H100's memory, 4096 tokens, 16 / 24 / 48 SMs), units in 512-byte
 * steps rather than halvings and 14 KB per warp rather than 12: 2 rows (3 stages of 2 KB
 * -> 2 of 3.5 KB) 144 / 104 / 70 -> 117 / 83 / 72 us; 4 rows (3 of 1 KB -> 2 of 1.5 KB)
 * 246 / 175 / 108 -> 211 / 150 / 100. */
#ifndef M2A_TMA_SEG
#define M2A_TMA_SEG 4096
#endif
/* 16 warps of 14 KB (two rows per unit) and the kernels' static shared memory (2.7 KB)
 * take all but 384 bytes of the 227 KB a block may have on sm_90: a launch that needed
 * more would be refused it (M2A_FAST_BULK_SMEM) and every combine would take the loads
 * way: moea2a_moe_create warns, and bench/device/combine_check.cu fails. */
#ifndef M2A_TMA_WARP_BYTES
#define M2A_TMA_WARP_BYTES 14336
#endif
constexpr int kTmaRows = 4, kTmaMaxStages = 4;
constexpr size_t kTmaSeg = M2A_TMA_SEG, kTmaWarpBytes = M2A_TMA_WARP_BYTES;
constexpr size_t kTmaSmem = kWarps * kTmaWarpBytes; /* the most dynamic shared memory a launch asks for */
static_assert(kTmaSeg % 512 == 0 && kTmaSeg >= 1024 && kTmaWarpBytes >= 2 * 1024,
              "units are whole vectors of a warp; two stages of a 1 KB row fit a warp");

/* Bytes per unit for D rows: the most 512-byte steps (whole vectors of every lane), up to
 * kTmaSeg, of which two stages fit the warp's share. */
__host__ __device__ constexpr size_t tma_seg(int D)
{
    const size_t fit = kTmaWarpBytes / (2 * (size_t)D) / 512 * 512;
    return fit < kTmaSeg ? (fit < 1024 ? 1024 : fit) : kTmaSeg;
}

/* Stages a warp keeps in flight for D rows per unit; below 2 the loads path is used. */
__host__ __device__ constexpr int tma_stages(int D)
{
    return (int)(kTmaWarpBytes / ((size_t)D * tma_seg(D))) < kTmaMaxStages
               ? (int)(kTmaWarpBytes / ((size_t)D * tma_seg(D)))
               : kTmaMaxStages;
}

/* Shared memory a warp's stages take for D rows, and a launch's: only what the stages
 * use, since the rest is L1 cache. One row per unit (4 KB, 3 stages) takes 12 KB: with
 * all 14 KB asked for, one H100's combine at 4096 tokens (ep 1) was 2-3% slower than
 * with the earlier units; with 12 KB, 1.5-2%. */
__host__ __device__ constexpr size_t tma_warp_bytes(int D) { return (size_t)D * tma_seg(D) * (size_t)tma_stages(D); }
__host__ __device__ constexpr size_t tma_smem(int D) { return (size_t)kWarps * tma_warp_bytes(D); }

/* Launches of at most this many blocks reduce through bulk copies (where the even split
 * does not apply): all of them. With the loop's instructions halved, one
 * H100 at 4096 tokens takes 64 us this way at 48 SMs against 131 with loads; the loads
 * way stays for rows the bulk copies cannot take (unaligned rows, more than kTmaRows
 * ranks per token, GPUs before sm_90). On 2 x H200 before that change, at 48
 * SMs bulk copies took 200 us against 211 with loads; the bound was then 32, since the
 * round trip gained nothing and 128 tokens lost 13% (a size the even split now takes). */
#ifndef M2A_COMBINE_TMA_MAX_BLOCKS
#define M2A_COMBINE_TMA_MAX_BLOCKS M2A_FAST_MAX_BLOCKS
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

/* Orders this thread's generic-proxy accesses (the acquire of the peers' signals, the
 * reads of a stage) before its later bulk copies (async proxy). */
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async;" ::: "memory");
#endif
}

/* Reduces a landed stage of N rows (row d at stage + d x seg) into len bytes at dst:
 * rows summed in fp32 from 0 in stage order (ascending rank), rounded once. The rows
 * are loaded before any is added. N is a template argument so that a unit's loop has
 * no branch or predicate per row (reduce_landed picks it from the unit). */
template <moea2a_datatype_t DT, int N>
__device__ __forceinline__ void reduce_rows(const unsigned char *stage, unsigned seg, unsigned len, unsigned char *dst)
{
    constexpr int V = (int)(16 / Elem<DT>::size), U = (int)(kTmaSeg / 16 / kWarpSize); /* the largest unit */
    const unsigned lane = threadIdx.x % kWarpSize, C = len / 16;
    const int4 *row = reinterpret_cast<const int4 *>(stage) + lane;
    int4 *out = reinterpret_cast<int4 *>(dst) + lane;
    const unsigned row_step = seg / 16;
#pragma unroll
    for (int k = 0; k < U; k++) {
        if (lane + 32u * k >= C) break;
        int4 r[N > 0 ? N : 1];
#pragma unroll
        for (int d = 0; d < N; d++) r[d] = row[d * row_step + kWarpSize * k];
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = 0.0f;
#pragma unroll
        for (int d = 0; d < N; d++) add_vec<DT>(acc, r[d]);
        out[kWarpSize * k] = pack_vec<DT>(acc);
    }
}

template <moea2a_datatype_t DT>
__device__ __forceinline__ void reduce_landed(const unsigned char *stage, unsigned seg, int nd, unsigned len,
                                              unsigned char *dst)
{
    static_assert(kTmaRows == 4, "one case per row count");
    switch (nd) {
    case 0: reduce_rows<DT, 0>(stage, seg, len, dst); break;
    case 1: reduce_rows<DT, 1>(stage, seg, len, dst); break;
    case 2: reduce_rows<DT, 2>(stage, seg, len, dst); break;
    case 3: reduce_rows<DT, 3>(stage, seg, len, dst); break;
    default: reduce_rows<DT, 4>(stage, seg, len, dst); break;
    }
}

/* Reduces tokens' rows through bulk copies: units of tma_seg(D) bytes of a token's output
 * row, tma_stages(D) of them in flight per warp. grab(&u0, &end) gives the warp its next
 * run of units [u0, end) (false: none left); rows(code) is the row of a send map code.
 * Needs tma_stages(D) >= 2, 16-byte rows and tma_smem(D) bytes of dynamic shared memory.
 * At few SMs the time is the instructions a unit costs (ncu at 16 SMs on one H100: issue
 * slots 55% busy, ~780 warp instructions per 2 KB unit), so the loop keeps them few: the
 * grab's units are walked without a division each, a token's rows are found once for its
 * units, the stage's unit is read from shared memory, and a stage is copied into again
 * after a __syncwarp alone: every lane's reads of it have returned (their sums were
 * stored), the consumer release of CUTLASS's TMA pipelines. */
template <moea2a_datatype_t DT, typename Grab, typename Rows>
__device__ void reduce_bulk(const int32_t *send_map, int k, int D, size_t out_row, uint32_t S, Grab grab, Rows rows,
                            unsigned char *out)
{
    extern __shared__ __align__(128) unsigned char dsm[];
    __shared__ uint64_t bars[kWarps][kTmaMaxStages];
    __shared__ int4 units_at[kWarps][kTmaMaxStages]; /* stage s's unit: token, rows, offset, length */
    const int lane = threadIdx.x % kWarpSize, w = threadIdx.x / kWarpSize, NS = tma_stages(D);
    const unsigned seg = (unsigned)tma_seg(D), stage_bytes = (unsigned)D * seg;
    unsigned char *stages = dsm + (size_t)w * tma_warp_bytes(D);
    if (lane == 0)
        for (int s = 0; s < NS; s++) mbar_init(&bars[w][s], 1);
    fence_proxy_async(); /* the barriers' init (and the combine's acquire of its peers' signals) before any bulk copy */
    __syncwarp();
    /* the next unit is (t, j), segment j of token t, and `left` more follow in the grab */
    long long left = 0;
    int t = 0;
    uint32_t j = 0;
    bool more = true;
    auto next_unit = [&]() -> bool {
        if (left == 0) {
            unsigned long long u0, end;
            if (!more || !(more = grab(&u0, &end))) return false;
            left = (long long)(end - u0), t = (int)(u0 / S), j = (uint32_t)(u0 % S);
            if (left <= 0) return more = false;
        }
        left--;
        return true;
    };
    /* the pending unit and its token's map entry (lane d: the d-th (rank, slot) code),
     * loaded ahead so that the load's latency passes while the warp waits */
    bool pend = next_unit();
    int pend_t = t;
    uint32_t pend_j = j;
    int32_t pend_slot = pend && lane < D ? __ldcg(send_map + (size_t)pend_t * k + lane) : -1;
    /* the token of the last unit issued: its rows (lane d: the row of its d-th map entry,
     * null past them), how many, and where this lane's row lands in a stage */
    int cur_t = -1, nd = 0;
    unsigned ok_rows = 0;
    const unsigned char *src_row = nullptr;
    unsigned char *land = nullptr;
    /* issue: the pending unit's rows (ascending rank) into stage s, then the next one's map */
    auto issue = [&](int s) {
        const int ut = pend_t;
        const uint32_t uj = pend_j;
        if (ut != cur_t) { /* a token's rows are found once for all its units */
            const int32_t slot = pend_slot;
            cur_t = ut;
            ok_rows = __ballot_sync(kAllLanes, slot >= 0);
            nd = __popc(ok_rows);
            src_row = slot >= 0 ? rows(slot) : nullptr;
            /* the d-th valid entry in rank order lands at row d of the stage */
            land = stages + (size_t)__popc(ok_rows & ((1u << lane) - 1)) * seg;
        }
        if (++j == S) j = 0, t++;
        pend = next_unit();
        if (pend && t != pend_t) pend_slot = lane < D ? __ldcg(send_map + (size_t)t * k + lane) : -1;
        pend_t = t, pend_j = j;
        const unsigned off = uj * seg;
        const unsigned len = (unsigned)(out_row - off < seg ? out_row - off : seg);
        if (lane == 0) units_at[w][s] = make_int4(ut, nd, (int)off, (int)len);
        if (src_row) {
            if (land == stages) mbar_expect(&bars[w][s], (unsigned)nd * len); /* row 0's lane */
            __syncwarp(ok_rows);
            bulk_load(land + (size_t)s * stage_bytes, src_row + off, len, &bars[w][s]);
        } else if (nd == 0 && lane == 0) {
            mbar_expect(&bars[w][s], 0); /* a token sent nowhere: zeros, nothing to load */
        }
    };
    unsigned phase = 0; /* bit s: the parity stage s waits for next */
    int n_in = 0;
    for (int s = 0; s < NS && pend; s++) {
        issue(s);
        n_in++;
    }
    __syncwarp(); /* lane 0's units_at before every lane reads them */
    for (int s = 0; n_in > 0; s = s + 1 == NS ? 0 : s + 1) {
        const int4 u = units_at[w][s];
        mbar_wait(&bars[w][s], (phase >> s) & 1u);
        phase ^= 1u << s;
        reduce_landed<DT>(stages + (size_t)s * stage_bytes, seg, u.y, (unsigned)u.w,
                          out + (size_t)u.x * out_row + (unsigned)u.z);
        __syncwarp(); /* every lane's reads of stage s and of units_at[w][s] before they are written again */
        if (!pend) n_in--;
        else issue(s);
    }
}

/* Token t's send map codes (rank x cap + slot, ascending rank, D <= 64, then -1): entry d
 * in lane d (lo) or d - 32 (hi). One warp. */
struct MapCodes {
    int32_t lo, hi;
};
__device__ __forceinline__ MapCodes map_codes(const int32_t *send_map, int k, int t, int D)
{
    const int lane = threadIdx.x % kWarpSize;
    const int32_t *map = send_map + (size_t)t * k;
    return {lane < D ? map[lane] : -1, lane + kWarpSize < D ? map[lane + kWarpSize] : -1};
}

/* The rows of codes m, at(code) the row of a code: row d in lane d (*row_lo) or d - 32
 * (*row_hi); *nd of them. One warp. */
template <typename At>
__device__ __forceinline__ void code_rows(const MapCodes &m, At at, int *nd, const unsigned char **row_lo,
                                          const unsigned char **row_hi)
{
    *nd = __popc(__ballot_sync(0xffffffffu, m.lo >= 0)) + __popc(__ballot_sync(0xffffffffu, m.hi >= 0));
    if (m.lo >= 0) *row_lo = at(m.lo);
    if (m.hi >= 0) *row_hi = at(m.hi);
}

/* The row of a send map code in the peers' combine buffers (this rank's slot there). */
struct PeerRow {
    const m2a_fast_t &f;
    int stride;
    size_t row;
    __device__ __forceinline__ const unsigned char *operator()(int32_t c) const
    {
        return f.peer[c / f.p.cap] + f.combine + ((size_t)f.p.me * stride + c % f.p.cap) * row;
    }
};

/* The reduce of up to kEvenUnitsPerWarp units of kSegEven bytes per warp (the launch
 * decides, even_units): the units split evenly over the warps, no counter. A unit costs
 * a round trip over NVLink, and the counter's grab cost another each (at 128 tokens that
 * was most of the reduce); 1 KB units kept too few bytes in flight. 16-byte rows and
 * output only. */
__host__ __device__ inline bool even_units(size_t out_row, int n, int blocks)
{
    return (unsigned long long)n * ((out_row + kSegEven - 1) / kSegEven) <=
           (unsigned long long)kEvenUnitsPerWarp * blocks * kWarps;
}

/* This warp's units [*u0, *u1) of the even reduce, and the send map codes of the
 * first one's token: loaded before the kernel waits for its peers (this rank's dispatch
 * wrote the map before the launch), so that after the wait the rows are the one round
 * trip before the sum. */
__device__ __forceinline__ MapCodes even_first(const int32_t *send_map, int k, int D, size_t out_row, int n,
                                               long long *u0, long long *u1)
{
    const uint32_t S = (uint32_t)((out_row + kSegEven - 1) / kSegEven);
    const long long units = (long long)n * S, gw = (long long)blockIdx.x * kWarps + (threadIdx.x / kWarpSize);
    *u0 = warp_share(units, gw), *u1 = warp_share(units, gw + 1);
    return *u0 < *u1 ? map_codes(send_map, k, (int)(*u0 / S), D) : MapCodes{-1, -1};
}

/* The even reduce of this warp's units [u0, u1) (even_first), first the codes of u0's
 * token, at(code) the row of a code: the combine's kEven way and copy-engine mode's sum. */
template <moea2a_datatype_t DT, typename At>
__device__ __forceinline__ void reduce_even(const int32_t *send_map, int k, int D, size_t out_row, long long u0,
                                            long long u1, MapCodes first, At at, unsigned char *out)
{
    const uint32_t S = (uint32_t)((out_row + kSegEven - 1) / kSegEven);
    int t_prev = -1, nd = 0;
    const unsigned char *row_lo = nullptr, *row_hi = nullptr;
    for (long long u = u0; u < u1; u++) {
        const int t = (int)(u / S);
        if (t != t_prev) {
            code_rows(t_prev < 0 ? first : map_codes(send_map, k, t, D), at, &nd, &row_lo, &row_hi);
            t_prev = t;
        }
        const size_t off = (size_t)(u % S) * kSegEven, len = out_row - off < kSegEven ? out_row - off : kSegEven;
        reduce_unit<DT, (int)(kSegEven / 16 / kWarpSize), 2>(row_lo, row_hi, nd, off, len, out + (size_t)t * out_row, true);
    }
}

/* The combine's ways to reduce (three for rows as they are; kFp8 for the FP8 wire's,
 * its units from the counter as kLoads takes them), each compiled into a kernel of its
 * own and chosen at launch: the code of one way, present in another's kernel even
 * unused, slowed that kernel's loads. On one H200 at 4096 tokens, 48 SMs: the even
 * reduce in the counter's kernel 139 -> 163 us; the bulk-copy way's barrier wait written as a C
 * loop 139.6 -> 159.5 us. */
enum CombineWay { kLoads, kEven, kTma, kFp8 };

} // namespace

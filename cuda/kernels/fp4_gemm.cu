/* The FP4 expert GEMM (fp4_gemm.h): bf16 activations times NVFP4 weights on tensor
 * cores that have no FP4 (sm_80, sm_90): the weights stay 4.5 bits each in memory and
 * become bf16 in registers, so at decode sizes, where the GEMM is bound by weight
 * bytes, it reads 3.6 x fewer bytes than a bf16 GEMM.
 *
 * Persistent kernels walk tiles of (expert, 64 to 256 weight rows, 16 or 64 token
 * rows: the variants of Cfg), the tile list built from the counts on the device; an
 * expert's rows past its count are not tiles, and in a tile's last rows only the 8-row
 * groups holding a row are loaded (and, on mma.sync, multiplied). Per 256-k stage,
 * cp.async copies the tile's codes, scales and activation rows into shared memory (one
 * to three stages in flight); each warp dequantizes its 16 or 32 weight rows into
 * m16n8k16 A fragments and multiplies them by every token group (the weights are the
 * MMA's M side: 8 tokens fill its N side, so a decode-size tile wastes nothing). On
 * Hopper the experts run on the warpgroup MMA (wgmma below), the same A fragments
 * against tokens read from shared memory: where TMA can describe the operands, in a
 * warp-specialized kernel whose copies are TMA's (gemm_kernel_ws), else those of more
 * than 8 rows, copied by the MMA warps.
 *
 * Exactness of the dequantization: an E2M1 code whose bits are spread into a bf16's
 * exponent and mantissa is the value x 2^-126 (code 1 a subnormal); multiplied by the
 * block's E4M3 scale x 2^118 (a table) it is e2m1 x SF x 2^-8, exact in bf16 (at most
 * 5 significant bits, far from bf16's range ends). The 2^8 and the expert's 1/g are
 * applied to the fp32 sums. On mma.sync, within a thread the k order differs from
 * memory order (a thread takes 32 consecutive k of a row), the same on both MMA
 * operands: the sum is over the same products. */
#ifdef HAVE_CONFIG_H
#include "config.h" /* MOEA2A_HAVE_SM90A */
#endif
#include <cuda.h> /* CUtensorMap (the encoder is reached through the runtime) */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp4_gemm.h"
#include "quant/fp4_math.h"
#include "mbarrier.cuh"

namespace {

using namespace m2a_mbar;

constexpr int BK = 128;      /* k per sub-stage (a stage holds KS of them) */
constexpr int W_SUB = BK / 2, S_SUB = BK / 16, A_SUB = 2 * BK; /* bytes per row per sub-stage */
constexpr int MAX_BN = 256, MAX_GROUPS = 8;

/* A variant: tiles of 64 MT x WGROUPS weight rows (MT m16 tiles per warp, or with
 * wgmma m64 tiles per warpgroup) by G groups of 8 token rows. The small one (MT = 1,
 * G = 2) takes the experts with at most 16 rows (decode): its tiles are many and its
 * registers few, so four blocks share an SM, each with two stages in flight, and the
 * tiles spread evenly over them; the large one (MT = 2, G = 8) the rest, each
 * dequantized weight feeding twice as many MMAs, one stage in flight. Each expert belongs to one of them by its count, read on the device. Their
 * shapes are what measured best on an H100 (bench/RESULTS.md, session 13). */
template <int G, int MT, int KSUB, bool WGMMA = false, int WGROUPS = 1> struct Cfg {
    static constexpr bool WG = WGMMA; /* Hopper's warpgroup MMA (see wgmma below) */
    /* four warps per warpgroup, each with MT m16 tiles of weight rows x the tile's tokens */
    static constexpr int THREADS = 128 * WGROUPS;
    /* a stage is KS sub-stages of 128 k: each weight row's bytes of a stage are read
     * together (KS = 2: a whole 128-byte line), which DRAM serves better */
    static constexpr int KS = KSUB, KSTAGE = BK * KS;
    static constexpr int W_ROW = W_SUB * KS, S_ROW = S_SUB * KS, A_ROW = A_SUB * KS;
    static constexpr int GROUPS = G, BT = 8 * G, A_BYTES = BT * A_ROW;
    static constexpr int M_TILES = MT, BN = 64 * MT * WGROUPS, W_BYTES = BN * W_ROW, S_BYTES = BN * S_ROW;
    /* buffers: STAGES - 1 in flight */
    static constexpr int STAGES = WGMMA ? (G <= 2 ? 4 : 3) : G <= 2 ? 3 : KS == 2 ? 2 : 4;
    static constexpr int STAGE_BYTES = W_BYTES + S_BYTES + A_BYTES, SMEM = STAGES * STAGE_BYTES;
    static constexpr int MIN_BLOCKS = WGMMA ? 1 : G <= 2 ? 4 : 2;
    /* mma.sync with few token groups: codes paired i with i + 4 (dequant<true>) and the
     * tokens regrouped to match once per stage (pair_tokens), rather than a byte
     * permute on every weight pair */
    static constexpr bool PAIRED = !WGMMA && G <= 2;
};
typedef Cfg<2, 1, 2> Small;
typedef Cfg<8, 2, 2> Large;
/* The large variant on Hopper's warpgroup MMA: each of four warpgroups issues
 * wgmma.m64n64k16 on its 64 weight rows times all 64 tokens (about twice the tensor
 * rate of mma.sync), the tokens read by the MMA from shared memory. The warpgroups
 * share the tokens of a 256-row tile (half the token bytes per weight of the mma.sync
 * tile); the block, one per SM, keeps two stages in flight, and its 16 warps (128
 * registers each) hide the dequantization's latencies. What measured best on an H100
 * (bench/RESULTS.md, session 16). */
typedef Cfg<8, 1, 2, true, 4> Hopper;
/* A small variant on wgmma (experts of 9-16 rows, gemm_kernel_sm90): the same 256-row tiles by
 * 16 tokens (wgmma.m64n16k16), four stages (three in flight, 96 KB of codes per SM). */
typedef Cfg<2, 1, 2, true, 4> HopperSmall;

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* cp.async of n bytes, zero-filled when !valid (src then is only a placeholder) */
template <int N> __device__ __forceinline__ void cp_async(void *dst, const void *src, bool valid)
{
    if (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                     "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N),
                     "r"(valid ? N : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The pair of byte j (0..3) of w, its two nibbles: select = j | 0x4440 (byte j, then
 * zeros). One multiply places copies of the byte at bits 6 and 18, so the low nibble's
 * magnitude lands at bits 6-8 and the high one's at 22-24, their signs at 9 and 25
 * (shifted to 15 and 31): six instructions per pair. */
__device__ __forceinline__ uint32_t dequant_byte(uint32_t w, uint32_t select, uint32_t scale2)
{
    const uint32_t y = __byte_perm(w, 0, select) * 0x40040u;
    uint32_t mag = y & 0x01c001c0u;
    __nv_bfloat162 v = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&mag), *reinterpret_cast<__nv_bfloat162 *>(&scale2));
    return *reinterpret_cast<uint32_t *>(&v) ^ ((y << 6) & 0x80008000u);
}

/* Two codes, alone at bits 0-3 and 16-19 (MUL = 0x1040) or 4-7 and 20-23 (MUL = 0x104),
 * times the scale pair: one multiply places each code's magnitude at bits 6-8 of its
 * half and its sign at bit 15 (the two copies do not overlap, so nothing carries); the
 * mask keeps those, a signed bf16 of the code's value x 2^-126, and the scale multiply
 * makes it e2m1 x SF x 2^-8 (exact, see the top). */
template <uint32_t MUL> __device__ __forceinline__ uint32_t e2m1_pair(uint32_t codes, uint32_t scale2)
{
    uint32_t v = (codes * MUL) & 0x81c081c0u;
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&v), *reinterpret_cast<__nv_bfloat162 *>(&scale2));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* A word of eight codes (k 0..7) -> four bf16 pairs, pair i the codes i and i + 4 (bits
 * 4i and 4i + 16): four instructions a pair and one shift a word. The pairing is not
 * memory order; the tokens are regrouped the same way (wg_pair_tokens). */
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t scale2, uint32_t (&d)[4])
{
    d[0] = e2m1_pair<0x1040u>(w & 0x000f000fu, scale2);
    d[1] = e2m1_pair<0x104u>(w & 0x00f000f0u, scale2);
    w >>= 8;
    d[2] = e2m1_pair<0x1040u>(w & 0x000f000fu, scale2);
    d[3] = e2m1_pair<0x104u>(w & 0x00f000f0u, scale2);
}

/* Four bytes of codes (eight weights k0..k0+7) -> four bf16 pairs, multiplied by the
 * block's scale pair. PAIRED = false: pair j is (k0 + 2j, k0 + 2j + 1), the two nibbles
 * of byte j (dequant_byte). PAIRED = true: pair j is (k0 + j, k0 + j + 4)
 * (dequant_word), paid for by regrouping the activations the same way (pair_tokens). */
template <bool PAIRED> __device__ __forceinline__ void dequant(uint32_t w, uint32_t scale2, uint32_t (&d)[4])
{
    if constexpr (PAIRED) {
        dequant_word(w, scale2, d);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) d[j] = dequant_byte(w, j | 0x4440, scale2);
    }
}

/* Eight activations k0..k0+7 as bf16 pairs (k0, k0+1) ... -> (k0, k0+4), (k0+1, k0+5),
 * (k0+2, k0+6), (k0+3, k0+7): the pairs of dequant<true>. */
__device__ __forceinline__ uint4 act_pairs(uint4 b)
{
    return make_uint4(__byte_perm(b.x, b.z, 0x5410), __byte_perm(b.x, b.z, 0x7632), __byte_perm(b.y, b.w, 0x5410),
                      __byte_perm(b.y, b.w, 0x7632));
}

/* Where a 16-byte unit u of token row i sits in its 256-byte stage row: spread so that
 * the eight threads of a load phase (two rows, units 4t + q) hit eight bank groups. */
__device__ __forceinline__ int swizzle(int u, int i) { return u ^ (((u >> 3) & 1) | ((i & 1) << 1)); }

struct Tile {
    int e, ntile, t0, cnt;
};

/* A thread group's tile (a group: the block, or on Hopper's merged kernel a warpgroup
 * running the small variant as a block of its own, gemm_kernel_sm90) */
struct Shared {
    int32_t nrow[MAX_BN];  /* weight row of each tile row, -1 past n (n < 2^31) */
    const uint16_t *arow[8 * MAX_GROUPS]; /* each token's A row, NULL past the count */
    int64_t crow[8 * MAX_GROUPS];         /* its C row */
};

/* A thread's index in its variant's group, and the group's barrier: the block's, or
 * (SUB: the group a warpgroup of a larger block) named barrier 1 + its index */
template <class C> __device__ __forceinline__ int gtid() { return (int)(threadIdx.x % C::THREADS); }
template <class C, bool SUB> __device__ __forceinline__ void group_sync()
{
    if constexpr (SUB)
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + (int)(threadIdx.x / C::THREADS)), "n"(C::THREADS) : "memory");
    else
        __syncthreads();
}

template <class C> __host__ __device__ __forceinline__ int ntiles_of(const m2a_kgemm_t &p)
{
    return p.swiglu ? (int)((p.n / 2 + C::BN / 2 - 1) / (C::BN / 2)) : (int)((p.n + C::BN - 1) / C::BN);
}

/* Expert e's rows (expert-major: clipped to A's rows; rank-major: its list) */
__device__ __forceinline__ void expert_rows(const m2a_kgemm_t &p, int e, int64_t *first, int *count)
{
    if (p.slots) {
        *first = p.list_offsets[e], *count = p.list_counts[e];
        return;
    }
    int64_t o = p.offsets[e], c = p.counts[e];
    if (o < 0 || o > p.rows || c < 0) c = 0;
    if (c > p.rows - o) c = (int)(p.rows - o);
    *first = o, *count = (int)c;
}

/* Weight row of tile row r: plain, or (SwiGLU) the gate rows j in the first half of
 * each warp's rows and the matching up rows j + n/2 in the second (MT = 2: its two m16
 * tiles; MT = 1: rows g and g + 8 of its one), so one thread holds both. */
template <class C> __device__ __forceinline__ int64_t weight_row(const m2a_kgemm_t &p, int ntile, int r)
{
    if (!p.swiglu) {
        int64_t n = (int64_t)ntile * C::BN + r;
        return n < p.n ? n : -1;
    }
    /* rows per warp (wgmma with two m64 tiles: per warpgroup, gate rows in the first),
     * and half of them */
    constexpr int WR = (C::WG && C::M_TILES > 1 ? 64 : 16) * C::M_TILES, HALF = WR / 2;
    int64_t j = (int64_t)ntile * (C::BN / 2) + (r / WR) * HALF + (r % HALF);
    return j < p.n / 2 ? j + ((r % WR) >= HALF ? p.n / 2 : 0) : -1;
}

/* What a thread copies each stage, set once per tile. With PPR = 4 KS 16-byte pieces
 * per code row: pieces tid % PPR of rows tid / PPR + (128 / PPR) i; scale words
 * tid % (2 KS) of rows tid / (2 KS) + (64 / KS) i (word w is the 128x4 layout's group
 * kstage / 64 + w); activation units tid % (16 KS) of rows tid / (16 KS) + (8 / KS) i.
 * Each thread's pieces are then 2048 (codes) or 512 (scales) bytes apart in the stage. */
template <class C> struct Loader {
    static constexpr int PPR = 4 * C::KS, W_N = C::BN * PPR / C::THREADS, S_N = C::BN * 2 * C::KS / C::THREADS;
    const uint8_t *w[W_N];
    const uint8_t *s[S_N];
    unsigned wvalid, svalid;
};

template <class C>
__device__ __forceinline__ void loader_init(const m2a_kgemm_t &p, const Shared &sh, const uint8_t *we,
                                            const uint8_t *sfe, Loader<C> &L)
{
    typedef Loader<C> LC;
    const int64_t kh = p.k / 2, nkt = (p.k / 16 + 3) / 4;
    L.wvalid = L.svalid = 0;
#pragma unroll
    for (int i = 0; i < LC::W_N; i++) {
        int64_t n = sh.nrow[gtid<C>() / LC::PPR + (C::THREADS / LC::PPR) * i];
        L.w[i] = n >= 0 ? we + n * kh + (gtid<C>() % LC::PPR) * 16 : p.w; /* invalid: copies nothing from p.w */
        L.wvalid |= (unsigned)(n >= 0) << i;
    }
#pragma unroll
    for (int i = 0; i < LC::S_N; i++) {
        int64_t n = sh.nrow[gtid<C>() / (2 * C::KS) + (C::THREADS / (2 * C::KS)) * i];
        L.s[i] = n >= 0 ? sfe + (n / 128) * nkt * 512 + (gtid<C>() % (2 * C::KS)) * 512 + (n % 32) * 16 +
                              ((n % 128) / 32) * 4
                        : p.sf;
        L.svalid |= (unsigned)(n >= 0) << i;
    }
}

/* mma.sync: the first of the 16-byte token units thread tid copies each stage, unit u =
 * tid % (16 KS) of rows tid / (16 KS) + (8 / KS) i, unit u of a row at sub-stage u / 16
 * (the rows of a thread alike in parity, so one swizzle serves them all) */
template <class C> __device__ __forceinline__ unsigned char *act_unit(unsigned char *st, int tid)
{
    constexpr int UPR = 16 * C::KS;
    const int u = tid % UPR, row0 = tid / UPR;
    return st + C::W_BYTES + C::S_BYTES + row0 * C::A_ROW + (u / 16) * A_SUB + swizzle(u % 16, row0) * 16;
}

/* Token `row`'s atom row of atom column a (k 64a..64a+63 of the stage), in the layout
 * wgmma_desc describes */
template <class C> __device__ __forceinline__ unsigned char *atom_row(unsigned char *sa, int row, int a)
{
    return sa + a * (C::BT * 128) + (row / 8) * 1024 + (row % 8) * 128;
}

template <bool W16, class C>
__device__ __forceinline__ void load_stage(const m2a_kgemm_t &p, const Shared &sh, const Loader<C> &L,
                                           unsigned char *st, int kbase, int groups)
{
    typedef Loader<C> LC;
    const int tid = gtid<C>(), k = (int)p.k;
    /* codes: piece tid % PPR holds k kbase + 32 (tid % PPR) .. + 31 */
    const int kk = kbase + 32 * (tid % LC::PPR);
    const bool lo = kk < k, hi = kk + 16 < k;
#pragma unroll
    for (int i = 0; i < LC::W_N; i++) {
        /* wgmma: the pieces of row r at piece ^ (r % 8), so that the eight rows a warp
         * reads at once lie in eight bank groups */
        const int row = tid / LC::PPR + (C::THREADS / LC::PPR) * i, piece = tid % LC::PPR;
        unsigned char *dst = st + row * C::W_ROW + ((C::WG ? piece ^ (row & 7) : piece) * 16);
        bool v = (L.wvalid >> i) & 1;
        if (W16) {
            cp_async<16>(dst, L.w[i] + kbase / 2, v && lo);
        } else { /* rows not 16-byte aligned (k % 32 == 16) */
            cp_async<8>(dst, L.w[i] + kbase / 2, v && lo);
            cp_async<8>(dst + 8, L.w[i] + kbase / 2 + 8, v && hi);
        }
    }
    /* scales: word tid % (2 KS) of the stage is 128x4 block group kbase / 64 + tid % (2 KS) */
    const bool sv = kbase / 64 + (tid % (2 * C::KS)) < (k / 16 + 3) / 4;
#pragma unroll
    for (int i = 0; i < LC::S_N; i++) {
        const int row = tid / (2 * C::KS) + (C::THREADS / (2 * C::KS)) * i;
        cp_async<4>(st + C::W_BYTES + row * C::S_ROW + (tid % (2 * C::KS)) * 4, L.s[i] + kbase * 8,
                    ((L.svalid >> i) & 1) && sv);
    }
    /* activations of the groups in use */
    constexpr int UPR = 16 * C::KS, RPI = C::THREADS / UPR; /* units per row, rows per pass */
    unsigned char *const sa = st + C::W_BYTES + C::S_BYTES;
    if (C::WG) {
        /* wgmma reads the tokens in 128-byte swizzled atoms (wgmma_desc): k 64a..64a+63
         * of token i are row i % 8 of atom (a, i / 8), their 16-byte unit c at c ^ (i % 8).
         * Pass i copies units c = tid % 8 of (row, a) = (v % BT, v / BT), v = tid / 8 +
         * THREADS / 8 i: whole 128-byte lines from global memory, a whole atom row per
         * eight threads into shared memory (eight bank groups). */
        static_assert(C::BT * 32 % C::THREADS == 0, "whole passes");
        __builtin_assume(tid >= 0 && tid < C::THREADS); /* v's row and column fold to shifts */
        const int c = tid % 8;
#pragma unroll
        for (int i = 0; i < C::BT * 32 / C::THREADS; i++) {
            const int v = tid / 8 + C::THREADS / 8 * i, row = v % C::BT, a = v / C::BT, ka = kbase + 64 * a + 8 * c;
            /* rows of the groups not in use zero-filled rather than skipped: no branch */
            const uint16_t *ar = row < groups * 8 ? sh.arow[row] : nullptr;
            cp_async<16>(atom_row<C>(sa, row, a) + ((c ^ (row % 8)) * 16),
                         ar ? ar + ka : p.a, ar && ka < k);
        }
        return;
    }
    const int row0 = tid / UPR, ka = kbase + 8 * (tid % UPR);
    unsigned char *adst = act_unit<C>(st, tid);
#pragma unroll
    for (int i = 0; i < C::GROUPS * 8 / RPI; i++) {
        if (i * RPI < groups * 8) {
            const uint16_t *ar = sh.arow[row0 + RPI * i];
            cp_async<16>(adst + i * RPI * C::A_ROW, ar ? ar + ka : p.a, ar && ka < k);
        }
    }
}

/* mma.sync, PAIRED: a stage's tokens into dequant<true>'s pairs, in place, each thread
 * the 16-byte units it copied itself (load_stage), so that cp.async.wait_group is all
 * it waits for (the caller's barrier then publishes them). Once per stage and unit,
 * rather than once per warp reading it. */
template <class C> __device__ __forceinline__ void pair_tokens(unsigned char *st, int groups)
{
    constexpr int RPI = C::THREADS / (16 * C::KS);
    unsigned char *a = act_unit<C>(st, gtid<C>());
#pragma unroll
    for (int i = 0; i < C::GROUPS * 8 / RPI; i++) {
        if (i * RPI < groups * 8) {
            uint4 *x = reinterpret_cast<uint4 *>(a + i * RPI * C::A_ROW);
            *x = act_pairs(*x);
        }
    }
}

/* One stage: thread (g, t) of a warp takes bytes 16t..16t+15 of its rows g and g + 8
 * (k 32t..32t+31), sub-step q their word q, which is MMA steps 2q and 2q + 1; the token
 * operand takes the same k of token g (16 bytes of unit 4t + q). */
template <class C>
__device__ __forceinline__ void compute_stage(const uint32_t *lut, const unsigned char *st, int groups,
                                              float (&acc)[C::M_TILES][C::GROUPS][4])
{
    constexpr int MT = C::M_TILES, G = C::GROUPS;
    constexpr bool PAIRED = C::PAIRED;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = gtid<C>() >> 5;
#pragma unroll 1 /* one sub-stage's registers at a time */
    for (int sub = 0; sub < C::KS; sub++) {
    const unsigned char *sw = st + sub * W_SUB, *ss = st + C::W_BYTES + sub * S_SUB,
                        *sa = st + C::W_BYTES + C::S_BYTES + sub * A_SUB;
    /* the scales of this thread's blocks 2t and 2t + 1 of rows g and g + 8, per m16 tile */
    uint32_t sc[MT][2][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned two =
                *reinterpret_cast<const uint16_t *>(ss + (warp * 16 * MT + mt * 16 + g + 8 * h) * C::S_ROW + 2 * t);
            sc[mt][h][0] = lut[two & 0xff], sc[mt][h][1] = lut[two >> 8];
        }
    /* this thread's 16 bytes of codes of rows g and g + 8, per m16 tile */
    uint4 wq[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wq[mt][h] =
                *reinterpret_cast<const uint4 *>(sw + (warp * 16 * MT + mt * 16 + g + 8 * h) * C::W_ROW + t * 16);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t af[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t d0[4], d1[4];
            const uint32_t w0 = q == 0 ? wq[mt][0].x : q == 1 ? wq[mt][0].y : q == 2 ? wq[mt][0].z : wq[mt][0].w;
            const uint32_t w1 = q == 0 ? wq[mt][1].x : q == 1 ? wq[mt][1].y : q == 2 ? wq[mt][1].z : wq[mt][1].w;
            dequant<PAIRED>(w0, sc[mt][0][q >> 1], d0);
            dequant<PAIRED>(w1, sc[mt][1][q >> 1], d1);
            af[mt][0][0] = d0[0], af[mt][0][1] = d1[0], af[mt][0][2] = d0[1], af[mt][0][3] = d1[1];
            af[mt][1][0] = d0[2], af[mt][1][1] = d1[2], af[mt][1][2] = d0[3], af[mt][1][3] = d1[3];
        }
#pragma unroll
        for (int grp = 0; grp < G; grp++) {
            if (grp < groups) {
                int i = grp * 8 + g;
                uint4 b = *reinterpret_cast<const uint4 *>(sa + i * C::A_ROW + swizzle(4 * t + q, i) * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma(acc[mt][grp], af[mt][0], b.x, b.y);
                    mma(acc[mt][grp], af[mt][1], b.z, b.w);
                }
            }
        }
    }
    }
}

/* Hopper's warpgroup MMA (sm_90a only; the other archs' builds of the Hopper variant
 * trap, and the launcher never picks it there). The weights are the A operand, from
 * registers: a warp's fragment of an m64 tile is an mma.m16n8k16 A fragment of its 16
 * rows (warp 16w..16w+15), thread (g, t) holding slots 2t, 2t + 1 and 2t + 8, 2t + 9 of
 * rows g and g + 8. Which k a slot is, is ours to choose as long as the tokens follow:
 * thread t takes word t of each 16-byte piece (32 k, two steps) of its rows, whose
 * eight codes dequant_word turns into four pairs in four instructions each (memory
 * order would cost six: wg_dequant), and the tokens are regrouped to match in shared
 * memory (wg_pair_tokens). The tokens are B, read from shared memory through a
 * descriptor (wgmma_desc). Results as mma.sync's: d[4j..4j+3] are tokens 8j + 2t, + 1
 * of rows g and g + 8. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define M2A_WGMMA 1
#endif

/* K-major, 128-byte swizzle: atoms of 8 tokens x 64 k (1024 bytes, 1024-aligned),
 * 8-token groups 1024 bytes apart (stride byte offset); step s of a 64-k atom column
 * starts 32 s bytes into it, the hardware applying the swizzle to the address. */
__device__ __forceinline__ uint64_t wgmma_desc(unsigned saddr)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence()
{
#ifdef M2A_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n");
#endif
}
__device__ __forceinline__ void wgmma_commit()
{
#ifdef M2A_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
#ifdef M2A_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N));
#endif
}
/* keeps the compiler from touching a register the asynchronous MMA owns */
template <int J> __device__ __forceinline__ void wgmma_hold(float (&d)[J][4])
{
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+f"(d[j][i])::"memory");
}

/* d += a (64 weight rows x 16 k, registers) . b (16 k x N tokens, shared memory), for
 * N = 64 and 16; other archs' builds trap (the launcher never runs them there) */
#ifdef M2A_WGMMA
__device__ __forceinline__ void wgmma_tile(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                   "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                   "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
__device__ __forceinline__ void wgmma_tile(float (&d)[2][4], const uint32_t (&a)[4], uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                   "+f"(d[1][2]), "+f"(d[1][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(1));
}
#else
template <int J> __device__ __forceinline__ void wgmma_tile(float (&)[J][4], const uint32_t (&)[4], uint64_t)
{
    __trap();
}
#endif

/* A thread's codes and scales of one 16-byte piece (32 k, two MMA steps): per m64 tile
 * word t of its rows g and g + 8 (k 8t..8t+7; the pieces stored at piece ^ (row % 8) =
 * piece ^ g) and those rows' scales of that word's block. */
template <class C> struct WgPiece {
    uint32_t w[C::M_TILES][2];
    uint32_t sc[C::M_TILES][2];
};

template <class C>
__device__ __forceinline__ void wg_load(const uint32_t *lut, const unsigned char *st, int piece, WgPiece<C> &P)
{
    /* warpgroup wg's rows are 64 MT wg .. + 64 MT - 1; warp w of it, 16 w + 16 rows per m64 */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = (threadIdx.x >> 5) & 3,
              wg = threadIdx.x >> 7;
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = (wg * C::M_TILES + mt) * 64 + warp * 16 + g + 8 * h;
            P.w[mt][h] = *reinterpret_cast<const uint32_t *>(st + r * C::W_ROW + ((piece ^ g) * 16) + 4 * t);
            P.sc[mt][h] = lut[st[C::W_BYTES + r * C::S_ROW + 2 * piece + (t >> 1)]];
        }
}

/* A piece's A registers: [step][m tile][4]. Thread t's word holds k 8t..8t+7 of the
 * piece; step e takes its pairs 2e (slots 2t, 2t + 1: k 8t + 2e, + 4) and 2e + 1 (slots
 * 2t + 8, 2t + 9: k 8t + 2e + 1, + 5). So step e's slot s is k 8 ((s % 8) / 2) + 2e +
 * s / 8 + 4 (s % 2) of the piece, the order wg_pair_tokens gives the tokens. */
template <class C>
__device__ __forceinline__ void wg_dequant(const WgPiece<C> &P, uint32_t (&af)[2][C::M_TILES][4])
{
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; mt++) {
        uint32_t d0[4], d1[4];
        dequant_word(P.w[mt][0], P.sc[mt][0], d0);
        dequant_word(P.w[mt][1], P.sc[mt][1], d1);
        af[0][mt][0] = d0[0], af[0][mt][1] = d1[0], af[0][mt][2] = d0[1], af[0][mt][3] = d1[1];
        af[1][mt][0] = d0[2], af[1][mt][1] = d1[2], af[1][mt][2] = d0[3], af[1][mt][3] = d1[3];
    }
}

/* Half h (k 32h..32h+31) of an atom row of token `row` into wg_dequant's k order */
__device__ __forceinline__ void pair_atom_half(unsigned char *at, int row, int h)
{
    uint4 *atom = reinterpret_cast<uint4 *>(at);
    uint4 in[4];
#pragma unroll
    for (int u = 0; u < 4; u++) in[u] = atom[(4 * h + u) ^ (row % 8)];
#pragma unroll
    for (int e = 0; e < 2; e++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const uint32_t sel = half ? 0x7632 : 0x5410;
            uint32_t o[4];
#pragma unroll
            for (int m = 0; m < 4; m++) o[m] = __byte_perm(e ? in[m].y : in[m].x, e ? in[m].w : in[m].z, sel);
            atom[(4 * h + 2 * e + half) ^ (row % 8)] = make_uint4(o[0], o[1], o[2], o[3]);
        }
}

/* Orders this thread's generic-proxy stores to shared memory before the async proxy's
 * reads (wgmma's operands), once a barrier has published them */
__device__ __forceinline__ void proxy_fence()
{
#ifdef M2A_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* The tokens of a stage into wg_dequant's k order, in place: a piece's 64 bytes of a
 * token (four 16-byte units, k 8u..8u+7 each) become step 0's 16 slots then step 1's,
 * word j of step e the pair (k 8 (j % 4) + 2e + j / 4, + 4): unit j % 4's word e and
 * word e + 2, both their halves j / 4. The pieces a warp regroups are the ones its own
 * copies wrote (load_stage: a warp copies 4 tokens x 128 bytes a pass), so after
 * cp.async.wait_group a __syncwarp is all it needs; lane l takes pass l / 8, token
 * l % 4 and piece half (l / 4) % 2, so that eight lanes at a time touch eight bank
 * groups. The stores are the generic proxy's, the MMA reads the async proxy's: the
 * fence orders them (the caller's barrier then publishes them to the block). */
template <class C> __device__ __forceinline__ void wg_pair_tokens(unsigned char *sa)
{
    constexpr int PASSES = C::BT * 32 / C::THREADS;
    const int tid = threadIdx.x, lane = tid & 31;
    __syncwarp();
    if (lane < 8 * PASSES) {
        const int j = lane & 3, h = (lane >> 2) & 1, v = 4 * (tid >> 5) + j + C::THREADS / 8 * (lane >> 3);
        pair_atom_half(atom_row<C>(sa, v % C::BT, v / C::BT), v % C::BT, h);
    }
    proxy_fence();
}

/* A piece's MMAs (two k16 steps x the m64 tiles; b0: the stage's token descriptor) as
 * one group, then the wait that leaves only this group in flight: the A registers
 * alternate between two sets, and a set is rewritten only after the group that read it
 * has retired, so that a piece's dequantization runs while the previous piece's MMAs
 * do. */
template <class C>
__device__ __forceinline__ void wg_mma_piece(float (&acc)[C::M_TILES][C::GROUPS][4],
                                             const uint32_t (&af)[2][C::M_TILES][4], uint64_t b0, int piece)
{
    wgmma_fence();
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int step = 2 * piece + e;
        const uint64_t b = b0 + (((step / 4) * (C::BT * 128) + (step % 4) * 32) >> 4);
#pragma unroll
        for (int mt = 0; mt < C::M_TILES; mt++) wgmma_tile(acc[mt], af[e][mt], b);
    }
    wgmma_commit();
    wgmma_wait<1>();
}

/* The descriptor of a stage's tokens; a step's adds its offset / 16 to the address field */
template <class C> __device__ __forceinline__ uint64_t stage_desc(const unsigned char *st)
{
    static_assert((C::GROUPS == 8 || C::GROUPS == 2) && C::KS == 2, "wgmma tiles are m64n64 or m64n16, stages 256 k");
    static_assert((C::W_BYTES + C::S_BYTES) % 1024 == 0 && C::STAGE_BYTES % 1024 == 0, "atoms 1024-aligned");
    return wgmma_desc(smem_addr(st + C::W_BYTES + C::S_BYTES));
}

/* One stage on wgmma (block-synchronous pipeline), a piece at a time: its A registers
 * dequantized, the next piece's codes and scales read, then its MMAs. The stage ends
 * with every MMA retired, as the next stage's copies overwrite this one's tokens. */
template <class C>
__device__ __forceinline__ void compute_stage_wg(const uint32_t *lut, const unsigned char *st,
                                                 float (&acc)[C::M_TILES][C::GROUPS][4])
{
    constexpr int PIECES = 4 * C::KS;
    const uint64_t b0 = stage_desc<C>(st);
    WgPiece<C> P;
    wg_load<C>(lut, st, 0, P);
#pragma unroll /* every offset an immediate */
    for (int piece = 0; piece < PIECES; piece++) {
        uint32_t af[2][C::M_TILES][4];
        wg_dequant<C>(P, af);
        if (piece + 1 < PIECES) wg_load<C>(lut, st, piece + 1, P);
        wg_mma_piece<C>(acc, af, b0, piece);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < C::M_TILES; mt++) wgmma_hold(acc[mt]);
}

/* SwiGLU of a gate and an up value (both epilogues: one formula, the same bits) */
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

__device__ __forceinline__ void store(const m2a_kgemm_t &p, int64_t crow, int64_t col, float v)
{
    size_t at = (size_t)crow * (size_t)p.ldc + (size_t)col;
    if (p.out_fp32) static_cast<float *>(p.c)[at] = v;
    else static_cast<__nv_bfloat16 *>(p.c)[at] = __float2bfloat16_rn(v);
}

template <class C>
__device__ __forceinline__ void epilogue(const m2a_kgemm_t &p, const Shared &sh, const Tile &T, int groups,
                                         float scale, float (&acc)[C::M_TILES][C::GROUPS][4])
{
    constexpr int MT = C::M_TILES;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = gtid<C>() >> 5;
#pragma unroll
    for (int grp = 0; grp < C::GROUPS; grp++) {
        if (grp >= groups) continue;
#pragma unroll
        for (int d = 0; d < 4; d++) {
            int i = grp * 8 + 2 * t + (d & 1);
            if (i >= T.cnt) continue;
            int64_t crow = sh.crow[i];
            /* the row of m tile 0; tile mt's is RS rows further (wgmma: m64 tiles, each
             * warpgroup 64 MT rows) */
            constexpr int RS = C::WG ? 64 : 16;
            int r = (C::WG ? (warp >> 2) * 64 * MT + (warp & 3) * 16 : warp * 16 * MT) + g + (d >> 1) * 8;
            if (p.swiglu) { /* MT = 2: gate in the first m tile, up in the second; MT = 1: rows g, g + 8 */
                if (MT == 1 && d >= 2) continue;
                int64_t j = sh.nrow[r];
                if (j < 0) continue;
                float gate = acc[0][grp][d] * scale, up = (MT == 2 ? acc[MT - 1][grp][d] : acc[0][grp][d + 2]) * scale;
                store(p, crow, j, silu_times(gate, up));
            } else {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    int64_t n = sh.nrow[r + mt * RS];
                    if (n >= 0) store(p, crow, n, acc[mt][grp][d] * scale);
                }
            }
        }
    }
}

/* The scale table: E4M3 byte -> bf16 pair of scale x 2^118 (all threads of the block) */
__device__ __forceinline__ void fill_lut(uint32_t *lut)
{
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        float s = m2a_e4m3_to_f32((uint8_t)i) * 0x1p118f;
        __nv_bfloat16 b = __float2bfloat16_rn(s);
        uint32_t h = *reinterpret_cast<uint16_t *>(&b);
        lut[i] = h | (h << 16);
    }
}

/* A variant's tile list, by one warp: prefix[e] = the tiles of the experts before e,
 * [num_experts + 1], expert e's being ceil(count / BT) token tiles x the weight tiles
 * when lo < count <= hi (the variant's experts), else none */
template <class C> __device__ __forceinline__ void tile_prefix(const m2a_kgemm_t &p, int lo, int hi, int32_t *prefix)
{
    const int lane = threadIdx.x & 31, E = p.num_experts, ntiles = ntiles_of<C>(p);
    int carry = 0;
    if (lane == 0) prefix[0] = 0;
    for (int base = 0; base < E; base += 32) {
        int e = base + lane, v = 0;
        if (e < E) {
            int64_t first;
            int cnt;
            expert_rows(p, e, &first, &cnt);
            v = cnt > lo && cnt <= hi ? (cnt + C::BT - 1) / C::BT * ntiles : 0;
        }
        for (int o = 1; o < 32; o <<= 1) {
            int n = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += n;
        }
        if (e < E) prefix[e + 1] = carry + v;
        carry += __shfl_sync(0xffffffffu, v, 31);
    }
}

/* Tile `tile` of a variant's list (prefix: tile_prefix) and the first row of its expert */
template <class C> __device__ __forceinline__ Tile tile_at(const m2a_kgemm_t &p, const int32_t *prefix, int tile,
                                                         int64_t *first)
{
    Tile T;
    int lo = 0, hi = p.num_experts - 1; /* the expert whose tiles hold this one */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= tile) lo = mid;
        else hi = mid - 1;
    }
    T.e = lo;
    int cnt;
    expert_rows(p, T.e, first, &cnt);
    int local = tile - prefix[T.e], ttiles = (cnt + C::BT - 1) / C::BT;
    T.ntile = local / ttiles; /* token tiles of one weight tile run side by side: L2 reuse */
    T.t0 = (local % ttiles) * C::BT;
    T.cnt = min(C::BT, cnt - T.t0);
    return T;
}

/* A tile's rows into sh, by the variant's group: each weight row's index, each token's
 * A row and C row */
template <class C>
__device__ __forceinline__ void tile_rows(const m2a_kgemm_t &p, const Tile &T, int64_t first, Shared &sh)
{
    for (int r = gtid<C>(); r < C::BN; r += C::THREADS) sh.nrow[r] = (int32_t)weight_row<C>(p, T.ntile, r);
    for (int i = gtid<C>(); i < C::BT; i += C::THREADS) {
        int64_t ar = -1, cr = -1;
        if (i < T.cnt) {
            int64_t at = first + T.t0 + i;
            if (p.slots) {
                int32_t pair = p.list[at];
                ar = pair / p.slots, cr = pair;
            } else {
                ar = cr = at;
            }
        }
        sh.arow[i] = ar >= 0 ? p.a + ar * p.lda : nullptr;
        sh.crow[i] = cr;
    }
}

template <class C> __device__ __forceinline__ void zero_acc(float (&acc)[C::M_TILES][C::GROUPS][4])
{
#pragma unroll
    for (int a = 0; a < C::M_TILES; a++)
#pragma unroll
        for (int b = 0; b < C::GROUPS; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.0f;
}

template <class C> __device__ __forceinline__ int ktiles_of(const m2a_kgemm_t &p)
{
    return (int)((p.k + C::KSTAGE - 1) / C::KSTAGE);
}

/* A group's tiles of a variant: tiles first, first + stride, ... of its list, each
 * through the stages at `stages`. Ends with the group's copies retired. */
template <bool W16, class C, bool SUB = false>
__device__ __forceinline__ void run_tiles(const m2a_kgemm_t &p, const int32_t *prefix, int first_tile, int stride,
                                          unsigned char *stages, Shared &sh, const uint32_t *lut)
{
    constexpr int G = C::GROUPS, MT = C::M_TILES;
    const int total = prefix[p.num_experts], ktiles = ktiles_of<C>(p);
    for (int tile = first_tile; tile < total; tile += stride) {
        int64_t first;
        const Tile T = tile_at<C>(p, prefix, tile, &first);
        group_sync<C, SUB>(); /* the previous tile's epilogue is done with sh and the stages */
        tile_rows<C>(p, T, first, sh);
        group_sync<C, SUB>();
        const int groups = (T.cnt + 7) / 8;
        Loader<C> L;
        loader_init<C>(p, sh, p.w + (size_t)T.e * (size_t)p.n * (size_t)(p.k / 2), p.sf + (size_t)T.e * p.sf_stride, L);
#pragma unroll
        for (int s = 0; s < C::STAGES - 1; s++) {
            if (s < ktiles) load_stage<W16, C>(p, sh, L, stages + s * C::STAGE_BYTES, s * C::KSTAGE, groups);
            cp_commit();
        }
        float acc[MT][G][4];
        zero_acc<C>(acc);
        /* the stage read now and the one written now, rotating */
        int rd = 0, wr = C::STAGES - 1;
        for (int kt = 0; kt < ktiles; kt++) {
            cp_wait<C::STAGES - 2>();
            if constexpr (C::WG) wg_pair_tokens<C>(stages + rd * C::STAGE_BYTES + C::W_BYTES + C::S_BYTES);
            if constexpr (C::PAIRED) pair_tokens<C>(stages + rd * C::STAGE_BYTES, groups);
            group_sync<C, SUB>();
            if (kt + C::STAGES - 1 < ktiles)
                load_stage<W16, C>(p, sh, L, stages + wr * C::STAGE_BYTES, (kt + C::STAGES - 1) * C::KSTAGE, groups);
            cp_commit();
            if constexpr (C::WG) compute_stage_wg<C>(lut, stages + rd * C::STAGE_BYTES, acc);
            else compute_stage<C>(lut, stages + rd * C::STAGE_BYTES, groups, acc);
            rd = rd + 1 == C::STAGES ? 0 : rd + 1;
            wr = wr + 1 == C::STAGES ? 0 : wr + 1;
        }
        epilogue<C>(p, sh, T, groups, 256.0f / p.g[T.e], acc);
    }
    cp_wait<0>();
}

/* One variant, its experts those with lo < count <= hi; a persistent grid of blocks
 * of its group size. */
template <bool W16, class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) gemm_kernel(const m2a_kgemm_t p, int lo, int hi)
{
    extern __shared__ __align__(1024) unsigned char stages[]; /* wgmma's swizzled atoms: 1024-aligned */
    __shared__ Shared sh;
    __shared__ uint32_t lut[256];
    int32_t *prefix = reinterpret_cast<int32_t *>(stages + C::SMEM); /* after the stages */
    fill_lut(lut);
    if (threadIdx.x < 32) tile_prefix<C>(p, lo, hi, prefix);
    __syncthreads();
    run_tiles<W16, C>(p, prefix, blockIdx.x, gridDim.x, stages, sh, lut);
}

/* Hopper's wgmma tiles, warp-specialized (gemm_kernel_ws, where ws_maps can describe the
 * operands: expert-major rows, 16-byte aligned). One thread copies each stage with TMA:
 * two boxes of 128 weight rows, their two 2 KB boxes of scales, the tokens' four 64-k
 * atoms (swizzled by the copy as wgmma_desc reads them), in eight instructions that
 * count their bytes on a barrier. Three warps regroup each stage's tokens (wg_dequant's
 * pairs) once it has landed, and the four consumer warpgroups only dequantize and
 * multiply. Stages pass through a ring of shared-memory barriers (landed, full, empty),
 * so no warp waits for a copy it issued, the warpgroups run as far ahead as the ring
 * allows, and the next tile's stages stream in while this one's results are written
 * (bf16 ones through each warpgroup's own rows of the tile's last stage: ws_epilogue).
 * With cp.async copies issued by three warps instead, the copies alone took longer than
 * the whole block-synchronous kernel (bench/RESULTS.md, session 18, run 5). */
constexpr int WS_CONSUMERS = Hopper::THREADS;
constexpr int WS_PRODUCERS = 128, WS_REGROUPERS = WS_PRODUCERS - 32; /* warp 0 copies, 1-3 regroup */
template <class C> constexpr bool ws_boxes()
{
    return C::BN == 256 && C::KS == 2 && C::W_BYTES == 2 * 128 * 128 && C::S_BYTES == 2 * 2048 &&
           C::A_BYTES == 4 * C::BT * 128 && C::THREADS == WS_CONSUMERS;
}
static_assert(ws_boxes<Hopper>() && ws_boxes<HopperSmall>(), "a stage is the TMA boxes of ws_copy");

/* The operands as TMA sees them (ws_maps): codes [experts][n][k/2] bytes (boxes of 128 k/2
 * x 128 rows, 128-byte swizzle), scales [experts][n/128][k/64][128 words] (boxes of 4 x
 * 128 words), tokens [rows][k] bf16 (boxes of 64 k x 64 rows, or x 16 rows for the
 * m64n16 tiles; 128-byte swizzle) */
struct WsMaps {
    CUtensorMap w, sf, a64, a16;
};

/* a stage's tokens are four 64-k atoms, regrouped and published one at a time */
constexpr int WS_ATOMS = 4;
template <int S> struct Ring {
    uint64_t landed[S];          /* a stage's bytes have landed */
    uint64_t full[S][WS_ATOMS];  /* ... and its atom a of tokens is regrouped: the MMAs may read it */
    uint64_t empty[S];           /* its last MMA has retired: it may be overwritten */
};

/* Where a role is in the ring: the slot, and the parity of the slot's current use */
template <int S> struct RingPos {
    unsigned slot = 0, parity = 0;
    __device__ __forceinline__ void next()
    {
        if (++slot == S) slot = 0, parity ^= 1;
    }
};

/* A TMA box at coordinates c (innermost first) into dst, its bytes counted on bar */
template <int D>
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, const int (&c)[D], uint64_t *bar)
{
#ifdef M2A_WGMMA
    const uint64_t m = reinterpret_cast<uint64_t>(map);
    if constexpr (D == 2)
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                     "%3}], [%4];\n" ::"r"(smem_addr(dst)),
                     "l"(m), "r"(c[0]), "r"(c[1]), "r"(smem_addr(bar))
                     : "memory");
    else if constexpr (D == 3)
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                     "%3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
                     "l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(smem_addr(bar))
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                     "%3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
                     "l"(m), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(smem_addr(bar))
                     : "memory");
#endif
}

template <int S> __device__ __forceinline__ void ring_init(Ring<S> &r)
{
    for (int s = 0; s < S; s++) {
        mbar_init(&r.landed[s], 1); /* the copying thread's expect */
        for (int a = 0; a < WS_ATOMS; a++) mbar_init(&r.full[s][a], WS_REGROUPERS);
        mbar_init(&r.empty[s], WS_CONSUMERS); /* every consumer thread */
    }
}

/* The copying thread: each stage once its slot is free. A tile's weight rows: 256 from
 * 256 ntile, or (SwiGLU) gate rows 128 ntile.. and up rows n/2 + 128 ntile.. (ws_maps
 * asks n/2 % 128 == 0, so each box is one 128-row group of scales). Rows and k past the
 * operands' ends are zero-filled by the copy. */
template <class C>
__device__ __forceinline__ void ws_copy(const m2a_kgemm_t &p, const WsMaps &maps, const int32_t *prefix,
                                        unsigned char *stages, Ring<C::STAGES> &ring)
{
    const CUtensorMap *amap = C::BT == 64 ? &maps.a64 : &maps.a16;
    const int total = prefix[p.num_experts], ktiles = ktiles_of<C>(p);
    RingPos<C::STAGES> at;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int64_t first;
        const Tile T = tile_at<C>(p, prefix, tile, &first);
        const int r0 = p.swiglu ? 128 * T.ntile : 256 * T.ntile, r1 = p.swiglu ? (int)(p.n / 2) + r0 : r0 + 128;
        const int a0 = (int)(first + T.t0);
        for (int kt = 0; kt < ktiles; kt++, at.next()) {
            unsigned char *st = stages + at.slot * C::STAGE_BYTES, *sa = st + C::W_BYTES + C::S_BYTES;
            uint64_t *bar = &ring.landed[at.slot];
            const int kb = kt * C::KSTAGE;
            mbar_wait(&ring.empty[at.slot], at.parity ^ 1);
            mbar_expect(bar, C::STAGE_BYTES);
            tma_load<3>(st, &maps.w, {kb / 2, r0, T.e}, bar);
            tma_load<3>(st + C::W_BYTES / 2, &maps.w, {kb / 2, r1, T.e}, bar);
            tma_load<4>(st + C::W_BYTES, &maps.sf, {0, kb / 64, r0 / 128, T.e}, bar);
            tma_load<4>(st + C::W_BYTES + C::S_BYTES / 2, &maps.sf, {0, kb / 64, r1 / 128, T.e}, bar);
#pragma unroll
            for (int a = 0; a < WS_ATOMS; a++) tma_load<2>(sa + a * (C::BT * 128), amap, {kb + 64 * a, a0}, bar);
        }
    }
}

/* The regrouping warps: each stage's tokens once they have landed, an atom at a time,
 * each atom published to the consumers once regrouped, so that a stage's first MMAs wait
 * for a quarter of the regrouping rather than all of it (with the consumers' offsets set
 * once: 270.2 -> 266.5 us at 64 rows, 4096 x 7168, the down projection unchanged;
 * bench/RESULTS.md, session 19, run 3). The items (half atom rows) are dealt in atom
 * order, so a thread arrives on atom a's barrier once it has passed a's last item. */
template <class C>
__device__ __forceinline__ void ws_regroup(const m2a_kgemm_t &p, const int32_t *prefix, unsigned char *stages,
                                           Ring<C::STAGES> &ring)
{
    constexpr int ITEMS = 2 * C::BT; /* per atom */
    const int total = prefix[p.num_experts], first = (int)blockIdx.x, stride = (int)gridDim.x;
    const int tid = (int)threadIdx.x % WS_PRODUCERS - 32;
    const unsigned all = first < total ? (unsigned)((total - first + stride - 1) / stride * ktiles_of<C>(p)) : 0;
    RingPos<C::STAGES> at;
    for (unsigned q = 0; q < all; q++, at.next()) {
        mbar_wait(&ring.landed[at.slot], at.parity);
        unsigned char *const sa = stages + at.slot * C::STAGE_BYTES + C::W_BYTES + C::S_BYTES;
        int i = tid;
#pragma unroll
        for (int a = 0; a < WS_ATOMS; a++) {
            for (; i < (a + 1) * ITEMS; i += WS_REGROUPERS) {
                const int row = (i - a * ITEMS) >> 1;
                pair_atom_half(atom_row<C>(sa, row, a), row, i & 1);
            }
            proxy_fence();
            mbar_arrive(&ring.full[at.slot][a]);
        }
    }
}

/* Where a consumer thread's codes and scales lie in any stage of the TMA boxes (two boxes
 * of 128 weight rows, SwiGLU's gate rows in the first and up rows in the second; their
 * scales as the 128x4 layout has them, 2 KB a box), set once (ws_offsets) so that a
 * stage's loop only adds the slot's base: row g's code word of piece 0 with g in the
 * swizzle bits (piece p's at code ^ (p << 4): the box's 128-byte swizzle puts 16-byte
 * piece p of row r at p ^ (r % 8), and r % 8 = g), its scale byte of piece 0 (piece p's
 * 512 (p / 2) + 2 (p % 2) further), and how much further row g + 8's are. */
struct WsOffsets {
    uint32_t code, scale, dcode, dscale;
};

/* byte of smem row R's scale of 16-k block kb of the stage, in a TMA box (128x4 layout:
 * 512 bytes per 64 k, row R % 32 at 16 (R % 32), R % 128 / 32 its word, kb % 4 its byte) */
__device__ __forceinline__ int ws_scale(int R, int kb)
{
    return (R >> 7) * 2048 + (kb >> 2) * 512 + (R & 31) * 16 + ((R & 127) >> 5) * 4 + (kb & 3);
}

template <class C> __device__ __forceinline__ WsOffsets ws_offsets(bool swiglu)
{
    static_assert(C::M_TILES == 1 && C::W_ROW == 128, "one m64 tile per warpgroup, 128-byte rows");
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, warp = (threadIdx.x >> 5) & 3,
              wg = threadIdx.x >> 7;
    /* fragment rows r and r + 8 (weight_row's order) in the boxes: SwiGLU's gate row j
     * and up row j + n/2 are 8 rows apart in each 16 there, 128 apart here */
    const int r = wg * 64 + warp * 16 + g, R = swiglu ? (r >> 4) * 8 + g : r, D = swiglu ? 128 : 8;
    WsOffsets o;
    o.code = (uint32_t)(R * C::W_ROW + (g << 4) + 4 * t);
    o.scale = (uint32_t)(C::W_BYTES + ws_scale(R, t >> 1));
    o.dcode = (uint32_t)(D * C::W_ROW);
    o.dscale = (uint32_t)(ws_scale(R + D, t >> 1) - ws_scale(R, t >> 1));
    return o;
}

/* A stage's own offsets (ws_stage: the slot's base added once): a thread's rows g and
 * g + 8, codes and scales */
struct WsStage {
    uint32_t c0, c1, s0, s1;
};

template <class C>
__device__ __forceinline__ void ws_load(const uint32_t *lut, const unsigned char *stages, const WsStage &o, int piece,
                                        WgPiece<C> &P)
{
    /* the slot's base is a multiple of 128: the swizzle bits (4-6) are the offsets' own */
    const uint32_t x = (uint32_t)piece << 4, s = (piece >> 1) * 512 + 2 * (piece & 1);
    P.w[0][0] = *reinterpret_cast<const uint32_t *>(stages + (o.c0 ^ x));
    P.w[0][1] = *reinterpret_cast<const uint32_t *>(stages + (o.c1 ^ x));
    P.sc[0][0] = lut[stages[o.s0 + s]];
    P.sc[0][1] = lut[stages[o.s1 + s]];
}

/* A consumer thread done with a stage (when `done`): its arrival on the stage's empty
 * barrier, which counts every consumer thread; predicated, so that no branch parts a
 * warp while its MMAs are in flight */
__device__ __forceinline__ void release(uint64_t *empty, bool done)
{
#ifdef M2A_WGMMA
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
                     smem_addr(empty)),
                 "r"((unsigned)done)
                 : "memory");
#endif
}

/* One stage of the warp-specialized pipeline (its first atom published: the caller
 * waited): as compute_stage_wg, each atom of tokens waited for before the first MMA that
 * reads it; the last piece's MMAs are left in flight into the next stage, whose first
 * wait retires them, after which `prev` (the stage before, when `release_prev`) is
 * released, so that the tensor pipe does not drain between stages. */
template <class C>
__device__ __forceinline__ void ws_stage(const uint32_t *lut, const unsigned char *stages, uint32_t slot, const WsOffsets &o,
                                         uint64_t (&full)[WS_ATOMS], unsigned parity, uint64_t *prev,
                                         bool release_prev, float (&acc)[1][C::GROUPS][4])
{
    constexpr int PIECES = 4 * C::KS;
    static_assert(C::STAGE_BYTES % 128 == 0, "a slot's base leaves the swizzle bits (4-6) alone");
    const uint32_t base = slot * C::STAGE_BYTES;
    const WsStage so = {base + o.code, base + o.code + o.dcode, base + o.scale, base + o.scale + o.dscale};
    const uint64_t b0 = stage_desc<C>(stages + base);
    WgPiece<C> P;
    ws_load<C>(lut, stages, so, 0, P);
#pragma unroll /* every offset an immediate */
    for (int piece = 0; piece < PIECES; piece++) {
        uint32_t af[2][1][4];
        wg_dequant<C>(P, af);
        if (piece + 1 < PIECES) ws_load<C>(lut, stages, so, piece + 1, P);
        if (piece > 0 && piece % 2 == 0) mbar_wait(&full[piece / 2], parity);
        wg_mma_piece<C>(acc, af, b0, piece);
        if (piece == 0) release(prev, release_prev);
    }
    wgmma_hold(acc[0]);
}

/* A tile's bf16 results written through shared memory (ws_consume, where C's rows are
 * 16-byte aligned): each warpgroup puts its 64 tokens x 64 columns (SwiGLU: 32) into its
 * own weight rows of the tile's last stage, which no other warpgroup reads, with
 * stmatrix (.trans: the fragment's rows are columns of C), then writes each token's
 * columns as 16-byte stores. Storing each value where it lies in the fragment took 2-byte
 * stores to four rows at once: 28 of the 160 us of the 64-row down projection
 * (bench/RESULTS.md, session 19). The buffer's rows are 128 (64) bytes, their 16-byte
 * chunks swizzled so that the eight rows of a matrix hit eight bank groups. */
__device__ __forceinline__ int epi_chunk(int tok, int c, bool swiglu)
{
    return swiglu ? c ^ ((tok >> 1) & 3) : c ^ (tok & 7);
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* four 8x8 matrices of 16-bit values, fragment row lane / 4, columns 2 (lane % 4) + 0..1
 * in register i, stored transposed: lanes 8i..8i+7 name matrix i's eight rows */
__device__ __forceinline__ void stmatrix_trans(unsigned char *row, const uint32_t (&r)[4])
{
#ifdef M2A_WGMMA
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row)),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#endif
}

/* the warpgroup's named barrier (1 is the consumers', 0 the block's) */
__device__ __forceinline__ void warpgroup_sync()
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + (int)(threadIdx.x >> 7)) : "memory");
}

template <class C>
__device__ __forceinline__ void ws_epilogue(const m2a_kgemm_t &p, const Tile &T, int64_t first, float scale,
                                            const float (&acc)[1][C::GROUPS][4], unsigned char *st)
{
    static_assert(C::GROUPS % 4 == 0 || C::GROUPS == 2, "stmatrix.x4: four token groups or two of two columns");
    const bool swiglu = p.swiglu != 0;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    const int CS = swiglu ? 2 : 3, RB = 16 << CS; /* a buffer row's 16-byte chunks (log2), bytes */
    unsigned char *buf = st + wg * 64 * RB;          /* its own weight rows (ws_offsets) */
    warpgroup_sync(); /* every warp of it is past its last reads of those rows */
    /* matrix i of a store: lanes 8i.. name its rows, tokens 8 grp + lane % 8 */
    const int mi = lane >> 3, tok_in = lane & 7;
    if (swiglu) { /* column warp * 8 + g: gate rows g, up rows g + 8; matrix i token group
                   * g0 + i (m64n16's two groups: matrices 2, 3 repeat 0, 1, same values
                   * to the same rows) */
#pragma unroll
        for (int g0 = 0; g0 < C::GROUPS; g0 += 4) {
            uint32_t r[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int grp = (g0 + i) % C::GROUPS;
                r[i] = bf16_pair(silu_times(acc[0][grp][0] * scale, acc[0][grp][2] * scale),
                                 silu_times(acc[0][grp][1] * scale, acc[0][grp][3] * scale));
            }
            const int tok = (g0 + mi) % C::GROUPS * 8 + tok_in;
            stmatrix_trans(buf + tok * RB + epi_chunk(tok, warp, true) * 16, r);
        }
    } else { /* columns warp * 16 + g (+ 8): matrices (grp, half) */
#pragma unroll
        for (int g0 = 0; g0 < C::GROUPS; g0 += 2) {
            uint32_t r[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                r[i] = bf16_pair(acc[0][g0 + (i >> 1)][2 * (i & 1)] * scale, acc[0][g0 + (i >> 1)][2 * (i & 1) + 1] * scale);
            const int tok = (g0 + (mi >> 1)) * 8 + tok_in;
            stmatrix_trans(buf + tok * RB + epi_chunk(tok, warp * 2 + (mi & 1), false) * 16, r);
        }
    }
    warpgroup_sync();
    const int64_t ncols = swiglu ? p.n / 2 : p.n, col0 = (int64_t)T.ntile * (swiglu ? 128 : 256) + wg * (swiglu ? 32 : 64);
    __nv_bfloat16 *c = static_cast<__nv_bfloat16 *>(p.c);
    for (int x = tid; x < T.cnt << CS; x += 128) {
        const int tok = x >> CS, ch = x & ((1 << CS) - 1);
        const int64_t col = col0 + ch * 8;
        if (col >= ncols) continue;
        const unsigned char *src = buf + tok * RB + epi_chunk(tok, ch, swiglu) * 16;
        __nv_bfloat16 *dst = c + (first + T.t0 + tok) * p.ldc + col;
        if (col + 8 <= ncols) {
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
        } else { /* the last columns, n % 8 of them */
            const __nv_bfloat16 *e = reinterpret_cast<const __nv_bfloat16 *>(src);
            for (int j = 0; j < ncols - col; j++) dst[j] = e[j];
        }
    }
}

template <class C>
__device__ __forceinline__ void ws_consume(const m2a_kgemm_t &p, const int32_t *prefix, unsigned char *stages,
                                           Shared &sh, Ring<C::STAGES> &ring, const uint32_t *lut)
{
    const int total = prefix[p.num_experts], ktiles = ktiles_of<C>(p);
    WsOffsets o = ws_offsets<C>(p.swiglu != 0);
    /* bf16 C rows 16-byte aligned: the results go out through shared memory */
    const bool staged = !p.out_fp32 && ((uintptr_t)p.c & 15) == 0 && p.ldc % 8 == 0;
    RingPos<C::STAGES> at;
    unsigned prev = C::STAGES - 1; /* the slot before at's */
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        int64_t first;
        const Tile T = tile_at<C>(p, prefix, tile, &first);
        if (!staged) { /* epilogue()'s rows */
            group_sync<C, true>(); /* the previous tile's epilogue is done with sh */
            tile_rows<C>(p, T, first, sh);
            group_sync<C, true>();
        }
        float acc[1][C::GROUPS][4];
        zero_acc<C>(acc);
        for (int kt = 0; kt < ktiles; kt++, prev = at.slot, at.next()) {
            mbar_wait(&ring.full[at.slot][0], at.parity); /* the weights too have landed */
            /* opaque to the compiler, so that it keeps the offsets in registers rather than
             * working them out again at each stage (142.5 -> 139.0 us at 64 rows, 7168 x
             * 2048: bench/RESULTS.md, session 19) */
            asm volatile("" : "+r"(o.code), "+r"(o.scale), "+r"(o.dcode), "+r"(o.dscale));
            ws_stage<C>(lut, stages, at.slot, o, ring.full[at.slot], at.parity, &ring.empty[prev],
                        kt > 0, acc);
        }
        wgmma_wait<0>();
        const float scale = 256.0f / p.g[T.e];
        if (staged && ktiles > 0) {
            ws_epilogue<C>(p, T, first, scale, acc, stages + prev * C::STAGE_BYTES);
            proxy_fence(); /* the buffer's stores before the copies that next overwrite it */
            release(&ring.empty[prev], true);
        } else {
            release(&ring.empty[prev], ktiles > 0);
            epilogue<C>(p, sh, T, (T.cnt + 7) / 8, scale, acc);
        }
    }
}

/* Hopper: the three variants in one launch, one block of four warpgroups per SM. Each
 * warpgroup first is a block of the mma.sync small variant (experts of 8 rows and
 * fewer; four per SM, as when launched alone), with its own quarter of the stages and
 * its own named barrier; then the blocks take the m64n16 tiles (9-16 rows), then the
 * m64n64 ones (more). One launch rather than three: a variant with
 * no expert of its size cost 3-5 us of launch and set-up in a kernel of its own (the
 * counts are on the device, so the host cannot skip it). */
constexpr int SM90_THREADS = 512;
static_assert(Hopper::THREADS == SM90_THREADS && HopperSmall::THREADS == SM90_THREADS &&
                  Hopper::MIN_BLOCKS == 1 && HopperSmall::MIN_BLOCKS == 1 && SM90_THREADS % Small::THREADS == 0,
              "one block of warpgroups per SM");
constexpr int SM90_GROUPS = SM90_THREADS / Small::THREADS;
/* experts of at most this many rows take mma.sync's small tiles, where weight bytes bound
 * the call (run_all), those of up to HopperSmall::BT the m64n16 ones */
constexpr int SM90_SMALL_ROWS = 8;
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int SM90_SMEM = cmax(cmax(Hopper::SMEM, HopperSmall::SMEM), SM90_GROUPS * Small::SMEM);

template <bool W16> __global__ void __launch_bounds__(SM90_THREADS, 1) gemm_kernel_sm90(const m2a_kgemm_t p)
{
    extern __shared__ __align__(1024) unsigned char stages[];
    __shared__ Shared sh[SM90_GROUPS];
    __shared__ uint32_t lut[256];
    const int E1 = p.num_experts + 1, warp = threadIdx.x >> 5;
    int32_t *prefix = reinterpret_cast<int32_t *>(stages + SM90_SMEM); /* [3][E1], after the stages */
    fill_lut(lut);
    if (warp == 0) tile_prefix<Hopper>(p, HopperSmall::BT, 0x7fffffff, prefix);
    else if (warp == 1) tile_prefix<HopperSmall>(p, SM90_SMALL_ROWS, HopperSmall::BT, prefix + E1);
    else if (warp == 2) tile_prefix<Small>(p, 0, SM90_SMALL_ROWS, prefix + 2 * E1);
    __syncthreads();
    const int group = threadIdx.x / Small::THREADS;
    run_tiles<W16, Small, true>(p, prefix + 2 * E1, blockIdx.x * SM90_GROUPS + group, gridDim.x * SM90_GROUPS,
                                stages + group * Small::SMEM, sh[group], lut);
    __syncthreads(); /* the whole block is done with the stages and sh[] */
    run_tiles<W16, HopperSmall>(p, prefix + E1, blockIdx.x, gridDim.x, stages, sh[0], lut);
    /* last: nothing stays live across its loop, so it keeps every register it had in a
     * kernel of its own (first, values for the later phases spilled, and the spills
     * reloaded at each tile's start missed L1: 5% slower at 64 rows) */
    run_tiles<W16, Hopper>(p, prefix, blockIdx.x, gridDim.x, stages, sh[0], lut);
}

/* Hopper where TMA can describe the operands (ws_maps): the m64n16 tiles (experts of
 * 1-16 rows: with TMA they read weights faster than mma.sync's small tiles, which this
 * kernel has no need of), then the m64n64 ones, each warp-specialized, in one launch of
 * four consumer warpgroups and a producer warpgroup per SM (registers split by role). A
 * kernel of its own, so that the block-synchronous one keeps 512 threads of 128
 * registers where TMA cannot serve (with the producers in it, 96 each: 16 rows took 245
 * against 233 us, bench/RESULTS.md, session 18, run 6). */
constexpr int WS_THREADS = WS_CONSUMERS + WS_PRODUCERS;
constexpr int WS_SMEM = cmax(Hopper::SMEM, HopperSmall::SMEM);

/* The registers split by role once the roles part: the producer warpgroup needs few and
 * gives them to the consumers (at 96 each, 64 rows took 283.8 against 263.9 us at 104:
 * bench/RESULTS.md, session 18). setmaxnreg.inc only takes what a .dec of the block gave
 * back: the split must fit the 96 a thread the block was launched with (an inc past it
 * waits forever). */
constexpr int WS_LAUNCH_REGS = 96, WS_PRODUCER_REGS = 56, WS_CONSUMER_REGS = 104;
static_assert(WS_PRODUCERS * WS_PRODUCER_REGS + WS_CONSUMERS * WS_CONSUMER_REGS <= WS_THREADS * WS_LAUNCH_REGS &&
                  WS_THREADS * WS_LAUNCH_REGS <= 65536,
              "the launch's registers, split");

/* all of the block, where its roles' code has parted: the unaligned barrier, which the
 * threads may reach at different instructions (bar.sync, __syncthreads', may not:
 * compute-sanitizer synccheck) */
__device__ __forceinline__ void ws_block_sync() { asm volatile("barrier.sync 0;\n" ::: "memory"); }

__global__ void __launch_bounds__(WS_THREADS, 1) gemm_kernel_ws(const m2a_kgemm_t p, const __grid_constant__ WsMaps maps)
{
    extern __shared__ __align__(1024) unsigned char stages[];
    __shared__ Shared sh;
    __shared__ uint32_t lut[256];
    __shared__ Ring<HopperSmall::STAGES> ring16;
    __shared__ Ring<Hopper::STAGES> ring64;
    const int E1 = p.num_experts + 1, warp = threadIdx.x >> 5;
    int32_t *prefix = reinterpret_cast<int32_t *>(stages + WS_SMEM); /* [2][E1], after the stages */
    fill_lut(lut);
    if (threadIdx.x == 0) ring_init(ring16), ring_init(ring64);
    if (warp == 0) tile_prefix<Hopper>(p, HopperSmall::BT, 0x7fffffff, prefix);
    else if (warp == 1) tile_prefix<HopperSmall>(p, 0, HopperSmall::BT, prefix + E1);
    __syncthreads();
    /* the m64n16 tiles, then (the stages free again) the m64n64 ones */
    if (warp < WS_CONSUMERS / 32) {
#ifdef M2A_WGMMA
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_CONSUMER_REGS));
#endif
        ws_consume<HopperSmall>(p, prefix + E1, stages, sh, ring16, lut);
        ws_block_sync();
        ws_consume<Hopper>(p, prefix, stages, sh, ring64, lut);
    } else {
#ifdef M2A_WGMMA
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
#endif
        if (warp > WS_CONSUMERS / 32) {
            ws_regroup<HopperSmall>(p, prefix + E1, stages, ring16);
            ws_block_sync();
            ws_regroup<Hopper>(p, prefix, stages, ring64);
        } else {
            if (threadIdx.x == WS_CONSUMERS) ws_copy<HopperSmall>(p, maps, prefix + E1, stages, ring16);
            ws_block_sync();
            if (threadIdx.x == WS_CONSUMERS) ws_copy<Hopper>(p, maps, prefix, stages, ring64);
        }
    }
}

/* Rank-major: expert e's (row, slot) pairs, ascending; one block per expert. */
constexpr int LIST_THREADS = 256;

__device__ int block_sum(int v, int *scratch)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    int s = 0;
    for (int w = 0; w < LIST_THREADS / 32; w++) s += scratch[w];
    return s;
}

__global__ void __launch_bounds__(LIST_THREADS) list_count(const m2a_kgemm_t p)
{
    __shared__ int scratch[LIST_THREADS / 32];
    const int32_t id = p.first_expert + (int32_t)blockIdx.x;
    const int64_t pairs = p.rows * p.slots;
    int c = 0;
    for (int64_t i = threadIdx.x; i < pairs; i += LIST_THREADS) c += p.ids[i] == id;
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) p.list_counts[blockIdx.x] = c;
}

__global__ void __launch_bounds__(LIST_THREADS) list_fill(const m2a_kgemm_t p)
{
    __shared__ int scratch[LIST_THREADS / 32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t id = p.first_expert + e;
    const int64_t pairs = p.rows * p.slots;
    int before = 0;
    for (int j = threadIdx.x; j < e; j += LIST_THREADS) before += p.list_counts[j];
    int at = block_sum(before, scratch);
    if (threadIdx.x == 0) p.list_offsets[e] = at;
    for (int64_t base = 0; base < pairs; base += LIST_THREADS) {
        int64_t i = base + threadIdx.x;
        bool mine = i < pairs && p.ids[i] == id;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        __syncthreads();
        if (lane == 0) scratch[warp] = __popc(ballot);
        __syncthreads();
        int wbefore = 0, all = 0;
        for (int w = 0; w < LIST_THREADS / 32; w++) {
            wbefore += w < warp ? scratch[w] : 0;
            all += scratch[w];
        }
        if (mine) p.list[at + wbefore + __popc(ballot & ((1u << lane) - 1))] = (int32_t)i;
        at += all;
    }
}

/* The current device: its SM count, and whether the large variants may run on wgmma
 * (the build has sm_90a code, configure building arch 90 as 90a with CUDA 12 or later,
 * and the device is an sm_90). Looked up once per device; the same values whichever
 * thread stores them. */
struct Device {
    int id, sms, sm90a;
};

int current_device(Device *d)
{
    static Device known[64]; /* sms 0: not looked up yet; stored last (release) */
    int err = (int)cudaGetDevice(&d->id);
    if (err) return err;
    Device &k = known[d->id & 63];
    if (!__atomic_load_n(&k.sms, __ATOMIC_ACQUIRE)) {
        int major = 0, minor = 0, n = 0;
        if ((err = (int)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d->id)) ||
            (err = (int)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d->id)) ||
            (err = (int)cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d->id)))
            return err;
#ifdef MOEA2A_HAVE_SM90A
        k.sm90a = major == 9 && minor == 0;
#endif
        k.id = d->id;
        __atomic_store_n(&k.sms, n, __ATOMIC_RELEASE);
    }
    *d = k;
    return 0;
}

/* The persistent grid of a variant: blocks per SM with this call's tile list, whose
 * size depends on the experts (the kernel's shared memory limit raised once per
 * device). */
constexpr int PREFIX_MAX = 4 * (M2A_GEMM_MAX_EXPERTS + 1);

/* A kernel's dynamic shared memory limit raised to `most` bytes, once per device and
 * kernel (the same value whichever thread sets it) */
template <auto KERNEL> int allow_smem(const Device &d, int most)
{
    static bool raised[64];
    if (!raised[d.id & 63]) {
        int err = (int)cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, most);
        if (err) return err;
        raised[d.id & 63] = true;
    }
    return 0;
}

template <bool W16, class C> int blocks_per_sm(const Device &d, int prefix_bytes, int *out)
{
    int err = allow_smem<gemm_kernel<W16, C>>(d, C::SMEM + PREFIX_MAX);
    if (err) return err;
    if ((err = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, gemm_kernel<W16, C>, C::THREADS,
                                                                   C::SMEM + prefix_bytes)))
        return err;
    if (*out < 1) *out = 1;
    return 0;
}

/* One variant over the experts with lo < count <= hi; rows_bound x its weight tiles
 * bounds its tiles. The grid is the fewest blocks that take at most as many tiles each as a
 * full grid would: every block then has the same number of tiles (or one fewer)
 * instead of some doing one more round than the rest. */
template <bool W16, class C>
int run(const m2a_kgemm_t *p, const Device &d, int lo, int hi, int64_t rows_bound, cudaStream_t s)
{
    const int prefix_bytes = 4 * (p->num_experts + 1);
    int per_sm = 0, err = blocks_per_sm<W16, C>(d, prefix_bytes, &per_sm);
    if (err) return err;
    const int64_t most = (int64_t)ntiles_of<C>(*p) * rows_bound, slots = (int64_t)d.sms * per_sm;
    const int64_t rounds = (most + slots - 1) / slots;
    int64_t grid = rounds ? (most + rounds - 1) / rounds : 1;
    if (grid < 1) grid = 1;
    gemm_kernel<W16, C><<<(unsigned)grid, C::THREADS, C::SMEM + prefix_bytes, s>>>(*p, lo, hi);
    return (int)cudaGetLastError();
}

/* cuTensorMapEncodeTiled, from the driver the runtime has loaded (no link to libcuda);
 * NULL where it has none. Looked up once; the same value whichever thread stores it. */
typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled()
{
    static EncodeTiled fn;
    static int looked;
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        __atomic_store_n(&fn, (EncodeTiled)f, __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&fn, __ATOMIC_RELAXED);
}

/* One map: `rank` dims (innermost first), strides of dims 1.. in bytes, box, swizzle */
bool encode(EncodeTiled fn, CUtensorMap *m, CUtensorMapDataType type, int rank, const void *base,
            const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle swz)
{
    const cuuint32_t ones[4] = {1, 1, 1, 1};
    return fn(m, type, (cuuint32_t)rank, const_cast<void *>(base), dims, strides, box, ones,
              CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The TMA maps of the warp-specialized phase (ws_copy), where TMA can describe the
 * operands: expert-major rows (rank-major ones are gathered through the list), 16-byte
 * aligned bases and row strides (k % 32 == 0), dims TMA takes, and with SwiGLU n/2 a
 * multiple of 128. Else false: the block-synchronous phase runs. */
bool ws_maps(const m2a_kgemm_t *p, WsMaps *m)
{
    const EncodeTiled fn = encode_tiled();
    const uint64_t kh = (uint64_t)p->k / 2, nkt = ((uint64_t)p->k / 16 + 3) / 4, groups = ((uint64_t)p->n + 127) / 128;
    if (!fn || p->slots || p->k % 32 || p->rows < 1 || p->lda % 8 || p->sf_stride % 16 ||
        ((uintptr_t)p->w | (uintptr_t)p->sf | (uintptr_t)p->a) % 16 || (p->swiglu && (p->n / 2) % 128) ||
        p->k >= (1LL << 31) || p->n >= (1LL << 31) || p->rows >= (1LL << 31))
        return false;
    const cuuint64_t wd[3] = {kh, (cuuint64_t)p->n, (cuuint64_t)p->num_experts},
                     ws[2] = {kh, kh * (cuuint64_t)p->n};
    const cuuint32_t wb[3] = {128, 128, 1};
    const cuuint64_t sd[4] = {128, nkt, groups, (cuuint64_t)p->num_experts},
                     ss[3] = {512, 512 * nkt, (cuuint64_t)p->sf_stride};
    const cuuint32_t sb[4] = {128, 4, 1, 1};
    const cuuint64_t ad[2] = {(cuuint64_t)p->k, (cuuint64_t)p->rows}, as[1] = {2 * (cuuint64_t)p->lda};
    const cuuint32_t ab64[2] = {64, 64}, ab16[2] = {64, 16};
    return encode(fn, &m->w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, p->w, wd, ws, wb, CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode(fn, &m->sf, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, p->sf, sd, ss, sb, CU_TENSOR_MAP_SWIZZLE_NONE) &&
           encode(fn, &m->a64, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p->a, ad, as, ab64, CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode(fn, &m->a16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p->a, ad, as, ab16, CU_TENSOR_MAP_SWIZZLE_128B);
}

/* Whether the warp-specialized kernel was built with the registers its split assumes
 * (gemm_kernel_ws: else its setmaxnreg.inc would wait forever); checked once */
bool ws_registers_fit()
{
    static int fit; /* 0 not checked, 1 yes, 2 no; the same whichever thread stores it */
    if (!__atomic_load_n(&fit, __ATOMIC_ACQUIRE)) {
        cudaFuncAttributes a;
        bool ok = cudaFuncGetAttributes(&a, gemm_kernel_ws) == cudaSuccess && a.numRegs == WS_LAUNCH_REGS;
        __atomic_store_n(&fit, ok ? 1 : 2, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&fit, __ATOMIC_ACQUIRE) == 1;
}

/* Hopper: the warp-specialized kernel where TMA can describe the operands, else the
 * merged block-synchronous one; one block per SM (their shared memory limits raised once
 * per device; the largest tile lists fit: 204 KB of stages, 12 KB of lists, 10 KB
 * static) */
template <bool W16> int run_sm90(const m2a_kgemm_t *p, const Device &d, cudaStream_t s)
{
    WsMaps maps;
    int err;
    if (W16 && !p->no_ws && ws_registers_fit() && ws_maps(p, &maps)) {
        if ((err = allow_smem<gemm_kernel_ws>(d, WS_SMEM + 2 * PREFIX_MAX))) return err;
        gemm_kernel_ws<<<d.sms, WS_THREADS, WS_SMEM + 2 * 4 * (p->num_experts + 1), s>>>(*p, maps);
        return (int)cudaGetLastError();
    }
    if ((err = allow_smem<gemm_kernel_sm90<W16>>(d, SM90_SMEM + 3 * PREFIX_MAX))) return err;
    gemm_kernel_sm90<W16><<<d.sms, SM90_THREADS, SM90_SMEM + 3 * 4 * (p->num_experts + 1), s>>>(*p);
    return (int)cudaGetLastError();
}

template <bool W16> int run_all(const m2a_kgemm_t *p, cudaStream_t s)
{
    Device d;
    int err = current_device(&d);
    if (err) return err;
    /* Hopper: experts of 8 rows and fewer on mma.sync's small tiles (where weight bytes
     * bound the call, four independent groups per SM read faster: H100, 4096x7168, 225
     * against 248 us on the m64n16 tiles), 9-16 rows on the m64n16 tiles, more on the
     * m64n64 ones, in one launch */
    if (d.sm90a && !p->no_wgmma) return run_sm90<W16>(p, d, s);
    const int64_t rows = p->slots ? p->rows * p->slots : p->rows;
    /* token tiles: at most one per expert for the small variant, rows / BT + experts for the large */
    err = run<W16, Small>(p, d, 0, Small::BT, p->num_experts, s);
    if (err || rows <= Small::BT) return err; /* no expert can be the large variant's */
    return run<W16, Large>(p, d, Small::BT, 0x7fffffff, rows / Large::BT + p->num_experts, s);
}

} /* namespace */

extern "C" int m2a_cuda_expert_gemm(const m2a_kgemm_t *p, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (p->slots) {
        list_count<<<p->num_experts, LIST_THREADS, 0, s>>>(*p);
        list_fill<<<p->num_experts, LIST_THREADS, 0, s>>>(*p);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return p->k % 32 == 0 ? run_all<true>(p, s) : run_all<false>(p, s);
}

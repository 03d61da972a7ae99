/* The GEMM's variants (tile shapes per GPU and expert size), the dequantization of
 * NVFP4 weights into bf16 pairs, and what each thread copies per stage. Part of
 * fp4_gemm.cu, which includes the parts in order: one translation unit, so that every
 * kernel keeps its inlining. */
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
 * shapes are what measured best on an H100 (bench/RESULTS.md, FP4 expert GEMM). */
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
 * (bench/RESULTS.md, FP4 expert GEMM). */
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
        L.s[i] = n >= 0 ? sfe + m2a_sf_128x4((size_t)n, M2A_SF_TILE_BLOCKS * (size_t)(gtid<C>() % (2 * C::KS)), (size_t)nkt)
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
        static_assert(C::BT * kWarpSize % C::THREADS == 0, "whole passes");
        __builtin_assume(tid >= 0 && tid < C::THREADS); /* v's row and column fold to shifts */
        const int c = tid % 8;
#pragma unroll
        for (int i = 0; i < C::BT * kWarpSize / C::THREADS; i++) {
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

} // namespace

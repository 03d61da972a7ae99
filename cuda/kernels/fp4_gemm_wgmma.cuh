/* Hopper's warpgroup MMA: the block-synchronous pipeline. Part of fp4_gemm.cu, which
 * includes the parts in order: one translation unit, so that every kernel keeps its
 * inlining. */
namespace {

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
    const int lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3, warp = (threadIdx.x / kWarpSize) & 3,
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
    constexpr int PASSES = C::BT * kWarpSize / C::THREADS;
    const int tid = threadIdx.x, lane = tid % kWarpSize;
    __syncwarp();
    if (lane < 8 * PASSES) {
        const int j = lane & 3, h = (lane >> 2) & 1, v = 4 * (tid / kWarpSize) + j + C::THREADS / 8 * (lane >> 3);
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

} // namespace

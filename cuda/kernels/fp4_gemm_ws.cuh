/* Hopper's warp-specialized kernel: TMA copies, regrouping warps, the consumer
 * warpgroups' pipeline. Part of fp4_gemm.cu, which includes the parts in order: one
 * translation unit, so that every kernel keeps its inlining. */
namespace {

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
 * the whole block-synchronous kernel. */
constexpr int WS_CONSUMERS = Hopper::THREADS;
constexpr int WS_PRODUCERS = 128, WS_REGROUPERS = WS_PRODUCERS - kWarpSize; /* warp 0 copies, 1-3 regroup */
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
 * on an H100). The items (half atom rows) are dealt in atom
 * order, so a thread arrives on atom a's barrier once it has passed a's last item. */
template <class C>
__device__ __forceinline__ void ws_regroup(const m2a_kgemm_t &p, const int32_t *prefix, unsigned char *stages,
                                           Ring<C::STAGES> &ring)
{
    constexpr int ITEMS = 2 * C::BT; /* per atom */
    const int total = prefix[p.num_experts], first = (int)blockIdx.x, stride = (int)gridDim.x;
    const int tid = (int)threadIdx.x % WS_PRODUCERS - kWarpSize;
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

/* byte of smem row R's scale of 16-k block kb of the stage, in a TMA box: the 128x4
 * layout of a box of 4 tiles of 4 blocks (moea2a_fp4(3)) */
__device__ __forceinline__ int ws_scale(int R, int kb)
{
    return (int)m2a_sf_128x4((size_t)R, (size_t)kb, 4);
}

template <class C> __device__ __forceinline__ WsOffsets ws_offsets(bool swiglu)
{
    static_assert(C::M_TILES == 1 && C::W_ROW == 128, "one m64 tile per warpgroup, 128-byte rows");
    const int lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3, warp = (threadIdx.x / kWarpSize) & 3,
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
 * on an H100. The buffer's rows are 128 (64) bytes, their 16-byte
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
    const int lane = threadIdx.x % kWarpSize, warp = (threadIdx.x / kWarpSize) & 3, wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
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
             * 2048 on an H100) */
            asm volatile("" : "+r"(o.code), "+r"(o.scale), "+r"(o.dcode), "+r"(o.dscale));
            ws_stage<C>(lut, stages, at.slot, o, ring.full[at.slot], at.parity, &ring.empty[prev],
                        kt > 0, acc);
        }
        wgmma_wait<0>();
        const float scale = M2A_GEMM_UNSCALE / p.g[T.e];
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
    const int E1 = p.num_experts + 1, warp = threadIdx.x / kWarpSize;
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
 * against 233 us on an H100). */
constexpr int WS_THREADS = WS_CONSUMERS + WS_PRODUCERS;
constexpr int WS_SMEM = cmax(Hopper::SMEM, HopperSmall::SMEM);

/* The registers split by role once the roles part: the producer warpgroup needs few and
 * gives them to the consumers (at 96 each, 64 rows took 283.8 against 263.9 us at 104:
 * on an H100). setmaxnreg.inc only takes what a .dec of the block gave
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
    const int E1 = p.num_experts + 1, warp = threadIdx.x / kWarpSize;
    int32_t *prefix = reinterpret_cast<int32_t *>(stages + WS_SMEM); /* [2][E1], after the stages */
    fill_lut(lut);
    if (threadIdx.x == 0) ring_init(ring16), ring_init(ring64);
    if (warp == 0) tile_prefix<Hopper>(p, HopperSmall::BT, 0x7fffffff, prefix);
    else if (warp == 1) tile_prefix<HopperSmall>(p, 0, HopperSmall::BT, prefix + E1);
    __syncthreads();
    /* the m64n16 tiles, then (the stages free again) the m64n64 ones */
    if (warp < WS_CONSUMERS / kWarpSize) {
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
        if (warp > WS_CONSUMERS / kWarpSize) {
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

} // namespace

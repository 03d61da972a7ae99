/* The epilogue (SwiGLU, bf16 or fp32 C), the scale table, the tile lists, and the
 * persistent kernel of one variant. Part of fp4_gemm.cu, which includes the parts in
 * order: one translation unit, so that every kernel keeps its inlining. */
namespace {

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
    const int lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3, warp = gtid<C>() / kWarpSize;
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
        float s = m2a_e4m3_to_f32((uint8_t)i) * M2A_GEMM_SCALE_TABLE;
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
    const int lane = threadIdx.x % kWarpSize, E = p.num_experts, ntiles = ntiles_of<C>(p);
    int carry = 0;
    if (lane == 0) prefix[0] = 0;
    for (int base = 0; base < E; base += kWarpSize) {
        int e = base + lane, v = 0;
        if (e < E) {
            int64_t first;
            int cnt;
            expert_rows(p, e, &first, &cnt);
            v = cnt > lo && cnt <= hi ? (cnt + C::BT - 1) / C::BT * ntiles : 0;
        }
        for (int o = 1; o < kWarpSize; o <<= 1) {
            int n = __shfl_up_sync(kAllLanes, v, o);
            if (lane >= o) v += n;
        }
        if (e < E) prefix[e + 1] = carry + v;
        carry += __shfl_sync(kAllLanes, v, 31);
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
        epilogue<C>(p, sh, T, groups, M2A_GEMM_UNSCALE / p.g[T.e], acc);
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
    if (threadIdx.x < kWarpSize) tile_prefix<C>(p, lo, hi, prefix);
    __syncthreads();
    run_tiles<W16, C>(p, prefix, blockIdx.x, gridDim.x, stages, sh, lut);
}

} // namespace

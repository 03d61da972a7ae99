/* One stage on mma.sync (Ampere and later). Part of fp4_gemm.cu, which includes the
 * parts in order: one translation unit, so that every kernel keeps its inlining. */
namespace {

/* One stage: thread (g, t) of a warp takes bytes 16t..16t+15 of its rows g and g + 8
 * (k 32t..32t+31), sub-step q their word q, which is MMA steps 2q and 2q + 1; the token
 * operand takes the same k of token g (16 bytes of unit 4t + q). */
template <class C>
__device__ __forceinline__ void compute_stage(const uint32_t *lut, const unsigned char *st, int groups,
                                              float (&acc)[C::M_TILES][C::GROUPS][4])
{
    constexpr int MT = C::M_TILES, G = C::GROUPS;
    constexpr bool PAIRED = C::PAIRED;
    const int lane = threadIdx.x % kWarpSize, g = lane >> 2, t = lane & 3, warp = gtid<C>() / kWarpSize;
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

} // namespace

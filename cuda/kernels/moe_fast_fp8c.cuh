/* The FP8 combine wire on the load/store path: the send half quantizes each valid row
 * of the combine buffer in place (its codes, then its row-major scales, from the row's
 * start: moea2a_moe(3), "FP8 combine"), the receive half reads the peers' codes and
 * scales, dequantizes (code x scale, fp32) and sums in ascending rank order from 0,
 * rounded once: the host reference's bits (lib/moe/backend/host_kernels.c). Part of
 * moe_fast.cu, which includes the parts in order: one translation unit, so that every
 * kernel keeps its inlining. */
namespace {

using namespace m2a_fp8c;

/* Where the send half quantizes: 1, a kernel of its own on the whole GPU before the
 * combine kernel (kQThreads per block, kQBlocksPerSM per SM); 0, the combine kernel's
 * blocks before they signal. On 4 x H200 at 4096 tokens (48 SMs, hidden 7168) the
 * combine's blocks took 245 us to quantize a rank's 14.7k rows (a warp's loads and its
 * arithmetic alternate, and 16 warps per SM hide neither), the whole FP8 combine 562
 * us; quantized first, about 100 us (3 TB/s of rows read and codes written) and 366 us.
 * Two groups ahead instead of four: the same (363 us). */
#ifndef M2A_FP8C_FIRST
#define M2A_FP8C_FIRST 1
#endif
constexpr bool kQFirst = M2A_FP8C_FIRST != 0;
constexpr int kQThreads = 256, kQBlocksPerSM = 4; /* bf16 rows: 63 registers, 4 blocks per SM */
/* Values of a token's output row per reduce unit (groups per lane x kQSpan; 2: 2 KB of
 * bf16 out), and the rows whose codes are loaded before any is added. */
#ifndef M2A_FP8C_GROUPS
#define M2A_FP8C_GROUPS 2
#endif
#ifndef M2A_FP8C_ROWS
#define M2A_FP8C_ROWS 4
#endif
constexpr int kFSeg = M2A_FP8C_GROUPS * kQSpan;
constexpr int kFRows = M2A_FP8C_ROWS;

/* The dynamic shared memory of a quantizing launch of `threads` per block: each warp's
 * scales of its row, written after the row's last values were read (they overlap the
 * row's second half). */
__host__ __device__ constexpr size_t fp8c_smem(size_t hidden, int threads = T)
{
    return (size_t)(threads / kWarpSize) * (hidden / M2A_FP8_BLOCK) * 4;
}

/* The send half's quantization as a kernel of its own (kQFirst): src the caller's rows,
 * or NULL for the rows in the combine buffer (quantized in place). */
template <moea2a_datatype_t DT>
__global__ void __launch_bounds__(kQThreads) fp8c_quantize_kernel(m2a_fast_t f, int stride, const unsigned char *src)
{
    unsigned char *ws = f.peer[f.p.me];
    fp8c_quantize<DT>(src ? src : ws + f.combine, f.combine_row, ws + f.combine, f.combine_row,
                      reinterpret_cast<const int32_t *>(ws + f.recv_counts), f.p.ep, stride, (int)f.hidden,
                      f.combine_fp8 == M2A_FAST_FP8_UE8M0);
}

/* One warp: out values [h0, h0 + kFSeg) of a token (out: its output row) = the sum of
 * its nd wire rows' dequantized values there (row_of: row d in lane d or d - 32). Every
 * row's codes and scale words of up to kFRows rows are loaded before any is added.
 * UE8M0 a template argument: a choice per added group cost the fp32-scale wire 6%
 * (2 GPUs, 4096 tokens: 202.5 against 190.3 us). */
template <moea2a_datatype_t DT, bool UE8M0>
__device__ void fp8c_reduce_unit(const unsigned char *row_lo, const unsigned char *row_hi, int nd, int h0, int hidden,
                                 unsigned char *out, bool vec)
{
    constexpr bool ue8m0 = UE8M0;
    constexpr int G = kFSeg / kQSpan, es = (int)Elem<DT>::size, V = 16 / es;
    const int lane = threadIdx.x % kWarpSize;
    float acc[G][kQv];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int v = 0; v < kQv; v++) acc[g][v] = 0.0f;
    for (int d0 = 0; d0 < nd; d0 += kFRows) {
        uint4 c[G][kFRows];
        uint32_t s[G][kFRows]; /* scale words, converted when added (fp8c_scale_word) */
#pragma unroll
        for (int d = 0; d < kFRows; d++) {
            const unsigned char *r = d0 + d < nd ? row_of(row_lo, row_hi, d0 + d) : nullptr;
#pragma unroll
            for (int g = 0; g < G; g++) {
                const int h = h0 + g * kQSpan + lane * kQv;
                if (r && h < hidden) {
                    c[g][d] = *reinterpret_cast<const uint4 *>(r + h);
                    s[g][d] = fp8c_scale_word(r, hidden, h / M2A_FP8_BLOCK, ue8m0);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int d = 0; d < kFRows; d++)
                if (d0 + d < nd && h0 + g * kQSpan + lane * kQv < hidden)
                    fp8c_add(acc[g], c[g][d], fp8c_scale_of(s[g][d], (h0 + g * kQSpan + lane * kQv) / M2A_FP8_BLOCK, ue8m0));
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        const int h = h0 + g * kQSpan + lane * kQv;
        if (h >= hidden) continue;
        unsigned char *o = out + (size_t)h * es;
        if (vec) {
#pragma unroll
            for (int q = 0; q < kQv / V; q++) reinterpret_cast<int4 *>(o)[q] = pack_vec<DT>(acc[g] + V * q);
        } else {
#pragma unroll
            for (int v = 0; v < kQv; v++) Elem<DT>::store(o, (size_t)v, acc[g][v]);
        }
    }
}

} // namespace

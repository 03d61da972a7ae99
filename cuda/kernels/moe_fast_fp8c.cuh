/* The FP8 combine wire on the load/store path: the send half quantizes each valid row
 * of the combine buffer in place (its codes, then its row-major scales, from the row's
 * start: moea2a_moe(3), "FP8 combine"), the receive half reads the peers' codes and
 * scales, dequantizes (code x scale, fp32) and sums in ascending rank order from 0,
 * rounded once: the host reference's bits (lib/moe/backend/host_kernels.c). Part of
 * moe_fast.cu, which includes the parts in order: one translation unit, so that every
 * kernel keeps its inlining. */
namespace {

constexpr int kQv = 16;                      /* values of a row per lane and group */
constexpr int kQLanes = M2A_FP8_BLOCK / kQv; /* adjacent lanes per block of 128 values: 8 */
constexpr int kQSpan = kWarpSize * kQv;      /* values of one group of the warp: 512 */
/* Groups a lane loads before it stores any: 4 KB of a bf16 row in flight per warp. */
#ifndef M2A_FP8C_AHEAD
#define M2A_FP8C_AHEAD 4
#endif
constexpr int kQAhead = M2A_FP8C_AHEAD;
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

/* 16 bytes at p (vec: 16-byte aligned; else byte by byte). */
__device__ __forceinline__ uint4 load16(const unsigned char *p, bool vec)
{
    if (vec) return *reinterpret_cast<const uint4 *>(p);
    uint4 r;
    unsigned char *b = reinterpret_cast<unsigned char *>(&r);
#pragma unroll
    for (int i = 0; i < 16; i++) b[i] = p[i];
    return r;
}

/* One warp: the row of `hidden` values of DT at src as an FP8 wire row at dst (hidden
 * codes, then the scales: fp32 words or, with ue8m0, bytes padded to a word). dst may be
 * src: codes of values [h, h + n) overwrite bytes that held values below h + n, all
 * read by then (the __syncwarp after each pass's loads), and the scales go last. sc: the
 * warp's hidden / 128 words of shared memory. */
template <moea2a_datatype_t DT>
__device__ void fp8c_quantize_row(const unsigned char *src, unsigned char *dst, int hidden, bool ue8m0, bool vec,
                                  uint32_t *sc)
{
    constexpr int es = (int)Elem<DT>::size, NV = kQv * es / 16;
    const int lane = threadIdx.x % kWarpSize, nkb = hidden / M2A_FP8_BLOCK;
    for (int base = 0; base < hidden; base += kQAhead * kQSpan) {
        uint4 raw[kQAhead][NV];
#pragma unroll
        for (int a = 0; a < kQAhead; a++) {
            const int h = base + a * kQSpan + lane * kQv;
#pragma unroll
            for (int c = 0; c < NV; c++)
                raw[a][c] = h < hidden ? load16(src + (size_t)h * es + 16 * c, vec) : make_uint4(0, 0, 0, 0);
        }
        __syncwarp();
#pragma unroll
        for (int a = 0; a < kQAhead; a++) {
            const int h = base + a * kQSpan + lane * kQv;
            if (base + a * kQSpan >= hidden) break; /* warp-uniform */
            float v[kQv];
            uint32_t am = m2a_fp8_unpack<DT, NV>(raw[a], v);
#pragma unroll
            for (int o = kQLanes / 2; o; o >>= 1) am = max(am, __shfl_xor_sync(kAllLanes, am, o));
            const bool finite = am < 0x7f800000u;
            float mul;
            const uint32_t s = m2a_fp8_scale(__uint_as_float(am), finite, ue8m0, &mul);
            uint32_t w[kQv / 4];
            m2a_fp8_encode<kQv>(v, mul, finite, w);
            if (h < hidden) {
                *reinterpret_cast<uint4 *>(dst + h) = make_uint4(w[0], w[1], w[2], w[3]);
                if (lane % kQLanes == 0) sc[h / M2A_FP8_BLOCK] = s;
            }
        }
    }
    __syncwarp(); /* every lane's values read and scales in sc */
    if (ue8m0) {
        for (int kb = lane; kb < (nkb + 3) / 4 * 4; kb += kWarpSize) dst[hidden + kb] = kb < nkb ? (unsigned char)sc[kb] : 0;
    } else {
        for (int kb = lane; kb < nkb; kb += kWarpSize) reinterpret_cast<uint32_t *>(dst + hidden)[kb] = sc[kb];
    }
    __syncwarp(); /* sc read before the warp's next row writes it */
}

/* Send half: every valid row (slot i of source q, i < counts[q]) of the ep x stride
 * rows at src quantized into the combine buffer at dst, a row per warp of the launch. */
template <moea2a_datatype_t DT>
__device__ void fp8c_quantize(const unsigned char *src, unsigned char *dst, const int32_t *counts, int ep, int stride,
                              size_t row, int hidden, bool ue8m0)
{
    extern __shared__ __align__(128) unsigned char dsm[]; /* the declaration reduce_bulk shares */
    const int wpb = (int)(blockDim.x / kWarpSize);
    uint32_t *sc = reinterpret_cast<uint32_t *>(dsm) + (size_t)(threadIdx.x / kWarpSize) * (hidden / M2A_FP8_BLOCK);
    const bool vec = (uintptr_t)src % 16 == 0 && row % 16 == 0;
    int q = 0, slot = (int)(blockIdx.x * wpb + threadIdx.x / kWarpSize); /* warp-uniform */
    const int step = (int)gridDim.x * wpb;
    for (; q < ep; slot += step) {
        while (q < ep && slot >= stride) slot -= stride, q++;
        if (q >= ep) break;
        if (slot >= counts[q]) continue;
        const size_t i = (size_t)q * stride + slot;
        fp8c_quantize_row<DT>(src + i * row, dst + i * row, hidden, ue8m0, vec, sc);
    }
}

/* The send half's quantization as a kernel of its own (kQFirst): src the caller's rows,
 * or NULL for the rows in the combine buffer (quantized in place). */
template <moea2a_datatype_t DT>
__global__ void __launch_bounds__(kQThreads) fp8c_quantize_kernel(m2a_fast_t f, int stride, const unsigned char *src)
{
    unsigned char *ws = f.peer[f.p.me];
    fp8c_quantize<DT>(src ? src : ws + f.combine, ws + f.combine, reinterpret_cast<const int32_t *>(ws + f.recv_counts),
                      f.p.ep, stride, f.combine_row, (int)f.hidden, f.combine_fp8 == M2A_FAST_FP8_UE8M0);
}

/* acc[v] += the 16 values of codes c (E4M3) times scale s: each product rounded to fp32,
 * a NaN product the canonical one, then added (m2a_fp8_value's arithmetic; no fused
 * multiply-add). */
__device__ __forceinline__ void fp8c_add(float *acc, const uint4 &c, float s)
{
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const float2 x = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
        float p0 = __fmul_rn(x.x, s), p1 = __fmul_rn(x.y, s);
        p0 = p0 != p0 ? __uint_as_float(M2A_FP8_NAN_SCALE) : p0;
        p1 = p1 != p1 ? __uint_as_float(M2A_FP8_NAN_SCALE) : p1;
        acc[2 * i] = __fadd_rn(acc[2 * i], p0), acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], p1);
    }
}

/* Block kb's scale of the wire row at r, as fp32 (a UE8M0 byte read in its word). */
__device__ __forceinline__ float fp8c_scale(const unsigned char *r, int hidden, int kb, bool ue8m0)
{
    const uint32_t *w = reinterpret_cast<const uint32_t *>(r + hidden);
    if (ue8m0) return m2a_fp8_scale_value((w[kb / 4] >> (8 * (kb % 4))) & 0xffu, 1);
    return __uint_as_float(w[kb]);
}

/* One warp: out values [h0, h0 + kFSeg) of a token (out: its output row) = the sum of
 * its nd wire rows' dequantized values there (row_of: row d in lane d or d - 32). Every
 * row's codes and scales of up to kFRows rows are loaded before any is added. */
template <moea2a_datatype_t DT>
__device__ void fp8c_reduce_unit(const unsigned char *row_lo, const unsigned char *row_hi, int nd, int h0, int hidden,
                                 bool ue8m0, unsigned char *out, bool vec)
{
    constexpr int G = kFSeg / kQSpan, es = (int)Elem<DT>::size, V = 16 / es;
    const int lane = threadIdx.x % kWarpSize;
    float acc[G][kQv];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int v = 0; v < kQv; v++) acc[g][v] = 0.0f;
    for (int d0 = 0; d0 < nd; d0 += kFRows) {
        uint4 c[G][kFRows];
        float s[G][kFRows];
#pragma unroll
        for (int d = 0; d < kFRows; d++) {
            const unsigned char *r = d0 + d < nd ? row_of(row_lo, row_hi, d0 + d) : nullptr;
#pragma unroll
            for (int g = 0; g < G; g++) {
                const int h = h0 + g * kQSpan + lane * kQv;
                if (r && h < hidden) {
                    c[g][d] = *reinterpret_cast<const uint4 *>(r + h);
                    s[g][d] = fp8c_scale(r, hidden, h / M2A_FP8_BLOCK, ue8m0);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int d = 0; d < kFRows; d++)
                if (d0 + d < nd && h0 + g * kQSpan + lane * kQv < hidden) fp8c_add(acc[g], c[g][d], s[g][d]);
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

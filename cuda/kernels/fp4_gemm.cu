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
#include "warp.cuh"

#include "fp4_gemm_tiles.cuh"
#include "fp4_gemm_mma.cuh"
#include "fp4_gemm_wgmma.cuh"
#include "fp4_gemm_kernel.cuh"
#include "fp4_gemm_ws.cuh"
#include "fp4_gemm_lists.cuh"

namespace {

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

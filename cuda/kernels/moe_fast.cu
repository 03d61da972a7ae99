/* Dispatch and combine over load/store peer pointers (see moe_fast.h).
 *
 * Protocol. Every rank's workspace has the same layout; rank q's kernels write into
 * rank r's through f.peer[r]. Counters only grow, so nothing is ever reset across
 * ranks: the e-th dispatch of a context waits for "arrive[src] >= e x blocks" and
 * the e-th combine for "carrive[src] >= e x blocks", where every block of the
 * sender adds one after its writes (release, system scope); a combine whose rows were
 * complete before it began (zero copy) adds all of them from its block 0. The epoch e
 * lives in the workspace, so a CUDA graph replays correctly.
 *
 *  dispatch, many tokens (over m2a_fast_t.even_tokens per block; blocks split them into
 *  contiguous chunks):
 *   1. count the tokens before the chunk per destination (every block for itself,
 *      no waiting on other blocks): the chunk's first slot at every destination.
 *      Slot order is token order, whatever the timing.
 *   2. wait until every peer's previous combine began (it no longer reads the
 *      receive arrays it got from the previous dispatch);
 *   3. route the chunk in pieces: each token's slot at every destination into the
 *      send map, then mark the chunk's send map complete; its ids (sanitized for
 *      each destination), weights and source index written there;
 *   4. copy payload rows in (token, 4 KB segment) units taken from a counter by any
 *      warp of any block, so that the links stay busy until the end;
 *   5. the last block writes each destination's count and this call's stride and
 *      status; every block signals every destination;
 *   6. wait for every source; check strides and statuses; sanitize padding slots;
 *      add the block's invalid and merged entries to the stats.
 *  dispatch, few tokens (a kernel of its own): the (token, segment) units are split
 *   evenly over all warps; 1 (the block's own tokens routed from the same pass over
 *   the ids) with 2 waited for by the last warp meanwhile, then 3 for the block's
 *   range with its warps copying their units (where the range fits one warp's lanes,
 *   no routing pass: each warp finds its units' slots from 1's masks and bases), 5, 6.
 *  combine:
 *   1. (caller rows) copy the valid rows into the workspace's combine buffer;
 *      signal every peer that this rank's rows are ready; wait for every peer's;
 *   2. (token, 2 KB segment) units split evenly over the warps (up to 8 per warp, in a
 *      kernel of its own), else (token, segment) units taken from a counter, their rows
 *      brought into shared memory by the SM's bulk copy engine (sm_90, up to 4 rows),
 *      else read with 16-byte loads: each token's rows in ascending rank order, summed
 *      in fp32 from 0.0f, rounded once: the host reference's arithmetic.
 *  variants: copy-engine mode runs the dispatch's send half QUIET, without payload
 *   arrays (steps 1-3 and 5's counts and headers, no rows, no signal); the host copies
 *   the rows, signal_kernel signals, and landing_reduce_kernel sums the combine's rows
 *   once the copy engines brought them here. A dispatch whose FP8 rows are quantized
 *   alongside it (dispatch_kernel<false, true>) waits in step 4 for each chunk's
 *   quantization counter and reads the rows through L2. With the FP8 combine wire
 *   (moe_fast_fp8c.cuh) combine's step 1 quantizes every valid row into the combine
 *   buffer (in place where the caller wrote there) and step 2 takes units from the
 *   counter, dequantizing each row as it adds it. */
#include <cuda_runtime.h>
#ifdef M2A_FAST_PROFILE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#endif

#include "base/convert.h"
#include "elem.cuh"
#include "fp8_device.cuh"
#include "fp8c_device.cuh"
#include "load.cuh"
#include "mbarrier.cuh"
#include "placement.cuh"
#include "moe_fast.h"
#include "wire_device.cuh"
#include "warp.cuh"

#include "moe_fast_sync.cuh"
#include "moe_fast_route.cuh"
#include "moe_fast_copy.cuh"
#include "moe_fast_dispatch.cuh"
#include "moe_fast_reduce.cuh"
#include "moe_fast_fp8c.cuh"
#include "moe_fast_combine.cuh"


#ifdef M2A_FAST_PROFILE
static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of n values (sorted in place). */
static double median_of(double *v, unsigned n)
{
    qsort(v, n, sizeof(double), by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Medians over the launches after the first 12 (warm-up and checks): span, the gap
 * before the launch, then each mark's mean and maximum over blocks, from each block's
 * start. Medians, not means: a benchmark's host-paced loops (a peer that starts late
 * shows up as a long wait) stay out of the typical launch. */
extern "C" void m2a_fast_profile_report(int rank)
{
    static unsigned long long rec[2][kLaunches][2 + 2 * kMarks];
    static double v[kLaunches];
    unsigned int launch[2], blocks[2];
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(rec, g_rec, sizeof(rec));
    cudaMemcpyFromSymbol(launch, g_launch, sizeof(launch));
    cudaMemcpyFromSymbol(blocks, g_blocks, sizeof(blocks));
    static const char *names[2][kMarks] = {{"counts", "prefix+gate", "routed", "copies", "signal", "arrivals", "sanitize", "small-route", "small-meta"},
                                           {"copy-in", "signal+wait", "reduce"}};
    for (int k = 0; k < 2; k++) {
        unsigned first = 12, last = launch[k] < kLaunches ? launch[k] : kLaunches, n = last - first;
        if (last <= first || !blocks[k]) continue;
        for (unsigned l = first; l < last; l++) v[l - first] = (double)(rec[k][l][1] - rec[k][l][0]);
        double span = median_of(v, n);
        for (unsigned l = first; l < last; l++) /* launches alternate: dispatch l, combine l */
            v[l - first] = k ? (double)rec[1][l][0] - (double)rec[0][l][1] : (double)rec[0][l][0] - (double)rec[1][l - 1][1];
        double gap = median_of(v, n);
        /* one write per line: the ranks of a job share the terminal */
        char line[1024];
        int o = snprintf(line, sizeof(line), "# profile rank %d %s: %u launches, median span %.1f us, gap before %.1f us; "
                         "mark mean/max over blocks (us, medians):", rank, k ? "combine" : "dispatch", n, span / 1e3, gap / 1e3);
        for (int i = 0; i < kMarks && names[k][i] && o > 0 && o < (int)sizeof(line); i++) {
            for (unsigned l = first; l < last; l++) v[l - first] = (double)rec[k][l][2 + i] / blocks[k];
            double mean = median_of(v, n);
            for (unsigned l = first; l < last; l++) v[l - first] = (double)rec[k][l][2 + kMarks + i];
            o += snprintf(line + o, sizeof(line) - (size_t)o, " %s %.1f/%.1f", names[k][i], mean / 1e3, median_of(v, n) / 1e3);
        }
        fprintf(stderr, "%s\n", line);
    }
    memset(rec, 0, sizeof(rec));
    unsigned int z[2] = {0, 0};
    cudaMemcpyToSymbol(g_rec, rec, sizeof(rec));
    cudaMemcpyToSymbol(g_launch, z, sizeof(z));
}
#endif

/* The launch for a rule: the one-holder kernels, or (GEN) the general rule's. */
template <bool GEN>
static void launch_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                            const int32_t *ids, const float *weights, int phases, cudaStream_t stream)
{
    const bool small = (long long)(status ? 0 : n) <= (long long)f->even_tokens * blocks;
    if (f->qfuse && !status) /* FP8 quantized inside the copies */
        (small ? dispatch_kernel<true, kInCopy, GEN> : dispatch_kernel<false, kInCopy, GEN>)<<<blocks, T, 0, stream>>>(
            *f, n, stride, status, payloads, ids, weights, phases);
    else if (f->qrows > 0 && !status && !small) /* the rows are quantized alongside */
        dispatch_kernel<false, kAlongside, GEN><<<blocks, T, 0, stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
    else if (small)
        dispatch_kernel<true, kBefore, GEN><<<blocks, T, 0, stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
    else
        dispatch_kernel<false, kBefore, GEN><<<blocks, T, 0, stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
}

extern "C" int m2a_fast_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                                 const int32_t *ids, const float *weights, int phases, void *stream)
{
    (f->general ? launch_dispatch<true> : launch_dispatch<false>)(f, blocks, n, stride, status, payloads, ids, weights,
                                                                   phases, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}

/* Every kernel of this file, loaded now (cuda/kernels/load.cuh). */
template <moea2a_datatype_t DT> static int load_combine(int e)
{
    e = m2a_load_kernel(combine_kernel<DT, kFp8>, m2a_load_kernel(fp8c_quantize_kernel<DT>, e));
    return m2a_load_kernel(combine_kernel<DT, kTma>, m2a_load_kernel(combine_kernel<DT, kEven>, m2a_load_kernel(combine_kernel<DT, kLoads>, e)));
}

template <bool GEN> static int load_dispatch(int e)
{
    e = m2a_load_kernel(dispatch_kernel<true, kBefore, GEN>, m2a_load_kernel(dispatch_kernel<false, kBefore, GEN>, e));
    e = m2a_load_kernel(dispatch_kernel<false, kAlongside, GEN>, e);
    return m2a_load_kernel(dispatch_kernel<true, kInCopy, GEN>, m2a_load_kernel(dispatch_kernel<false, kInCopy, GEN>, e));
}

extern "C" int m2a_fast_load(void)
{
    int e = load_dispatch<false>(0);
    e = load_dispatch<true>(e);
    e = load_combine<MOEA2A_FLOAT32>(e);
    e = load_combine<MOEA2A_FLOAT16>(e);
    e = load_combine<MOEA2A_BFLOAT16>(e);
    e = m2a_load_kernel(signal_kernel, e);
    e = m2a_load_kernel(landing_reduce_kernel<MOEA2A_FLOAT32, false>, m2a_load_kernel(landing_reduce_kernel<MOEA2A_FLOAT32, true>, e));
    e = m2a_load_kernel(landing_reduce_kernel<MOEA2A_FLOAT16, false>, m2a_load_kernel(landing_reduce_kernel<MOEA2A_FLOAT16, true>, e));
    return m2a_load_kernel(landing_reduce_kernel<MOEA2A_BFLOAT16, false>, m2a_load_kernel(landing_reduce_kernel<MOEA2A_BFLOAT16, true>, e));
}

extern "C" int m2a_fast_signal(const m2a_fast_t *f, int blocks, void *stream)
{
    signal_kernel<<<1, M2A_FAST_MAX_PEERS, 0, (cudaStream_t)stream>>>(*f, (uint32_t)blocks);
    return (int)cudaGetLastError();
}

/* Whether this device runs bulk copies (sm_90+), with the kernels that reduce through them
 * allowed the dynamic shared memory they need: checked once per device. M2A_FAST_BULK_OK,
 * M2A_FAST_BULK_ARCH or M2A_FAST_BULK_SMEM. */
template <typename K> static bool bulk_smem(K kernel)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kTmaSmem) == cudaSuccess;
}
static int device_bulk()
{
    static int cached[64]; /* the answer + 1 */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return M2A_FAST_BULK_ARCH;
    if (!cached[dev]) {
        int major = 0;
        int why = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9
                      ? M2A_FAST_BULK_OK
                      : M2A_FAST_BULK_ARCH;
        if (why == M2A_FAST_BULK_OK &&
            !(bulk_smem(combine_kernel<MOEA2A_FLOAT32, kTma>) && bulk_smem(combine_kernel<MOEA2A_FLOAT16, kTma>) &&
              bulk_smem(combine_kernel<MOEA2A_BFLOAT16, kTma>) && bulk_smem(landing_reduce_kernel<MOEA2A_FLOAT32, true>) &&
              bulk_smem(landing_reduce_kernel<MOEA2A_FLOAT16, true>) &&
              bulk_smem(landing_reduce_kernel<MOEA2A_BFLOAT16, true>)))
            why = M2A_FAST_BULK_SMEM;
        cudaGetLastError();
        cached[dev] = why + 1;
    }
    return cached[dev] - 1;
}

/* The current device's SMs (kernels that take the whole GPU), read once per device. */
static int device_sms()
{
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 1;
    if (!cached[dev]) {
        int n = 0;
        cached[dev] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0 ? n : 1;
        cudaGetLastError();
    }
    return cached[dev];
}

/* D: the rows a token's sum may have, one per rank it reaches. */
static int rows_per_token(const m2a_fast_t *f) { return f->p.k < f->p.ep ? f->p.k : f->p.ep; }

/* Whether a reduce of D rows per token may go through bulk copies, given 16-byte rows
 * (M2A_FAST_BULK_OK), or why not: a token on more than kTmaRows ranks (or under two
 * stages per warp), or the device (device_bulk). */
static int bulk_why(const m2a_fast_t *f)
{
    const int D = rows_per_token(f);
    return D > kTmaRows || tma_stages(D) < 2 ? M2A_FAST_BULK_ROWS : device_bulk();
}

extern "C" int m2a_fast_bulk(const m2a_fast_t *f, size_t *unit, int *stages, size_t *smem)
{
    const int D = rows_per_token(f);
    *unit = tma_seg(D), *stages = tma_stages(D), *smem = kTmaSmem;
    return bulk_why(f);
}

/* Whether a reduce of these rows (vec: 16-byte ones) goes through bulk copies. */
static bool bulk_fits(const m2a_fast_t *f, bool vec) { return vec && bulk_why(f) == M2A_FAST_BULK_OK; }

template <CombineWay WAY>
static void launch_combine(const m2a_fast_t *f, int blocks, cudaStream_t s, int n, int stride,
                           const unsigned char *expert_rows, unsigned char *o, int status, int phases)
{
    const size_t smem = WAY == kTma                                          ? tma_smem(rows_per_token(f))
                        : WAY == kFp8 && !kQFirst && (phases & M2A_FAST_SEND) ? fp8c_smem(f->hidden)
                                                                               : 0;
    switch (f->combine_dtype) {
    case MOEA2A_FLOAT32: combine_kernel<MOEA2A_FLOAT32, WAY><<<blocks, T, smem, s>>>(*f, n, stride, expert_rows, o, status, phases); break;
    case MOEA2A_FLOAT16: combine_kernel<MOEA2A_FLOAT16, WAY><<<blocks, T, smem, s>>>(*f, n, stride, expert_rows, o, status, phases); break;
    default: combine_kernel<MOEA2A_BFLOAT16, WAY><<<blocks, T, smem, s>>>(*f, n, stride, expert_rows, o, status, phases); break;
    }
}

extern "C" int m2a_fast_combine(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows,
                                void *out, int status, int phases, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned char *o = static_cast<unsigned char *>(out);
    const size_t out_row = f->hidden * (f->combine_dtype == MOEA2A_FLOAT32 ? 4 : 2);
    const bool vec = out_row % 16 == 0 && f->combine_row % 16 == 0 && (uintptr_t)out % 16 == 0;
    static_assert(fp8c_smem(M2A_FAST_FP8_MAX_HIDDEN) <= 48 * 1024, "the FP8 wire's scales outgrew a launch's shared memory");
    if (f->combine_fp8 != M2A_FAST_AS_IS) {
        if (kQFirst && (phases & M2A_FAST_SEND) && !status) { /* the rows quantized first, on the whole GPU */
            const size_t qsmem = fp8c_smem(f->hidden, kQThreads);
            const int qb = device_sms() * kQBlocksPerSM;
            const unsigned char *src = expert_rows == f->peer[f->p.me] + f->combine ? nullptr : expert_rows;
            switch (f->combine_dtype) {
            case MOEA2A_FLOAT32: fp8c_quantize_kernel<MOEA2A_FLOAT32><<<qb, kQThreads, qsmem, s>>>(*f, stride, src); break;
            case MOEA2A_FLOAT16: fp8c_quantize_kernel<MOEA2A_FLOAT16><<<qb, kQThreads, qsmem, s>>>(*f, stride, src); break;
            default: fp8c_quantize_kernel<MOEA2A_BFLOAT16><<<qb, kQThreads, qsmem, s>>>(*f, stride, src); break;
            }
        }
        launch_combine<kFp8>(f, blocks, s, n, stride, expert_rows, o, status, phases);
    } else if ((phases & M2A_FAST_RECV) && vec && even_units(out_row, n, blocks)) {
        launch_combine<kEven>(f, blocks, s, n, stride, expert_rows, o, status, phases);
    } else if ((phases & M2A_FAST_RECV) && blocks <= M2A_COMBINE_TMA_MAX_BLOCKS && bulk_fits(f, vec)) {
        launch_combine<kTma>(f, blocks, s, n, stride, expert_rows, o, status, phases);
    } else {
        launch_combine<kLoads>(f, blocks, s, n, stride, expert_rows, o, status, phases);
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_fast_landing_reduce(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *landing,
                                       const int32_t *index, void *out, void *stream)
{
    if (n <= 0 || f->hidden == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned char *o = static_cast<unsigned char *>(out);
    const size_t out_row = f->hidden * (f->combine_dtype == MOEA2A_FLOAT32 ? 4 : 2);
    const bool vec = out_row % 16 == 0 && f->combine_row % 16 == 0 && ((uintptr_t)o | (uintptr_t)landing) % 16 == 0;
    const bool bulk = !even_units(out_row, n, blocks) && bulk_fits(f, vec);
    const size_t smem = bulk ? tma_smem(rows_per_token(f)) : 0;
    switch (f->combine_dtype) {
    case MOEA2A_FLOAT32:
        (bulk ? landing_reduce_kernel<MOEA2A_FLOAT32, true> : landing_reduce_kernel<MOEA2A_FLOAT32, false>)<<<blocks, T, smem, s>>>(
            *f, n, stride, landing, index, o);
        break;
    case MOEA2A_FLOAT16:
        (bulk ? landing_reduce_kernel<MOEA2A_FLOAT16, true> : landing_reduce_kernel<MOEA2A_FLOAT16, false>)<<<blocks, T, smem, s>>>(
            *f, n, stride, landing, index, o);
        break;
    default:
        (bulk ? landing_reduce_kernel<MOEA2A_BFLOAT16, true> : landing_reduce_kernel<MOEA2A_BFLOAT16, false>)<<<blocks, T, smem, s>>>(
            *f, n, stride, landing, index, o);
        break;
    }
    return (int)cudaGetLastError();
}


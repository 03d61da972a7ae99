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
 *  dispatch, many tokens (over 4 per block; blocks split them into contiguous chunks):
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
 *   range with its warps copying their units, 5, 6.
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
 *   quantization counter and reads the rows through L2. */
#include <cuda_runtime.h>
#ifdef M2A_FAST_PROFILE
#include <stdio.h>
#include <string.h>
#endif

#include "base/convert.h"
#include "elem.cuh"
#include "fp8_device.cuh"
#include "load.cuh"
#include "mbarrier.cuh"
#include "moe_fast.h"
#include "wire_device.cuh"

namespace {

using namespace m2a_mbar;

constexpr int T = M2A_FAST_THREADS;
constexpr int kWarps = T / 32;
constexpr int kPieceSlots = 4096; /* (token, destination) pairs of a piece kept in shared memory */
constexpr int kErrTimeout = MOEA2A_ERR_TIMEOUT, kErrMismatch = MOEA2A_ERR_MISMATCH;

/* ---- memory order helpers -------------------------------------------------------- */

/* The scope of the signals. A rank alone (ep 1) signals only itself: its own GPU
 * writes and reads every word, the GPU's scope orders them, and a system-scope release
 * waits for more (one H100, ep 1: graph round trip at 8 / 128 tokens 13.3 / 15.8 ->
 * 12.4 / 14.9 us; bench/RESULTS.md, session 25). With peers every signal keeps the
 * system's: giving only a rank's own slot the GPU's measured mixed with two ranks on
 * one GPU (back to back 0.3 us faster, each call alone 2 us slower), unexplained. */
__device__ __forceinline__ uint32_t load_acquire(const uint32_t *p, bool local)
{
    uint32_t v;
    if (local) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    else asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void add_release(uint32_t *p, uint32_t v, bool local)
{
    if (local) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
    else asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---- optional phase profile (developers: build with -DM2A_FAST_PROFILE) ------------
 * Thread 0 of every block adds the time from its block's start to each phase mark;
 * the last block of a launch adds the launch's span (first start to last end). The
 * first kLaunches launches of each kind are recorded (moea2a_perf: keep --iters small).
 * Ranks that share a process share the record: profile ranks as processes.
 * m2a_fast_profile_report() prints the means and starts over. */
#ifdef M2A_FAST_PROFILE
constexpr int kMarks = 8, kLaunches = 512;
/* per launch: [0] first block start, [1] last block end, [2 + i] sum over blocks of
 * mark i (from the block's start), [2 + kMarks + i] its maximum over blocks */
__device__ unsigned long long g_rec[2][kLaunches][2 + 2 * kMarks];
__device__ unsigned int g_launch[2], g_blocks[2], g_done[2];
#define PROF_START(k)                                                                          \
    unsigned long long prof_t0 = 0, *prof_r = nullptr;                                         \
    if (threadIdx.x == 0) {                                                                    \
        const unsigned int l_ = *(volatile unsigned int *)&g_launch[k];                        \
        if (l_ < kLaunches) { /* the first kLaunches launches only: a slot is never reused */  \
            prof_t0 = now_ns(), prof_r = g_rec[k][l_];                                         \
            if (atomicCAS(&prof_r[0], 0ull, prof_t0)) atomicMin(&prof_r[0], prof_t0);         \
            g_blocks[k] = gridDim.x;                                                           \
        }                                                                                      \
    }
#define PROF_MARK(k, i)                                                                           \
    if (threadIdx.x == 0 && prof_r) {                                                             \
        unsigned long long d_ = now_ns() - prof_t0;                                               \
        atomicAdd(&prof_r[2 + (i)], d_), atomicMax(&prof_r[2 + kMarks + (i)], d_);                \
    }
#define PROF_END(k, i)                                                                             \
    PROF_MARK(k, i);                                                                               \
    if (threadIdx.x == 0 && atomicAdd(&g_done[k], 1u) == gridDim.x - 1) {                          \
        if (prof_r) prof_r[1] = now_ns();                                                          \
        g_done[k] = 0, g_launch[k]++;                                                              \
    }
#else
#define PROF_START(k)
#define PROF_MARK(k, i)
#define PROF_END(k, i)
#endif

/* ---- the workspace's control regions --------------------------------------------- */

struct Ctl {
    uint32_t *arrive, *carrive; /* [ep], written by peers */
    int32_t *hdr;               /* [ep][2]: stride, status of each source's dispatch */
    uint32_t *routed;           /* [MAX_BLOCKS] epoch of the block's send map */
    uint32_t *epoch_d, *epoch_c;
    uint32_t *done_d, *done_c; /* blocks of a send-only launch that finished (the last one moves the epoch) */
    long long *stats; /* [4] total_recv, invalid, sent_rows, merged */
    /* invalid and merged entries a dispatch's blocks add up, one pair per epoch parity
     * (the stats get the sum once every block signalled; the same reuse as next_unit) */
    unsigned long long *pending;
    /* units handed out so far, one counter per epoch parity: a launch uses [e & 1]
     * and zeroes [(e + 1) & 1], which the previous launch used and the next one
     * will (launches on one stream never overlap), so no block has to be the last */
    unsigned long long *next_unit, *next_cunit; /* dispatch's copy units, combine's reduce units */
    uint32_t *qready; /* [M2A_FAST_QCHUNKS]: groups quantized per chunk (an overlapped quantization) */
};

__device__ Ctl ctl_of(const m2a_fast_t &f, unsigned char *ws)
{
    const int ep = f.p.ep;
    Ctl c;
    c.arrive = reinterpret_cast<uint32_t *>(ws + f.sig);
    c.carrive = c.arrive + ep;
    c.hdr = reinterpret_cast<int32_t *>(c.carrive + ep);
    c.routed = reinterpret_cast<uint32_t *>(ws + f.blocks);
    uint32_t *w = reinterpret_cast<uint32_t *>(ws + f.ctl);
    c.epoch_d = w, c.epoch_c = w + 1, c.done_d = w + 2, c.done_c = w + 3;
    c.stats = reinterpret_cast<long long *>(ws + f.ctl + M2A_FAST_CTL_STATS);
    c.next_unit = reinterpret_cast<unsigned long long *>(ws + f.ctl + M2A_FAST_CTL_STATS + 4 * 8);
    c.next_cunit = c.next_unit + 2;
    c.pending = c.next_cunit + 2;
    c.qready = reinterpret_cast<uint32_t *>(ws + f.ctl + M2A_FAST_CTL_QREADY);
    return c;
}

/* A send-only launch has no wait after which one block knows that every block read
 * the epoch: the last block to finish moves it on (the receive half reads it). */
__device__ void send_done(uint32_t *done, uint32_t *epoch, uint32_t e)
{
    if (threadIdx.x == 0 && atomicAdd(done, 1u) == gridDim.x - 1) {
        *done = 0;
        *epoch = e;
    }
}
static_assert(4 * M2A_FAST_MAX_BLOCKS <= M2A_FAST_BLOCK_BYTES, "block scratch outgrew M2A_FAST_BLOCK_BYTES");
static_assert(M2A_FAST_CTL_STATS + 4 * 8 + 4 * 8 + 4 * 8 <= M2A_FAST_CTL_QREADY &&
                  M2A_FAST_CTL_QREADY + 4 * M2A_FAST_QCHUNKS <= M2A_FAST_CTL_BYTES,
              "counters outgrew M2A_FAST_CTL_BYTES");

/* Records the first error (device record, then the host's copy) and returns false. */
__device__ bool fail(const m2a_fast_t &f, int code, int peer, int what)
{
    if (atomicCAS(&f.err->code, 0, code) == 0) {
        f.err->peer = peer, f.err->what = what;
        volatile m2a_fast_error_t *h = f.host_err;
        h->peer = peer, h->what = what;
        __threadfence_system();
        h->code = code;
    }
    return false;
}

__device__ __forceinline__ bool failed(const m2a_fast_t &f)
{
    return *reinterpret_cast<volatile int32_t *>(&f.err->code) != 0;
}

/* Developers' switch for A/B runs: a wait polls its word this many times between
 * looks at the error record and the clock. Each look is a round trip to memory after
 * the poll's (the acquire orders it), so looking at every poll doubled the time from
 * a peer's release to its being seen. */
#ifndef M2A_WAIT_LOOK_EVERY
#define M2A_WAIT_LOOK_EVERY 16
#endif

/* A rank alone: every signal word is its own GPU's (see load_acquire). */
__device__ __forceinline__ bool alone(const m2a_fast_t &f) { return f.p.ep == 1; }

/* Adds v to a signal word (a peer's, or this rank's own), releasing what this thread
 * wrote before it, and its block's writes before their barrier. */
__device__ __forceinline__ void signal_add(const m2a_fast_t &f, uint32_t *p, uint32_t v) { add_release(p, v, alone(f)); }

/* Waits until *p >= target (wrap-safe), bounded by the timeout; gives up soon (within
 * M2A_WAIT_LOOK_EVERY polls) when another thread recorded an error. */
__device__ bool wait_for(const m2a_fast_t &f, const uint32_t *p, uint32_t target, int peer, int what)
{
    const bool local = alone(f);
    if ((int32_t)(load_acquire(p, local) - target) >= 0) return true;
    const unsigned long long start = now_ns();
    for (unsigned i = 1; (int32_t)(load_acquire(p, local) - target) < 0; i++) {
        if (i % M2A_WAIT_LOOK_EVERY) continue;
        if (failed(f)) return false;
        if (now_ns() - start > f.timeout_ns) return fail(f, kErrTimeout, peer, what);
        __nanosleep(64);
    }
    return true;
}

/* ---- routing ------------------------------------------------------------------------ */

__device__ __forceinline__ bool invalid_id(const m2a_kparams_t &p, int32_t e)
{
    return e < 0 || e >= p.num_experts || e == p.invalid_id;
}

/* Developers' switch for A/B runs (run.sh VARIANTS), 1 by default: the expert -> rank
 * table copied into shared memory at the dispatch's start (bench/RESULTS.md, session 20). */
#ifndef M2A_OWNER_SMEM
#define M2A_OWNER_SMEM 1
#endif
/* Experts whose owners a dispatch keeps in shared memory (a byte each: ep <= 64). */
constexpr int kOwnerSmem = M2A_OWNER_SMEM ? 4096 : 0;

/* Expert e's rank: from the block's copy of the table in shared memory (loaded while
 * the kernel reads its epoch, so a token's ids are the one round trip to memory that
 * its count waits for), else from the workspace's table (more than kOwnerSmem experts). */
struct Owners {
    const unsigned char *smem;
    const int32_t *table;
    __device__ __forceinline__ int operator()(int32_t e) const { return smem ? smem[e] : table[e]; }
};

/* The ids j0..j0+7 of a token's row (the invalid id past k). */
struct IdBatch {
    int32_t v[8];
};
__device__ __forceinline__ IdBatch load_ids(const m2a_kparams_t &p, const int32_t *row, int j0)
{
    IdBatch e;
#pragma unroll
    for (int j = 0; j < 8; j++) e.v[j] = j0 + j < p.k ? row[j0 + j] : p.invalid_id;
    return e;
}

/* Bit r set: the token goes to rank r. Counts invalid and merged entries. The ids of a
 * batch are all loaded before any owner, and the owners before any is used: two
 * round trips to memory per 8 entries instead of two per entry (at 8 tokens on one
 * H200 the count took 3.5 us of an 11 us dispatch). head: the first batch, where the
 * caller loaded it already (have_head). */
__device__ unsigned long long token_mask(const m2a_kparams_t &p, const Owners &owner, const int32_t *ids, int t,
                                         int *inv, int *merged, IdBatch head = {}, bool have_head = false)
{
    constexpr int B = 8;
    unsigned long long mask = 0;
    const int32_t *row = ids + (size_t)t * p.k;
    for (int j0 = 0; j0 < p.k; j0 += B) {
        const IdBatch e = j0 == 0 && have_head ? head : load_ids(p, row, j0);
        int32_t o[B];
#pragma unroll
        for (int j = 0; j < B; j++) o[j] = j0 + j < p.k && !invalid_id(p, e.v[j]) ? owner(e.v[j]) : -1;
#pragma unroll
        for (int j = 0; j < B; j++) {
            if (j0 + j >= p.k) continue;
            if (o[j] < 0) {
                ++*inv;
                continue;
            }
            const unsigned long long bit = 1ull << o[j];
            *merged += (mask & bit) != 0;
            mask |= bit;
        }
    }
    return mask;
}

template <typename V> __device__ V block_sum(V v, V *scratch)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    V s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < kWarps; w++) s += scratch[w];
    return s; /* valid in thread 0 */
}

/* ---- copies --------------------------------------------------------------------------- */

/* Bytes of a row a warp copies per unit, all in flight (8 vectors per lane). On 2 x H200
 * (dispatch at 16 / 24 / 48 SMs, 4096 tokens; 128 tokens at 48 SMs): 2 KB 268.6 / 194.7 /
 * 186.8 us, 23.0 us; 4 KB 207.5 / 186.3 / 186.7 us, 22.5 us; 8 KB 196.6 / 190.2 / 190.8 us,
 * 24.1 us. */
#ifndef M2A_DISPATCH_SEG
#define M2A_DISPATCH_SEG 4096
#endif
constexpr size_t kSeg = M2A_DISPATCH_SEG;
static_assert(kSeg % 512 == 0, "a dispatch unit is whole vectors of every lane");

struct Shared {
    int base[M2A_FAST_MAX_PEERS];  /* next slot at each destination */
    int warp_count[kWarps][M2A_FAST_MAX_PEERS];
    int nd[T];                     /* destinations of each token of the piece */
    unsigned char rank[kPieceSlots];
    int row[kPieceSlots];          /* receive row (src * stride + slot) at that rank */
    unsigned long long pre[T];     /* few tokens: the block's tokens' masks, from the count */
    long long red[kWarps];
    uint32_t epoch;
    int recv_count[M2A_FAST_MAX_PEERS]; /* rows each source sent here (the receive step) */
    unsigned long long pending[2];      /* block 0: the invalid and merged entries of every block */
    unsigned char owner[kOwnerSmem > 0 ? kOwnerSmem : 1]; /* expert -> rank (Owners) */
};

/* One warp copies len bytes (a segment of a row) to nd destinations: 16-byte vectors
 * when the addresses and len allow, else 4-byte words or bytes. Four vectors in
 * flight per lane; stores to peers are posted and need not wait. */
template <bool CG = false>
__device__ void copy_row(const unsigned char *src, unsigned char *const *dst, int nd, size_t len, int lane)
{
    bool vec = ((uintptr_t)src | len) % 16 == 0;
    for (int d = 0; d < nd; d++) vec = vec && (uintptr_t)dst[d] % 16 == 0;
    if (vec) {
        constexpr int U = (int)(kSeg / 16 / 32); /* the unit's vectors per lane, all in flight */
        const int C = (int)(len / 16);
        const int4 *s4 = reinterpret_cast<const int4 *>(src);
        for (int i0 = lane; i0 < C; i0 += 32 * U) {
            int4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (i0 + 32 * u < C) v[u] = CG ? __ldcg(s4 + i0 + 32 * u) : __ldg(s4 + i0 + 32 * u);
            for (int d = 0; d < nd; d++) {
                int4 *d4 = reinterpret_cast<int4 *>(dst[d]);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (i0 + 32 * u < C) d4[i0 + 32 * u] = v[u];
            }
        }
        return;
    }
    bool words = len % 4 == 0 && (uintptr_t)src % 4 == 0;
    for (int d = 0; d < nd; d++) words = words && (uintptr_t)dst[d] % 4 == 0;
    const size_t unit = words ? 4 : 1, C = len / unit;
    for (size_t i = lane; i < C; i += 32) {
        uint32_t v = words ? (CG ? __ldcg(reinterpret_cast<const uint32_t *>(src) + i) : reinterpret_cast<const uint32_t *>(src)[i])
                           : src[i];
        for (int d = 0; d < nd; d++) {
            if (words) reinterpret_cast<uint32_t *>(dst[d])[i] = v;
            else dst[d][i] = (unsigned char)v;
        }
    }
}

/* Developers' switches for A/B runs (run.sh VARIANTS), each 1 by default: the few-token
 * dispatch's single pass over the ids; the zero-copy combine's one signal per launch
 * (bench/RESULTS.md, session 14); the few-token dispatch's gate waited for by its last
 * warp during the count (session 20). A system fence by one thread before the signals'
 * releases went in session 20: the releases are cumulative over the block's barrier, and
 * without the fence 8 / 128 / 1024 tokens took 12.50 / 13.54 / 29.90 -> 11.84 / 13.26 / 29.46 us
 * on one H200. Session 14's prefetch of the few-token units into L1 went
 * in session 20: an acquire load (the gate's) invalidates L1 (CCTL.IVALL), and without
 * the prefetch 128 tokens took 0.5 us less on one H200. The counter-fed dispatch asks for
 * a warp's next unit while it copies the current one (session 22, one H100, 4096 tokens at
 * 16 / 24 / 48 SMs: 170.8 / 126.5 / 80.9 -> 168.6 / 125.0 / 79.3 us). */
#ifndef M2A_DISPATCH_PRE
#define M2A_DISPATCH_PRE 1
#endif
#ifndef M2A_DISPATCH_EARLY_GATE
#define M2A_DISPATCH_EARLY_GATE 1
#endif
#ifndef M2A_COMBINE_ONE_SIGNAL
#define M2A_COMBINE_ONE_SIGNAL 1
#endif
#ifndef M2A_DISPATCH_NEXT_AHEAD
#define M2A_DISPATCH_NEXT_AHEAD 1
#endif

constexpr int kDst = 8;         /* destinations a warp writes per pass over a segment */
/* Up to this many tokens per block, the dispatch's units are split evenly over the warps
 * (no counter). On one H200 (bench/RESULTS.md, session 20, run 15), 48 SMs, 256 / 512 /
 * 1024 tokens: 4 per block 17.5 / 20.1 / 29.6 us, 16 per block 14.3 / 17.2 / 29.4, 32 per
 * block 14.4 / 17.2 / 26.7 (results checked, #wrong 0). Not raised yet: the test suite has
 * not run on such a build, and two GPUs may need the counter's balance across SMs that
 * the links serve unevenly (session 6: blocks ended up to 6 us apart with a static split
 * at 4096 tokens), which one GPU cannot show. */
#ifndef M2A_DISPATCH_SMALL_PER_BLOCK
#define M2A_DISPATCH_SMALL_PER_BLOCK 4
#endif
constexpr int kSmallPerBlock = M2A_DISPATCH_SMALL_PER_BLOCK;

/* The copy units: kSeg-byte segments of a token's payload rows, all byte arrays laid
 * end to end, so that a unit may span arrays. A payload quantized on dispatch carries
 * a short scale row (and NVFP4 a 4-byte global scale) next to its codes; as units of
 * their own they tripled the units of such a payload, and each unit costs a counter
 * grab and a map read. Each array starts 16-byte aligned in that concatenation, so a
 * piece of it starts 16-byte aligned in its row (16-byte copies where rows allow). */
__device__ __forceinline__ size_t span16(size_t width) { return (width + 15) / 16 * 16; }

/* How the rows of payloads sent quantized come to be: by the standalone kernels before
 * the launch (or none is quantized), by them alongside the dispatch kernel (each chunk
 * of tokens waited for, f.qrows), or inside the dispatch's copies (f.qfuse). */
enum QuantWay { kBefore, kAlongside, kInCopy };

/* Bytes of a unit. Quantizing in the copies with few tokens (up to kSmallPerBlock per
 * block), a unit is 2048 codes, one pass of the warp (quantize_piece): in 4096-code
 * units each warp made two passes one after the other while most warps had no unit.
 * On one H100, 128 / 1024 / 4096 tokens: 2048 17.8 / 40.2 / 106.7 us, 4096 19.0 / 37.5
 * / 93.8 (bench/RESULTS.md, session 21, run 11). */
#ifndef M2A_QUANT_COPY_SMALL_SEG
#define M2A_QUANT_COPY_SMALL_SEG 2048
#endif
static_assert(M2A_QUANT_COPY_SMALL_SEG % 512 == 0, "in-copy units hold whole UE8M0 scale words");
template <QuantWay Q, bool SMALL> __host__ __device__ constexpr size_t unit_bytes()
{
    return Q == kInCopy && SMALL ? (size_t)M2A_QUANT_COPY_SMALL_SEG : kSeg;
}

template <QuantWay Q, bool SMALL> __device__ uint32_t segments_per_token(const m2a_kparams_t &p)
{
    size_t bytes = 0;
    for (int a = 0; a < p.num_payloads; a++) bytes += span16(p.width[a]);
    return (uint32_t)((bytes + unit_bytes<Q, SMALL>() - 1) / unit_bytes<Q, SMALL>());
}

/* Calls piece(a, t, off, len) for each payload array a that unit u (token t = u /
 * per_token, the bytes [lo, lo + unit_bytes) of its arrays end to end) overlaps: [off,
 * off + len) the unit's bytes of the token's row of a. */
template <QuantWay Q, bool SMALL, typename Piece>
__device__ __forceinline__ void unit_pieces(const m2a_kparams_t &p, unsigned long long u, uint32_t per_token, Piece piece)
{
    const int t = (int)(u / per_token);
    const size_t lo = (size_t)(u % per_token) * unit_bytes<Q, SMALL>(), hi = lo + unit_bytes<Q, SMALL>();
    size_t start = 0; /* of array a, end to end */
    for (int a = 0; a < p.num_payloads && start < hi; start += span16(p.width[a]), a++) {
        const size_t width = p.width[a];
        if (start + width <= lo) continue;
        const size_t off = lo > start ? lo - start : 0, len = (start + width < hi ? start + width : hi) - start - off;
        piece(a, t, off, len);
    }
}

/* The largest of each lane's a[0..7] over the 16 lanes of its half-warp, transposed:
 * lane q of a half (q = lane % 16) returns that of a[q / 2]. Each butterfly step
 * trades half of the values still held, so 4 + 2 + 1 + 1 shuffles do the work of 8 x 4. */
__device__ __forceinline__ uint32_t half_max_transposed(const uint32_t *a, int lane)
{
    const bool b3 = lane & 8, b2 = lane & 4, b1 = lane & 2;
    uint32_t x[4], y[2];
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = max(b3 ? a[i + 4] : a[i], __shfl_xor_sync(0xffffffffu, b3 ? a[i] : a[i + 4], 8));
#pragma unroll
    for (int i = 0; i < 2; i++) y[i] = max(b2 ? x[i + 2] : x[i], __shfl_xor_sync(0xffffffffu, b2 ? x[i] : x[i + 2], 4));
    uint32_t z = max(b1 ? y[1] : y[0], __shfl_xor_sync(0xffffffffu, b1 ? y[0] : y[1], 2));
    return max(z, __shfl_xor_sync(0xffffffffu, z, 1));
}

/* FP8 quantized inside the copies (m2a_fast_t.qfuse): the codes [off, off + len) of a
 * token's row of array a (whole 128-value blocks; off a multiple of 512, so that UE8M0
 * scale words are whole) from its 16-bit row src (2 bytes per code), stored with their
 * row-major scales (array a + 1) at nd destinations by one warp: each token is read
 * and quantized once, whatever its destinations. The arithmetic of the standalone
 * quantize kernel (fp8_device.cuh), so the same bits. A pass is 8 16-byte vectors per
 * lane in flight, 16 blocks of 128 values (block 2u + h: vector u of half-warp h);
 * each block's amax is reduced into one lane pair (half_max_transposed), which alone
 * computes its scale (the divisions cost more than the rest of the arithmetic when
 * every lane made every scale: 4096 tokens on one H200 took 116 against 93 us without
 * them; 91 with this) and stores it, and hands the multiplier back to its 16 lanes.
 * (Loading the next pass before quantizing this one spilled registers and cost 16%:
 * bench/RESULTS.md, session 21.) */
template <moea2a_datatype_t SRC, typename Dest>
__device__ void quantize_piece(const m2a_fast_t &f, int a, const unsigned char *src, size_t off, size_t len, bool ue8m0,
                               int nd, Dest dest)
{
    const m2a_kparams_t &p = f.p;
    constexpr int U = 8;
    const int lane = threadIdx.x & 31, h = lane >> 4, C = (int)(len / 8); /* source vectors of 8 values */
    const uint4 *s4 = reinterpret_cast<const uint4 *>(src + 2 * off);
    const size_t kb0 = off / M2A_FP8_BLOCK;
    for (int v0 = 0; v0 < C; v0 += 32 * U) { /* warp-uniform: every lane shuffles */
        const int i0 = v0 + lane;
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) raw[u] = i0 + 32 * u < C ? __ldg(s4 + i0 + 32 * u) : make_uint4(0, 0, 0, 0);
        uint32_t am[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float v[8]; /* unused here: the compiler drops it */
            am[u] = m2a_fp8_unpack<SRC, 1>(&raw[u], v);
        }
        /* this lane's block: vector u = (lane % 16) / 2 of half h, the lane pair's */
        const uint32_t bam = half_max_transposed(am, lane);
        const bool blive = v0 + 32 * ((lane & 15) >> 1) + 16 * h < C;
        float bmul; /* 0 for a non-finite block (finite ones get at least 448 / FLT_MAX) */
        const uint32_t sc = m2a_fp8_scale(__uint_as_float(bam), bam < 0x7f800000u, ue8m0, &bmul);
        uint2 code[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const float mul = __shfl_sync(0xffffffffu, bmul, 16 * h + 2 * u);
            float v[8];
            m2a_fp8_unpack<SRC, 1>(&raw[u], v);
            uint32_t w[2];
            m2a_fp8_encode<8>(v, mul, mul != 0.0f, w);
            code[u] = make_uint2(w[0], w[1]);
        }
        /* UE8M0: blocks 4j..4j+3 of the pass (lanes 4j, 16 + 4j, 4j + 2, 18 + 4j) make word j,
         * packed by lane 4j; bytes of blocks past the row's end 0 */
        uint32_t word = 0;
        if (ue8m0) {
            const int from[4] = {0, 16, 2, 18};
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const uint32_t byte = __shfl_sync(0xffffffffu, sc, (lane + from[b]) & 31);
                if (v0 + 64 * (lane >> 2) + 16 * b < C) word |= byte << (8 * b);
            }
        }
        const size_t kb = kb0 + (size_t)(v0 / 16); /* the pass's first block */
        for (int d = 0; d < nd; d++) {
            int rank;
            size_t row;
            dest(d, &rank, &row);
            unsigned char *base = f.peer[rank];
            uint2 *dc = reinterpret_cast<uint2 *>(base + p.ws_off[a] + row * p.width[a] + off);
            uint32_t *ds = reinterpret_cast<uint32_t *>(base + p.ws_off[a + 1] + row * p.width[a + 1]);
#pragma unroll
            for (int u = 0; u < U; u++)
                if (i0 + 32 * u < C) dc[i0 + 32 * u] = code[u];
            if (ue8m0) {
                if (lane < 16 && (lane & 3) == 0 && v0 + 64 * (lane >> 2) < C) ds[kb / 4 + (lane >> 2)] = word;
            } else if ((lane & 1) == 0 && blive) {
                ds[kb + 2 * ((lane & 15) >> 1) + h] = sc;
            }
        }
    }
}

/* Copies unit u to the token's nd destinations, kDst at a time; dest(d, &rank, &row)
 * gives destination d's rank and receive row. One warp, warp-uniform arguments.
 * kAlongside: loads through L2 only (the source rows are being written while the kernel
 * runs: the read-only path may keep a stale line of a neighbour's scales). kInCopy: the
 * arrays of f.qfuse are quantized here (quantize_piece), their scale arrays written with
 * them. */
template <QuantWay Q, bool SMALL, typename Dest>
__device__ void copy_unit(const m2a_fast_t &f, const m2a_kpayloads_t &pay, unsigned long long u, uint32_t per_token,
                          int nd, Dest dest)
{
    const m2a_kparams_t &p = f.p;
    constexpr bool FUSE = Q == kInCopy;
    unit_pieces<Q, SMALL>(p, u, per_token, [&](int a, int t, size_t off, size_t len) {
        const size_t width = p.width[a];
        if (FUSE && ((f.qfuse >> a) & 1)) {
            const unsigned char *src = static_cast<const unsigned char *>(pay.p[a]) + (size_t)t * 2 * width;
            const bool ue8m0 = (f.qfuse_ue8m0 >> a) & 1;
            if ((f.qfuse_f16 >> a) & 1) quantize_piece<MOEA2A_FLOAT16>(f, a, src, off, len, ue8m0, nd, dest);
            else quantize_piece<MOEA2A_BFLOAT16>(f, a, src, off, len, ue8m0, nd, dest);
            return;
        }
        if (FUSE && a > 0 && ((f.qfuse >> (a - 1)) & 1)) return; /* scales: written with their codes */
        const unsigned char *src_row = static_cast<const unsigned char *>(pay.p[a]) + (size_t)t * width;
        for (int d0 = 0; d0 < nd; d0 += kDst) {
            unsigned char *dst[kDst];
            const int m = nd - d0 < kDst ? nd - d0 : kDst;
            for (int d = 0; d < m; d++) {
                int rank;
                size_t row;
                dest(d0 + d, &rank, &row);
                dst[d] = f.peer[rank] + p.ws_off[a] + row * width + off;
            }
            copy_row<Q == kAlongside>(src_row + off, dst, m, len, threadIdx.x & 31);
        }
    });
}

/* The first of this warp's share of total units, split evenly over every warp of the
 * grid (the next warp's first ends the share). */
__device__ long long warp_share(long long total, long long gw)
{
    return total * gw / ((long long)gridDim.x * kWarps);
}

/* The payload rows, in units of (token, kSeg segment of its rows end to end) that warps
 * take from a counter: an SM that the links serve faster takes more units, so all
 * blocks end at about the same time (a static split left the links idle while the
 * slowest blocks finished), and a few tokens still spread over every SM. A token's
 * slots come from its send map, written by the block that routed it. Q: how payloads
 * sent quantized become their rows (QuantWay). */
template <QuantWay Q>
__device__ bool copy_payloads(const m2a_fast_t &f, unsigned long long *next, const Ctl &c, const m2a_kpayloads_t &pay,
                              int n, int stride, const int32_t *send_map, uint32_t e, int G)
{
    const m2a_kparams_t &p = f.p;
    const int lane = threadIdx.x & 31, D = p.k < p.ep ? p.k : p.ep;
    const uint32_t per_token = segments_per_token<Q, false>(p);
    const unsigned long long units = (unsigned long long)n * per_token;
    int ready = -1;  /* the last block whose send map this warp saw complete */
    int quantized = -1; /* kAlongside: the last chunk this warp saw quantized */
    /* the warp's next unit, asked for while it copies the current one: one round trip to
     * the counter less per unit (M2A_DISPATCH_NEXT_AHEAD) */
    unsigned long long ahead = 0;
    if (M2A_DISPATCH_NEXT_AHEAD && lane == 0) ahead = atomicAdd(next, 1ull);
    for (;;) {
        unsigned long long u = 0;
        if (lane == 0) u = M2A_DISPATCH_NEXT_AHEAD ? ahead : atomicAdd(next, 1ull);
        u = __shfl_sync(0xffffffffu, u, 0);
        if (u >= units) return true;
        if (M2A_DISPATCH_NEXT_AHEAD && lane == 0) ahead = atomicAdd(next, 1ull);
        const int t = (int)(u / per_token);
        const int owner = (int)(((long long)(t + 1) * G - 1) / n); /* the block whose chunk holds t */
        if (owner != ready) {
            bool ok = true;
            if (lane == 0) ok = wait_for(f, &c.routed[owner], e, p.me, M2A_FAST_AT_PREFIX);
            if (!__shfl_sync(0xffffffffu, ok, 0)) return false;
            ready = owner;
        }
        if (Q == kAlongside && t / f.qrows != quantized) {
            const int q = t / f.qrows, rows = n - q * f.qrows < f.qrows ? n - q * f.qrows : f.qrows;
            bool ok = true;
            if (lane == 0) ok = wait_for(f, c.qready + q, (uint32_t)rows * f.qgroups, p.me, M2A_FAST_AT_QUANTIZE);
            if (!__shfl_sync(0xffffffffu, ok, 0)) return false;
            quantized = q;
        }
        __syncwarp();
        /* the token's (rank, slot) codes, ascending by rank, then -1: D <= 64 */
        const int32_t *map = send_map + (size_t)t * p.k;
        const int32_t lo = lane < D ? __ldcg(map + lane) : -1, hi = lane + 32 < D ? __ldcg(map + lane + 32) : -1;
        const int nd = __popc(__ballot_sync(0xffffffffu, lo >= 0)) + __popc(__ballot_sync(0xffffffffu, hi >= 0));
        copy_unit<Q, false>(f, pay, u, per_token, nd, [&](int d, int *rank, size_t *row) {
            const int32_t cd = d < 32 ? __shfl_sync(0xffffffffu, lo, d) : __shfl_sync(0xffffffffu, hi, d - 32);
            *rank = cd / p.cap, *row = (size_t)p.me * stride + cd % p.cap;
        });
    }
}

/* ids (sanitized for each destination), weights and the source index of the piece's
 * tokens tl0..tl1-1 (indices in the piece that starts at token first). */
__device__ void copy_small(const m2a_fast_t &f, const Shared &s, const Owners &owner, int D, int first, int tl0, int tl1,
                           const int32_t *ids, const float *weights)
{
    const m2a_kparams_t &p = f.p;
    const int k = p.k, P = p.num_payloads;
    const size_t ids_off = p.ws_off[P], src_off = p.ws_off[p.narrays - 1], w_off = p.weights ? p.ws_off[P + 1] : 0;
    const int items = (tl1 - tl0) * D * k; /* piece x D <= kPieceSlots, k <= 1024 */
    for (int i = threadIdx.x; i < items; i += T) {
        const int tl = tl0 + i / (D * k), d = i / k % D, j = i % k;
        if (d >= s.nd[tl]) continue;
        int slot = tl * D + d, rank = s.rank[slot], t = first + tl;
        unsigned char *base = f.peer[rank];
        size_t row = (size_t)s.row[slot];
        int32_t e = ids[(size_t)t * k + j];
        if (f.sanitize && (invalid_id(p, e) || (f.rewrite && owner(e) != rank))) e = p.invalid_id;
        reinterpret_cast<int32_t *>(base + ids_off)[row * k + j] = e;
        if (p.weights) reinterpret_cast<float *>(base + w_off)[row * k + j] = weights[(size_t)t * k + j];
        if (j == 0) reinterpret_cast<int32_t *>(base + src_off)[row] = t;
    }
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* Routes the piece [first, first + ntok) from the slots in s.base (each destination's
 * next slot, updated past the piece): every token's destinations and receive rows into
 * s.nd / s.rank / s.row (src * stride + slot); for the tokens in [own_lo, own_hi) the
 * send map, and their invalid and merged entries counted into *inv, *merged; pre: the
 * piece's masks, computed (and those entries counted) already, or NULL. */
__device__ void route_piece(const m2a_fast_t &f, Shared &s, const Owners &owner, const int32_t *ids, int first,
                            int ntok, int stride, int32_t *send_map, int own_lo, int own_hi, int *inv, int *merged,
                            const unsigned long long *pre)
{
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, tid = threadIdx.x, lane = tid & 31, warp = tid / 32, D = p.k < ep ? p.k : ep;
    const int t = first + tid;
    const bool own = tid < ntok && t >= own_lo && t < own_hi;
    int dummy = 0;
    unsigned long long m = 0;
    if (tid < ntok) m = pre ? pre[tid] : token_mask(p, owner, ids, t, own ? inv : &dummy, own ? merged : &dummy);
    for (int r = 0; r < ep; r++) {
        unsigned bal = __ballot_sync(0xffffffffu, (m >> r) & 1);
        if (lane == 0) s.warp_count[warp][r] = __popc(bal);
    }
    __syncthreads();
    if (tid < ntok) { /* warp prefixes here; lane prefixes below, with the whole warp */
        int nd = 0;
        for (int r = 0; r < ep; r++) {
            if (!((m >> r) & 1)) continue;
            int slot = s.base[r];
            for (int w = 0; w < warp; w++) slot += s.warp_count[w][r];
            s.rank[tid * D + nd] = (unsigned char)r;
            s.row[tid * D + nd] = slot; /* lane prefix added below */
            nd++;
        }
        s.nd[tid] = nd;
    }
    for (int r = 0, d = 0; r < ep; r++) {
        unsigned bal = __ballot_sync(0xffffffffu, (m >> r) & 1);
        if ((m >> r) & 1) {
            s.row[tid * D + d] += __popc(bal & ((1u << lane) - 1));
            d++;
        }
    }
    __syncthreads();
    if (tid < ntok) {
        int32_t *map = send_map + (size_t)t * p.k;
        const int nd = s.nd[tid];
        for (int d = 0; d < nd; d++) {
            const int slot = s.row[tid * D + d];
            if (own) map[d] = s.rank[tid * D + d] * p.cap + slot;
            s.row[tid * D + d] = p.me * stride + slot;
        }
        if (own)
            for (int d = nd; d < p.k; d++) map[d] = -1;
    }
    __syncthreads();
    if (tid < ep) /* the next piece starts after this one's tokens */
        for (int w = 0; w < kWarps; w++) s.base[tid] += s.warp_count[w][tid];
}

/* Copies the units [u0, u1) (token-major, per_token per token) of the routed piece
 * that starts at token first: one warp, slots from shared memory. */
template <QuantWay Q>
__device__ void copy_units(const m2a_fast_t &f, const Shared &s, const m2a_kpayloads_t &pay, long long u0, long long u1,
                           uint32_t per_token, int first)
{
    const int D = f.p.k < f.p.ep ? f.p.k : f.p.ep;
    for (long long u = u0; u < u1; u++) {
        const int tl = (int)(u / per_token) - first;
        copy_unit<Q, true>(f, pay, (unsigned long long)u, per_token, s.nd[tl], [&](int d, int *rank, size_t *row) {
            *rank = s.rank[tl * D + d], *row = (size_t)s.row[tl * D + d];
        });
    }
}

/* The receive half's finish of one FP8 payload quantized on dispatch (m2a_fast_t.qfin),
 * once every source's rows arrived (ok: their counts are in recv_count; else every row
 * is padding): its padding rows' scales (`words` per row) 0, then, where mn is not
 * NULL, the MN-major copy, [src][word][r] with row r's word and 0 past the source's
 * count and the stride. The in-copy kernels only (the others leave it to the separate
 * kernel of m2a_cuda_wire_finish: folded into them it spilled the few-token kernel,
 * which is at its register bound). Not inlined, and given scalars. */
__device__ __noinline__ void finish_fp8(uint32_t *rows, uint32_t *mn, size_t words, int ep, int stride,
                                        const int *recv_count, bool ok)
{
    const size_t slots = (size_t)ep * stride, first = (size_t)blockIdx.x * T + threadIdx.x, step = (size_t)gridDim.x * T;
    for (size_t slot = first; slot < slots; slot += step)
        if (!ok || (int)(slot % stride) >= recv_count[slot / stride])
            for (size_t w = 0; w < words; w++) rows[slot * words + w] = 0;
    if (mn) m2a_wire_mn(rows, mn, words, ep, stride, [&](int src) { return ok ? recv_count[src] : 0; }, first, step);
}

/* The tokens a dispatch block routes, [lo, hi), and those it owns (send map, ids,
 * stats), [own_lo, own_hi); step 1 counts [0, top). Few tokens: the blocks split the
 * n x S units evenly over every warp of the grid, and route the tokens of their units. */
struct BlockRange {
    int lo, hi, own_lo, own_hi, top;
};
template <bool SMALL> __device__ __forceinline__ BlockRange block_range(int n, uint32_t S, int b, int G)
{
    BlockRange r;
    if (SMALL) { /* the shares of this block's first warp and of the next block's */
        const long long u0 = warp_share((long long)n * S, (long long)b * kWarps), u1 = warp_share((long long)n * S, (long long)(b + 1) * kWarps);
        r.lo = (int)(u0 / S), r.hi = u1 > u0 ? (int)((u1 - 1) / S) + 1 : r.lo;
        r.own_lo = (int)((u0 + S - 1) / S), r.own_hi = (int)((u1 + S - 1) / S);
    } else {
        r.lo = r.own_lo = (int)((long long)n * b / G), r.hi = r.own_hi = (int)((long long)n * (b + 1) / G);
    }
    r.top = M2A_DISPATCH_PRE && SMALL && r.hi - r.lo <= T ? r.hi : r.lo;
    return r;
}

/* Two ways to the same slots and the same bytes (a rank picks by its own n; the
 * receiving side cannot tell them apart). Both begin alike: every block counts the
 * tokens before its own range itself (replicated, no wait on other blocks).
 *  - few tokens (up to kSmallPerBlock per block): each block routes its range and
 *    copies its share of (token, segment) units, split evenly over all warps of the
 *    grid: rows start moving a few microseconds into the kernel;
 *  - many tokens: a send map per chunk, and the units handed out by a counter
 *    (balance across SMs that the links serve unevenly matters more than the set-up
 *    then).
 * phases: M2A_FAST_SEND (steps 1-5), M2A_FAST_RECV (6) or both. A send-only launch
 * moves the epoch on when its last block ends; the receive-only launch that follows it
 * on the stream uses that epoch. */
template <bool SMALL, QuantWay Q = kBefore>
__global__ void __launch_bounds__(T, 1) dispatch_kernel(m2a_fast_t f, int n, int stride, int status, m2a_kpayloads_t pay, const int32_t *__restrict__ ids,
                                                        const float *__restrict__ weights, int phases)
{
    __shared__ Shared s;
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, me = p.me, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    unsigned char *ws = f.peer[me];
    const Ctl c = ctl_of(f, ws);
    const bool send = (phases & M2A_FAST_SEND) != 0;
    /* ok: this block may go on; made uniform by __syncthreads_and at each step */
    bool ok = !failed(f);
    if (tid == 0) s.epoch = *reinterpret_cast<volatile uint32_t *>(c.epoch_d) + (send ? 1 : 0);
    if (tid < ep) s.base[tid] = 0;
    const Owners owner = {send && p.num_experts <= kOwnerSmem ? s.owner : nullptr, p.owner};
    if (owner.smem)
        for (int i = tid; i < p.num_experts; i += T) s.owner[i] = (unsigned char)p.owner[i];
    /* few tokens: the first ids this thread counts in step 1, loaded before the barrier
     * (the range needs no epoch), so that their round trip overlaps the epoch's and the
     * table's. The many-token and in-copy kernels work out their range after it, as
     * before: their registers are spoken for. */
    constexpr bool kHead = SMALL && Q != kInCopy;
    uint32_t per_token = 0, S = 1;
    BlockRange range = {};
    IdBatch head = {};
    const auto ranges = [&] {
        if (status || !send) n = 0;
        per_token = segments_per_token<Q, SMALL>(p), S = per_token ? per_token : 1;
        range = block_range<SMALL>(n, S, b, G);
    };
    if constexpr (kHead) {
        ranges();
        if (warp * 32 + lane < range.top) head = load_ids(p, ids + (size_t)(warp * 32 + lane) * p.k, 0);
    }
    __syncthreads();
    const uint32_t e = s.epoch;
    PROF_START(0);
    if (send) {
        if (b == 0 && tid == 0) c.next_unit[(e + 1) & 1] = 0; /* before this block's signal, which every block waits for */
        if constexpr (!kHead) ranges();
        const bool small = SMALL; /* n <= kSmallPerBlock * G, decided at launch (two kernels, each
                                   * compiled for its own way, leave the other's code out) */
        const int D = p.k < ep ? p.k : ep, piece = kPieceSlots / D < T ? kPieceSlots / D : T;
        int32_t *send_map = reinterpret_cast<int32_t *>(ws + f.send_map);
        const int lo = range.lo, hi = range.hi, own_lo = range.own_lo, own_hi = range.own_hi, top = range.top;
        const long long gw = (long long)b * kWarps + warp; /* small: this warp's units [wu0, wu1) */
        const long long wu0 = warp_share((long long)n * S, gw), wu1 = warp_share((long long)n * S, gw + 1);
        /* few tokens: step 2 (the gate) by the last warp, which has no tokens to count
         * below unless the block's range reaches past T - 32, while the others count,
         * instead of a round trip to memory after the count */
        const bool early_gate = M2A_DISPATCH_EARLY_GATE && small;
        if (early_gate && warp == kWarps - 1 && e > 1)
            for (int r = lane; r < ep && ok; r += 32) ok = wait_for(f, &c.carrive[r], (e - 1) * (uint32_t)G, r, M2A_FAST_AT_GATE);

        /* 1. the slots before this block's range, at every destination: every block counts
         * the tokens [0, lo) itself (a warp takes 32 at a time). Replicated, but no block
         * waits for another, and the copies take tokens in order: the first chunks, whose
         * counting is shortest, are needed first. Few tokens: the block's own [lo, hi)
         * in the same pass (their masks kept for the routing, their invalid and merged
         * entries counted), so that their ids are not read a second time after it. */
        int inv = 0, merged = 0;
        {
            int cnt_lo = 0, cnt_hi = 0;
            for (int t0 = warp * 32; t0 < top; t0 += T) {
                const int t = t0 + lane;
                const bool mine = t >= lo && t < top, owned = mine && t >= own_lo && t < own_hi;
                int ti = 0, tm = 0; /* kept in registers: a pointer chosen per token would put the counts in memory */
                unsigned long long m = t < top ? token_mask(p, owner, ids, t, &ti, &tm, head, kHead && t0 == warp * 32) : 0;
                if (owned) inv += ti, merged += tm;
                if (mine) s.pre[t - lo] = m, m = 0; /* the block's own: not before its range */
                for (int r = 0; r < ep; r++) {
                    const int cr = __popc(__ballot_sync(0xffffffffu, (m >> r) & 1));
                    if (lane == (r & 31)) (r < 32 ? cnt_lo : cnt_hi) += cr;
                }
            }
            if (lane < ep) s.warp_count[warp][lane] = cnt_lo;
            if (lane + 32 < ep) s.warp_count[warp][lane + 32] = cnt_hi;
            __syncthreads();
            if (tid < ep)
                for (int w = 0; w < kWarps; w++) s.base[tid] += s.warp_count[w][tid];
            PROF_MARK(0, 0);
        }
        /* 2. every destination's previous combine began */
        if (!early_gate && tid < ep && e > 1 && ok) ok = wait_for(f, &c.carrive[tid], (e - 1) * (uint32_t)G, tid, M2A_FAST_AT_GATE);
        ok = __syncthreads_and(ok);
        PROF_MARK(0, 1);

        /* 3. route (and, small, copy) a piece of tokens at a time */
        for (int first = lo; first < hi && ok; first += piece) {
            const int ntok = hi - first < piece ? hi - first : piece;
            route_piece(f, s, owner, ids, first, ntok, stride, send_map, own_lo, own_hi, &inv, &merged,
                        top == hi ? s.pre + (first - lo) : nullptr);
            if (!small && first + ntok == hi && tid == 0) { /* 4. the chunk's send map is complete */
                __threadfence();
                atomicExch(&c.routed[b], e);
            }
            const int c0 = first > own_lo ? first : own_lo, c1 = first + ntok < own_hi ? first + ntok : own_hi;
            if (c1 > c0) copy_small(f, s, owner, D, first, c0 - first, c1 - first, ids, weights);
            if (small && per_token) {
                const long long p0 = (long long)first * S, p1 = (long long)(first + ntok) * S;
                copy_units<Q>(f, s, pay, wu0 > p0 ? wu0 : p0, wu1 < p1 ? wu1 : p1, per_token, first);
            }
            __syncthreads();
        }
        if (!small) { /* any warp may now copy the rows of tokens whose chunk is routed */
            if (tid == 0 && ok && lo == hi) atomicExch(&c.routed[b], e); /* an empty chunk */
            PROF_MARK(0, 2);
            if (ok) ok = copy_payloads<Q>(f, c.next_unit + (e & 1), c, pay, n, stride, send_map, e, G);
        }
        const long long inv_sum = block_sum<long long>(inv, s.red), merged_sum = block_sum<long long>(merged, s.red);
        if (tid == 0 && ok) { /* before the signal: the stats take the sum once every block signalled */
            atomicAdd(&c.pending[2 * (e & 1)], (unsigned long long)inv_sum);
            atomicAdd(&c.pending[2 * (e & 1) + 1], (unsigned long long)merged_sum);
        }
        ok = __syncthreads_and(ok);
        PROF_MARK(0, 3);
        /* 5. counts and headers (last block: its bases are the totals), then the signal */
        if (b == G - 1 && tid < ep) {
            unsigned char *peer = f.peer[tid];
            const Ctl pc = ctl_of(f, peer);
            reinterpret_cast<int32_t *>(peer + f.recv_counts)[me] = ok ? s.base[tid] : 0;
            pc.hdr[2 * me] = stride, pc.hdr[2 * me + 1] = status;
        }
        if (b == G - 1 && tid == 0) {
            long long sent = 0;
            for (int r = 0; r < ep; r++) sent += s.base[r];
            c.stats[2] = sent;
        }
        /* the release is cumulative: the block's rows, ordered before it by the barrier
         * after the copies, are visible to a peer that acquires the count (the pattern of
         * cooperative groups' grid sync: bar.sync, then one thread's fence and atomic;
         * red.release is that fence and atomic) */
        if (tid < ep && ok && !(phases & M2A_FAST_QUIET)) /* a failed block stays silent */
            signal_add(f, &ctl_of(f, f.peer[tid]).arrive[me], 1);
        PROF_MARK(0, 4);
    }
    if (!(phases & M2A_FAST_RECV)) {
        send_done(c.done_d, c.epoch_d, e);
        return;
    }

    /* 6. every source's rows arrived: check its header, then sanitize padding. The
     * source's count is read with its header (one round trip after the arrival, not
     * two) and kept in shared memory for the sanitize and the stats. */
    const int32_t *counts = reinterpret_cast<const int32_t *>(ws + f.recv_counts);
    if (tid < ep && ok) {
        ok = wait_for(f, &c.arrive[tid], e * (uint32_t)G, tid, M2A_FAST_AT_ARRIVE);
        if (ok) {
            const int32_t st = *reinterpret_cast<volatile int32_t *>(&c.hdr[2 * tid + 1]);
            const int32_t sr = *reinterpret_cast<volatile int32_t *>(&c.hdr[2 * tid]);
            s.recv_count[tid] = *reinterpret_cast<const volatile int32_t *>(&counts[tid]);
            if (b == 0 && tid == me) /* every block of this rank added its sums before its signal */
                for (int i = 0; i < 2; i++)
                    s.pending[i] = *reinterpret_cast<volatile unsigned long long *>(&c.pending[2 * (e & 1) + i]);
            if (st) ok = fail(f, st, tid, M2A_FAST_AT_HEADER);
            else if (sr != stride) ok = fail(f, kErrMismatch, tid, M2A_FAST_AT_HEADER);
        }
    }
    ok = __syncthreads_and(ok);
    PROF_MARK(0, 5);
    int32_t *rids = reinterpret_cast<int32_t *>(ws + p.ws_off[p.num_payloads]);
    int32_t *src_index = reinterpret_cast<int32_t *>(ws + p.ws_off[p.narrays - 1]);
    const size_t slots = (size_t)ep * stride;
    for (size_t slot = (size_t)b * T + tid; slot < slots; slot += (size_t)G * T) {
        int src = (int)(slot / stride), i = (int)(slot % stride);
        if (ok && i < s.recv_count[src]) continue;
        src_index[slot] = -1;
        if (f.sanitize)
            for (int j = 0; j < p.k; j++) rids[slot * p.k + j] = p.invalid_id;
    }
    for (int q = 0; Q == kInCopy && q < f.nqfin; q++) /* one launch for the whole FP8 dispatch */
        finish_fp8(reinterpret_cast<uint32_t *>(ws + p.ws_off[f.qfin[q].arr]),
                   f.qfin[q].mn ? reinterpret_cast<uint32_t *>(ws + f.qfin[q].mn) : nullptr, p.width[f.qfin[q].arr] / 4,
                   ep, stride, s.recv_count, ok);

    /* stats, and the epoch moves on: every block of this rank signalled (block 0 waited
     * for them), so each read the epoch and added its sums already; the other parity's
     * sums start over for the next dispatch (after a failure nothing is waited for,
     * but the context is then poisoned for good) */
    if (b == 0 && tid == 0) {
        long long recv = 0;
        for (int r = 0; r < ep; r++) recv += ok ? s.recv_count[r] : *reinterpret_cast<const volatile int32_t *>(&counts[r]);
        c.stats[0] = recv;
        for (int i = 0; i < 2; i++)
            c.stats[1 + 2 * i] = (long long)(ok ? s.pending[i] : *reinterpret_cast<volatile unsigned long long *>(&c.pending[2 * (e & 1) + i]));
        c.pending[2 * ((e + 1) & 1)] = c.pending[2 * ((e + 1) & 1) + 1] = 0;
        if (send) *c.epoch_d = e;
    }
    PROF_END(0, 6);
}

/* The send half's signal alone (M2A_FAST_QUIET; the host copied the rows): what each
 * block of a send half adds, all at once. */
__global__ void signal_kernel(m2a_fast_t f, uint32_t blocks)
{
    if ((int)threadIdx.x < f.p.ep) signal_add(f, &ctl_of(f, f.peer[threadIdx.x]).arrive[f.p.me], blocks);
}

/* ---- combine ---------------------------------------------------------------------------- */

/* A value of DT at a time (Elem), 16-byte vectors rounded by the pair instruction (pack_vec):
 * elem.cuh, shared with the other kernels. */
using m2a_elem::Elem;
using m2a_elem::pack_vec;

/* acc[v] += value v of a 16-byte vector of DT (16 / size of them). bf16 words split by a
 * shift and a mask (one instruction each, where the element-wise get takes two). */
template <moea2a_datatype_t DT> __device__ __forceinline__ void add_vec(float *acc, const int4 &r)
{
    if constexpr (DT == MOEA2A_BFLOAT16) {
        const uint32_t w[4] = {(uint32_t)r.x, (uint32_t)r.y, (uint32_t)r.z, (uint32_t)r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[2 * i] += __uint_as_float(w[i] << 16);
            acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int v = 0; v < (int)(16 / Elem<DT>::size); v++) acc[v] += Elem<DT>::load(reinterpret_cast<const unsigned char *>(&r), v);
    }
}

constexpr size_t kSegC = 1024; /* bytes of an output row a warp reduces per unit: 2 vectors per lane */
/* Up to kEvenUnitsPerWarp units of kSegEven bytes per warp: larger units, split evenly,
 * 4 vectors per lane of 2 rows at a time (bench/RESULTS.md, session 20: on one H200,
 * 48 SMs, the counter's 1 KB loads took 16.4 / 23.0 / 42.0 us at 256 / 512 / 1024 tokens,
 * this one 11.4 / 15.2 / 27.8). Past the bound the bulk-copy way takes over, whose
 * counter also balances the SMs that the links serve unevenly. Since that way's loop lost
 * half its instructions (session 22, one H100, combine us at 256 / 512 / 1024 tokens),
 * a bound of 8 beats 16 where more units per warp would follow: 48 SMs 10.2 / 13.5 /
 * 21.3 against 10.1 / 12.9 / 24.2, 16 SMs 14.4 / 20.3 / 34.0 against 14.4 / 23.6 / 34.0;
 * 4 and 2 lose at 256-512 tokens (48 SMs 512 tokens 14.6, 24 SMs 256 tokens 14.3). */
constexpr size_t kSegEven = 2048;
#ifndef M2A_COMBINE_EVEN_UNITS
#define M2A_COMBINE_EVEN_UNITS 8
#endif
constexpr int kEvenUnitsPerWarp = M2A_COMBINE_EVEN_UNITS;

/* Row d of a token, held by lane d (row_lo) or lane d - 32 (row_hi). */
__device__ __forceinline__ const unsigned char *row_of(const unsigned char *row_lo, const unsigned char *row_hi, int d)
{
    return d < 32 ? reinterpret_cast<const unsigned char *>(__shfl_sync(0xffffffffu, (unsigned long long)row_lo, d))
                  : reinterpret_cast<const unsigned char *>(__shfl_sync(0xffffffffu, (unsigned long long)row_hi, d - 32));
}

/* One warp: out bytes [off, off + len) = the sum of the token's nd rows (those bytes),
 * from 0.0f in ascending rank order, rounded once: the host reference's arithmetic.
 * Every row's vectors are loaded before any is added (up to R rows at a time, U
 * vectors per lane: len <= U x 512): NVLink reads have long latency and need many in
 * flight. */
template <moea2a_datatype_t DT, int U = (int)(kSegC / 16 / 32), int R = 4>
__device__ void reduce_unit(const unsigned char *row_lo, const unsigned char *row_hi, int nd, size_t off, size_t len,
                            unsigned char *out, bool vec)
{
    const int lane = threadIdx.x & 31;
    if (vec) {
        constexpr int V = (int)(16 / Elem<DT>::size);
        const int C = (int)(len / 16);
        int4 r[U][R];
        float acc[U][V];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int v = 0; v < V; v++) acc[u][v] = 0.0f;
        for (int d0 = 0; d0 < nd; d0 += R) {
#pragma unroll
            for (int d = 0; d < R; d++) {
                const unsigned char *src = d0 + d < nd ? row_of(row_lo, row_hi, d0 + d) + off : nullptr;
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (src && lane + 32 * u < C) r[u][d] = reinterpret_cast<const int4 *>(src)[lane + 32 * u];
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int d = 0; d < R; d++)
                    if (d0 + d < nd)
                        add_vec<DT>(acc[u], r[u][d]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (lane + 32 * u < C) reinterpret_cast<int4 *>(out + off)[lane + 32 * u] = pack_vec<DT>(acc[u]);
        return;
    }
    const int h0 = (int)(off / Elem<DT>::size), h1 = (int)((off + len) / Elem<DT>::size);
    for (int h = h0; h < h1; h += 32) { /* warp-uniform trips: every lane reaches the shuffles */
        float acc = 0.0f;
        for (int d = 0; d < nd; d++) {
            const unsigned char *src = row_of(row_lo, row_hi, d);
            if (h + lane < h1) acc += Elem<DT>::load(src, h + lane);
        }
        if (h + lane < h1) Elem<DT>::store(out, h + lane, acc);
    }
}

/* Consecutive units a warp takes per grab of the combine's counter, mostly one
 * token's, so that the token's map is read once for them. Fewer SMs keep fewer reads
 * in flight and lose more to the counter's round trip and those reads (best at 4096
 * tokens on 4 x H200: 2 units at 48 SMs, 4 at 24, 6-7 at 16); more blocks balance
 * better with 1, and few tokens need every warp busy: at least two grabs per warp. */
__device__ unsigned units_per_grab(unsigned long long units, int G)
{
    const unsigned long long per_warp = units / (2ull * G * kWarps);
    unsigned take = 96u / (unsigned)G;
    if (take > 8u) take = 8u;
    if (take > per_warp) take = (unsigned)per_warp;
    return take ? take : 1u;
}

/* ---- the combine's reduce through the bulk copy engine (sm_90+) ------------------------
 * With few SMs, 16-byte loads cannot keep enough reads in flight to fill NVLink (154
 * GB/s per GPU from 16 SMs on 2 x H200), while bulk copies issued by one lane reach
 * the load ceiling from the same SMs. A unit is tma_seg(D) bytes of a token's output
 * row; its rows (one per source rank, D <= kTmaRows of them) land in a stage of the
 * warp's shared memory, an mbarrier counts their bytes, and the warp reduces them from
 * there in the same order as reduce_unit (ascending rank, fp32 from 0, rounded once):
 * the same bits. Each warp keeps as many stages in flight as kTmaWarpBytes holds, at
 * most kTmaMaxStages, and loads the next unit's map while it waits for a stage.
 * What a unit costs apart from its bytes (the counter, the map, the barrier) decides
 * the time at few SMs, so units are as large as two stages allow. On 2 x H200 at 4096
 * tokens (2 rows per unit; 16 / 24 SMs), before the loop lost half its instructions
 * (session 22): 3 stages of 2 KB 365 / 252 us; 2 of 1 KB 465 / 319; 4 of 1 KB 474 / 325;
 * 6 of 1 KB 516 / 355; 16-byte loads 513 / 359; copying this rank's own row with the
 * lanes (cp.async) instead of the bulk engine, 4 of 1 KB, 525 / 360. On one H100 (1 row
 * per unit, 16 / 24 / 32 / 48 SMs, after it): 2 KB units 174 / 123 / 97 / 72 us, 4 KB
 * 157 / 104 / 86 / 64. With 2 and 4 rows per unit (bench/device/combine_check.cu, the
 * peers' rows in one H100's memory, 4096 tokens, 16 / 24 / 48 SMs), units in 512-byte
 * steps rather than halvings and 14 KB per warp rather than 12: 2 rows (3 stages of 2 KB
 * -> 2 of 3.5 KB) 144 / 104 / 70 -> 117 / 83 / 72 us; 4 rows (3 of 1 KB -> 2 of 1.5 KB)
 * 246 / 175 / 108 -> 211 / 150 / 100. */
#ifndef M2A_TMA_SEG
#define M2A_TMA_SEG 4096
#endif
/* 16 warps of 14 KB (two rows per unit) and the kernels' static shared memory (2.7 KB)
 * take all but 384 bytes of the 227 KB a block may have on sm_90: a launch that needed
 * more would be refused it (M2A_FAST_BULK_SMEM) and every combine would take the loads
 * way: moea2a_moe_create warns, and bench/device/combine_check.cu fails. */
#ifndef M2A_TMA_WARP_BYTES
#define M2A_TMA_WARP_BYTES 14336
#endif
constexpr int kTmaRows = 4, kTmaMaxStages = 4;
constexpr size_t kTmaSeg = M2A_TMA_SEG, kTmaWarpBytes = M2A_TMA_WARP_BYTES;
constexpr size_t kTmaSmem = kWarps * kTmaWarpBytes; /* the most dynamic shared memory a launch asks for */
static_assert(kTmaSeg % 512 == 0 && kTmaSeg >= 1024 && kTmaWarpBytes >= 2 * 1024,
              "units are whole vectors of a warp; two stages of a 1 KB row fit a warp");

/* Bytes per unit for D rows: the most 512-byte steps (whole vectors of every lane), up to
 * kTmaSeg, of which two stages fit the warp's share. */
__host__ __device__ constexpr size_t tma_seg(int D)
{
    const size_t fit = kTmaWarpBytes / (2 * (size_t)D) / 512 * 512;
    return fit < kTmaSeg ? (fit < 1024 ? 1024 : fit) : kTmaSeg;
}

/* Stages a warp keeps in flight for D rows per unit; below 2 the loads path is used. */
__host__ __device__ constexpr int tma_stages(int D)
{
    return (int)(kTmaWarpBytes / ((size_t)D * tma_seg(D))) < kTmaMaxStages
               ? (int)(kTmaWarpBytes / ((size_t)D * tma_seg(D)))
               : kTmaMaxStages;
}

/* Shared memory a warp's stages take for D rows, and a launch's: only what the stages
 * use, since the rest is L1 cache. One row per unit (4 KB, 3 stages) takes 12 KB: with
 * all 14 KB asked for, one H100's combine at 4096 tokens (ep 1) was 2-3% slower than
 * with the earlier units; with 12 KB, 1.5-2% (bench/RESULTS.md, session 23). */
__host__ __device__ constexpr size_t tma_warp_bytes(int D) { return (size_t)D * tma_seg(D) * (size_t)tma_stages(D); }
__host__ __device__ constexpr size_t tma_smem(int D) { return (size_t)kWarps * tma_warp_bytes(D); }

/* Launches of at most this many blocks reduce through bulk copies (where the even split
 * does not apply): all of them. With the loop's instructions halved (session 22), one
 * H100 at 4096 tokens takes 64 us this way at 48 SMs against 131 with loads; the loads
 * way stays for rows the bulk copies cannot take (unaligned rows, more than kTmaRows
 * ranks per token, GPUs before sm_90). On 2 x H200 before that change (session 6), at 48
 * SMs bulk copies took 200 us against 211 with loads; the bound was then 32, since the
 * round trip gained nothing and 128 tokens lost 13% (a size the even split now takes). */
#ifndef M2A_COMBINE_TMA_MAX_BLOCKS
#define M2A_COMBINE_TMA_MAX_BLOCKS M2A_FAST_MAX_BLOCKS
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}

/* Orders this thread's generic-proxy accesses (the acquire of the peers' signals, the
 * reads of a stage) before its later bulk copies (async proxy). */
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async;" ::: "memory");
#endif
}

/* Reduces a landed stage of N rows (row d at stage + d x seg) into len bytes at dst:
 * rows summed in fp32 from 0 in stage order (ascending rank), rounded once. The rows
 * are loaded before any is added. N is a template argument so that a unit's loop has
 * no branch or predicate per row (reduce_landed picks it from the unit). */
template <moea2a_datatype_t DT, int N>
__device__ __forceinline__ void reduce_rows(const unsigned char *stage, unsigned seg, unsigned len, unsigned char *dst)
{
    constexpr int V = (int)(16 / Elem<DT>::size), U = (int)(kTmaSeg / 16 / 32); /* the largest unit */
    const unsigned lane = threadIdx.x & 31, C = len / 16;
    const int4 *row = reinterpret_cast<const int4 *>(stage) + lane;
    int4 *out = reinterpret_cast<int4 *>(dst) + lane;
    const unsigned row_step = seg / 16;
#pragma unroll
    for (int k = 0; k < U; k++) {
        if (lane + 32u * k >= C) break;
        int4 r[N > 0 ? N : 1];
#pragma unroll
        for (int d = 0; d < N; d++) r[d] = row[d * row_step + 32 * k];
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = 0.0f;
#pragma unroll
        for (int d = 0; d < N; d++) add_vec<DT>(acc, r[d]);
        out[32 * k] = pack_vec<DT>(acc);
    }
}

template <moea2a_datatype_t DT>
__device__ __forceinline__ void reduce_landed(const unsigned char *stage, unsigned seg, int nd, unsigned len,
                                              unsigned char *dst)
{
    static_assert(kTmaRows == 4, "one case per row count");
    switch (nd) {
    case 0: reduce_rows<DT, 0>(stage, seg, len, dst); break;
    case 1: reduce_rows<DT, 1>(stage, seg, len, dst); break;
    case 2: reduce_rows<DT, 2>(stage, seg, len, dst); break;
    case 3: reduce_rows<DT, 3>(stage, seg, len, dst); break;
    default: reduce_rows<DT, 4>(stage, seg, len, dst); break;
    }
}

/* Reduces tokens' rows through bulk copies: units of tma_seg(D) bytes of a token's output
 * row, tma_stages(D) of them in flight per warp. grab(&u0, &end) gives the warp its next
 * run of units [u0, end) (false: none left); rows(code) is the row of a send map code.
 * Needs tma_stages(D) >= 2, 16-byte rows and tma_smem(D) bytes of dynamic shared memory.
 * At few SMs the time is the instructions a unit costs (ncu at 16 SMs on one H100: issue
 * slots 55% busy, ~780 warp instructions per 2 KB unit), so the loop keeps them few: the
 * grab's units are walked without a division each, a token's rows are found once for its
 * units, the stage's unit is read from shared memory, and a stage is copied into again
 * after a __syncwarp alone: every lane's reads of it have returned (their sums were
 * stored), the consumer release of CUTLASS's TMA pipelines. */
template <moea2a_datatype_t DT, typename Grab, typename Rows>
__device__ void reduce_bulk(const int32_t *send_map, int k, int D, size_t out_row, uint32_t S, Grab grab, Rows rows,
                            unsigned char *out)
{
    extern __shared__ __align__(128) unsigned char dsm[];
    __shared__ uint64_t bars[kWarps][kTmaMaxStages];
    __shared__ int4 units_at[kWarps][kTmaMaxStages]; /* stage s's unit: token, rows, offset, length */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, NS = tma_stages(D);
    const unsigned seg = (unsigned)tma_seg(D), stage_bytes = (unsigned)D * seg;
    unsigned char *stages = dsm + (size_t)w * tma_warp_bytes(D);
    if (lane == 0)
        for (int s = 0; s < NS; s++) mbar_init(&bars[w][s], 1);
    fence_proxy_async(); /* the barriers' init (and the combine's acquire of its peers' signals) before any bulk copy */
    __syncwarp();
    /* the next unit is (t, j), segment j of token t, and `left` more follow in the grab */
    long long left = 0;
    int t = 0;
    uint32_t j = 0;
    bool more = true;
    auto next_unit = [&]() -> bool {
        if (left == 0) {
            unsigned long long u0, end;
            if (!more || !(more = grab(&u0, &end))) return false;
            left = (long long)(end - u0), t = (int)(u0 / S), j = (uint32_t)(u0 % S);
            if (left <= 0) return more = false;
        }
        left--;
        return true;
    };
    /* the pending unit and its token's map entry (lane d: the d-th (rank, slot) code),
     * loaded ahead so that the load's latency passes while the warp waits */
    bool pend = next_unit();
    int pend_t = t;
    uint32_t pend_j = j;
    int32_t pend_slot = pend && lane < D ? __ldcg(send_map + (size_t)pend_t * k + lane) : -1;
    /* the token of the last unit issued: its rows (lane d: the row of its d-th map entry,
     * null past them), how many, and where this lane's row lands in a stage */
    int cur_t = -1, nd = 0;
    unsigned ok_rows = 0;
    const unsigned char *src_row = nullptr;
    unsigned char *land = nullptr;
    /* issue: the pending unit's rows (ascending rank) into stage s, then the next one's map */
    auto issue = [&](int s) {
        const int ut = pend_t;
        const uint32_t uj = pend_j;
        if (ut != cur_t) { /* a token's rows are found once for all its units */
            const int32_t slot = pend_slot;
            cur_t = ut;
            ok_rows = __ballot_sync(0xffffffffu, slot >= 0);
            nd = __popc(ok_rows);
            src_row = slot >= 0 ? rows(slot) : nullptr;
            /* the d-th valid entry in rank order lands at row d of the stage */
            land = stages + (size_t)__popc(ok_rows & ((1u << lane) - 1)) * seg;
        }
        if (++j == S) j = 0, t++;
        pend = next_unit();
        if (pend && t != pend_t) pend_slot = lane < D ? __ldcg(send_map + (size_t)t * k + lane) : -1;
        pend_t = t, pend_j = j;
        const unsigned off = uj * seg;
        const unsigned len = (unsigned)(out_row - off < seg ? out_row - off : seg);
        if (lane == 0) units_at[w][s] = make_int4(ut, nd, (int)off, (int)len);
        if (src_row) {
            if (land == stages) mbar_expect(&bars[w][s], (unsigned)nd * len); /* row 0's lane */
            __syncwarp(ok_rows);
            bulk_load(land + (size_t)s * stage_bytes, src_row + off, len, &bars[w][s]);
        } else if (nd == 0 && lane == 0) {
            mbar_expect(&bars[w][s], 0); /* a token sent nowhere: zeros, nothing to load */
        }
    };
    unsigned phase = 0; /* bit s: the parity stage s waits for next */
    int n_in = 0;
    for (int s = 0; s < NS && pend; s++) {
        issue(s);
        n_in++;
    }
    __syncwarp(); /* lane 0's units_at before every lane reads them */
    for (int s = 0; n_in > 0; s = s + 1 == NS ? 0 : s + 1) {
        const int4 u = units_at[w][s];
        mbar_wait(&bars[w][s], (phase >> s) & 1u);
        phase ^= 1u << s;
        reduce_landed<DT>(stages + (size_t)s * stage_bytes, seg, u.y, (unsigned)u.w,
                          out + (size_t)u.x * out_row + (unsigned)u.z);
        __syncwarp(); /* every lane's reads of stage s and of units_at[w][s] before they are written again */
        if (!pend) n_in--;
        else issue(s);
    }
}

/* Token t's send map codes (rank x cap + slot, ascending rank, D <= 64, then -1): entry d
 * in lane d (lo) or d - 32 (hi). One warp. */
struct MapCodes {
    int32_t lo, hi;
};
__device__ __forceinline__ MapCodes map_codes(const int32_t *send_map, int k, int t, int D)
{
    const int lane = threadIdx.x & 31;
    const int32_t *map = send_map + (size_t)t * k;
    return {lane < D ? map[lane] : -1, lane + 32 < D ? map[lane + 32] : -1};
}

/* The rows of codes m, at(code) the row of a code: row d in lane d (*row_lo) or d - 32
 * (*row_hi); *nd of them. One warp. */
template <typename At>
__device__ __forceinline__ void code_rows(const MapCodes &m, At at, int *nd, const unsigned char **row_lo,
                                          const unsigned char **row_hi)
{
    *nd = __popc(__ballot_sync(0xffffffffu, m.lo >= 0)) + __popc(__ballot_sync(0xffffffffu, m.hi >= 0));
    if (m.lo >= 0) *row_lo = at(m.lo);
    if (m.hi >= 0) *row_hi = at(m.hi);
}

/* The row of a send map code in the peers' combine buffers (this rank's slot there). */
struct PeerRow {
    const m2a_fast_t &f;
    int stride;
    size_t row;
    __device__ __forceinline__ const unsigned char *operator()(int32_t c) const
    {
        return f.peer[c / f.p.cap] + f.combine + ((size_t)f.p.me * stride + c % f.p.cap) * row;
    }
};

/* The reduce of up to kEvenUnitsPerWarp units of kSegEven bytes per warp (the launch
 * decides, even_units): the units split evenly over the warps, no counter. A unit costs
 * a round trip over NVLink, and the counter's grab cost another each (at 128 tokens that
 * was most of the reduce); 1 KB units kept too few bytes in flight. 16-byte rows and
 * output only. */
__host__ __device__ inline bool even_units(size_t out_row, int n, int blocks)
{
    return (unsigned long long)n * ((out_row + kSegEven - 1) / kSegEven) <=
           (unsigned long long)kEvenUnitsPerWarp * blocks * kWarps;
}

/* This warp's units [*u0, *u1) of the even reduce, and the send map codes of the
 * first one's token: loaded before the kernel waits for its peers (this rank's dispatch
 * wrote the map before the launch), so that after the wait the rows are the one round
 * trip before the sum. */
__device__ __forceinline__ MapCodes even_first(const int32_t *send_map, int k, int D, size_t out_row, int n,
                                               long long *u0, long long *u1)
{
    const uint32_t S = (uint32_t)((out_row + kSegEven - 1) / kSegEven);
    const long long units = (long long)n * S, gw = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
    *u0 = warp_share(units, gw), *u1 = warp_share(units, gw + 1);
    return *u0 < *u1 ? map_codes(send_map, k, (int)(*u0 / S), D) : MapCodes{-1, -1};
}

/* The even reduce of this warp's units [u0, u1) (even_first), first the codes of u0's
 * token, at(code) the row of a code: the combine's kEven way and copy-engine mode's sum. */
template <moea2a_datatype_t DT, typename At>
__device__ __forceinline__ void reduce_even(const int32_t *send_map, int k, int D, size_t out_row, long long u0,
                                            long long u1, MapCodes first, At at, unsigned char *out)
{
    const uint32_t S = (uint32_t)((out_row + kSegEven - 1) / kSegEven);
    int t_prev = -1, nd = 0;
    const unsigned char *row_lo = nullptr, *row_hi = nullptr;
    for (long long u = u0; u < u1; u++) {
        const int t = (int)(u / S);
        if (t != t_prev) {
            code_rows(t_prev < 0 ? first : map_codes(send_map, k, t, D), at, &nd, &row_lo, &row_hi);
            t_prev = t;
        }
        const size_t off = (size_t)(u % S) * kSegEven, len = out_row - off < kSegEven ? out_row - off : kSegEven;
        reduce_unit<DT, (int)(kSegEven / 16 / 32), 2>(row_lo, row_hi, nd, off, len, out + (size_t)t * out_row, true);
    }
}

/* The combine's three ways to reduce, each compiled into a kernel of its own and chosen
 * at launch: the code of one way, present in another's kernel even unused, slowed that
 * kernel's loads. On one H200 at 4096 tokens, 48 SMs: the even reduce in the
 * counter's kernel 139 -> 163 us (session 14); the bulk-copy way's barrier wait written
 * as a C loop (ca85db8) 139.6 -> 159.5 us. */
enum CombineWay { kLoads, kEven, kTma };

/* phases as dispatch_kernel's: M2A_FAST_SEND is step 1 and the signal, M2A_FAST_RECV
 * the wait and step 2 (in the way WAY). */
template <moea2a_datatype_t DT, CombineWay WAY>
__global__ void __launch_bounds__(T, 1) combine_kernel(m2a_fast_t f, int n, int stride,
                                                       const unsigned char *__restrict__ expert_rows,
                                                       unsigned char *__restrict__ out, int status, int phases)
{
    __shared__ uint32_t s_epoch;
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, me = p.me, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
    unsigned char *ws = f.peer[me];
    const Ctl c = ctl_of(f, ws);
    const size_t row = f.combine_row;
    const bool send = (phases & M2A_FAST_SEND) != 0;
    bool ok = !failed(f);
    if (tid == 0) s_epoch = *reinterpret_cast<volatile uint32_t *>(c.epoch_c) + (send ? 1 : 0);
    __syncthreads();
    const uint32_t e = s_epoch;
    PROF_START(1);
    if (send && b == 0 && tid == 0) c.next_cunit[(e + 1) & 1] = 0;

    /* 1. caller rows into the combine buffer (valid slots only), then the signal; rows
     * the caller wrote there itself were written by earlier kernels, complete and
     * visible to the peers before this one started */
    const bool copy_in = send && expert_rows && expert_rows != ws + f.combine;
    if (copy_in) {
        const int32_t *counts = reinterpret_cast<const int32_t *>(ws + f.recv_counts);
        const bool vec = (row % 16 == 0) && (uintptr_t)expert_rows % 16 == 0;
        const size_t unit = vec ? 16 : 1, C = row / unit, items = (size_t)ep * stride * C;
        for (size_t i = (size_t)b * T + tid; i < items; i += (size_t)G * T) {
            size_t slot = i / C;
            if ((int)(slot % stride) >= counts[slot / stride]) continue;
            if (vec) reinterpret_cast<int4 *>(ws + f.combine)[i] = reinterpret_cast<const int4 *>(expert_rows)[i];
            else ws[f.combine + i] = expert_rows[i];
        }
    }
    ok = __syncthreads_and(ok); /* the rows before the signal's release (cumulative) */
    PROF_MARK(1, 0);
    /* the signal: one per block, or, when the rows were complete before this launch
     * (zero copy), all G from block 0 to the peers, which then need not wait for this
     * launch's last block to start. This rank's own count still takes one per block:
     * that is how block 0 knows below that every block read the epoch. */
    const bool whole = !copy_in && M2A_COMBINE_ONE_SIGNAL;
    if (send && tid < ep && ok && (!whole || tid == me || b == 0)) {
        const Ctl pc = ctl_of(f, f.peer[tid]); /* a failed rank's status goes out with its signal (the same thread) */
        if (status) pc.hdr[2 * me + 1] = status;
        signal_add(f, &pc.carrive[me], whole && tid != me ? (uint32_t)G : 1u);
    }
    if (!(phases & M2A_FAST_RECV)) {
        send_done(c.done_c, c.epoch_c, e);
        return;
    }
    const int D = p.k < ep ? p.k : ep, lane = tid & 31;
    const int32_t *send_map = reinterpret_cast<const int32_t *>(ws + f.send_map);
    const size_t out_row = f.hidden * Elem<DT>::size;
    long long even_u0 = 0, even_u1 = 0;
    MapCodes even_codes = {-1, -1};
    if constexpr (WAY == kEven) even_codes = even_first(send_map, p.k, D, out_row, n, &even_u0, &even_u1);
    if (tid < ep && ok) ok = wait_for(f, &c.carrive[tid], e * (uint32_t)G, tid, M2A_FAST_AT_COMBINE);
    if (tid < ep && ok) { /* 0 since that rank's last dispatch, unless its combine failed its checks (final) */
        const int32_t st = *reinterpret_cast<volatile int32_t *>(&c.hdr[2 * tid + 1]);
        if (st) ok = fail(f, st, tid, M2A_FAST_AT_COMBINE_HEADER);
    }
    ok = __syncthreads_and(ok);
    /* every block of this launch signalled: each read it (or it failed) */
    if (send && b == 0 && tid == 0) *c.epoch_c = e;
    PROF_MARK(1, 1);

    /* 2. (token, segment) units split evenly (kEven), or taken from a counter by any warp:
     * SMs that the links serve faster take more, so all end together */
    const size_t seg = WAY == kTma ? tma_seg(D) : kSegC;
    const uint32_t S = (uint32_t)((out_row + seg - 1) / seg);
    const bool vec = out_row % 16 == 0 && row % 16 == 0 && (uintptr_t)out % 16 == 0;
    const unsigned long long units = (unsigned long long)n * S;
    unsigned long long *next = c.next_cunit + (e & 1);
    if constexpr (WAY == kEven) {
        if (ok) reduce_even<DT>(send_map, p.k, D, out_row, even_u0, even_u1, even_codes, PeerRow{f, stride, row}, out);
        PROF_END(1, 2);
        return;
    }
    /* a warp asks for its next grab before reducing this one */
    const unsigned take = units_per_grab(units, G);
    const unsigned long long grabs = (units + take - 1) / take;
    unsigned long long taken = lane == 0 ? atomicAdd(next, 1ull) : 0;
    if constexpr (WAY == kTma) {
        auto grab = [&](unsigned long long *u0, unsigned long long *end) -> bool {
            const unsigned long long g = __shfl_sync(0xffffffffu, taken, 0);
            if (g >= grabs) return false;
            *u0 = g * take, *end = *u0 + take < units ? *u0 + take : units;
            if (lane == 0) taken = atomicAdd(next, 1ull); /* the grab after this one */
            return true;
        };
        if (ok) reduce_bulk<DT>(send_map, p.k, D, out_row, S, grab, PeerRow{f, stride, row}, out);
    } else {
        int t_prev = -1, nd = 0;
        const unsigned char *row_lo = nullptr, *row_hi = nullptr; /* row d in lane d (and d - 32) */
        while (ok) {
            const unsigned long long g = __shfl_sync(0xffffffffu, taken, 0);
            if (g >= grabs) break;
            if (lane == 0) taken = atomicAdd(next, 1ull);
            for (unsigned long long u = g * take; u < (g + 1) * take && u < units; u++) {
                const int t = (int)(u / S);
                if (t != t_prev) { /* the token's rows, ascending rank (D <= 64) */
                    code_rows(map_codes(send_map, p.k, t, D), PeerRow{f, stride, row}, &nd, &row_lo, &row_hi);
                    t_prev = t;
                }
                const size_t off = (size_t)(u % S) * kSegC, len = out_row - off < kSegC ? out_row - off : kSegC;
                reduce_unit<DT>(row_lo, row_hi, nd, off, len, out + (size_t)t * out_row, vec);
            }
        }
    }
    PROF_END(1, 2);
}

/* Copy-engine mode's sum (its own kernel: nothing waits, every row is in this GPU's
 * memory): each token's rows from this rank's combine buffer (its own slot there) or
 * from the landing area the copy engines filled ([index[rank]][cap][row]), summed with
 * the load/store combine's arithmetic, its units split evenly over the warps: the even
 * reduce (reduce_even) where it applies, else through bulk copies (BULK, reduce_bulk),
 * or 1 KB units where rows are not 16-byte aligned. */
template <moea2a_datatype_t DT, bool BULK>
__global__ void __launch_bounds__(T, 1) landing_reduce_kernel(m2a_fast_t f, int n, int stride,
                                                              const unsigned char *__restrict__ landing,
                                                              const int32_t *__restrict__ index,
                                                              unsigned char *__restrict__ out)
{
    const m2a_kparams_t &p = f.p;
    const int D = p.k < p.ep ? p.k : p.ep;
    const unsigned char *ws = f.peer[p.me];
    const int32_t *send_map = reinterpret_cast<const int32_t *>(ws + f.send_map);
    const size_t row = f.combine_row, out_row = f.hidden * Elem<DT>::size;
    const bool vec = out_row % 16 == 0 && row % 16 == 0 && ((uintptr_t)out | (uintptr_t)landing) % 16 == 0; /* !BULK */
    auto at = [&](int32_t code) -> const unsigned char * {
        const int rank = code / p.cap, slot = code % p.cap;
        return rank == p.me ? ws + f.combine + ((size_t)p.me * stride + slot) * row
                            : landing + ((size_t)index[rank] * p.cap + slot) * row;
    };
    const long long gw = (long long)blockIdx.x * kWarps + (threadIdx.x >> 5);
    if constexpr (BULK) {
        const uint32_t S = (uint32_t)((out_row + tma_seg(D) - 1) / tma_seg(D));
        const long long units = (long long)n * S;
        bool given = false; /* the warp's one run of units */
        auto grab = [&](unsigned long long *u0, unsigned long long *end) -> bool {
            if (given) return false;
            given = true;
            *u0 = (unsigned long long)warp_share(units, gw), *end = (unsigned long long)warp_share(units, gw + 1);
            return true;
        };
        reduce_bulk<DT>(send_map, p.k, D, out_row, S, grab, at, out);
    } else if (vec) {
        long long u0, u1;
        const MapCodes first = even_first(send_map, p.k, D, out_row, n, &u0, &u1);
        reduce_even<DT>(send_map, p.k, D, out_row, u0, u1, first, at, out);
    } else {
        const uint32_t S = (uint32_t)((out_row + kSegC - 1) / kSegC);
        const long long units = (long long)n * S;
        int t_prev = -1, nd = 0;
        const unsigned char *row_lo = nullptr, *row_hi = nullptr;
        for (long long u = warp_share(units, gw); u < warp_share(units, gw + 1); u++) {
            const int t = (int)(u / S);
            if (t != t_prev) code_rows(map_codes(send_map, p.k, t, D), at, &nd, &row_lo, &row_hi), t_prev = t;
            const size_t off = (size_t)(u % S) * kSegC, len = out_row - off < kSegC ? out_row - off : kSegC;
            reduce_unit<DT>(row_lo, row_hi, nd, off, len, out + (size_t)t * out_row, false);
        }
    }
}

} // namespace

#ifdef M2A_FAST_PROFILE
/* Means over the launches after the first 12 (warm-up and checks): span, then each
 * mark's mean and maximum over blocks, from each block's start. */
extern "C" void m2a_fast_profile_report(int rank)
{
    static unsigned long long rec[2][kLaunches][2 + 2 * kMarks];
    unsigned int launch[2], blocks[2];
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(rec, g_rec, sizeof(rec));
    cudaMemcpyFromSymbol(launch, g_launch, sizeof(launch));
    cudaMemcpyFromSymbol(blocks, g_blocks, sizeof(blocks));
    static const char *names[2][kMarks] = {{"counts", "prefix+gate", "routed", "copies", "signal", "arrivals", "sanitize"},
                                           {"copy-in", "signal+wait", "reduce"}};
    for (int k = 0; k < 2; k++) {
        unsigned first = 12, last = launch[k] < kLaunches ? launch[k] : kLaunches;
        if (last <= first || !blocks[k]) continue;
        double span = 0, mean[kMarks] = {0}, mx[kMarks] = {0};
        for (unsigned l = first; l < last; l++) {
            span += (double)(rec[k][l][1] - rec[k][l][0]);
            for (int i = 0; i < kMarks; i++) mean[i] += (double)rec[k][l][2 + i] / blocks[k], mx[i] += (double)rec[k][l][2 + kMarks + i];
        }
        double nl = last - first, gap = 0;
        for (unsigned l = first; l < last; l++) /* launches alternate: dispatch l, combine l */
            gap += k ? (double)(rec[1][l][0] - rec[0][l][1]) : (double)(rec[0][l][0] - rec[1][l - 1][1]);
        fprintf(stderr, "# profile rank %d %s: %u launches, span %.1f us, gap before %.1f us; mark mean/max over blocks (us):",
                rank, k ? "combine" : "dispatch", last - first, span / 1e3 / nl, gap / 1e3 / nl);
        for (int i = 0; i < kMarks && names[k][i]; i++)
            fprintf(stderr, " %s %.1f/%.1f", names[k][i], mean[i] / 1e3 / nl, mx[i] / 1e3 / nl);
        fprintf(stderr, "\n");
    }
    memset(rec, 0, sizeof(rec));
    unsigned int z[2] = {0, 0};
    cudaMemcpyToSymbol(g_rec, rec, sizeof(rec));
    cudaMemcpyToSymbol(g_launch, z, sizeof(z));
}
#endif

extern "C" int m2a_fast_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                                 const int32_t *ids, const float *weights, int phases, void *stream)
{
    const bool small = (status ? 0 : n) <= kSmallPerBlock * blocks;
    if (f->qfuse && !status) /* FP8 quantized inside the copies */
        (small ? dispatch_kernel<true, kInCopy> : dispatch_kernel<false, kInCopy>)<<<blocks, T, 0, (cudaStream_t)stream>>>(
            *f, n, stride, status, payloads, ids, weights, phases);
    else if (f->qrows > 0 && !status && !small) /* the rows are quantized alongside */
        dispatch_kernel<false, kAlongside><<<blocks, T, 0, (cudaStream_t)stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
    else if (small)
        dispatch_kernel<true><<<blocks, T, 0, (cudaStream_t)stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
    else
        dispatch_kernel<false><<<blocks, T, 0, (cudaStream_t)stream>>>(*f, n, stride, status, payloads, ids, weights, phases);
    return (int)cudaGetLastError();
}

/* Every kernel of this file, loaded now (kernels/load.cuh). */
template <moea2a_datatype_t DT> static int load_combine(int e)
{
    return m2a_load_kernel(combine_kernel<DT, kTma>, m2a_load_kernel(combine_kernel<DT, kEven>, m2a_load_kernel(combine_kernel<DT, kLoads>, e)));
}

extern "C" int m2a_fast_load(void)
{
    int e = m2a_load_kernel(dispatch_kernel<true>, 0);
    e = m2a_load_kernel(dispatch_kernel<false>, e);
    e = m2a_load_kernel(dispatch_kernel<false, kAlongside>, e);
    e = m2a_load_kernel(dispatch_kernel<true, kInCopy>, e);
    e = m2a_load_kernel(dispatch_kernel<false, kInCopy>, e);
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
    const size_t smem = WAY == kTma ? tma_smem(rows_per_token(f)) : 0;
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
    if ((phases & M2A_FAST_RECV) && vec && even_units(out_row, n, blocks)) {
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


/* The load/store kernels' constants, memory order, phase profile and the workspace's
 * control regions (signals, counters, the error record) with the bounded waits on
 * them. Part of moe_fast.cu, which includes the parts in order: one translation unit,
 * so that every kernel keeps its inlining. */
namespace {

using namespace m2a_mbar;

constexpr int T = M2A_FAST_THREADS;
constexpr int kWarps = T / kWarpSize;
constexpr int kPieceSlots = 4096; /* (token, destination) pairs of a piece kept in shared memory */
constexpr int kErrTimeout = MOEA2A_ERR_TIMEOUT, kErrMismatch = MOEA2A_ERR_MISMATCH, kErrPeerFailed = MOEA2A_ERR_PEER_FAILED;


/* ---- memory order helpers -------------------------------------------------------- */

/* The scope of the signals. A rank alone (ep 1) signals only itself: its own GPU
 * writes and reads every word, the GPU's scope orders them, and a system-scope release
 * waits for more (one H100, ep 1: graph round trip at 8 / 128 tokens 13.3 / 15.8 ->
 * 12.4 / 14.9 us). With peers every signal keeps the
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

/* ---- optional phase profile (build with -DM2A_FAST_PROFILE) ------------------------
 * Thread 0 of every block adds the time from its block's start to each phase mark;
 * the last block of a launch adds the launch's span (first start to last end). The
 * first kLaunches launches of each kind are recorded (moea2a_perf: keep --iters small).
 * Ranks that share a process share the record: profile ranks as processes.
 * m2a_fast_profile_report() prints the means and starts over. */
#ifdef M2A_FAST_PROFILE
constexpr int kMarks = 10, kLaunches = 512;
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

/* How a call's costs grow with the peers (ep): every control region is one word per
 * peer; a dispatch writes its count row to each peer once (ep threads at once), each
 * block releases one counter per destination (G x ep small writes) and waits on ep
 * counters; a combine signals ep counters from block 0 and every block polls ep. No
 * step grows faster than the peers, and up to the M2A_FAST_MAX_PEERS a context may have
 * each is one pass of one block's threads. What does grow: the bytes, with the distinct
 * ranks a token reaches (top-8 of 256: 1.0 remote rows per token on 2 GPUs, 2.7 on 4,
 * 4.6 on 8) over a GPU's NVLink bandwidth, which does not; and the wait for the
 * slowest peer's last block, a maximum over more peers. The parts measured on 2 and 4
 * GPUs, and what they predict for 8, are in bench/RESULTS.md ("Decode sizes"). */

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

/* A build switch for A/B runs: a wait polls its word this many times between
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

/* The rank the host's peer watcher saw die, + 1, or 0 (m2a_fast_error_t.dead). */
__device__ __forceinline__ int dead_peer(const m2a_fast_t &f)
{
    int v;
    asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(&f.host_err->dead) : "memory");
    return v;
}

/* Waits until *p >= target (wrap-safe), bounded by the timeout; gives up soon (within
 * M2A_WAIT_LOOK_EVERY polls) when another thread recorded an error, and within
 * M2A_FAST_DEAD_LOOK_NS of the host's news of a dead peer. */
__device__ bool wait_for(const m2a_fast_t &f, const uint32_t *p, uint32_t target, int peer, int what)
{
    const bool local = alone(f);
    if ((int32_t)(load_acquire(p, local) - target) >= 0) return true;
    const unsigned long long start = now_ns();
    unsigned long long looked = start;
    for (unsigned i = 1; (int32_t)(load_acquire(p, local) - target) < 0; i++) {
        if (i % M2A_WAIT_LOOK_EVERY) continue;
        if (failed(f)) return false;
        const unsigned long long t = now_ns();
        if (t - looked > M2A_FAST_DEAD_LOOK_NS) {
            looked = t;
            if (const int d = dead_peer(f)) return fail(f, kErrPeerFailed, d - 1, what);
        }
        if (t - start > f.timeout_ns) return fail(f, kErrTimeout, peer, what);
        __nanosleep(64);
    }
    return true;
}

} // namespace

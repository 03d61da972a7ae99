/* Dispatch and combine over load/store peer pointers (see moe_fast.h).
 *
 * Protocol. Every rank's workspace has the same layout; rank q's kernels write into
 * rank r's through f.peer[r]. Counters only grow, so nothing is ever reset across
 * ranks: the e-th dispatch of a context waits for "arrive[src] >= e x blocks" and
 * the e-th combine for "carrive[src] >= e x blocks", where every block of the
 * sender adds one after its writes (release, system scope). The epoch e lives in the
 * workspace, so a CUDA graph replays correctly.
 *
 *  dispatch (blocks split the tokens into contiguous chunks, in order):
 *   1. count the chunk's tokens per destination; publish the counts (block scratch);
 *      add up the counts of the blocks before this one: the chunk's first slot at
 *      every destination. Slot order is token order, whatever the timing.
 *   2. wait until every peer's previous combine began (it no longer reads the
 *      receive arrays it got from the previous dispatch);
 *   3. route the chunk in pieces, write each token's arrays into every destination's
 *      slot (ids sanitized for that destination), keep the send map for combine;
 *   4. the last block writes each destination's count and this call's stride and
 *      status; every block signals every destination;
 *   5. wait for every source; check strides and statuses; sanitize padding slots.
 *  combine:
 *   1. (caller rows) copy the valid rows into the workspace's combine buffer;
 *      signal every peer that this rank's rows are ready; wait for every peer's;
 *   2. each token's rows, read over NVLink in ascending rank order and summed in
 *      fp32 from 0.0f, rounded once: the host reference's arithmetic. */
#include <cuda_runtime.h>

#include "convert.h"
#include "moe_fast.h"

namespace {

constexpr int T = M2A_FAST_THREADS;
constexpr int kWarps = T / 32;
constexpr int kPieceSlots = 4096; /* (token, destination) pairs of a piece kept in shared memory */
constexpr int kErrTimeout = MOEA2A_ERR_TIMEOUT, kErrMismatch = MOEA2A_ERR_MISMATCH;

/* ---- memory order helpers -------------------------------------------------------- */

__device__ __forceinline__ uint32_t load_acquire(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void add_release(uint32_t *p, uint32_t v)
{
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---- the workspace's control regions --------------------------------------------- */

struct Ctl {
    uint32_t *arrive, *carrive; /* [ep], written by peers */
    int32_t *hdr;               /* [ep][2]: stride, status of each source's dispatch */
    int32_t *agg;               /* [MAX_BLOCKS][ep] chunk counts */
    uint32_t *aggflag;          /* [MAX_BLOCKS] epoch of agg */
    long long *part;            /* [MAX_BLOCKS][2] invalid, merged entries */
    uint32_t *epoch_d, *epoch_c, *done_d, *done_c;
    long long *stats; /* [4] total_recv, invalid, sent_rows, merged */
};

__device__ Ctl ctl_of(const m2a_fast_t &f, unsigned char *ws)
{
    const int ep = f.p.ep;
    Ctl c;
    c.arrive = reinterpret_cast<uint32_t *>(ws + f.sig);
    c.carrive = c.arrive + ep;
    c.hdr = reinterpret_cast<int32_t *>(c.carrive + ep);
    c.agg = reinterpret_cast<int32_t *>(ws + f.blocks);
    c.aggflag = reinterpret_cast<uint32_t *>(ws + f.blocks + (size_t)4 * ep * M2A_FAST_MAX_BLOCKS);
    c.part = reinterpret_cast<long long *>(ws + f.blocks + (size_t)4 * ep * M2A_FAST_MAX_BLOCKS + 4 * M2A_FAST_MAX_BLOCKS);
    uint32_t *w = reinterpret_cast<uint32_t *>(ws + f.ctl);
    c.epoch_d = w, c.epoch_c = w + 1, c.done_d = w + 2, c.done_c = w + 3;
    c.stats = reinterpret_cast<long long *>(ws + f.ctl + M2A_FAST_CTL_STATS);
    return c;
}
static_assert(4 * M2A_FAST_MAX_BLOCKS <= 1024 && (4 + 16) * M2A_FAST_MAX_BLOCKS <= 8192,
              "block scratch outgrew M2A_FAST_BLOCK_BYTES"); /* 4 ep + 4 + 16 bytes per block */
static_assert(M2A_FAST_CTL_STATS + 4 * 8 <= M2A_FAST_CTL_BYTES, "counters outgrew M2A_FAST_CTL_BYTES");

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

/* Waits until *p >= target (wrap-safe), bounded by the timeout; gives up at once
 * when another thread already recorded an error. */
__device__ bool wait_for(const m2a_fast_t &f, const uint32_t *p, uint32_t target, int peer, int what)
{
    if ((int32_t)(load_acquire(p) - target) >= 0) return true;
    const unsigned long long start = now_ns();
    while ((int32_t)(load_acquire(p) - target) < 0) {
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

/* Bit r set: the token goes to rank r. Counts invalid and merged entries. */
__device__ unsigned long long token_mask(const m2a_kparams_t &p, const int32_t *ids, int t, int *inv, int *merged)
{
    unsigned long long mask = 0;
    const int32_t *row = ids + (size_t)t * p.k;
    for (int j = 0; j < p.k; j++) {
        int32_t e = row[j];
        if (invalid_id(p, e)) {
            ++*inv;
            continue;
        }
        unsigned long long bit = 1ull << p.owner[e];
        *merged += (mask & bit) != 0;
        mask |= bit;
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

struct Shared {
    int base[M2A_FAST_MAX_PEERS];  /* next slot at each destination */
    int count[M2A_FAST_MAX_PEERS]; /* this chunk's tokens per destination */
    int warp_count[kWarps][M2A_FAST_MAX_PEERS];
    int nd[T];                     /* destinations of each token of the piece */
    unsigned char rank[kPieceSlots];
    int row[kPieceSlots];          /* receive row (src * stride + slot) at that rank */
    long long red[kWarps];
    uint32_t epoch;
};

/* Copies array a of the piece's tokens to all their destinations: 16-byte vectors
 * when the row and the source allow, else 4-byte words or bytes. Eight vectors in
 * flight per thread; stores to peers are posted and need not wait. */
__device__ void copy_array(const m2a_fast_t &f, const Shared &s, int D, int first, int ntok, const unsigned char *src,
                           size_t width, size_t ws_off)
{
    if (((uintptr_t)src | width) % 16 == 0) {
        const size_t C = width / 16, items = (size_t)ntok * C;
        constexpr int U = 8; /* loads in flight per thread */
        for (size_t i0 = threadIdx.x; i0 < items; i0 += U * T) {
            int4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                size_t i = i0 + (size_t)u * T;
                if (i < items)
                    v[u] = __ldg(reinterpret_cast<const int4 *>(src + (size_t)(first + (int)(i / C)) * width) + i % C);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                size_t i = i0 + (size_t)u * T;
                if (i >= items) break;
                int tl = (int)(i / C);
                for (int d = 0; d < s.nd[tl]; d++) {
                    int slot = tl * D + d;
                    unsigned char *dst = f.peer[s.rank[slot]] + ws_off + (size_t)s.row[slot] * width;
                    reinterpret_cast<int4 *>(dst)[i % C] = v[u];
                }
            }
        }
        return;
    }
    const bool words = ((uintptr_t)src | width) % 4 == 0;
    const size_t unit = words ? 4 : 1, C = width / unit, items = (size_t)ntok * C;
    for (size_t i = threadIdx.x; i < items; i += T) {
        int tl = (int)(i / C);
        const unsigned char *from = src + (size_t)(first + tl) * width + (i % C) * unit;
        uint32_t v = words ? *reinterpret_cast<const uint32_t *>(from) : *from;
        for (int d = 0; d < s.nd[tl]; d++) {
            int slot = tl * D + d;
            unsigned char *dst = f.peer[s.rank[slot]] + ws_off + (size_t)s.row[slot] * width + (i % C) * unit;
            if (words) *reinterpret_cast<uint32_t *>(dst) = v;
            else *dst = (unsigned char)v;
        }
    }
}

/* ids (sanitized for each destination), weights and the source index. */
__device__ void copy_small(const m2a_fast_t &f, const Shared &s, int D, int first, int ntok, const int32_t *ids,
                           const float *weights)
{
    const m2a_kparams_t &p = f.p;
    const int k = p.k, P = p.num_payloads;
    const size_t ids_off = p.ws_off[P], src_off = p.ws_off[p.narrays - 1], w_off = p.weights ? p.ws_off[P + 1] : 0;
    const size_t items = (size_t)ntok * D * k;
    for (size_t i = threadIdx.x; i < items; i += T) {
        int tl = (int)(i / ((size_t)D * k)), d = (int)(i / k % D), j = (int)(i % k);
        if (d >= s.nd[tl]) continue;
        int slot = tl * D + d, rank = s.rank[slot], t = first + tl;
        unsigned char *base = f.peer[rank];
        size_t row = (size_t)s.row[slot];
        int32_t e = ids[(size_t)t * k + j];
        if (f.sanitize && (invalid_id(p, e) || (f.rewrite && p.owner[e] != rank))) e = p.invalid_id;
        reinterpret_cast<int32_t *>(base + ids_off)[row * k + j] = e;
        if (p.weights) reinterpret_cast<float *>(base + w_off)[row * k + j] = weights[(size_t)t * k + j];
        if (j == 0) reinterpret_cast<int32_t *>(base + src_off)[row] = t;
    }
}

/* ---- dispatch ------------------------------------------------------------------------- */

__global__ void __launch_bounds__(T, 1) dispatch_kernel(m2a_fast_t f, int n, int stride, int status,
                                                        m2a_kpayloads_t pay, const int32_t *__restrict__ ids,
                                                        const float *__restrict__ weights)
{
    __shared__ Shared s;
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, me = p.me, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    unsigned char *ws = f.peer[me];
    const Ctl c = ctl_of(f, ws);
    /* ok: this block may go on; made uniform by __syncthreads_and at each step */
    bool ok = !failed(f);
    if (tid == 0) s.epoch = *reinterpret_cast<volatile uint32_t *>(c.epoch_d) + 1;
    if (tid < ep) s.count[tid] = 0, s.base[tid] = 0;
    __syncthreads();
    const uint32_t e = s.epoch;
    if (status) n = 0;
    const int lo = (int)((long long)n * b / G), hi = (int)((long long)n * (b + 1) / G);

    /* 1. this chunk's counts, published; the earlier blocks' counts added up */
    int inv = 0, merged = 0;
    for (int t = lo + tid; t < hi; t += T) {
        unsigned long long m = token_mask(p, ids, t, &inv, &merged);
        for (; m; m &= m - 1) atomicAdd(&s.count[__ffsll((long long)m) - 1], 1);
    }
    long long inv_sum = block_sum<long long>(inv, s.red), merged_sum = block_sum<long long>(merged, s.red);
    __syncthreads();
    if (tid < ep) c.agg[(size_t)b * ep + tid] = s.count[tid];
    if (tid == 0) c.part[2 * b] = inv_sum, c.part[2 * b + 1] = merged_sum;
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        atomicExch(&c.aggflag[b], e);
    }
    if (tid < b && ok) {
        ok = wait_for(f, &c.aggflag[tid], e, me, M2A_FAST_AT_PREFIX);
        for (int r = 0; r < ep; r++) atomicAdd(&s.base[r], *reinterpret_cast<volatile int32_t *>(&c.agg[(size_t)tid * ep + r]));
    }
    /* 2. every destination's previous combine began */
    if (tid < ep && e > 1 && ok) ok = wait_for(f, &c.carrive[tid], (e - 1) * (uint32_t)G, tid, M2A_FAST_AT_GATE);
    ok = __syncthreads_and(ok);

    /* 3. route and write, a piece of tokens at a time */
    const int D = p.k < ep ? p.k : ep, piece = kPieceSlots / D < T ? kPieceSlots / D : T;
    int32_t *send_map = reinterpret_cast<int32_t *>(ws + f.send_map);
    for (int first = lo; first < hi && ok; first += piece) {
        const int ntok = hi - first < piece ? hi - first : piece, t = first + tid;
        int dummy = 0;
        unsigned long long m = tid < ntok ? token_mask(p, ids, t, &dummy, &dummy) : 0;
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
        /* lane prefixes, with the whole warp present */
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
            int nd = s.nd[tid];
            for (int d = 0; d < nd; d++) {
                int slot = s.row[tid * D + d];
                map[d] = s.rank[tid * D + d] * p.cap + slot;
                s.row[tid * D + d] = me * stride + slot;
            }
            for (int d = nd; d < p.k; d++) map[d] = -1;
        }
        __syncthreads();
        if (tid < ep) /* the next piece starts after this one's tokens */
            for (int w = 0; w < kWarps; w++) s.base[tid] += s.warp_count[w][tid];
        for (int a = 0; a < p.num_payloads; a++)
            copy_array(f, s, D, first, ntok, static_cast<const unsigned char *>(pay.p[a]), p.width[a], p.ws_off[a]);
        copy_small(f, s, D, first, ntok, ids, weights);
        __syncthreads();
    }

    /* 4. counts and headers (last block: its bases are the totals), then the signal */
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
    __syncthreads();
    if (tid == 0) __threadfence_system();
    __syncthreads();
    if (tid < ep && ok) add_release(&ctl_of(f, f.peer[tid]).arrive[me], 1); /* a failed block stays silent */

    /* 5. every source's rows arrived: check its header, then sanitize padding */
    if (tid < ep && ok) {
        ok = wait_for(f, &c.arrive[tid], e * (uint32_t)G, tid, M2A_FAST_AT_ARRIVE);
        if (ok) {
            int32_t st = *reinterpret_cast<volatile int32_t *>(&c.hdr[2 * tid + 1]);
            int32_t sr = *reinterpret_cast<volatile int32_t *>(&c.hdr[2 * tid]);
            if (st) ok = fail(f, st, tid, M2A_FAST_AT_HEADER);
            else if (sr != stride) ok = fail(f, kErrMismatch, tid, M2A_FAST_AT_HEADER);
        }
    }
    ok = __syncthreads_and(ok);
    const int32_t *counts = reinterpret_cast<const int32_t *>(ws + f.recv_counts);
    int32_t *rids = reinterpret_cast<int32_t *>(ws + p.ws_off[p.num_payloads]);
    int32_t *src_index = reinterpret_cast<int32_t *>(ws + p.ws_off[p.narrays - 1]);
    const size_t slots = (size_t)ep * stride;
    for (size_t slot = (size_t)b * T + tid; slot < slots; slot += (size_t)G * T) {
        int src = (int)(slot / stride), i = (int)(slot % stride);
        if (ok && i < *reinterpret_cast<const volatile int32_t *>(&counts[src])) continue;
        src_index[slot] = -1;
        if (f.sanitize)
            for (int j = 0; j < p.k; j++) rids[slot * p.k + j] = p.invalid_id;
    }

    /* the last block to finish: stats, then the epoch moves on */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(c.done_d, 1u) == (uint32_t)G - 1) {
            __threadfence();
            long long invalid = 0, mg = 0, recv = 0;
            for (int j = 0; j < G; j++) {
                invalid += *reinterpret_cast<volatile long long *>(&c.part[2 * j]);
                mg += *reinterpret_cast<volatile long long *>(&c.part[2 * j + 1]);
            }
            for (int r = 0; r < ep; r++) recv += *reinterpret_cast<const volatile int32_t *>(&counts[r]);
            c.stats[0] = recv, c.stats[1] = invalid, c.stats[3] = mg;
            *c.done_d = 0;
            *c.epoch_d = e;
            __threadfence();
        }
    }
}

/* ---- combine ---------------------------------------------------------------------------- */

template <moea2a_datatype_t DT> struct Val;
template <> struct Val<MOEA2A_FLOAT32> {
    static constexpr int size = 4;
    static __device__ float get(const unsigned char *b, int i) { return reinterpret_cast<const float *>(b)[i]; }
    static __device__ void put(unsigned char *b, int i, float v) { reinterpret_cast<float *>(b)[i] = v; }
};
template <> struct Val<MOEA2A_BFLOAT16> {
    static constexpr int size = 2;
    static __device__ float get(const unsigned char *b, int i) { return m2a_bf16_to_f32(reinterpret_cast<const uint16_t *>(b)[i]); }
    static __device__ void put(unsigned char *b, int i, float v) { reinterpret_cast<uint16_t *>(b)[i] = m2a_f32_to_bf16(v); }
};
template <> struct Val<MOEA2A_FLOAT16> {
    static constexpr int size = 2;
    static __device__ float get(const unsigned char *b, int i) { return m2a_f16_to_f32(reinterpret_cast<const uint16_t *>(b)[i]); }
    static __device__ void put(unsigned char *b, int i, float v) { reinterpret_cast<uint16_t *>(b)[i] = m2a_f32_to_f16(v); }
};

struct CombineShared {
    const unsigned char *rows[kPieceSlots / 2]; /* each token's rows, ascending rank */
    int nd[T];
    uint32_t epoch;
};

/* out rows of the piece's tokens: vector chunks of 16 bytes (or single values when
 * rows are not 16-byte multiples), each a sum from 0.0f in ascending rank order. */
template <moea2a_datatype_t DT>
__device__ void reduce_piece(const CombineShared &s, int D, int first, int ntok, size_t hidden, unsigned char *out)
{
    const size_t row = hidden * Val<DT>::size;
    if (row % 16 == 0 && (uintptr_t)out % 16 == 0) {
        /* Two chunks per thread, each with up to 4 rows loaded before any is summed:
         * NVLink reads have long latency and need many in flight. */
        constexpr int V = 16 / Val<DT>::size, R = 4, U = 2;
        const size_t C = row / 16, items = (size_t)ntok * C;
        for (size_t i0 = threadIdx.x; i0 < items; i0 += U * T) {
            int4 r[U][R];
            int tl[U], nd[U];
            size_t ch[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                size_t i = i0 + (size_t)u * T;
                tl[u] = (int)(i / C), ch[u] = i % C, nd[u] = i < items ? s.nd[tl[u]] : 0;
#pragma unroll
                for (int d = 0; d < R; d++)
                    if (d < nd[u]) r[u][d] = reinterpret_cast<const int4 *>(s.rows[tl[u] * D + d])[ch[u]];
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (nd[u] == 0 && i0 + (size_t)u * T >= items) continue;
                float acc[V];
#pragma unroll
                for (int v = 0; v < V; v++) acc[v] = 0.0f;
                for (int d0 = 0; d0 < nd[u]; d0 += R) {
                    if (d0 > 0) /* more than R rows: the next batch */
#pragma unroll
                        for (int d = 0; d < R; d++)
                            if (d0 + d < nd[u]) r[u][d] = reinterpret_cast<const int4 *>(s.rows[tl[u] * D + d0 + d])[ch[u]];
#pragma unroll
                    for (int d = 0; d < R; d++) {
                        if (d0 + d >= nd[u]) break;
#pragma unroll
                        for (int v = 0; v < V; v++) acc[v] += Val<DT>::get(reinterpret_cast<const unsigned char *>(&r[u][d]), v);
                    }
                }
                int4 res;
#pragma unroll
                for (int v = 0; v < V; v++) Val<DT>::put(reinterpret_cast<unsigned char *>(&res), v, acc[v]);
                reinterpret_cast<int4 *>(out + (size_t)(first + tl[u]) * row)[ch[u]] = res;
            }
        }
        return;
    }
    const size_t items = (size_t)ntok * hidden;
    for (size_t i = threadIdx.x; i < items; i += T) {
        const int tl = (int)(i / hidden), h = (int)(i % hidden);
        float acc = 0.0f;
        for (int d = 0; d < s.nd[tl]; d++) acc += Val<DT>::get(s.rows[tl * D + d], h);
        Val<DT>::put(out + (size_t)(first + tl) * row, h, acc);
    }
}

template <moea2a_datatype_t DT>
__global__ void __launch_bounds__(T, 1) combine_kernel(m2a_fast_t f, int n, int stride,
                                                       const unsigned char *__restrict__ expert_rows,
                                                       unsigned char *__restrict__ out)
{
    __shared__ CombineShared s;
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, me = p.me, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
    unsigned char *ws = f.peer[me];
    const Ctl c = ctl_of(f, ws);
    const size_t row = f.combine_row;
    bool ok = !failed(f);
    if (tid == 0) s.epoch = *reinterpret_cast<volatile uint32_t *>(c.epoch_c) + 1;
    __syncthreads();
    const uint32_t e = s.epoch;

    /* 1. caller rows into the combine buffer (valid slots only), then the signal */
    if (expert_rows && expert_rows != ws + f.combine) {
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
    __syncthreads();
    if (tid == 0) __threadfence_system();
    __syncthreads();
    ok = __syncthreads_and(ok);
    if (tid < ep && ok) add_release(&ctl_of(f, f.peer[tid]).carrive[me], 1);
    if (tid < ep && ok) ok = wait_for(f, &c.carrive[tid], e * (uint32_t)G, tid, M2A_FAST_AT_COMBINE);
    ok = __syncthreads_and(ok);

    /* 2. each block reduces a contiguous chunk of this rank's tokens */
    const int lo = (int)((long long)n * b / G), hi = (int)((long long)n * (b + 1) / G);
    const int D = p.k < ep ? p.k : ep, piece = (kPieceSlots / 2) / D < T ? (kPieceSlots / 2) / D : T;
    const int32_t *send_map = reinterpret_cast<const int32_t *>(ws + f.send_map);
    for (int first = lo; first < hi && ok; first += piece) {
        const int ntok = hi - first < piece ? hi - first : piece;
        if (tid < ntok) {
            const int32_t *map = send_map + (size_t)(first + tid) * p.k;
            int nd = 0;
            for (int d = 0; d < D; d++) {
                int32_t code = map[d];
                if (code < 0) break;
                int rank = code / p.cap, slot = code % p.cap;
                s.rows[tid * D + nd++] = f.peer[rank] + f.combine + ((size_t)me * stride + slot) * row;
            }
            s.nd[tid] = nd;
        }
        __syncthreads();
        reduce_piece<DT>(s, D, first, ntok, f.hidden, out);
        __syncthreads();
    }

    if (tid == 0) {
        __threadfence();
        if (atomicAdd(c.done_c, 1u) == (uint32_t)G - 1) {
            *c.done_c = 0;
            *c.epoch_c = e;
            __threadfence();
        }
    }
}

} // namespace

extern "C" int m2a_fast_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                                 const int32_t *ids, const float *weights, void *stream)
{
    dispatch_kernel<<<blocks, T, 0, (cudaStream_t)stream>>>(*f, n, stride, status, payloads, ids, weights);
    return (int)cudaGetLastError();
}

extern "C" int m2a_fast_combine(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows,
                                void *out, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned char *o = static_cast<unsigned char *>(out);
    switch (f->combine_dtype) {
    case MOEA2A_FLOAT32: combine_kernel<MOEA2A_FLOAT32><<<blocks, T, 0, s>>>(*f, n, stride, expert_rows, o); break;
    case MOEA2A_FLOAT16: combine_kernel<MOEA2A_FLOAT16><<<blocks, T, 0, s>>>(*f, n, stride, expert_rows, o); break;
    default: combine_kernel<MOEA2A_BFLOAT16><<<blocks, T, 0, s>>>(*f, n, stride, expert_rows, o); break;
    }
    return (int)cudaGetLastError();
}

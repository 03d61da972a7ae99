/* The dispatch kernel (both token regimes) and the signal of a copy-engine send. Part
 * of moe_fast.cu, which includes the parts in order: one translation unit, so that
 * every kernel keeps its inlining. */
namespace {

/* ---- dispatch ------------------------------------------------------------------------- */

/* Routes the piece [first, first + ntok) from the slots in s.base (each destination's
 * next slot, updated past the piece): every token's destinations and receive rows into
 * s.nd / s.rank / s.row (src * stride + slot); for the tokens in [own_lo, own_hi) the
 * send map, and their invalid and merged entries counted into *inv, *merged (the
 * general rule's dropped into *dropped, else NULL); pre: the piece's masks, computed
 * (and those entries counted) already, or NULL. */
template <class O>
__device__ void route_piece(const m2a_fast_t &f, Shared &s, const O &owner, const int32_t *ids, int first, int ntok,
                            int stride, int32_t *send_map, int own_lo, int own_hi, int *inv, int *merged, int *dropped,
                            const unsigned long long *pre)
{
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize, D = p.k < ep ? p.k : ep;
    const int t = first + tid;
    const bool own = tid < ntok && t >= own_lo && t < own_hi;
    int dummy = 0;
    unsigned long long m = 0;
    if (tid < ntok)
        m = pre ? pre[tid]
                : token_mask(p, owner, ids, t, own ? inv : &dummy, own ? merged : &dummy, {}, false,
                             O::kGeneral ? (own ? dropped : &dummy) : nullptr);
    for (int r = 0; r < ep; r++) {
        unsigned bal = __ballot_sync(kAllLanes, (m >> r) & 1);
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
        unsigned bal = __ballot_sync(kAllLanes, (m >> r) & 1);
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
    r.top = SMALL && r.hi - r.lo <= T ? r.hi : r.lo; /* few tokens: one pass over the ids */
    return r;
}

/* Two ways to the same slots and the same bytes (a rank picks by its own n; the
 * receiving side cannot tell them apart). Both begin alike: every block counts the
 * tokens before its own range itself (replicated, no wait on other blocks).
 *  - few tokens (up to m2a_fast_t.even_tokens per block): each block routes its range and
 *    copies its share of (token, segment) units, split evenly over all warps of the
 *    grid: rows start moving a few microseconds into the kernel (a range within one
 *    warp's lanes is routed by each warp for its own units: copy_tiny);
 *  - many tokens: a send map per chunk, and the units handed out by a counter
 *    (balance across SMs that the links serve unevenly matters more than the set-up
 *    then).
 * phases: M2A_FAST_SEND (steps 1-5), M2A_FAST_RECV (6) or both. A send-only launch
 * moves the epoch on when its last block ends; the receive-only launch that follows it
 * on the stream uses that epoch.
 * GEN: routes by the general rule (Holders: replicas, experts no rank holds, and their
 * dropped entries), for the contexts created with MOEA2A_MOE_GENERAL_PLACEMENT; the
 * one-holder kernel (GEN false) keeps none of that code. */
template <bool SMALL, QuantWay Q = kBefore, bool GEN = false>
__global__ void __launch_bounds__(T, 1) dispatch_kernel(m2a_fast_t f, int n, int stride, int status, m2a_kpayloads_t pay, const int32_t *__restrict__ ids,
                                                        const float *__restrict__ weights, int phases)
{
    __shared__ Shared s;
    __shared__ unsigned long long s_dropped; /* block 0 (GEN): the dropped entries of every block */
    const m2a_kparams_t &p = f.p;
    const int ep = p.ep, me = p.me, G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
    unsigned char *ws = f.peer[me];
    const Ctl c = ctl_of(f, ws);
    const bool send = (phases & M2A_FAST_SEND) != 0;
    /* ok: this block may go on; made uniform by __syncthreads_and at each step */
    bool ok = !failed(f);
    if (tid == 0) s.epoch = *reinterpret_cast<volatile uint32_t *>(c.epoch_d) + (send ? 1 : 0);
    if (tid < ep) s.base[tid] = 0;
    const Owners one = {send && p.num_experts <= kOwnerSmem ? s.owner : nullptr, p.owner};
    int general = 0; /* the general kernel: whether the placement is general now */
    if constexpr (!GEN) {
        if (one.smem)
            for (int i = tid; i < p.num_experts; i += T) s.owner[i] = (unsigned char)p.owner[i];
    } else if (one.smem) { /* seen in the table copied anyway (all -1 while general) */
        for (int i = tid; i < p.num_experts; i += T) {
            const int32_t o = p.owner[i];
            s.owner[i] = (unsigned char)o;
            general |= o < 0;
        }
    } else if (send && tid == 0) {
        general = m2a_general(p);
    }
    /* few tokens: the first ids this thread counts in step 1, loaded before the barrier
     * (the range needs no epoch), so that their round trip overlaps the epoch's and the
     * table's. The many-token kernels work out their range after it: their registers
     * are spoken for. */
    constexpr bool kHead = SMALL;
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
        if (warp * kWarpSize + lane < range.top) head = load_ids(p, ids + (size_t)(warp * kWarpSize + lane) * p.k, 0);
    }
    if constexpr (GEN) general = __syncthreads_or(general);
    else __syncthreads();
    const uint32_t e = s.epoch;
    const auto owner = rule<GEN>(one, general != 0);
    PROF_START(0);
    if (send) {
        if (b == 0 && tid == 0) c.next_unit[(e + 1) & 1] = 0; /* before this block's signal, which every block waits for */
        if constexpr (!kHead) ranges();
        const bool small = SMALL; /* n <= even_tokens x G, decided at launch (two kernels, each
                                   * compiled for its own way, leave the other's code out) */
        const int D = p.k < ep ? p.k : ep, piece = kPieceSlots / D < T ? kPieceSlots / D : T;
        int32_t *send_map = reinterpret_cast<int32_t *>(ws + f.send_map);
        const int lo = range.lo, hi = range.hi, own_lo = range.own_lo, own_hi = range.own_hi, top = range.top;
        const long long gw = (long long)b * kWarps + warp; /* small: this warp's units [wu0, wu1) */
        const long long wu0 = warp_share((long long)n * S, gw), wu1 = warp_share((long long)n * S, gw + 1);
        /* few tokens: step 2 (the gate) by the last warp, which has no tokens to count
         * below unless the block's range reaches past T - 32, while the others count,
         * instead of a round trip to memory after the count */
        const bool early_gate = small;
        if (early_gate && warp == kWarps - 1 && e > 1)
            for (int r = lane; r < ep && ok; r += kWarpSize) ok = wait_for(f, &c.carrive[r], (e - 1) * (uint32_t)G, r, M2A_FAST_AT_GATE);

        /* 1. the slots before this block's range, at every destination: every block counts
         * the tokens [0, lo) itself (a warp takes 32 at a time). Replicated, but no block
         * waits for another, and the copies take tokens in order: the first chunks, whose
         * counting is shortest, are needed first. Few tokens: the block's own [lo, hi)
         * in the same pass (their masks kept for the routing, their invalid and merged
         * entries counted), so that their ids are not read a second time after it. */
        int inv = 0, merged = 0, dropped = 0; /* dropped: the general rule's */
        {
            int cnt_lo = 0, cnt_hi = 0;
            for (int t0 = warp * kWarpSize; t0 < top; t0 += T) {
                const int t = t0 + lane;
                const bool mine = t >= lo && t < top, owned = mine && t >= own_lo && t < own_hi;
                int ti = 0, tm = 0, td = 0; /* kept in registers: a pointer chosen per token would put the counts in memory */
                unsigned long long m =
                    t < top ? token_mask(p, owner, ids, t, &ti, &tm, head, kHead && t0 == warp * kWarpSize, GEN ? &td : nullptr) : 0;
                if (owned) inv += ti, merged += tm, dropped += td;
                if (mine) s.pre[t - lo] = m, m = 0; /* the block's own: not before its range */
                for (int r = 0; r < ep; r++) {
                    const int cr = __popc(__ballot_sync(kAllLanes, (m >> r) & 1));
                    if (lane == (r % kWarpSize)) (r < kWarpSize ? cnt_lo : cnt_hi) += cr;
                }
            }
            if (lane < ep) s.warp_count[warp][lane] = cnt_lo;
            if (lane + kWarpSize < ep) s.warp_count[warp][lane + kWarpSize] = cnt_hi;
            __syncthreads();
            if (tid < ep)
                for (int w = 0; w < kWarps; w++) s.base[tid] += s.warp_count[w][tid];
            PROF_MARK(0, 0);
        }
        /* 2. every destination's previous combine began */
        if (!early_gate && tid < ep && e > 1 && ok) ok = wait_for(f, &c.carrive[tid], (e - 1) * (uint32_t)G, tid, M2A_FAST_AT_GATE);
        ok = __syncthreads_and(ok);
        PROF_MARK(0, 1);

        /* 3. route (and, small, copy) a piece of tokens at a time; or, a block's few
         * tokens within one warp's lanes, each warp its own units' tokens (copy_tiny,
         * FP8 quantized in the copies included) */
        const bool tiny = small && top == hi && hi - lo <= kWarpSize;
        if (tiny && ok) {
            PROF_MARK(0, 7);
            copy_tiny<Q>(f, s, owner, pay, ids, weights, send_map, stride, lo, own_lo, own_hi, wu0, wu1, per_token, S);
            PROF_MARK(0, 8);
        }
        for (int first = lo; first < hi && ok && !tiny; first += piece) {
            const int ntok = hi - first < piece ? hi - first : piece;
            route_piece(f, s, owner, ids, first, ntok, stride, send_map, own_lo, own_hi, &inv, &merged, GEN ? &dropped : nullptr,
                        top == hi ? s.pre + (first - lo) : nullptr);
            if (!small && first + ntok == hi && tid == 0) { /* 4. the chunk's send map is complete */
                __threadfence();
                atomicExch(&c.routed[b], e);
            }
            if (small) PROF_MARK(0, 7); /* few tokens: one piece per block, so one mark each */
            const int c0 = first > own_lo ? first : own_lo, c1 = first + ntok < own_hi ? first + ntok : own_hi;
            if (c1 > c0) copy_small(f, s, owner, D, first, c0 - first, c1 - first, ids, weights);
            if (small) PROF_MARK(0, 8);
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
        long long dropped_sum = 0;
        if constexpr (GEN) dropped_sum = block_sum<long long>(dropped, s.red);
        if (tid == 0 && ok) { /* before the signal: the stats take the sum once every block signalled */
            atomicAdd(&c.pending[2 * (e & 1)], (unsigned long long)inv_sum);
            atomicAdd(&c.pending[2 * (e & 1) + 1], (unsigned long long)merged_sum);
            if (GEN && dropped_sum) atomicAdd(&p.dropped_sums[e & 1], (unsigned long long)dropped_sum);
        }
        ok = __syncthreads_and(ok);
        PROF_MARK(0, 3);
        /* 5. counts and headers (last block: its bases are the totals; copy_tiny left them
         * before its range), then the signal */
        if (tiny && b == G - 1) {
            if (tid < ep)
                for (int l = 0; l < hi - lo; l++) s.base[tid] += (int)((s.pre[l] >> tid) & 1);
            __syncthreads();
        }
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
            if (b == 0 && tid == me) { /* every block of this rank added its sums before its signal */
                for (int i = 0; i < 2; i++)
                    s.pending[i] = *reinterpret_cast<volatile unsigned long long *>(&c.pending[2 * (e & 1) + i]);
                if constexpr (GEN) s_dropped = *reinterpret_cast<volatile unsigned long long *>(&p.dropped_sums[e & 1]);
            }
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
        if constexpr (GEN) { /* the dropped entries beside them (the one-holder kernels drop none) */
            volatile unsigned long long *d = p.dropped_sums;
            d[2] = ok ? s_dropped : d[e & 1];
            d[(e + 1) & 1] = 0;
        }
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

} // namespace

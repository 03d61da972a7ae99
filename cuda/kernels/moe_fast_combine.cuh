/* The combine kernels: signal, wait, reduce; and copy-engine mode's sum of landed
 * rows. Part of moe_fast.cu, which includes the parts in order: one translation unit,
 * so that every kernel keeps its inlining. */
namespace {

/* phases as dispatch_kernel's: M2A_FAST_SEND is step 1 and the signal, M2A_FAST_RECV
 * the wait and step 2 (in the way WAY; kFp8: the FP8 wire, moe_fast_fp8c.cuh, whose
 * launch has fp8c_smem(hidden) bytes of dynamic shared memory where it quantizes). */
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
     * visible to the peers before this one started. The FP8 wire quantizes every valid
     * row into the buffer, from the caller's rows or in place. */
    const bool fp8 = WAY == kFp8, ue8m0 = f.combine_fp8 == M2A_FAST_FP8_UE8M0;
    if (fp8 && !kQFirst && send && !status)
        fp8c_quantize<DT>(expert_rows ? expert_rows : ws + f.combine, row, ws + f.combine, row,
                          reinterpret_cast<const int32_t *>(ws + f.recv_counts), ep, stride, (int)f.hidden, ue8m0);
    const bool copy_in = send && !fp8 && expert_rows && expert_rows != ws + f.combine;
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
    const bool whole = !copy_in && !(fp8 && !kQFirst);
    if (send && tid < ep && ok && (!whole || tid == me || b == 0)) {
        const Ctl pc = ctl_of(f, f.peer[tid]); /* a failed rank's status goes out with its signal (the same thread) */
        if (status) pc.hdr[2 * me + 1] = status;
        signal_add(f, &pc.carrive[me], whole && tid != me ? (uint32_t)G : 1u);
    }
    if (!(phases & M2A_FAST_RECV)) {
        send_done(c.done_c, c.epoch_c, e);
        return;
    }
    const int D = p.k < ep ? p.k : ep, lane = tid % kWarpSize;
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
    const uint32_t S = fp8 ? (uint32_t)((f.hidden + kFSeg - 1) / kFSeg) : (uint32_t)((out_row + seg - 1) / seg);
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
            const unsigned long long g = __shfl_sync(kAllLanes, taken, 0);
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
            const unsigned long long g = __shfl_sync(kAllLanes, taken, 0);
            if (g >= grabs) break;
            if (lane == 0) taken = atomicAdd(next, 1ull);
            for (unsigned long long u = g * take; u < (g + 1) * take && u < units; u++) {
                const int t = (int)(u / S);
                if (t != t_prev) { /* the token's rows, ascending rank (D <= 64) */
                    code_rows(map_codes(send_map, p.k, t, D), PeerRow{f, stride, row}, &nd, &row_lo, &row_hi);
                    t_prev = t;
                }
                if constexpr (WAY == kFp8) {
                    if (ue8m0)
                        fp8c_reduce_unit<DT, true>(row_lo, row_hi, nd, (int)(u % S) * kFSeg, (int)f.hidden,
                                                   out + (size_t)t * out_row, vec);
                    else
                        fp8c_reduce_unit<DT, false>(row_lo, row_hi, nd, (int)(u % S) * kFSeg, (int)f.hidden,
                                                    out + (size_t)t * out_row, vec);
                } else {
                    const size_t off = (size_t)(u % S) * kSegC, len = out_row - off < kSegC ? out_row - off : kSegC;
                    reduce_unit<DT>(row_lo, row_hi, nd, off, len, out + (size_t)t * out_row, vec);
                }
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
    const long long gw = (long long)blockIdx.x * kWarps + (threadIdx.x / kWarpSize);
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

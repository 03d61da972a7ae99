/* The expert-major layout on the device (expert_kernels.h). The order of rows is
 * decided by counts and block-wide prefix sums, never by atomics: three passes, the
 * first two a block per (local expert, part of the slots):
 *   count   how many valid slots name the expert, per part (and the map cleared)
 *   fill    aligned offsets from the counts (each block sums what precedes it), then a
 *           prefix sum over its part's slots in slot order: each row's index and arrays
 *   copy    a warp per (slot, tile of the row): read once, written to each of its rows
 * (A variant that folded count into fill, every block counting all experts, measured
 * slower on one H200: dispatch 36.6 against 33.8 us at 128 tokens, 355 against 284 at 4096.)
 * A slot's order is ascending (source rank, source token), as the host reference's. */
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include "elem.cuh"
#include "expert_kernels.h"
#include "load.cuh"
#include "placement.cuh"
#include "warp.cuh"

namespace {

using m2a_elem::Elem;

constexpr int kThreads = 512;     /* count and fill: slots per step of a block */
constexpr int kCopyThreads = 256; /* copy and fold: 8 warps, a warp per (slot, tile) */
constexpr int kSlotsPerPart = 4096;

/* Whether slot (src, i) holds a token: i below the source's count. */
__device__ __forceinline__ bool valid_slot(const m2a_kexpert_t &x, int stride, size_t slot)
{
    return (int)(slot % (size_t)stride) < x.recv_counts[slot / (size_t)stride];
}

/* The first top-k slot of token row t (receive slot `slot`) naming expert e (a local
 * expert's global id, valid unless it is the invalid id), -1 if none: later repeats of
 * e share its row. Comparisons only, no table lookup per id: the k loads issue
 * together. With replicas in force (rep), e is this rank's for the token only where
 * their rule sends it here (the slot's source rank and token index). */
__device__ __forceinline__ int first_slot(const m2a_kexpert_t &x, const int32_t *t, int32_t e, bool rep, size_t slot,
                                          int stride)
{
    if (e == x.invalid_id) return -1;
    int first = -1;
    for (int s = x.k - 1; s >= 0; s--)
        if (t[s] == e) first = s;
    if (first >= 0 && rep &&
        m2a_holder_in(x.holders, x.nrep, x.ep, e, (int)(slot / (size_t)stride), x.src_index[slot]) != x.me)
        return -1;
    return first;
}

/* Part p of `parts` equal runs of the slots. */
__device__ __forceinline__ void part_range(int p, int parts, size_t slots, size_t *begin, size_t *end)
{
    const size_t span = (slots + (size_t)parts - 1) / (size_t)parts, b = (size_t)p * span;
    *begin = b < slots ? b : slots;
    *end = b + span < slots ? b + span : slots;
}

/* Block (j, p): part p's slots naming local expert j (blocks past the experts only
 * clear). Every block clears the map of the slots of its part it is assigned. */
__global__ void __launch_bounds__(kThreads) count(m2a_kexpert_t x, int stride, int parts)
{
    const int j = blockIdx.x, p = blockIdx.y, blocks = gridDim.x;
    size_t begin, end;
    part_range(p, parts, (size_t)x.ep * (size_t)stride, &begin, &end);
    int n = 0;
    const bool rep = x.nrep[x.num_experts] != 0;
    for (size_t base = begin; base < end; base += kThreads) {
        const size_t slot = base + threadIdx.x;
        int has = 0;
        if (slot < end && valid_slot(x, stride, slot)) {
            const int32_t *t = x.ids + slot * (size_t)x.k;
            has = j < x.num_local && first_slot(x, t, x.global_of[j], rep, slot, stride) >= 0;
            if ((slot - begin) % (size_t)blocks == (size_t)j)
                for (int s = 0; s < x.k; s++) x.map[slot * (size_t)x.k + s] = -1;
        }
        n += __syncthreads_count(has);
    }
    if (threadIdx.x == 0 && j < x.num_local) x.part_counts[p * x.num_local + j] = n;
}

__global__ void __launch_bounds__(kThreads) fill(m2a_kexpert_t x, int stride, int parts)
{
    typedef cub::BlockReduce<long long, kThreads> Reduce;
    typedef cub::BlockScan<int, kThreads> Scan;
    __shared__ union {
        typename Reduce::TempStorage reduce;
        typename Scan::TempStorage scan;
    } tmp;
    __shared__ long long s_total, s_before;
    const int j = blockIdx.x, p = blockIdx.y, el = x.num_local;
    const long long a = x.align;
    /* every expert's rows rounded up to the alignment: the total, and those before j */
    long long total = 0, before = 0;
    for (int q = threadIdx.x; q < el; q += kThreads) {
        long long c = 0;
        for (int pp = 0; pp < parts; pp++) c += x.part_counts[pp * el + q];
        const long long rounded = (c + a - 1) / a * a;
        total += rounded;
        if (q < j) before += rounded;
    }
    total = Reduce(tmp.reduce).Sum(total);
    __syncthreads();
    before = Reduce(tmp.reduce).Sum(before);
    if (threadIdx.x == 0) s_total = total, s_before = before;
    __syncthreads();
    total = s_total, before = s_before;
    const bool lead = p == 0 && threadIdx.x == 0;
    if (total > x.max_rows) { /* over the bound: nothing is written */
        if (lead && j == 0) *x.rows = -1;
        return;
    }
    if (j >= el) { /* a rank with no experts */
        if (lead && j == 0) x.offsets[0] = 0, *x.rows = 0;
        return;
    }
    int count = 0, base = 0;
    for (int pp = 0; pp < parts; pp++) {
        const int c = x.part_counts[pp * el + j];
        count += c;
        if (pp < p) base += c;
    }
    const int32_t off = (int32_t)before, end_off = (int32_t)(before + (count + a - 1) / a * a);
    const bool rep = x.nrep[x.num_experts] != 0;
    if (lead) {
        x.counts[j] = count, x.offsets[j] = off;
        if (j == el - 1) x.offsets[el] = (int32_t)total, *x.rows = total;
    }
    size_t begin, end;
    part_range(p, parts, (size_t)x.ep * (size_t)stride, &begin, &end);
    int32_t next = off + base;
    for (size_t b0 = begin; b0 < end; b0 += kThreads) {
        const size_t slot = b0 + threadIdx.x;
        const int32_t *t = x.ids + slot * (size_t)x.k;
        const int s0 = slot < end && valid_slot(x, stride, slot) ? first_slot(x, t, x.global_of[j], rep, slot, stride) : -1;
        int pos, taken;
        Scan(tmp.scan).ExclusiveSum(s0 >= 0 ? 1 : 0, pos, taken);
        if (s0 >= 0) {
            const int32_t row = next + pos, e = t[s0];
            x.xid[row] = e, x.xrank[row] = (int32_t)(slot / (size_t)stride), x.xtok[row] = x.src_index[slot];
            x.xslot[row] = s0;
            if (x.xw) x.xw[row] = x.weights[slot * (size_t)x.k + s0];
            for (int s = s0; s < x.k; s++)
                if (t[s] == e) x.map[slot * (size_t)x.k + s] = row;
        }
        next += taken;
        __syncthreads(); /* the scan's storage is reused */
    }
    if (p == parts - 1) /* the alignment gap after the expert's rows */
        for (int32_t row = off + count + (int32_t)threadIdx.x; row < end_off; row += kThreads) {
            x.xid[row] = x.invalid_id, x.xrank[row] = -1, x.xtok[row] = -1, x.xslot[row] = -1;
            if (x.xw) x.xw[row] = 0.0f;
        }
}

/* One chunk c (a V) of array a of slot `item`, read once and written to each row the
 * warp passes round (mine: this lane's map entry, n of them); every lane takes part. */
template <typename V>
__device__ __forceinline__ void spread(const m2a_kexpert_t &x, int a, size_t item, size_t c, int32_t mine, int n)
{
    const size_t w = x.width[a];
    const bool have = c < w / sizeof(V);
    const V v = have ? reinterpret_cast<const V *>(x.src[a] + item * w)[c] : V();
    for (int d = 0; d < n; d++) {
        const int32_t r = __shfl_sync(kAllLanes, mine, d);
        if (have && r >= 0) reinterpret_cast<V *>(x.dst[a] + (size_t)r * w)[c] = v;
    }
}

template <typename V>
__device__ __forceinline__ void zero_chunk(const m2a_kexpert_t &x, int a, int32_t row, size_t c)
{
    if (c < x.width[a] / sizeof(V)) reinterpret_cast<V *>(x.dst[a] + (size_t)row * x.width[a])[c] = V();
}

/* A warp per (item, tile of 32 chunks), so that even a few slots spread over the GPU:
 * items are the slots (each valid slot's arrays, read once, written to each of its
 * rows), then every possible gap row (num_local x align), whose arrays get zeros where
 * asked. Lanes fetch the slot's map entries, one each, and pass them round. A row
 * named twice (an expert repeated in the top-k) gets the same bytes twice from the
 * same lane. */
__global__ void __launch_bounds__(kCopyThreads) copy(m2a_kexpert_t x, int stride, size_t tiles, size_t gap_items)
{
    if (*x.rows < 0) return;
    const int lane = threadIdx.x % kWarpSize;
    const size_t slots = (size_t)x.ep * (size_t)stride, items = slots + gap_items;
    const size_t nwarps = (size_t)gridDim.x * (kCopyThreads / kWarpSize);
    for (size_t w = (size_t)blockIdx.x * (kCopyThreads / kWarpSize) + threadIdx.x / kWarpSize; w < items * tiles; w += nwarps) {
        const size_t item = w / tiles, c = (w % tiles) * kWarpSize + (size_t)lane;
        if (item >= slots) { /* a gap row, if this one is inside a gap */
            const size_t q = item - slots, j = q / (size_t)x.align;
            const int32_t row = x.offsets[j] + x.counts[j] + (int32_t)(q % (size_t)x.align);
            if (row >= x.offsets[j + 1]) continue;
            for (int a = 0; a < x.num_arrays; a++) {
                if (!x.always_zero[a] && !x.zero_padding) continue;
                if (x.vbytes[a] == 16) zero_chunk<int4>(x, a, row, c);
                else if (x.vbytes[a] == 4) zero_chunk<uint32_t>(x, a, row, c);
                else zero_chunk<unsigned char>(x, a, row, c);
            }
            continue;
        }
        if (!valid_slot(x, stride, item)) continue;
        for (int s0 = 0; s0 < x.k; s0 += kWarpSize) {
            const int32_t mine = s0 + lane < x.k ? x.map[item * (size_t)x.k + s0 + lane] : -1;
            const int n = x.k - s0 < kWarpSize ? x.k - s0 : kWarpSize;
            for (int a = 0; a < x.num_arrays; a++) {
                if (x.vbytes[a] == 16) spread<int4>(x, a, item, c, mine, n);
                else if (x.vbytes[a] == 4) spread<uint32_t>(x, a, item, c, mine, n);
                else spread<unsigned char>(x, a, item, c, mine, n);
            }
        }
    }
}

/* One combine element's product, rounded to fp32 before it is added (no FMA): the
 * host's arithmetic under -ffp-contract=off. */
__device__ __forceinline__ float add_product(float acc, float w, float v) { return __fadd_rn(acc, __fmul_rn(w, v)); }

/* A warp per (valid slot, tile of 32 steps): the slot's combine row from the rows its
 * map names, ascending top-k slot. VEC: a step is 16 bytes (rows and pointers 16-byte
 * aligned), else one element. */
template <moea2a_datatype_t DT, bool VEC>
__global__ void __launch_bounds__(kCopyThreads)
    fold(m2a_kexpert_t x, int stride, size_t hidden, int weighted, const unsigned char *rows, unsigned char *combine)
{
    constexpr int V = VEC ? 16 / (int)Elem<DT>::size : 1;
    const unsigned full = kAllLanes;
    const int lane = threadIdx.x % kWarpSize;
    const size_t row_bytes = Elem<DT>::size * hidden, steps = hidden / V, tiles = (steps + kWarpSize - 1) / kWarpSize;
    const size_t slots = (size_t)x.ep * (size_t)stride, nwarps = (size_t)gridDim.x * (kCopyThreads / kWarpSize);
    for (size_t w = (size_t)blockIdx.x * (kCopyThreads / kWarpSize) + threadIdx.x / kWarpSize; w < slots * tiles; w += nwarps) {
        const size_t slot = w / tiles, c = (w % tiles) * kWarpSize + (size_t)lane;
        if (!valid_slot(x, stride, slot)) continue;
        const bool have = c < steps;
        float acc[V];
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] = 0.0f;
        for (int s0 = 0; s0 < x.k; s0 += kWarpSize) {
            const size_t at = slot * (size_t)x.k + (size_t)(s0 + lane);
            const int32_t my_r = s0 + lane < x.k ? x.map[at] : -1;
            const float my_w = s0 + lane < x.k && weighted ? x.weights[at] : 1.0f;
            const int n = x.k - s0 < kWarpSize ? x.k - s0 : kWarpSize;
#pragma unroll 4
            for (int d = 0; d < n; d++) {
                const int32_t r = __shfl_sync(full, my_r, d);
                const float wt = __shfl_sync(full, my_w, d);
                if (!have || r < 0) continue;
                const unsigned char *in = rows + (size_t)r * row_bytes;
                if (VEC) {
                    const int4 raw = reinterpret_cast<const int4 *>(in)[c];
                    const unsigned char *b = reinterpret_cast<const unsigned char *>(&raw);
#pragma unroll
                    for (int v = 0; v < V; v++) acc[v] = add_product(acc[v], wt, Elem<DT>::load(b, (size_t)v));
                } else {
                    acc[0] = add_product(acc[0], wt, Elem<DT>::load(in, c));
                }
            }
        }
        if (!have) continue;
        unsigned char *out = combine + slot * row_bytes;
        if (VEC) {
            int4 res;
            unsigned char *rb = reinterpret_cast<unsigned char *>(&res);
#pragma unroll
            for (int v = 0; v < V; v++) Elem<DT>::store(rb, (size_t)v, acc[v]);
            reinterpret_cast<int4 *>(out)[c] = res;
        } else {
            Elem<DT>::store(out, c, acc[0]);
        }
    }
}

/* Blocks of kCopyThreads for this many warp items. */
int blocks_for(size_t warp_items)
{
    const size_t b = (warp_items + kCopyThreads / kWarpSize - 1) / (kCopyThreads / kWarpSize);
    return (int)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

int parts_for(size_t slots)
{
    const size_t p = (slots + kSlotsPerPart - 1) / kSlotsPerPart;
    return (int)(p < 1 ? 1 : p > M2A_EXPERT_MAX_PARTS ? M2A_EXPERT_MAX_PARTS : p);
}

template <moea2a_datatype_t DT>
void launch_fold(const m2a_kexpert_t *x, int stride, size_t hidden, int weighted, const unsigned char *rows,
                 unsigned char *combine, bool vec, cudaStream_t s)
{
    const size_t steps = vec ? Elem<DT>::size * hidden / 16 : hidden;
    const size_t warps = (size_t)x->ep * (size_t)stride * ((steps + kWarpSize - 1) / kWarpSize);
    if (vec) fold<DT, true><<<blocks_for(warps), kCopyThreads, 0, s>>>(*x, stride, hidden, weighted, rows, combine);
    else fold<DT, false><<<blocks_for(warps), kCopyThreads, 0, s>>>(*x, stride, hidden, weighted, rows, combine);
}

} // namespace

extern "C" int m2a_cuda_expert_expand(const m2a_kexpert_t *x, int stride, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t slots = (size_t)x->ep * (size_t)stride;
    const int parts = parts_for(slots);
    const dim3 grid(x->num_local > 0 ? x->num_local : 1, parts);
    if (grid.x > 65535u) return (int)cudaErrorNotSupported;
    count<<<grid, kThreads, 0, s>>>(*x, stride, parts);
    fill<<<grid, kThreads, 0, s>>>(*x, stride, parts);
    /* each array in the widest chunks its rows and bases allow */
    m2a_kexpert_t xc = *x;
    size_t chunks = 0; /* of the array with the most */
    bool gaps = x->zero_padding != 0;
    for (int a = 0; a < x->num_arrays; a++) {
        const uintptr_t at = (uintptr_t)x->src[a] | (uintptr_t)x->dst[a];
        xc.vbytes[a] = x->width[a] % 16 == 0 && at % 16 == 0 ? 16 : x->width[a] % 4 == 0 && at % 4 == 0 ? 4 : 1;
        const size_t c = x->width[a] / (size_t)xc.vbytes[a];
        chunks = c > chunks ? c : chunks;
        gaps = gaps || x->always_zero[a];
    }
    const size_t tiles = (chunks + kWarpSize - 1) / kWarpSize, gap_items = gaps ? (size_t)x->num_local * (size_t)x->align : 0;
    if (tiles > 0) copy<<<blocks_for((slots + gap_items) * tiles), kCopyThreads, 0, s>>>(xc, stride, tiles, gap_items);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_expert_fold(const m2a_kexpert_t *x, int stride, moea2a_datatype_t dtype, size_t hidden,
                                    int weighted, const unsigned char *rows, unsigned char *combine, void *stream)
{
    if (hidden == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const size_t es = dtype == MOEA2A_FLOAT32 ? 4 : 2;
    const bool vec = (es * hidden) % 16 == 0 && ((uintptr_t)rows | (uintptr_t)combine) % 16 == 0;
    switch (dtype) {
    case MOEA2A_FLOAT32: launch_fold<MOEA2A_FLOAT32>(x, stride, hidden, weighted, rows, combine, vec, s); break;
    case MOEA2A_FLOAT16: launch_fold<MOEA2A_FLOAT16>(x, stride, hidden, weighted, rows, combine, vec, s); break;
    default: launch_fold<MOEA2A_BFLOAT16>(x, stride, hidden, weighted, rows, combine, vec, s); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_expert_load(void)
{
    int e = m2a_load_kernel(copy, m2a_load_kernel(fill, m2a_load_kernel(count, 0)));
    e = m2a_load_kernel(fold<MOEA2A_BFLOAT16, true>, m2a_load_kernel(fold<MOEA2A_BFLOAT16, false>, e));
    e = m2a_load_kernel(fold<MOEA2A_FLOAT16, true>, m2a_load_kernel(fold<MOEA2A_FLOAT16, false>, e));
    return m2a_load_kernel(fold<MOEA2A_FLOAT32, true>, m2a_load_kernel(fold<MOEA2A_FLOAT32, false>, e));
}

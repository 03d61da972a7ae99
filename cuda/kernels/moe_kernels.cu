/* CUDA kernels of the MoE data path: routing, packing, sanitize, combine. Written to
 * give exactly the bits of the host reference (lib/moe/backend/host_kernels.c). */
#include <cub/block/block_scan.cuh>
#include <string.h>
#include <cuda_runtime.h>

#include "elem.cuh"
#include "fp8c_device.cuh"
#include "moe_kernels.h"
#include "load.cuh"
#include "placement.cuh"

namespace {

using m2a_elem::Elem;

constexpr int kScanThreads = 512;

__device__ __forceinline__ bool expert_invalid(const m2a_kparams_t &p, int32_t e)
{
    return e < 0 || e >= p.num_experts || e == p.invalid_id;
}

/* Step 1, one thread per token: the token's destination ranks, each once, in
 * ascending order, written as -(rank + 2) (distinct from padding -1 and from the
 * final rank*cap+slot >= 0 that step 2 writes). */
__global__ void route_dests(m2a_kparams_t p, int n, const int32_t *__restrict__ ids, int32_t *__restrict__ map,
                            unsigned long long *stats)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int32_t *row = ids + (size_t)t * p.k;
    int32_t *m = map + (size_t)t * p.k;
    int nd = 0;
    unsigned long long invalid = 0, merged = 0, dropped = 0;
    const bool rep = m2a_general(p);
    for (int j = 0; j < p.k; j++) {
        int32_t e = row[j];
        if (expert_invalid(p, e)) {
            invalid++;
            continue;
        }
        const int dest = m2a_expert_rank(p, rep, e, p.me, t);
        if (dest < 0) { /* held by no rank */
            dropped++;
            continue;
        }
        int32_t code = -(dest + 2);
        bool seen = false;
        for (int d = 0; d < nd; d++) seen |= m[d] == code;
        if (seen) {
            merged++;
            continue;
        }
        int d = nd++;
        while (d > 0 && m[d - 1] < code) m[d] = m[d - 1], d--; /* -(r+2) descending = r ascending */
        m[d] = code;
    }
    for (int d = nd; d < p.k; d++) m[d] = -1;
    if (invalid) atomicAdd(&stats[0], invalid); /* sums only: order does not matter */
    if (merged) atomicAdd(&stats[1], merged);
    if (dropped) atomicAdd(&stats[2], dropped);
}

/* Step 2, one block per destination rank r: an exclusive scan over tokens of "goes
 * to r" gives each token its slot at r, in token order. */
__global__ void __launch_bounds__(kScanThreads) route_slots(m2a_kparams_t p, int n, int32_t *__restrict__ map,
                                                            int32_t *__restrict__ send_counts)
{
    using Scan = cub::BlockScan<int, kScanThreads>;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ int carry;
    const int r = blockIdx.x;
    const int32_t code = -(r + 2);
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < n; base += kScanThreads) {
        int t = base + threadIdx.x, entry = -1;
        if (t < n)
            for (int d = 0; d < p.k; d++)
                if (map[(size_t)t * p.k + d] == code) entry = d;
        int slot, total;
        Scan(tmp).ExclusiveSum(entry >= 0 ? 1 : 0, slot, total);
        if (entry >= 0) map[(size_t)t * p.k + entry] = r * p.cap + carry + slot;
        __syncthreads();
        if (threadIdx.x == 0) carry += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) send_counts[r] = carry;
}

/* Copies `bytes` with 16-byte vectors when both sides allow it. */
__device__ __forceinline__ void copy_row(unsigned char *dst, const unsigned char *src, size_t bytes)
{
    if ((((uintptr_t)dst | (uintptr_t)src | bytes) & 15) == 0) {
        const int4 *s = reinterpret_cast<const int4 *>(src);
        int4 *d = reinterpret_cast<int4 *>(dst);
        for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
    } else if ((((uintptr_t)dst | (uintptr_t)src | bytes) & 3) == 0) {
        const int *s = reinterpret_cast<const int *>(src);
        int *d = reinterpret_cast<int *>(dst);
        for (size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) d[i] = s[i];
    } else {
        for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

/* One block per token: every destination gets every array of the token. A row for
 * this rank lands in source block `block` of the workspace; the source index is the
 * token number, or src_index[t] where given (rows relayed for another rank). */
__global__ void pack(m2a_kparams_t p, int n, int stride, m2a_kpayloads_t pay, const int32_t *__restrict__ ids,
                     const float *__restrict__ weights, const int32_t *__restrict__ map, unsigned char *ws,
                     unsigned char *stage, int block, const unsigned char *src_index)
{
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        for (int d = 0; d < p.k; d++) {
            int32_t e = map[(size_t)t * p.k + d];
            if (e < 0) break;
            int rank = e / p.cap, slot = e % p.cap, s = p.stage_index[rank];
            for (int a = 0; a < p.narrays; a++) {
                size_t w = p.width[a];
                const unsigned char *src;
                if (a < p.num_payloads) src = (const unsigned char *)pay.p[a] + (size_t)t * w;
                else if (a == p.num_payloads) src = (const unsigned char *)(ids + (size_t)t * p.k);
                else if (a == p.narrays - 1) src = src_index ? src_index + (size_t)t * 4 : nullptr; /* else t */
                else src = (const unsigned char *)(weights + (size_t)t * p.k);
                unsigned char *dst = s < 0 ? ws + p.ws_off[a] + ((size_t)block * stride + slot) * w
                                           : stage + (size_t)s * p.cap * p.record + (size_t)p.cap * p.rec_off[a] + (size_t)slot * w;
                if (src) {
                    copy_row(dst, src, w);
                } else if (threadIdx.x < 4) { /* staging offsets may be odd: byte stores */
                    int32_t v = t;
                    dst[threadIdx.x] = reinterpret_cast<const unsigned char *>(&v)[threadIdx.x];
                }
            }
        }
    }
}

__global__ void sanitize(m2a_kparams_t p, int stride, const int32_t *__restrict__ counts, int32_t *__restrict__ ids,
                         int32_t *__restrict__ src_index, int do_sanitize, int rewrite)
{
    size_t slots = (size_t)p.ep * stride;
    const bool rep = rewrite && m2a_general(p);
    for (size_t slot = blockIdx.x * (size_t)blockDim.x + threadIdx.x; slot < slots; slot += (size_t)gridDim.x * blockDim.x) {
        int src = (int)(slot / stride), i = (int)(slot % stride);
        bool pad = i >= counts[src];
        if (pad) src_index[slot] = -1;
        if (!do_sanitize) continue;
        int32_t *row = ids + slot * p.k;
        const int t = pad ? 0 : src_index[slot]; /* the token's index at its source: the replicas' rule */
        for (int j = 0; j < p.k; j++) {
            int32_t e = row[j];
            if (pad || expert_invalid(p, e) || (rewrite && m2a_expert_rank(p, rep, e, src, t) != p.me))
                row[j] = p.invalid_id;
        }
    }
}

constexpr int kMaxDest = 64; /* destinations per token kept in shared memory */

/* The rows token t gets back, in ascending rank order (the send map's order): this
 * rank's own from self_rows, the others' from their landing region. Across nodes
 * (p.nodes > 1) they are regrouped by node, ascending, ranks ascending within a node
 * (a stable sort), and *ends has bit d set where row d ends its node's group; 0 on
 * one node. */
__device__ int token_rows(const m2a_kparams_t &p, const int32_t *map, int t, size_t row_bytes,
                          const unsigned char *self_rows, const unsigned char *landing, const unsigned char **rows,
                          unsigned long long *ends, unsigned long long *far = nullptr)
{
    int nd = 0, node[kMaxDest];
    for (int d = 0; d < p.k && nd < kMaxDest; d++) {
        int32_t e = map[(size_t)t * p.k + d];
        if (e < 0) break;
        int rank = e / p.cap, slot = e % p.cap;
        const unsigned char *row = rank == p.me ? self_rows + (size_t)slot * row_bytes
                                                : landing + ((size_t)p.stage_index[rank] * p.cap + slot) * row_bytes;
        int q = p.nodes > 1 ? p.node[rank] : 0, i = nd++;
        while (i > 0 && node[i - 1] > q) rows[i] = rows[i - 1], node[i] = node[i - 1], i--;
        rows[i] = row, node[i] = q;
    }
    *ends = 0;
    for (int d = 0; p.nodes > 1 && d < nd; d++)
        if (d == nd - 1 || node[d + 1] != node[d]) *ends |= 1ull << d;
    if (far) { /* bit d: row d comes from another node than this rank's */
        *far = 0;
        for (int d = 0; p.nodes > 1 && d < nd; d++)
            if (node[d] != p.node[p.me]) *far |= 1ull << d;
    }
    return nd;
}

/* One block per token; threads over hidden. Sum from 0.0f in ascending rank order
 * (the order of the send map), rounded once: the host reference's arithmetic. */
template <moea2a_datatype_t DT>
__global__ void combine(m2a_kparams_t p, int n, const int32_t *__restrict__ map, size_t hidden,
                        const unsigned char *self_rows, const unsigned char *landing, unsigned char *out)
{
    __shared__ const unsigned char *rows[kMaxDest];
    __shared__ int nrows;
    __shared__ unsigned long long ends;
    const size_t row_bytes = Elem<DT>::size * hidden;
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        if (threadIdx.x == 0) nrows = token_rows(p, map, t, row_bytes, self_rows, landing, rows, &ends);
        __syncthreads();
        unsigned char *o = out + (size_t)t * row_bytes;
        for (size_t h = threadIdx.x; h < hidden; h += blockDim.x) {
            float acc = 0.0f, total = 0.0f;
            for (int d = 0; d < nrows; d++) {
                acc += Elem<DT>::load(rows[d], h);
                if ((ends >> d) & 1) total += Elem<DT>::round(acc), acc = 0.0f; /* a node's partial, as it travels */
            }
            Elem<DT>::store(o, h, ends ? total : acc);
        }
        __syncthreads();
    }
}

/* The same reduction, 16 bytes per load and store (8 bf16/fp16 or 4 fp32 values per
 * thread step): each element still sums from 0.0f over the token's rows in
 * ascending rank order, so the bits equal the scalar kernel's. Needs 16-byte rows
 * and pointers. */
template <moea2a_datatype_t DT>
__global__ void combine_vec(m2a_kparams_t p, int n, const int32_t *__restrict__ map, size_t hidden,
                            const unsigned char *self_rows, const unsigned char *landing, unsigned char *out)
{
    constexpr int V = 16 / Elem<DT>::size;
    __shared__ const unsigned char *rows[kMaxDest];
    __shared__ int nrows;
    __shared__ unsigned long long ends;
    const size_t row_bytes = Elem<DT>::size * hidden, chunks = row_bytes / 16;
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        if (threadIdx.x == 0) nrows = token_rows(p, map, t, row_bytes, self_rows, landing, rows, &ends);
        __syncthreads();
        unsigned char *o = out + (size_t)t * row_bytes;
        for (size_t c = threadIdx.x; c < chunks; c += blockDim.x) {
            float acc[V], total[V];
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] = 0.0f, total[v] = 0.0f;
            for (int d = 0; d < nrows; d++) {
                int4 raw = reinterpret_cast<const int4 *>(rows[d])[c];
                const unsigned char *b = reinterpret_cast<const unsigned char *>(&raw);
#pragma unroll
                for (int v = 0; v < V; v++) acc[v] += Elem<DT>::load(b, (size_t)v);
                if ((ends >> d) & 1) { /* a node's partial, as it travels between nodes */
#pragma unroll
                    for (int v = 0; v < V; v++) total[v] += Elem<DT>::round(acc[v]), acc[v] = 0.0f;
                }
            }
            int4 res;
            unsigned char *rb = reinterpret_cast<unsigned char *>(&res);
#pragma unroll
            for (int v = 0; v < V; v++) Elem<DT>::store(rb, (size_t)v, ends ? total[v] : acc[v]);
            reinterpret_cast<int4 *>(o)[c] = res;
        }
        __syncthreads();
    }
}

/* The FP8 combine wire's sum (wire: M2A_FAST_FP8 or M2A_FAST_FP8_UE8M0): rows of hidden
 * codes and their scales (wire_row bytes), dequantized and added as combine_vec adds
 * values, 16 per thread step; across nodes each node's partial quantized again by the
 * block rule (8 adjacent threads hold a block of 128) and added dequantized, as the
 * host reference does. HOW, the hierarchical path's bits of cuda_module.h (0 on the
 * flat paths, a kernel of its own each): M2A_FAST_WIRE_PARTIALS adds the rows of other
 * nodes as the partials they are; M2A_FAST_WIRE_OUT stores each sum as a wire row
 * (wire_row bytes apart). vec: every row and out 16-byte aligned. */
template <moea2a_datatype_t DT, int HOW>
__global__ void combine_fp8(m2a_kparams_t p, int n, const int32_t *__restrict__ map, size_t hidden, size_t wire_row,
                            int wire, bool vec, const unsigned char *self_rows, const unsigned char *landing,
                            unsigned char *out)
{
    using namespace m2a_fp8c;
    constexpr int V = 16 / (int)Elem<DT>::size;
    constexpr bool wire_out = HOW & M2A_FAST_WIRE_OUT, partials = HOW & M2A_FAST_WIRE_PARTIALS;
    __shared__ const unsigned char *rows[kMaxDest];
    __shared__ int nrows;
    __shared__ unsigned long long ends, far;
    const bool ue8m0 = (wire & M2A_FAST_WIRE_KIND) == M2A_FAST_FP8_UE8M0;
    const size_t out_row = wire_out ? wire_row : Elem<DT>::size * hidden, groups = hidden / kQv;
    const int nkb = (int)(hidden / M2A_FP8_BLOCK);
    for (int t = blockIdx.x; t < n; t += gridDim.x) {
        if (threadIdx.x == 0) nrows = token_rows(p, map, t, wire_row, self_rows, landing, rows, &ends, partials ? &far : nullptr);
        __syncthreads();
        const unsigned long long came = partials ? far : 0; /* rows added as they came */
        unsigned char *o = out + (size_t)t * out_row;
        for (size_t c0 = 0; c0 < groups; c0 += blockDim.x) { /* block-uniform: every lane reaches the shuffles */
            const size_t c = c0 + threadIdx.x;
            const bool live = c < groups;
            const int kb = (int)(c / kQLanes);
            float acc[kQv], total[kQv];
#pragma unroll
            for (int v = 0; v < kQv; v++) acc[v] = 0.0f, total[v] = 0.0f;
            for (int d = 0; d < nrows; d++) {
                const bool as_came = (came >> d) & 1;
                if (live) {
                    const uint4 q = load16(rows[d] + c * kQv, vec);
                    const float sc = fp8c_scale(rows[d], (int)hidden, kb, ue8m0);
                    if (as_came) fp8c_add(total, q, sc);
                    else fp8c_add(acc, q, sc);
                }
                if (((ends >> d) & 1) && !as_came) { /* a node's partial, as it travels between nodes: FP8 again */
                    uint32_t am = 0, w[kQv / 4];
#pragma unroll
                    for (int v = 0; v < kQv; v++) am = max(am, __float_as_uint(acc[v]) & 0x7fffffffu);
                    const uint32_t sb = fp8c_encode(acc, am, ue8m0, w);
                    fp8c_add(total, make_uint4(w[0], w[1], w[2], w[3]), m2a_fp8_scale_value(sb, ue8m0));
#pragma unroll
                    for (int v = 0; v < kQv; v++) acc[v] = 0.0f;
                }
            }
            if constexpr (wire_out) { /* the sum as it will travel: codes, then the block's scale */
                uint32_t am = 0, w[kQv / 4];
#pragma unroll
                for (int v = 0; v < kQv; v++) am = max(am, __float_as_uint(acc[v]) & 0x7fffffffu);
                const uint32_t sb = fp8c_encode(acc, am, ue8m0, w);
                if (!live) continue;
                store16(o + c * kQv, make_uint4(w[0], w[1], w[2], w[3]), vec);
                if (c % kQLanes == 0) {
                    if (ue8m0) o[hidden + kb] = (unsigned char)sb;
                    else reinterpret_cast<uint32_t *>(o + hidden)[kb] = sb;
                }
                if (c == 0 && ue8m0) /* the scale bytes' padding to a word */
                    for (int z = nkb; z < (nkb + 3) / 4 * 4; z++) o[hidden + z] = 0;
                continue;
            }
            if (!live) continue;
            const float *sum = ends ? total : acc;
            unsigned char *dst = o + c * kQv * Elem<DT>::size;
            if (vec) {
#pragma unroll
                for (int q = 0; q < kQv / V; q++) reinterpret_cast<int4 *>(dst)[q] = m2a_elem::pack_vec<DT>(sum + V * q);
            } else {
#pragma unroll
                for (int v = 0; v < kQv; v++) Elem<DT>::store(dst, (size_t)v, sum[v]);
            }
        }
        __syncthreads();
    }
}

/* The FP8 combine wire's rows for the generic paths: ep x stride rows of in (in_row
 * bytes apart, the valid ones as counts says) quantized into out (out_row apart). */
template <moea2a_datatype_t DT>
__global__ void __launch_bounds__(256) combine_quantize(int ep, int stride, const int32_t *__restrict__ counts,
                                                       size_t hidden, int wire, const unsigned char *in, size_t in_row,
                                                       unsigned char *out, size_t out_row)
{
    m2a_fp8c::fp8c_quantize<DT>(in, in_row, out, out_row, counts, ep, stride, (int)hidden, wire == M2A_FAST_FP8_UE8M0);
}

/* combine_fp8 for out's dtype. */
template <int HOW>
void launch_fp8(moea2a_datatype_t dtype, dim3 grid, dim3 block, cudaStream_t s, const m2a_kparams_t &p, int n,
                const int32_t *map, size_t hidden, size_t wrow, int wire, bool v, const unsigned char *self_rows,
                const unsigned char *landing, unsigned char *o)
{
    switch (dtype) {
    case MOEA2A_FLOAT32: combine_fp8<MOEA2A_FLOAT32, HOW><<<grid, block, 0, s>>>(p, n, map, hidden, wrow, wire, v, self_rows, landing, o); break;
    case MOEA2A_FLOAT16: combine_fp8<MOEA2A_FLOAT16, HOW><<<grid, block, 0, s>>>(p, n, map, hidden, wrow, wire, v, self_rows, landing, o); break;
    default: combine_fp8<MOEA2A_BFLOAT16, HOW><<<grid, block, 0, s>>>(p, n, map, hidden, wrow, wire, v, self_rows, landing, o); break;
    }
}

/* e, or the error of loading combine_fp8's three float instantiations for HOW. */
template <int HOW>
int load_fp8(int e)
{
    return m2a_load_kernel(combine_fp8<MOEA2A_FLOAT32, HOW>,
                           m2a_load_kernel(combine_fp8<MOEA2A_FLOAT16, HOW>, m2a_load_kernel(combine_fp8<MOEA2A_BFLOAT16, HOW>, e)));
}

int grid_for(long long work, int per_block)
{
    long long g = (work + per_block - 1) / per_block;
    return (int)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

} // namespace

extern "C" int m2a_cuda_route(const m2a_kparams_t *p, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                              unsigned long long *stats, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (n > 0) route_dests<<<grid_for(n, 256), 256, 0, s>>>(*p, n, ids, send_map, stats);
    route_slots<<<p->ep, kScanThreads, 0, s>>>(*p, n, send_map, send_counts);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_pack(const m2a_kparams_t *p, int n, int stride, m2a_kpayloads_t payloads, const int32_t *ids,
                             const float *weights, const int32_t *send_map, unsigned char *ws, unsigned char *stage_send,
                             int block, const void *src_index, void *stream)
{
    if (n <= 0) return 0;
    pack<<<grid_for(n, 1), 256, 0, (cudaStream_t)stream>>>(*p, n, stride, payloads, ids, weights, send_map, ws, stage_send,
                                                           block, (const unsigned char *)src_index);
    return (int)cudaGetLastError();
}

/* Words per launch of write_words: with the count and pointer within the 4 KB of
 * parameters every architecture takes. */
constexpr int kWordsPerLaunch = 960;
struct Words {
    int32_t v[kWordsPerLaunch];
};

__global__ void write_words_kernel(int32_t *dst, int n, Words w)
{
    if ((int)threadIdx.x < n) dst[threadIdx.x] = w.v[threadIdx.x];
}

extern "C" int m2a_cuda_write_words(int32_t *dst, const int32_t *src, int n, void *stream)
{
    for (int at = 0; at < n; at += kWordsPerLaunch) {
        const int m = n - at < kWordsPerLaunch ? n - at : kWordsPerLaunch;
        Words w;
        memcpy(w.v, src + at, sizeof(int32_t) * (size_t)m);
        write_words_kernel<<<1, kWordsPerLaunch, 0, (cudaStream_t)stream>>>(dst + at, m, w);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return (int)e;
    }
    return 0;
}

/* One thread per receive slot: each valid slot's entries that this rank holds, each
 * expert once per token (the host reference's rule, moe/load.c), added to load[E]. */
__global__ void count_load(const m2a_kparams_t p, int stride, const int32_t *recv_counts, const int32_t *ids,
                           const int32_t *src_index, unsigned long long *load)
{
    const long long slots = (long long)p.ep * stride, step = (long long)gridDim.x * blockDim.x;
    const bool rep = m2a_general(p);
    for (long long slot = (long long)blockIdx.x * blockDim.x + threadIdx.x; slot < slots; slot += step) {
        const int src = (int)(slot / stride), i = (int)(slot % stride);
        if (i >= recv_counts[src]) continue;
        const int32_t *row = ids + slot * p.k;
        for (int j = 0; j < p.k; j++) {
            const int32_t e = row[j];
            if (e < 0 || e >= p.num_experts || m2a_expert_rank(p, rep, e, src, src_index[slot]) != p.me) continue;
            bool repeat = false;
            for (int q = 0; q < j; q++) repeat |= row[q] == e;
            if (!repeat) atomicAdd(load + e, 1ull);
        }
    }
}

extern "C" int m2a_cuda_count_load(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, const int32_t *ids,
                                   const int32_t *src_index, int64_t *load, void *stream)
{
    const long long slots = (long long)p->ep * stride;
    if (slots <= 0) return 0;
    count_load<<<grid_for(slots, 256), 256, 0, (cudaStream_t)stream>>>(*p, stride, recv_counts, ids, src_index,
                                                                        (unsigned long long *)load);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_sanitize(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, int32_t *ids,
                                 int32_t *src_index, int do_sanitize, int rewrite_nonlocal, void *stream)
{
    long long slots = (long long)p->ep * stride;
    sanitize<<<grid_for(slots, 256), 256, 0, (cudaStream_t)stream>>>(*p, stride, recv_counts, ids, src_index,
                                                                      do_sanitize, rewrite_nonlocal);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_combine(const m2a_kparams_t *p, int n, const int32_t *send_map, moea2a_datatype_t dtype,
                                size_t hidden, int wire, const unsigned char *self_rows, const unsigned char *landing,
                                void *out, void *stream)
{
    if (n <= 0 || hidden == 0) return 0;
    if (p->k > kMaxDest && p->ep > kMaxDest) return (int)cudaErrorNotSupported; /* more than 64 ranks per token */
    dim3 grid(grid_for(n, 1)), block(256);
    cudaStream_t s = (cudaStream_t)stream;
    unsigned char *o = (unsigned char *)out;
    size_t es = dtype == MOEA2A_FLOAT32 ? 4 : 2;
    if (wire != M2A_FAST_AS_IS) {
        const size_t nkb = hidden / M2A_FP8_BLOCK;
        const size_t wrow = hidden + 4 * ((wire & M2A_FAST_WIRE_KIND) == M2A_FAST_FP8_UE8M0 ? (nkb + 3) / 4 : nkb);
        const bool v = wrow % 16 == 0 && (((uintptr_t)self_rows | (uintptr_t)landing | (uintptr_t)out) % 16 == 0);
        const int how = wire & ~M2A_FAST_WIRE_KIND;
        if (how == M2A_FAST_WIRE_OUT) launch_fp8<M2A_FAST_WIRE_OUT>(dtype, grid, block, s, *p, n, send_map, hidden, wrow, wire, v, self_rows, landing, o);
        else if (how == M2A_FAST_WIRE_PARTIALS) launch_fp8<M2A_FAST_WIRE_PARTIALS>(dtype, grid, block, s, *p, n, send_map, hidden, wrow, wire, v, self_rows, landing, o);
        else if (how == 0) launch_fp8<0>(dtype, grid, block, s, *p, n, send_map, hidden, wrow, wire, v, self_rows, landing, o);
        else return (int)cudaErrorInvalidValue; /* one of them at a time */
        return (int)cudaGetLastError();
    }
    bool vec = ((es * hidden) % 16 == 0) && (((uintptr_t)self_rows | (uintptr_t)landing | (uintptr_t)out) % 16 == 0);
    if (vec) {
        switch (dtype) {
        case MOEA2A_FLOAT32: combine_vec<MOEA2A_FLOAT32><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
        case MOEA2A_FLOAT16: combine_vec<MOEA2A_FLOAT16><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
        default: combine_vec<MOEA2A_BFLOAT16><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
        }
        return (int)cudaGetLastError();
    }
    switch (dtype) {
    case MOEA2A_FLOAT32: combine<MOEA2A_FLOAT32><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
    case MOEA2A_FLOAT16: combine<MOEA2A_FLOAT16><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
    default: combine<MOEA2A_BFLOAT16><<<grid, block, 0, s>>>(*p, n, send_map, hidden, self_rows, landing, o); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_combine_quantize(int ep, int stride, const int32_t *recv_counts, moea2a_datatype_t dtype,
                                         size_t hidden, int wire, const unsigned char *in, size_t in_row,
                                         unsigned char *out, size_t out_row, void *stream)
{
    constexpr int threads = 256;
    const size_t smem = (size_t)(threads / kWarpSize) * (hidden / M2A_FP8_BLOCK) * 4;
    const dim3 grid(grid_for((long long)ep * stride, threads / kWarpSize));
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case MOEA2A_FLOAT32: combine_quantize<MOEA2A_FLOAT32><<<grid, threads, smem, s>>>(ep, stride, recv_counts, hidden, wire, in, in_row, out, out_row); break;
    case MOEA2A_FLOAT16: combine_quantize<MOEA2A_FLOAT16><<<grid, threads, smem, s>>>(ep, stride, recv_counts, hidden, wire, in, in_row, out, out_row); break;
    default: combine_quantize<MOEA2A_BFLOAT16><<<grid, threads, smem, s>>>(ep, stride, recv_counts, hidden, wire, in, in_row, out, out_row); break;
    }
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_moe_load(void)
{
    int e = m2a_load_kernel(route_dests, 0);
    e = m2a_load_kernel(route_slots, m2a_load_kernel(pack, m2a_load_kernel(sanitize, e)));
    e = load_fp8<0>(load_fp8<M2A_FAST_WIRE_OUT>(load_fp8<M2A_FAST_WIRE_PARTIALS>(M2A_LOAD_FLOATS(combine_quantize, e))));
    return M2A_LOAD_FLOATS(combine_vec, M2A_LOAD_FLOATS(combine, e));
}

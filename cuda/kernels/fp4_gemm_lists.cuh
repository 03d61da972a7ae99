/* Rank-major rows: each expert's (row, slot) pairs listed on the device. Part of
 * fp4_gemm.cu, which includes the parts in order: one translation unit, so that every
 * kernel keeps its inlining. */
namespace {

/* Rank-major: expert e's (row, slot) pairs, ascending; one block per expert. */
constexpr int LIST_THREADS = 256;

__device__ int block_sum(int v, int *scratch)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kAllLanes, v, o);
    __syncthreads();
    if ((threadIdx.x % kWarpSize) == 0) scratch[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    int s = 0;
    for (int w = 0; w < LIST_THREADS / kWarpSize; w++) s += scratch[w];
    return s;
}

__global__ void __launch_bounds__(LIST_THREADS) list_count(const m2a_kgemm_t p)
{
    __shared__ int scratch[LIST_THREADS / kWarpSize];
    const int32_t id = p.first_expert + (int32_t)blockIdx.x;
    const int64_t pairs = p.rows * p.slots;
    int c = 0;
    for (int64_t i = threadIdx.x; i < pairs; i += LIST_THREADS) c += p.ids[i] == id;
    c = block_sum(c, scratch);
    if (threadIdx.x == 0) p.list_counts[blockIdx.x] = c;
}

__global__ void __launch_bounds__(LIST_THREADS) list_fill(const m2a_kgemm_t p)
{
    __shared__ int scratch[LIST_THREADS / kWarpSize];
    const int e = blockIdx.x, lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const int32_t id = p.first_expert + e;
    const int64_t pairs = p.rows * p.slots;
    int before = 0;
    for (int j = threadIdx.x; j < e; j += LIST_THREADS) before += p.list_counts[j];
    int at = block_sum(before, scratch);
    if (threadIdx.x == 0) p.list_offsets[e] = at;
    for (int64_t base = 0; base < pairs; base += LIST_THREADS) {
        int64_t i = base + threadIdx.x;
        bool mine = i < pairs && p.ids[i] == id;
        unsigned ballot = __ballot_sync(kAllLanes, mine);
        __syncthreads();
        if (lane == 0) scratch[warp] = __popc(ballot);
        __syncthreads();
        int wbefore = 0, all = 0;
        for (int w = 0; w < LIST_THREADS / kWarpSize; w++) {
            wbefore += w < warp ? scratch[w] : 0;
            all += scratch[w];
        }
        if (mine) p.list[at + wbefore + __popc(ballot & ((1u << lane) - 1))] = (int32_t)i;
        at += all;
    }
}

} // namespace

/* The floors under moea2a_perf's numbers on this machine (a maintainers' tool;
 * bench/device/run.sh FLOORS="..." builds and runs it):
 *  - NVLink ceilings, every GPU to all its peers at once: 16-byte stores and loads
 *    from SMs (what the kernels do), the same with a flag raised per chunk after a
 *    system-scope fence (what a pushed combine needs so rows can be reduced while
 *    others are in flight), each SM's bulk copy engine (cp.async.bulk), and the DMA
 *    copy engines (cudaMemcpyPeerAsync, no SM). One
 *    process drives every GPU through peer access; all kernels meet at a barrier
 *    in GPU 0's memory, then each GPU times itself (globaltimer).
 *  - what an event-timed call costs with nothing to do: an empty kernel between two
 *    events, and back to back, with the launches queued behind a busy GPU; and what
 *    a kernel adds to a replayed CUDA graph.
 *  - the latencies a decode-size call is made of, GPU 0 against GPU 1 (one warp
 *    each): a flag's trip to the peer, the same after rows stored to the peer and
 *    released, and a load from the peer's memory.
 *   floors [sms] [MiB per peer] [chunk bytes] [warps issuing bulk copies] */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

enum { ST16, LD16, ST16_SIG, BULK_ST, BULK_LD, BULK_PATH, BULK_PATH_SIG, MODES };
static const char *mode_name[MODES] = {"st16 (SM stores)", "ld16 (SM loads)", "st16 + fence, flag per chunk",
                                       "bulk store smem->peer", "bulk load peer->smem", "bulk local->smem->peers",
                                       "bulk path + flag per chunk"};

struct Args {
    unsigned char *mine;        /* this GPU's buffer: [ngpu][per_peer] */
    unsigned char *peer[8];     /* every GPU's buffer as this one reaches it */
    unsigned int *bar;          /* GPU 0's barrier counter */
    unsigned int bar_target;
    unsigned long long *times;  /* this GPU: [0] start, [1] end (max over blocks) */
    int me, ngpu;
    size_t per_peer, chunk;
    int issuers;                /* warps that issue bulk copies */
    unsigned int *flags[8];     /* every GPU's landing flags, as this one reaches them */
    unsigned long long *sink;
};

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void meet(const Args &a)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.sys.global.add.u32 [%0], 1;" ::"l"(a.bar) : "memory");
        unsigned int v;
        do {
            asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a.bar) : "memory");
        } while ((int)(v - a.bar_target) < 0);
        if (blockIdx.x == 0) a.times[0] = now_ns();
    }
    __syncthreads();
}

__device__ void done(const Args &a)
{
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(&a.times[1], now_ns());
}

/* chunk j of this GPU's work: destination (or source) peer and offset there */
__device__ __forceinline__ void chunk_at(const Args &a, size_t j, int *peer, size_t *off)
{
    const int others = a.ngpu - 1;
    *peer = (a.me + 1 + (int)(j % others)) % a.ngpu;
    *off = (size_t)a.me * a.per_peer + (j / others) * a.chunk;
}

constexpr int kU = 4; /* 16-byte vectors per lane in flight */

/* Chunk j's vectors first, first + step, ... (kU per lane at a time): loaded from the
 * peer (load) or copied from here to the peer. Returns the loaded bits folded, so
 * that the loads are kept. */
__device__ int move_chunk(const Args &a, size_t j, size_t first, size_t step, bool load)
{
    int q;
    size_t off;
    chunk_at(a, j, &q, &off);
    const size_t vecs = a.chunk / 16;
    int4 *remote = reinterpret_cast<int4 *>(a.peer[q] + off);
    const int4 *local = reinterpret_cast<const int4 *>(a.mine + off);
    constexpr int U = kU;
    int acc = 0;
    for (size_t i0 = first; i0 < vecs; i0 += step * U) {
        int4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + 32 * u < vecs) v[u] = load ? remote[i0 + 32 * u] : __ldg(local + i0 + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i0 + 32 * u < vecs) {
                if (load) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
                else remote[i0 + 32 * u] = v[u];
            }
    }
    return acc;
}

/* Every warp of a block on the same chunk. */
__global__ void sm_kernel(Args a, int load)
{
    meet(a);
    const size_t chunks = a.per_peer / a.chunk * (a.ngpu - 1);
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, W = blockDim.x / 32;
    int acc = 0;
    for (size_t j = blockIdx.x; j < chunks; j += gridDim.x) acc ^= move_chunk(a, j, (size_t)warp * 32 * kU + lane, (size_t)W * 32, load);
    if (acc == 0x12345678) *a.sink = 1; /* keeps the loads */
    done(a);
}

/* Each warp copies whole chunks (local load, peer store), then makes them visible
 * (system-scope fence) and raises the peer's flag: what a pushed combine must do
 * for its rows to be reduced while others are still in flight. */
__global__ void sm_signal_kernel(Args a)
{
    meet(a);
    const size_t chunks = a.per_peer / a.chunk * (a.ngpu - 1);
    const int lane = threadIdx.x & 31, W = blockDim.x / 32;
    for (size_t j = (size_t)blockIdx.x * W + threadIdx.x / 32; j < chunks; j += (size_t)gridDim.x * W) {
        move_chunk(a, j, lane, 32, false);
        __syncwarp();
        if (lane == 0) {
            int q;
            size_t off;
            chunk_at(a, j, &q, &off);
            __threadfence_system();
            asm volatile("red.relaxed.sys.global.add.u32 [%0], 1;" ::"l"(a.flags[q] + a.me) : "memory");
        }
    }
    done(a);
}

/* ---- the bulk copy engine ------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bulk_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void bar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}

constexpr int kStages = 4;

/* Each issuing warp (lane 0) streams its chunks with kStages in flight. mode:
 * BULK_ST stores a fixed shared buffer into peers; BULK_LD loads peers' chunks into
 * shared memory; BULK_PATH loads the chunk from this GPU's memory, then stores it to
 * the peer (what a dispatch through shared memory would do); BULK_PATH_SIG also
 * raises the peer's flag once each chunk's store is complete (a pushed combine). */
__global__ void bulk_kernel(Args a, int mode)
{
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ uint64_t bars[32][kStages];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (lane == 0 && warp < a.issuers)
        for (int s = 0; s < kStages; s++) bar_init(&bars[warp][s]);
    meet(a);
    if (warp < a.issuers && lane == 0) {
        unsigned char *buf = sm + (size_t)warp * kStages * a.chunk;
        const size_t chunks = a.per_peer / a.chunk * (a.ngpu - 1);
        const size_t stride = (size_t)gridDim.x * a.issuers;
        uint32_t phase[kStages] = {0, 0, 0, 0};
        size_t it = 0;
        for (size_t j = (size_t)blockIdx.x * a.issuers + warp; j < chunks; j += stride, it++) {
            int q;
            size_t off;
            chunk_at(a, j, &q, &off);
            const int s = (int)(it % kStages);
            unsigned char *st = buf + (size_t)s * a.chunk;
            if (mode == BULK_ST) {
                bulk_store(a.peer[q] + off, st, (uint32_t)a.chunk);
                bulk_wait_read<kStages - 1>();
            } else if (mode == BULK_LD) {
                if (it >= kStages) bar_wait(&bars[warp][s], phase[s]), phase[s] ^= 1;
                bulk_load(st, a.peer[q] + off, (uint32_t)a.chunk, &bars[warp][s]);
            } else { /* load local, wait, store to the peer; stage reuse waits for the store */
                if (mode == BULK_PATH_SIG) {
                    bulk_wait<kStages - 1>(); /* the store kStages ago is complete: flag it */
                    if (it >= kStages) {
                        int q0;
                        size_t off0;
                        chunk_at(a, j - kStages * stride, &q0, &off0);
                        asm volatile("fence.proxy.async.global;" ::: "memory");
                        asm volatile("red.release.sys.global.add.u32 [%0], 1;" ::"l"(a.flags[q0] + a.me) : "memory");
                    }
                } else {
                    bulk_wait_read<kStages - 1>();
                }
                bulk_load(st, a.mine + off, (uint32_t)a.chunk, &bars[warp][s]);
                bar_wait(&bars[warp][s], phase[s]), phase[s] ^= 1;
                bulk_store(a.peer[q] + off, st, (uint32_t)a.chunk);
            }
        }
        if (mode == BULK_LD)
            for (size_t i = it > kStages ? it - kStages : 0; i < it; i++) {
                const int s = (int)(i % kStages);
                bar_wait(&bars[warp][s], phase[s]), phase[s] ^= 1;
            }
        bulk_wait_all();
    }
    done(a);
}

/* ---- the cost of an event-timed call ------------------------------------------------- */

__global__ void spin(unsigned long long ns)
{
    const unsigned long long t0 = now_ns();
    while (now_ns() - t0 < ns) {
    }
}

__global__ void empty_kernel(unsigned long long *sink, int never)
{
    if (never == 12345 && threadIdx.x == 0) *sink = blockIdx.x;
}

/* GPU 0: the launches are queued behind a 20 ms spin, so the host's launch rate does
 * not count; 48 blocks of 512 threads, as moea2a's kernels. */
static void launch_floor(unsigned long long *sink)
{
    const int N = 200;
    cudaEvent_t ev[N + 1];
    cudaStream_t s;
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i <= N; i++) CK(cudaEventCreate(&ev[i]));
    double between = 0, b2b = 0;
    float ms;
    spin<<<1, 1, 0, s>>>(20000000ull);
    for (int i = 0; i < N; i++) {
        CK(cudaEventRecord(ev[i], s));
        empty_kernel<<<48, 512, 0, s>>>(sink, 0);
    }
    CK(cudaEventRecord(ev[N], s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++) {
        CK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
        between += ms;
    }
    spin<<<1, 1, 0, s>>>(20000000ull);
    CK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < N; i++) empty_kernel<<<48, 512, 0, s>>>(sink, 0);
    CK(cudaEventRecord(ev[1], s));
    CK(cudaStreamSynchronize(s));
    CK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    b2b = ms;
    printf("# an empty kernel (48 x 512 threads): %.2f us between two events, %.2f us back to back\n", between / N * 1e3,
           b2b / N * 1e3);
    for (int i = 0; i <= N; i++) CK(cudaEventDestroy(ev[i]));
    CK(cudaStreamDestroy(s));
}


/* ---- latencies, GPU 0 against GPU 1 ------------------------------------------------- */

enum { L_FLAG, L_RELEASE, L_ROW, L_ROWS8, L_LOAD, LMODES };
static const char *lat_name[LMODES] = {"flag (relaxed store)", "flag (release add, no data)",
                                       "one 14336-byte row, release add", "eight rows, release add",
                                       "dependent 16-byte load from the peer"};

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* One warp per GPU. Ping-pong modes: GPU 0 sends (the rows, then) the flag, GPU 1
 * answers in kind, iters times; GPU 0's time per iteration is two one-way trips. L_LOAD:
 * GPU 0 alone chases indices through GPU 1's memory (each load waits for the last). */
__global__ void latency_kernel(uint32_t *mine, uint32_t *peer_flag, int4 *peer_rows, const int4 *rows, int role, int mode,
                               int iters, unsigned long long *out)
{
    const int lane = threadIdx.x;
    const int nrows = mode == L_ROWS8 ? 8 : mode == L_ROW ? 1 : 0, vecs = 14336 / 16;
    if (mode == L_LOAD) {
        if (role) return;
        const int4 *chase = peer_rows;
        int idx = 0;
        unsigned long long t0 = 0;
        for (int i = -8; i < iters; i++) {
            if (i == 0) t0 = now_ns();
            int4 v;
            asm volatile("ld.relaxed.sys.global.v4.s32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "l"(chase + idx)
                         : "memory");
            idx = v.x;
        }
        if (lane == 0) out[0] = now_ns() - t0, out[1] = (unsigned long long)idx;
        return;
    }
    unsigned long long t0 = 0;
    for (int i = -8; i < iters; i++) {
        const uint32_t want = (uint32_t)(i + 9);
        if (i == 0) t0 = now_ns();
        if (role == 1)
            while (ld_acquire_sys(mine) < want) {
            }
        for (int r = 0; r < nrows; r++)
            for (int v = lane; v < vecs; v += 32) peer_rows[r * vecs + v] = rows[r * vecs + v];
        __syncwarp();
        if (lane == 0) {
            if (mode == L_FLAG) asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(peer_flag), "r"(want) : "memory");
            else asm volatile("red.release.sys.global.add.u32 [%0], 1;" ::"l"(peer_flag) : "memory");
        }
        if (role == 0)
            while (ld_acquire_sys(mine) < want) {
            }
        __syncwarp();
    }
    if (role == 0 && lane == 0) out[0] = now_ns() - t0;
}

static void latency_floors(Args *a, cudaStream_t *st)
{
    const int iters = 2000;
    uint32_t *flag[2];
    int4 *buf[2];
    unsigned long long *out;
    CK(cudaSetDevice(0));
    CK(cudaMallocManaged(&out, 2 * sizeof(unsigned long long)));
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaMalloc(&flag[g], 64));
        CK(cudaMalloc(&buf[g], 2 * 8 * 14336 + 4096 * 16));
    }
    /* GPU 1's chase: 4096 vectors, each pointing 1021 ahead (mod 4096): no two loads in a line */
    int4 *h = (int4 *)calloc(4096, sizeof(int4));
    for (int i = 0; i < 4096; i++) h[i].x = (i + 1021) % 4096;
    printf("# latencies, GPU 0 against GPU 1, one warp each, %d iterations (us one way; the load: per load)\n", iters);
    for (int mode = 0; mode < LMODES; mode++) {
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaMemset(flag[g], 0, 64));
            }
            CK(cudaMemcpy(buf[1], h, 4096 * sizeof(int4), cudaMemcpyHostToDevice));
            for (int g = 1; g >= 0; g--) {
                CK(cudaSetDevice(g));
                int4 *dst = mode == L_LOAD ? buf[1] : buf[1 - g] + 4096 + 8 * 14336 / 16;
                latency_kernel<<<1, 32, 0, st[g]>>>(flag[g], flag[1 - g], dst, buf[g] + 4096, g, mode, iters, out);
                CK(cudaGetLastError());
            }
            for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaStreamSynchronize(st[g]));
            }
            const double us = (double)out[0] / 1e3 / iters / (mode == L_LOAD ? 1 : 2);
            best = us < best ? us : best;
        }
        printf("  %-40s %8.3f\n", lat_name[mode], best);
    }
    free(h);
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaFree(flag[g]));
        CK(cudaFree(buf[g]));
    }
    CK(cudaFree(out));
    (void)a;
}

/* What a kernel adds to a replayed graph: graphs of 1 and 2 empty kernels (48 x 512),
 * each replayed 200 times back to back and 200 times alone (synchronized between). */
static void graph_floor(unsigned long long *sink)
{
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double b2b[3] = {0}, alone[3] = {0};
    for (int k = 1; k <= 2; k++) {
        cudaGraph_t g;
        cudaGraphExec_t x;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < k; i++) empty_kernel<<<48, 512, 0, s>>>(sink, 0);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&x, g, 0));
        for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(x, s));
        CK(cudaStreamSynchronize(s));
        float ms;
        spin<<<1, 1, 0, s>>>(20000000ull);
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 200; i++) CK(cudaGraphLaunch(x, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        b2b[k] = ms * 1e3 / 200;
        for (int i = 0; i < 200; i++) {
            CK(cudaEventRecord(e0, s));
            CK(cudaGraphLaunch(x, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            alone[k] += ms * 1e3 / 200;
        }
        CK(cudaGraphExecDestroy(x));
        CK(cudaGraphDestroy(g));
    }
    printf("# a graph of 1 / 2 empty kernels (48 x 512): %.2f / %.2f us back to back, %.2f / %.2f us alone\n", b2b[1], b2b[2],
           alone[1], alone[2]);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess) ngpu = 0;
    if (ngpu < 2) {
        printf("floors: needs 2 or more GPUs, found %d\n", ngpu);
        return 0;
    }
    if (ngpu > 8) ngpu = 8;
    const int sms = argc > 1 ? atoi(argv[1]) : 48;
    const size_t chunk = argc > 3 ? atol(argv[3]) : 16384;
    const size_t per_peer = ((argc > 2 ? atol(argv[2]) : 64) << 20) / (chunk ? chunk : 1) * chunk; /* whole chunks */
    const int issuers = argc > 4 ? atoi(argv[4]) : 4;
    const int threads = 512, reps = 5;
    if (!chunk || chunk % 16 || issuers < 1 || issuers > 16) {
        fprintf(stderr, "floors: the chunk must be a multiple of 16 bytes; 1-16 issuers\n");
        return 2;
    }
    Args a[8];
    cudaStream_t st[8];
    unsigned int *bar = NULL;
    for (int g = 0; g < ngpu; g++) {
        CK(cudaSetDevice(g));
        for (int h = 0; h < ngpu; h++)
            if (h != g) {
                int can = 0;
                CK(cudaDeviceCanAccessPeer(&can, g, h));
                if (!can) {
                    printf("floors: GPU %d cannot reach GPU %d by load/store\n", g, h);
                    return 0;
                }
                CK(cudaDeviceEnablePeerAccess(h, 0));
            }
        CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
        a[g].me = g, a[g].ngpu = ngpu, a[g].per_peer = per_peer, a[g].chunk = chunk, a[g].issuers = issuers;
        CK(cudaMalloc(&a[g].mine, per_peer * ngpu));
        CK(cudaMemset(a[g].mine, g + 1, per_peer * ngpu));
        CK(cudaMalloc(&a[g].times, 2 * sizeof(unsigned long long)));
        CK(cudaMalloc(&a[g].sink, sizeof(unsigned long long)));
        CK(cudaMalloc(&a[g].flags[g], 8 * sizeof(unsigned int)));
        CK(cudaMemset(a[g].flags[g], 0, 8 * sizeof(unsigned int)));
        if (g == 0) {
            CK(cudaMalloc(&bar, sizeof(unsigned int)));
            CK(cudaMemset(bar, 0, sizeof(unsigned int)));
        }
        CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    }
    for (int g = 0; g < ngpu; g++) {
        a[g].bar = bar;
        for (int h = 0; h < ngpu; h++) a[g].peer[h] = a[h].mine, a[g].flags[h] = a[h].flags[h];
    }
    const size_t smem = (size_t)issuers * kStages * chunk;
    if (smem > 200 * 1024) {
        fprintf(stderr, "floors: %d issuers x %d stages x %zu bytes is over 200 KiB of shared memory\n", issuers, kStages, chunk);
        return 2;
    }
    printf("# floors: %d GPUs, %d SMs each, %.1f MiB to each peer, %zu-byte chunks, %d bulk issuers per SM, %d reps\n", ngpu,
           sms, per_peer / 1048576.0, chunk, issuers, reps);
    printf("# %-26s %12s %12s   (GB/s per GPU to/from all peers: min over GPUs, mean)\n", "mode", "min", "mean");
    unsigned int target = 0;
    for (int mode = 0; mode < MODES; mode++) {
        double best_min = 0, best_mean = 0;
        for (int r = 0; r < reps; r++) {
            target += (unsigned int)(ngpu * sms);
            for (int g = 0; g < ngpu; g++) {
                CK(cudaSetDevice(g));
                CK(cudaMemsetAsync(a[g].times, 0, 2 * sizeof(unsigned long long), st[g]));
                a[g].bar_target = target;
                if (mode == ST16 || mode == LD16) sm_kernel<<<sms, threads, 0, st[g]>>>(a[g], mode == LD16);
                else if (mode == ST16_SIG) sm_signal_kernel<<<sms, threads, 0, st[g]>>>(a[g]);
                else bulk_kernel<<<sms, threads, smem, st[g]>>>(a[g], mode);
                CK(cudaGetLastError());
            }
            double mn = 1e30, sum = 0;
            for (int g = 0; g < ngpu; g++) {
                CK(cudaSetDevice(g));
                CK(cudaStreamSynchronize(st[g]));
                unsigned long long t[2];
                CK(cudaMemcpy(t, a[g].times, sizeof(t), cudaMemcpyDeviceToHost));
                const double gbs = (double)per_peer * (ngpu - 1) / (double)(t[1] - t[0]);
                mn = gbs < mn ? gbs : mn, sum += gbs;
            }
            if (mn > best_min) best_min = mn, best_mean = sum / ngpu;
        }
        printf("  %-26s %12.1f %12.1f\n", mode_name[mode], best_min, best_mean);
    }
    /* the DMA copy engines: every GPU pushes its block to every peer at once with
     * cudaMemcpyPeerAsync (no SM involved), timed by events on its own stream */
    double ce_min = 0, ce_mean = 0;
    cudaEvent_t ev[8][2];
    for (int g = 0; g < ngpu; g++) {
        CK(cudaSetDevice(g));
        CK(cudaEventCreate(&ev[g][0]));
        CK(cudaEventCreate(&ev[g][1]));
    }
    for (int r = 0; r < reps; r++) {
        for (int g = 0; g < ngpu; g++) {
            CK(cudaSetDevice(g));
            CK(cudaEventRecord(ev[g][0], st[g]));
            for (int h = 0; h < ngpu; h++)
                if (h != g) CK(cudaMemcpyPeerAsync(a[h].mine + g * per_peer, h, a[g].mine + h * per_peer, g, per_peer, st[g]));
            CK(cudaEventRecord(ev[g][1], st[g]));
        }
        double mn = 1e30, sum = 0;
        for (int g = 0; g < ngpu; g++) {
            CK(cudaSetDevice(g));
            CK(cudaEventSynchronize(ev[g][1]));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, ev[g][0], ev[g][1]));
            const double gbs = (double)per_peer * (ngpu - 1) / (ms * 1e6);
            mn = gbs < mn ? gbs : mn, sum += gbs;
        }
        if (mn > ce_min) ce_min = mn, ce_mean = sum / ngpu;
    }
    printf("  %-26s %12.1f %12.1f\n", "copy engines (memcpy peer)", ce_min, ce_mean);
    launch_floor(a[0].sink);
    graph_floor(a[0].sink);
    latency_floors(a, st);
    return 0;
}

/* Quantize on dispatch around the copies (wire_kernels.h). Small, memory-bound passes
 * over scale rows: warps per row, threads per word. */
#include <cuda_runtime.h>

#include "wire_device.cuh"
#include "wire_kernels.h"
#include "load.cuh"
#include "warp.cuh"

namespace {

constexpr int kThreads = 256;

/* Every padding row's scales to 0, a warp per row; MN-major words; global scales. */
__global__ void __launch_bounds__(kThreads) finish(m2a_kwire_t w, int ep, int stride, const int32_t *counts)
{
    const size_t rows = (size_t)ep * (size_t)stride, lane = threadIdx.x % kWarpSize;
    const size_t gthreads = (size_t)gridDim.x * blockDim.x, gtid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t row = gtid / kWarpSize; row < rows; row += gthreads / kWarpSize) {
        const int src = (int)(row / (size_t)stride), r = (int)(row % (size_t)stride);
        if (r < counts[src]) continue;
        unsigned char *p = w.rows + row * w.srow;
        for (size_t b = lane; b < w.srow; b += kWarpSize) p[b] = 0;
    }
    if (w.mn)
        m2a_wire_mn(reinterpret_cast<const uint32_t *>(w.rows), reinterpret_cast<uint32_t *>(w.mn), w.srow / 4, ep, stride,
                    [&](int src) { return counts[src]; }, gtid, gthreads);
    if (w.g)
        for (size_t src = gtid; src < (size_t)ep; src += gthreads)
            w.g[src] = counts[src] > 0 ? w.g_rows[src * (size_t)stride] : 0.0f;
}

int blocks_for(size_t items)
{
    const size_t b = (items + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

} // namespace

extern "C" int m2a_cuda_wire_finish(const m2a_kwire_t *w, int ep, int stride, const int32_t *counts, void *stream)
{
    const size_t rows = (size_t)ep * (size_t)stride, mn = w->mn ? (size_t)ep * (w->srow / 4) * ((size_t)stride + 3) : 0;
    finish<<<blocks_for(kWarpSize * rows > mn ? kWarpSize * rows : mn), kThreads, 0, (cudaStream_t)stream>>>(*w, ep, stride, counts);
    return (int)cudaGetLastError();
}

extern "C" int m2a_cuda_wire_load(void) { return m2a_load_kernel(finish, 0); }

/* The warp as the kernels use it: its size, the mask of all its lanes, and a thread's
 * lane and warp within its block. */
#ifndef M2A_WARP_CUH
#define M2A_WARP_CUH

constexpr int kWarpSize = 32;
constexpr unsigned kAllLanes = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return (int)(threadIdx.x % kWarpSize); }
__device__ __forceinline__ int warp_id() { return (int)(threadIdx.x / kWarpSize); }
#endif

/* Kernels loaded now, not at their first launch. With CUDA's lazy loading (the default
 * since CUDA 12.2) a kernel loads at its first launch, and that load waits for every
 * kernel running in the context. The MoE kernels wait for each other across streams:
 * a quantization alongside the dispatch, and ranks that share a GPU as threads of one
 * process (one context), each rank's kernels waiting for its peers'. A first launch
 * behind such a wait would come only when the waits time out. */
#ifndef M2A_LOAD_CUH
#define M2A_LOAD_CUH
#include <cuda_runtime.h>

/* e, or the error of loading kernel (cudaFuncGetAttributes loads it). */
template <typename K> static inline int m2a_load_kernel(K kernel, int e)
{
    cudaFuncAttributes a;
    return e ? e : (int)cudaFuncGetAttributes(&a, kernel);
}

/* A kernel template's three float instantiations. */
#define M2A_LOAD_FLOATS(kernel, e)                                                                  \
    m2a_load_kernel(kernel<MOEA2A_FLOAT32>, m2a_load_kernel(kernel<MOEA2A_FLOAT16>,                 \
                                                            m2a_load_kernel(kernel<MOEA2A_BFLOAT16>, e)))
#endif

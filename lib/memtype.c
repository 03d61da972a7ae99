#include "config.h"
#include "comm.h"

#ifdef MOEA2A_HAVE_CUDA
#include <cuda_runtime_api.h>

unsigned m2a_memtype(const void *ptr)
{
    struct cudaPointerAttributes attr;
    if (!ptr) return MOEA2A_MEM_HOST;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError(); /* no device or driver: plain host memory */
        return MOEA2A_MEM_HOST;
    }
    return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) ? MOEA2A_MEM_CUDA
                                                                                    : MOEA2A_MEM_HOST;
}
#else
unsigned m2a_memtype(const void *ptr)
{
    (void)ptr;
    return MOEA2A_MEM_HOST;
}
#endif

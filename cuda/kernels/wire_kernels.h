/* CUDA kernels of quantize on dispatch around the copies (lib/moe/backend/cuda_steps.c): the sender's
 * NVFP4 global scale in every row it sends, and the receiver's finish of what landed.
 * They mirror lib/moe/backend/host_kernels.c (m2a_host_wire_finish). Each returns 0 or the
 * cudaError_t of its launch. */
#ifndef M2A_WIRE_KERNELS_H
#define M2A_WIRE_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "comm/cuda_module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Padding rows' scales (row >= counts[src]) 0, the MN-major copy (padding 0), the
 * global scale per source. */
int m2a_cuda_wire_finish(const m2a_kwire_t *w, int ep, int stride, const int32_t *counts, void *stream);

/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_cuda_wire_load(void);
#ifdef __cplusplus
}
#endif
#endif

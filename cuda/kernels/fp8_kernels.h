/* CUDA kernels of the FP8 block quantization calls (lib/quant/fp8.c checks the arguments).
 * Each returns 0 or the cudaError_t of its launch. layout: 0 row-major, 1 MN-major. */
#ifndef M2A_FP8_KERNELS_H
#define M2A_FP8_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif
int m2a_cuda_fp8_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                          int layout, int ue8m0, void *stream);
/* Row-major scales, `blocks` blocks of 256 threads, and per chunk of chunk_rows rows the groups of 16 values written so far added to
 * ready[chunk] (zeroed by the caller), each add after its groups' codes and scales are
 * visible: a kernel running at the same time may copy a chunk's rows once
 * ready[chunk] = rows x k / 16. The bits of m2a_cuda_fp8_quantize. */
int m2a_cuda_fp8_quantize_ready(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                                int ue8m0, uint32_t *ready, uint32_t chunk_rows, int blocks, void *stream);
/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_cuda_fp8_load(void);
int m2a_cuda_fp8_dequantize(const void *q, const void *scales, int layout, int ue8m0, size_t m, size_t k, void *out,
                            moea2a_datatype_t otype, void *stream);
#ifdef __cplusplus
}
#endif
#endif

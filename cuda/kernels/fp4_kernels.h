/* CUDA kernels of the NVFP4 calls (lib/quant/fp4.c checks the arguments). Each returns 0
 * or the cudaError_t of its launch. */
#ifndef M2A_FP4_KERNELS_H
#define M2A_FP4_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif
int m2a_cuda_fp4_global_scale(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream);
/* g_rows: NULL, or m floats each set to *g (it may be g itself: its first is then
 * written with the value it holds). */
int m2a_cuda_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q, void *sf,
                          int layout, float *g_rows, void *stream);
int m2a_cuda_fp4_dequantize(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k, void *out,
                            moea2a_datatype_t otype, void *stream);
/* counts == NULL: plain conversion of m rows; else m = ep x stride receive rows. */
int m2a_cuda_fp4_sf_convert(const void *src, int src_layout, void *dst, int dst_layout, size_t m, size_t k,
                            const int32_t *counts, int stride, void *stream);
/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_cuda_fp4_load(void);
#ifdef __cplusplus
}
#endif
#endif

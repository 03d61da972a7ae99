/* CUDA kernels of the expert-major layout (moea2a_moe(3), "Expert-major layout"), on
 * the caller's stream after a dispatch landed and before a combine's send half. They
 * mirror lib/moe/backend/host_kernels.c (m2a_host_expert_expand, m2a_host_expert_fold) bit for bit,
 * read every count on the device (graph-capturable) and let no atomic decide an
 * order. Each returns 0 or the cudaError_t of its launches. */
#ifndef M2A_EXPERT_KERNELS_H
#define M2A_EXPERT_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "comm/cuda_module.h"
#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout from the rank-major arrays at this stride: counts, aligned offsets, the
 * rows in ascending (source rank, source token) order per expert, their arrays and
 * byte arrays, the map; padding rows marked (byte arrays zeroed where asked). Over
 * max_rows: *rows = -1 and no row is written. */
int m2a_cuda_expert_expand(const m2a_kexpert_t *x, int stride, void *stream);
/* Each valid slot's combine row (combine + slot x row bytes) from the expert side's
 * rows: over the slot's k map entries in ascending order, row x weight (1 when
 * weighted is 0) rounded to fp32, summed in fp32 from 0, rounded once to dtype. */
int m2a_cuda_expert_fold(const m2a_kexpert_t *x, int stride, moea2a_datatype_t dtype, size_t hidden, int weighted,
                         const unsigned char *rows, unsigned char *combine, void *stream);

/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_cuda_expert_load(void);
#ifdef __cplusplus
}
#endif
#endif

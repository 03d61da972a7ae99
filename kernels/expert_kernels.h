/* CUDA kernels of the expert-major layout (moea2a_moe(3), "Expert-major layout"), on
 * the caller's stream after a dispatch landed and before a combine's send half. They
 * mirror lib/moe_host.c (m2a_host_expert_expand, m2a_host_expert_fold) bit for bit,
 * read every count on the device (graph-capturable) and let no atomic decide an
 * order. Each returns 0 or the cudaError_t of its launches. */
#ifndef M2A_EXPERT_KERNELS_H
#define M2A_EXPERT_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The slots are split into at most this many parts, each counted and filled by its
 * own blocks (a block per local expert and part); the workspace holds one count per
 * (part, local expert) (moe_layout.h). */
#define M2A_EXPERT_MAX_PARTS 16
/* Byte arrays a row carries: each payload, and a quantized one's scales [and global
 * scale]. */
#define M2A_EXPERT_MAX_ARRAYS (3 * MOEA2A_MOE_MAX_PAYLOADS)

/* Everything the kernels read and write, device pointers into the workspace. */
typedef struct {
    int ep, k, num_experts, num_local, num_arrays, align, zero_padding;
    int32_t invalid_id;
    int64_t max_rows;                     /* the bound on rows, padding included */
    const int32_t *recv_counts;           /* [ep] */
    const int32_t *ids, *src_index;       /* rank-major [ep][stride][k], [ep][stride] */
    const float *weights;                 /* rank-major [ep][stride][k]; NULL unless carried */
    const int32_t *global_of;             /* [num_local]: the global id of each local expert */
    int32_t *part_counts;                 /* [M2A_EXPERT_MAX_PARTS][num_local] */
    int32_t *counts, *offsets;            /* [num_local], [num_local + 1] */
    int64_t *rows;                        /* rows used, padding included; -1 over max_rows */
    int32_t *map;                         /* [ep][stride][k]: the row of each entry, -1 */
    int32_t *xid, *xrank, *xtok, *xslot;  /* per row */
    float *xw;                            /* per row; NULL unless weights are carried */
    /* each byte array: rank-major rows, expert-major rows, bytes per row, whether gap
     * rows get zeros always (scales) or only with zero_padding (payloads, codes) */
    const unsigned char *src[M2A_EXPERT_MAX_ARRAYS];
    unsigned char *dst[M2A_EXPERT_MAX_ARRAYS];
    size_t width[M2A_EXPERT_MAX_ARRAYS];
    int always_zero[M2A_EXPERT_MAX_ARRAYS];
    int vbytes[M2A_EXPERT_MAX_ARRAYS]; /* set by the launcher: the chunk the copy moves, 16, 4 or 1 */
} m2a_kexpert_t;

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

/* Loads this file's kernels now (kernels/load.cuh says why). */
int m2a_cuda_expert_load(void);
#ifdef __cplusplus
}
#endif
#endif

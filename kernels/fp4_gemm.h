/* The FP4 expert GEMM on CUDA memory (moea2a_expert(3); lib/expert_gemm.c checks the
 * arguments and holds the host reference). For each local expert e,
 * C_e = A_e . dequant(W_e)^T with bf16 A rows, NVFP4 weights [n][k/2] with 128x4 E4M3
 * scales and one fp32 global scale per expert, fp32 accumulation on the tensor cores.
 * Every count is read on the device (graph-capturable); rows past an expert's count
 * are neither read nor written. Returns 0 or the cudaError_t of its launches. */
#ifndef M2A_FP4_GEMM_H
#define M2A_FP4_GEMM_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most local experts one call takes (each block keeps their tile counts). */
#define M2A_GEMM_MAX_EXPERTS 1024

typedef struct {
    int num_experts;
    int swiglu;   /* C holds silu(C[:, j]) * C[:, j + n/2], j < n/2 */
    int out_fp32; /* else bf16 */
    int slots;    /* rank-major: ids per A row (0: expert-major) */
    int32_t first_expert; /* rank-major: the global id of local expert 0 */
    int no_wgmma;         /* 1: mma.sync even where Hopper's wgmma kernel could run */
    int no_ws;            /* 1: on Hopper the block-synchronous wgmma kernel even where the TMA one could run */
    int64_t n, k, rows;   /* rows: A's rows (expert-major) or id rows (rank-major) */
    int64_t lda, ldc;     /* elements */
    const uint16_t *a;
    /* expert-major: expert e's rows [offsets[e], offsets[e] + counts[e]) of A and C */
    const int32_t *counts, *offsets;
    /* rank-major: ids [rows][slots]; the launcher lists each expert's (row, slot) pairs
     * in list (ascending), with list_counts/list_offsets, in the caller's workspace */
    const int32_t *ids;
    int32_t *list, *list_counts, *list_offsets;
    const uint8_t *w;  /* [num_experts][n][k/2] */
    const uint8_t *sf; /* [num_experts][sf_stride], 128x4 */
    size_t sf_stride;
    const float *g; /* [num_experts] */
    void *c;
} m2a_kgemm_t;

/* Workspace bytes the rank-major entry needs for rows x slots ids (0 for
 * expert-major): the list, then counts and offsets per expert. */
static inline size_t m2a_gemm_workspace_bytes(int num_experts, int64_t rows, int slots)
{
    return slots <= 0 ? 0 : 4 * ((size_t)rows * (size_t)slots + 2 * (size_t)num_experts);
}
int m2a_cuda_expert_gemm(const m2a_kgemm_t *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif

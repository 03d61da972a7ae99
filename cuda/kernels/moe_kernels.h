/* CUDA kernels of the MoE data path, launched on the caller's stream. They mirror
 * lib/moe/backend/host_kernels.c step for step and produce the same bits. Each returns 0 or a
 * cudaError_t of the launch. */
#ifndef M2A_MOE_KERNELS_H
#define M2A_MOE_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "comm/cuda_module.h"
#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif

/* send_counts[ep], send_map[n][k] (rank*cap+slot ascending by rank, then -1),
 * stats[0] += invalid entries, stats[1] += merged entries, stats[2] += entries naming
 * an expert no rank holds (placement.cuh's rule). Slots follow token order
 * through prefix sums: no atomic decides any order. */
int m2a_cuda_route(const m2a_kparams_t *p, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                   unsigned long long *stats, void *stream);
/* Each token's arrays to this rank's receive slots, in source block `block` (this
 * rank's own number, or the source a relayed row came from), or the staging region of
 * each staged destination (p->stage_index). The source index array gets the token
 * number, or src_index's 4 bytes of the token where given (any alignment). */
int m2a_cuda_pack(const m2a_kparams_t *p, int n, int stride, m2a_kpayloads_t payloads, const int32_t *ids,
                  const float *weights, const int32_t *send_map, unsigned char *ws, unsigned char *stage_send,
                  int block, const void *src_index, void *stream);
/* dst[0..n) = the host words src[0..n), as launches whose parameters carry them. */
int m2a_cuda_write_words(int32_t *dst, const int32_t *src, int n, void *stream);
/* load[e] += the entries of the ep x stride receive slots (the first recv_counts[src] of
 * each source) naming expert e that the placement (placement.cuh, with the slot's
 * src_index) gives this rank, each expert once per slot. */
int m2a_cuda_count_load(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, const int32_t *ids,
                        const int32_t *src_index, int64_t *load, void *stream);
/* Padding slots: source index -1 and (sanitize) invalid ids; valid rows normalized. */
int m2a_cuda_sanitize(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, int32_t *ids,
                      int32_t *src_index, int sanitize, int rewrite_nonlocal, void *stream);
/* out[t] = fp32 sum of the token's rows in ascending rank order, rounded once; across
 * nodes (p->nodes > 1) the node-grouped order of moea2a_moe(3): each node's partial
 * rounded to dtype (FP8 wire: quantized again), the partials added in ascending node
 * order, rounded. wire: M2A_FAST_AS_IS (rows of dtype) or the FP8 wire's rows, with
 * M2A_FAST_WIRE_OUT and M2A_FAST_WIRE_PARTIALS as cuda_module.h says. */
int m2a_cuda_combine(const m2a_kparams_t *p, int n, const int32_t *send_map, moea2a_datatype_t dtype, size_t hidden,
                     int wire, const unsigned char *self_rows, const unsigned char *landing, void *out, void *stream);
/* The FP8 combine wire's rows (wire M2A_FAST_FP8 or M2A_FAST_FP8_UE8M0): each valid row
 * of the ep x stride rows of dtype at in (in_row bytes apart) as codes and scales at out
 * (out_row bytes apart). */
int m2a_cuda_combine_quantize(int ep, int stride, const int32_t *recv_counts, moea2a_datatype_t dtype, size_t hidden,
                              int wire, const unsigned char *in, size_t in_row, unsigned char *out, size_t out_row,
                              void *stream);

/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_cuda_moe_load(void);
#ifdef __cplusplus
}
#endif
#endif

/* The CUDA pieces both CUDA backends use (lib/moe/backend/cuda_steps.c): the context's device set-up
 * around its workspace, and the kernels of the generic path's local steps. Without
 * the CUDA module begin (and free_memory) return MOEA2A_ERR_UNAVAILABLE naming it;
 * stream: cudaStream_t. */
#ifndef M2A_MOE_CUDA_H
#define M2A_MOE_CUDA_H
#include "moe/core.h"
#include "moe/backend.h"
#include "comm/cuda_module.h"

moea2a_result_t m2a_moe_cuda_free_memory(moea2a_comm_t comm, size_t *free_bytes);
/* Before the workspace: this rank's device, the pinned mirror (mapped). */
moea2a_result_t m2a_moe_cuda_begin(moea2a_moe_t moe);
/* After moe->ws exists: staging, the mirror's views, the kernels' parameters, the
 * tables, and every slot as padding. */
moea2a_result_t m2a_moe_cuda_finish(moea2a_moe_t moe);
/* Frees what begin and finish made (not the workspace: its backend's). */
void m2a_moe_cuda_end(moea2a_moe_t moe);
/* The workspace as plain device memory (moe->ws), and back. */
moea2a_result_t m2a_moe_cuda_alloc_workspace(moea2a_moe_t moe);
void m2a_moe_cuda_free_workspace(moea2a_moe_t moe);
/* The generic path's local steps (moe_generic.h), on the device. route waits once for
 * the stream (the counts NCCL needs on the host), bounded by the timeout. */
moea2a_result_t m2a_moe_cuda_route(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                   int64_t *dedup);
/* The same, with the send map ([n][k], pinned host memory) copied to map_host in the
 * same wait. */
moea2a_result_t m2a_moe_cuda_route_map(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                       int64_t *dedup, int32_t *map_host);
moea2a_result_t m2a_moe_cuda_pack(moea2a_moe_t moe, const m2a_dispatch_args_t *a, void *stream);
/* sanitize, then m2a_moe_cuda_wire_finish */
moea2a_result_t m2a_moe_cuda_sanitize(moea2a_moe_t moe, int stride, void *stream);
/* The byte arrays' sources for a dispatch's kernels (kparams' num_payloads of them): a
 * payload as given, or, for one sent quantized, its codes, scales [and global scale]
 * in the workspace, made from the caller's rows once per token with the standalone
 * quantize kernels (their bits): here on the stream when `quantize`, else by
 * m2a_moe_cuda_quantize_alongside. Payload i with bit i of in_copy is quantized by the
 * dispatch kernel inside its copies (m2a_fast_t.qfuse): its codes' source is the
 * caller's rows, its scales' none. */
moea2a_result_t m2a_moe_cuda_sources(moea2a_moe_t moe, int n, const void *const *payloads, void *stream,
                                     int quantize, unsigned in_copy, m2a_kpayloads_t *pay);
/* Quantize on dispatch alongside the dispatch kernel (load/store path, FP8 payloads
 * only): the quantize kernels run on `stream` (forked from the dispatch's) in `blocks`
 * blocks and count the groups they finished per chunk of `rows` tokens in `ready`
 * (zeroed on the dispatch's stream before the fork). */
typedef struct {
    void *stream;
    uint32_t *ready;
    int rows, blocks;
} m2a_quant_overlap_t;
moea2a_result_t m2a_moe_cuda_quantize_alongside(moea2a_moe_t moe, int n, const void *const *payloads,
                                                const m2a_quant_overlap_t *ov);
/* After a dispatch landed (counts in the workspace): quantized payloads' padding
 * scales 0, the scales in the wire's layout, NVFP4's global scale per source; payload
 * i with bit i of done was finished already (by the load/store dispatch kernel). */
moea2a_result_t m2a_moe_cuda_wire_finish(moea2a_moe_t moe, int stride, unsigned done, void *stream);
/* The combine wire as the kernels name it: M2A_FAST_AS_IS, M2A_FAST_FP8 or M2A_FAST_FP8_UE8M0. */
int m2a_moe_cuda_combine_wire(const moea2a_moe_config_t *c);
/* The generic flow's combine steps: the rows sent (quantized into staging by the FP8
 * combine wire), then their sum. */
moea2a_result_t m2a_moe_cuda_combine_rows(moea2a_moe_t moe, const unsigned char *in, const unsigned char **rows,
                                          void *stream);
moea2a_result_t m2a_moe_cuda_combine(moea2a_moe_t moe, const unsigned char *in, void *out, void *stream);
/* The combine's reduction with the kernels' view kp: out[t] for n tokens from map (rank x
 * cap + slot per entry): this rank's rows at self_rows + slot, a peer's at landing's
 * block kp->stage_index[rank] (cap rows each), summed as m2a_cuda_combine says; with the
 * FP8 combine wire, the bits `how` (M2A_FAST_WIRE_OUT, M2A_FAST_WIRE_PARTIALS; 0 for the
 * flat paths) go with it. */
moea2a_result_t m2a_moe_cuda_reduce(moea2a_moe_t moe, const m2a_kparams_t *kp, int n, const int32_t *map,
                                    const unsigned char *self_rows, const unsigned char *landing, void *out, int how,
                                    void *stream);
/* MOEA2A_SUCCESS for 0, else MOEA2A_ERR_CUDA naming the cudaError_t err and what failed. */
moea2a_result_t m2a_moe_cuda_check(moea2a_comm_t comm, int err, const char *what);
/* The expert-major layout on the stream (moe_expert.h): the kernels, and with
 * MOEA2A_MOE_HOST_EXPERT_COUNTS the copy of rows, counts and offsets to the pinned
 * mirror (l->pinned_expert). */
moea2a_result_t m2a_moe_cuda_expert_expand(moea2a_moe_t moe, int num_local, int stride, void *stream);
/* Waits for the stream (bounded) and reads the rows the expand used (-1: over the
 * bound). */
moea2a_result_t m2a_moe_cuda_expert_rows(moea2a_moe_t moe, void *stream, int64_t *rows);
/* Waits for the stream, bounded by the communicator's timeout (expiry breaks it). */
moea2a_result_t m2a_moe_cuda_sync(moea2a_moe_t moe, void *stream, const char *what);
/* Whether the stream is being captured into a graph. */
moea2a_result_t m2a_moe_cuda_capturing(moea2a_moe_t moe, void *stream, int *capturing);
/* The backends' placement hook: the device's owner table (and the expert-major
 * layout's local experts) from moe->h_owner, in order on stream, capturable. */
moea2a_result_t m2a_moe_cuda_placement(moea2a_moe_t moe, void *stream);
/* The experts' load on the device (the backend table's count_load and take_load). */
moea2a_result_t m2a_moe_cuda_count_load(moea2a_moe_t moe, void *stream);
moea2a_result_t m2a_moe_cuda_take_load(moea2a_moe_t moe, int64_t *load);
/* The expert side's rows folded into the rank-major combine rows (ws + l->combine). */
moea2a_result_t m2a_moe_cuda_expert_fold(moea2a_moe_t moe, int num_local, const unsigned char *rows, void *stream);
/* The expert-major entries of both CUDA backends' tables (moe/backend.h). */
moea2a_result_t m2a_moe_cuda_expand_view(moea2a_moe_t moe, int num_local, int need_rows, void *stream,
                                         m2a_expert_view_t *out);
void m2a_moe_cuda_wait(void *stream); /* phase timing only */
#endif

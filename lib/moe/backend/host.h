/* What the host backend (backend/host.c) lends the other host-memory backend, the
 * hierarchical one (backend/hier.c): the context's memory, the per-token quantization
 * on dispatch and the expert-major pass, all over the same workspace layout. */
#ifndef M2A_MOE_BACKEND_HOST_H
#define M2A_MOE_BACKEND_HOST_H
#include "moe/backend.h"
#include "moe/backend/host_kernels.h"
#include "moe/core.h"

/* The workspace and staging on the rank's NUMA node, counts and headers inside the
 * workspace, every slot padding; m2a_host_release frees them. */
moea2a_result_t m2a_host_memory(moea2a_moe_t moe);
void m2a_host_release(moea2a_moe_t moe);

/* Payloads sent quantized: NVFP4's global scale over this call's tokens, and room for
 * one token's codes and scales (m2a_host_quantize_token). NULL when every payload goes
 * as is; *fail on no memory. m2a_host_wire_end frees it. */
m2a_wire_token_t *m2a_host_wire_begin(moea2a_moe_t moe, const m2a_dispatch_args_t *a, m2a_wire_token_t *w, int *fail);
void m2a_host_wire_end(m2a_wire_token_t *w);

/* The rows the combine sends, from the expert side's rows in ([ep][stride] of the
 * combine dtype): in itself as is; with an FP8 combine wire each source's valid rows
 * (moe->h_recv_counts) quantized into staging (l->stage_cwire, [ep][stride] wire rows). */
const unsigned char *m2a_host_combine_rows(moea2a_moe_t moe, const unsigned char *in);

/* The expert-major pass on host memory (m2a_moe_backend_t.expert_expand, expert_fold). */
moea2a_result_t m2a_host_expert_expand_op(moea2a_moe_t moe, int num_local, int need_rows, void *stream,
                                          m2a_expert_view_t *out);
moea2a_result_t m2a_host_expert_fold_op(moea2a_moe_t moe, int num_local, const unsigned char *rows, void *stream);
#endif

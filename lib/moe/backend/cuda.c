/* The cuda backend: CUDA memory among ranks that do not all reach each other by
 * load/store. The generic flow (lib/moe/backend/generic.c) with the device's local steps
 * (lib/moe/backend/cuda_steps.c): headers over the host transport, rows by NCCL send and receive; one
 * host synchronization per dispatch, for the counts NCCL needs on the host. */
#include "moe/backend.h"
#include "moe/backend/cuda_steps.h"
#include "moe/backend/generic.h"

/* the sender's quantized rows (the pack kernel copies them as bytes) */
static void cuda_size(const moea2a_moe_config_t *c, int ep, const m2a_moe_nodes_t *nodes, m2a_moe_backend_size_t *out)
{
    (void)c, (void)ep, (void)nodes;
    out->quantized_rows = 1;
    out->device_load = 1, out->device_tables = 1;
}

static const m2a_generic_steps_t steps = {
    .route = m2a_moe_cuda_route, .pack = m2a_moe_cuda_pack, .sanitize = m2a_moe_cuda_sanitize,
    .combine_rows = m2a_moe_cuda_combine_rows, .reduce = m2a_moe_cuda_combine, .wait = m2a_moe_cuda_wait,
};

static void cuda_release(moea2a_moe_t moe)
{
    m2a_moe_cuda_free_workspace(moe);
    m2a_moe_cuda_end(moe);
}

static moea2a_result_t cuda_alloc(moea2a_moe_t moe)
{
    moe->steps = &steps;
    moea2a_result_t r = m2a_moe_cuda_begin(moe);
    if (r == MOEA2A_SUCCESS) r = m2a_moe_cuda_alloc_workspace(moe);
    if (r == MOEA2A_SUCCESS) r = m2a_moe_cuda_finish(moe);
    return r;
}

/* by role: the context's memory; the collectives; the expert-major pass; capture */
const m2a_moe_backend_t m2a_moe_backend_cuda = {
    .name = "cuda",
    .size = cuda_size, .alloc = cuda_alloc, .release = cuda_release,
    .dispatch = m2a_generic_dispatch, .combine = m2a_generic_combine,
    .expert_expand = m2a_moe_cuda_expand_view, .expert_fold = m2a_moe_cuda_expert_fold,
    .capturing = m2a_moe_cuda_capturing, .placement = m2a_moe_cuda_placement,
    .count_load = m2a_moe_cuda_count_load, .take_load = m2a_moe_cuda_take_load,
    .not_capturable = "the generic NCCL path cannot be captured in a CUDA graph (a dispatch waits on the host for "
                      "the counts): call dispatch and combine outside the capture and capture what runs between them",
    .fp8_combine_hidden = M2A_FAST_FP8_MAX_HIDDEN, /* a warp's scales of a row in shared memory */
};

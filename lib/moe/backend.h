/* MoE backends: the families of paths a context can take, one table each, chosen once
 * at create (moe.c) and called only through the table:
 *   host    host memory; headers and packed rows over the host transport (backend/host.c)
 *   hier    host memory across nodes: a row once per node, relayed inside it (backend/hier.c)
 *   cuda    CUDA memory; headers on the host, rows by NCCL send/receive (backend/cuda.c)
 *   cuda-hier  CUDA memory across nodes: hier's plan over NCCL, relayed by the pack kernel
 *           (backend/cuda_hier.c)
 *   nvlink  CUDA memory; one kernel per half over load/store peer pointers (backend/nvlink.c)
 * The MoE layer (moe.c: the public calls, their checks and order; expert.c: the
 * expert-major pass) calls a backend and never asks which one it holds; a backend gets
 * what it needs as arguments and the context, uses what sits beside it in the layer
 * (core.h: agreement, results; layout.h: the formula; backend/generic.h: the
 * header-and-exchange flow; backend/cuda_steps.h: the CUDA context and kernels) and
 * never calls moe.c or expert.c. A new backend is a new file, its table, and a line
 * in m2a_moe_backend_pick. */
#ifndef M2A_MOE_BACKEND_H
#define M2A_MOE_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "moe/layout.h"
#include "moea2a.h"

/* Which halves one call performs (the kernels' M2A_FAST_* have these values). */
enum { M2A_MOE_SEND = 1, M2A_MOE_RECV = 2, M2A_MOE_BOTH = 3 };

/* A dispatch's inputs, as the caller passed them (already checked unless status says
 * otherwise). stride: the receive stride of this call (runtime_max, or cap). */
typedef struct {
    int n, stride;
    const int32_t *ids;
    const float *weights;
    const void *const *payloads;
} m2a_dispatch_args_t;

/* What the expert-major layout's expand leaves on the host. */
typedef struct {
    int64_t rows; /* the layout's rows, padding included; -1: over the bound, or not known on the host */
    const int32_t *counts_host, *offsets_host; /* host-readable counts and offsets, or NULL */
} m2a_expert_view_t;

typedef struct m2a_moe_backend {
    const char *name;
    /* pure: its additions to the formula for this config on ep ranks placed as nodes
     * says (NULL: none; moe_layout.h) */
    void (*size)(const moea2a_moe_config_t *c, int ep, const m2a_moe_nodes_t *nodes, m2a_moe_backend_size_t *out);
    /* collective: the workspace, staging and tables of moe->l (the core's layout);
     * MOEA2A_ERR_UNAVAILABLE on every rank when it cannot serve this communicator */
    moea2a_result_t (*alloc)(moea2a_moe_t moe);
    void (*release)(moea2a_moe_t moe);
    /* The halves of a dispatch, phases M2A_MOE_SEND, RECV or BOTH, collective. The send
     * half gets this rank's check result (status), which must reach every peer as that
     * call's error; with MOEA2A_SUCCESS it sets moe->num_tokens and moe->stride. The
     * receive half fills result. */
    moea2a_result_t (*dispatch)(moea2a_moe_t moe, moea2a_result_t status, const m2a_dispatch_args_t *a,
                                moea2a_dispatch_result_t *result, int phases, void *stream);
    /* The halves of a combine, the same way (expert_out in the send half, out in the
     * receive half). */
    moea2a_result_t (*combine)(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out, int phases,
                               void *stream);
    /* non-blocking: an error recorded where the host did not wait (NULL: never) */
    moea2a_result_t (*status)(moea2a_moe_t moe);
    /* Collective, after a dispatch that no combine will answer (the expert-major layout
     * over its bound on some rank, on every rank): what the next dispatch needs (NULL:
     * nothing). */
    moea2a_result_t (*drop)(moea2a_moe_t moe, void *stream);
    /* The expert-major layout (moe/expert.c orders it). expert_expand: built from what
     * the last dispatch delivered, for this rank's num_local experts; the rows known on
     * the host where need_rows (a bound that may bind), else where that costs nothing.
     * expert_fold: the expert side's rows folded into the rank-major combine rows
     * (ws + l.combine), which the combine then sends. */
    moea2a_result_t (*expert_expand)(moea2a_moe_t moe, int num_local, int need_rows, void *stream,
                                     m2a_expert_view_t *out);
    moea2a_result_t (*expert_fold)(moea2a_moe_t moe, int num_local, const unsigned char *rows, void *stream);
    /* After the placement changed (moe->h_owner and moe->route hold the new one): what
     * the device keeps of it, rewritten in order on stream (NULL: nothing kept). */
    moea2a_result_t (*placement)(moea2a_moe_t moe, void *stream);
    /* The experts' load on the device (MOEA2A_MOE_EXPERT_LOAD; NULL: the host counts):
     * count_load adds the last dispatch's entries in order on stream; take_load waits for
     * the device, reads the counts into load[E] and zeroes them. */
    moea2a_result_t (*count_load)(moea2a_moe_t moe, void *stream);
    moea2a_result_t (*take_load)(moea2a_moe_t moe, int64_t *load);
    /* Whether stream is being captured into a CUDA graph (NULL: no device streams). */
    moea2a_result_t (*capturing)(moea2a_moe_t moe, void *stream, int *capturing);
    /* With capturing: why a dispatch or combine on a capturing stream is refused before
     * anything is enqueued (the calls wait on the host, which a graph cannot replay);
     * NULL: the calls may be captured. */
    const char *not_capturable;
    /* The backend that serves the context when alloc finds this one unavailable on every
     * rank (NULL: none, the create fails). */
    const struct m2a_moe_backend *fallback;
    /* 1: serves copy-engine mode (MOEA2A_MOE_COPY_ENGINE). */
    int copy_engine;
    /* The largest hidden whose combine rows it sends on the FP8 combine wire (0: it does
     * not serve that wire). Copy-engine mode sums rows as they are, so never with it. */
    size_t fp8_combine_hidden;
} m2a_moe_backend_t;

extern const m2a_moe_backend_t m2a_moe_backend_host, m2a_moe_backend_hier, m2a_moe_backend_cuda,
    m2a_moe_backend_cuda_hier, m2a_moe_backend_nvlink;

/* The backend for a context in host or CUDA memory that does (lsa) or does not reach
 * every peer by load/store; hier: across nodes, the hierarchical path allowed
 * (MOEA2A_HIERARCHICAL). */
static inline const m2a_moe_backend_t *m2a_moe_backend_pick(int cuda, int lsa, int hier)
{
    return !cuda ? (hier ? &m2a_moe_backend_hier : &m2a_moe_backend_host)
                 : hier ? &m2a_moe_backend_cuda_hier : lsa ? &m2a_moe_backend_nvlink : &m2a_moe_backend_cuda;
}
#endif

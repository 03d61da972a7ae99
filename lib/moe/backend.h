/* MoE backends: the families of paths a context can take, one table each, chosen once
 * at create (moe.c) and called only through the table:
 *   host    host memory; headers and packed rows over the host transport (moe_backend_host.c)
 *   cuda    CUDA memory; headers on the host, rows by NCCL send/receive (moe_backend_cuda.c)
 *   nvlink  CUDA memory; one kernel per half over load/store peer pointers (moe_backend_nvlink.c)
 * Layers: moe.c (the public calls: checks, call order) calls a backend; a backend calls
 * the shared pieces below it (moe_core.h: agreement, results; moe_generic.h: the
 * header-and-exchange flow; moe_cuda.h: CUDA context and kernels; moe_layout.h: the
 * formula) and never moe.c. A new backend is a new file and a line in
 * m2a_moe_backend_pick. */
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

typedef struct m2a_moe_backend {
    const char *name;
    /* pure: its additions to the formula for this config on ep ranks (NULL: none;
     * moe_layout.h) */
    void (*size)(const moea2a_moe_config_t *c, int ep, m2a_moe_backend_size_t *out);
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
} m2a_moe_backend_t;

extern const m2a_moe_backend_t m2a_moe_backend_host, m2a_moe_backend_cuda, m2a_moe_backend_nvlink;

/* The backend for a context in host or CUDA memory that does (lsa) or does not reach
 * every peer by load/store. */
static inline const m2a_moe_backend_t *m2a_moe_backend_pick(int cuda, int lsa)
{
    return !cuda ? &m2a_moe_backend_host : lsa ? &m2a_moe_backend_nvlink : &m2a_moe_backend_cuda;
}
#endif

/* Copy-engine mode of the load/store path (MOEA2A_MOE_COPY_ENGINE, moea2a_moe(3)):
 * the rows move by the GPU's DMA copy engines, so no SM is held while bytes cross
 * NVLink. The kernels keep the small parts: routing (the send map, ids, weights,
 * source index, counts; the load/store kernels' own send half, told not to move rows
 * nor signal), the signal, the receive half's checks and sanitize, and the combine's
 * sum. Between them the host reads the send map once per dispatch (one bounded wait),
 * turns it into runs of consecutive tokens per destination and hands them to the copy
 * engines as one batch; the combine pulls each peer's [this rank][0, count) rows in
 * one copy per peer and sums them locally (the load/store combine's arithmetic, on the
 * SM budget's blocks). A batch of 4 MiB or more is cut into MOEA2A_CE_LANES parts of
 * equal bytes, each on its own stream, which the driver spreads over the engines.
 * The host wait makes dispatch and combine uncapturable in CUDA graphs: both refuse
 * a capturing stream.
 *
 * Called by the nvlink backend (nvlink.c) only, with what it needs. */
#ifndef M2A_MOE_COPY_ENGINE_H
#define M2A_MOE_COPY_ENGINE_H
#include "moe/core.h"
#include "comm/cuda_module.h"
#include "moe/layout.h"

typedef struct m2a_ce m2a_ce_t;

/* The most copy lanes (MOEA2A_CE_LANES): streams a large batch is spread over. */
#define M2A_CE_MAX_LANES 8

/* The formula's additions (into the nvlink backend's): pinned, after the backend's
 * first `pinned` bytes: the send map as the host reads it (int32 [cap][k]) and the
 * copy list (three 8-byte words per copy, cap x min(k, ep) x payloads + ep copies);
 * staging: the landing index (int32 [ep]) and the combine rows pulled from the
 * peers ([ep - 1][cap][combine row]). */
void m2a_ce_size(const moea2a_moe_config_t *c, int ep, m2a_moe_backend_size_t *out);

/* After the workspace, its window and f exist: the state (*out), the landing index
 * uploaded. blocks: the SM budget (the blocks of every launch here);
 * pinned_off: where its pinned part starts in the backend's
 * share of moe->pinned. */
moea2a_result_t m2a_ce_create(moea2a_moe_t moe, const m2a_fast_t *f, int blocks, size_t pinned_off, m2a_ce_t **out);
void m2a_ce_destroy(m2a_ce_t *ce);

/* A dispatch's send half, first part: the routing launch (the rows not moved, no
 * signal); with status != MOEA2A_SUCCESS it carries this rank's failure to the peers
 * and the signal follows at once. Otherwise it waits for the stream (bounded) and
 * reads the send map: the caller then checks the launch's device error record before
 * m2a_ce_dispatch_rows. A capturing stream is refused (MOEA2A_ERR_UNAVAILABLE). */
moea2a_result_t m2a_ce_dispatch_route(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride, int status,
                                      const int32_t *ids, const float *weights, void *stream);
/* Second part: the rows by the copy engines, then the signal. */
moea2a_result_t m2a_ce_dispatch_rows(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride,
                                     m2a_kpayloads_t pay, void *stream);
/* Before a combine launches anything: a capturing stream is refused. */
moea2a_result_t m2a_ce_combine_check(moea2a_moe_t moe, void *stream);
/* A combine's receive half after the wait for the peers' rows (the load/store
 * kernel's, with no tokens): the pulls, then the sum into out. */
moea2a_result_t m2a_ce_combine_rows(moea2a_moe_t moe, m2a_ce_t *ce, int n, int stride, void *out, void *stream);
#endif

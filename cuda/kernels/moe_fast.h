/* The load/store (NVLink) path of dispatch and combine: one kernel each, launched on
 * the caller's stream, moving rows straight between the ranks' workspaces through
 * the peer pointers of a symmetric allocation. No host synchronization, so both can
 * be captured in a CUDA graph; every wait on a peer is bounded and ends the kernel
 * with an error record instead of a trap. */
#ifndef M2A_MOE_FAST_H
#define M2A_MOE_FAST_H
#include <stddef.h>
#include <stdint.h>

#include "comm/cuda_module.h"
#include "moe_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* status != 0: this rank failed its argument checks; it sends nothing and tells every
 * peer, whose kernels record that error. */
int m2a_fast_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                      const int32_t *ids, const float *weights, int phases, void *stream);
/* expert_rows: NULL when the expert side wrote into the workspace's combine buffer.
 * status != 0 (send half): this rank's combine failed its checks; the peers' receive
 * halves record that error instead of reading its rows. */
int m2a_fast_combine(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows, void *out,
                     int status, int phases, void *stream);
/* The signal a dispatch's send half ends with, on its own (one small block): every
 * rank's arrival count for this rank moves by `blocks` (the peers wait for blocks per
 * dispatch). After a QUIET send half and the rows the host had copied. */
int m2a_fast_signal(const m2a_fast_t *f, int blocks, void *stream);
/* Loads this file's kernels now (cuda/kernels/load.cuh says why). */
int m2a_fast_load(void);
/* Copy-engine mode's combine sum, once the rows are in this GPU's memory: out[t] = the
 * sum of token t's rows (this rank's own in its combine buffer, the others' in
 * landing[index[rank]][cap][combine row]) in the load/store combine's arithmetic. */
int m2a_fast_landing_reduce(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *landing,
                            const int32_t *index, void *out, void *stream);
/* Whether the combine (and copy-engine mode's sum) can reduce through bulk copies where
 * the even split does not apply, given 16-byte rows: M2A_FAST_BULK_OK, or why not. With
 * *unit the bytes of a token's row per unit, *stages the units in flight per warp and
 * *smem the most dynamic shared memory a block asks for. */
int m2a_fast_bulk(const m2a_fast_t *f, size_t *unit, int *stages, size_t *smem);
#ifdef M2A_FAST_PROFILE
void m2a_fast_profile_report(int rank); /* prints the phase means to stderr, then resets */
#endif

#ifdef __cplusplus
}
#endif
#endif

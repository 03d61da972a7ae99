/* The expert-major layout (moea2a_moe(3), "Expert-major layout") around the backends'
 * rank-major dispatch and combine: built from what a dispatch delivered, folded back
 * into rank-major combine rows before a combine, on the host or on the stream. */
#ifndef M2A_MOE_EXPERT_H
#define M2A_MOE_EXPERT_H
#include "moe/core.h"

/* Whether the context delivers the expert-major layout. */
static inline int m2a_moe_expert_major(const moea2a_moe_t moe)
{
    return moe->cfg.layout == MOEA2A_LAYOUT_EXPERT_MAJOR;
}

/* Collective, after a dispatch's receive half succeeded on every rank: the layout, and
 * its fields in result (NULL: the send half of a split call has none). Over
 * max_expert_rows on any rank: MOEA2A_ERR_CAPACITY on every rank, naming the rank and
 * the bound to raise; no expert-major row is written then. On CUDA memory a bound below
 * the worst case makes the host wait for the rows. */
moea2a_result_t m2a_moe_expert_dispatch(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream);
/* Local, before a dispatch or its halves start anything: MOEA2A_ERR_UNAVAILABLE when
 * the host would have to wait for the rows (CUDA memory, a bound below the worst case)
 * but the stream is being captured into a graph. */
moea2a_result_t m2a_moe_expert_check_stream(moea2a_moe_t moe, const char *fn, void *stream);
/* Local, before a combine's send half: the expert side's rows (expert_out, or the
 * context's expert-major combine buffer when NULL) folded into the rank-major combine
 * buffer, which the backend then sends. */
moea2a_result_t m2a_moe_expert_combine(moea2a_moe_t moe, const void *expert_out, void *stream);
#endif

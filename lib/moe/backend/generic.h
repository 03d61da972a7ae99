/* The host-driven flow of the generic backends (host memory; CUDA memory through NCCL
 * send/receive): a dispatch exchanges headers (counts, stride and every rank's verdict
 * on its arguments), packs, moves every array with the transports' all-to-all and
 * sanitizes; a combine agrees that every rank can go on, sends the expert rows back
 * and reduces. The local steps differ by memory and come from the backend. */
#ifndef M2A_MOE_GENERIC_H
#define M2A_MOE_GENERIC_H
#include "moe/core.h"
#include "moe/backend.h"

typedef struct {
    /* this rank's tokens: counts per destination into moe->h_send_counts, the send map
     * into the workspace, invalid and merged entries */
    moea2a_result_t (*route)(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                             int64_t *dedup);
    /* the records: this rank's own tokens into its slots, staged peers' into staging
     * (moe->h_recv_counts holds what each peer sends) */
    moea2a_result_t (*pack)(moea2a_moe_t moe, const m2a_dispatch_args_t *a, void *stream);
    moea2a_result_t (*sanitize)(moea2a_moe_t moe, int stride, void *stream);
    /* *rows = the rows a combine sends, from the expert side's (in: [ep][stride] of the
     * combine dtype), [ep][stride] rows of l->combine_wire bytes; NULL: in itself */
    moea2a_result_t (*combine_rows)(moea2a_moe_t moe, const unsigned char *in, const unsigned char **rows, void *stream);
    /* out = the token-order sum of the rows (in: this rank's rows as combine_rows gave them) */
    moea2a_result_t (*reduce)(moea2a_moe_t moe, const unsigned char *in, void *out, void *stream);
    void (*wait)(void *stream); /* for phase tracing; NULL: nothing runs asynchronously */
} m2a_generic_steps_t;

/* The header exchange of a dispatch's send half: send[q] rows announced to each rank
 * q (0 where this rank failed its checks, mine), with its stride rt and num_tokens n;
 * every rank's verdict judged (a failed rank's reason, or a runtime_max
 * disagreement, becomes every rank's error); recv[q] the rows q announced here. */
moea2a_result_t m2a_generic_headers(moea2a_moe_t moe, moea2a_result_t mine, int n, int rt, const int32_t *send,
                                    int32_t *recv);
/* The first step of a combine's send half: every rank learns whether every rank can
 * go on (a failed rank's reason becomes every rank's error). */
moea2a_result_t m2a_generic_combine_agree(moea2a_moe_t moe, moea2a_result_t mine);

/* One side of a move: array a of peer q's block starts at buf[a] + byte0[q] + row0[q] x
 * width[a] (NULL byte0 / row0: 0), rows[q] rows of it; a NULL buf[a] leaves array a out
 * of this pair (on every rank alike). */
typedef struct {
    unsigned char *buf[M2A_MOE_MAX_ARRAYS + 1];
    const int32_t *rows;
    const int64_t *row0, *byte0;
} m2a_move_side_t;

/* The moves of pairs (send side, receive side) of narrays arrays (at most
 * M2A_MOE_MAX_ARRAYS + 1), one non-blocking all-to-all per array and pair, all in one
 * transport group (one NCCL group on CUDA memory, on stream), then waited for. Between
 * two ranks the moves go in pair order, then array order, on both sides. */
moea2a_result_t m2a_generic_move(moea2a_moe_t moe, const char *fn, const m2a_move_side_t *pairs, int npairs,
                                 int narrays, const size_t *width, void *stream);

/* The first stage of a hierarchical dispatch as two pairs of move sides (pairs[0..3]):
 * the rows for the other ranks of this rank's node from their staging blocks into their
 * slots, and the rows for the rail peers of other nodes into fwd, an array-major region
 * of n_fwd rows holding cap rows per source served (index[q] its place, or -1); s1_send
 * and s1_recv the rows to and from each rank, node[] each rank's node. v: scratch of 5
 * ep int64 that the sides point into. MOEA2A_ERR_INTERNAL where a rank that this one
 * does not serve sends it rows across nodes. */
moea2a_result_t m2a_generic_first_stage(moea2a_moe_t moe, const int *node, const int32_t *s1_send,
                                        const int32_t *s1_recv, const int *index, int stride, unsigned char *fwd,
                                        size_t n_fwd, int64_t *v, m2a_move_side_t *pairs);

/* The dispatch and combine operations of a generic backend, whose alloc sets
 * moe->steps to its steps (m2a_generic_steps_t). */
moea2a_result_t m2a_generic_dispatch(moea2a_moe_t moe, moea2a_result_t status, const m2a_dispatch_args_t *a,
                                     moea2a_dispatch_result_t *result, int phases, void *stream);
moea2a_result_t m2a_generic_combine(moea2a_moe_t moe, moea2a_result_t status, const void *expert_out, void *out,
                                    int phases, void *stream);
#endif

/* The MoE data path on the host, one rank's share, with no communication: routing,
 * dispatch records, sanitize, and the combine reduction. These are the reference the
 * CUDA kernels are tested against, so they are written for clarity first. */
#ifndef M2A_MOE_HOST_H
#define M2A_MOE_HOST_H
#include <stdint.h>

#include "moe/layout.h"

/* For tokens 0..n-1 in order: the ranks owning their valid experts, each rank once
 * per token. send_counts[ep] = tokens per destination; send_map[n][k] = entries
 * (rank * cap + slot) in ascending rank order, then -1. Slots are handed out in
 * ascending token order, so receivers see source order. */
void m2a_host_route(const m2a_route_t *r, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                    int64_t *invalid_entries, int64_t *deduplicated, int64_t *dropped_entries);

/* A token's payloads quantized on dispatch (m2a_host_quantize_token): made once, then
 * copied to each of its destinations. */
typedef struct {
    unsigned char *codes[MOEA2A_MOE_MAX_PAYLOADS], *scales[MOEA2A_MOE_MAX_PAYLOADS];
    float global[MOEA2A_MOE_MAX_PAYLOADS]; /* NVFP4: the sender's global scale */
    unsigned char *buffer;                 /* holds every codes[] and scales[] row */
} m2a_wire_token_t;

/* Quantizes token t of every payload sent quantized into w (buffers of the layout's
 * code and scale row sizes; global[] already set) exactly as moea2a_fp8_quantize and
 * moea2a_fp4_quantize do one row (row-major / linear scales). */
void m2a_host_quantize_token(const moea2a_moe_config_t *c, int t, const void *const *payloads, m2a_wire_token_t *w);

/* Copies token t's arrays (payload rows or, from w, their codes, scales and global
 * scale; its k ids, its k weights if carried, its index t) to row `slot` of each
 * destination array: base[a] + slot x width(a). */
void m2a_host_put_token(const m2a_route_t *r, const m2a_moe_layout_t *l, int t, const void *const *payloads,
                        const int32_t *ids, const float *weights, const m2a_wire_token_t *w,
                        unsigned char *const *base, size_t slot);

/* After the arrays of quantized payloads landed: padding rows' scales 0, the scales in
 * the wire's layout (FP8 MN-major per source block, NVFP4 tiles over ep x stride
 * rows), NVFP4's global scale per source (0 where a source sent nothing). */
void m2a_host_wire_finish(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int ep, int stride,
                          unsigned char *ws);


/* Padding slots (i >= recv_counts[src]) get source index -1 and, when sanitizing,
 * invalid ids in all k entries; valid rows get invalid ids normalized to invalid_id
 * and, with rewrite_nonlocal, ids owned by other ranks too. */
void m2a_host_sanitize(const m2a_route_t *r, const m2a_moe_layout_t *l, int stride, int sanitize,
                       int rewrite_nonlocal, unsigned char *ws);

/* A combine row as it travels (moea2a_moe_config_t.combine_wire): hidden values of the
 * combine dtype, or FP8: hidden E4M3 codes, then the row's scales, row-major (one fp32,
 * or one UE8M0 byte of a little-endian word of four, per 128 values). bytes: a row's. */
typedef struct {
    moea2a_datatype_t dtype;
    size_t hidden, bytes;
    int fp8, ue8m0;
} m2a_crow_t;
void m2a_host_crow(const moea2a_moe_config_t *c, m2a_crow_t *f);
/* n rows of the combine dtype -> n wire rows (a copy as is; FP8: moea2a_fp8(3)'s block
 * rule, each row quantized on its own). */
void m2a_host_crow_pack(const m2a_crow_t *f, const unsigned char *rows, size_t n, unsigned char *wire);

/* out[t] = sum over the token's destinations in ascending rank order, in fp32, of
 * their rows (wire rows, dequantized), rounded once to the dtype; across nodes (nodes >
 * 1, node[rank] each rank's node) the node-grouped order: each node's partial so, as it
 * travels (rounded to the dtype, or quantized to FP8 again), the partials added in
 * ascending node order. Rows of this rank are read from self_rows (slot-indexed), the
 * others' from landing[stage_index[rank]][slot]. Tokens with no destination get zeros.
 * Returns -1 if it could not allocate its accumulators. */
int m2a_host_combine_reduce(const m2a_route_t *r, int n, const int32_t *send_map, const m2a_crow_t *f,
                            const unsigned char *self_rows, const unsigned char *landing, const int *stage_index,
                            const int *node, int nodes, void *out);
/* out = wire rows[0..nrows) summed in fp32 in that order from 0, then stored as a wire
 * row (wire: a node's partial as it travels) or rounded to the dtype (every NaN the
 * canonical one): a node's partial of a token from its ranks' rows in ascending rank
 * order, and the sum of a token's partials in ascending node order, as
 * m2a_host_combine_reduce computes them. acc: hidden floats. */
void m2a_host_sum_rows(const m2a_crow_t *f, const unsigned char *const *rows, int nrows, float *acc, void *out,
                       int wire);
/* The expert-major layout (moea2a_moe(3)), from the rank-major arrays a dispatch left
 * in ws at this stride: per local expert (ascending global id) its rows in ascending
 * (source rank, source token) order from an offset aligned to expert_alignment, the
 * per-row arrays, and the map from (slot, top-k slot) to row that the combine folds
 * back by. Returns the rows used, padding included, or -1 over l->ex_rows (no row
 * written). *num_local: this rank's experts. */
int64_t m2a_host_expert_expand(const m2a_route_t *r, const moea2a_moe_config_t *c, const m2a_moe_layout_t *l,
                               int stride, unsigned char *ws, int *num_local);
/* MOEA2A_MOE_EXPERT_WIRE_SCALES: each payload's expert-major row scales (rows rows
 * used) copied into its wire's tiled layout (l->ex_scales_wire; FP8 MN-major, NVFP4
 * 128x4 / 8x4), padding 0. */
void m2a_host_expert_wire_scales(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, unsigned char *ws,
                                 int64_t rows);
/* The expert side's rows ([rows][hidden] of combine_dtype) folded into each valid
 * slot's rank-major combine row (ws + l->combine): over the slot's top-k entries in
 * ascending order, the row of each local one times its router weight (1 without
 * MOEA2A_MOE_WEIGHTED_COMBINE), each product rounded to fp32, summed in fp32 from 0,
 * rounded once to combine_dtype. -1 out of memory. */
int m2a_host_expert_fold(const m2a_route_t *r, const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int stride,
                         const unsigned char *rows, unsigned char *ws);
#endif

/* The MoE workspace: the exact formula of moea2a_moe_workspace_size(3), as byte
 * offsets of every array, so that sizing and allocation cannot disagree. */
#ifndef M2A_MOE_LAYOUT_H
#define M2A_MOE_LAYOUT_H
#include <stddef.h>

#include "moea2a.h"
#include "wireup/topo.h"

#define M2A_ALIGN 128
static inline size_t m2a_align(size_t x) { return (x + M2A_ALIGN - 1) & ~(size_t)(M2A_ALIGN - 1); }

/* The per-peer header of a dispatch's first exchange. */
typedef struct {
    int32_t count;       /* tokens the sender sends to the receiver */
    int32_t runtime_max; /* the sender's runtime_max_tokens_per_rank */
    int32_t status;      /* moea2a_result_t of the sender's argument checks */
    int32_t num_tokens;  /* the sender's num_tokens */
} m2a_moe_header_t;

/* What an array of a record holds. */
typedef enum {
    M2A_ARR_PAYLOAD, /* payload i's bytes as given, or its codes when quantized on dispatch */
    M2A_ARR_SCALES,  /* a quantized payload's scales for the token: row-major FP8 / linear NVFP4 */
    M2A_ARR_GLOBAL,  /* an NVFP4 payload's global scale (the sender's, the same in every row) */
    M2A_ARR_IDS,
    M2A_ARR_WEIGHTS,
    M2A_ARR_INDEX /* the source token index */
} m2a_moe_array_kind_t;

/* One array a token carries. */
typedef struct {
    size_t width;  /* bytes per token */
    size_t ws;     /* offset of its [ep][stride][width] array in the workspace */
    size_t rec;    /* offset within a record; in staging, the array starts at cap x rec */
    int kind;      /* m2a_moe_array_kind_t */
    int payload;   /* the payload it belongs to (payload, scales, global) */
} m2a_moe_array_t;

/* One byte array an expert-major row carries (a payload, or a quantized one's codes,
 * row scales or NVFP4 global scale): offsets of its rank-major rows and of its expert
 * rows, bytes per row, and whether gap rows get zeros always (scales: a GEMM reads
 * them) or only with MOEA2A_MOE_ZERO_PADDING. The host reference and the kernels both
 * walk this list. */
typedef struct {
    size_t src, dst, width;
    int always_zero;
} m2a_moe_ex_array_t;
#define M2A_MOE_MAX_EX_ARRAYS (3 * MOEA2A_MOE_MAX_PAYLOADS)

/* The device's expert-major kernels split the slots into at most this many parts
 * (cuda/kernels/expert_kernels.h has the same bound). */
#define M2A_EXPERT_PARTS 16

/* payloads (as given, or codes + scales [+ global scale] when quantized), ids, weights,
 * source index (the kernels' M2A_K_MAX_ARRAYS is the same bound) */
#define M2A_MOE_MAX_ARRAYS (3 * MOEA2A_MOE_MAX_PAYLOADS + 3)

/* Quantize on dispatch, per payload: the bytes of a token's codes and of its scales
 * on the wire. */
size_t m2a_wire_code_bytes(const moea2a_moe_config_t *c, int i);
/* A combine row on the wire: hidden x size(combine_dtype) as is; FP8: hidden codes, then
 * the row's scales (4 x hidden / 128 bytes; UE8M0: 4 x ceil(hidden / 512)). */
size_t m2a_combine_wire_bytes(const moea2a_moe_config_t *c);
size_t m2a_wire_scale_row_bytes(const moea2a_moe_config_t *c, int i);
/* MOEA2A_MOE_EXPERT_WIRE_SCALES: payload i's expert-major scales in its wire's tiled
 * layout: 1 (FP8 MN-major), 128 / 8 (NVFP4's tiles: rows per tile), 0 (row-major,
 * linear, not quantized, or the flag off); and their bytes over rows rows. */
int m2a_expert_scale_tile(const moea2a_moe_config_t *c, int i);
size_t m2a_expert_wire_scale_bytes(const moea2a_moe_config_t *c, int i, size_t rows);

typedef struct {
    /* aux: counters, flags, headers, the per-token send map, source indexes */
    size_t recv_counts, send_counts, hdr_send, hdr_recv, send_map, src_index, owner, stage_index, node, stats, load,
        aux_end;
    /* the backend's control regions in the aux part (m2a_moe_backend_t.size) */
    size_t backend_ctl;
    size_t payload[MOEA2A_MOE_MAX_PAYLOADS], ids, weights, combine;
    /* the general placement's tables, at the end (layout.c says why) */
    size_t holders, nrep, dropped_sums;
    size_t workspace; /* total workspace bytes */
    /* staging: dispatch records to, and records or combine rows from, staged peers;
     * then the backend's share */
    size_t stage_send, stage_recv, stage_backend, staging;
    size_t pinned; /* CUDA contexts: host mirror of counts and headers, then the backend's share */
    size_t pinned_stats, pinned_backend;
    size_t pinned_expert; /* expert-major: rows (int64), counts, offsets as the host gets them */
    size_t row_bytes[MOEA2A_MOE_MAX_PAYLOADS], combine_row, record;
    /* a combine row on the wire (combine_row unless combine_wire quantizes), and the
     * staging of the rows quantized for it ([ep][cap]; with an FP8 combine wire only) */
    size_t combine_wire, stage_cwire;
    size_t bytes_payload[MOEA2A_MOE_MAX_PAYLOADS], bytes_ids, bytes_weights, bytes_combine;
    /* quantize on dispatch, per payload sent quantized (else 0): its scales as they
     * land ([ep][cap][scale row]), NVFP4's global scale per row ([ep][cap][4]) and per
     * source (float[ep]), and the scales in the wire's layout where that is not the
     * landing one (FP8 MN-major, NVFP4 tiled; else the landing offset) */
    size_t wire_scale_row[MOEA2A_MOE_MAX_PAYLOADS], wire_scales[MOEA2A_MOE_MAX_PAYLOADS];
    size_t wire_global_rows[MOEA2A_MOE_MAX_PAYLOADS], wire_global[MOEA2A_MOE_MAX_PAYLOADS];
    size_t wire_final[MOEA2A_MOE_MAX_PAYLOADS];
    /* backends that quantize before sending (quantized_rows): this rank's tokens
     * quantized, [cap][code row], [cap][scale row], NVFP4 [cap][4] (else 0) */
    size_t send_codes[MOEA2A_MOE_MAX_PAYLOADS], send_scales[MOEA2A_MOE_MAX_PAYLOADS];
    size_t send_global[MOEA2A_MOE_MAX_PAYLOADS];
    /* the expert-major layout (else 0): ex_rows rows (max_expert_rows), ex_experts the
     * most experts a rank holds; the map from (slot, top-k slot) to row, per-expert
     * counts and offsets, one scratch region, rows of each payload, per-row ids, source
     * rank, source token, top-k slot [, weight], and the combine rows the expert side
     * writes. The scratch holds, in order: the rows used (int64), expert -> local index
     * [E], the host's cursors [experts + 1] (CUDA contexts: each local expert's global id), the
     * device's counts per part of the slots [M2A_EXPERT_PARTS][experts] */
    size_t ex_rows, ex_experts, ex_map, ex_counts, ex_offsets, ex_payload[MOEA2A_MOE_MAX_PAYLOADS];
    size_t ex_used, ex_local_of, ex_cursors, ex_parts;
    /* payloads quantized on dispatch (else 0): each expert row's scales, row-major
     * ([R][scale row]: FP8 row-major, NVFP4 linear), and NVFP4's global scale ([R]) */
    size_t ex_scales[MOEA2A_MOE_MAX_PAYLOADS], ex_global[MOEA2A_MOE_MAX_PAYLOADS];
    /* MOEA2A_MOE_EXPERT_WIRE_SCALES with a tiled wire layout: the scales in it (0: none) */
    size_t ex_scales_wire[MOEA2A_MOE_MAX_PAYLOADS];
    int ex_narrays;
    m2a_moe_ex_array_t ex_array[M2A_MOE_MAX_EX_ARRAYS];
    size_t ex_ids, ex_src_rank, ex_src_token, ex_slot, ex_weights, ex_combine, bytes_expert;
    /* the arrays of a record: payloads in order, ids, [weights], source index */
    int narrays;
    m2a_moe_array_t array[M2A_MOE_MAX_ARRAYS];
} m2a_moe_layout_t;

/* The record's array of a kind (M2A_ARR_IDS, M2A_ARR_INDEX: every record has one), the
 * first of that kind, or -1. */
static inline int m2a_moe_array_of(const m2a_moe_layout_t *l, int kind)
{
    for (int a = 0; a < l->narrays; a++)
        if ((int)l->array[a].kind == kind) return a;
    return -1;
}

/* Bytes of quantized payload i's scales in the wire's layout at this stride (the
 * dispatch result's payload_scale_bytes). */
size_t m2a_wire_scale_bytes(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int i, int ep, int stride);

/* The most experts one of ep ranks holds under the config's placement. */
int m2a_moe_max_local_experts(const moea2a_moe_config_t *c, int ep);
/* The expert-major rows no rank can exceed: ep x cap x min(k, most local experts) pairs
 * plus each of those experts' alignment gap (the config's alignment resolved). */
long long m2a_moe_expert_worst_rows(const moea2a_moe_config_t *c, int ep);
/* Checks a caller's config (size/version, ranges, overflow) for ep ranks and copies
 * it into *out with defaults applied. */
moea2a_result_t m2a_moe_read_config(moea2a_comm_t comm, const moea2a_moe_config_t *in, int ep,
                                    moea2a_moe_config_t *out);
/* What a backend adds to the workspace formula: its control regions (in the aux part
 * of the workspace), its share of the pinned host mirror, its share of staging (after
 * the staged peers'), and whether it quantizes payloads sent quantized into the
 * workspace before sending (the sender's rows of the formula, for CUDA kernels that
 * then copy codes and scales as bytes), and whether the FP8 combine wire's rows are
 * quantized in place in the combine buffer (no staging of their own), and whether it
 * counts the experts' load on the device (MOEA2A_MOE_EXPERT_LOAD: 8 bytes an expert in
 * the aux part), and whether its kernels route by the device's placement tables (the
 * general placement's holders, their counts and the dropped entries, 4 E ep +
 * 4 (E + 1) + 24 bytes at the end of the workspace). */
typedef struct {
    size_t ctl_bytes, pinned_bytes, staging_bytes;
    int quantized_rows, combine_wire_in_place, device_load, device_tables;
} m2a_moe_backend_size_t;

/* Where a rank sits among the nodes of its communicator's map, for the sizes of a path
 * across them: the nodes, the ranks of its own node, and the sources on other nodes it
 * relays for as their rail peer (moe/hier_plan.h); and the largest of the last two over
 * every rank, for a workspace of one size on every rank (symmetric memory: an NCCL
 * window takes the same size from every rank) where nodes differ in size. */
typedef struct {
    int nnodes, node_size, served;
    int widest, most_served;
} m2a_moe_nodes_t;

/* backend: what the context's backend adds (m2a_moe_backend_t.size). */
void m2a_moe_layout(const moea2a_moe_config_t *cfg, int ep, int staged_peers, const m2a_moe_backend_size_t *backend,
                    m2a_moe_layout_t *l);

/* Ranks the load/store path serves at most (one bit per destination). */
#define M2A_LSA_MAX_RANKS 64
/* Whether a config may use the load/store path: it needs a combine (its gate) and
 * may be switched off (MOEA2A_MOE_NO_NVLINK, MOEA2A_NVLINK=0). */
static inline int m2a_moe_lsa_allowed(const moea2a_moe_config_t *c)
{
    return c->hidden > 0 && !(c->flags & MOEA2A_MOE_NO_NVLINK);
}

/* Peers of `rank` that need staging, those joined to it by NVLink, and whether the
 * load/store path serves them all (*lsa; then none is staged). node[r]: node of rank
 * r; gpu[r]: its GPU on that node (-1 none). Host memory: every peer is staged. */
int m2a_moe_staged_peers(int ep, int rank, const int *node, const int *gpu, const m2a_topo_t *topo, int cuda,
                         int allow_lsa, int *nvlink_peers, int *lsa);
/* Fills the public sizes from a layout and placement. */
moea2a_result_t m2a_moe_fill_sizes(const moea2a_moe_config_t *cfg, const m2a_moe_layout_t *l, int cuda,
                                   int staged, int nvlink, const m2a_topo_t *topo, m2a_topo_place_t place,
                                   moea2a_moe_workspace_sizes_t *sizes);
/* The routing view every path and the host reference kernels share: the owner table
 * and the sizes. */
typedef struct {
    int ep, me, k, num_experts, cap, num_payloads, weights;
    int32_t invalid_id;
    const int32_t *owner; /* [num_experts]: rank that owns each expert (-1: none) */
    /* replicas (moea2a_moe_set_replicas; NULL: none): expert e's nrep[e] holders are
     * holders[e x max_rep + j], j < nrep[e] */
    const int32_t *holders, *nrep;
    int max_rep;
} m2a_route_t;

/* An expert id that routes nowhere: outside [0, E) or the configured invalid id. */
static inline int m2a_expert_invalid(const m2a_route_t *r, int32_t e)
{
    return e < 0 || e >= r->num_experts || e == r->invalid_id;
}

/* The rank that takes valid expert e for token t of rank src: its owner, or with
 * replicas its holder number (src + t) mod (its holders); -1: no rank holds it. Every
 * rank applies the same rule, so a receiver knows which of a token's entries are its. */
static inline int m2a_expert_rank(const m2a_route_t *r, int32_t e, int src, int t)
{
    if (!r->nrep) return r->owner[e];
    const int n = r->nrep[e];
    return n ? r->holders[(size_t)e * (size_t)r->max_rep + (size_t)((src + t) % n)] : -1;
}

/* Whether rank q holds valid expert e (as its owner or one of its replicas). */
static inline int m2a_expert_held(const m2a_route_t *r, int32_t e, int q)
{
    if (!r->nrep) return r->owner[e] == q;
    for (int j = 0; j < r->nrep[e]; j++)
        if (r->holders[(size_t)e * (size_t)r->max_rep + (size_t)j] == q) return 1;
    return 0;
}

#endif

/* MoE configuration checks, the workspace formula, and sizing from a layout. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/error.h"
#include "quant/fp4_math.h"
#include "quant/fp8_math.h"
#include "moe/layout.h"
#include "comm/last_error.h"
#include "base/params.h"

#define CONFIG_MIN_SIZE (offsetof(moea2a_moe_config_t, version) + sizeof(unsigned int))

/* One row's FP8 scales on the wire, row-major: fp32 per block, or UE8M0 four to a word. */
static size_t fp8_scale_row(size_t elems, unsigned flags)
{
    const size_t nkb = elems / M2A_FP8_BLOCK;
    return 4 * ((flags & MOEA2A_FP8_UE8M0) ? (nkb + 3) / 4 : nkb);
}

size_t m2a_combine_wire_bytes(const moea2a_moe_config_t *c)
{
    size_t es = 0;
    if (c->hidden) moea2a_datatype_size(c->combine_dtype, &es);
    if (c->combine_wire.format != MOEA2A_WIRE_FP8) return c->hidden * es;
    return c->hidden + fp8_scale_row(c->hidden, c->combine_wire.flags);
}

size_t m2a_wire_code_bytes(const moea2a_moe_config_t *c, int i)
{
    size_t e = c->payloads[i].elems_per_token;
    return c->wire[i].format == MOEA2A_WIRE_FP8 ? e : e / 2;
}

size_t m2a_wire_scale_row_bytes(const moea2a_moe_config_t *c, int i)
{
    size_t e = c->payloads[i].elems_per_token;
    if (c->wire[i].format == MOEA2A_WIRE_NVFP4) return e / 16; /* one E4M3 byte per 16 */
    return fp8_scale_row(e, c->wire[i].flags);
}

int m2a_expert_scale_tile(const moea2a_moe_config_t *c, int i)
{
    const moea2a_wire_t *w = &c->wire[i];
    if (!(c->flags & MOEA2A_MOE_EXPERT_WIRE_SCALES) || c->layout != MOEA2A_LAYOUT_EXPERT_MAJOR) return 0;
    if (w->format == MOEA2A_WIRE_FP8) return w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR;
    if (w->format != MOEA2A_WIRE_NVFP4 || w->scale_layout == MOEA2A_SF_LINEAR) return 0;
    return w->scale_layout == MOEA2A_SF_128X4 ? 128 : 8;
}

size_t m2a_expert_wire_scale_bytes(const moea2a_moe_config_t *c, int i, size_t rows)
{
    const size_t e = c->payloads[i].elems_per_token;
    if (c->wire[i].format == MOEA2A_WIRE_FP8) return m2a_wire_scale_row_bytes(c, i) * ((rows + 3) / 4 * 4);
    size_t bytes = 0;
    moea2a_fp4_sf_bytes((moea2a_sf_layout_t)c->wire[i].scale_layout, rows, e, &bytes);
    return bytes;
}

/* A payload's quantize-on-dispatch settings against its type and size. */
static moea2a_result_t check_wire(moea2a_comm_t comm, const moea2a_moe_config_t *c, int i)
{
    static const char fn[] = "moea2a_moe config";
    const moea2a_wire_t *w = &c->wire[i];
    const moea2a_payload_desc_t *p = &c->payloads[i];
    if (i >= c->num_payloads || w->format == MOEA2A_WIRE_AS_IS) {
        M2A_CHECK_ARG(comm, w->format == MOEA2A_WIRE_AS_IS && w->scale_layout == 0 && w->flags == 0,
                      "%s: wire[%d] is set but %s", fn, i,
                      i >= c->num_payloads ? "there is no such payload" : "its format is MOEA2A_WIRE_AS_IS");
        return MOEA2A_SUCCESS;
    }
    M2A_CHECK_ARG(comm, w->format == MOEA2A_WIRE_FP8 || w->format == MOEA2A_WIRE_NVFP4, "%s: wire[%d].format=%d is unknown",
                  fn, i, (int)w->format);
    M2A_CHECK_ARG(comm, p->dtype == MOEA2A_BFLOAT16 || p->dtype == MOEA2A_FLOAT16 || p->dtype == MOEA2A_FLOAT32,
                  "%s: payload %d is quantized on dispatch, so its dtype must be bf16, fp16 or fp32", fn, i);
    if (w->format == MOEA2A_WIRE_FP8) {
        M2A_CHECK_ARG(comm, p->elems_per_token % 128 == 0,
                      "%s: payload %d sent as FP8 needs elems_per_token (%zu) a multiple of 128", fn, i,
                      p->elems_per_token);
        M2A_CHECK_ARG(comm, w->scale_layout == MOEA2A_FP8_SCALES_ROW_MAJOR || w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR,
                      "%s: wire[%d].scale_layout=%d is not an FP8 scale layout", fn, i, w->scale_layout);
        M2A_CHECK_ARG(comm, !(w->flags & ~MOEA2A_FP8_UE8M0), "%s: wire[%d].flags=0x%x: unknown flags", fn, i, w->flags);
    } else {
        M2A_CHECK_ARG(comm, p->elems_per_token % 16 == 0,
                      "%s: payload %d sent as NVFP4 needs elems_per_token (%zu) a multiple of 16", fn, i,
                      p->elems_per_token);
        M2A_CHECK_ARG(comm, w->scale_layout == MOEA2A_SF_LINEAR || w->scale_layout == MOEA2A_SF_128X4 ||
                                w->scale_layout == MOEA2A_SF_8X4,
                      "%s: wire[%d].scale_layout=%d is not an NVFP4 scale layout", fn, i, w->scale_layout);
        M2A_CHECK_ARG(comm, w->flags == 0, "%s: wire[%d].flags=0x%x: NVFP4 takes none", fn, i, w->flags);
    }
    return MOEA2A_SUCCESS;
}

/* Whether every term of the workspace formula, staging for every peer included, and
 * their sum stay below 2^63 bytes, so the layout below computes exact sizes. A
 * quantized payload's arrays (codes, scales twice, global scales) are bounded by
 * three times its row as given. */
static int workspace_fits(const moea2a_moe_config_t *c, int ep)
{
    size_t slots = (size_t)ep * (size_t)c->max_tokens_per_rank, es, row, term, total = (size_t)1 << 20; /* aux */
    size_t record = (size_t)c->top_k * 8 + 4;
    for (int i = 0; i < c->num_payloads; i++) {
        moea2a_datatype_size(c->payloads[i].dtype, &es);
        if (!m2a_mul_ok(es, c->payloads[i].elems_per_token, &row) || !m2a_add_ok(record, row, &record) ||
            !m2a_mul_ok(slots, row, &term) || !m2a_add_ok(total, term, &total))
            return 0;
        if (c->wire[i].format != MOEA2A_WIRE_AS_IS &&
            (!m2a_add_ok(record, 4, &record) || !m2a_add_ok(total, term, &total) || !m2a_add_ok(total, term, &total)))
            return 0;
    }
    es = 4;
    if (c->hidden) moea2a_datatype_size(c->combine_dtype, &es);
    if (c->layout == MOEA2A_LAYOUT_EXPERT_MAJOR) { /* rows bounded by 2^31 (checked first), each below the record */
        size_t per = record + c->hidden * es + 16;
        if (!m2a_mul_ok((size_t)c->max_expert_rows, per, &term) || !m2a_add_ok(total, term, &total) ||
            !m2a_mul3_ok(slots, (size_t)c->top_k, 4, &term) || !m2a_add_ok(total, term, &total))
            return 0;
    }
    /* combine rows and their staging; then ids, weights and the staged records */
    if (!m2a_mul3_ok(slots, c->hidden, es, &term) || !m2a_add_ok(total, term, &total) || !m2a_add_ok(total, term, &total))
        return 0;
    if (!m2a_mul_ok(slots, record, &term) || !m2a_add_ok(total, term, &total) || !m2a_add_ok(total, term, &total))
        return 0;
    return total < ((size_t)1 << 63);
}

int m2a_moe_max_local_experts(const moea2a_moe_config_t *c, int ep)
{
    int most = c->max_local_experts; /* a later placement's bound */
    if (c->placement != MOEA2A_PLACEMENT_MAP) {
        const int even = (c->num_experts + ep - 1) / ep;
        return even > most ? even : most;
    }
    int *n = calloc((size_t)ep, sizeof(int));
    if (!n) return c->num_experts; /* a bound all the same */
    for (int e = 0; e < c->num_experts; e++)
        if (c->expert_to_rank[e] >= 0) n[c->expert_to_rank[e]]++; /* -1: held by no rank (set_placement) */
    for (int r = 0; r < ep; r++) most = n[r] > most ? n[r] : most;
    free(n);
    return most;
}

long long m2a_moe_expert_worst_rows(const moea2a_moe_config_t *c, int ep)
{
    int el = m2a_moe_max_local_experts(c, ep), per = c->top_k < el ? c->top_k : el;
    return (long long)ep * c->max_tokens_per_rank * per + (long long)el * (c->expert_alignment - 1);
}

/* The expert-major layout's settings, after placement and flags are checked: its bound
 * on rows (0: the worst case, ep x cap x min(k, local experts) pairs plus each
 * expert's alignment gap) resolved into out. */
static moea2a_result_t check_expert_layout(moea2a_comm_t comm, moea2a_moe_config_t *c, int ep)
{
    static const char fn[] = "moea2a_moe config";
    const unsigned only = MOEA2A_MOE_WEIGHTED_COMBINE | MOEA2A_MOE_ZERO_PADDING | MOEA2A_MOE_HOST_EXPERT_COUNTS |
                          MOEA2A_MOE_EXPERT_WIRE_SCALES;
    M2A_CHECK_ARG(comm, c->layout == MOEA2A_LAYOUT_RANK_MAJOR || c->layout == MOEA2A_LAYOUT_EXPERT_MAJOR,
                  "%s: layout=%d is unknown", fn, (int)c->layout);
    if (c->layout == MOEA2A_LAYOUT_RANK_MAJOR) {
        M2A_CHECK_ARG(comm, !(c->flags & only) && c->expert_alignment == 0 && c->max_expert_rows == 0,
                      "%s: expert_alignment, max_expert_rows, MOEA2A_MOE_WEIGHTED_COMBINE, MOEA2A_MOE_ZERO_PADDING, "
                      "MOEA2A_MOE_HOST_EXPERT_COUNTS and MOEA2A_MOE_EXPERT_WIRE_SCALES "
                      "belong to layout=MOEA2A_LAYOUT_EXPERT_MAJOR", fn);
        return MOEA2A_SUCCESS;
    }
    if (c->expert_alignment == 0) c->expert_alignment = 1;
    M2A_CHECK_ARG(comm, c->expert_alignment >= 1 && c->expert_alignment <= 1024,
                  "%s: expert_alignment=%d must be in 1..1024", fn, c->expert_alignment);
    M2A_CHECK_ARG(comm, !(c->flags & MOEA2A_MOE_WEIGHTED_COMBINE) || (c->flags & MOEA2A_MOE_CARRY_WEIGHTS),
                  "%s: MOEA2A_MOE_WEIGHTED_COMBINE needs the router weights: set MOEA2A_MOE_CARRY_WEIGHTS", fn);
    for (int i = 0; i < c->num_payloads && (c->flags & MOEA2A_MOE_EXPERT_WIRE_SCALES); i++) {
        const int tile = m2a_expert_scale_tile(c, i); /* NVFP4 tiles: every expert starts one */
        M2A_CHECK_ARG(comm, tile <= 1 || c->expert_alignment % tile == 0,
                      "%s: MOEA2A_MOE_EXPERT_WIRE_SCALES puts wire[%d]'s scales in tiles of %d rows, so each expert "
                      "must start one: expert_alignment=%d is not a multiple of %d",
                      fn, i, tile, c->expert_alignment, tile);
    }
    long long worst = m2a_moe_expert_worst_rows(c, ep);
    M2A_CHECK_ARG(comm, c->max_expert_rows >= 0, "%s: max_expert_rows=%lld is negative", fn,
                  (long long)c->max_expert_rows);
    if (c->max_expert_rows == 0 || c->max_expert_rows > worst) c->max_expert_rows = worst;
    M2A_CHECK_ARG(comm, c->max_expert_rows < (1LL << 31),
                  "%s: %lld expert-major rows (ep x cap x min(k, local experts) + alignment gaps) must stay below 2^31: "
                  "set max_expert_rows", fn, (long long)c->max_expert_rows);
    return MOEA2A_SUCCESS;
}

/* The combine's wire: as is, or FP8 blocks of 128 along hidden (scale_layout unused: a
 * row's scales travel with it, row-major). */
static moea2a_result_t check_combine_wire(moea2a_comm_t comm, const moea2a_moe_config_t *c)
{
    static const char fn[] = "moea2a_moe config";
    const moea2a_wire_t *w = &c->combine_wire;
    M2A_CHECK_ARG(comm, w->format == MOEA2A_WIRE_AS_IS || w->format == MOEA2A_WIRE_FP8,
                  "%s: combine_wire.format=%d: the combine's rows travel as is (MOEA2A_WIRE_AS_IS) or as FP8 "
                  "(MOEA2A_WIRE_FP8)", fn, (int)w->format);
    M2A_CHECK_ARG(comm, w->scale_layout == 0 && (w->format == MOEA2A_WIRE_FP8 ? !(w->flags & ~MOEA2A_FP8_UE8M0) : !w->flags),
                  "%s: combine_wire: scale_layout=%d flags=0x%x (scale_layout 0; flags MOEA2A_FP8_UE8M0 or 0 with FP8, "
                  "0 as is)", fn, w->scale_layout, w->flags);
    if (w->format == MOEA2A_WIRE_FP8)
        M2A_CHECK_ARG(comm, c->hidden > 0 && c->hidden % M2A_FP8_BLOCK == 0,
                      "%s: combine_wire FP8 quantizes blocks of %d values: hidden=%zu must be a positive multiple",
                      fn, M2A_FP8_BLOCK, c->hidden);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_moe_read_config(moea2a_comm_t comm, const moea2a_moe_config_t *in, int ep,
                                    moea2a_moe_config_t *out)
{
    static const char fn[] = "moea2a_moe config";
    M2A_CHECK_ARG(comm, in, "%s: config is NULL", fn);
    M2A_CHECK_ARG(comm, in->size >= CONFIG_MIN_SIZE && in->size <= 65536,
                  "%s: size=%zu: start from MOEA2A_MOE_CONFIG_INITIALIZER", fn, in->size);
    *out = (moea2a_moe_config_t)MOEA2A_MOE_CONFIG_INITIALIZER;
    memcpy(out, in, in->size < sizeof(*out) ? in->size : sizeof(*out));
    out->size = sizeof(*out);
    const moea2a_moe_config_t *c = out;
    M2A_CHECK_ARG(comm, c->num_experts >= 1, "%s: num_experts=%d must be >= 1", fn, c->num_experts);
    M2A_CHECK_ARG(comm, c->top_k >= 1 && c->top_k <= 1024, "%s: top_k=%d must be in 1..1024", fn, c->top_k);
    /* padding slots carry it: an expert's own id there would read as that expert's rows */
    M2A_CHECK_ARG(comm, c->invalid_expert_id < 0 || c->invalid_expert_id >= c->num_experts,
                  "%s: invalid_expert_id=%d is a valid expert id (0..%d): padding slots would read as that "
                  "expert's rows; use -1 or num_experts",
                  fn, c->invalid_expert_id, c->num_experts - 1);
    M2A_CHECK_ARG(comm, c->max_tokens_per_rank >= 1, "%s: max_tokens_per_rank=%d must be >= 1", fn,
                  c->max_tokens_per_rank);
    M2A_CHECK_ARG(comm, (long long)ep * c->max_tokens_per_rank < (1LL << 31),
                  "%s: ep %d x max_tokens_per_rank %d must stay below 2^31 receive slots", fn, ep,
                  c->max_tokens_per_rank);
    M2A_CHECK_ARG(comm, c->num_payloads >= 0 && c->num_payloads <= MOEA2A_MOE_MAX_PAYLOADS,
                  "%s: num_payloads=%d must be in 0..%d", fn, c->num_payloads, MOEA2A_MOE_MAX_PAYLOADS);
    for (int i = 0; i < c->num_payloads; i++) {
        size_t es;
        M2A_CHECK_ARG(comm, moea2a_datatype_size(c->payloads[i].dtype, &es) == MOEA2A_SUCCESS,
                      "%s: payloads[%d].dtype=%d is not a datatype", fn, i, (int)c->payloads[i].dtype);
        M2A_CHECK_ARG(comm, c->payloads[i].elems_per_token >= 1 && c->payloads[i].elems_per_token <= (1u << 30),
                      "%s: payloads[%d].elems_per_token=%zu must be in 1..2^30", fn, i, c->payloads[i].elems_per_token);
    }
    for (int i = 0; i < MOEA2A_MOE_MAX_PAYLOADS; i++) M2A_TRY(check_wire(comm, c, i));
    if (c->hidden) {
        M2A_CHECK_ARG(comm, c->combine_dtype == MOEA2A_BFLOAT16 || c->combine_dtype == MOEA2A_FLOAT16 ||
                                c->combine_dtype == MOEA2A_FLOAT32,
                      "%s: combine_dtype must be bf16, fp16 or fp32", fn);
        M2A_CHECK_ARG(comm, c->hidden <= (1u << 30), "%s: hidden=%zu is too large", fn, c->hidden);
    }
    M2A_TRY(check_combine_wire(comm, c));
    M2A_CHECK_ARG(comm, c->max_local_experts >= 0 && c->max_local_experts <= c->num_experts,
                  "%s: max_local_experts=%d must be in 0..num_experts (%d)", fn, c->max_local_experts, c->num_experts);
    M2A_CHECK_ARG(comm, c->placement == MOEA2A_PLACEMENT_CONTIGUOUS || c->placement == MOEA2A_PLACEMENT_MAP,
                  "%s: placement=%d is unknown", fn, (int)c->placement);
    if (c->placement == MOEA2A_PLACEMENT_MAP) {
        M2A_CHECK_ARG(comm, c->expert_to_rank, "%s: MOEA2A_PLACEMENT_MAP needs expert_to_rank", fn);
        for (int e = 0; e < c->num_experts; e++)
            M2A_CHECK_ARG(comm, c->expert_to_rank[e] >= 0 && c->expert_to_rank[e] < ep,
                          "%s: expert_to_rank[%d]=%d is not a rank (0..%d)", fn, e, c->expert_to_rank[e], ep - 1);
    }
    M2A_CHECK_ARG(comm, !(c->flags & ~(MOEA2A_MOE_NO_SANITIZE | MOEA2A_MOE_REWRITE_NONLOCAL | MOEA2A_MOE_CARRY_WEIGHTS |
                                       MOEA2A_MOE_NO_NVLINK | MOEA2A_MOE_WEIGHTED_COMBINE | MOEA2A_MOE_ZERO_PADDING |
                                       MOEA2A_MOE_HOST_EXPERT_COUNTS | MOEA2A_MOE_COPY_ENGINE |
                                       MOEA2A_MOE_EXPERT_WIRE_SCALES | MOEA2A_MOE_EXPERT_LOAD |
                                       MOEA2A_MOE_GENERAL_PLACEMENT)),
                  "%s: unknown flags 0x%x", fn, c->flags);
    for (int i = 0; i < c->num_payloads && (c->flags & MOEA2A_MOE_COPY_ENGINE); i++)
        M2A_CHECK_ARG(comm, c->wire[i].format == MOEA2A_WIRE_AS_IS,
                      "%s: MOEA2A_MOE_COPY_ENGINE moves payloads as given, but wire[%d] quantizes on dispatch (the "
                      "load/store kernels do that: leave the flag off)", fn, i);
    M2A_CHECK_ARG(comm, !(c->flags & MOEA2A_MOE_COPY_ENGINE) || !(c->flags & MOEA2A_MOE_NO_NVLINK),
                  "%s: MOEA2A_MOE_COPY_ENGINE is a mode of the load/store path, which MOEA2A_MOE_NO_NVLINK turns off",
                  fn);
    M2A_TRY(check_expert_layout(comm, out, ep));
    /* the load/store path: MOEA2A_NVLINK=0 turns it off; its SM budget */
    long nvlink = 1, sms = out->num_sms;
    M2A_TRY(m2a_comm_record(comm, m2a_param_int("MOEA2A_NVLINK", &nvlink)));
    if (!nvlink) out->flags |= MOEA2A_MOE_NO_NVLINK;
    if (sms == 0) M2A_TRY(m2a_comm_record(comm, m2a_param_int("MOEA2A_NUM_SMS", &sms)));
    if (sms == 0) sms = MOEA2A_MOE_DEFAULT_SMS(ep); /* ep is agreed, so every rank takes the same */
    out->num_sms = sms > 0 && sms <= 256 ? (int)sms : -1;
    M2A_CHECK_ARG(comm, out->num_sms >= 1 && out->num_sms <= 256,
                  "%s: num_sms (or MOEA2A_NUM_SMS=%ld) must be in 1..256", fn, sms);
    M2A_CHECK_ARG(comm, c->memory == MOEA2A_MEMORY_AUTO || c->memory == MOEA2A_MEMORY_HOST || c->memory == MOEA2A_MEMORY_CUDA,
                  "%s: memory=%d is unknown", fn, (int)c->memory);
    M2A_CHECK_ARG(comm, workspace_fits(c, ep),
                  "%s: the workspace for ep %d x max_tokens_per_rank %d of these rows exceeds 2^63 bytes", fn, ep,
                  c->max_tokens_per_rank);
    return MOEA2A_SUCCESS;
}

/* Appends an aligned region of `bytes` at *at and returns its offset. */
static size_t take(size_t *at, size_t bytes)
{
    size_t off = *at;
    *at += m2a_align(bytes);
    return off;
}

void m2a_moe_layout(const moea2a_moe_config_t *c, int ep, int staged, const m2a_moe_backend_size_t *backend,
                    m2a_moe_layout_t *l)
{
    memset(l, 0, sizeof(*l));
    size_t n = (size_t)ep, cap = (size_t)c->max_tokens_per_rank, k = (size_t)c->top_k, at = 0;
    int weights = (c->flags & MOEA2A_MOE_CARRY_WEIGHTS) != 0;
    size_t combine_es = 0;
    if (c->hidden) moea2a_datatype_size(c->combine_dtype, &combine_es);
    l->combine_row = c->hidden * combine_es;
    l->combine_wire = m2a_combine_wire_bytes(c);
    l->record = k * 4 + (weights ? k * 4 : 0) + 4; /* ids, weights, source index */
    for (int i = 0; i < c->num_payloads; i++) {
        size_t es;
        moea2a_datatype_size(c->payloads[i].dtype, &es);
        l->row_bytes[i] = es * c->payloads[i].elems_per_token;
        if (c->wire[i].format != MOEA2A_WIRE_AS_IS) { /* codes, scales [, global scale] on the wire */
            l->row_bytes[i] = m2a_wire_code_bytes(c, i);
            l->wire_scale_row[i] = m2a_wire_scale_row_bytes(c, i);
            l->record += l->wire_scale_row[i] + (c->wire[i].format == MOEA2A_WIRE_NVFP4 ? 4 : 0);
        }
        l->record += l->row_bytes[i];
    }

    l->recv_counts = take(&at, 4 * n);
    l->send_counts = take(&at, 4 * n);
    l->hdr_send = take(&at, sizeof(m2a_moe_header_t) * n);
    l->hdr_recv = take(&at, sizeof(m2a_moe_header_t) * n);
    l->send_map = take(&at, 4 * cap * k);
    l->src_index = take(&at, 4 * n * cap);
    l->owner = take(&at, 4 * (size_t)c->num_experts); /* expert -> rank */
    l->stage_index = take(&at, 4 * n);                 /* rank -> staging slot, -1 direct */
    l->node = take(&at, 4 * n);                        /* rank -> node: the combine order across nodes */
    l->stats = take(&at, 24);                          /* invalid, merged and dropped entries */
    /* the experts' load, counted on the device (a host context counts on the host) */
    l->load = take(&at, (c->flags & MOEA2A_MOE_EXPERT_LOAD) && backend->device_load ? 8 * (size_t)c->num_experts : 0);
    l->backend_ctl = take(&at, backend->ctl_bytes); /* e.g. the load/store path's signals and counters */
    l->aux_end = at;
    for (int i = 0; i < c->num_payloads; i++) {
        size_t start = at;
        l->payload[i] = take(&at, n * cap * l->row_bytes[i]);
        const moea2a_wire_t *w = &c->wire[i];
        if (w->format != MOEA2A_WIRE_AS_IS) {
            l->wire_scales[i] = l->wire_final[i] = take(&at, n * cap * l->wire_scale_row[i]);
            if (w->format == MOEA2A_WIRE_NVFP4) {
                l->wire_global_rows[i] = take(&at, n * cap * 4);
                l->wire_global[i] = take(&at, 4 * n);
                if (w->scale_layout != MOEA2A_SF_LINEAR) /* tiles over the ep x cap rows bound any stride's */
                    l->wire_final[i] = take(&at, m2a_sf_bytes(w->scale_layout, n * cap, c->payloads[i].elems_per_token / 16));
            } else if (w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR) { /* [ep][scale words][cap rounded up to 4] */
                l->wire_final[i] = take(&at, n * l->wire_scale_row[i] * ((cap + 3) / 4 * 4));
            }
            if (backend->quantized_rows) { /* this rank's tokens quantized, then sent as bytes */
                l->send_codes[i] = take(&at, cap * l->row_bytes[i]);
                l->send_scales[i] = take(&at, cap * l->wire_scale_row[i]);
                if (w->format == MOEA2A_WIRE_NVFP4) l->send_global[i] = take(&at, cap * 4);
            }
        }
        l->bytes_payload[i] = at - start;
    }
    l->bytes_ids = m2a_align(n * cap * k * 4);
    l->ids = take(&at, n * cap * k * 4);
    l->bytes_weights = weights ? m2a_align(n * cap * k * 4) : 0;
    l->weights = take(&at, weights ? n * cap * k * 4 : 0);
    l->bytes_combine = m2a_align(n * cap * l->combine_row);
    l->combine = take(&at, n * cap * l->combine_row);
    if (c->layout == MOEA2A_LAYOUT_EXPERT_MAJOR) { /* R rows: payloads, per-row arrays, combine rows */
        size_t start = at, R = (size_t)c->max_expert_rows, el = (size_t)m2a_moe_max_local_experts(c, ep);
        l->ex_rows = R, l->ex_experts = el;
        l->ex_map = take(&at, 4 * n * cap * k); /* (slot, top-k slot) -> row, -1 */
        l->ex_counts = take(&at, 4 * el);
        l->ex_offsets = take(&at, 4 * (el + 1));
        /* rows used, expert -> local index, the host's cursors, the device's part counts */
        l->ex_used = at, l->ex_local_of = at + 8, l->ex_cursors = l->ex_local_of + 4 * (size_t)c->num_experts;
        l->ex_parts = l->ex_cursors + 4 * (el + 1);
        take(&at, 8 + 4 * (size_t)c->num_experts + 4 * (el + 1) + 4 * M2A_EXPERT_PARTS * el);
#define EX_ARRAY(from, to, w, zero) (l->ex_array[l->ex_narrays++] = (m2a_moe_ex_array_t){(from), (to), (w), (zero)})
        for (int i = 0; i < c->num_payloads; i++) {
            l->ex_payload[i] = take(&at, R * l->row_bytes[i]); /* quantized: the codes */
            EX_ARRAY(l->payload[i], l->ex_payload[i], l->row_bytes[i], 0);
            if (c->wire[i].format == MOEA2A_WIRE_AS_IS) continue;
            l->ex_scales[i] = take(&at, R * l->wire_scale_row[i]); /* the row scales as they landed */
            EX_ARRAY(l->wire_scales[i], l->ex_scales[i], l->wire_scale_row[i], 1);
            l->ex_scales_wire[i] = m2a_expert_scale_tile(c, i) ? take(&at, m2a_expert_wire_scale_bytes(c, i, R)) : 0;
            if (c->wire[i].format != MOEA2A_WIRE_NVFP4) continue;
            l->ex_global[i] = take(&at, 4 * R);
            EX_ARRAY(l->wire_global_rows[i], l->ex_global[i], 4, 1);
        }
#undef EX_ARRAY
        l->ex_ids = take(&at, 4 * R);
        l->ex_src_rank = take(&at, 4 * R);
        l->ex_src_token = take(&at, 4 * R);
        l->ex_slot = take(&at, 4 * R);
        l->ex_weights = weights ? take(&at, 4 * R) : 0;
        l->ex_combine = take(&at, R * l->combine_row);
        l->bytes_expert = at - start;
    }
    /* Where kernels route: the general placement's holders [E][ep], their counts
     * [E + 1] and the load/store path's dropped entries [3] (placement.cuh). Last, so
     * that the regions the one-holder kernels use sit where they would without them. */
    l->holders = take(&at, backend->device_tables ? 4 * (size_t)c->num_experts * n : 0);
    l->nrep = take(&at, backend->device_tables ? 4 * ((size_t)c->num_experts + 1) : 0);
    l->dropped_sums = take(&at, backend->device_tables ? 24 : 0);
    l->workspace = at;

    size_t rec = 0;
#define ARRAY(w, off, kind, i) (l->array[l->narrays++] = (m2a_moe_array_t){(w), (off), rec, (kind), (i)}, rec += (w))
    for (int i = 0; i < c->num_payloads; i++) {
        ARRAY(l->row_bytes[i], l->payload[i], M2A_ARR_PAYLOAD, i);
        if (c->wire[i].format != MOEA2A_WIRE_AS_IS) ARRAY(l->wire_scale_row[i], l->wire_scales[i], M2A_ARR_SCALES, i);
        if (c->wire[i].format == MOEA2A_WIRE_NVFP4) ARRAY(4, l->wire_global_rows[i], M2A_ARR_GLOBAL, i);
    }
    ARRAY(4 * k, l->ids, M2A_ARR_IDS, -1);
    if (weights) ARRAY(4 * k, l->weights, M2A_ARR_WEIGHTS, -1);
    ARRAY(4, l->src_index, M2A_ARR_INDEX, -1);
#undef ARRAY

    /* Staging: what this rank sends to staged peers (per peer, each array packed in
     * slot order), and the combine rows that come back from them. Dispatched arrays
     * land straight in the workspace. */
    size_t s = 0, peers = (size_t)staged;
    l->stage_send = take(&s, peers * cap * l->record);
    l->stage_recv = take(&s, peers * cap * l->combine_wire);
    l->stage_backend = take(&s, backend->staging_bytes); /* e.g. the copy engines' combine landing */
    /* the combine's rows quantized for the wire, every source's block ([ep][cap]) */
    if (c->combine_wire.format != MOEA2A_WIRE_AS_IS && !backend->combine_wire_in_place)
        l->stage_cwire = take(&s, n * cap * l->combine_wire);
    l->staging = s;
    /* CUDA contexts mirror the counts, the headers and the stats in pinned host memory. */
    l->pinned_stats = m2a_align(4 * n) * 2 + m2a_align(sizeof(m2a_moe_header_t) * n) * 2;
    l->pinned = l->pinned_stats + m2a_align(24);
    l->pinned_backend = l->pinned, l->pinned += m2a_align(backend->pinned_bytes); /* e.g. a device error record's copy */
    if (l->ex_rows) /* the expert-major counts as the host reads them */
        l->pinned_expert = l->pinned, l->pinned += m2a_align(8 + 4 * l->ex_experts + 4 * (l->ex_experts + 1));
}

size_t m2a_wire_scale_bytes(const moea2a_moe_config_t *c, const m2a_moe_layout_t *l, int i, int ep, int stride)
{
    const moea2a_wire_t *w = &c->wire[i];
    size_t rows = (size_t)ep * (size_t)stride, srow = l->wire_scale_row[i];
    if (w->format == MOEA2A_WIRE_FP8 && w->scale_layout == MOEA2A_FP8_SCALES_MN_MAJOR)
        return (size_t)ep * srow * (((size_t)stride + 3) / 4 * 4);
    if (w->format == MOEA2A_WIRE_NVFP4 && w->scale_layout != MOEA2A_SF_LINEAR)
        return m2a_sf_bytes(w->scale_layout, rows, c->payloads[i].elems_per_token / 16);
    return rows * srow;
}

int m2a_moe_staged_peers(int ep, int rank, const int *node, const int *gpu, const m2a_topo_t *topo, int cuda,
                         int allow_lsa, int *nvlink_peers, int *lsa)
{
    int direct = 0, shared = 0, same_node = 1;
    for (int p = 0; p < ep; p++) {
        if (p == rank) continue;
        same_node &= node[p] == node[rank] && gpu[p] >= 0 && gpu[rank] >= 0;
        int local = cuda && node[p] == node[rank] && gpu[p] >= 0 && gpu[rank] >= 0;
        shared += local && gpu[p] == gpu[rank]; /* ranks sharing a GPU reach each other */
        direct += local && gpu[p] != gpu[rank] && topo->has_nvlink_info && topo->nvlink[gpu[rank]][gpu[p]];
    }
    *nvlink_peers = direct;
    /* The load/store path serves every peer directly, so it needs them all on this
     * node, on this GPU or joined to it by NVLink (assumed when hwloc does not report
     * NVLink at all: moea2a_moe_create confirms when it maps their memory). Otherwise
     * the host transport or NCCL send/receive move packed rows: every peer is staged. */
    *lsa = cuda && allow_lsa && ep <= M2A_LSA_MAX_RANKS && same_node && (!topo->has_nvlink_info || direct + shared == ep - 1);
    return *lsa ? 0 : ep - 1;
}

moea2a_result_t m2a_moe_fill_sizes(const moea2a_moe_config_t *cfg, const m2a_moe_layout_t *l, int cuda,
                                   int staged, int nvlink, const m2a_topo_t *topo, m2a_topo_place_t place,
                                   moea2a_moe_workspace_sizes_t *s)
{
    M2A_CHECK_ARG(NULL, s, "moea2a_moe_workspace_size: sizes is NULL");
    M2A_CHECK_ARG(NULL, s->size >= sizeof(*s),
                  "moea2a_moe_workspace_size: sizes->size=%zu: start from MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER", s->size);
    size_t caller_size = s->size;
    memset(s, 0, sizeof(*s));
    s->size = caller_size;
    s->version = MOEA2A_VERSION_CODE;
    s->workspace_bytes = l->workspace;
    s->staging_bytes = l->staging;
    s->total_bytes = l->workspace + l->staging + (cuda ? l->pinned : 0);
    if (cuda) { /* NCCL moves device memory: workspace and staging on the GPU */
        s->device_bytes = l->workspace + l->staging;
        s->pinned_host_bytes = l->pinned;
    } else {
        s->host_bytes = l->workspace + l->staging;
    }
    s->aux_bytes = l->aux_end;
    for (int i = 0; i < cfg->num_payloads; i++) s->payload_bytes[i] = l->bytes_payload[i];
    s->ids_bytes = l->bytes_ids;
    s->weights_bytes = l->bytes_weights;
    s->combine_bytes = l->bytes_combine;
    s->expert_bytes = l->bytes_expert;
    s->record_bytes = l->record;
    s->staged_peers = staged;
    s->nvlink_peers = nvlink;
    s->numa_node = place.numa;
    s->gpu = place.gpu;
    if (place.nic >= 0) snprintf(s->nic, sizeof(s->nic), "%s", topo->nic_name[place.nic]);
    return MOEA2A_SUCCESS;
}

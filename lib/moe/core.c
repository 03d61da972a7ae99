/* The shared core of the MoE layer (lib/moe/core.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "comm/agree.h"
#include "moe/core.h"

/* What every rank must agree on, compared field by field at create. */
typedef struct {
    int32_t status, num_experts, top_k, cap, num_payloads, combine_dtype, invalid_id, placement, flags, memory, num_sms;
    int32_t layout, expert_alignment;
    int64_t max_expert_rows;
    int32_t dtypes[MOEA2A_MOE_MAX_PAYLOADS];
    int32_t wire[MOEA2A_MOE_MAX_PAYLOADS]; /* format | scale layout << 8 | flags << 16 */
    int32_t combine_wire, max_local;       /* the same for the combine's rows; max_local_experts */
    uint64_t elems[MOEA2A_MOE_MAX_PAYLOADS], hidden, map_hash;
} digest_t;

static digest_t digest_of(const moea2a_moe_config_t *c, moea2a_result_t status)
{
    digest_t d;
    memset(&d, 0, sizeof(d));
    d.status = status;
    if (status != MOEA2A_SUCCESS) return d;
    d.num_experts = c->num_experts, d.top_k = c->top_k, d.cap = c->max_tokens_per_rank;
    d.num_payloads = c->num_payloads, d.combine_dtype = c->combine_dtype, d.invalid_id = c->invalid_expert_id;
    d.placement = c->placement, d.flags = (int32_t)c->flags, d.memory = c->memory, d.hidden = c->hidden;
    d.num_sms = c->num_sms;
    d.layout = c->layout, d.expert_alignment = c->expert_alignment, d.max_expert_rows = c->max_expert_rows;
    for (int i = 0; i < c->num_payloads; i++) {
        d.dtypes[i] = c->payloads[i].dtype, d.elems[i] = c->payloads[i].elems_per_token;
        d.wire[i] = (int32_t)c->wire[i].format | c->wire[i].scale_layout << 8 | (int32_t)(c->wire[i].flags << 16);
    }
    d.combine_wire = (int32_t)c->combine_wire.format | c->combine_wire.scale_layout << 8 |
                     (int32_t)(c->combine_wire.flags << 16);
    d.max_local = c->max_local_experts;
    d.map_hash = 1469598103934665603ULL;
    for (int e = 0; c->placement == MOEA2A_PLACEMENT_MAP && e < c->num_experts; e++)
        d.map_hash = (d.map_hash ^ (uint64_t)c->expert_to_rank[e]) * 1099511628211ULL;
    return d;
}

moea2a_result_t m2a_moe_agree_config(moea2a_comm_t comm, moea2a_result_t mine, const moea2a_moe_config_t *cfg)
{
    int n = comm->nranks;
    digest_t *all = calloc((size_t)n, sizeof(*all));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    all[comm->rank] = digest_of(cfg, mine);
    moea2a_result_t r = m2a_comm_allgather(comm, all, sizeof(*all));
    int failed = 0;
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) failed |= all[q].status != MOEA2A_SUCCESS;
    if (r == MOEA2A_SUCCESS && failed) {
        r = m2a_comm_tell_failures(comm, "moea2a_moe_create", mine, &all[0].status, sizeof(*all) / sizeof(int32_t));
        free(all);
        return r;
    }
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (mine == MOEA2A_SUCCESS && memcmp(all[q].wire, all[comm->rank].wire, sizeof(all[q].wire))) {
            int i = 0;
            while (all[q].wire[i] == all[comm->rank].wire[i]) i++;
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "moea2a_moe_create: rank %d sends payload %d in another wire format (format | scale layout "
                          "<< 8 | flags << 16: 0x%x here, 0x%x there)", q, i, all[comm->rank].wire[i], all[q].wire[i]);
        } else if (mine == MOEA2A_SUCCESS && all[q].combine_wire != all[comm->rank].combine_wire) {
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "moea2a_moe_create: rank %d combines in another wire format (combine_wire: format | scale "
                          "layout << 8 | flags << 16: 0x%x here, 0x%x there)", q, all[comm->rank].combine_wire,
                          all[q].combine_wire);
        } else if (mine == MOEA2A_SUCCESS && memcmp(&all[q], &all[comm->rank], sizeof(digest_t))) {
            const digest_t *a = &all[comm->rank], *b = &all[q];
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "moea2a_moe_create: rank %d passed a different config (experts %d/%d, top_k %d/%d, "
                          "max_tokens_per_rank %d/%d, payloads %d/%d, hidden %llu/%llu, flags 0x%x/0x%x, num_sms %d/%d, "
                          "layout %d/%d, expert_alignment %d/%d, max_expert_rows %lld/%lld, max_local_experts %d/%d: "
                          "this rank/rank %d; MOEA2A_NVLINK and MOEA2A_NUM_SMS count too)",
                          q, a->num_experts, b->num_experts, a->top_k, b->top_k, a->cap, b->cap, a->num_payloads,
                          b->num_payloads, (unsigned long long)a->hidden, (unsigned long long)b->hidden, a->flags,
                          b->flags, a->num_sms, b->num_sms, a->layout, b->layout, a->expert_alignment,
                          b->expert_alignment, (long long)a->max_expert_rows, (long long)b->max_expert_rows,
                          a->max_local, b->max_local, q);
        }
    }
    free(all);
    return r != MOEA2A_SUCCESS ? r : mine;
}

moea2a_result_t m2a_moe_agree(moea2a_comm_t comm, moea2a_result_t mine, int *value_min)
{
    int n = comm->nranks;
    int32_t *all = calloc((size_t)n * 2, sizeof(int32_t));
    if (!all) return mine != MOEA2A_SUCCESS ? mine : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    all[2 * comm->rank] = mine, all[2 * comm->rank + 1] = value_min ? *value_min : 0;
    moea2a_result_t g = m2a_comm_allgather(comm, all, 2 * sizeof(int32_t)), r = mine;
    if (g != MOEA2A_SUCCESS && r == MOEA2A_SUCCESS) r = g;
    int failed = 0;
    for (int q = 0; g == MOEA2A_SUCCESS && q < n; q++) {
        failed |= all[2 * q] != MOEA2A_SUCCESS;
        if (value_min && all[2 * q + 1] < *value_min) *value_min = all[2 * q + 1];
    }
    if (g == MOEA2A_SUCCESS && failed) r = m2a_comm_tell_failures(comm, "moea2a_moe_create", mine, all, 2);
    free(all);
    return r;
}

void m2a_moe_owner_table(const moea2a_moe_config_t *c, int ep, int32_t *owner)
{
    if (c->placement == MOEA2A_PLACEMENT_MAP) {
        memcpy(owner, c->expert_to_rank, sizeof(int32_t) * (size_t)c->num_experts);
        return;
    }
    /* contiguous: ranks 0..E%ep-1 own E/ep+1 experts, the others E/ep */
    int q = c->num_experts / ep, rem = c->num_experts % ep, e = 0;
    for (int r = 0; r < ep; r++)
        for (int j = 0; j < q + (r < rem); j++) owner[e++] = r;
}

void m2a_moe_set_route(moea2a_moe_t moe)
{
    const moea2a_moe_config_t *c = &moe->cfg;
    moe->route = (m2a_route_t){moe->comm->nranks, moe->comm->rank, c->top_k, c->num_experts, c->max_tokens_per_rank,
                               c->num_payloads, (c->flags & MOEA2A_MOE_CARRY_WEIGHTS) != 0, c->invalid_expert_id,
                               moe->h_owner, moe->h_holders, moe->h_nrep, moe->max_rep};
}

void m2a_moe_fill_result(moea2a_moe_t moe, const int64_t *device_stats, moea2a_dispatch_result_t *result)
{
    const m2a_moe_layout_t *l = &moe->l;
    unsigned char *ws = moe->ws;
    /* A caller built against an earlier header has a shorter struct: everything is
     * filled here, then only its part is copied back. */
    moea2a_dispatch_result_t full;
    memset(&full, 0, sizeof(full));
    const size_t caller_size = result->size < sizeof(full) ? result->size : sizeof(full);
    moea2a_dispatch_result_t *caller = result;
    result = &full;
    result->size = caller->size;
    result->version = MOEA2A_VERSION_CODE;
    result->ep = moe->comm->nranks, result->stride = moe->stride, result->top_k = moe->cfg.top_k;
    result->recv_counts = (const int32_t *)(ws + l->recv_counts);
    for (int i = 0; i < moe->cfg.num_payloads; i++) {
        result->payloads[i] = ws + l->payload[i];
        result->payload_row_bytes[i] = l->row_bytes[i];
        if (moe->cfg.wire[i].format == MOEA2A_WIRE_AS_IS) continue;
        result->payload_scales[i] = ws + l->wire_final[i];
        result->payload_scale_bytes[i] = m2a_wire_scale_bytes(&moe->cfg, l, i, moe->comm->nranks, moe->stride);
        if (moe->cfg.wire[i].format == MOEA2A_WIRE_NVFP4) result->payload_global_scales[i] = (const float *)(ws + l->wire_global[i]);
    }
    result->topk_ids = (int32_t *)(ws + l->ids);
    result->topk_weights = (moe->cfg.flags & MOEA2A_MOE_CARRY_WEIGHTS) ? (float *)(ws + l->weights) : NULL;
    result->src_token_index = (const int32_t *)(ws + l->src_index);
    if (device_stats) { /* nothing waited for on the host: the counts are on the device (one node) */
        result->total_recv = result->sent_rows = result->invalid_entries = result->deduplicated = -1;
        result->dropped_entries = -1;
        result->device_stats = device_stats;
        result->device_dropped = (const int64_t *)(ws + l->dropped_sums) + 2; /* placement.cuh's total */
        result->nvlink = 1;
        memcpy(caller, &full, caller_size);
        return;
    }
    const int *node = moe->comm->nodes.node, me = node[moe->comm->rank];
    for (int q = 0; q < moe->comm->nranks; q++) {
        result->total_recv += moe->h_recv_counts[q], result->sent_rows += moe->h_send_counts[q];
        if (node[q] != me) result->internode_rows += moe->h_send_counts[q];
    }
    result->internode_bytes = result->internode_rows * (int64_t)moe->l.record;
    result->network_rows = moe->network_own ? moe->network_rows : result->internode_rows;
    result->network_bytes = result->network_rows * (int64_t)moe->l.record;
    result->invalid_entries = moe->pending_invalid;
    result->deduplicated = moe->pending_dedup;
    result->dropped_entries = moe->pending_dropped;
    memcpy(caller, &full, caller_size);
}

void m2a_phase_start(m2a_phase_t *ph, void (*wait)(void *stream), void *stream)
{
    ph->on = m2a_log_enabled(M2A_LOG_TRACE, M2A_SUBSYS_MOE);
    ph->n = 0, ph->text[0] = 0, ph->wait = wait;
    if (!ph->on) return;
    if (ph->wait) ph->wait(stream);
    ph->t0 = ph->last = m2a_now();
}

void m2a_phase_mark(m2a_phase_t *ph, void *stream, const char *name)
{
    if (!ph->on) return;
    if (ph->wait) ph->wait(stream);
    double now = m2a_now();
    if (ph->n < 200)
        ph->n += snprintf(ph->text + ph->n, sizeof(ph->text) - (size_t)ph->n, " %s %.1f", name, (now - ph->last) * 1e6);
    ph->last = now;
}

void m2a_phase_report(const m2a_phase_t *ph, const char *what)
{
    if (ph->on) M2A_TRACE(M2A_SUBSYS_MOE, "%s phases (us):%s; total %.1f", what, ph->text, (m2a_now() - ph->t0) * 1e6);
}

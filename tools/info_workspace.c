/* moea2a_info --workspace KEY=VALUE,...: the per-rank workspace of an MoE context,
 * computed offline by moea2a_moe_workspace_size_layout (the numbers moea2a_moe_create
 * would allocate), with its breakdown and, given mem=SIZE, the largest
 * max_tokens_per_rank that fits; with ranks_per_node below ep, the rows and bytes a
 * token sends to other nodes, flat (one row per destination rank, today's generic
 * path) against node-aware (one row per destination node), modelled for uniform
 * routing, and the memory each scheme holds for the network. The last line is "total
 * <N> bytes". */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info_workspace.h"
#include "moea2a.h"

typedef struct {
    int ep, hidden, topk, experts, cap, weights, rpn, rank;
    int align, expert_rows; /* align=N (1..1024): the expert-major layout; expert_rows=N: its bound */
    moea2a_datatype_t dtype, combine;
    moea2a_memory_t memory;
    const char *topology;
    double mem_limit;
    moea2a_wire_t wire; /* wire=fp8|fp8-ue8m0|nvfp4: the payload quantized on dispatch */
    moea2a_wire_t cwire; /* combine_wire=fp8|fp8-ue8m0: the combine's rows as FP8 */
    int copy_engine;    /* engine=ce: MOEA2A_MOE_COPY_ENGINE */
} ws_args_t;

/* The wire settings of moea2a_perf --wire: MN-major FP8 scales (fp32 or UE8M0), 128x4
 * NVFP4 scales, the layouts grouped GEMMs read. */
static int parse_wire(const char *s, moea2a_wire_t *w)
{
    if (!strcmp(s, "fp8")) *w = (moea2a_wire_t){MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, 0};
    else if (!strcmp(s, "fp8-ue8m0")) *w = (moea2a_wire_t){MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_MN_MAJOR, MOEA2A_FP8_UE8M0};
    else if (!strcmp(s, "nvfp4")) *w = (moea2a_wire_t){MOEA2A_WIRE_NVFP4, MOEA2A_SF_128X4, 0};
    else return -1;
    return 0;
}

static int parse_dtype(const char *s, moea2a_datatype_t *d)
{
    for (int i = 0; i < MOEA2A_NUM_DATATYPES; i++)
        if (!strcmp(s, moea2a_datatype_name((moea2a_datatype_t)i))) return *d = (moea2a_datatype_t)i, 0;
    return -1;
}

static double parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': return v * 1024;
    case 'M': case 'm': return v * 1024 * 1024;
    case 'G': case 'g': return v * 1024 * 1024 * 1024;
    case 'T': case 't': return v * 1024.0 * 1024 * 1024 * 1024;
    case 0: return v;
    default: return -1;
    }
}

static int parse_args(char *spec, ws_args_t *a)
{
    for (char *save, *kv = strtok_r(spec, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *v = strchr(kv, '=');
        if (!v) return fprintf(stderr, "moea2a_info --workspace: '%s' is not KEY=VALUE\n", kv), -1;
        *v++ = 0;
        int *ip = !strcmp(kv, "ep") ? &a->ep : !strcmp(kv, "hidden") ? &a->hidden : !strcmp(kv, "topk") ? &a->topk
                : !strcmp(kv, "experts") ? &a->experts : !strcmp(kv, "cap") ? &a->cap : !strcmp(kv, "weights") ? &a->weights
                : !strcmp(kv, "ranks_per_node") ? &a->rpn : !strcmp(kv, "rank") ? &a->rank
                : !strcmp(kv, "align") ? &a->align : !strcmp(kv, "expert_rows") ? &a->expert_rows : NULL;
        if (ip) {
            /* whole numbers that fit the int the config holds; the call checks the rest */
            char *end;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (end == v || *end || errno || x < INT_MIN || x > INT_MAX)
                return fprintf(stderr, "moea2a_info --workspace: %s=%s is not a whole number in %d..%d\n", kv, v,
                               INT_MIN, INT_MAX), -1;
            *ip = (int)x;
        } else if (!strcmp(kv, "dtype") && !parse_dtype(v, &a->dtype)) continue;
        else if (!strcmp(kv, "combine") && !parse_dtype(v, &a->combine)) continue;
        else if (!strcmp(kv, "topology")) a->topology = v;
        else if (!strcmp(kv, "wire") && !parse_wire(v, &a->wire)) continue;
        else if (!strcmp(kv, "combine_wire") && (!strcmp(v, "fp8") || !strcmp(v, "fp8-ue8m0")))
            a->cwire = (moea2a_wire_t){MOEA2A_WIRE_FP8, 0, strcmp(v, "fp8") ? MOEA2A_FP8_UE8M0 : 0u};
        else if (!strcmp(kv, "engine") && (!strcmp(v, "sm") || !strcmp(v, "ce"))) a->copy_engine = !strcmp(v, "ce");
        else if (!strcmp(kv, "mem") && (a->mem_limit = parse_bytes(v)) > 0) continue;
        else if (!strcmp(kv, "memory") && (!strcmp(v, "cuda") || !strcmp(v, "host") || !strcmp(v, "auto")))
            a->memory = !strcmp(v, "cuda") ? MOEA2A_MEMORY_CUDA : !strcmp(v, "host") ? MOEA2A_MEMORY_HOST : MOEA2A_MEMORY_AUTO;
        else return fprintf(stderr, "moea2a_info --workspace: cannot use %s=%s\n", kv, v), -1;
    }
    return 0;
}

/* dtype=nvfp4 means packed values (hidden/2 bytes) plus their per-row linear E4M3
 * scales (hidden/16), the two payloads an NVFP4 dispatch carries. */
static moea2a_moe_config_t config_of(const ws_args_t *a)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = a->experts, c.top_k = a->topk, c.max_tokens_per_rank = a->cap, c.hidden = (size_t)a->hidden;
    c.combine_dtype = a->combine;
    c.num_payloads = 1;
    c.payloads[0] = (moea2a_payload_desc_t){a->dtype, (size_t)a->hidden};
    if (a->dtype == MOEA2A_NVFP4) {
        c.num_payloads = 2;
        c.payloads[0].elems_per_token = (size_t)a->hidden / 2;
        c.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT8_E4M3, (size_t)a->hidden / 16};
    }
    if (a->weights) c.flags |= MOEA2A_MOE_CARRY_WEIGHTS;
    if (a->copy_engine) c.flags |= MOEA2A_MOE_COPY_ENGINE;
    c.wire[0] = a->wire;
    c.combine_wire = a->cwire;
    if (a->align > 0 || a->expert_rows > 0) {
        c.layout = MOEA2A_LAYOUT_EXPERT_MAJOR, c.expert_alignment = a->align, c.max_expert_rows = a->expert_rows;
        if (a->weights) c.flags |= MOEA2A_MOE_WEIGHTED_COMBINE;
    }
    return c;
}

static moea2a_moe_layout_t layout_of(const ws_args_t *a)
{
    moea2a_moe_layout_t l = MOEA2A_MOE_LAYOUT_INITIALIZER;
    l.ep = a->ep, l.ranks_per_node = a->rpn, l.rank = a->rank, l.topology_xml = a->topology, l.memory = a->memory;
    return l;
}

/* P(a token's k distinct experts, uniform over E, miss m given experts) = C(E-m, k) / C(E, k). */
static double p_miss(int E, int k, int m)
{
    double p = 1.0;
    for (int i = 0; i < k; i++) p *= E - m - i <= 0 ? 0.0 : (double)(E - m - i) / (double)(E - i);
    return p;
}

/* Experts rank q holds under contiguous placement (ranks 0..E%ep-1 one more). */
static int experts_of(int E, int ep, int q)
{
    return E / ep + (q < E % ep);
}

/* Ranks on other nodes than `rank` that a token reaches (flat: one row each), and
 * other nodes it reaches (node-aware: one row each), expected over uniform routing. */
static void network_model(const ws_args_t *a, int rpn, double *flat, double *node_aware)
{
    const int me_node = a->rank / rpn, nodes = (a->ep + rpn - 1) / rpn;
    *flat = *node_aware = 0;
    for (int n = 0; n < nodes; n++) {
        if (n == me_node) continue;
        int m = 0;
        for (int q = n * rpn; q < (n + 1) * rpn && q < a->ep; q++) {
            *flat += 1.0 - p_miss(a->experts, a->topk, experts_of(a->experts, a->ep, q));
            m += experts_of(a->experts, a->ep, q);
        }
        *node_aware += 1.0 - p_miss(a->experts, a->topk, m);
    }
}

static void line(const char *what, size_t bytes, const char *how)
{
    printf("  %-18s %16zu bytes %9.3f GiB  %s\n", what, bytes, (double)bytes / (1 << 30), how);
}

int info_workspace(const char *spec_in)
{
    ws_args_t a = {1, 7168, 8, 256, 1024, 0, 0, 0, 0, 0, MOEA2A_BFLOAT16, MOEA2A_BFLOAT16, MOEA2A_MEMORY_AUTO, NULL, 0};
    char spec[2048];
    snprintf(spec, sizeof(spec), "%s", spec_in ? spec_in : "");
    if (parse_args(spec, &a)) return 2;
    moea2a_moe_config_t c = config_of(&a);
    moea2a_moe_layout_t l = layout_of(&a);
    moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    if (moea2a_moe_workspace_size_layout(&l, &c, &s) != MOEA2A_SUCCESS) {
        fprintf(stderr, "moea2a_info --workspace: %s\n", moea2a_last_error(NULL));
        return 1;
    }
    int cuda = s.device_bytes > 0 || s.pinned_host_bytes > 0, fits = 1;
    char buf[256];
    printf("MoE workspace per rank: ep %d, max_tokens_per_rank %d, top-%d of %d experts, hidden %d, payload %s%s\n", a.ep,
           a.cap, a.topk, a.experts, a.hidden, moea2a_datatype_name(a.dtype), a.weights ? ", weights" : "");
    printf("  topology: %s; rank %d, %d per node; GPU %d, NUMA %d, NIC %s; %d NVLink peer(s), %d staged peer(s)\n",
           a.topology ? a.topology : "this machine", a.rank, a.rpn ? a.rpn : a.ep, s.gpu, s.numa_node,
           *s.nic ? s.nic : "none", s.nvlink_peers, s.staged_peers);
    line("aux", s.aux_bytes, "counters, headers, send map (cap x k), source index (ep x cap)");
    for (int i = 0; i < c.num_payloads; i++) {
        size_t es;
        moea2a_datatype_size(c.payloads[i].dtype, &es);
        if (c.wire[i].format == MOEA2A_WIRE_AS_IS)
            snprintf(buf, sizeof(buf), "ep x cap x %zu B (%s)", es * c.payloads[i].elems_per_token,
                     moea2a_datatype_name(c.payloads[i].dtype));
        else /* codes, row scales, the wire's layout (moea2a_moe(3), "Quantize on dispatch") */
            snprintf(buf, sizeof(buf), "%s given, quantized on dispatch to %s: codes and scales%s",
                     moea2a_datatype_name(c.payloads[i].dtype), c.wire[i].format == MOEA2A_WIRE_FP8 ? "FP8" : "NVFP4",
                     cuda ? ", the sender's quantized rows" : "");
        char name[32];
        snprintf(name, sizeof(name), "payload %d", i);
        line(name, s.payload_bytes[i], buf);
    }
    line("topk ids", s.ids_bytes, "ep x cap x k x 4 B");
    if (s.weights_bytes) line("topk weights", s.weights_bytes, "ep x cap x k x 4 B");
    line("combine", s.combine_bytes, "ep x cap x hidden (combine dtype)");
    if (s.expert_bytes) line("expert-major", s.expert_bytes, "local experts' rows, per-row arrays, combine rows");
    line("workspace", s.workspace_bytes, cuda ? "device memory" : "host memory");
    /* beyond the staged peers' blocks: the hierarchical path's relay (or copy-engine mode's landing) */
    size_t crow_es = 0;
    if (c.hidden) moea2a_datatype_size(c.combine_dtype, &crow_es);
    const size_t peers = (size_t)s.staged_peers * (size_t)a.cap, blocks = (peers * s.record_bytes + 127) / 128 * 128 +
                                                                      (peers * c.hidden * crow_es + 127) / 128 * 128;
    const char *more = s.staging_bytes <= blocks                    ? ""
                       : cuda && (c.flags & MOEA2A_MOE_COPY_ENGINE) ? ", + the combine's landing"
                       : c.combine_wire.format != MOEA2A_WIRE_AS_IS ? ", + the combine's FP8 rows [, + the hierarchical relay]"
                                                                     : ", + the hierarchical relay";
    if (cuda)
        snprintf(buf, sizeof(buf), "%d peer(s) x cap x (%zu B sent + combine row back)%s, device memory", s.staged_peers,
                 s.record_bytes, more);
    else
        snprintf(buf, sizeof(buf), "%d peer(s) x cap x (%zu B sent + combine row back)%s, host on NUMA %d",
                 s.staged_peers, s.record_bytes, more, s.numa_node);
    line("staging", s.staging_bytes, buf);
    if (cuda) line("pinned mirror", s.pinned_host_bytes, "counts, headers, stats [, error record] [, expert-major counts]: pinned host memory");
    if (a.mem_limit > 0) {
        size_t budget = (size_t)a.mem_limit, need = cuda ? s.device_bytes : s.total_bytes;
        if (need <= budget) {
            printf("  fits in %.1f GiB (%.1f%% used)\n", a.mem_limit / (1 << 30), 100.0 * (double)need / a.mem_limit);
        } else {
            int lo = 0, hi = a.cap;
            while (lo < hi) {
                moea2a_moe_config_t t = c;
                t.max_tokens_per_rank = lo + (hi - lo + 1) / 2;
                moea2a_moe_workspace_sizes_t ts = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
                moea2a_moe_workspace_size_layout(&l, &t, &ts);
                if ((cuda ? ts.device_bytes : ts.total_bytes) <= budget) lo = t.max_tokens_per_rank;
                else hi = t.max_tokens_per_rank - 1;
            }
            printf("  does NOT fit in %.1f GiB: needs %.2f GiB; max_tokens_per_rank <= %d fits\n", a.mem_limit / (1 << 30),
                   (double)need / (1 << 30), lo);
            fits = 0;
        }
    }
    const int rpn = a.rpn > 0 ? a.rpn : a.ep;
    if (rpn < a.ep) { /* several nodes: what crosses between them per token, modelled */
        double flat, node_aware;
        network_model(&a, rpn, &flat, &node_aware);
        const double rec = (double)s.record_bytes, crow = (double)a.hidden * (a.combine == MOEA2A_FLOAT32 ? 4 : 2);
        printf("  network (model, uniform top-%d of %d, contiguous placement, rank %d, nodes of %d ranks): rows to "
               "other nodes per token: flat %.4f, node-aware %.4f (%.3fx); bytes per token: dispatch %.0f / %.0f, "
               "combine %.0f / %.0f\n",
               a.topk, a.experts, a.rank, rpn, flat, node_aware, flat > 0 ? node_aware / flat : 0.0, flat * rec,
               node_aware * rec, flat * crow, node_aware * crow);
        /* Memory for the network, cap tokens: flat, a block of cap records out and cap combine rows back per
         * rank on another node; node-aware (the hierarchical plan, lib/moe/hier_plan.h), a block per other node
         * out (a token once per node) and its partials back, and, as a rail peer, a block from each source it
         * serves (those of other nodes with its index in its node, modulo its node's size) and their
         * partials out. */
        const int me_node = a.rank / rpn, nodes = (a.ep + rpn - 1) / rpn, mine = a.ep - me_node * rpn < rpn ? a.ep - me_node * rpn : rpn;
        long long served = 0;
        for (int n = 0; n < nodes; n++) {
            const int size = a.ep - n * rpn < rpn ? a.ep - n * rpn : rpn;
            for (int l = 0; l < size && n != me_node; l++) served += l % mine == a.rank % rpn;
        }
        const double blk = (double)a.cap * (rec + crow);
        printf("  network memory (model, per rank, cap %d): flat %.0f bytes (%d ranks on other nodes x cap x (record "
               "+ combine row)), node-aware %.0f bytes ((%d other nodes + %lld sources served as rail peer) x cap x "
               "(record + combine row))\n",
               a.cap, (a.ep - mine) * blk, a.ep - mine, (double)(nodes - 1 + served) * blk, nodes - 1, served);
    }
    printf("total %zu bytes\n", s.total_bytes);
    return fits ? 0 : 3;
}

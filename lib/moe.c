/* MoE contexts: create (collective, topology-aware sizing), dispatch (route, exchange
 * headers, move records, sanitize) and combine (return rows, reduce in rank order).
 *
 * Every collective step starts with an exchange that carries each rank's argument
 * check, so bad input on one rank fails every rank at once, with the same code,
 * instead of leaving the others waiting for a rank that already returned. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "moe.h"

/* ---- phase timing (TRACE only) ---------------------------------------------------
 * With MOEA2A_DEBUG=TRACE and the MOE subsystem, dispatch and combine wait for the
 * stream at each phase boundary and log how long each phase took. The waits change
 * the timing they measure; they exist to find where time goes, never otherwise. */
typedef struct {
    int on, n;
    double t0, last;
    char text[256];
} phase_t;

static void phase_start(moea2a_moe_t moe, phase_t *ph, void *stream)
{
    ph->on = m2a_log_enabled(M2A_LOG_TRACE, M2A_SUBSYS_MOE);
    ph->n = 0, ph->text[0] = 0;
    if (!ph->on) return;
    if (moe->cuda) m2a_moe_cuda_wait(moe, stream);
    ph->t0 = ph->last = m2a_now();
}

static void phase_mark(moea2a_moe_t moe, phase_t *ph, void *stream, const char *name)
{
    if (!ph->on) return;
    if (moe->cuda) m2a_moe_cuda_wait(moe, stream);
    double now = m2a_now();
    if (ph->n < 200)
        ph->n += snprintf(ph->text + ph->n, sizeof(ph->text) - (size_t)ph->n, " %s %.1f", name, (now - ph->last) * 1e6);
    ph->last = now;
}

static void phase_report(const phase_t *ph, const char *what)
{
    if (ph->on) M2A_TRACE(M2A_SUBSYS_MOE, "%s phases (us):%s; total %.1f", what, ph->text, (m2a_now() - ph->t0) * 1e6);
}

/* ---- planning: config, placement, layout ------------------------------------ */

typedef struct {
    moea2a_moe_config_t cfg;
    int cuda, staged, nvlink, lsa, rpn;
    int *stage_index;
    m2a_topo_t topo;
    m2a_topo_place_t place;
    m2a_moe_layout_t l;
} plan_t;

/* Nodes from the host names the bootstrap collected: node[r] = first rank on r's host. */
static void nodes_of(moea2a_comm_t comm, int *node, int *local, int *count)
{
    for (int r = 0; r < comm->nranks; r++) {
        node[r] = r, local[r] = 0, count[r] = 0;
        for (int q = 0; q < r; q++)
            if (!strcmp(comm->bs->peers[q].host, comm->bs->peers[r].host)) {
                node[r] = node[q];
                local[r]++;
            }
    }
    for (int r = 0; r < comm->nranks; r++) count[node[r]]++;
}

static moea2a_result_t plan(moea2a_comm_t comm, const moea2a_moe_config_t *config, plan_t *p)
{
    int ep = comm->nranks;
    memset(p, 0, sizeof(*p));
    M2A_TRY(m2a_moe_read_config(comm, config, ep, &p->cfg));
    moea2a_memory_t mem = p->cfg.memory;
    int cuda_transport = m2a_transport_for(comm, MOEA2A_MEM_CUDA) != NULL;
    if (mem == MOEA2A_MEMORY_AUTO) mem = cuda_transport ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    if (mem == MOEA2A_MEMORY_CUDA && !cuda_transport)
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                         "moea2a_moe: CUDA memory needs a transport that moves it (nccl, with a GPU); this "
                         "communicator has none (moea2a_info -T lists the transports)");
    if (!m2a_transport_for(comm, MOEA2A_MEM_HOST))
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "moea2a_moe: the MoE headers need a host-memory transport (ucx)");
    p->cuda = mem == MOEA2A_MEMORY_CUDA;
    M2A_TRY(m2a_topo_load(NULL, &p->topo));
    int *node = calloc((size_t)ep, sizeof(int)), *local = calloc((size_t)ep, sizeof(int));
    int *count = calloc((size_t)ep, sizeof(int)), *gpu = calloc((size_t)ep, sizeof(int));
    p->stage_index = calloc((size_t)ep, sizeof(int));
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (!node || !local || !count || !gpu || !p->stage_index) {
        r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe: out of memory");
    } else {
        nodes_of(comm, node, local, count);
        p->rpn = count[node[comm->rank]];
        for (int q = 0; q < ep; q++) gpu[q] = m2a_topo_place(&p->topo, local[q], count[node[q]], p->cuda).gpu;
        p->staged = m2a_moe_staged_peers(ep, comm->rank, node, gpu, &p->topo, p->cuda, m2a_moe_lsa_allowed(&p->cfg),
                                         &p->nvlink, &p->lsa);
        /* Staged peers take staging slots in rank order; this rank and load/store
         * peers have none. Host memory: every peer but this rank is staged. */
        for (int q = 0, s = 0; q < ep; q++) p->stage_index[q] = q == comm->rank ? -1 : s++;
        p->place = m2a_topo_place(&p->topo, local[comm->rank], p->rpn, p->cuda);
        m2a_moe_layout(&p->cfg, ep, p->staged, p->lsa, &p->l);
    }
    free(node), free(local), free(count), free(gpu);
    if (r != MOEA2A_SUCCESS) free(p->stage_index), p->stage_index = NULL;
    return r;
}

moea2a_result_t moea2a_moe_workspace_size(moea2a_comm_t comm, const moea2a_moe_config_t *config,
                                          moea2a_moe_workspace_sizes_t *sizes)
{
    M2A_TRY(m2a_comm_check(comm, "moea2a_moe_workspace_size"));
    M2A_CHECK_ARG(comm, sizes, "moea2a_moe_workspace_size: sizes is NULL");
    plan_t *p = malloc(sizeof(*p));
    if (!p) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_workspace_size: out of memory");
    moea2a_result_t r = plan(comm, config, p);
    if (r == MOEA2A_SUCCESS)
        r = m2a_moe_fill_sizes(&p->cfg, &p->l, p->cuda, p->staged, p->nvlink, &p->topo, p->place, sizes);
    free(p->stage_index);
    free(p);
    return r;
}

/* ---- create ------------------------------------------------------------------ */

/* MemAvailable from /proc/meminfo, in bytes; 0 if unknown. */
static size_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (size_t)kb * 1024;
}

/* Fails fast, before allocating, when this node's ranks would not fit in memory,
 * naming the largest max_tokens_per_rank that would. */
static moea2a_result_t check_fits(moea2a_comm_t comm, const plan_t *p)
{
    /* Host contexts share the node's memory with the node's other ranks; a CUDA
     * context has its GPU's free memory to itself. */
    size_t avail = 0, per_rank = p->l.workspace + p->l.staging, ranks = p->cuda ? 1 : (size_t)p->rpn;
    if (p->cuda) M2A_TRY(m2a_moe_cuda_free_memory(comm, &avail));
    else avail = host_available();
    if (!avail || per_rank <= avail / ranks) return MOEA2A_SUCCESS;
    moea2a_moe_config_t c = p->cfg;
    int lo = 0, hi = c.max_tokens_per_rank;
    while (lo < hi) { /* largest cap whose per-rank total fits */
        c.max_tokens_per_rank = lo + (hi - lo + 1) / 2;
        m2a_moe_layout_t l;
        m2a_moe_layout(&c, comm->nranks, p->staged, p->lsa, &l);
        if (l.workspace + l.staging <= avail / ranks) lo = c.max_tokens_per_rank;
        else hi = c.max_tokens_per_rank - 1;
    }
    return m2a_error(comm, MOEA2A_ERR_NO_MEMORY,
                     "moea2a_moe_create: needs %.2f GiB per rank = ep %d x cap %d x %.1f KiB per slot (+ %.2f GiB "
                     "staging) for %zu rank(s) sharing this %s; %.2f GiB free; max_tokens_per_rank <= %d fits",
                     (double)per_rank / (1 << 30), comm->nranks, p->cfg.max_tokens_per_rank,
                     (double)p->l.workspace / comm->nranks / p->cfg.max_tokens_per_rank / 1024,
                     (double)p->l.staging / (1 << 30), ranks, p->cuda ? "GPU" : "node's memory",
                     (double)avail / (1 << 30), lo);
}

/* What every rank must agree on, compared field by field at create. */
typedef struct {
    int32_t status, num_experts, top_k, cap, num_payloads, combine_dtype, invalid_id, placement, flags, memory, num_sms;
    int32_t dtypes[MOEA2A_MOE_MAX_PAYLOADS];
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
    for (int i = 0; i < c->num_payloads; i++) d.dtypes[i] = c->payloads[i].dtype, d.elems[i] = c->payloads[i].elems_per_token;
    d.map_hash = 1469598103934665603ULL;
    for (int e = 0; c->placement == MOEA2A_PLACEMENT_MAP && e < c->num_experts; e++)
        d.map_hash = (d.map_hash ^ (uint64_t)c->expert_to_rank[e]) * 1099511628211ULL;
    return d;
}

static moea2a_result_t agree_config(moea2a_comm_t comm, moea2a_result_t mine, const moea2a_moe_config_t *cfg)
{
    int n = comm->nranks;
    digest_t *all = calloc((size_t)n, sizeof(*all));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    all[comm->rank] = digest_of(cfg, mine);
    moea2a_result_t r = m2a_bootstrap_allgather(comm, comm->bs, all, sizeof(*all));
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (all[q].status != MOEA2A_SUCCESS) {
            r = mine != MOEA2A_SUCCESS ? mine
                                       : m2a_error(comm, (moea2a_result_t)all[q].status,
                                                   "moea2a_moe_create failed on rank %d (%s); see its moea2a_last_error",
                                                   q, moea2a_strerror((moea2a_result_t)all[q].status));
        } else if (mine == MOEA2A_SUCCESS && memcmp(&all[q], &all[comm->rank], sizeof(digest_t))) {
            const digest_t *a = &all[comm->rank], *b = &all[q];
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "moea2a_moe_create: rank %d passed a different config (experts %d/%d, top_k %d/%d, "
                          "max_tokens_per_rank %d/%d, payloads %d/%d, hidden %llu/%llu, flags 0x%x/0x%x, num_sms %d/%d: this "
                          "rank/rank %d; MOEA2A_NVLINK and MOEA2A_NUM_SMS count too)",
                          q, a->num_experts, b->num_experts, a->top_k, b->top_k, a->cap, b->cap, a->num_payloads,
                          b->num_payloads, (unsigned long long)a->hidden, (unsigned long long)b->hidden, a->flags,
                          b->flags, a->num_sms, b->num_sms, q);
        }
    }
    free(all);
    return r != MOEA2A_SUCCESS ? r : mine;
}

static void set_route(moea2a_moe_t moe)
{
    const moea2a_moe_config_t *c = &moe->cfg;
    moe->route = (m2a_route_t){moe->comm->nranks, moe->comm->rank, c->top_k, c->num_experts, c->max_tokens_per_rank,
                               c->num_payloads, (c->flags & MOEA2A_MOE_CARRY_WEIGHTS) != 0, c->invalid_expert_id,
                               moe->h_owner};
}

static void owner_table(const moea2a_moe_config_t *c, int ep, int32_t *owner)
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

moea2a_result_t m2a_moe_agree(moea2a_comm_t comm, moea2a_result_t mine, int *value_min)
{
    int n = comm->nranks;
    int32_t *all = calloc((size_t)n * 2, sizeof(int32_t));
    if (!all) return mine != MOEA2A_SUCCESS ? mine : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    all[2 * comm->rank] = mine, all[2 * comm->rank + 1] = value_min ? *value_min : 0;
    moea2a_result_t g = m2a_bootstrap_allgather(comm, comm->bs, all, 2 * sizeof(int32_t)), r = mine;
    if (g != MOEA2A_SUCCESS && r == MOEA2A_SUCCESS) r = g;
    for (int q = 0; g == MOEA2A_SUCCESS && q < n; q++) {
        if (r == MOEA2A_SUCCESS && all[2 * q] != MOEA2A_SUCCESS)
            r = m2a_error(comm, (moea2a_result_t)all[2 * q], "moea2a_moe_create failed on rank %d (%s)", q,
                          moea2a_strerror((moea2a_result_t)all[2 * q]));
        if (value_min && all[2 * q + 1] < *value_min) *value_min = all[2 * q + 1];
    }
    free(all);
    return r;
}

moea2a_result_t moea2a_moe_destroy(moea2a_moe_t moe)
{
    if (!moe) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_moe_destroy: moe is NULL");
    if (moe->cuda) {
        m2a_moe_cuda_release(moe);
        free(moe->h_owner);
        free(moe->stage_index);
    } else {
        m2a_topo_free(moe->ws, moe->l.workspace);
        m2a_topo_free(moe->stage, moe->l.staging);
    }
    free(moe);
    return MOEA2A_SUCCESS;
}

/* Host context: workspace and staging bound to the rank's NUMA node; the tables
 * live in the workspace itself. */
static moea2a_result_t alloc_host(moea2a_moe_t moe, plan_t *p)
{
    const m2a_moe_layout_t *l = &moe->l;
    moe->ws = m2a_topo_alloc(l->workspace, p->place.numa);
    moe->stage = l->staging ? m2a_topo_alloc(l->staging, p->place.numa) : NULL;
    if (!moe->ws || (l->staging && !moe->stage))
        return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: cannot allocate %zu + %zu bytes",
                         l->workspace, l->staging);
    moe->h_send_counts = (int32_t *)(moe->ws + l->send_counts);
    moe->h_recv_counts = (int32_t *)(moe->ws + l->recv_counts);
    moe->h_hdr_send = (m2a_moe_header_t *)(moe->ws + l->hdr_send);
    moe->h_hdr_recv = (m2a_moe_header_t *)(moe->ws + l->hdr_recv);
    moe->h_owner = (int32_t *)(moe->ws + l->owner);
    moe->stage_index = (int *)(moe->ws + l->stage_index);
    owner_table(&p->cfg, moe->comm->nranks, moe->h_owner); /* p->cfg still holds the caller's map */
    memcpy(moe->stage_index, p->stage_index, sizeof(int) * (size_t)moe->comm->nranks);
    set_route(moe);
    /* Every slot starts as padding: sanitized ids, source index -1. */
    memset(moe->h_recv_counts, 0, 4 * (size_t)moe->comm->nranks);
    m2a_host_sanitize(&moe->route, l, moe->cfg.max_tokens_per_rank, 1, 0, moe->ws);
    return MOEA2A_SUCCESS;
}

/* CUDA context: host copies of the tables for the host logic; moe_cuda.c allocates
 * the device memory and the pinned mirror and uploads the tables. */
static moea2a_result_t alloc_cuda(moea2a_moe_t moe, plan_t *p)
{
    moe->h_owner = malloc(sizeof(int32_t) * (size_t)moe->cfg.num_experts);
    moe->stage_index = p->stage_index, p->stage_index = NULL;
    if (!moe->h_owner) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    owner_table(&p->cfg, moe->comm->nranks, moe->h_owner); /* p->cfg still holds the caller's map */
    set_route(moe);
    moea2a_result_t r = m2a_moe_cuda_alloc(moe);
    if (r == MOEA2A_ERR_UNAVAILABLE && moe->l.lsa) {
        /* Every rank learned the same: no load/store between all ranks after all.
         * The generic path needs staging for every peer. */
        M2A_INFO(M2A_SUBSYS_MOE, "load/store path unavailable (%s); the generic NCCL path stages every peer, "
                 "so this context is larger than moea2a_moe_workspace_size predicted", moea2a_last_error(moe->comm));
        m2a_moe_cuda_release(moe);
        p->staged = moe->comm->nranks - 1, p->lsa = 0;
        m2a_moe_layout(&moe->cfg, moe->comm->nranks, p->staged, 0, &moe->l);
        r = m2a_moe_cuda_alloc(moe);
    }
    return r;
}

moea2a_result_t moea2a_moe_create(moea2a_moe_t *out, moea2a_comm_t comm, const moea2a_moe_config_t *config)
{
    M2A_TRY(m2a_comm_check(comm, "moea2a_moe_create"));
    M2A_CHECK_ARG(comm, out, "moea2a_moe_create: moe is NULL");
    *out = NULL;
    moea2a_moe_t moe = calloc(1, sizeof(*moe));
    plan_t *p = calloc(1, sizeof(*p));
    moea2a_result_t r = moe && p ? plan(comm, config, p) : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    /* All ranks learn whether every rank's config checked out and is the same. */
    r = agree_config(comm, r, r == MOEA2A_SUCCESS ? &p->cfg : NULL);
    if (r == MOEA2A_SUCCESS) r = check_fits(comm, p);
    if (r == MOEA2A_SUCCESS) {
        moe->comm = comm;
        moe->cfg = p->cfg;
        moe->cfg.expert_to_rank = NULL; /* the owner table keeps the map */
        moe->cuda = p->cuda;
        moe->l = p->l;
        moe->numa = p->place.numa;
        r = moe->cuda ? alloc_cuda(moe, p) : alloc_host(moe, p);
    }
    /* The allocation may fail on one rank only: agree once more. */
    r = m2a_moe_agree(comm, r, NULL);
    if (p) free(p->stage_index);
    free(p);
    if (r != MOEA2A_SUCCESS) {
        if (moe) moea2a_moe_destroy(moe);
        /* Config and memory failures were agreed on by every rank, which stay in step;
         * only a failed exchange (timeout, dead peer) leaves the communicator broken. */
        return r == MOEA2A_ERR_TIMEOUT || r == MOEA2A_ERR_PEER_FAILED ? m2a_comm_fail(comm, r) : r;
    }
    M2A_INFO(M2A_SUBSYS_MOE, "MoE context: ep %d, %d experts, top-%d, cap %d, workspace %zu B, staging %zu B (%d peers) on NUMA %d",
             comm->nranks, moe->cfg.num_experts, moe->cfg.top_k, moe->cfg.max_tokens_per_rank, moe->l.workspace,
             moe->l.staging, comm->nranks - 1, moe->numa);
    *out = moe;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_status(moea2a_moe_t moe)
{
    M2A_CHECK_ARG(NULL, moe, "moea2a_moe_status: moe is NULL");
    return moe->fast ? m2a_moe_fast_status(moe) : MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_max_recv_rows(moea2a_moe_t moe, size_t *rows)
{
    M2A_CHECK_ARG(NULL, moe && rows, "moea2a_moe_max_recv_rows: moe and rows must not be NULL");
    *rows = (size_t)moe->comm->nranks * (size_t)moe->cfg.max_tokens_per_rank;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_combine_buffer(moea2a_moe_t moe, void **buffer)
{
    M2A_CHECK_ARG(NULL, moe && buffer, "moea2a_moe_combine_buffer: moe and buffer must not be NULL");
    M2A_CHECK_ARG(moe->comm, moe->cfg.hidden > 0, "moea2a_moe_combine_buffer: the context was created with hidden=0");
    *buffer = moe->ws + moe->l.combine;
    return MOEA2A_SUCCESS;
}

/* ---- dispatch ------------------------------------------------------------------ */

/* A per-call token count (what) over the context's capacity: MOEA2A_ERR_CAPACITY
 * with the capacity that would do. */
static moea2a_result_t within_cap(moea2a_comm_t comm, const char *fn, const char *what, int v, int cap)
{
    if (v <= cap) return MOEA2A_SUCCESS;
    return m2a_error(comm, MOEA2A_ERR_CAPACITY,
                     "%s: %s=%d exceeds max_tokens_per_rank=%d: raise max_tokens_per_rank to at least %d at "
                     "moea2a_moe_create",
                     fn, what, v, cap, v);
}

static moea2a_result_t check_result_arg(moea2a_comm_t comm, const char *fn, const moea2a_dispatch_result_t *result)
{
    M2A_CHECK_ARG(comm, result && result->size >= sizeof(*result),
                  "%s: result is NULL or its size is not set (use MOEA2A_DISPATCH_RESULT_INITIALIZER)", fn);
    return MOEA2A_SUCCESS;
}

static moea2a_result_t check_dispatch_args(moea2a_moe_t moe, const char *fn, int n, const int32_t *ids,
                                           const float *weights, const void *const *payloads, int runtime_max)
{
    moea2a_comm_t comm = moe->comm;
    const moea2a_moe_config_t *c = &moe->cfg;
    M2A_CHECK_ARG(comm, runtime_max >= 0, "%s: runtime_max_tokens_per_rank=%d is negative", fn, runtime_max);
    M2A_TRY(within_cap(comm, fn, "runtime_max_tokens_per_rank", runtime_max, c->max_tokens_per_rank));
    M2A_CHECK_ARG(comm, n >= 0, "%s: num_tokens=%d is negative", fn, n);
    M2A_TRY(within_cap(comm, fn, "num_tokens", n, c->max_tokens_per_rank));
    if (runtime_max && n > runtime_max)
        return m2a_error(comm, MOEA2A_ERR_CAPACITY,
                         "%s: num_tokens=%d exceeds runtime_max_tokens_per_rank=%d of this call: pass at least %d",
                         fn, n, runtime_max, n);
    if (n == 0) return MOEA2A_SUCCESS;
    M2A_CHECK_ARG(comm, ids, "%s: topk_ids is NULL with num_tokens=%d", fn, n);
    M2A_CHECK_ARG(comm, weights || !(c->flags & MOEA2A_MOE_CARRY_WEIGHTS),
                  "%s: topk_weights is NULL but the context carries weights", fn);
    M2A_CHECK_ARG(comm, payloads || c->num_payloads == 0, "%s: payloads is NULL with %d payloads configured", fn,
                  c->num_payloads);
    for (int i = 0; i < c->num_payloads; i++) M2A_CHECK_ARG(comm, payloads[i], "%s: payloads[%d] is NULL", fn, i);
    const void *ptrs[2] = {ids, weights};
    for (int i = 0; i < 2 + c->num_payloads; i++) {
        const void *ptr = i < 2 ? ptrs[i] : payloads[i - 2];
        M2A_CHECK_ARG(comm, !ptr || m2a_memtype(ptr) == (moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST),
                      "%s: an input is in %s memory but the context was created for %s memory", fn,
                      moe->cuda ? "host" : "CUDA", moe->cuda ? "CUDA" : "host");
    }
    return MOEA2A_SUCCESS;
}

/* After the header exchange: the first failing rank's error, or a runtime_max
 * disagreement, becomes every rank's result. */
static moea2a_result_t judge_headers(moea2a_moe_t moe, moea2a_result_t mine, const m2a_moe_header_t *in, int rt)
{
    moea2a_comm_t comm = moe->comm;
    if (mine != MOEA2A_SUCCESS) return mine;
    for (int q = 0; q < comm->nranks; q++) {
        if (in[q].status == MOEA2A_SUCCESS) continue;
        if (in[q].status == MOEA2A_ERR_CAPACITY)
            return m2a_error(comm, MOEA2A_ERR_CAPACITY,
                             "moea2a_dispatch failed on rank %d: num_tokens=%d or runtime_max_tokens_per_rank=%d "
                             "exceeds max_tokens_per_rank=%d; raise max_tokens_per_rank to at least %d",
                             q, in[q].num_tokens, in[q].runtime_max, moe->cfg.max_tokens_per_rank,
                             in[q].num_tokens > in[q].runtime_max ? in[q].num_tokens : in[q].runtime_max);
        return m2a_error(comm, (moea2a_result_t)in[q].status, "moea2a_dispatch failed on rank %d: %s", q,
                         moea2a_strerror((moea2a_result_t)in[q].status));
    }
    for (int q = 0; q < comm->nranks; q++) {
        if (in[q].runtime_max != rt)
            return m2a_error(comm, MOEA2A_ERR_MISMATCH,
                             "moea2a_dispatch: ranks passed different runtime_max_tokens_per_rank: rank %d passed %d, "
                             "rank %d passed %d (0 means max_tokens_per_rank); every rank must pass the same value",
                             comm->rank, rt, q, in[q].runtime_max);
        if (in[q].count < 0 || in[q].count > rt)
            return m2a_error(comm, MOEA2A_ERR_MISMATCH, "moea2a_dispatch: rank %d announced %d tokens for a stride of %d",
                             q, in[q].count, rt);
    }
    return MOEA2A_SUCCESS;
}

/* Byte counts and displacements of one all-to-all with the staged peers (this rank
 * and load/store peers are served directly): send_rows[q] rows of `width` bytes go to
 * q, recv_rows[q] come from q. Peer q's send block starts at index x send_peer_bytes
 * + soff and its receive block at index x recv_peer_bytes, where the send side is
 * indexed by staging slot and the receive side by rank (dispatch: staging to
 * workspace), or the other way round when send_by_rank is set (combine: workspace
 * to staging). */
typedef struct {
    int64_t *sc, *sd, *rc, *rd;
} exchange_t;

static void exchange_plan(const moea2a_moe_t moe, exchange_t *x, const int32_t *send_rows, const int32_t *recv_rows,
                          size_t width, size_t send_peer_bytes, size_t soff, size_t recv_peer_bytes, int send_by_rank)
{
    for (int q = 0; q < moe->comm->nranks; q++) {
        int s = moe->stage_index[q];
        x->sc[q] = s < 0 ? 0 : (int64_t)send_rows[q] * (int64_t)width;
        x->sd[q] = s < 0 ? 0 : (int64_t)((size_t)(send_by_rank ? q : s) * send_peer_bytes + soff);
        x->rc[q] = s < 0 ? 0 : (int64_t)recv_rows[q] * (int64_t)width;
        x->rd[q] = s < 0 ? 0 : (int64_t)((size_t)(send_by_rank ? s : q) * recv_peer_bytes);
    }
}

static int64_t *vectors(int n, int count)
{
    return malloc(sizeof(int64_t) * 4 * (size_t)n * (size_t)count);
}

/* Sends every array of the dispatched tokens to the staged peers, each as its own
 * non-blocking all-to-all, all in flight together (one NCCL group on CUDA memory),
 * landing straight in the workspace's [ep][stride][width] arrays. */
static moea2a_result_t exchange_arrays(moea2a_moe_t moe, int stride, void *stream)
{
    const m2a_moe_layout_t *l = &moe->l;
    int n = moe->comm->nranks;
    size_t cap = (size_t)moe->cfg.max_tokens_per_rank;
    int64_t *v = vectors(n, l->narrays);
    moea2a_request_t req[M2A_MOE_MAX_ARRAYS] = {0};
    if (!v) return m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    unsigned mem = moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
    moea2a_result_t r = m2a_transport_group(moe->comm, mem, 1);
    for (int a = 0; a < l->narrays && r == MOEA2A_SUCCESS; a++) {
        const m2a_moe_array_t *ar = &l->array[a];
        exchange_t x = {v + 4 * n * a, v + 4 * n * a + n, v + 4 * n * a + 2 * n, v + 4 * n * a + 3 * n};
        exchange_plan(moe, &x, moe->h_send_counts, moe->h_recv_counts, ar->width, cap * l->record, cap * ar->rec,
                      (size_t)stride * ar->width, 0);
        r = moea2a_ialltoallv(moe->stage ? moe->stage + l->stage_send : NULL, x.sc, x.sd, moe->ws + ar->ws, x.rc, x.rd,
                              MOEA2A_UINT8, moe->comm, stream, &req[a]);
    }
    moea2a_result_t g = m2a_transport_group(moe->comm, mem, 0);
    if (r == MOEA2A_SUCCESS) r = g;
    for (int a = 0; a < l->narrays; a++) {
        moea2a_result_t w = req[a] ? moea2a_wait(&req[a]) : MOEA2A_SUCCESS;
        if (r == MOEA2A_SUCCESS) r = w;
    }
    free(v);
    return r;
}

/* Host context: route, then this rank's tokens straight into their slots and the
 * staged peers' packed per peer and array, in slot order. */
static void host_route(moea2a_moe_t moe, int n, const int32_t *ids, int64_t *invalid, int64_t *dedup)
{
    m2a_host_route(&moe->route, n, ids, moe->h_send_counts, (int32_t *)(moe->ws + moe->l.send_map), invalid, dedup);
}

static void host_pack(moea2a_moe_t moe, int n, int rt, const void *const *payloads, const int32_t *ids,
                      const float *weights)
{
    const m2a_moe_layout_t *l = &moe->l;
    const int32_t *send_map = (const int32_t *)(moe->ws + l->send_map);
    int cap = moe->cfg.max_tokens_per_rank, k = moe->cfg.top_k;
    unsigned char *self_base[M2A_MOE_MAX_ARRAYS], *peer_base[M2A_MOE_MAX_ARRAYS];
    for (int a = 0; a < l->narrays; a++) self_base[a] = moe->ws + l->array[a].ws;
    for (int t = 0; t < n; t++)
        for (int d = 0; d < k && send_map[(size_t)t * k + d] >= 0; d++) {
            int e = send_map[(size_t)t * k + d], dest = e / cap, slot = e % cap, s = moe->stage_index[dest];
            if (s < 0) {
                m2a_host_put_token(&moe->route, l, t, payloads, ids, weights, self_base, (size_t)dest * rt + (size_t)slot);
                continue;
            }
            unsigned char *region = moe->stage + l->stage_send + (size_t)s * (size_t)cap * l->record;
            for (int a = 0; a < l->narrays; a++) peer_base[a] = region + (size_t)cap * l->array[a].rec;
            m2a_host_put_token(&moe->route, l, t, payloads, ids, weights, peer_base, (size_t)slot);
        }
}

static void fill_result(moea2a_moe_t moe, int rt, int64_t invalid, int64_t dedup, moea2a_dispatch_result_t *result)
{
    const m2a_moe_layout_t *l = &moe->l;
    unsigned char *ws = moe->ws;
    size_t caller_size = result->size;
    memset(result, 0, sizeof(*result));
    result->size = caller_size;
    result->version = MOEA2A_VERSION_CODE;
    result->ep = moe->comm->nranks, result->stride = rt, result->top_k = moe->cfg.top_k;
    result->recv_counts = (const int32_t *)(ws + l->recv_counts);
    for (int i = 0; i < moe->cfg.num_payloads; i++) {
        result->payloads[i] = ws + l->payload[i];
        result->payload_row_bytes[i] = l->row_bytes[i];
    }
    result->topk_ids = (int32_t *)(ws + l->ids);
    result->topk_weights = (moe->cfg.flags & MOEA2A_MOE_CARRY_WEIGHTS) ? (float *)(ws + l->weights) : NULL;
    result->src_token_index = (const int32_t *)(ws + l->src_index);
    if (moe->fast) { /* nothing waited for on the host: the counts are on the device */
        result->total_recv = result->sent_rows = result->invalid_entries = result->deduplicated = -1;
        result->device_stats = m2a_moe_fast_stats(moe);
        result->nvlink = 1;
        return;
    }
    for (int q = 0; q < moe->comm->nranks; q++)
        result->total_recv += moe->h_recv_counts[q], result->sent_rows += moe->h_send_counts[q];
    result->invalid_entries = invalid;
    result->deduplicated = dedup;
}


/* The state a call needs, or MOEA2A_ERR_STATE naming the call that comes next. */
static moea2a_result_t expect_step(moea2a_moe_t moe, const char *fn, m2a_moe_step_t want)
{
    /* A dispatch-only context (hidden = 0) has no combine: each dispatch replaces the last. */
    if (want == M2A_MOE_IDLE && moe->step == M2A_MOE_DISPATCHED && !moe->cfg.hidden) return MOEA2A_SUCCESS;
    if (moe->step == want) return MOEA2A_SUCCESS;
    static const char *const next[] = {
        "no dispatch is pending: call moea2a_dispatch (or moea2a_dispatch_send) first",
        "a split dispatch is pending: call moea2a_dispatch_recv next",
        "the previous dispatch was not combined yet: call moea2a_combine (or moea2a_combine_send) first; its results "
        "stay valid until then",
        "a split combine is pending: call moea2a_combine_recv next",
    };
    if (want == M2A_MOE_DISPATCHED && moe->step == M2A_MOE_IDLE)
        return m2a_error(moe->comm, MOEA2A_ERR_STATE, "%s: there is no dispatch to combine (call moea2a_dispatch first)", fn);
    return m2a_error(moe->comm, MOEA2A_ERR_STATE, "%s: %s", fn, next[moe->step]);
}

/* The checks every dispatch and combine entry point makes first. */
static moea2a_result_t enter(moea2a_moe_t moe, const char *fn, m2a_moe_step_t want)
{
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_TRY(m2a_comm_check(moe->comm, fn));
    return expect_step(moe, fn, want);
}

/* The send half on the load/store path (phases SEND), or the whole dispatch (BOTH):
 * the checks travel to the peers inside the kernel launch (a rank whose checks fail
 * sends its status instead of rows). */
static moea2a_result_t fast_dispatch_send(moea2a_moe_t moe, moea2a_result_t mine, int n, const int32_t *ids,
                                          const float *weights, const void *const *payloads, int runtime_max,
                                          int phases, void *stream)
{
    int rt = runtime_max ? runtime_max : moe->cfg.max_tokens_per_rank;
    M2A_TRY(m2a_moe_fast_status(moe));
    if (mine != MOEA2A_SUCCESS) rt = moe->cfg.max_tokens_per_rank; /* a stride every slot fits */
    moea2a_result_t r = m2a_moe_fast_dispatch(moe, n, ids, weights, payloads, rt, mine, phases, stream);
    if (mine != MOEA2A_SUCCESS) {
        m2a_moe_fast_poison(moe, mine);
        return mine;
    }
    M2A_TRY(r);
    moe->num_tokens = n, moe->stride = rt;
    return MOEA2A_SUCCESS;
}

/* The send half on the generic paths: route locally, exchange headers (counts, stride
 * and every rank's verdict), pack and move every array. */
static moea2a_result_t generic_dispatch_send(moea2a_moe_t moe, moea2a_result_t mine, int n, const int32_t *ids,
                                             const float *weights, const void *const *payloads, int runtime_max,
                                             void *stream)
{
    moea2a_comm_t comm = moe->comm;
    int ep = comm->nranks, cap = moe->cfg.max_tokens_per_rank, rt = runtime_max ? runtime_max : cap;
    m2a_moe_header_t *hs = moe->h_hdr_send, *hr = moe->h_hdr_recv;

    phase_t ph;
    phase_start(moe, &ph, stream);
    /* 1. Route locally; the outcome of the checks travels with the headers. */
    int64_t invalid = 0, dedup = 0;
    if (mine == MOEA2A_SUCCESS) {
        if (moe->cuda) mine = m2a_moe_cuda_route(moe, n, ids, stream, &invalid, &dedup);
        else host_route(moe, n, ids, &invalid, &dedup);
    }
    /* A failure that broke the communicator (device work stuck on a dead peer) has
     * no headers to travel with: return it, not the ABORTED of the exchange. */
    if (mine != MOEA2A_SUCCESS && comm->broken != MOEA2A_SUCCESS) return mine;
    if (mine != MOEA2A_SUCCESS) memset(moe->h_send_counts, 0, sizeof(int32_t) * (size_t)ep);
    for (int q = 0; q < ep; q++) hs[q] = (m2a_moe_header_t){moe->h_send_counts[q], rt, mine, n};
    phase_mark(moe, &ph, stream, "route");

    /* 2. Headers. */
    int64_t hc[512], *hcv = ep <= 256 ? hc : malloc(sizeof(int64_t) * 2 * (size_t)ep);
    if (!hcv) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_dispatch: out of memory");
    for (int q = 0; q < ep; q++) hcv[q] = 4, hcv[ep + q] = 4 * (int64_t)q;
    moea2a_result_t r = moea2a_alltoallv(hs, hcv, hcv + ep, hr, hcv, hcv + ep, MOEA2A_INT32, comm, NULL);
    if (hcv != hc) free(hcv);
    if (r != MOEA2A_SUCCESS) return r;
    M2A_TRY(judge_headers(moe, mine, hr, rt));
    for (int q = 0; q < ep; q++) moe->h_recv_counts[q] = hr[q].count;
    phase_mark(moe, &ph, stream, "headers");

    /* 3. Pack and move every array. */
    if (moe->cuda) r = m2a_moe_cuda_pack(moe, n, rt, payloads, ids, weights, stream);
    else host_pack(moe, n, rt, payloads, ids, weights);
    phase_mark(moe, &ph, stream, "pack");
    if (r == MOEA2A_SUCCESS) r = exchange_arrays(moe, rt, stream);
    if (r != MOEA2A_SUCCESS) return r;
    phase_mark(moe, &ph, stream, "exchange");
    phase_report(&ph, "dispatch send");
    moe->num_tokens = n, moe->stride = rt;
    moe->pending_invalid = invalid, moe->pending_dedup = dedup;
    return MOEA2A_SUCCESS;
}

/* The receive half on the generic paths: sanitize the padding slots. */
static moea2a_result_t generic_dispatch_recv(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream)
{
    int rt = moe->stride;
    phase_t ph;
    phase_start(moe, &ph, stream);
    if (moe->cuda) {
        M2A_TRY(m2a_moe_cuda_sanitize(moe, rt, stream));
    } else {
        m2a_host_sanitize(&moe->route, &moe->l, rt, !(moe->cfg.flags & MOEA2A_MOE_NO_SANITIZE),
                          (moe->cfg.flags & MOEA2A_MOE_REWRITE_NONLOCAL) != 0, moe->ws);
    }
    phase_mark(moe, &ph, stream, "sanitize");
    phase_report(&ph, "dispatch receive");
    fill_result(moe, rt, moe->pending_invalid, moe->pending_dedup, result);
    M2A_TRACE(M2A_SUBSYS_MOE, "dispatch: %d tokens, sent %lld rows, received %lld, %lld invalid entries",
              moe->num_tokens, (long long)result->sent_rows, (long long)result->total_recv,
              (long long)moe->pending_invalid);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_dispatch(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                const void *const *payloads, int runtime_max, moea2a_dispatch_result_t *result,
                                void *stream)
{
    static const char fn[] = "moea2a_dispatch";
    M2A_TRY(enter(moe, fn, M2A_MOE_IDLE));
    /* Every check, result's included, travels to the peers: a rejected call fails everywhere. */
    moea2a_result_t mine = check_result_arg(moe->comm, fn, result);
    if (mine == MOEA2A_SUCCESS) mine = check_dispatch_args(moe, fn, n, ids, weights, payloads, runtime_max);
    if (moe->fast) { /* one kernel: both halves */
        M2A_TRY(fast_dispatch_send(moe, mine, n, ids, weights, payloads, runtime_max, M2A_MOE_BOTH, stream));
        fill_result(moe, moe->stride, 0, 0, result);
    } else {
        M2A_TRY(generic_dispatch_send(moe, mine, n, ids, weights, payloads, runtime_max, stream));
        M2A_TRY(generic_dispatch_recv(moe, result, stream));
    }
    moe->step = M2A_MOE_DISPATCHED;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_dispatch_send(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                     const void *const *payloads, int runtime_max, void *stream)
{
    static const char fn[] = "moea2a_dispatch_send";
    M2A_TRY(enter(moe, fn, M2A_MOE_IDLE));
    moea2a_result_t mine = check_dispatch_args(moe, fn, n, ids, weights, payloads, runtime_max);
    if (moe->fast)
        M2A_TRY(fast_dispatch_send(moe, mine, n, ids, weights, payloads, runtime_max, M2A_MOE_SEND, stream));
    else
        M2A_TRY(generic_dispatch_send(moe, mine, n, ids, weights, payloads, runtime_max, stream));
    moe->step = M2A_MOE_DISPATCH_SENT;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_dispatch_recv(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream)
{
    static const char fn[] = "moea2a_dispatch_recv";
    M2A_TRY(enter(moe, fn, M2A_MOE_DISPATCH_SENT));
    /* local: a rejected receive leaves the dispatch pending (call it again) */
    M2A_TRY(check_result_arg(moe->comm, fn, result));
    if (moe->fast) {
        M2A_TRY(m2a_moe_fast_status(moe));
        M2A_TRY(m2a_moe_fast_dispatch(moe, moe->num_tokens, NULL, NULL, NULL, moe->stride, MOEA2A_SUCCESS,
                                      M2A_MOE_RECV, stream));
        fill_result(moe, moe->stride, 0, 0, result);
    } else {
        M2A_TRY(generic_dispatch_recv(moe, result, stream));
    }
    moe->step = M2A_MOE_DISPATCHED;
    return MOEA2A_SUCCESS;
}

/* ---- combine ------------------------------------------------------------------- */

static moea2a_result_t check_combine_in(moea2a_moe_t moe, const char *fn, const void *expert_out)
{
    unsigned want = moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
    if (expert_out && m2a_memtype(expert_out) != want)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT,
                         "%s: expert_out must be in %s memory, like the context", fn, moe->cuda ? "CUDA" : "host");
    return MOEA2A_SUCCESS;
}

static moea2a_result_t check_combine_out(moea2a_moe_t moe, const char *fn, const void *out)
{
    unsigned want = moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
    if (!out && moe->num_tokens > 0)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: out is NULL with %d tokens", fn, moe->num_tokens);
    if (out && m2a_memtype(out) != want)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: out must be in %s memory, like the context", fn,
                         moe->cuda ? "CUDA" : "host");
    return MOEA2A_SUCCESS;
}

/* The checks of every combine entry point; every rank has the same config, so the
 * hidden = 0 check needs no agreement. */
static moea2a_result_t enter_combine(moea2a_moe_t moe, const char *fn, m2a_moe_step_t want)
{
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_TRY(m2a_comm_check(moe->comm, fn));
    if (!moe->cfg.hidden)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT,
                         "%s: the context was created with hidden=0 (dispatch only): it has no combine", fn);
    return expect_step(moe, fn, want);
}

/* The send half on the generic paths: everyone learns whether everyone can go on,
 * then the expert side sends back each source's rows from [src][stride][hidden]; the
 * token side lands them per staged peer. */
static moea2a_result_t generic_combine_send(moea2a_moe_t moe, moea2a_result_t mine, const void *expert_out, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    int ep = comm->nranks;
    int32_t *st = calloc((size_t)ep, sizeof(int32_t));
    if (!st) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    int32_t me = mine;
    moea2a_result_t r = moea2a_allgather(&me, st, 1, MOEA2A_INT32, comm, NULL);
    for (int q = 0; r == MOEA2A_SUCCESS && q < ep; q++)
        if (st[q] != MOEA2A_SUCCESS)
            r = mine != MOEA2A_SUCCESS ? mine
                                       : m2a_error(comm, (moea2a_result_t)st[q], "moea2a_combine failed on rank %d: %s", q,
                                                   moea2a_strerror((moea2a_result_t)st[q]));
    free(st);
    if (r != MOEA2A_SUCCESS) return r;

    const unsigned char *in = expert_out ? expert_out : moe->ws + l->combine;
    size_t row = l->combine_row;
    int64_t *v = vectors(ep, 1);
    if (!v) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    exchange_t x = {v, v + ep, v + 2 * ep, v + 3 * ep};
    exchange_plan(moe, &x, moe->h_recv_counts, moe->h_send_counts, row, (size_t)moe->stride * row, 0,
                  (size_t)moe->cfg.max_tokens_per_rank * row, 1);
    unsigned char *landing = moe->stage ? moe->stage + l->stage_recv : NULL;
    r = moea2a_alltoallv(in, x.sc, x.sd, landing, x.rc, x.rd, MOEA2A_UINT8, comm, stream);
    free(v);
    if (r == MOEA2A_SUCCESS) moe->combine_in = in;
    return r;
}

/* The receive half on the generic paths: the sum in ascending rank order. */
static moea2a_result_t generic_combine_recv(moea2a_moe_t moe, void *out, void *stream)
{
    moea2a_comm_t comm = moe->comm;
    const m2a_moe_layout_t *l = &moe->l;
    const unsigned char *in = moe->combine_in;
    if (moe->cuda) return m2a_moe_cuda_combine(moe, in, out, stream);
    const unsigned char *landing = moe->stage ? moe->stage + l->stage_recv : NULL;
    if (m2a_host_combine_reduce(&moe->route, moe->num_tokens, (const int32_t *)(moe->ws + l->send_map),
                                moe->cfg.combine_dtype, moe->cfg.hidden,
                                in + (size_t)comm->rank * (size_t)moe->stride * l->combine_row, landing,
                                moe->stage_index, out))
        return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_combine: out of memory");
    return MOEA2A_SUCCESS;
}

/* The load/store path's combine launch (phases SEND, or BOTH): a rank whose checks
 * failed (mine) launches too, so that its peers' kernels record the failure instead of
 * reading its rows; its context is poisoned. */
static moea2a_result_t fast_combine_send(moea2a_moe_t moe, moea2a_result_t mine, const void *expert_out, void *out,
                                         int phases, void *stream)
{
    M2A_TRY(m2a_moe_fast_status(moe));
    moea2a_result_t r = m2a_moe_fast_combine(moe, expert_out, out, mine, phases, stream);
    if (mine == MOEA2A_SUCCESS) mine = r;
    if (mine != MOEA2A_SUCCESS) m2a_moe_fast_poison(moe, mine);
    return mine;
}

moea2a_result_t moea2a_combine(moea2a_moe_t moe, const void *expert_out, void *out, void *stream)
{
    static const char fn[] = "moea2a_combine";
    M2A_TRY(enter_combine(moe, fn, M2A_MOE_DISPATCHED));
    moea2a_result_t mine = check_combine_out(moe, fn, out);
    if (mine == MOEA2A_SUCCESS) mine = check_combine_in(moe, fn, expert_out);
    if (moe->fast) { /* the load/store path: one kernel, the peers wait on the device */
        M2A_TRY(fast_combine_send(moe, mine, expert_out, out, M2A_MOE_BOTH, stream));
        moe->step = M2A_MOE_IDLE;
        return MOEA2A_SUCCESS;
    }
    phase_t ph;
    phase_start(moe, &ph, stream);
    moea2a_result_t r = generic_combine_send(moe, mine, expert_out, stream);
    phase_mark(moe, &ph, stream, "exchange");
    if (r == MOEA2A_SUCCESS) r = generic_combine_recv(moe, out, stream);
    phase_mark(moe, &ph, stream, "reduce");
    phase_report(&ph, "combine");
    if (r == MOEA2A_SUCCESS) moe->step = M2A_MOE_IDLE;
    return r;
}

moea2a_result_t moea2a_combine_send(moea2a_moe_t moe, const void *expert_out, void *stream)
{
    static const char fn[] = "moea2a_combine_send";
    M2A_TRY(enter_combine(moe, fn, M2A_MOE_DISPATCHED));
    moea2a_result_t mine = check_combine_in(moe, fn, expert_out);
    if (moe->fast) {
        M2A_TRY(fast_combine_send(moe, mine, expert_out, NULL, M2A_MOE_SEND, stream));
    } else {
        M2A_TRY(generic_combine_send(moe, mine, expert_out, stream));
    }
    moe->step = M2A_MOE_COMBINE_SENT;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_combine_recv(moea2a_moe_t moe, void *out, void *stream)
{
    static const char fn[] = "moea2a_combine_recv";
    M2A_TRY(enter_combine(moe, fn, M2A_MOE_COMBINE_SENT));
    /* local: a rejected receive leaves the combine pending (call it again); the peers'
     * rows it reads stay put until this rank's next dispatch */
    M2A_TRY(check_combine_out(moe, fn, out));
    if (moe->fast) {
        M2A_TRY(m2a_moe_fast_status(moe));
        M2A_TRY(m2a_moe_fast_combine(moe, NULL, out, MOEA2A_SUCCESS, M2A_MOE_RECV, stream));
    } else {
        M2A_TRY(generic_combine_recv(moe, out, stream));
    }
    moe->step = M2A_MOE_IDLE;
    return MOEA2A_SUCCESS;
}

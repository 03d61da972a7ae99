/* MoE contexts, the public calls: create (collective, topology-aware sizing, the
 * backend chosen once), destroy, and the one-call and split forms of dispatch and
 * combine, which check their arguments and the call order and hand the work to the
 * context's backend (moe_backend.h).
 *
 * Every collective step starts with an exchange that carries each rank's argument
 * check, so bad input on one rank fails every rank at once, with the same code,
 * instead of leaving the others waiting for a rank that already returned. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/memtype.h"
#include "comm/agree.h"
#include "comm/coll.h"
#include "comm/transport.h"
#include "moe/core.h"
#include "moe/backend.h"
#include "moe/backend/cuda_steps.h"
#include "moe/expert.h"
#include "moe/load.h"
#include "moe/hier_plan.h"
#include "moe/backend/symmetric.h"

/* ---- planning: config, placement, layout ------------------------------------ */

/* Across nodes a context takes the hierarchical path (a row once per node, relayed
 * inside it) where a node holds two or more ranks (largest: the largest node's ranks),
 * or everywhere with MOEA2A_HIERARCHICAL=1; never with 0, nor on one node. */
static int hier_wanted(int nnodes, int largest, long setting)
{
    return nnodes > 1 && (setting == 1 || (setting < 0 && largest > 1));
}

typedef struct {
    moea2a_moe_config_t cfg;
    const m2a_moe_backend_t *backend;
    int cuda, staged, flat_staged, nvlink, lsa, rpn, hier;
    m2a_moe_nodes_t nodes; /* where this rank sits among the nodes (the backends' sizes) */
    char no_lsa[240]; /* why the topology's load/store path has no symmetric memory, or "" */
    int *stage_index;
    m2a_topo_t topo;
    m2a_topo_place_t place;
    m2a_moe_layout_t l;
} plan_t;

/* The formula for a backend: the core's layout with the backend's additions. */
static void layout_for(const moea2a_moe_config_t *cfg, int ep, int staged, const m2a_moe_backend_t *b,
                       const m2a_moe_nodes_t *nodes, m2a_moe_layout_t *l)
{
    m2a_moe_backend_size_t bs = {0};
    if (b->size) b->size(cfg, ep, nodes, &bs);
    m2a_moe_layout(cfg, ep, staged, &bs, l);
}

/* Copy-engine mode is a mode of the load/store path: a context on another path
 * refuses it (sizing too: it sizes what create would allocate). no_lsa: why the
 * symmetric memory is missing where the topology offered the path, or "". */
static moea2a_result_t copy_engine_possible(moea2a_comm_t comm, const moea2a_moe_config_t *c,
                                            const m2a_moe_backend_t *b, int cuda, const char *no_lsa)
{
    if (!(c->flags & MOEA2A_MOE_COPY_ENGINE) || b->copy_engine) return MOEA2A_SUCCESS;
    return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                     "moea2a_moe: MOEA2A_MOE_COPY_ENGINE needs the load/store path: CUDA memory, a combine (hidden > "
                     "0), every rank reaching every other by NVLink and symmetric memory on every rank; this context "
                     "%s",
                     !cuda ? "is in host memory" : c->hidden == 0 ? "has hidden = 0" : *no_lsa ? no_lsa
                     : "has ranks that do not (another node, no NVLink between their GPUs, or MOEA2A_NVLINK=0)");
}

/* Staging slots, in rank order, this rank none: on the hierarchical path in host
 * memory its node's other ranks and its rail peer in every other node (all it sends to
 * and hears from); else every peer (used only by the paths that stage, and ready for
 * the generic path should the load/store one fall back; the CUDA hierarchical path
 * keeps them all too). p->staged follows; flat_staged keeps the flat paths' count. -1:
 * out of memory. */
static int set_staging(moea2a_comm_t comm, plan_t *p)
{
    const int ep = comm->nranks;
    if (p->hier && !p->cuda) {
        int n = m2a_hier_staged(&comm->nodes, ep, comm->rank, p->stage_index);
        if (n < 0) return -1;
        p->staged = n;
        return 0;
    }
    for (int q = 0, s = 0; q < ep; q++) p->stage_index[q] = q == comm->rank ? -1 : s++;
    p->staged = p->flat_staged;
    return 0;
}

/* What a context's path does not serve, refused at create and in the sizing calls: the
 * FP8 combine wire where the path has none (or not for this hidden, or in copy-engine
 * mode, whose sum reads rows as they are), and, in CUDA memory, the expert-major scales
 * in the wires' tiled layouts (made on the host in this release). */
static moea2a_result_t wire_possible(moea2a_comm_t comm, const moea2a_moe_config_t *c, const m2a_moe_backend_t *b,
                                     int cuda)
{
    if (c->combine_wire.format != MOEA2A_WIRE_AS_IS &&
        (c->hidden > b->fp8_combine_hidden || (c->flags & MOEA2A_MOE_COPY_ENGINE))) {
        char why[96];
        if (!b->fp8_combine_hidden)
            snprintf(why, sizeof(why), "which has no FP8 combine");
        else if (c->flags & MOEA2A_MOE_COPY_ENGINE)
            snprintf(why, sizeof(why), "in copy-engine mode, whose sum reads rows as they are");
        else
            snprintf(why, sizeof(why), "whose FP8 combine takes hidden up to %zu (hidden=%zu)", b->fp8_combine_hidden,
                     c->hidden);
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                         "moea2a_moe: combine_wire FP8 runs on host memory and on the load/store, generic and "
                         "hierarchical paths in CUDA memory; this context takes the %s path, %s "
                         "(combine_wire.format MOEA2A_WIRE_AS_IS combines its rows as they are)", b->name, why);
    }
    if (!cuda) return MOEA2A_SUCCESS;
    if (c->flags & MOEA2A_MOE_EXPERT_WIRE_SCALES)
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                         "moea2a_moe: MOEA2A_MOE_EXPERT_WIRE_SCALES runs on host memory in this release; a context in "
                         "CUDA memory delivers the expert-major scales row-major (leave the flag off)");
    return MOEA2A_SUCCESS;
}

static moea2a_result_t plan(moea2a_comm_t comm, const moea2a_moe_config_t *config, plan_t *p)
{
    int ep = comm->nranks;
    memset(p, 0, sizeof(*p));
    M2A_TRY(m2a_moe_read_config(comm, config, ep, &p->cfg));
    moea2a_memory_t mem = p->cfg.memory;
    int cuda_transport = m2a_transport_for(comm, MOEA2A_MEM_CUDA) != NULL;
    if (mem == MOEA2A_MEMORY_AUTO) mem = cuda_transport ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    if (!m2a_transport_for(comm, MOEA2A_MEM_HOST))
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "moea2a_moe: the MoE headers need a host-memory transport (ucx)");
    p->cuda = mem == MOEA2A_MEMORY_CUDA;
    M2A_TRY(m2a_topo_load(NULL, &p->topo));
    /* Placement (GPU, NUMA node, memory shared) follows the real host, whatever nodes
     * the communicator's node map emulates; whether a peer is local follows the map. */
    const m2a_nodemap_t *m = &comm->nodes;
    int *gpu = calloc((size_t)ep, sizeof(int));
    p->stage_index = calloc((size_t)ep, sizeof(int));
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (!gpu || !p->stage_index) {
        r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe: out of memory");
    } else {
        p->rpn = m->host_size[comm->rank];
        for (int q = 0; q < ep; q++) gpu[q] = m2a_topo_place(&p->topo, m->host_local[q], m->host_size[q], p->cuda).gpu;
        p->staged = m2a_moe_staged_peers(ep, comm->rank, m->node, gpu, &p->topo, p->cuda, m2a_moe_lsa_allowed(&p->cfg),
                                         &p->nvlink, &p->lsa);
        /* The load/store path also needs symmetric memory (moe_symmetric.h): where the
         * chosen way cannot serve every rank, no mode takes the path, and the sizes are
         * the generic path's. */
        if (p->lsa && !m2a_symm_usable(comm, p->no_lsa, sizeof(p->no_lsa))) p->lsa = 0, p->staged = ep - 1;
        p->flat_staged = p->staged;
        p->place = m2a_topo_place(&p->topo, m->host_local[comm->rank], p->rpn, p->cuda);
        long hier = -1;
        r = m2a_comm_record(comm, m2a_param_int("MOEA2A_HIERARCHICAL", &hier));
        if (r == MOEA2A_SUCCESS && m2a_hier_nodes(m, ep, comm->rank, &p->nodes))
            r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe: out of memory");
        p->hier = hier_wanted(p->nodes.nnodes, p->nodes.widest, hier);
        if (r == MOEA2A_SUCCESS && set_staging(comm, p)) r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe: out of memory");
        p->backend = m2a_moe_backend_pick(p->cuda, p->lsa, p->hier);
        layout_for(&p->cfg, ep, p->staged, p->backend, &p->nodes, &p->l);
        if (r == MOEA2A_SUCCESS) r = copy_engine_possible(comm, &p->cfg, p->backend, p->cuda, p->no_lsa);
        if (r == MOEA2A_SUCCESS) r = wire_possible(comm, &p->cfg, p->backend, p->cuda);
    }
    /* Without a transport that moves CUDA memory only the load/store path serves a CUDA
     * context (its symmetric memory may come from CUDA IPC), on a GPU the topology shows. */
    if (r == MOEA2A_SUCCESS && p->cuda && !cuda_transport && (!p->lsa || p->place.gpu < 0))
        r = m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                      "moea2a_moe: CUDA memory needs a transport that moves it (nccl, with a GPU), or every rank on "
                      "one node reaching every other by load/store (the load/store path); this communicator has "
                      "neither (moea2a_info -T lists the transports)%s%s", *p->no_lsa ? "; load/store path: " : "",
                      p->no_lsa);
    free(gpu);
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

moea2a_result_t moea2a_moe_workspace_size_layout(const moea2a_moe_layout_t *layout, const moea2a_moe_config_t *config,
                                                 moea2a_moe_workspace_sizes_t *sizes)
{
    static const char fn[] = "moea2a_moe_workspace_size_layout";
    M2A_CHECK_ARG(NULL, layout && sizes, "%s: layout and sizes must not be NULL", fn);
    M2A_CHECK_ARG(NULL, layout->size >= sizeof(*layout), "%s: layout->size: start from MOEA2A_MOE_LAYOUT_INITIALIZER", fn);
    M2A_CHECK_ARG(NULL, layout->ep >= 1 && layout->ep <= (1 << 20), "%s: ep=%d is out of range", fn, layout->ep);
    M2A_CHECK_ARG(NULL, layout->rank >= 0 && layout->rank < layout->ep, "%s: rank=%d is out of range 0..%d", fn,
                  layout->rank, layout->ep - 1);
    int rpn = layout->ranks_per_node > 0 ? layout->ranks_per_node : layout->ep;
    M2A_CHECK_ARG(NULL, rpn <= layout->ep, "%s: ranks_per_node=%d exceeds ep=%d", fn, rpn, layout->ep);
    moea2a_moe_config_t cfg;
    M2A_TRY(m2a_moe_read_config(NULL, config, layout->ep, &cfg));
    m2a_topo_t *topo = calloc(1, sizeof(*topo));
    int *node = calloc((size_t)layout->ep, sizeof(int)), *gpu = calloc((size_t)layout->ep, sizeof(int));
    moea2a_result_t r = topo && node && gpu ? m2a_topo_load(layout->topology_xml, topo)
                                            : m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (r == MOEA2A_SUCCESS) {
        moea2a_memory_t mem = cfg.memory != MOEA2A_MEMORY_AUTO ? cfg.memory : layout->memory;
        int cuda = mem == MOEA2A_MEMORY_CUDA || (mem == MOEA2A_MEMORY_AUTO && topo->ngpus > 0);
        if (cuda && topo->ngpus == 0)
            r = m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "%s: CUDA memory asked for, but the topology has no GPU", fn);
        for (int p = 0; p < layout->ep; p++) {
            node[p] = p / rpn;
            gpu[p] = m2a_topo_place(topo, p % rpn, rpn, cuda).gpu;
        }
        int nvlink, lsa, staged = m2a_moe_staged_peers(layout->ep, layout->rank, node, gpu, topo, cuda,
                                                       m2a_moe_lsa_allowed(&cfg), &nvlink, &lsa);
        long hier = -1;
        m2a_moe_nodes_t nodes = {1, layout->ep, 0, layout->ep, 0};
        if (r == MOEA2A_SUCCESS) r = m2a_param_int("MOEA2A_HIERARCHICAL", &hier);
        if (r == MOEA2A_SUCCESS && m2a_hier_nodes_blocks(layout->ep, rpn, layout->rank, &nodes))
            r = m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
        const int h = hier_wanted(nodes.nnodes, rpn, hier);
        const m2a_moe_backend_t *b = m2a_moe_backend_pick(cuda, lsa, h);
        if (h && !cuda) staged = nodes.node_size - 1 + nodes.nnodes - 1; /* set_staging, m2a_hier_staged */
        m2a_moe_layout_t l;
        if (r == MOEA2A_SUCCESS) layout_for(&cfg, layout->ep, staged, b, &nodes, &l);
        if (r == MOEA2A_SUCCESS) r = copy_engine_possible(NULL, &cfg, b, cuda, "");
        if (r == MOEA2A_SUCCESS) r = wire_possible(NULL, &cfg, b, cuda);
        if (r == MOEA2A_SUCCESS)
            r = m2a_moe_fill_sizes(&cfg, &l, cuda, staged, nvlink, topo,
                                   m2a_topo_place(topo, layout->rank % rpn, rpn, cuda), sizes);
    }
    free(topo), free(node), free(gpu);
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
        layout_for(&c, comm->nranks, p->staged, p->backend, &p->nodes, &l);
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

void m2a_moe_release(moea2a_moe_t moe)
{
    if (moe->backend) moe->backend->release(moe);
    moe->backend = NULL;
    free(moe->h_owner), free(moe->h_holders), free(moe->h_nrep), free(moe->h_load);
    free(moe->stage_index);
    moe->h_owner = moe->h_holders = moe->h_nrep = NULL, moe->h_load = NULL, moe->stage_index = NULL;
}

moea2a_result_t moea2a_moe_destroy(moea2a_moe_t moe)
{
    if (!moe) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_moe_destroy: moe is NULL");
    m2a_moe_release(moe);
    free(moe);
    return MOEA2A_SUCCESS;
}

/* The backend's allocation. When the load/store path turns out unavailable (every
 * rank learned the same), the generic NCCL path takes over: it stages every peer. */
static moea2a_result_t alloc(moea2a_moe_t moe, plan_t *p)
{
    moea2a_comm_t comm = moe->comm;
    int ep = comm->nranks;
    moe->h_owner = malloc(sizeof(int32_t) * (size_t)moe->cfg.num_experts);
    moe->h_load = calloc((size_t)moe->cfg.num_experts, sizeof(int64_t));
    moe->stage_index = p->stage_index, p->stage_index = NULL;
    if (!moe->h_owner || !moe->h_load) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    m2a_moe_owner_table(&p->cfg, ep, moe->h_owner); /* p->cfg still holds the caller's map */
    moe->max_local = m2a_moe_max_local_experts(&p->cfg, ep);
    m2a_moe_set_route(moe);
    moe->backend = p->backend;
    moea2a_result_t r = moe->backend->alloc(moe);
    const m2a_moe_backend_t *fallback = moe->backend->fallback;
    if (r != MOEA2A_ERR_UNAVAILABLE || !fallback) return r;
    if (moe->cfg.flags & MOEA2A_MOE_COPY_ENGINE && !fallback->copy_engine)
        return m2a_error(comm, r, "moea2a_moe_create: MOEA2A_MOE_COPY_ENGINE needs the %s path, which is unavailable (%s)",
                         moe->backend->name, moea2a_last_error(comm));
    if (moe->cfg.combine_wire.format != MOEA2A_WIRE_AS_IS && moe->cfg.hidden > fallback->fp8_combine_hidden)
        return m2a_error(comm, r, "moea2a_moe_create: combine_wire FP8 in CUDA memory needs the %s path, which is "
                         "unavailable (%s); the %s path combines rows as they are", moe->backend->name,
                         moea2a_last_error(comm), fallback->name);
    if (moe->cuda && !m2a_transport_for(comm, MOEA2A_MEM_CUDA))
        return m2a_error(comm, r, "moea2a_moe_create: the %s path is unavailable (%s), and no transport moves CUDA "
                         "memory for the %s path (nccl)", moe->backend->name, moea2a_last_error(comm), fallback->name);
    M2A_INFO(M2A_SUBSYS_MOE, "%s path unavailable (%s); the %s path stages every peer, so this context is larger than "
             "moea2a_moe_workspace_size predicted", moe->backend->name, moea2a_last_error(comm), fallback->name);
    moe->backend->release(moe);
    moe->backend = fallback; /* a path with a fallback gives every peer a staging slot */
    const m2a_moe_nodes_t one = {1, ep, 0, ep, 0}; /* the fallback is the generic CUDA path, which sizes no nodes */
    layout_for(&moe->cfg, ep, ep - 1, moe->backend, &one, &moe->l);
    return moe->backend->alloc(moe);
}

/* A context's collective making on comm into moe (zeroed, or released by
 * m2a_moe_release): plan, agreement, allocation. On failure what it made is released. */
moea2a_result_t m2a_moe_build(moea2a_moe_t moe, moea2a_comm_t comm, const moea2a_moe_config_t *config)
{
    plan_t *p = calloc(1, sizeof(*p));
    moea2a_result_t r = p ? plan(comm, config, p) : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    /* All ranks learn whether every rank's config checked out and is the same. */
    r = m2a_moe_agree_config(comm, r, r == MOEA2A_SUCCESS ? &p->cfg : NULL);
    /* The hierarchical path takes every rank or none (MOEA2A_HIERARCHICAL may differ) */
    int hier = r == MOEA2A_SUCCESS ? p->hier : 0;
    if (r == MOEA2A_SUCCESS) r = m2a_moe_agree(comm, r, &hier);
    if (r == MOEA2A_SUCCESS && hier != p->hier) {
        M2A_INFO(M2A_SUBSYS_MOE, "moea2a_moe_create: another rank takes the flat path (MOEA2A_HIERARCHICAL): the flat path");
        p->hier = 0, p->backend = m2a_moe_backend_pick(p->cuda, p->lsa, 0);
        set_staging(comm, p); /* every peer: cannot fail */
        layout_for(&p->cfg, comm->nranks, p->staged, p->backend, &p->nodes, &p->l);
    }
    /* Memory (or a missing CUDA module) may fail on one rank only; the backends'
     * allocations are collective, so every rank enters them or none does. */
    if (r == MOEA2A_SUCCESS) r = m2a_moe_agree(comm, check_fits(comm, p), NULL);
    if (r == MOEA2A_SUCCESS) {
        moe->comm = comm;
        moe->cfg = p->cfg;
        /* the caller's fields (plan checked its size), zeros past an older header's */
        memset(&moe->given, 0, sizeof(moe->given));
        memcpy(&moe->given, config, config->size < sizeof(moe->given) ? config->size : sizeof(moe->given));
        moe->given.size = sizeof(moe->given), moe->given.expert_to_rank = NULL; /* the caller's memory */
        moe->cuda = p->cuda;
        moe->l = p->l;
        moe->numa = p->place.numa;
        r = alloc(moe, p);
        /* The caller's map was copied: the context's copy is its owner table, which
         * every later use of the config (the expert-major bound among them) reads. */
        moe->cfg.expert_to_rank = moe->cfg.placement == MOEA2A_PLACEMENT_MAP ? moe->h_owner : NULL;
    }
    /* The allocation may fail on one rank only: agree once more. */
    r = m2a_moe_agree(comm, r, NULL);
    if (p) free(p->stage_index);
    free(p);
    if (r != MOEA2A_SUCCESS) {
        m2a_moe_release(moe);
        /* Config and memory failures were agreed on by every rank, which stay in step;
         * only a failed exchange (timeout, dead peer) leaves the communicator broken. */
        return m2a_peer_lost(r) ? m2a_comm_fail(comm, r) : r;
    }
    M2A_INFO(M2A_SUBSYS_MOE, "MoE context (%s backend): ep %d, %d experts, top-%d, cap %d, workspace %zu B, staging %zu B "
             "(%d peers) on NUMA %d",
             moe->backend->name, comm->nranks, moe->cfg.num_experts, moe->cfg.top_k, moe->cfg.max_tokens_per_rank,
             moe->l.workspace, moe->l.staging, comm->nranks - 1, moe->numa);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_create(moea2a_moe_t *out, moea2a_comm_t comm, const moea2a_moe_config_t *config)
{
    M2A_TRY(m2a_comm_check(comm, "moea2a_moe_create"));
    M2A_CHECK_ARG(comm, out, "moea2a_moe_create: moe is NULL");
    *out = NULL;
    moea2a_moe_t moe = calloc(1, sizeof(*moe));
    if (!moe) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    moea2a_result_t r = m2a_moe_build(moe, comm, config);
    if (r != MOEA2A_SUCCESS) {
        free(moe);
        return r;
    }
    *out = moe;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_status(moea2a_moe_t moe)
{
    M2A_CHECK_ARG(NULL, moe, "moea2a_moe_status: moe is NULL");
    M2A_TRY(m2a_moe_usable(moe, "moea2a_moe_status"));
    M2A_TRY(moe->backend->status ? moe->backend->status(moe) : MOEA2A_SUCCESS);
    return m2a_comm_check_peers(moe->comm, "moea2a_moe_status");
}

moea2a_result_t moea2a_moe_max_recv_rows(moea2a_moe_t moe, size_t *rows)
{
    M2A_CHECK_ARG(NULL, moe && rows, "moea2a_moe_max_recv_rows: moe and rows must not be NULL");
    M2A_TRY(m2a_moe_usable(moe, "moea2a_moe_max_recv_rows"));
    *rows = m2a_moe_expert_major(moe) ? moe->l.ex_rows : (size_t)moe->comm->nranks * (size_t)moe->cfg.max_tokens_per_rank;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_moe_combine_buffer(moea2a_moe_t moe, void **buffer)
{
    M2A_CHECK_ARG(NULL, moe && buffer, "moea2a_moe_combine_buffer: moe and buffer must not be NULL");
    M2A_TRY(m2a_moe_usable(moe, "moea2a_moe_combine_buffer"));
    M2A_CHECK_ARG(moe->comm, moe->cfg.hidden > 0, "moea2a_moe_combine_buffer: the context was created with hidden=0");
    *buffer = moe->ws + (m2a_moe_expert_major(moe) ? moe->l.ex_combine : moe->l.combine);
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

/* The result struct grows at its end: a caller built against a header up to the
 * first one with internode_rows gets the fields its size covers. */
static moea2a_result_t check_result_arg(moea2a_comm_t comm, const char *fn, const moea2a_dispatch_result_t *result)
{
    M2A_CHECK_ARG(comm, result && result->size >= offsetof(moea2a_dispatch_result_t, internode_rows),
                  "%s: result is NULL or its size is not set (use MOEA2A_DISPATCH_RESULT_INITIALIZER)", fn);
    return MOEA2A_SUCCESS;
}

/* Whether a caller's pointer is in the context's kind of memory. */
static int in_context_memory(const moea2a_moe_t moe, const void *ptr)
{
    return m2a_memtype(ptr) == (moe->cuda ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST);
}

/* Whether ptr may be read as elements of dtype: a GPU faults on an element at an
 * address that is not a multiple of its size (and C may not read one there). */
static int elem_aligned(const void *ptr, moea2a_datatype_t dtype)
{
    size_t es = 1;
    (void)moea2a_datatype_size(dtype, &es);
    return (uintptr_t)ptr % es == 0;
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
    M2A_CHECK_ARG(comm, elem_aligned(ids, MOEA2A_INT32) && elem_aligned(weights, MOEA2A_FLOAT32),
                  "%s: topk_ids and topk_weights must be 4-byte aligned (int32 and float elements)", fn);
    M2A_CHECK_ARG(comm, payloads || c->num_payloads == 0, "%s: payloads is NULL with %d payloads configured", fn,
                  c->num_payloads);
    for (int i = 0; i < c->num_payloads; i++) {
        M2A_CHECK_ARG(comm, payloads[i], "%s: payloads[%d] is NULL", fn, i);
        /* rows sent as they are move as bytes; quantizing reads elements, and the
         * quantize kernels whole 16-byte vectors */
        if (c->wire[i].format == MOEA2A_WIRE_AS_IS) continue;
        const int aligned = moe->cuda ? (uintptr_t)payloads[i] % 16 == 0 : elem_aligned(payloads[i], c->payloads[i].dtype);
        M2A_CHECK_ARG(comm, aligned, "%s: payloads[%d] (quantized on dispatch) must be %s-aligned", fn, i,
                      moe->cuda ? "16-byte" : "element");
    }
    const void *ptrs[2] = {ids, weights};
    for (int i = 0; i < 2 + c->num_payloads; i++) {
        const void *ptr = i < 2 ? ptrs[i] : payloads[i - 2];
        M2A_CHECK_ARG(comm, !ptr || in_context_memory(moe, ptr),
                      "%s: an input is in %s memory but the context was created for %s memory", fn,
                      moe->cuda ? "host" : "CUDA", moe->cuda ? "CUDA" : "host");
    }
    return MOEA2A_SUCCESS;
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

/* The checks every dispatch and combine entry point makes first. A combine needs a
 * context with one (every rank has the same config: this needs no agreement). */
static moea2a_result_t enter(moea2a_moe_t moe, const char *fn, m2a_moe_step_t want, int combine)
{
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_TRY(m2a_moe_usable(moe, fn));
    M2A_TRY(m2a_comm_check(moe->comm, fn));
    /* On CUDA memory a call would enqueue device work that waits on the dead rank (NCCL's
     * group launch itself may then block past the watcher's reach): it does not start. */
    if (moe->cuda) M2A_TRY(m2a_comm_check_peers(moe->comm, fn));
    if (combine && !moe->cfg.hidden)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT,
                         "%s: the context was created with hidden=0 (dispatch only): it has no combine", fn);
    return expect_step(moe, fn, want);
}


/* A call on a stream being captured into a CUDA graph, where the backend's calls wait
 * on the host: refused before anything is enqueued. The send halves carry it to the
 * peers as this rank's check result, so every rank fails at once, and the context takes
 * the same call outside the capture. */
static moea2a_result_t check_capture(moea2a_moe_t moe, const char *fn, void *stream)
{
    if (!moe->backend->capturing || !moe->backend->not_capturable) return MOEA2A_SUCCESS;
    int capturing = 0;
    M2A_TRY(moe->backend->capturing(moe, stream, &capturing));
    if (!capturing) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE, "%s: the stream is being captured: %s", fn,
                     moe->backend->not_capturable);
}

/* The dispatch's inputs for the backend: the receive stride resolved. */
static m2a_dispatch_args_t dispatch_args(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                         const void *const *payloads, int runtime_max)
{
    m2a_dispatch_args_t a = {n, runtime_max > 0 ? runtime_max : moe->cfg.max_tokens_per_rank, ids, weights, payloads};
    return a;
}

moea2a_result_t moea2a_dispatch(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                const void *const *payloads, int runtime_max, moea2a_dispatch_result_t *result,
                                void *stream)
{
    static const char fn[] = "moea2a_dispatch";
    M2A_TRY(enter(moe, fn, M2A_MOE_IDLE, 0));
    M2A_TRY(m2a_moe_expert_check_stream(moe, fn, stream)); /* local: nothing has started */
    /* Every check, result's included, travels to the peers: a rejected call fails everywhere. */
    moea2a_result_t mine = check_result_arg(moe->comm, fn, result);
    if (mine == MOEA2A_SUCCESS) mine = check_dispatch_args(moe, fn, n, ids, weights, payloads, runtime_max);
    if (mine == MOEA2A_SUCCESS) mine = check_capture(moe, fn, stream);
    const m2a_dispatch_args_t a = dispatch_args(moe, n, ids, weights, payloads, runtime_max);
    M2A_TRY(moe->backend->dispatch(moe, mine, &a, result, M2A_MOE_BOTH, stream));
    M2A_TRY(m2a_moe_count_load(moe, stream));
    if (m2a_moe_expert_major(moe)) M2A_TRY(m2a_moe_expert_dispatch(moe, result, stream)); /* a failure leaves it idle */
    moe->step = M2A_MOE_DISPATCHED;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_dispatch_send(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                     const void *const *payloads, int runtime_max, void *stream)
{
    static const char fn[] = "moea2a_dispatch_send";
    M2A_TRY(enter(moe, fn, M2A_MOE_IDLE, 0));
    M2A_TRY(m2a_moe_expert_check_stream(moe, fn, stream)); /* local: nothing has started */
    moea2a_result_t mine = check_dispatch_args(moe, fn, n, ids, weights, payloads, runtime_max);
    if (mine == MOEA2A_SUCCESS) mine = check_capture(moe, fn, stream);
    const m2a_dispatch_args_t a = dispatch_args(moe, n, ids, weights, payloads, runtime_max);
    M2A_TRY(moe->backend->dispatch(moe, mine, &a, NULL, M2A_MOE_SEND, stream));
    moe->step = M2A_MOE_DISPATCH_SENT;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_dispatch_recv(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream)
{
    static const char fn[] = "moea2a_dispatch_recv";
    M2A_TRY(enter(moe, fn, M2A_MOE_DISPATCH_SENT, 0));
    M2A_TRY(m2a_moe_expert_check_stream(moe, fn, stream)); /* local: nothing has started */
    /* local: a rejected receive leaves the dispatch pending (call it again) */
    M2A_TRY(check_result_arg(moe->comm, fn, result));
    M2A_TRY(check_capture(moe, fn, stream));
    M2A_TRY(moe->backend->dispatch(moe, MOEA2A_SUCCESS, NULL, result, M2A_MOE_RECV, stream));
    M2A_TRY(m2a_moe_count_load(moe, stream));
    if (m2a_moe_expert_major(moe)) {
        moea2a_result_t r = m2a_moe_expert_dispatch(moe, result, stream);
        if (r != MOEA2A_SUCCESS) { /* on every rank: this dispatch is over, the next may come */
            moe->step = M2A_MOE_IDLE;
            return r;
        }
    }
    moe->step = M2A_MOE_DISPATCHED;
    return MOEA2A_SUCCESS;
}

/* ---- combine ------------------------------------------------------------------- */

static moea2a_result_t check_combine_in(moea2a_moe_t moe, const char *fn, const void *expert_out)
{
    if (expert_out && !in_context_memory(moe, expert_out))
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT,
                         "%s: expert_out must be in %s memory, like the context", fn, moe->cuda ? "CUDA" : "host");
    if (!elem_aligned(expert_out, moe->cfg.combine_dtype))
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: expert_out must be aligned to its elements (%s)",
                         fn, moea2a_datatype_name(moe->cfg.combine_dtype));
    return MOEA2A_SUCCESS;
}

static moea2a_result_t check_combine_out(moea2a_moe_t moe, const char *fn, const void *out)
{
    if (!out && moe->num_tokens > 0)
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: out is NULL with %d tokens", fn, moe->num_tokens);
    if (out && !in_context_memory(moe, out))
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: out must be in %s memory, like the context", fn,
                         moe->cuda ? "CUDA" : "host");
    if (!elem_aligned(out, moe->cfg.combine_dtype))
        return m2a_error(moe->comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: out must be aligned to its elements (%s)", fn,
                         moea2a_datatype_name(moe->cfg.combine_dtype));
    return MOEA2A_SUCCESS;
}

/* A combine's send side, in both forms: the checks after mine (this rank's so far),
 * then, in the expert-major layout, the expert rows folded into the rank-major rows the
 * backend sends (the combine buffer). Every check travels to the peers. */
static moea2a_result_t combine_sent(moea2a_moe_t moe, const char *fn, moea2a_result_t mine, const void *expert_out,
                                    void *out, int phases, void *stream)
{
    if (mine == MOEA2A_SUCCESS) mine = check_combine_in(moe, fn, expert_out);
    if (mine == MOEA2A_SUCCESS) mine = check_capture(moe, fn, stream);
    if (mine == MOEA2A_SUCCESS && m2a_moe_expert_major(moe))
        mine = m2a_moe_expert_combine(moe, expert_out, stream), expert_out = NULL;
    return moe->backend->combine(moe, mine, expert_out, out, phases, stream);
}

moea2a_result_t moea2a_combine(moea2a_moe_t moe, const void *expert_out, void *out, void *stream)
{
    static const char fn[] = "moea2a_combine";
    M2A_TRY(enter(moe, fn, M2A_MOE_DISPATCHED, 1));
    M2A_TRY(combine_sent(moe, fn, check_combine_out(moe, fn, out), expert_out, out, M2A_MOE_BOTH, stream));
    moe->step = M2A_MOE_IDLE;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_combine_send(moea2a_moe_t moe, const void *expert_out, void *stream)
{
    static const char fn[] = "moea2a_combine_send";
    M2A_TRY(enter(moe, fn, M2A_MOE_DISPATCHED, 1));
    M2A_TRY(combine_sent(moe, fn, MOEA2A_SUCCESS, expert_out, NULL, M2A_MOE_SEND, stream));
    moe->step = M2A_MOE_COMBINE_SENT;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_combine_recv(moea2a_moe_t moe, void *out, void *stream)
{
    static const char fn[] = "moea2a_combine_recv";
    M2A_TRY(enter(moe, fn, M2A_MOE_COMBINE_SENT, 1));
    /* local: a rejected receive leaves the combine pending (call it again); the peers'
     * rows it reads stay put until this rank's next dispatch */
    M2A_TRY(check_combine_out(moe, fn, out));
    M2A_TRY(check_capture(moe, fn, stream));
    M2A_TRY(moe->backend->combine(moe, MOEA2A_SUCCESS, NULL, out, M2A_MOE_RECV, stream));
    moe->step = M2A_MOE_IDLE;
    return MOEA2A_SUCCESS;
}

/* ---- placement in place ---------------------------------------------------------- */

/* A placement changes with no dispatch pending; in CUDA memory the backend rewrites
 * the device's tables on the stream (every CUDA path has the hook). */
static moea2a_result_t change_allowed(moea2a_moe_t moe, const char *fn)
{
    M2A_TRY(m2a_moe_usable(moe, fn));
    M2A_TRY(expect_step(moe, fn, M2A_MOE_IDLE));
    if (!moe->cuda || moe->backend->placement) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE, "%s: this context's path (%s) cannot change its placement "
                     "in place", fn, moe->backend->name);
}

/* A general placement (replicas, or experts no rank holds) on CUDA memory: only where the
 * context was made for it, since its kernels are the general rule's (what names the
 * refused entry: why). */
static moea2a_result_t general_allowed(moea2a_moe_t moe, const char *fn, const char *why)
{
    if (!moe->cuda || (moe->cfg.flags & MOEA2A_MOE_GENERAL_PLACEMENT)) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_UNAVAILABLE, "%s: %s: a context in CUDA memory takes replicas and experts "
                     "no rank holds where it was created with MOEA2A_MOE_GENERAL_PLACEMENT (its kernels then route by "
                     "the general rule; without it they keep the one-holder kernels)", fn, why);
}

/* This rank's verdict on a new map: the state, the memory, every entry a rank, no rank
 * over the bound. */
static moea2a_result_t placement_ok(moea2a_moe_t moe, const char *fn, const int32_t *map)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, E = moe->cfg.num_experts;
    M2A_TRY(change_allowed(moe, fn));
    M2A_CHECK_ARG(comm, map, "%s: expert_to_rank is NULL", fn);
    int *held = calloc((size_t)ep, sizeof(int));
    if (!held) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int e = 0; e < E && r == MOEA2A_SUCCESS; e++) {
        if (map[e] < -1 || map[e] >= ep)
            r = m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                          "%s: expert_to_rank[%d]=%d is neither a rank (0..%d) nor -1 (held by no rank)", fn, e, map[e],
                          ep - 1);
        else if (map[e] >= 0 && ++held[map[e]] > moe->max_local)
            r = m2a_error(comm, MOEA2A_ERR_CAPACITY, "%s: the map gives rank %d more than %d experts, the most a rank "
                          "of this context may hold (max_local_experts at create)", fn, map[e], moe->max_local);
        else if (map[e] < 0) {
            char why[48];
            snprintf(why, sizeof(why), "expert_to_rank[%d]=-1", e);
            r = general_allowed(moe, fn, why);
        }
    }
    free(held);
    return r;
}

/* Every rank's verdict (mine) and the hash of what it passed, so that all apply the
 * same change or none: a failure anywhere fails every rank, naming it; a rank that
 * passed something else is MOEA2A_ERR_MISMATCH. Gathered over the communicator's
 * host transport where it has one: all ranks' words in one round of messages (UCX
 * over shared memory: a few microseconds), where the bootstrap's ring takes a
 * message's latency per rank (its socket's); the bootstrap otherwise. */
static moea2a_result_t agree_change(moea2a_moe_t moe, const char *fn, moea2a_result_t mine, uint64_t h)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks;
    int32_t *all = calloc((size_t)ep * 3, sizeof(int32_t));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    int32_t *me = all + 3 * (size_t)comm->rank;
    me[0] = mine, me[1] = (int32_t)(uint32_t)h, me[2] = (int32_t)(uint32_t)(h >> 32);
    const int32_t words[3] = {me[0], me[1], me[2]};
    moea2a_result_t r = m2a_transport_for(comm, MOEA2A_MEM_HOST)
                            ? m2a_allgather(fn, words, all, 3, MOEA2A_INT32, comm, NULL)
                            : m2a_comm_allgather(comm, all, 3 * sizeof(int32_t));
    int failed = 0;
    for (int q = 0; r == MOEA2A_SUCCESS && q < ep; q++) failed |= all[3 * q] != MOEA2A_SUCCESS;
    if (r == MOEA2A_SUCCESS && failed) r = m2a_comm_tell_failures(comm, fn, mine, all, 3);
    for (int q = 0; r == MOEA2A_SUCCESS && q < ep; q++)
        if (all[3 * q + 1] != me[1] || all[3 * q + 2] != me[2])
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH, "%s: rank %d passed another map; every rank must pass the same",
                          fn, q);
    free(all);
    return r == MOEA2A_SUCCESS || !m2a_peer_lost(r) ? r : m2a_comm_fail(comm, r);
}

static uint64_t hash_words(uint64_t h, const int32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)v[i]) * 1099511628211ULL;
    return h;
}

moea2a_result_t moea2a_moe_set_placement(moea2a_moe_t moe, const int32_t *expert_to_rank, void *stream)
{
    static const char fn[] = "moea2a_moe_set_placement";
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_TRY(m2a_comm_check(moe->comm, fn));
    const int E = moe->cfg.num_experts;
    moea2a_result_t mine = placement_ok(moe, fn, expert_to_rank);
    const uint64_t h = mine == MOEA2A_SUCCESS ? hash_words(1469598103934665603ULL, expert_to_rank, (size_t)E) : 0;
    M2A_TRY(agree_change(moe, fn, mine, h));
    memcpy(moe->h_owner, expert_to_rank, sizeof(int32_t) * (size_t)E);
    free(moe->h_holders), free(moe->h_nrep); /* one holder per expert again */
    moe->h_holders = moe->h_nrep = NULL, moe->max_rep = 0;
    moe->cfg.placement = MOEA2A_PLACEMENT_MAP, moe->cfg.expert_to_rank = moe->h_owner;
    m2a_moe_set_route(moe);
    return moe->backend->placement ? moe->backend->placement(moe, stream) : MOEA2A_SUCCESS;
}

/* This rank's verdict on a replicated placement: the state and memory as for a map;
 * each expert's holders ranks, none twice, -1 only after the last; no rank over the
 * bound. */
static moea2a_result_t replicas_ok(moea2a_moe_t moe, const char *fn, int R, const int32_t *holders)
{
    moea2a_comm_t comm = moe->comm;
    const int ep = comm->nranks, E = moe->cfg.num_experts;
    M2A_TRY(change_allowed(moe, fn));
    M2A_CHECK_ARG(comm, holders, "%s: holders is NULL", fn);
    M2A_CHECK_ARG(comm, R >= 1 && R <= ep, "%s: max_replicas=%d must be in 1..%d (the ranks)", fn, R, ep);
    int *held = calloc((size_t)ep, sizeof(int));
    if (!held) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int e = 0; e < E && r == MOEA2A_SUCCESS; e++) {
        int n = 0; /* expert e's holders */
        for (int j = 0, ended = 0; j < R && r == MOEA2A_SUCCESS; j++) {
            const int q = holders[(size_t)e * R + j];
            int twice = 0;
            for (int p = 0; p < j; p++) twice |= q >= 0 && holders[(size_t)e * R + p] == q;
            if (q < -1 || q >= ep || (ended && q != -1) || twice)
                r = m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                              "%s: holders[%d][%d]=%d: expert %d's holders must be distinct ranks (0..%d), -1 after "
                              "the last", fn, e, j, q, e, ep - 1);
            else if (q < 0)
                ended = 1;
            else if (n++, ++held[q] > moe->max_local) /* one more holder of e, and of an expert for q */
                r = m2a_error(comm, MOEA2A_ERR_CAPACITY, "%s: the replicas give rank %d more than %d experts, the most "
                              "a rank of this context may hold (max_local_experts at create)", fn, q, moe->max_local);
        }
        if (r == MOEA2A_SUCCESS && n != 1) {
            char why[64];
            snprintf(why, sizeof(why), "expert %d has %d holders", e, n);
            r = general_allowed(moe, fn, why);
        }
    }
    free(held);
    return r;
}

moea2a_result_t moea2a_moe_set_replicas(moea2a_moe_t moe, int max_replicas, const int32_t *holders, void *stream)
{
    static const char fn[] = "moea2a_moe_set_replicas";
    M2A_CHECK_ARG(NULL, moe, "%s: moe is NULL", fn);
    M2A_TRY(m2a_comm_check(moe->comm, fn));
    const int E = moe->cfg.num_experts, R = max_replicas;
    moea2a_result_t mine = replicas_ok(moe, fn, R, holders);
    int32_t *hold = NULL, *nrep = NULL; /* made before the agreement: a rank out of memory fails them all */
    if (mine == MOEA2A_SUCCESS) {
        hold = malloc(sizeof(int32_t) * (size_t)E * (size_t)R), nrep = malloc(sizeof(int32_t) * (size_t)E);
        if (!hold || !nrep) mine = m2a_error(moe->comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    uint64_t h = 0;
    if (mine == MOEA2A_SUCCESS) h = hash_words(hash_words(1469598103934665603ULL, &R, 1), holders, (size_t)E * R);
    moea2a_result_t r = agree_change(moe, fn, mine, h);
    if (r != MOEA2A_SUCCESS) {
        free(hold), free(nrep);
        return r;
    }
    memcpy(hold, holders, sizeof(int32_t) * (size_t)E * (size_t)R);
    for (int e = 0; e < E; e++) {
        int n = 0;
        while (n < R && hold[(size_t)e * R + n] >= 0) n++;
        nrep[e] = n, moe->h_owner[e] = n ? hold[(size_t)e * R] : -1; /* the first holder stands for the map */
    }
    free(moe->h_holders), free(moe->h_nrep);
    moe->h_holders = hold, moe->h_nrep = nrep, moe->max_rep = R;
    moe->cfg.placement = MOEA2A_PLACEMENT_MAP, moe->cfg.expert_to_rank = moe->h_owner;
    m2a_moe_set_route(moe);
    return moe->backend->placement ? moe->backend->placement(moe, stream) : MOEA2A_SUCCESS;
}

/* The MoE layer's core: the context (struct moea2a_moe) that the public calls
 * (moe.c), the expert-major pass (expert.c) and the backends (moe/backend/) share, and
 * what every backend uses of the layer (core.c): agreement among the ranks, the expert
 * -> rank table, the dispatch result, the phase tracing of the host-driven paths. It
 * calls no backend. Host contexts keep everything in host memory; CUDA contexts keep
 * the workspace and staging on the device and mirror in pinned host memory what the
 * host logic reads (counts, headers). */
#ifndef M2A_MOE_CORE_H
#define M2A_MOE_CORE_H
#include "comm/comm.h"
#include "moe/layout.h"

struct m2a_moe_backend;

/* The cycle of a context: dispatch (send, receive) then combine (send, receive). The
 * one-call forms take two steps at once. */
typedef enum {
    M2A_MOE_IDLE = 0,       /* ready for a dispatch */
    M2A_MOE_DISPATCH_SENT,  /* moea2a_dispatch_send done: moea2a_dispatch_recv next */
    M2A_MOE_DISPATCHED,     /* results delivered: a combine next */
    M2A_MOE_COMBINE_SENT    /* moea2a_combine_send done: moea2a_combine_recv next */
} m2a_moe_step_t;

struct moea2a_moe {
    moea2a_comm_t comm;
    moea2a_moe_config_t cfg;
    moea2a_moe_config_t given; /* the caller's config as create took it (no map): a retarget makes the context anew from it */
    int leaving; /* release without meeting the communicator's ranks (a retarget: some may be dead or elsewhere) */
    const struct m2a_moe_backend *backend; /* chosen at create */
    void *state;                           /* the backend's own */
    const void *steps;                     /* generic backends: their local steps (backend/generic.h) */
    int cuda, device;
    m2a_route_t route;        /* host view: owner table, sizes */
    m2a_moe_layout_t l;
    unsigned char *ws, *stage;  /* device memory for CUDA contexts */
    unsigned char *pinned;      /* CUDA: host mirror block */
    /* host-readable views (into ws for host contexts, into the mirror for CUDA) */
    int32_t *h_send_counts, *h_recv_counts;
    m2a_moe_header_t *h_hdr_send, *h_hdr_recv;
    int32_t *h_owner;           /* [E], host memory */
    int32_t *h_holders, *h_nrep; /* replicas (moea2a_moe_set_replicas): [E][max_rep], [E]; NULL: none */
    int max_rep;
    int64_t *h_load; /* [E]: host memory, entries taken per expert (moea2a_moe_expert_load) */
    int max_local;              /* the most experts a placement may give a rank (create's bound) */
    int *stage_index;           /* [ep], host memory: staging slot of each peer, -1 direct */
    void *kparams;              /* CUDA: kernel parameters (m2a_kparams_t) */
    int numa;
    /* where the context is in its cycle (a split call's halves are separate steps),
     * and the last dispatch, which combine answers */
    m2a_moe_step_t step;
    int num_tokens, stride;
    int64_t pending_invalid, pending_dedup; /* generic paths: counts between dispatch's halves */
    int64_t pending_dropped; /* host memory: entries naming experts no rank holds (set by the route) */
    int network_own;      /* the backend counts the rows its dispatch sends across nodes ... */
    int64_t network_rows; /* ... here (else they are the flat count, internode_rows) */
    const unsigned char *combine_in;        /* generic paths: the rows combine's send half sent */
};

/* Collective step of create: every rank's result (the first failure wins on every
 * rank, named); with value_min, every rank ends with the smallest *value_min. */
moea2a_result_t m2a_moe_agree(moea2a_comm_t comm, moea2a_result_t mine, int *value_min);
/* Collective: every rank's config checked out (mine) and is the same as this one's;
 * MOEA2A_ERR_MISMATCH naming the first rank that differs. */
moea2a_result_t m2a_moe_agree_config(moea2a_comm_t comm, moea2a_result_t mine, const moea2a_moe_config_t *cfg);

/* Collective over comm: makes the context into moe (zeroed, or emptied by
 * m2a_moe_release) from config, as moea2a_moe_create; on failure nothing stays. */
moea2a_result_t m2a_moe_build(moea2a_moe_t moe, moea2a_comm_t comm, const moea2a_moe_config_t *config);
/* Frees what moe holds (its backend's memory, its tables); moe itself stays. */
void m2a_moe_release(moea2a_moe_t moe);
/* Entry check of the calls on a context: one whose retarget failed holds nothing. */
static inline moea2a_result_t m2a_moe_usable(moea2a_moe_t moe, const char *fn)
{
    if (moe->backend) return MOEA2A_SUCCESS;
    return m2a_error(moe->comm, MOEA2A_ERR_STATE, "%s: the context's retarget failed, so it holds no memory: "
                     "destroy it", fn);
}

/* owner[e]: the rank that holds expert e (the map, or contiguous placement). */
void m2a_moe_owner_table(const moea2a_moe_config_t *c, int ep, int32_t *owner);
/* moe->route from the config and moe->h_owner. */
void m2a_moe_set_route(moea2a_moe_t moe);

/* The result of the last dispatch (moe->stride): the workspace's arrays, and either
 * the exact counts (device_stats NULL: the generic paths, from the host's counts and
 * moe->pending_*) or -1 and the device's copy. */
void m2a_moe_fill_result(moea2a_moe_t moe, const int64_t *device_stats, moea2a_dispatch_result_t *result);

/* ---- phase timing (TRACE only) ---------------------------------------------------
 * With MOEA2A_DEBUG=TRACE and the MOE subsystem, the host-driven paths wait for the
 * stream (wait, when not NULL) at each phase boundary and log how long each phase
 * took. The waits change the timing they measure; they exist to find where time
 * goes, never otherwise. */
typedef struct {
    int on, n;
    double t0, last;
    char text[256];
    void (*wait)(void *stream);
} m2a_phase_t;

void m2a_phase_start(m2a_phase_t *ph, void (*wait)(void *stream), void *stream);
void m2a_phase_mark(m2a_phase_t *ph, void *stream, const char *name);
void m2a_phase_report(const m2a_phase_t *ph, const char *what);
#endif

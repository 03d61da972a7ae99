/* The MoE context, shared by the public calls (moe.c), the core (moe_core.c) and the
 * backends (moe_backend.h). Host contexts keep everything in host memory; CUDA
 * contexts keep the workspace and staging on the device and mirror in pinned host
 * memory what the host logic reads (counts, headers). */
#ifndef M2A_MOE_H
#define M2A_MOE_H
#include "comm.h"
#include "moe_host.h"
#include "moe_layout.h"

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
    const struct m2a_moe_backend *backend; /* chosen at create */
    void *state;                           /* the backend's own (generic backends: their local steps) */
    int cuda, device;
    m2a_route_t route;        /* host view: owner table, sizes */
    m2a_moe_layout_t l;
    unsigned char *ws, *stage;  /* device memory for CUDA contexts */
    unsigned char *pinned;      /* CUDA: host mirror block */
    /* host-readable views (into ws for host contexts, into the mirror for CUDA) */
    int32_t *h_send_counts, *h_recv_counts;
    m2a_moe_header_t *h_hdr_send, *h_hdr_recv;
    int32_t *h_owner;           /* [E], host memory */
    int *stage_index;           /* [ep], host memory: staging slot of each peer, -1 direct */
    void *kparams;              /* CUDA: kernel parameters (m2a_kparams_t) */
    int numa;
    /* where the context is in its cycle (a split call's halves are separate steps),
     * and the last dispatch, which combine answers */
    m2a_moe_step_t step;
    int num_tokens, stride;
    int64_t pending_invalid, pending_dedup; /* generic paths: counts between dispatch's halves */
    const unsigned char *combine_in;        /* generic paths: the rows combine's send half sent */
};
#endif

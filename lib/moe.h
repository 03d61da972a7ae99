/* The MoE context, shared by the orchestration (moe.c) and the CUDA path
 * (moe_cuda.c). Host contexts keep everything in host memory; CUDA contexts keep
 * the workspace and staging on the device and mirror in pinned host memory what the
 * host logic reads (counts, headers) and the tables it needs. */
#ifndef M2A_MOE_H
#define M2A_MOE_H
#include "comm.h"
#include "moe_host.h"
#include "moe_layout.h"

/* The cycle of a context: dispatch (send, receive) then combine (send, receive). The
 * one-call forms take two steps at once. */
typedef enum {
    M2A_MOE_IDLE = 0,       /* ready for a dispatch */
    M2A_MOE_DISPATCH_SENT,  /* moea2a_dispatch_send done: moea2a_dispatch_recv next */
    M2A_MOE_DISPATCHED,     /* results delivered: a combine next */
    M2A_MOE_COMBINE_SENT    /* moea2a_combine_send done: moea2a_combine_recv next */
} m2a_moe_step_t;

/* Which halves one launch or call performs (the kernels' M2A_FAST_* have these values). */
enum { M2A_MOE_SEND = 1, M2A_MOE_RECV = 2, M2A_MOE_BOTH = 3 };

struct moea2a_moe {
    moea2a_comm_t comm;
    moea2a_moe_config_t cfg;
    int cuda, device;
    m2a_route_t route;        /* host view: owner table, sizes */
    m2a_moe_layout_t l;
    unsigned char *ws, *stage;  /* device memory for CUDA contexts */
    unsigned char *pinned;      /* CUDA: host mirror block */
    /* host-readable views (into ws for host contexts, into the mirror for CUDA) */
    int32_t *h_send_counts, *h_recv_counts;
    m2a_moe_header_t *h_hdr_send, *h_hdr_recv;
    int32_t *h_owner;           /* [E] */
    int *stage_index;           /* [ep] host copy: staging slot of each peer, -1 direct */
    void *kparams;              /* CUDA: kernel parameters (m2a_kparams_t) */
    int numa;
    /* where the context is in its cycle (a split call's halves are separate steps),
     * and the last dispatch, which combine answers */
    m2a_moe_step_t step;
    int num_tokens, stride;
    int64_t pending_invalid, pending_dedup; /* generic paths: counts between dispatch's halves */
    const unsigned char *combine_in;        /* generic paths: the rows combine's send half sent */
    void *fast; /* the load/store path's state (moe_fast.c), NULL on the generic paths */
};

/* Collective step of create: every rank's result (the first failure wins on every
 * rank, named); with value_min, every rank ends with the smallest *value_min. */
moea2a_result_t m2a_moe_agree(moea2a_comm_t comm, moea2a_result_t mine, int *value_min);

/* moe_cuda.c; without CUDA these return MOEA2A_ERR_UNAVAILABLE. stream: cudaStream_t. */
moea2a_result_t m2a_moe_cuda_free_memory(moea2a_comm_t comm, size_t *free_bytes);
moea2a_result_t m2a_moe_cuda_alloc(moea2a_moe_t moe);
void m2a_moe_cuda_release(moea2a_moe_t moe);
/* Routes on the device and brings the send counts and stats to the host: the one
 * host synchronization of a dispatch on the generic path, bounded by the timeout. */
moea2a_result_t m2a_moe_cuda_route(moea2a_moe_t moe, int n, const int32_t *ids, void *stream, int64_t *invalid,
                                   int64_t *dedup);
moea2a_result_t m2a_moe_cuda_pack(moea2a_moe_t moe, int n, int stride, const void *const *payloads,
                                  const int32_t *ids, const float *weights, void *stream);
moea2a_result_t m2a_moe_cuda_sanitize(moea2a_moe_t moe, int stride, void *stream);
moea2a_result_t m2a_moe_cuda_combine(moea2a_moe_t moe, const unsigned char *in, void *out, void *stream);
/* Waits for the stream (phase timing only). */
void m2a_moe_cuda_wait(moea2a_moe_t moe, void *stream);

/* moe_fast.c: the load/store (NVLink) path. alloc is collective: it allocates the
 * workspace as symmetric memory and returns MOEA2A_ERR_UNAVAILABLE on every rank
 * when some rank cannot reach the others by load/store. */
moea2a_result_t m2a_moe_fast_alloc(moea2a_moe_t moe);
/* The kernels' parameters, once the kernel tables exist. */
void m2a_moe_fast_params(moea2a_moe_t moe);
void m2a_moe_fast_release(moea2a_moe_t moe);
/* Launches one dispatch; status != MOEA2A_SUCCESS: this rank's checks failed, it
 * tells its peers and sends nothing. */
moea2a_result_t m2a_moe_fast_dispatch(moea2a_moe_t moe, int n, const int32_t *ids, const float *weights,
                                      const void *const *payloads, int stride, moea2a_result_t status, int phases,
                                      void *stream);
/* status != MOEA2A_SUCCESS: this rank's checks failed; its peers' kernels record that
 * error instead of reading its rows. */
moea2a_result_t m2a_moe_fast_combine(moea2a_moe_t moe, const void *expert_out, void *out, moea2a_result_t status,
                                     int phases, void *stream);
/* The context's state: an earlier failure, or an error a kernel recorded. */
moea2a_result_t m2a_moe_fast_status(moea2a_moe_t moe);
/* After a failure the context is unusable; every later call returns r. */
void m2a_moe_fast_poison(moea2a_moe_t moe, moea2a_result_t r);
/* [4] device stats of the last dispatch. */
const int64_t *m2a_moe_fast_stats(moea2a_moe_t moe);
#endif

/*
 * moea2a: expert-parallel all-to-all collectives for mixture-of-experts models.
 *
 * Core API: results and errors, datatypes, the communicator, generic collectives,
 * requests, and the run-time parameter table. See moea2a(7) for the overview,
 * thread safety and the environment variables.
 */
#ifndef MOEA2A_H
#define MOEA2A_H

#include <stddef.h>
#include <stdint.h>

#include "moea2a_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(MOEA2A_NO_VISIBILITY)
#define MOEA2A_API __attribute__((visibility("default")))
#else
#define MOEA2A_API
#endif

/* ---- results --------------------------------------------------------------- */

/* Every call returns one of these. Values are stable across releases. */
typedef enum {
    MOEA2A_SUCCESS = 0,
    MOEA2A_ERR_INVALID_ARGUMENT = 1, /* null pointer, out-of-range value, bad id */
    MOEA2A_ERR_NO_MEMORY = 2,        /* host or device allocation failed */
    MOEA2A_ERR_SYSTEM = 3,           /* an operating-system call failed */
    MOEA2A_ERR_TIMEOUT = 4,          /* a peer did not answer within MOEA2A_TIMEOUT_S */
    MOEA2A_ERR_PEER_FAILED = 5,      /* a peer closed its connection or died */
    MOEA2A_ERR_MISMATCH = 6,         /* ranks passed disagreeing arguments */
    MOEA2A_ERR_UNAVAILABLE = 7,      /* transport or feature not available */
    MOEA2A_ERR_TRANSPORT = 8,        /* the transport reported an error */
    MOEA2A_ERR_CAPACITY = 9,         /* a size exceeds what was configured */
    MOEA2A_ERR_STATE = 10,           /* call out of order (e.g. dispatch twice) */
    MOEA2A_ERR_CUDA = 11,            /* a CUDA call failed */
    MOEA2A_ERR_ABORTED = 12,         /* the communicator was aborted or is broken */
    MOEA2A_ERR_INTERNAL = 13         /* a bug in moea2a: please report it */
} moea2a_result_t;

/* Short name of a result ("MOEA2A_ERR_TIMEOUT: ..."); never NULL. */
MOEA2A_API const char *moea2a_strerror(moea2a_result_t result);

/* ---- version and build --------------------------------------------------- */

/* The version of the library actually loaded (compare with MOEA2A_VERSION_*). */
MOEA2A_API moea2a_result_t moea2a_get_version(int *major, int *minor, int *patch);
/* One line describing the build: CUDA, NCCL, UCX, hwloc, MPI, transports. */
MOEA2A_API const char *moea2a_get_build_config(void);

/* ---- datatypes --------------------------------------------------------------- */

typedef enum {
    MOEA2A_INT8 = 0,
    MOEA2A_UINT8 = 1,
    MOEA2A_INT32 = 2,
    MOEA2A_INT64 = 3,
    MOEA2A_FLOAT16 = 4,
    MOEA2A_BFLOAT16 = 5,
    MOEA2A_FLOAT32 = 6,
    MOEA2A_FLOAT8_E4M3 = 7,
    MOEA2A_NVFP4 = 8, /* packed E2M1 pairs: one element = one byte = two values */
    MOEA2A_NUM_DATATYPES
} moea2a_datatype_t;

/* Bytes per element of dtype (MOEA2A_NVFP4: 1, a packed pair). */
MOEA2A_API moea2a_result_t moea2a_datatype_size(moea2a_datatype_t dtype, size_t *size);
/* "bf16", "fp32", ...; NULL for an unknown dtype. */
MOEA2A_API const char *moea2a_datatype_name(moea2a_datatype_t dtype);

/* ---- communicator ----------------------------------------------------------- */

typedef struct moea2a_comm *moea2a_comm_t;
typedef struct moea2a_request *moea2a_request_t;

#define MOEA2A_UNIQUE_ID_BYTES 128
/* Opaque rendezvous token: made by one process, handed to every rank. */
typedef struct {
    char internal[MOEA2A_UNIQUE_ID_BYTES];
} moea2a_unique_id_t;

/* Communicator options. Always start from MOEA2A_CONFIG_INITIALIZER: the size and
 * version fields let later releases add fields without breaking this ABI. */
typedef struct {
    size_t size;           /* sizeof(moea2a_config_t) as compiled by the caller */
    unsigned int version;  /* MOEA2A_VERSION_CODE as compiled by the caller */
    double timeout_s;      /* bound on every wait for a peer, seconds; < 0: MOEA2A_TIMEOUT_S;
                              0, NaN and infinities are MOEA2A_ERR_INVALID_ARGUMENT */
    const char *transport; /* transport list as in MOEA2A_TRANSPORT; NULL: that variable */
    int cuda_device;       /* device for CUDA work; -1: the caller's current device */
} moea2a_config_t;

/* The *_INITIALIZER macros: every field named is set, the rest zero. In C they are
 * designated initializers; in C++ (before C++20 has them) calls of inline functions
 * that value-initialize the struct and set the same fields. Both compile clean under
 * -Wall -Wextra (-Wmissing-field-initializers) and keep working as structs grow.
 * The functions live in namespace moea2a_detail and names ending in _ are this
 * header's own helpers: neither is part of the API. */
#ifdef __cplusplus
#define MOEA2A_INIT_FN_(type, fn, sets) \
    namespace moea2a_detail { static inline type fn() { type v_ = type(); sets; return v_; } }
#define MOEA2A_SIZE_VERSION_(type) v_.size = sizeof(type), v_.version = MOEA2A_VERSION_CODE
#endif

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_config_t, config_initializer,
                (MOEA2A_SIZE_VERSION_(moea2a_config_t), v_.timeout_s = -1.0, v_.cuda_device = -1))
#define MOEA2A_CONFIG_INITIALIZER moea2a_detail::config_initializer()
#else
#define MOEA2A_CONFIG_INITIALIZER \
    { .size = sizeof(moea2a_config_t), .version = MOEA2A_VERSION_CODE, .timeout_s = -1.0, .transport = NULL, \
      .cuda_device = -1 }
#endif

/* Makes a new unique id and starts the rendezvous service for it in this process
 * (a background thread that lives until every rank has joined or the timeout). The
 * id holds a random key that admits ranks (moea2a(7), SECURITY): keep it private. */
MOEA2A_API moea2a_result_t moea2a_get_unique_id(moea2a_unique_id_t *id);

/* Collective over nranks processes: each calls it with the same id and nranks and
 * its own rank. Bounded by the timeout; config may be NULL for the defaults. */
MOEA2A_API moea2a_result_t moea2a_comm_init_rank(moea2a_comm_t *comm, int nranks,
                                                 moea2a_unique_id_t id, int rank,
                                                 const moea2a_config_t *config);

/* Like moea2a_comm_init_rank, with rank, size and rendezvous address read from the
 * environment: MOEA2A_RANK / MOEA2A_NRANKS / MOEA2A_ROOT_ADDR, else the variables
 * Open MPI (OMPI_COMM_WORLD_*), PMIx (PMIX_RANK) and Slurm (SLURM_PROCID, ...) set. */
MOEA2A_API moea2a_result_t moea2a_comm_init_env(moea2a_comm_t *comm,
                                                const moea2a_config_t *config);

/* Collective over the ranks of a caller's NCCL communicator (an ncclComm_t passed as
 * void *, so this header needs no NCCL): moea2a takes rank and size from it, uses it
 * to hand out its rendezvous id, and adopts it for CUDA memory instead of creating
 * another. The caller keeps ownership: destroy the moea2a communicator first. */
MOEA2A_API moea2a_result_t moea2a_comm_init_nccl(moea2a_comm_t *comm, void *nccl_comm,
                                                 const moea2a_config_t *config);

/* Frees the communicator. Collective when healthy (peers are flushed first); after
 * an error or abort it only releases local resources. */
MOEA2A_API moea2a_result_t moea2a_comm_destroy(moea2a_comm_t comm);
/* Marks the communicator broken: every pending and later call on it returns
 * MOEA2A_ERR_ABORTED, and transports that can (NCCL) end their device work at once
 * (ncclCommRevoke where NCCL has it, which keeps the communicator's memory mapped
 * until destroy and its connections for moea2a_comm_shrink; else ncclCommAbort); local
 * resources are freed by moea2a_comm_destroy. */
MOEA2A_API moea2a_result_t moea2a_comm_abort(moea2a_comm_t comm);
/* Collective over the survivors: a new communicator of the ranks of comm that are
 * neither in exclude[nexclude] nor seen dead by the peer watcher, renumbered in rank
 * order, linked over the bootstrap listeners they have (no unique id, no rendezvous),
 * its transports made from comm's where they can (ncclCommShrink; UCX's endpoints when
 * no rank died), else set up anew; comm stays, to be destroyed. Every survivor must
 * pass the same exclude list; moea2a_comm(3), "Shrinking". */
MOEA2A_API moea2a_result_t moea2a_comm_shrink(moea2a_comm_t comm, const int *exclude, int nexclude,
                                              moea2a_comm_t *newcomm);
/* Collective over comm's ranks and nranks - size(comm) new processes: a new
 * communicator of nranks ranks, comm's among them (comm stays, to be destroyed). Each
 * rank of comm passes its rank in the new communicator (-1: the one it has), distinct
 * ones; the new processes take the rest by moea2a_comm_init_rank(nranks, the id, their
 * rank). id: on comm's rank 0, one it made with moea2a_get_unique_id and handed to the
 * new processes (the others' is written with it). moea2a_comm(3), "Growing". */
MOEA2A_API moea2a_result_t moea2a_comm_grow(moea2a_comm_t comm, int nranks, moea2a_unique_id_t *id, int rank,
                                            moea2a_comm_t *newcomm);
MOEA2A_API moea2a_result_t moea2a_comm_rank(moea2a_comm_t comm, int *rank);
MOEA2A_API moea2a_result_t moea2a_comm_size(moea2a_comm_t comm, int *size);
/* This rank's node: ranks on one host form a node, or with MOEA2A_NODE_SIZE=N (the
 * same on every rank) N consecutive ranks of a host (emulated nodes). Nodes are
 * numbered by their lowest rank; local_rank counts within the node in rank order. Any
 * output may be NULL. */
MOEA2A_API moea2a_result_t moea2a_comm_node(moea2a_comm_t comm, int *node, int *num_nodes, int *local_rank,
                                            int *local_size);

/* The bytes this rank has handed its transports to send by all-to-all since the
 * communicator was created (moea2a_alltoallv, moea2a_ialltoallv and the MoE calls' moves,
 * their headers included), by memory and by whether the receiving peer shares this
 * rank's node (moea2a_comm_node). A rank's block to itself, copied locally, and the other
 * collectives are not counted. Start from MOEA2A_COMM_TRAFFIC_INITIALIZER (size,
 * version); later versions append fields. */
typedef struct {
    size_t size;
    unsigned version;
    int64_t host_same_node, host_other_nodes; /* host memory (the host transport) */
    int64_t cuda_same_node, cuda_other_nodes; /* CUDA memory (the CUDA transport: NCCL) */
} moea2a_comm_traffic_t;

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_comm_traffic_t, comm_traffic_initializer, MOEA2A_SIZE_VERSION_(moea2a_comm_traffic_t))
#define MOEA2A_COMM_TRAFFIC_INITIALIZER moea2a_detail::comm_traffic_initializer()
#else
#define MOEA2A_COMM_TRAFFIC_INITIALIZER { .size = sizeof(moea2a_comm_traffic_t), .version = MOEA2A_VERSION_CODE }
#endif

MOEA2A_API moea2a_result_t moea2a_comm_traffic(moea2a_comm_t comm, moea2a_comm_traffic_t *traffic);

/* The detailed message of the last failed call on comm, or, with comm == NULL, of
 * the calling thread's last failed call (e.g. an init that made no communicator).
 * Never NULL; "" if nothing failed. */
MOEA2A_API const char *moea2a_last_error(moea2a_comm_t comm);

/* ---- generic collectives -------------------------------------------------------
 * MPI's argument order; counts and displacements are in elements of dtype.
 * Host memory: complete on return, stream ignored. CUDA memory: ordered on stream
 * (a cudaStream_t, NULL = the default stream). Every rank calls the same
 * collectives in the same order. */

MOEA2A_API moea2a_result_t moea2a_alltoallv(const void *sendbuf, const int64_t *sendcounts,
                                            const int64_t *sdispls, void *recvbuf,
                                            const int64_t *recvcounts, const int64_t *rdispls,
                                            moea2a_datatype_t dtype, moea2a_comm_t comm,
                                            void *stream);
MOEA2A_API moea2a_result_t moea2a_allgather(const void *sendbuf, void *recvbuf, size_t count,
                                            moea2a_datatype_t dtype, moea2a_comm_t comm,
                                            void *stream);
MOEA2A_API moea2a_result_t moea2a_bcast(void *buf, size_t count, moea2a_datatype_t dtype,
                                        int root, moea2a_comm_t comm, void *stream);
MOEA2A_API moea2a_result_t moea2a_barrier(moea2a_comm_t comm);

/* Non-blocking variants: start the operation and return a request that
 * moea2a_test / moea2a_wait complete. Buffers must stay untouched until then. */
MOEA2A_API moea2a_result_t moea2a_ialltoallv(const void *sendbuf, const int64_t *sendcounts,
                                             const int64_t *sdispls, void *recvbuf,
                                             const int64_t *recvcounts, const int64_t *rdispls,
                                             moea2a_datatype_t dtype, moea2a_comm_t comm,
                                             void *stream, moea2a_request_t *request);
MOEA2A_API moea2a_result_t moea2a_iallgather(const void *sendbuf, void *recvbuf, size_t count,
                                             moea2a_datatype_t dtype, moea2a_comm_t comm,
                                             void *stream, moea2a_request_t *request);
MOEA2A_API moea2a_result_t moea2a_ibcast(void *buf, size_t count, moea2a_datatype_t dtype,
                                         int root, moea2a_comm_t comm, void *stream,
                                         moea2a_request_t *request);
MOEA2A_API moea2a_result_t moea2a_ibarrier(moea2a_comm_t comm, moea2a_request_t *request);

/* Progresses the request; *done = 1 when it finished, and then the request is freed
 * and set to NULL. A request that failed is freed too, and the error returned. */
MOEA2A_API moea2a_result_t moea2a_test(moea2a_request_t *request, int *done);
/* Waits (bounded by the communicator's timeout) for the request, frees it, sets it
 * to NULL. */
MOEA2A_API moea2a_result_t moea2a_wait(moea2a_request_t *request);

/* ---- MoE collectives: dispatch, sanitize, combine --------------------------------
 * See moea2a_moe(3). Terms: ep = ranks of the communicator, E = experts, k = top-k,
 * cap = max_tokens_per_rank (the most tokens ONE rank passes to one dispatch). */

typedef struct moea2a_moe *moea2a_moe_t;

#define MOEA2A_MOE_MAX_PAYLOADS 8

/* Where the MoE context keeps its buffers and where dispatch/combine data lives. */
typedef enum {
    MOEA2A_MEMORY_AUTO = 0, /* CUDA if the communicator has a CUDA transport and a device, else host */
    MOEA2A_MEMORY_HOST = 1,
    MOEA2A_MEMORY_CUDA = 2
} moea2a_memory_t;

typedef enum {
    MOEA2A_PLACEMENT_CONTIGUOUS = 0, /* ranks 0..E%ep-1 own E/ep+1 experts, the rest E/ep */
    MOEA2A_PLACEMENT_MAP = 1         /* expert_to_rank[E] says */
} moea2a_placement_t;

/* How dispatch delivers rows (moea2a_moe(3), "Expert-major layout"). */
typedef enum {
    MOEA2A_LAYOUT_RANK_MAJOR = 0,  /* [ep][stride] slots per source rank (default) */
    MOEA2A_LAYOUT_EXPERT_MAJOR = 1 /* also each local expert's rows contiguous and aligned */
} moea2a_recv_layout_t;

/* moea2a_moe_config_t.flags */
#define MOEA2A_MOE_NO_SANITIZE (1u << 0)       /* no rewriting of received ids (moea2a_moe(3)) */
#define MOEA2A_MOE_REWRITE_NONLOCAL (1u << 1)  /* also set ids owned by other ranks to invalid */
#define MOEA2A_MOE_CARRY_WEIGHTS (1u << 2)     /* dispatch delivers topk_weights too */
#define MOEA2A_MOE_NO_NVLINK (1u << 3)         /* never the load/store (NVLink) path */
#define MOEA2A_MOE_WEIGHTED_COMBINE (1u << 4)  /* expert-major: combine multiplies rows by router weights */
#define MOEA2A_MOE_ZERO_PADDING (1u << 5)      /* expert-major: alignment padding rows' payloads written 0 */
#define MOEA2A_MOE_HOST_EXPERT_COUNTS (1u << 6) /* expert-major, CUDA memory: counts and offsets copied to the host too */
#define MOEA2A_MOE_COPY_ENGINE (1u << 7)        /* load/store path: rows moved by the GPU's copy engines (moea2a_moe(3)) */
#define MOEA2A_MOE_EXPERT_WIRE_SCALES (1u << 8) /* expert-major: expert_payload_scales in each wire's scale_layout */
#define MOEA2A_MOE_EXPERT_LOAD (1u << 9)        /* CUDA memory: count the experts' load on the device (moea2a_moe(3)) */
#define MOEA2A_MOE_GENERAL_PLACEMENT (1u << 10) /* CUDA memory: replicas and unheld experts allowed (moea2a_moe(3)) */

/* One payload: each token carries elems_per_token elements of dtype (for
 * MOEA2A_NVFP4, packed bytes: hidden/2). */
typedef struct {
    moea2a_datatype_t dtype;
    size_t elems_per_token;
} moea2a_payload_desc_t;

/* Quantize on dispatch (moea2a_moe(3)): how payload i travels. A quantized payload is
 * given in bf16, fp16 or fp32 and quantized once per token on the sending rank; the
 * receiver gets its codes and scales. */
typedef enum {
    MOEA2A_WIRE_AS_IS = 0, /* the payload's own bytes (default) */
    MOEA2A_WIRE_FP8 = 1,   /* FP8 block-scaled, moea2a_fp8(3): elems_per_token % 128 == 0 */
    MOEA2A_WIRE_NVFP4 = 2  /* NVFP4, moea2a_fp4(3): elems_per_token % 16 == 0 */
} moea2a_wire_format_t;

typedef struct {
    moea2a_wire_format_t format;
    int scale_layout; /* FP8: a moea2a_fp8_scale_layout_t; NVFP4: a moea2a_sf_layout_t */
    unsigned flags;   /* FP8: MOEA2A_FP8_UE8M0 or 0; NVFP4: 0 */
} moea2a_wire_t;

typedef struct {
    size_t size;          /* sizeof(moea2a_moe_config_t) */
    unsigned int version; /* MOEA2A_VERSION_CODE */
    int num_experts;      /* E >= 1 */
    int top_k;            /* k >= 1 */
    int max_tokens_per_rank; /* cap: per rank, never multiplied by ep */
    int num_payloads;     /* 0..MOEA2A_MOE_MAX_PAYLOADS */
    moea2a_payload_desc_t payloads[MOEA2A_MOE_MAX_PAYLOADS];
    moea2a_datatype_t combine_dtype; /* MOEA2A_BFLOAT16, MOEA2A_FLOAT16 or MOEA2A_FLOAT32 */
    size_t hidden;        /* elements per combine row; 0: no combine buffer */
    int32_t invalid_expert_id; /* written to unused id slots; default -1 (E is common too); never 0..E-1 */
    moea2a_placement_t placement;
    const int32_t *expert_to_rank; /* [E], for MOEA2A_PLACEMENT_MAP (copied at create) */
    unsigned int flags;   /* MOEA2A_MOE_* */
    moea2a_memory_t memory;
    int num_sms;          /* load/store path: SMs per kernel; 0 = MOEA2A_NUM_SMS, else MOEA2A_MOE_DEFAULT_SMS(ep) */
    moea2a_wire_t wire[MOEA2A_MOE_MAX_PAYLOADS]; /* per payload; zero (as is) by default */
    moea2a_recv_layout_t layout; /* rank-major (default) or expert-major */
    int expert_alignment;        /* expert-major: each expert's rows start at a multiple; 1..1024, 0 = 1 */
    int64_t max_expert_rows;     /* expert-major: rows a rank may hold, padding included; 0 = the worst case */
    /* the combine's rows on the wire: MOEA2A_WIRE_AS_IS (default: the combine dtype) or
     * MOEA2A_WIRE_FP8 (E4M3 codes, one fp32 or, with flags MOEA2A_FP8_UE8M0, one UE8M0
     * scale per 128 values; hidden % 128 == 0; scale_layout 0), host memory in this
     * release (moea2a_moe(3), "FP8 combine") */
    moea2a_wire_t combine_wire;
    /* the most experts a rank may hold under a placement set later with
     * moea2a_moe_set_placement (0: what the create's placement gives the fullest rank);
     * the expert-major layout is sized for it */
    int max_local_experts;
} moea2a_moe_config_t;

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_moe_config_t, moe_config_initializer,
                (MOEA2A_SIZE_VERSION_(moea2a_moe_config_t), v_.combine_dtype = MOEA2A_BFLOAT16,
                 v_.invalid_expert_id = -1, v_.placement = MOEA2A_PLACEMENT_CONTIGUOUS, v_.memory = MOEA2A_MEMORY_AUTO))
#define MOEA2A_MOE_CONFIG_INITIALIZER moea2a_detail::moe_config_initializer()
#else
#define MOEA2A_MOE_CONFIG_INITIALIZER                                                                         \
    { .size = sizeof(moea2a_moe_config_t), .version = MOEA2A_VERSION_CODE, .combine_dtype = MOEA2A_BFLOAT16, \
      .invalid_expert_id = -1, .placement = MOEA2A_PLACEMENT_CONTIGUOUS, .memory = MOEA2A_MEMORY_AUTO }
#endif

/* Per-rank memory, exactly what moea2a_moe_create allocates. A(x) = x rounded up to
 * 128 bytes; see moea2a_moe_workspace_size(3) for the formula. */
/* The load/store path's SM budget (thread blocks per dispatch or combine kernel) of a
 * context over ep ranks when neither num_sms nor MOEA2A_NUM_SMS sets one: with more
 * peers fewer SMs keep NVLink as busy and contend less (4 x H100, hidden 7168, top-8
 * of 256: 32 SMs against 48 took the 128-token dispatch + combine from 60.5 to 58.5
 * us, 1024 tokens from 279.2 to 269.5, 4096 from 969.7 to 964.4; on 2 GPUs 48 stays
 * ahead at 512-4096 tokens by up to 3%). */
#define MOEA2A_MOE_DEFAULT_SMS(ep) ((ep) >= 4 ? 32 : 48)

typedef struct {
    size_t size;                 /* sizeof(moea2a_moe_workspace_sizes_t), set by the caller */
    unsigned int version;
    size_t workspace_bytes;      /* aux + payloads + ids + weights + combine */
    size_t staging_bytes;        /* for peers not reachable by load/store */
    size_t device_bytes;         /* of the above, in device memory */
    size_t pinned_host_bytes;    /* of the above, in pinned host memory */
    size_t host_bytes;           /* of the above, in ordinary host memory */
    size_t total_bytes;          /* workspace_bytes + staging_bytes */
    /* breakdown */
    size_t aux_bytes;
    size_t payload_bytes[MOEA2A_MOE_MAX_PAYLOADS];
    size_t ids_bytes, weights_bytes, combine_bytes;
    size_t record_bytes;         /* one token's dispatch record through staging */
    /* topology */
    int staged_peers;            /* peers reached through staging */
    int nvlink_peers;            /* peers written by load/store */
    int numa_node;               /* where host staging is placed; -1 unknown */
    int gpu;                     /* this rank's GPU in the topology; -1 none */
    char nic[32];                /* NIC nearest this rank's GPU or NUMA node; "" none */
    size_t expert_bytes;         /* expert-major layout: its rows, per-row arrays and combine rows */
} moea2a_moe_workspace_sizes_t;

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_moe_workspace_sizes_t, moe_workspace_sizes_initializer,
                MOEA2A_SIZE_VERSION_(moea2a_moe_workspace_sizes_t))
#define MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER moea2a_detail::moe_workspace_sizes_initializer()
#else
#define MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER \
    { .size = sizeof(moea2a_moe_workspace_sizes_t), .version = MOEA2A_VERSION_CODE }
#endif

/* What moea2a_dispatch delivers. Arrays live in the context's workspace and stay
 * valid until the next dispatch. Slot (src, i), i < recv_counts[src], is the i-th
 * token rank src sent here, in ascending source-token order. */
typedef struct {
    size_t size;                 /* sizeof(moea2a_dispatch_result_t), set by the caller */
    unsigned int version;
    int ep, stride, top_k;       /* arrays are [ep][stride][...] */
    const int32_t *recv_counts;  /* [ep] valid slots per source rank */
    void *payloads[MOEA2A_MOE_MAX_PAYLOADS]; /* [ep][stride][row bytes of payload i] */
    size_t payload_row_bytes[MOEA2A_MOE_MAX_PAYLOADS];
    int32_t *topk_ids;           /* [ep][stride][k], sanitized */
    float *topk_weights;         /* [ep][stride][k]; NULL without MOEA2A_MOE_CARRY_WEIGHTS */
    const int32_t *src_token_index; /* [ep][stride]: token index on the source rank; -1 padding */
    int64_t total_recv;          /* sum of recv_counts */
    int64_t invalid_entries;     /* this rank's input entries skipped as invalid */
    int64_t sent_rows;           /* rows this rank sent (one per token and destination rank) */
    int64_t deduplicated;        /* entries merged because their rank already got the token */
    /* The load/store path does not wait for the dispatch on the host: the four counts
     * above are -1 there, and device_stats ([4] in device memory: total_recv,
     * invalid_entries, sent_rows, deduplicated) holds them once the stream has passed
     * the dispatch. The generic paths (host memory, NCCL send/receive) fill the four
     * counts and set device_stats to NULL. */
    const int64_t *device_stats;
    int nvlink;                  /* 1: this dispatch took the load/store path */
    /* Rows this rank's dispatch sent to ranks on other nodes (moea2a_comm_node), and
     * their bytes on the wire (payload rows, ids, weights, source index); its combine
     * brings as many rows back. 0 when every rank is on one node. */
    int64_t internode_rows, internode_bytes;
    /* Quantized payloads (config wire[i] not as is): payloads[i] holds the codes
     * ([ep][stride][elems] E4M3 bytes, or [ep][stride][elems/2] packed NVFP4) and
     * payload_row_bytes[i] their bytes per row; payload_scales[i] the scales in the
     * wire's layout (FP8: one block per source rank, of stride rows; NVFP4: over the
     * ep x stride rows), payload_scale_bytes[i] their bytes at this stride, padding
     * rows' scales 0; payload_global_scales[i] (NVFP4) float[ep], each source rank's
     * global scale (0 where it sent nothing). NULL / 0 for payloads sent as is. */
    void *payload_scales[MOEA2A_MOE_MAX_PAYLOADS];
    size_t payload_scale_bytes[MOEA2A_MOE_MAX_PAYLOADS];
    const float *payload_global_scales[MOEA2A_MOE_MAX_PAYLOADS];
    /* Expert-major layout (config layout; 0 / NULL otherwise), in the context's memory:
     * this rank's num_local_experts experts in ascending global id; local expert j's
     * rows are [expert_offsets[j], expert_offsets[j] + expert_counts[j]), one per
     * (source token, expert) pair in ascending (source rank, source token) order,
     * expert_offsets[j] a multiple of expert_alignment, expert_offsets[num_local_experts]
     * = expert_rows (alignment padding included). Per row: expert_payloads[i] (row bytes
     * of payload i), expert_ids (the global expert id; invalid_expert_id on padding rows),
     * expert_src_rank, expert_src_token, expert_topk_slot (the token's first top-k slot
     * naming the expert) and expert_weights (that slot's router weight; NULL without
     * MOEA2A_MOE_CARRY_WEIGHTS); padding rows: source rank, token and slot -1, weight 0.
     * The rank-major arrays above are delivered too. On CUDA memory the layout is
     * built on the stream: expert_rows is -1 there unless the host waited for it
     * (max_expert_rows below the worst case, whose agreement waits), and
     * expert_offsets[num_local_experts] on the device always holds it. */
    int num_local_experts;
    const int32_t *expert_counts;  /* [num_local_experts] */
    const int32_t *expert_offsets; /* [num_local_experts + 1] */
    int64_t expert_rows;
    void *expert_payloads[MOEA2A_MOE_MAX_PAYLOADS];
    const int32_t *expert_ids, *expert_src_rank, *expert_src_token, *expert_topk_slot;
    const float *expert_weights;
    /* The counts and offsets in host memory: with MOEA2A_MOE_HOST_EXPERT_COUNTS on CUDA
     * memory, pinned copies made on the stream (read them once the stream has passed
     * the dispatch, e.g. after cudaStreamSynchronize); on host memory, expert_counts
     * and expert_offsets themselves; NULL otherwise. */
    const int32_t *expert_counts_host, *expert_offsets_host;
    /* Payloads quantized on dispatch, per expert row (NULL for payloads sent as is):
     * expert_payloads[i] holds the codes, expert_payload_scales[i] the row's scales
     * row-major ([max_expert_rows][scale row bytes]: FP8 row-major scales, NVFP4 linear
     * E4M3 scales, whatever the wire's scale_layout, which applies to payload_scales),
     * expert_global_scales[i] (NVFP4) each row's source global scale. Padding rows:
     * scales and global scale 0. With MOEA2A_MOE_EXPERT_WIRE_SCALES (host memory in
     * this release) the scales follow the wire's scale_layout over the expert_rows
     * rows instead, as grouped GEMMs read them: FP8 MN-major [scale words][rows rounded
     * up to 4]; NVFP4 128x4 / 8x4 tiles over the rows rounded up to 128 / 8 (each
     * expert starting a tile: expert_alignment a multiple of 128 / 8). */
    void *expert_payload_scales[MOEA2A_MOE_MAX_PAYLOADS];
    const float *expert_global_scales[MOEA2A_MOE_MAX_PAYLOADS];
    /* Rows this rank's dispatch handed its transport for ranks on other nodes, and their
     * bytes: internode_rows and internode_bytes on the flat paths; on the hierarchical
     * path (host memory across nodes) one row per token for each other node it reaches,
     * sent to that node's rail peer, which relays it there. The combine brings as many
     * rows back (of the combine dtype). 0 when every rank is on one node. */
    int64_t network_rows, network_bytes;
    /* This rank's input entries naming an expert that no rank holds (-1 in the map of
     * moea2a_moe_set_placement, no holder in moea2a_moe_set_replicas): skipped as
     * invalid ids are, and counted here instead of in invalid_entries. -1 on the
     * load/store path, where device_dropped (one int64 in device memory) holds it once
     * the stream has passed the dispatch; NULL on the generic paths. */
    int64_t dropped_entries;
    const int64_t *device_dropped;
} moea2a_dispatch_result_t;

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_dispatch_result_t, dispatch_result_initializer,
                MOEA2A_SIZE_VERSION_(moea2a_dispatch_result_t))
#define MOEA2A_DISPATCH_RESULT_INITIALIZER moea2a_detail::dispatch_result_initializer()
#else
#define MOEA2A_DISPATCH_RESULT_INITIALIZER { .size = sizeof(moea2a_dispatch_result_t), .version = MOEA2A_VERSION_CODE }
#endif

/* A machine layout for sizing without a communicator (moea2a_info --workspace). */
typedef struct {
    size_t size;
    unsigned int version;
    int ep;                      /* ranks */
    int ranks_per_node;          /* consecutive ranks share a node; 0: all on one node */
    int rank;                    /* whose sizes */
    const char *topology_xml;    /* hwloc XML of a node; NULL: this machine */
    moea2a_memory_t memory;      /* AUTO means CUDA when the topology has GPUs */
} moea2a_moe_layout_t;

#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_moe_layout_t, moe_layout_initializer,
                (MOEA2A_SIZE_VERSION_(moea2a_moe_layout_t), v_.ep = 1, v_.memory = MOEA2A_MEMORY_AUTO))
#define MOEA2A_MOE_LAYOUT_INITIALIZER moea2a_detail::moe_layout_initializer()
#else
#define MOEA2A_MOE_LAYOUT_INITIALIZER \
    { .size = sizeof(moea2a_moe_layout_t), .version = MOEA2A_VERSION_CODE, .ep = 1, .memory = MOEA2A_MEMORY_AUTO }
#endif

/* Pure: computes what moea2a_moe_create would allocate on this rank. */
MOEA2A_API moea2a_result_t moea2a_moe_workspace_size(moea2a_comm_t comm, const moea2a_moe_config_t *config,
                                                     moea2a_moe_workspace_sizes_t *sizes);
MOEA2A_API moea2a_result_t moea2a_moe_workspace_size_layout(const moea2a_moe_layout_t *layout,
                                                            const moea2a_moe_config_t *config,
                                                            moea2a_moe_workspace_sizes_t *sizes);
/* Collective over comm: every rank passes the same config. */
MOEA2A_API moea2a_result_t moea2a_moe_create(moea2a_moe_t *moe, moea2a_comm_t comm,
                                             const moea2a_moe_config_t *config);
MOEA2A_API moea2a_result_t moea2a_moe_destroy(moea2a_moe_t moe);
/* ep * cap: the receive rows any dispatch may deliver; size consumer buffers by it. */
MOEA2A_API moea2a_result_t moea2a_moe_max_recv_rows(moea2a_moe_t moe, size_t *rows);
/* Collective, with no dispatch pending: experts move to the ranks expert_to_rank[E]
 * names (every rank passes the same map), in place: no new context, no allocation.
 * -1: no rank holds the expert (its entries are dropped: dropped_entries). A rank
 * given more than the context's bound on local experts is MOEA2A_ERR_CAPACITY. On
 * CUDA memory the device's tables change in order on stream (capturable), and -1 needs
 * a context created with MOEA2A_MOE_GENERAL_PLACEMENT (else MOEA2A_ERR_UNAVAILABLE);
 * moea2a_moe(3), "Placement in place". */
MOEA2A_API moea2a_result_t moea2a_moe_set_placement(moea2a_moe_t moe, const int32_t *expert_to_rank, void *stream);
/* Collective, as moea2a_moe_set_placement, with replicas: expert e is held by the ranks
 * holders[e x max_replicas + j] for j below its count n_e (distinct ranks, then -1;
 * n_e = 0: held by no rank), and a token's entry naming e goes to holder number
 * (source rank + source token index) mod n_e: a rule every rank applies, so results
 * stay reproducible. Replicas count against the bound on local experts;
 * moea2a_moe_set_placement drops them. On CUDA memory, in order on stream (capturable),
 * for a context created with MOEA2A_MOE_GENERAL_PLACEMENT (else MOEA2A_ERR_UNAVAILABLE). */
MOEA2A_API moea2a_result_t moea2a_moe_set_replicas(moea2a_moe_t moe, int max_replicas, const int32_t *holders,
                                                   void *stream);
/* Collective over newcomm: moe, made on another communicator, moves to newcomm, keeping
 * its handle, config and expert load counts; its memory is released without waiting on
 * the old communicator's ranks (some may be dead) and allocated anew. expert_to_rank[E]
 * (every rank the same): the placement on newcomm. NULL, only where newcomm came from
 * moea2a_comm_shrink of moe's communicator: each expert stays on its rank (or the first
 * surviving replica), renumbered, and the experts of ranks that left, and those no rank
 * held, go in ascending id each to the rank holding fewest (the lowest of them), by new
 * rank 0's view of the old placement (a change a failure cut short may differ). Ranks
 * that joined newcomm (moea2a_comm_grow) call moea2a_moe_create with moe's config,
 * placement MOEA2A_PLACEMENT_MAP and the same map. A dispatch left pending (by a
 * failure) is dropped with its results. On failure moe holds no memory and takes only
 * moea2a_moe_destroy; moea2a_moe(3), "Recovery". */
MOEA2A_API moea2a_result_t moea2a_moe_retarget(moea2a_moe_t moe, moea2a_comm_t newcomm, const int32_t *expert_to_rank);
/* Local: load[E] = per expert, the (token, expert) entries this rank took since create
 * or the last reset (each expert once per token, by the placement in force at each
 * dispatch): what load balancers sum over the ranks. reset: zero the counts after
 * reading. On CUDA memory the device counts them after each dispatch, in order on its
 * stream, where the context was created with MOEA2A_MOE_EXPERT_LOAD (else
 * MOEA2A_ERR_UNAVAILABLE), and this call waits for the device first. */
MOEA2A_API moea2a_result_t moea2a_moe_expert_load(moea2a_moe_t moe, int64_t *load, int reset);
/* The workspace's combine input buffer, [ep][stride][hidden] of combine_dtype: expert
 * kernels may write there and pass NULL (or this pointer) to moea2a_combine. */
MOEA2A_API moea2a_result_t moea2a_moe_combine_buffer(moea2a_moe_t moe, void **buffer);

/* Collective. num_tokens in 0..cap (0: an idle rank that still takes part, and may
 * pass NULL arrays); topk_ids [num_tokens][k] int32; topk_weights [num_tokens][k]
 * float or NULL; payloads[i] [num_tokens][row of payload i];
 * runtime_max_tokens_per_rank: the receive stride for this call (0: cap), the same on
 * every rank. Negative values are MOEA2A_ERR_INVALID_ARGUMENT. A call rejected by its
 * checks fails on every rank with one code; what it leaves behind: moea2a_moe(3). */
MOEA2A_API moea2a_result_t moea2a_dispatch(moea2a_moe_t moe, int num_tokens, const int32_t *topk_ids,
                                           const float *topk_weights, const void *const *payloads,
                                           int runtime_max_tokens_per_rank,
                                           moea2a_dispatch_result_t *result, void *stream);
/* Collective. expert_out: [ep][stride][hidden] of combine_dtype, one row per valid
 * slot of the last dispatch (NULL: the combine buffer). A context with hidden = 0 has
 * no combine (MOEA2A_ERR_INVALID_ARGUMENT); its dispatches replace each other. out: [num_tokens][hidden]:
 * out[t] = sum, in fp32 and in ascending rank order, of the rows of the ranks that
 * received token t; zeros for tokens sent nowhere. */
MOEA2A_API moea2a_result_t moea2a_combine(moea2a_moe_t moe, const void *expert_out, void *out, void *stream);

/* Split phases (moea2a_moe(3), "Split phases"): each call in two halves, so that the
 * caller runs other work between them (on other streams, or on the same one).
 *  moea2a_dispatch = moea2a_dispatch_send + moea2a_dispatch_recv,
 *  moea2a_combine  = moea2a_combine_send  + moea2a_combine_recv,
 * with the same arguments split between the halves, the same results and bits. A send
 * half returns once its work is enqueued (on the load/store path: one kernel that
 * writes this rank's rows into its peers and signals them); the receive half waits
 * for the peers, then sanitizes (dispatch) or reduces (combine). Both halves are
 * collective, in this order on every rank; pass the receive half the send half's
 * stream (or one ordered after it). Both may be captured in a CUDA graph where the
 * one-call form may. Out of order (a receive without its send, two sends, a one-call
 * form between the halves) is MOEA2A_ERR_STATE. The receive halves check only their
 * own arguments (result, out): a rejected receive is local and leaves the send done
 * (call it again). */
MOEA2A_API moea2a_result_t moea2a_dispatch_send(moea2a_moe_t moe, int num_tokens, const int32_t *topk_ids,
                                                const float *topk_weights, const void *const *payloads,
                                                int runtime_max_tokens_per_rank, void *stream);
MOEA2A_API moea2a_result_t moea2a_dispatch_recv(moea2a_moe_t moe, moea2a_dispatch_result_t *result, void *stream);
MOEA2A_API moea2a_result_t moea2a_combine_send(moea2a_moe_t moe, const void *expert_out, void *stream);
MOEA2A_API moea2a_result_t moea2a_combine_recv(moea2a_moe_t moe, void *out, void *stream);
/* Non-blocking: MOEA2A_SUCCESS, or the error a load/store-path kernel of this context
 * recorded on the device (a peer that timed out, a peer's failed checks, mismatched
 * strides), with the details in moea2a_last_error. Such an error is final: the
 * context must be destroyed. Contexts on the generic paths report errors from the
 * calls themselves and always return MOEA2A_SUCCESS here. */
MOEA2A_API moea2a_result_t moea2a_moe_status(moea2a_moe_t moe);

/* ---- NVFP4 ------------------------------------------------------------------------
 * See moea2a_fp4(3) for the exact format and arithmetic. Memory space (host or CUDA)
 * comes from the pointers; all pointers of a call, g included, must be in the same
 * space. stream (a cudaStream_t) orders CUDA work and is ignored for host memory.
 * k must be a multiple of 16. */

typedef enum {
    MOEA2A_SF_LINEAR = 0, /* sf[m * (k/16) + kb] */
    MOEA2A_SF_128X4 = 1,  /* 128-row x 4-block tiles (roundup(m,128) x roundup(k/16,4) bytes) */
    MOEA2A_SF_8X4 = 2     /* 8-row x 4-block tiles (roundup(m,8) x roundup(k/16,4) bytes) */
} moea2a_sf_layout_t;

/* Bytes of a scale buffer of m rows of k values in layout (padding included). */
MOEA2A_API moea2a_result_t moea2a_fp4_sf_bytes(moea2a_sf_layout_t layout, size_t m, size_t k, size_t *bytes);
/* *g = 448 * 6 / amax(|x|) over count elements (1 when amax is 0). */
MOEA2A_API moea2a_result_t moea2a_fp4_global_scale(const void *x, moea2a_datatype_t xtype, size_t count, float *g,
                                                   void *stream);
/* x [m][k] (bf16, fp16 or fp32) -> q [m][k/2] packed E2M1 and sf (E4M3, layout). */
MOEA2A_API moea2a_result_t moea2a_fp4_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k,
                                               const float *g, void *q, void *sf, moea2a_sf_layout_t layout,
                                               void *stream);
/* q, sf -> out [m][k] of otype (bf16, fp16 or fp32): e2m1(q) * sf * (1/g). */
MOEA2A_API moea2a_result_t moea2a_fp4_dequantize(const void *q, const void *sf, moea2a_sf_layout_t layout,
                                                 const float *g, size_t m, size_t k, void *out,
                                                 moea2a_datatype_t otype, void *stream);
/* Scales of m rows of k values from one layout to another; padding written 0. */
MOEA2A_API moea2a_result_t moea2a_fp4_sf_convert(const void *src, moea2a_sf_layout_t src_layout, void *dst,
                                                 moea2a_sf_layout_t dst_layout, size_t m, size_t k, void *stream);
/* The linear scales of a dispatch's [ep][stride] receive rows into dst_layout over
 * ep x stride rows: rows i >= recv_counts[src] (padding) get scale 0. recv_counts
 * lives in the same memory as src (moea2a_dispatch_result_t.recv_counts). */
MOEA2A_API moea2a_result_t moea2a_fp4_sf_convert_padded(const void *src, void *dst, moea2a_sf_layout_t dst_layout,
                                                        const int32_t *recv_counts, int ep, int stride, size_t k,
                                                        void *stream);

/* ---- FP8 block quantization ---------------------------------------------------------
 * See moea2a_fp8(3): DeepSeek-V3 / DeepGEMM activations, E4M3 values with one scale per
 * block of 128 values of a row; k must be a multiple of 128. Memory space from the
 * pointers (all in one space); stream orders CUDA work and is ignored for host memory. */

#define MOEA2A_FP8_BLOCK 128
/* flags: power-of-two scales, one exponent byte (e + 127) each, packed four per
 * uint32 along k; default: fp32 scales (amax / 448). */
#define MOEA2A_FP8_UE8M0 (1u << 0)

typedef enum {
    MOEA2A_FP8_SCALES_ROW_MAJOR = 0, /* [m][k/128] (UE8M0: [m][ceil(k/512)] words) */
    MOEA2A_FP8_SCALES_MN_MAJOR = 1   /* [k/128][m_pad], m_pad = m rounded up to 4 (UE8M0:
                                        [ceil(k/512)][m_pad] words): what TMA-based FP8
                                        GEMMs read */
} moea2a_fp8_scale_layout_t;

/* Bytes of the scale buffer for m rows of k values (padding included). */
MOEA2A_API moea2a_result_t moea2a_fp8_scale_bytes(moea2a_fp8_scale_layout_t layout, unsigned flags, size_t m,
                                                  size_t k, size_t *bytes);
/* x [m][k] (bf16, fp16 or fp32) -> q [m][k] E4M3 codes and scales (layout, flags). */
MOEA2A_API moea2a_result_t moea2a_fp8_quantize(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q,
                                               void *scales, moea2a_fp8_scale_layout_t layout, unsigned flags,
                                               void *stream);
/* q, scales -> out [m][k] of otype (bf16, fp16 or fp32): e4m3(q) x scale. */
MOEA2A_API moea2a_result_t moea2a_fp8_dequantize(const void *q, const void *scales, moea2a_fp8_scale_layout_t layout,
                                                 unsigned flags, size_t m, size_t k, void *out,
                                                 moea2a_datatype_t otype, void *stream);

/* ---- FP4 expert GEMM ----------------------------------------------------------------
 * See moea2a_expert(3). For each local expert e: C_e = A_e . dequant(W_e)^T, A bf16
 * rows of k values, W_e [n][k] in NVFP4 as moea2a_fp4_quantize writes it (codes
 * [n][k/2], E4M3 scales in MOEA2A_SF_128X4, one fp32 global scale), fp32 sums, bf16 or
 * fp32 C. Rows that are not an expert's (alignment padding, sanitized or non-local
 * ids) are neither read nor written. Memory space from the pointers (all in one); on
 * CUDA memory every count is read on the device (the call never waits: it can be
 * captured into a CUDA graph). */

typedef enum {
    MOEA2A_GEMM_ROWS_EXPERT_MAJOR = 0, /* expert e's rows [offsets[e], offsets[e] + counts[e]) of A and C */
    MOEA2A_GEMM_ROWS_RANK_MAJOR = 1    /* ids [rows][slots]: row r feeds expert ids[r][s] - first_expert
                                          into C row r * slots + s */
} moea2a_gemm_rows_t;

/* flags: C gets silu(G[:, j]) * G[:, j + n/2] for j < n/2 (SwiGLU of a gate/up
 * product G, silu(x) = x / (1 + exp(-x)) in fp32): n / 2 columns. */
#define MOEA2A_GEMM_SWIGLU (1u << 0)

/* Start from MOEA2A_EXPERT_GEMM_INITIALIZER (zeros but size and version), then set the
 * fields the call needs. */
typedef struct {
    size_t size;          /* sizeof(moea2a_expert_gemm_t) as compiled by the caller */
    unsigned int version; /* MOEA2A_VERSION_CODE as compiled by the caller */
    int num_experts;      /* local experts, 1..1024 */
    size_t n, k;          /* W_e is n x k: n < 2^31 (even with SWIGLU), k a multiple of 16, 16..2^24 */
    moea2a_gemm_rows_t rows_layout;
    unsigned flags;       /* MOEA2A_GEMM_SWIGLU */
    const void *a;        /* bf16 A: row i at a + i * lda elements */
    size_t lda;           /* >= k (CUDA: a multiple of 8) */
    int64_t rows;         /* A's rows, < 2^31: none past it is read (expert-major counts are clipped to it) */
    /* expert-major */
    const int32_t *counts;  /* [num_experts] */
    const int32_t *offsets; /* [num_experts] (e.g. moea2a_dispatch_result_t.expert_offsets) */
    /* rank-major */
    const int32_t *ids;   /* [rows][slots] global expert ids; others than the local are skipped */
    int slots;            /* ids per row (the dispatch's k, or 1 for one expert per row) */
    int32_t first_expert; /* global id of local expert 0 (the local ids are contiguous) */
    /* weights: expert e's codes at w + e * n * k/2, its scales at w_scales + e *
     * moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, n, k), its global scale w_global[e] */
    const void *w, *w_scales;
    const float *w_global;
    void *c;               /* row i at c + i * ldc elements */
    moea2a_datatype_t c_type; /* MOEA2A_BFLOAT16 or MOEA2A_FLOAT32 */
    size_t ldc;            /* >= n (SWIGLU: n / 2) */
    void *workspace;       /* rank-major on CUDA: moea2a_expert_gemm_workspace_size bytes */
    size_t workspace_size;
} moea2a_expert_gemm_t;
#ifdef __cplusplus
MOEA2A_INIT_FN_(moea2a_expert_gemm_t, expert_gemm_initializer, MOEA2A_SIZE_VERSION_(moea2a_expert_gemm_t))
#define MOEA2A_EXPERT_GEMM_INITIALIZER moea2a_detail::expert_gemm_initializer()
#else
#define MOEA2A_EXPERT_GEMM_INITIALIZER { .size = sizeof(moea2a_expert_gemm_t), .version = MOEA2A_VERSION_CODE }
#endif

/* Bytes of workspace the call described by g needs (0 for expert-major and host memory). */
MOEA2A_API moea2a_result_t moea2a_expert_gemm_workspace_size(const moea2a_expert_gemm_t *g, size_t *bytes);
/* Runs the GEMM on stream (a cudaStream_t; ignored for host memory, which runs the
 * host reference). */
MOEA2A_API moea2a_result_t moea2a_expert_gemm(const moea2a_expert_gemm_t *g, void *stream);

/* ---- transports and parameters ------------------------------------------------ */

typedef struct {
    char name[32];      /* "ucx", "nccl" */
    char path[512];     /* module file */
    int abi_version;    /* moea2a_transport_v<N> it exports; 0 if it did not load */
    int loadable;       /* 1 if it loaded and its ABI matches */
    char detail[256];   /* why it did not load, or what it supports */
} moea2a_transport_info_t;

/* Lists the transport modules on the search path (MOEA2A_TRANSPORT_PATH, then the
 * installed module directory): fills up to max entries, *count = how many exist. */
MOEA2A_API moea2a_result_t moea2a_get_transports(moea2a_transport_info_t *infos, int max,
                                                 int *count);

typedef struct {
    const char *name;          /* MOEA2A_... */
    const char *type;          /* "int", "double", "string", "enum", "secret" (a string that
                                  tools never print) */
    const char *default_value; /* as text */
    const char *help;          /* one or two sentences */
} moea2a_param_t;

/* The table of every environment variable moea2a reads (static storage). */
MOEA2A_API moea2a_result_t moea2a_get_params(const moea2a_param_t **params, int *count);
/* Whether value (NULL or "": unset) is one the variable name may take: its type, range
 * or words. MOEA2A_ERR_INVALID_ARGUMENT with the reason in why (len bytes) otherwise. */
MOEA2A_API moea2a_result_t moea2a_param_check(const char *name, const char *value, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* MOEA2A_H */

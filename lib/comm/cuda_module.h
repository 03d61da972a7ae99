/* The interface between the moea2a core and its CUDA module, libmoea2a-cuda.so
 * (cuda/cuda_module.c and cuda/kernels/): the CUDA runtime calls and kernel launches that
 * the MoE and NVFP4 calls make on device memory. The core never links the CUDA
 * runtime, so one core package serves GPU and CPU-only nodes; a call on CUDA memory
 * loads the module on first use (m2a_cuda_require), and without it fails with
 * MOEA2A_ERR_UNAVAILABLE naming the module.
 *
 * The module exports one symbol, MOEA2A_CUDA_SYMBOL, of type moea2a_cuda_v1_t. Every
 * int-returning member returns 0 or a cudaError_t value (error_string names it). Like
 * the transports, the module ships with the library it was built with; the version
 * guards against a stray file. This header is everything the two share: the module's
 * table and the kernels' parameter structs. The module includes it; the core never
 * includes the module's own headers. */
#ifndef M2A_CUDA_MODULE_H
#define M2A_CUDA_MODULE_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the kernels' parameters, passed by value; pointers are device pointers ------ */

/* The MoE data path (cuda/kernels/moe_kernels.cu). Byte arrays (a payload as given, or
 * a quantized one's codes, scales [, global scale]), then ids, [weights,] the source
 * index: moe/layout.h's M2A_MOE_MAX_ARRAYS. */
#define M2A_K_MAX_ARRAYS (3 * MOEA2A_MOE_MAX_PAYLOADS + 3)
#define M2A_K_MAX_BYTE_ARRAYS (M2A_K_MAX_ARRAYS - 3)

/* Everything the kernels need, passed by value. Pointers are device pointers. */
typedef struct {
    /* num_payloads: the byte arrays, arrays 0..num_payloads-1, copied from payloads.p[] */
    int ep, me, k, num_experts, cap, num_payloads, weights, narrays;
    int32_t invalid_id;
    const int32_t *owner;       /* [E]: each expert's rank (while the placement is not general) */
    const int32_t *stage_index; /* [ep] */
    const int32_t *node;        /* [ep]: each rank's node (the communicator's node map) */
    int nodes;                  /* nodes of the communicator: above 1, combine sums per node first */
    size_t record;
    size_t width[M2A_K_MAX_ARRAYS], ws_off[M2A_K_MAX_ARRAYS], rec_off[M2A_K_MAX_ARRAYS];
    /* The general placement (placement.cuh): [E][ep] expert e's holders, nrep[e] of them
     * (0: no rank holds it); nrep [E + 1], whose word E is nonzero while some expert
     * has other than one holder (moea2a_moe_set_replicas, or -1 in
     * moea2a_moe_set_placement's map). Then an entry naming e of token t of rank src
     * goes to holder (src + t) mod nrep[e], and every word of owner[] is -1. The tables
     * change on the stream, so kernels read which rule holds from the device.
     * dropped_sums [3]: a load/store dispatch's dropped entries, one sum per epoch
     * parity, then the last dispatch's total (moea2a_dispatch_result_t.device_dropped;
     * the general kernels only). Last: the fields above keep their offsets. */
    const int32_t *holders, *nrep;
    unsigned long long *dropped_sums;
} m2a_kparams_t;

typedef struct {
    const void *p[M2A_K_MAX_BYTE_ARRAYS];
} m2a_kpayloads_t;

/* The load/store (NVLink) path (cuda/kernels/moe_fast*.cu). */
#define M2A_FAST_MAX_PEERS 64   /* ranks a load/store context may have */
#define M2A_FAST_MAX_BLOCKS 256 /* thread blocks (SMs) a kernel may use */
#define M2A_FAST_THREADS 512

/* The control regions in the workspace (the layout's formula uses these sizes):
 * signals peers write: arrivals, combine arrivals, [stride, status] per source; block
 * scratch: send-map epochs [blocks]; counters: the dispatch and combine epochs
 * (2 x u32), the blocks of a send-only launch done (2 x u32), the stats [4] (int64)
 * that dispatch results point to, the units handed out (u64): dispatch's two,
 * combine's two, then the invalid and merged sums of the two epoch parities (u64);
 * from byte 128, the quantized groups of each chunk of a dispatch's tokens
 * (M2A_FAST_QCHUNKS x u32, an overlapped quantization's, qrows). */
#define M2A_FAST_SIG_BYTES(ep) (16 * (size_t)(ep))
#define M2A_FAST_BLOCK_BYTES (4 * (size_t)M2A_FAST_MAX_BLOCKS)
#define M2A_FAST_CTL_BYTES 384
#define M2A_FAST_CTL_STATS 16  /* offset of the stats in the counters */
#define M2A_FAST_CTL_QREADY 128 /* offset of the quantized-groups counters */
#define M2A_FAST_QCHUNKS 64
/* After the counters: a rank whose own checks failed writes its message here (text,
 * NUL-terminated) before its kernel tells the peers; a peer that learns of the failure
 * reads it from that rank's workspace, so every rank reports the reason. */
#define M2A_FAST_REASON_BYTES 256

/* The device error record (first error wins): code is a moea2a_result_t, peer the rank
 * it concerns, what the step (M2A_FAST_AT_*). dead, in the host's copy only: 0, or a
 * dead rank + 1 as the host's peer watcher wrote it (comm/comm.h m2a_comm_watch); a
 * device wait that has lasted M2A_FAST_DEAD_LOOK_NS looks at it every as long and
 * records MOEA2A_ERR_PEER_FAILED naming that rank. */
typedef struct {
    int32_t code, peer, what, dead;
} m2a_fast_error_t;
/* 1 ms: a wait shorter than this never reads host memory (a read over PCIe is about a
 * microsecond); a death is seen within a millisecond of the watcher's news. */
#define M2A_FAST_DEAD_LOOK_NS 1000000ull

enum {
    M2A_FAST_AT_GATE = 1,
    M2A_FAST_AT_ARRIVE,
    M2A_FAST_AT_HEADER,
    M2A_FAST_AT_COMBINE,
    M2A_FAST_AT_PREFIX,
    M2A_FAST_AT_COMBINE_HEADER,
    M2A_FAST_AT_QUANTIZE
};

enum { M2A_FAST_AS_IS, M2A_FAST_FP8, M2A_FAST_FP8_UE8M0 };
/* Bits or-ed into an FP8 wire given to combine, for the hierarchical path's two
 * reductions (the wire's kind is wire & M2A_FAST_WIRE_KIND):
 *   M2A_FAST_WIRE_OUT       out holds wire rows: each token's fp32 sum quantized by the
 *                           block rule, as a node's partial travels (one node: p->nodes 1)
 *   M2A_FAST_WIRE_PARTIALS  the rows of ranks on other nodes than this rank's are those
 *                           nodes' partials, already quantized: each added as it came */
#define M2A_FAST_WIRE_KIND 0xf
#define M2A_FAST_WIRE_OUT 0x10
#define M2A_FAST_WIRE_PARTIALS 0x20
/* The largest hidden of an FP8 combine wire on the load/store path: each warp keeps a
 * row's scales in shared memory, within the 48 KB a launch has without asking. */
#define M2A_FAST_FP8_MAX_HIDDEN 98304

typedef struct {
    m2a_kparams_t p;
    unsigned char *peer[M2A_FAST_MAX_PEERS]; /* every rank's workspace, as this GPU reaches it */
    size_t sig, blocks, ctl;                 /* offsets of the control regions (moe_layout.h) */
    size_t recv_counts, send_map, combine;   /* offsets of arrays the kernels use by name */
    size_t combine_row;                      /* bytes */
    int combine_dtype;                       /* moea2a_datatype_t */
    size_t hidden;
    int sanitize, rewrite;
    /* How the combine's rows travel: M2A_FAST_AS_IS, or FP8 (M2A_FAST_FP8 with fp32
     * scales, M2A_FAST_FP8_UE8M0): the send half quantizes each valid row of the combine
     * buffer in place, codes then scales from the row's start (moea2a_moe(3), "FP8
     * combine"; hidden a multiple of 128 with fp8c's shared memory within
     * M2A_FAST_FP8_MAX_HIDDEN), the receive half dequantizes and sums. */
    int combine_fp8;
    /* quantize on dispatch overlapped with the dispatch (0: the payload rows were
     * complete before the launch): chunk c of qrows tokens may be copied once the
     * counter c at M2A_FAST_CTL_QREADY holds its rows x qgroups */
    int qrows;
    uint32_t qgroups;
    /* FP8 quantized inside the dispatch's copies (0: none). Bit a: byte array a holds
     * FP8 codes (a whole number of 128-value blocks per row, starting a multiple of 512
     * bytes into a token's arrays laid end to end) that the kernel makes from the
     * 16-bit rows at payloads.p[a] (2 bytes per code, 16-byte aligned), writing their
     * row-major scales into array a + 1; qfuse_ue8m0: UE8M0 scales; qfuse_f16: fp16
     * rows (else bf16). */
    uint32_t qfuse, qfuse_ue8m0, qfuse_f16;
    /* The in-copy kernels' receive half also finishes the FP8 payloads quantized on
     * dispatch (the separate kernel of m2a_cuda_wire_finish otherwise). For each of
     * nqfin, byte array arr holds the row-major scales as they landed: padding rows'
     * scales become 0, and where mn is not 0 the MN-major copy is made at that
     * workspace offset ([ep][width / 4][stride rounded up to 4] words, 0 past each
     * source's count). */
    int nqfin;
    struct {
        int32_t arr;
        size_t mn;
    } qfin[MOEA2A_MOE_MAX_PAYLOADS];
    /* the dispatch takes its few-token way (units split evenly over the warps, each
     * block routing its own tokens) up to this many tokens per block
     * (MOEA2A_DISPATCH_EVEN_TOKENS), the counter's way past it */
    int even_tokens;
    unsigned long long timeout_ns;
    m2a_fast_error_t *err;      /* device memory: the record the kernels race for */
    m2a_fast_error_t *host_err; /* mapped pinned memory: the copy the host reads */
    /* host only: the context was created with MOEA2A_MOE_GENERAL_PLACEMENT, so the
     * dispatch launches the kernels of the general rule (placement.cuh) */
    int general;
} m2a_fast_t;

/* What a launch does: the send half (route, write into the peers, signal), the
 * receive half (wait, check, sanitize / reduce), or both in one kernel. A receive-only
 * launch must follow its send-only launch on the stream. M2A_FAST_QUIET (dispatch,
 * with M2A_FAST_SEND alone): no signal at the end of the send half; the copy-engine
 * mode moves the rows after it and then signals with m2a_fast_signal. */
enum { M2A_FAST_SEND = 1, M2A_FAST_RECV = 2, M2A_FAST_BOTH = 3, M2A_FAST_QUIET = 4 };

/* How the load/store combine reduces past the even split (fast_bulk). */
enum {
    M2A_FAST_BULK_OK = 0,
    M2A_FAST_BULK_ROWS, /* a token may reach more ranks than a stage holds rows */
    M2A_FAST_BULK_ARCH, /* the GPU is before sm_90 */
    M2A_FAST_BULK_SMEM  /* the GPU refused the kernels that shared memory */
};

/* The expert-major layout (cuda/kernels/expert_kernels.cu). The slots are split into at most this many parts, each counted and filled by its
 * own blocks (a block per local expert and part); the workspace holds one count per
 * (part, local expert) (moe_layout.h). */
#define M2A_EXPERT_MAX_PARTS 16
/* Byte arrays a row carries: each payload, and a quantized one's scales [and global
 * scale]. */
#define M2A_EXPERT_MAX_ARRAYS (3 * MOEA2A_MOE_MAX_PAYLOADS)

/* Everything the kernels read and write, device pointers into the workspace. */
typedef struct {
    int ep, me, k, num_experts, num_local, num_arrays, align, zero_padding;
    int32_t invalid_id;
    int64_t max_rows;                     /* the bound on rows, padding included */
    /* the placement's replicas (m2a_kparams_t.holders, nrep): while in force, an entry
     * of a local expert is this rank's only when the rule sends it here */
    const int32_t *holders, *nrep;
    const int32_t *recv_counts;           /* [ep] */
    const int32_t *ids, *src_index;       /* rank-major [ep][stride][k], [ep][stride] */
    const float *weights;                 /* rank-major [ep][stride][k]; NULL unless carried */
    const int32_t *global_of;             /* [num_local]: the global id of each local expert */
    int32_t *part_counts;                 /* [M2A_EXPERT_MAX_PARTS][num_local] */
    int32_t *counts, *offsets;            /* [num_local], [num_local + 1] */
    int64_t *rows;                        /* rows used, padding included; -1 over max_rows */
    int32_t *map;                         /* [ep][stride][k]: the row of each entry, -1 */
    int32_t *xid, *xrank, *xtok, *xslot;  /* per row */
    float *xw;                            /* per row; NULL unless weights are carried */
    /* each byte array: rank-major rows, expert-major rows, bytes per row, whether gap
     * rows get zeros always (scales) or only with zero_padding (payloads, codes) */
    const unsigned char *src[M2A_EXPERT_MAX_ARRAYS];
    unsigned char *dst[M2A_EXPERT_MAX_ARRAYS];
    size_t width[M2A_EXPERT_MAX_ARRAYS];
    int always_zero[M2A_EXPERT_MAX_ARRAYS];
    int vbytes[M2A_EXPERT_MAX_ARRAYS]; /* set by the launcher: the chunk the copy moves, 16, 4 or 1 */
} m2a_kexpert_t;

/* The FP4 expert GEMM (cuda/kernels/fp4_gemm*.cu). The most local experts one call takes (each block keeps their tile counts). */
#define M2A_GEMM_MAX_EXPERTS 1024

typedef struct {
    int num_experts;
    int swiglu;   /* C holds silu(C[:, j]) * C[:, j + n/2], j < n/2 */
    int out_fp32; /* else bf16 */
    int slots;    /* rank-major: ids per A row (0: expert-major) */
    int32_t first_expert; /* rank-major: the global id of local expert 0 */
    int no_wgmma;         /* 1: mma.sync even where Hopper's wgmma kernel could run */
    int no_ws;            /* 1: on Hopper the block-synchronous wgmma kernel even where the TMA one could run */
    int64_t n, k, rows;   /* rows: A's rows (expert-major) or id rows (rank-major) */
    int64_t lda, ldc;     /* elements */
    const uint16_t *a;
    /* expert-major: expert e's rows [offsets[e], offsets[e] + counts[e]) of A and C */
    const int32_t *counts, *offsets;
    /* rank-major: ids [rows][slots]; the launcher lists each expert's (row, slot) pairs
     * in list (ascending), with list_counts/list_offsets, in the caller's workspace */
    const int32_t *ids;
    int32_t *list, *list_counts, *list_offsets;
    const uint8_t *w;  /* [num_experts][n][k/2] */
    const uint8_t *sf; /* [num_experts][sf_stride], 128x4 */
    size_t sf_stride;
    const float *g; /* [num_experts] */
    void *c;
} m2a_kgemm_t;

/* The GEMM carries each weight in bf16 as e2m1 x SF x 2^-8 (exact: an E2M1 code spread
 * into a bf16 is the value x 2^-126, multiplied by the block's scale x 2^118), so its fp32
 * sums come out 2^-8 of their value: the epilogue multiplies them by M2A_GEMM_UNSCALE / g,
 * and the host reference rounds the same way. */
#define M2A_GEMM_UNSCALE 256.0f
#define M2A_GEMM_SCALE_TABLE 0x1p118f /* 2^(126 - 8) */

/* Workspace bytes the rank-major entry needs for rows x slots ids (0 for
 * expert-major): the list, then counts and offsets per expert. */
static inline size_t m2a_gemm_workspace_bytes(int num_experts, int64_t rows, int slots)
{
    return slots <= 0 ? 0 : 4 * ((size_t)rows * (size_t)slots + 2 * (size_t)num_experts);
}

/* Quantize on dispatch around the copies (cuda/kernels/wire_kernels.cu): one payload
 * quantized on dispatch, as its receive side finishes it. */
typedef struct {
    size_t srow;          /* scale bytes of a row as it lands */
    unsigned char *rows;  /* [ep][stride][srow]: the row scales as they landed */
    unsigned char *mn;    /* FP8 MN-major: [ep][srow / 4][stride rounded up to 4] words; else NULL */
    const float *g_rows;  /* NVFP4: [ep][stride] the global scale each row carried; else NULL */
    float *g;             /* NVFP4: [ep] per source, 0 where it sent nothing */
} m2a_kwire_t;

/* ---- the module --------------------------------------------------------------------- */

/* 2: the expert-major layout's kernels; 3: the FP4 expert GEMM; 4: copy-engine mode;
 * 5: m2a_kgemm_t.no_wgmma; 6: m2a_fast_t's FP8 quantized inside the copies (qfuse..., qfin);
 * 7: fast_bulk; 8: CUDA IPC and the device's identity (the load/store path without NCCL),
 * load_kernels for fast_load and quantize_alongside_load; 9: pack's block and src_index (rows
 * relayed inside a node by the hierarchical path); 10: m2a_fast_t.combine_fp8; 11: the
 * generic paths' FP8 combine wire (combine's wire, combine_quantize); 12: the waits read
 * m2a_fast_error_t.dead; 13: write_words (a placement changed on the stream); 14:
 * count_load (the experts' load on the device); 15: the general placement, replicas
 * and experts held by no rank (m2a_kparams_t.holders, nrep, dropped_sums; route's
 * dropped entries, count_load's src_index; m2a_fast_t.general); 16: combine's
 * M2A_FAST_WIRE_OUT and M2A_FAST_WIRE_PARTIALS (the FP8 wire on the hierarchical path);
 * 17: fp4_quantize's g_rows, in place of wire_fill */
#define MOEA2A_CUDA_ABI_VERSION 17
#define MOEA2A_CUDA_SYMBOL "moea2a_cuda_v1"
#define M2A_CUDA_MODULE_NAME "cuda" /* libmoea2a-cuda.so on the module search path */

/* The cudaError_t values the core tells apart (the module checks they match). */
#define M2A_CUDA_NOT_READY 600     /* cudaErrorNotReady: stream_query, work pending */
#define M2A_CUDA_NOT_SUPPORTED 801 /* cudaErrorNotSupported: a kernel's shape limit */
/* cudaMemcpyKind values for copy / copy_async. */
enum { M2A_CUDA_H2D = 1, M2A_CUDA_D2H = 2, M2A_CUDA_D2D = 3 };
/* the size of a cudaIpcMemHandle_t (the module checks) */
#define M2A_CUDA_IPC_HANDLE_BYTES 64

typedef struct moea2a_cuda_v1 {
    const char *name; /* "cuda" */
    int abi_version;  /* MOEA2A_CUDA_ABI_VERSION */
    int runtime_version; /* CUDART_VERSION it was built with */

    const char *(*error_string)(int err);
    /* Returns and clears the last launch error (cudaGetLastError). */
    int (*clear_error)(void);
    int (*set_device)(int device);
    int (*get_device)(int *device);
    int (*sm_count)(int device, int *sms);
    int (*mem_info)(size_t *free_bytes, size_t *total_bytes);
    int (*malloc)(void **ptr, size_t bytes);
    void (*free)(void *ptr);
    /* Pinned host memory mapped into the device's address space (and portable). */
    int (*host_alloc_mapped)(void **ptr, size_t bytes);
    void (*host_free)(void *ptr);
    int (*host_device_pointer)(void **device_ptr, void *host_ptr);
    int (*copy)(void *dst, const void *src, size_t bytes, int kind);
    int (*copy_async)(void *dst, const void *src, size_t bytes, int kind, void *stream);
    int (*set)(void *ptr, int value, size_t bytes);
    int (*set_async)(void *ptr, int value, size_t bytes, void *stream);
    int (*device_synchronize)(void);
    /* 0 when the stream's work is done, M2A_CUDA_NOT_READY while it runs, else an error. */
    int (*stream_query)(void *stream);
    int (*stream_synchronize)(void *stream);
    /* *capturing = 1 while the stream is being captured into a graph */
    int (*stream_capturing)(void *stream, int *capturing);

    /* The kernels (cuda/kernels/moe_kernels.h, moe_fast.h, fp4_kernels.h, fp8_kernels.h, wire_kernels.h). */
    int (*route)(const m2a_kparams_t *p, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                 unsigned long long *stats, void *stream);
    int (*pack)(const m2a_kparams_t *p, int n, int stride, m2a_kpayloads_t payloads, const int32_t *ids,
                const float *weights, const int32_t *send_map, unsigned char *ws, unsigned char *stage_send, int block,
                const void *src_index, void *stream);
    int (*sanitize)(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, int32_t *ids, int32_t *src_index,
                    int sanitize, int rewrite_nonlocal, void *stream);
    /* dst[0..n) = src[0..n) (host memory, read before the call returns), in order on
     * stream and capturable: the words travel in kernel launches' parameters. */
    int (*write_words)(int32_t *dst, const int32_t *src, int n, void *stream);
    /* load[e] += the last dispatch's received entries naming e that this rank holds
     * (each expert once per slot; with replicas, the entries the rule sends here), in
     * order on stream */
    int (*count_load)(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, const int32_t *ids,
                      const int32_t *src_index, int64_t *load, void *stream);
    int (*combine)(const m2a_kparams_t *p, int n, const int32_t *send_map, moea2a_datatype_t dtype, size_t hidden,
                   int wire, const unsigned char *self_rows, const unsigned char *landing, void *out, void *stream);
    int (*combine_quantize)(int ep, int stride, const int32_t *recv_counts, moea2a_datatype_t dtype, size_t hidden,
                            int wire, const unsigned char *in, size_t in_row, unsigned char *out, size_t out_row,
                            void *stream);
    int (*fast_dispatch)(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                         const int32_t *ids, const float *weights, int phases, void *stream);
    int (*fast_combine)(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows, void *out,
                        int status, int phases, void *stream);
    /* Prints the load/store kernels' phase means (builds with M2A_FAST_PROFILE); NULL otherwise. */
    void (*fast_profile_report)(int rank);
    int (*fp4_global_scale)(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream);
    /* g_rows: NULL, or m floats each given *g (the global scale each row of a dispatch
     * carries; g_rows may be g itself) */
    int (*fp4_quantize)(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q, void *sf,
                        int layout, float *g_rows, void *stream);
    int (*fp4_dequantize)(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k, void *out,
                          moea2a_datatype_t otype, void *stream);
    int (*fp4_sf_convert)(const void *src, int src_layout, void *dst, int dst_layout, size_t m, size_t k,
                          const int32_t *counts, int stride, void *stream);
    int (*fp8_quantize)(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales, int layout,
                        int ue8m0, void *stream);
    int (*fp8_dequantize)(const void *q, const void *scales, int layout, int ue8m0, size_t m, size_t k, void *out,
                          moea2a_datatype_t otype, void *stream);
    /* quantize on dispatch (cuda/kernels/wire_kernels.h) */
    int (*wire_finish)(const m2a_kwire_t *w, int ep, int stride, const int32_t *counts, void *stream);
    /* the expert-major layout (cuda/kernels/expert_kernels.h) */
    int (*expert_expand)(const m2a_kexpert_t *x, int stride, void *stream);
    int (*expert_fold)(const m2a_kexpert_t *x, int stride, moea2a_datatype_t dtype, size_t hidden, int weighted,
                       const unsigned char *rows, unsigned char *combine, void *stream);
    /* the FP4 expert GEMM (cuda/kernels/fp4_gemm.h) */
    int (*expert_gemm)(const m2a_kgemm_t *p, void *stream);
    /* count copies in stream order, by the copy engines as one batch where the runtime
     * can (cudaMemcpyBatchAsync; one cudaMemcpyAsync each otherwise) */
    int (*copy_batch)(void *const *dst, const void *const *src, const size_t *bytes, size_t count, void *stream);
    int (*fast_signal)(const m2a_fast_t *f, int blocks, void *stream);
    int (*fast_landing_reduce)(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *landing,
                               const int32_t *index, void *out, void *stream);
    /* quantize on dispatch overlapped with the dispatch: FP8 with per-chunk counters
     * (fp8_kernels.h), on a stream of the context's forked from the caller's and joined
     * back with events (capturable) */
    int (*fp8_quantize_ready)(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales,
                              int ue8m0, uint32_t *ready, uint32_t chunk_rows, int blocks, void *stream);
    /* Every kernel the MoE calls launch, loaded now rather than at its first launch:
     * with CUDA's lazy loading a first launch waits for every kernel running in the
     * context, and these wait for each other (cuda/kernels/load.cuh). */
    int (*load_kernels)(void);
    int (*stream_create)(void **stream); /* non-blocking: no implicit order with the legacy stream */
    void (*stream_destroy)(void *stream);
    int (*event_create)(void **event); /* no timing */
    void (*event_destroy)(void *event);
    int (*event_record)(void *event, void *stream);
    int (*stream_wait_event)(void *stream, void *event);
    /* how the load/store combine reduces past the even split (m2a_fast_bulk: not a
     * cudaError_t but M2A_FAST_BULK_OK or why not) */
    int (*fast_bulk)(const m2a_fast_t *f, size_t *unit, int *stages, size_t *smem);
    /* Symmetric memory by CUDA IPC (lib/moe/backend/symmetric_ipc.c). device_uuid: the GPU's
     * identity across processes (16 bytes). ipc_export: the handle (M2A_CUDA_IPC_HANDLE_BYTES)
     * of a cudaMalloc'ed allocation; ipc_import maps another process's into this one
     * (peer access enabled where the GPUs differ), ipc_close unmaps it. peer_access:
     * this process's current GPU loads from and stores to `peer`'s memory (enables it;
     * cudaErrorPeerAccessUnsupported where it cannot). */
    int (*device_uuid)(int device, unsigned char *uuid);
    int (*ipc_export)(void *ptr, void *handle);
    int (*ipc_import)(const void *handle, void **ptr);
    int (*ipc_close)(void *ptr);
    int (*peer_access)(int peer);
} moea2a_cuda_v1_t;

#ifdef __cplusplus
}
#endif
#endif

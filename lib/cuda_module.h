/* The interface between the moea2a core and its CUDA module, libmoea2a-cuda.so
 * (cuda/cuda_module.c plus kernels/): the CUDA runtime calls and kernel launches that
 * the MoE and NVFP4 calls make on device memory. The core never links the CUDA
 * runtime, so one core package serves GPU and CPU-only nodes; a call on CUDA memory
 * loads the module on first use (m2a_cuda_require), and without it fails with
 * MOEA2A_ERR_UNAVAILABLE naming the module.
 *
 * The module exports one symbol, MOEA2A_CUDA_SYMBOL, of type moea2a_cuda_v1_t. Every
 * int-returning member returns 0 or a cudaError_t value (error_string names it). Like
 * the transports, the module ships with the library it was built with (the kernels'
 * parameter structs are shared headers); the version guards against a stray file. */
#ifndef M2A_CUDA_MODULE_H
#define M2A_CUDA_MODULE_H
#include <stddef.h>
#include <stdint.h>

#include "fp4_gemm.h"
#include "fp4_kernels.h"
#include "fp8_kernels.h"
#include "moe_fast.h"
#include "moe_kernels.h"
#include "expert_kernels.h"
#include "wire_kernels.h"

/* 2: the expert-major layout's kernels; 3: the FP4 expert GEMM; 4: copy-engine mode;
 * 5: m2a_kgemm_t.no_wgmma; 6: m2a_fast_t's FP8 quantized inside the copies (qfuse..., qfin);
 * 7: fast_bulk; 8: CUDA IPC and the device's identity (the load/store path without NCCL),
 * load_kernels for fast_load and quantize_alongside_load */
#define MOEA2A_CUDA_ABI_VERSION 8
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

    /* The kernels (kernels/moe_kernels.h, moe_fast.h, fp4_kernels.h, fp8_kernels.h, wire_kernels.h). */
    int (*route)(const m2a_kparams_t *p, int n, const int32_t *ids, int32_t *send_counts, int32_t *send_map,
                 unsigned long long *stats, void *stream);
    int (*pack)(const m2a_kparams_t *p, int n, int stride, m2a_kpayloads_t payloads, const int32_t *ids,
                const float *weights, const int32_t *send_map, unsigned char *ws, unsigned char *stage_send, void *stream);
    int (*sanitize)(const m2a_kparams_t *p, int stride, const int32_t *recv_counts, int32_t *ids, int32_t *src_index,
                    int sanitize, int rewrite_nonlocal, void *stream);
    int (*combine)(const m2a_kparams_t *p, int n, const int32_t *send_map, moea2a_datatype_t dtype, size_t hidden,
                   const unsigned char *self_rows, const unsigned char *landing, void *out, void *stream);
    int (*fast_dispatch)(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                         const int32_t *ids, const float *weights, int phases, void *stream);
    int (*fast_combine)(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows, void *out,
                        int status, int phases, void *stream);
    /* Prints the load/store kernels' phase means (builds with M2A_FAST_PROFILE); NULL otherwise. */
    void (*fast_profile_report)(int rank);
    int (*fp4_global_scale)(const void *x, moea2a_datatype_t xtype, size_t count, float *g, void *stream);
    int (*fp4_quantize)(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, const float *g, void *q, void *sf,
                        int layout, void *stream);
    int (*fp4_dequantize)(const void *q, const void *sf, int layout, const float *g, size_t m, size_t k, void *out,
                          moea2a_datatype_t otype, void *stream);
    int (*fp4_sf_convert)(const void *src, int src_layout, void *dst, int dst_layout, size_t m, size_t k,
                          const int32_t *counts, int stride, void *stream);
    int (*fp8_quantize)(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales, int layout,
                        int ue8m0, void *stream);
    int (*fp8_dequantize)(const void *q, const void *scales, int layout, int ue8m0, size_t m, size_t k, void *out,
                          moea2a_datatype_t otype, void *stream);
    /* quantize on dispatch (kernels/wire_kernels.h) */
    int (*wire_finish)(const m2a_kwire_t *w, int ep, int stride, const int32_t *counts, void *stream);
    int (*wire_fill)(float *dst, size_t n, void *stream);
    /* the expert-major layout (kernels/expert_kernels.h) */
    int (*expert_expand)(const m2a_kexpert_t *x, int stride, void *stream);
    int (*expert_fold)(const m2a_kexpert_t *x, int stride, moea2a_datatype_t dtype, size_t hidden, int weighted,
                       const unsigned char *rows, unsigned char *combine, void *stream);
    /* the FP4 expert GEMM (kernels/fp4_gemm.h) */
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
     * context, and these wait for each other (kernels/load.cuh). */
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
    /* Symmetric memory by CUDA IPC (lib/moe_symmetric_ipc.c). device_uuid: the GPU's
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
#endif

/* libmoea2a-cuda.so: the CUDA runtime and the kernels behind lib/comm/cuda_module.h. The
 * only file of moea2a, with the kernels, that sees the CUDA runtime's headers; the
 * core reaches it through moea2a_cuda_v1 below. */
#include "config.h"

#include <string.h>

#include <cuda_runtime_api.h>

#include "comm/cuda_module.h"
#include "expert_kernels.h"
#include "fp4_gemm.h"
#include "fp4_kernels.h"
#include "fp8_kernels.h"
#include "moe_fast.h"
#include "moe_kernels.h"
#include "wire_kernels.h"

_Static_assert(M2A_CUDA_NOT_READY == (int)cudaErrorNotReady, "cudaErrorNotReady moved");
_Static_assert(M2A_CUDA_NOT_SUPPORTED == (int)cudaErrorNotSupported, "cudaErrorNotSupported moved");
_Static_assert(M2A_CUDA_IPC_HANDLE_BYTES == sizeof(cudaIpcMemHandle_t), "cudaIpcMemHandle_t changed size");
_Static_assert(M2A_CUDA_H2D == (int)cudaMemcpyHostToDevice && M2A_CUDA_D2H == (int)cudaMemcpyDeviceToHost,
               "cudaMemcpyKind moved");

static const char *error_string(int err) { return cudaGetErrorString((cudaError_t)err); }
static int clear_error(void) { return (int)cudaGetLastError(); }
static int set_device(int device) { return (int)cudaSetDevice(device); }
static int get_device(int *device) { return (int)cudaGetDevice(device); }
static int sm_count(int device, int *sms)
{
    return (int)cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
}
static int mem_info(size_t *free_bytes, size_t *total_bytes) { return (int)cudaMemGetInfo(free_bytes, total_bytes); }
static int dev_malloc(void **ptr, size_t bytes) { return (int)cudaMalloc(ptr, bytes); }
static void dev_free(void *ptr) { (void)cudaFree(ptr); }
static int host_alloc_mapped(void **ptr, size_t bytes)
{
    return (int)cudaHostAlloc(ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
}
static void host_free(void *ptr) { (void)cudaFreeHost(ptr); }
static int host_device_pointer(void **device_ptr, void *host_ptr)
{
    return (int)cudaHostGetDevicePointer(device_ptr, host_ptr, 0);
}
static int copy(void *dst, const void *src, size_t bytes, int kind)
{
    return (int)cudaMemcpy(dst, src, bytes, (enum cudaMemcpyKind)kind);
}
static int copy_async(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
    return (int)cudaMemcpyAsync(dst, src, bytes, (enum cudaMemcpyKind)kind, (cudaStream_t)stream);
}
static int set(void *ptr, int value, size_t bytes) { return (int)cudaMemset(ptr, value, bytes); }
static int set_async(void *ptr, int value, size_t bytes, void *stream)
{
    return (int)cudaMemsetAsync(ptr, value, bytes, (cudaStream_t)stream);
}
static int device_synchronize(void) { return (int)cudaDeviceSynchronize(); }
static int stream_query(void *stream) { return (int)cudaStreamQuery((cudaStream_t)stream); }
static int stream_synchronize(void *stream) { return (int)cudaStreamSynchronize((cudaStream_t)stream); }
static int stream_capturing(void *stream, int *capturing)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    int rc = (int)cudaStreamIsCapturing((cudaStream_t)stream, &st);
    *capturing = st == cudaStreamCaptureStatusActive;
    return rc;
}
/* The batch asks the runtime to read the sources in stream order and to leave the
 * SMs to compute; it is one driver call for thousands of row runs (a call each costs
 * microseconds of host time). The legacy default stream takes no batches: there, and
 * with runtimes before 12.8, one call per copy. */
static int copy_batch(void *const *dst, const void *const *src, const size_t *bytes, size_t count, void *stream)
{
    if (count == 0) return 0;
#if CUDART_VERSION >= 12080
    if (stream != NULL) {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first = 0;
#if CUDART_VERSION >= 13000
        return (int)cudaMemcpyBatchAsync(dst, src, bytes, count, &attr, &first, 1, (cudaStream_t)stream);
#else
        size_t failed = 0;
        return (int)cudaMemcpyBatchAsync((void **)dst, (void **)src, (size_t *)bytes, count, &attr, &first, 1, &failed,
                                         (cudaStream_t)stream);
#endif
    }
#endif
    for (size_t i = 0; i < count; i++) {
        cudaError_t e = cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDefault, (cudaStream_t)stream);
        if (e != cudaSuccess) return (int)e;
    }
    return 0;
}
static int stream_create(void **stream)
{
    return (int)cudaStreamCreateWithFlags((cudaStream_t *)stream, cudaStreamNonBlocking);
}
static void stream_destroy(void *stream) { (void)cudaStreamDestroy((cudaStream_t)stream); }
static int event_create(void **event) { return (int)cudaEventCreateWithFlags((cudaEvent_t *)event, cudaEventDisableTiming); }
static void event_destroy(void *event) { (void)cudaEventDestroy((cudaEvent_t)event); }
static int event_record(void *event, void *stream) { return (int)cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream); }
static int stream_wait_event(void *stream, void *event)
{
    return (int)cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
}
static int device_uuid(int device, unsigned char *uuid)
{
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e == cudaSuccess) memcpy(uuid, &p.uuid, 16);
    return (int)e;
}
static int ipc_export(void *ptr, void *handle) { return (int)cudaIpcGetMemHandle((cudaIpcMemHandle_t *)handle, ptr); }
static int ipc_import(const void *handle, void **ptr)
{
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    return (int)cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
}
static int ipc_close(void *ptr) { return (int)cudaIpcCloseMemHandle(ptr); }
static int peer_access(int peer)
{
    int self, ok = 0;
    cudaError_t e = cudaGetDevice(&self);
    if (e == cudaSuccess && self == peer) return 0;
    if (e == cudaSuccess) e = cudaDeviceCanAccessPeer(&ok, self, peer);
    if (e == cudaSuccess && !ok) return (int)cudaErrorPeerAccessUnsupported;
    if (e == cudaSuccess) e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) { /* another context of this process enabled it */
        (void)cudaGetLastError();
        e = cudaSuccess;
    }
    return (int)e;
}
static int load_kernels(void)
{
    int e = m2a_fast_load();
    if (!e) e = m2a_cuda_moe_load();
    if (!e) e = m2a_cuda_fp8_load();
    if (!e) e = m2a_cuda_fp4_load();
    if (!e) e = m2a_cuda_wire_load();
    if (!e) e = m2a_cuda_expert_load();
    return e;
}

#ifdef M2A_FAST_PROFILE
#define PROFILE_REPORT m2a_fast_profile_report
#else
#define PROFILE_REPORT NULL
#endif

__attribute__((visibility("default"))) const moea2a_cuda_v1_t moea2a_cuda_v1 = {
    .name = M2A_CUDA_MODULE_NAME,
    .abi_version = MOEA2A_CUDA_ABI_VERSION,
    .runtime_version = CUDART_VERSION,
    .error_string = error_string,
    .clear_error = clear_error,
    .set_device = set_device,
    .get_device = get_device,
    .sm_count = sm_count,
    .mem_info = mem_info,
    .malloc = dev_malloc,
    .free = dev_free,
    .host_alloc_mapped = host_alloc_mapped,
    .host_free = host_free,
    .host_device_pointer = host_device_pointer,
    .copy = copy,
    .copy_async = copy_async,
    .set = set,
    .set_async = set_async,
    .device_synchronize = device_synchronize,
    .stream_query = stream_query,
    .stream_synchronize = stream_synchronize,
    .stream_capturing = stream_capturing,
    .route = m2a_cuda_route,
    .pack = m2a_cuda_pack,
    .sanitize = m2a_cuda_sanitize,
    .write_words = m2a_cuda_write_words,
    .count_load = m2a_cuda_count_load,
    .combine = m2a_cuda_combine,
    .combine_quantize = m2a_cuda_combine_quantize,
    .fast_dispatch = m2a_fast_dispatch,
    .fast_combine = m2a_fast_combine,
    .fast_profile_report = PROFILE_REPORT,
    .fp4_global_scale = m2a_cuda_fp4_global_scale,
    .fp4_quantize = m2a_cuda_fp4_quantize,
    .fp4_dequantize = m2a_cuda_fp4_dequantize,
    .fp4_sf_convert = m2a_cuda_fp4_sf_convert,
    .fp8_quantize = m2a_cuda_fp8_quantize,
    .fp8_dequantize = m2a_cuda_fp8_dequantize,
    .wire_finish = m2a_cuda_wire_finish,
    .expert_expand = m2a_cuda_expert_expand,
    .expert_fold = m2a_cuda_expert_fold,
    .expert_gemm = m2a_cuda_expert_gemm,
    .copy_batch = copy_batch,
    .fast_signal = m2a_fast_signal,
    .fast_landing_reduce = m2a_fast_landing_reduce,
    .fp8_quantize_ready = m2a_cuda_fp8_quantize_ready,
    .load_kernels = load_kernels,
    .fast_bulk = m2a_fast_bulk,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .stream_wait_event = stream_wait_event,
    .device_uuid = device_uuid,
    .ipc_export = ipc_export,
    .ipc_import = ipc_import,
    .ipc_close = ipc_close,
    .peer_access = peer_access,
};

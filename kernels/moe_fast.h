/* The load/store (NVLink) path of dispatch and combine: one kernel each, launched on
 * the caller's stream, moving rows straight between the ranks' workspaces through
 * the peer pointers of a symmetric allocation. No host synchronization, so both can
 * be captured in a CUDA graph; every wait on a peer is bounded and ends the kernel
 * with an error record instead of a trap. */
#ifndef M2A_MOE_FAST_H
#define M2A_MOE_FAST_H
#include <stddef.h>
#include <stdint.h>

#include "moe_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * it concerns, what the step (M2A_FAST_AT_*). */
typedef struct {
    int32_t code, peer, what, pad;
} m2a_fast_error_t;

enum {
    M2A_FAST_AT_GATE = 1,
    M2A_FAST_AT_ARRIVE,
    M2A_FAST_AT_HEADER,
    M2A_FAST_AT_COMBINE,
    M2A_FAST_AT_PREFIX,
    M2A_FAST_AT_COMBINE_HEADER,
    M2A_FAST_AT_QUANTIZE
};

typedef struct {
    m2a_kparams_t p;
    unsigned char *peer[M2A_FAST_MAX_PEERS]; /* every rank's workspace, as this GPU reaches it */
    size_t sig, blocks, ctl;                 /* offsets of the control regions (moe_layout.h) */
    size_t recv_counts, send_map, combine;   /* offsets of arrays the kernels use by name */
    size_t combine_row;                      /* bytes */
    int combine_dtype;                       /* moea2a_datatype_t */
    size_t hidden;
    int sanitize, rewrite;
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
    unsigned long long timeout_ns;
    m2a_fast_error_t *err;      /* device memory: the record the kernels race for */
    m2a_fast_error_t *host_err; /* mapped pinned memory: the copy the host reads */
} m2a_fast_t;

/* What a launch does: the send half (route, write into the peers, signal), the
 * receive half (wait, check, sanitize / reduce), or both in one kernel. A receive-only
 * launch must follow its send-only launch on the stream. M2A_FAST_QUIET (dispatch,
 * with M2A_FAST_SEND alone): no signal at the end of the send half; the copy-engine
 * mode moves the rows after it and then signals with m2a_fast_signal. */
enum { M2A_FAST_SEND = 1, M2A_FAST_RECV = 2, M2A_FAST_BOTH = 3, M2A_FAST_QUIET = 4 };

/* status != 0: this rank failed its argument checks; it sends nothing and tells every
 * peer, whose kernels record that error. */
int m2a_fast_dispatch(const m2a_fast_t *f, int blocks, int n, int stride, int status, m2a_kpayloads_t payloads,
                      const int32_t *ids, const float *weights, int phases, void *stream);
/* expert_rows: NULL when the expert side wrote into the workspace's combine buffer.
 * status != 0 (send half): this rank's combine failed its checks; the peers' receive
 * halves record that error instead of reading its rows. */
int m2a_fast_combine(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *expert_rows, void *out,
                     int status, int phases, void *stream);
/* The signal a dispatch's send half ends with, on its own (one small block): every
 * rank's arrival count for this rank moves by `blocks` (the peers wait for blocks per
 * dispatch). After a QUIET send half and the rows the host had copied. */
int m2a_fast_signal(const m2a_fast_t *f, int blocks, void *stream);
/* Loads this file's kernels now (kernels/load.cuh says why). */
int m2a_fast_load(void);
/* Copy-engine mode's combine sum, once the rows are in this GPU's memory: out[t] = the
 * sum of token t's rows (this rank's own in its combine buffer, the others' in
 * landing[index[rank]][cap][combine row]) in the load/store combine's arithmetic. */
int m2a_fast_landing_reduce(const m2a_fast_t *f, int blocks, int n, int stride, const unsigned char *landing,
                            const int32_t *index, void *out, void *stream);
/* Whether the combine (and copy-engine mode's sum) can reduce through bulk copies where
 * the even split does not apply, given 16-byte rows: M2A_FAST_BULK_OK, or why not. With
 * *unit the bytes of a token's row per unit, *stages the units in flight per warp and
 * *smem the most dynamic shared memory a block asks for. */
enum {
    M2A_FAST_BULK_OK = 0,
    M2A_FAST_BULK_ROWS, /* a token may reach more ranks than a stage holds rows */
    M2A_FAST_BULK_ARCH, /* the GPU is before sm_90 */
    M2A_FAST_BULK_SMEM  /* the GPU refused the kernels that shared memory */
};
int m2a_fast_bulk(const m2a_fast_t *f, size_t *unit, int *stages, size_t *smem);
#ifdef M2A_FAST_PROFILE
void m2a_fast_profile_report(int rank); /* prints the phase means to stderr, then resets */
#endif

#ifdef __cplusplus
}
#endif
#endif

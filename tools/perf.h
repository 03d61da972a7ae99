/* moea2a_perf internals: options, and the two benchmarks (generic collectives and
 * MoE dispatch/combine), each run by every rank on an initialized communicator. */
#ifndef MOEA2A_PERF_H
#define MOEA2A_PERF_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"
#include "perf_mem.h"

typedef enum { OP_ALLTOALLV, OP_ALLGATHER, OP_BCAST, OP_MOE, OP_FP4, OP_FP8, OP_EXPERT_GEMM } perf_op_t;

#define PERF_MAX_TOKEN_SIZES 16

/* --wire: FP8 with fp32 scales (MN-major, as DeepGEMM reads them), FP8 with UE8M0
 * scales (MN-major), NVFP4 (128x4 scales) */
enum { PERF_WIRE_NONE, PERF_WIRE_FP8, PERF_WIRE_FP8_UE8M0, PERF_WIRE_NVFP4 };

typedef struct {
    perf_op_t op;
    size_t min_bytes, max_bytes; /* generic collectives */
    int factor, iters, warmup, check;
    moea2a_datatype_t dtype;
    const char *mem;
    /* MoE */
    int tokens[PERF_MAX_TOKEN_SIZES], ntokens;
    int hidden, topk, experts, baseline, weights;
    double skew; /* probability that an expert is drawn from rank 0's experts */
    int fp4_rows; /* --op fp4 / fp8: M (K is --hidden) */
    int sms[PERF_MAX_TOKEN_SIZES], nsms; /* --sms: SM budgets (num_sms) to run each size at */
    int split;                          /* --split: the split halves, and their overlap with a GEMM */
    int wire;                           /* --wire: payload 0 quantized on dispatch (PERF_WIRE_*) */
    int combine_wire;                   /* --combine-wire: 0 as is, 1 FP8, 2 FP8 with UE8M0 scales */
    int expert_align;                   /* --layout expert[:ALIGN]: the expert-major layout (0: rank-major) */
    int copy_engine;                    /* --engine ce: MOEA2A_MOE_COPY_ENGINE */
    int general;                        /* --placement general: MOEA2A_MOE_GENERAL_PLACEMENT */
    int moves;                          /* --moves: placement changes timed per size (0: none) */
    int kernels;                        /* --kernels: each call's GPU work listed (rank 0) */
    int kernel_times;                   /* ranks as processes: CUPTI's kernel times (perf_kernel_time.h) */
    /* --op expert-gemm: local experts (--experts), shapes n:k (--gemm-shapes); rows per
     * expert are --tokens */
    int gemm_experts, gemm_nshapes;
    int gemm_n[PERF_MAX_TOKEN_SIZES], gemm_k[PERF_MAX_TOKEN_SIZES];
} perf_opts_t;

/* Test data of the single-device benchmarks (--op fp4, fp8, expert-gemm): a short
 * splitmix-style hash of an index (perf_moe.c's routing keeps its own, full one). */
static inline uint64_t perf_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    return x ^ (x >> 31);
}

double perf_now(void);
/* Across ranks: the largest of each rank's t, and the sum of each rank's v. */
moea2a_result_t perf_reduce(moea2a_comm_t comm, double t, double v, double *tmax, double *vsum);

/* Exit status: 0 ok, 1 error, 3 wrong values. */
int perf_coll(moea2a_comm_t comm, const perf_opts_t *o);
int perf_moe(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m);
/* --op fp4 and fp8 */
int perf_quant(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m);
/* --op expert-gemm */
int perf_egemm(moea2a_comm_t comm, const perf_opts_t *o, perf_mem_t *m);
#endif

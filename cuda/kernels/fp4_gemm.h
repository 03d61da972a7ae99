/* The FP4 expert GEMM on CUDA memory (moea2a_expert(3); lib/quant/expert_gemm.c checks the
 * arguments and holds the host reference). For each local expert e,
 * C_e = A_e . dequant(W_e)^T with bf16 A rows, NVFP4 weights [n][k/2] with 128x4 E4M3
 * scales and one fp32 global scale per expert, fp32 accumulation on the tensor cores.
 * Every count is read on the device (graph-capturable); rows past an expert's count
 * are neither read nor written. Returns 0 or the cudaError_t of its launches. */
#ifndef M2A_FP4_GEMM_H
#define M2A_FP4_GEMM_H
#include <stddef.h>
#include <stdint.h>

#include "comm/cuda_module.h"

#ifdef __cplusplus
extern "C" {
#endif

int m2a_cuda_expert_gemm(const m2a_kgemm_t *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif

/* What the quantization calls (fp4.c, fp8.c) share: the 16/32-bit float inputs and
 * outputs as fp32, the memory space of a call's pointers, and the launch of a CUDA
 * module kernel when they are device memory. Each macro expects `fn`, the public
 * function's name, in scope. */
#ifndef M2A_QUANT_H
#define M2A_QUANT_H
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/memtype.h"
#include "base/convert.h"
#include "comm/cuda.h"
#include "base/error.h"

static inline int m2a_quant_float_type(moea2a_datatype_t t)
{
    return t == MOEA2A_BFLOAT16 || t == MOEA2A_FLOAT16 || t == MOEA2A_FLOAT32;
}

static inline float m2a_quant_load(const void *x, moea2a_datatype_t t, size_t i)
{
    uint16_t h;
    float f;
    switch (t) {
    case MOEA2A_BFLOAT16: memcpy(&h, (const char *)x + 2 * i, 2); return m2a_bf16_to_f32(h);
    case MOEA2A_FLOAT16: memcpy(&h, (const char *)x + 2 * i, 2); return m2a_f16_to_f32(h);
    default: memcpy(&f, (const char *)x + 4 * i, 4); return f;
    }
}

static inline void m2a_quant_store(void *x, moea2a_datatype_t t, size_t i, float f)
{
    uint16_t h;
    switch (t) {
    case MOEA2A_BFLOAT16: h = m2a_f32_to_bf16(f); memcpy((char *)x + 2 * i, &h, 2); break;
    case MOEA2A_FLOAT16: h = m2a_f32_to_f16(f); memcpy((char *)x + 2 * i, &h, 2); break;
    default: memcpy((char *)x + 4 * i, &f, 4); break;
    }
}

/* One memory space for every pointer of a call: 1 = CUDA, 0 = host, -1 = mixed. */
static inline int m2a_quant_space(const void *const *ptrs, int n)
{
    int cuda = -2;
    for (int i = 0; i < n; i++) {
        if (!ptrs[i]) continue;
        int c = m2a_memtype(ptrs[i]) == MOEA2A_MEM_CUDA;
        if (cuda != -2 && c != cuda) return -1;
        cuda = c;
    }
    return cuda == 1;
}

/* CUDA memory: the CUDA module's kernel (the module loads on first use; without it
 * MOEA2A_ERR_UNAVAILABLE names it). */
#define M2A_QUANT_CUDA_OR(launch)                                                                              \
    do {                                                                                                       \
        const moea2a_cuda_v1_t *ops_;                                                                          \
        M2A_TRY(m2a_cuda_require(NULL, fn, &ops_));                                                            \
        int e_ = ops_->launch;                                                                                 \
        return e_ ? m2a_error(NULL, MOEA2A_ERR_CUDA, "%s: %s", fn, ops_->error_string(e_)) : MOEA2A_SUCCESS;   \
    } while (0)

#define M2A_QUANT_CHECK_SPACE(cuda, fn)                                                                        \
    M2A_CHECK_ARG(NULL, (cuda) >= 0, "%s: all pointers must be in the same memory (host or CUDA)", fn)

/* The CUDA kernels move 16-byte vectors of values and codes, and 4-byte words of
 * scales: device buffers must be aligned so (cudaMalloc gives 256 bytes). */
#define M2A_QUANT_CHECK_ALIGNED(cuda, fn, values, codes, scales)                                               \
    M2A_CHECK_ARG(NULL, !(cuda) || ((((uintptr_t)(values) | (uintptr_t)(codes)) & 15) == 0 &&                  \
                                    ((uintptr_t)(scales) & 3) == 0),                                           \
                  "%s: device buffers must be 16-byte aligned (scales 4-byte aligned)", fn)
#endif

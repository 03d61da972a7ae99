/* The host loops of the quantization calls, without their argument checks: for the
 * public calls on host memory (fp4.c, fp8.c) and for quantize on dispatch on the host
 * path (lib/moe/backend/host_kernels.c), so both produce the same bits. Layouts as in moea2a_fp4(3) and
 * moea2a_fp8(3); k a multiple of the block. */
#ifndef M2A_QUANT_HOST_H
#define M2A_QUANT_HOST_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

/* 448 x 6 / amax(|x|) over count values (1 when amax is 0). */
float m2a_fp4_global_scale_host(const void *x, moea2a_datatype_t xtype, size_t count);
/* m rows of k values -> codes [m][k/2] and E4M3 scales in layout (padding 0). */
void m2a_fp4_quantize_host(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, float g, void *q, void *sf,
                           int layout);
/* Scales of m rows of kb_n blocks from layout sl to dl (padding 0); counts, when not
 * NULL, marks rows r % stride >= counts[r / stride] as padding too. */
void m2a_fp4_convert_host(const unsigned char *src, int sl, unsigned char *dst, int dl, size_t m, size_t kb_n,
                          const int32_t *counts, int stride);
/* m rows of k values -> E4M3 codes [m][k] and scales in layout (padding 0). */
void m2a_fp8_quantize_host(const void *x, moea2a_datatype_t xtype, size_t m, size_t k, void *q, void *scales, int layout,
                           int ue8m0);
#endif

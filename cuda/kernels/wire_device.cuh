/* Quantize on dispatch's receive finish, device side, shared by the separate finish
 * kernel (wire_kernels.cu) and the load/store in-copy dispatch kernels (moe_fast.cu),
 * which do it in their receive half. */
#ifndef M2A_WIRE_DEVICE_CUH
#define M2A_WIRE_DEVICE_CUH
#include <stddef.h>
#include <stdint.h>

/* FP8 scales MN-major from the row scales that landed (rows: [ep][stride][words]):
 * mn [src][word][r] is row r's word, 0 past count(src) and in the rows that round the
 * stride up to 4; the elements first, first + step, ... */
template <typename Count>
__device__ __forceinline__ void m2a_wire_mn(const uint32_t *rows, uint32_t *mn, size_t words, int ep, int stride,
                                            Count count, size_t first, size_t step)
{
    const size_t pad = ((size_t)stride + 3) / 4 * 4, total = (size_t)ep * words * pad;
    for (size_t x = first; x < total; x += step) {
        const size_t r = x % pad, wd = x / pad % words, src = x / pad / words;
        mn[x] = r < (size_t)count((int)src) ? rows[(src * (size_t)stride + r) * words + wd] : 0u;
    }
}

#endif

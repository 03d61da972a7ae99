/* One combine element of each combine dtype, as the kernels load, store and round it
 * (lib/convert.h's conversions: the host reference's bits). Shared by the kernels
 * that sum combine rows (moe_kernels.cu, expert_kernels.cu). */
#ifndef M2A_ELEM_CUH
#define M2A_ELEM_CUH
#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "moea2a.h"

namespace m2a_elem {

template <moea2a_datatype_t DT> struct Elem;
template <> struct Elem<MOEA2A_FLOAT32> {
    static __device__ float load(const unsigned char *r, size_t h) { return reinterpret_cast<const float *>(r)[h]; }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<float *>(r)[h] = v; }
    static __device__ float round(float v) { return v; }
    static constexpr size_t size = 4;
};
template <> struct Elem<MOEA2A_BFLOAT16> {
    static __device__ float load(const unsigned char *r, size_t h) { return m2a_bf16_to_f32(reinterpret_cast<const uint16_t *>(r)[h]); }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<uint16_t *>(r)[h] = m2a_f32_to_bf16(v); }
    static __device__ float round(float v) { return m2a_bf16_to_f32(m2a_f32_to_bf16(v)); }
    static constexpr size_t size = 2;
};
template <> struct Elem<MOEA2A_FLOAT16> {
    static __device__ float load(const unsigned char *r, size_t h) { return m2a_f16_to_f32(reinterpret_cast<const uint16_t *>(r)[h]); }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<uint16_t *>(r)[h] = m2a_f32_to_f16(v); }
    static __device__ float round(float v) { return m2a_f16_to_f32(m2a_f32_to_f16(v)); }
    static constexpr size_t size = 2;
};

} // namespace m2a_elem
#endif

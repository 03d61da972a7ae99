/* One combine element of each combine dtype, as the kernels load, store and round it
 * (lib/base/convert.h's conversions: the host reference's bits; every NaN stored is the
 * canonical one, m2a_canonical), and 16 bytes of them at once. Shared by the kernels that sum combine rows (moe_kernels.cu, expert_kernels.cu,
 * moe_fast.cu). */
#ifndef M2A_ELEM_CUH
#define M2A_ELEM_CUH
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/convert.h"
#include "moea2a.h"

namespace m2a_elem {

template <moea2a_datatype_t DT> struct Elem;
template <> struct Elem<MOEA2A_FLOAT32> {
    static __device__ float load(const unsigned char *r, size_t h) { return reinterpret_cast<const float *>(r)[h]; }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<float *>(r)[h] = m2a_canonical(v); }
    static __device__ float round(float v) { return v; }
    static constexpr size_t size = 4;
};
template <> struct Elem<MOEA2A_BFLOAT16> {
    static __device__ float load(const unsigned char *r, size_t h) { return m2a_bf16_to_f32(reinterpret_cast<const uint16_t *>(r)[h]); }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<uint16_t *>(r)[h] = m2a_f32_to_bf16(m2a_canonical(v)); }
    static __device__ float round(float v) { return m2a_bf16_to_f32(m2a_f32_to_bf16(v)); }
    static constexpr size_t size = 2;
};
template <> struct Elem<MOEA2A_FLOAT16> {
    static __device__ float load(const unsigned char *r, size_t h) { return m2a_f16_to_f32(reinterpret_cast<const uint16_t *>(r)[h]); }
    static __device__ void store(unsigned char *r, size_t h, float v) { reinterpret_cast<uint16_t *>(r)[h] = m2a_f32_to_f16(m2a_canonical(v)); }
    static __device__ float round(float v) { return m2a_f16_to_f32(m2a_f32_to_f16(v)); }
    static constexpr size_t size = 2;
};

/* Two floats to a 16-bit pair in one instruction (cvt.rn ...x2.f32: round to nearest
 * even, subnormals kept, overflow to infinity, as convert.h rounds). NaN alone differs:
 * the instruction gives one canonical NaN where convert.h keeps the sign and payload.
 * bench/device/convert_check.cu compares both ways on every float. */
static __device__ __forceinline__ uint32_t cvt_pair(float lo, float hi, moea2a_datatype_t dt)
{
    uint32_t r;
    if (dt == MOEA2A_BFLOAT16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Sums rounded into one 16-byte vector of DT (16 / size of them): the same bits as
 * Elem<DT>::store of each, with the pair instruction where no value is NaN (a vector
 * that holds one takes Elem's way, which writes the canonical NaN). */
template <moea2a_datatype_t DT> static __device__ __forceinline__ int4 pack_vec(const float *v)
{
    if constexpr (DT == MOEA2A_FLOAT32) {
        return make_int4(__float_as_int(m2a_canonical(v[0])), __float_as_int(m2a_canonical(v[1])),
                         __float_as_int(m2a_canonical(v[2])), __float_as_int(m2a_canonical(v[3])));
    } else {
        bool nan = false;
#pragma unroll
        for (int i = 0; i < 8; i += 2) nan |= !(v[i] == v[i] && v[i + 1] == v[i + 1]);
        uint32_t w[4];
        if (!nan) {
#pragma unroll
            for (int i = 0; i < 4; i++) w[i] = cvt_pair(v[2 * i], v[2 * i + 1], DT);
        } else {
            unsigned char b[16];
#pragma unroll
            for (int i = 0; i < 8; i++) Elem<DT>::store(b, (size_t)i, v[i]);
            memcpy(w, b, 16);
        }
        return make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
    }
}

} // namespace m2a_elem
#endif

/* Every float through the combine's 16-bit rounding both ways (a maintainers' check;
 * bench/device/run.sh builds and runs it): cuda/kernels/elem.cuh's pair instruction
 * (cvt_pair) against lib/base/convert.h's rounding, the host reference's, on all 2^32
 * bit patterns but NaN, and pack_vec (the kernels' vector rounding, NaN included:
 * vectors of 8 consecutive patterns) against Elem's store value by value (convert.h
 * after the canonical NaN). Prints the
 * mismatches of each; exit status 1 if any. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "elem.cuh"

using namespace m2a_elem;

template <moea2a_datatype_t DT> __global__ void check(unsigned long long *bad)
{
    unsigned long long pair = 0, vec = 0;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long base = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; base < (1ull << 29);
         base += step) {
        float v[8];
        uint16_t want[8];
        for (int i = 0; i < 8; i++) {
            v[i] = __uint_as_float((uint32_t)(base * 8 + i));
            unsigned char b[2];
            Elem<DT>::store(b, 0, v[i]);
            want[i] = (uint16_t)(b[0] | b[1] << 8);
            if (v[i] == v[i]) { /* the instruction alone: both halves */
                const uint32_t r = cvt_pair(v[i], v[i], DT);
                pair += (r & 0xffffu) != want[i] || (r >> 16) != want[i];
            }
        }
        const int4 p = pack_vec<DT>(v);
        const uint32_t w[4] = {(uint32_t)p.x, (uint32_t)p.y, (uint32_t)p.z, (uint32_t)p.w};
        for (int i = 0; i < 8; i++) vec += ((w[i / 2] >> (16 * (i % 2))) & 0xffffu) != want[i];
    }
    atomicAdd(&bad[0], pair);
    atomicAdd(&bad[1], vec);
}

int main(void)
{
    unsigned long long *bad, h[2];
    int fails = 0;
    if (cudaMalloc(&bad, sizeof(h)) != cudaSuccess) {
        printf("convert_check: no CUDA device\n");
        return 0;
    }
    for (int t = 0; t < 2; t++) {
        cudaMemset(bad, 0, sizeof(h));
        if (t == 0) check<MOEA2A_BFLOAT16><<<1024, 256>>>(bad);
        else check<MOEA2A_FLOAT16><<<1024, 256>>>(bad);
        if (cudaMemcpy(h, bad, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess) {
            printf("convert_check: %s\n", cudaGetErrorString(cudaGetLastError()));
            return 1;
        }
        printf("convert_check %s: every non-NaN float, cvt pair vs convert.h: %llu mismatches; every float, pack_vec vs "
               "convert.h: %llu\n", t == 0 ? "bf16" : "fp16", h[0], h[1]);
        fails += h[0] != 0 || h[1] != 0;
    }
    return fails ? 1 : 0;
}

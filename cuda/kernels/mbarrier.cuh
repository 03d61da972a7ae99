/* Shared-memory barriers (mbarrier) as the kernels that stream stages through them use
 * them: bulk and TMA copies counting their bytes on a barrier (moe_fast.cu's combine,
 * fp4_gemm.cu's warp-specialized kernel), and threads arriving on one. sm_90 and later;
 * on older archs they compile to nothing (their callers never run there). */
#ifndef M2A_MBARRIER_CUH
#define M2A_MBARRIER_CUH
#include <stdint.h>

namespace m2a_mbar {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define M2A_MBAR 1
#endif

static __device__ __forceinline__ unsigned mbar_addr(const uint64_t *b)
{
    return (unsigned)__cvta_generic_to_shared(b);
}

/* a barrier whose phase completes after `count` arrivals (and the bytes they expect) */
static __device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count)
{
#ifdef M2A_MBAR
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar_addr(b)), "r"(count) : "memory");
#endif
}

static __device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
#ifdef M2A_MBAR
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mbar_addr(b)) : "memory");
#endif
}

/* an arrival that also expects `bytes` of copies to land on the barrier */
static __device__ __forceinline__ void mbar_expect(uint64_t *b, unsigned bytes)
{
#ifdef M2A_MBAR
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mbar_addr(b)), "r"(bytes)
                 : "memory");
#endif
}

/* until the phase of this parity has completed (a fresh barrier: parity 1 at once). A C
 * loop, so that the compiler reconverges the warp at its exit (aligned barriers and
 * wgmma may follow; a branch inside the asm would hide the loop from it). */
static __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
#ifdef M2A_MBAR
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(mbar_addr(b)), "r"(parity)
                     : "memory");
#endif
}

#undef M2A_MBAR
} /* namespace m2a_mbar */

#endif

/* Routing: each token's destinations from its ids (the owner table in shared memory).
 * Part of moe_fast.cu, which includes the parts in order: one translation unit, so
 * that every kernel keeps its inlining. */
namespace {

/* ---- routing ------------------------------------------------------------------------ */

__device__ __forceinline__ bool invalid_id(const m2a_kparams_t &p, int32_t e)
{
    return e < 0 || e >= p.num_experts || e == p.invalid_id;
}

/* Experts whose owners a dispatch keeps in shared memory (a byte each: ep <= 64), the
 * table copied there at the dispatch's start. */
constexpr int kOwnerSmem = 4096;

/* The one-holder rule: expert e's rank from the block's copy of the owner table in
 * shared memory (loaded while the kernel reads its epoch, so a token's ids are the one
 * round trip to memory that its count waits for), else from the workspace's table
 * (more than kOwnerSmem experts). p and t are the general rule's: the dispatch is
 * compiled once for each (dispatch_kernel's GEN), and this one's code is the same as
 * if they were not there. */
struct Owners {
    static constexpr bool kGeneral = false;
    const unsigned char *smem;
    const int32_t *table;
    __device__ __forceinline__ int operator()(const m2a_kparams_t &, int32_t e, int) const
    {
        return smem ? smem[e] : table[e];
    }
};

/* The general rule (placement.cuh): while the device's word says the placement has
 * replicas or experts no rank holds (general, read at the kernel's start), holder
 * (me + t) mod n_e of token t's expert e, -1 for none, from p's tables; else as
 * Owners. p is the kernel's parameter, passed rather than kept here: a pointer to it
 * would copy the parameters to the stack. */
struct Holders {
    static constexpr bool kGeneral = true;
    Owners one;
    bool general;
    __device__ __forceinline__ int operator()(const m2a_kparams_t &p, int32_t e, int t) const
    {
        return general ? m2a_holder(p, e, p.me, t) : one(p, e, t);
    }
};

/* The rule a dispatch kernel routes by, by value (the one-holder kernel's is then the
 * plain Owners, whose table pointer the compiler tests once, not per entry): the
 * general one where it was compiled for it. */
template <bool GEN> struct RuleOf {
    using type = Owners;
};
template <> struct RuleOf<true> {
    using type = Holders;
};
template <bool GEN> __device__ __forceinline__ typename RuleOf<GEN>::type rule(const Owners &one, bool general)
{
    if constexpr (GEN) return Holders{one, general};
    else return one;
}

/* The ids j0..j0+7 of a token's row (the invalid id past k). */
struct IdBatch {
    int32_t v[8];
};
__device__ __forceinline__ IdBatch load_ids(const m2a_kparams_t &p, const int32_t *row, int j0)
{
    IdBatch e;
#pragma unroll
    for (int j = 0; j < 8; j++) e.v[j] = j0 + j < p.k ? row[j0 + j] : p.invalid_id;
    return e;
}

/* Bit r set: the token goes to rank r. Counts invalid and merged entries, and with the
 * general rule (O::kGeneral) those naming an expert no rank holds (*dropped; NULL
 * otherwise). The ids of a batch are all loaded before any owner, and the owners
 * before any is used: two round trips to memory per 8 entries instead of two per entry
 * (at 8 tokens on one H200 the count took 3.5 us of an 11 us dispatch). head: the
 * first batch, where the caller loaded it already (have_head). */
template <class O>
__device__ unsigned long long token_mask(const m2a_kparams_t &p, const O &owner, const int32_t *ids, int t, int *inv,
                                         int *merged, IdBatch head = {}, bool have_head = false, int *dropped = nullptr)
{
    constexpr int kInvalid = O::kGeneral ? -2 : -1; /* an invalid id; -1: held by no rank */
    constexpr int B = 8;
    unsigned long long mask = 0;
    const int32_t *row = ids + (size_t)t * p.k;
    for (int j0 = 0; j0 < p.k; j0 += B) {
        const IdBatch e = j0 == 0 && have_head ? head : load_ids(p, row, j0);
        int32_t o[B];
#pragma unroll
        for (int j = 0; j < B; j++) o[j] = j0 + j < p.k && !invalid_id(p, e.v[j]) ? owner(p, e.v[j], t) : kInvalid;
#pragma unroll
        for (int j = 0; j < B; j++) {
            if (j0 + j >= p.k) continue;
            if (o[j] < 0) {
                if (!O::kGeneral || o[j] == kInvalid) ++*inv;
                else ++*dropped;
                continue;
            }
            const unsigned long long bit = 1ull << o[j];
            *merged += (mask & bit) != 0;
            mask |= bit;
        }
    }
    return mask;
}

template <typename V> __device__ V block_sum(V v, V *scratch)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(kAllLanes, v, o);
    __syncthreads();
    if ((threadIdx.x % kWarpSize) == 0) scratch[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    V s = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < kWarps; w++) s += scratch[w];
    return s; /* valid in thread 0 */
}

} // namespace

/* The load/store combine's sums of 2-4 rows on one GPU (a maintainers' check;
 * bench/device/run.sh builds and runs it). With one rank every token has one row, so the
 * library's own tests reach the sums of several rows, and the bulk-copy way's stages of
 * several rows, only on 2+ GPUs. Here the peers' workspaces are buffers on this GPU: each
 * case fills ep of them as ep ranks' dispatches would have (send map, combine rows), sets
 * the control words as if every peer had signalled, and runs the receive half of the real
 * combine kernel (cuda/kernels/moe_fast.cu, included) in each of its three ways, then
 * copy-engine mode's sum (rows from a landing area) both ways, against a host reference
 * written here: each token's rows summed in fp32 from 0 in ascending rank order, rounded
 * once by lib/base/convert.h. Bit for bit; exit status 1 on any difference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "moe_fast.cu"

namespace {

struct Case {
    int ep, me, n, hidden;
    moea2a_datatype_t dt;
};

uint64_t rng = 0x9e3779b97f4a7c15ull;
uint32_t rnd()
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* A finite value of dt: random sign and mantissa, exponents over a range wide enough that
 * the sums round, with a few subnormals. */
void fill_value(unsigned char *p, moea2a_datatype_t dt)
{
    const uint32_t r = rnd(), sign = r >> 31;
    const bool sub = r % 61 == 0;
    if (dt == MOEA2A_FLOAT32) {
        const uint32_t e = sub ? 0 : 127 - 20 + (r >> 8) % 40, v = sign << 31 | e << 23 | (rnd() & 0x7fffffu);
        memcpy(p, &v, 4);
    } else if (dt == MOEA2A_BFLOAT16) {
        const uint16_t e = sub ? 0 : 127 - 20 + (r >> 8) % 40, v = (uint16_t)(sign << 15 | e << 7 | (rnd() & 0x7fu));
        memcpy(p, &v, 2);
    } else {
        const uint16_t e = sub ? 0 : 15 - 8 + (r >> 8) % 14, v = (uint16_t)(sign << 15 | e << 10 | (rnd() & 0x3ffu));
        memcpy(p, &v, 2);
    }
}

float host_load(const unsigned char *p, moea2a_datatype_t dt)
{
    uint16_t h;
    float f;
    if (dt == MOEA2A_FLOAT32) return memcpy(&f, p, 4), f;
    memcpy(&h, p, 2);
    return dt == MOEA2A_BFLOAT16 ? m2a_bf16_to_f32(h) : m2a_f16_to_f32(h);
}

void host_store(unsigned char *p, float v, moea2a_datatype_t dt)
{
    if (dt == MOEA2A_FLOAT32) return (void)memcpy(p, &v, 4);
    const uint16_t h = dt == MOEA2A_BFLOAT16 ? m2a_f32_to_bf16(v) : m2a_f32_to_f16(v);
    memcpy(p, &h, 2);
}

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            printf("combine_check: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);    \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* One workspace's layout: the control regions, the counts, the send map, the combine rows. */
struct Layout {
    size_t sig, blocks, ctl, counts, send_map, combine, bytes;
};
Layout layout_of(int ep, int n, int k, int stride, size_t row)
{
    Layout l;
    l.sig = 0;
    l.blocks = 1024;
    l.ctl = l.blocks + M2A_FAST_BLOCK_BYTES;
    l.counts = l.ctl + M2A_FAST_CTL_BYTES;
    l.send_map = l.counts + 4 * (size_t)M2A_FAST_MAX_PEERS;
    l.combine = (l.send_map + 4 * (size_t)n * k + 255) / 256 * 256;
    l.bytes = l.combine + (size_t)ep * stride * row;
    return l;
}

const char *dt_name(moea2a_datatype_t dt)
{
    return dt == MOEA2A_FLOAT32 ? "fp32" : dt == MOEA2A_FLOAT16 ? "fp16" : "bf16";
}

enum Way { kWayLoads, kWayEven, kWayBulk, kWayCeBulk, kWayCe, kWays };
const char *const way_names[kWays] = {"loads", "even", "bulk copies", "copy-engine sum, bulk copies", "copy-engine sum"};

/* One rank's combine over ep workspaces on this GPU, its rows and their reference. */
struct Combine {
    Case c;
    int k = 8, cap = 0, stride = 0, D = 0;
    size_t esz = 0, out_row = 0, row = 0;
    Layout l;
    std::vector<unsigned char> want;
    m2a_fast_t f;
    std::vector<unsigned char *> dws;
    unsigned char *landing = nullptr, *out = nullptr;
    int32_t *dindex = nullptr;
    bool vec = false, bulk = false;
    size_t rows = 0; /* rows summed, over all tokens */

    /* topk: each token's ranks from 8 distinct experts of 256 (DeepSeek-V3's routing),
     * else a random set of ranks (none at times) */
    Combine(const Case &cs, bool topk, m2a_fast_error_t *err, m2a_fast_error_t *host_err) : c(cs)
    {
        cap = stride = c.n, D = k < c.ep ? k : c.ep;
        esz = c.dt == MOEA2A_FLOAT32 ? 4 : 2, out_row = row = (size_t)c.hidden * esz;
        l = layout_of(c.ep, c.n, k, stride, row);
        /* routing, a slot at each rank in token order, as the dispatch numbers them */
        std::vector<int32_t> map((size_t)c.n * k, -1);
        std::vector<int> used(c.ep, 0);
        for (int t = 0; t < c.n; t++) {
            uint32_t set = 0;
            if (topk) {
                uint64_t chosen[4] = {0, 0, 0, 0};
                for (int j = 0; j < 8;) {
                    const uint32_t e = rnd() % 256;
                    if (chosen[e / 64] >> (e % 64) & 1) continue;
                    chosen[e / 64] |= 1ull << (e % 64), j++;
                    set |= 1u << (e * (uint32_t)c.ep / 256); /* experts split evenly over the ranks */
                }
            } else {
                set = rnd() % 7 == 0 ? 0 : rnd() & ((1u << c.ep) - 1);
            }
            int d = 0;
            for (int r = 0; r < c.ep; r++)
                if (set >> r & 1) map[(size_t)t * k + d++] = r * cap + used[r]++;
        }
        for (int r = 0; r < c.ep; r++) rows += (size_t)used[r];
        /* every rank's combine rows for this rank (its slot me there), and the reference */
        std::vector<std::vector<unsigned char>> ws(c.ep, std::vector<unsigned char>(l.bytes, 0));
        for (int r = 0; r < c.ep; r++)
            for (size_t i = 0; i < (size_t)used[r] * row; i += esz)
                fill_value(ws[r].data() + l.combine + (size_t)c.me * stride * row + i, c.dt);
        want.resize((size_t)c.n * out_row);
        for (int t = 0; t < c.n; t++)
            for (int h = 0; h < c.hidden; h++) {
                float acc = 0.0f;
                for (int d = 0; d < D && map[(size_t)t * k + d] >= 0; d++) {
                    const int32_t code = map[(size_t)t * k + d];
                    acc += host_load(ws[code / cap].data() + l.combine + ((size_t)c.me * stride + code % cap) * row + h * esz,
                                     c.dt);
                }
                host_store(want.data() + (size_t)t * out_row + h * esz, acc, c.dt);
            }
        memcpy(ws[c.me].data() + l.send_map, map.data(), map.size() * 4);
        reinterpret_cast<uint32_t *>(ws[c.me].data() + l.ctl)[1] = 1; /* the combine's epoch */

        memset(&f, 0, sizeof(f));
        f.p.ep = c.ep, f.p.me = c.me, f.p.k = k, f.p.cap = cap, f.p.nodes = 1;
        f.sig = l.sig, f.blocks = l.blocks, f.ctl = l.ctl, f.recv_counts = l.counts, f.send_map = l.send_map;
        f.combine = l.combine, f.combine_row = row, f.combine_dtype = c.dt, f.hidden = (size_t)c.hidden;
        f.timeout_ns = 2000000000ull, f.err = err, f.host_err = host_err;
        dws.resize(c.ep);
        for (int r = 0; r < c.ep; r++) {
            CK(cudaMalloc(&dws[r], l.bytes));
            CK(cudaMemcpy(dws[r], ws[r].data(), l.bytes, cudaMemcpyHostToDevice));
            f.peer[r] = dws[r];
        }
        /* copy-engine mode's landing area: the peers' rows for this rank, [index[r]][cap][row] */
        std::vector<int32_t> index(c.ep, -1);
        CK(cudaMalloc(&landing, (size_t)c.ep * cap * row + 16));
        CK(cudaMalloc(&dindex, 4 * (size_t)c.ep));
        for (int r = 0, i = 0; r < c.ep; r++) {
            if (r == c.me) continue;
            index[r] = i;
            CK(cudaMemcpy(landing + (size_t)i++ * cap * row, dws[r] + l.combine + (size_t)c.me * stride * row,
                          (size_t)cap * row, cudaMemcpyDeviceToDevice));
        }
        CK(cudaMemcpy(dindex, index.data(), 4 * (size_t)c.ep, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&out, c.n * out_row + 16));
        vec = out_row % 16 == 0, bulk = bulk_fits(&f, vec);
    }
    ~Combine()
    {
        for (unsigned char *p : dws) cudaFree(p);
        cudaFree(landing), cudaFree(dindex), cudaFree(out);
    }
    bool applies(int way) const
    {
        return !(way == kWayEven && !vec) && !((way == kWayBulk || way == kWayCeBulk) && !bulk);
    }
    /* The control words a launch on `blocks` SMs reads: every peer's combine signal for
     * epoch 1 (blocks of them), the units handed out zeroed. */
    void arm(int blocks, cudaStream_t s)
    {
        uint32_t sig[2 * M2A_FAST_MAX_PEERS];
        for (int r = 0; r < c.ep; r++) sig[r] = 0, sig[c.ep + r] = (uint32_t)blocks;
        const unsigned long long zero[4] = {0, 0, 0, 0};
        CK(cudaMemcpyAsync(dws[c.me] + l.sig, sig, 8 * (size_t)c.ep, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(dws[c.me] + l.ctl + M2A_FAST_CTL_STATS + 4 * 8, zero, sizeof(zero), cudaMemcpyHostToDevice, s));
    }
    /* One launch of a way (the receive half alone: the peers signalled) on `blocks` SMs. */
    void go(int way, int blocks, cudaStream_t s)
    {
        if (way == kWayLoads) launch_combine<kLoads>(&f, blocks, s, c.n, stride, nullptr, out, 0, M2A_FAST_RECV);
        if (way == kWayEven) launch_combine<kEven>(&f, blocks, s, c.n, stride, nullptr, out, 0, M2A_FAST_RECV);
        if (way == kWayBulk) launch_combine<kTma>(&f, blocks, s, c.n, stride, nullptr, out, 0, M2A_FAST_RECV);
        if (way == kWayCeBulk || way == kWayCe) {
            const size_t smem = way == kWayCeBulk ? tma_smem(D) : 0;
#define LANDING(DT)                                                                                                   \
    (way == kWayCeBulk ? landing_reduce_kernel<DT, true> : landing_reduce_kernel<DT, false>)<<<blocks, T, smem, s>>>( \
        f, c.n, stride, landing, dindex, out)
            if (c.dt == MOEA2A_FLOAT32) LANDING(MOEA2A_FLOAT32);
            else if (c.dt == MOEA2A_FLOAT16) LANDING(MOEA2A_FLOAT16);
            else LANDING(MOEA2A_BFLOAT16);
#undef LANDING
        }
        CK(cudaGetLastError());
    }
    /* Values that differ from the reference after a way on `blocks` SMs (or its error). */
    size_t check(int way, int blocks)
    {
        CK(cudaMemset(out, 0xff, c.n * out_row));
        CK(cudaMemset(f.err, 0, sizeof(*f.err)));
        arm(blocks, 0);
        go(way, blocks, 0);
        CK(cudaDeviceSynchronize());
        m2a_fast_error_t e;
        CK(cudaMemcpy(&e, f.err, sizeof(e), cudaMemcpyDeviceToHost));
        std::vector<unsigned char> got(c.n * out_row);
        CK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < got.size(); i += esz)
            if (memcmp(&got[i], &want[i], esz) && !wrong++) first = i / esz;
        if (wrong || e.code)
            printf("combine_check: ep %d me %d n %d hidden %d %s blocks %d, %s: %zu wrong (first at token %zu value %zu), "
                   "error record %d\n", c.ep, c.me, c.n, c.hidden, dt_name(c.dt), blocks, way_names[way], wrong,
                   first / c.hidden, first % c.hidden, e.code);
        return wrong + (e.code != 0);
    }
    /* Mean us of one launch (events around it alone; its control words written before). */
    double time(int way, int blocks, int iters)
    {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        double total = 0;
        for (int i = -3; i < iters; i++) {
            arm(blocks, 0);
            CK(cudaEventRecord(e0, 0));
            go(way, blocks, 0);
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 0) total += ms;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        return 1000.0 * total / iters;
    }
};

} // namespace

/* No argument: every case checked. "quick": a few (for compute-sanitizer). "time EP N
 * HIDDEN [SMS...]": DeepSeek-V3's routing (top-8 of 256) over EP ranks, N tokens of
 * HIDDEN bf16 values, each way timed at each SM budget (default 16 24 32 48), after its
 * check. */
int main(int argc, char **argv)
{
    const bool quick = argc > 1 && !strcmp(argv[1], "quick"), timing = argc > 4 && !strcmp(argv[1], "time");
    m2a_fast_error_t *err, *host_err;
    if (cudaMalloc(&err, sizeof(*err)) != cudaSuccess) {
        printf("combine_check: no CUDA device\n");
        return 0;
    }
    CK(cudaHostAlloc(&host_err, sizeof(*host_err), cudaHostAllocMapped));
    if (timing) {
        const int ep = atoi(argv[2]), n = atoi(argv[3]), hidden = atoi(argv[4]);
        std::vector<int> sms;
        for (int i = 5; i < argc; i++) sms.push_back(atoi(argv[i]));
        if (sms.empty()) sms = {16, 24, 32, 48};
        if (ep < 1 || ep > 8 || n < 1 || hidden < 1) return printf("combine_check: time EP(1-8) N HIDDEN [SMS...]\n"), 2;
        Combine cb(Case{ep, 0, n, hidden, MOEA2A_BFLOAT16}, true, err, host_err);
        printf("# combine, one GPU, the peers' rows in its memory: ep %d, %d tokens (%.2f rows each), hidden %d bf16; "
               "us per launch\n", ep, n, (double)cb.rows / n, hidden);
        printf("| SMs |");
        for (int w = 0; w < kWays; w++) printf(" %s |", way_names[w]);
        printf("\n|---|---|---|---|---|---|\n");
        int bad = 0;
        for (int g : sms) {
            printf("| %d |", g);
            for (int w = 0; w < kWays; w++) {
                if (!cb.applies(w)) {
                    printf(" - |");
                    continue;
                }
                const size_t wrong = cb.check(w, g);
                bad += wrong != 0;
                printf(" %.1f%s |", cb.time(w, g, 20), wrong ? " (WRONG)" : "");
            }
            printf("\n");
        }
        return bad ? 1 : 0;
    }
    const moea2a_datatype_t dts[] = {MOEA2A_BFLOAT16, MOEA2A_FLOAT16, MOEA2A_FLOAT32};
    /* hidden: the DeepSeek-V3 row, one a vector past whole units, small rows, a row not
     * of whole 16-byte vectors; tokens and blocks from one unit per warp to many grabs */
    const int hiddens[] = {7168, 7176, 2048, 8, 7};
    const int tokens[] = {1, 37, 301};
    const int blocks[] = {1, 3, 16};
    int cases = 0, bad = 0;
    for (int ep = 2; ep <= 4; ep++)
        for (int me : {0, ep - 1})
            for (moea2a_datatype_t dt : dts)
                for (int hidden : hiddens)
                    for (int n : tokens) {
                        if (quick && (n != 37 || (hidden != 7176 && hidden != 7))) continue;
                        Combine cb(Case{ep, me, n, hidden, dt}, false, err, host_err);
                        for (int g : blocks) {
                            if (quick && g != 3) continue;
                            int wrong_ways = 0;
                            for (int w = 0; w < kWays; w++) wrong_ways += cb.applies(w) && cb.check(w, g) != 0;
                            bad += wrong_ways != 0;
                            cases++;
                        }
                    }
    const int bulk = device_bulk(); /* SMEM: the kernels outgrew the shared memory a block may have */
    printf("combine_check: %d cases of 2-4 ranks (every way each: loads, even, bulk copies%s, copy-engine sum), "
           "%d with a difference\n", cases,
           bulk == M2A_FAST_BULK_OK ? "" : bulk == M2A_FAST_BULK_SMEM ? " (REFUSED on this sm_90+ GPU)" : " (not on this GPU)", bad);
    return bad || bulk == M2A_FAST_BULK_SMEM ? 1 : 0;
}

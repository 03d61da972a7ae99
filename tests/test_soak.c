/* Soak: 4 ranks loop over dispatch + combine on host memory (on one node, then in two
 * emulated nodes: the hierarchical path), re-creating the MoE
 * context every RECREATE iterations, and check every result against a reference
 * computed independently on the source rank: each token carries small integers, the
 * expert side returns what it received, so out[t] must be the token's row times the
 * number of distinct ranks its top-k experts live on (exact in bf16). Resident memory
 * and the heap in use are sampled after the warm-up, half-way through the rest and at
 * the end. A leak grows both halves alike, so over a long run (50000 iterations or
 * more) resident memory must grow less than 100 kB a rank in at least one half (a
 * steady leak of 3 bytes an iteration fails); one late page-in of a pool that UCX
 * grew earlier (seen: +172 kB once in ten 100000-iteration runs, heap +0) lands in
 * one half and passes. The heap in use is judged the same way, in any run: less than
 * 32 KiB in at least one half (a steady leak of 8 bytes an iteration fails at 10000
 * iterations), less than 1 MiB in all; a pool UCX grows once (seen: +151 kB on one
 * rank of four on a 16-core machine) lands in one half.
 * MOEA2A_SOAK_ITERS sets the iterations (default 10000; .ci/run sets 100000),
 * MOEA2A_SOAK_RECREATE the re-create interval (default 1000). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "local_ranks.h"
#include "moe_roundtrip.h"
#include "moea2a.h"
#include "tap.h"

#define RANKS 4
#define RECREATE_DEFAULT 1000
/* Warm-up: the first tenth of the run (at least 2000 iterations), while UCX's pools
 * grow to the peaks this traffic reaches; memory is measured after it. */
#define WARMUP_MIN 2000

static long rss_kb(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

typedef struct {
    long iters, recreate;
} soak_arg_t;

static int soak_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const soak_arg_t *a = arg;
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    moea2a_moe_config_t mc = rt_config();
    static rt_state_t st;
    st.ep = n;
    st.seed = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(rank + 1) * 0x100000001b3ULL;
    long mismatches = 0, rss_warm = 0, rss_half = 0;
    long warmup = a->iters / 10 > WARMUP_MIN ? a->iters / 10 : WARMUP_MIN, half = warmup + (a->iters - warmup) / 2;
    size_t heap_warm = 0, heap_half = 0;
    for (long it = 0; it < a->iters && fails == 0; it++) {
        if (it % a->recreate == 0) {
            if (st.moe && moea2a_moe_destroy(st.moe)) fails++;
            if (moea2a_moe_create(&st.moe, comm, &mc)) {
                printf("# rank %d: create at %ld: %s\n", rank, it, moea2a_last_error(comm));
                return 1;
            }
        }
        if (rt_step(&st, it, &mismatches) != MOEA2A_SUCCESS) {
            printf("# rank %d: iteration %ld: %s\n", rank, it, moea2a_last_error(comm));
            fails++;
            break;
        }
        if (it == warmup) rss_warm = rss_kb(), heap_warm = mallinfo2().uordblks;
        if (it == half) rss_half = rss_kb(), heap_half = mallinfo2().uordblks;
    }
    long first = rss_half ? rss_half - rss_warm : 0, second = rss_half ? rss_kb() - rss_half : 0;
    long growth = first < second ? first : second;
    long heap1 = heap_half ? (long)heap_half - (long)heap_warm : 0;
    long heap2 = heap_half ? (long)mallinfo2().uordblks - (long)heap_half : 0;
    printf("# rank %d: %ld iterations, %ld mismatching values; after the warm-up: resident memory %+ld kB "
           "then %+ld kB, heap in use %+ld then %+ld bytes\n", rank, a->iters, mismatches, first, second, heap1, heap2);
    RANK_EXPECT(fails, rank, mismatches == 0, "%ld mismatching values", mismatches);
    /* Resident memory settles only over a long run (UCX's pools and shared-memory
     * pages grow to the traffic's peaks): judged from 50000 iterations on, as .ci/run
     * runs it; the heap in use, where a leak of moea2a's would show, always. */
    RANK_EXPECT(fails, rank, a->iters < 50000 || growth < 100,
                "resident memory grew by %ld kB and %ld kB in the two halves after the warm-up (bound 100 kB in one)",
                first, second);
    RANK_EXPECT(fails, rank, (heap1 < 32 * 1024 || heap2 < 32 * 1024) && heap1 + heap2 < 1024 * 1024,
                "the heap in use grew by %ld and %ld bytes in the two halves (bound 32 KiB in one, 1 MiB in all)",
                heap1, heap2);
    if (st.moe) moea2a_moe_destroy(st.moe);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    soak_arg_t a = {getenv("MOEA2A_SOAK_ITERS") ? atol(getenv("MOEA2A_SOAK_ITERS")) : 10000,
                    getenv("MOEA2A_SOAK_RECREATE") ? atol(getenv("MOEA2A_SOAK_RECREATE")) : RECREATE_DEFAULT};
    if (a.recreate < 1) a.recreate = RECREATE_DEFAULT;
    if (a.iters <= WARMUP_MIN) a.iters = WARMUP_MIN + 1;
    local_ranks_result_t res;
    local_ranks_run(RANKS, soak_rank, &a, 3600.0, &res);
    tap_ok(res.failed == 0 && res.hung == 0,
           "soak: %d ranks, %ld dispatch/combine iterations, context re-created every %d: results exact, memory flat",
           RANKS, a.iters, (int)a.recreate);
    /* the same in two emulated nodes (the hierarchical path), up to 10000 iterations */
    soak_arg_t b = a;
    if (b.iters > 10000) b.iters = 10000;
    setenv("MOEA2A_NODE_SIZE", "2", 1); /* the ranks inherit it */
    local_ranks_run(RANKS, soak_rank, &b, 3600.0, &res);
    unsetenv("MOEA2A_NODE_SIZE");
    tap_ok(res.failed == 0 && res.hung == 0,
           "soak: %d ranks in nodes of 2 (hierarchical path), %ld dispatch/combine iterations, context re-created every "
           "%d: results exact, memory flat", RANKS, b.iters, (int)b.recreate);
    return tap_done();
}

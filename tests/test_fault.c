/* Faults: a rank that dies in the middle of a collective, a rank that never joins,
 * a rank that aborts. The others must return an error within MOEA2A_TIMEOUT_S (set
 * to 2 s here) instead of hanging; the watchdog turns any hang into a failure. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define TIMEOUT_S 2.0
#define SLACK_S 3.0 /* process start-up and scheduling on a loaded 2-core machine */
#define WATCHDOG 30.0

static int failed_in_time(int rank, moea2a_result_t res, double t0, const char *what, moea2a_comm_t comm)
{
    int fails = 0;
    double dt = now() - t0;
    RANK_EXPECT(fails, rank, res == MOEA2A_ERR_TIMEOUT || res == MOEA2A_ERR_PEER_FAILED,
                "%s: expected a timeout or peer failure, got %s", what, moea2a_strerror(res));
    RANK_EXPECT(fails, rank, dt < TIMEOUT_S + SLACK_S, "%s: took %.1f s, bound %.1f s", what, dt, TIMEOUT_S + SLACK_S);
    printf("# rank %d: %s -> %s after %.2f s: %s\n", rank, what, moea2a_strerror(res), dt, moea2a_last_error(comm));
    return fails;
}

/* Rank `victim` exits right after init; the others run an alltoallv and a barrier. */
static int dies_mid_collective(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int victim = *(int *)arg, fails = 0;
    moea2a_comm_t comm;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, NULL);
    if (res) return 1;
    int32_t s[64], r[64];
    int64_t c[8], d[8];
    for (int p = 0; p < n; p++) c[p] = 8, d[p] = 8 * p;
    if (rank == victim) {
        /* Join in, but leave mid-way: post nothing and exit without a goodbye. */
        _exit(0);
    }
    double t0 = now();
    res = moea2a_alltoallv(s, c, d, r, c, d, MOEA2A_INT32, comm, NULL);
    fails += failed_in_time(rank, res, t0, "alltoallv with a dead peer", comm);
    t0 = now();
    res = moea2a_barrier(comm);
    RANK_EXPECT(fails, rank, res == MOEA2A_ERR_ABORTED, "the broken communicator then says ABORTED, got %s",
                moea2a_strerror(res));
    res = moea2a_comm_destroy(comm);
    RANK_EXPECT(fails, rank, now() - t0 < TIMEOUT_S + SLACK_S, "destroy of a broken communicator took %.1f s", now() - t0);
    return fails;
}

/* Rank `victim` exits after creating an MoE context; the others' dispatch fails in time. */
static int dies_before_dispatch(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int victim = *(int *)arg, fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = 8, mc.top_k = 2, mc.max_tokens_per_rank = 4, mc.hidden = 4, mc.memory = MOEA2A_MEMORY_HOST;
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) return 1;
    if (rank == victim) _exit(0);
    int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    double t0 = now();
    moea2a_result_t r = moea2a_dispatch(moe, 4, ids, NULL, NULL, 0, &res, NULL);
    fails += failed_in_time(rank, r, t0, "dispatch with a dead peer", comm);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* The last rank never calls init: the rendezvous names it. */
static int never_joins(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int fails = 0;
    if (rank == n - 1) return 0;
    moea2a_comm_t comm;
    double t0 = now();
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = TIMEOUT_S;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, &cfg);
    fails += failed_in_time(rank, res, t0, "init with a missing rank", NULL);
    char want[32];
    snprintf(want, sizeof(want), "missing ranks %d", n - 1);
    RANK_EXPECT(fails, rank, strstr(moea2a_last_error(NULL), want), "message names the missing rank: %s",
                moea2a_last_error(NULL));
    return fails;
}

/* Rank 0 aborts and leaves; rank 1's collective fails in time. */
static int one_aborts(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    if (rank == 0) {
        moea2a_comm_abort(comm);
        RANK_EXPECT(fails, rank, moea2a_barrier(comm) == MOEA2A_ERR_ABORTED, "barrier after abort");
        moea2a_comm_destroy(comm);
        return fails;
    }
    double t0 = now();
    int32_t v = rank, all[2];
    moea2a_result_t res = moea2a_allgather(&v, all, 1, MOEA2A_INT32, comm, NULL);
    fails += failed_in_time(rank, res, t0, "allgather with an aborted peer", comm);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    setenv("MOEA2A_TIMEOUT_S", "2", 1);
    /* host memory over UCX is under test: with NCCL too, a 4-rank init on a GPU
     * machine (NCCL's setup, refused for ranks sharing a GPU) can outlast the 2 s
     * timeout (test_kill did on a 4-GPU machine) */
    setenv("MOEA2A_TRANSPORT", "ucx", 1);
    local_ranks_result_t res;
    for (int n = 2; n <= 4; n += 2) {
        int victim = n - 1;
        local_ranks_run(n, dies_mid_collective, &victim, WATCHDOG, &res);
        tap_ok(res.failed == 0 && res.hung == 0,
               "%d ranks, rank %d dies before an alltoallv: the others fail within MOEA2A_TIMEOUT_S", n, victim);
    }
    int victim = 1;
    local_ranks_run(3, dies_before_dispatch, &victim, WATCHDOG, &res);
    tap_ok(res.failed == 0 && res.hung == 0, "3 ranks, rank 1 dies before a dispatch: the others fail within MOEA2A_TIMEOUT_S");
    local_ranks_run(3, never_joins, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0 && res.hung == 0, "a rank that never joins: init fails in time naming it");
    local_ranks_run(2, one_aborts, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0 && res.hung == 0, "a rank that aborts: its peer's collective fails in time");
    return tap_done();
}

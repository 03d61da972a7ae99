/* Dead peers at random moments: every rank loops over MoE dispatch + combine or over
 * alltoallv (host memory, UCX) while one rank is killed with SIGKILL by a thread of
 * its own after a random delay, so the death lands anywhere in a call. Each
 * survivor must
 *   - not die itself (UCX used to abort survivors from its shared-memory transport),
 *   - return MOEA2A_ERR_PEER_FAILED naming the dead rank, or MOEA2A_ERR_TIMEOUT,
 *     within MOEA2A_TIMEOUT_S + 1 s of the kill,
 *   - then destroy its communicator within a second.
 * Then rank 0 exiting after init, its connections closing with it or held open 3 s
 * longer (as a CUDA context's teardown holds them): every survivor's moe_create names it
 * within SETUP_BOUND_S. Then deaths between calls (only the peer watcher can tell):
 * moea2a_moe_status names the dead rank within 1 s on every survivor.
 * MOEA2A_KILL_RUNS (default 20) sets the number of kills; runs alternate 2 and 4
 * ranks, MoE and alltoallv, UCX_TLS=self,sm and UCX's default transports. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define TIMEOUT_S 2.0
#define BOUND_S (TIMEOUT_S + 1.0)
#define MAX_RANKS 4

/* Shared between the forked ranks and the parent (MAP_SHARED before the fork). */
typedef struct {
    volatile double kill_time; /* CLOCK_MONOTONIC, system-wide */
    volatile int verdicts;     /* survivors that have their error */
    int linger_ms;             /* setup deaths: how long rank 0's connections outlive it */
    struct {
        int result, named, iters;
        double after_kill, destroy_s, choice_s; /* choice_s: a shrink by choice */
    } rank[MAX_RANKS];
} board_t;

typedef struct {
    board_t *board;
    int victim, moe;
    unsigned delay_us;
} run_t;

/* After delay_us, notes the time on the board (for the survivors' bounds) and dies. */
static void die_after(board_t *b, unsigned delay_us)
{
    usleep(delay_us);
    b->kill_time = now();
    __sync_synchronize();
    kill(getpid(), SIGKILL);
}

static void *killer(void *arg)
{
    run_t *run = arg;
    die_after(run->board, run->delay_us);
    return NULL;
}

typedef struct {
    moea2a_moe_t moe;
    int32_t ids[8 * 2];
    uint16_t x[8 * 16], y[8 * 16], expert_out[MAX_RANKS * 8 * 16];
    int64_t c[MAX_RANKS], d[MAX_RANKS];
    int32_t s[MAX_RANKS * 64], r[MAX_RANKS * 64];
} work_t;

static moea2a_result_t one_step(moea2a_comm_t comm, int rank, int moe, work_t *w, int it)
{
    if (!moe) return moea2a_alltoallv(w->s, w->c, w->d, w->r, w->c, w->d, MOEA2A_INT32, comm, NULL);
    for (int t = 0; t < 8; t++) w->ids[2 * t] = (t + it + rank) % 16, w->ids[2 * t + 1] = (t * 3 + it) % 16;
    const void *payloads[1] = {w->x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_dispatch(w->moe, 8, w->ids, NULL, payloads, 0, &res, NULL);
    if (r != MOEA2A_SUCCESS) return r;
    return moea2a_combine(w->moe, w->expert_out, w->y, NULL);
}

static int looping_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    run_t *run = arg;
    board_t *b = run->board;
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) {
        printf("# rank %d: init: %s\n", rank, moea2a_last_error(NULL));
        return 1;
    }
    static work_t w;
    for (int p = 0; p < n; p++) w.c[p] = 64, w.d[p] = 64 * p;
    if (run->moe) {
        moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
        mc.num_experts = 16, mc.top_k = 2, mc.max_tokens_per_rank = 8, mc.hidden = 16;
        mc.memory = MOEA2A_MEMORY_HOST, mc.num_payloads = 1;
        mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, 16};
        if (moea2a_moe_create(&w.moe, comm, &mc)) {
            printf("# rank %d: moe_create: %s\n", rank, moea2a_last_error(comm));
            return 1;
        }
    }
    /* Every rank starts its loop together, so the kill lands inside the loop. */
    if (moea2a_barrier(comm)) return 1;
    if (rank == run->victim) {
        pthread_t t;
        pthread_create(&t, NULL, killer, run);
    }
    moea2a_result_t r = MOEA2A_SUCCESS;
    int it = 0;
    while (r == MOEA2A_SUCCESS && it < 1000000) r = one_step(comm, rank, run->moe, &w, it++);
    double t_err = now();
    if (rank == run->victim) pause(); /* the killer thread ends this process */
    char want[32];
    snprintf(want, sizeof(want), "rank %d", run->victim);
    const char *msg = moea2a_last_error(comm);
    b->rank[rank].result = r;
    b->rank[rank].iters = it;
    b->rank[rank].named = r == MOEA2A_ERR_PEER_FAILED && strstr(msg, want) != NULL;
    b->rank[rank].after_kill = b->kill_time > 0 ? t_err - b->kill_time : -1;
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_PEER_FAILED || r == MOEA2A_ERR_TIMEOUT,
                "expected PEER_FAILED or TIMEOUT, got %s: %s", moea2a_strerror(r), msg);
    RANK_EXPECT(fails, rank, r != MOEA2A_ERR_PEER_FAILED || b->rank[rank].named,
                "PEER_FAILED does not name the dead rank %d: %s", run->victim, msg);
    RANK_EXPECT(fails, rank, b->kill_time > 0 && t_err - b->kill_time <= BOUND_S,
                "error %.2f s after the kill (bound %.1f s): %s: %s", t_err - b->kill_time, BOUND_S,
                moea2a_strerror(r), msg);
    /* Hold the communicator until every survivor has its verdict: a survivor that
     * tears down first would be reported as a second failure by the others. */
    __sync_fetch_and_add(&b->verdicts, 1);
    for (double t0 = now(); b->verdicts < n - 1 && now() - t0 < BOUND_S + 1;) usleep(1000);
    double t0 = now();
    if (run->moe) moea2a_moe_destroy(w.moe);
    moea2a_comm_destroy(comm);
    b->rank[rank].destroy_s = now() - t0;
    RANK_EXPECT(fails, rank, now() - t0 < 1.0, "destroy after the failure took %.2f s", now() - t0);
    return fails;
}

/* A rank that dies during setup (after comm_init, before moe_create): every survivor
 * must name it within a second, none blaming the neighbour that noticed first, and
 * none waiting for a neighbour to exit (each survivor stays alive until all have their
 * verdict). The timeout is long, so a timeout is no way to pass. */
#define SETUP_TIMEOUT_S 20.0
/* A death inside a host collective: its error within the peer watcher's grace (a second
 * from the news, once per death: man moea2a_comm) and half a second more */
#define SETUP_BOUND_S 1.5
/* A communicator with the long timeout, and a small host MoE context's config. */
static moea2a_comm_t long_comm(int rank, int n, moea2a_unique_id_t id)
{
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = SETUP_TIMEOUT_S;
    moea2a_comm_t comm;
    return moea2a_comm_init_rank(&comm, n, id, rank, &cfg) ? NULL : comm;
}

static moea2a_moe_config_t small_moe(void)
{
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = 16, mc.top_k = 2, mc.max_tokens_per_rank = 8, mc.hidden = 16, mc.memory = MOEA2A_MEMORY_HOST;
    return mc;
}

static int setup_death_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    board_t *b = arg;
    int fails = 0;
    moea2a_comm_t comm = long_comm(rank, n, id);
    if (!comm) return 1;
    moea2a_result_t rb = moea2a_barrier(comm);
    RANK_EXPECT(fails, rank, rb == MOEA2A_SUCCESS, "barrier before rank 0 exits: %s", moea2a_last_error(comm));
    if (rb) return fails;
    if (rank == 0) {
        /* a child holds this process's connections open past its exit, as a CUDA
         * context's teardown holds a dying process's files for a second or more: the
         * survivors then learn of the death from the peer watcher's shared mark alone */
        if (b->linger_ms && fork() == 0) {
            usleep((useconds_t)b->linger_ms * 1000u);
            _exit(0);
        }
        b->kill_time = now();
        __sync_synchronize();
        _exit(0);
    }
    moea2a_moe_config_t mc = small_moe();
    moea2a_moe_t moe = NULL;
    moea2a_result_t r = moea2a_moe_create(&moe, comm, &mc);
    double t_err = now();
    const char *msg = moea2a_last_error(comm);
    RANK_EXPECT(fails, rank,
                r == MOEA2A_ERR_PEER_FAILED && strstr(msg, "rank 0 ") && t_err - b->kill_time <= SETUP_BOUND_S,
                "moe_create %.2f s after rank 0 exited: %s: %s (want MOEA2A_ERR_PEER_FAILED naming rank 0 within %.1f s)",
                t_err - b->kill_time, moea2a_strerror(r), msg, SETUP_BOUND_S);
    __sync_fetch_and_add(&b->verdicts, 1);
    for (double t0 = now(); b->verdicts < n - 1 && now() - t0 < SETUP_TIMEOUT_S;) usleep(1000);
    if (moe) moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* A peer dies while the others are between calls: no call of theirs waits on it, so
 * only the peer watcher can tell them. Each survivor polls moea2a_moe_status, which
 * must say MOEA2A_ERR_PEER_FAILED naming the dead rank within 1 s of the kill; the
 * timeout is long, so it cannot be what tells them. */
static int idle_death_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    board_t *b = arg;
    int fails = 0;
    moea2a_comm_t comm = long_comm(rank, n, id);
    moea2a_moe_config_t mc = small_moe();
    moea2a_moe_t moe = NULL;
    if (!comm || moea2a_moe_create(&moe, comm, &mc) || moea2a_barrier(comm)) return 1;
    RANK_EXPECT(fails, rank, moea2a_moe_status(moe) == MOEA2A_SUCCESS, "status before the death: %s",
                moea2a_last_error(comm));
    if (rank == n - 1) {
        die_after(b, 50000);
    }
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (double t0 = now(); r == MOEA2A_SUCCESS && now() - t0 < SETUP_TIMEOUT_S; usleep(1000)) r = moea2a_moe_status(moe);
    const double after = now() - b->kill_time;
    char want[32];
    snprintf(want, sizeof(want), "rank %d ", n - 1);
    const char *msg = moea2a_last_error(comm);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_PEER_FAILED && strstr(msg, want) && b->kill_time > 0 && after <= 1.0,
                "status %.3f s after rank %d's kill: %s: %s (want MOEA2A_ERR_PEER_FAILED naming it within 1 s)", after,
                n - 1, moea2a_strerror(r), msg);
    b->rank[rank].after_kill = after;
    double t0 = now();
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    RANK_EXPECT(fails, rank, now() - t0 < 2.0, "destroy after the death took %.2f s", now() - t0);
    return fails;
}

/* The survivors' communicator is right: its size and ranks, and an alltoallv whose
 * blocks name their source and destination arrive where they should. */
static int check_comm(moea2a_comm_t c, int rank, int want_rank, int want_n)
{
    int fails = 0, r = -1, n = -1;
    moea2a_comm_rank(c, &r), moea2a_comm_size(c, &n);
    RANK_EXPECT(fails, rank, r == want_rank && n == want_n, "shrunk: rank %d of %d, want %d of %d", r, n, want_rank,
                want_n);
    if (fails) return fails;
    int64_t send[MAX_RANKS], recv[MAX_RANKS], counts[MAX_RANKS], displs[MAX_RANKS];
    for (int q = 0; q < n; q++) send[q] = 1000 * r + q, recv[q] = -1, counts[q] = 1, displs[q] = q;
    moea2a_result_t e = moea2a_alltoallv(send, counts, displs, recv, counts, displs, MOEA2A_INT64, c, NULL);
    RANK_EXPECT(fails, rank, e == MOEA2A_SUCCESS, "alltoallv on the shrunk communicator: %s", moea2a_last_error(c));
    for (int q = 0; e == MOEA2A_SUCCESS && q < n; q++)
        RANK_EXPECT(fails, rank, recv[q] == 1000 * q + r, "alltoallv: block from rank %d holds %lld", q,
                    (long long)recv[q]);
    return fails;
}

/* A MoE dispatch on the shrunk communicator: every row received names its source rank
 * and token, as the source index says. */
static int check_moe(moea2a_comm_t c, int rank)
{
    int fails = 0, me = -1, n = -1;
    moea2a_comm_rank(c, &me), moea2a_comm_size(c, &n);
    moea2a_moe_config_t mc = small_moe();
    mc.num_payloads = 1, mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_FLOAT32, 2};
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, c, &mc)) {
        RANK_EXPECT(fails, rank, 0, "moe_create on the shrunk communicator: %s", moea2a_last_error(c));
        return fails;
    }
    int32_t ids[8 * 2];
    float x[8 * 2];
    for (int t = 0; t < 8; t++) {
        ids[2 * t] = (t + me) % 16, ids[2 * t + 1] = (3 * t + 5) % 16;
        x[2 * t] = (float)me, x[2 * t + 1] = (float)t;
    }
    const void *pl[1] = {x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t e = moea2a_dispatch(moe, 8, ids, NULL, pl, 0, &res, NULL);
    RANK_EXPECT(fails, rank, e == MOEA2A_SUCCESS, "dispatch on the shrunk communicator: %s", moea2a_last_error(c));
    for (int q = 0; e == MOEA2A_SUCCESS && q < n; q++)
        for (int i = 0; i < res.recv_counts[q]; i++) {
            const size_t slot = (size_t)q * (size_t)res.stride + (size_t)i;
            const float *row = (const float *)res.payloads[0] + 2 * slot;
            RANK_EXPECT(fails, rank, row[0] == (float)q && row[1] == (float)res.src_token_index[slot],
                        "row %d from rank %d: (%g, %g), source index %d", i, q, row[0], row[1],
                        res.src_token_index[slot]);
        }
    if (e == MOEA2A_SUCCESS) {
        float out[8 * 16];
        e = moea2a_combine(moe, NULL, out, NULL);
        RANK_EXPECT(fails, rank, e == MOEA2A_SUCCESS, "combine on the shrunk communicator: %s", moea2a_last_error(c));
    }
    moea2a_moe_destroy(moe);
    return fails;
}

/* Rank 2 of 4 dies; the survivors learn of it, shrink to 3 ranks (renumbered 0, 1, 2
 * from 0, 1, 3) with no new id, and move data there; then, by choice, ranks 0 and 1
 * shrink the 3 to 2, leaving out rank 2 (which aborts its side). */
static int shrink_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    board_t *b = arg;
    int fails = 0;
    moea2a_comm_t comm = long_comm(rank, n, id);
    if (!comm || moea2a_barrier(comm)) return 1;
    if (rank == 2) {
        die_after(b, 20000);
    }
    moea2a_result_t r = moea2a_barrier(comm);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_PEER_FAILED && strstr(moea2a_last_error(comm), "rank 2 "),
                "barrier after the death: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
    moea2a_comm_t nc = NULL, nc2 = NULL;
    const double t0 = now();
    r = moea2a_comm_shrink(comm, NULL, 0, &nc);
    b->rank[rank].after_kill = now() - t0;
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "shrink: %s", moea2a_last_error(comm));
    const int nr = rank < 2 ? rank : rank - 1;
    if (r == MOEA2A_SUCCESS) fails += check_comm(nc, rank, nr, 3) + check_moe(nc, rank);
    if (r == MOEA2A_SUCCESS && nr < 2) {
        const int leave[1] = {2};
        const double t1 = now();
        r = moea2a_comm_shrink(nc, leave, 1, &nc2);
        b->rank[rank].choice_s = now() - t1;
        RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "shrink by choice: %s", moea2a_last_error(nc));
        if (r == MOEA2A_SUCCESS) fails += check_comm(nc2, rank, nr, 2) + check_moe(nc2, rank);
        const int self[1] = {nr};
        moea2a_comm_t none = NULL;
        RANK_EXPECT(fails, rank, moea2a_comm_shrink(nc, self, 1, &none) == MOEA2A_ERR_INVALID_ARGUMENT && !none,
                    "a rank that excludes itself: %s", moea2a_last_error(nc));
    } else if (r == MOEA2A_SUCCESS) {
        moea2a_comm_abort(nc); /* left out by the others */
    }
    if (nc2) moea2a_comm_destroy(nc2);
    if (nc) moea2a_comm_destroy(nc);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    int runs = getenv("MOEA2A_KILL_RUNS") ? atoi(getenv("MOEA2A_KILL_RUNS")) : 20;
    char tv[16];
    snprintf(tv, sizeof(tv), "%g", TIMEOUT_S);
    setenv("MOEA2A_TIMEOUT_S", tv, 1);
    /* host memory over UCX is under test: with NCCL too, a 4-rank init on a GPU
     * machine (NCCL's setup, refused for ranks sharing a GPU) outlasted the 2 s
     * timeout on a 4-GPU machine */
    setenv("MOEA2A_TRANSPORT", "ucx", 1);
    const char *tls0 = getenv("UCX_TLS");
    char tls_saved[128];
    snprintf(tls_saved, sizeof(tls_saved), "%s", tls0 ? tls0 : "");
    board_t *b = mmap(NULL, sizeof(board_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 1;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int survivors = 0, named = 0, timeouts = 0, signalled = 0;
    double worst = 0, sum_named = 0;
    for (int i = 0; i < runs; i++) {
        /* every other 4-rank run in two emulated nodes: MoE on the hierarchical path */
        int n = i % 2 ? 4 : 2, moe = (i / 2) % 2, default_tls = (i / 4) % 2, nodes = n == 4 && (i / 8) % 2;
        if (default_tls) unsetenv("UCX_TLS");
        else setenv("UCX_TLS", "self,sm", 1);
        if (nodes) setenv("MOEA2A_NODE_SIZE", "2", 1); /* the ranks inherit it */
        const int unwatched = i % 5 == 4; /* the transports' own detection, as without the peer watcher */
        if (unwatched) setenv("MOEA2A_WATCH", "0", 1);
        memset(b, 0, sizeof(*b));
        run_t run = {b, rand() % n, moe, (unsigned)(rand() % 40000)};
        local_ranks_result_t res;
        local_ranks_run(n, looping_rank, &run, 60.0, &res);
        unsetenv("MOEA2A_NODE_SIZE");
        unsetenv("MOEA2A_WATCH");
        int ok = res.hung == 0;
        for (int r = 0; r < n; r++) {
            if (r == run.victim) {
                ok &= res.exit_codes[r] == 128 + SIGKILL;
                continue;
            }
            survivors++;
            signalled += res.exit_codes[r] >= 128;
            ok &= res.exit_codes[r] == 0;
            if (b->rank[r].named) named++, sum_named += b->rank[r].after_kill;
            else if (b->rank[r].result == MOEA2A_ERR_TIMEOUT) timeouts++;
            if (b->rank[r].after_kill > worst) worst = b->rank[r].after_kill;
        }
        tap_ok(ok, "kill %d: %d ranks%s%s, %s, UCX_TLS=%s, rank %d killed after %.1f ms: survivors fail cleanly in time",
               i + 1, n, nodes ? " in nodes of 2" : "", unwatched ? ", MOEA2A_WATCH=0" : "",
               moe ? "dispatch/combine" : "alltoallv",
               default_tls ? "(default)" : "self,sm", run.victim, run.delay_us / 1000.0);
    }
    if (*tls_saved) setenv("UCX_TLS", tls_saved, 1);
    for (int linger = 0; linger <= 1; linger++)
        for (int n = 2; n <= 4; n += 2) {
            memset(b, 0, sizeof(*b));
            b->linger_ms = linger ? 3000 : 0;
            local_ranks_result_t res;
            local_ranks_run(n, setup_death_rank, b, 60.0, &res);
            tap_ok(res.failed == 0 && res.hung == 0, "%d ranks, rank 0 exits after comm_init%s: every survivor's "
                   "moe_create names rank 0 within %.1f s (none blames a neighbour or waits for one; exits %d %d %d %d)",
                   n, linger ? ", its connections held open 3 s longer" : "", SETUP_BOUND_S, res.exit_codes[0],
                   res.exit_codes[1], n > 2 ? res.exit_codes[2] : 0, n > 3 ? res.exit_codes[3] : 0);
        }
    for (int n = 2; n <= 4; n++) {
        memset(b, 0, sizeof(*b));
        local_ranks_result_t res;
        local_ranks_run(n, idle_death_rank, b, 60.0, &res);
        double slowest = 0;
        int ok = res.hung == 0 && res.exit_codes[n - 1] == 128 + SIGKILL;
        for (int r = 0; r < n - 1; r++) {
            ok &= res.exit_codes[r] == 0;
            slowest = b->rank[r].after_kill > slowest ? b->rank[r].after_kill : slowest;
        }
        tap_ok(ok,
               "%d ranks, rank %d killed between calls: every survivor's moea2a_moe_status names it within 1 s "
               "(slowest %.3f s; the timeout is %.0f s)", n, n - 1, slowest, SETUP_TIMEOUT_S);
    }
    memset(b, 0, sizeof(*b));
    local_ranks_result_t sres;
    local_ranks_run(4, shrink_rank, b, 120.0, &sres);
    tap_ok(sres.hung == 0 && sres.exit_codes[0] == 0 && sres.exit_codes[1] == 0 && sres.exit_codes[2] == 128 + SIGKILL &&
               sres.exit_codes[3] == 0,
           "4 ranks, rank 2 killed: the survivors shrink to 3 (no new id; %.3f s), renumbered, and alltoallv and MoE "
           "dispatch there are right; ranks 0 and 1 then shrink to 2 by choice (%.3f s)", b->rank[0].after_kill,
           b->rank[0].choice_s);
    tap_diag("%d survivors: %d killed by a signal, %d PEER_FAILED naming the dead rank (mean %.3f s after the kill), "
             "%d TIMEOUT; slowest %.2f s (bound %.1f s)",
             survivors, signalled, named, named ? sum_named / named : 0.0, timeouts, worst, BOUND_S);
    return tap_done();
}

/* The recovery flow on host memory (moea2a_moe(3), "Recovery"): 4 ranks loop over MoE
 * dispatch + combine, the placement changing every few iterations (an expert held by
 * no rank now and then), every result checked against a reference that knows the
 * placement. In each cycle one rank (never rank 0) is killed with SIGKILL at a random
 * moment; the survivors shrink to 3 (moea2a_comm_shrink), move their context there
 * (moea2a_moe_retarget, the placement derived: the test derives it too) and go on with
 * checked round trips; then a spare process joins as the dead rank
 * (moea2a_comm_grow on the survivors, moea2a_comm_init_rank + moea2a_moe_create on the
 * spare), the survivors retarget to a given map, and the 4 go on checked. Rank 0's
 * process lives through every cycle: its descriptors, threads and heap must not grow.
 * Then the same on CUDA memory where a GPU is: the load/store path, ranks sharing the
 * GPUs over CUDA IPC (no NCCL), every expert held (CUDA memory takes no -1); and the
 * generic NCCL path, each process a host of its own for NCCL (NCCL_HOSTID), so that
 * ranks may share a GPU there too (NCCL joins them through its network transport).
 * MOEA2A_ELASTIC_CYCLES (default 3, at most MAX_CYCLES) sets the number of cycles;
 * MOEA2A_ELASTIC_ONLY=host, ipc or nccl runs that part alone (the others' points
 * skipped), so that a long run on GPUs fits a time limit; MOEA2A_ELASTIC_FDS set lists
 * rank 0's descriptors after the first and the last. */
#include "config.h"

#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "derived_placement.h"
#ifdef MOEA2A_HAVE_CUDA
#include "gpu_util.h"
#endif
#include "local_ranks.h"
#include "mix.h"
#include "moea2a.h"
#include "no_nccl.h"
#include "tap.h"

#define N 4
#define E 16
#define K 2
#define CAP 8
#define H 4 /* floats per payload row and per combine row */
/* long enough for 4 + cycles processes making their CUDA contexts at once before the
 * first rendezvous; deaths are the peer watcher's news, not the timeout's */
#define TIMEOUT_S 10.0
#define MAX_CYCLES 100
_Static_assert(N + MAX_CYCLES <= LOCAL_RANKS_CODES, "every process's exit code is kept");

static int ndev; /* 0: host memory; else CUDA memory, rank r on GPU r % ndev */
static int over_nccl; /* CUDA memory over NCCL (the generic path), every process NCCL_HOSTID apart */

/* The few device calls of the CUDA cycles; a build without CUDA runs the host cycles
 * only (ndev stays 0, so none of these is reached). */
#ifdef MOEA2A_HAVE_CUDA
static void dev_use(int g) { cudaSetDevice(g); }
static void dev_ready(int g) { cudaSetDevice(g), cudaFree(NULL); }
static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
static void dev_put(void *dst, const void *src, size_t n) { cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice); }
static void dev_get(void *dst, const void *src, size_t n) { cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost); }
static int dev_sync(void) { return cudaDeviceSynchronize() == cudaSuccess; }
static int gpus_here(void) { return gpu_count(); }
static void nccl_apart(int process) { if (over_nccl) nccl_hosts_apart(process, 1); }
#else
static void dev_use(int g) { (void)g; }
static void dev_ready(int g) { (void)g; }
static void *dev_alloc(size_t bytes) { return malloc(bytes); }
static void dev_put(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static void dev_get(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static int dev_sync(void) { return 1; }
static int gpus_here(void) { return 0; }
static void nccl_apart(int process) { (void)process; }
#endif

typedef struct {
    volatile int cycle_kill[MAX_CYCLES]; /* set by the victim of the cycle when it arms its killer */
    volatile int32_t map0[MAX_CYCLES][E];  /* the placement rank 0 last set in the cycle */
    volatile double kill_time[MAX_CYCLES];
    volatile double back_s[MAX_CYCLES][N];   /* kill to the first checked round trip on 3 ranks */
    volatile double shrink_s[MAX_CYCLES][N]; /* the shrink and retarget */
    volatile double grow_s[MAX_CYCLES][N];   /* the grow and retarget (or create) */
    volatile int join_req, claimed, done;    /* spares: cycle + 1 of the join wanted, and taken */
    moea2a_unique_id_t join_id;
    volatile int join_rank;
    volatile long fd0, fd1, threads0, threads1;
    volatile long sock0, sock1, closed0, closed1; /* of fd0, fd1: sockets, and those whose connection is gone */
    volatile long long heap0, heap1;
    unsigned seed;
    int cycles;
} board_t;

static unsigned mix2(unsigned a, unsigned b) { return (unsigned)mix((uint64_t)a << 32 | b); }

/* Every rank computes the same: the victim of a cycle (1..N-1), the tokens, ids and
 * payloads of any rank at any iteration, and the maps. */
static int victim_of(const board_t *b, int cycle) { return 1 + (int)(mix2(b->seed, (unsigned)cycle) % (N - 1)); }

static int ntok(int it, int rank) { return (it + rank) % 5 == 4 ? 0 : 1 + (it * 3 + rank) % CAP; }

static int32_t id_of(int it, int rank, int t, int j)
{
    unsigned h = mix2(mix2((unsigned)it, (unsigned)rank), (unsigned)(t * K + j));
    return h % 23 == 0 ? -1 : (int32_t)(h % E); /* an invalid id now and then */
}

static float x_of(int rank, int t, int c, int it) { return c == 0 ? (float)(rank * 100 + t) : (float)(c + it % 7); }

/* The placement of the loop at iteration it of a phase over n ranks: rotated every 3
 * iterations, and one expert held by no rank every other time. */
static void loop_map(int phase, int it, int n, int32_t *map)
{
    const int step = it / 3;
    for (int e = 0; e < E; e++) map[e] = (e * 7 + phase + step) % n;
    if (step % 2 && !ndev) map[(phase + step) % E] = -1; /* CUDA memory: every expert held */
}

static moea2a_moe_config_t config(void)
{
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = E, mc.top_k = K, mc.max_tokens_per_rank = CAP, mc.hidden = H;
    mc.combine_dtype = MOEA2A_FLOAT32, mc.memory = ndev ? MOEA2A_MEMORY_CUDA : MOEA2A_MEMORY_HOST;
    mc.max_local_experts = E;
    mc.num_payloads = 1, mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_FLOAT32, H};
    return mc;
}

/* Rank `rank` of n joins id's communicator (on its GPU, for CUDA memory). */
static moea2a_result_t join(moea2a_comm_t *comm, int n, moea2a_unique_id_t id, int rank)
{
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    if (ndev) dev_use(rank % ndev), cfg.cuda_device = rank % ndev;
    return moea2a_comm_init_rank(comm, n, id, rank, &cfg);
}

/* A call's arrays where the context's memory is: host arrays as they are, or device
 * copies (made once per process) and the device's results read back after the stream
 * (and the context's status: a dead peer's news ends the device's waits). */
typedef struct {
    int32_t *ids;
    float *x, *out;
} dev_bufs_t;

static moea2a_result_t synced(moea2a_moe_t moe)
{
    return ndev && !dev_sync() ? MOEA2A_ERR_CUDA : moea2a_moe_status(moe);
}

static void fetch(void *dst, const void *src, size_t bytes)
{
    if (ndev) dev_get(dst, src, bytes);
    else memcpy(dst, src, bytes);
}

/* One checked round trip: rows from rank q arrive as many as q's tokens this rank
 * holds an expert of, each naming its source token; combine returns each token times
 * the number of ranks that held one of its experts (the expert is the identity). */
static int round_trip(moea2a_moe_t moe, moea2a_comm_t comm, const int32_t *map, int it, int tag, moea2a_result_t *err)
{
    int me, n, fails = 0;
    moea2a_comm_rank(comm, &me), moea2a_comm_size(comm, &n);
    const int nt = ntok(it, me);
    int32_t ids[CAP * K];
    float x[CAP * H], out[CAP * H];
    for (int t = 0; t < nt; t++) {
        for (int j = 0; j < K; j++) ids[t * K + j] = id_of(it, me, t, j);
        for (int c = 0; c < H; c++) x[t * H + c] = x_of(me, t, c, it);
    }
    static dev_bufs_t d;
    const int32_t *ids_in = ids;
    const float *x_in = x;
    float *out_at = out;
    if (ndev) {
        if (!d.ids) d.ids = dev_alloc(sizeof(ids)), d.x = dev_alloc(sizeof(x)), d.out = dev_alloc(sizeof(out));
        dev_put(d.ids, ids, sizeof(ids)), dev_put(d.x, x, sizeof(x));
        ids_in = d.ids, x_in = d.x, out_at = d.out;
    }
    const void *pl[1] = {x_in};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    if ((*err = moea2a_dispatch(moe, nt, ids_in, NULL, pl, 0, &res, NULL)) != MOEA2A_SUCCESS) return 0;
    if ((*err = synced(moe)) != MOEA2A_SUCCESS) return 0;
    static int32_t counts[N], src_index[N * CAP];
    static float rows[N * CAP * H];
    fetch(counts, res.recv_counts, sizeof(int32_t) * (size_t)n);
    fetch(src_index, res.src_token_index, sizeof(int32_t) * (size_t)n * (size_t)res.stride);
    fetch(rows, res.payloads[0], sizeof(float) * H * (size_t)n * (size_t)res.stride);
    for (int q = 0; q < n; q++) {
        int want = 0;
        for (int t = 0; t < ntok(it, q); t++) {
            int here = 0;
            for (int j = 0; j < K; j++) {
                const int32_t e = id_of(it, q, t, j);
                here |= e >= 0 && map[e] == me;
            }
            want += here;
        }
        RANK_EXPECT(fails, tag, counts[q] == want, "it %d: %d rows from rank %d, want %d", it, counts[q], q, want);
        for (int i = 0; i < counts[q] && i < want; i++) {
            const size_t slot = (size_t)q * (size_t)res.stride + (size_t)i;
            const float *row = rows + slot * H;
            RANK_EXPECT(fails, tag, row[0] == (float)(q * 100 + src_index[slot]), "it %d: row %d from %d: "
                        "%g for token %d", it, i, q, row[0], src_index[slot]);
        }
    }
    if ((*err = moea2a_combine(moe, res.payloads[0], out_at, NULL)) != MOEA2A_SUCCESS) return fails;
    if ((*err = synced(moe)) != MOEA2A_SUCCESS) return fails;
    fetch(out, out_at, sizeof(float) * H * (size_t)nt);
    for (int t = 0; t < nt; t++) {
        int ranks = 0;
        for (int q = 0; q < n; q++) {
            int holds = 0;
            for (int j = 0; j < K; j++) holds |= ids[t * K + j] >= 0 && map[ids[t * K + j]] == q;
            ranks += holds;
        }
        for (int c = 0; c < H; c++)
            RANK_EXPECT(fails, tag, out[t * H + c] == (float)ranks * x[t * H + c], "it %d: token %d [%d] = %g, want %g",
                        it, t, c, out[t * H + c], (double)ranks * x[t * H + c]);
    }
    return fails;
}

static long count_dir(const char *path)
{
    DIR *d = opendir(path);
    long n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* Whether socket inode ino has a line in the kernel's tables of this network namespace
 * (TCP, UDP, UNIX, netlink); a TCP connection that was reset (its peer died) has none,
 * though its descriptor stays open until closed. The line into where, when found. */
static int socket_listed(unsigned long ino, char *where, size_t len)
{
    static const char *const tabs[] = {"/proc/self/net/tcp",  "/proc/self/net/tcp6", "/proc/self/net/udp",
                                       "/proc/self/net/udp6", "/proc/self/net/unix", "/proc/self/net/netlink"};
    char want[32];
    snprintf(want, sizeof(want), "%lu", ino);
    for (size_t t = 0; t < sizeof(tabs) / sizeof(tabs[0]); t++) {
        FILE *f = fopen(tabs[t], "r");
        char line[512];
        while (f && fgets(line, sizeof(line), f)) {
            char copy[sizeof(line)], *save = NULL;
            snprintf(copy, sizeof(copy), "%s", line);
            for (char *tok = strtok_r(copy, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
                if (!strcmp(tok, want)) {
                    line[strcspn(line, "\n")] = 0;
                    snprintf(where, len, "%s: %s", tabs[t] + 15, line);
                    fclose(f);
                    return 1;
                }
        }
        if (f) fclose(f);
    }
    return 0;
}

/* Open descriptors, and among them sockets (*sockets) and those whose connection is gone
 * (*closed: not in the kernel's tables). MOEA2A_ELASTIC_FDS set: each one listed as a TAP
 * comment, headed by `when`. */
static long count_fds(long *sockets, long *closed, const char *when)
{
    const int show = getenv("MOEA2A_ELASTIC_FDS") != NULL;
    DIR *d = opendir("/proc/self/fd");
    long n = 0;
    *sockets = *closed = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], target[256], where[600] = "";
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        const ssize_t len = readlink(path, target, sizeof(target) - 1);
        target[len > 0 ? len : 0] = 0;
        unsigned long ino;
        n++;
        if (sscanf(target, "socket:[%lu]", &ino) == 1 && (++*sockets, !socket_listed(ino, where, sizeof(where))))
            ++*closed, snprintf(where, sizeof(where), "(a socket whose connection is gone)");
        if (show) printf("# %s: fd %s -> %s %s\n", when, e->d_name, target, where);
    }
    if (d) closedir(d);
    if (show) fflush(stdout);
    return n; /* the directory's own included, as count_dir counts */
}

typedef struct {
    board_t *b;
    int cycle;
} killer_t;

static void *killer(void *arg)
{
    killer_t *k = arg;
    usleep(1000 + mix2(k->b->seed, (unsigned)k->cycle * 7u) % 20000);
    k->b->kill_time[k->cycle] = now();
    __sync_synchronize();
    kill(getpid(), SIGKILL);
    return NULL;
}

/* A member from cycle c0 on (rank 0..3 of comm, moe on it with the grow's map, or the
 * create's contiguous placement at c0 = 0). Returns its failed checks. */
static int member(board_t *b, moea2a_comm_t comm, moea2a_moe_t moe, int c0)
{
    int fails = 0, me;
    moea2a_comm_rank(comm, &me);
    int32_t map[E];
    for (int cycle = c0; cycle < b->cycles; cycle++) {
        const int victim = victim_of(b, cycle);
        /* 4 ranks until the kill */
        moea2a_result_t err = MOEA2A_SUCCESS;
        int it = 0;
        static killer_t k;
        for (; err == MOEA2A_SUCCESS && it < 100000; it++) {
            if (it % 3 == 0) {
                int32_t next[E];
                loop_map(cycle, it, N, next);
                if ((err = moea2a_moe_set_placement(moe, next, NULL)) != MOEA2A_SUCCESS) break;
                memcpy(map, next, sizeof(map));
                if (me == 0) memcpy((void *)b->map0[cycle], map, sizeof(map));
            }
            if (me == victim && it == 5) {
                pthread_t t;
                k.b = b, k.cycle = cycle;
                b->cycle_kill[cycle] = 1;
                pthread_create(&t, NULL, killer, &k);
            }
            fails += round_trip(moe, comm, map, it, me, &err);
        }
        if (me == victim) pause(); /* its killer ends it */
        char want[32];
        snprintf(want, sizeof(want), "rank %d", victim);
        RANK_EXPECT(fails, me, (err == MOEA2A_ERR_PEER_FAILED && strstr(moea2a_last_error(comm), want)) ||
                                   err == MOEA2A_ERR_ABORTED,
                    "cycle %d: the loop ended on %s: %s (want PEER_FAILED naming rank %d)", cycle,
                    moea2a_strerror(err), moea2a_last_error(comm), victim);
        if (err != MOEA2A_ERR_PEER_FAILED && err != MOEA2A_ERR_ABORTED) return fails + 1;
        /* shrink, retarget with the derived placement, go on checked */
        double t0 = now();
        moea2a_comm_t small = NULL;
        moea2a_comm_abort(comm); /* ends what still waits on the dead rank (moea2a_recovery(7)) */
        moea2a_result_t r = moea2a_comm_shrink(comm, NULL, 0, &small);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: shrink: %s", cycle, moea2a_last_error(comm));
        if (r) return fails;
        int32_t dmap[E]; /* from rank 0's placement: a change the kill cut short may differ here */
        derived_placement((const int32_t *)b->map0[cycle], E, N, victim, dmap);
        const double t_shrunk = now();
        r = moea2a_moe_retarget(moe, small, NULL);
        b->shrink_s[cycle][me] = now() - t0;
        if (getenv("MOEA2A_ELASTIC_TIMES"))
            printf("# rank %d: shrink %.3f s, retarget %.3f s\n", me, t_shrunk - t0, now() - t_shrunk);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: retarget to 3 ranks: %s", cycle, moea2a_last_error(small));
        if (r) return fails;
        const double t_destroy = now();
        moea2a_comm_destroy(comm);
        if (getenv("MOEA2A_ELASTIC_TIMES"))
            printf("# rank %d: cycle %d: the old communicator destroyed in %.3f s\n", me, cycle, now() - t_destroy);
        int sme;
        moea2a_comm_rank(small, &sme);
        for (int i = 0; i < 3 && r == MOEA2A_SUCCESS; i++) {
            fails += round_trip(moe, small, dmap, 1000 + i, me, &r);
            if (i == 0) b->back_s[cycle][me] = now() - b->kill_time[cycle];
        }
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: round trip on 3 ranks: %s", cycle,
                    moea2a_last_error(small));
        if (r) return fails;
        /* grow back: rank 0 makes the id, a spare takes the dead rank's place */
        t0 = now();
        moea2a_unique_id_t id;
        if (sme == 0) {
            r = moea2a_get_unique_id(&id);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "get_unique_id: %s", moea2a_last_error(NULL));
            b->join_id = id, b->join_rank = victim;
            __sync_synchronize();
            b->join_req = cycle + 1;
        }
        moea2a_comm_t full = NULL;
        r = moea2a_comm_grow(small, N, &id, me, &full);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: grow: %s", cycle, moea2a_last_error(small));
        if (r) return fails;
        loop_map(cycle + 100, 0, N, map);
        r = moea2a_moe_retarget(moe, full, map);
        b->grow_s[cycle][me] = now() - t0;
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: retarget to 4 ranks: %s", cycle, moea2a_last_error(full));
        if (r) return fails;
        moea2a_comm_destroy(small);
        comm = full;
        for (int i = 0; i < 3 && r == MOEA2A_SUCCESS; i++) fails += round_trip(moe, comm, map, 2000 + i, me, &r);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "cycle %d: round trip after the grow: %s", cycle,
                    moea2a_last_error(comm));
        if (r) return fails;
        if (me == 0 && cycle == 0) {
            long sockets, closed;
            b->fd0 = count_fds(&sockets, &closed, "after the first cycle"), b->sock0 = sockets, b->closed0 = closed;
            b->threads0 = count_dir("/proc/self/task");
            b->heap0 = (long long)mallinfo2().uordblks;
        }
    }
    if (me == 0) {
        long sockets, closed;
        b->fd1 = count_fds(&sockets, &closed, "after the last cycle"), b->sock1 = sockets, b->closed1 = closed;
        b->threads1 = count_dir("/proc/self/task");
        b->heap1 = (long long)mallinfo2().uordblks;
    }
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* Spare k: waits for the join of cycle k, takes it, creates the context with the
 * survivors' map and becomes a member from the next cycle. It makes its GPUs' contexts
 * once spare k - 1 has joined, so that it is ready before it is called, as a
 * replacement would be (a second or more on some machines, which the rendezvous's
 * timeout would count), and so that one spare at a time makes them: up to 100 spares
 * making theirs at once kept the members' own start past the rendezvous's timeout. */
static int spare(board_t *b, int k)
{
    int ready = 0;
    for (;;) {
        const int req = b->join_req, got = b->claimed;
        if (b->done) return 0;
        if (!ready && got == k) {
            for (int g = 0; g < ndev; g++) dev_ready(g);
            ready = 1;
            continue;
        }
        if (ready && req > k && __sync_bool_compare_and_swap(&b->claimed, k, k + 1)) break;
        /* up to 100 spares wait at once: a few wake-ups a second each keep them off the
         * cores the members' recovery is timed on (a join waits 20 ms at most for one) */
        usleep(20000);
    }
    const int cycle = b->claimed - 1, rank = b->join_rank;
    moea2a_unique_id_t id = b->join_id;
    int fails = 0;
    moea2a_comm_t comm;
    moea2a_result_t r = join(&comm, N, id, rank);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "cycle %d: the spare's init as rank %d: %s", cycle, rank,
                moea2a_last_error(NULL));
    if (r) return 1;
    int32_t map[E];
    loop_map(cycle + 100, 0, N, map);
    moea2a_moe_config_t mc = config();
    mc.placement = MOEA2A_PLACEMENT_MAP, mc.expert_to_rank = map;
    moea2a_moe_t moe;
    r = moea2a_moe_create(&moe, comm, &mc);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "cycle %d: the spare's create: %s", cycle, moea2a_last_error(comm));
    if (r) return 1;
    for (int i = 0; i < 3 && r == MOEA2A_SUCCESS; i++) fails += round_trip(moe, comm, map, 2000 + i, rank, &r);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "cycle %d: the spare's round trip: %s", cycle, moea2a_last_error(comm));
    if (r) return fails;
    return fails + member(b, comm, moe, cycle + 1);
}

static int first_member(board_t *b, int rank, moea2a_unique_id_t id)
{
    moea2a_comm_t comm;
    if (join(&comm, N, id, rank)) {
        printf("# rank %d: init: %s\n", rank, moea2a_last_error(NULL));
        return 1;
    }
    moea2a_moe_config_t mc = config();
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) {
        printf("# rank %d: create: %s\n", rank, moea2a_last_error(comm));
        return 1;
    }
    return member(b, comm, moe, 0);
}

static int run_rank(int rank, int nranks, moea2a_unique_id_t id, void *arg)
{
    (void)nranks;
    board_t *b = arg;
    nccl_apart(rank); /* rank: this process's index among the members and spares */
    if (rank >= N) return spare(b, rank - N);
    const int fails = first_member(b, rank, id);
    if (rank == 0) b->done = 1; /* rank 0 outlives every cycle (or fails): the spares left may go */
    return fails;
}

/* Wrong calls, on 2 ranks with no process joining: every rank gets the same code,
 * naming the rank at fault, and the communicator stays usable. A retarget to a shrunk
 * copy derives the same placement; one whose map is wrong leaves the context holding
 * nothing: its calls say so, and destroy frees it. */
static int wrong_calls_rank(int rank, int nranks, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    int fails = 0;
    moea2a_comm_t comm, grown = NULL;
    if (moea2a_comm_init_rank(&comm, nranks, id, rank, NULL)) return 1;
    moea2a_unique_id_t gid;
    if (rank == 0 && moea2a_get_unique_id(&gid)) return 1;
    static const struct {
        int nranks[2], rank[2], null_id[2];
        moea2a_result_t want;
        const char *names;
    } cases[] = {
        {{3, 3}, {-1, -1}, {0, 1}, MOEA2A_ERR_INVALID_ARGUMENT, "id is NULL"},
        {{3, 4}, {-1, -1}, {0, 0}, MOEA2A_ERR_MISMATCH, "to 4"},
        {{3, 3}, {2, 2}, {0, 0}, MOEA2A_ERR_MISMATCH, "both take rank 2"},
        {{2, 2}, {-1, -1}, {0, 0}, MOEA2A_ERR_INVALID_ARGUMENT, "must exceed"},
        {{3, 3}, {-1, 3}, {0, 0}, MOEA2A_ERR_INVALID_ARGUMENT, "rank=3"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        moea2a_unique_id_t mine = gid;
        moea2a_result_t r = moea2a_comm_grow(comm, cases[i].nranks[rank], cases[i].null_id[rank] ? NULL : &mine,
                                             cases[i].rank[rank], &grown);
        RANK_EXPECT(fails, rank, r == cases[i].want && !grown && strstr(moea2a_last_error(comm), cases[i].names),
                    "grow case %zu: %s: %s (want %s naming '%s')", i, moea2a_strerror(r), moea2a_last_error(comm),
                    moea2a_strerror(cases[i].want), cases[i].names);
    }
    RANK_EXPECT(fails, rank, moea2a_barrier(comm) == MOEA2A_SUCCESS, "barrier after the wrong grows: %s",
                moea2a_last_error(comm));
    moea2a_moe_config_t mc = config();
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &mc)) return fails + 1;
    RANK_EXPECT(fails, rank, moea2a_moe_retarget(moe, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "retarget to its own communicator: %s", moea2a_last_error(comm));
    moea2a_comm_t copy = NULL, copy2 = NULL;
    if (moea2a_comm_shrink(comm, NULL, 0, &copy) || moea2a_comm_shrink(copy, NULL, 0, &copy2)) return fails + 1;
    int32_t map[E];
    for (int e = 0; e < E; e++) map[e] = e < E / 2 ? 0 : 1; /* the contiguous placement over 2 ranks */
    moea2a_result_t r = moea2a_moe_retarget(moe, copy, NULL), er = MOEA2A_SUCCESS;
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "retarget to a shrunk copy: %s", moea2a_last_error(copy));
    for (int it = 0; r == MOEA2A_SUCCESS && it < 3; it++) fails += round_trip(moe, copy, map, it, rank, &er);
    RANK_EXPECT(fails, rank, er == MOEA2A_SUCCESS, "round trip after the retarget: %s", moea2a_last_error(copy));
    r = moea2a_moe_retarget(moe, comm, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "shrunk"),
                "retarget with no map to a communicator not shrunk from its own: %s: %s", moea2a_strerror(r),
                moea2a_last_error(comm));
    map[3] = 7;
    r = moea2a_moe_retarget(moe, copy2, map);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(copy2), "expert_to_rank[3]=7"),
                "retarget with a map naming rank 7: %s: %s", moea2a_strerror(r), moea2a_last_error(copy2));
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    r = moea2a_dispatch(moe, 0, NULL, NULL, NULL, 0, &res, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_ERR_STATE && strstr(moea2a_last_error(copy2), "retarget failed"),
                "dispatch after a failed retarget: %s: %s", moea2a_strerror(r), moea2a_last_error(copy2));
    RANK_EXPECT(fails, rank, moea2a_moe_destroy(moe) == MOEA2A_SUCCESS, "destroy after a failed retarget");
    RANK_EXPECT(fails, rank, moea2a_barrier(copy2) == MOEA2A_SUCCESS, "barrier after: %s", moea2a_last_error(copy2));
    moea2a_comm_destroy(copy2), moea2a_comm_destroy(copy), moea2a_comm_destroy(comm);
    return fails;
}

/* The cycles on the memory ndev says; their results as test points. */
static void run_cycles(board_t *b, int cycles, const char *where)
{
    memset(b, 0, sizeof(*b));
    b->seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    b->cycles = cycles;
    tap_diag("%s: seed %u, %d cycles", where, b->seed, cycles);
    local_ranks_result_t res;
    local_ranks_run(N + cycles, run_rank, b, 30.0 + 10.0 * cycles, &res);
    /* the ranks killed are the victims' processes: the first 4 and the spares that joined */
    int killed = 0, ok = res.hung == 0;
    for (int p = 0; p < N + cycles; p++) {
        killed += res.exit_codes[p] == 128 + SIGKILL;
        ok &= res.exit_codes[p] == 0 || res.exit_codes[p] == 128 + SIGKILL;
    }
    ok &= killed == cycles && res.exit_codes[0] == 0;
    double back = 0, shrink = 0, grow = 0;
    for (int c = 0; c < cycles; c++)
        for (int q = 0; q < N; q++) {
            back = b->back_s[c][q] > back ? b->back_s[c][q] : back;
            shrink = b->shrink_s[c][q] > shrink ? b->shrink_s[c][q] : shrink;
            grow = b->grow_s[c][q] > grow ? b->grow_s[c][q] : grow;
        }
    tap_ok(ok, "%s: %d cycles of kill (a random rank but 0, at a random moment), shrink to 3, retarget, grow back "
           "to 4 with a spare, retarget: every round trip checked against the placement in force (%d killed, %d "
           "hung)", where, cycles, killed, res.hung);
    /* the bound is the timeout's (a survivor stuck on the dead rank would be there at
     * the most); the times themselves are measurements, for the results page */
    tap_ok(ok && back <= TIMEOUT_S + 1.0, "%s: survivors back to checked round trips within MOEA2A_TIMEOUT_S + 1 s "
           "of each kill (slowest %.3f s; shrink + retarget at most %.3f s, grow + retarget at most %.3f s)", where,
           back, shrink, grow);
    /* Over NCCL's network transport the sockets are NCCL's too, and an aborted NCCL
     * communicator keeps some whose connection the dead rank's end reset (six at a time,
     * seen with NCCL 2.28.9). There the sockets are reported, not held to the count:
     * moea2a's own go through the same code in the host and CUDA IPC runs, which hold
     * every descriptor; here every descriptor but a socket must stay. */
    const long kept0 = b->fd0 - (over_nccl ? b->sock0 : 0), kept1 = b->fd1 - (over_nccl ? b->sock1 : 0);
    char apart[128] = "";
    if (over_nccl)
        snprintf(apart, sizeof(apart), " besides sockets (NCCL's among them: %ld -> %ld, with connections gone %ld -> %ld)",
                 b->sock0, b->sock1, b->closed0, b->closed1);
    if (cycles >= 2)
        tap_ok(ok && kept1 == kept0 && b->threads1 == b->threads0 && b->heap1 - b->heap0 < 256 * 1024,
               "%s: rank 0 after %d more cycles: descriptors %ld -> %ld%s, threads %ld -> %ld, heap %+lld bytes",
               where, cycles - 1, kept0, kept1, apart, b->threads0, b->threads1, b->heap1 - b->heap0);
    else
        tap_skip("one cycle", "%s: descriptors, threads and heap across cycles", where);
}

/* Whether MOEA2A_ELASTIC_ONLY leaves the part named so to run. */
static int part_runs(const char *name)
{
    const char *only = getenv("MOEA2A_ELASTIC_ONLY");
    return !only || !*only || strcmp(only, name) == 0;
}

/* The cycles on CUDA memory over CUDA IPC (the load/store path, no NCCL) or over NCCL
 * (the generic path), or their points skipped saying why. */

static void cuda_cycles(board_t *b, int cycles, int gpus, int nccl)
{
    const char *path = nccl ? "generic NCCL path" : "load/store path over CUDA IPC";
    const char *why = !part_runs(nccl ? "nccl" : "ipc")            ? "MOEA2A_ELASTIC_ONLY"
                      : !gpus                                       ? "no CUDA device"
                      : !have_transport(nccl ? "nccl" : "ucx")      ? (nccl ? "no nccl transport" : "no ucx transport")
                                                                    : NULL;
    if (why) {
        for (int i = 0; i < 3; i++) tap_skip(why, "CUDA memory: the recovery cycles (%s)", path);
        return;
    }
    ndev = gpus < N ? gpus : N, over_nccl = nccl;
    if (nccl) {
        unsetenv("MOEA2A_TRANSPORT"), unsetenv("MOEA2A_SYMMETRIC_MEMORY");
        setenv("MOEA2A_NVLINK", "0", 1); /* the generic path: NCCL's sends and receives */
    } else {
        without_nccl(); /* ranks share GPUs: CUDA IPC, no NCCL */
    }
    char where[96];
    snprintf(where, sizeof(where), "CUDA memory, %d ranks on %d GPU(s), %s", N, ndev, path);
    run_cycles(b, cycles, where);
}

int main(void)
{
    int cycles = getenv("MOEA2A_ELASTIC_CYCLES") ? atoi(getenv("MOEA2A_ELASTIC_CYCLES")) : 3;
    if (cycles < 1) cycles = 1;
    if (cycles > MAX_CYCLES) cycles = MAX_CYCLES;
    char tv[16];
    snprintf(tv, sizeof(tv), "%g", TIMEOUT_S);
    setenv("MOEA2A_TIMEOUT_S", tv, 1);
    setenv("MOEA2A_TRANSPORT", "ucx", 1); /* host memory is under test */
    board_t *b = mmap(NULL, sizeof(board_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 1;
    if (part_runs("host")) {
        run_cycles(b, cycles, "host memory");
        local_ranks_result_t wres;
        local_ranks_run(2, wrong_calls_rank, NULL, 60.0, &wres);
        tap_ok(wres.failed == 0 && wres.hung == 0, "wrong grows (an id missing, sizes or ranks that differ, no growth, a "
               "rank out of range) fail on every rank naming the cause; retargets: to a shrunk copy (placement derived), "
               "refused with no map elsewhere, and with a bad map, after which the context says so until destroyed");
    } else {
        for (int i = 0; i < 4; i++) tap_skip("MOEA2A_ELASTIC_ONLY", "host memory: the recovery cycles and wrong grows");
    }
    const int gpus = gpus_here();
    cuda_cycles(b, cycles, gpus, 0);
    cuda_cycles(b, cycles, gpus, 1);
    return tap_done();
}

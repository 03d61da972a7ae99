/* Communicator life cycle across processes: init for 1..8 ranks, bad arguments,
 * rendezvous failures (mismatched nranks, foreign and stale ids, stray connections),
 * unavailable transports, a version 1 transport module, init from the environment,
 * abort. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wireup/bootstrap.h" /* only to reach the root address inside an id */
#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define WATCHDOG 60.0

static int init_destroy_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    int fails = 0, r = -1, s = -1;
    moea2a_comm_t comm;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, NULL);
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "init: %s: %s", moea2a_strerror(res), moea2a_last_error(NULL));
    if (res) return 1;
    moea2a_comm_rank(comm, &r);
    moea2a_comm_size(comm, &s);
    RANK_EXPECT(fails, rank, r == rank && s == n, "rank/size %d/%d, expected %d/%d", r, s, rank, n);
    RANK_EXPECT(fails, rank, moea2a_barrier(comm) == MOEA2A_SUCCESS, "barrier: %s", moea2a_last_error(comm));
    RANK_EXPECT(fails, rank, moea2a_comm_destroy(comm) == MOEA2A_SUCCESS, "destroy: %s", moea2a_last_error(NULL));
    return fails;
}

/* The node map under MOEA2A_NODE_SIZE = *arg (all ranks on this host): nodes of that
 * many consecutive ranks (the last one shorter), or one node for 0; a value that
 * differs on the last rank, or is out of range, fails every rank. */
static int node_map_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const int size = *(const int *)arg, odd = size >= 100; /* >= 100: the last rank sets size - 100 + 1 */
    const int want = odd ? size - 100 : size;
    char v[16];
    snprintf(v, sizeof(v), "%d", rank == n - 1 && odd ? want + 1 : want);
    setenv("MOEA2A_NODE_SIZE", v, 1);
    int fails = 0, node = -1, nodes = -1, local = -1, lsize = -1;
    moea2a_comm_t comm;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, NULL);
    if (odd || want > n) {
        moea2a_result_t expect = want > n ? MOEA2A_ERR_INVALID_ARGUMENT : MOEA2A_ERR_MISMATCH;
        RANK_EXPECT(fails, rank, res == expect && strstr(moea2a_last_error(NULL), "MOEA2A_NODE_SIZE"),
                    "MOEA2A_NODE_SIZE %s: got %s: %s", odd ? "differing on the last rank" : "out of range",
                    moea2a_strerror(res), moea2a_last_error(NULL));
        if (res == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);
        return fails;
    }
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "init: %s", moea2a_last_error(NULL));
    if (res) return fails;
    RANK_EXPECT(fails, rank, moea2a_comm_node(comm, &node, &nodes, &local, &lsize) == MOEA2A_SUCCESS, "comm_node");
    const int per = size ? size : n; /* nodes of `per` consecutive ranks */
    const int w_node = rank / per, w_nodes = (n + per - 1) / per, w_local = rank % per;
    const int w_size = (w_node + 1) * per <= n ? per : n - w_node * per;
    RANK_EXPECT(fails, rank, node == w_node && nodes == w_nodes && local == w_local && lsize == w_size,
                "NODE_SIZE %d: node %d of %d, local %d of %d; expected %d of %d, %d of %d", size, node, nodes, local,
                lsize, w_node, w_nodes, w_local, w_size);
    RANK_EXPECT(fails, rank, moea2a_comm_node(comm, NULL, NULL, NULL, NULL) == MOEA2A_SUCCESS &&
                                 moea2a_comm_node(NULL, &node, NULL, NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "comm_node: NULL outputs allowed, NULL comm refused");
    moea2a_comm_destroy(comm);
    return fails;
}

static void test_node_map(void)
{
    static const int sizes[] = {0, 1, 2, 3, 5, 102, 9}; /* 102: 2, but 3 on the last rank; 9 > 5 ranks */
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        local_ranks_result_t res;
        int size = sizes[i];
        local_ranks_run(5, node_map_rank, &size, WATCHDOG, &res);
        tap_ok(res.failed == 0 && res.hung == 0, "node map on 5 ranks with MOEA2A_NODE_SIZE=%d%s",
               size >= 100 ? size - 100 : size, size >= 100 ? " (3 on the last rank)" : "");
    }
}

/* Rank r of the group passes nranks + r: every rank after the first disagrees. */
static int mismatch_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    moea2a_comm_t comm;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n + rank, id, rank, NULL);
    if (res == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);
    if (res != MOEA2A_ERR_MISMATCH) printf("# rank %d: got %s: %s\n", rank, moea2a_strerror(res), moea2a_last_error(NULL));
    return res == MOEA2A_ERR_MISMATCH ? 0 : 1;
}

static int transport_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const char *spec = arg;
    int fails = 0;
    moea2a_comm_t comm;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.transport = spec;
    cfg.timeout_s = 5;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, &cfg);
    RANK_EXPECT(fails, rank, res == MOEA2A_ERR_UNAVAILABLE, "transport '%s': got %s", spec, moea2a_strerror(res));
    if (!strcmp(spec, "nosuch"))
        RANK_EXPECT(fails, rank, strstr(moea2a_last_error(NULL), "ucx") && strstr(moea2a_last_error(NULL), "'nosuch'"),
                    "message names the missing and the available transports: %s", moea2a_last_error(NULL));
    if (res == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);
    return fails;
}

static void test_bad_arguments(void)
{
    moea2a_unique_id_t id, zero;
    moea2a_comm_t comm = (moea2a_comm_t)0x1;
    memset(&zero, 0, sizeof(zero));
    tap_ok(moea2a_get_unique_id(NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "get_unique_id(NULL)");
    tap_ok(moea2a_get_unique_id(&id) == MOEA2A_SUCCESS, "get_unique_id");
    tap_ok(moea2a_comm_init_rank(NULL, 1, id, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_rank: NULL comm");
    tap_ok(moea2a_comm_init_rank(&comm, 0, id, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT && comm == NULL,
           "init_rank: nranks 0 (and *comm set to NULL)");
    tap_ok(moea2a_comm_init_rank(&comm, 2, id, -1, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_rank: rank -1");
    tap_ok(moea2a_comm_init_rank(&comm, 2, id, 2, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "rank=2"),
           "init_rank: rank == nranks, message names it");
    tap_ok(moea2a_comm_init_rank(&comm, 1, zero, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_rank: zeroed (foreign) id");
    moea2a_unique_id_t junk;
    for (size_t i = 0; i < sizeof(junk.internal); i++) junk.internal[i] = (char)(i * 37 + 11);
    tap_ok(moea2a_comm_init_rank(&comm, 1, junk, 0, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_rank: random (foreign) id");
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.size = 3;
    tap_ok(moea2a_comm_init_rank(&comm, 1, id, 0, &cfg) == MOEA2A_ERR_INVALID_ARGUMENT, "init_rank: config without size");
    int x;
    tap_ok(moea2a_comm_rank(NULL, &x) == MOEA2A_ERR_INVALID_ARGUMENT && moea2a_comm_size(NULL, &x) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_comm_destroy(NULL) == MOEA2A_ERR_INVALID_ARGUMENT && moea2a_comm_abort(NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_barrier(NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "NULL communicator is rejected by every call");
    tap_ok(moea2a_test(NULL, &x) == MOEA2A_ERR_INVALID_ARGUMENT && moea2a_wait(NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "NULL request is rejected");
    tap_ok(moea2a_comm_init_env(NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_env: NULL comm");
}

static void test_init_sizes(void)
{
    static const int sizes[] = {1, 2, 3, 4, 8};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        local_ranks_result_t res;
        local_ranks_run(sizes[i], init_destroy_rank, NULL, WATCHDOG, &res);
        tap_ok(res.failed == 0, "init, rank/size, barrier, destroy on %d ranks", sizes[i]);
    }
}

static void test_mismatched_nranks(void)
{
    local_ranks_result_t res;
    local_ranks_run(3, mismatch_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "ranks passing different nranks all get MOEA2A_ERR_MISMATCH");
}

/* Runs in this process: must come after every test that forks ranks, since a
 * process whose transports were initialized must not fork new ranks (moea2a(7)). */
static void test_stray_and_stale(void)
{
    /* A stray connection to the rendezvous (wrong magic) is rejected; the real ranks
     * still meet. The harness makes its own id, so poke a fresh id's service first and
     * check that it still serves a rank afterwards. */
    moea2a_unique_id_t id;
    moea2a_get_unique_id(&id);
    m2a_id_t raw;
    memcpy(&raw, id.internal, sizeof(raw));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int connected = connect(fd, (struct sockaddr *)&raw.root, sizeof(raw.root)) == 0;
    char junk[256];
    memset(junk, 'x', sizeof(junk));
    if (connected) connected = write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk);
    close(fd);
    moea2a_comm_t comm;
    moea2a_result_t r = moea2a_comm_init_rank(&comm, 1, id, 0, NULL);
    tap_ok(connected && r == MOEA2A_SUCCESS, "a stray connection is rejected and the rendezvous goes on (%s)",
           moea2a_strerror(r));
    if (r == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);

    /* The same id again: its service has ended, so the id is stale. */
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = 1.0;
    r = moea2a_comm_init_rank(&comm, 1, id, 0, &cfg);
    tap_ok(r == MOEA2A_ERR_TIMEOUT && strstr(moea2a_last_error(NULL), "stale"),
           "a stale id fails within the timeout with a message that says so (%s)", moea2a_strerror(r));
}

static void test_transport_selection(void)
{
    local_ranks_result_t res;
    local_ranks_run(2, transport_rank, "nosuch", WATCHDOG, &res);
    tap_ok(res.failed == 0, "an unavailable transport is MOEA2A_ERR_UNAVAILABLE naming the available ones");
    local_ranks_run(2, transport_rank, "^ucx", WATCHDOG, &res);
    tap_ok(res.failed == 0, "excluding every transport (^ucx) is MOEA2A_ERR_UNAVAILABLE");
}

static int env_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    char buf[16];
    int fails = 0;
    snprintf(buf, sizeof(buf), "%d", rank);
    setenv("MOEA2A_RANK", buf, 1);
    snprintf(buf, sizeof(buf), "%d", n);
    setenv("MOEA2A_NRANKS", buf, 1);
    setenv("MOEA2A_ROOT_ADDR", (const char *)arg, 1);
    moea2a_comm_t comm;
    moea2a_result_t r = moea2a_comm_init_env(&comm, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "init_env: %s", moea2a_last_error(NULL));
    if (r) return fails;
    int mine = rank * 10, all[8] = {0};
    r = moea2a_allgather(&mine, all, 1, MOEA2A_INT32, comm, NULL);
    RANK_EXPECT(fails, rank, r == MOEA2A_SUCCESS, "allgather: %s", moea2a_last_error(comm));
    for (int i = 0; i < n; i++) RANK_EXPECT(fails, rank, all[i] == i * 10, "all[%d] = %d", i, all[i]);
    moea2a_comm_destroy(comm);
    return fails;
}

/* One init_env run where something is wrong on some ranks: every rank must fail with
 * want, its message holding says, within within_s (the timeout is 30 s). */
typedef struct {
    const char *root;
    int nranks_of[4]; /* MOEA2A_NRANKS per rank (0: the real one) */
    int rank_of[4];   /* MOEA2A_RANK per rank (-1: the real one) */
    moea2a_result_t want;
    const char *says;
    double within_s;
    double timeout_s; /* 0: 30 s */
    volatile int verdicts; /* ranks that have their result (the case lives in shared memory) */
} env_case_t;

static int env_case_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)id;
    const env_case_t *c = arg;
    char buf[16];
    int fails = 0;
    snprintf(buf, sizeof(buf), "%d", c->rank_of[rank] >= 0 ? c->rank_of[rank] : rank);
    setenv("MOEA2A_RANK", buf, 1);
    snprintf(buf, sizeof(buf), "%d", c->nranks_of[rank] ? c->nranks_of[rank] : n);
    setenv("MOEA2A_NRANKS", buf, 1);
    setenv("MOEA2A_ROOT_ADDR", c->root, 1);
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.timeout_s = c->timeout_s > 0 ? c->timeout_s : 30.0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    moea2a_comm_t comm = NULL;
    moea2a_result_t r = moea2a_comm_init_env(&comm, &cfg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    RANK_EXPECT(fails, rank, r == c->want && strstr(r ? moea2a_last_error(NULL) : "", c->says) && took < c->within_s,
                "init_env: %s after %.2f s: %s (want %s saying '%s' within %.0f s)", moea2a_strerror(r), took,
                r ? moea2a_last_error(NULL) : "", moea2a_strerror(c->want), c->says, c->within_s);
    if (r == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);
    /* stay until every rank has its result: rank 0's process serves the rendezvous,
     * and a rank that starts late must still find it (as in a job whose ranks are not
     * killed the moment one fails) */
    env_case_t *shared = (env_case_t *)arg;
    __sync_fetch_and_add(&shared->verdicts, 1);
    for (int i = 0; i < 2000 && shared->verdicts < n; i++) usleep(5000);
    return fails;
}

/* Runs case c on n forked ranks (in memory they share); 1 when every rank passed. */
static int run_env_case(int n, env_case_t c)
{
    env_case_t *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) return 0;
    *s = c;
    local_ranks_result_t res;
    local_ranks_run(n, env_case_rank, s, WATCHDOG, &res);
    munmap(s, sizeof(*s));
    return res.failed == 0;
}

static int ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

static void test_init_env(void)
{
    /* A port that is free now, below the ephemeral range (see is_self_connected in
     * lib/wireup/socket.c for what happens otherwise; the library copes with both). */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (unsigned p = 21000 + (unsigned)getpid() % 9000;; p = p >= 31999 ? 21000 : p + 1) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        a.sin_port = htons((uint16_t)p);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok) break;
    }
    char root[64];
    snprintf(root, sizeof(root), "127.0.0.1:%u", ntohs(a.sin_port));
    local_ranks_result_t res;
    local_ranks_run(3, env_rank, root, WATCHDOG, &res);
    tap_ok(res.failed == 0, "moea2a_comm_init_env with MOEA2A_RANK/NRANKS/ROOT_ADDR on 3 ranks");
    if (ipv6_loopback()) {
        char root6[64];
        snprintf(root6, sizeof(root6), "[::1]:%u", ntohs(a.sin_port));
        local_ranks_run(2, env_rank, root6, WATCHDOG, &res);
        tap_ok(res.failed == 0, "moea2a_comm_init_env with an IPv6 MOEA2A_ROOT_ADDR (%s) on 2 ranks", root6);
    } else {
        tap_skip("no IPv6 loopback", "moea2a_comm_init_env with an IPv6 MOEA2A_ROOT_ADDR");
    }
    env_case_t nr = {root, {0, 4, 0}, {-1, -1, -1}, MOEA2A_ERR_MISMATCH, "nranks=", 5.0};
    tap_ok(run_env_case(3, nr), "init_env: a rank whose MOEA2A_NRANKS differs: MOEA2A_ERR_MISMATCH naming it on every rank "
                            "at once");
    env_case_t twice = {root, {0, 0}, {-1, 0}, MOEA2A_ERR_MISMATCH, "as rank 0", 5.0};
    tap_ok(run_env_case(2, twice), "init_env: two processes with MOEA2A_RANK=0: MOEA2A_ERR_MISMATCH on both at once");
    env_case_t alone = {root, {2}, {1}, MOEA2A_ERR_TIMEOUT, "is rank 0 running", 6.0, 2.0};
    tap_ok(run_env_case(1, alone), "init_env: a rank whose root never listens fails at its timeout, asking whether rank 0 "
                            "runs at MOEA2A_ROOT_ADDR");
    env_case_t nohost = {"nohost.invalid:1234", {0}, {-1}, MOEA2A_ERR_INVALID_ARGUMENT, "does not resolve", 5.0};
    tap_ok(run_env_case(1, nohost), "init_env: a MOEA2A_ROOT_ADDR host that does not resolve is named as such");
    env_case_t nobrackets = {"::1:1234", {0}, {-1}, MOEA2A_ERR_INVALID_ARGUMENT, "brackets", 5.0};
    tap_ok(run_env_case(1, nobrackets), "init_env: an IPv6 MOEA2A_ROOT_ADDR without brackets says how to write it");

    moea2a_comm_t comm;
    unsetenv("MOEA2A_RANK");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("PMIX_RANK");
    unsetenv("SLURM_PROCID");
    tap_ok(moea2a_comm_init_env(&comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "MOEA2A_RANK"),
           "init_env without a rank says which variables to set");
    setenv("MOEA2A_RANK", "1", 1);
    setenv("MOEA2A_NRANKS", "2", 1);
    unsetenv("MOEA2A_ROOT_ADDR");
    tap_ok(moea2a_comm_init_env(&comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "MOEA2A_ROOT_ADDR"),
           "init_env without a root address asks for MOEA2A_ROOT_ADDR");
    setenv("MOEA2A_RANK", "5", 1);
    tap_ok(moea2a_comm_init_env(&comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "init_env: rank >= nranks");
    unsetenv("MOEA2A_RANK");
    unsetenv("MOEA2A_NRANKS");
}

static void test_abort(void)
{
    moea2a_unique_id_t id;
    moea2a_comm_t comm;
    moea2a_get_unique_id(&id);
    if (moea2a_comm_init_rank(&comm, 1, id, 0, NULL)) {
        tap_ok(0, "init for the abort test: %s", moea2a_last_error(NULL));
        return;
    }
    tap_ok(moea2a_comm_abort(comm) == MOEA2A_SUCCESS, "abort");
    int v = 1, w;
    tap_ok(moea2a_barrier(comm) == MOEA2A_ERR_ABORTED && moea2a_allgather(&v, &w, 1, MOEA2A_INT32, comm, NULL) == MOEA2A_ERR_ABORTED,
           "calls after abort return MOEA2A_ERR_ABORTED");
    tap_ok(moea2a_comm_destroy(comm) == MOEA2A_SUCCESS, "destroy after abort frees the communicator");
}

/* Rank 0 of a communicator of one: an alltoallv of n ints (each its index plus salt)
 * comes back as sent. */
static int one_rank_exchange(moea2a_comm_t comm, int salt)
{
    int32_t s[4], r[4] = {0};
    const int64_t c[1] = {4}, d[1] = {0};
    for (int i = 0; i < 4; i++) s[i] = i + salt;
    if (moea2a_alltoallv(s, c, d, r, c, d, MOEA2A_INT32, comm, NULL) != MOEA2A_SUCCESS) return 0;
    return !memcmp(s, r, sizeof(s));
}

/* A module of interface version 1 (tests/transport_loop_v1.c) loads beside the version 2
 * ones, serves a communicator, and a shrink sets it up anew: version 1 has no shrink. */
static void test_v1_module(void)
{
    const char *top = getenv("top_builddir"), *old = getenv("MOEA2A_TRANSPORT_PATH");
    char dir[1024], lib[1100], path[4096];
    snprintf(dir, sizeof(dir), "%s/tests/.libs", top ? top : ".");
    snprintf(lib, sizeof(lib), "%s/libmoea2a-loop.so", dir);
    void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    const int *inits = dl ? dlsym(dl, "loop_inits") : NULL;
    if (!inits) {
        tap_ok(0, "the version 1 test module %s loads (%s)", lib, dlerror());
        return;
    }
    char *saved = old ? strdup(old) : NULL;
    snprintf(path, sizeof(path), "%s%s%s", dir, old ? ":" : "", old ? old : "");
    setenv("MOEA2A_TRANSPORT_PATH", path, 1);
    moea2a_transport_info_t infos[16];
    int n = 0, v1 = 0, v2 = 0;
    moea2a_get_transports(infos, 16, &n);
    for (int i = 0; i < n && i < 16; i++) {
        v1 |= !strcmp(infos[i].name, "loop") && infos[i].loadable && infos[i].abi_version == 1;
        v2 |= !strcmp(infos[i].name, "ucx") && infos[i].loadable && infos[i].abi_version == 2;
    }
    tap_ok(v1 && v2, "moea2a_get_transports lists the version 1 module loadable at ABI 1 and ucx at ABI 2");

    moea2a_unique_id_t id;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    cfg.transport = "loop";
    moea2a_comm_t comm = NULL, nc = NULL;
    const int before = *inits;
    int ok = moea2a_get_unique_id(&id) == MOEA2A_SUCCESS && moea2a_comm_init_rank(&comm, 1, id, 0, &cfg) == MOEA2A_SUCCESS;
    ok = ok && one_rank_exchange(comm, 7);
    ok = ok && moea2a_comm_shrink(comm, NULL, 0, &nc) == MOEA2A_SUCCESS && one_rank_exchange(nc, 11);
    tap_ok(ok && *inits == before + 2, "a version 1 module serves a communicator and its shrink, set up anew for it "
           "(%d setups; %s)", *inits - before, moea2a_last_error(comm));
    if (nc) moea2a_comm_destroy(nc);
    if (comm) moea2a_comm_destroy(comm);
    if (saved) setenv("MOEA2A_TRANSPORT_PATH", saved, 1);
    else unsetenv("MOEA2A_TRANSPORT_PATH");
    free(saved);
    dlclose(dl);
}

int main(void)
{
    test_init_sizes();
    test_node_map();
    test_mismatched_nranks();
    test_transport_selection();
    test_init_env();
    /* What starts threads in this process last: an id's rendezvous thread, in-process
     * communicators (see test_stray_and_stale). Nothing forks after them. */
    test_bad_arguments();
    test_stray_and_stale();
    test_abort();
    test_v1_module();
    return tap_done();
}

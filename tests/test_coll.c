/* Generic collectives across 1, 2, 3, 4 and 8 processes on host memory: alltoallv
 * with random counts (zeros included) in several datatypes, allgather, bcast from
 * every root, barrier, the non-blocking forms in flight together, and bad input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define WATCHDOG 120.0

/* Element counts every rank can compute for every (src, dst) pair: about a quarter
 * are zero, the rest up to 300. */
static int64_t pair_count(unsigned seed, int src, int dst)
{
    unsigned h = seed * 2654435761u ^ (unsigned)(src * 40503 + dst * 9973);
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    return (h & 3) == 0 ? 0 : (int64_t)(h % 301);
}

/* The byte at index i of the message from src to dst. */
static unsigned char value(int src, int dst, size_t i)
{
    return (unsigned char)(src * 53 + dst * 17 + i * 3 + (i >> 7));
}

static int check_alltoallv(moea2a_comm_t comm, int rank, int n, unsigned seed, moea2a_datatype_t dt)
{
    int fails = 0;
    size_t es;
    moea2a_datatype_size(dt, &es);
    int64_t sc[8], sd[8], rc[8], rd[8], stot = 0, rtot = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = pair_count(seed, rank, p), rc[p] = pair_count(seed, p, rank);
        /* Gaps between blocks: displacements are honoured, not assumed contiguous. */
        sd[p] = stot, rd[p] = rtot + p;
        stot += sc[p], rtot += rc[p] + p;
    }
    unsigned char *s = malloc((size_t)(stot + 1) * es), *r = malloc((size_t)(rtot + 1) * es);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < (size_t)sc[p] * es; i++) s[(size_t)sd[p] * es + i] = value(rank, p, i);
    memset(r, 0xEE, (size_t)(rtot + 1) * es);
    moea2a_result_t res = moea2a_alltoallv(s, sc, sd, r, rc, rd, dt, comm, NULL);
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "alltoallv: %s", moea2a_last_error(comm));
    for (int p = 0; p < n && !res; p++) {
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)rc[p] * es; i++) bad += r[(size_t)rd[p] * es + i] != value(p, rank, i);
        /* The gap before each block must be untouched. */
        for (size_t i = 0; p > 0 && i < es; i++) bad += r[(size_t)(rd[p] - 1) * es + i] != 0xEE;
        RANK_EXPECT(fails, rank, bad == 0, "alltoallv %s from rank %d: %zu wrong bytes", moea2a_datatype_name(dt), p, bad);
    }
    free(s);
    free(r);
    return fails;
}

static int check_allgather_bcast(moea2a_comm_t comm, int rank, int n)
{
    int fails = 0;
    static const size_t counts[] = {0, 1, 7, 4096, 100000};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t cnt = counts[c];
        int32_t *s = malloc((cnt + 1) * 4), *r = malloc((cnt * (size_t)n + 1) * 4);
        for (size_t i = 0; i < cnt; i++) s[i] = (int32_t)(rank * 1000003 + (int)i);
        moea2a_result_t res = moea2a_allgather(s, r, cnt, MOEA2A_INT32, comm, NULL);
        RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "allgather(%zu): %s", cnt, moea2a_last_error(comm));
        size_t bad = 0;
        for (int p = 0; p < n && !res; p++)
            for (size_t i = 0; i < cnt; i++) bad += r[(size_t)p * cnt + i] != (int32_t)(p * 1000003 + (int)i);
        RANK_EXPECT(fails, rank, bad == 0, "allgather(%zu): %zu wrong", cnt, bad);
        for (int root = 0; root < n; root++) {
            for (size_t i = 0; i < cnt; i++) s[i] = rank == root ? (int32_t)(root * 7919 + (int)i) : -1;
            res = moea2a_bcast(s, cnt, MOEA2A_INT32, root, comm, NULL);
            RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "bcast(%zu, root %d): %s", cnt, root, moea2a_last_error(comm));
            bad = 0;
            for (size_t i = 0; i < cnt; i++) bad += s[i] != (int32_t)(root * 7919 + (int)i);
            RANK_EXPECT(fails, rank, bad == 0, "bcast(%zu, root %d): %zu wrong", cnt, root, bad);
        }
        free(s);
        free(r);
    }
    return fails;
}

/* Three operations in flight at once, completed by test() polling and wait(). */
static int check_nonblocking(moea2a_comm_t comm, int rank, int n)
{
    int fails = 0;
    int64_t sc[8], sd[8], rc[8], rd[8];
    int32_t s[8 * 5], r[8 * 5], g[8], b = rank == 0 ? 4242 : 0, mine = rank + 100;
    for (int p = 0; p < n; p++) {
        sc[p] = rc[p] = 5, sd[p] = rd[p] = 5 * p;
        for (int i = 0; i < 5; i++) s[5 * p + i] = rank * 100 + p * 10 + i;
    }
    moea2a_request_t req[4];
    moea2a_result_t res = moea2a_ialltoallv(s, sc, sd, r, rc, rd, MOEA2A_INT32, comm, NULL, &req[0]);
    res |= moea2a_iallgather(&mine, g, 1, MOEA2A_INT32, comm, NULL, &req[1]);
    res |= moea2a_ibcast(&b, 1, MOEA2A_INT32, 0, comm, NULL, &req[2]);
    res |= moea2a_ibarrier(comm, &req[3]);
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "starting non-blocking ops: %s", moea2a_last_error(comm));
    if (res) return fails;
    int left = 3;
    while (left > 0) {
        for (int i = 0; i < 3; i++) {
            int done = 0;
            if (!req[i]) continue;
            res = moea2a_test(&req[i], &done);
            RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "test: %s", moea2a_last_error(comm));
            if (res) return fails;
            if (done) {
                left--;
                RANK_EXPECT(fails, rank, req[i] == NULL, "finished request not set to NULL");
            }
        }
    }
    RANK_EXPECT(fails, rank, moea2a_wait(&req[3]) == MOEA2A_SUCCESS && req[3] == NULL, "wait(ibarrier)");
    for (int p = 0; p < n; p++) {
        RANK_EXPECT(fails, rank, g[p] == p + 100, "iallgather[%d] = %d", p, g[p]);
        for (int i = 0; i < 5; i++)
            RANK_EXPECT(fails, rank, r[5 * p + i] == p * 100 + rank * 10 + i, "ialltoallv from %d [%d] = %d", p, i, r[5 * p + i]);
    }
    RANK_EXPECT(fails, rank, b == 4242, "ibcast = %d", b);
    return fails;
}

static int check_bad_input(moea2a_comm_t comm, int rank, int n)
{
    int fails = 0;
    int64_t c[8] = {0}, d[8] = {0};
    int32_t x[8] = {0};
    moea2a_request_t req = (moea2a_request_t)0x1;
    RANK_EXPECT(fails, rank, moea2a_alltoallv(x, NULL, d, x, c, d, MOEA2A_INT32, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "NULL sendcounts");
    c[n - 1] = -3;
    RANK_EXPECT(fails, rank, moea2a_alltoallv(x, c, d, x, c, d, MOEA2A_INT32, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
                    strstr(moea2a_last_error(comm), "negative"),
                "negative count: %s", moea2a_last_error(comm));
    c[n - 1] = 1;
    RANK_EXPECT(fails, rank, moea2a_alltoallv(NULL, c, d, x, c, d, MOEA2A_INT32, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "NULL sendbuf with counts");
    RANK_EXPECT(fails, rank, moea2a_allgather(x, x, 1, (moea2a_datatype_t)77, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "unknown datatype");
    RANK_EXPECT(fails, rank, moea2a_bcast(x, 1, MOEA2A_INT32, n, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
                    moea2a_bcast(x, 1, MOEA2A_INT32, -1, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "bcast root out of range");
    RANK_EXPECT(fails, rank, moea2a_ibarrier(comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "NULL request pointer");
    RANK_EXPECT(fails, rank, moea2a_iallgather(NULL, x, 1, MOEA2A_INT32, comm, NULL, &req) == MOEA2A_ERR_INVALID_ARGUMENT &&
                    req == NULL,
                "failed start leaves a NULL request");
    /* Ranges no process can address: refused before any copy or transport reads them
     * (a count of INT64_MAX bytes to itself once reached the transport) */
    int64_t sc[8] = {0}, rc[8] = {0};
    static const int64_t huge[3] = {INT64_MAX, (int64_t)1 << 56, ((int64_t)1 << 56) - 4};
    for (int i = 0; i < 3; i++) {
        sc[rank] = rc[rank] = huge[i];
        moea2a_result_t r = moea2a_alltoallv(x, sc, d, x, rc, d, MOEA2A_INT8, comm, NULL);
        RANK_EXPECT(fails, rank, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "highest address"),
                    "a block of %lld bytes to itself: %s: %s", (long long)huge[i], moea2a_strerror(r),
                    moea2a_last_error(comm));
    }
    sc[rank] = 2, rc[rank] = 3;
    RANK_EXPECT(fails, rank, moea2a_alltoallv(x, sc, d, x, rc, d, MOEA2A_INT32, comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT &&
                    strstr(moea2a_last_error(comm), "sends itself"),
                "a rank that sends itself 2 elements and expects 3: %s", moea2a_last_error(comm));
    /* its own block overlapping the receive block: copied as memmove copies */
    int32_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t sd[8] = {0}, rd[8] = {0};
    sc[rank] = rc[rank] = 6, rd[rank] = 2;
    RANK_EXPECT(fails, rank, moea2a_alltoallv(v, sc, sd, v, rc, rd, MOEA2A_INT32, comm, NULL) == MOEA2A_SUCCESS &&
                    v[0] == 1 && v[1] == 2 && v[2] == 1 && v[7] == 6,
                "an overlapping block to itself: %s", moea2a_last_error(comm));
    /* Rejected calls must not have consumed a collective: the next one still matches. */
    RANK_EXPECT(fails, rank, moea2a_barrier(comm) == MOEA2A_SUCCESS, "barrier after rejected calls: %s", moea2a_last_error(comm));
    return fails;
}

static int coll_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    moea2a_comm_t comm;
    int fails = 0;
    moea2a_result_t res = moea2a_comm_init_rank(&comm, n, id, rank, NULL);
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "init: %s", moea2a_last_error(NULL));
    if (res) return 1;
    static const moea2a_datatype_t types[] = {MOEA2A_UINT8, MOEA2A_BFLOAT16, MOEA2A_INT32, MOEA2A_INT64};
    for (unsigned seed = 1; seed <= 6; seed++) fails += check_alltoallv(comm, rank, n, seed, types[seed % 4]);
    fails += check_allgather_bcast(comm, rank, n);
    fails += check_nonblocking(comm, rank, n);
    fails += check_bad_input(comm, rank, n);
    RANK_EXPECT(fails, rank, moea2a_comm_destroy(comm) == MOEA2A_SUCCESS, "destroy: %s", moea2a_last_error(NULL));
    return fails > 100 ? 100 : fails;
}

/* Rank 0 expects one element fewer from rank 1 than rank 1 sends. */
static int mismatch_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    moea2a_comm_t comm;
    int fails = 0;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    int64_t sc[2] = {4, 4}, d[2] = {0, 4}, rc[2] = {4, rank == 0 ? 3 : 4};
    int32_t s[8] = {0}, r[8];
    moea2a_result_t res = moea2a_alltoallv(s, sc, d, r, rc, d, MOEA2A_INT32, comm, NULL);
    if (rank == 0)
        RANK_EXPECT(fails, rank, res == MOEA2A_ERR_MISMATCH && strstr(moea2a_last_error(comm), "rank 1"),
                    "receiver of too much data: %s: %s", moea2a_strerror(res), moea2a_last_error(comm));
    moea2a_comm_destroy(comm);
    return fails;
}

/* moea2a_comm_traffic: 5 ranks in emulated nodes of 2 (MOEA2A_NODE_SIZE): rank r sends
 * 8 (r + q + 1) int32 to each q; the counter splits what went to the rank's own node from
 * what went to others, the block to itself not counted, and refuses a size too small. */
static int traffic_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    moea2a_comm_t comm;
    int fails = 0;
    setenv("MOEA2A_NODE_SIZE", "2", 1);
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    int64_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0, same = 0, other = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = 8 * (rank + q + 1), rc[q] = 8 * (q + rank + 1), sd[q] = so, rd[q] = ro, so += sc[q], ro += rc[q];
        if (q != rank) *(q / 2 == rank / 2 ? &same : &other) += 4 * sc[q];
    }
    int32_t *s = calloc((size_t)so, 4), *r = calloc((size_t)ro, 4);
    moea2a_comm_traffic_t before = MOEA2A_COMM_TRAFFIC_INITIALIZER, after = before, small = before;
    moea2a_result_t res = moea2a_comm_traffic(comm, &before);
    if (!res) res = moea2a_alltoallv(s, sc, sd, r, rc, rd, MOEA2A_INT32, comm, NULL);
    if (!res) res = moea2a_comm_traffic(comm, &after);
    RANK_EXPECT(fails, rank, res == MOEA2A_SUCCESS, "%s", moea2a_last_error(comm));
    RANK_EXPECT(fails, rank, after.host_same_node - before.host_same_node == same &&
                                 after.host_other_nodes - before.host_other_nodes == other &&
                                 after.cuda_same_node == 0 && after.cuda_other_nodes == 0,
                "traffic: same node %lld, other nodes %lld, expected %lld and %lld",
                (long long)(after.host_same_node - before.host_same_node),
                (long long)(after.host_other_nodes - before.host_other_nodes), (long long)same, (long long)other);
    small.size = 4;
    RANK_EXPECT(fails, rank, moea2a_comm_traffic(comm, &small) == MOEA2A_ERR_INVALID_ARGUMENT &&
                                 moea2a_comm_traffic(comm, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
                "a size below the initializer's and NULL are refused");
    free(s), free(r);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    static const int sizes[] = {1, 2, 3, 4, 8};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        local_ranks_result_t res;
        local_ranks_run(sizes[i], coll_rank, NULL, WATCHDOG, &res);
        tap_ok(res.failed == 0, "alltoallv (4 dtypes, random counts), allgather, bcast from every root, "
                                "non-blocking, bad input on %d ranks", sizes[i]);
    }
    local_ranks_result_t res;
    local_ranks_run(2, mismatch_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "a receive count smaller than what the peer sends is MOEA2A_ERR_MISMATCH naming the peer");
    local_ranks_run(5, traffic_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "moea2a_comm_traffic on 5 ranks in nodes of 2: the bytes handed for this node and for "
                            "others, the rank's own block not counted; a short size and NULL refused");
    return tap_done();
}

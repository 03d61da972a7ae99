/* One rank of tests/test_netns.sh, run inside its own network namespace and UTS
 * hostname ("a host"): moea2a_comm_init_env (rank, size, root address and key from
 * the environment), then MoE dispatch + combine on host memory, each round trip
 * checked against the reference of tests/moe_roundtrip.h.
 *   netns_rank ITERS     ITERS checked round trips; exit 0 when all were exact
 *   netns_rank survive   round trips until one fails (another host is killed): prints
 *                        the error and the seconds since the last success; exit 0 when
 *                        it is PEER_FAILED or TIMEOUT within MOEA2A_TIMEOUT_S + 1 s
 *   netns_rank recover V the same, then the recovery flow without host V (cut off, so
 *                        the others learn of it by the timeout, not the peer watcher):
 *                        abort, shrink excluding V, retarget to the contiguous placement
 *                        over the rest, and 50 checked round trips there */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "moe_roundtrip.h"
#include "moea2a.h"

int main(int argc, char **argv)
{
    const int recover = argc > 2 && !strcmp(argv[1], "recover"), victim = recover ? atoi(argv[2]) : -1;
    int survive = argc > 1 && (!strcmp(argv[1], "survive") || recover);
    long iters = argc > 1 && !survive ? atol(argv[1]) : 100;
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    moea2a_comm_t comm;
    if (moea2a_comm_init_env(&comm, NULL)) {
        printf("%s: init: %s\n", host, moea2a_last_error(NULL));
        return 1;
    }
    int rank, n, node = -1, nodes = -1, local = -1, lsize = -1;
    moea2a_comm_rank(comm, &rank);
    moea2a_comm_size(comm, &n);
    moea2a_comm_node(comm, &node, &nodes, &local, &lsize);
    /* every rank on a host of its own: a node each, numbered by rank */
    const int map_ok = node == rank && nodes == n && local == 0 && lsize == 1;
    static rt_state_t st;
    st.ep = n;
    st.seed = 0x5851f42d4c957f2dULL * (uint64_t)(rank + 1);
    moea2a_moe_config_t mc = rt_config();
    if (moea2a_moe_create(&st.moe, comm, &mc)) {
        printf("%s: create: %s\n", host, moea2a_last_error(comm));
        return 1;
    }
    long mismatches = 0, it = 0;
    moea2a_result_t r = MOEA2A_SUCCESS;
    double last_ok = now();
    for (; r == MOEA2A_SUCCESS && (survive || it < iters); it++) {
        r = rt_step(&st, it, &mismatches);
        if (r == MOEA2A_SUCCESS) last_ok = now();
        if (survive && it == 50) printf("%s: rank %d looping\n", host, rank), fflush(stdout);
    }
    double detect = now() - last_ok;
    const char *timeout = getenv("MOEA2A_TIMEOUT_S");
    double bound = (timeout ? atof(timeout) : 300.0) + 1.0;
    int ok = map_ok && (survive ? (r == MOEA2A_ERR_PEER_FAILED || r == MOEA2A_ERR_TIMEOUT) && detect <= bound
                                : r == MOEA2A_SUCCESS && mismatches == 0);
    printf("%s: rank %d of %d (node %d of %d%s): %ld round trips, %ld mismatching values, %s%s%s after %.2f s\n", host,
           rank, n, node, nodes, map_ok ? "" : ", WRONG node map", it, mismatches, moea2a_strerror(r), r ? ": " : "",
           r ? moea2a_last_error(comm) : "", detect);
    if (recover && ok) {
        const double t0 = now();
        moea2a_comm_t small = NULL;
        moea2a_comm_abort(comm);
        r = moea2a_comm_shrink(comm, &victim, 1, &small);
        int32_t map[RT_E];
        for (int e = 0; e < RT_E; e++) map[e] = rt_owner(e, n - 1);
        if (r == MOEA2A_SUCCESS) r = moea2a_moe_retarget(st.moe, small, map);
        const double back = now() - t0;
        st.ep = n - 1, mismatches = 0;
        long done = 0;
        for (; r == MOEA2A_SUCCESS && done < 50; done++) r = rt_step(&st, 1000 + done, &mismatches);
        int me = -1;
        if (small) moea2a_comm_rank(small, &me);
        ok = r == MOEA2A_SUCCESS && mismatches == 0 && me == rank - (rank > victim);
        printf("%s: without rank %d: rank %d of %d, shrink + retarget %.3f s, %ld round trips, %ld mismatching "
               "values, %s%s%s\n", host, victim, me, n - 1, back, done, mismatches, moea2a_strerror(r),
               r ? ": " : "", r ? moea2a_last_error(small ? small : comm) : "");
        if (small) moea2a_comm_destroy(small);
    }
    moea2a_moe_destroy(st.moe);
    moea2a_comm_destroy(comm);
    return ok ? 0 : 1;
}

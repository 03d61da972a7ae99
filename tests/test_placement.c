/* moea2a_moe_set_placement on host memory: a context whose experts move every few
 * round trips gives, after each move, exactly what a context freshly created with that
 * map gives (receive counts, ids, source indexes, payload rows, combine output, and in
 * the expert-major layout its per-expert counts), and its combine output equals an
 * oracle that knows the map; the refusals (a rank over the bound, ranks that disagree,
 * a rank that is not one, a dispatch pending; for replicas a rank twice, a holder after
 * -1, max_replicas 0, over the bound) leave the old placement in force on every rank.
 * Some moves mark a rank inactive (its experts -1: held by no rank): entries naming
 * them are dropped, counted in dropped_entries apart from the invalid ids, and the
 * combine equals the oracle without them. Others place replicas
 * (moea2a_moe_set_replicas): the oracle sends token t of rank s to holder (s + t) mod
 * n of each expert it names. Every round, moea2a_moe_expert_load equals the oracle's
 * count of the entries each rank took. The time of a change (256 experts, 4 ranks) is
 * printed, not asserted. (No GPU takes part here: test_gpu checks a CUDA context's
 * moea2a_moe_set_placement against a host context's.) */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define WATCHDOG 300.0
enum { EP = 4, E = 32, K = 4, CAP = 24, H = 16, BOUND = 12, ROUNDS = 24 };

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31, x *= 0x7fb5d329728ea185ull, x ^= x >> 27, x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* The same random map on every rank for a round: at most BOUND experts per rank. */
static void random_map(uint64_t seed, int ep, int E_, int bound, int32_t *map)
{
    int held[64] = {0};
    for (int e = 0; e < E_; e++) {
        int r;
        do r = (int)(mix(seed * 1000003u + (uint64_t)e * 7919u + (uint64_t)held[0] * 31u) % (uint64_t)ep), seed++;
        while (held[r] >= bound);
        map[e] = r, held[r]++;
    }
}

/* Replicas for a round, the same on every rank: each expert 1 to 3 distinct holders
 * (-1 after), expert 5 none; no rank over BOUND. */
static void replicas_for(uint64_t seed, int32_t *hold, int *nrep)
{
    int held[EP] = {0};
    for (int i = 0; i < E * EP; i++) hold[i] = -1;
    for (int e = 0; e < E; e++) {
        const uint64_t x = mix(seed * 7777 + (uint64_t)e);
        const int want = e == 5 ? 0 : 1 + (int)(x % 5 == 0) + (int)(x % 7 == 0);
        nrep[e] = 0;
        for (int j = 0; j < EP && nrep[e] < want; j++) {
            const int q = (int)(((x >> 8) + (uint64_t)j) % EP);
            if (held[q] >= BOUND) continue;
            hold[e * EP + nrep[e]++] = q, held[q]++;
        }
    }
}

static moea2a_moe_config_t config(int expert_major, const int32_t *map)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = E, c.top_k = K, c.max_tokens_per_rank = CAP, c.hidden = H, c.combine_dtype = MOEA2A_FLOAT32;
    c.num_payloads = 1, c.payloads[0] = (moea2a_payload_desc_t){MOEA2A_FLOAT32, H};
    c.memory = MOEA2A_MEMORY_HOST, c.max_local_experts = BOUND;
    if (expert_major) c.layout = MOEA2A_LAYOUT_EXPERT_MAJOR;
    if (map) c.placement = MOEA2A_PLACEMENT_MAP, c.expert_to_rank = map;
    return c;
}

typedef struct {
    int32_t counts[EP], ids[EP * CAP * K], src[EP * CAP];
    float rows[EP * CAP * H], out[CAP * H];
    int32_t ex_counts[E];
    int num_local;
    int64_t invalid, dropped;
} got_t;

/* One round trip of this rank's tokens for round `round`: the receive arrays, and the
 * combine of the received payload rows themselves (rank-major), or of one row per
 * expert row (expert-major); out as it came. */
static moea2a_result_t round_trip(moea2a_moe_t moe, int me, int round, int n, int expert_major, got_t *g)
{
    int32_t ids[CAP * K];
    float x[CAP * H];
    for (int i = 0; i < n * K; i++) {
        uint64_t r = mix((uint64_t)me << 40 ^ (uint64_t)round << 20 ^ (uint64_t)i);
        ids[i] = r % 13 == 0 ? -1 : (int32_t)(r % E);
    }
    for (int i = 0; i < n * H; i++) x[i] = (float)((int)(mix((uint64_t)me * 31 + (uint64_t)i + 977u * (uint64_t)round) % 17) - 8) / 4.0f;
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    const void *p[1] = {x};
    moea2a_result_t r = moea2a_dispatch(moe, n, ids, NULL, p, 0, &res, NULL);
    if (r != MOEA2A_SUCCESS) return r;
    memset(g, 0, sizeof(*g));
    g->invalid = res.invalid_entries, g->dropped = res.dropped_entries;
    memcpy(g->counts, res.recv_counts, sizeof(int32_t) * EP);
    for (int q = 0; q < EP; q++)
        for (int i = 0; i < res.recv_counts[q]; i++) {
            const size_t s = (size_t)q * (size_t)res.stride + (size_t)i, d = (size_t)q * CAP + (size_t)i;
            memcpy(g->ids + d * K, res.topk_ids + s * K, sizeof(int32_t) * K);
            g->src[d] = res.src_token_index[s];
            memcpy(g->rows + d * H, (const float *)res.payloads[0] + s * H, sizeof(float) * H);
        }
    if (expert_major) {
        g->num_local = res.num_local_experts;
        memcpy(g->ex_counts, res.expert_counts, sizeof(int32_t) * (size_t)res.num_local_experts);
        /* each expert row: its token's payload row (the fold sums a token's rows here) */
        float *xr = calloc((size_t)res.expert_rows * H + 1, sizeof(float));
        for (int64_t row = 0; xr && row < res.expert_rows; row++) {
            const int q = res.expert_src_rank[row];
            if (q < 0) continue;
            for (int i = 0; i < res.recv_counts[q]; i++)
                if (res.src_token_index[(size_t)q * (size_t)res.stride + (size_t)i] == res.expert_src_token[row])
                    memcpy(xr + row * H, (const float *)res.payloads[0] + ((size_t)q * (size_t)res.stride + (size_t)i) * H,
                           sizeof(float) * H);
        }
        r = xr ? moea2a_combine(moe, xr, g->out, NULL) : MOEA2A_ERR_NO_MEMORY;
        free(xr);
        return r;
    }
    return moea2a_combine(moe, res.payloads[0], g->out, NULL);
}

/* out[t] = the token's row once per distinct rank its valid ids reach under map (and,
 * expert-major, once per slot naming an expert there: the fold), summed in fp32 in
 * ascending rank order: what both contexts must give. */
/* Where expert e goes for token t of rank s: map[e], or with replicas (hold: [E][EP],
 * nrep[e] of them) holder (s + t) mod nrep[e]; -1 nowhere. */
typedef struct {
    const int32_t *map, *hold;
    const int *nrep;
} place_t;
static int rank_of(const place_t *pl, int e, int s, int t)
{
    if (!pl->hold) return pl->map[e];
    return pl->nrep[e] ? pl->hold[e * EP + (s + t) % pl->nrep[e]] : -1;
}

/* The entries of this rank's round that are invalid (-1) and that name an expert held
 * by no rank. */
static void oracle_entries(int me, int round, int n, const place_t *pl, int64_t *invalid, int64_t *dropped)
{
    *invalid = *dropped = 0;
    for (int i = 0; i < n * K; i++) {
        uint64_t r = mix((uint64_t)me << 40 ^ (uint64_t)round << 20 ^ (uint64_t)i);
        if (r % 13 == 0) ++*invalid;
        else *dropped += rank_of(pl, (int)(r % E), me, i / K) < 0;
    }
}

/* The entries rank me takes in a round, per expert (moea2a_moe_expert_load): every
 * rank's tokens (their ids are the round's formula), each expert once per token, where
 * the placement sends it to me. */
static void oracle_load(int me, int round, const place_t *pl, int64_t *load)
{
    memset(load, 0, sizeof(int64_t) * E);
    for (int s = 0; s < EP; s++)
        for (int t = 0; t < CAP - (s + round) % 7; t++) {
            int32_t ids[K];
            for (int j = 0; j < K; j++) {
                uint64_t r = mix((uint64_t)s << 40 ^ (uint64_t)round << 20 ^ (uint64_t)(t * K + j));
                ids[j] = r % 13 == 0 ? -1 : (int32_t)(r % E);
                int repeat = 0;
                for (int p = 0; p < j; p++) repeat |= ids[p] == ids[j];
                if (ids[j] >= 0 && !repeat && rank_of(pl, ids[j], s, t) == me) load[ids[j]]++;
            }
        }
}

static int oracle_bad(int me, int round, int n, const place_t *pl, int expert_major, const float *out)
{
    for (int t = 0; t < n; t++) {
        int32_t ids[K];
        for (int j = 0; j < K; j++) {
            uint64_t r = mix((uint64_t)me << 40 ^ (uint64_t)round << 20 ^ (uint64_t)(t * K + j));
            ids[j] = r % 13 == 0 ? -1 : (int32_t)(r % E);
        }
        for (int h = 0; h < H; h++) {
            const float v = (float)((int)(mix((uint64_t)me * 31 + (uint64_t)(t * H + h) + 977u * (uint64_t)round) % 17) - 8) / 4.0f;
            float acc = 0.0f;
            for (int q = 0; q < EP; q++) {
                int slots = 0; /* the token's slots naming an expert of q (a repeat adds its row again) */
                for (int j = 0; j < K; j++) slots += ids[j] >= 0 && rank_of(pl, ids[j], me, t) == q;
                float fold = 0.0f;
                for (int i = 0; i < slots; i++) fold += v;
                if (slots) acc += expert_major ? fold : v;
            }
            if (acc != out[t * H + h])
                return printf("# rank %d round %d token %d h %d: %g, the oracle %g\n", me, round, t, h,
                              (double)out[t * H + h], (double)acc), 1;
        }
    }
    return 0;
}

static int placement_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    const int expert_major = *(const int *)arg;
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    moea2a_moe_config_t c = config(expert_major, NULL);
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &c)) return printf("# rank %d: create: %s\n", me, moea2a_last_error(comm)), 1;
    int32_t map[E], hold[E * EP];
    int nrep[E];
    for (int e = 0; e < E; e++) map[e] = e / (E / EP); /* the contiguous placement it starts with */
    place_t pl = {map, NULL, nrep};
    got_t *a = malloc(sizeof(got_t)), *b = malloc(sizeof(got_t));
    for (int round = 0; a && b && round < ROUNDS && !fails; round++) {
        const int n = CAP - (me + round) % 7;
        /* every third move marks a rank inactive: its experts held by no rank; another
         * places replicas */
        const int inactive = round % 9 == 7 ? round / 9 % EP : -1;
        if (round % 3 == 1 && round % 9 == 4) {
            replicas_for((uint64_t)round, hold, nrep);
            moea2a_result_t r = moea2a_moe_set_replicas(moe, EP, hold, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "round %d: set_replicas: %s", round, moea2a_last_error(comm));
            pl.hold = hold;
            for (int e = 0; e < E; e++) map[e] = nrep[e] ? hold[e * EP] : -1;
        } else if (round % 3 == 1) {
            random_map((uint64_t)round, EP, E, BOUND, map);
            for (int e = 0; e < E && inactive >= 0; e++)
                if (map[e] == inactive) map[e] = -1;
            moea2a_result_t r = moea2a_moe_set_placement(moe, map, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "round %d: set_placement: %s", round, moea2a_last_error(comm));
            pl.hold = NULL;
        }
        int unheld = 0;
        for (int e = 0; e < E; e++) unheld += map[e] < 0;
        const int no_fresh = unheld || pl.hold; /* create has no form of either */
        moea2a_moe_t fresh = NULL; /* create takes a rank for every expert: none to compare with then */
        moea2a_moe_config_t fc = config(expert_major, map);
        moea2a_result_t r = no_fresh ? MOEA2A_SUCCESS : moea2a_moe_create(&fresh, comm, &fc);
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS, "round %d: the fresh context: %s", round, moea2a_last_error(comm));
        if (r) break;
        r = round_trip(moe, me, round, n, expert_major, a);
        moea2a_result_t r2 = fresh ? round_trip(fresh, me, round, n, expert_major, b) : MOEA2A_SUCCESS;
        RANK_EXPECT(fails, me, r == MOEA2A_SUCCESS && r2 == MOEA2A_SUCCESS, "round %d: %s", round, moea2a_last_error(comm));
        RANK_EXPECT(fails, me, !r && !r2 && (!fresh || !memcmp(a, b, sizeof(*a))),
                    "round %d: the moved context differs from a fresh one with the same map", round);
        RANK_EXPECT(fails, me, !r && !oracle_bad(me, round, n, &pl, expert_major, a->out),
                    "round %d: the combine differs from the oracle", round);
        int64_t inv, drop, load[E], want[E];
        oracle_load(me, round, &pl, want);
        r = r ? r : moea2a_moe_expert_load(moe, load, 1);
        RANK_EXPECT(fails, me, !r && !memcmp(load, want, sizeof(load)), "round %d: expert load: %s", round,
                    r ? moea2a_last_error(comm) : "differs from the oracle");
        oracle_entries(me, round, n, &pl, &inv, &drop);
        /* a whole rank's experts unheld: some of this rank's entries name them */
        RANK_EXPECT(fails, me, !r && a->invalid == inv && a->dropped == drop && (unheld < E / EP || drop > 0),
                    "round %d (%d experts held by no rank): invalid %lld dropped %lld, the oracle %lld %lld", round,
                    unheld, (long long)a->invalid, (long long)a->dropped, (long long)inv, (long long)drop);
        if (fresh) moea2a_moe_destroy(fresh);
        /* refusals, on every rank alike, leave this placement in force */
        if (round % 6 == 4) {
            int32_t bad[E];
            memcpy(bad, map, sizeof(bad));
            for (int e = 0; e < BOUND + 1; e++) bad[e] = 0; /* rank 0 over the bound */
            r = moea2a_moe_set_placement(moe, bad, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_CAPACITY && strstr(moea2a_last_error(comm), "rank 0"),
                        "over the bound: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            memcpy(bad, map, sizeof(bad));
            for (int e = 1; me == 1 && e < E; e++) /* two experts trade ranks: no rank over the bound */
                if (bad[e] != bad[0]) {
                    int32_t x = bad[e];
                    bad[e] = bad[0], bad[0] = x;
                    break;
                }
            r = moea2a_moe_set_placement(moe, bad, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_MISMATCH && strstr(moea2a_last_error(comm), "rank"),
                        "rank 1 passes another map: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            memcpy(bad, map, sizeof(bad));
            bad[7] = EP;
            r = moea2a_moe_set_placement(moe, bad, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "expert_to_rank[7]"),
                        "a rank that is not one: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            bad[7] = -2;
            r = moea2a_moe_set_placement(moe, bad, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "nor -1"),
                        "-2: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            RANK_EXPECT(fails, me, moea2a_moe_set_placement(moe, NULL, NULL) == MOEA2A_ERR_INVALID_ARGUMENT, "NULL map");
            int32_t rh[2 * E];
            for (int e = 0; e < E; e++) rh[2 * e] = rh[2 * e + 1] = e % EP; /* a rank twice */
            r = moea2a_moe_set_replicas(moe, 2, rh, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "holders[0][1]"),
                        "replicas: a rank twice: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            r = moea2a_moe_set_replicas(moe, 0, rh, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "max_replicas"),
                        "replicas: max_replicas 0: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            for (int e = 0; e < E; e++) rh[2 * e] = 0, rh[2 * e + 1] = 1; /* ranks 0 and 1 over the bound */
            r = moea2a_moe_set_replicas(moe, 2, rh, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_CAPACITY && strstr(moea2a_last_error(comm), "rank 0"),
                        "replicas over the bound: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
            rh[0] = -1, rh[1] = 2; /* a holder after a -1 */
            for (int e = 1; e < E; e++) rh[2 * e] = e % EP, rh[2 * e + 1] = -1;
            r = moea2a_moe_set_replicas(moe, 2, rh, NULL);
            RANK_EXPECT(fails, me, r == MOEA2A_ERR_INVALID_ARGUMENT && strstr(moea2a_last_error(comm), "after the last"),
                        "replicas: a holder after -1: %s: %s", moea2a_strerror(r), moea2a_last_error(comm));
        }
    }
    if (!expert_major && !fails) { /* a change between a dispatch and its combine */
        int32_t ids[K] = {0, 1, 2, 3};
        float x[H] = {0};
        const void *p[1] = {x};
        moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
        moea2a_result_t r = moea2a_dispatch(moe, 1, ids, NULL, p, 0, &res, NULL);
        moea2a_result_t s = r ? r : moea2a_moe_set_placement(moe, map, NULL);
        RANK_EXPECT(fails, me, s == MOEA2A_ERR_STATE, "a dispatch pending: %s", moea2a_strerror(s));
        float out[H];
        if (!r) moea2a_combine(moe, NULL, out, NULL);
    }
    free(a), free(b);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

/* The time of a change: 256 experts over 4 ranks, 200 changes (every rank's mean). */
static int timing_rank(int me, int ep, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, ep, id, me, NULL)) return 1;
    moea2a_moe_config_t c = config(0, NULL);
    c.num_experts = 256, c.max_local_experts = 96;
    moea2a_moe_t moe;
    if (moea2a_moe_create(&moe, comm, &c)) return 1;
    int32_t map[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int bad = 0;
    for (int i = 0; i < 200; i++) {
        random_map((uint64_t)i, ep, 256, 96, map);
        bad += moea2a_moe_set_placement(moe, map, NULL) != MOEA2A_SUCCESS;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (me == 0)
        printf("# set_placement, 256 experts, %d ranks: %.1f us per change, agreement included\n", ep,
               ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3) / 200);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return bad;
}

int main(void)
{
    /* rank-major, expert-major, and rank-major in 2 emulated nodes of 2 (the host
     * hierarchical path, whose relays look the experts up again) */
    for (int mode = 0; mode <= 2; mode++) {
        int expert_major = mode == 1;
        if (mode == 2) setenv("MOEA2A_NODE_SIZE", "2", 1);
        local_ranks_result_t res;
        local_ranks_run(EP, placement_rank, &expert_major, WATCHDOG, &res);
        unsetenv("MOEA2A_NODE_SIZE");
        tap_ok(res.failed == 0, "moea2a_moe_set_placement on %d ranks%s, %s layout: %d rounds, the experts moved every "
                                "third: each round equals a freshly created context with that map and the oracle; "
                                "a rank marked inactive (its experts -1): its entries dropped and counted apart; "
                                "replicas, each token to holder (source + token) mod n; the expert load; "
                                "over the bound, disagreeing ranks, a non-rank, NULL%s refused on every rank",
               EP, mode == 2 ? " in 2 nodes of 2" : "", expert_major ? "expert-major" : "rank-major", ROUNDS,
               expert_major ? "" : ", a pending dispatch");
    }
    local_ranks_result_t res;
    local_ranks_run(EP, timing_rank, NULL, WATCHDOG, &res);
    tap_ok(res.failed == 0, "200 placement changes of 256 experts on %d ranks", EP);
    return tap_done();
}

/* moea2a_perf, generic collectives: alltoallv, allgather, bcast over a range of
 * sizes, nccl-tests columns. "size" is what one rank sends in total. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf.h"

static const char *const op_names[] = {"alltoallv", "allgather", "bcast"};

#define CHECK(call)                                                                            \
    do {                                                                                       \
        moea2a_result_t r_ = (call);                                                           \
        if (r_ != MOEA2A_SUCCESS) {                                                            \
            fprintf(stderr, "rank %d: %s: %s\n  %s\n", rank, #call, moea2a_strerror(r_),       \
                    moea2a_last_error(comm));                                                  \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

typedef struct {
    unsigned char *sbuf, *rbuf;
    int64_t *sc, *sd, *rc, *rd;
} bufs_t;

/* Deterministic byte for (source rank, destination rank, byte index). */
static unsigned char pattern(int src, int dst, size_t i)
{
    return (unsigned char)(src * 31 + dst * 7 + i * 13 + (i >> 8));
}

static moea2a_result_t run_once(const perf_opts_t *o, moea2a_comm_t comm, bufs_t *b, size_t count)
{
    switch (o->op) {
    case OP_ALLTOALLV:
        return moea2a_alltoallv(b->sbuf, b->sc, b->sd, b->rbuf, b->rc, b->rd, o->dtype, comm, NULL);
    case OP_ALLGATHER:
        return moea2a_allgather(b->sbuf, b->rbuf, count, o->dtype, comm, NULL);
    default:
        return moea2a_bcast(b->rbuf, count, o->dtype, 0, comm, NULL);
    }
}

/* Fills send data, runs once, and counts wrong bytes on this rank. */
static long check_once(const perf_opts_t *o, moea2a_comm_t comm, bufs_t *b, int rank, int n, size_t count,
                       size_t esize, moea2a_result_t *res)
{
    size_t block = count * esize;
    long wrong = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < block; i++) {
            int dst = o->op == OP_ALLTOALLV ? p : 0;
            b->sbuf[(size_t)p * block + i] = pattern(rank, dst, i);
        }
    memset(b->rbuf, 0xA5, block * (size_t)n);
    if (o->op == OP_BCAST && rank == 0) memcpy(b->rbuf, b->sbuf, block);
    if ((*res = run_once(o, comm, b, count)) != MOEA2A_SUCCESS) return 0;
    for (int p = 0; p < n; p++) {
        if (o->op == OP_BCAST && p > 0) break;
        for (size_t i = 0; i < block; i++) {
            int src = o->op == OP_BCAST ? 0 : p, dst = o->op == OP_ALLTOALLV ? rank : 0;
            wrong += b->rbuf[(size_t)p * block + i] != pattern(src, dst, i);
        }
    }
    return wrong;
}

int perf_coll(moea2a_comm_t comm, const perf_opts_t *o)
{
    int rank, n;
    CHECK(moea2a_comm_rank(comm, &rank));
    CHECK(moea2a_comm_size(comm, &n));
    size_t esize;
    moea2a_datatype_size(o->dtype, &esize);
    if (strcmp(o->mem, "host")) {
        fprintf(stderr, "moea2a_perf: --mem %s: generic collectives are benchmarked on host memory only\n", o->mem);
        return 2;
    }
    /* `bytes` is what one rank sends in total; each of the n blocks is bytes/n. */
    size_t max_block = o->max_bytes / (size_t)n + esize;
    bufs_t b;
    b.sbuf = malloc(max_block * (size_t)n);
    b.rbuf = malloc(max_block * (size_t)n);
    b.sc = calloc((size_t)n * 4, sizeof(int64_t));
    if (!b.sbuf || !b.rbuf || !b.sc) {
        fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", rank, max_block * (size_t)n);
        return 1;
    }
    b.sd = b.sc + n, b.rc = b.sc + 2 * n, b.rd = b.sc + 3 * n;
    if (rank == 0) {
        printf("# moea2a_perf: %s, %d ranks, %s memory, %d iterations (%d warm-up)\n", op_names[o->op], n, o->mem,
               o->iters, o->warmup);
        printf("#\n# %10s %12s %8s %10s %11s %11s %7s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)", "#wrong");
    }
    double sum_busbw = 0;
    int rows = 0, any_wrong = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= (size_t)o->factor) {
        size_t count = bytes / (size_t)n / esize; /* elements per block */
        for (int p = 0; p < n; p++) {
            b.sc[p] = b.rc[p] = (int64_t)count;
            b.sd[p] = b.rd[p] = (int64_t)(count * (size_t)p);
        }
        long wrong = 0;
        moea2a_result_t r = MOEA2A_SUCCESS;
        if (o->check) wrong = check_once(o, comm, &b, rank, n, count, esize, &r);
        for (int i = 0; i < o->warmup && r == MOEA2A_SUCCESS; i++) r = run_once(o, comm, &b, count);
        if (r == MOEA2A_SUCCESS) r = moea2a_barrier(comm);
        double t0 = perf_now();
        for (int i = 0; i < o->iters && r == MOEA2A_SUCCESS; i++) r = run_once(o, comm, &b, count);
        double t = (perf_now() - t0) / o->iters, tmax, wsum;
        CHECK(r);
        /* The slowest rank defines the collective's time; wrong counts add up. */
        CHECK(perf_reduce(comm, t, (double)wrong, &tmax, &wsum));
        size_t moved = count * esize * (size_t)n;
        double algbw = (double)moved / tmax / 1e9;
        double busbw = o->op == OP_BCAST ? algbw : algbw * (n - 1) / n;
        char wrong_col[24] = "N/A";
        if (o->check) snprintf(wrong_col, sizeof(wrong_col), "%.0f", wsum);
        if (rank == 0)
            printf("  %10zu %12zu %8s %10.2f %11.3f %11.3f %7s\n", moved, count * (size_t)n,
                   moea2a_datatype_name(o->dtype), tmax * 1e6, algbw, busbw, wrong_col);
        any_wrong |= wsum > 0;
        sum_busbw += busbw;
        rows++;
        if (bytes == 0) break;
    }
    if (rank == 0) {
        printf("# Out of bounds values : %d %s\n", any_wrong, any_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4f\n", rows ? sum_busbw / rows : 0.0);
    }
    free(b.sbuf), free(b.rbuf), free(b.sc);
    return any_wrong ? 3 : 0;
}


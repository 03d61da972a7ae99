/* moea2a_perf: collective benchmark with nccl-tests-style output.
 *
 * Ranks are forked locally (--ranks N) or started by a launcher (mpirun, srun, or
 * MOEA2A_RANK/MOEA2A_NRANKS/MOEA2A_ROOT_ADDR), in which case moea2a_comm_init_env
 * joins them. Rank 0 prints the table. Bandwidths follow nccl-tests: algbw = bytes /
 * time, busbw = algbw * (n-1)/n for all-to-all and allgather, algbw for bcast. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local_ranks.h"
#include "moea2a.h"

typedef enum { OP_ALLTOALLV, OP_ALLGATHER, OP_BCAST } perf_op_t;
static const char *const op_names[] = {"alltoallv", "allgather", "bcast"};

typedef struct {
    perf_op_t op;
    size_t min_bytes, max_bytes;
    int factor, iters, warmup, check;
    moea2a_datatype_t dtype;
    const char *mem;
} perf_opts_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Deterministic byte for (source rank, destination rank, byte index). */
static unsigned char pattern(int src, int dst, size_t i)
{
    return (unsigned char)(src * 31 + dst * 7 + i * 13 + (i >> 8));
}

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

/* Runs op once on per-peer blocks of `block` bytes (alltoallv) or `block` bytes
 * per rank (allgather, bcast root 0). */
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

static int perf_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const perf_opts_t *o = arg;
    moea2a_comm_t comm = NULL;
    if (id.internal[0] || id.internal[1]) CHECK(moea2a_comm_init_rank(&comm, n, id, rank, NULL));
    else CHECK(moea2a_comm_init_env(&comm, NULL));
    CHECK(moea2a_comm_rank(comm, &rank));
    CHECK(moea2a_comm_size(comm, &n));
    size_t esize;
    moea2a_datatype_size(o->dtype, &esize);
    if (strcmp(o->mem, "host")) {
        fprintf(stderr, "moea2a_perf: --mem %s: this build benchmarks host memory only\n", o->mem);
        moea2a_comm_destroy(comm);
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
        double t0 = now();
        for (int i = 0; i < o->iters && r == MOEA2A_SUCCESS; i++) r = run_once(o, comm, &b, count);
        double t = (now() - t0) / o->iters;
        CHECK(r);
        /* The slowest rank defines the collective's time; wrong counts add up. */
        double mine[2] = {t, (double)wrong}, *all = malloc(sizeof(mine) * (size_t)n);
        CHECK(moea2a_allgather(mine, all, 2 * sizeof(double), MOEA2A_UINT8, comm, NULL));
        double tmax = 0, wsum = 0;
        for (int p = 0; p < n; p++) tmax = fmax(tmax, all[2 * p]), wsum += all[2 * p + 1];
        free(all);
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
    CHECK(moea2a_comm_destroy(comm));
    return any_wrong ? 3 : 0;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static int parse_dtype(const char *s, moea2a_datatype_t *d)
{
    for (int i = 0; i < MOEA2A_NUM_DATATYPES; i++)
        if (!strcmp(s, moea2a_datatype_name((moea2a_datatype_t)i))) return *d = (moea2a_datatype_t)i, 0;
    return -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moea2a_perf [options]\n"
            "  -n, --ranks N        fork N local ranks (default: from the launcher's environment, else 2)\n"
            "  -o, --op OP          alltoallv (default), allgather, bcast\n"
            "  -b, --minbytes B     smallest size per rank, bytes (K/M/G suffixes; default 1K)\n"
            "  -e, --maxbytes B     largest size per rank (default 16M)\n"
            "  -f, --stepfactor F   size multiplier (default 2)\n"
            "  -i, --iters I        timed iterations per size (default 20)\n"
            "  -w, --warmup W       untimed iterations per size (default 5)\n"
            "  -d, --dtype T        int8 uint8 int32 int64 fp16 bf16 fp32 fp8_e4m3 nvfp4 (default int32)\n"
            "  -m, --mem M          host (default) or cuda\n"
            "  -c, --check 0|1      verify every byte once per size (default 1)\n"
            "exit status: 0 ok, 1 error, 3 wrong values found\n");
}

int main(int argc, char **argv)
{
    perf_opts_t o = {OP_ALLTOALLV, 1024, 16 << 20, 2, 20, 5, 1, MOEA2A_INT32, "host"};
    int nranks = 0;
    static const struct option opts[] = {
        {"ranks", required_argument, 0, 'n'},      {"op", required_argument, 0, 'o'},
        {"minbytes", required_argument, 0, 'b'},   {"maxbytes", required_argument, 0, 'e'},
        {"stepfactor", required_argument, 0, 'f'}, {"iters", required_argument, 0, 'i'},
        {"warmup", required_argument, 0, 'w'},     {"dtype", required_argument, 0, 'd'},
        {"mem", required_argument, 0, 'm'},        {"check", required_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "n:o:b:e:f:i:w:d:m:c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n': nranks = atoi(optarg); break;
        case 'o':
            if (!strcmp(optarg, "alltoallv")) o.op = OP_ALLTOALLV;
            else if (!strcmp(optarg, "allgather")) o.op = OP_ALLGATHER;
            else if (!strcmp(optarg, "bcast")) o.op = OP_BCAST;
            else { usage(stderr); return 2; }
            break;
        case 'b': o.min_bytes = parse_size(optarg); break;
        case 'e': o.max_bytes = parse_size(optarg); break;
        case 'f': o.factor = atoi(optarg); break;
        case 'i': o.iters = atoi(optarg); break;
        case 'w': o.warmup = atoi(optarg); break;
        case 'd': if (parse_dtype(optarg, &o.dtype)) { usage(stderr); return 2; } break;
        case 'm': o.mem = optarg; break;
        case 'c': o.check = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (o.factor < 2 || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes || o.min_bytes == 0) {
        fprintf(stderr, "moea2a_perf: need stepfactor >= 2, iters >= 1, 0 < minbytes <= maxbytes\n");
        return 2;
    }
    int launched = getenv("MOEA2A_RANK") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK") ||
                   getenv("SLURM_PROCID");
    if (launched && !nranks) {
        moea2a_unique_id_t none;
        memset(&none, 0, sizeof(none));
        return perf_rank(0, 0, none, &o);
    }
    if (nranks < 1 || nranks > 64) nranks = nranks ? -1 : 2;
    if (nranks < 0) {
        fprintf(stderr, "moea2a_perf: --ranks must be 1..64\n");
        return 2;
    }
    local_ranks_result_t res;
    local_ranks_run(nranks, perf_rank, &o, 3600.0, &res);
    int worst = 0;
    for (int r = 0; r < nranks; r++) worst = res.exit_codes[r] > worst ? res.exit_codes[r] : worst;
    return res.hung ? 1 : worst;
}

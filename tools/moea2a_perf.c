/* moea2a_perf: benchmark with nccl-tests-style output.
 *
 * Ranks are forked locally (--ranks N) or started by a launcher (mpirun, srun, or
 * MOEA2A_RANK/MOEA2A_NRANKS/MOEA2A_ROOT_ADDR), in which case moea2a_comm_init_env
 * joins them. Rank 0 prints the table. --moe benchmarks dispatch and combine
 * (perf_moe.c); otherwise a generic collective over a range of sizes (perf_coll.c). */
#include "config.h"

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "local_ranks.h"
#include "perf.h"

double perf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

moea2a_result_t perf_reduce(moea2a_comm_t comm, double t, double v, double *tmax, double *vsum)
{
    int n;
    moea2a_comm_size(comm, &n);
    double mine[2] = {t, v}, *all = malloc(sizeof(mine) * (size_t)n);
    if (!all) return MOEA2A_ERR_NO_MEMORY;
    moea2a_result_t r = moea2a_allgather(mine, all, sizeof(mine), MOEA2A_UINT8, comm, NULL);
    *tmax = 0, *vsum = 0;
    for (int p = 0; r == MOEA2A_SUCCESS && p < n; p++) {
        if (all[2 * p] > *tmax) *tmax = all[2 * p];
        *vsum += all[2 * p + 1];
    }
    free(all);
    return r;
}

/* The rank's number before the communicator exists (to pick its GPU first). */
static int launch_rank(int rank, int n)
{
    const char *v = n > 0 ? NULL : getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!v && n == 0) v = getenv("SLURM_LOCALID");
    if (!v && n == 0) v = getenv("MOEA2A_RANK");
    return v ? atoi(v) : rank;
}

static int perf_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const perf_opts_t *o = arg;
    moea2a_comm_t comm = NULL;
    perf_mem_t mem;
    moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
    int cuda = !strcmp(o->mem, "cuda");
    /* This rank's GPU is chosen before the communicator, which sets NCCL up on it. */
    cfg.cuda_device = perf_mem_open(&mem, cuda, launch_rank(rank, n));
    if (cuda && cfg.cuda_device < 0) {
        if (launch_rank(rank, n) != 0) return 1; /* rank 0 says why, once */
        fprintf(stderr, "moea2a_perf: --mem cuda: no usable CUDA device%s\n",
#ifdef MOEA2A_HAVE_CUDA
                ""
#else
                " (this build has no CUDA)"
#endif
        );
        return 1;
    }
    moea2a_result_t r = n > 0 ? moea2a_comm_init_rank(&comm, n, id, rank, &cfg) : moea2a_comm_init_env(&comm, &cfg);
    if (r != MOEA2A_SUCCESS) {
        fprintf(stderr, "moea2a_perf: rank %d: communicator: %s: %s\n", rank, moea2a_strerror(r), moea2a_last_error(NULL));
        return 1;
    }
    int rc = o->op == OP_MOE                       ? perf_moe(comm, o, &mem)
             : o->op == OP_FP4 || o->op == OP_FP8 ? perf_quant(comm, o, &mem)
             : o->op == OP_EXPERT_GEMM            ? perf_egemm(comm, o, &mem)
                                                  : perf_coll(comm, o);
    perf_mem_close(&mem);
    r = moea2a_comm_destroy(comm);
    if (r != MOEA2A_SUCCESS && rc == 0) {
        fprintf(stderr, "moea2a_perf: destroy: %s\n", moea2a_last_error(NULL));
        rc = 1;
    }
    return rc;
}

/* A byte count with an optional K, M or G suffix; -1 when it is not one. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024, end++; break;
    case 'M': case 'm': v *= 1024 * 1024, end++; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024, end++; break;
    default: break;
    }
    if (end == s || *end || !(v >= 0) || v > 1e18) return -1;
    *out = (size_t)v;
    return 0;
}

/* A whole number in [lo, hi]; -1 when it is not one. */
static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* Exit status 2 with the option, its value and what it takes. */
static int bad_option(const char *opt, const char *value, const char *takes)
{
    fprintf(stderr, "moea2a_perf: %s '%s': %s (moea2a_perf --help lists the options)\n", opt, value, takes);
    return 2;
}

static int parse_dtype(const char *s, moea2a_datatype_t *d)
{
    for (int i = 0; i < MOEA2A_NUM_DATATYPES; i++)
        if (!strcmp(s, moea2a_datatype_name((moea2a_datatype_t)i))) return *d = (moea2a_datatype_t)i, 0;
    return -1;
}

/* A comma-separated list of at most PERF_MAX_TOKEN_SIZES integers >= min. */
static int parse_list(char *s, int *v, int *n, int min)
{
    *n = 0;
    for (char *save, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long x = strtol(t, &end, 10);
        if (*n == PERF_MAX_TOKEN_SIZES || *end || x < min || x > 1 << 30) return -1;
        v[(*n)++] = (int)x;
    }
    return *n ? 0 : -1;
}

/* --gemm-shapes n:k[,n:k...]: n >= 1, k a positive multiple of 16 */
static int parse_shapes(char *s, perf_opts_t *o)
{
    o->gemm_nshapes = 0;
    for (char *save, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long n = strtol(t, &end, 10), k = *end == ':' ? strtol(end + 1, &end, 10) : -1;
        if (o->gemm_nshapes == PERF_MAX_TOKEN_SIZES || *end || n < 1 || k < 16 || k % 16 || n > 1 << 20 || k > 1 << 20)
            return -1;
        o->gemm_n[o->gemm_nshapes] = (int)n, o->gemm_k[o->gemm_nshapes++] = (int)k;
    }
    return o->gemm_nshapes ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moea2a_perf [options]\n"
            "  -n, --ranks N        fork N local ranks, 1..64, or cores: one per core (default: from the\n"
            "                       launcher's environment, else 2)\n"
            "  -T, --threads        the N local ranks as threads of one process: ranks that share a GPU\n"
            "                       (N above the GPU count) run at once; without NCCL, which refuses\n"
            "                       that: MOEA2A_TRANSPORT=ucx (the load/store path over CUDA IPC)\n"
            "  -m, --mem M          host (default) or cuda\n"
            "  -i, --iters I        timed iterations per size (default 20)\n"
            "  -w, --warmup W       untimed iterations per size (default 5)\n"
            "  -c, --check 0|1      verify results once per size (default 1)\n"
            "  -d, --dtype T        int8 uint8 int32 int64 fp16 bf16 fp32 fp8_e4m3 nvfp4\n"
            "                       (default int32; with --moe, the payload dtype, default bf16)\n"
            "generic collectives:\n"
            "  -o, --op OP          alltoallv (default), allgather, bcast; fp4 / fp8: NVFP4 / FP8\n"
            "                       block quantize and dequantize of --rows x --hidden bf16 next to\n"
            "                       a copy of it (fp8: fp32 and UE8M0 scales)\n"
            "  -r, --rows M         rows for --op fp4 and fp8 (default 16384)\n"
            "                       expert-gemm: moea2a_expert_gemm (NVFP4 weights) next to cuBLAS's\n"
            "                       bf16 grouped GEMM (--tokens: rows per expert, default 8,64,1024;\n"
            "                       --experts: local experts, default 32)\n"
            "  -G, --gemm-shapes L  n:k of the weights, comma-separated (default 4096:7168,7168:2048,\n"
            "                       DeepSeek-V3's gate/up and down)\n"
            "  -b, --minbytes B     smallest size per rank, bytes (K/M/G suffixes; default 1K)\n"
            "  -e, --maxbytes B     largest size per rank (default 16M)\n"
            "  -f, --stepfactor F   size multiplier (default 2)\n"
            "MoE dispatch and combine:\n"
            "  -M, --moe            benchmark moea2a_dispatch / moea2a_combine\n"
            "  -t, --tokens LIST    tokens per rank, comma-separated (default 128,1024,4096)\n"
            "  -H, --hidden H       hidden size (default 7168)\n"
            "  -k, --topk K         experts per token (default 8)\n"
            "  -E, --experts E      experts (default 256)\n"
            "  -s, --skew P         probability that an expert is one of rank 0's (default 0: uniform)\n"
            "  -W, --weights        carry router weights\n"
            "  -B, --baseline       also time the path without moea2a: pack rows per destination, then\n"
            "                       an all-to-all of the packed rows (and back, then sum)\n"
            "  -S, --sms LIST       SM budgets (num_sms) to run every size at, comma-separated\n"
            "                       (default: the context's default)\n"
            "  -P, --split          also time the split halves, and their overlap with a cuBLAS bf16\n"
            "                       GEMM on a second stream sized to take as long as the exchange\n"
            "  -K, --kernels        with --mem cuda, list each call's GPU work on rank 0 (kernels, copies,\n"
            "                       memsets: start after the call's first, duration; CUPTI)\n"
            "  -q, --wire F         quantize the payload on dispatch: fp8, fp8-ue8m0 (MN-major scales)\n"
            "                       or nvfp4 (128x4 scales); with --baseline also quantize, then dispatch\n"
            "                       the codes and scales as plain payloads (the q+dispatch row)\n"
            "  -C, --combine-wire F the combine's rows as FP8: fp8 or fp8-ue8m0 (host memory, or the\n"
            "                       load/store and generic paths in CUDA memory; --check counts outputs\n"
            "                       outside twice the documented error bound as wrong)\n"
            "  -L, --layout L       rank (default) or expert[:ALIGN] (the expert-major layout, its rows\n"
            "                       aligned to ALIGN, default 128; the rank-major rows follow, same run)\n"
            "  -x, --engine E       sm (default): the load/store kernels move the rows; ce: the GPU's copy\n"
            "                       engines do (MOEA2A_MOE_COPY_ENGINE; no CUDA graph row)\n"
            "  -p, --placement P    one (default) or general: a context made for replicas and experts\n"
            "                       no rank holds (MOEA2A_MOE_GENERAL_PLACEMENT; its kernels route by the\n"
            "                       general rule), with the same one-holder placement\n"
            "  -V, --moves N        also time N changes of the placement per size (moea2a_moe_set_placement,\n"
            "                       the experts permuted within the create's bound): the host's time in the\n"
            "                       call and its time on the stream; then the moved context's round trip\n"
            "                       against one created with the last map, every output compared (#wrong)\n"
            "exit status: 0 ok, 1 error, 2 usage, 3 wrong values found\n");
}

/* What the command line asked beyond perf_opts_t: how the ranks start, and which
 * defaults the chosen operation replaces. */
typedef struct {
    int nranks, threads, dtype_set, tokens_set, experts_set;
} cli_t;

/* What an option setter did with an option: took it, left it to the other setters, or
 * ended the program with *status (help, or a bad value). */
enum { OPT_TAKEN, OPT_NOT_MINE, OPT_EXIT };

static int exit_with(int *status, int s)
{
    *status = s;
    return OPT_EXIT;
}

/* The options that take one whole number in a range: where it goes and what it takes. */
static const struct {
    int c;
    const char *name;
    long lo, hi;
    size_t off; /* in perf_opts_t */
    const char *takes;
} int_options[] = {
    {'f', "--stepfactor", 2, 1 << 20, offsetof(perf_opts_t, factor), "takes 2 or more"},
    {'i', "--iters", 1, 1 << 24, offsetof(perf_opts_t, iters), "takes 1 or more"},
    {'w', "--warmup", 0, 1 << 24, offsetof(perf_opts_t, warmup), "takes 0 or more"},
    {'c', "--check", 0, 1, offsetof(perf_opts_t, check), "takes 0 or 1"},
    {'r', "--rows", 1, 1 << 28, offsetof(perf_opts_t, fp4_rows), "takes 1 or more"},
    {'H', "--hidden", 1, 1 << 24, offsetof(perf_opts_t, hidden), "takes 1 or more"},
    {'k', "--topk", 1, 1024, offsetof(perf_opts_t, topk), "takes 1..1024"},
    {'E', "--experts", 1, 1 << 20, offsetof(perf_opts_t, experts), "takes 1 or more"},
    {'V', "--moves", 0, PERF_MARKS / 2 - 1, offsetof(perf_opts_t, moves), "takes 0..255"},
};

static int set_int_option(int c, const char *arg, perf_opts_t *o, cli_t *cli, int *status)
{
    for (size_t i = 0; i < sizeof(int_options) / sizeof(int_options[0]); i++) {
        if (int_options[i].c != c) continue;
        int *to = (int *)((char *)o + int_options[i].off);
        if (parse_int(arg, int_options[i].lo, int_options[i].hi, to))
            return exit_with(status, bad_option(int_options[i].name, arg, int_options[i].takes));
        if (c == 'E') cli->experts_set = 1; /* --op expert-gemm's experts default otherwise */
        return OPT_TAKEN;
    }
    return OPT_NOT_MINE;
}

/* The options every operation shares: ranks, the operation, sizes, memory. */
static int set_common_option(int c, char *arg, perf_opts_t *o, cli_t *cli, int *status)
{
    switch (c) {
    case 'n':
        if (!strcmp(arg, "cores")) { /* one rank per core: steady times (see the warning in launch) */
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            cli->nranks = cores < 1 ? 1 : cores > 64 ? 64 : (int)cores;
        } else if (parse_int(arg, 1, 64, &cli->nranks)) {
            return exit_with(status, bad_option("--ranks", arg, "takes 1..64 or cores"));
        }
        return OPT_TAKEN;
    case 'T': cli->threads = 1; return OPT_TAKEN;
    case 'o':
        if (!strcmp(arg, "alltoallv")) o->op = OP_ALLTOALLV;
        else if (!strcmp(arg, "allgather")) o->op = OP_ALLGATHER;
        else if (!strcmp(arg, "bcast")) o->op = OP_BCAST;
        else if (!strcmp(arg, "moe")) o->op = OP_MOE;
        else if (!strcmp(arg, "fp4")) o->op = OP_FP4;
        else if (!strcmp(arg, "fp8")) o->op = OP_FP8;
        else if (!strcmp(arg, "expert-gemm")) o->op = OP_EXPERT_GEMM;
        else
            return exit_with(status, bad_option("--op", arg, "takes alltoallv, allgather, bcast, moe, fp4, fp8 or "
                                                             "expert-gemm"));
        return OPT_TAKEN;
    case 'b':
        if (parse_size(arg, &o->min_bytes))
            return exit_with(status, bad_option("--minbytes", arg, "takes bytes (K, M, G suffixes)"));
        return OPT_TAKEN;
    case 'e':
        if (parse_size(arg, &o->max_bytes))
            return exit_with(status, bad_option("--maxbytes", arg, "takes bytes (K, M, G suffixes)"));
        return OPT_TAKEN;
    case 'd':
        if (parse_dtype(arg, &o->dtype))
            return exit_with(status, bad_option("--dtype", arg, "takes int8, uint8, int32, int64, fp16, bf16, fp32, "
                                                                "fp8_e4m3 or nvfp4"));
        cli->dtype_set = 1;
        return OPT_TAKEN;
    case 'm':
        if (strcmp(arg, "host") && strcmp(arg, "cuda")) return exit_with(status, bad_option("--mem", arg, "takes host or cuda"));
        o->mem = arg;
        return OPT_TAKEN;
    case 'h': usage(stdout); return exit_with(status, 0);
    default: return OPT_NOT_MINE;
    }
}

/* The options of --moe (and of the quantization and GEMM benchmarks' shapes). */
static int set_moe_option(int c, char *arg, perf_opts_t *o, cli_t *cli, int *status)
{
    switch (c) {
    case 'M': o->op = OP_MOE; return OPT_TAKEN;
    case 't':
        if (parse_list(arg, o->tokens, &o->ntokens, 0))
            return exit_with(status, bad_option("--tokens", arg, "takes up to 16 token counts >= 0, comma-separated"));
        cli->tokens_set = 1;
        return OPT_TAKEN;
    case 'G':
        if (parse_shapes(arg, o))
            return exit_with(status, bad_option("--gemm-shapes", arg, "takes n:k pairs (k a multiple of 16), "
                                                                      "comma-separated"));
        return OPT_TAKEN;
    case 'S':
        if (parse_list(arg, o->sms, &o->nsms, 1))
            return exit_with(status, bad_option("--sms", arg, "takes up to 16 SM budgets >= 1, comma-separated"));
        return OPT_TAKEN;
    case 'P': o->split = 1; return OPT_TAKEN;
    case 'K': o->kernels = 1; return OPT_TAKEN;
    case 'x':
        if (!strcmp(arg, "sm")) o->copy_engine = 0;
        else if (!strcmp(arg, "ce")) o->copy_engine = 1;
        else return exit_with(status, bad_option("--engine", arg, "takes sm or ce"));
        return OPT_TAKEN;
    case 'p':
        if (!strcmp(arg, "one")) o->general = 0;
        else if (!strcmp(arg, "general")) o->general = 1;
        else return exit_with(status, bad_option("--placement", arg, "takes one or general"));
        return OPT_TAKEN;
    case 'q':
        if (!strcmp(arg, "fp8")) o->wire = PERF_WIRE_FP8;
        else if (!strcmp(arg, "fp8-ue8m0")) o->wire = PERF_WIRE_FP8_UE8M0;
        else if (!strcmp(arg, "nvfp4")) o->wire = PERF_WIRE_NVFP4;
        else return exit_with(status, bad_option("--wire", arg, "takes fp8, fp8-ue8m0 or nvfp4"));
        return OPT_TAKEN;
    case 'C':
        if (!strcmp(arg, "fp8")) o->combine_wire = 1;
        else if (!strcmp(arg, "fp8-ue8m0")) o->combine_wire = 2;
        else return exit_with(status, bad_option("--combine-wire", arg, "takes fp8 or fp8-ue8m0"));
        return OPT_TAKEN;
    case 'L':
        if (!strcmp(arg, "rank")) o->expert_align = 0;
        else if (!strcmp(arg, "expert")) o->expert_align = 128;
        else if (strncmp(arg, "expert:", 7) || parse_int(arg + 7, 1, 1024, &o->expert_align))
            return exit_with(status, bad_option("--layout", arg, "takes rank, expert or expert:ALIGN (1..1024)"));
        return OPT_TAKEN;
    case 's':
        if (parse_double(arg, 0.0, 1.0, &o->skew)) return exit_with(status, bad_option("--skew", arg, "takes 0..1"));
        return OPT_TAKEN;
    case 'W': o->weights = 1; return OPT_TAKEN;
    case 'B': o->baseline = 1; return OPT_TAKEN;
    default: return OPT_NOT_MINE;
    }
}

/* Every option into o and cli, each value checked as it is read: -1 to go on, else the
 * exit status (0 after --help, 2 for a bad option). */
static int parse_args(int argc, char **argv, perf_opts_t *o, cli_t *cli)
{
    static const struct option opts[] = { /* the options that take a value, then the switches */
        {"ranks", required_argument, 0, 'n'}, {"op", required_argument, 0, 'o'},
        {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
        {"stepfactor", required_argument, 0, 'f'}, {"iters", required_argument, 0, 'i'},
        {"warmup", required_argument, 0, 'w'}, {"dtype", required_argument, 0, 'd'},
        {"mem", required_argument, 0, 'm'}, {"check", required_argument, 0, 'c'},
        {"tokens", required_argument, 0, 't'}, {"hidden", required_argument, 0, 'H'},
        {"topk", required_argument, 0, 'k'}, {"experts", required_argument, 0, 'E'},
        {"skew", required_argument, 0, 's'}, {"rows", required_argument, 0, 'r'}, {"sms", required_argument, 0, 'S'},
        {"wire", required_argument, 0, 'q'}, {"layout", required_argument, 0, 'L'},
        {"gemm-shapes", required_argument, 0, 'G'}, {"engine", required_argument, 0, 'x'},
        {"combine-wire", required_argument, 0, 'C'}, {"placement", required_argument, 0, 'p'},
        {"moves", required_argument, 0, 'V'},
        /* the switches */
        {"moe", no_argument, 0, 'M'}, {"weights", no_argument, 0, 'W'}, {"baseline", no_argument, 0, 'B'},
        {"help", no_argument, 0, 'h'}, {"split", no_argument, 0, 'P'}, {"threads", no_argument, 0, 'T'},
        {"kernels", no_argument, 0, 'K'}, {0, 0, 0, 0}};
    int c, status = 0;
    while ((c = getopt_long(argc, argv, "n:o:b:e:f:i:w:d:m:c:Mt:H:k:E:s:WBr:hS:PKq:L:G:x:TC:p:V:", opts, NULL)) != -1) {
        int took = set_int_option(c, optarg, o, cli, &status);
        if (took == OPT_NOT_MINE) took = set_common_option(c, optarg, o, cli, &status);
        if (took == OPT_NOT_MINE) took = set_moe_option(c, optarg, o, cli, &status);
        if (took == OPT_EXIT) return status;
        if (took == OPT_NOT_MINE) { /* getopt has named the unknown option */
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) return bad_option("an argument", argv[optind], "is not an option");
    return -1;
}

/* The operation's defaults and the checks across options: 0, or exit status 2. */
static int settle_options(perf_opts_t *o, const cli_t *cli)
{
    if (o->op == OP_MOE) {
        if (!cli->dtype_set) o->dtype = MOEA2A_BFLOAT16;
        if (o->hidden < 1 || o->topk < 1 || o->experts < 1 || o->skew < 0 || o->skew > 1) {
            fprintf(stderr, "moea2a_perf: need hidden, topk, experts >= 1 and 0 <= skew <= 1\n");
            return 2;
        }
        if (o->combine_wire && o->hidden % 128) {
            fprintf(stderr, "moea2a_perf --combine-wire: needs --hidden a multiple of 128\n");
            return 2;
        }
        if (o->moves && (o->wire || o->dtype != MOEA2A_BFLOAT16 || o->expert_align)) {
            fprintf(stderr, "moea2a_perf --moves: needs a bf16 payload as it is (no --wire, no --dtype, no "
                            "--layout expert): the round trips it compares combine the rows received\n");
            return 2;
        }
        if (o->wire && (o->dtype != MOEA2A_BFLOAT16 || o->hidden % (o->wire == PERF_WIRE_NVFP4 ? 16 : 128))) {
            fprintf(stderr, "moea2a_perf --wire: needs --dtype bf16 and --hidden a multiple of %d\n",
                    o->wire == PERF_WIRE_NVFP4 ? 16 : 128);
            return 2;
        }
    } else if (o->op == OP_FP4 || o->op == OP_FP8) {
        const int block = o->op == OP_FP8 ? 128 : 16;
        if (o->fp4_rows < 1 || o->hidden < block || o->hidden % block) {
            fprintf(stderr, "moea2a_perf --op %s: need --rows >= 1 and --hidden a multiple of %d\n",
                    o->op == OP_FP8 ? "fp8" : "fp4", block);
            return 2;
        }
    } else if (o->op == OP_EXPERT_GEMM) {
        static const int rows[] = {8, 64, 1024};
        if (!cli->tokens_set) memcpy(o->tokens, rows, sizeof(rows)), o->ntokens = 3;
        o->gemm_experts = cli->experts_set ? o->experts : 32;
        if (!o->gemm_nshapes)
            o->gemm_n[0] = 4096, o->gemm_k[0] = 7168, o->gemm_n[1] = 7168, o->gemm_k[1] = 2048, o->gemm_nshapes = 2;
        if (o->gemm_experts < 1 || o->gemm_experts > 1024) {
            fprintf(stderr, "moea2a_perf --op expert-gemm: need 1 <= --experts <= 1024\n");
            return 2;
        }
    } else if (o->factor < 2 || o->min_bytes > o->max_bytes || o->min_bytes == 0) {
        fprintf(stderr, "moea2a_perf: need stepfactor >= 2 and 0 < minbytes <= maxbytes\n");
        return 2;
    }
    return 0;
}

/* This process as one rank of a launcher's job, or nranks local ranks (processes, or
 * threads with --threads); the exit status is the worst rank's. */
static int launch(perf_opts_t *o, const cli_t *cli)
{
    int launched = getenv("MOEA2A_RANK") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK") ||
                   getenv("SLURM_PROCID");
    if (launched && !cli->nranks) {
        o->kernel_times = 1;
        moea2a_unique_id_t none;
        memset(&none, 0, sizeof(none));
        return perf_rank(0, 0, none, o);
    }
    int nranks = cli->nranks ? cli->nranks : 2;
    /* Ranks that outnumber the cores take turns on them: a rank waits for a peer's time
     * slice, and the times (and vs base) change from run to run. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && nranks > cores)
        fprintf(stderr, "moea2a_perf: warning: %d ranks on %ld cores: ranks take turns on the cores, so times and "
                "'vs base' vary from run to run; --ranks %ld or fewer gives steady numbers\n", nranks, cores, cores);
    local_ranks_result_t res;
    o->kernel_times = !cli->threads; /* CUPTI records per process: not for ranks as threads */
    if (cli->threads) local_ranks_run_threads(nranks, perf_rank, o, &res);
    else local_ranks_run(nranks, perf_rank, o, 3600.0, &res);
    int worst = 0;
    for (int r = 0; r < nranks; r++) worst = res.exit_codes[r] > worst ? res.exit_codes[r] : worst;
    return res.hung ? 1 : worst;
}

int main(int argc, char **argv)
{
    perf_opts_t o = {OP_ALLTOALLV, 1024, 16 << 20, 2, 20, 5, 1, MOEA2A_INT32, "host",
                     {128, 1024, 4096}, 3, 7168, 8, 256, 0, 0, 0.0, 16384};
    cli_t cli = {0, 0, 0, 0, 0};
    int status = parse_args(argc, argv, &o, &cli);
    if (status >= 0) return status;
    if ((status = settle_options(&o, &cli))) return status;
    return launch(&o, &cli);
}

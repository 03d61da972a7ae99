#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "base/params.h"

#ifndef MOEA2A_PKGLIBDIR
#define MOEA2A_PKGLIBDIR ""
#endif

/* Every MOEA2A_* variable, once: moea2a_info -c and moea2a(7) list exactly this. */
static const moea2a_param_t params[] = {
    {"MOEA2A_DEBUG", "enum", "WARN",
     "Log level: NONE, WARN, INFO or TRACE."},
    {"MOEA2A_DEBUG_SUBSYS", "string", "ALL",
     "Comma-separated subsystems to log (INIT, BOOTSTRAP, TRANSPORT, COLL, MOE, TOPO, ALL); "
     "a leading ^ logs all but those."},
    {"MOEA2A_DEBUG_FILE", "string", "",
     "Write the log to this file instead of stderr; %h is replaced by the host name, %p by the process id."},
    {"MOEA2A_TIMEOUT_S", "double", "300",
     "Seconds any wait for a peer (rendezvous, collective, device-side wait) may last before "
     "MOEA2A_ERR_TIMEOUT names the missing peers."},
    {"MOEA2A_WATCH", "int", "1",
     "1: each rank keeps a connection to every other (past 256 ranks, to those of its node) that tells it within "
     "milliseconds when a peer's process dies, so that waits on that peer (device-side ones included) fail with "
     "MOEA2A_ERR_PEER_FAILED naming it, whatever MOEA2A_TIMEOUT_S is; 0: no such connections (a death is then seen "
     "by the transports, or at MOEA2A_TIMEOUT_S). Read at communicator init; the same on every rank."},
    {"MOEA2A_WATCH_SILENCE_S", "double", "5",
     "With MOEA2A_WATCH: each rank's watcher beats on its connections twice a second, and a peer whose connection "
     "stays silent this many seconds (its host down or cut off, or its process stopped) is taken for dead, "
     "MOEA2A_ERR_PEER_FAILED naming it; 0: only a closed connection or an exit tells. Read at communicator init; "
     "ranks may differ (each beats whatever its own bound)."},
    {"MOEA2A_NVLINK", "int", "1",
     "1: CUDA MoE contexts whose ranks all share a node and reach each other by load/store (NVLink, or "
     "one GPU) dispatch and combine with fused kernels over symmetric memory (MOEA2A_SYMMETRIC_MEMORY); "
     "0: always the generic NCCL send/receive path."},
    {"MOEA2A_SYMMETRIC_MEMORY", "enum", "auto",
     "Where the load/store path's workspace comes from: transport (the CUDA transport's symmetric memory: "
     "ncclMemAlloc and an NCCL window, where NCCL's load/store team holds every rank), cuda_ipc (cudaMalloc "
     "and CUDA IPC handles exchanged by moea2a: one host, no NCCL needed, and ranks may share a GPU, in one "
     "process or several) or auto (default: transport where a CUDA transport with symmetric memory is loaded, "
     "and where NCCL's team is smaller than the communicator the generic path; else cuda_ipc). Read at "
     "create; the same on every rank."},
    {"MOEA2A_NODE_SIZE", "int", "0",
     "0: a node is a host. N: the ranks of each host form nodes of N consecutive ranks (emulated nodes, "
     "for tests and benchmarks of multi-node behaviour on one machine); 0..ranks, the same on every rank."},
    {"MOEA2A_HIERARCHICAL", "int", "-1",
     "MoE contexts whose ranks sit on several nodes (the node map: hosts, or MOEA2A_NODE_SIZE) can take the "
     "hierarchical path: a token crosses the network once per other node it reaches, to the rank there with the "
     "sender's index in its node, which relays it inside its node and sums that node's rows of it in the "
     "combine. -1 (default): where a node holds two or more ranks (with one rank per node nothing is saved); 1: "
     "also with one rank per node; 0: the flat path (a row per destination rank). Host and CUDA memory; the "
     "results are the same bits either way. Read at create; it takes every rank or none (one rank's flat choice "
     "makes every rank flat)."},
    {"MOEA2A_NUM_SMS", "int", "0",
     "SMs (thread blocks) each fused dispatch or combine kernel of the load/store path uses, 1..256, "
     "at most the GPU's SM count; moea2a_moe_config_t.num_sms overrides it. Every rank must use the same. "
     "0 (default): 32 where the context spans 4 or more ranks, 48 on fewer (MOEA2A_MOE_DEFAULT_SMS in "
     "moea2a.h). On 4 x H100 (hidden 7168, top-8 of 256) 32 SMs beat 48 at every size, dispatch + combine "
     "58.5 against 60.5 us at 128 tokens, 269.5 against 279.2 at 1024, 964.4 against 969.7 at 4096; on 2 of "
     "them 48 stays ahead by up to 3% at 512-4096 tokens (moea2a_perf --sms or MOEA2A_NUM_SMS measure it "
     "elsewhere)."},
    {"MOEA2A_DISPATCH_EVEN_TOKENS", "int", "16",
     "On the load/store path, the dispatch splits its copies evenly over the warps of its SMs (each SM routing "
     "its own tokens, no shared counter) while a rank sends at most this many tokens per SM, 1..64; past it, "
     "warps take the copies from a counter. Each rank decides by its own token count; the results are the "
     "same either way. 16 against 4 on 4 x H100 (48 SMs, hidden 7168, top-8 of 256; kernel time): 256 "
     "tokens 53.0 against 55.7 us, 512 84.5 against 85.8, 1024 the same (142.3 / 143.2); on 2 of them 256 "
     "tokens 22.6 against 25.5, 512 33.8 against 36.1; 32 and 64 cost 3% at 1024 tokens on 4 GPUs. Read at "
     "create."},
    {"MOEA2A_QUANT_OVERLAP", "int", "-1",
     "On the load/store path a large dispatch that quantizes payloads to FP8 can run the quantization "
     "alongside the dispatch kernel, on the SMs that kernel leaves, copying each chunk of tokens once it is "
     "quantized. -1 (default): where the context spans 2 or more GPUs (the dispatch bound by NVLink: 131 "
     "against 142 us at 4096 tokens on 2 x H200; on one GPU, bound by memory, it cost 17%); 1: always; 0: "
     "never (quantize first, then dispatch). Not for payloads MOEA2A_QUANT_IN_COPY quantizes inside the "
     "dispatch's copies. The same bits either way."},
    {"MOEA2A_QUANT_IN_COPY", "int", "-1",
     "On the load/store path, FP8 payloads sent quantized from bf16 or fp16 rows can be quantized by the "
     "dispatch kernel itself, inside its copies: each token read and quantized once, its codes and scales "
     "stored at every destination, with no quantize pass before the dispatch. 1: where the layout allows (an FP8 "
     "payload whose codes start a multiple of 512 bytes into a token's rows, as the first payload's do; not in "
     "copy-engine mode); 0: never (MOEA2A_QUANT_OVERLAP decides); -1 (default): as 1 where the context has 2 "
     "ranks and its kernels 48 SMs or more, else as 0. The dispatch is then one kernel launch (its receive half "
     "also finishes the FP8 scales). On 2 x H200 (48 SMs, kernel time) 13.8 / 16.2 / 44.7 / 120.1 us at 1 / 128 / "
     "1024 / 4096 tokens, against 15.6 / 18.4 / 50.6 / 124.4 quantizing alongside and 15.6 / 18.6 / 50.7 / 135.8 "
     "quantizing first; on 4 x H100 at 4096 tokens 312.3 against 292.6 alongside; with one rank on an H100 16% "
     "faster than quantizing first at 128 tokens, 2% slower at 4096, 25% slower at 24 SMs. The same bits either "
     "way. Read at create."},
    {"MOEA2A_CE_LANES", "int", "4",
     "Copy-engine mode (MOEA2A_MOE_COPY_ENGINE): a dispatch's or combine's copies of 4 MiB or more are cut "
     "into this many parts of equal bytes, each on its own stream (forked from the caller's and joined back), "
     "so that several copy engines move them; 1..8, 1 keeps one batch on the caller's stream. Read at create."},
    {"MOEA2A_GEMM_WGMMA", "int", "2",
     "2: on Hopper (sm_90) moea2a_expert_gemm runs every expert on the warpgroup MMA (wgmma), fed by TMA "
     "copies from warps of their own, where the library was built for arch 90 with CUDA 12 or later and TMA "
     "can describe the operands (expert-major rows, 16-byte aligned: moea2a_expert(3)); 1: the experts of "
     "more than 8 rows on wgmma with the copies issued by the MMA warps themselves (what runs where TMA "
     "cannot); 0: mma.sync, as on other GPUs (for comparison). The results agree within the documented "
     "bound either way, not bit for bit."},
    {"MOEA2A_TRANSPORT", "string", "",
     "Transports to use, in order of preference (e.g. \"nccl,ucx\"); \"^name\" excludes. "
     "Empty: every transport found, chosen by memory type."},
    {"MOEA2A_TRANSPORT_PATH", "string", MOEA2A_PKGLIBDIR,
     "Colon-separated directories searched for modules (transports libmoea2a-<name>.so, and the "
     "CUDA module libmoea2a-cuda.so) before the installed module directory."},
    {"MOEA2A_SOCKET_IFNAME", "string", "",
     "Network interface (prefix match, e.g. \"eth\" or \"lo\") used for the TCP rendezvous. "
     "Empty: the first non-loopback IPv4 interface that is up, else loopback."},
    {"MOEA2A_RANK", "int", "",
     "Rank of this process for moea2a_comm_init_env (else OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID)."},
    {"MOEA2A_NRANKS", "int", "",
     "Number of ranks for moea2a_comm_init_env (else OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)."},
    {"MOEA2A_ROOT_ADDR", "string", "",
     "host:port where rank 0 serves the rendezvous for moea2a_comm_init_env. Optional when all "
     "ranks are on one node under mpirun or srun (a port is derived from the job id)."},
    {"MOEA2A_KEY", "secret", "",
     "Shared secret that authenticates the ranks of moea2a_comm_init_env to each other (never sent: "
     "challenge-response with HMAC-SHA256). Every rank sets the same value. Unset (and no "
     "MOEA2A_KEY_FILE): the rendezvous is unauthenticated and one WARN says so."},
    {"MOEA2A_KEY_FILE", "string", "",
     "File whose contents are the shared secret of moea2a_comm_init_env, as launchers distribute it; "
     "must belong to the user and be readable by no one else (mode 0600)."},
};

/* What a value of each variable may be, beyond its type: an integer's range, an
 * enum's words (or a list's, for MOEA2A_DEBUG_SUBSYS), a number above a floor. The
 * readers use it (m2a_param_int and friends) and so does moea2a_param_check. */
typedef struct {
    const char *name;
    long lo, hi;        /* int: the range */
    const char *words;  /* enum: the values, space-separated; list: its items */
    int list;           /* comma-separated items of words, an optional leading ^ */
    int nocase;         /* words in any case */
} rule_t;

static const rule_t rules[] = {
    {"MOEA2A_DEBUG", 0, 0, "NONE WARN INFO TRACE", 0, 1},
    {"MOEA2A_DEBUG_SUBSYS", 0, 0, "INIT BOOTSTRAP TRANSPORT COLL MOE TOPO ALL", 1, 1},
    {"MOEA2A_NVLINK", 0, 1, NULL, 0},
    {"MOEA2A_SYMMETRIC_MEMORY", 0, 0, "auto transport cuda_ipc", 0},
    {"MOEA2A_NODE_SIZE", 0, 1 << 20, NULL, 0},
    {"MOEA2A_HIERARCHICAL", -1, 1, NULL, 0},
    {"MOEA2A_NUM_SMS", 0, 256, NULL, 0},
    {"MOEA2A_DISPATCH_EVEN_TOKENS", 1, 64, NULL, 0},
    {"MOEA2A_QUANT_OVERLAP", -1, 1, NULL, 0},
    {"MOEA2A_QUANT_IN_COPY", -1, 1, NULL, 0},
    {"MOEA2A_CE_LANES", 1, 8, NULL, 0},
    {"MOEA2A_GEMM_WGMMA", 0, 2, NULL, 0},
    {"MOEA2A_RANK", 0, (1 << 20) - 1, NULL, 0},
    {"MOEA2A_NRANKS", 1, 1 << 20, NULL, 0},
};

static const rule_t *rule_of(const char *name)
{
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (!strcmp(rules[i].name, name)) return &rules[i];
    return NULL;
}

/* Whether word (len bytes) is one of the space-separated words. */
static int one_of(const rule_t *r, const char *word, size_t len)
{
    for (const char *w = r->words; *w;) {
        size_t wl = strcspn(w, " ");
        if (wl == len && !(r->nocase ? strncasecmp(w, word, len) : strncmp(w, word, len))) return 1;
        w += wl + (w[wl] == ' ');
    }
    return 0;
}

moea2a_result_t moea2a_get_params(const moea2a_param_t **out, int *count)
{
    if (!out || !count)
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_params: params and count must not be NULL");
    *out = params;
    *count = (int)(sizeof(params) / sizeof(params[0]));
    return MOEA2A_SUCCESS;
}

static const moea2a_param_t *find_param(const char *name)
{
    for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++)
        if (!strcmp(params[i].name, name)) return &params[i];
    return NULL;
}

const char *m2a_param_str(const char *name)
{
    const moea2a_param_t *p = find_param(name);
#ifndef NDEBUG
    if (!p) abort(); /* every variable must be in the table */
#endif
    const char *v = getenv(name);
    if (v && *v) return v;
    return p ? p->default_value : "";
}

int m2a_parse_double(const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    while (*end == ' ' || *end == '\t') end++;
    if (errno || end == text || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int m2a_parse_long(const char *text, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    if (errno || end == text || *end) return -1;
    *out = v;
    return 0;
}

int m2a_param_why(const char *name, const char *value, char *why, size_t len)
{
    const moea2a_param_t *p = find_param(name);
    if (!p) return snprintf(why, len, "%s is not a moea2a variable (moea2a_info -c lists them)", name), -1;
    if (!value || !*value) return 0; /* unset or empty: the default */
    const rule_t *r = rule_of(name);
    long l;
    double d;
    if (!strcmp(p->type, "int")) {
        if (m2a_parse_long(value, &l)) return snprintf(why, len, "%s='%s' is not an integer", name, value), -1;
        if (r && (l < r->lo || l > r->hi))
            return snprintf(why, len, "%s=%ld is outside %ld..%ld", name, l, r->lo, r->hi), -1;
    } else if (!strcmp(p->type, "double")) {
        if (m2a_parse_double(value, &d)) return snprintf(why, len, "%s='%s' is not a finite number", name, value), -1;
        if (d <= 0) return snprintf(why, len, "%s=%g must be positive", name, d), -1;
    } else if (r && r->words && !r->list) {
        if (!one_of(r, value, strlen(value)))
            return snprintf(why, len, "%s='%s' is not one of: %s", name, value, r->words), -1;
    } else if (r && r->words) {
        const char *v = value + (*value == '^');
        for (const char *item = v;; item += strcspn(item, ",") + 1) {
            size_t il = strcspn(item, ",");
            if (!one_of(r, item, il))
                return snprintf(why, len, "%s='%s': '%.*s' is not one of: %s", name, value, (int)il, item, r->words), -1;
            if (!item[il]) break;
        }
    }
    return 0;
}

moea2a_result_t moea2a_param_check(const char *name, const char *value, char *why, size_t len)
{
    char own[256];
    if (!why || !len) why = own, len = sizeof(own);
    *why = 0;
    if (!name) return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_param_check: name is NULL");
    if (m2a_param_why(name, value, why, len))
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_param_check: %s", why);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_param_double(const char *name, double *out)
{
    const char *v = m2a_param_str(name);
    if (m2a_parse_double(v, out))
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "%s='%s' is not a number", name, v);
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_param_int(const char *name, long *out)
{
    const char *v = m2a_param_str(name);
    char why[160];
    if (m2a_parse_long(v, out))
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "%s='%s' is not an integer", name, v);
    if (m2a_param_why(name, v, why, sizeof(why))) return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "%s", why);
    return MOEA2A_SUCCESS;
}

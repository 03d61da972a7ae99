/* Workspace sizing: the documented formula (restated here term by term), replayed
 * over saved hwloc topologies (a 4-GPU NVLink node, a 2-socket 8-GPU node with two
 * NVLink islands and 4 NICs, a CPU-only node) so staging, NUMA placement and NIC
 * choice are checked without the hardware; and moea2a_info --workspace agreeing
 * with the API to the byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moea2a.h"
#include "tap.h"

static const char *srcdir(void)
{
    const char *s = getenv("top_srcdir");
    return s && *s ? s : ".";
}

static size_t A(size_t x) { return (x + 127) / 128 * 128; }

/* MOEA2A_HIERARCHICAL=1 set: the hierarchical path also on nodes of one rank */
static int hier_forced;

/* The most sources a rank relays for as their rail peer, in nodes of rpn consecutive
 * ranks (the last one smaller): rank r serves source s of another node when s's index
 * in its node, modulo the size of r's node, is r's index in its node. */
static size_t most_served(int ep, int rpn)
{
    size_t most = 0;
    for (int r = 0; r < ep; r++) {
        const int size = ep - r / rpn * rpn < rpn ? ep - r / rpn * rpn : rpn;
        size_t n = 0;
        for (int s = 0; s < ep; s++) n += s / rpn != r / rpn && (s % rpn) % size == r % rpn;
        most = n > most ? n : most;
    }
    return most;
}

/* The formula of moea2a_moe_workspace_size(3); N nodes of M ranks (N > 1, M > 1: the
 * hierarchical path, whose staging differs by memory; M the largest node, and on CUDA
 * memory S the most sources any rank serves, so that every rank's size is one). */
static void expected(const moea2a_moe_config_t *c, int ep, int staged, int lsa, int cuda, int N, int M,
                     size_t *workspace, size_t *staging, size_t *pinned)
{
    size_t n = (size_t)ep, cap = (size_t)c->max_tokens_per_rank, k = (size_t)c->top_k;
    int w = (c->flags & MOEA2A_MOE_CARRY_WEIGHTS) != 0;
    size_t aux = A(4 * n) + A(4 * n) + A(16 * n) + A(16 * n) + A(4 * cap * k) + A(4 * n * cap) +
                 A(4 * (size_t)c->num_experts) + A(4 * n) + A(4 * n) + A(24);
    if (lsa) aux += A(16 * n) + A(1024) + A(384) + A(256); /* load/store path control, a failed check's reason */
    if (cuda && (c->flags & MOEA2A_MOE_EXPERT_LOAD)) aux += A(8 * (size_t)c->num_experts); /* the load counts */
    size_t record = 4 * k + (w ? 4 * k : 0) + 4, es = 0, sum = aux;
    for (int i = 0; i < c->num_payloads; i++) {
        size_t s;
        moea2a_datatype_size(c->payloads[i].dtype, &s);
        sum += A(n * cap * s * c->payloads[i].elems_per_token);
        record += s * c->payloads[i].elems_per_token;
    }
    sum += A(n * cap * k * 4) + (w ? A(n * cap * k * 4) : 0);
    if (c->hidden) moea2a_datatype_size(c->combine_dtype, &es);
    sum += A(n * cap * c->hidden * es);
    /* CUDA memory: the general placement's holders, their counts, the dropped entries */
    if (cuda) sum += A(4 * (size_t)c->num_experts * n) + A(4 * ((size_t)c->num_experts + 1)) + A(24);
    *workspace = sum;
    /* a combine row on the wire: the dtype's, or FP8 codes and scales */
    const size_t nkb = c->hidden / 128, fp8 = c->combine_wire.format == MOEA2A_WIRE_FP8;
    const size_t cw = fp8 ? c->hidden + 4 * ((c->combine_wire.flags & MOEA2A_FP8_UE8M0) ? (nkb + 3) / 4 : nkb)
                          : c->hidden * es;
    *staging = A((size_t)staged * cap * record) + A((size_t)staged * cap * cw) + (fp8 && !lsa ? A(n * cap * cw) : 0);
    *pinned = 2 * A(4 * n) + 2 * A(16 * n) + A(16) + (lsa ? A(16) : 0);
    const size_t S = cuda ? most_served(ep, M) : (size_t)N - 1, m1 = (size_t)M - 1, nn = (size_t)N; /* S sources served */
    if (cuda && N > 1 && (M > 1 || hier_forced)) { /* the hierarchical path on CUDA memory */
        *staging += A(4 * cap * k) + A(4 * n) + A(4 * nn * cap * k) + A(4 * S * cap * k) + A(S * cap * record) +
                    A(S * m1 * cap * record) + A(S * m1 * cap * cw) + A(S * cap * cw);
        *pinned += A(4 * cap * k) * (2 + nn);
    } else if (N > 1 && M > 1) { /* on host memory: R ranks on other nodes, D = min(k, M) */
        const size_t R = n - (size_t)M, D = k < (size_t)M ? k : (size_t)M;
        *staging += A(S * cap * record) + A(D * S * cap * record) + A(R * cap * record) + A(R * cap * cw) +
                    A(D * S * cap * cw) + A(S * cap * cw);
    }
    if (lsa && (c->flags & MOEA2A_MOE_COPY_ENGINE)) { /* landing index and rows; send map and copy list */
        size_t d = k < n ? k : n;
        *staging += A(4 * n) + A((n - 1) * cap * c->hidden * es);
        *pinned += A(4 * cap * k) + A(24 * (cap * d * (size_t)c->num_payloads + n));
    }
}

static moea2a_moe_config_t deepseek(int cap, int weights, moea2a_datatype_t dt)
{
    moea2a_moe_config_t c = MOEA2A_MOE_CONFIG_INITIALIZER;
    c.num_experts = 256, c.top_k = 8, c.max_tokens_per_rank = cap;
    c.num_payloads = 1;
    c.payloads[0] = (moea2a_payload_desc_t){dt, dt == MOEA2A_NVFP4 ? 7168 / 2 : 7168};
    if (dt == MOEA2A_NVFP4) c.num_payloads = 2, c.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT8_E4M3, 7168 / 16};
    c.hidden = 7168, c.combine_dtype = MOEA2A_BFLOAT16;
    if (weights) c.flags |= MOEA2A_MOE_CARRY_WEIGHTS;
    return c;
}

typedef struct {
    const char *xml;
    int ep, rpn, rank;
    moea2a_memory_t mem;
    int staged, nvlink, numa, gpu;
    const char *nic;
} case_t;

static void check_case(const case_t *k, const moea2a_moe_config_t *c)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/topologies/%s", srcdir(), k->xml);
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.ep = k->ep, lay.ranks_per_node = k->rpn, lay.rank = k->rank, lay.topology_xml = path, lay.memory = k->mem;
    moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_result_t r = moea2a_moe_workspace_size_layout(&lay, c, &s);
    size_t ws, st, pin;
    /* the load/store path: CUDA, every peer NVLinked on this node, none staged */
    int cuda = k->mem == MOEA2A_MEMORY_CUDA;
    expected(c, k->ep, k->staged, cuda && k->staged == 0 && k->ep > 1, cuda, (k->ep + k->rpn - 1) / k->rpn, k->rpn,
             &ws, &st, &pin);
    int ok = r == MOEA2A_SUCCESS && s.staged_peers == k->staged && s.nvlink_peers == k->nvlink &&
             s.numa_node == k->numa && s.gpu == k->gpu && !strcmp(s.nic, k->nic) && s.workspace_bytes == ws &&
             s.staging_bytes == st && s.total_bytes == ws + st + (cuda ? pin : 0) &&
             s.device_bytes == (cuda ? ws + st : 0) && s.pinned_host_bytes == (cuda ? pin : 0) &&
             s.host_bytes == (cuda ? 0 : ws + st);
    tap_ok(ok, "%s ep %d x %d/node rank %d %s: staged %d (want %d), NVLink %d (%d), NUMA %d (%d), GPU %d (%d), NIC %s (%s), "
               "%zu + %zu bytes (formula %zu + %zu)",
           k->xml, k->ep, k->rpn, k->rank, cuda ? "cuda" : "host", s.staged_peers, k->staged, s.nvlink_peers, k->nvlink,
           s.numa_node, k->numa, s.gpu, k->gpu, s.nic, k->nic, s.workspace_bytes, s.staging_bytes, ws, st);
    if (r) tap_diag("%s", moea2a_last_error(NULL));
}

/* Sizing config c on CUDA memory in case k's layout is MOEA2A_ERR_UNAVAILABLE, its
 * message naming what. */
static int refused_on_cuda(const case_t *k, const moea2a_moe_config_t *c, const char *what)
{
    char xml[1024];
    snprintf(xml, sizeof(xml), "%s/tests/topologies/%s", srcdir(), k->xml);
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.ep = k->ep, lay.ranks_per_node = k->rpn, lay.topology_xml = xml, lay.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    return moea2a_moe_workspace_size_layout(&lay, c, &s) == MOEA2A_ERR_UNAVAILABLE &&
           strstr(moea2a_last_error(NULL), what) != NULL;
}

static void test_topologies(void)
{
    moea2a_moe_config_t c = deepseek(8192, 0, MOEA2A_BFLOAT16);
    static const case_t cases[] = {
        /* Peers are staged unless the load/store path serves them all: CUDA memory,
         * one node, every pair NVLinked. */
        /* 4 GPUs, all pairs NVLinked: the load/store path, nothing staged; across nodes
         * (CUDA memory) every peer, and the hierarchical path's relay */
        {"4gpu-nvlink.xml", 4, 4, 1, MOEA2A_MEMORY_CUDA, 0, 3, 0, 1, "mlx5_0"},
        {"4gpu-nvlink.xml", 8, 4, 1, MOEA2A_MEMORY_CUDA, 7, 3, 0, 1, "mlx5_0"},
        {"4gpu-nvlink.xml", 8, 4, 6, MOEA2A_MEMORY_CUDA, 7, 3, 1, 2, "mlx5_1"},
        /* host memory: no load/store peers; ranks spread over the sockets; across
         * nodes the hierarchical path stages the node's other ranks and one rail peer
         * per other node */
        {"4gpu-nvlink.xml", 4, 4, 3, MOEA2A_MEMORY_HOST, 3, 0, 1, -1, "mlx5_1"},
        {"4gpu-nvlink.xml", 8, 4, 5, MOEA2A_MEMORY_HOST, 4, 0, 0, -1, "mlx5_0"},
        {"4gpu-nvlink.xml", 12, 4, 2, MOEA2A_MEMORY_HOST, 5, 0, 1, -1, "mlx5_1"},
        /* 8 GPUs in two NVLink islands: 3 NVLink peers each, NICs shared two GPUs apiece */
        {"8gpu-2socket-4nic.xml", 8, 8, 0, MOEA2A_MEMORY_CUDA, 7, 3, 0, 0, "mlx5_0"},
        {"8gpu-2socket-4nic.xml", 8, 8, 5, MOEA2A_MEMORY_CUDA, 7, 3, 1, 5, "mlx5_2"},
        {"8gpu-2socket-4nic.xml", 16, 8, 3, MOEA2A_MEMORY_CUDA, 15, 3, 0, 3, "mlx5_1"},
        {"8gpu-2socket-4nic.xml", 32, 8, 31, MOEA2A_MEMORY_CUDA, 31, 3, 1, 7, "mlx5_3"},
        /* CPU-only node */
        {"cpu-only.xml", 4, 4, 2, MOEA2A_MEMORY_HOST, 3, 0, 0, -1, "mlx5_0"},
        {"cpu-only.xml", 1, 1, 0, MOEA2A_MEMORY_HOST, 0, 0, 0, -1, "mlx5_0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) check_case(&cases[i], &c);

    /* The same on other configs: weights, NVFP4 payload + scales, tiny and odd shapes. */
    moea2a_moe_config_t w = deepseek(4096, 1, MOEA2A_NVFP4);
    check_case(&cases[1], &w);
    moea2a_moe_config_t odd = MOEA2A_MOE_CONFIG_INITIALIZER;
    odd.num_experts = 7, odd.top_k = 22, odd.max_tokens_per_rank = 3, odd.num_payloads = 3;
    odd.payloads[0] = (moea2a_payload_desc_t){MOEA2A_INT8, 13};
    odd.payloads[1] = (moea2a_payload_desc_t){MOEA2A_FLOAT16, 7};
    odd.payloads[2] = (moea2a_payload_desc_t){MOEA2A_INT64, 1};
    check_case(&cases[8], &odd);
    /* the FP8 combine wire on host memory, one node and across nodes (hierarchical), both
     * scale kinds; on the load/store path (quantized in place: no staging of its own), the
     * generic one and the hierarchical CUDA path (its relayed rows and partials on the wire) */
    moea2a_moe_config_t cw = deepseek(4096, 1, MOEA2A_BFLOAT16);
    cw.combine_wire.format = MOEA2A_WIRE_FP8;
    check_case(&cases[3], &cw);
    check_case(&cases[4], &cw);
    cw.combine_wire.flags = MOEA2A_FP8_UE8M0;
    check_case(&cases[5], &cw);
    check_case(&cases[0], &cw);
    check_case(&cases[1], &cw); /* the hierarchical CUDA path */
    check_case(&cases[6], &cw); /* the generic CUDA path: the rows quantized into staging */
    const case_t one_each = {"4gpu-nvlink.xml", 2, 1, 0, MOEA2A_MEMORY_CUDA, 1, 0, 0, 0, "mlx5_0"};
    setenv("MOEA2A_HIERARCHICAL", "1", 1); /* nodes of one rank: the hierarchical path only when asked for */
    hier_forced = 1;
    check_case(&one_each, &cw);
    cw.combine_wire.flags = 0;
    check_case(&one_each, &cw);
    cw.combine_wire.flags = MOEA2A_FP8_UE8M0;
    hier_forced = 0;
    unsetenv("MOEA2A_HIERARCHICAL");
    cw.hidden = 98304 + 128;
    tap_ok(refused_on_cuda(&cases[0], &cw, "hidden=98432"),
           "the FP8 combine wire on the load/store path past its hidden is refused at sizing: %s", moea2a_last_error(NULL));
    cw.hidden = 4096, cw.flags |= MOEA2A_MOE_COPY_ENGINE;
    tap_ok(refused_on_cuda(&cases[0], &cw, "copy-engine"),
           "the FP8 combine wire in copy-engine mode is refused at sizing: %s", moea2a_last_error(NULL));
    /* the experts' load counted on the device: its counters on CUDA memory, nothing on host memory */
    moea2a_moe_config_t el = deepseek(4096, 1, MOEA2A_BFLOAT16);
    el.flags |= MOEA2A_MOE_EXPERT_LOAD;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) check_case(&cases[i], &el);
    /* copy-engine mode: its landing and host-side terms on the load/store path; refused elsewhere */
    moea2a_moe_config_t ce = deepseek(4096, 1, MOEA2A_BFLOAT16);
    ce.flags |= MOEA2A_MOE_COPY_ENGINE;
    check_case(&cases[0], &ce);
    tap_ok(refused_on_cuda(&cases[1], &ce, ""),
           "copy-engine mode across two nodes (no load/store path) is refused at sizing: %s", moea2a_last_error(NULL));

    /* CUDA memory on a node without GPUs is an error, not a silent host plan. */
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/topologies/cpu-only.xml", srcdir());
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.ep = 2, lay.topology_xml = path, lay.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    tap_ok(moea2a_moe_workspace_size_layout(&lay, &c, &s) == MOEA2A_ERR_INVALID_ARGUMENT, "CUDA sizing on a CPU-only topology is refused");
    lay.topology_xml = "/nonexistent.xml";
    tap_ok(moea2a_moe_workspace_size_layout(&lay, &c, &s) == MOEA2A_ERR_INVALID_ARGUMENT, "a missing XML file is an error");
    lay.topology_xml = path, lay.memory = MOEA2A_MEMORY_HOST, lay.rank = 2;
    tap_ok(moea2a_moe_workspace_size_layout(&lay, &c, &s) == MOEA2A_ERR_INVALID_ARGUMENT, "rank outside ep is refused");
    lay.rank = 0;
    s.size = 8;
    tap_ok(moea2a_moe_workspace_size_layout(&lay, &c, &s) == MOEA2A_ERR_INVALID_ARGUMENT, "sizes without its size field is refused");
    moea2a_moe_config_t bad = c;
    bad.max_tokens_per_rank = 0;
    s.size = sizeof(s);
    tap_ok(moea2a_moe_workspace_size_layout(&lay, &bad, &s) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "max_tokens_per_rank"),
           "cap 0 is refused with a message naming it");
}

/* The ep-once rule: doubling ep doubles the per-rank receive arrays, not more. */
static void test_ep_once(void)
{
    moea2a_moe_config_t c = deepseek(1024, 0, MOEA2A_BFLOAT16);
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/topologies/8gpu-2socket-4nic.xml", srcdir());
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.ranks_per_node = 8, lay.topology_xml = path, lay.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_workspace_sizes_t a = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER, b = a;
    lay.ep = 16;
    moea2a_moe_workspace_size_layout(&lay, &c, &a);
    lay.ep = 32;
    moea2a_moe_workspace_size_layout(&lay, &c, &b);
    tap_ok(b.payload_bytes[0] == 2 * a.payload_bytes[0] && b.ids_bytes == 2 * a.ids_bytes &&
               b.combine_bytes == 2 * a.combine_bytes,
           "receive arrays scale with ep once (ep 16: %zu, ep 32: %zu payload bytes)", a.payload_bytes[0], b.payload_bytes[0]);
    tap_ok(a.payload_bytes[0] == 16u * 1024 * 7168 * 2, "bf16 payload is ep x cap x 7168 x 2 bytes exactly");
}

/* moea2a_info --workspace KEYS (its topology= given) against the API for the same
 * context: its last line is the API's total. */
static void info_matches(const char *keys, const char *xml, int ep, int rpn, int rank, const moea2a_moe_config_t *c)
{
    const char *b = getenv("top_builddir");
    char cmd[2048], line[512], last[512] = "", path[1024];
    snprintf(path, sizeof(path), "%s/tests/topologies/%s", srcdir(), xml);
    snprintf(cmd, sizeof(cmd), "%s/tools/moea2a_info --workspace %s,topology=%s 2>&1", b && *b ? b : ".", keys, path);
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof(line), f)) snprintf(last, sizeof(last), "%s", line);
    int rc = f ? pclose(f) : -1;
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.ep = ep, lay.ranks_per_node = rpn, lay.rank = rank, lay.topology_xml = path, lay.memory = MOEA2A_MEMORY_CUDA;
    moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_moe_workspace_size_layout(&lay, c, &s);
    char want[64];
    snprintf(want, sizeof(want), "total %zu bytes\n", s.total_bytes);
    tap_ok(rc == 0 && !strcmp(last, want), "moea2a_info --workspace %s ends with '%.*s' (got '%.*s')", keys,
           (int)strlen(want) - 1, want, (int)strcspn(last, "\n"), last);
}

/* moea2a_info --workspace prints the breakdown and ends with the API's total. */
static void test_info_tool(void)
{
    const char *b = getenv("top_builddir");
    char cmd[2048], line[512];
    moea2a_moe_config_t c = deepseek(8192, 1, MOEA2A_BFLOAT16);
    info_matches("ep=16,hidden=7168,topk=8,experts=256,cap=8192,dtype=bf16,weights=1,ranks_per_node=8,rank=3,"
                 "memory=cuda", "8gpu-2socket-4nic.xml", 16, 8, 3, &c);
    moea2a_moe_config_t ce = deepseek(4096, 0, MOEA2A_BFLOAT16);
    ce.flags |= MOEA2A_MOE_COPY_ENGINE;
    info_matches("ep=4,hidden=7168,topk=8,experts=256,cap=4096,dtype=bf16,ranks_per_node=4,rank=1,memory=cuda,"
                 "engine=ce", "4gpu-nvlink.xml", 4, 4, 1, &ce);
    FILE *f;
    snprintf(cmd, sizeof(cmd), "%s/tools/moea2a_info --workspace ep=32,hidden=7168,topk=8,cap=8192,dtype=bf16,mem=80G >/dev/null 2>&1; echo $?",
             b && *b ? b : ".");
    f = popen(cmd, "r");
    int status = -1;
    if (f && fgets(line, sizeof(line), f)) status = atoi(line);
    if (f) pclose(f);
    tap_ok(status == 0, "moea2a_info --workspace with mem=80G runs (status %d)", status);
}

/* Every k-subset of E experts in lexicographic order: advances idx, 0 after the last. */
static int next_subset(int *idx, int k, int E)
{
    int i = k - 1;
    while (i >= 0 && idx[i] == E - k + i) i--;
    if (i < 0) return 0;
    idx[i]++;
    for (int j = i + 1; j < k; j++) idx[j] = idx[j - 1] + 1;
    return 1;
}

/* moea2a_info's network model against an enumeration of every routing: experts placed
 * contiguously (uneven: E % ep != 0), nodes of rpn ranks (the last one short), the
 * source on the second node; the expected distinct ranks and nodes on other nodes. */
static void test_network_model(void)
{
    enum { E = 13, K = 3, EP = 6, RPN = 4, ME = 5 };
    int owner[E], e = 0;
    for (int r = 0; r < EP; r++) /* ranks 0..E%EP-1 hold one more */
        for (int j = 0; j < E / EP + (r < E % EP); j++) owner[e++] = r;
    double ranks = 0, nodes = 0, subsets = 0;
    int idx[K] = {0, 1, 2};
    do {
        int seen_rank[EP] = {0}, seen_node[EP] = {0};
        for (int j = 0; j < K; j++) {
            int r = owner[idx[j]], n = r / RPN;
            if (n == ME / RPN) continue;
            ranks += !seen_rank[r], nodes += !seen_node[n];
            seen_rank[r] = seen_node[n] = 1;
        }
        subsets++;
    } while (next_subset(idx, K, E));
    ranks /= subsets, nodes /= subsets;
    const char *b = getenv("top_builddir");
    char cmd[1024], line[1024];
    snprintf(cmd, sizeof(cmd), "%s/tools/moea2a_info --workspace ep=%d,ranks_per_node=%d,rank=%d,experts=%d,topk=%d,"
             "hidden=64,cap=16,memory=host 2>&1", b && *b ? b : ".", EP, RPN, ME, E, K);
    FILE *f = popen(cmd, "r");
    double flat = -1, aware = -1;
    while (f && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "rows to other nodes per token: flat ");
        if (p) sscanf(p, "rows to other nodes per token: flat %lf, node-aware %lf", &flat, &aware);
    }
    if (f) pclose(f);
    tap_ok(flat > 0 && aware > 0 && (flat - ranks) * (flat - ranks) < 1e-8 && (aware - nodes) * (aware - nodes) < 1e-8,
           "moea2a_info's network model: flat %.4f, node-aware %.4f rows per token; enumeration of %.0f routings: "
           "%.4f, %.4f",
           flat, aware, subsets, ranks, nodes);
}

/* Nodes of unequal size on CUDA memory (6 ranks in nodes of 4 and 2: rank 4 serves 2
 * sources, ranks 2 and 3 none): every rank's workspace and staging are the formula's
 * with the largest node and the most sources served, the same on every rank (the NCCL
 * window of the load/store stage takes one size from every rank). */
static void test_unequal_nodes(void)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/tests/topologies/4gpu-nvlink.xml", srcdir());
    const moea2a_moe_config_t c = deepseek(1024, 1, MOEA2A_BFLOAT16);
    size_t ws, st, pin;
    expected(&c, 6, 5, 0, 1, 2, 4, &ws, &st, &pin);
    int same = 1;
    size_t got_ws[6] = {0}, got_st[6] = {0};
    for (int rank = 0; rank < 6; rank++) {
        moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
        lay.ep = 6, lay.ranks_per_node = 4, lay.rank = rank, lay.topology_xml = path, lay.memory = MOEA2A_MEMORY_CUDA;
        moea2a_moe_workspace_sizes_t s = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
        same &= moea2a_moe_workspace_size_layout(&lay, &c, &s) == MOEA2A_SUCCESS && s.workspace_bytes == ws &&
                s.staging_bytes == st;
        got_ws[rank] = s.workspace_bytes, got_st[rank] = s.staging_bytes;
    }
    tap_ok(same && most_served(6, 4) == 2, "CUDA memory, 6 ranks in nodes of 4 and 2: every rank %zu + %zu bytes, the "
           "formula with the largest node and the most sources served (%zu): ranks 3 and 5 %zu + %zu, %zu + %zu",
           ws, st, most_served(6, 4), got_ws[3], got_st[3], got_ws[5], got_st[5]);
}

int main(void)
{
    test_topologies();
    test_unequal_nodes();
    test_ep_once();
    test_info_tool();
    test_network_model();
    return tap_done();
}

/* moea2a_info: what this moea2a is built with, which transports load, which
 * variables it reads, and what the machine's topology looks like to it. */
#include <getopt.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info_workspace.h"
#include "moea2a.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moea2a_info [options]\n"
            "  (no option)          version, build, transports and topology\n"
            "  -c, --config         every MOEA2A_* environment variable: default, current value, help\n"
            "  -t, --topology[=XML] topology summary (of this machine, or of an hwloc XML file)\n"
            "  -T, --transports     transport modules found and whether they load\n"
            "  -w, --workspace SPEC MoE workspace per rank, offline; SPEC is KEY=VALUE,... with ep, cap,\n"
            "                       hidden, topk, experts, dtype (bf16, nvfp4, ...), combine, weights=0|1,\n"
            "                       memory=cuda|host, ranks_per_node, rank, topology=FILE.xml, mem=SIZE,\n"
            "                       wire=fp8|fp8-ue8m0|nvfp4 (the payload quantized on dispatch),\n"
            "                       combine_wire=fp8|fp8-ue8m0 (the combine's rows as FP8: host memory,\n"
            "                       or the load/store and generic paths in CUDA memory)\n"
            "  -v, --version        version only\n"
            "  -h, --help           this text\n"
            "exit status: 0 ok, 1 error (or a variable set to a value moea2a refuses), 2 usage,\n"
            "3 the workspace does not fit in mem=SIZE\n");
}

static void print_version(void)
{
    int ma, mi, pa;
    moea2a_get_version(&ma, &mi, &pa);
    printf("moea2a %d.%d.%d (headers %s)\n", ma, mi, pa, MOEA2A_VERSION_STRING);
}

/* Exit status 1 when a variable is set to a value moea2a refuses. */
static int print_config(void)
{
    const moea2a_param_t *p;
    int n, bad = 0;
    if (moea2a_get_params(&p, &n)) return 1;
    /* ucx_info -c style: NAME=value (the value in effect: the environment's, else the
     * default), the help and the type as comments above it; a secret shows no value.
     * A value moea2a would refuse gets an INVALID line above it (a comment, so the
     * output can still be sourced). */
    printf("# %d environment variables; the value in effect (environment, else default)\n", n);
    for (int i = 0; i < n; i++) {
        const char *cur = getenv(p[i].name), *secret = !strcmp(p[i].type, "secret") ? "" : NULL;
        char why[256] = "";
        const int invalid = !secret && moea2a_param_check(p[i].name, cur, why, sizeof(why)) != MOEA2A_SUCCESS;
        printf("#\n# %s\n# (%s; default %s%s)\n", p[i].help, p[i].type,
               *p[i].default_value ? p[i].default_value : "empty",
               secret ? (cur ? "; set, never shown" : "; unset") : cur ? "; set in the environment" : "");
        if (invalid) printf("# INVALID: %s\n", why), fprintf(stderr, "moea2a_info: %s\n", why), bad++;
        printf("%s=%s\n", p[i].name, secret ? secret : cur ? cur : p[i].default_value);
    }
    return bad ? 1 : 0;
}

static int print_transports(void)
{
    moea2a_transport_info_t t[16];
    int n;
    if (moea2a_get_transports(t, 16, &n)) {
        fprintf(stderr, "moea2a_info: %s\n", moea2a_last_error(NULL));
        return 1;
    }
    printf("transports: %d found\n", n);
    for (int i = 0; i < n && i < 16; i++)
        printf("  %-6s %-9s %s\n         %s\n", t[i].name, t[i].loadable ? "loadable" : "BROKEN", t[i].path, t[i].detail);
    if (n == 0) printf("  (none: set MOEA2A_TRANSPORT_PATH to the directory holding libmoea2a-<name>.so)\n");
    return 0;
}

/* The NUMA node(s) nearest an I/O object: those of its first non-I/O ancestor. */
static void locality(hwloc_topology_t topo, hwloc_obj_t obj, char *buf, size_t len)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(topo, obj);
    if (!a || !a->nodeset || hwloc_bitmap_iszero(a->nodeset) ||
        hwloc_bitmap_isequal(a->nodeset, hwloc_topology_get_topology_nodeset(topo))) {
        snprintf(buf, len, "all NUMA nodes");
        return;
    }
    char *s;
    hwloc_bitmap_list_asprintf(&s, a->nodeset);
    snprintf(buf, len, "NUMA %s", s);
    free(s);
}

static int print_topology(const char *xml)
{
    hwloc_topology_t topo;
    hwloc_topology_init(&topo);
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml && hwloc_topology_set_xml(topo, xml)) {
        fprintf(stderr, "moea2a_info: cannot read hwloc XML '%s'\n", xml);
        hwloc_topology_destroy(topo);
        return 1;
    }
    if (hwloc_topology_load(topo)) {
        fprintf(stderr, "moea2a_info: hwloc could not load the topology\n");
        hwloc_topology_destroy(topo);
        return 1;
    }
    int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    printf("topology%s%s: %d package(s), %d core(s), %d NUMA node(s)\n", xml ? " of " : "", xml ? xml : "", packages,
           cores, numa);
    for (int i = 0; i < numa; i++) {
        hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        printf("  NUMA %u: %.1f GiB\n", n->os_index, (double)n->attr->numanode.local_memory / (1 << 30));
    }
    int gpus = 0, nics = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(topo, o));) {
        hwloc_obj_osdev_type_t t = o->attr->osdev.type;
        const char *kind = NULL;
        if (t == HWLOC_OBJ_OSDEV_GPU || t == HWLOC_OBJ_OSDEV_COPROC) {
            /* CUDA devices show up as cudaN (COPROC) and as the NVML/DRM device (GPU):
             * count the CUDA ones where present. */
            if (o->subtype && strcmp(o->subtype, "CUDA")) continue;
            if (!o->subtype && t == HWLOC_OBJ_OSDEV_GPU) continue;
            kind = "GPU";
            gpus++;
        } else if (t == HWLOC_OBJ_OSDEV_OPENFABRICS || t == HWLOC_OBJ_OSDEV_NETWORK) {
            kind = "NIC";
            nics++;
        }
        if (!kind) continue;
        char where[64];
        locality(topo, o, where, sizeof(where));
        hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : NULL;
        char bus[32] = "";
        if (pci)
            snprintf(bus, sizeof(bus), " %04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                     pci->attr->pcidev.dev, pci->attr->pcidev.func);
        printf("  %s %-10s%s near %s\n", kind, o->name, bus, where);
    }
    if (!gpus) printf("  no GPUs (CUDA memory needs a GPU; host memory works everywhere)\n");
    if (!nics) printf("  no NICs listed (loopback and shared memory only)\n");
    hwloc_topology_destroy(topo);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", no_argument, 0, 'c'},     {"topology", optional_argument, 0, 't'},
                                         {"transports", no_argument, 0, 'T'}, {"version", no_argument, 0, 'v'},
                                         {"workspace", required_argument, 0, 'w'},
                                         {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    /* every option is read (and a stray argument refused) before anything runs */
    struct {
        int what;
        const char *arg;
    } todo[32];
    int c, ntodo = 0, rc = 0;
    while ((c = getopt_long(argc, argv, "ct::Tw:vh", opts, NULL)) != -1) {
        switch (c) {
        case 't': /* -t FILE and --topology FILE as well as -tFILE and --topology=FILE */
            if (!optarg && optind < argc && argv[optind][0] != '-') optarg = argv[optind++];
            /* fall through */
        case 'c': case 'T': case 'w': case 'v':
            if (ntodo == (int)(sizeof(todo) / sizeof(todo[0]))) {
                fprintf(stderr, "moea2a_info: too many options\n");
                return 2;
            }
            todo[ntodo].what = c, todo[ntodo++].arg = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moea2a_info: '%s' is not an option (moea2a_info --help lists them)\n", argv[optind]);
        return 2;
    }
    for (int i = 0; i < ntodo; i++) {
        int r = 0;
        switch (todo[i].what) {
        case 'c': r = print_config(); break;
        case 't': r = print_topology(todo[i].arg); break;
        case 'T': r = print_transports(); break;
        case 'w': r = info_workspace(todo[i].arg); break;
        default: print_version(); break;
        }
        rc = r > rc ? r : rc;
    }
    if (!ntodo) {
        print_version();
        printf("build: %s\n", moea2a_get_build_config());
        rc |= print_transports();
        rc |= print_topology(NULL);
        printf("(moea2a_info -c lists the environment variables)\n");
    }
    return rc;
}

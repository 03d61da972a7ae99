#include <hwloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "wireup/topo.h"

/* The NUMA node (OS index) an object is attached to: the first of its nearest
 * non-I/O ancestor's nodeset; -1 when that ancestor spans every node. */
static int numa_of(hwloc_topology_t t, hwloc_obj_t obj)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, obj);
    if (!a || !a->nodeset || hwloc_bitmap_iszero(a->nodeset)) return -1;
    if (hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) > 1 &&
        hwloc_bitmap_isequal(a->nodeset, hwloc_topology_get_topology_nodeset(t)))
        return -1;
    return hwloc_bitmap_first(a->nodeset);
}

static int is_nvidia_gpu(hwloc_obj_t pci)
{
    unsigned cls = pci->attr->pcidev.class_id;
    return pci->attr->pcidev.vendor_id == 0x10de && (cls == 0x0300 || cls == 0x0302);
}

static int gpu_index_of(hwloc_obj_t *gpus, int n, hwloc_obj_t obj)
{
    while (obj && obj->type != HWLOC_OBJ_PCI_DEVICE) obj = obj->parent;
    for (int i = 0; i < n; i++)
        if (gpus[i] == obj) return i;
    return -1;
}

static void read_nvlink(hwloc_topology_t t, hwloc_obj_t *gpus, m2a_topo_t *topo)
{
    unsigned nr = 1;
    struct hwloc_distances_s *d = NULL;
    if (hwloc_distances_get_by_name(t, "NVLinkBandwidth", &nr, &d, 0) || nr == 0) return;
    topo->has_nvlink_info = 1;
    for (unsigned i = 0; i < d->nbobjs; i++)
        for (unsigned j = 0; j < d->nbobjs; j++) {
            int gi = gpu_index_of(gpus, topo->ngpus, d->objs[i]), gj = gpu_index_of(gpus, topo->ngpus, d->objs[j]);
            if (gi >= 0 && gj >= 0 && gi != gj && d->values[i * d->nbobjs + j] > 0) topo->nvlink[gi][gj] = 1;
        }
    hwloc_distances_release(t, d);
}

static moea2a_result_t load(const char *xml, m2a_topo_t *topo);

/* This machine's topology does not change while the process runs: loaded once
 * (hwloc's discovery takes milliseconds, and its plugins keep a little memory per
 * load that every context re-create would add to). */
static pthread_once_t machine_once = PTHREAD_ONCE_INIT;
static m2a_topo_t machine;
static moea2a_result_t machine_result;
static char machine_error[256];

static void load_machine(void)
{
    machine_result = load(NULL, &machine);
    if (machine_result != MOEA2A_SUCCESS) snprintf(machine_error, sizeof(machine_error), "%s", m2a_thread_error());
}

moea2a_result_t m2a_topo_load(const char *xml, m2a_topo_t *topo)
{
    if (xml) return load(xml, topo);
    pthread_once(&machine_once, load_machine);
    if (machine_result != MOEA2A_SUCCESS) return m2a_fail(machine_result, "%s", machine_error);
    *topo = machine;
    return MOEA2A_SUCCESS;
}

static moea2a_result_t load(const char *xml, m2a_topo_t *topo)
{
    memset(topo, 0, sizeof(*topo));
    hwloc_topology_t t;
    if (hwloc_topology_init(&t)) return m2a_fail(MOEA2A_ERR_SYSTEM, "hwloc_topology_init failed");
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml && hwloc_topology_set_xml(t, xml)) {
        hwloc_topology_destroy(t);
        return m2a_fail(MOEA2A_ERR_INVALID_ARGUMENT, "cannot read hwloc XML topology '%s'", xml);
    }
    if (hwloc_topology_load(t)) {
        hwloc_topology_destroy(t);
        return m2a_fail(MOEA2A_ERR_SYSTEM, "hwloc could not load %s", xml ? xml : "this machine's topology");
    }
    topo->nnuma = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    hwloc_obj_t gpus[M2A_TOPO_MAX_GPUS];
    /* PCI devices come in bus order, which is CUDA's order with
     * CUDA_DEVICE_ORDER=PCI_BUS_ID and, for identical GPUs, its default order too. */
    for (hwloc_obj_t pci = NULL; (pci = hwloc_get_next_pcidev(t, pci));) {
        if (is_nvidia_gpu(pci) && topo->ngpus < M2A_TOPO_MAX_GPUS) {
            gpus[topo->ngpus] = pci;
            topo->gpu_numa[topo->ngpus++] = numa_of(t, pci);
            continue;
        }
        /* A NIC: a PCI device with an OpenFabrics device (preferred name) or a network one. */
        const char *name = NULL;
        for (hwloc_obj_t c = pci->io_first_child; c; c = c->next_sibling) {
            if (c->type != HWLOC_OBJ_OS_DEVICE) continue;
            if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) name = c->name;
            else if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && !name) name = c->name;
        }
        if (name && topo->nnics < M2A_TOPO_MAX_NICS) {
            snprintf(topo->nic_name[topo->nnics], sizeof(topo->nic_name[0]), "%s", name);
            topo->nic_numa[topo->nnics++] = numa_of(t, pci);
        }
    }
    read_nvlink(t, gpus, topo);
    hwloc_topology_destroy(t);
    M2A_INFO(M2A_SUBSYS_TOPO, "topology %s: %d NUMA node(s), %d GPU(s), %d NIC(s), NVLink %s", xml ? xml : "(this machine)",
             topo->nnuma, topo->ngpus, topo->nnics, topo->has_nvlink_info ? "reported" : "unknown");
    return MOEA2A_SUCCESS;
}

m2a_topo_place_t m2a_topo_place(const m2a_topo_t *topo, int local_rank, int ranks_per_node, int use_gpu)
{
    m2a_topo_place_t p = {-1, -1, -1};
    int per = ranks_per_node > 0 ? ranks_per_node : 1;
    int pos = 0, sharing = 1; /* this rank's position among the devices (or ranks) of its NUMA node */
    if (use_gpu && topo->ngpus > 0) {
        p.gpu = local_rank % topo->ngpus;
        p.numa = topo->gpu_numa[p.gpu];
        sharing = 0;
        for (int g = 0; g < topo->ngpus; g++)
            if (topo->gpu_numa[g] == p.numa) pos += g < p.gpu, sharing++;
    } else if (topo->nnuma > 0) {
        p.numa = (int)((long)local_rank * topo->nnuma / per) % topo->nnuma;
        sharing = 0;
        for (int r = 0; r < per; r++)
            if ((int)((long)r * topo->nnuma / per) % topo->nnuma == p.numa) pos += r < local_rank, sharing++;
    }
    /* NICs on the same NUMA node, shared out in blocks (GPUs 0-1 on the first NIC,
     * 2-3 on the second, ...); with none there, all NICs round robin. */
    int cand[M2A_TOPO_MAX_NICS], ncand = 0;
    for (int i = 0; i < topo->nnics; i++)
        if (topo->nic_numa[i] == p.numa || topo->nic_numa[i] < 0) cand[ncand++] = i;
    if (ncand > 0) p.nic = cand[(long)pos * ncand / (sharing > 0 ? sharing : 1)];
    else if (topo->nnics > 0) p.nic = local_rank % topo->nnics;
    if (p.numa < 0 && p.nic >= 0) p.numa = topo->nic_numa[p.nic];
    return p;
}

/* One live topology per process, for memory binding. */
static hwloc_topology_t live;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void load_live(void)
{
    if (hwloc_topology_init(&live) || hwloc_topology_load(live)) live = NULL;
}

void *m2a_topo_alloc(size_t bytes, int numa)
{
    pthread_once(&live_once, load_live);
    if (!bytes) return NULL;
    if (live && numa >= 0) {
        hwloc_bitmap_t set = hwloc_bitmap_alloc();
        hwloc_bitmap_only(set, (unsigned)numa);
        void *p = hwloc_alloc_membind(live, bytes, set, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
        hwloc_bitmap_free(set);
        if (p) return p;
        M2A_INFO(M2A_SUBSYS_TOPO, "could not bind %zu bytes to NUMA node %d; using unbound memory", bytes, numa);
    }
    return live ? hwloc_alloc(live, bytes) : malloc(bytes);
}

void m2a_topo_free(void *ptr, size_t bytes)
{
    if (!ptr) return;
    if (live) hwloc_free(live, ptr, bytes);
    else free(ptr);
}

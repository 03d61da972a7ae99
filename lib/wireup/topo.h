/* What moea2a needs to know about a node, read through hwloc from this machine or
 * from a saved XML topology: NUMA nodes, GPUs (in CUDA's PCI order) and their NUMA
 * node, NICs and theirs, and which GPU pairs NVLink joins. */
#ifndef M2A_TOPO_H
#define M2A_TOPO_H
#include "moea2a.h"

#define M2A_TOPO_MAX_GPUS 64
#define M2A_TOPO_MAX_NICS 32

typedef struct {
    int nnuma;
    int ngpus;
    int gpu_numa[M2A_TOPO_MAX_GPUS];
    int nnics;
    int nic_numa[M2A_TOPO_MAX_NICS];
    char nic_name[M2A_TOPO_MAX_NICS][32];
    int has_nvlink_info; /* hwloc reported an NVLinkBandwidth matrix */
    unsigned char nvlink[M2A_TOPO_MAX_GPUS][M2A_TOPO_MAX_GPUS];
} m2a_topo_t;

/* xml == NULL: this machine. */
moea2a_result_t m2a_topo_load(const char *xml, m2a_topo_t *topo);

/* Where one rank sits on its node. */
typedef struct {
    int gpu;  /* -1: none */
    int numa; /* node for its host memory */
    int nic;  /* index into nic_name; -1: none */
} m2a_topo_place_t;

/* local_rank of ranks_per_node on a node of this topology. GPUs are taken in order
 * (local rank i uses GPU i mod ngpus); host-only ranks spread over NUMA nodes in
 * blocks; NICs of the same NUMA node are shared out among its GPUs (or ranks) in
 * blocks, else round robin. */
m2a_topo_place_t m2a_topo_place(const m2a_topo_t *topo, int local_rank, int ranks_per_node, int use_gpu);

/* Binds host memory to a NUMA node where the system allows it (else plain pages). */
void *m2a_topo_alloc(size_t bytes, int numa);
void m2a_topo_free(void *ptr, size_t bytes);
#endif

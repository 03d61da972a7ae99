/* Ranks without NCCL, for the tests that run the load/store path with ranks sharing a
 * GPU (NCCL refuses two ranks on one GPU): the host transport only, and the symmetric
 * memory by CUDA IPC. Needs no CUDA itself. */
#ifndef MOEA2A_TEST_NO_NCCL_H
#define MOEA2A_TEST_NO_NCCL_H
#include <stdlib.h>
#include <string.h>

#include "moea2a.h"

/* A rank without NCCL: the host transport only, the load/store path's memory by CUDA
 * IPC (set before the communicator reads them). */
static inline void without_nccl(void)
{
    setenv("MOEA2A_TRANSPORT", "ucx", 1);
    setenv("MOEA2A_SYMMETRIC_MEMORY", "cuda_ipc", 1);
}

/* Whether the transport module `name` loads. */
static inline int have_transport(const char *name)
{
    moea2a_transport_info_t t[16];
    int n = 0;
    if (moea2a_get_transports(t, 16, &n) != MOEA2A_SUCCESS) return 0;
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(t[i].name, name) && t[i].loadable) return 1;
    return 0;
}

/* Whether a ucx transport module loads (the CUDA IPC tests run without NCCL). */
static inline int have_ucx(void) { return have_transport("ucx"); }

#endif

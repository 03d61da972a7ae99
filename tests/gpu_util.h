/* Helpers of the GPU tests. */
#ifndef MOEA2A_TEST_GPU_UTIL_H
#define MOEA2A_TEST_GPU_UTIL_H
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mix.h"
#include "moea2a.h"

/* Counted in a child, so the test process never initializes CUDA before forking ranks. */
static inline int gpu_count(void)
{
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

/* A rank without NCCL: the host transport only, the load/store path's memory by CUDA
 * IPC (set before the communicator reads them). */
static inline void without_nccl(void)
{
    setenv("MOEA2A_TRANSPORT", "ucx", 1);
    setenv("MOEA2A_SYMMETRIC_MEMORY", "cuda_ipc", 1);
}

/* Whether a ucx transport module loads (the CUDA IPC tests run without NCCL). */
static inline int have_ucx(void)
{
    moea2a_transport_info_t t[16];
    int n = 0;
    if (moea2a_get_transports(t, 16, &n) != MOEA2A_SUCCESS) return 0;
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(t[i].name, "ucx") && t[i].loadable) return 1;
    return 0;
}

#endif

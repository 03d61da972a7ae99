/* Helpers of the GPU tests. */
#ifndef MOEA2A_TEST_GPU_UTIL_H
#define MOEA2A_TEST_GPU_UTIL_H
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mix.h"

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

/* NCCL takes one rank per GPU and host: ranks given the same host id here (host =
 * rank / group) and apart from the others are joined by NCCL's network transport
 * (sockets on loopback), as separate machines; so group 1 lets ranks share a GPU. */
static inline void nccl_hosts_apart(int rank, int group)
{
    char v[32];
    snprintf(v, sizeof(v), "m2a-node-%d", rank / group);
    setenv("NCCL_HOSTID", v, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
}

#endif

/* Helpers of the GPU tests. */
#ifndef MOEA2A_TEST_GPU_UTIL_H
#define MOEA2A_TEST_GPU_UTIL_H
#include <cuda_runtime_api.h>
#include <stdint.h>
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

#endif

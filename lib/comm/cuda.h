/* Loading the CUDA module (cuda_module.h) on first use. */
#ifndef M2A_CUDA_LOADER_H
#define M2A_CUDA_LOADER_H
#include "comm/comm.h"
#include "comm/cuda_module.h"

/* The module's operations, loading it the first time (thread-safe; it stays loaded):
 * MOEA2A_SUCCESS and *ops, or MOEA2A_ERR_UNAVAILABLE recorded on comm (NULL: the
 * thread's last error) with fn and why the module is missing. */
moea2a_result_t m2a_cuda_require(moea2a_comm_t comm, const char *fn, const moea2a_cuda_v1_t **ops);
/* The loaded module, or NULL when it is not loaded (yet): for paths that only run
 * after m2a_cuda_require succeeded. */
const moea2a_cuda_v1_t *m2a_cuda_loaded(void);
/* For module listings: opens path as a CUDA module; 1 and its ABI version and a
 * description in detail, or 0 and why not. */
int m2a_cuda_probe(const char *path, int *abi_version, char *detail, size_t len);
#endif

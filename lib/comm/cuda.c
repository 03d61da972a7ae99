/* The CUDA module, loaded on first use (lib/comm/cuda.h). It stays loaded until the
 * process ends: device memory and kernels it owns may outlive any one context. */
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "comm/cuda.h"
#include "base/error.h"
#include "base/log.h"
#include "comm/modules.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const moea2a_cuda_v1_t *loaded;
static char why_not[768];

static const moea2a_cuda_v1_t *open_module(const char *path, void **dl, char *why, size_t len)
{
    return m2a_module_open(path, MOEA2A_CUDA_SYMBOL, offsetof(moea2a_cuda_v1_t, abi_version), MOEA2A_CUDA_ABI_VERSION,
                           "the CUDA module", dl, why, len);
}

static void load_once(void)
{
    char path[4096 + 256];
    void *dl;
    if (!m2a_module_find(M2A_CUDA_MODULE_NAME, path, sizeof(path))) {
        snprintf(why_not, sizeof(why_not),
                 "no libmoea2a-" M2A_CUDA_MODULE_NAME ".so on MOEA2A_TRANSPORT_PATH or in %s (a build without CUDA, "
                 "or the CUDA package is not installed)", MOEA2A_PKGLIBDIR);
        return;
    }
    loaded = open_module(path, &dl, why_not, sizeof(why_not));
    if (loaded) M2A_INFO(M2A_SUBSYS_INIT, "CUDA module %s loaded (CUDA runtime %d)", path, loaded->runtime_version);
}

moea2a_result_t m2a_cuda_require(moea2a_comm_t comm, const char *fn, const moea2a_cuda_v1_t **ops)
{
    pthread_once(&once, load_once);
    *ops = loaded;
    return loaded ? MOEA2A_SUCCESS
                  : m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "%s: CUDA memory needs moea2a's CUDA module: %s", fn, why_not);
}

const moea2a_cuda_v1_t *m2a_cuda_loaded(void)
{
    return loaded;
}

int m2a_cuda_probe(const char *path, int *abi_version, char *detail, size_t len)
{
    void *dl;
    const moea2a_cuda_v1_t *ops = open_module(path, &dl, detail, len);
    if (!ops) return 0;
    *abi_version = ops->abi_version;
    snprintf(detail, len, "CUDA module (kernels of the MoE and NVFP4 calls on CUDA memory), ABI v%d, CUDA runtime %d.%d",
             ops->abi_version, ops->runtime_version / 1000, ops->runtime_version % 1000 / 10);
    /* a probe does not unload a module the library is using (dlopen counts) */
    dlclose(dl);
    return 1;
}

/* Host or device memory, asked of the CUDA driver (libcuda.so.1, opened at first
 * use) rather than the runtime, so that the core links no CUDA library: without a
 * driver every pointer is host memory. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "comm/memtype.h"
#include "moea2a_transport_v1.h"

/* The driver API's values (cuda.h): CUpointer_attribute, CUmemorytype. */
enum { CU_ATTR_MEMORY_TYPE = 2, CU_ATTR_IS_MANAGED = 8, CU_MEMTYPE_DEVICE = 2 };
typedef int (*pointer_attributes_fn)(unsigned n, int *attributes, void **data, unsigned long long ptr);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pointer_attributes_fn pointer_attributes;

static void open_driver(void)
{
    void *dl = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!dl) return;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(dl, "cuInit");
    pointer_attributes_fn get = (pointer_attributes_fn)dlsym(dl, "cuPointerGetAttributes");
    if (!init || !get || init(0) != 0) { /* a driver without a device */
        dlclose(dl);
        return;
    }
    pointer_attributes = get;
}

unsigned m2a_memtype(const void *ptr)
{
    if (!ptr) return MOEA2A_MEM_HOST;
    pthread_once(&once, open_driver);
    if (!pointer_attributes) return MOEA2A_MEM_HOST;
    /* The plural call answers "no attributes" (zeros) for memory CUDA does not know
     * instead of failing; the buffers are wider than the enum and bool it writes. */
    unsigned long long type = 0, managed = 0;
    int attributes[2] = {CU_ATTR_MEMORY_TYPE, CU_ATTR_IS_MANAGED};
    void *data[2] = {&type, &managed};
    if (pointer_attributes(2, attributes, data, (unsigned long long)(uintptr_t)ptr) != 0) return MOEA2A_MEM_HOST;
    return type == CU_MEMTYPE_DEVICE || managed ? MOEA2A_MEM_CUDA : MOEA2A_MEM_HOST;
}

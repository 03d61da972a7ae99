/* Module files (libmoea2a-<name>.so): where they are looked for and how they are
 * listed. Transports (transport.c) and the CUDA module (lib/comm/cuda.c) live there. */
#ifndef M2A_MODULES_H
#define M2A_MODULES_H
#include <stddef.h>

#ifndef MOEA2A_PKGLIBDIR
#define MOEA2A_PKGLIBDIR ""
#endif

/* Calls fn for every module file on the search path (MOEA2A_TRANSPORT_PATH, then
 * <dir of libmoea2a.so>/moea2a, then the configured module directory), first
 * directory first, each name once. Returns the number of calls. */
int m2a_modules_each(void (*fn)(const char *name, const char *path, void *arg), void *arg);
/* The first file of module name on the search path: 1 and *path, or 0. */
int m2a_module_find(const char *name, char *path, size_t len);
/* Opens the module file path and finds its table, the symbol `symbol`, whose int at
 * abi_offset (the table's abi_version member) must be abi: the table and the open
 * handle in *dl, or NULL and why not (what = "a transport", "the CUDA module": what
 * the file should have been). Transports and the CUDA module are opened this one way. */
const void *m2a_module_open(const char *path, const char *symbol, size_t abi_offset, int abi, const char *what,
                            void **dl, char *why, size_t len);
#endif

/* The communicator's transport modules (transport.c): finding and opening them,
 * setting them up with the peers over the bootstrap, and choosing one by memory type. */
#ifndef M2A_TRANSPORT_H
#define M2A_TRANSPORT_H
#include <stddef.h>

#include "moea2a.h"
#include "moea2a_transport_v3.h"

#define M2A_MAX_TRANSPORTS 8
#define M2A_NAME_LEN 32

typedef struct {
    char name[M2A_NAME_LEN];
    const moea2a_transport_v1_t *ops;
    /* the later versions' members, NULL for a module of an earlier one
     * (moea2a_transport_v2.h, moea2a_transport_v3.h) */
    int (*can_shrink)(void *parent);
    int (*shrink)(void *parent, const moea2a_core_v1_t *core, const int *parent_rank, int dead, void **tcomm,
                  unsigned *mem_types);
    void (*watch)(void *tcomm, const volatile int32_t *dead);
    void *dl;          /* dlopen handle */
    void *tc;          /* the module's per-communicator state */
    unsigned mem_types;
    int explicit_ask;  /* named in MOEA2A_TRANSPORT: losing it is an error */
} m2a_transport_t;

/* Opens the modules named by spec (MOEA2A_TRANSPORT syntax; "" = every module found),
 * without any communication. */
moea2a_result_t m2a_transports_open(moea2a_comm_t comm, const char *spec);
/* Sets every opened transport up with the peers over the bootstrap; comm made by a
 * shrink of parent (else NULL): from parent's transports where every rank can. */
moea2a_result_t m2a_transports_connect(moea2a_comm_t comm, moea2a_comm_t parent);
void m2a_transports_close(moea2a_comm_t comm, int force);
/* Loads one module by name, outside any communicator (NULL and *why on failure): its
 * version 1 members. */
const moea2a_transport_v1_t *m2a_transport_load(const char *name, void **dl, char *why, size_t len);
/* Brackets operations on the transport of memory type mem into one group (NCCL
 * groups) when it supports that; otherwise does nothing. A failure is returned as the
 * transport gave it: the caller decides what it means for the communicator. */
moea2a_result_t m2a_transport_group(moea2a_comm_t comm, unsigned mem, int start);
/* The transport that moves memory of type mem (MOEA2A_MEM_*), or NULL. */
m2a_transport_t *m2a_transport_for(moea2a_comm_t comm, unsigned mem);
#endif

/* The communicator object shared by the core's files. */
#ifndef M2A_COMM_H
#define M2A_COMM_H
#include "bootstrap.h"
#include "error.h"
#include "moea2a.h"
#include "nodemap.h"
#include "transport_api.h"

#define M2A_MAX_TRANSPORTS 8
#define M2A_NAME_LEN 32

typedef struct {
    char name[M2A_NAME_LEN];
    const moea2a_transport_v1_t *ops;
    void *dl;          /* dlopen handle */
    void *tc;          /* the module's per-communicator state */
    unsigned mem_types;
    int explicit_ask;  /* named in MOEA2A_TRANSPORT: losing it is an error */
} m2a_transport_t;

struct moea2a_comm {
    int rank, nranks;
    double timeout_s;
    int cuda_device;
    m2a_bootstrap_t *bs;
    m2a_nodemap_t nodes; /* which ranks share a node */
    m2a_transport_t tr[M2A_MAX_TRANSPORTS];
    int ntr;
    moea2a_core_v1_t core;
    /* != MOEA2A_SUCCESS after a failure that leaves peers out of step (timeout,
     * dead peer, abort): every later call returns MOEA2A_ERR_ABORTED. */
    moea2a_result_t broken;
    char broken_why[M2A_ERRMSG_LEN]; /* the message of the failure that broke it */
    char last_error[M2A_ERRMSG_LEN];
};

/* Entry check of every call on a communicator. */
moea2a_result_t m2a_comm_check(moea2a_comm_t comm, const char *fn);
/* Marks comm broken when r means the peers may be out of step; returns r. */
moea2a_result_t m2a_comm_fail(moea2a_comm_t comm, moea2a_result_t r);

/* transport.c */
/* Opens the modules named by spec (MOEA2A_TRANSPORT syntax; "" = every module found),
 * without any communication. */
moea2a_result_t m2a_transports_open(moea2a_comm_t comm, const char *spec);
/* Sets every opened transport up with the peers over the bootstrap. */
moea2a_result_t m2a_transports_connect(moea2a_comm_t comm);
void m2a_transports_close(moea2a_comm_t comm, int force);
/* Loads one module by name, outside any communicator (NULL and *why on failure). */
const moea2a_transport_v1_t *m2a_transport_load(const char *name, void **dl, char *why, size_t len);
/* Brackets operations on the transport of memory type mem into one group (NCCL
 * groups) when it supports that; otherwise does nothing. */
moea2a_result_t m2a_transport_group(moea2a_comm_t comm, unsigned mem, int start);
/* The transport that moves memory of type mem (MOEA2A_MEM_*), or NULL. */
m2a_transport_t *m2a_transport_for(moea2a_comm_t comm, unsigned mem);

/* memtype.c: MOEA2A_MEM_HOST or MOEA2A_MEM_CUDA. */
unsigned m2a_memtype(const void *ptr);
#endif

/* A transport module of interface version 1 (moea2a_transport_v1.h and moea2a.h only),
 * built as libmoea2a-loop.so for test_comm: host memory of a communicator of one rank,
 * each collective a copy. The library must keep loading such a module beside version 2
 * ones, and set it up anew where a version 2 module would shrink. loop_inits counts its
 * init_local calls, for the test to read through its own dlopen of this file. */
#include <stdlib.h>
#include <string.h>

#include "moea2a.h"
#include "moea2a_transport_v1.h"

__attribute__((visibility("default"))) int loop_inits;

static int loop_init_local(const moea2a_core_v1_t *core, void **tcomm, void **addr, size_t *addr_len,
                           unsigned *mem_types)
{
    loop_inits++;
    *tcomm = NULL, *addr = NULL, *addr_len = 0, *mem_types = MOEA2A_MEM_HOST;
    if (core->nranks != 1)
        return moea2a_core_fail(core, MOEA2A_ERR_UNAVAILABLE, "loop: %d ranks; this module serves one", core->nranks);
    *tcomm = malloc(1);
    return *tcomm ? MOEA2A_SUCCESS : MOEA2A_ERR_NO_MEMORY;
}

static int loop_connect(void *tcomm, const void *const *addrs, const size_t *lens)
{
    (void)tcomm, (void)addrs, (void)lens;
    return MOEA2A_SUCCESS;
}

static void loop_finalize(void *tcomm, int force)
{
    (void)force;
    free(tcomm);
}

static int loop_alltoallv(void *tcomm, const void *sbuf, const size_t *sc, const size_t *sd, void *rbuf,
                          const size_t *rc, const size_t *rd, unsigned mem, void *stream, void **op)
{
    (void)tcomm, (void)mem, (void)stream;
    *op = NULL;
    if (sc[0] != rc[0]) return MOEA2A_ERR_MISMATCH;
    if (sc[0]) memmove((char *)rbuf + rd[0], (const char *)sbuf + sd[0], sc[0]);
    return MOEA2A_SUCCESS;
}

static int loop_allgather(void *tcomm, const void *sbuf, void *rbuf, size_t bytes, unsigned mem, void *stream, void **op)
{
    (void)tcomm, (void)mem, (void)stream;
    *op = NULL;
    if (bytes && sbuf != rbuf) memmove(rbuf, sbuf, bytes);
    return MOEA2A_SUCCESS;
}

static int loop_bcast(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **op)
{
    (void)tcomm, (void)buf, (void)bytes, (void)root, (void)mem, (void)stream;
    *op = NULL;
    return MOEA2A_SUCCESS;
}

static int loop_barrier(void *tcomm, void **op)
{
    (void)tcomm;
    *op = NULL;
    return MOEA2A_SUCCESS;
}

static int loop_test(void *tcomm, void *op, int *done)
{
    (void)tcomm, (void)op;
    *done = 1;
    return MOEA2A_SUCCESS;
}

static void loop_describe(void *tcomm, void *op, char *buf, size_t len)
{
    (void)tcomm, (void)op;
    if (len) buf[0] = 0;
}

static void loop_op_free(void *tcomm, void *op) { (void)tcomm, (void)op; }

__attribute__((visibility("default"))) const moea2a_transport_v1_t moea2a_transport_v1 = {
    .name = "loop", .abi_version = MOEA2A_TRANSPORT_ABI_VERSION,
    .init_local = loop_init_local, .connect = loop_connect, .finalize = loop_finalize,
    .alltoallv = loop_alltoallv, .allgather = loop_allgather, .bcast = loop_bcast, .barrier = loop_barrier,
    .test = loop_test, .describe = loop_describe, .op_free = loop_op_free,
};

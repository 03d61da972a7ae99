/* Generic collectives: argument checks, memory-type routing to a transport, and the
 * request life cycle (start, test, wait) with the communicator's timeout. */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/checked.h"
#include "base/clock.h"
#include "comm/coll.h"
#include "comm/comm.h"
#include "comm/memtype.h"
#include "comm/cuda.h"
#include "base/log.h"

struct moea2a_request {
    moea2a_comm_t comm;
    m2a_transport_t *t;
    void *op;       /* the transport's; NULL when it finished at start */
    double deadline;
    const char *name;
    size_t *bytes;  /* byte counts handed to the transport, kept alive with op */
};

/* The transport for buffers bufs[0..n) (NULL ones ignored); all must be of one type. */
static moea2a_result_t route(moea2a_comm_t comm, const char *fn, const void *const *bufs, int n,
                             m2a_transport_t **t, unsigned *mem)
{
    unsigned m = 0;
    for (int i = 0; i < n; i++) {
        if (!bufs[i]) continue;
        unsigned mi = m2a_memtype(bufs[i]);
        if (m && mi != m)
            return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                             "%s: send and receive buffers are in different memory (host and CUDA)", fn);
        m = mi;
    }
    *mem = m ? m : MOEA2A_MEM_HOST;
    *t = m2a_transport_for(comm, *mem);
    if (!*t) {
        char names[256] = "";
        size_t o = 0;
        for (int i = 0; i < comm->ntr && o < sizeof(names); i++)
            o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%s", i ? ", " : "", comm->tr[i].name);
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "%s: no transport of this communicator moves %s memory (it has: %s)",
                         fn, *mem == MOEA2A_MEM_CUDA ? "CUDA" : "host", names);
    }
    return MOEA2A_SUCCESS;
}

/* Entry checks every collective shares; *es = element size of dtype. */
static moea2a_result_t begin(moea2a_comm_t comm, const char *fn, moea2a_request_t *request, moea2a_datatype_t dtype,
                             size_t *es)
{
    M2A_TRY(m2a_comm_check(comm, fn));
    M2A_CHECK_ARG(comm, request, "%s: request is NULL", fn);
    *request = NULL;
    if (moea2a_datatype_size(dtype, es))
        return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: unknown datatype %d", fn, (int)dtype);
    return MOEA2A_SUCCESS;
}

static moea2a_result_t new_request(moea2a_comm_t comm, const char *name, m2a_transport_t *t,
                                   moea2a_request_t *out)
{
    moea2a_request_t req = calloc(1, sizeof(*req));
    if (!req) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", name);
    req->comm = comm;
    req->t = t;
    req->name = name;
    req->deadline = m2a_now() + comm->timeout_s;
    *out = req;
    return MOEA2A_SUCCESS;
}

/* A request on the transport that moves the memory of bufs. */
static moea2a_result_t routed_request(moea2a_comm_t comm, const char *fn, const void *const *bufs, int n,
                                      moea2a_request_t *req, unsigned *mem)
{
    m2a_transport_t *t;
    M2A_TRY(route(comm, fn, bufs, n, &t, mem));
    return new_request(comm, fn, t, req);
}

static void free_request(moea2a_request_t req)
{
    if (req->op) req->t->ops->op_free(req->t->tc, req->op);
    free(req->bytes);
    free(req);
}

/* Hands a started (or failed to start) request to the caller or frees it. */
static moea2a_result_t started(moea2a_request_t req, int rc, moea2a_request_t *out)
{
    moea2a_comm_t comm = req->comm;
    if (rc != MOEA2A_SUCCESS) {
        req->op = NULL; /* a start that failed owns nothing */
        free_request(req);
        *out = NULL;
        return m2a_comm_fail(comm, (moea2a_result_t)rc);
    }
    *out = req;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_test(moea2a_request_t *request, int *done)
{
    if (!request || !*request || !done)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_test: request and done must not be NULL");
    moea2a_request_t req = *request;
    moea2a_comm_t comm = req->comm;
    int fin = 1;
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (comm->broken != MOEA2A_SUCCESS) {
        r = m2a_comm_check(comm, req->name);
    } else if (req->op) {
        r = (moea2a_result_t)req->t->ops->test(req->t->tc, req->op, &fin);
        if (r == MOEA2A_SUCCESS && !fin && m2a_now() > req->deadline) {
            char who[256] = "";
            req->t->ops->describe(req->t->tc, req->op, who, sizeof(who));
            r = m2a_error(comm, MOEA2A_ERR_TIMEOUT, "%s: no progress for %.1f s (MOEA2A_TIMEOUT_S); still waiting for %s",
                          req->name, comm->timeout_s, who);
        }
        if (r == MOEA2A_SUCCESS && !fin && m2a_comm_dead_since(comm) > M2A_WATCH_GRACE_S)
            r = m2a_comm_peer_error(comm, req->name);
    }
    *done = fin || r != MOEA2A_SUCCESS;
    if (*done) {
        free_request(req);
        *request = NULL;
    }
    return m2a_comm_fail(comm, r);
}

moea2a_result_t moea2a_wait(moea2a_request_t *request)
{
    if (!request || !*request)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_wait: request must not be NULL");
    for (unsigned spins = 0;; spins++) {
        int done;
        moea2a_result_t r = moea2a_test(request, &done);
        if (done || r != MOEA2A_SUCCESS) return r;
        /* Ranks often outnumber cores (tests, oversubscribed nodes): let peers run. */
        if (spins > 64) sched_yield();
    }
}

/* ---- alltoallv ----------------------------------------------------------------- */

static moea2a_result_t check_vector(moea2a_comm_t comm, const char *fn, const char *what, const int64_t *v,
                                    int n)
{
    if (!v) return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    for (int i = 0; i < n; i++)
        if (v[i] < 0)
            return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: %s[%d]=%lld is negative", fn, what, i,
                             (long long)v[i]);
    return MOEA2A_SUCCESS;
}

/* A rank's block to itself, copied here rather than through the transport: no round
 * trip through the network stack, and a single-rank communicator needs none at all.
 * Host memory: memmove (the blocks may overlap). CUDA memory: a copy on the stream, in
 * order with the transport's work there. */
static moea2a_result_t self_copy(moea2a_comm_t comm, const char *fn, const void *sendbuf, size_t soff, void *recvbuf,
                                 size_t roff, size_t bytes, unsigned mem, void *stream)
{
    if (bytes == 0) return MOEA2A_SUCCESS;
    const unsigned char *src = (const unsigned char *)sendbuf + soff;
    unsigned char *dst = (unsigned char *)recvbuf + roff;
    if (mem != MOEA2A_MEM_CUDA) {
        memmove(dst, src, bytes);
        return MOEA2A_SUCCESS;
    }
    const moea2a_cuda_v1_t *ops;
    M2A_TRY(m2a_cuda_require(comm, fn, &ops));
    int e = ops->copy_async(dst, src, bytes, M2A_CUDA_D2D, stream);
    if (e) return m2a_error(comm, MOEA2A_ERR_CUDA, "%s: copying this rank's own block: %s", fn, ops->error_string(e));
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_ialltoallv(const char *fn, const void *sendbuf, const int64_t *sendcounts,
                               const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls,
                               moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream, moea2a_request_t *request)
{
    size_t es;
    M2A_TRY(begin(comm, fn, request, dtype, &es));
    int n = comm->nranks;
    M2A_TRY(check_vector(comm, fn, "sendcounts", sendcounts, n));
    M2A_TRY(check_vector(comm, fn, "sdispls", sdispls, n));
    M2A_TRY(check_vector(comm, fn, "recvcounts", recvcounts, n));
    M2A_TRY(check_vector(comm, fn, "rdispls", rdispls, n));
    int64_t stotal = 0, rtotal = 0;
    for (int i = 0; i < n; i++) stotal += sendcounts[i], rtotal += recvcounts[i];
    M2A_CHECK_ARG(comm, sendbuf || stotal == 0, "%s: sendbuf is NULL but sendcounts are not all 0", fn);
    M2A_CHECK_ARG(comm, recvbuf || rtotal == 0, "%s: recvbuf is NULL but recvcounts are not all 0", fn);

    const void *bufs[2] = {sendbuf, recvbuf};
    moea2a_request_t req;
    unsigned mem;
    M2A_TRY(routed_request(comm, fn, bufs, 2, &req, &mem));
    m2a_transport_t *t = req->t;
    size_t *b = req->bytes = malloc(sizeof(size_t) * 4 * (size_t)n);
    if (!b) return started(req, m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn), request);
    const int64_t *v[4] = {sendcounts, sdispls, recvcounts, rdispls};
    static const char *const names[4] = {"sendcounts", "sdispls", "recvcounts", "rdispls"};
    for (int a = 0; a < 4; a++)
        for (int i = 0; i < n; i++)
            if (!m2a_mul_ok((size_t)v[a][i], es, &b[a * n + i]))
                return started(req, m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                                              "%s: %s[%d]=%lld elements of %zu bytes overflow a size", fn, names[a], i,
                                              (long long)v[a][i], es), request);
    /* No buffer reaches past the addresses a process can use. */
    for (int i = 0; i < n; i++) {
        size_t send_end, recv_end;
        if (!m2a_add_ok(b[n + i], b[i], &send_end) || !m2a_add_ok(b[3 * n + i], b[2 * n + i], &recv_end) ||
            !m2a_range_ok(sendbuf, send_end) || !m2a_range_ok(recvbuf, recv_end))
            return started(req, m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                                          "%s: %s for rank %d (displacement %lld + count %lld elements of %zu bytes) "
                                          "reaches past the highest address a process can use", fn,
                                          m2a_range_ok(sendbuf, send_end) ? "the receive block" : "the send block", i,
                                          (long long)(m2a_range_ok(sendbuf, send_end) ? rdispls[i] : sdispls[i]),
                                          (long long)(m2a_range_ok(sendbuf, send_end) ? recvcounts[i] : sendcounts[i]),
                                          es), request);
    }
    int me = comm->rank;
    if (b[me] != b[2 * n + me])
        return started(req, m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT,
                                      "%s: rank %d sends itself sendcounts[%d]=%lld elements but expects "
                                      "recvcounts[%d]=%lld", fn, me, me, (long long)sendcounts[me], me,
                                      (long long)recvcounts[me]), request);
    int rc = self_copy(comm, fn, sendbuf, b[n + me], recvbuf, b[3 * n + me], b[me], mem, stream);
    b[me] = b[2 * n + me] = 0; /* the transport moves the peers' blocks only */
    if (rc == MOEA2A_SUCCESS && n > 1)
        rc = t->ops->alltoallv(t->tc, sendbuf, b, b + n, recvbuf, b + 2 * n, b + 3 * n, mem, stream, &req->op);
    for (int i = 0; rc == MOEA2A_SUCCESS && i < n; i++) /* what was handed, by memory and node (b[me] is 0) */
        comm->traffic[mem == MOEA2A_MEM_CUDA][comm->nodes.node[i] != comm->nodes.node[me]] += (int64_t)b[i];
    return started(req, rc, request);
}

moea2a_result_t m2a_iallgather(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                               moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream, moea2a_request_t *request)
{
    size_t es;
    M2A_TRY(begin(comm, fn, request, dtype, &es));
    M2A_CHECK_ARG(comm, (sendbuf && recvbuf) || count == 0, "%s: sendbuf or recvbuf is NULL", fn);
    M2A_CHECK_ARG(comm, count <= SIZE_MAX / es / (size_t)comm->nranks, "%s: count=%zu overflows", fn, count);
    const void *bufs[2] = {sendbuf, recvbuf};
    moea2a_request_t req;
    unsigned mem;
    M2A_TRY(routed_request(comm, fn, bufs, 2, &req, &mem));
    m2a_transport_t *t = req->t;
    return started(req, t->ops->allgather(t->tc, sendbuf, recvbuf, count * es, mem, stream, &req->op), request);
}

moea2a_result_t moea2a_ialltoallv(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
                                  void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls,
                                  moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream,
                                  moea2a_request_t *request)
{
    return m2a_ialltoallv("moea2a_alltoallv", sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, comm,
                          stream, request);
}

moea2a_result_t moea2a_iallgather(const void *sendbuf, void *recvbuf, size_t count, moea2a_datatype_t dtype,
                                  moea2a_comm_t comm, void *stream, moea2a_request_t *request)
{
    return m2a_iallgather("moea2a_allgather", sendbuf, recvbuf, count, dtype, comm, stream, request);
}

/* A broadcast whose ranks name different roots would have two roots that only send
 * and return success with nothing received: every rank compares (root, bytes) over
 * the bootstrap first, so all get the same MISMATCH before any data moves, and the
 * communicator stays usable. */
static moea2a_result_t agree_on_root(moea2a_comm_t comm, const char *fn, int root, size_t bytes)
{
    int n = comm->nranks;
    if (n == 1) return MOEA2A_SUCCESS;
    uint64_t(*all)[2] = calloc((size_t)n, sizeof(*all));
    if (!all) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    all[comm->rank][0] = (uint64_t)root, all[comm->rank][1] = bytes;
    moea2a_result_t r = m2a_comm_fail(comm, m2a_comm_allgather(comm, all, sizeof(*all)));
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++)
        if (all[q][0] != all[0][0] || all[q][1] != all[0][1])
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH,
                          "%s: ranks disagree: rank 0 passed root %llu and %llu bytes, rank %d root %llu and %llu bytes",
                          fn, (unsigned long long)all[0][0], (unsigned long long)all[0][1], q,
                          (unsigned long long)all[q][0], (unsigned long long)all[q][1]);
    free(all);
    return r;
}

moea2a_result_t moea2a_ibcast(void *buf, size_t count, moea2a_datatype_t dtype, int root, moea2a_comm_t comm,
                              void *stream, moea2a_request_t *request)
{
    static const char fn[] = "moea2a_bcast";
    size_t es;
    M2A_TRY(begin(comm, fn, request, dtype, &es));
    M2A_CHECK_ARG(comm, root >= 0 && root < comm->nranks, "%s: root=%d is out of range 0..%d", fn, root, comm->nranks - 1);
    M2A_CHECK_ARG(comm, buf || count == 0, "%s: buf is NULL", fn);
    M2A_CHECK_ARG(comm, count <= SIZE_MAX / es, "%s: count=%zu overflows", fn, count);
    M2A_TRY(agree_on_root(comm, fn, root, count * es));
    const void *bufs[1] = {buf};
    moea2a_request_t req;
    unsigned mem;
    M2A_TRY(routed_request(comm, fn, bufs, 1, &req, &mem));
    m2a_transport_t *t = req->t;
    return started(req, t->ops->bcast(t->tc, buf, count * es, root, mem, stream, &req->op), request);
}

moea2a_result_t moea2a_ibarrier(moea2a_comm_t comm, moea2a_request_t *request)
{
    static const char fn[] = "moea2a_barrier";
    M2A_TRY(m2a_comm_check(comm, fn));
    M2A_CHECK_ARG(comm, request, "%s: request is NULL", fn);
    *request = NULL;
    m2a_transport_t *t = m2a_transport_for(comm, MOEA2A_MEM_HOST);
    if (!t) t = &comm->tr[0];
    moea2a_request_t req = NULL;
    M2A_TRY(new_request(comm, fn, t, &req));
    return started(req, t->ops->barrier(t->tc, &req->op), request);
}

/* The blocking forms: start, then wait. */

moea2a_result_t m2a_alltoallv(const char *fn, const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
                              void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, moea2a_datatype_t dtype,
                              moea2a_comm_t comm, void *stream)
{
    moea2a_request_t req;
    M2A_TRY(m2a_ialltoallv(fn, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, comm, stream, &req));
    return req ? moea2a_wait(&req) : MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_alltoallv(const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
                                 void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls,
                                 moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream)
{
    return m2a_alltoallv("moea2a_alltoallv", sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, comm,
                         stream);
}

moea2a_result_t m2a_allgather(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                              moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream)
{
    moea2a_request_t req;
    M2A_TRY(m2a_iallgather(fn, sendbuf, recvbuf, count, dtype, comm, stream, &req));
    return req ? moea2a_wait(&req) : MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_allgather(const void *sendbuf, void *recvbuf, size_t count, moea2a_datatype_t dtype,
                                 moea2a_comm_t comm, void *stream)
{
    return m2a_allgather("moea2a_allgather", sendbuf, recvbuf, count, dtype, comm, stream);
}

moea2a_result_t moea2a_bcast(void *buf, size_t count, moea2a_datatype_t dtype, int root, moea2a_comm_t comm,
                             void *stream)
{
    moea2a_request_t req;
    M2A_TRY(moea2a_ibcast(buf, count, dtype, root, comm, stream, &req));
    return req ? moea2a_wait(&req) : MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_barrier(moea2a_comm_t comm)
{
    moea2a_request_t req;
    M2A_TRY(moea2a_ibarrier(comm, &req));
    return req ? moea2a_wait(&req) : MOEA2A_SUCCESS;
}

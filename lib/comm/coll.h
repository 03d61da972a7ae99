/* The generic collectives as the core's other layers call them (coll.c): the same as
 * moea2a_alltoallv and moea2a_allgather, with the caller's function name (fn) in every
 * message, so that an error inside a dispatch says moea2a_dispatch. */
#ifndef M2A_COLL_H
#define M2A_COLL_H
#include "moea2a.h"

moea2a_result_t m2a_ialltoallv(const char *fn, const void *sendbuf, const int64_t *sendcounts,
                               const int64_t *sdispls, void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls,
                               moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream, moea2a_request_t *request);
moea2a_result_t m2a_alltoallv(const char *fn, const void *sendbuf, const int64_t *sendcounts, const int64_t *sdispls,
                              void *recvbuf, const int64_t *recvcounts, const int64_t *rdispls, moea2a_datatype_t dtype,
                              moea2a_comm_t comm, void *stream);
moea2a_result_t m2a_iallgather(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                               moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream, moea2a_request_t *request);
moea2a_result_t m2a_allgather(const char *fn, const void *sendbuf, void *recvbuf, size_t count,
                              moea2a_datatype_t dtype, moea2a_comm_t comm, void *stream);
#endif

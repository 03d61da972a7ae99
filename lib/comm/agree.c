/* Failures of one rank told to all (agree.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/agree.h"
#include "comm/comm.h"

#define REASON_BYTES 240 /* of a failed rank's message, carried to its peers */

moea2a_result_t m2a_comm_tell_failures(moea2a_comm_t comm, const char *fn, moea2a_result_t mine,
                                       const int32_t *status, size_t step)
{
    const int n = comm->nranks;
    char(*why)[REASON_BYTES] = calloc((size_t)n, REASON_BYTES);
    if (!why) return mine != MOEA2A_SUCCESS ? mine : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (mine != MOEA2A_SUCCESS) {
        const char *m = moea2a_last_error(comm);
        const size_t fl = strlen(fn);
        if (!strncmp(m, fn, fl) && !strncmp(m + fl, ": ", 2)) m += fl + 2; /* the peer's message names fn itself */
        snprintf(why[comm->rank], REASON_BYTES, "%s", m);
    }
    moea2a_result_t g = m2a_comm_allgather(comm, why, REASON_BYTES), r = mine;
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (status[(size_t)q * step] == MOEA2A_SUCCESS) continue;
        why[q][REASON_BYTES - 1] = 0;
        r = m2a_error(comm, (moea2a_result_t)status[(size_t)q * step], "%s failed on rank %d: %s", fn, q,
                      g == MOEA2A_SUCCESS && why[q][0] ? why[q] : moea2a_strerror((moea2a_result_t)status[(size_t)q * step]));
    }
    free(why);
    return r;
}

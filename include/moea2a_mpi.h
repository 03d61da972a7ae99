/*
 * moea2a_mpi.h: create a moea2a communicator over the processes of an MPI
 * communicator. Header-only on purpose: libmoea2a.so never links MPI, so one build
 * serves programs with and without MPI, and any MPI implementation works.
 */
#ifndef MOEA2A_MPI_H
#define MOEA2A_MPI_H

#include <mpi.h>

#include "moea2a.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over mpi_comm: rank 0 makes the unique id, MPI_Bcast hands it to the
 * others, and every process joins with its MPI rank. Returns
 * MOEA2A_ERR_INVALID_ARGUMENT if comm is NULL, MOEA2A_ERR_SYSTEM if an MPI call
 * failed, else what moea2a_comm_init_rank returns. */
static inline moea2a_result_t moea2a_comm_init_mpi(moea2a_comm_t *comm, MPI_Comm mpi_comm,
                                                   const moea2a_config_t *config)
{
    int rank, size;
    moea2a_unique_id_t id;
    moea2a_result_t r = MOEA2A_SUCCESS;
    if (!comm) return MOEA2A_ERR_INVALID_ARGUMENT;
    if (MPI_Comm_rank(mpi_comm, &rank) != MPI_SUCCESS || MPI_Comm_size(mpi_comm, &size) != MPI_SUCCESS)
        return MOEA2A_ERR_SYSTEM;
    if (rank == 0) r = moea2a_get_unique_id(&id);
    /* Every rank learns whether rank 0 could make an id, so none waits in vain. */
    int ok = r == MOEA2A_SUCCESS;
    if (MPI_Bcast(&ok, 1, MPI_INT, 0, mpi_comm) != MPI_SUCCESS) return MOEA2A_ERR_SYSTEM;
    if (!ok) return rank == 0 ? r : MOEA2A_ERR_PEER_FAILED;
    if (MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, mpi_comm) != MPI_SUCCESS) return MOEA2A_ERR_SYSTEM;
    return moea2a_comm_init_rank(comm, size, id, rank, config);
}

#ifdef __cplusplus
}
#endif

#endif /* MOEA2A_MPI_H */

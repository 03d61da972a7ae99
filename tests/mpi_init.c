/* moea2a_comm_init_mpi under mpirun: the communicator mirrors MPI_COMM_WORLD. */
#include <moea2a_mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, mr = -1, ms = -1, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    moea2a_comm_t comm;
    moea2a_result_t r = moea2a_comm_init_mpi(&comm, MPI_COMM_WORLD, NULL);
    if (r != MOEA2A_SUCCESS) {
        fprintf(stderr, "rank %d: moea2a_comm_init_mpi: %s\n", rank, moea2a_last_error(NULL));
        bad = 1;
    } else {
        moea2a_comm_rank(comm, &mr);
        moea2a_comm_size(comm, &ms);
        int v = rank, sum = 0, all[64];
        bad = mr != rank || ms != size || moea2a_allgather(&v, all, 1, MOEA2A_INT32, comm, NULL) != MOEA2A_SUCCESS;
        for (int i = 0; !bad && i < size; i++) sum += all[i] == i;
        bad |= sum != size;
        moea2a_comm_destroy(comm);
    }
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("moea2a_comm_init_mpi on %d ranks: %s\n", size, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any;
}

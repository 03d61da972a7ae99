/* Built by `make installcheck` against the installed headers and library, found with
 * pkg-config, exactly as a user's program would be. Two forked ranks allgather. */
#include <moea2a.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static int rank_main(int rank, moea2a_unique_id_t id)
{
    moea2a_comm_t comm;
    int mine = 7 * (rank + 1), all[2] = {0, 0};
    if (moea2a_comm_init_rank(&comm, 2, id, rank, NULL) != MOEA2A_SUCCESS) {
        fprintf(stderr, "consumer rank %d: %s\n", rank, moea2a_last_error(NULL));
        return 1;
    }
    int bad = moea2a_allgather(&mine, all, 1, MOEA2A_INT32, comm, NULL) != MOEA2A_SUCCESS || all[0] != 7 || all[1] != 14;
    moea2a_comm_destroy(comm);
    return bad;
}

int main(void)
{
    int major, minor, patch, status, failed = 0;
    moea2a_get_version(&major, &minor, &patch);
    if (major != MOEA2A_VERSION_MAJOR || minor != MOEA2A_VERSION_MINOR) return 1;
    /* Fork first, then make the id (it starts a thread) and pipe it to the child:
     * moea2a(7) says to fork before moea2a starts threads. */
    int fd[2];
    moea2a_unique_id_t id;
    fflush(stdout);
    if (pipe(fd)) return 1;
    pid_t child = fork();
    if (child == 0) {
        close(fd[1]);
        _exit(read(fd[0], &id, sizeof(id)) == (ssize_t)sizeof(id) ? rank_main(1, id) : 1);
    }
    close(fd[0]);
    if (moea2a_get_unique_id(&id) != MOEA2A_SUCCESS) return 1;
    if (write(fd[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) return 1;
    close(fd[1]);
    failed |= rank_main(0, id);
    waitpid(child, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status);
    printf("consumer of moea2a %d.%d.%d: %s\n", major, minor, patch, failed ? "FAILED" : "ok");
    return failed;
}

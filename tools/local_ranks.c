#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "local_ranks.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The id is made after the fork and sent down a pipe: making it starts the
 * rendezvous thread, and a process that forks while another of its threads runs
 * hands its children whatever locks that thread held (malloc's, a sanitizer's). */
int local_ranks_run(int nranks, local_rank_fn fn, void *arg, double watchdog_s, local_ranks_result_t *res)
{
    memset(res, 0, sizeof(*res));
    pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
    int *pipes = calloc((size_t)nranks, sizeof(*pipes));
    if (!pids || !pipes) {
        free(pids), free(pipes);
        return res->failed = nranks;
    }
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        int fd[2];
        if (pipe(fd)) {
            perror("pipe");
            pids[r] = -1;
            res->failed++;
            continue;
        }
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fd[1]);
            moea2a_unique_id_t id;
            if (read(fd[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(100); /* the parent could not make one */
            close(fd[0]);
            int rc = fn(r, nranks, id, arg);
            fflush(NULL);
            _exit(rc);
        }
        close(fd[0]);
        pipes[r] = fd[1];
        if (pids[r] < 0) {
            perror("fork");
            close(fd[1]);
            res->failed++;
        }
    }
    moea2a_unique_id_t id;
    int made = moea2a_get_unique_id(&id) == MOEA2A_SUCCESS;
    if (!made) fprintf(stderr, "moea2a_get_unique_id: %s\n", moea2a_last_error(NULL));
    for (int r = 0; r < nranks; r++) {
        if (pids[r] > 0 && made && write(pipes[r], &id, sizeof(id)) != (ssize_t)sizeof(id)) perror("write");
        if (pids[r] > 0) close(pipes[r]);
    }
    free(pipes);
    double deadline = now() + watchdog_s;
    int left = nranks - res->failed;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < nranks; r++) {
                if (pids[r] != p) continue;
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (r < 64) res->exit_codes[r] = code;
                if (code) res->failed++;
                pids[r] = 0;
                left--;
            }
            continue;
        }
        if (now() > deadline) {
            for (int r = 0; r < nranks; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, "# watchdog: rank %d still running after %.0f s; killing it\n", r, watchdog_s);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    res->hung++;
                    res->failed++;
                    left--;
                }
            break;
        }
        usleep(2000);
    }
    free(pids);
    return res->failed;
}

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

int local_ranks_run(int nranks, local_rank_fn fn, void *arg, double watchdog_s, local_ranks_result_t *res)
{
    memset(res, 0, sizeof(*res));
    moea2a_unique_id_t id;
    if (moea2a_get_unique_id(&id) != MOEA2A_SUCCESS) {
        fprintf(stderr, "moea2a_get_unique_id: %s\n", moea2a_last_error(NULL));
        return res->failed = nranks;
    }
    pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
    if (!pids) return res->failed = nranks;
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int rc = fn(r, nranks, id, arg);
            fflush(NULL);
            _exit(rc);
        }
        if (pids[r] < 0) {
            perror("fork");
            res->failed++;
        }
    }
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

#include <pthread.h>
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

/* A child process makes the id and serves its rendezvous, so this process never
 * starts a thread: a process that forks while another of its threads runs hands its
 * children whatever locks that thread held (malloc's, a sanitizer's), and they hang.
 * Returns the maker's pid, or -1 with a zeroed id. */
static pid_t id_maker(moea2a_unique_id_t *id)
{
    int fd[2];
    memset(id, 0, sizeof(*id));
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        moea2a_unique_id_t made;
        if (moea2a_get_unique_id(&made) != MOEA2A_SUCCESS) {
            fprintf(stderr, "moea2a_get_unique_id: %s\n", moea2a_last_error(NULL));
            _exit(1);
        }
        if (write(fd[1], &made, sizeof(made)) != (ssize_t)sizeof(made)) _exit(1);
        close(fd[1]);
        for (;;) pause(); /* until the ranks are done: the parent kills it */
    }
    close(fd[1]);
    if (pid > 0 && read(fd[0], id, sizeof(*id)) != (ssize_t)sizeof(*id)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        pid = -1;
    }
    close(fd[0]);
    return pid;
}

int local_ranks_run(int nranks, local_rank_fn fn, void *arg, double watchdog_s, local_ranks_result_t *res)
{
    memset(res, 0, sizeof(*res));
    fflush(NULL);
    moea2a_unique_id_t id;
    pid_t maker = id_maker(&id);
    pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
    if (maker < 0 || !pids) {
        if (maker > 0) kill(maker, SIGKILL), waitpid(maker, NULL, 0);
        free(pids);
        return res->failed = nranks;
    }
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
                if (r < LOCAL_RANKS_CODES) res->exit_codes[r] = code;
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
    kill(maker, SIGKILL);
    waitpid(maker, NULL, 0);
    return res->failed;
}

typedef struct {
    local_rank_fn fn;
    void *arg;
    moea2a_unique_id_t id;
    int rank, nranks, rc;
} thread_rank_t;

static void *run_thread(void *p)
{
    thread_rank_t *t = p;
    t->rc = t->fn(t->rank, t->nranks, t->id, t->arg);
    return NULL;
}

int local_ranks_run_threads(int nranks, local_rank_fn fn, void *arg, local_ranks_result_t *res)
{
    memset(res, 0, sizeof(*res));
    thread_rank_t *t = calloc((size_t)nranks, sizeof(*t));
    pthread_t *th = calloc((size_t)nranks, sizeof(*th));
    moea2a_unique_id_t id;
    if (!t || !th || moea2a_get_unique_id(&id) != MOEA2A_SUCCESS) {
        if (t && th) fprintf(stderr, "moea2a_get_unique_id: %s\n", moea2a_last_error(NULL));
        free(t), free(th);
        return res->failed = nranks;
    }
    int started = 0;
    for (; started < nranks; started++) {
        t[started] = (thread_rank_t){fn, arg, id, started, nranks, 0};
        if (pthread_create(&th[started], NULL, run_thread, &t[started])) break;
    }
    for (int r = 0; r < started; r++) {
        pthread_join(th[r], NULL);
        if (r < LOCAL_RANKS_CODES) res->exit_codes[r] = t[r].rc;
        res->failed += t[r].rc != 0;
    }
    /* a rank that never started leaves the others waiting until their timeout */
    for (int r = started; r < nranks; r++) {
        if (r < LOCAL_RANKS_CODES) res->exit_codes[r] = 1;
        res->failed++;
    }
    free(t), free(th);
    return res->failed;
}

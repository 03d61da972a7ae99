/* Runs a function as N local ranks: forks N processes that share one unique id made
 * by the parent, and bounds the whole run by a watchdog so nothing can hang (or, for
 * moea2a_perf --threads, runs N threads). Used by moea2a_perf (--ranks N) and by the
 * multi-process tests. */
#ifndef MOEA2A_LOCAL_RANKS_H
#define MOEA2A_LOCAL_RANKS_H
#include <stddef.h>

#include "moea2a.h"

/* Returns the process exit code (0 = success) of one rank. */
typedef int (*local_rank_fn)(int rank, int nranks, moea2a_unique_id_t id, void *arg);

/* Ranks whose exit codes a run keeps (the first ones; every rank counts in failed/hung) */
#define LOCAL_RANKS_CODES 128

typedef struct {
    int failed;      /* ranks that exited non-zero or died of a signal */
    int hung;        /* ranks killed by the watchdog */
    int exit_codes[LOCAL_RANKS_CODES];
} local_ranks_result_t;

/* 0 when every rank exited 0. The id is made, and its rendezvous served, by a child
 * process, so this process never starts a thread or touches a transport: every
 * rank is forked from a clean, single-threaded state (moea2a(7), THREAD SAFETY). */
int local_ranks_run(int nranks, local_rank_fn fn, void *arg, double watchdog_s, local_ranks_result_t *res);

/* The same with the ranks as threads of this process (one CUDA context: ranks that
 * share a GPU run their kernels at once). No watchdog: a thread cannot be killed, so
 * the ranks' own timeouts (MOEA2A_TIMEOUT_S) bound the run. This process must not fork
 * afterwards. */
int local_ranks_run_threads(int nranks, local_rank_fn fn, void *arg, local_ranks_result_t *res);
#endif

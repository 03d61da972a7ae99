/* Peer liveness (watch.c): a thread per communicator that notices a peer's death within
 * milliseconds, whatever MOEA2A_TIMEOUT_S is.
 *
 * Each rank keeps one authenticated TCP connection (over the bootstrap's listener,
 * label "watch") to each rank it watches, used for nothing else. A process that dies,
 * even by SIGKILL, has its sockets closed by its kernel; the watcher thread, blocked in
 * poll() and costing nothing meanwhile, sees the end of the stream and records the
 * rank. On one host each rank also holds a mark, a robust process-shared mutex in
 * shared memory, on which a thread per watched peer of the host waits: the kernel
 * releases it as the dying process's exit begins, where its sockets close only after
 * its memory and earlier files went (a second with NCCL's resources in the process).
 * A rank that leaves cleanly says so first (one byte; its mark's left flag), and is
 * not reported. A host that goes down or is cut off closes no socket: each watcher
 * beats on its links every M2A_WATCH_BEAT_S (whatever its own bound: ranks may set
 * different ones), and a link silent for silence_s
 * (MOEA2A_WATCH_SILENCE_S) is a peer gone. What it cannot see: a process that hangs
 * with its watcher thread running; the bounded waits (MOEA2A_TIMEOUT_S) catch those.
 *
 * Who watches whom: every rank every other up to M2A_WATCH_ALL_MAX ranks; past that,
 * the ranks of its own node (the peers whose death device waits over load/store would
 * otherwise sit out). The relation is symmetric, so both ends of a link agree on it.
 *
 * Consumers read the dead rank (m2a_watch_dead), or hand a word (host memory, e.g.
 * pinned and mapped for device waits) that gets the dead rank + 1. */
#ifndef M2A_WATCH_H
#define M2A_WATCH_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"
#include "wireup/bootstrap.h"

#define M2A_WATCH_ALL_MAX 256
/* How long after the news of a death a host-side collective still waits on its live
 * peers: one the dead rank had done its part of completes, and a rank that left a
 * collective on the news (it will not come) is given up on after this, not at
 * MOEA2A_TIMEOUT_S. Device waits and the NCCL paths' host waits, whose work waits on
 * every peer, do not wait it out. */
#define M2A_WATCH_GRACE_S 1.0
#define M2A_WATCH_MAX_WORDS 64
/* How often a watcher beats on its links: ten beats fit in the default silence bound,
 * so a peer is declared gone only after many missed ones. */
#define M2A_WATCH_BEAT_S 0.5

typedef struct m2a_watch m2a_watch_t;

/* Collective over the ranks that watch each other: links them (watched[q] != 0: this
 * rank watches rank q) and starts the thread; silence_s > 0: a link silent that long is
 * a peer gone (0: only a closed link or a released mark is). Failures are the thread's
 * last error. */
moea2a_result_t m2a_watch_start(m2a_bootstrap_t *bs, const unsigned char *watched, double timeout_s,
                                double silence_s, m2a_watch_t **out);
/* -1 while every watched peer lives (or left cleanly), else the first rank seen dead. */
int m2a_watch_dead(const m2a_watch_t *w);
/* How the first death was seen ("its process exited: ...", "its watch link was silent
 * ..."), once m2a_watch_dead names one. */
void m2a_watch_how(m2a_watch_t *w, char *buf, size_t len);
/* 1 when rank q was seen dead (any of them, not only the first). */
int m2a_watch_is_dead(m2a_watch_t *w, int q);
/* The news m2a_watch_dead reads, for m2a_bootstrap_t.news (NULL for w NULL). */
const m2a_death_news_t *m2a_watch_news(const m2a_watch_t *w);
/* Seconds from the first death's news to now (m2a_now()), or -1 while none came (w
 * NULL included): M2A_WATCH_GRACE_S counts from the news, once, so that the waits
 * one after the other on a rank that died (a call's, then its failure's agreement)
 * do not each wait it out. */
double m2a_watch_dead_since(const m2a_watch_t *w);
/* *word gets the dead rank + 1 once a death is seen (at once if one was already);
 * MOEA2A_ERR_NO_MEMORY past M2A_WATCH_MAX_WORDS words. */
moea2a_result_t m2a_watch_add(m2a_watch_t *w, volatile int32_t *word);
void m2a_watch_remove(m2a_watch_t *w, volatile int32_t *word);
/* Says a clean goodbye to every peer, stops the thread and closes the links. */
void m2a_watch_stop(m2a_watch_t *w);
#endif

/* A minimal TAP producer: ok/skip lines, diagnostics, and the plan printed last. */
#ifndef MOEA2A_TAP_H
#define MOEA2A_TAP_H
#include <stdarg.h>

/* TAP_POINTS="10-19,25" (or "20-") runs a long suite in parts, e.g. over several
 * processes under compute-sanitizer: tap_selected() says whether the next test point is
 * one of them, so the test can leave out its work, and tap_ok reports a point that is
 * not as skipped. Without TAP_POINTS every point is selected. */
int tap_selected(void);
/* Prints "ok N - name" or "not ok N - name"; returns cond. */
int tap_ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tap_skip(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints the plan; returns the exit status (0 if nothing failed). */
int tap_done(void);


/* For code running inside a forked rank: count a failed check and say why as a TAP
 * diagnostic; the rank's exit code then reports the count to the parent. */
#include <stdio.h>
#define RANK_EXPECT(fails, rank, cond, ...)                                         \
    do {                                                                            \
        if (!(cond)) {                                                              \
            printf("# rank %d: %s:%d: ", (rank), __FILE__, __LINE__);               \
            printf(__VA_ARGS__);                                                    \
            printf("\n");                                                           \
            fflush(stdout);                                                         \
            (fails)++;                                                              \
        }                                                                           \
    } while (0)
#endif

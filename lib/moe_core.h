/* The shared core of the MoE layer, below every backend: agreement among the ranks at
 * create, the expert -> rank table, the dispatch result every backend fills, and the
 * phase tracing of the host-driven paths. It calls no backend. */
#ifndef M2A_MOE_CORE_H
#define M2A_MOE_CORE_H
#include "moe.h"

/* Collective step of create: every rank's result (the first failure wins on every
 * rank, named); with value_min, every rank ends with the smallest *value_min. */
moea2a_result_t m2a_moe_agree(moea2a_comm_t comm, moea2a_result_t mine, int *value_min);
/* Collective: every rank's config checked out (mine) and is the same as this one's;
 * MOEA2A_ERR_MISMATCH naming the first rank that differs. */
moea2a_result_t m2a_moe_agree_config(moea2a_comm_t comm, moea2a_result_t mine, const moea2a_moe_config_t *cfg);

/* Collective, for ranks that all saw (status[q * step], every rank's code) that some
 * rank's call failed: each failed rank's own message goes to every rank (over the
 * bootstrap: only failures pay for it). Returns mine where this rank failed, else the
 * first failed rank's code, with "fn failed on rank q: its message". */
moea2a_result_t m2a_moe_tell_failures(moea2a_comm_t comm, const char *fn, moea2a_result_t mine, const int32_t *status,
                                      size_t step);

/* owner[e]: the rank that holds expert e (the map, or contiguous placement). */
void m2a_moe_owner_table(const moea2a_moe_config_t *c, int ep, int32_t *owner);
/* moe->route from the config and moe->h_owner. */
void m2a_moe_set_route(moea2a_moe_t moe);

/* The result of the last dispatch (moe->stride): the workspace's arrays, and either
 * the exact counts (device_stats NULL: the generic paths, from the host's counts and
 * moe->pending_*) or -1 and the device's copy. */
void m2a_moe_fill_result(moea2a_moe_t moe, const int64_t *device_stats, moea2a_dispatch_result_t *result);

/* ---- phase timing (TRACE only) ---------------------------------------------------
 * With MOEA2A_DEBUG=TRACE and the MOE subsystem, the host-driven paths wait for the
 * stream (wait, when not NULL) at each phase boundary and log how long each phase
 * took. The waits change the timing they measure; they exist to find where time
 * goes, never otherwise. */
typedef struct {
    int on, n;
    double t0, last;
    char text[256];
    void (*wait)(void *stream);
} m2a_phase_t;

void m2a_phase_start(m2a_phase_t *ph, void (*wait)(void *stream), void *stream);
void m2a_phase_mark(m2a_phase_t *ph, void *stream, const char *name);
void m2a_phase_report(const m2a_phase_t *ph, const char *what);
#endif

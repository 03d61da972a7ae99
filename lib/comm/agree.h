/* When one rank's part of a collective step fails (agree.c): every rank learns which
 * rank failed and why, so each returns the same code with the failed rank's message. */
#ifndef M2A_AGREE_H
#define M2A_AGREE_H
#include <stddef.h>
#include <stdint.h>

#include "moea2a.h"

/* Collective, for ranks that all saw (status[q * step], every rank's code) that some
 * rank's call failed: each failed rank's own message goes to every rank (over the
 * bootstrap: only failures pay for it). Returns mine where this rank failed, else the
 * first failed rank's code, with "fn failed on rank q: its message". */
moea2a_result_t m2a_comm_tell_failures(moea2a_comm_t comm, const char *fn, moea2a_result_t mine,
                                       const int32_t *status, size_t step);
#endif

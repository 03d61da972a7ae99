/* moea2a_perf's kernel times (perf_kernel_time.c): the span of the GPU work a call
 * enqueues (kernels, copies, memsets), from its first start to its last end, read from
 * CUPTI's activity records: the time DeepEP's and NCCL EP's benchmarks report as kernel
 * time, without the launch latency or the events an event-timed call carries.
 *
 * Calls are tagged: what the calling thread enqueues between perf_kt_tag(tag) and
 * perf_kt_untag() belongs to tag. Records are kept between perf_kt_begin and perf_kt_end
 * only, because tracing the API calls costs host time. CUPTI is loaded at run time
 * (libcupti.so on the library path, then where configure found CUDA); one process
 * records at a time per GPU context, so ranks as threads (--threads) get no kernel times. */
#ifndef MOEA2A_PERF_KERNEL_TIME_H
#define MOEA2A_PERF_KERNEL_TIME_H
#include <stddef.h>
#include <stdint.h>

/* Loads CUPTI once per process; 0 when kernel times can be taken, else -1 with the
 * reason in why (the same reason on every later call). */
int perf_kt_open(char *why, size_t len);
/* Starts recording, forgetting earlier records; 0 on success. */
int perf_kt_begin(void);
void perf_kt_tag(uint64_t tag); /* tag: nonzero */
void perf_kt_untag(void);
/* Stops recording and collects the records: call after the work is finished (the
 * stream synchronized). 0 on success. */
int perf_kt_end(void);
/* Seconds from the first start to the last end of the work tagged tag; 0 when none
 * was recorded. */
double perf_kt_span(uint64_t tag);

/* One piece of the work tagged tag: its name (a kernel's function name without its
 * namespace and template arguments, or "memcpy" / "memset"), its start after the tag's
 * first start and its duration (s). */
typedef struct {
    const char *name;
    double start, dur;
} perf_kt_part_t;

/* The work tagged tag in order of start, up to max pieces into parts; returns how many
 * pieces the tag has (more than max when some were left out). */
int perf_kt_parts(uint64_t tag, perf_kt_part_t *parts, int max);
#endif

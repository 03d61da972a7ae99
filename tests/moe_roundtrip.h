/* One MoE round trip checked against a reference computed on the source rank alone:
 * every token carries small integers (exact in bf16), the expert side returns what it
 * received, so combine's out[t] must be the token's row times the number of distinct
 * ranks its valid top-k experts live on. Used by the soak and multi-host tests. */
#ifndef MOEA2A_TEST_MOE_ROUNDTRIP_H
#define MOEA2A_TEST_MOE_ROUNDTRIP_H
#include <stdint.h>
#include <string.h>

#include "derived_placement.h"
#include "moea2a.h"

#define RT_E 16
#define RT_K 3
#define RT_CAP 32
#define RT_H 16
#define RT_MAX_RANKS 16

typedef struct {
    moea2a_moe_t moe;
    int ep;
    uint64_t seed;
    int32_t ids[RT_CAP * RT_K];
    uint16_t x[RT_CAP * RT_H], out[RT_CAP * RT_H];
} rt_state_t;

static inline moea2a_moe_config_t rt_config(void)
{
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = RT_E, mc.top_k = RT_K, mc.max_tokens_per_rank = RT_CAP, mc.hidden = RT_H;
    mc.memory = MOEA2A_MEMORY_HOST, mc.num_payloads = 1;
    mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, RT_H};
    return mc;
}

static inline uint16_t rt_bf16(int v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact: small integers have no low mantissa bits */
}

static inline uint64_t rt_next(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* The contiguous placement of moea2a_moe(3), written out independently. */
static inline int rt_owner(int e, int ep) { return contiguous_owner(e, RT_E, ep); }

/* A random batch (0..cap tokens, invalid ids included) for iteration it into s->ids
 * and s->x; returns its token count. */
static inline int rt_inputs(rt_state_t *s, long it)
{
    int nt = (int)(rt_next(&s->seed) % (RT_CAP + 1));
    for (int i = 0; i < nt * RT_K; i++) s->ids[i] = (int)(rt_next(&s->seed) % (RT_E + 2)) - 1; /* -1, E invalid */
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < RT_H; h++) s->x[t * RT_H + h] = rt_bf16((t + h + (int)it) % 9 + 1);
    return nt;
}

/* The values of s->out that differ from the reference for the batch of rt_inputs. */
static inline long rt_mismatches(const rt_state_t *s, long it, int nt)
{
    long wrong = 0;
    for (int t = 0; t < nt; t++) {
        int seen[RT_MAX_RANKS] = {0}, copies = 0;
        for (int j = 0; j < RT_K; j++) {
            int e = s->ids[t * RT_K + j];
            if (e < 0 || e >= RT_E) continue;
            int o = rt_owner(e, s->ep);
            copies += !seen[o];
            seen[o] = 1;
        }
        for (int h = 0; h < RT_H; h++) wrong += s->out[t * RT_H + h] != rt_bf16(copies * ((t + h + (int)it) % 9 + 1));
    }
    return wrong;
}

/* Dispatch + combine of a random batch in host memory for iteration it; adds the
 * values that differ from the reference to *mismatches. */
static inline moea2a_result_t rt_step(rt_state_t *s, long it, long *mismatches)
{
    int nt = rt_inputs(s, it);
    const void *pl[1] = {s->x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    moea2a_result_t r = moea2a_dispatch(s->moe, nt, s->ids, NULL, pl, 0, &res, NULL);
    if (r == MOEA2A_SUCCESS) r = moea2a_combine(s->moe, res.payloads[0], s->out, NULL); /* experts return what came */
    if (r == MOEA2A_SUCCESS) *mismatches += rt_mismatches(s, it, nt);
    return r;
}
#endif

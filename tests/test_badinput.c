/* The bad-input matrix: every public function with null pointers, negative and
 * out-of-range values, NaN and infinite timeouts, sizes that overflow, values over
 * capacity, and (on 2 ranks) arguments that disagree between ranks. Each case must
 * return its specific error, never crash, hang or succeed; written from moea2a.h and
 * the man pages alone. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local_ranks.h"
#include "moea2a.h"
#include "tap.h"

#define EXPECT(call, want)                                                                                   \
    do {                                                                                                     \
        moea2a_result_t got_ = (call);                                                                       \
        if (got_ != (want)) {                                                                                \
            printf("# rank %d: %s -> %s, expected %s (%s)\n", rank, #call, moea2a_strerror(got_),            \
                   moea2a_strerror(want), moea2a_last_error(NULL));                                          \
            fails++;                                                                                         \
        }                                                                                                    \
        cases++;                                                                                             \
    } while (0)

static int cases;

static moea2a_moe_config_t moe_config(void)
{
    moea2a_moe_config_t mc = MOEA2A_MOE_CONFIG_INITIALIZER;
    mc.num_experts = 8, mc.top_k = 2, mc.max_tokens_per_rank = 4, mc.hidden = 8, mc.memory = MOEA2A_MEMORY_HOST;
    mc.num_payloads = 1, mc.payloads[0] = (moea2a_payload_desc_t){MOEA2A_BFLOAT16, 8};
    return mc;
}

/* Calls that need no communicator, and init's own checks. */
static int no_comm(int rank)
{
    int fails = 0;
    moea2a_unique_id_t id, zero;
    memset(&zero, 0, sizeof(zero));
    moea2a_comm_t comm;
    EXPECT(moea2a_get_unique_id(NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_get_unique_id(&id), MOEA2A_SUCCESS);
    EXPECT(moea2a_comm_init_rank(NULL, 1, id, 0, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_rank(&comm, 0, id, 0, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_rank(&comm, -3, id, 0, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_rank(&comm, 2, id, 2, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_rank(&comm, 2, id, -1, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_rank(&comm, 1, zero, 0, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    double bad_t[] = {NAN, INFINITY, -INFINITY, 0.0};
    for (int i = 0; i < 4; i++) {
        moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
        cfg.timeout_s = bad_t[i];
        EXPECT(moea2a_comm_init_rank(&comm, 1, id, 0, &cfg), MOEA2A_ERR_INVALID_ARGUMENT);
    }
    moea2a_config_t small = MOEA2A_CONFIG_INITIALIZER;
    small.size = 3;
    EXPECT(moea2a_comm_init_rank(&comm, 1, id, 0, &small), MOEA2A_ERR_INVALID_ARGUMENT);
    setenv("MOEA2A_TIMEOUT_S", "nan", 1);
    EXPECT(moea2a_get_unique_id(&id), MOEA2A_ERR_INVALID_ARGUMENT);
    setenv("MOEA2A_TIMEOUT_S", "inf", 1);
    EXPECT(moea2a_get_unique_id(&id), MOEA2A_ERR_INVALID_ARGUMENT);
    setenv("MOEA2A_TIMEOUT_S", "20", 1);
    EXPECT(moea2a_comm_init_env(NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_init_nccl(NULL, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_destroy(NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_abort(NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_rank(NULL, &rank), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_comm_size(NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    size_t es, bytes;
    EXPECT(moea2a_datatype_size((moea2a_datatype_t)99, &es), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_datatype_size((moea2a_datatype_t)-1, &es), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_datatype_size(MOEA2A_INT32, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    if (moea2a_datatype_name((moea2a_datatype_t)99) != NULL) fails++, printf("# datatype_name(99) is not NULL\n");
    EXPECT(moea2a_get_version(NULL, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_get_params(NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_get_transports(NULL, 4, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_test(NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_wait(NULL), MOEA2A_ERR_INVALID_ARGUMENT);

    /* NVFP4: shapes whose sizes overflow, k not a multiple of 16, null pointers */
    float g = 1.0f, x[32] = {0};
    unsigned char q[16], sf[512];
    EXPECT(moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, SIZE_MAX / 2, 1 << 20, &bytes), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_bytes(MOEA2A_SF_128X4, SIZE_MAX - 3, 16, &bytes), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_bytes(MOEA2A_SF_LINEAR, 4, 17, &bytes), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_bytes((moea2a_sf_layout_t)7, 4, 16, &bytes), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_bytes(MOEA2A_SF_LINEAR, 4, 16, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_quantize(x, MOEA2A_FLOAT32, (size_t)1 << 62, 64, &g, q, sf, MOEA2A_SF_LINEAR, NULL),
           MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_quantize(x, MOEA2A_FLOAT32, 2, 16, NULL, q, sf, MOEA2A_SF_LINEAR, NULL),
           MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_quantize(x, MOEA2A_INT32, 2, 16, &g, q, sf, MOEA2A_SF_LINEAR, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_dequantize(q, sf, MOEA2A_SF_LINEAR, &g, SIZE_MAX / 8, 32, x, MOEA2A_FLOAT32, NULL),
           MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_convert(sf, MOEA2A_SF_LINEAR, q, MOEA2A_SF_8X4, SIZE_MAX - 2, 16, NULL),
           MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_global_scale(x, MOEA2A_FLOAT32, SIZE_MAX / 2, &g, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_global_scale(x, MOEA2A_FLOAT32, 4, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    int32_t counts[1] = {1};
    EXPECT(moea2a_fp4_sf_convert_padded(sf, q, MOEA2A_SF_128X4, counts, 0, 4, 16, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_fp4_sf_convert_padded(sf, q, MOEA2A_SF_128X4, NULL, 1, 4, 16, NULL), MOEA2A_ERR_INVALID_ARGUMENT);

    /* Workspace sizing from a layout: no communicator needed */
    moea2a_moe_layout_t lay = MOEA2A_MOE_LAYOUT_INITIALIZER;
    lay.memory = MOEA2A_MEMORY_HOST;
    moea2a_moe_workspace_sizes_t ws = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    moea2a_moe_config_t mc = moe_config();
    EXPECT(moea2a_moe_workspace_size_layout(&lay, &mc, &ws), MOEA2A_SUCCESS);
    EXPECT(moea2a_moe_workspace_size_layout(NULL, &mc, &ws), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_workspace_size_layout(&lay, NULL, &ws), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_workspace_size_layout(&lay, &mc, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    mc.num_payloads = 2;
    mc.payloads[0] = mc.payloads[1] = (moea2a_payload_desc_t){MOEA2A_INT64, (size_t)1 << 30};
    mc.max_tokens_per_rank = 1 << 30;
    EXPECT(moea2a_moe_workspace_size_layout(&lay, &mc, &ws), MOEA2A_ERR_INVALID_ARGUMENT); /* 2 x 2^63 bytes */
    mc = moe_config();
    mc.payloads[0].elems_per_token = SIZE_MAX / 2;
    EXPECT(moea2a_moe_workspace_size_layout(&lay, &mc, &ws), MOEA2A_ERR_INVALID_ARGUMENT);
    lay.ep = 0;
    mc = moe_config();
    EXPECT(moea2a_moe_workspace_size_layout(&lay, &mc, &ws), MOEA2A_ERR_INVALID_ARGUMENT);
    return fails;
}

/* Calls on a one-rank communicator. */
static int one_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    int fails = no_comm(rank);
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return fails + 1;
    int32_t s[8] = {0}, r[8];
    int64_t c[1] = {1}, d[1] = {0}, neg[1] = {-1}, big[1] = {((int64_t)1 << 61) + 1}, max[1] = {INT64_MAX};
    moea2a_request_t req;
    EXPECT(moea2a_alltoallv(s, NULL, d, r, c, d, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, neg, d, r, c, d, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, c, neg, r, c, d, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, big, d, r, big, d, MOEA2A_INT64, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, max, d, r, max, d, MOEA2A_INT64, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, c, max, r, c, d, MOEA2A_UINT8, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(NULL, c, d, r, c, d, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, c, d, r, c, d, (moea2a_datatype_t)42, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_alltoallv(s, c, d, r, c, d, MOEA2A_INT32, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_ialltoallv(s, c, d, r, c, d, MOEA2A_INT32, comm, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_allgather(s, r, SIZE_MAX / 2, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_allgather(NULL, r, 1, MOEA2A_INT32, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_bcast(s, 1, MOEA2A_INT32, -1, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_bcast(s, 1, MOEA2A_INT32, n, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_bcast(s, SIZE_MAX / 2, MOEA2A_INT32, 0, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_bcast(NULL, 1, MOEA2A_INT32, 0, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_ibarrier(comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_ibarrier(NULL, &req), MOEA2A_ERR_INVALID_ARGUMENT);
    /* a valid call after all that: nothing above broke the communicator */
    EXPECT(moea2a_alltoallv(s, c, d, r, c, d, MOEA2A_INT32, comm, NULL), MOEA2A_SUCCESS);

    /* MoE create */
    moea2a_moe_t moe;
    moea2a_moe_config_t mc = moe_config();
    moea2a_moe_workspace_sizes_t ws = MOEA2A_MOE_WORKSPACE_SIZES_INITIALIZER;
    EXPECT(moea2a_moe_workspace_size(comm, NULL, &ws), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_create(NULL, comm, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_create(&moe, NULL, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_create(&moe, comm, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    int32_t map[8] = {0, 0, 0, 0, 0, 0, 0, 5};
    for (int v = 0; v < 13; v++) {
        mc = moe_config();
        switch (v) {
        case 0: mc.num_experts = 0; break;
        case 1: mc.top_k = -2; break;
        case 2: mc.max_tokens_per_rank = -4; break;
        case 3: mc.num_payloads = 9; break;
        case 4: mc.payloads[0].dtype = (moea2a_datatype_t)77; break;
        case 5: mc.placement = MOEA2A_PLACEMENT_MAP; break; /* no map */
        case 6: mc.placement = MOEA2A_PLACEMENT_MAP, mc.expert_to_rank = map; break; /* rank 5 */
        case 7: mc.flags = 1u << 20; break;
        case 8: mc.num_sms = 300; break;
        case 9: mc.memory = (moea2a_memory_t)7; break;
        case 10: mc.invalid_expert_id = 0; break; /* an expert's id */
        case 11: mc.invalid_expert_id = 7; break;
        default: mc.max_tokens_per_rank = 1 << 30, mc.hidden = 1 << 30, mc.combine_dtype = MOEA2A_FLOAT32; break;
        }
        EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    }
    /* copy-engine mode: payloads as given, on the load/store path only (host memory
     * has none: unavailable, with the reason, at create and at sizing) */
    mc = moe_config();
    mc.flags = MOEA2A_MOE_COPY_ENGINE, mc.payloads[0].elems_per_token = 128;
    mc.wire[0] = (moea2a_wire_t){MOEA2A_WIRE_FP8, MOEA2A_FP8_SCALES_ROW_MAJOR, 0};
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    mc = moe_config();
    mc.flags = MOEA2A_MOE_COPY_ENGINE | MOEA2A_MOE_NO_NVLINK;
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    mc.flags = MOEA2A_MOE_COPY_ENGINE;
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_UNAVAILABLE);
    EXPECT(moea2a_moe_workspace_size(comm, &mc, &ws), MOEA2A_ERR_UNAVAILABLE);
    if (!strstr(moea2a_last_error(comm), "host memory")) {
        printf("# rank %d: copy-engine mode on host memory: the message does not say why: %s\n", rank,
               moea2a_last_error(comm));
        fails++;
    }
    /* ids outside the experts are fine as the invalid id (-1 and E are the usual ones) */
    mc = moe_config();
    mc.invalid_expert_id = 8;
    EXPECT(moea2a_moe_workspace_size(comm, &mc, &ws), MOEA2A_SUCCESS);
    mc.invalid_expert_id = -7;
    EXPECT(moea2a_moe_workspace_size(comm, &mc, &ws), MOEA2A_SUCCESS);
    /* a valid create after all that */
    mc = moe_config();
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_SUCCESS);
    int32_t ids[2 * 8] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
    uint16_t x[8 * 8] = {0}, y[8 * 8];
    const void *pl[1] = {x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    size_t rows;
    void *cb;
    EXPECT(moea2a_moe_max_recv_rows(moe, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_max_recv_rows(NULL, &rows), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_combine_buffer(moe, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_combine_buffer(NULL, &cb), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_status(NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_ERR_STATE); /* no dispatch yet */
    EXPECT(moea2a_dispatch(moe, -1, ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_dispatch(moe, 5, ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_CAPACITY);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, -1, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 5, &res, NULL), MOEA2A_ERR_CAPACITY);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 3, &res, NULL), MOEA2A_ERR_CAPACITY); /* n > runtime max */
    EXPECT(moea2a_dispatch(moe, 4, NULL, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, NULL, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 0, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_dispatch(NULL, 4, ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    /* int32 ids off their 4-byte grid (an odd address) would be misread, or fault a GPU */
    int32_t ids_buf[2 * 8 + 1];
    int32_t *odd_ids = (int32_t *)(void *)((unsigned char *)ids_buf + 1);
    memcpy(odd_ids, ids, sizeof(ids));
    EXPECT(moea2a_dispatch(moe, 4, odd_ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    /* bf16 payload rows sent as they are move as bytes: an odd address is fine */
    unsigned char x_buf[sizeof(x) + 1];
    memcpy(x_buf + 1, x, sizeof(x));
    const void *odd_pl[1] = {x_buf + 1};
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, odd_pl, 0, &res, NULL), MOEA2A_SUCCESS);
    EXPECT(moea2a_combine(moe, NULL, (unsigned char *)y + 1, NULL), MOEA2A_ERR_INVALID_ARGUMENT); /* bf16 out */
    EXPECT(moea2a_combine(moe, (const unsigned char *)x_buf + 1, y, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_SUCCESS);
    /* rejected dispatches consumed nothing: a valid one works, a second is STATE */
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 0, &res, NULL), MOEA2A_SUCCESS);
    EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_STATE);
    EXPECT(moea2a_combine(moe, NULL, NULL, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_SUCCESS); /* the rejected combine left the dispatch pending */
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_ERR_STATE);
    EXPECT(moea2a_moe_destroy(moe), MOEA2A_SUCCESS);
    EXPECT(moea2a_moe_destroy(NULL), MOEA2A_ERR_INVALID_ARGUMENT);

    /* A dispatch-only context (hidden = 0): dispatch after dispatch; it has no combine */
    mc = moe_config();
    mc.hidden = 0;
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_SUCCESS);
    for (int i = 0; i < 3; i++) EXPECT(moea2a_dispatch(moe, 4, ids, NULL, pl, 0, &res, NULL), MOEA2A_SUCCESS);
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    EXPECT(moea2a_moe_destroy(moe), MOEA2A_SUCCESS);
    EXPECT(moea2a_comm_destroy(comm), MOEA2A_SUCCESS);
    return fails;
}

/* Arguments that disagree between 2 ranks: every rank gets the documented code. */
static int two_ranks(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    (void)arg;
    int fails = 0;
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return 1;
    int32_t v = 7;
    /* bcast: two roots; every rank gets MISMATCH and the communicator stays usable */
    EXPECT(moea2a_bcast(&v, 1, MOEA2A_INT32, rank, comm, NULL), MOEA2A_ERR_MISMATCH);
    EXPECT(moea2a_bcast(&v, (size_t)rank + 1, MOEA2A_INT32, 0, comm, NULL), MOEA2A_ERR_MISMATCH);
    EXPECT(moea2a_bcast(&v, 1, MOEA2A_INT32, 0, comm, NULL), MOEA2A_SUCCESS);
    /* MoE: a config that differs on one rank fails create on both */
    moea2a_moe_config_t mc = moe_config();
    if (rank == 1) mc.top_k = 3;
    moea2a_moe_t moe;
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_MISMATCH);
    /* a config that is bad on one rank only: INVALID_ARGUMENT there, and the healthy
     * rank learns of it with the same code (moea2a_moe(3)) */
    mc = moe_config();
    if (rank == 1) mc.num_experts = 0;
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_ERR_INVALID_ARGUMENT);
    /* runtime_max that differs between the ranks of one dispatch: MISMATCH on both */
    mc = moe_config();
    EXPECT(moea2a_moe_create(&moe, comm, &mc), MOEA2A_SUCCESS);
    int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint16_t x[4 * 8] = {0};
    const void *pl[1] = {x};
    moea2a_dispatch_result_t res = MOEA2A_DISPATCH_RESULT_INITIALIZER;
    EXPECT(moea2a_dispatch(moe, 2, ids, NULL, pl, rank ? 3 : 4, &res, NULL), MOEA2A_ERR_MISMATCH);
    /* ... which consumed nothing: the context and the communicator go on (moea2a_moe(3)) */
    EXPECT(moea2a_dispatch(moe, 2, ids, NULL, pl, 0, &res, NULL), MOEA2A_SUCCESS);
    uint16_t y[4 * 8];
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_SUCCESS);
    /* a rank whose arguments are bad: its error, with the same code on the healthy rank */
    EXPECT(moea2a_dispatch(moe, rank ? -1 : 2, ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    /* more tokens than this call's stride on rank 1: CAPACITY on both, and rank 0's
     * message names the stride rank 1 passed, not max_tokens_per_rank (which was enough) */
    EXPECT(moea2a_dispatch(moe, rank ? 3 : 1, ids, NULL, pl, 2, &res, NULL), MOEA2A_ERR_CAPACITY);
    if (rank == 0 && (!strstr(moea2a_last_error(comm), "on rank 1: num_tokens=3 exceeds runtime_max_tokens_per_rank=2") ||
                      strstr(moea2a_last_error(comm), "raise max_tokens_per_rank")))
        printf("# rank 0: the message about rank 1's stride is wrong: %s\n", moea2a_last_error(comm)), fails++;
    /* every failure carries the failed rank's reason to its peers, not only its code */
    EXPECT(moea2a_dispatch(moe, 2, rank ? NULL : ids, NULL, pl, 0, &res, NULL), MOEA2A_ERR_INVALID_ARGUMENT);
    if (rank == 0 && !strstr(moea2a_last_error(comm), "moea2a_dispatch failed on rank 1: topk_ids is NULL"))
        printf("# rank 0: rank 1's reason did not come with its code: %s\n", moea2a_last_error(comm)), fails++;
    EXPECT(moea2a_dispatch(moe, 2, ids, NULL, pl, 0, &res, NULL), MOEA2A_SUCCESS);
    EXPECT(moea2a_combine(moe, NULL, rank ? (unsigned char *)y + 1 : (unsigned char *)y, NULL),
           MOEA2A_ERR_INVALID_ARGUMENT);
    if (rank == 0 && !strstr(moea2a_last_error(comm), "moea2a_combine failed on rank 1: "))
        printf("# rank 0: rank 1's combine reason did not come: %s\n", moea2a_last_error(comm)), fails++;
    EXPECT(moea2a_combine(moe, NULL, y, NULL), MOEA2A_SUCCESS);
    /* an idle rank may pass NULL arrays; the generic path fills the counts, no device_stats */
    EXPECT(moea2a_dispatch(moe, rank ? 0 : 2, rank ? NULL : ids, NULL, rank ? NULL : pl, 0, &res, NULL), MOEA2A_SUCCESS);
    if (res.device_stats != NULL || res.total_recv < 0 || res.sent_rows != (rank ? 0 : res.sent_rows))
        printf("# rank %d: host-path counts or device_stats wrong\n", rank), fails++;
    EXPECT(moea2a_combine(moe, NULL, rank ? NULL : y, NULL), MOEA2A_SUCCESS);
    EXPECT(moea2a_barrier(comm), MOEA2A_SUCCESS);
    moea2a_moe_destroy(moe);
    moea2a_comm_destroy(comm);
    return fails;
}

int main(void)
{
    setenv("MOEA2A_TIMEOUT_S", "20", 1);
    local_ranks_result_t res;
    local_ranks_run(1, one_rank, NULL, 60.0, &res);
    tap_ok(res.failed == 0 && res.hung == 0, "bad input on one rank: every case returns its error (exit %d)",
           res.exit_codes[0]);
    local_ranks_run(2, two_ranks, NULL, 60.0, &res);
    tap_ok(res.failed == 0 && res.hung == 0,
           "arguments that disagree between 2 ranks: every rank gets the documented error (exits %d, %d)",
           res.exit_codes[0], res.exit_codes[1]);
    return tap_done();
}

/* UCX transport: collectives as sets of tagged point-to-point messages on one UCP
 * worker. UCX picks shared memory between processes of a node and TCP or InfiniBand
 * across nodes. Moves host memory, and CUDA memory where the UCX build supports it.
 *
 * Tags: [ sequence number : 32 | operation : 8 | source rank : 24 ]. Every rank
 * calls collectives in the same order, so the sequence number matches a message to
 * its collective without any handshake. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "moea2a.h"
#include "moea2a_transport_v1.h"

enum { OP_ALLTOALLV = 1, OP_ALLGATHER, OP_BCAST, OP_BARRIER };

typedef struct ucx_comm ucx_comm_t;

/* What UCX's error callback gets: the rank behind the endpoint. */
typedef struct {
    ucx_comm_t *c;
    int rank;
} peer_ref_t;

struct ucx_comm {
    const moea2a_core_v1_t *core;
    int rank, nranks;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h *eps;
    peer_ref_t *refs;       /* [nranks], the error callback's argument per endpoint */
    ucs_status_t *failed;   /* [nranks]: UCS_OK, or why UCX gave up on that rank */
    int first_failed;       /* the first rank UCX reported dead, -1 while none */
    uint32_t seq;
};

typedef struct {
    void *req;          /* UCX request; NULL once complete */
    int peer;
    int is_recv;
    size_t expect;      /* bytes a receive must get */
    ucp_tag_recv_info_t info;
} slot_t;

typedef struct {
    int n, pending;
    slot_t *slots;
} ucx_op_t;

#define fail(c, result, ...) moea2a_core_fail((c)->core, (result), __VA_ARGS__)

static void log_msg(ucx_comm_t *c, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    c->core->log(level, fmt, ap);
    va_end(ap);
}

static ucp_tag_t make_tag(uint32_t seq, int op, int src)
{
    return ((ucp_tag_t)seq << 32) | ((ucp_tag_t)op << 24) | (ucp_tag_t)(src & 0xffffff);
}

/* Whether UCX_TLS lets UCX use its shared-memory transports (a setting for a
 * transport that is not loaded makes UCX warn of an invalid configuration). */
static int may_use_shared_memory(void)
{
    const char *tls = getenv("UCX_TLS");
    if (!tls || !*tls || *tls == '^') return 1;
    static const char *const names[] = {"sm", "shm", "mm", "posix", "sysv", "all"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        for (const char *p = tls; (p = strstr(p, names[i])); p += n)
            if ((p == tls || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    }
    return 0;
}

static int ucx_init_local(const moea2a_core_v1_t *core, void **tcomm, void **addr, size_t *addr_len,
                          unsigned *mem_types)
{
    ucx_comm_t *c = calloc(1, sizeof(*c));
    if (!c) return MOEA2A_ERR_NO_MEMORY;
    c->core = core;
    c->rank = core->rank;
    c->nranks = core->nranks;
    c->first_failed = -1;
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        int r = fail(c, MOEA2A_ERR_TRANSPORT, "ucx: ucp_config_read: %s", ucs_status_string(st));
        free(c);
        return r;
    }
    /* UCX probes idle peers every 20 s by default, longer than a typical
     * MOEA2A_TIMEOUT_S: probe often enough that a dead peer is named before the
     * core's timeout expires, unless the user chose an interval. */
    if (!getenv("UCX_KEEPALIVE_INTERVAL")) {
        char iv[32];
        double t = core->timeout_s / 4 < 1.0 ? core->timeout_s / 4 : 1.0;
        snprintf(iv, sizeof(iv), "%.0fms", t < 0.05 ? 50.0 : t * 1000.0);
        ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", iv);
    }
    /* Shared memory takes part in peer-failure handling only when asked (UCX keeps
     * it off by default); without this, peer error mode would move intra-node
     * traffic to TCP. */
    if (may_use_shared_memory() && !getenv("UCX_MM_ERROR_HANDLING") && !getenv("UCX_POSIX_ERROR_HANDLING") &&
        !getenv("UCX_SYSV_ERROR_HANDLING"))
        if (ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y") != UCS_OK)
            log_msg(c, 1, "ucx: this UCX cannot enable shared-memory error handling; peers on this node may use TCP");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                      .features = UCP_FEATURE_TAG, .mt_workers_shared = 0};
    st = ucp_init(&p, cfg, &c->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        int r = fail(c, MOEA2A_ERR_TRANSPORT, "ucx: ucp_init: %s", ucs_status_string(st));
        free(c);
        return r;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_address_t *a;
    st = ucp_worker_create(c->ctx, &wp, &c->worker);
    if (st == UCS_OK) st = ucp_worker_get_address(c->worker, &a, addr_len);
    if (st != UCS_OK) {
        int r = fail(c, MOEA2A_ERR_TRANSPORT, "ucx: worker setup: %s", ucs_status_string(st));
        if (c->worker) ucp_worker_destroy(c->worker);
        ucp_cleanup(c->ctx);
        free(c);
        return r;
    }
    *addr = malloc(*addr_len);
    if (*addr) memcpy(*addr, a, *addr_len);
    ucp_worker_release_address(c->worker, a);

    *mem_types = MOEA2A_MEM_HOST;
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(c->ctx, &ca) == UCS_OK && (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        *mem_types |= MOEA2A_MEM_CUDA;
    log_msg(c, 2, "ucx: worker ready (%s CUDA memory)", (*mem_types & MOEA2A_MEM_CUDA) ? "with" : "without");
    *tcomm = c;
    return *addr ? MOEA2A_SUCCESS : MOEA2A_ERR_NO_MEMORY;
}

/* UCX calls this from ucp_worker_progress when it gives up on a peer. Without it
 * (the default error mode) a peer that dies in the middle of a shared-memory copy
 * makes UCX abort the survivors. */
static void peer_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_ref_t *ref = arg;
    ucx_comm_t *c = ref->c;
    (void)ep;
    if (c->failed[ref->rank] != UCS_OK) return;
    c->failed[ref->rank] = status;
    if (c->first_failed < 0) c->first_failed = ref->rank;
    log_msg(c, 1, "ucx: rank %d is unreachable: %s", ref->rank, ucs_status_string(status));
}

static int ucx_connect(void *tcomm, const void *const *addrs, const size_t *lens)
{
    ucx_comm_t *c = tcomm;
    c->eps = calloc((size_t)c->nranks, sizeof(*c->eps));
    c->refs = calloc((size_t)c->nranks, sizeof(*c->refs));
    c->failed = calloc((size_t)c->nranks, sizeof(*c->failed));
    if (!c->eps || !c->refs || !c->failed) return MOEA2A_ERR_NO_MEMORY;
    (void)lens;
    for (int r = 0; r < c->nranks; r++) {
        c->refs[r] = (peer_ref_t){c, r};
        /* Peer error mode on every endpoint but our own (a process cannot outlive
         * itself, and UCX's loopback transport has no failure handling). */
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                              .address = (const ucp_address_t *)addrs[r]};
        if (r != c->rank) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
            ep.err_handler = (ucp_err_handler_t){.cb = peer_failed, .arg = &c->refs[r]};
        }
        ucs_status_t st = ucp_ep_create(c->worker, &ep, &c->eps[r]);
        if (st != UCS_OK) {
            c->eps[r] = NULL;
            return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: cannot reach rank %d: %s", r, ucs_status_string(st));
        }
    }
    return MOEA2A_SUCCESS;
}

static void ucx_finalize(void *tcomm, int force)
{
    ucx_comm_t *c = tcomm;
    if (c->eps) {
        double deadline = moea2a_transport_now() + (force ? 1.0 : c->core->timeout_s);
        for (int r = 0; r < c->nranks; r++) {
            if (!c->eps[r]) continue;
            /* A peer UCX reported dead cannot take part in a graceful close. */
            int hard = force || (c->failed && c->failed[r] != UCS_OK);
            ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                     .flags = hard ? UCP_EP_CLOSE_FLAG_FORCE : 0};
            void *req = ucp_ep_close_nbx(c->eps[r], &p);
            if (UCS_PTR_IS_PTR(req)) {
                while (ucp_request_check_status(req) == UCS_INPROGRESS && moea2a_transport_now() < deadline)
                    ucp_worker_progress(c->worker);
                ucp_request_free(req);
            }
        }
    }
    if (c->worker) ucp_worker_destroy(c->worker);
    if (c->ctx) ucp_cleanup(c->ctx);
    free(c->eps);
    free(c->refs);
    free(c->failed);
    free(c);
}

/* ---- operations ------------------------------------------------------------------ */

static ucx_op_t *op_new(int n)
{
    ucx_op_t *op = calloc(1, sizeof(*op));
    if (op && !(op->slots = calloc((size_t)(n ? n : 1), sizeof(slot_t)))) {
        free(op);
        op = NULL;
    }
    return op;
}

static int status_error(ucx_comm_t *c, const slot_t *s, ucs_status_t st);

static int post_send(ucx_comm_t *c, ucx_op_t *op, int peer, const void *buf, size_t len, ucp_tag_t tag, unsigned mem)
{
    slot_t *s = &op->slots[op->n++];
    s->peer = peer;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE,
                             .memory_type = mem == MOEA2A_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST};
    void *req = ucp_tag_send_nbx(c->eps[peer], buf, len, tag, &p);
    if (UCS_PTR_IS_ERR(req)) return status_error(c, s, UCS_PTR_STATUS(req));
    s->req = req;
    if (req) op->pending++;
    return MOEA2A_SUCCESS;
}

static int post_recv(ucx_comm_t *c, ucx_op_t *op, int peer, void *buf, size_t len, ucp_tag_t tag, unsigned mem)
{
    slot_t *s = &op->slots[op->n++];
    s->peer = peer;
    s->is_recv = 1;
    s->expect = len;
    s->info.length = len;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_RECV_INFO,
                             .memory_type = mem == MOEA2A_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
                             .recv_info.tag_info = &s->info};
    void *req = ucp_tag_recv_nbx(c->worker, buf, len, tag, (ucp_tag_t)-1, &p);
    if (UCS_PTR_IS_ERR(req)) return status_error(c, s, UCS_PTR_STATUS(req));
    s->req = req;
    if (req) op->pending++;
    else if (s->info.length != len)
        return fail(c, MOEA2A_ERR_MISMATCH, "rank %d sent %zu bytes where this rank expected %zu", peer,
                    s->info.length, len);
    return MOEA2A_SUCCESS;
}

static void op_release(ucx_comm_t *c, ucx_op_t *op)
{
    for (int i = 0; i < op->n; i++) {
        slot_t *s = &op->slots[i];
        if (!s->req) continue;
        /* A receive still posted would match a later collective's message: cancel it.
         * ucp_request_free lets UCX release either kind once it completes. */
        if (s->is_recv && ucp_request_check_status(s->req) == UCS_INPROGRESS) ucp_request_cancel(c->worker, s->req);
        ucp_request_free(s->req);
        s->req = NULL;
    }
    free(op->slots);
    free(op);
}

/* Ends a start that failed part-way. */
static int start_failed(ucx_comm_t *c, ucx_op_t *op, int r)
{
    op_release(c, op);
    return r;
}

/* Posts one receive from and one send to every rank (byte counts and offsets per
 * peer): alltoallv directly, allgather with the same block for everyone. */
static int start_exchange(ucx_comm_t *c, int opcode, const void *sbuf, const size_t *sc, const size_t *sd,
                          void *rbuf, const size_t *rc, const size_t *rd, unsigned mem, void **out)
{
    ucx_op_t *op = op_new(2 * c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = c->seq++;
    int r = MOEA2A_SUCCESS;
    for (int i = 0; i < c->nranks && r == MOEA2A_SUCCESS; i++) {
        int peer = (c->rank + c->nranks - i) % c->nranks; /* stagger so no rank is everyone's first */
        r = post_recv(c, op, peer, (char *)rbuf + rd[peer], rc[peer], make_tag(seq, opcode, peer), mem);
    }
    for (int i = 0; i < c->nranks && r == MOEA2A_SUCCESS; i++) {
        int peer = (c->rank + i) % c->nranks;
        r = post_send(c, op, peer, (const char *)sbuf + sd[peer], sc[peer], make_tag(seq, opcode, c->rank), mem);
    }
    if (r != MOEA2A_SUCCESS) return start_failed(c, op, r);
    *out = op;
    return MOEA2A_SUCCESS;
}

static int ucx_alltoallv(void *tcomm, const void *sbuf, const size_t *sc, const size_t *sd, void *rbuf,
                         const size_t *rc, const size_t *rd, unsigned mem, void *stream, void **out)
{
    (void)stream;
    return start_exchange(tcomm, OP_ALLTOALLV, sbuf, sc, sd, rbuf, rc, rd, mem, out);
}

static int ucx_allgather(void *tcomm, const void *sbuf, void *rbuf, size_t bytes, unsigned mem, void *stream,
                         void **out)
{
    ucx_comm_t *c = tcomm;
    (void)stream;
    size_t *v = malloc(sizeof(size_t) * 3 * (size_t)c->nranks);
    if (!v) return MOEA2A_ERR_NO_MEMORY;
    size_t *counts = v, *zero = v + c->nranks, *offs = v + 2 * c->nranks;
    for (int p = 0; p < c->nranks; p++) counts[p] = bytes, zero[p] = 0, offs[p] = (size_t)p * bytes;
    int r = start_exchange(c, OP_ALLGATHER, sbuf, counts, zero, rbuf, counts, offs, mem, out);
    free(v); /* UCX has the addresses; the vectors are not needed after posting */
    return r;
}

static int ucx_bcast(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **out)
{
    ucx_comm_t *c = tcomm;
    (void)stream;
    ucx_op_t *op = op_new(c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = c->seq++;
    int r = MOEA2A_SUCCESS;
    if (c->rank == root) {
        for (int i = 1; i < c->nranks && r == MOEA2A_SUCCESS; i++)
            r = post_send(c, op, (root + i) % c->nranks, buf, bytes, make_tag(seq, OP_BCAST, root), mem);
    } else {
        r = post_recv(c, op, root, buf, bytes, make_tag(seq, OP_BCAST, root), mem);
    }
    if (r != MOEA2A_SUCCESS) return start_failed(c, op, r);
    *out = op;
    return MOEA2A_SUCCESS;
}

static int ucx_barrier(void *tcomm, void **out)
{
    ucx_comm_t *c = tcomm;
    ucx_op_t *op = op_new(2 * c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = c->seq++;
    int r = MOEA2A_SUCCESS;
    for (int peer = 0; peer < c->nranks && r == MOEA2A_SUCCESS; peer++)
        if (peer != c->rank) r = post_recv(c, op, peer, NULL, 0, make_tag(seq, OP_BARRIER, peer), MOEA2A_MEM_HOST);
    for (int peer = 0; peer < c->nranks && r == MOEA2A_SUCCESS; peer++)
        if (peer != c->rank) r = post_send(c, op, peer, NULL, 0, make_tag(seq, OP_BARRIER, c->rank), MOEA2A_MEM_HOST);
    if (r != MOEA2A_SUCCESS) return start_failed(c, op, r);
    *out = op;
    return MOEA2A_SUCCESS;
}

static int status_error(ucx_comm_t *c, const slot_t *s, ucs_status_t st)
{
    const char *dir = s->is_recv ? "receive from" : "send to";
    if (st == UCS_ERR_MESSAGE_TRUNCATED)
        return fail(c, MOEA2A_ERR_MISMATCH, "rank %d sent more than the %zu bytes this rank expected", s->peer, s->expect);
    /* Errors of the path to the peer (a dead process's shared memory segment, a reset
     * socket), reported before or instead of the endpoint's error callback. */
    if (c->failed[s->peer] != UCS_OK || st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
        st == UCS_ERR_UNREACHABLE || st == UCS_ERR_CANCELED || st == UCS_ERR_NOT_CONNECTED ||
        st == UCS_ERR_SHMEM_SEGMENT || st == UCS_ERR_IO_ERROR || st == UCS_ERR_REJECTED || st == UCS_ERR_TIMED_OUT)
        return fail(c, MOEA2A_ERR_PEER_FAILED, "ucx: %s rank %d failed: rank %d died or became unreachable (%s)", dir,
                    s->peer, s->peer, ucs_status_string(c->failed[s->peer] != UCS_OK ? c->failed[s->peer] : st));
    return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: %s rank %d failed: %s", dir, s->peer, ucs_status_string(st));
}

static int ucx_test(void *tcomm, void *opaque, int *done)
{
    ucx_comm_t *c = tcomm;
    ucx_op_t *op = opaque;
    if (op->pending) ucp_worker_progress(c->worker);
    for (int i = 0; i < op->n && op->pending; i++) {
        slot_t *s = &op->slots[i];
        if (!s->req) continue;
        ucs_status_t st = ucp_request_check_status(s->req);
        /* A receive is posted on the worker, not on the endpoint, so UCX never fails
         * it when the sender dies: the error callback's verdict ends it. */
        if (st == UCS_INPROGRESS && c->failed[s->peer] != UCS_OK) {
            op->pending--;
            return status_error(c, s, c->failed[s->peer]);
        }
        if (st == UCS_INPROGRESS) continue;
        if (st == UCS_OK && s->is_recv) ucp_tag_recv_request_test(s->req, &s->info);
        ucp_request_free(s->req);
        s->req = NULL;
        op->pending--;
        if (st != UCS_OK) return status_error(c, s, st);
        if (s->is_recv && s->info.length != s->expect)
            return fail(c, MOEA2A_ERR_MISMATCH, "rank %d sent %zu bytes where this rank expected %zu", s->peer,
                        s->info.length, s->expect);
    }
    *done = op->pending == 0;
    return MOEA2A_SUCCESS;
}

static void ucx_describe(void *tcomm, void *opaque, char *buf, size_t len)
{
    (void)tcomm;
    ucx_op_t *op = opaque;
    size_t o = (size_t)snprintf(buf, len, "ranks");
    int any = 0;
    for (int i = 0; i < op->n && o < len; i++)
        if (op->slots[i].req && op->slots[i].is_recv)
            o += (size_t)snprintf(buf + o, len - o, "%s%d", any++ ? "," : " ", op->slots[i].peer);
    if (!any && o < len) snprintf(buf + o, len - o, " (sends still in flight)");
}

static void ucx_op_free(void *tcomm, void *op) { op_release(tcomm, op); }

__attribute__((visibility("default"))) const moea2a_transport_v1_t moea2a_transport_v1 = {
    .name = "ucx", .abi_version = MOEA2A_TRANSPORT_ABI_VERSION,
    /* setup */
    .init_local = ucx_init_local, .connect = ucx_connect, .finalize = ucx_finalize,
    /* collectives, and the operations they return */
    .alltoallv = ucx_alltoallv, .allgather = ucx_allgather, .bcast = ucx_bcast, .barrier = ucx_barrier,
    .test = ucx_test, .describe = ucx_describe, .op_free = ucx_op_free,
};

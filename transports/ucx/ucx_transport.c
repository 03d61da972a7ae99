/* UCX transport: collectives as sets of tagged point-to-point messages on one UCP
 * worker. UCX picks shared memory between processes of a node and TCP or InfiniBand
 * across nodes. Moves host memory, and CUDA memory where the UCX build supports it.
 *
 * Tags: [ sequence number : 32 | operation : 8 | source rank : 24 ]. Every rank
 * calls collectives in the same order, so the sequence number matches a message to
 * its collective without any handshake. A communicator shrunk from another keeps its
 * worker and endpoints (no new addresses to exchange) and numbers its collectives
 * apart (SEQ_BITS). */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "moea2a.h"
#include "moea2a_transport_v2.h"

enum { OP_ALLTOALLV = 1, OP_ALLGATHER, OP_BCAST, OP_BARRIER };

typedef struct ucx_net ucx_net_t;

/* What UCX's error callback gets: the endpoint's rank in the net. */
typedef struct {
    ucx_net_t *net;
    int rank;
} peer_ref_t;

/* The worker and one endpoint per rank of the communicator that made them (numbered
 * as there), shared with the communicators shrunk from it, released by the last. The
 * worker is single-threaded and communicators may be used by different threads at
 * once (moea2a(7)), so every call that touches it holds lock. */
struct ucx_net {
    pthread_mutex_t lock;
    int users, nranks;
    unsigned mem_types;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h *eps;
    peer_ref_t *refs;     /* [nranks], the error callback's argument per endpoint */
    ucs_status_t *failed; /* [nranks]: UCS_OK, or why UCX gave up on that rank */
    void (*log)(int level, const char *fmt, va_list ap);
};

typedef struct {
    const moea2a_core_v1_t *core;
    int rank, nranks;
    ucx_net_t *net;
    int *at;      /* [nranks]: each rank's number in net */
    uint32_t seq; /* [ communicator : 12 | collective : 20 ] */
} ucx_comm_t;

/* Sequence numbers: a communicator's own in the low bits, so that one shrunk from
 * another (sharing its worker) never matches the other's messages. */
#define SEQ_BITS 20

static uint32_t next_seq(ucx_comm_t *c)
{
    const uint32_t s = c->seq, low = (1u << SEQ_BITS) - 1;
    c->seq = (s & ~low) | ((s + 1) & low);
    return s;
}

static ucp_ep_h ep_of(const ucx_comm_t *c, int peer) { return c->net->eps[c->at[peer]]; }
static ucs_status_t failed_of(const ucx_comm_t *c, int peer) { return c->net->failed[c->at[peer]]; }

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

static void log_net(ucx_net_t *net, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    net->log(level, fmt, ap);
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

/* Releases a net once its last communicator is gone: endpoints closed (those to
 * ranks UCX reported dead, or all when force, without the peers), worker, context. */
static void net_release(ucx_net_t *net, int force, double timeout_s)
{
    pthread_mutex_lock(&net->lock);
    const int last = --net->users == 0;
    pthread_mutex_unlock(&net->lock);
    if (!last) return;
    if (net->eps) {
        double deadline = moea2a_transport_now() + (force ? 1.0 : timeout_s);
        for (int r = 0; r < net->nranks; r++) {
            if (!net->eps[r]) continue;
            /* A peer UCX reported dead cannot take part in a graceful close. */
            int hard = force || net->failed[r] != UCS_OK;
            ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                     .flags = hard ? UCP_EP_CLOSE_FLAG_FORCE : 0};
            void *req = ucp_ep_close_nbx(net->eps[r], &p);
            if (UCS_PTR_IS_PTR(req)) {
                while (ucp_request_check_status(req) == UCS_INPROGRESS && moea2a_transport_now() < deadline)
                    ucp_worker_progress(net->worker);
                ucp_request_free(req);
            }
        }
    }
    if (net->worker) ucp_worker_destroy(net->worker);
    if (net->ctx) ucp_cleanup(net->ctx);
    free(net->eps);
    free(net->refs);
    free(net->failed);
    pthread_mutex_destroy(&net->lock);
    free(net);
}

static void ucx_finalize(void *tcomm, int force)
{
    ucx_comm_t *c = tcomm;
    if (c->net) net_release(c->net, force, c->core->timeout_s);
    free(c->at);
    free(c);
}

/* A communicator's state on a net of its own (init_local) or a parent's (shrink). */
static ucx_comm_t *comm_new(const moea2a_core_v1_t *core)
{
    ucx_comm_t *c = calloc(1, sizeof(*c));
    if (c && !(c->at = calloc((size_t)core->nranks, sizeof(*c->at)))) {
        free(c);
        return NULL;
    }
    if (c) c->core = core, c->rank = core->rank, c->nranks = core->nranks;
    return c;
}

static int ucx_init_local(const moea2a_core_v1_t *core, void **tcomm, void **addr, size_t *addr_len,
                          unsigned *mem_types)
{
    ucx_comm_t *c = comm_new(core);
    ucx_net_t *net = calloc(1, sizeof(*net));
    if (!c || !net) {
        free(net);
        if (c) ucx_finalize(c, 1);
        return MOEA2A_ERR_NO_MEMORY;
    }
    *tcomm = c;
    c->net = net, net->users = 1, net->nranks = core->nranks, net->log = core->log;
    pthread_mutex_init(&net->lock, NULL);
    for (int r = 0; r < c->nranks; r++) c->at[r] = r;
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: ucp_config_read: %s", ucs_status_string(st));
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
            log_net(net, 1, "ucx: this UCX cannot enable shared-memory error handling; peers on this node may use TCP");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                      .features = UCP_FEATURE_TAG, .mt_workers_shared = 0};
    st = ucp_init(&p, cfg, &net->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: ucp_init: %s", ucs_status_string(st));
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_address_t *a;
    st = ucp_worker_create(net->ctx, &wp, &net->worker);
    if (st == UCS_OK) st = ucp_worker_get_address(net->worker, &a, addr_len);
    if (st != UCS_OK) return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: worker setup: %s", ucs_status_string(st));
    *addr = malloc(*addr_len);
    if (*addr) memcpy(*addr, a, *addr_len);
    ucp_worker_release_address(net->worker, a);

    *mem_types = MOEA2A_MEM_HOST;
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(net->ctx, &ca) == UCS_OK && (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        *mem_types |= MOEA2A_MEM_CUDA;
    net->mem_types = *mem_types;
    log_net(net, 2, "ucx: worker ready (%s CUDA memory)", (*mem_types & MOEA2A_MEM_CUDA) ? "with" : "without");
    return *addr ? MOEA2A_SUCCESS : MOEA2A_ERR_NO_MEMORY;
}

/* UCX calls this from ucp_worker_progress when it gives up on a peer. Without it
 * (the default error mode) a peer that dies in the middle of a shared-memory copy
 * makes UCX abort the survivors. */
static void peer_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_ref_t *ref = arg;
    ucx_net_t *net = ref->net;
    (void)ep;
    if (net->failed[ref->rank] != UCS_OK) return;
    net->failed[ref->rank] = status;
    log_net(net, 1, "ucx: rank %d is unreachable: %s", ref->rank, ucs_status_string(status));
}

static int ucx_connect(void *tcomm, const void *const *addrs, const size_t *lens)
{
    ucx_comm_t *c = tcomm;
    ucx_net_t *net = c->net;
    net->eps = calloc((size_t)c->nranks, sizeof(*net->eps));
    net->refs = calloc((size_t)c->nranks, sizeof(*net->refs));
    net->failed = calloc((size_t)c->nranks, sizeof(*net->failed));
    if (!net->eps || !net->refs || !net->failed) return MOEA2A_ERR_NO_MEMORY;
    (void)lens;
    for (int r = 0; r < c->nranks; r++) {
        net->refs[r] = (peer_ref_t){net, r};
        /* Peer error mode on every endpoint but our own (a process cannot outlive
         * itself, and UCX's loopback transport has no failure handling). */
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                              .address = (const ucp_address_t *)addrs[r]};
        if (r != c->rank) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
            ep.err_handler = (ucp_err_handler_t){.cb = peer_failed, .arg = &net->refs[r]};
        }
        ucs_status_t st = ucp_ep_create(net->worker, &ep, &net->eps[r]);
        if (st != UCS_OK) {
            net->eps[r] = NULL;
            return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: cannot reach rank %d: %s", r, ucs_status_string(st));
        }
    }
    return MOEA2A_SUCCESS;
}

/* A shrink by choice keeps the parent's worker and its endpoints to the ranks that stay,
 * as long as UCX has not given up on any of them. After a death it does not: a process
 * killed while writing into a peer's shared-memory queue leaves it mid-message, and
 * the survivors' later messages on that worker were lost (a test's shrunk communicator
 * timed out in 2 of 6 runs of 50 kills); a new worker starts clean. */
static int ucx_can_shrink(void *parent) { return ((ucx_comm_t *)parent)->net->eps != NULL; }

static int ucx_shrink(void *parent, const moea2a_core_v1_t *core, const int *parent_rank, int dead, void **tcomm,
                      unsigned *mem_types)
{
    const ucx_comm_t *p = parent;
    ucx_comm_t *c = comm_new(core);
    if (!c) return MOEA2A_ERR_NO_MEMORY;
    *tcomm = c;
    if (dead)
        return fail(c, MOEA2A_ERR_UNAVAILABLE, "ucx: a rank died, and the worker's shared-memory queues may hold its "
                    "half-written messages: a new worker is made");
    uint32_t id = 2166136261u ^ (p->seq >> SEQ_BITS); /* the parent's, then the ranks that stay */
    for (int r = 0; r < c->nranks; r++) {
        if (parent_rank[r] < 0 || parent_rank[r] >= p->nranks)
            return fail(c, MOEA2A_ERR_INVALID_ARGUMENT, "ucx: shrink: rank %d's old rank %d is not one of the parent's %d",
                        r, parent_rank[r], p->nranks);
        c->at[r] = p->at[parent_rank[r]];
        if (p->net->failed[c->at[r]] != UCS_OK)
            return fail(c, MOEA2A_ERR_PEER_FAILED, "ucx: shrink: UCX gave up on rank %d (%s)", r,
                        ucs_status_string(p->net->failed[c->at[r]]));
        id = (id ^ (uint32_t)parent_rank[r]) * 16777619u;
    }
    pthread_mutex_lock(&p->net->lock);
    c->net = p->net, c->net->users++;
    pthread_mutex_unlock(&p->net->lock);
    c->seq = ((id % ((1u << (32 - SEQ_BITS)) - 1)) + 1) << SEQ_BITS; /* never the first communicator's 0 */
    *mem_types = c->net->mem_types;
    return MOEA2A_SUCCESS;
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
    void *req = ucp_tag_send_nbx(ep_of(c, peer), buf, len, tag, &p);
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
    void *req = ucp_tag_recv_nbx(c->net->worker, buf, len, tag, (ucp_tag_t)-1, &p);
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
        if (s->is_recv && ucp_request_check_status(s->req) == UCS_INPROGRESS) ucp_request_cancel(c->net->worker, s->req);
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
static int exchange_posts(ucx_comm_t *c, int opcode, const void *sbuf, const size_t *sc, const size_t *sd,
                          void *rbuf, const size_t *rc, const size_t *rd, unsigned mem, void **out)
{
    ucx_op_t *op = op_new(2 * c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = next_seq(c);
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

/* exchange_posts under the net's lock (the entry points below) */
static int start_exchange(ucx_comm_t *c, int opcode, const void *sbuf, const size_t *sc, const size_t *sd,
                          void *rbuf, const size_t *rc, const size_t *rd, unsigned mem, void **out);

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

static int bcast_posts(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **out)
{
    ucx_comm_t *c = tcomm;
    (void)stream;
    ucx_op_t *op = op_new(c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = next_seq(c);
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

static int barrier_posts(void *tcomm, void **out)
{
    ucx_comm_t *c = tcomm;
    ucx_op_t *op = op_new(2 * c->nranks);
    if (!op) return MOEA2A_ERR_NO_MEMORY;
    uint32_t seq = next_seq(c);
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
    if (failed_of(c, s->peer) != UCS_OK || st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
        st == UCS_ERR_UNREACHABLE || st == UCS_ERR_CANCELED || st == UCS_ERR_NOT_CONNECTED ||
        st == UCS_ERR_SHMEM_SEGMENT || st == UCS_ERR_IO_ERROR || st == UCS_ERR_REJECTED || st == UCS_ERR_TIMED_OUT)
        return fail(c, MOEA2A_ERR_PEER_FAILED, "ucx: %s rank %d failed: rank %d died or became unreachable (%s)", dir,
                    s->peer, s->peer, ucs_status_string(failed_of(c, s->peer) != UCS_OK ? failed_of(c, s->peer) : st));
    return fail(c, MOEA2A_ERR_TRANSPORT, "ucx: %s rank %d failed: %s", dir, s->peer, ucs_status_string(st));
}

static int test_progress(void *tcomm, void *opaque, int *done)
{
    ucx_comm_t *c = tcomm;
    ucx_op_t *op = opaque;
    if (op->pending) ucp_worker_progress(c->net->worker);
    for (int i = 0; i < op->n && op->pending; i++) {
        slot_t *s = &op->slots[i];
        if (!s->req) continue;
        ucs_status_t st = ucp_request_check_status(s->req);
        /* A receive is posted on the worker, not on the endpoint, so UCX never fails
         * it when the sender dies: the error callback's verdict ends it. */
        if (st == UCS_INPROGRESS && failed_of(c, s->peer) != UCS_OK) {
            op->pending--;
            return status_error(c, s, failed_of(c, s->peer));
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

/* ---- the entry points: each holds its net's lock ------------------------------------ */

static int start_exchange(ucx_comm_t *c, int opcode, const void *sbuf, const size_t *sc, const size_t *sd,
                          void *rbuf, const size_t *rc, const size_t *rd, unsigned mem, void **out)
{
    pthread_mutex_lock(&c->net->lock);
    const int r = exchange_posts(c, opcode, sbuf, sc, sd, rbuf, rc, rd, mem, out);
    pthread_mutex_unlock(&c->net->lock);
    return r;
}

static int ucx_bcast(void *tcomm, void *buf, size_t bytes, int root, unsigned mem, void *stream, void **out)
{
    ucx_net_t *net = ((ucx_comm_t *)tcomm)->net;
    pthread_mutex_lock(&net->lock);
    const int r = bcast_posts(tcomm, buf, bytes, root, mem, stream, out);
    pthread_mutex_unlock(&net->lock);
    return r;
}

static int ucx_barrier(void *tcomm, void **out)
{
    ucx_net_t *net = ((ucx_comm_t *)tcomm)->net;
    pthread_mutex_lock(&net->lock);
    const int r = barrier_posts(tcomm, out);
    pthread_mutex_unlock(&net->lock);
    return r;
}

static int ucx_test(void *tcomm, void *op, int *done)
{
    ucx_net_t *net = ((ucx_comm_t *)tcomm)->net;
    pthread_mutex_lock(&net->lock);
    const int r = test_progress(tcomm, op, done);
    pthread_mutex_unlock(&net->lock);
    return r;
}

static void ucx_op_free(void *tcomm, void *op)
{
    ucx_net_t *net = ((ucx_comm_t *)tcomm)->net;
    pthread_mutex_lock(&net->lock);
    op_release(tcomm, op);
    pthread_mutex_unlock(&net->lock);
}

__attribute__((visibility("default"))) const moea2a_transport_v2_t moea2a_transport_v2 = {
    .v1 = {
        .name = "ucx", .abi_version = MOEA2A_TRANSPORT_V2_ABI_VERSION,
        /* setup */
        .init_local = ucx_init_local, .connect = ucx_connect, .finalize = ucx_finalize,
        /* collectives, and the operations they return */
        .alltoallv = ucx_alltoallv, .allgather = ucx_allgather, .bcast = ucx_bcast, .barrier = ucx_barrier,
        .test = ucx_test, .describe = ucx_describe, .op_free = ucx_op_free,
    },
    /* a shrunk communicator on the same worker and endpoints */
    .can_shrink = ucx_can_shrink, .shrink = ucx_shrink,
};

/* Communicator life cycle: unique ids, init (by id, from the environment), destroy. */
#include <arpa/inet.h>
#include <math.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wireup/auth.h"
#include "base/clock.h"
#include "comm/agree.h"
#include "comm/comm.h"
#include "base/log.h"
#include "base/params.h"
#include "wireup/socket.h"
#include "wireup/watch.h"

/* Through the version field: a caller compiled against an older header passes a
 * smaller struct; fields it does not know keep their defaults. */
#define CONFIG_MIN_SIZE (offsetof(moea2a_config_t, version) + sizeof(unsigned int))

static moea2a_result_t default_timeout(double *t)
{
    M2A_TRY(m2a_param_double("MOEA2A_TIMEOUT_S", t));
    if (*t <= 0)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_TIMEOUT_S=%g must be positive", *t);
    return MOEA2A_SUCCESS;
}

/* The caller's config (or the defaults) with the effective timeout filled in:
 * config.timeout_s when set, else MOEA2A_TIMEOUT_S. */
static moea2a_result_t read_config(const moea2a_config_t *in, moea2a_config_t *out)
{
    *out = (moea2a_config_t)MOEA2A_CONFIG_INITIALIZER;
    if (!in) return default_timeout(&out->timeout_s);
    if (in->size < CONFIG_MIN_SIZE || in->size > 65536)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT,
                         "config.size=%zu is not a moea2a_config_t size: start from MOEA2A_CONFIG_INITIALIZER",
                         in->size);
    memcpy(out, in, in->size < sizeof(*out) ? in->size : sizeof(*out));
    if (in->size > sizeof(*out))
        M2A_INFO(M2A_SUBSYS_INIT, "config from a newer header (version %u, %zu bytes): unknown fields ignored",
                 in->version, in->size);
    out->size = sizeof(*out);
    if (out->timeout_s == 0 || !isfinite(out->timeout_s))
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT,
                         "config.timeout_s=%g must be a positive number of seconds (or negative for MOEA2A_TIMEOUT_S)",
                         out->timeout_s);
    return out->timeout_s < 0 ? default_timeout(&out->timeout_s) : MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_get_unique_id(moea2a_unique_id_t *uid)
{
    if (!uid) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_unique_id: id is NULL");
    double timeout;
    M2A_TRY(default_timeout(&timeout));
    m2a_sockaddr_t addr;
    char why[128];
    if (m2a_sock_pick_addr(&addr, AF_INET, why, sizeof(why)))
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_unique_id: %s", why);
    m2a_id_t id = {.magic = M2A_ID_MAGIC, .root = addr};
    M2A_TRY(m2a_random(&id.tag, sizeof(id.tag)));
    M2A_TRY(m2a_random(id.key, sizeof(id.key)));
    M2A_TRY(m2a_rendezvous_serve(&id, timeout, NULL));
    memset(uid, 0, sizeof(*uid));
    memcpy(uid->internal, &id, sizeof(id));
    memset(id.key, 0, sizeof(id.key));
    return MOEA2A_SUCCESS;
}

/* The peer watcher (wireup/watch.h), after the node map (past M2A_WATCH_ALL_MAX ranks
 * a rank watches its node only) and after a collective, so every rank has finished
 * linking the bootstrap ring before any watch link reaches its listener. */
static moea2a_result_t start_watch(moea2a_comm_t comm)
{
    long on = 1;
    double silence = 5.0;
    M2A_TRY(m2a_comm_record(comm, m2a_param_int("MOEA2A_WATCH", &on)));
    M2A_TRY(m2a_comm_record(comm, m2a_param_double("MOEA2A_WATCH_SILENCE_S", &silence)));
    if (!(silence >= 0) || silence > 1e6)
        return m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "MOEA2A_WATCH_SILENCE_S=%g must be 0 (off) or a number "
                         "of seconds", silence);
    if (on == 0 || comm->nranks == 1) return MOEA2A_SUCCESS;
    unsigned char *watched = calloc((size_t)comm->nranks, 1);
    if (!watched) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    const int me = comm->rank, all = comm->nranks <= M2A_WATCH_ALL_MAX;
    for (int q = 0; q < comm->nranks; q++)
        watched[q] = q != me && (all || comm->nodes.node[q] == comm->nodes.node[me]);
    moea2a_result_t r = m2a_comm_record(comm, m2a_watch_start(comm->bs, watched, comm->timeout_s, silence,
                                                              &comm->watch));
    free(watched);
    comm->bs->news = m2a_watch_news(comm->watch);
    if (r == MOEA2A_SUCCESS)
        M2A_INFO(M2A_SUBSYS_INIT, "peer watcher: rank %d watches %s", me, all ? "every rank" : "the ranks of its node");
    return r;
}

/* What a communicator is made of after its fields: the modules (spec; a missing
 * transport fails here, on every rank alike, before any rank waits on the network), the
 * bootstrap (joining id's rendezvous, or the survivors' ring of old's: alive), the node
 * map, the peer watcher, the transports (after a shrink, from old's where they can). On
 * failure comm is freed. */
static moea2a_result_t comm_build(moea2a_comm_t comm, const char *spec, const m2a_id_t *id,
                                  moea2a_comm_t old, const unsigned char *alive, moea2a_comm_t *out)
{
    m2a_log_set_rank(comm->rank);
    comm->spec = strdup(spec);
    moea2a_result_t r = comm->spec ? m2a_transports_open(comm, spec)
                                   : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    if (r == MOEA2A_SUCCESS)
        r = m2a_comm_record(comm, id ? m2a_bootstrap_join(id, comm->rank, comm->nranks, comm->timeout_s, &comm->bs)
                                     : m2a_bootstrap_shrink(old->bs, alive, &comm->bs));
    if (r == MOEA2A_SUCCESS) r = m2a_nodemap_build(comm, &comm->nodes);
    if (r == MOEA2A_SUCCESS) r = start_watch(comm);
    if (r == MOEA2A_SUCCESS) r = m2a_transports_connect(comm, old);
    if (r != MOEA2A_SUCCESS) {
        m2a_error(NULL, r, "%s", comm->last_error); /* keep the message after comm is gone */
        if (comm->bs) comm->bs->news = NULL;
        m2a_watch_stop(comm->watch);
        m2a_transports_close(comm, 1);
        m2a_bootstrap_close(comm->bs);
        m2a_nodemap_free(&comm->nodes);
        free(comm->spec);
        free(comm->parent_rank);
        free(comm);
        return r;
    }
    M2A_INFO(M2A_SUBSYS_INIT, "communicator ready: rank %d of %d, timeout %.1f s", comm->rank, comm->nranks,
             comm->timeout_s);
    *out = comm;
    return MOEA2A_SUCCESS;
}

static moea2a_result_t comm_init(moea2a_comm_t *out, int nranks, const m2a_id_t *id, int rank,
                                 const moea2a_config_t *user_config, void *external_nccl)
{
    moea2a_config_t cfg;
    M2A_TRY(read_config(user_config, &cfg));
    moea2a_comm_t comm = calloc(1, sizeof(*comm));
    if (!comm) return m2a_error(NULL, MOEA2A_ERR_NO_MEMORY, "moea2a_comm_init: out of memory");
    comm->rank = rank;
    comm->nranks = nranks;
    comm->timeout_s = cfg.timeout_s;
    comm->cuda_device = cfg.cuda_device;
    comm->core.external_comm = external_nccl;
    return comm_build(comm, cfg.transport ? cfg.transport : m2a_param_str("MOEA2A_TRANSPORT"), id, NULL, NULL, out);
}

/* A new communicator's failure (the thread's message, its comm gone) recorded on the
 * one it was made from, under fn; a copy first: the thread's buffer is rewritten. */
static void record_on(moea2a_comm_t comm, const char *fn, moea2a_result_t r)
{
    char why[M2A_ERRMSG_LEN];
    snprintf(why, sizeof(why), "%s", moea2a_last_error(NULL));
    m2a_error(comm, r, "%s: %s", fn, why);
}

moea2a_result_t moea2a_comm_shrink(moea2a_comm_t comm, const int *exclude, int nexclude, moea2a_comm_t *newcomm)
{
    static const char fn[] = "moea2a_comm_shrink";
    M2A_CHECK_ARG(NULL, newcomm, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    M2A_CHECK_ARG(NULL, comm, "%s: comm is NULL", fn);
    M2A_CHECK_ARG(comm, nexclude >= 0 && (nexclude == 0 || exclude),
                  "%s: nexclude=%d with exclude %s: want 0, or a list of that many ranks", fn, nexclude,
                  exclude ? "given" : "NULL");
    unsigned char *alive = malloc((size_t)comm->nranks);
    if (!alive) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    memset(alive, 1, (size_t)comm->nranks);
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int i = 0; i < nexclude && r == MOEA2A_SUCCESS; i++) {
        if (exclude[i] < 0 || exclude[i] >= comm->nranks)
            r = m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: exclude[%d]=%d is not a rank (0..%d)", fn, i,
                          exclude[i], comm->nranks - 1);
        else
            alive[exclude[i]] = 0;
    }
    /* A transport may tell of a death before this rank's watcher sees it; the survivors'
     * views must agree (their ring refuses others), so a rank that lost a peer waits,
     * bounded, for its watcher to name it. */
    for (const double t0 = m2a_now(); comm->peer_lost && comm->watch && m2a_comm_dead_peer(comm) < 0 &&
                                      m2a_now() - t0 < comm->timeout_s;)
        usleep(1000);
    int n = 0, me = 0;
    for (int q = 0; q < comm->nranks; q++) {
        if (m2a_watch_is_dead(comm->watch, q)) alive[q] = 0; /* the dead leave whether named or not */
        me += q < comm->rank && alive[q];
        n += alive[q] != 0;
    }
    if (r == MOEA2A_SUCCESS && !alive[comm->rank])
        r = m2a_error(comm, MOEA2A_ERR_INVALID_ARGUMENT, "%s: rank %d excludes itself; only the survivors call it",
                      fn, comm->rank);
    moea2a_comm_t nc = r == MOEA2A_SUCCESS ? calloc(1, sizeof(*nc)) : NULL;
    int *from = nc ? malloc(sizeof(int) * (size_t)n) : NULL;
    if (r == MOEA2A_SUCCESS && (!nc || !from)) {
        free(nc), free(from);
        r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    }
    if (r == MOEA2A_SUCCESS) {
        nc->rank = me, nc->nranks = n, nc->timeout_s = comm->timeout_s, nc->cuda_device = comm->cuda_device;
        for (int q = 0, i = 0; q < comm->nranks; q++)
            if (alive[q]) from[i++] = q;
        nc->parent = comm, nc->parent_rank = from;
        M2A_INFO(M2A_SUBSYS_INIT, "%s: rank %d of %d becomes rank %d of %d", fn, comm->rank, comm->nranks, me, n);
        r = comm_build(nc, comm->spec, NULL, comm, alive, newcomm);
        if (r != MOEA2A_SUCCESS) record_on(comm, fn, r);
    }
    free(alive);
    return r;
}

/* What each rank of comm brings to a grow: its verdict on its own arguments, the size
 * and its rank in the new communicator, and (rank 0) the id the joining ranks hold. */
typedef struct {
    int32_t result, nranks, rank, pad;
    moea2a_unique_id_t id;
} grow_card_t;

static moea2a_result_t grow_verdict(moea2a_comm_t comm, const char *fn, int nranks, const moea2a_unique_id_t *id,
                                    int rank)
{
    M2A_CHECK_ARG(comm, id, "%s: id is NULL (rank 0 passes the id it made and handed to the joining ranks; the "
                  "others get it)", fn);
    M2A_CHECK_ARG(comm, nranks > comm->nranks && nranks <= (1 << 20),
                  "%s: nranks=%d must exceed the communicator's %d ranks (at most %d)", fn, nranks, comm->nranks,
                  1 << 20);
    M2A_CHECK_ARG(comm, rank >= 0 && rank < nranks, "%s: rank=%d is not a rank of the new communicator (0..%d, or "
                  "-1 to keep %d)", fn, rank, nranks - 1, comm->rank);
    m2a_id_t mid;
    memcpy(&mid, id->internal, sizeof(mid));
    M2A_CHECK_ARG(comm, comm->rank != 0 || mid.magic == M2A_ID_MAGIC,
                  "%s: rank 0's id was not made by moea2a_get_unique_id (foreign or uninitialized id)", fn);
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_comm_grow(moea2a_comm_t comm, int nranks, moea2a_unique_id_t *id, int rank,
                                 moea2a_comm_t *newcomm)
{
    static const char fn[] = "moea2a_comm_grow";
    M2A_CHECK_ARG(NULL, newcomm, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    M2A_CHECK_ARG(NULL, comm, "%s: comm is NULL", fn);
    M2A_TRY(m2a_comm_check(comm, fn));
    const int n = comm->nranks;
    if (rank == -1) rank = comm->rank;
    grow_card_t *cards = calloc((size_t)n, sizeof(*cards));
    if (!cards) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    grow_card_t *mine = &cards[comm->rank];
    mine->result = grow_verdict(comm, fn, nranks, id, rank);
    mine->nranks = nranks, mine->rank = rank;
    if (mine->result == MOEA2A_SUCCESS && comm->rank == 0) mine->id = *id;
    /* every rank learns every rank's verdict, size and rank, and rank 0's id */
    moea2a_result_t r = m2a_comm_allgather(comm, cards, sizeof(*cards));
    int failed = 0;
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) failed |= cards[q].result != MOEA2A_SUCCESS;
    if (r == MOEA2A_SUCCESS && failed)
        r = m2a_comm_tell_failures(comm, fn, (moea2a_result_t)mine->result, &cards[0].result,
                                   sizeof(*cards) / sizeof(int32_t));
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (cards[q].nranks != nranks)
            r = m2a_error(comm, MOEA2A_ERR_MISMATCH, "%s: rank %d grows to %d ranks, rank %d to %d; every rank "
                          "passes the same nranks", fn, q, cards[q].nranks, comm->rank, nranks);
        for (int p = 0; r == MOEA2A_SUCCESS && p < q; p++)
            if (cards[p].rank == cards[q].rank)
                r = m2a_error(comm, MOEA2A_ERR_MISMATCH, "%s: ranks %d and %d both take rank %d of the new "
                              "communicator", fn, p, q, cards[q].rank);
    }
    moea2a_comm_t nc = r == MOEA2A_SUCCESS ? calloc(1, sizeof(*nc)) : NULL;
    if (r == MOEA2A_SUCCESS && !nc) r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "%s: out of memory", fn);
    if (r != MOEA2A_SUCCESS) {
        free(cards);
        /* arguments were agreed on, so the ranks stay in step; a failed exchange does not */
        return m2a_peer_lost(r) ? m2a_comm_fail(comm, r) : r;
    }
    *id = cards[0].id;
    m2a_id_t mid;
    memcpy(&mid, id->internal, sizeof(mid));
    free(cards);
    nc->rank = rank, nc->nranks = nranks, nc->timeout_s = comm->timeout_s, nc->cuda_device = comm->cuda_device;
    M2A_INFO(M2A_SUBSYS_INIT, "%s: rank %d of %d becomes rank %d of %d (%d joining)", fn, comm->rank, n, rank, nranks,
             nranks - n);
    r = comm_build(nc, comm->spec, &mid, NULL, NULL, newcomm);
    memset(&mid, 0, sizeof(mid));
    if (r != MOEA2A_SUCCESS) record_on(comm, fn, r);
    return r;
}

moea2a_result_t moea2a_comm_init_rank(moea2a_comm_t *comm, int nranks, moea2a_unique_id_t uid, int rank,
                                      const moea2a_config_t *config)
{
    M2A_CHECK_ARG(NULL, comm, "moea2a_comm_init_rank: comm is NULL");
    *comm = NULL;
    M2A_CHECK_ARG(NULL, nranks >= 1 && nranks <= (1 << 20), "moea2a_comm_init_rank: nranks=%d is out of range 1..%d",
                  nranks, 1 << 20);
    M2A_CHECK_ARG(NULL, rank >= 0 && rank < nranks, "moea2a_comm_init_rank: rank=%d is out of range 0..%d", rank,
                  nranks - 1);
    m2a_id_t id;
    memcpy(&id, uid.internal, sizeof(id));
    M2A_CHECK_ARG(NULL, id.magic == M2A_ID_MAGIC,
                  "moea2a_comm_init_rank: the unique id was not made by moea2a_get_unique_id (foreign or "
                  "uninitialized id)");
    return comm_init(comm, nranks, &id, rank, config, NULL);
}

/* ---- init from the environment ----------------------------------------------- */

static int env_long(const char *const *names, long *out, const char **which)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v && !m2a_parse_long(v, out)) {
            *which = *names;
            return 0;
        }
    }
    return -1;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* An identifier the launcher gives every process of one job, or "". */
static void job_id(char *buf, size_t len)
{
    const char *ompi = getenv("OMPI_MCA_ess_base_jobid"), *pmix = getenv("PMIX_NAMESPACE");
    const char *sj = getenv("SLURM_JOB_ID"), *ss = getenv("SLURM_STEP_ID");
    if (ompi) snprintf(buf, len, "ompi:%s", ompi);
    else if (pmix) snprintf(buf, len, "pmix:%s", pmix);
    else if (sj) snprintf(buf, len, "slurm:%s.%s", sj, ss ? ss : "0");
    else buf[0] = 0;
}

static int single_node(long nranks)
{
    long local;
    const char *which;
    static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", NULL};
    const char *nodes = getenv("SLURM_NNODES");
    if (nodes && !strcmp(nodes, "1")) return 1;
    return !env_long(local_vars, &local, &which) && local == nranks;
}

moea2a_result_t moea2a_comm_init_env(moea2a_comm_t *comm, const moea2a_config_t *config)
{
    static const char *const rank_vars[] = {"MOEA2A_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"MOEA2A_NRANKS", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", NULL};
    M2A_CHECK_ARG(NULL, comm, "moea2a_comm_init_env: comm is NULL");
    *comm = NULL;
    long rank, nranks;
    const char *rv, *nv;
    if (env_long(rank_vars, &rank, &rv) || env_long(size_vars, &nranks, &nv))
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT,
                         "moea2a_comm_init_env: cannot tell this process's rank and size: set MOEA2A_RANK and "
                         "MOEA2A_NRANKS, or start it with mpirun or srun");
    M2A_CHECK_ARG(NULL, nranks >= 1 && nranks <= (1 << 20) && rank >= 0 && rank < nranks,
                  "moea2a_comm_init_env: %s=%ld and %s=%ld are inconsistent", rv, rank, nv, nranks);

    char jid[256], root_text[300];
    job_id(jid, sizeof(jid));
    const char *root = m2a_param_str("MOEA2A_ROOT_ADDR");
    if (*root) {
        snprintf(root_text, sizeof(root_text), "%s", root);
    } else if (*jid && single_node(nranks)) {
        /* One node under a launcher: a port every rank derives alike from the job id,
         * below Linux's ephemeral range (32768+) so no outgoing connection holds it. */
        snprintf(root_text, sizeof(root_text), "127.0.0.1:%u", 20000u + (unsigned)(fnv1a(jid) % 12000u));
    } else {
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT,
                         "moea2a_comm_init_env: set MOEA2A_ROOT_ADDR=host:port (an address of the node that "
                         "runs rank 0, and a free port)");
    }
    /* The tag only names the rendezvous; what admits a rank is the key, which comes
     * from the launcher (MOEA2A_KEY, MOEA2A_KEY_FILE) and never from public values.
     * Neither depends on nranks: a rank that disagrees on it reaches the rendezvous,
     * which tells every rank (MOEA2A_ERR_MISMATCH), as it does for moea2a_comm_init_rank. */
    m2a_id_t id = {.magic = M2A_ID_MAGIC, .flags = M2A_ID_FROM_ENV};
    char tag_text[600];
    snprintf(tag_text, sizeof(tag_text), "%s|%s", root_text, jid);
    id.tag = fnv1a(tag_text);
    int have_key;
    M2A_TRY(m2a_env_key(id.key, &have_key));
    if (!have_key) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            M2A_WARN(M2A_SUBSYS_INIT, "moea2a_comm_init_env: the rendezvous is unauthenticated: any process that "
                     "can reach %s can join as a rank; set MOEA2A_KEY or MOEA2A_KEY_FILE on every rank", root_text);
        m2a_sha256(tag_text, strlen(tag_text), id.key);
    }
    char why[400];
    if (m2a_sock_parse_addr(root_text, &id.root, why, sizeof(why)))
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_comm_init_env: MOEA2A_ROOT_ADDR: %s", why);
    if (m2a_sock_port(&id.root) == 0)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT,
                         "moea2a_comm_init_env: MOEA2A_ROOT_ADDR='%s' has no port (host:port, or [IPv6]:port)",
                         root_text);
    moea2a_config_t cfg;
    M2A_TRY(read_config(config, &cfg));
    if (rank == 0) {
        int in_use = 0;
        moea2a_result_t served = m2a_rendezvous_serve(&id, cfg.timeout_s, &in_use);
        /* Someone listens there already: perhaps another process started as rank 0 of
         * this job. Joining its rendezvous as rank 0 makes it tell every rank so
         * (MOEA2A_ERR_MISMATCH); anything else there fails the handshake. */
        if (served != MOEA2A_SUCCESS && in_use)
            M2A_WARN(M2A_SUBSYS_INIT, "moea2a_comm_init_env: %s is in use; joining what listens there as rank 0",
                     root_text);
        else if (served != MOEA2A_SUCCESS)
            return served;
    }
    M2A_INFO(M2A_SUBSYS_INIT, "init from environment: rank %ld of %ld (%s, %s), rendezvous %s", rank, nranks, rv, nv,
             root_text);
    moea2a_result_t r = comm_init(comm, (int)nranks, &id, (int)rank, config, NULL);
    memset(id.key, 0, sizeof(id.key));
    return r;
}

/* ---- init from a caller's NCCL communicator ------------------------------------- */

moea2a_result_t moea2a_comm_init_nccl(moea2a_comm_t *comm, void *nccl_comm, const moea2a_config_t *config)
{
    M2A_CHECK_ARG(NULL, comm && nccl_comm, "moea2a_comm_init_nccl: comm and nccl_comm must not be NULL");
    *comm = NULL;
    moea2a_config_t cfg;
    M2A_TRY(read_config(config, &cfg));
    double timeout = cfg.timeout_s;
    void *dl = NULL;
    char why[512];
    const moea2a_transport_v1_t *ops = m2a_transport_load("nccl", &dl, why, sizeof(why));
    if (!ops || !ops->external_rank || !ops->external_bcast) {
        if (dl) dlclose(dl);
        return m2a_error(NULL, MOEA2A_ERR_UNAVAILABLE, "moea2a_comm_init_nccl: the nccl transport is not available: %s",
                         ops ? "it cannot adopt a communicator" : why);
    }
    int rank, nranks;
    moea2a_result_t r = (moea2a_result_t)ops->external_rank(nccl_comm, &rank, &nranks);
    if (r != MOEA2A_SUCCESS) {
        dlclose(dl);
        return m2a_error(NULL, r, "moea2a_comm_init_nccl: not a usable NCCL communicator");
    }
    /* Rank 0 makes the id; the caller's communicator carries it to the others, so
     * the caller needs no rendezvous of its own. A rank 0 that could not make one
     * sends zeros, which every rank then rejects as a foreign id. */
    moea2a_unique_id_t uid;
    memset(&uid, 0, sizeof(uid));
    moea2a_result_t made = rank == 0 ? moea2a_get_unique_id(&uid) : MOEA2A_SUCCESS;
    r = (moea2a_result_t)ops->external_bcast(nccl_comm, &uid, sizeof(uid), 0, timeout);
    dlclose(dl);
    if (r != MOEA2A_SUCCESS)
        return m2a_error(NULL, r, "moea2a_comm_init_nccl: broadcasting the rendezvous id over NCCL failed (%s)",
                         moea2a_strerror(r));
    if (made != MOEA2A_SUCCESS) return made;
    m2a_id_t id;
    memcpy(&id, uid.internal, sizeof(id));
    if (id.magic != M2A_ID_MAGIC)
        return m2a_error(NULL, MOEA2A_ERR_PEER_FAILED, "moea2a_comm_init_nccl: rank 0 could not make a rendezvous id");
    return comm_init(comm, nranks, &id, rank, config, nccl_comm);
}

/* ---- the rest of the life cycle ------------------------------------------------ */

moea2a_result_t m2a_comm_check(moea2a_comm_t comm, const char *fn)
{
    if (!comm) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "%s: comm is NULL", fn);
    if (comm->broken != MOEA2A_SUCCESS)
        return m2a_error(comm, MOEA2A_ERR_ABORTED,
                         "%s: the communicator is unusable after an earlier failure (%s: %s); destroy it", fn,
                         moea2a_strerror(comm->broken), comm->broken_why);
    return MOEA2A_SUCCESS;
}

/* Device work of earlier calls may wait on a peer that failed (NCCL kernels have no
 * timeout of their own): abort what can be aborted, so that no later CUDA call, the
 * frees of destroy included, waits on it forever. */
static void abort_transports(moea2a_comm_t comm)
{
    for (int i = 0; i < comm->ntr; i++)
        if (comm->tr[i].ops->abort) comm->tr[i].ops->abort(comm->tr[i].tc);
}

moea2a_result_t m2a_comm_fail(moea2a_comm_t comm, moea2a_result_t r)
{
    if (r == MOEA2A_ERR_TIMEOUT || r == MOEA2A_ERR_PEER_FAILED || r == MOEA2A_ERR_TRANSPORT ||
        r == MOEA2A_ERR_MISMATCH || r == MOEA2A_ERR_INTERNAL) {
        if (comm->broken == MOEA2A_SUCCESS) {
            memcpy(comm->broken_why, comm->last_error, sizeof(comm->broken_why));
            abort_transports(comm);
        }
        comm->broken = r;
        comm->peer_lost |= r == MOEA2A_ERR_PEER_FAILED;
    }
    return r;
}

moea2a_result_t m2a_comm_peer_error(moea2a_comm_t comm, const char *fn)
{
    const int dead = m2a_comm_dead_peer(comm);
    if (dead < 0) return MOEA2A_SUCCESS;
    char how[160];
    m2a_comm_dead_how(comm, how, sizeof(how));
    return m2a_error(comm, MOEA2A_ERR_PEER_FAILED, "%s: rank %d is gone (%s, as this rank's peer watcher saw)", fn,
                     dead, how);
}

moea2a_result_t m2a_comm_check_peers(moea2a_comm_t comm, const char *fn)
{
    return m2a_comm_fail(comm, m2a_comm_peer_error(comm, fn));
}

moea2a_result_t moea2a_comm_destroy(moea2a_comm_t comm)
{
    if (!comm) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_comm_destroy: comm is NULL");
    /* A healthy communicator waits for its peers so none tears down a connection
     * another still uses; a broken one only releases what it holds. */
    int force = comm->broken != MOEA2A_SUCCESS;
    if (!force && comm->nranks > 1 && m2a_comm_barrier(comm) != MOEA2A_SUCCESS) force = 1;
    moea2a_result_t r = force && comm->broken == MOEA2A_SUCCESS ? MOEA2A_ERR_PEER_FAILED : MOEA2A_SUCCESS;
    if (r != MOEA2A_SUCCESS) m2a_error(NULL, r, "moea2a_comm_destroy: %s", comm->last_error);
    comm->bs->news = NULL;
    m2a_watch_stop(comm->watch); /* a goodbye: the peers still running do not take this for a death */
    m2a_transports_close(comm, force);
    m2a_bootstrap_close(comm->bs);
    m2a_nodemap_free(&comm->nodes);
    free(comm->spec);
    free(comm->parent_rank);
    free(comm);
    return r;
}

moea2a_result_t moea2a_comm_abort(moea2a_comm_t comm)
{
    if (!comm) return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_comm_abort: comm is NULL");
    if (comm->broken == MOEA2A_SUCCESS) {
        snprintf(comm->broken_why, sizeof(comm->broken_why), "aborted by the application");
        abort_transports(comm);
    }
    comm->broken = MOEA2A_ERR_ABORTED;
    M2A_INFO(M2A_SUBSYS_INIT, "communicator aborted by the application");
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_comm_rank(moea2a_comm_t comm, int *rank)
{
    M2A_CHECK_ARG(comm, comm && rank, "moea2a_comm_rank: comm and rank must not be NULL");
    *rank = comm->rank;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_comm_size(moea2a_comm_t comm, int *size)
{
    M2A_CHECK_ARG(comm, comm && size, "moea2a_comm_size: comm and size must not be NULL");
    *size = comm->nranks;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_comm_traffic(moea2a_comm_t comm, moea2a_comm_traffic_t *traffic)
{
    M2A_CHECK_ARG(comm, comm && traffic, "moea2a_comm_traffic: comm and traffic must not be NULL");
    M2A_CHECK_ARG(comm, traffic->size >= offsetof(moea2a_comm_traffic_t, host_same_node),
                  "moea2a_comm_traffic: traffic->size=%zu: start from MOEA2A_COMM_TRAFFIC_INITIALIZER", traffic->size);
    moea2a_comm_traffic_t full = {sizeof(full), MOEA2A_VERSION_CODE, comm->traffic[0][0], comm->traffic[0][1],
                                  comm->traffic[1][0], comm->traffic[1][1]};
    size_t caller = traffic->size;
    memcpy(traffic, &full, caller < sizeof(full) ? caller : sizeof(full));
    traffic->size = caller;
    return MOEA2A_SUCCESS;
}

moea2a_result_t moea2a_comm_node(moea2a_comm_t comm, int *node, int *num_nodes, int *local_rank, int *local_size)
{
    M2A_CHECK_ARG(comm, comm, "moea2a_comm_node: comm is NULL");
    const m2a_nodemap_t *m = &comm->nodes;
    const int me = m->node[comm->rank];
    if (node) *node = me;
    if (num_nodes) *num_nodes = m->nnodes;
    if (local_rank) *local_rank = m->local[comm->rank];
    if (local_size) *local_size = m->size[me];
    return MOEA2A_SUCCESS;
}

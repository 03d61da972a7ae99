/* Transport modules: finding them on the search path, opening them, and setting
 * them up with the peers. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "base/log.h"
#include "comm/cuda.h"
#include "comm/modules.h"
#include "base/params.h"

/* Preferred first when nothing is asked for: the fastest path for its memory type. */
static const char *const default_order[] = {"nccl", "ucx"};

/* The interface versions a module may export, newest first. Each version's table
 * starts with the one before it, so every table is also read as version 1's. */
static const struct {
    const char *symbol;
    size_t abi_offset;
    int abi, version;
} versions[] = {
    {MOEA2A_TRANSPORT_V3_SYMBOL, offsetof(moea2a_transport_v3_t, v2.v1.abi_version), MOEA2A_TRANSPORT_V3_ABI_VERSION, 3},
    {MOEA2A_TRANSPORT_V2_SYMBOL, offsetof(moea2a_transport_v2_t, v1.abi_version), MOEA2A_TRANSPORT_V2_ABI_VERSION, 2},
    {MOEA2A_TRANSPORT_SYMBOL, offsetof(moea2a_transport_v1_t, abi_version), MOEA2A_TRANSPORT_ABI_VERSION, 1},
};

/* A module's table: its newest version's, read as version 1's with the later members
 * beside it. *v2, *v3: those tables, or NULL where the module has none. A symbol of a
 * version whose ABI differs stops the search, so that the reason says so. */
static const moea2a_transport_v1_t *load_module(const char *path, void **dl, char *why, size_t len,
                                                const moea2a_transport_v2_t **v2, const moea2a_transport_v3_t **v3)
{
    if (v2) *v2 = NULL;
    if (v3) *v3 = NULL;
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        const void *t = m2a_module_open(path, versions[i].symbol, versions[i].abi_offset, versions[i].abi,
                                        "a transport", dl, why, len);
        if (t) {
            if (v2 && versions[i].version >= 2) *v2 = t;
            if (v3 && versions[i].version >= 3) *v3 = t;
            return t;
        }
        if (strstr(why, "ABI version")) return NULL; /* m2a_module_open's reason for another ABI */
    }
    return NULL;
}

typedef struct {
    moea2a_transport_info_t *infos;
    int max, n;
} list_arg_t;

static void list_one(const char *name, const char *path, void *arg)
{
    list_arg_t *a = arg;
    if (a->n < a->max) {
        moea2a_transport_info_t *t = &a->infos[a->n];
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        snprintf(t->path, sizeof(t->path), "%s", path);
        void *dl;
        const moea2a_transport_v1_t *ops;
        if (!strcmp(name, M2A_CUDA_MODULE_NAME)) { /* not a transport: the kernels' module */
            t->loadable = m2a_cuda_probe(path, &t->abi_version, t->detail, sizeof(t->detail));
        } else if ((ops = load_module(path, &dl, t->detail, sizeof(t->detail), NULL, NULL))) {
            t->loadable = 1;
            t->abi_version = ops->abi_version;
            snprintf(t->detail, sizeof(t->detail), "transport '%s', ABI v%d", ops->name, ops->abi_version);
            dlclose(dl);
        }
    }
    a->n++;
}

moea2a_result_t moea2a_get_transports(moea2a_transport_info_t *infos, int max, int *count)
{
    if (!count || (max > 0 && !infos) || max < 0)
        return m2a_error(NULL, MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_transports: bad infos/max/count");
    list_arg_t a = {infos, max, 0};
    m2a_modules_each(list_one, &a);
    *count = a.n;
    return MOEA2A_SUCCESS;
}

typedef struct {
    char names[M2A_MAX_TRANSPORTS * 4][M2A_NAME_LEN];
    char paths[M2A_MAX_TRANSPORTS * 4][4096 + 256];
    int n;
} found_t;

static void collect(const char *name, const char *path, void *arg)
{
    found_t *f = arg;
    /* the CUDA module is not a transport (lib/comm/cuda.c loads it on demand) */
    if (f->n >= (int)(sizeof(f->names) / sizeof(f->names[0])) || !strcmp(name, M2A_CUDA_MODULE_NAME)) return;
    snprintf(f->names[f->n], M2A_NAME_LEN, "%s", name);
    snprintf(f->paths[f->n], sizeof(f->paths[0]), "%s", path);
    f->n++;
}

static int find(const found_t *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return i;
    return -1;
}

static int in_list(const char *list, const char *name)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
        if (!strcmp(t, name)) return 1;
    return 0;
}

static moea2a_result_t open_one(moea2a_comm_t comm, const found_t *f, int i, int explicit_ask)
{
    if (comm->ntr == M2A_MAX_TRANSPORTS) return MOEA2A_SUCCESS;
    m2a_transport_t *t = &comm->tr[comm->ntr];
    char why[512];
    const moea2a_transport_v2_t *v2;
    const moea2a_transport_v3_t *v3;
    t->ops = load_module(f->paths[i], &t->dl, why, sizeof(why), &v2, &v3);
    if (!t->ops) {
        if (explicit_ask)
            return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "transport '%s' (%s) cannot be loaded: %s",
                             f->names[i], f->paths[i], why);
        M2A_INFO(M2A_SUBSYS_TRANSPORT, "skipping transport %s: %s", f->paths[i], why);
        return MOEA2A_SUCCESS;
    }
    snprintf(t->name, sizeof(t->name), "%s", f->names[i]);
    t->explicit_ask = explicit_ask;
    if (v2 && v2->can_shrink && v2->shrink) t->can_shrink = v2->can_shrink, t->shrink = v2->shrink;
    if (v3) t->watch = v3->watch;
    comm->ntr++;
    return MOEA2A_SUCCESS;
}

moea2a_result_t m2a_transports_open(moea2a_comm_t comm, const char *spec)
{
    found_t *f = calloc(1, sizeof(*f));
    if (!f) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "transport loader: out of memory");
    m2a_modules_each(collect, f);
    moea2a_result_t r = MOEA2A_SUCCESS;
    int exclude = spec[0] == '^';

    if (*spec && !exclude) { /* an explicit list, in its order */
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", spec);
        for (char *save, *t = strtok_r(buf, ", ", &save); t && r == MOEA2A_SUCCESS; t = strtok_r(NULL, ", ", &save)) {
            int i = find(f, t);
            if (i >= 0) {
                r = open_one(comm, f, i, 1);
                continue;
            }
            char avail[512] = "";
            size_t o = 0;
            for (int j = 0; j < f->n && o < sizeof(avail); j++)
                o += (size_t)snprintf(avail + o, sizeof(avail) - o, "%s%s", j ? ", " : "", f->names[j]);
            r = m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                          "transport '%s' is not available; available: %s (searched MOEA2A_TRANSPORT_PATH and %s)",
                          t, f->n ? avail : "none", MOEA2A_PKGLIBDIR);
        }
    } else { /* everything found, preferred ones first, minus exclusions */
        const char *excl = exclude ? spec + 1 : "";
        for (size_t k = 0; k < sizeof(default_order) / sizeof(default_order[0]) && r == MOEA2A_SUCCESS; k++) {
            int i = find(f, default_order[k]);
            if (i >= 0 && !in_list(excl, f->names[i])) r = open_one(comm, f, i, 0);
        }
        for (int i = 0; i < f->n && r == MOEA2A_SUCCESS; i++) {
            int preferred = 0;
            for (size_t k = 0; k < sizeof(default_order) / sizeof(default_order[0]); k++)
                preferred |= !strcmp(f->names[i], default_order[k]);
            if (!preferred && !in_list(excl, f->names[i])) r = open_one(comm, f, i, 0);
        }
    }
    if (r == MOEA2A_SUCCESS && comm->ntr == 0)
        r = m2a_error(comm, MOEA2A_ERR_UNAVAILABLE,
                      "no transport module could be loaded (MOEA2A_TRANSPORT='%s'; %d module(s) found on "
                      "MOEA2A_TRANSPORT_PATH and in %s)", spec, f->n, MOEA2A_PKGLIBDIR);
    free(f);
    return r;
}

/* ---- connecting: init_local everywhere, exchange addresses, connect ------------- */

static int core_error(void *ctx, int result, const char *fmt, va_list ap)
{
    return (int)m2a_verror((moea2a_comm_t)ctx, (moea2a_result_t)result, fmt, ap);
}

static void core_log(int level, const char *fmt, va_list ap)
{
    if (!m2a_log_enabled(level, M2A_SUBSYS_TRANSPORT)) return;
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    m2a_log(level, M2A_SUBSYS_TRANSPORT, "transport", 0, "%s", msg);
}

typedef struct {
    uint32_t ok_mask;
    uint32_t pad;
    uint64_t len[M2A_MAX_TRANSPORTS];
} local_state_t;

static void drop_transport(m2a_transport_t *t, int force)
{
    if (t->tc) t->ops->finalize(t->tc, force);
    if (t->dl) dlclose(t->dl);
    memset(t, 0, sizeof(*t));
}

static void compact(moea2a_comm_t comm)
{
    int o = 0;
    for (int i = 0; i < comm->ntr; i++)
        if (comm->tr[i].ops) comm->tr[o++] = comm->tr[i];
    for (int i = o; i < comm->ntr; i++) memset(&comm->tr[i], 0, sizeof(comm->tr[i]));
    comm->ntr = o;
}

/* Drops the transports that failed on some rank; an explicitly requested one failing
 * is an error. mask: bit i set when transport i works on every rank. */
static moea2a_result_t keep_common(moea2a_comm_t comm, uint32_t mask, const char *stage)
{
    moea2a_result_t r = MOEA2A_SUCCESS;
    for (int i = 0; i < comm->ntr; i++) {
        if (mask & (1u << i)) continue;
        if (comm->tr[i].explicit_ask && r == MOEA2A_SUCCESS)
            r = m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "transport '%s' failed to %s on at least one rank",
                          comm->tr[i].name, stage);
        M2A_INFO(M2A_SUBSYS_TRANSPORT, "transport %s dropped: it failed to %s on some rank", comm->tr[i].name, stage);
        drop_transport(&comm->tr[i], 1); /* its peers are dropping it too */
    }
    compact(comm);
    return r;
}

/* One bit per transport, ANDed over the ranks (bit i: transport i, on every rank). */
static moea2a_result_t agree_bits(moea2a_comm_t comm, uint32_t mine, uint32_t *all)
{
    uint32_t *bits = calloc((size_t)comm->nranks, sizeof(*bits));
    if (!bits) return m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "out of memory");
    bits[comm->rank] = mine;
    moea2a_result_t r = m2a_comm_allgather(comm, bits, sizeof(*bits));
    *all = ~0u;
    for (int k = 0; k < comm->nranks; k++) *all &= bits[k];
    free(bits);
    return r;
}

/* A shrunk communicator's transports made from its parent's (moea2a_transport_v2_t's
 * shrink) where every rank's can: *made, the mask of those made on every rank. A
 * transport made on some ranks only is released there, and set up anew everywhere. */
static moea2a_result_t shrink_from(moea2a_comm_t comm, moea2a_comm_t parent, uint32_t *made)
{
    m2a_transport_t *from[M2A_MAX_TRANSPORTS] = {0};
    uint32_t can = 0, did = 0, all = 0;
    *made = 0;
    for (int i = 0; i < comm->ntr; i++) {
        const m2a_transport_t *t = &comm->tr[i];
        for (int j = 0; j < parent->ntr; j++) /* the same module's state, so the same code */
            if (!strcmp(parent->tr[j].name, t->name) && parent->tr[j].tc && parent->tr[j].shrink == t->shrink)
                from[i] = &parent->tr[j];
        if (from[i] && t->shrink && t->can_shrink(from[i]->tc)) can |= 1u << i;
    }
    moea2a_result_t r = agree_bits(comm, can, &all);
    int dead = 0; /* ranks of parent that left dead, not by choice */
    for (int q = 0, i = 0; q < parent->nranks; q++) {
        if (i < comm->nranks && comm->parent_rank[i] == q) i++;
        else dead |= m2a_watch_is_dead(parent->watch, q);
    }
    for (int i = 0; r == MOEA2A_SUCCESS && i < comm->ntr; i++) {
        m2a_transport_t *t = &comm->tr[i];
        if (!(all & (1u << i))) continue;
        if (t->shrink(from[i]->tc, &comm->core, comm->parent_rank, dead, &t->tc, &t->mem_types) == MOEA2A_SUCCESS) {
            did |= 1u << i;
            continue;
        }
        M2A_INFO(M2A_SUBSYS_TRANSPORT, "transport %s: no shrink of the parent's (%s); set up anew", t->name,
                 comm->last_error);
        if (t->tc) t->ops->finalize(t->tc, 1);
        t->tc = NULL;
    }
    if (r == MOEA2A_SUCCESS) r = agree_bits(comm, did, &all);
    for (int i = 0; i < comm->ntr; i++) {
        m2a_transport_t *t = &comm->tr[i];
        if (!(did & (1u << i))) continue;
        if (r == MOEA2A_SUCCESS && (all & (1u << i))) {
            M2A_INFO(M2A_SUBSYS_TRANSPORT, "transport %s: made from the parent communicator's by its shrink", t->name);
            continue;
        }
        t->ops->finalize(t->tc, 1); /* another rank could not: every rank sets it up anew */
        t->tc = NULL;
    }
    *made = r == MOEA2A_SUCCESS ? all & did : 0;
    return r;
}

moea2a_result_t m2a_transports_connect(moea2a_comm_t comm, moea2a_comm_t parent)
{
    int n = comm->nranks;
    comm->core = (moea2a_core_v1_t){comm->rank, n, comm->timeout_s, comm->cuda_device, comm, core_error, core_log,
                                    comm->core.external_comm};
    void *addr[M2A_MAX_TRANSPORTS] = {0};
    local_state_t *st = calloc((size_t)n, sizeof(*st));
    uint32_t *okc = calloc((size_t)n, sizeof(*okc));
    moea2a_result_t r = (st && okc) ? MOEA2A_SUCCESS : m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "out of memory");
    uint32_t made = 0; /* transports made from parent's */
    if (r == MOEA2A_SUCCESS && parent) r = shrink_from(comm, parent, &made);

    local_state_t *me = st ? &st[comm->rank] : NULL;
    for (int i = 0; r == MOEA2A_SUCCESS && i < comm->ntr; i++) {
        size_t len = 0;
        m2a_transport_t *t = &comm->tr[i];
        if (made & (1u << i)) {
            me->ok_mask |= 1u << i;
            continue;
        }
        int rc = t->ops->init_local(&comm->core, &t->tc, &addr[i], &len, &t->mem_types);
        if (rc == MOEA2A_SUCCESS) {
            me->ok_mask |= 1u << i;
            me->len[i] = len;
        } else {
            /* Unavailable (e.g. no GPU for nccl) is expected on many machines. */
            M2A_LOG(rc == MOEA2A_ERR_UNAVAILABLE && !t->explicit_ask ? M2A_LOG_INFO : M2A_LOG_WARN, M2A_SUBSYS_TRANSPORT,
                    "transport %s did not initialize: %s", t->name, comm->last_error);
            if (t->tc) t->ops->finalize(t->tc, 1);
            t->tc = NULL;
        }
    }
    if (r == MOEA2A_SUCCESS) r = m2a_comm_allgather(comm, st, sizeof(*st));

    uint32_t common = ~0u;
    for (int k = 0; r == MOEA2A_SUCCESS && k < n; k++) common &= st[k].ok_mask;

    /* Address blobs of the transports that initialized everywhere, one exchange each. */
    uint32_t connected = 0;
    for (int i = 0; r == MOEA2A_SUCCESS && i < comm->ntr; i++) {
        if (!(common & (1u << i))) continue;
        if (made & (1u << i)) {
            connected |= 1u << i;
            continue;
        }
        size_t max = 0;
        for (int k = 0; k < n; k++) max = st[k].len[i] > max ? st[k].len[i] : max;
        char *all = calloc((size_t)n, max ? max : 1);
        const void **ptrs = calloc((size_t)n, sizeof(*ptrs));
        size_t *lens = calloc((size_t)n, sizeof(*lens));
        if (!all || !ptrs || !lens) r = m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "out of memory");
        if (r == MOEA2A_SUCCESS) {
            if (st[comm->rank].len[i]) /* a module may send no address (NULL, 0) */
                memcpy(all + (size_t)comm->rank * max, addr[i], st[comm->rank].len[i]);
            r = m2a_comm_allgather(comm, all, max);
        }
        if (r == MOEA2A_SUCCESS) {
            for (int k = 0; k < n; k++) ptrs[k] = all + (size_t)k * max, lens[k] = st[k].len[i];
            if (comm->tr[i].ops->connect(comm->tr[i].tc, ptrs, lens) == MOEA2A_SUCCESS) connected |= 1u << i;
            else M2A_WARN(M2A_SUBSYS_TRANSPORT, "transport %s failed to connect: %s", comm->tr[i].name, comm->last_error);
        }
        free(all), free(ptrs), free(lens);
    }
    if (r == MOEA2A_SUCCESS) {
        okc[comm->rank] = connected;
        r = m2a_comm_allgather(comm, okc, sizeof(*okc));
    }
    uint32_t all_connected = ~0u;
    for (int k = 0; r == MOEA2A_SUCCESS && k < n; k++) all_connected &= okc[k];
    for (int i = 0; i < M2A_MAX_TRANSPORTS; i++) free(addr[i]);
    free(st);
    free(okc);
    if (r == MOEA2A_SUCCESS) r = keep_common(comm, common & all_connected, "initialize or connect");
    if (r == MOEA2A_SUCCESS && comm->ntr == 0)
        r = m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "no transport could be set up on every rank (MOEA2A_DEBUG=INFO says why)");
    /* the peer watcher's news for the modules' waits (the word is the communicator's, so
     * it outlives both the watcher and the modules) */
    if (r == MOEA2A_SUCCESS && comm->watch) r = m2a_comm_watch(comm, &comm->dead_word);
    for (int i = 0; r == MOEA2A_SUCCESS && i < comm->ntr; i++)
        if (comm->tr[i].watch) comm->tr[i].watch(comm->tr[i].tc, comm->watch ? &comm->dead_word : NULL);
    for (int i = 0; r == MOEA2A_SUCCESS && i < comm->ntr; i++)
        M2A_INFO(M2A_SUBSYS_TRANSPORT, "transport %s ready (memory:%s%s)", comm->tr[i].name,
                 comm->tr[i].mem_types & MOEA2A_MEM_HOST ? " host" : "",
                 comm->tr[i].mem_types & MOEA2A_MEM_CUDA ? " cuda" : "");
    return r;
}

void m2a_transports_close(moea2a_comm_t comm, int force)
{
    for (int i = 0; i < comm->ntr; i++) drop_transport(&comm->tr[i], force);
    comm->ntr = 0;
}

m2a_transport_t *m2a_transport_for(moea2a_comm_t comm, unsigned mem)
{
    for (int i = 0; i < comm->ntr; i++)
        if (comm->tr[i].mem_types & mem) return &comm->tr[i];
    return NULL;
}

moea2a_result_t m2a_transport_group(moea2a_comm_t comm, unsigned mem, int start)
{
    m2a_transport_t *t = m2a_transport_for(comm, mem);
    if (!t || !(start ? t->ops->group_start : t->ops->group_end)) return MOEA2A_SUCCESS;
    int r = start ? t->ops->group_start(t->tc) : t->ops->group_end(t->tc);
    return (moea2a_result_t)r;
}

const moea2a_transport_v1_t *m2a_transport_load(const char *name, void **dl, char *why, size_t len)
{
    found_t *f = calloc(1, sizeof(*f));
    const moea2a_transport_v1_t *ops = NULL;
    if (!f) {
        snprintf(why, len, "out of memory");
        return NULL;
    }
    m2a_modules_each(collect, f);
    int i = find(f, name);
    if (i < 0) snprintf(why, len, "no module libmoea2a-%s.so on MOEA2A_TRANSPORT_PATH or in %s", name, MOEA2A_PKGLIBDIR);
    else ops = load_module(f->paths[i], dl, why, len, NULL, NULL);
    free(f);
    return ops;
}

/* Kernel times from CUPTI activity records (perf_kernel_time.h).
 *
 * How a record finds its call: while a tag is pushed as CUPTI's external correlation id,
 * every traced API call (runtime and driver) is preceded by an external-correlation
 * record that pairs the tag with the call's correlation id; the kernels, copies and
 * memsets that call enqueued carry the same correlation id (a graph launch's nodes
 * carry the launch's). So: (tag, correlation id) pairs from the one kind of record,
 * (correlation id, start, end) from the others, joined when recording ends. */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_kernel_time.h"

#ifdef MOEA2A_HAVE_CUPTI
#include <cupti.h>

/* The record layouts of the header this file is built with; perf_kt_open refuses a
 * CUPTI library of another major version, whose layouts may differ. */
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 kt_kernel_t;
typedef CUpti_ActivityMemcpy6 kt_memcpy_t;
typedef CUpti_ActivityMemcpyPtoP4 kt_peer_t;
#define KT_PEER_COPIES 1
#define KT_MAJOR(v) ((v) / 10000)
#else /* CUDA 12: peer copies (MEMCPY2) are not read */
typedef CUpti_ActivityKernel9 kt_kernel_t;
typedef CUpti_ActivityMemcpy5 kt_memcpy_t;
#define KT_PEER_COPIES 0
#define KT_MAJOR(v) ((v) < 130000 ? 12u : (v) / 10000)
#endif
typedef CUpti_ActivityMemset4 kt_memset_t;

#define KT_BUFFER_BYTES ((size_t)4 << 20)
#define KT_EXTERNAL_KIND CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0

typedef struct {
    uint64_t key;        /* correlation id, then (after the join) the tag */
    uint64_t start, end; /* ns, CUPTI's clock */
    int name;            /* into kt.names */
} kt_work_t;

/* Names of work, each kept once: the kernels' short names, then "memcpy" and "memset";
 * work beyond the table's room shares its last entry. */
#define KT_NAMES 64
#define KT_NAME_LEN 64

typedef struct {
    uint64_t corr, tag;
} kt_link_t;

static struct {
    int state; /* 0 not tried, 1 ready, -1 unavailable */
    char why[1400];
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*flush)(uint32_t);
    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*push)(CUpti_ExternalCorrelationKind, uint64_t);
    CUptiResult (*pop)(CUpti_ExternalCorrelationKind, uint64_t *);
    pthread_mutex_t mu;
    kt_work_t *work;
    kt_link_t *link;
    char names[KT_NAMES][KT_NAME_LEN];
    int nnames;
    size_t nwork, cwork, nlink, clink;
    int overflow; /* a record could not be kept: the spans are not trusted */
} kt = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The activity kinds recorded: the work, and the API calls the links hang on. */
static const CUpti_ActivityKind kt_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
#if KT_PEER_COPIES
    CUPTI_ACTIVITY_KIND_MEMCPY2,
#endif
};

static void *grow(void *p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return p;
    size_t c = *cap ? 2 * *cap : 4096;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

/* A kernel's function name from its mangled name (Itanium C++ ABI): the last
 * identifier of its nested name, so "_ZN12_GLOBAL__N_18quantizeIL..." gives "quantize";
 * a name that is not mangled is kept as it is. */
static void short_name(const char *mangled, char *out, size_t len)
{
    snprintf(out, len, "%s", mangled ? mangled : "kernel");
    if (!mangled || strncmp(mangled, "_Z", 2)) return;
    const char *p = mangled + 2;
    if (*p == 'N') p++;
    while (*p == 'L' || *p == 'K') p++;
    while (*p >= '1' && *p <= '9') {
        char *end;
        long n = strtol(p, &end, 10);
        if (n <= 0 || (size_t)n > strlen(end)) return;
        snprintf(out, len, "%.*s", (int)n, end);
        p = end + n;
    }
}

static int intern(const char *name)
{
    for (int i = 0; i < kt.nnames; i++)
        if (!strcmp(kt.names[i], name)) return i;
    if (kt.nnames == KT_NAMES) return KT_NAMES - 1;
    snprintf(kt.names[kt.nnames], KT_NAME_LEN, "%s", name);
    return kt.nnames++;
}

static void keep_work(uint32_t corr, uint64_t start, uint64_t end, int name)
{
    kt_work_t *w = grow(kt.work, &kt.cwork, kt.nwork, sizeof(*w));
    if (!w) {
        kt.overflow = 1;
        return;
    }
    kt.work = w;
    w[kt.nwork++] = (kt_work_t){corr, start, end, name};
}

static void keep_link(uint32_t corr, uint64_t tag)
{
    kt_link_t *l = grow(kt.link, &kt.clink, kt.nlink, sizeof(*l));
    if (!l) {
        kt.overflow = 1;
        return;
    }
    kt.link = l;
    l[kt.nlink++] = (kt_link_t){corr, tag};
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, KT_BUFFER_BYTES);
    *size = *buffer ? KT_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&kt.mu);
    while (kt.next(buffer, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
/* the start, end and correlation id of one kind of work record, and its name */
#define KEEP(type, name) \
    keep_work(((const type *)r)->correlationId, ((const type *)r)->start, ((const type *)r)->end, intern(name))
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            char name[KT_NAME_LEN];
            short_name(((const kt_kernel_t *)r)->name, name, sizeof(name));
            KEEP(kt_kernel_t, name);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: KEEP(kt_memcpy_t, "memcpy"); break;
        case CUPTI_ACTIVITY_KIND_MEMSET: KEEP(kt_memset_t, "memset"); break;
#if KT_PEER_COPIES
        case CUPTI_ACTIVITY_KIND_MEMCPY2: KEEP(kt_peer_t, "memcpy"); break;
#endif
#undef KEEP
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
            const CUpti_ActivityExternalCorrelation *x = (const CUpti_ActivityExternalCorrelation *)r;
            if (x->externalKind == KT_EXTERNAL_KIND) keep_link(x->correlationId, x->externalId);
            break;
        }
        default: /* the API records themselves: only their links matter */
            break;
        }
    }
    pthread_mutex_unlock(&kt.mu);
    free(buffer);
}

#define KT_SYM(field, name)                                                      \
    do {                                                                         \
        *(void **)&kt.field = dlsym(lib, name);                                  \
        if (!kt.field) {                                                         \
            snprintf(kt.why, sizeof(kt.why), "%s lacks %s", path, name);         \
            return -1;                                                           \
        }                                                                        \
    } while (0)

static void *load_library(char *path, size_t len)
{
    static const char *const names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *lib = dlopen(names[i], RTLD_NOW);
        if (lib) {
            snprintf(path, len, "%s", names[i]);
            return lib;
        }
    }
#ifdef MOEA2A_CUPTI_DIRS
    char dirs[1024];
    snprintf(dirs, sizeof(dirs), "%s", MOEA2A_CUPTI_DIRS);
    for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(path, len, "%s/libcupti.so", d);
        void *lib = dlopen(path, RTLD_NOW);
        if (lib) return lib;
    }
#endif
    return NULL;
}

static int open_once(void)
{
    char path[1100];
    void *lib = load_library(path, sizeof(path));
    if (!lib) {
        snprintf(kt.why, sizeof(kt.why), "libcupti.so not found (on the library path, or in CUDA's extras/CUPTI/lib64)");
        return -1;
    }
    CUptiResult (*version)(uint32_t *) = NULL;
    CUptiResult (*callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = NULL;
    KT_SYM(enable, "cuptiActivityEnable");
    KT_SYM(disable, "cuptiActivityDisable");
    KT_SYM(flush, "cuptiActivityFlushAll");
    KT_SYM(next, "cuptiActivityGetNextRecord");
    KT_SYM(push, "cuptiActivityPushExternalCorrelationId");
    KT_SYM(pop, "cuptiActivityPopExternalCorrelationId");
    *(void **)&version = dlsym(lib, "cuptiGetVersion");
    *(void **)&callbacks = dlsym(lib, "cuptiActivityRegisterCallbacks");
    uint32_t v = 0;
    if (!version || !callbacks || version(&v) != CUPTI_SUCCESS) {
        snprintf(kt.why, sizeof(kt.why), "%s: no usable cuptiGetVersion / cuptiActivityRegisterCallbacks", path);
        return -1;
    }
    if (KT_MAJOR(v) != KT_MAJOR((uint32_t)CUPTI_API_VERSION)) {
        snprintf(kt.why, sizeof(kt.why), "%s has CUPTI API version %u; moea2a_perf reads the records of version %u",
                 path, v, (unsigned)CUPTI_API_VERSION);
        return -1;
    }
    CUptiResult r = callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        snprintf(kt.why, sizeof(kt.why), "cuptiActivityRegisterCallbacks failed (%d): is another profiler attached?",
                 (int)r);
        return -1;
    }
    return 0;
}

int perf_kt_open(char *why, size_t len)
{
    if (!kt.state) kt.state = open_once() ? -1 : 1;
    if (kt.state < 0 && why) snprintf(why, len, "%s", kt.why);
    return kt.state > 0 ? 0 : -1;
}

int perf_kt_begin(void)
{
    if (kt.state <= 0) return -1;
    pthread_mutex_lock(&kt.mu);
    kt.nwork = kt.nlink = 0, kt.overflow = 0;
    pthread_mutex_unlock(&kt.mu);
    for (size_t i = 0; i < sizeof(kt_kinds) / sizeof(kt_kinds[0]); i++)
        if (kt.enable(kt_kinds[i]) != CUPTI_SUCCESS) {
            for (size_t j = 0; j < i; j++) kt.disable(kt_kinds[j]);
            return -1;
        }
    return 0;
}

void perf_kt_tag(uint64_t tag)
{
    if (kt.state > 0) kt.push(KT_EXTERNAL_KIND, tag);
}

void perf_kt_untag(void)
{
    uint64_t last;
    if (kt.state > 0) kt.pop(KT_EXTERNAL_KIND, &last);
}

static int by_key(const void *a, const void *b)
{
    const kt_work_t *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

static int by_corr(const void *a, const void *b)
{
    const kt_link_t *x = a, *y = b;
    return x->corr < y->corr ? -1 : x->corr > y->corr;
}

int perf_kt_end(void)
{
    if (kt.state <= 0) return -1;
    for (size_t i = 0; i < sizeof(kt_kinds) / sizeof(kt_kinds[0]); i++) kt.disable(kt_kinds[i]);
    int failed = kt.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != CUPTI_SUCCESS;
    pthread_mutex_lock(&kt.mu);
    /* the join: each work record's correlation id becomes its tag (0: untagged) */
    qsort(kt.link, kt.nlink, sizeof(kt_link_t), by_corr);
    for (size_t i = 0; i < kt.nwork; i++) {
        kt_link_t want = {kt.work[i].key, 0};
        const kt_link_t *l = kt.nlink ? bsearch(&want, kt.link, kt.nlink, sizeof(kt_link_t), by_corr) : NULL;
        kt.work[i].key = l ? l->tag : 0;
    }
    qsort(kt.work, kt.nwork, sizeof(kt_work_t), by_key);
    failed |= kt.overflow;
    pthread_mutex_unlock(&kt.mu);
    return failed ? -1 : 0;
}

/* The first record of tag in the joined records (sorted by tag), or kt.nwork. */
static size_t first_of(uint64_t tag)
{
    size_t lo = 0, hi = kt.nwork;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (kt.work[mid].key < tag) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

double perf_kt_span(uint64_t tag)
{
    if (kt.state <= 0 || !tag) return 0;
    uint64_t first = UINT64_MAX, last = 0;
    for (size_t i = first_of(tag); i < kt.nwork && kt.work[i].key == tag; i++) {
        if (kt.work[i].start < first) first = kt.work[i].start;
        if (kt.work[i].end > last) last = kt.work[i].end;
    }
    return last > first ? (double)(last - first) * 1e-9 : 0;
}

static int by_start(const void *a, const void *b)
{
    const kt_work_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int perf_kt_parts(uint64_t tag, perf_kt_part_t *parts, int max)
{
    if (kt.state <= 0 || !tag) return 0;
    size_t lo = first_of(tag), hi = lo;
    while (hi < kt.nwork && kt.work[hi].key == tag) hi++;
    /* the tag's records keep their place in the order by tag */
    qsort(kt.work + lo, hi - lo, sizeof(kt_work_t), by_start);
    for (size_t i = lo; i < hi && (int)(i - lo) < max; i++)
        parts[i - lo] = (perf_kt_part_t){kt.names[kt.work[i].name], (double)(kt.work[i].start - kt.work[lo].start) * 1e-9,
                                         (double)(kt.work[i].end - kt.work[i].start) * 1e-9};
    return (int)(hi - lo);
}

#else /* built without CUPTI's headers */

int perf_kt_open(char *why, size_t len)
{
    if (why) snprintf(why, len, "moea2a_perf was built without CUPTI's headers (cupti.h)");
    return -1;
}
int perf_kt_begin(void) { return -1; }
void perf_kt_tag(uint64_t tag) { (void)tag; }
void perf_kt_untag(void) {}
int perf_kt_end(void) { return -1; }
double perf_kt_span(uint64_t tag)
{
    (void)tag;
    return 0;
}
int perf_kt_parts(uint64_t tag, perf_kt_part_t *parts, int max)
{
    (void)tag, (void)parts, (void)max;
    return 0;
}
#endif

/* Unit tests of pieces that need no peers: errors, version, datatypes, the variable
 * table and its parsers, logging, addresses, and the bootstrap ring (in threads). */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/wait.h>

#include "wireup/auth.h"
#include "wireup/bootstrap.h"
#include "comm/cuda.h"
#include "base/error.h"
#include "local_ranks.h"
#include "base/log.h"
#include "moe/backend/symmetric.h"
#include "moea2a.h"
#include "base/params.h"
#include "wireup/socket.h"
#include "tap.h"

static void test_logging(void)
{
    char pattern[] = "/tmp/moea2a-unit-%h-%p.log", path[256], host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(path, sizeof(path), "/tmp/moea2a-unit-%s-%d.log", host, (int)getpid());
    unlink(path);
    setenv("MOEA2A_DEBUG", "INFO", 1);
    setenv("MOEA2A_DEBUG_FILE", pattern, 1);
    M2A_INFO(M2A_SUBSYS_INIT, "hello from the unit test %d", 42);
    M2A_TRACE(M2A_SUBSYS_INIT, "trace must not appear");
    FILE *f = fopen(path, "r");
    char buf[4096] = "";
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
    tap_ok(f != NULL, "MOEA2A_DEBUG_FILE expands %%h and %%p (%s)", path);
    tap_ok(strstr(buf, "MOEA2A INFO INIT") && strstr(buf, "hello from the unit test 42"), "INFO line logged with level and subsystem");
    tap_ok(!strstr(buf, "trace must not appear"), "TRACE suppressed at INFO");
    unlink(path);
}

static void test_errors(void)
{
    int distinct = 1, prefixed = 1;
    static const char *const names[] = {"MOEA2A_SUCCESS", "MOEA2A_ERR_INVALID_ARGUMENT", "MOEA2A_ERR_NO_MEMORY",
                                        "MOEA2A_ERR_SYSTEM", "MOEA2A_ERR_TIMEOUT", "MOEA2A_ERR_PEER_FAILED",
                                        "MOEA2A_ERR_MISMATCH", "MOEA2A_ERR_UNAVAILABLE", "MOEA2A_ERR_TRANSPORT",
                                        "MOEA2A_ERR_CAPACITY", "MOEA2A_ERR_STATE", "MOEA2A_ERR_CUDA",
                                        "MOEA2A_ERR_ABORTED", "MOEA2A_ERR_INTERNAL"};
    for (int i = 0; i < 14; i++) {
        const char *s = moea2a_strerror((moea2a_result_t)i);
        size_t l = strlen(names[i]);
        prefixed &= !strncmp(s, names[i], l) && s[l] == ':';
        for (int j = 0; j < i; j++) distinct &= strcmp(s, moea2a_strerror((moea2a_result_t)j)) != 0;
    }
    tap_ok(prefixed, "moea2a_strerror names every result code");
    tap_ok(distinct, "moea2a_strerror strings are distinct");
    tap_ok(!strncmp(moea2a_strerror((moea2a_result_t)999), "MOEA2A_ERR_UNKNOWN", 18), "unknown code has a string");
    m2a_error(NULL, MOEA2A_ERR_CAPACITY, "raise %s to %d", "cap", 7);
    tap_ok(!strcmp(moea2a_last_error(NULL), "raise cap to 7"), "last error of the thread keeps the detail");
}

static void test_version(void)
{
    int ma = -1, mi = -1, pa = -1;
    /* called before tap_ok: its message's arguments may be evaluated before its test */
    moea2a_result_t r = moea2a_get_version(&ma, &mi, &pa);
    tap_ok(r == MOEA2A_SUCCESS && ma == MOEA2A_VERSION_MAJOR &&
               mi == MOEA2A_VERSION_MINOR && pa == MOEA2A_VERSION_PATCH,
           "moea2a_get_version matches the header (%d.%d.%d)", ma, mi, pa);
    tap_ok(moea2a_get_version(NULL, &mi, &pa) == MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_version(NULL) is rejected");
    tap_ok(strstr(moea2a_get_build_config(), "hwloc=") != NULL, "build config describes the build");
}

static void test_datatypes(void)
{
    static const size_t want[MOEA2A_NUM_DATATYPES] = {1, 1, 4, 8, 2, 2, 4, 1, 1};
    static const char *const names[MOEA2A_NUM_DATATYPES] = {"int8", "uint8", "int32", "int64", "fp16",
                                                             "bf16", "fp32", "fp8_e4m3", "nvfp4"};
    int good = 1;
    for (int d = 0; d < MOEA2A_NUM_DATATYPES; d++) {
        size_t s = 0;
        good &= moea2a_datatype_size((moea2a_datatype_t)d, &s) == MOEA2A_SUCCESS && s == want[d];
        good &= !strcmp(moea2a_datatype_name((moea2a_datatype_t)d), names[d]);
    }
    tap_ok(good, "datatype sizes and names");
    size_t s;
    tap_ok(moea2a_datatype_size(MOEA2A_NUM_DATATYPES, &s) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_datatype_size((moea2a_datatype_t)-1, &s) == MOEA2A_ERR_INVALID_ARGUMENT &&
               moea2a_datatype_size(MOEA2A_INT8, NULL) == MOEA2A_ERR_INVALID_ARGUMENT,
           "bad datatype and NULL size are rejected");
    tap_ok(moea2a_datatype_name((moea2a_datatype_t)42) == NULL, "unknown datatype has no name");
}

static void test_params(void)
{
    const moea2a_param_t *p;
    int n = 0, good = 1;
    moea2a_result_t r = moea2a_get_params(&p, &n);
    tap_ok(r == MOEA2A_SUCCESS && n >= 10, "parameter table has %d entries", n);
    for (int i = 0; i < n; i++) {
        good &= !strncmp(p[i].name, "MOEA2A_", 7) && strlen(p[i].help) > 20 && p[i].default_value;
        good &= !strcmp(p[i].type, "int") || !strcmp(p[i].type, "double") || !strcmp(p[i].type, "string") ||
                !strcmp(p[i].type, "enum") || !strcmp(p[i].type, "secret");
        for (int j = 0; j < i; j++) good &= strcmp(p[i].name, p[j].name) != 0;
    }
    tap_ok(good, "every parameter has a MOEA2A_ name, a type, a default and help; names are unique");
    tap_ok(moea2a_get_params(NULL, &n) == MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_params(NULL) is rejected");

    double d;
    long l;
    tap_ok(!m2a_parse_double("2.5", &d) && d == 2.5 && !m2a_parse_double(" 3 ", &d) && d == 3.0,
           "numbers parse (with surrounding blanks)");
    tap_ok(m2a_parse_double("abc", &d) && m2a_parse_double("1.5x", &d) && m2a_parse_double("", &d) &&
               m2a_parse_double("inf", &d) && m2a_parse_double("nan", &d),
           "malformed and non-finite numbers are rejected");
    tap_ok(!m2a_parse_long("-12", &l) && l == -12 && m2a_parse_long("12.5", &l) && m2a_parse_long("99999999999999999999", &l),
           "integers parse; fractions and overflow are rejected");

    setenv("MOEA2A_TIMEOUT_S", "soon", 1);
    tap_ok(m2a_param_double("MOEA2A_TIMEOUT_S", &d) == MOEA2A_ERR_INVALID_ARGUMENT &&
               strstr(moea2a_last_error(NULL), "MOEA2A_TIMEOUT_S='soon'"),
           "a malformed variable is an error that names it");
    moea2a_unique_id_t id;
    tap_ok(moea2a_get_unique_id(&id) == MOEA2A_ERR_INVALID_ARGUMENT, "moea2a_get_unique_id refuses a malformed timeout");
    setenv("MOEA2A_TIMEOUT_S", "-1", 1);
    tap_ok(moea2a_get_unique_id(&id) == MOEA2A_ERR_INVALID_ARGUMENT, "... and a negative one");
    unsetenv("MOEA2A_TIMEOUT_S");
    tap_ok(m2a_param_double("MOEA2A_TIMEOUT_S", &d) == MOEA2A_SUCCESS && d == 300.0, "default timeout is 300 s");
}

static void test_addresses(void)
{
    m2a_sockaddr_t a;
    char buf[160], why[300];
    tap_ok(!m2a_sock_parse_addr("127.0.0.1:4242", &a, why, sizeof(why)), "host:port parses");
    m2a_sock_format_addr(&a, buf, sizeof(buf));
    tap_ok(!strcmp(buf, "127.0.0.1:4242"), "and formats back (%s)", buf);
    tap_ok(!m2a_sock_parse_addr("localhost:80", &a, why, sizeof(why)) && m2a_sock_port(&a) == 80, "names resolve");
    tap_ok(!m2a_sock_parse_addr("[::1]:29000", &a, why, sizeof(why)) && a.sa.sa_family == AF_INET6 &&
               m2a_sock_port(&a) == 29000 && m2a_sock_is_loopback(&a),
           "[::1]:29000 is IPv6 loopback, port 29000 (%s)", why);
    m2a_sock_format_addr(&a, buf, sizeof(buf));
    tap_ok(!strcmp(buf, "[::1]:29000"), "and formats back (%s)", buf);
    tap_ok(m2a_sock_parse_addr("127.0.0.1:99999", &a, why, sizeof(why)) && strstr(why, "port") &&
               m2a_sock_parse_addr(":80", &a, why, sizeof(why)) && strstr(why, "no host") &&
               m2a_sock_parse_addr("127.0.0.1:x", &a, why, sizeof(why)) &&
               m2a_sock_parse_addr("::1:80", &a, why, sizeof(why)) && strstr(why, "brackets"),
           "bad ports, empty hosts and IPv6 without brackets are refused, saying which");
    tap_ok(m2a_sock_parse_addr("nohost.invalid:1234", &a, why, sizeof(why)) && strstr(why, "does not resolve") &&
               strstr(why, "nohost.invalid"),
           "a host that does not resolve is named as such: %s", why);
    setenv("MOEA2A_SOCKET_IFNAME", "no-such-if", 1);
    tap_ok(m2a_sock_pick_addr(&a, AF_INET, buf, sizeof(buf)) == -1, "an interface name that matches nothing is an error");
    setenv("MOEA2A_SOCKET_IFNAME", "lo", 1);
    tap_ok(!m2a_sock_pick_addr(&a, AF_INET, buf, sizeof(buf)) && a.in4.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
           "lo picks 127.0.0.1");
}

/* The bootstrap ring in threads: large blocks make every rank send and receive at
 * once, which deadlocks unless sends and receives are interleaved. */
#define RING_N 4
#define RING_BLOCK (3u << 20)
typedef struct {
    m2a_id_t id;
    int rank, fails;
} ring_arg_t;

static void *ring_rank(void *p)
{
    ring_arg_t *a = p;
    m2a_bootstrap_t *bs;
    if (m2a_bootstrap_join(&a->id, a->rank, RING_N, 20.0, &bs)) {
        a->fails++;
        return NULL;
    }
    unsigned char *data = malloc((size_t)RING_N * RING_BLOCK);
    for (size_t i = 0; i < RING_BLOCK; i++) data[(size_t)a->rank * RING_BLOCK + i] = (unsigned char)(a->rank * 7 + i);
    if (m2a_bootstrap_allgather(bs, data, RING_BLOCK)) a->fails++;
    for (int r = 0; r < RING_N; r++)
        for (size_t i = 0; i < RING_BLOCK; i += 4093)
            if (data[(size_t)r * RING_BLOCK + i] != (unsigned char)(r * 7 + i)) a->fails++;
    /* small blocks leave with their header, up to 4096 bytes; larger ones after it:
     * calls of either kind one after another */
    static const size_t sizes[] = {1, 16, 4096, 4097, 24, 4096};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        const size_t sz = sizes[k];
        for (size_t i = 0; i < sz; i++) data[(size_t)a->rank * sz + i] = (unsigned char)(a->rank * 13 + i + k);
        if (m2a_bootstrap_allgather(bs, data, sz)) a->fails++;
        for (int r = 0; r < RING_N; r++)
            for (size_t i = 0; i < sz; i++)
                if (data[(size_t)r * sz + i] != (unsigned char)(r * 13 + i + k)) a->fails++;
    }
    if (m2a_bootstrap_barrier(bs)) a->fails++;
    free(data);
    m2a_bootstrap_close(bs);
    return NULL;
}

static int hex_is(const uint8_t *d, const char *hex)
{
    char buf[65];
    for (int i = 0; i < 32; i++) snprintf(buf + 2 * i, 3, "%02x", d[i]);
    return !strcmp(buf, hex);
}

/* FIPS 180-4 examples and RFC 4231 cases 1 and 2 (HMAC pads a short key with zeros
 * to the block size, so the 20- and 4-byte keys are the same keys zero-padded to 32). */
static void test_auth(void)
{
    uint8_t d[32], key[32] = {0};
    m2a_sha256("abc", 3, d);
    tap_ok(hex_is(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "SHA-256 of 'abc'");
    static const char two[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    m2a_sha256(two, strlen(two), d);
    tap_ok(hex_is(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "SHA-256, two blocks");
    memset(key, 0x0b, 20);
    m2a_part_t p1[2] = {{"Hi ", 3}, {"There", 5}};
    m2a_hmac(key, p1, 2, d);
    tap_ok(hex_is(d, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"), "HMAC-SHA256, RFC 4231 case 1");
    memset(key, 0, sizeof(key));
    memcpy(key, "Jefe", 4);
    m2a_part_t p2[1] = {{"what do ya want for nothing?", 28}};
    m2a_hmac(key, p2, 1, d);
    tap_ok(hex_is(d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"), "HMAC-SHA256, RFC 4231 case 2");
    uint8_t a[32] = {0}, b[32] = {0};
    b[31] = 1;
    tap_ok(m2a_equal_ct(a, a, 32) && !m2a_equal_ct(a, b, 32), "constant-time comparison");
}

static void test_bootstrap_ring(void)
{
    m2a_id_t id = {.magic = M2A_ID_MAGIC, .tag = 0x1234,
                   .root = {.in4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}}};
    memset(id.key, 0x5a, sizeof(id.key));
    tap_ok(m2a_rendezvous_serve(&id, 20.0, NULL) == MOEA2A_SUCCESS, "rendezvous service starts");
    pthread_t t[RING_N];
    ring_arg_t a[RING_N];
    for (int r = 0; r < RING_N; r++) {
        a[r] = (ring_arg_t){id, r, 0};
        pthread_create(&t[r], NULL, ring_rank, &a[r]);
    }
    int fails = 0;
    for (int r = 0; r < RING_N; r++) pthread_join(t[r], NULL), fails += a[r].fails;
    tap_ok(fails == 0, "bootstrap ring allgather of %d x %u bytes, then of 1 to 4097 bytes, and barrier (%d failures)",
           RING_N, RING_BLOCK, fails);
}

/* The CUDA module is found on the search path and loaded on first use; a file of that
 * name that is not the module is refused with MOEA2A_ERR_UNAVAILABLE naming why, and
 * host-memory calls never need it. Each case in a child: the loader keeps its first
 * answer for the life of the process. */
static int cuda_module_child(const char *path_dir, int want_loaded)
{
    if (path_dir) setenv("MOEA2A_TRANSPORT_PATH", path_dir, 1);
    float x[2] = {1.0f, -3.0f}, g = 0;
    int fails = 0;
    /* host memory: no module involved, whatever is on the path */
    fails += moea2a_fp4_global_scale(x, MOEA2A_FLOAT32, 2, &g, NULL) != MOEA2A_SUCCESS || g != 448.0f * 6.0f / 3.0f;
    const moea2a_cuda_v1_t *ops = NULL;
    moea2a_result_t r = m2a_cuda_require(NULL, "unit", &ops);
    moea2a_transport_info_t infos[16];
    int n = 0, listed = -1;
    moea2a_get_transports(infos, 16, &n);
    for (int i = 0; i < n && i < 16; i++)
        if (!strcmp(infos[i].name, "cuda")) listed = infos[i].loadable;
    if (want_loaded) {
        fails += r != MOEA2A_SUCCESS || !ops || strcmp(ops->name, "cuda") || ops->abi_version != MOEA2A_CUDA_ABI_VERSION;
        /* the module really calls the runtime: an error code has its runtime name */
        fails += !ops || !ops->error_string(M2A_CUDA_NOT_READY) || !strstr(ops->error_string(M2A_CUDA_NOT_READY), "ready");
        fails += listed != 1;
    } else {
        const char *e = moea2a_last_error(NULL);
        fails += r != MOEA2A_ERR_UNAVAILABLE || ops || !strstr(e, "unit: CUDA memory needs moea2a's CUDA module") ||
                 !strstr(e, MOEA2A_CUDA_SYMBOL);
        fails += m2a_cuda_loaded() != NULL || listed != 0;
        if (fails) printf("# child: r=%d listed=%d error: %s\n", (int)r, listed, e);
    }
    return fails;
}

static int run_child(const char *path_dir, int want_loaded)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(cuda_module_child(path_dir, want_loaded) ? 1 : 0);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_cuda_module(void)
{
    const char *build = getenv("top_builddir") ? getenv("top_builddir") : ".";
    char dir[] = "/tmp/moea2a-unit-XXXXXX", link[256], target[1024], real[4096];
    if (!mkdtemp(dir)) {
        tap_ok(0, "mkdtemp for the CUDA module test");
        return;
    }
    /* a shared object that is not the CUDA module, under the module's file name */
    snprintf(target, sizeof(target), "%s/lib/.libs/libmoea2a.so", build);
    snprintf(link, sizeof(link), "%s/libmoea2a-cuda.so", dir);
    int ok = realpath(target, real) && symlink(real, link) == 0;
    tap_ok(ok && run_child(dir, 0),
           "a libmoea2a-cuda.so without the module's symbol: MOEA2A_ERR_UNAVAILABLE naming it, listed as not loadable; "
           "host-memory calls unaffected");
    unlink(link);
    rmdir(dir);
#ifdef MOEA2A_HAVE_CUDA
    tap_ok(run_child(NULL, 1), "the built CUDA module loads from the search path, ABI v%d, and answers with the runtime",
           MOEA2A_CUDA_ABI_VERSION);
#else
    tap_skip("built without CUDA", "the built CUDA module loads from the search path");
#endif
}

/* MOEA2A_SYMMETRIC_MEMORY's choice, agreed by every rank before any memory is touched
 * (no GPU needed: every case here fails before a way opens): per rank its value, the
 * result every rank must get, and what the message must say. */
typedef struct {
    const char *value[2];
    moea2a_result_t want;
    const char *says[2];
} symm_case_t;

static int symm_rank(int rank, int n, moea2a_unique_id_t id, void *arg)
{
    const symm_case_t *c = arg;
    setenv("MOEA2A_TRANSPORT", "ucx", 1); /* no NCCL: auto means cuda_ipc */
    setenv("MOEA2A_SYMMETRIC_MEMORY", c->value[rank], 1);
    moea2a_comm_t comm;
    if (moea2a_comm_init_rank(&comm, n, id, rank, NULL)) return printf("# rank %d: %s\n", rank, moea2a_last_error(NULL)), 1;
    void *peers[2] = {NULL, NULL};
    m2a_symm_t s;
    moea2a_result_t r = m2a_symm_open(comm, MOEA2A_SUCCESS, 4096, peers, &s);
    int ok = r == c->want && strstr(moea2a_last_error(comm), c->says[rank]) && !s.way && !s.ptr && !peers[0];
    if (!ok) printf("# rank %d: %s: %s\n", rank, moea2a_strerror(r), moea2a_last_error(comm));
    moea2a_comm_destroy(comm);
    return !ok;
}

static void test_symmetric_choice(void)
{
    static const symm_case_t cases[] = {
        {{"nvshmem", "nvshmem"}, MOEA2A_ERR_INVALID_ARGUMENT, {"expected auto, transport or cuda_ipc", "expected auto"}},
        {{"transport", "transport"}, MOEA2A_ERR_UNAVAILABLE, {"by transport: no CUDA transport", "by transport: no CUDA"}},
        {{"cuda_ipc", "nvshmem"}, MOEA2A_ERR_INVALID_ARGUMENT, {"failed on rank 1", "expected auto"}},
        {{"auto", "transport"}, MOEA2A_ERR_UNAVAILABLE, {"by cuda_ipc: not on every rank", "by transport: no CUDA"}},
    };
    int fails = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        local_ranks_result_t res;
        fails += local_ranks_run(2, symm_rank, (void *)&cases[i], 60.0, &res) != 0;
    }
    tap_ok(fails == 0, "MOEA2A_SYMMETRIC_MEMORY: an unknown way is MOEA2A_ERR_INVALID_ARGUMENT, a way some rank cannot "
                       "use MOEA2A_ERR_UNAVAILABLE, on every rank with the reason; nothing allocated");
}

int main(void)
{
    test_logging();
    test_errors();
    test_version();
    test_datatypes();
    test_params();
    test_addresses();
    test_auth();
    test_bootstrap_ring();
    test_cuda_module();
    test_symmetric_choice();
    return tap_done();
}

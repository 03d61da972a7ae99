/* The rendezvous under attack, from processes on the same host:
 *   - a forged join (no key, or a wrong key) gets no byte of the answer and no place;
 *   - moea2a_comm_init_env with MOEA2A_KEY: an impostor that starts first as rank 1
 *     is refused, and the real ranks still form the communicator;
 *   - 200 idle and 20 garbage connections at the root do not delay a 4-rank init
 *     (each would have cost up to 5 s when the root served connections one by one). */
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "wireup/bootstrap.h"
#include "moea2a.h"
#include "tap.h"

#define IDLE 200
#define GARBAGE 20

static int connect_to(const m2a_sockaddr_t *a)
{
    int fd = socket(a->sa.sa_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, &a->sa, m2a_sock_len(a))) close(fd), fd = -1;
    return fd;
}

/* What a maker process reports: the id, and what its attack saw. */
typedef struct {
    moea2a_unique_id_t id;
    int ok;
    ssize_t answered;
} made_t;

/* A maker process makes the id (and, with prepare, attacks its root) and holds it
 * until killed, so this process never has a thread when it forks ranks (moea2a(7)).
 * The ranks init, allgather their ranks and destroy. Returns how many failed, the
 * seconds from handing out the id to the last exit, and what the maker saw. */
static int run_ranks(int nranks, void (*prepare)(made_t *), double *seconds, made_t *made)
{
    int fd[2];
    memset(made, 0, sizeof(*made));
    fflush(stdout);
    if (pipe(fd)) return nranks;
    pid_t maker = fork(), pids[8];
    if (maker == 0) {
        close(fd[0]);
        made_t m = {.ok = moea2a_get_unique_id(&m.id) == MOEA2A_SUCCESS};
        if (m.ok && prepare) prepare(&m);
        if (write(fd[1], &m, sizeof(m)) != (ssize_t)sizeof(m)) _exit(1);
        for (;;) pause();
    }
    close(fd[1]);
    int ok = maker > 0 && read(fd[0], made, sizeof(*made)) == (ssize_t)sizeof(*made) && made->ok;
    close(fd[0]);
    double t0 = now();
    int failed = 0;
    for (int r = 0; ok && r < nranks; r++) {
        if ((pids[r] = fork()) != 0) continue;
        moea2a_comm_t comm;
        int32_t me = r, all[8] = {0}, bad = 0;
        if (moea2a_comm_init_rank(&comm, nranks, made->id, r, NULL)) {
            printf("# rank %d: %s\n", r, moea2a_last_error(NULL));
            fflush(stdout);
            _exit(1);
        }
        bad = moea2a_allgather(&me, all, 1, MOEA2A_INT32, comm, NULL) != MOEA2A_SUCCESS;
        for (int q = 0; q < nranks; q++) bad |= all[q] != q;
        bad |= moea2a_comm_destroy(comm) != MOEA2A_SUCCESS;
        _exit(bad);
    }
    for (int r = 0; ok && r < nranks; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        failed += !WIFEXITED(st) || WEXITSTATUS(st);
    }
    if (seconds) *seconds = now() - t0;
    if (maker > 0) kill(maker, SIGKILL), waitpid(maker, NULL, 0);
    return ok ? failed : nranks;
}

/* In the maker: 200 idle and 20 garbage connections to the root, held open. */
static void junk(made_t *m)
{
    m2a_id_t id;
    memcpy(&id, m->id.internal, sizeof(id));
    int made = 0;
    for (int i = 0; i < IDLE + GARBAGE; i++) {
        int fd = connect_to(&id.root);
        if (fd < 0) continue;
        made++;
        if (i >= IDLE) { /* garbage: junk of every length, some of a hello's size */
            unsigned char junkbuf[sizeof(m2a_hello_t)];
            for (size_t b = 0; b < sizeof(junkbuf); b++) junkbuf[b] = (unsigned char)rand();
            size_t len = i % 2 ? sizeof(junkbuf) : (size_t)(rand() % (int)sizeof(junkbuf));
            send(fd, junkbuf, len, MSG_NOSIGNAL);
        }
    }
    m->answered = made;
}

/* In the maker: the process that serves the root may hold only 64 descriptors, and
 * 40 idle connections (80 descriptors between their two ends) exhaust them. */
static void junk_fd_limit(made_t *m)
{
    struct rlimit rl = {64, 64};
    setrlimit(RLIMIT_NOFILE, &rl);
    m2a_id_t id;
    memcpy(&id, m->id.internal, sizeof(id));
    int made = 0;
    for (int i = 0; i < 40; i++) made += connect_to(&id.root) >= 0;
    m->answered = made;
}

static double timed_init(int nranks, int with_junk)
{
    made_t m;
    double dt;
    int failed = run_ranks(nranks, with_junk ? junk : NULL, &dt, &m);
    if (with_junk && m.answered != IDLE + GARBAGE)
        tap_diag("only %zd of %d junk connections were made", m.answered, IDLE + GARBAGE);
    return failed ? -1 : dt;
}

/* In the maker: join the rendezvous as a raw client that speaks the protocol without
 * the key; it must be closed with no byte of answer. */
static void forge(made_t *m)
{
    m2a_id_t id;
    memcpy(&id, m->id.internal, sizeof(id));
    int fd = connect_to(&id.root);
    unsigned char challenge[32];
    m2a_hello_t h = {.magic = M2A_ID_MAGIC, .tag = id.tag, .rank = 1, .nranks = 2};
    memset(h.mac, 0xab, sizeof(h.mac));
    m->answered = -2;
    if (fd < 0 || recv(fd, challenge, sizeof(challenge), MSG_WAITALL) != (ssize_t)sizeof(challenge)) return;
    send(fd, &h, sizeof(h), MSG_NOSIGNAL);
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[64];
    m->answered = recv(fd, buf, sizeof(buf), 0);
    close(fd);
}

static void forged_join(void)
{
    made_t m;
    int failed = run_ranks(2, forge, NULL, &m);
    tap_ok(m.answered == 0, "a join with a forged MAC (id tag known, key not) is closed with no byte of answer (got %zd)",
           m.answered);
    tap_ok(failed == 0, "the real ranks form the communicator after the forged join");
}

/* init_env with MOEA2A_KEY: an impostor (a wrong key, or none) that comes first as
 * rank 1 is refused; the real ranks form the communicator. */
/* A key file holding text: mode 0600 (good) or 0644 (refused). */
static void key_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
    chmod(path, mode);
}

static void env_impostor(const char *keyfile)
{
    int port = 20000 + (int)(getpid() % 10000);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    pid_t pids[3];
    for (int p = 0; p < 3; p++) {
        if ((pids[p] = fork()) != 0) continue;
        int rank = p == 0 ? 1 : p - 1; /* process 0: the impostor */
        char rs[8];
        snprintf(rs, sizeof(rs), "%d", rank);
        setenv("MOEA2A_RANK", rs, 1);
        setenv("MOEA2A_NRANKS", "2", 1);
        setenv("MOEA2A_ROOT_ADDR", addr, 1);
        if (p == 0) unsetenv("MOEA2A_KEY"); /* derives the public key, as an attacker can */
        else if (p == 1) setenv("MOEA2A_KEY", "the job's secret", 1);
        else setenv("MOEA2A_KEY_FILE", keyfile, 1); /* the same secret, from a file */
        moea2a_config_t cfg = MOEA2A_CONFIG_INITIALIZER;
        cfg.timeout_s = p == 0 ? 2.0 : 10.0;
        if (p == 2) usleep(300000); /* the real rank 1 comes last */
        moea2a_comm_t comm;
        moea2a_result_t r = moea2a_comm_init_env(&comm, &cfg);
        if (p == 0) {
            if (r == MOEA2A_SUCCESS) moea2a_comm_destroy(comm);
            printf("# impostor: %s: %s\n", moea2a_strerror(r), moea2a_last_error(NULL));
            fflush(stdout);
            _exit(r == MOEA2A_SUCCESS ? 1 : 0);
        }
        if (r != MOEA2A_SUCCESS) {
            printf("# rank %d: %s\n", rank, moea2a_last_error(NULL));
            _exit(1);
        }
        int32_t me = rank, all[2] = {-1, -1};
        int bad = moea2a_allgather(&me, all, 1, MOEA2A_INT32, comm, NULL) || all[0] != 0 || all[1] != 1;
        bad |= moea2a_comm_destroy(comm) != MOEA2A_SUCCESS;
        _exit(bad);
    }
    int codes[3];
    for (int p = 0; p < 3; p++) {
        int st;
        waitpid(pids[p], &st, 0);
        codes[p] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    tap_ok(codes[0] == 0, "init_env with MOEA2A_KEY: an impostor without the key is refused as rank 1");
    tap_ok(codes[1] == 0 && codes[2] == 0,
           "init_env: the real ranks 0 (MOEA2A_KEY) and 1 (MOEA2A_KEY_FILE, the same secret) form the communicator");
}

/* Key settings that init_env must refuse before any network step. */
static void bad_keys(const char *keyfile)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fails = 0;
        moea2a_comm_t comm;
        setenv("MOEA2A_RANK", "0", 1);
        setenv("MOEA2A_NRANKS", "1", 1);
        setenv("MOEA2A_ROOT_ADDR", "127.0.0.1:1", 1);
        setenv("MOEA2A_KEY", "x", 1);
        setenv("MOEA2A_KEY_FILE", keyfile, 1);
        fails += moea2a_comm_init_env(&comm, NULL) != MOEA2A_ERR_INVALID_ARGUMENT; /* both set */
        unsetenv("MOEA2A_KEY");
        key_file(keyfile, "the job's secret", 0644);
        fails += moea2a_comm_init_env(&comm, NULL) != MOEA2A_ERR_INVALID_ARGUMENT; /* others may read it */
        setenv("MOEA2A_KEY_FILE", "/nonexistent/moea2a.key", 1);
        fails += moea2a_comm_init_env(&comm, NULL) != MOEA2A_ERR_INVALID_ARGUMENT; /* missing */
        _exit(fails);
    }
    int st;
    waitpid(pid, &st, 0);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "init_env refuses both MOEA2A_KEY and MOEA2A_KEY_FILE, a key file others can read, a missing one");
}

int main(void)
{
    setenv("MOEA2A_TIMEOUT_S", "20", 1);
    /* the rendezvous is under test, not the transports: on a GPU machine NCCL's setup
     * made a 4-rank init take 5.6 s, varying by over 1 s from one init to the next */
    setenv("MOEA2A_TRANSPORT", "ucx", 1);
    srand((unsigned)getpid());
    char keyfile[] = "/tmp/moea2a-key-XXXXXX";
    int kfd = mkstemp(keyfile);
    if (kfd >= 0) close(kfd);
    key_file(keyfile, "the job's secret", 0600);
    env_impostor(keyfile);
    bad_keys(keyfile);
    unlink(keyfile);
    forged_join();
    double base = timed_init(4, 0), attacked = timed_init(4, 1);
    tap_diag("4-rank init: %.3f s alone, %.3f s with %d idle and %d garbage connections at the root", base, attacked,
             IDLE, GARBAGE);
    made_t m;
    int failed = run_ranks(4, junk_fd_limit, NULL, &m);
    tap_ok(failed == 0, "a root out of file descriptors (%zd idle connections, limit 64) sheds them and admits 4 ranks",
           m.answered);
    /* A root that served connections one at a time would wait out each idle one's
     * handshake allowance (5 s) before the ranks behind it: half of one is the bound. */
    tap_ok(base >= 0 && attacked >= 0 && attacked - base < 2.5,
           "%d idle and %d garbage connections delay a 4-rank init by %.3f s (< 2.5 s, half of one idle connection's "
           "handshake allowance)",
           IDLE, GARBAGE, attacked - base);
    return tap_done();
}

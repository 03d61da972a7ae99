#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"

int m2a_log_level = -1;
static int log_subsys = M2A_SUBSYS_ALL;
static FILE *log_file;
static int log_rank = -1;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct { const char *name; int bit; } subsys_names[] = {
    {"INIT", M2A_SUBSYS_INIT}, {"BOOTSTRAP", M2A_SUBSYS_BOOTSTRAP},
    {"TRANSPORT", M2A_SUBSYS_TRANSPORT}, {"COLL", M2A_SUBSYS_COLL},
    {"MOE", M2A_SUBSYS_MOE}, {"TOPO", M2A_SUBSYS_TOPO}, {"ALL", M2A_SUBSYS_ALL},
};

static const char *subsys_name(int subsys)
{
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
        if (subsys_names[i].bit == subsys) return subsys_names[i].name;
    return "ALL";
}

/* "INIT,COLL" enables those; "^INIT" enables all but those. */
static int parse_subsys(const char *spec)
{
    int exclude = spec[0] == '^', mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec + exclude);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
            if (!strcasecmp(tok, subsys_names[i].name)) mask |= subsys_names[i].bit;
    return exclude ? ~mask : mask;
}

/* MOEA2A_DEBUG_FILE: %h is replaced by the host name, %p by the process id. */
static FILE *open_log_file(const char *pattern)
{
    char path[1024];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += snprintf(path + o, sizeof(path) - o, "%s", log_host), p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += snprintf(path + o, sizeof(path) - o, "%d", (int)getpid()), p++;
        } else {
            path[o++] = *p;
        }
        if (o >= sizeof(path)) o = sizeof(path) - 1;
    }
    path[o] = 0;
    FILE *f = fopen(path, "a");
    if (!f) fprintf(stderr, "moea2a: cannot open MOEA2A_DEBUG_FILE '%s'; logging to stderr\n", path);
    return f ? f : stderr;
}

static void log_init_once(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    const char *lvl = m2a_param_str("MOEA2A_DEBUG");
    int level = M2A_LOG_WARN;
    if (!strcasecmp(lvl, "NONE")) level = M2A_LOG_NONE;
    else if (!strcasecmp(lvl, "INFO")) level = M2A_LOG_INFO;
    else if (!strcasecmp(lvl, "TRACE")) level = M2A_LOG_TRACE;
    else if (strcasecmp(lvl, "WARN"))
        fprintf(stderr, "moea2a: MOEA2A_DEBUG='%s' is not NONE|WARN|INFO|TRACE; using WARN\n", lvl);
    log_subsys = parse_subsys(m2a_param_str("MOEA2A_DEBUG_SUBSYS"));
    const char *file = getenv("MOEA2A_DEBUG_FILE");
    log_file = (file && *file) ? open_log_file(file) : stderr;
    if (log_file != stderr) setvbuf(log_file, NULL, _IOLBF, 0);
    __atomic_store_n(&m2a_log_level, level, __ATOMIC_RELEASE);
}

void m2a_log_init(void) { pthread_once(&log_once, log_init_once); }
void m2a_log_set_rank(int rank) { log_rank = rank; }

int m2a_log_enabled(int level, int subsys)
{
    if (__atomic_load_n(&m2a_log_level, __ATOMIC_ACQUIRE) < 0) m2a_log_init();
    return level <= m2a_log_level && (subsys & log_subsys);
}

void m2a_log(int level, int subsys, const char *file, int line, const char *fmt, ...)
{
    static const char *const level_names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    pthread_mutex_lock(&log_lock);
    fprintf(log_file, "%s:%d:%ld [%d] MOEA2A %s %s %s:%d %s\n", log_host, (int)getpid(),
            (long)syscall(SYS_gettid), log_rank, level_names[level], subsys_name(subsys),
            base ? base + 1 : file, line, msg);
    fflush(log_file);
    pthread_mutex_unlock(&log_lock);
}

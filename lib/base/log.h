/* Logging in the NCCL DEBUG / DEBUG_SUBSYS style: MOEA2A_DEBUG picks the level,
 * MOEA2A_DEBUG_SUBSYS the subsystems, MOEA2A_DEBUG_FILE the destination. */
#ifndef M2A_LOG_H
#define M2A_LOG_H

enum { M2A_LOG_NONE = 0, M2A_LOG_WARN = 1, M2A_LOG_INFO = 2, M2A_LOG_TRACE = 3 };
enum {
    M2A_SUBSYS_INIT = 1 << 0,
    M2A_SUBSYS_BOOTSTRAP = 1 << 1,
    M2A_SUBSYS_TRANSPORT = 1 << 2,
    M2A_SUBSYS_COLL = 1 << 3,
    M2A_SUBSYS_MOE = 1 << 4,
    M2A_SUBSYS_TOPO = 1 << 5,
    M2A_SUBSYS_ALL = ~0
};

extern int m2a_log_level; /* -1 until the environment was read */
void m2a_log_init(void);
void m2a_log_set_rank(int rank);
void m2a_log(int level, int subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int m2a_log_enabled(int level, int subsys);

/* Cheap when disabled: one load and compare before any formatting. */
#define M2A_LOG(level, subsys, ...) \
    do { if (m2a_log_enabled((level), (subsys))) \
             m2a_log((level), (subsys), __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define M2A_WARN(subsys, ...) M2A_LOG(M2A_LOG_WARN, subsys, __VA_ARGS__)
#define M2A_INFO(subsys, ...) M2A_LOG(M2A_LOG_INFO, subsys, __VA_ARGS__)
#define M2A_TRACE(subsys, ...) M2A_LOG(M2A_LOG_TRACE, subsys, __VA_ARGS__)
#endif

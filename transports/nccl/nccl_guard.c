/* The guard of an NCCL communicator: a thread that ends it once the core's peer watcher
 * names a dead rank (moea2a_transport_v3_t.watch), so that NCCL kernels stuck on that
 * rank end even while nobody calls moea2a: a caller waiting in cudaStreamSynchronize()
 * behind a generic-path dispatch gets its stream back within milliseconds of the
 * death, as the load/store kernels' own waits give it. The communicator is ended as
 * the module's abort ends it (m2a_nccl_end). Every operation of the module on the
 * communicator holds its lock (recursive: a group holds it from its start to its end),
 * so the guard never frees NCCL's communicator under a call that uses it. */
#include <pthread.h>
#include <time.h>

#include "nccl_internal.h"

/* Polls of the dead word, 2 ms apart: a death is acted on within that of the news. */
#define GUARD_POLL_NS 2000000L

static void *guard_main(void *arg)
{
    nccl_comm_t *c = arg;
    const struct timespec nap = {0, GUARD_POLL_NS};
    while (!__atomic_load_n(&c->guard_stop, __ATOMIC_ACQUIRE)) {
        const volatile int32_t *dead = __atomic_load_n(&c->dead, __ATOMIC_ACQUIRE);
        if (dead && __atomic_load_n(dead, __ATOMIC_ACQUIRE)) {
            m2a_nccl_lock(c);
            if (!c->failed) m2a_nccl_end(c);
            m2a_nccl_unlock(c);
            break;
        }
        nanosleep(&nap, NULL);
    }
    return NULL;
}

int m2a_nccl_guard_init(nccl_comm_t *c)
{
    pthread_mutexattr_t a;
    if (pthread_mutexattr_init(&a)) return -1;
    int e = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    if (!e) e = pthread_mutex_init(&c->lock, &a);
    pthread_mutexattr_destroy(&a);
    return e ? -1 : 0;
}

int m2a_nccl_guard_start(nccl_comm_t *c)
{
    if (c->guarded) return 0;
    __atomic_store_n(&c->guard_stop, 0, __ATOMIC_RELEASE);
    if (pthread_create(&c->guard, NULL, guard_main, c)) return -1;
    c->guarded = 1;
    return 0;
}

void m2a_nccl_guard_stop(nccl_comm_t *c)
{
    if (!c->guarded) return;
    __atomic_store_n(&c->guard_stop, 1, __ATOMIC_RELEASE);
    pthread_join(c->guard, NULL);
    c->guarded = 0;
}

void m2a_nccl_guard_fini(nccl_comm_t *c)
{
    m2a_nccl_guard_stop(c);
    pthread_mutex_destroy(&c->lock);
}

void m2a_nccl_lock(nccl_comm_t *c) { pthread_mutex_lock(&c->lock); }
void m2a_nccl_unlock(nccl_comm_t *c) { pthread_mutex_unlock(&c->lock); }

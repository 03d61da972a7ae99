/* Symmetric memory by CUDA IPC: each rank cudaMallocs its allocation and exports a
 * handle; the ranks exchange cards over the bootstrap and map each other's. Serves
 * ranks on one host whose GPUs reach each other, with no NCCL: ranks in other
 * processes are imported (cudaIpcOpenMemHandle, peer access enabled as needed), ranks
 * of this process reached directly (a process cannot import its own handles), ranks
 * on the same GPU as well, which is how several ranks share one GPU. */
#include "config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wireup/auth.h"
#include "comm/comm.h"
#include "comm/cuda.h"
#include "moe/core.h"
#include "moe/backend/symmetric.h"

#define OPS (m2a_cuda_loaded())

/* What every rank learns of every other's allocation. */
typedef struct {
    int32_t result; /* this rank's local steps: MOEA2A_SUCCESS or why not */
    int32_t cuda_error; /* with MOEA2A_ERR_CUDA: which */
    int32_t device; /* ordinal, meaningful within one process */
    char host[40];  /* the kernel's boot id: ranks that can import each other's handles */
    uint64_t process; /* random per process: ranks that share an address space */
    unsigned char uuid[16]; /* the GPU */
    uint64_t ptr;
    unsigned char handle[M2A_CUDA_IPC_HANDLE_BYTES];
} card_t;

typedef struct {
    int n;
    void *imported[]; /* [nranks]: what ipc_import mapped, NULL elsewhere */
} ipc_state_t;

static uint64_t process_token;
static pthread_once_t token_once = PTHREAD_ONCE_INIT;
static void make_token(void)
{
    if (m2a_random(&process_token, sizeof(process_token)) != MOEA2A_SUCCESS)
        process_token = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&process_token;
}

static void host_id(char *out, size_t len)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    memset(out, 0, len);
    if (!f || !fgets(out, (int)len, f)) gethostname(out, len - 1);
    if (f) fclose(f);
    out[strcspn(out, "\n")] = 0;
}

static int usable(moea2a_comm_t comm, char *why, size_t len)
{
    int hosts = comm->nodes.host_size[comm->rank];
    if (hosts == comm->nranks) return 1;
    snprintf(why, len, "%d of the %d ranks are on this host; CUDA IPC serves one host", hosts, comm->nranks);
    return 0;
}

/* This rank's card: its allocation of bytes, exported. */
static void fill_card(size_t bytes, card_t *c, void **ptr)
{
    pthread_once(&token_once, make_token);
    memset(c, 0, sizeof(*c));
    host_id(c->host, sizeof(c->host));
    c->process = process_token;
    int e = OPS->get_device(&c->device);
    if (e == 0) e = OPS->device_uuid(c->device, c->uuid);
    if (e == 0) e = OPS->malloc(ptr, bytes);
    if (e == 0) e = OPS->ipc_export(*ptr, c->handle);
    c->ptr = (uint64_t)(uintptr_t)*ptr;
    c->result = e == 0 ? MOEA2A_SUCCESS : MOEA2A_ERR_CUDA;
    c->cuda_error = e;
}

/* Where this rank reaches rank q's allocation. */
static moea2a_result_t map_peer(moea2a_comm_t comm, const card_t *me, const card_t *c, int q, ipc_state_t *st,
                                void **peer)
{
    int e;
    if (strcmp(c->host, me->host))
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "CUDA IPC: rank %d runs on another host (boot id %s)", q, c->host);
    if (c->process != me->process) {
        if ((e = OPS->ipc_import(c->handle, &st->imported[q])) != 0)
            return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "CUDA IPC: this GPU cannot map rank %d's memory: %s", q,
                             OPS->error_string(e));
        *peer = st->imported[q];
        return MOEA2A_SUCCESS;
    }
    if (memcmp(c->uuid, me->uuid, 16) && (e = OPS->peer_access(c->device)) != 0)
        return m2a_error(comm, MOEA2A_ERR_UNAVAILABLE, "CUDA IPC: GPU %d cannot reach rank %d's GPU %d: %s", me->device,
                         q, c->device, OPS->error_string(e));
    *peer = (void *)(uintptr_t)c->ptr;
    return MOEA2A_SUCCESS;
}

static void unmap(moea2a_comm_t comm, m2a_symm_t *s)
{
    (void)comm;
    ipc_state_t *st = s->state;
    for (int q = 0; st && q < st->n; q++)
        if (st->imported[q]) (void)OPS->ipc_close(st->imported[q]), st->imported[q] = NULL;
}

static void release(moea2a_comm_t comm, m2a_symm_t *s, int healthy)
{
    (void)comm, (void)healthy;
    if (s->ptr) OPS->free(s->ptr);
    free(s->state);
    s->ptr = s->state = NULL;
}

static moea2a_result_t open_ipc(moea2a_comm_t comm, size_t bytes, void **peers, m2a_symm_t *s)
{
    const int n = comm->nranks, me = comm->rank;
    card_t *cards = calloc((size_t)n, sizeof(card_t));
    ipc_state_t *st = calloc(1, sizeof(*st) + sizeof(void *) * (size_t)n);
    void *ptr = NULL;
    if (cards && st) fill_card(bytes, &cards[me], &ptr);
    else if (cards) cards[me].result = MOEA2A_ERR_NO_MEMORY;
    /* every rank enters the exchange, whatever its own steps gave */
    moea2a_result_t r = cards ? m2a_comm_allgather(comm, cards, sizeof(card_t)) :
                                m2a_error(comm, MOEA2A_ERR_NO_MEMORY, "moea2a_moe_create: out of memory");
    const int exchanged = r == MOEA2A_SUCCESS;
    s->ptr = ptr, s->state = st;
    if (st) st->n = n;
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++)
        if (cards[q].result != MOEA2A_SUCCESS)
            r = m2a_error(comm, (moea2a_result_t)cards[q].result, "CUDA IPC: rank %d could not allocate and export %zu "
                          "bytes: %s", q, bytes, cards[q].result == MOEA2A_ERR_CUDA ? OPS->error_string(cards[q].cuda_error)
                                                                                   : "out of memory");
    for (int q = 0; r == MOEA2A_SUCCESS && q < n; q++) {
        if (q == me) peers[q] = ptr;
        else r = map_peer(comm, &cards[me], &cards[q], q, st, &peers[q]);
        s->gpu_ranks += !strcmp(cards[q].host, cards[me].host) && !memcmp(cards[q].uuid, cards[me].uuid, 16);
    }
    free(cards);
    if (exchanged) r = m2a_moe_agree(comm, r, NULL);
    if (r != MOEA2A_SUCCESS) { /* as at destroy: nobody frees what a peer still maps */
        unmap(comm, s);
        if (exchanged && !m2a_peer_lost(r))
            (void)m2a_comm_barrier(comm);
        release(comm, s, 0);
    }
    return r;
}

const m2a_symm_way_t m2a_symm_cuda_ipc = {
    .name = "cuda_ipc", .usable = usable, .open = open_ipc, .unmap = unmap, .release = release,
};

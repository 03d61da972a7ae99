/* The NCCL transport's use of NCCL's device API (nccl_device.h is C++): the device
 * communicator, which tells whether every rank is load/store reachable (its LSA
 * team), and the peer addresses of a symmetric window, resolved on the device. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_internal.h"

extern "C" ncclResult_t m2a_nccl_devcomm_create(ncclComm_t nc, void **devcomm)
{
    ncclDevComm *dc = static_cast<ncclDevComm *>(calloc(1, sizeof(ncclDevComm)));
    if (!dc) return ncclSystemError;
    ncclDevCommRequirements reqs;
    memset(&reqs, 0, sizeof(reqs)); /* no barriers or other resources: moea2a signals itself */
    *devcomm = dc;
    return ncclDevCommCreate(nc, &reqs, dc);
}

extern "C" int m2a_nccl_lsa_team_size(ncclComm_t nc)
{
    return ncclTeamLsa(nc).nRanks;
}

extern "C" int m2a_nccl_devcomm_lsa_size(const void *devcomm)
{
    return static_cast<const ncclDevComm *>(devcomm)->lsaSize;
}

extern "C" void m2a_nccl_devcomm_destroy(ncclComm_t nc, void *devcomm)
{
    if (!devcomm) return;
    ncclDevCommDestroy(nc, static_cast<ncclDevComm *>(devcomm));
    free(devcomm);
}

namespace {
__global__ void window_peers(ncclWindow_t win, int nranks, void **peers)
{
    for (int r = threadIdx.x; r < nranks; r += blockDim.x) peers[r] = ncclGetPeerPointer(win, 0, r);
}
} // namespace

extern "C" int m2a_nccl_window_peers(ncclWindow_t win, int nranks, void **d_peers)
{
    window_peers<<<1, 64>>>(win, nranks, d_peers);
    cudaError_t e = cudaGetLastError();
    return (int)(e != cudaSuccess ? e : cudaDeviceSynchronize());
}

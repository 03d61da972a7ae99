"""moea2a.MoE on CUDA memory from PyTorch (skipped without torch or a GPU): bf16 torch
tensors in, torch tensors out that view the workspace (no copies), on a torch stream;
dispatch, the expert step written into the combine buffer with torch ops, and combine,
checked against the reference of test_numpy (contiguous placement, ascending source
tokens, the sum over the ranks a token went to); the same three captured in one CUDA
graph and replayed with new tokens. One rank in this process; with 2 or more GPUs also
that many spawned ranks, one GPU each, their communicator from a unique id or from a
torch.distributed NCCL group (Comm.from_torch); and 2 spawned ranks sharing GPU 0
without NCCL (CUDA IPC)."""
import os

import numpy as np
import pytest

import moea2a

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_numpy import CAP, E, H, K, dests, tokens  # noqa: E402


def bf16(x):
    """float32 NumPy -> bf16 torch tensor on the GPU (the test's values are small
    integers, exact in bf16)."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).cuda()


def check_dispatch(res, rank, ep, seed, x_of):
    """The received rows against what every source sent here (tokens(src, seed))."""
    assert res.ep == ep and res.stride == CAP
    counts = res.recv_counts.cpu().numpy()
    pay, ids, src_index = res.payloads[0], res.topk_ids.cpu().numpy(), res.src_token_index.cpu().numpy()
    assert pay.dtype == torch.bfloat16 and tuple(pay.shape) == (ep, CAP, H) and pay.is_cuda
    got = pay.float().cpu().numpy()
    for src in range(ep):
        sids, _ = tokens(src, seed)
        sx = x_of(src)
        want = [t for t in range(len(sids)) if rank in dests(sids[t], ep)]
        assert counts[src] == len(want), (src, counts[src], len(want))
        for i, t in enumerate(want):
            assert src_index[src, i] == t
            assert np.array_equal(got[src, i], sx[t])
            valid = [e if 0 <= e < E else -1 for e in sids[t]]
            assert list(ids[src, i]) == valid
        assert np.all(ids[src, len(want):] == -1) and np.all(src_index[src, len(want):] == -1)  # sanitized


def expert_step(moe, res, rank):
    """The experts: each received row times (rank + 1), into the combine buffer (torch
    ops on the views, so a graph captures them)."""
    buf = moe.combine_buffer()
    assert buf.dtype == torch.bfloat16 and buf.is_cuda
    buf.view(res.ep, CAP, H).copy_(res.payloads[0] * (rank + 1))


def combined(ids, x, ep):
    want = np.zeros_like(x)
    for t in range(len(ids)):
        want[t] = sum((d + 1) for d in dests(ids[t], ep)) * x[t]
    return want


def xs(rank, seed):
    """Rows of small integers (rank * 1000 + t would not be exact in bf16), so that
    every product and sum below is exact in bf16 too."""
    n = len(tokens(rank, seed)[0])
    return ((np.arange(n)[:, None] * 3 + rank * 5 + np.arange(H)[None, :] + seed) % 16 - 8).astype(np.float32)


def rank_main(rank, ep, uid, port=None, copy_engine=False, share=False):
    """One rank: its communicator from uid, or (with a port) from a torch.distributed
    NCCL group of ep ranks through Comm.from_torch; copy_engine: the rows moved by the
    GPU's copy engines (MOEA2A_MOE_COPY_ENGINE); share: every rank on GPU 0, without
    NCCL (ucx for the host side, the load/store path's memory by CUDA IPC)."""
    device = 0 if share else rank
    torch.cuda.set_device(device)
    if share:
        os.environ["MOEA2A_SYMMETRIC_MEMORY"] = "cuda_ipc"
        comm = moea2a.Comm(ep, rank, uid, cuda_device=device, transport="ucx")
    elif port is not None:
        import torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ep,
                                device_id=torch.device("cuda", rank))
        comm = moea2a.Comm.from_torch(cuda_device=rank)
        assert (comm.rank, comm.size) == (rank, ep)
    else:
        comm = moea2a.Comm(ep, rank, uid, cuda_device=rank)
    with comm:
        moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="bf16", memory="cuda", copy_engine=copy_engine)
        stream = torch.cuda.Stream()
        for seed in (1, 2, 3):
            ids, _ = tokens(rank, seed)
            x = xs(rank, seed)
            with torch.cuda.stream(stream):
                res = moe.dispatch(bf16(x), torch.from_numpy(ids).cuda(), stream=stream)
                check_dispatch(res, rank, ep, seed, lambda s: xs(s, seed))
                expert_step(moe, res, rank)
                out = moe.combine(stream=stream)
                stream.synchronize()
            assert out.dtype == torch.bfloat16 and tuple(out.shape) == (len(ids), H)
            assert np.array_equal(out.float().cpu().numpy(), combined(ids, x, ep))
        moe.close()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_rank():
    rank_main(0, 1, moea2a.unique_id())


def test_copy_engine_one_rank():
    """Copy-engine mode gives the same rows and sums; under CUDA graph capture its
    dispatch raises moea2a.Unavailable (it waits on the host) and launches nothing."""
    rank_main(0, 1, moea2a.unique_id(), copy_engine=True)
    with moea2a.Comm(1, 0, moea2a.unique_id(), cuda_device=0) as comm:
        moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="bf16", memory="cuda", copy_engine=True)
        ids, _ = tokens(0, 1)
        dx, dids = bf16(xs(0, 1)), torch.from_numpy(ids).cuda()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            with pytest.raises(moea2a.Unavailable, match="CUDA graph"):
                with torch.cuda.graph(graph, stream=stream):
                    moe.dispatch(dx, dids, stream=stream)
        moe.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("how", ["unique_id", "torch_group"])
def test_ranks_on_gpus(how):
    ep = min(torch.cuda.device_count(), 4)
    port = free_port() if how == "torch_group" else None
    assert moea2a.run_local(ep, rank_main, port, timeout=180, start="spawn") == [None] * ep


def ucx_transport():
    """Whether this build has a ucx transport (ranks sharing a GPU run without NCCL,
    which refuses two ranks on one GPU)."""
    try:
        with moea2a.Comm(1, 0, moea2a.unique_id(), transport="ucx"):
            return True
    except moea2a.Error:
        return False


@pytest.mark.skipif(not ucx_transport(), reason="no ucx transport")
@pytest.mark.parametrize("copy_engine", [False, True])
def test_ranks_sharing_a_gpu(copy_engine):
    """2 spawned ranks on GPU 0, the load/store path over CUDA IPC (each process in its
    turn on the GPU: slow, but every exchange between ranks runs)."""
    assert moea2a.run_local(2, rank_main, None, copy_engine, True, timeout=180, start="spawn") == [None, None]


def test_comm_from_torch_group():
    """Comm.from_torch on a one-rank group (gloo: no GPU needed for the id's trip)."""
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group exists already")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with moea2a.Comm.from_torch() as comm:
            assert (comm.rank, comm.size) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_graph_capture_and_replay():
    """dispatch, the expert step and combine captured once; each replay reads the tokens
    and ids copied into the captured inputs (same count), results checked every time."""
    with moea2a.Comm(1, 0, moea2a.unique_id(), cuda_device=0) as comm:
        moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="bf16", memory="cuda")
        n = CAP
        rng = np.random.default_rng(5)
        ids0 = rng.integers(-1, E, size=(n, K)).astype(np.int32)
        dx, dids = bf16(np.ones((n, H))), torch.from_numpy(ids0).cuda()
        out = torch.empty((n, H), dtype=torch.bfloat16, device="cuda")
        stream = torch.cuda.Stream()

        def step():
            res = moe.dispatch(dx, dids, stream=stream)
            expert_step(moe, res, 0)
            moe.combine(out=out, stream=stream)
            return res

        with torch.cuda.stream(stream):
            step()  # warm-up: the views are made here, outside the capture
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                res = step()
        for seed in (6, 7, 8):
            r = np.random.default_rng(seed)
            ids = r.integers(-1, E, size=(n, K)).astype(np.int32)
            x = r.integers(-8, 8, size=(n, H)).astype(np.float32)
            dids.copy_(torch.from_numpy(ids))
            dx.copy_(bf16(x))
            out.fill_(7)
            graph.replay()
            torch.cuda.synchronize()
            routed = [t for t in range(n) if dests(ids[t], 1)]
            assert int(res.recv_counts.cpu()[0]) == len(routed)
            assert np.array_equal(res.src_token_index.cpu().numpy()[0, :len(routed)], routed)
            assert np.array_equal(out.float().cpu().numpy(), combined(ids, x, 1))
        moe.close()


def test_views_are_the_workspace():
    """The result's tensors share the workspace's memory: no copies, same addresses."""
    with moea2a.Comm(1, 0, moea2a.unique_id(), cuda_device=0) as comm:
        moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="bf16", memory="cuda")
        ids, _ = tokens(0, 4)
        res = moe.dispatch(bf16(xs(0, 4)), torch.from_numpy(ids).cuda())
        assert res.payloads[0].data_ptr() == res.ptr["payloads"][0]
        assert res.topk_ids.data_ptr() == res.ptr["topk_ids"]
        assert res.recv_counts.data_ptr() == res.ptr["recv_counts"]
        moe.combine()  # out allocated: a torch tensor
        moe.close()


def test_the_torch_dispatcher_example():
    """examples/torch_dispatcher.py: one rank in this process; on 2 or more GPUs also
    the script itself, which spawns one rank per GPU and checks every result."""
    import importlib.util
    import os
    import subprocess
    import sys
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "torch_dispatcher.py")
    spec = importlib.util.spec_from_file_location("torch_dispatcher", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.demo_rank(0, 1, moea2a.unique_id()) is None
    if torch.cuda.device_count() >= 2:
        run = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "GPU(s): ok" in run.stdout, (run.stdout, run.stderr[-2000:])


def test_wire_fp8_on_cuda():
    """Quantize on dispatch on CUDA memory: the codes delivered (a uint8 torch view of
    the workspace) equal the host quantization of the rows that were sent, in order,
    and the scales arrive as a byte view."""
    hq = 256  # FP8 blocks are 128 wide
    rng = np.random.default_rng(9)
    ids = rng.integers(-1, E, size=(CAP, K)).astype(np.int32)
    xb = torch.from_numpy(rng.normal(size=(CAP, hq)).astype(np.float32)).to(torch.bfloat16)
    bits = xb.view(torch.int16).numpy().view(np.uint16)  # what the host quantizer takes for bf16
    with moea2a.Comm(1, 0, moea2a.unique_id(), cuda_device=0) as comm:
        moe = moea2a.MoE(comm, E, K, CAP, hidden=hq, dtype="bf16", wire="fp8", memory="cuda")
        res = moe.dispatch(xb.cuda(), torch.from_numpy(ids).cuda())
        torch.cuda.synchronize()
        routed = [t for t in range(CAP) if dests(ids[t], 1)]
        codes = res.payloads[0]
        assert codes.dtype == torch.uint8 and codes.is_cuda and tuple(codes.shape) == (1, CAP, hq)
        want, _ = moea2a.fp8_quantize(np.ascontiguousarray(bits[routed]), "bf16", layout="row")
        assert np.array_equal(codes[0, :len(routed)].cpu().numpy(), want)
        assert res.scales[0].is_cuda and res.scales[0].dtype == torch.uint8 and res.scales[0].numel() > 0
        moe.combine_buffer().zero_()
        moe.combine()
        moe.close()


def test_the_hf_moe_block_example():
    """examples/hf_moe_block.py (needs transformers): a Qwen3-MoE block split over the
    ranks with moea2a agrees with its own forward, fp32 within 1e-4 and bf16 within
    2e-2 of the largest output; one rank in this process, and on 2 or more GPUs the
    script on every GPU, both dtypes."""
    pytest.importorskip("transformers")
    import importlib.util
    import subprocess
    import sys
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "hf_moe_block.py")
    spec = importlib.util.spec_from_file_location("hf_moe_block", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for dtype in ("fp32", "bf16"):
        assert example.rank_main(0, 1, moea2a.unique_id(), dtype, 64) is None
        if torch.cuda.device_count() >= 2:
            run = subprocess.run([sys.executable, path, "--dtype", dtype], capture_output=True, text=True, timeout=600)
            assert run.returncode == 0 and "GPU(s), " + dtype + ": ok" in run.stdout, (run.stdout, run.stderr[-2000:])

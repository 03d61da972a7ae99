"""moea2a.expert_gemm on CUDA memory from PyTorch (skipped without torch or a GPU):
torch bf16 rows and uint8/float32 weight tensors, the result equal to the same call on
host memory (NumPy) within moea2a_expert(3)'s bound, rank-major rows with a workspace
tensor, and a call captured into a CUDA graph that follows counts changed between
replays."""
import numpy as np
import pytest

import moea2a

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_expert_gemm import E, K, N, bf16_bits, bf16_value, check_rows, weights  # noqa: E402


def cuda(x):
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def test_expert_major_graph():
    w, s, g, wd = weights(11)
    rows = 48
    a, af = bf16_bits(np.random.default_rng(12).normal(size=(rows, K)))
    counts, offsets = np.array([7, 16, 1], dtype=np.int32), np.array([0, 8, 32], dtype=np.int32)
    da = cuda(a).view(torch.bfloat16)
    dw, ds, dg, dcnt, doff = cuda(w), cuda(s), cuda(g), cuda(counts), cuda(offsets)
    dc = torch.zeros((rows, N), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        moea2a.expert_gemm(da, dw, ds, dg, N, K, counts=dcnt, offsets=doff, c=dc, stream=stream)  # warm-up
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            moea2a.expert_gemm(da, dw, ds, dg, N, K, counts=dcnt, offsets=doff, c=dc, stream=stream)
    for cnt in ([7, 16, 1], [0, 3, 16]):  # the replay reads the counts of the moment
        dc.zero_()
        dcnt.copy_(torch.tensor(cnt, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        got = bf16_value(dc.view(torch.int16).cpu().numpy().view(np.uint16))
        used = np.zeros(rows, dtype=bool)
        for e in range(E):
            r = slice(offsets[e], offsets[e] + cnt[e])
            used[r] = True
            if cnt[e]:
                check_rows(got[r], af[r], wd[e], False, False)
        assert not np.any(got[~used])


def test_rank_major_workspace():
    w, s, g, wd = weights(13)
    rows, slots = 24, 2
    rng = np.random.default_rng(14)
    ids = rng.choice([-1, 0, 1, 2, 7], size=(rows, slots)).astype(np.int32)
    a, af = bf16_bits(rng.normal(size=(rows, K)))
    da, dw, ds, dg, dids = cuda(a).view(torch.bfloat16), cuda(w), cuda(s), cuda(g), cuda(ids)
    nb = moea2a.expert_gemm_workspace_size(da, dw, ds, dg, N, K, ids=dids, slots=slots)
    assert nb > 0
    ws = torch.empty(nb, dtype=torch.uint8, device="cuda")
    dc = torch.zeros((rows * slots, N // 2), dtype=torch.float32, device="cuda")
    moea2a.expert_gemm(da, dw, ds, dg, N, K, ids=dids, slots=slots, c=dc, c_dtype="fp32", swiglu=True,
                       workspace=ws, stream=torch.cuda.current_stream())
    got = dc.cpu().numpy()
    host = moea2a.expert_gemm(a, w, s, g, N, K, ids=ids, slots=slots, c_dtype="fp32", swiglu=True)
    for r in range(rows):
        for sl in range(slots):
            e = int(ids[r, sl])
            if 0 <= e < E:
                check_rows(got[r * slots + sl][None, :], af[r:r + 1], wd[e], True, True)
            else:
                assert not np.any(got[r * slots + sl])
    assert np.allclose(got, host, rtol=2.0 ** -6, atol=1e-6)

"""moea2a from Python on host memory with NumPy: 1-4 processes (forked, each a rank),
dispatch and combine checked against a reference written here from moea2a_moe(3)
(contiguous expert placement, slots in ascending source-token order, combine as the
sum of the rows of the ranks a token went to); quantize on dispatch; error mapping."""
import os

import numpy as np
import pytest

import moea2a

E, K, CAP, H = 16, 3, 12, 64


def tokens(rank, seed):
    rng = np.random.default_rng(seed * 100 + rank)
    n = int(rng.integers(0, CAP + 1))
    ids = rng.integers(-1, E, size=(n, K)).astype(np.int32)  # -1: invalid, routes nowhere
    x = (rank * 1000 + np.arange(n)[:, None] + np.zeros((1, H))).astype(np.float32)
    return ids, x


def owner(e, ep):
    per, rem = divmod(E, ep)  # ranks 0..rem-1 own per + 1 experts
    return e // (per + 1) if e < rem * (per + 1) else rem + (e - rem * (per + 1)) // per


def dests(ids_row, ep):
    return sorted({owner(int(e), ep) for e in ids_row if 0 <= e < E})


def rank_main(rank, ep, uid, seed):
    comm = moea2a.Comm(ep, rank, uid)
    moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="fp32", combine_dtype="fp32", memory="host")
    ids, x = tokens(rank, seed)
    res = moe.dispatch(x, ids)
    assert res.ep == ep and res.stride == CAP
    # what every source sent here, in source-token order
    for src in range(ep):
        sids, sx = tokens(src, seed)
        want = [t for t in range(len(sids)) if rank in dests(sids[t], ep)]
        assert res.recv_counts[src] == len(want), (src, res.recv_counts[src], len(want))
        for i, t in enumerate(want):
            assert res.src_token_index[src, i] == t
            assert np.array_equal(res.payloads[0][src, i], sx[t])
    assert res.invalid_entries == int((ids < 0).sum())
    # the expert side: each received row scaled by (this rank + 1), in the combine buffer
    buf = moe.combine_buffer()
    for src in range(ep):
        for i in range(res.recv_counts[src]):
            buf[src * res.stride + i] = res.payloads[0][src, i] * (rank + 1)
    out = moe.combine()
    for t in range(len(ids)):
        want = sum((d + 1) for d in dests(ids[t], ep)) * x[t]
        assert np.array_equal(out[t], want.astype(np.float32)), (t, out[t][:4], want[:4])
    moe.close()
    comm.destroy()


def run_ranks(ep, target, *args):
    return dict(enumerate(moea2a.run_local(ep, target, *args)))


@pytest.mark.parametrize("ep", [1, 2, 3, 4])
def test_dispatch_combine_match_the_reference(ep):
    for seed in (1, 2):
        results = run_ranks(ep, rank_main, seed)
        assert all(v is None for v in results.values()), results


def expert_main(rank, ep, uid, seed):
    """Expert-major: each local expert's rows in (source rank, token) order from aligned
    offsets; combine with the router weights, whose sums (products rounded to fp32,
    ascending slot, per rank rounded, then the ranks in order) the oracle repeats."""
    comm = moea2a.Comm(ep, rank, uid)
    moe = moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="fp32", combine_dtype="fp32", memory="host", weights=True,
                     layout="expert", expert_alignment=8, weighted_combine=True)
    ids, x = tokens(rank, seed)
    w = (np.arange(ids.size, dtype=np.float32).reshape(ids.shape) % 7 + 1) / np.float32(3)
    res = moe.dispatch(x, ids, w)
    local = [e for e in range(E) if owner(e, ep) == rank]
    assert res.num_local_experts == len(local)
    off = 0
    for j, e in enumerate(local):
        rows = [(src, t, s) for src in range(ep) for t, row in enumerate(tokens(src, seed)[0])
                for s in range(K) if row[s] == e and e not in list(row[:s])]
        assert res.expert_counts[j] == len(rows) and res.expert_offsets[j] == off
        for i, (src, t, s) in enumerate(rows):
            assert (res.expert_ids[off + i], res.expert_src_rank[off + i], res.expert_src_token[off + i],
                    res.expert_topk_slot[off + i]) == (e, src, t, s)
            assert np.array_equal(res.expert_payloads[0][off + i], tokens(src, seed)[1][t])
        off += -(-len(rows) // 8) * 8
    assert res.expert_rows == off
    rows = np.zeros((res.expert_rows, H), dtype=np.float32)
    for i in range(res.expert_rows):
        if res.expert_src_rank[i] >= 0:
            rows[i] = res.expert_payloads[0][i] * np.float32(res.expert_ids[i] + 1)
    out = moe.combine(rows)
    for t in range(len(ids)):
        want = np.zeros(H, dtype=np.float32)
        for q in dests(ids[t], ep):
            acc = np.zeros(H, dtype=np.float32)
            for s in range(K):
                e = int(ids[t, s])
                if 0 <= e < E and owner(e, ep) == q:
                    acc = acc + w[t, s] * (x[t] * np.float32(e + 1))
            want = want + acc
        assert np.array_equal(out[t], want), (t, out[t][:4], want[:4])
    moe.close()
    comm.destroy()


@pytest.mark.parametrize("ep", [1, 2, 3])
def test_expert_major_layout(ep):
    results = run_ranks(ep, expert_main, 3)
    assert all(v is None for v in results.values()), results


def wire_main(rank, ep, uid):
    comm = moea2a.Comm(ep, rank, uid)
    moe = moea2a.MoE(comm, E, K, CAP, hidden=256, dtype="bf16", wire="fp8-mn", memory="host")
    rng = np.random.default_rng(rank)
    ids = rng.integers(0, E, size=(5, K)).astype(np.int32)
    x = (rng.standard_normal((5, 256)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    res = moe.dispatch(x, ids)
    codes, _ = moea2a.fp8_quantize(x, "bf16", layout="row")
    if ep == 1:  # one rank: every token of its own, in order, as the standalone call quantizes them
        got = [res.src_token_index[0, i] for i in range(res.recv_counts[0])]
        for i, t in enumerate(got):
            assert np.array_equal(res.payloads[0][0, i], codes[t])
    assert res.scales[0] is not None and res.scales[0].size == ep * 2 * ((CAP + 3) // 4 * 4) * 4  # [ep][2 blocks][cap4] fp32
    moe.close()
    comm.destroy()


@pytest.mark.parametrize("ep", [1, 2])
def test_quantize_on_dispatch(ep):
    results = run_ranks(ep, wire_main)
    assert all(v is None for v in results.values()), results


def test_errors_carry_code_and_detail():
    with pytest.raises(moea2a.InvalidArgument) as e:
        moea2a.fp8_quantize(np.zeros((2, 100), dtype=np.float32), "fp32")
    assert e.value.code == 1 and "multiple of 128" in e.value.detail
    assert isinstance(e.value, ValueError) and e.value.name == "MOEA2A_ERR_INVALID_ARGUMENT"
    with pytest.raises(moea2a.InvalidArgument):
        moea2a.MoE.__init__(object.__new__(moea2a.MoE), None, E, K, CAP, hidden=8, dtype="nope")


def test_config_errors_on_a_communicator():
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            try:
                moea2a.MoE(comm, E, K, CAP, hidden=100, dtype="bf16", wire="fp8", memory="host")
                return "no error"
            except moea2a.InvalidArgument as e:
                return None if "multiple of 128" in e.detail else e.detail
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def bad_arrays_main(rank, ep, uid):
    """Arrays the context would misread (another dtype, too few bytes), on rank 1 only:
    InvalidArgument on every rank, naming the array on rank 1; the context goes on."""
    with moea2a.Comm(ep, rank, uid) as comm:
        with moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="fp32", combine_dtype="fp32", memory="host",
                        weights=True) as moe:
            ids = np.array([[0, 5, 9], [15, 1, -1]], dtype=np.int32)
            x, w = np.ones((2, H), np.float32), np.ones((2, K), np.float32)
            bad = {"topk_ids": (x, ids.astype(np.int64), w), "topk_weights": (x, ids, w[:1]),
                   "payload 0": (x.astype(np.float64), ids, w)}
            seen = []
            for what, args in bad.items():
                good = (x, ids, w)
                try:
                    moe.dispatch(*(args if rank == 1 else good))
                    return f"dispatch with a bad {what} on rank 1 passed"
                except moea2a.InvalidArgument as e:
                    if rank == 1 and what not in e.detail:
                        return f"the message does not name {what}: {e.detail}"
                    seen.append(what)
            res = moe.dispatch(x, ids, w)  # the context took none of those
            out = np.zeros((2, H), np.float32)
            buf = moe.combine_buffer()
            for src in range(ep):
                for i in range(res.recv_counts[src]):
                    buf[src * res.stride + i] = res.payloads[0][src, i]
            for bad_out in (np.zeros((2, H), np.float16), np.zeros((1, H), np.float32)):
                try:
                    moe.combine(None, bad_out if rank == 1 else out)
                    return "combine with a bad out on rank 1 passed"
                except moea2a.InvalidArgument as e:
                    if rank == 1 and "out" not in e.detail:
                        return f"the message does not name out: {e.detail}"
            moe.combine(None, out)  # the dispatch still waits for its combine: it goes through
            want = np.array([len(dests(r, ep)) for r in ids], np.float32)[:, None] * x
            if not np.array_equal(out, want):
                return f"combine after the refusals: {out[:, 0]} != {want[:, 0]}"
            # rank 1 idle, its expert rows of the wrong dtype: the combine fails on both too
            res = moe.dispatch(x, ids, w) if rank == 0 else moe.dispatch(None, None)
            rows = np.zeros((res.ep * res.stride, H), np.float32)
            try:
                moe.combine(rows.astype(np.float64) if rank == 1 else rows, out if rank == 0 else None)
                return "combine with a bad expert_out on idle rank 1 passed"
            except moea2a.InvalidArgument as e:
                if rank == 1 and "expert_out" not in e.detail:
                    return f"the message does not name expert_out: {e.detail}"
            moe.combine(rows, out if rank == 0 else None)
            return None if len(seen) == 3 else seen


def test_bad_arrays_fail_every_rank_and_the_context_goes_on():
    results = run_ranks(2, bad_arrays_main)
    assert all(v is None for v in results.values()), results


def test_out_of_order_comes_before_bad_arrays():
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            with moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="fp32", combine_dtype="fp32", memory="host") as moe:
                ids, x = np.array([[0, 1, 2]], np.int32), np.ones((1, H), np.float32)
                with pytest.raises(moea2a.StateError):  # no dispatch yet, and an out of 3 rows
                    moe.combine(None, np.zeros((3, H), np.float32))
                moe.dispatch(x, ids)
                with pytest.raises(moea2a.StateError):  # not combined yet, and int64 ids
                    moe.dispatch(x, ids.astype(np.int64))
                moe.combine()
                return None
    results = run_ranks(1, main)
    assert all(v is None for v in results.values()), results


class TorchLike:
    """What the package reads of a torch.Tensor (data_ptr, is_contiguous, dtype named
    "torch.<name>", nbytes, shape), over a NumPy array: the torch path on host memory,
    where PyTorch is not installed."""

    class DType:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return "torch." + self.name

    def __init__(self, a, name):
        self.a, self.dtype = a, TorchLike.DType(name)
        self.shape, self.nbytes = a.shape, a.nbytes

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]

    def is_contiguous(self):
        return self.a.flags.c_contiguous


def test_torch_like_arrays_are_checked_by_dtype_name_and_bytes():
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            with moea2a.MoE(comm, E, K, CAP, hidden=H, dtype="bf16", combine_dtype="bf16", memory="host") as moe:
                ids = np.array([[0, 5, 9], [15, 1, -1]], dtype=np.int32)
                x = np.arange(2 * H, dtype=np.uint16).reshape(2, H)
                for bad_ids in (TorchLike(ids.astype(np.int64), "int64"), TorchLike(ids[:, :2].copy(), "int32")):
                    try:
                        moe.dispatch(TorchLike(x, "bfloat16"), bad_ids)
                        return "a torch-like int64 or short topk_ids passed"
                    except moea2a.InvalidArgument:
                        pass
                res = moe.dispatch(TorchLike(x, "bfloat16"), TorchLike(ids, "int32"))
                if not np.array_equal(res.payloads[0][0, :2], x):
                    return "the rows of torch-like bf16 arrays did not arrive"
                out = np.zeros((2, H), np.uint16)
                moe.combine(None, TorchLike(out, "bfloat16"))
                return None
    results = run_ranks(1, main)
    assert all(v is None for v in results.values()), results


def test_fp8_roundtrip_is_close():
    x = np.linspace(-3, 3, 2 * 256, dtype=np.float32).reshape(2, 256)
    q, s = moea2a.fp8_quantize(x, "fp32", layout="mn", ue8m0=True)
    y = moea2a.fp8_dequantize(q, s, "fp32", layout="mn", ue8m0=True)
    assert np.max(np.abs(y - x)) <= 3 * 2.0 ** -4  # E4M3: 3 mantissa bits


def test_version_matches_the_package():
    import importlib.metadata
    try:
        assert importlib.metadata.version("moea2a") == moea2a.__version__
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the package is not installed (run from the source tree)")


def test_fp8_combine_wire_is_close_to_the_plain_combine():
    """MoE(combine_wire="fp8"): the same round trip as the plain combine, each output
    within a few FP8 steps of it (moea2a_moe(3), "FP8 combine", bounds it exactly;
    test_combine_wire checks the bits), and not the same numbers."""
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            outs = []
            for wire in (None, "fp8"):
                with moea2a.MoE(comm, E, K, CAP, hidden=128, dtype="fp32", memory="host", combine_wire=wire) as moe:
                    rng = np.random.default_rng(rank)
                    ids = rng.integers(0, E, size=(CAP, K)).astype(np.int32)
                    x = rng.standard_normal((CAP, 128)).astype(np.float32)
                    res = moe.dispatch(x, ids)
                    outs.append(np.array(moe.combine(res.payloads[0])))
            plain, fp8 = outs
            scale = np.abs(plain).max()
            if not (np.abs(fp8 - plain).max() <= 2 * K * scale / 16 and not np.array_equal(fp8, plain)):
                return f"FP8 combine off by {np.abs(fp8 - plain).max()} (scale {scale})"
        return None
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def test_set_placement_moves_experts_in_place():
    """MoE.set_placement: after moving every expert to the other rank, a round trip
    equals that of a context created with the moved map; a map over the bound raises."""
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            moved = [(e * ep // E + 1) % ep for e in range(E)]
            rng = np.random.default_rng(7 + rank)
            ids = rng.integers(0, E, size=(CAP, K)).astype(np.int32)
            x = rng.standard_normal((CAP, 8)).astype(np.float32)
            outs = []
            for mapped in (False, True):
                kw = {"expert_to_rank": moved} if mapped else {"max_local_experts": E // ep}
                with moea2a.MoE(comm, E, K, CAP, hidden=8, dtype="fp32", memory="host", **kw) as moe:
                    if not mapped:
                        moe.set_placement(moved)
                        try:
                            moe.set_placement([0] * E)
                            return "a map over the bound was taken"
                        except moea2a.Error:
                            pass
                    res = moe.dispatch(x, ids)
                    outs.append((np.array(res.recv_counts), np.array(moe.combine(res.payloads[0]))))
            if not (np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])):
                return "the moved context differs from the one created with the map"
        return None
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def test_set_replicas_spreads_tokens_over_holders():
    """MoE.set_replicas: every expert but 0 on both ranks, expert 0 on none: token t of
    rank s reaches rank (s + t) % 2 only, its entries for expert 0 are dropped_entries
    (and, with rewrite_nonlocal, arrive invalid while its own expert stays), and the
    combine returns the token's row once. general_placement=True (the flag a context in
    CUDA memory needs for this) is taken on host memory as the no-op it is there."""
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            with moea2a.MoE(comm, E, K, CAP, hidden=8, dtype="fp32", memory="host", max_local_experts=E,
                            rewrite_nonlocal=True, general_placement=True) as moe:
                moe.set_replicas([[] if e == 0 else [0, 1] for e in range(E)])
                ids = np.zeros((CAP, K), dtype=np.int32)
                ids[:, 0] = 1 + np.arange(CAP) % (E - 1)
                x = np.arange(CAP * 8, dtype=np.float32).reshape(CAP, 8) + rank
                res = moe.dispatch(x, ids)
                want = [sum(1 for t in range(CAP) if (s + t) % ep == rank) for s in range(ep)]
                if list(np.array(res.recv_counts)) != want or res.dropped_entries != CAP * (K - 1):
                    return f"recv_counts {list(np.array(res.recv_counts))} (want {want}), dropped {res.dropped_entries}"
                got, src = np.array(res.topk_ids), np.array(res.src_token_index)
                for s_ in range(ep):
                    for i in range(want[s_]):
                        t = src[s_, i]
                        if got[s_, i, 0] != 1 + t % (E - 1) or (got[s_, i, 1:] != -1).any():
                            return f"received ids {got[s_, i]} for token {t} of rank {s_}"
                load = moe.expert_load(reset=True)
                want_load = [0] * E
                for s_ in range(ep):
                    for t in range(CAP):
                        if (s_ + t) % ep == rank:
                            want_load[1 + t % (E - 1)] += 1
                if load != want_load or moe.expert_load() != [0] * E:
                    return f"expert load {load}, want {want_load}"
                out = np.array(moe.combine(res.payloads[0]))
                if not np.array_equal(out, x):
                    return "the combine differs from each token's row"
        return None
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def test_traffic_counts_what_an_alltoall_hands_the_transport():
    """Comm.traffic(): after one host dispatch and combine the bytes this rank handed for
    its own node grew (2 ranks on one host: one node) and none went to other nodes."""
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            before = comm.traffic()
            with moea2a.MoE(comm, E, K, CAP, hidden=8, dtype="fp32", memory="host") as moe:
                ids = np.full((4, K), (rank + 1) % ep * (E // ep), dtype=np.int32)  # every token to the peer
                moe.dispatch(np.ones((4, 8), np.float32), ids)
                moe.combine()
            after = comm.traffic()
            if not (after["host_same_node"] > before["host_same_node"] and after["host_other_nodes"] == 0
                    and after["cuda_same_node"] == 0 and after["cuda_other_nodes"] == 0):
                return f"traffic {before} -> {after}"
        return None
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def test_handles_release_once_and_refuse_use_after():
    def main(rank, ep, uid):
        with moea2a.Comm(ep, rank, uid) as comm:
            with moea2a.MoE(comm, E, K, CAP, hidden=8, dtype="fp32", memory="host") as moe:
                assert moe.max_recv_rows() == ep * CAP
            try:
                moe.max_recv_rows()
                return "a closed MoE context answered"
            except moea2a.StateError:
                pass
            assert comm.size == ep and comm.rank == rank
        try:
            comm.rank
            return "a destroyed communicator answered"
        except moea2a.StateError:
            return None
    results = run_ranks(2, main)
    assert all(v is None for v in results.values()), results


def test_the_token_dispatcher_example():
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "examples", "token_dispatcher.py")
    spec = importlib.util.spec_from_file_location("token_dispatcher", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    results = example.demo(4)
    assert all(v is None for v in results.values()), results


def test_the_overhead_bench_runs():
    """python -m moea2a.bench --overhead on host memory: it runs and reports both calls
    (the numbers themselves are recorded in bench/RESULTS.md, not asserted here)."""
    from moea2a import bench

    rows = bench.overhead(tokens=4, hidden=16, iters=50, mem="host")
    assert [name for name, _ in rows] == ["dispatch", "combine"]


def combine_dtype_main(rank, ep, uid, dtype, combine_dtype, want):
    """The combine rows follow dtype (fp16, bf16, fp32; bf16 for other payloads) unless
    combine_dtype names them; float32 rows in an fp32 context come back exact."""
    comm = moea2a.Comm(ep, rank, uid)
    kw = {} if combine_dtype is None else {"combine_dtype": combine_dtype}
    elems = H if dtype != "nvfp4" else H // 2
    with moea2a.MoE(comm, E, K, CAP, hidden=elems, dtype=dtype, memory="host", **kw) as moe:
        assert moe.combine_dtype == want, (moe.combine_dtype, want)
        buf = moe.combine_buffer()
        assert buf.dtype == np.dtype({"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}[want]), buf.dtype
        if dtype == "fp32" and combine_dtype is None:
            ids, x = tokens(rank, 3)
            x = x + np.float32(0.125)  # not exact in bf16 at these magnitudes
            res = moe.dispatch(x, ids)
            for src in range(ep):
                for i in range(res.recv_counts[src]):
                    buf[src * res.stride + i] = res.payloads[0][src, i]
            out = moe.combine()
            assert out.dtype == np.float32
            for t in range(len(ids)):
                want_row = len(dests(ids[t], ep)) * x[t]
                assert np.array_equal(out[t], want_row.astype(np.float32)), (t, out[t][:4], want_row[:4])
    comm.destroy()


@pytest.mark.parametrize("dtype,combine_dtype,want", [("fp32", None, "fp32"), ("fp16", None, "fp16"),
                                                      ("bf16", None, "bf16"), ("int32", None, "bf16"),
                                                      ("fp32", "bf16", "bf16")])
def test_combine_dtype_follows_dtype(dtype, combine_dtype, want):
    results = run_ranks(2, combine_dtype_main, dtype, combine_dtype, want)
    assert all(v is None for v in results.values()), results


def round_trip_checked(moe, rank, ep, seed, owner_of):
    """One dispatch + combine whose rows and sums match the reference for the placement
    owner_of (expert -> rank); None, or what differs."""
    ids, x = tokens(rank, seed)
    res = moe.dispatch(x, ids)
    if res.ep != ep:
        return f"ep {res.ep}, want {ep}"
    for src in range(ep):
        sids, sx = tokens(src, seed)
        want = [t for t in range(len(sids)) if any(0 <= e < E and owner_of[e] == rank for e in sids[t])]
        if res.recv_counts[src] != len(want):
            return f"{res.recv_counts[src]} rows from rank {src}, want {len(want)}"
        for i, t in enumerate(want):
            if res.src_token_index[src, i] != t or not np.array_equal(res.payloads[0][src, i], sx[t]):
                return f"row {i} from rank {src} is not token {t}"
    out = moe.combine(res.payloads[0])
    for t in range(len(ids)):
        n = len({owner_of[e] for e in ids[t] if 0 <= e < E})
        if not np.array_equal(out[t], (n * x[t]).astype(np.float32)):
            return f"token {t} combined wrong"
    return None


def test_shrink_retarget_grow():
    """Comm.shrink, MoE.retarget and Comm.grow: ranks 0 and 1 leave rank 2 out, move their
    context to the 2 of them (the placement derived: rank 2's experts shared out) and
    check a round trip; then they grow back to 3 with rank 2 joining by a new uid, retarget
    to a given map, and all 3 check a round trip (rank 2's context created with it)."""
    import multiprocessing as mp
    q = mp.get_context("fork").Queue()

    def main(rank, ep, uid, q):
        kw = dict(hidden=H, dtype="fp32", combine_dtype="fp32", memory="host", max_local_experts=E)
        contiguous = [owner(e, ep) for e in range(E)]
        spread = [(e * 5 + 1) % ep for e in range(E)]
        comm = moea2a.Comm(ep, rank, uid)
        moe = moea2a.MoE(comm, E, K, CAP, **kw)
        if rank == 2:  # left out: it aborts, then comes back as a new member
            comm.abort()
            moe.close()
            comm.destroy()
            big = moea2a.Comm(ep, 2, q.get(timeout=60))
            moe = moea2a.MoE(big, E, K, CAP, expert_to_rank=spread, **kw)
        else:  # the recovery flow (moea2a_recovery(7)): abort, shrink, retarget
            comm.abort()
            small = comm.shrink(exclude=[2])
            moe.retarget(small)
            derived, held = [], [0, 0]
            for e in range(E):  # moea2a_moe_retarget(3): rank 2's experts to the rank holding fewest
                derived.append(contiguous[e] if contiguous[e] < 2 else -1)
                held[derived[-1]] += derived[-1] >= 0
            for e in range(E):
                if derived[e] < 0:
                    derived[e] = 0 if held[0] <= held[1] else 1
                    held[derived[e]] += 1
            bad = round_trip_checked(moe, rank, 2, 3, derived)
            if bad:
                return "after the shrink: " + bad
            comm.destroy()
            new_uid = None
            if rank == 0:
                new_uid = moea2a.unique_id()
                q.put(new_uid)
            big = small.grow(ep, uid=new_uid)
            moe.retarget(big, spread)
            small.destroy()
        bad = round_trip_checked(moe, rank, ep, 4, spread)
        moe.close()
        big.destroy()
        return "after the grow: " + bad if bad else None
    results = run_ranks(3, main, q)
    assert all(v is None for v in results.values()), results

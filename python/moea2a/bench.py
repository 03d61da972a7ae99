"""python -m moea2a.bench --overhead: what the Python layer adds to a call. One rank,
one MoE context; dispatch and combine through moea2a.MoE next to the same C calls made
through ctypes with their arguments built once (the floor a Python caller can reach),
timed as round trips (a dispatch must be combined before the next) over many calls;
the differences are the overhead per call.

    python -m moea2a.bench --overhead [--tokens 8] [--hidden 64] [--iters 20000]
                                      [--mem host|cuda]

What is timed is the host's time per round trip: the fastest of many samples of 100
round trips (noise from other processes only lengthens a sample). --mem cuda needs
PyTorch with a GPU: the rows are torch CUDA tensors and the calls go on the current
stream; each sample starts with the GPU idle and is too short to fill its queue of
launches, so the GPU's time per call never holds the host back (over a long loop it
would: the loop would run as fast as the GPU, and hide the host's cost).

    python -m moea2a.bench [--ranks N] [--tokens 128,1024,4096] [--hidden 7168]
                           [--experts 256] [--topk 8] [--iters 20] [--warmup 5]

(the default mode) dispatch and combine of bf16 rows on N local GPUs (one spawned
process each, torch.distributed over NCCL, the moea2a communicator made from that
group), next to what a PyTorch program does without moea2a for the same routing:
pack each destination's rows, exchange the counts, torch.distributed.all_to_all_single
the rows there and back, sum per token (index_add_). Uniform routing (top-k of the
experts drawn per token), contiguous expert placement; every call timed with CUDA
events, the mean over --iters, the slowest rank. Columns as moea2a_perf's: bytes are
the rows a rank sends (a token once per destination rank, itself included); busbw =
algbw x (N - 1) / N; #wrong counts rows that differ from the expected ones (dispatch:
the rows every source sent here, in source-token order; combine: each row times the
number of ranks it went to, which the expert step here, the identity, gives);
"vs base" is the all_to_all_single path's time over moea2a's."""
import argparse
import ctypes
import socket
import sys
import time

import moea2a
from moea2a import _capi as C, _native
from moea2a._arrays import _ptr


def _host_time(fn, iters, sync=None, sample=100):
    """The host's time per call of fn (us): the fastest of iters / sample samples of
    sample calls, each begun with the GPU idle (sync) so that its queue of launches
    never fills and holds the host back."""
    for _ in range(min(iters, 200)):  # warm-up
        fn()
    best = float("inf")
    for _ in range(max(1, iters // sample)):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(sample):
            fn()
        best = min(best, time.perf_counter() - t0)
    if sync:
        sync()
    return best / sample * 1e6


def overhead(tokens, hidden, iters, mem):
    E, K = 256, 8
    uid = moea2a.unique_id()
    comm = moea2a.Comm(1, 0, uid)
    sync = None
    if mem == "cuda":
        import torch
        moe = moea2a.MoE(comm, E, K, max(tokens, 1), hidden=hidden, dtype="bf16", memory="cuda")
        x = torch.ones((tokens, hidden), dtype=torch.bfloat16, device="cuda")
        ids = torch.randint(0, E, (tokens, K), dtype=torch.int32, device="cuda")
        out = torch.empty((tokens, hidden), dtype=torch.bfloat16, device="cuda")
        stream = torch.cuda.current_stream()
        sync = torch.cuda.synchronize
        sptr = stream.cuda_stream
    else:
        import numpy as np
        moe = moea2a.MoE(comm, E, K, max(tokens, 1), hidden=hidden, dtype="bf16", memory="host")
        x = np.ones((tokens, hidden), dtype=np.uint16)
        ids = np.random.default_rng(0).integers(0, E, size=(tokens, K)).astype(np.int32)
        out = np.empty((tokens, hidden), dtype=np.uint16)
        stream, sptr = None, None

    def py_dispatch():
        moe.dispatch(x, ids, stream=stream)

    def py_combine():
        moe.combine(None, out=out, stream=stream)

    # the same calls with every argument built once
    lib, h = _native.lib, moe.handle
    pays = (ctypes.c_void_p * 1)(_ptr(x, "x"))
    res = C.DispatchResult()
    res.size, res.version = ctypes.sizeof(res), _native.VERSION_CODE
    ids_p, out_p, rref = _ptr(ids, "ids"), _ptr(out, "out"), ctypes.byref(res)
    f_dispatch, f_combine = lib.moea2a_dispatch, lib.moea2a_combine

    def c_dispatch():
        f_dispatch(h, tokens, ids_p, None, pays, 0, rref, sptr)

    def c_combine():
        f_combine(h, None, out_p, sptr)

    py_dispatch()
    py_combine()  # checks once that both work (errors raise here)
    # a dispatch must be combined before the next: time round trips, each half from
    # Python or from the bare C call, and take the differences
    t_cc = _host_time(lambda: (c_dispatch(), c_combine()), iters, sync)
    t_pc = _host_time(lambda: (py_dispatch(), c_combine()), iters, sync)
    t_cp = _host_time(lambda: (c_dispatch(), py_combine()), iters, sync)
    t_pp = _host_time(lambda: (py_dispatch(), py_combine()), iters, sync)
    print(f"# moea2a.bench --overhead: 1 rank, {mem} memory, {tokens} tokens x {hidden} bf16, top-{K} of {E}, "
          f"{iters} round trips each; Python {sys.version.split()[0]}")
    print(f"# {'round trip':<28} {'us':>8}")
    for name, t in (("C dispatch + C combine", t_cc), ("Python dispatch + C combine", t_pc),
                    ("C dispatch + Python combine", t_cp), ("Python dispatch + combine", t_pp)):
        print(f"  {name:<28} {t:8.2f}")
    rows = [("dispatch", t_pc - t_cc), ("combine", t_cp - t_cc)]
    for name, t in rows:
        print(f"# Python overhead per {name}: {t:.2f} us")
    moe.close()
    comm.destroy()
    return rows


def _routing(rank, tokens, n, experts, topk, hidden, owner):
    """Rank rank's tokens at this size (the same on every rank that asks): ids [T, k],
    rows x [T, hidden] bf16 of small integers, and mask [T, n] (token -> ranks)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(1000003 * rank + tokens)
    ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(topk, dim=1).indices.to(torch.int32)
    x = torch.randint(-8, 8, (tokens, hidden), device="cuda", generator=g).to(torch.bfloat16)
    mask = torch.zeros(tokens, n, dtype=torch.bool, device="cuda")
    mask.scatter_(1, owner[ids.long()], True)
    return ids, x, mask


def _timed(round_trip, iters, warmup):
    """Mean event time (us) of each step of round trips: round_trip() gives one as a
    list of callables, each timed on its own; no host wait between iterations (as
    moea2a_perf), so a step's host cost shows only where the GPU would wait for it."""
    import torch
    for _ in range(warmup):
        for f in round_trip():
            f()
    marks = []
    for _ in range(iters):
        steps = round_trip()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)]
        ev[0].record()
        for i, f in enumerate(steps):
            f()
            ev[i + 1].record()
        marks.append(ev)
    torch.cuda.synchronize()
    return [sum(ev[i].elapsed_time(ev[i + 1]) for ev in marks) * 1e3 / iters for i in range(len(marks[0]) - 1)]


def _bench_rank(rank, n, uid, port, a):
    """One rank of the side-by-side benchmark (spawned by run_local; the communicator
    comes from the torch.distributed group, not uid); rank 0 returns the table's rows."""
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            device_id=torch.device("cuda", rank))
    comm = moea2a.Comm.from_torch(cuda_device=rank)
    E, K, H, cap = a.experts, a.topk, a.hidden, max(a.tokens)
    moe = moea2a.MoE(comm, E, K, cap, hidden=H, dtype="bf16", memory="cuda")
    per, rem = divmod(E, n)  # contiguous placement: ranks 0..rem-1 own per + 1 experts
    owner = torch.tensor([r for r in range(n) for _ in range(per + (r < rem))], device="cuda")
    buf = moe.combine_buffer().view(n, cap, H)
    rows = []
    stream = torch.cuda.Stream()  # both paths on one stream of their own
    torch.cuda.set_stream(stream)
    for T in a.tokens:
        ids, x, mask = _routing(rank, T, n, E, K, H, owner)
        # the rows each source sends here, in its token order
        sent = [sx[smask[:, rank]] for _, sx, smask in (_routing(r, T, n, E, K, H, owner) for r in range(n))]
        out = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
        want = (x.float() * mask.sum(1, keepdim=True)).to(torch.bfloat16)

        # moea2a: the combine reads the rows the experts left in the combine buffer
        res = moe.dispatch(x, ids, stream=stream)
        wrong_d = 0
        for src, rows_in in enumerate(sent):
            got = res.payloads[0][src, :rows_in.shape[0]]
            wrong_d += int((got != rows_in).any(1).sum()) + abs(int(res.recv_counts[src]) - rows_in.shape[0])
        buf.copy_(res.payloads[0])
        moe.combine(out=out, stream=stream)
        wrong_c = int((out != want).any(1).sum())
        t_m = _timed(lambda: [lambda: moe.dispatch(x, ids, stream=stream), lambda: moe.combine(out=out, stream=stream)],
                     a.iters, a.warmup)

        # without moea2a: pack, count exchange, all_to_all_single there and back, index_add_
        state = {}

        def a2a_dispatch():
            pairs = mask.t().nonzero()  # (rank, token), by rank then token
            send = x.index_select(0, pairs[:, 1])
            sc = mask.sum(0)
            rc = torch.empty_like(sc)
            dist.all_to_all_single(rc, sc)
            sl, rl = sc.tolist(), rc.tolist()
            recv = torch.empty((sum(rl), H), dtype=x.dtype, device="cuda")
            dist.all_to_all_single(recv, send, rl, sl)
            state.update(pairs=pairs, sl=sl, rl=rl, recv=recv)

        def a2a_combine():
            back = torch.empty((sum(state["sl"]), H), dtype=x.dtype, device="cuda")
            dist.all_to_all_single(back, state["recv"], state["sl"], state["rl"])  # the identity expert
            acc = torch.zeros((T, H), dtype=torch.float32, device="cuda")
            acc.index_add_(0, state["pairs"][:, 1], back.float())
            state["out"] = acc.to(torch.bfloat16)

        a2a_dispatch()
        recv = torch.split(state["recv"], [r.shape[0] for r in sent])  # by source, as all_to_all_single lays them
        wrong_bd = sum(int((got != rows_in).any(1).sum()) for got, rows_in in zip(recv, sent))
        a2a_combine()
        wrong_bc = int((state["out"] != want).any(1).sum())
        t_b = _timed(lambda: [a2a_dispatch, a2a_combine], a.iters, a.warmup)

        # the slowest rank's times, every rank's wrong rows
        v = torch.tensor(t_m + t_b, dtype=torch.float64, device="cuda")
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        w = torch.tensor([wrong_d, wrong_c, wrong_bd, wrong_bc], dtype=torch.int64, device="cuda")
        dist.all_reduce(w)
        nbytes = int(mask.sum()) * H * 2
        rows.append((T, nbytes, v.tolist(), w.tolist()))
    moe.close()
    comm.destroy()
    dist.destroy_process_group()
    return rows if rank == 0 else None


def side_by_side(a):
    try:
        import torch
    except ImportError:
        raise SystemExit("python -m moea2a.bench needs PyTorch and CUDA GPUs (--overhead runs without)")
    if torch.cuda.device_count() < a.ranks:
        raise SystemExit(f"--ranks {a.ranks}: {torch.cuda.device_count()} CUDA device(s) here")
    with socket.socket() as s:  # a free port for torch.distributed's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = moea2a.run_local(a.ranks, _bench_rank, port, a, timeout=600, start="spawn")
    errors = [f"rank {r}: {v}" for r, v in enumerate(got) if isinstance(v, str)]
    rows = got[0]
    if errors or not rows:
        raise SystemExit("; ".join(errors) or "rank 0 gave no results")
    n = a.ranks
    print(f"# moea2a.bench: {n} rank(s) on {n} GPU(s), bf16, hidden {a.hidden}, top-{a.topk} of {a.experts}, uniform, "
          f"{a.iters} iterations ({a.warmup} warm-up); torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}")
    print(f"#{'tokens':>9} {'op':<16} {'bytes':>12} {'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
          f"{'#wrong':>7} {'vs base':>8}")
    for T, nbytes, t, w in rows:
        for i, op in enumerate(("dispatch", "combine")):
            for name, tm, wr, vs in ((op, t[i], w[i], f"{t[2 + i] / t[i]:.2f}x"), ("a2a-" + op, t[2 + i], w[2 + i], "")):
                algbw = nbytes / tm / 1e3
                print(f" {T:>9} {name:<16} {nbytes:>12} {tm:>10.2f} {algbw:>11.3f} {algbw * (n - 1) / n:>11.3f} "
                      f"{wr:>7} {vs:>8}")
    return 1 if any(sum(w) for *_, w in rows) else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m moea2a.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--overhead", action="store_true", help="the Python layer's cost per call")
    ap.add_argument("--ranks", type=int, default=2, help="GPUs, one process each (default 2)")
    ap.add_argument("--tokens", default=None, help="tokens per rank, comma-separated (default 128,1024,4096; "
                    "--overhead: one number, default 8)")
    ap.add_argument("--hidden", type=int, default=None, help="default 7168 (--overhead: 64)")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=None, help="default 20 (--overhead: 20000)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mem", choices=("host", "cuda"), default="host", help="--overhead: where the rows live")
    a = ap.parse_args(argv)
    if a.overhead:
        overhead(int(a.tokens or 8), a.hidden or 64, a.iters or 20000, a.mem)
        return 0
    a.tokens = [int(t) for t in (a.tokens or "128,1024,4096").split(",")]
    a.hidden, a.iters = a.hidden or 7168, a.iters or 20
    if a.ranks < 1 or min(a.tokens) < 1 or a.topk < 1 or a.experts < a.topk or a.hidden < 1:
        ap.error("--ranks, --tokens, --topk, --hidden must be positive and --experts at least --topk")
    return side_by_side(a)


if __name__ == "__main__":
    sys.exit(main())

"""python -m moea2a.bench --overhead: what the Python layer adds to a call. One rank,
one MoE context; dispatch and combine through moea2a.MoE next to the same C calls made
through ctypes with their arguments built once (the floor a Python caller can reach),
timed as round trips (a dispatch must be combined before the next) over many calls;
the differences are the overhead per call.

    python -m moea2a.bench --overhead [--tokens 8] [--hidden 64] [--iters 20000]
                                      [--mem host|cuda]

--mem cuda needs PyTorch with a GPU: the rows are torch CUDA tensors and the calls go on
the current stream, waited for once after the loop; the loop is then as fast as the GPU
runs the calls, so Python's cost shows only where it exceeds the GPU's time per call."""
import argparse
import ctypes
import sys
import time

import moea2a
from moea2a import _capi as C


def _time(fn, iters, sync=None):
    for _ in range(min(iters, 200)):  # warm-up
        fn()
    if sync:
        sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) / iters * 1e6


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
    lib, h = moea2a._lib, moe.handle
    pays = (ctypes.c_void_p * 1)(moea2a._ptr(x, "x"))
    res = C.DispatchResult()
    res.size, res.version = ctypes.sizeof(res), moea2a._VERSION_CODE
    ids_p, out_p, rref = moea2a._ptr(ids, "ids"), moea2a._ptr(out, "out"), ctypes.byref(res)
    f_dispatch, f_combine = lib.moea2a_dispatch, lib.moea2a_combine

    def c_dispatch():
        f_dispatch(h, tokens, ids_p, None, pays, 0, rref, sptr)

    def c_combine():
        f_combine(h, None, out_p, sptr)

    py_dispatch()
    py_combine()  # checks once that both work (errors raise here)
    # a dispatch must be combined before the next: time round trips, each half from
    # Python or from the bare C call, and take the differences
    t_cc = _time(lambda: (c_dispatch(), c_combine()), iters, sync)
    t_pc = _time(lambda: (py_dispatch(), c_combine()), iters, sync)
    t_cp = _time(lambda: (c_dispatch(), py_combine()), iters, sync)
    t_pp = _time(lambda: (py_dispatch(), py_combine()), iters, sync)
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


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m moea2a.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--overhead", action="store_true", help="the Python layer's cost per call (the only mode so far)")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--mem", choices=("host", "cuda"), default="host")
    a = ap.parse_args(argv)
    if not a.overhead:
        ap.error("say --overhead (dispatch/combine next to torch.distributed.all_to_all_single is still to come)")
    overhead(a.tokens, a.hidden, a.iters, a.mem)
    return 0


if __name__ == "__main__":
    sys.exit(main())

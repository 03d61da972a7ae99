"""Ranks on one machine: run_local starts them as processes (tests, demos)."""
from ._comm import unique_id


def _local_rank(fn, rank, nranks, uid, args, q):
    """One rank of run_local (module level, so that a spawned process can find it)."""
    try:
        q.put((rank, fn(rank, nranks, uid, *args), None))
    except Exception as e:  # the parent reports it
        q.put((rank, None, repr(e)))


def run_local(nranks, fn, *args, timeout=120.0, start="fork"):
    """Runs fn(rank, nranks, uid, *args) in nranks new processes (tests, demos, one
    machine), uid a fresh unique_id() they share; returns their return values by rank,
    or for a rank that raised, the exception's repr as a string. Timeout: seconds to
    wait for every rank. start="spawn" for ranks that use CUDA (it does not survive a
    fork); fn must then be importable by the new processes (a module's, or __main__'s)."""
    import multiprocessing as mp
    import queue as _queue

    ctx = mp.get_context(start)
    uid, q = unique_id(), ctx.Queue()
    procs = [ctx.Process(target=_local_rank, args=(fn, r, nranks, uid, args, q)) for r in range(nranks)]
    for p in procs:
        p.start()
    out = [f"rank {r}: no answer within {timeout} s" for r in range(nranks)]
    try:
        for _ in procs:
            r, value, err = q.get(timeout=timeout)
            out[r] = err if err is not None else value
    except _queue.Empty:
        pass
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return out

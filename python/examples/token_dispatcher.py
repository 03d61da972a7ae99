"""A token dispatcher with the interface serving stacks use, over moea2a (NumPy, host
memory): dispatch(hidden_states, topk_ids, topk_weights) gives each rank the tokens its
experts need; the caller runs its experts on them; combine(expert_out) brings the
results back to the tokens' ranks, summed per token.

    disp = TokenDispatcher(comm, num_experts=256, top_k=8, max_tokens=4096, hidden=7168)
    recv = disp.dispatch(x, topk_ids, topk_weights)
    for src, i, local_ids, weights in recv.rows():    # every received token
        disp.expert_out(src, i)[:] = my_experts(recv.x[src, i], local_ids, weights)
    y = disp.combine()                                # [num_tokens, hidden]

Run it as a demo: python examples/token_dispatcher.py (4 local ranks, checked)."""
import numpy as np

import moea2a


class Received:
    """One dispatch's tokens on this rank (views, valid until the next dispatch)."""

    def __init__(self, res, num_experts, rank, owner):
        self.x, self.ids, self.weights = res.payloads[0], res.topk_ids, res.topk_weights
        self.counts, self.src_token = res.recv_counts, res.src_token_index
        self._owner, self._rank = owner, rank

    def rows(self):
        """(source rank, slot, this rank's expert ids of the token, their weights)."""
        for src in range(len(self.counts)):
            for i in range(self.counts[src]):
                ids = self.ids[src, i]
                mine = [(int(e), float(w)) for e, w in zip(ids, self.weights[src, i]) if e >= 0 and self._owner[e] == self._rank]
                yield src, i, [e for e, _ in mine], [w for _, w in mine]


class TokenDispatcher:
    def __init__(self, comm, num_experts, top_k, max_tokens, hidden, dtype="fp32"):
        self.comm, self.hidden = comm, hidden
        self.moe = moea2a.MoE(comm, num_experts, top_k, max_tokens, hidden=hidden, dtype=dtype, combine_dtype=dtype,
                              weights=True, memory="host")
        ep, per, rem = comm.size, num_experts // comm.size, num_experts % comm.size
        # contiguous placement (moea2a_moe(3)): ranks 0..rem-1 own per + 1 experts
        self.owner = [r for r in range(ep) for _ in range(per + (r < rem))]
        self._buf, self._stride = self.moe.combine_buffer(), max_tokens

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        res = self.moe.dispatch(hidden_states, topk_ids, topk_weights)
        self._stride = res.stride
        return Received(res, len(self.owner), self.comm.rank, self.owner)

    def expert_out(self, src, i):
        """Where the expert output of received slot (src, i) goes: the combine buffer."""
        return self._buf[src * self._stride + i]

    def combine(self):
        return self.moe.combine()


def demo_rank(rank, ep, uid, E=16, K=4, T=32, H=8):
    """Each expert e multiplies by e + 1; weights are powers of two and inputs small
    integers, so every sum is exact and the result is checked against a direct one."""
    with moea2a.Comm(ep, rank, uid) as comm:
        disp = TokenDispatcher(comm, E, K, T, H)
        rng = np.random.default_rng(rank)
        x = rng.integers(-8, 8, size=(T, H)).astype(np.float32)
        ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
        w = (2.0 ** -rng.integers(0, 4, size=(T, K))).astype(np.float32)
        recv = disp.dispatch(x, ids, w)
        for src, i, local, lw in recv.rows():
            disp.expert_out(src, i)[:] = sum(wt * (e + 1) * recv.x[src, i] for e, wt in zip(local, lw))
        y = disp.combine()
        want = np.stack([sum(w[t, j] * (ids[t, j] + 1) * x[t] for j in range(K)) for t in range(T)])
        disp.moe.close()
        return None if np.array_equal(y, want) else f"max error {np.abs(y - want).max()}"


def demo(ep=4):
    """The demo on ep local ranks: {rank: None} when every rank's result is right."""
    return dict(enumerate(moea2a.run_local(ep, demo_rank)))


if __name__ == "__main__":
    results = demo()
    print("token dispatcher on 4 ranks:", "ok" if all(v is None for v in results.values()) else results)

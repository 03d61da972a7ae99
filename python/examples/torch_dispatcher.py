"""A token dispatcher for PyTorch on CUDA memory, with the interface serving stacks use,
over moea2a: dispatch(hidden_states, topk_ids, topk_weights) returns the tokens this
rank's experts need as torch tensors that view moea2a's workspace (no copies); the
experts write their outputs into expert_out(), a view of the combine buffer; combine()
returns the tokens' results summed over the ranks they went to. Every call is ordered
on the current stream with no host wait, so a CUDA graph can capture the whole layer.

    torch.cuda.set_device(rank)
    disp = TorchDispatcher(comm, num_experts=256, top_k=8, max_tokens=4096, hidden=7168)
    recv = disp.dispatch(x, topk_ids, topk_weights)       # x [n, 7168] bf16, CUDA
    # recv.x [ep, stride, hidden], recv.ids / recv.weights [ep, stride, k],
    # recv.counts [ep], recv.src_token [ep, stride]; recv.local [ep, stride, k]: which
    # of a row's ids are this rank's experts (padding rows: none)
    disp.expert_out()[:] = my_experts(recv)                # [ep, stride, hidden]
    y = disp.combine()                                    # [n, hidden]

Run it as a demo: python examples/torch_dispatcher.py (one rank per GPU, checked)."""
import torch

import moea2a


class Received:
    """One dispatch's tokens on this rank (torch views, valid until the next dispatch)."""

    def __init__(self, res, lo, hi):
        self.x, self.ids, self.weights = res.payloads[0], res.topk_ids, res.topk_weights
        self.counts, self.src_token = res.recv_counts, res.src_token_index
        self.local = (self.ids >= lo) & (self.ids < hi)  # sanitized: padding rows hold -1


class TorchDispatcher:
    def __init__(self, comm, num_experts, top_k, max_tokens, hidden, dtype="bf16"):
        self.comm, self.hidden = comm, hidden
        self.moe = moea2a.MoE(comm, num_experts, top_k, max_tokens, hidden=hidden, dtype=dtype, combine_dtype=dtype,
                              weights=True, memory="cuda")
        ep, rank = comm.size, comm.rank
        per, rem = divmod(num_experts, ep)  # contiguous placement (moea2a_moe(3))
        self.first_expert = rank * per + min(rank, rem)
        self.last_expert = self.first_expert + per + (rank < rem)
        self._buf = self.moe.combine_buffer()
        self._shape = None

    def dispatch(self, hidden_states, topk_ids, topk_weights):
        res = self.moe.dispatch(hidden_states, topk_ids, topk_weights, stream=torch.cuda.current_stream())
        self._shape = (res.ep, res.stride, self.hidden)
        return Received(res, self.first_expert, self.last_expert)

    def expert_out(self):
        """Where the experts' outputs go, [ep, stride, hidden]: row (src, i) is the
        output for received slot (src, i) (the combine buffer, so combine copies nothing)."""
        return self._buf[:self._shape[0] * self._shape[1]].view(self._shape)

    def combine(self):
        return self.moe.combine(stream=torch.cuda.current_stream())

    def close(self):
        self.moe.close()


def demo_rank(rank, ep, uid, E=16, K=4, T=64, H=128):
    """Expert e multiplies by e + 1; inputs in [-2, 2) and weights 1 or 1/2, so every
    product and sum (at most 116 in steps of 1/2: 8 significant bits) is exact in bf16,
    and the result is checked against a direct one."""
    torch.cuda.set_device(rank)
    with moea2a.Comm(ep, rank, uid, cuda_device=rank) as comm:
        disp = TorchDispatcher(comm, E, K, T, H)
        g = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randint(-2, 2, (T, H), device="cuda", generator=g).to(torch.bfloat16)
        ids = torch.rand(T, E, device="cuda", generator=g).topk(K, dim=1).indices.to(torch.int32)
        w = 2.0 ** -torch.randint(0, 2, (T, K), device="cuda", generator=g).float()
        recv = disp.dispatch(x, ids, w)
        # the experts, vectorized: each received row times sum over its local ids of w * (id + 1)
        factor = torch.where(recv.local, recv.weights * (recv.ids + 1).float(), 0.0).sum(-1, keepdim=True)
        disp.expert_out()[:] = (recv.x.float() * factor).to(torch.bfloat16)
        y = disp.combine()
        want = (x.float() * (w * (ids + 1).float()).sum(-1, keepdim=True)).to(torch.bfloat16)
        disp.close()
        torch.cuda.synchronize()
        return None if torch.equal(y, want) else f"rank {rank}: {int((y != want).any(1).sum())} rows differ"


def demo(ep=None):
    """The demo on ep GPUs (default: all, at most 4), one spawned process each:
    {rank: None} when every rank's result is right."""
    ep = ep or min(torch.cuda.device_count(), 4)
    return dict(enumerate(moea2a.run_local(ep, demo_rank, timeout=180, start="spawn")))


if __name__ == "__main__":
    results = demo()
    print(f"torch token dispatcher on {len(results)} GPU(s):",
          "ok" if all(v is None for v in results.values()) else results)

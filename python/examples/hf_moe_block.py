"""A Hugging Face transformers MoE block split over the ranks with moea2a, checked
against the block's own forward.

The block is Qwen3-MoE's sparse MoE block (transformers.models.qwen3_moe), a small
configuration with random weights, the same on every rank. Each rank routes its own
tokens with the block's router, dispatches them to the ranks that own their experts
(contiguous placement: rank r owns experts [r*E/ep, (r+1)*E/ep)), runs only its own
experts on the rows it received, with the block's own expert weights and activation,
writes each row's weighted sum over its local experts into the combine buffer, and
combines. Every rank then runs the whole block on its tokens on its GPU, the
reference: fp32 must agree within 1e-4 x max |output|, bf16 within 2e-2 x (the sums
are added in another order: per rank, then over the ranks in fp32).

    python examples/hf_moe_block.py [--dtype bf16|fp32] [--ranks N] [--tokens T]

One spawned process per GPU (all of them, at most 4, by default); prints each rank's
error and "ok" or what failed. Needs PyTorch with CUDA and transformers."""
import argparse

import torch

import moea2a

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}  # x max |reference output|


def make_block(dtype, seed=1234):
    """The block with random weights, identical on every rank (one seed)."""
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                         norm_topk_prob=True, hidden_act="silu")
    block = Qwen3MoeSparseMoeBlock(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return cfg, block.to(device="cuda", dtype=dtype).eval()


def local_experts(block, rows, ids, weights, first, last):
    """This rank's experts [first, last) on its received rows ([slots, hidden]) as the
    block computes each one (gate_up projection, act(gate) * up, down projection, times
    the router weight), summed per row over the row's local experts."""
    ex = block.experts
    out = torch.zeros_like(rows)
    for e in range(first, last):
        slot, kpos = torch.where(ids == e)  # sanitized ids: padding rows hold -1
        if slot.numel() == 0:
            continue
        gate, up = torch.nn.functional.linear(rows[slot], ex.gate_up_proj[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(ex.act_fn(gate) * up, ex.down_proj[e])
        out.index_add_(0, slot, h * weights[slot, kpos, None].to(rows.dtype))
    return out


def rank_main(rank, ep, uid, dtype_name, tokens):
    """One rank: its tokens through moea2a and the split block, against the whole block.
    Returns None when within tolerance, else what differs."""
    torch.cuda.set_device(rank)
    dtype = DTYPES[dtype_name]
    cfg, block = make_block(dtype)
    E, k, H = cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size
    per, rem = divmod(E, ep)  # contiguous placement (moea2a_moe(3))
    first = rank * per + min(rank, rem)
    last = first + per + (rank < rem)
    g = torch.Generator(device="cuda").manual_seed(rank + 1)
    x = torch.randn(tokens, H, device="cuda", generator=g).to(dtype)
    with torch.no_grad():
        want = block(x[None])[0]
        _, weights, ids = block.gate(x)
        with moea2a.Comm(ep, rank, uid, cuda_device=rank) as comm:
            with moea2a.MoE(comm, E, k, tokens, hidden=H, dtype=dtype_name, weights=True, memory="cuda") as moe:
                s = torch.cuda.current_stream()
                res = moe.dispatch(x, ids.to(torch.int32), weights.float(), stream=s)
                slots = res.ep * res.stride
                rows = res.payloads[0].reshape(slots, H)
                moe.combine_buffer()[:slots].view(slots, H).copy_(
                    local_experts(block, rows, res.topk_ids.reshape(slots, k), res.topk_weights.reshape(slots, k),
                                  first, last))
                got = moe.combine(stream=s)
                torch.cuda.synchronize()
    err = (got.float() - want.float()).abs().max().item()
    bound = TOLERANCE[dtype_name] * want.float().abs().max().item()
    print(f"rank {rank}: {dtype_name}, {tokens} tokens, max |moea2a - block| = {err:.3g} (bound {bound:.3g})",
          flush=True)
    return None if err <= bound else f"rank {rank}: max error {err:.3g} over the bound {bound:.3g}"


def run(ranks=None, dtype="bf16", tokens=64):
    """The check on `ranks` GPUs (default: all, at most 4), one spawned process each:
    {rank: None} when every rank is within tolerance."""
    ranks = ranks or min(torch.cuda.device_count(), 4)
    return dict(enumerate(moea2a.run_local(ranks, rank_main, dtype, tokens, timeout=300, start="spawn")))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--ranks", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    results = run(a.ranks, a.dtype, a.tokens)
    ok = all(v is None for v in results.values())
    print(f"Qwen3-MoE block split over {len(results)} GPU(s), {a.dtype}:", "ok" if ok else results)
    raise SystemExit(0 if ok else 1)

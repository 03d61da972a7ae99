"""moea2a.expert_gemm on host memory with NumPy: expert-major and rank-major rows,
SwiGLU, fp32 and bf16 C, against a reference computed here in fp64 from the
dequantized weights (moea2a.fp4_dequantize), within moea2a_expert(3)'s bound; rows that
are no expert's stay untouched; a bad description raises InvalidArgument."""
import numpy as np
import pytest

import moea2a

E, N, K = 3, 40, 64


def bf16_bits(x):
    """float32 -> bf16 bits (round to nearest even) and the values they hold"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


def bf16_value(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def weights(seed, n=N):
    rng = np.random.default_rng(seed)
    qs, ss, gs, wd = [], [], [], []
    for _ in range(E):
        w = rng.normal(size=(n, K)).astype(np.float32)
        q, s, g = moea2a.fp4_quantize(w, dtype="fp32", layout="128x4")
        qs.append(q), ss.append(s), gs.append(g)
        wd.append(moea2a.fp4_dequantize(q, s, g, K, dtype="fp32", layout="128x4").astype(np.float64))
    return np.stack(qs), np.stack(ss), np.array(gs, dtype=np.float32), wd


def check_rows(got, a, wd, swiglu, fp32):
    """got [r, cols] against the fp64 reference of a [r, K] times wd [n, K]^T"""
    ref, mag = a.astype(np.float64) @ wd.T, np.abs(a.astype(np.float64)) @ np.abs(wd).T
    tol = 2.0 ** -8 * mag
    if swiglu:
        h = ref.shape[1] // 2
        gate, up = ref[:, :h], ref[:, h:]
        silu = gate / (1.0 + np.exp(-gate))
        ref = silu * up
        tol = 1.1 * tol[:, :h] * np.abs(up) + np.abs(silu) * tol[:, h:] + 1.1 * tol[:, :h] * tol[:, h:]
    tol = tol + (2.0 ** -22 if fp32 else 2.0 ** -8) * np.abs(ref) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= tol), f"worst excess {np.max(err - tol):.3g}"


@pytest.mark.parametrize("swiglu,c_dtype", [(False, "bf16"), (False, "fp32"), (True, "bf16")])
def test_expert_major(swiglu, c_dtype):
    w, s, g, wd = weights(1)
    counts, offsets = np.array([5, 0, 9], dtype=np.int32), np.array([0, 8, 16], dtype=np.int32)
    rows = 32
    a, af = bf16_bits(np.random.default_rng(2).normal(size=(rows, K)))
    c = moea2a.expert_gemm(a, w, s, g, N, K, counts=counts, offsets=offsets, c_dtype=c_dtype, swiglu=swiglu)
    cols = N // 2 if swiglu else N
    assert c.shape == (rows, cols)
    got = c if c_dtype == "fp32" else bf16_value(c)
    used = np.zeros(rows, dtype=bool)
    for e in range(E):
        r = slice(offsets[e], offsets[e] + counts[e])
        used[r] = True
        if counts[e]:
            check_rows(got[r], af[r], wd[e], swiglu, c_dtype == "fp32")
    assert not np.any(c[~used]), "rows that are no expert's were written"


def test_rank_major():
    w, s, g, wd = weights(3)
    rows, slots, first = 10, 2, 4
    rng = np.random.default_rng(4)
    ids = rng.choice([-1, 0, 1, first, first + 1, first + 2, first + 3], size=(rows, slots)).astype(np.int32)
    a, af = bf16_bits(rng.normal(size=(rows, K)))
    c = moea2a.expert_gemm(a, w, s, g, N, K, ids=ids, slots=slots, first_expert=first)
    assert c.shape == (rows * slots, N)
    for r in range(rows):
        for sl in range(slots):
            e = int(ids[r, sl]) - first
            row = c[r * slots + sl]
            if 0 <= e < E:
                check_rows(bf16_value(row)[None, :], af[r:r + 1], wd[e], False, False)
            else:
                assert not np.any(row), f"slot ({r}, {sl}) names no local expert but was written"


def test_workspace_and_errors():
    w, s, g, _ = weights(5)
    a, _ = bf16_bits(np.zeros((4, K)))
    ids = np.zeros((4, 1), dtype=np.int32)
    assert moea2a.expert_gemm_workspace_size(a, w, s, g, N, K, ids=ids) == 0  # host memory
    with pytest.raises(moea2a.InvalidArgument, match="moea2a_expert_gemm"):
        moea2a.expert_gemm(a, w, s, g, N, 24, ids=ids)  # k not a multiple of 16
    with pytest.raises(moea2a.InvalidArgument, match="even"):
        moea2a.expert_gemm(a, w, s, g, N - 1, K, ids=ids, swiglu=True)

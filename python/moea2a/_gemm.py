"""The FP4 expert GEMM (moea2a_expert(3))."""
import ctypes

from . import _capi as C
from ._arrays import _NP_DTYPE, _dtype, _np, _ptr, _stream
from ._errors import _check
from ._native import VERSION_CODE as _VERSION_CODE, lib as _lib


def _gemm_desc(a, w, w_scales, w_global, n, k, counts, offsets, ids, slots, first_expert, c, c_dtype, swiglu, rows,
               lda, ldc, workspace):
    g = C.ExpertGemm()
    g.size, g.version = ctypes.sizeof(g), _VERSION_CODE
    rank_major = ids is not None
    g.num_experts, g.n, g.k = len(w_global), int(n), int(k)
    g.rows_layout = C.GEMM_ROWS_RANK_MAJOR if rank_major else C.GEMM_ROWS_EXPERT_MAJOR
    g.flags = C.GEMM_SWIGLU if swiglu else 0
    g.a, g.lda, g.rows = _ptr(a, "a"), int(lda if lda is not None else k), int(rows)
    g.counts, g.offsets = _ptr(counts, "counts"), _ptr(offsets, "offsets")
    g.ids, g.slots, g.first_expert = _ptr(ids, "ids"), int(slots), int(first_expert)
    g.w, g.w_scales, g.w_global = _ptr(w, "w"), _ptr(w_scales, "w_scales"), _ptr(w_global, "w_global")
    g.c, g.c_type = _ptr(c, "c"), _dtype(c_dtype)
    g.ldc = int(ldc if ldc is not None else (n // 2 if swiglu else n))
    g.workspace = _ptr(workspace, "workspace")
    if workspace is not None:  # a NumPy array's nbytes, a torch tensor's numel x element_size
        g.workspace_size = (workspace.numel() * workspace.element_size() if hasattr(workspace, "element_size")
                            else workspace.nbytes)
    return g


def expert_gemm(a, w, w_scales, w_global, n, k, counts=None, offsets=None, ids=None, slots=1, first_expert=0,
                c=None, c_dtype="bf16", swiglu=False, rows=None, lda=None, ldc=None, workspace=None, stream=None):
    """The FP4 expert GEMM (moea2a_expert(3)): for each local expert e, C_e = A_e .
    dequant(W_e)^T with bf16 rows a [rows, lda] (NumPy uint16 bits, or a torch bf16
    tensor), NVFP4 weights w [E, n, k/2] with 128x4 scales w_scales [E, sf bytes] and
    w_global [E], each expert as fp4_quantize(..., layout="128x4") writes it.
    Expert-major rows: counts and offsets [E] (a dispatch's expert_counts and
    expert_offsets); rank-major rows: ids [rows, slots] of global ids, local expert e
    being first_expert + e, into C row r * slots + s. swiglu: C = silu(G[:, :n/2]) *
    G[:, n/2:]. On host memory c is allocated (zeros) when None and returned; on CUDA
    memory pass c (and for rank-major rows a workspace of expert_gemm_workspace_size
    bytes): the call is enqueued on stream and returns at once."""
    rows = rows if rows is not None else (ids.shape[0] if ids is not None else a.shape[0])
    if c is None:
        np = _np()
        c = np.zeros((rows * (slots if ids is not None else 1), n // 2 if swiglu else n), dtype=_NP_DTYPE[c_dtype])
    g = _gemm_desc(a, w, w_scales, w_global, n, k, counts, offsets, ids, slots, first_expert, c, c_dtype, swiglu, rows,
                   lda, ldc, workspace)
    _check(_lib.moea2a_expert_gemm(ctypes.byref(g), _stream(stream)))
    return c


def expert_gemm_workspace_size(a, w, w_scales, w_global, n, k, ids=None, slots=1, first_expert=0, swiglu=False,
                               rows=None, lda=None):
    """Bytes of workspace expert_gemm needs for these arguments (rank-major rows on CUDA
    memory; 0 otherwise)."""
    rows = rows if rows is not None else (ids.shape[0] if ids is not None else a.shape[0])
    g = _gemm_desc(a, w, w_scales, w_global, n, k, None, None, ids, slots, first_expert, a, "bf16", swiglu, rows,
                   lda, None, None)
    if ids is None:
        g.counts = g.offsets = g.a  # expert-major: any pointer of the same memory (not read)
    nb = ctypes.c_size_t()
    _check(_lib.moea2a_expert_gemm_workspace_size(ctypes.byref(g), ctypes.byref(nb)))
    return nb.value

"""FP8 and NVFP4 quantization of host arrays (moea2a_fp8(3), moea2a_fp4(3))."""
import ctypes

from . import _capi as C
from ._arrays import _NP_DTYPE, _dtype, _np, _ptr
from ._errors import _check
from ._native import lib as _lib


def fp8_quantize(x, dtype="bf16", layout="row", ue8m0=False):
    """FP8 block quantization of a host array x [m, k] (moea2a_fp8(3)): returns
    (codes uint8 [m, k], scales bytes)."""
    np = _np()
    m, k = x.shape
    lay = {"row": C.FP8_SCALES_ROW_MAJOR, "mn": C.FP8_SCALES_MN_MAJOR}[layout]
    flags = C.FP8_UE8M0 if ue8m0 else 0
    nb = ctypes.c_size_t()
    _check(_lib.moea2a_fp8_scale_bytes(lay, flags, m, k, ctypes.byref(nb)))
    q, s = np.empty((m, k), dtype=np.uint8), np.empty(nb.value, dtype=np.uint8)
    _check(_lib.moea2a_fp8_quantize(_ptr(x, "x"), _dtype(dtype), m, k, _ptr(q, "q"), _ptr(s, "scales"), lay, flags, None))
    return q, s


def fp8_dequantize(q, scales, dtype="fp32", layout="row", ue8m0=False):
    np = _np()
    m, k = q.shape
    lay = {"row": C.FP8_SCALES_ROW_MAJOR, "mn": C.FP8_SCALES_MN_MAJOR}[layout]
    out = np.empty((m, k), dtype=_NP_DTYPE[dtype])
    _check(_lib.moea2a_fp8_dequantize(_ptr(q, "q"), _ptr(scales, "scales"), lay, C.FP8_UE8M0 if ue8m0 else 0, m, k,
                                      _ptr(out, "out"), _dtype(dtype), None))
    return out


def fp4_quantize(x, dtype="bf16", layout="linear"):
    """NVFP4 quantization of a host array x [m, k]: (codes uint8 [m, k/2], scales, g)."""
    np = _np()
    m, k = x.shape
    lay = {"linear": C.SF_LINEAR, "128x4": C.SF_128X4, "8x4": C.SF_8X4}[layout]
    g = np.empty(1, dtype=np.float32)
    _check(_lib.moea2a_fp4_global_scale(_ptr(x, "x"), _dtype(dtype), m * k, _ptr(g, "g"), None))
    nb = ctypes.c_size_t()
    _check(_lib.moea2a_fp4_sf_bytes(lay, m, k, ctypes.byref(nb)))
    q, s = np.empty((m, k // 2), dtype=np.uint8), np.empty(nb.value, dtype=np.uint8)
    _check(_lib.moea2a_fp4_quantize(_ptr(x, "x"), _dtype(dtype), m, k, _ptr(g, "g"), _ptr(q, "q"), _ptr(s, "sf"), lay,
                                    None))
    return q, s, float(g[0])


def fp4_dequantize(q, sf, g, k, dtype="fp32", layout="linear"):
    """NVFP4 codes q [m, k/2] with scales sf (layout) and global scale g (a float) back to
    a host array [m, k] of dtype: e2m1(q) x sf x (1/g) (moea2a_fp4(3))."""
    np = _np()
    m = q.shape[0]
    lay = {"linear": C.SF_LINEAR, "128x4": C.SF_128X4, "8x4": C.SF_8X4}[layout]
    gg = np.array([g], dtype=np.float32)
    out = np.empty((m, k), dtype=_NP_DTYPE[dtype])
    _check(_lib.moea2a_fp4_dequantize(_ptr(q, "q"), _ptr(sf, "sf"), lay, _ptr(gg, "g"), m, k, _ptr(out, "out"),
                                      _dtype(dtype), None))
    return out

"""Arrays and streams as the C calls take them: addresses of NumPy arrays and torch
tensors checked against the rows a call reads or writes, and views of memory the
library owns (NumPy on host memory, torch tensors on CUDA memory)."""
import ctypes

from . import _capi as C
from ._errors import InvalidArgument, Unavailable, _check
from ._native import lib as _lib


def _np():
    import numpy
    return numpy


# numpy dtypes of moea2a's datatypes; bf16, fp8 and nvfp4 travel as their bits
_NP_DTYPE = {"int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64", "fp16": "float16",
             "bf16": "uint16", "fp32": "float32", "fp8_e4m3": "uint8", "nvfp4": "uint8"}


# What an array handed to dispatch or combine may hold for each moea2a dtype: NumPy's
# and torch's dtype names (bf16: torch.bfloat16, or its bit patterns as 16-bit ints).
_ACCEPTS = {"int8": {"int8", "uint8"}, "uint8": {"int8", "uint8"}, "int32": {"int32"}, "int64": {"int64"},
            "fp16": {"float16"}, "bf16": {"bfloat16", "uint16", "int16"}, "fp32": {"float32"},
            "fp8_e4m3": {"uint8", "int8", "float8_e4m3fn"}, "nvfp4": {"uint8", "int8"}}
_DTYPE_NAMES = {}  # a NumPy or torch dtype object -> its name without "torch."
_INT32, _FLOAT32 = {"int32"}, {"float32"}


def _rows_ptr(a, what, n, row_bytes, accepts, at_least=False):
    """a's address (_ptr) once a holds what the C call reads or writes there: n rows of
    row_bytes bytes, of one of the dtypes accepts. Anything else is InvalidArgument:
    another dtype would be read as other values, fewer bytes past a's end. at_least:
    a may hold more rows (a buffer). None for None."""
    addr = _ptr(a, what)
    if addr is None:
        return None
    dt = a.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = str(dt).replace("torch.", "")
    if name not in accepts:
        raise InvalidArgument(1, f"{what} is {name}: it must be {' or '.join(sorted(accepts))}")
    want, have = n * row_bytes, a.nbytes
    if have != want and not (at_least and have > want):
        raise InvalidArgument(1, f"{what} has {have} bytes: {n} rows of {row_bytes} bytes are "
                                 f"{'at least ' if at_least else ''}{want}")
    return addr


def _itemsize(name):
    """Bytes per element of a moea2a dtype, as the library counts them (nvfp4: 1, a
    packed pair)."""
    size = ctypes.c_size_t()
    _check(_lib.moea2a_datatype_size(_dtype(name), ctypes.byref(size)))
    return size.value


def _dtype(name):
    if name not in C.DTYPES:
        raise InvalidArgument(1, f"unknown dtype {name!r}; one of {', '.join(C.DTYPES)}")
    return C.DTYPES[name]


def _combine_dtype(dtype, combine_dtype):
    """The combine rows' dtype: combine_dtype where given, else the payload's dtype where
    a combine can sum it (fp16, bf16, fp32), else bf16."""
    if combine_dtype is not None:
        return combine_dtype
    return dtype if dtype in ("fp16", "bf16", "fp32") else "bf16"


def _ptr(obj, what):
    """The address of a NumPy array (C-contiguous) or of anything with data_ptr()
    (a torch.Tensor); None for None. Every dispatch and combine calls it: each step
    is one lookup, so that the layer costs little per call."""
    if obj is None:
        return None
    data_ptr = getattr(obj, "data_ptr", None)
    if data_ptr is not None:  # a torch.Tensor
        is_contiguous = getattr(obj, "is_contiguous", None)
        if is_contiguous is not None and not is_contiguous():
            raise InvalidArgument(1, f"{what} must be contiguous")
        return data_ptr()
    flags = getattr(obj, "flags", None)
    if flags is not None and flags.c_contiguous:  # NumPy
        if flags.writeable and obj.nbytes:  # the buffer protocol: cheaper than .ctypes (an object per read)
            return ctypes.addressof(ctypes.c_char.from_buffer(obj))
        return obj.__array_interface__["data"][0]
    if hasattr(obj, "__array_interface__"):
        if not obj.flags["C_CONTIGUOUS"]:
            raise InvalidArgument(1, f"{what} must be C-contiguous")
        return obj.__array_interface__["data"][0]
    raise InvalidArgument(1, f"{what}: a NumPy array or a torch.Tensor, not {type(obj).__name__}")


def _view(owner, ptr, shape, np_dtype):
    """A NumPy array over memory the library owns, keeping owner alive."""
    np = _np()
    dt = np.dtype(np_dtype)
    count = 1
    for s in shape:
        count *= s
    if not ptr or count == 0:
        return np.zeros(shape, dtype=dt)
    buf = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    buf.owner = owner
    return np.frombuffer(buf, dtype=dt).reshape(shape)


# CUDA array interface type strings of the NumPy dtype names above; bf16 (uint16 bit
# patterns on host memory) arrives as int16 and is viewed as torch.bfloat16.
_CAI_TYPE = {"int8": "|i1", "uint8": "|u1", "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4",
             "uint16": "<i2"}


class _CudaArray:
    """Device memory the library owns, described by __cuda_array_interface__ (v3, no
    stream to wait for: the memory is ordered by the caller's stream) so that
    torch.as_tensor views it without a copy; the tensor keeps this object, and so the
    owner (the MoE context), alive."""

    def __init__(self, owner, ptr, shape, np_dtype):
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": tuple(int(d) for d in shape), "typestr": _CAI_TYPE[np_dtype],
                                         "data": (int(ptr), False), "version": 3, "strides": None, "stream": None}


def _torch_dtype(np_dtype):
    """The torch dtype of a NumPy dtype name above ("uint16": bf16 bits, torch.bfloat16)."""
    import torch
    return {"uint16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32,
            "int64": torch.int64, "float16": torch.float16, "float32": torch.float32}[np_dtype]


def _cuda_view(owner, ptr, shape, np_dtype):
    """A torch CUDA tensor over device memory the library owns (zero copy), on the
    device that memory is on; bf16 rows (np_dtype "uint16") as torch.bfloat16."""
    try:
        import torch
    except ImportError:
        raise Unavailable(7, "views of CUDA memory are torch tensors: install PyTorch (the addresses are in .ptr)")
    count = 1
    for d in shape:
        count *= int(d)
    if not ptr or count == 0:
        return torch.zeros(tuple(shape), dtype=_torch_dtype(np_dtype), device="cuda")
    t = torch.as_tensor(_CudaArray(owner, ptr, shape, np_dtype))  # no device=: that would copy from another GPU
    return t.view(torch.bfloat16) if np_dtype == "uint16" else t


def _stream(stream):
    """A CUDA stream for the C calls: None is the default stream (pass
    torch.cuda.current_stream() to order with PyTorch's work), an int its address, or
    anything with .cuda_stream (a torch.cuda.Stream). Host memory ignores it."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    return getattr(stream, "cuda_stream", None)

"""moea2a from Python: expert-parallel all-to-all (dispatch, combine) for MoE models.

A pure-Python layer over the C library (ctypes; no compiled extension, no build-time
dependency on PyTorch). NumPy arrays work on host memory: dispatch results are views
of the context's workspace, valid until its next dispatch. See python/README.md.
"""
import ctypes

from . import _capi as C

_lib = C.load()


def _version():
    ma, mi, pa = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _lib.moea2a_get_version(ctypes.byref(ma), ctypes.byref(mi), ctypes.byref(pa))
    return f"{ma.value}.{mi.value}.{pa.value}"


__version__ = _version()
_VERSION_CODE = sum(int(p) * m for p, m in zip(__version__.split("."), (10000, 100, 1)))
build_config = _lib.moea2a_get_build_config().decode()


# ---- errors -------------------------------------------------------------------------

class Error(Exception):
    """A moea2a call failed: .code is the moea2a_result_t, .name its MOEA2A_ERR_* name,
    .detail the library's message (moea2a_last_error)."""

    def __init__(self, code, detail=""):
        self.code = code
        self.name = _lib.moea2a_strerror(code).decode().split(":")[0]
        self.detail = detail
        super().__init__(f"{self.name}: {detail}" if detail else self.name)


class InvalidArgument(Error, ValueError): pass
class NoMemory(Error, MemoryError): pass
class SystemError_(Error, OSError): pass
class Timeout(Error, TimeoutError): pass
class PeerFailed(Error, ConnectionError): pass
class Mismatch(Error): pass
class Unavailable(Error): pass
class TransportError(Error): pass
class CapacityError(Error): pass
class StateError(Error): pass
class CudaError(Error): pass
class Aborted(Error): pass
class InternalError(Error): pass


_ERRORS = {1: InvalidArgument, 2: NoMemory, 3: SystemError_, 4: Timeout, 5: PeerFailed, 6: Mismatch, 7: Unavailable,
           8: TransportError, 9: CapacityError, 10: StateError, 11: CudaError, 12: Aborted, 13: InternalError}


def _check(rc, comm=None):
    """Raises the Error subclass of rc with the library's message; comm: a Comm, a raw
    handle, or None (the thread's last error)."""
    if rc:
        h = getattr(comm, "_h", comm)
        detail = _lib.moea2a_last_error(h if h else None).decode(errors="replace")
        raise _ERRORS.get(rc, Error)(rc, detail)


# ---- buffers ------------------------------------------------------------------------

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
    is one lookup (issue 20's bound on the Python layer's cost per call)."""
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


# ---- handles ------------------------------------------------------------------------

class _Handle:
    """A C object this package owns: released once, by its release method or at the
    end of a with-block; using it afterwards raises StateError."""
    _what, _free = "object", None

    @property
    def handle(self):
        if not self._h:
            raise StateError(10, f"the {self._what} was destroyed")
        return self._h

    def _release(self):
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            _check(getattr(_lib, self._free)(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._release()


# ---- communicator -------------------------------------------------------------------

def unique_id():
    """A rendezvous token (bytes): made by one process, handed to every rank."""
    uid = C.UniqueId()
    _check(_lib.moea2a_get_unique_id(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


class Comm(_Handle):
    """A communicator. Comm(nranks, rank, uid) joins the ranks that got the same
    unique_id(); Comm() reads the launcher's environment (MOEA2A_RANK / mpirun / srun);
    Comm.from_torch(group) takes its ranks from a torch.distributed process group."""

    _what, _free = "communicator", "moea2a_comm_destroy"

    def __init__(self, nranks=None, rank=None, uid=None, timeout_s=None, transport=None, cuda_device=-1):
        cfg = C.Config(ctypes.sizeof(C.Config), _VERSION_CODE, -1.0 if timeout_s is None else float(timeout_s),
                       transport.encode() if transport else None, cuda_device)
        self._h = ctypes.c_void_p()
        if uid is None:
            if nranks is not None or rank is not None:
                raise InvalidArgument(1, "Comm(nranks, rank) needs the uid every rank shares (moea2a.unique_id())")
            _check(_lib.moea2a_comm_init_env(ctypes.byref(self._h), ctypes.byref(cfg)))
        else:
            if len(uid) != C.UNIQUE_ID_BYTES:
                raise InvalidArgument(1, f"uid must be the {C.UNIQUE_ID_BYTES} bytes moea2a.unique_id() made")
            u = C.UniqueId()
            ctypes.memmove(ctypes.addressof(u), bytes(uid), ctypes.sizeof(u))
            _check(_lib.moea2a_comm_init_rank(ctypes.byref(self._h), int(nranks), u, int(rank), ctypes.byref(cfg)))

    @classmethod
    def from_torch(cls, group=None, **kw):
        """All ranks of a torch.distributed group; rank 0's unique id travels through it."""
        import torch.distributed as dist
        obj = [unique_id() if dist.get_rank(group) == 0 else None]
        dist.broadcast_object_list(obj, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        return cls(dist.get_world_size(group), dist.get_rank(group), obj[0], **kw)

    @property
    def rank(self):
        r = ctypes.c_int()
        _check(_lib.moea2a_comm_rank(self.handle, ctypes.byref(r)), self.handle)
        return r.value

    @property
    def size(self):
        s = ctypes.c_int()
        _check(_lib.moea2a_comm_size(self.handle, ctypes.byref(s)), self.handle)
        return s.value

    def last_error(self):
        return _lib.moea2a_last_error(self._h).decode(errors="replace")

    def abort(self):
        """Stops everything in flight; afterwards calls fail with Aborted."""
        _check(_lib.moea2a_comm_abort(self.handle), self.handle)

    def destroy(self):
        self._release()


# ---- MoE ----------------------------------------------------------------------------

_WIRES = {None: (C.WIRE_AS_IS, 0, 0), "fp8": (C.WIRE_FP8, C.FP8_SCALES_ROW_MAJOR, 0),
          "fp8-mn": (C.WIRE_FP8, C.FP8_SCALES_MN_MAJOR, 0),
          "fp8-ue8m0": (C.WIRE_FP8, C.FP8_SCALES_ROW_MAJOR, C.FP8_UE8M0),
          "fp8-ue8m0-mn": (C.WIRE_FP8, C.FP8_SCALES_MN_MAJOR, C.FP8_UE8M0),
          "nvfp4": (C.WIRE_NVFP4, C.SF_LINEAR, 0), "nvfp4-128x4": (C.WIRE_NVFP4, C.SF_128X4, 0),
          "nvfp4-8x4": (C.WIRE_NVFP4, C.SF_8X4, 0)}
_MEMORY = {"auto": C.MEMORY_AUTO, "host": C.MEMORY_HOST, "cuda": C.MEMORY_CUDA}


def _moe_config(num_experts, top_k, max_tokens_per_rank, hidden=0, dtype="bf16", payloads=None,
                combine_dtype=None, weights=False, memory="auto", wire=None, num_sms=0, invalid_expert_id=-1,
                expert_to_rank=None, sanitize=True, rewrite_nonlocal=False, nvlink=True, layout="rank",
                expert_alignment=0, max_expert_rows=0, weighted_combine=False, zero_padding=False,
                host_expert_counts=False, copy_engine=False):
    c = C.MoeConfig()
    c.size, c.version = ctypes.sizeof(C.MoeConfig), _VERSION_CODE
    c.num_experts, c.top_k, c.max_tokens_per_rank = num_experts, top_k, max_tokens_per_rank
    plist = payloads if payloads is not None else ([(dtype, hidden)] if hidden else [])
    if len(plist) > C.MAX_PAYLOADS:
        raise InvalidArgument(1, f"at most {C.MAX_PAYLOADS} payloads")
    wires = wire if isinstance(wire, (list, tuple)) else [wire] + [None] * (len(plist) - 1)
    c.num_payloads = len(plist)
    for i, (dt, elems) in enumerate(plist):
        c.payloads[i].dtype, c.payloads[i].elems_per_token = _dtype(dt), int(elems)
        if wires[i] not in _WIRES:
            raise InvalidArgument(1, f"unknown wire {wires[i]!r}; one of {', '.join(str(w) for w in _WIRES)}")
        c.wire[i].format, c.wire[i].scale_layout, c.wire[i].flags = _WIRES[wires[i]]
    c.combine_dtype = _dtype(_combine_dtype(dtype, combine_dtype))
    c.hidden, c.invalid_expert_id = int(hidden), invalid_expert_id
    c.flags = ((0 if sanitize else C.MOE_NO_SANITIZE) | (C.MOE_REWRITE_NONLOCAL if rewrite_nonlocal else 0) |
               (C.MOE_CARRY_WEIGHTS if weights else 0) | (0 if nvlink else C.MOE_NO_NVLINK) |
               (C.MOE_WEIGHTED_COMBINE if weighted_combine else 0) | (C.MOE_ZERO_PADDING if zero_padding else 0) |
               (C.MOE_HOST_EXPERT_COUNTS if host_expert_counts else 0) | (C.MOE_COPY_ENGINE if copy_engine else 0))
    if layout not in ("rank", "expert"):
        raise InvalidArgument(1, "layout must be 'rank' or 'expert'")
    c.layout = C.LAYOUT_EXPERT_MAJOR if layout == "expert" else C.LAYOUT_RANK_MAJOR
    c.expert_alignment, c.max_expert_rows = int(expert_alignment), int(max_expert_rows)
    if memory not in _MEMORY:
        raise InvalidArgument(1, f"memory must be one of {', '.join(_MEMORY)}")
    c.memory, c.num_sms = _MEMORY[memory], num_sms
    keep = None
    if expert_to_rank is not None:
        keep = (ctypes.c_int32 * len(expert_to_rank))(*expert_to_rank)
        c.placement, c.expert_to_rank = C.PLACEMENT_MAP, ctypes.cast(keep, ctypes.POINTER(ctypes.c_int32))
    return c, plist, keep


def workspace_size(comm, num_experts, top_k, max_tokens_per_rank, **kw):
    """The bytes moea2a_moe_workspace_size reports for this rank, as a dict."""
    c, _, _keep = _moe_config(num_experts, top_k, max_tokens_per_rank, **kw)
    s = C.WorkspaceSizes()
    s.size, s.version = ctypes.sizeof(C.WorkspaceSizes), _VERSION_CODE
    _check(_lib.moea2a_moe_workspace_size(comm.handle, ctypes.byref(c), ctypes.byref(s)), comm.handle)
    out = {name: getattr(s, name) for name, _ in C.WorkspaceSizes._fields_ if name not in ("size", "version", "nic")}
    out["payload_bytes"] = list(s.payload_bytes)[: c.num_payloads]
    out["nic"] = s.nic.decode()
    return out


class DispatchResult:
    """What a dispatch delivered, as views of the context's workspace (valid until the
    next dispatch): recv_counts [ep], payloads[i] [ep, stride, row], topk_ids and
    topk_weights [ep, stride, k], src_token_index [ep, stride]; for payloads quantized
    on dispatch, scales[i] (bytes in the wire's layout) and global_scales[i] (NVFP4,
    [ep]). On CUDA memory they are torch CUDA tensors over the same device memory
    (bf16 as torch.bfloat16; needs PyTorch) and their addresses are also in .ptr.
    The views are made when first read and kept by the context for later dispatches
    of the same shape (the workspace does not move), so a dispatch costs no more in
    Python than the fields it reads."""

    def __init__(self, moe, r):
        self._moe, self._r = moe, r

    def __getattr__(self, name):  # the counts and shape, read from the C result when asked
        if name in ("ep", "stride", "top_k", "total_recv", "invalid_entries", "sent_rows", "deduplicated",
                    "internode_rows", "internode_bytes", "num_local_experts", "expert_rows"):
            return getattr(self._r, name)
        if name == "nvlink":
            return bool(self._r.nvlink)
        raise AttributeError(name)

    @property
    def ptr(self):
        r, n = self._r, len(self._moe.payload_dtypes)
        addr = lambda p: ctypes.cast(p, ctypes.c_void_p).value  # noqa: E731
        return {"recv_counts": addr(r.recv_counts), "payloads": [r.payloads[i] for i in range(n)],
                "topk_ids": addr(r.topk_ids), "topk_weights": addr(r.topk_weights),
                "src_token_index": addr(r.src_token_index), "scales": [r.payload_scales[i] for i in range(n)],
                "global_scales": [addr(r.payload_global_scales[i]) for i in range(n)]}

    def _view(self, ptr, shape, np_dtype):
        if not ptr:
            return None
        return self._moe._view_of(ptr, shape, np_dtype)

    @property
    def recv_counts(self):
        return self._view(ctypes.cast(self._r.recv_counts, ctypes.c_void_p).value, (self.ep,), "int32")

    @property
    def payloads(self):
        out = []
        for i, dt in enumerate(self._moe.payload_dtypes):
            npdt = "uint8" if self._moe.wires[i] is not None else _NP_DTYPE[dt]
            item = _np().dtype(npdt).itemsize
            out.append(self._view(self._r.payloads[i], (self.ep, self.stride, self._r.payload_row_bytes[i] // item),
                                  npdt))
        return out

    @property
    def topk_ids(self):
        return self._view(ctypes.cast(self._r.topk_ids, ctypes.c_void_p).value, (self.ep, self.stride, self.top_k),
                          "int32")

    @property
    def topk_weights(self):
        return self._view(ctypes.cast(self._r.topk_weights, ctypes.c_void_p).value,
                          (self.ep, self.stride, self.top_k), "float32")

    @property
    def src_token_index(self):
        return self._view(ctypes.cast(self._r.src_token_index, ctypes.c_void_p).value, (self.ep, self.stride), "int32")

    @property
    def scales(self):
        n = len(self._moe.payload_dtypes)
        return [self._view(self._r.payload_scales[i], (self._r.payload_scale_bytes[i],), "uint8") for i in range(n)]

    # The expert-major layout (MoE(layout="expert")): None in the rank-major one.
    def _expert(self, field, shape, np_dtype):
        return self._view(ctypes.cast(getattr(self._r, field), ctypes.c_void_p).value, shape, np_dtype)

    @property
    def expert_counts(self):
        """[num_local_experts] rows of each local expert (ascending global id)."""
        return self._expert("expert_counts", (self._r.num_local_experts,), "int32")

    @property
    def expert_offsets(self):
        """[num_local_experts + 1] each expert's first row (aligned); the last: expert_rows."""
        return self._expert("expert_offsets", (self._r.num_local_experts + 1,), "int32")

    @property
    def expert_payloads(self):
        """per payload [expert_rows, row]: each local expert's rows, contiguous."""
        out = []
        for i, dt in enumerate(self._moe.payload_dtypes):
            npdt = _NP_DTYPE[dt]
            width = self._r.payload_row_bytes[i] // _np().dtype(npdt).itemsize
            out.append(self._view(self._r.expert_payloads[i], (self._r.expert_rows, width), npdt))
        return out

    @property
    def expert_ids(self):
        return self._expert("expert_ids", (self._r.expert_rows,), "int32")

    @property
    def expert_src_rank(self):
        return self._expert("expert_src_rank", (self._r.expert_rows,), "int32")

    @property
    def expert_src_token(self):
        return self._expert("expert_src_token", (self._r.expert_rows,), "int32")

    @property
    def expert_topk_slot(self):
        return self._expert("expert_topk_slot", (self._r.expert_rows,), "int32")

    @property
    def expert_weights(self):
        return self._expert("expert_weights", (self._r.expert_rows,), "float32")

    @property
    def global_scales(self):
        n = len(self._moe.payload_dtypes)
        return [self._view(ctypes.cast(self._r.payload_global_scales[i], ctypes.c_void_p).value, (self.ep,), "float32")
                for i in range(n)]


class MoE(_Handle):
    """An MoE dispatch/combine context (moea2a_moe_create; collective). hidden and dtype
    describe the payload and the combine rows: the combine dtype is dtype where that is
    fp16, bf16 or fp32, else bf16, unless combine_dtype names it; payloads=[(dtype, elems), ...] several
    payloads; wire="fp8" | "fp8-mn" | "fp8-ue8m0" | "fp8-ue8m0-mn" | "nvfp4" |
    "nvfp4-128x4" | "nvfp4-8x4" quantizes payload 0 on dispatch (or a list, one entry
    per payload); weights=True carries router weights; memory "auto", "host", "cuda";
    layout="expert" (expert_alignment, max_expert_rows, weighted_combine, zero_padding,
    host_expert_counts) also delivers each local expert's rows contiguously, and combine
    then takes one row per expert row (moea2a_moe(3), "Expert-major layout"; NumPy
    views on host memory, addresses in .ptr on CUDA memory); copy_engine=True moves the
    rows of the load/store path with the GPU's copy engines (moea2a_moe(3), "Copy-engine
    mode": not capturable in a CUDA graph)."""

    _what, _free = "MoE context", "moea2a_moe_destroy"

    def __init__(self, comm, num_experts, top_k, max_tokens_per_rank, hidden=0, dtype="bf16", **kw):
        self.comm = comm
        c, plist, self._keep = _moe_config(num_experts, top_k, max_tokens_per_rank, hidden=hidden, dtype=dtype, **kw)
        self.payload_dtypes = [p[0] for p in plist]
        wire = kw.get("wire")
        self.wires = list(wire) if isinstance(wire, (list, tuple)) else [wire] + [None] * (len(plist) - 1)
        self.hidden, self.top_k = int(hidden), top_k
        self.combine_dtype = _combine_dtype(dtype, kw.get("combine_dtype"))
        self._expert_major = kw.get("layout", "rank") == "expert"
        # where the buffers live: as asked, or for memory="auto" as the library decides
        # (CUDA when the communicator moves CUDA memory), which the sizes tell
        self.memory_kind = {C.MEMORY_HOST: "host", C.MEMORY_CUDA: "cuda"}.get(c.memory)
        if self.memory_kind is None:
            s = C.WorkspaceSizes()
            s.size, s.version = ctypes.sizeof(C.WorkspaceSizes), _VERSION_CODE
            _check(_lib.moea2a_moe_workspace_size(comm.handle, ctypes.byref(c), ctypes.byref(s)), comm.handle)
            self.memory_kind = "cuda" if s.device_bytes else "host"
        self._h = ctypes.c_void_p()
        _check(_lib.moea2a_moe_create(ctypes.byref(self._h), comm.handle, ctypes.byref(c)), comm.handle)
        # what each input row must be: (bytes, dtypes accepted) of payload i, ids, weights
        self._payload_rows = [(int(el) * _itemsize(dt), _ACCEPTS[dt]) for dt, el in plist]
        self._payload_names = [f"payload {i}" for i in range(len(plist))]
        self._ids_row = 4 * int(top_k)
        self._out_row = (self.hidden * _itemsize(self.combine_dtype), _ACCEPTS[self.combine_dtype])
        self._pays = (ctypes.c_void_p * max(1, len(plist)))()
        self._host_word = ctypes.c_uint64()  # what a combine refused here passes (see combine)
        self._views = {}  # workspace views by (address, shape, dtype): the workspace never moves
        # one result, filled by every dispatch (a result is valid until the next one);
        # the library keeps its size and version, so they are set once
        self._result = C.DispatchResult()
        self._result.size, self._result.version = ctypes.sizeof(self._result), _VERSION_CODE
        self._result_ref = ctypes.byref(self._result)
        self._dispatch_result = DispatchResult(self, self._result)
        self._last_n = 0

    def _view_of(self, ptr, shape, np_dtype):
        """The context's view of its workspace at ptr (NumPy on host memory, a torch
        tensor on CUDA memory), made once per (address, shape, dtype)."""
        key = (ptr, shape, np_dtype)
        v = self._views.get(key)
        if v is None:
            make = _cuda_view if self.memory_kind == "cuda" else _view
            v = self._views[key] = make(self, ptr, shape, np_dtype)
        return v

    def max_recv_rows(self):
        rows = ctypes.c_size_t()
        _check(_lib.moea2a_moe_max_recv_rows(self.handle, ctypes.byref(rows)), self.comm)
        return rows.value

    def combine_buffer(self):
        """The context's combine buffer [ep * cap, hidden] ([max_expert_rows, hidden] in
        the expert-major layout), a view: NumPy on host memory, a torch CUDA tensor on
        CUDA memory. Expert outputs written there need no copy (combine(None)); row
        src * stride + i is the output of received slot (src, i)."""
        p = ctypes.c_void_p()
        _check(_lib.moea2a_moe_combine_buffer(self.handle, ctypes.byref(p)), self.comm)
        return self._view_of(p.value, (self.max_recv_rows(), self.hidden), _NP_DTYPE[self.combine_dtype])

    def dispatch(self, x, topk_ids, topk_weights=None, runtime_max_tokens_per_rank=0, stream=None):
        """x: [num_tokens, row] of payload 0 (or a list, one per payload), topk_ids
        [num_tokens, top_k] int32, topk_weights [num_tokens, top_k] float32. Returns the
        context's DispatchResult (views, no copies; the same object from every dispatch,
        describing the last one until the next). Arrays of another dtype or size raise
        InvalidArgument on this rank, and every other rank's dispatch fails with it."""
        h = self._h or self.handle  # (the property raises for a closed context)
        sp = _stream(stream)
        try:  # each step below costs the caller: issue 20 bounds the layer at 5 us per call
            xs = x if isinstance(x, (list, tuple)) else (x,)
            if len(xs) != len(self.payload_dtypes):
                raise InvalidArgument(1, f"{len(self.payload_dtypes)} payload(s) configured, {len(xs)} given")
            shape = None if topk_ids is None else getattr(topk_ids, "shape", None)
            n = shape[0] if shape else 0  # not len(): 1 us on a torch tensor (_rows_ptr checks the rest)
            ids = _rows_ptr(topk_ids, "topk_ids", n, self._ids_row, _INT32)
            weights = _rows_ptr(topk_weights, "topk_weights", n, self._ids_row, _FLOAT32)
            for i, a in enumerate(xs):
                self._pays[i] = _rows_ptr(a, self._payload_names[i], n, *self._payload_rows[i])
        except InvalidArgument:
            # Refused here, the C call still takes place, with a token count it refuses:
            # the ranks fail together (moea2a_moe(3)) instead of the others waiting for
            # this one until the timeout.
            _out_of_order(_lib.moea2a_dispatch(h, -1, None, None, None, 0, self._result_ref, sp), self.comm)
            raise
        rc = _lib.moea2a_dispatch(h, n, ids, weights, self._pays, int(runtime_max_tokens_per_rank), self._result_ref,
                                  sp)
        if rc:
            _check(rc, self.comm)
        self._last_n = n
        return self._dispatch_result

    def combine(self, expert_out=None, out=None, stream=None):
        """expert_out [ep, stride, hidden] of the combine dtype ([expert_rows, hidden] in
        the expert-major layout; None: the combine buffer); out [num_tokens, hidden] of
        the last dispatch (allocated when None: NumPy on host memory, a torch tensor on
        CUDA memory). Arrays of another dtype or size raise InvalidArgument on this rank,
        and every other rank's combine fails with it."""
        h = self._h or self.handle
        sp = _stream(stream)
        if out is None:
            if self.memory_kind == "cuda":  # a torch tensor on the current device (graph capture: its pool)
                import torch
                out = torch.empty((self._last_n, self.hidden), dtype=_torch_dtype(_NP_DTYPE[self.combine_dtype]),
                                  device="cuda")
            else:
                out = _np().empty((self._last_n, self.hidden), dtype=_NP_DTYPE[self.combine_dtype])
        try:
            out_ptr = _rows_ptr(out, "out", self._last_n, *self._out_row)
            rows = None
            if expert_out is not None:  # the rows the last dispatch delivered, or more
                r = self._result
                need = r.expert_rows if self._expert_major else r.ep * r.stride
                rows = _rows_ptr(expert_out, "expert_out", max(need, 0), *self._out_row, at_least=True)
        except InvalidArgument:
            # refused here, the C call takes an expert_out it refuses on every memory (on
            # CUDA memory host memory, on host memory an address off the elements' grid):
            # every rank fails, as in dispatch
            _out_of_order(_lib.moea2a_combine(h, ctypes.addressof(self._host_word) + 1, None, sp), self.comm)
            raise
        rc = _lib.moea2a_combine(h, rows, out_ptr, sp)
        if rc:
            _check(rc, self.comm)
        return out

    def close(self):
        self._release()


def _out_of_order(rc, comm):
    """After a call refused here: the library's StateError where the call came out of
    order (a combine before its dispatch), which is the error to report first."""
    if _ERRORS.get(rc) is StateError:
        _check(rc, comm)


def _stream(stream):
    """A CUDA stream for the C calls: None is the default stream (pass
    torch.cuda.current_stream() to order with PyTorch's work), an int its address, or
    anything with .cuda_stream (a torch.cuda.Stream). Host memory ignores it."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    return getattr(stream, "cuda_stream", None)


# ---- quantization -------------------------------------------------------------------

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


# ---- local ranks --------------------------------------------------------------------

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

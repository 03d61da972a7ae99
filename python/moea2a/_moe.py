"""MoE contexts: dispatch and combine, and what a dispatch delivered."""
import ctypes

from . import _capi as C
from ._arrays import (_ACCEPTS, _FLOAT32, _INT32, _NP_DTYPE, _combine_dtype, _cuda_view, _dtype, _itemsize, _np,
                      _rows_ptr, _stream, _torch_dtype, _view)
from ._errors import InvalidArgument, _check, out_of_order as _out_of_order
from ._handle import _Handle
from ._native import VERSION_CODE as _VERSION_CODE, lib as _lib


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
                host_expert_counts=False, copy_engine=False, combine_wire=None, max_local_experts=0,
                expert_wire_scales=False, count_load=False, general_placement=False):
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
               (C.MOE_HOST_EXPERT_COUNTS if host_expert_counts else 0) | (C.MOE_COPY_ENGINE if copy_engine else 0) |
               (C.MOE_EXPERT_WIRE_SCALES if expert_wire_scales else 0) | (C.MOE_EXPERT_LOAD if count_load else 0) |
               (C.MOE_GENERAL_PLACEMENT if general_placement else 0))
    if layout not in ("rank", "expert"):
        raise InvalidArgument(1, "layout must be 'rank' or 'expert'")
    c.layout = C.LAYOUT_EXPERT_MAJOR if layout == "expert" else C.LAYOUT_RANK_MAJOR
    c.expert_alignment, c.max_expert_rows = int(expert_alignment), int(max_expert_rows)
    if combine_wire not in (None, "fp8", "fp8-ue8m0"):
        raise InvalidArgument(1, f"unknown combine_wire {combine_wire!r}; one of None, fp8, fp8-ue8m0")
    c.combine_wire.format, c.combine_wire.scale_layout, c.combine_wire.flags = _WIRES[combine_wire]
    c.max_local_experts = int(max_local_experts)
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


def _expert_row_array(field, np_dtype, doc):
    """A DispatchResult property: the expert-major layout's array field, one value per
    expert row (None in the rank-major layout)."""
    return property(lambda self: self._expert(field, (self._r.expert_rows,), np_dtype), doc=f"[expert_rows] {doc}")


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
                    "internode_rows", "internode_bytes", "network_rows", "network_bytes", "dropped_entries",
                    "num_local_experts",
                    "expert_rows"):
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

    # [expert_rows] per-row arrays of the expert-major layout (moea2a_moe(3))
    expert_ids = _expert_row_array("expert_ids", "int32", "each row's global expert id")
    expert_src_rank = _expert_row_array("expert_src_rank", "int32", "the rank each row came from")
    expert_src_token = _expert_row_array("expert_src_token", "int32", "the row's token on that rank")
    expert_topk_slot = _expert_row_array("expert_topk_slot", "int32", "the token's top-k slot the row serves")
    expert_weights = _expert_row_array("expert_weights", "float32", "the router weight of that slot")

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
    host_expert_counts, expert_wire_scales) also delivers each local expert's rows contiguously, and combine
    then takes one row per expert row (moea2a_moe(3), "Expert-major layout"; NumPy
    views on host memory, addresses in .ptr on CUDA memory); copy_engine=True moves the
    rows of the load/store path with the GPU's copy engines (moea2a_moe(3), "Copy-engine
    mode": not capturable in a CUDA graph); combine_wire="fp8" | "fp8-ue8m0" sends the
    combine's rows as FP8 (moea2a_moe(3), "FP8 combine"; host memory, or the load/store
    and generic paths in CUDA memory); max_local_experts
    bounds what set_placement may give a rank; count_load=True counts the experts' load
    on the GPU for expert_load() (host memory always counts it); general_placement=True
    lets a context in CUDA memory take replicas and experts no rank holds
    (set_replicas, -1 in set_placement; its kernels then route by the general rule)."""

    _what, _free = "MoE context", "moea2a_moe_destroy"

    def __init__(self, comm, num_experts, top_k, max_tokens_per_rank, hidden=0, dtype="bf16", **kw):
        self.comm = comm
        c, plist, self._keep = _moe_config(num_experts, top_k, max_tokens_per_rank, hidden=hidden, dtype=dtype, **kw)
        self.payload_dtypes = [p[0] for p in plist]
        wire = kw.get("wire")
        self.wires = list(wire) if isinstance(wire, (list, tuple)) else [wire] + [None] * (len(plist) - 1)
        self.hidden, self.top_k, self._num_experts = int(hidden), top_k, int(num_experts)
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

    def set_placement(self, expert_to_rank, stream=None):
        """Moves the experts (moea2a_moe_set_placement; collective, no dispatch pending):
        expert e to rank expert_to_rank[e], the same map on every rank, in place; -1: no
        rank holds e (its entries are dropped, counted in dropped_entries). On CUDA
        memory the device's tables change in order on stream, as dispatch's stream
        argument."""
        m = (ctypes.c_int32 * len(expert_to_rank))(*[int(r) for r in expert_to_rank])
        if len(expert_to_rank) != self._num_experts:
            raise InvalidArgument(1, f"expert_to_rank has {len(expert_to_rank)} entries for {self._num_experts} experts")
        _check(_lib.moea2a_moe_set_placement(self.handle, m, _stream(stream)), self.comm)

    def set_replicas(self, holders, stream=None):
        """Moves the experts with replicas (moea2a_moe_set_replicas; collective, no
        dispatch pending): holders[e] lists the ranks holding expert e (empty: none);
        token t of rank s goes to holders[e][(s + t) % len(holders[e])]. On CUDA memory
        the device's tables change in order on stream, as set_placement's."""
        if len(holders) != self._num_experts:
            raise InvalidArgument(1, f"holders has {len(holders)} entries for {self._num_experts} experts")
        R = max(1, max(len(h) for h in holders))
        flat = [int(h[j]) if j < len(h) else -1 for h in holders for j in range(R)]
        m = (ctypes.c_int32 * len(flat))(*flat)
        _check(_lib.moea2a_moe_set_replicas(self.handle, R, m, _stream(stream)), self.comm)

    def expert_load(self, reset=False):
        """Per expert, the (token, expert) entries this rank took since create or the last
        reset (moea2a_moe_expert_load; local): a list of num_experts ints. On CUDA memory the
        context counts them where created with count_load=True, and this waits for the GPU."""
        load = (ctypes.c_int64 * self._num_experts)()
        _check(_lib.moea2a_moe_expert_load(self.handle, load, 1 if reset else 0), self.comm)
        return list(load)

    def retarget(self, comm, expert_to_rank=None):
        """Moves the context to comm, made by shrinking or growing its communicator
        (moea2a_moe_retarget(3); collective over comm): the same object, config and load
        counts, memory made anew; expert_to_rank: the placement there (None after a
        shrink: derived from the old one). Views of the old workspace must not be used."""
        m = None
        if expert_to_rank is not None:
            if len(expert_to_rank) != self._num_experts:
                raise InvalidArgument(1, f"expert_to_rank has {len(expert_to_rank)} entries for {self._num_experts} experts")
            m = (ctypes.c_int32 * len(expert_to_rank))(*[int(r) for r in expert_to_rank])
        rc = _lib.moea2a_moe_retarget(self.handle, comm.handle, m)
        self._views = {}  # the workspace moved, even where the retarget failed
        self.comm = comm
        _check(rc, comm)

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
        try:  # each step below is paid on every call: the layer stays within 5 us of the C call
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

"""Communicators: the ranks of a job, joined by a unique id, the launcher's environment
or a torch.distributed process group."""
import ctypes

from . import _capi as C
from ._errors import InvalidArgument, _check
from ._handle import _Handle
from ._native import VERSION_CODE as _VERSION_CODE, lib as _lib


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

    @classmethod
    def _adopt(cls, handle):
        c = cls.__new__(cls)
        c._h = handle
        return c

    def shrink(self, exclude=()):
        """The survivors' communicator (moea2a_comm_shrink(3); collective over them): the
        ranks not in exclude and not seen dead, renumbered in order; no new uid. This
        communicator stays, to be destroyed."""
        ex = (ctypes.c_int * max(1, len(exclude)))(*[int(q) for q in exclude])
        h = ctypes.c_void_p()
        _check(_lib.moea2a_comm_shrink(self.handle, ex if exclude else None, len(exclude), ctypes.byref(h)),
               self.handle)
        return Comm._adopt(h)

    def grow(self, nranks, uid=None, rank=-1):
        """A communicator of nranks ranks, this one's and new processes (moea2a_comm_grow(3);
        collective): rank 0 passes the uid it made with unique_id() and handed to the new
        processes, which join with Comm(nranks, their rank, uid); rank: this rank's number
        there (-1: the one it has)."""
        u = C.UniqueId()
        if uid is not None:
            if len(uid) != C.UNIQUE_ID_BYTES:
                raise InvalidArgument(1, f"uid must be the {C.UNIQUE_ID_BYTES} bytes moea2a.unique_id() made")
            ctypes.memmove(ctypes.addressof(u), bytes(uid), ctypes.sizeof(u))
        h = ctypes.c_void_p()
        _check(_lib.moea2a_comm_grow(self.handle, int(nranks), ctypes.byref(u), int(rank), ctypes.byref(h)),
               self.handle)
        return Comm._adopt(h)

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

    def traffic(self):
        """Bytes this rank handed its transports by all-to-all so far (moea2a_comm_traffic(3)):
        a dict of host_same_node, host_other_nodes, cuda_same_node, cuda_other_nodes."""
        t = C.Traffic(ctypes.sizeof(C.Traffic), _VERSION_CODE)
        _check(_lib.moea2a_comm_traffic(self.handle, ctypes.byref(t)), self.handle)
        return {name: getattr(t, name) for name, _ in C.Traffic._fields_[2:]}

    def last_error(self):
        return _lib.moea2a_last_error(self._h).decode(errors="replace")

    def abort(self):
        """Stops everything in flight; afterwards calls fail with Aborted."""
        _check(_lib.moea2a_comm_abort(self.handle), self.handle)

    def destroy(self):
        self._release()

"""The exceptions of moea2a's result codes, one class per MOEA2A_ERR_* value."""
from ._native import lib as _lib


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


def out_of_order(rc, comm):
    """After a call refused here: the library's StateError where the call came out of
    order (a combine before its dispatch), which is the error to report first."""
    if _ERRORS.get(rc) is StateError:
        _check(rc, comm)

"""The base of the objects that own a C handle (communicators, MoE contexts)."""
import ctypes

from ._errors import StateError, _check
from ._native import lib as _lib


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

"""The C library as ctypes loads it, and its version."""
import ctypes

from . import _capi as C

lib = C.load()


def _version():
    ma, mi, pa = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.moea2a_get_version(ctypes.byref(ma), ctypes.byref(mi), ctypes.byref(pa))
    return f"{ma.value}.{mi.value}.{pa.value}"


VERSION = _version()
# MOEA2A_VERSION_CODE: what the size/version header of every config struct carries
VERSION_CODE = sum(int(p) * m for p, m in zip(VERSION.split("."), (10000, 100, 1)))
BUILD_CONFIG = lib.moea2a_get_build_config().decode()

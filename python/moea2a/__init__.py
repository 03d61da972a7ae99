"""moea2a from Python: expert-parallel all-to-all (dispatch, combine) for MoE models.

A pure-Python layer over the C library (ctypes; no compiled extension, no build-time
dependency on PyTorch). NumPy arrays work on host memory: dispatch results are views
of the context's workspace, valid until its next dispatch. See python/README.md.

The package in modules, each with one job: _native (the loaded library), _errors (one
exception per result code), _arrays (arguments as the C calls take them), _comm
(communicators), _moe (MoE contexts), _quant (FP8/NVFP4), _gemm (the expert GEMM),
_launch (ranks on one machine). Everything public is here, under moea2a.
"""
from ._native import BUILD_CONFIG as build_config, VERSION as __version__
from ._errors import (Aborted, CapacityError, CudaError, Error, InternalError, InvalidArgument, Mismatch, NoMemory,
                      PeerFailed, StateError, SystemError_, Timeout, TransportError, Unavailable)
from ._comm import Comm, unique_id
from ._moe import DispatchResult, MoE, workspace_size
from ._quant import fp4_dequantize, fp4_quantize, fp8_dequantize, fp8_quantize
from ._gemm import expert_gemm, expert_gemm_workspace_size
from ._launch import run_local

__all__ = ["__version__", "Aborted", "CapacityError", "Comm", "CudaError", "DispatchResult", "Error", "InternalError",
           "InvalidArgument", "Mismatch", "MoE", "NoMemory", "PeerFailed", "StateError", "SystemError_", "Timeout",
           "TransportError", "Unavailable", "build_config", "expert_gemm", "expert_gemm_workspace_size",
           "fp4_dequantize", "fp4_quantize", "fp8_dequantize", "fp8_quantize", "run_local", "unique_id",
           "workspace_size"]

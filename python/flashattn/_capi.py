"""ctypes bindings over the flashattn C API (include/flashattn/flashattn.h).

Binding the C API rather than PyTorch's C++ headers means one build of libflashattn serves every
PyTorch version: this module only needs raw pointers, shapes, strides, a device index and a CUDA
stream, all of which torch.Tensor exposes from Python.

The library is looked up, in order, at
  1. $FLASHATTN_LIBRARY (a path to libflashattn.so: used by the CTest run over a build tree),
  2. flashattn/_lib/libflashattn.so inside this package (where ``pip install .`` puts it).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import Optional

# Codes from flashattn.h; keep in sync (checked indirectly: a wrong code fails validation).
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_I32, DTYPE_E4M3 = 0, 1, 2, 3, 4
DEVICE_CPU, DEVICE_CUDA = 0, 1
ALIGN_BOTTOM_RIGHT, ALIGN_TOP_LEFT = 0, 1
STATUS_OK = 0


class FlashAttnError(ValueError):
    """Raised when libflashattn rejects a call or fails.

    The message is the library's (fa_last_error()): it names the argument, what was expected and
    what came, e.g. ``"k: expected shape[2] (num_heads_k) to divide num_heads = 6, got 4"``.
    A ValueError subclass, since nearly every failure is an argument the caller can fix.
    """


class FaTensor(ctypes.Structure):
    """Mirror of ``fa_tensor``: a strided view; ndim == 0 means "not given"."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class FaParams(ctypes.Structure):
    """Mirror of ``fa_params`` (and so of flashattn::AttentionParams), field by field."""

    _fields_ = [
        ("q", FaTensor),
        ("k", FaTensor),
        ("v", FaTensor),
        ("out", FaTensor),
        ("lse", FaTensor),
        ("dout", FaTensor),
        ("dq", FaTensor),
        ("dk", FaTensor),
        ("dv", FaTensor),
        ("cu_seqlens_q", FaTensor),
        ("cu_seqlens_k", FaTensor),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("causal_align", ctypes.c_int32),
        ("window_size_left", ctypes.c_int64),
        ("window_size_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", FaTensor),
        ("deterministic", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("q_descale", FaTensor),
        ("k_descale", FaTensor),
        ("v_descale", FaTensor),
    ]


def _params_struct() -> struct.Struct:
    """A struct.Struct laid out like FaParams (offsets and padding taken from ctypes), so that a call
    packs its fa_params in one pack() of a flat tuple: fa_tensor fields take 13 values each (data,
    dtype, device, device_index, ndim, shape[4], stride[4]), scalars one, in FaParams' field order.
    Assigning ctypes fields one by one cost ~4x more host time per attention call."""
    codes = {ctypes.c_int64: "q", ctypes.c_int32: "i", ctypes.c_float: "f", ctypes.c_void_p: "Q",
             FaTensor: "Q4i4q4q"}
    fmt, pos = "=", 0
    for name, typ in FaParams._fields_:
        offset = getattr(FaParams, name).offset
        fmt += f"{offset - pos}x" * (offset > pos) + codes[typ]
        pos = offset + ctypes.sizeof(typ)
    fmt += f"{ctypes.sizeof(FaParams) - pos}x" * (ctypes.sizeof(FaParams) > pos)
    packer = struct.Struct(fmt)
    assert packer.size == ctypes.sizeof(FaParams), (fmt, packer.size)
    return packer


PARAMS_STRUCT = _params_struct()
NO_TENSOR = (0,) * 13  # an fa_tensor meaning "not given"
FLOAT32_MAX = 3.4028234663852886e38

_lib: Optional[ctypes.CDLL] = None
_packed_calls: Optional[tuple] = None  # (fa_forward, fa_backward) taking a packed fa_params (bytes)
_lib_lock = threading.Lock()


def library_path() -> Path:
    """Where libflashattn is loaded from (see the module docstring for the order)."""
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "_lib" / "libflashattn.so"


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.is_file():
        raise ImportError(
            f"flashattn: native library not found at {path}; install the package with "
            "`pip install --no-build-isolation .` from the repository root, or set FLASHATTN_LIBRARY "
            "to a libflashattn.so built with -DBUILD_SHARED_LIBS=ON"
        )
    # CDLL (not PyDLL) releases the GIL during each call, so CPU kernels don't block other threads.
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        source = "FLASHATTN_LIBRARY" if os.environ.get("FLASHATTN_LIBRARY") else "the installed package"
        raise ImportError(f"flashattn: expected a loadable libflashattn.so at {path} (from {source}), "
                          f"got a file the dynamic loader refuses: {e}") from None
    params_p = ctypes.POINTER(FaParams)
    lib.fa_params_init.argtypes = [params_p]
    lib.fa_params_init.restype = None
    lib.fa_forward.argtypes = [params_p]
    lib.fa_forward.restype = ctypes.c_int
    lib.fa_backward.argtypes = [params_p]
    lib.fa_backward.restype = ctypes.c_int
    lib.fa_plan.argtypes = [params_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32]
    lib.fa_plan.restype = ctypes.c_int
    lib.fa_last_error.argtypes = []
    lib.fa_last_error.restype = ctypes.c_char_p
    lib.fa_cuda_available.argtypes = []
    lib.fa_cuda_available.restype = ctypes.c_int
    lib.fa_version.argtypes = []
    lib.fa_version.restype = ctypes.c_char_p
    lib.fa_params_size.argtypes = []
    lib.fa_params_size.restype = ctypes.c_int64
    native_size = lib.fa_params_size()
    if native_size != ctypes.sizeof(FaParams):
        raise ImportError(
            f"flashattn: fa_params layout mismatch: {path} has sizeof(fa_params) = {native_size}, "
            f"these bindings expect {ctypes.sizeof(FaParams)}; rebuild the package"
        )
    return lib


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once, on first use)."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _load()
    return _lib


def new_params() -> FaParams:
    """A zero-initialized fa_params with unbounded windows (fa_params_init)."""
    p = FaParams()
    lib().fa_params_init(ctypes.byref(p))
    return p


def _last_error() -> str:
    msg = lib().fa_last_error()
    return msg.decode("utf-8", "replace") if msg else "unknown error"


def forward(params: FaParams) -> None:
    """fa_forward; raises FlashAttnError with the library's message on failure."""
    if lib().fa_forward(ctypes.byref(params)) != STATUS_OK:
        raise FlashAttnError(_last_error())


def backward(params: FaParams) -> None:
    """fa_backward; raises FlashAttnError with the library's message on failure."""
    if lib().fa_backward(ctypes.byref(params)) != STATUS_OK:
        raise FlashAttnError(_last_error())


def run_packed(backward_pass: bool, packed: bytes) -> None:
    """fa_forward (or fa_backward) on an fa_params packed by PARAMS_STRUCT; raises FlashAttnError
    with the library's message on failure."""
    global _packed_calls
    if _packed_calls is None:
        calls = []
        for name in ("fa_forward", "fa_backward"):
            fn = lib()[name]  # a new function object: its argtypes don't touch lib().fa_forward's
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
            calls.append(fn)
        _packed_calls = tuple(calls)
    if _packed_calls[1 if backward_pass else 0](packed) != STATUS_OK:
        raise FlashAttnError(_last_error())


def plan(params: FaParams, backward_pass: bool = False) -> str:
    """Name of the kernel that would run the call; raises FlashAttnError with the reason if none can."""
    buf = ctypes.create_string_buffer(128)
    if not lib().fa_plan(ctypes.byref(params), 1 if backward_pass else 0, buf, len(buf)):
        raise FlashAttnError(_last_error())
    return buf.value.decode("utf-8", "replace")


def cuda_available() -> bool:
    """True when the loaded library has the CUDA backend and sees a CUDA device."""
    return bool(lib().fa_cuda_available())


def version() -> str:
    """The native library's version string."""
    return lib().fa_version().decode()

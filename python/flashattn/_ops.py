"""PyTorch custom operators over libflashattn: flashattn::fwd and flashattn::bwd.

Registered with torch.library (PyTorch >= 2.4): real implementations for CPU and CUDA tensors
(CUDA kernels are enqueued on torch.cuda.current_stream(), so CUDA graphs capture them), fake
implementations so that torch.compile traces them without a graph break, and autograd for fwd
through bwd (FlashAttention-2, Dao 2023, Alg. 2: the backward recomputes P from q, k and the
forward's lse instead of storing it).

Layouts are the library's (see include/flashattn/flashattn.hpp):
  batched q [batch, seqlen_q, num_heads, head_dim], k/v [batch, seqlen_k, num_heads_k, head_dim(_v)],
          out [batch, seqlen_q, num_heads, head_dim_v], lse float32 [batch, num_heads, seqlen_q]
  varlen  q [total_q, num_heads, head_dim], ..., cu_seqlens_q/k int32 [batch + 1],
          lse float32 [num_heads, total_q]
FP8 forward (FlashAttention-3, Sec. 3.3): q, k, v torch.float8_e4m3fn with optional float32
q_descale / k_descale / v_descale ([batch, num_heads_k] or one element); out is bfloat16; forward only.
"""

from __future__ import annotations

import ctypes
import math
import operator
import struct
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import _capi
from ._capi import FlashAttnError

if not all(hasattr(torch.library, name) for name in ("custom_op", "register_fake", "register_autograd")):
    raise ImportError(f"flashattn needs PyTorch >= 2.4 (torch.library.custom_op), found torch {torch.__version__}")

_DTYPE_CODES = {
    torch.float32: _capi.DTYPE_F32,
    torch.float16: _capi.DTYPE_F16,
    torch.bfloat16: _capi.DTYPE_BF16,
    torch.int32: _capi.DTYPE_I32,
}
_E4M3 = getattr(torch, "float8_e4m3fn", None)  # PyTorch >= 2.1
if _E4M3 is not None:
    _DTYPE_CODES[_E4M3] = _capi.DTYPE_E4M3
# (The CLI's spellings, with a hyphen, are accepted too.)
_ALIGN_CODES = {"bottom_right": _capi.ALIGN_BOTTOM_RIGHT, "top_left": _capi.ALIGN_TOP_LEFT,
                "bottom-right": _capi.ALIGN_BOTTOM_RIGHT, "top-left": _capi.ALIGN_TOP_LEFT}


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The library reads raw memory: a tensor with torch's lazy negation bit (e.g. x.conj().imag of
    # a complex x) must be materialized first.
    if t.is_neg():
        t = t.resolve_neg()
    # The library takes any strides but needs the last dimension contiguous (as flash-attn does).
    if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1:
        return t
    # An empty tensor counts as contiguous to torch whatever its strides (e.g. the stride-0 gradient
    # that sum() hands back), so contiguous() would return it unchanged.
    return t.contiguous() if t.numel() > 0 else t.new_empty(t.shape)


_I64x4 = ctypes.c_int64 * 4
# Arguments whose dtype is fixed (the others take q's: fp32, fp16, bf16 or e4m3, the library's
# names, which its own messages use too, e.g. for an int32 q).
_EXPECTED_DTYPES = {"cu_seqlens_q": "int32", "cu_seqlens_k": "int32", "alibi_slopes": "float32",
                    "q_descale": "float32", "k_descale": "float32", "v_descale": "float32", "lse": "float32"}
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def _dtype_error(t: Tensor, name: str) -> FlashAttnError:
    expected = _EXPECTED_DTYPES.get(name, "fp32, fp16, bf16 or e4m3 (float8_e4m3fn)")
    return FlashAttnError(f"{name}: expected dtype {expected}, got {str(t.dtype).removeprefix('torch.')}")


def _rank_error(t: Tensor, name: str) -> FlashAttnError:
    return FlashAttnError(f"{name}: expected rank <= 4, got shape {tuple(t.shape)}")


def _tensor(t: Tensor, name: str) -> Tuple[int, ...]:
    """The 13 values of an fa_tensor describing t, in _capi.PARAMS_STRUCT's order. Runs up to 11
    times per attention call, so it reads each property once (fixed dtypes: _fixed_dtype)."""
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise _dtype_error(t, name)
    shape = t.shape
    ndim = len(shape)
    if ndim > 4:
        raise _rank_error(t, name)
    if t.is_cuda:
        dev, index = _capi.DEVICE_CUDA, t.get_device()
    elif t.is_cpu:
        dev, index = _capi.DEVICE_CPU, 0
    else:
        raise FlashAttnError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
    pad = _PAD[ndim]
    return (t.data_ptr(), code, dev, index, ndim, *shape, *pad, *t.stride(), *pad)


def _fixed_dtype(t: Optional[Tensor], name: str) -> Tuple[int, ...]:
    """_tensor for the arguments whose dtype is fixed (cu_seqlens int32, alibi_slopes float32);
    NO_TENSOR for None."""
    if t is None:
        return _capi.NO_TENSOR
    expected = _EXPECTED_DTYPES[name]
    if str(t.dtype) != "torch." + expected:
        raise FlashAttnError(f"{name}: expected dtype {expected}, got {str(t.dtype).removeprefix('torch.')}")
    return _tensor(t, name)


_PAD = [(0,) * (4 - n) for n in range(5)]


def _view(t: Optional[Tensor], name: str) -> _capi.FaTensor:
    """An fa_tensor (ctypes) describing t; an empty one, meaning "not given", for None."""
    x = _capi.NO_TENSOR if t is None else _fixed_dtype(t, name) if name in _EXPECTED_DTYPES else _tensor(t, name)
    return _capi.FaTensor(*x[:5], _I64x4(*x[5:9]), _I64x4(*x[9:13]))


# Scalar options travel as two lists, int_opts = [max_seqlen_q, max_seqlen_k, causal, causal_align
# (0 bottom_right, 1 top_left), window_size_left, window_size_right, deterministic] and float_opts =
# [softmax_scale (0 = 1/sqrt(head_dim)), softcap]: torch's custom-op autograd wrapper re-reads the
# schema once per argument on every call (torch/_library/utils.py fill_defaults), which cost ~130 us
# per call with one schema argument per option and a third of that with two lists.
NUM_INT_OPTS, NUM_FLOAT_OPTS = 7, 2
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def as_int(name: str, value) -> int:
    """value as a Python int (int, bool, numpy or 0-dim torch integer); a float such as 1.7, NaN or
    None raises, naming the argument, instead of being truncated or failing inside int()."""
    try:
        return operator.index(value)
    except TypeError:
        raise FlashAttnError(f"{name}: expected an integer, got {value!r}") from None


def as_float(name: str, value) -> float:
    """value as a Python float (any real number); None, strings or tensors of more than one
    element raise, naming the argument."""
    # float() parses strings ("1" -> 1.0): a string option is a caller's mistake, not a number.
    if isinstance(value, (str, bytes, bytearray)):
        raise FlashAttnError(f"{name}: expected a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise FlashAttnError(f"{name}: expected a real number, got {value!r}") from None


def as_bool(name: str, value) -> bool:
    """value as a flag: True / False (also NumPy's bool and the ints 0 and 1); anything else raises,
    naming the argument (bool("false") is True, so a string would silently turn the flag on)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise FlashAttnError(f"{name}: expected True or False, got {value!r}")


def pack_options(max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, causal_align: str,
                 window_size_left: int, window_size_right: int, softcap: float,
                 deterministic: bool) -> Tuple[List[int], List[float]]:
    """The (int_opts, float_opts) lists of flashattn::fwd / bwd."""
    if causal_align not in _ALIGN_CODES:
        raise FlashAttnError(f"causal_align: expected 'bottom_right' or 'top_left', got {causal_align!r}")
    # The library's fields are int64: a Python int outside that range would otherwise fail inside
    # torch's schema check with a message that names int_opts, not the argument.
    sizes = {"max_seqlen_q": as_int("max_seqlen_q", max_seqlen_q), "max_seqlen_k": as_int("max_seqlen_k", max_seqlen_k),
             "window_size[0] (left)": as_int("window_size[0] (left)", window_size_left),
             "window_size[1] (right)": as_int("window_size[1] (right)", window_size_right)}
    for name, value in sizes.items():
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise FlashAttnError(f"{name}: expected a value in the int64 range [-2^63, 2^63 - 1], got {value}")
    ints = [sizes["max_seqlen_q"], sizes["max_seqlen_k"], int(as_bool("causal", causal)),
            _ALIGN_CODES[causal_align], sizes["window_size[0] (left)"], sizes["window_size[1] (right)"],
            int(as_bool("deterministic", deterministic))]
    return ints, [as_float("softmax_scale", softmax_scale), as_float("softcap", softcap)]


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.resolve_neg().contiguous()


def _descale(t: Optional[Tensor]) -> Optional[Tensor]:
    """A descale as the library takes it: one element of any shape becomes rank 0 (per tensor),
    anything else ([batch, num_heads_k], any strides) is passed as it is."""
    if t is None:
        return None
    t = t.resolve_neg()
    return t.reshape(()) if t.numel() == 1 else t


def is_fp8(t: Tensor) -> bool:
    return _E4M3 is not None and t.dtype == _E4M3


def out_dtype(q: Tensor) -> torch.dtype:
    """out's dtype for inputs like q: q's, except bfloat16 for float8_e4m3fn (FlashAttention-3's FP8 forward)."""
    return torch.bfloat16 if is_fp8(q) else q.dtype


NO_FP8_BACKWARD = ("flashattn: e4m3 (torch.float8_e4m3fn) inputs have a forward pass only (FlashAttention-3's FP8 "
                   "attention): no gradient flows to q, k, v; run the backward in bfloat16 or float16, or detach the "
                   "FP8 inputs")


def _values(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Optional[Tensor],
            dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
            cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor], int_opts: List[int],
            float_opts: List[float], descales: Tuple[Optional[Tensor], ...] = (None, None, None),
            describe=None) -> Tuple[list, tuple]:
    """The flat PARAMS_STRUCT values of one fa_forward / fa_backward call on these tensors and options
    (the options as pack_options() makes them), stream left 0, and the small tensors it reads (the
    dense copies of cu_seqlens and alibi_slopes, then the descales, to be kept alive until the call
    returns). describe(t, name) replaces _tensor() for q, k, v, out, lse and the gradients (the fake
    kernels' shape-only check)."""
    if len(int_opts) != NUM_INT_OPTS or len(float_opts) != NUM_FLOAT_OPTS:
        raise FlashAttnError(f"int_opts, float_opts: expected {NUM_INT_OPTS} and {NUM_FLOAT_OPTS} values, "
                             f"got {len(int_opts)} and {len(float_opts)}")
    max_seqlen_q, max_seqlen_k, causal, causal_align, window_left, window_right, deterministic = int_opts
    # float32 fields: C's conversion turns a finite double beyond float32's range into inf (which the
    # library refuses by name); struct.pack would raise OverflowError instead.
    softmax_scale, softcap = float(float_opts[0]), float(float_opts[1])
    if abs(softmax_scale) > _capi.FLOAT32_MAX:  # False for NaN, which the library refuses by name
        softmax_scale = math.copysign(math.inf, softmax_scale)
    if abs(softcap) > _capi.FLOAT32_MAX:
        softcap = math.copysign(math.inf, softcap)
    # The library reads these as dense arrays; q, k, v may be strided, these small ones are copied
    # when they are not (e.g. a slice of a larger slopes table).
    kept = (_contiguous(cu_seqlens_q), _contiguous(cu_seqlens_k), _contiguous(alibi_slopes),
            *(_descale(t) for t in descales))
    # Follow torch's intra-op thread setting on CPU rather than the library's "all cores" default.
    num_threads = 0 if q.is_cuda else torch.get_num_threads()
    none = _capi.NO_TENSOR
    tensor = describe or _tensor
    values = [
        *tensor(q, "q"), *tensor(k, "k"), *tensor(v, "v"), *tensor(out, "out"), *tensor(lse, "lse"),
        *(none if dout is None else tensor(dout, "dout")), *(none if dq is None else tensor(dq, "dq")),
        *(none if dk is None else tensor(dk, "dk")), *(none if dv is None else tensor(dv, "dv")),
        *_fixed_dtype(kept[0], "cu_seqlens_q"), *_fixed_dtype(kept[1], "cu_seqlens_k"), max_seqlen_q,
        max_seqlen_k, softmax_scale, causal, causal_align, window_left, window_right, softcap,
        *_fixed_dtype(kept[2], "alibi_slopes"), deterministic, num_threads, 0,
        *_fixed_dtype(kept[3], "q_descale"), *_fixed_dtype(kept[4], "k_descale"), *_fixed_dtype(kept[5], "v_descale")]
    return values, kept


def _run(backward_pass: bool, q: Tensor, values: list) -> None:
    """fa_forward / fa_backward on _values()' list; CUDA work goes on q's device, on torch's current
    stream there."""
    cuda = q.is_cuda
    if cuda:
        index = q.get_device()
        values[_STREAM] = _current_stream(index)
    try:
        packed = _capi.PARAMS_STRUCT.pack(*values)
    except struct.error as e:  # only a direct op call can get here: pack_options() range-checks its values
        raise FlashAttnError(f"int_opts: expected [max_seqlen_q, max_seqlen_k, causal, causal_align, "
                             f"window_size_left, window_size_right, deterministic] within the C fields' ranges "
                             f"(int64, int32 for the flags), got {[values[i] for i in _INT_OPTS]} ({e})") from None
    if cuda and index != _current_device():
        # The library launches on the current device; make it q's (as a CUDA kernel launcher must).
        with torch.cuda.device(index):
            _capi.run_packed(backward_pass, packed)
    else:
        _capi.run_packed(backward_pass, packed)


# Positions in _values()' list: fa_tensor fields take 13 values each, data pointer first, in
# FaParams' order (q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k), then the
# scalars, alibi_slopes, deterministic, num_threads, stream, q_descale, k_descale, v_descale.
_T = 13
# Offsets inside an fa_tensor's values (data, dtype, device, device_index, ndim, shape[4], stride[4]).
_NDIM, _STRIDE = 4, 9
_DATA = {name: i * _T for i, name in enumerate(("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv",
                                                 "cu_seqlens_q", "cu_seqlens_k"))}
_DATA["alibi_slopes"] = 11 * _T + 8
_NUM_THREADS = 12 * _T + 8 + 1
_STREAM = _NUM_THREADS + 1
for _i, _name in enumerate(DESCALE_NAMES):
    _DATA[_name] = _STREAM + 1 + _i * _T
_INT_OPTS = [11 * _T + i for i in (0, 1, 3, 4, 5, 6)] + [12 * _T + 8]
assert _STREAM + 1 + 3 * _T == len(_capi.PARAMS_STRUCT.unpack(bytes(_capi.PARAMS_STRUCT.size)))


def _call(backward_pass: bool, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Optional[Tensor],
          dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
          cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor], int_opts: List[int],
          float_opts: List[float]) -> None:
    """One fa_forward / fa_backward call on these tensors and options (the options as pack_options()
    makes them); CUDA work goes on q's device, on torch's current stream there."""
    values, kept = _values(q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                           int_opts, float_opts)
    _run(backward_pass, q, values)  # `kept` lives until here


def _current_stream(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


_current_device = torch.cuda.current_device
if hasattr(torch._C, "_cuda_getCurrentRawStream") and hasattr(torch._C, "_cuda_getDevice"):
    # Inductor's own calls for the raw cudaStream_t and the device (no torch.cuda.Stream object
    # built, no lazy-init check per call; q being a CUDA tensor means CUDA is initialized).
    _current_stream = torch._C._cuda_getCurrentRawStream  # noqa: F811
    _current_device = torch._C._cuda_getDevice


def _lse_shape(q: Tensor, cu_seqlens_q: Optional[Tensor]) -> Tuple[int, ...]:
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise FlashAttnError(f"q: expected rank 4 [batch, seqlen_q, num_heads, head_dim], got shape {tuple(q.shape)}")
        return (q.shape[0], q.shape[2], q.shape[1])
    if q.dim() != 3:
        raise FlashAttnError(f"q: expected rank 3 [total_q, num_heads, head_dim] (varlen), got shape {tuple(q.shape)}")
    return (q.shape[1], q.shape[0])


def _fwd_run(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
             alibi_slopes: Optional[Tensor], int_opts: List[int], float_opts: List[float],
             want_template: bool, descales: Tuple[Optional[Tensor], ...] = (None, None, None)
             ) -> Tuple[Tensor, Tensor, Optional[Tuple[list, tuple]]]:
    """_fwd_impl, plus (want_template) the backward's PARAMS_STRUCT values for these inputs when
    they are the tensors the forward read (no copies made): data pointers and stream left to fill,
    dout, dq, dk, dv described as contiguous tensors of out's, q's, k's, v's shapes, paired with the
    (shape, stride, dtype, device) of each tensor the values describe (_bwd_fast checks them)."""
    q_in, k_in, v_in = q, k, v
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    if v.dim() < 1:
        raise FlashAttnError(f"v: expected rank 4 (or 3 when varlen), got shape {tuple(v.shape)}")
    out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype(q))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    values, kept = _values(q, k, v, out, lse, None, None, None, None, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                           int_opts, float_opts, descales)
    _run(False, q, values)
    template = None
    if (want_template and not is_fp8(q) and q is q_in and k is k_in and v is v_in and kept[0] is cu_seqlens_q
            and kept[1] is cu_seqlens_k and kept[2] is alibi_slopes):
        # What the values describe, in ctx.saved_tensors' order: the backward must find the same
        # layouts there (saved-tensor hooks may hand back copies with other strides, dtypes or
        # devices, and `x.data = ...` replaces a tensor's storage and shape).
        layouts = tuple(_layout(t) for t in (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes))
        # The forward's values become the backward's (the call is done): out is new_empty's, hence
        # contiguous, so dout's description is out's; dq, dk, dv are contiguous tensors of q's, k's
        # and v's shapes.
        i, j = _DATA["dout"], _DATA["out"]
        values[i:i + _T] = values[j:j + _T]
        for dst, src in (("dq", "q"), ("dk", "k"), ("dv", "v")):
            i, j = _DATA[dst], _DATA[src]
            values[i:i + _STRIDE] = values[j:j + _STRIDE]
            values[i + _STRIDE:i + _T] = _contiguous_strides(values[j + _NDIM], *values[j + _NDIM + 1:j + _STRIDE])
        template = (values, layouts)
    return out, lse, template


def _layout(t: Optional[Tensor]):
    """What a template's values describe of a tensor: (shape, stride, dtype, device), None for none."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _contiguous_strides(ndim: int, s0: int, s1: int, s2: int, s3: int) -> Tuple[int, int, int, int]:
    """The strides of a contiguous tensor of this shape (ndim 3 or 4, as q, k, v are), padded to 4."""
    return (s1 * s2 * s3, s2 * s3, s3, 1) if ndim == 4 else (s1 * s2, s2, 1, 0)


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              alibi_slopes: Optional[Tensor], int_opts: List[int], float_opts: List[float],
              q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
              v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Attention forward (FA-2 Alg. 1). Returns (out, lse); layouts in the module docstring, options
    as pack_options() makes them. deterministic only matters to the backward and is carried here
    so that autograd can hand it on. The descales are the FP8 forward's (float8_e4m3fn q, k, v).
    """
    out, lse, _ = _fwd_run(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, False,
                           (q_descale, k_descale, v_descale))
    return out, lse


fwd = torch.library.custom_op("flashattn::fwd", _fwd_impl, mutates_args=())


def _check_same_device(q: Tensor, named: dict) -> None:
    """The fake implementations' device check: the dispatcher sends a call whose tensors mix a
    'meta' (or fake) tensor with real ones here, where no library call would refuse them."""
    for name, t in named.items():
        if t is not None and t.device != q.device:
            raise FlashAttnError(f"{name}: expected a tensor on q's device {q.device}, got {t.device}")


# Fake addresses for the shape-only check: 2^40 bytes apart and 4 KiB aligned, so that no two
# tensors' extents overlap and every alignment rule holds (the library compares addresses only).
_FAKE_BASE = {name: (i + 1) << 40 for i, name in enumerate(("q", "k", "v", "out", "lse", "dout", "dq", "dk",
                                                              "dv"))}


def _shape_only(t: Tensor, name: str) -> Tuple[int, ...]:
    """_tensor()'s values for a fake / meta tensor: its dtype, shape and strides on the CPU at a
    fake address (nothing reads it)."""
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise _dtype_error(t, name)
    if t.dim() > 4:
        raise _rank_error(t, name)
    stride = _last_dim_contiguous(t).stride()  # the strides the real call passes on (no data is touched)
    pad = _PAD[t.dim()]
    return (_FAKE_BASE[name], code, _capi.DEVICE_CPU, 0, t.dim(), *t.shape, *pad, *stride, *pad)


def _check_shapes(backward_pass: bool, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  dout: Optional[Tensor], dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor],
                  cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
                  int_opts: List[int], float_opts: List[float]) -> None:
    """The library's own checks (fa_plan's validation: shapes, dtypes, options) on a fake call, so
    that meta tensors and torch.compile's tracing refuse what the real call would, with its message.
    Only where those checks read no data: not varlen (they read cu_seqlens), no ALiBi (they read
    host slopes), not e4m3 (its descales; also a CUDA-only dtype, and the description is on the
    CPU, whose backend takes every other dtype and shape the CUDA one does)."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None or alibi_slopes is not None or is_fp8(q):
        return
    values, _ = _values(q, k, v, out, lse, dout, dq, dk, dv, None, None, None, int_opts, float_opts,
                        describe=_shape_only)
    try:
        params = _capi.FaParams.from_buffer_copy(_capi.PARAMS_STRUCT.pack(*values))
    except struct.error:
        return  # out-of-range options: the real call reports them (_run)
    _capi.plan(params, backward_pass)


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, q_descale=None,
              k_descale=None, v_descale=None):
    _check_same_device(q, {"k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                           "alibi_slopes": alibi_slopes, "q_descale": q_descale, "k_descale": k_descale,
                           "v_descale": v_descale})
    out = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype(q))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    _check_shapes(False, q, k, v, out, lse, None, None, None, None, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                  int_opts, float_opts)
    return out, lse


def _backward_call(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
                   int_opts: List[int], float_opts: List[float]) -> Tuple[Tensor, Tensor, Tensor]:
    dout, out, lse = _last_dim_contiguous(dout), _last_dim_contiguous(out), _last_dim_contiguous(lse)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    _call(True, q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts)
    return dq, dk, dv


def _lse_term(q: Tensor, k: Tensor, lse: Tensor, dlse: Tensor, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor], int_opts: List[int],
              float_opts: List[float]) -> Tuple[Tensor, Tensor]:
    """(dq, dk) of sum_i dlse_i * lse_i, by one more pass of the library's backward.

    d lse_i / d S_ij = P_ij, so this term adds dlse_i to (dP_ij - D_i) in the backward's
    dS = P o (dP - D) (FA-2 Alg. 2). The library computes dP = dout v^T and D = rowsum(dout o out),
    so a call with v = a column of ones, dout = dlse in that column and out = 0 gives dP_ij = dlse_i,
    D = 0, hence dS = P o dlse and the matching dq, dk, with the masks, ALiBi and the softcap chain
    rule applied by the kernel itself. P is recomputed from q, k and lse as in any backward. The
    CUDA kernels take head_dim_v in multiples of 8, hence the zero padding there.
    """
    width = 8 if q.device.type == "cuda" else 1
    ones = torch.zeros((*k.shape[:-1], width), dtype=q.dtype, device=q.device)
    ones[..., 0] = 1
    dout = torch.zeros((*q.shape[:-1], width), dtype=q.dtype, device=q.device)
    # lse is [batch, num_heads, seqlen_q] (or [num_heads, total_q]); dout's rows are [..., seqlen_q, num_heads].
    dout[..., 0] = dlse.transpose(-1, -2)
    out = torch.zeros_like(dout)
    dq, dk, _ = _backward_call(dout, q, k, ones, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts,
                               float_opts)
    return dq, dk


def _bwd_impl(dout: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
              int_opts: List[int], float_opts: List[float],
              dlse: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Attention backward (FA-2 Alg. 2). Returns (dq, dk, dv) with the shapes and dtype of q, k, v.

    dout is the gradient of out (None: out did not reach the loss), dlse (float32, lse's shape) the
    gradient of lse (None: lse did not reach the loss); lse must be the forward's. For GQA, dk/dv of
    a KV head sum over the query heads that read it. A dlse costs one more backward pass over the
    scores (see _lse_term).
    """
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    if lse.dim() != (2 if cu_seqlens_q is not None else 3):
        raise FlashAttnError(f"lse: expected rank {2 if cu_seqlens_q is not None else 3} ([num_heads, total_q] when "
                             f"varlen, else [batch, num_heads, seqlen_q]), got shape {tuple(lse.shape)}")
    if dlse is not None and dlse.shape != lse.shape:
        raise FlashAttnError(f"dlse: expected lse's shape {tuple(lse.shape)}, got {tuple(dlse.shape)}")
    if dout is None and dlse is None:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if dout is None:
        dq, dk = _lse_term(q, k, lse, dlse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts)
        return dq, dk, torch.zeros_like(v)
    dq, dk, dv = _backward_call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts,
                                float_opts)
    if dlse is not None:
        dq_lse, dk_lse = _lse_term(q, k, lse, dlse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts)
        dq.add_(dq_lse)
        dk.add_(dk_lse)
    return dq, dk, dv


bwd = torch.library.custom_op("flashattn::bwd", _bwd_impl, mutates_args=())

# The CPU and CUDA kernels of both ops, registered on the dispatcher directly: custom_op's own
# registration (CompositeExplicitAutograd) wraps every call in Python checks (output aliasing,
# torch._disable_dynamo) that cost a few hundred µs per call with torch 2.11 on the H200's host;
# backend kernels take precedence over it. The schema, fake kernels and autograd stay custom_op's.
_kernels = torch.library.Library("flashattn", "IMPL")
for _name, _fn in (("fwd", _fwd_impl), ("bwd", _bwd_impl)):
    for _key in ("CPU", "CUDA"):
        _kernels.impl(_name, _fn, _key)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, dlse=None):
    _check_same_device(q, {"dout": dout, "k": k, "v": v, "out": out, "lse": lse, "cu_seqlens_q": cu_seqlens_q,
                           "cu_seqlens_k": cu_seqlens_k, "alibi_slopes": alibi_slopes, "dlse": dlse})
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if dout is not None:
        _check_shapes(True, q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts,
                      float_opts)
    return dq, dk, dv


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts = inputs[:8]  # then the descales
    out, lse = output
    ctx.fp8 = is_fp8(q)
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.opts = (int_opts, float_opts)
    # An output that does not reach the loss gets None rather than zeros, so that the common case
    # (lse unused) costs no extra pass.
    ctx.set_materialize_grads(False)


_NO_GRADS = (None,) * 8  # of fwd's inputs after q, k, v (cu_seqlens, alibi_slopes, options, descales)


def _input_grads(backward_fn, ctx, dout, dlse):
    """The gradients of fwd's eleven inputs from those of (out, lse), through backward_fn (the bwd
    op, or _bwd_impl on the eager path)."""
    if dout is None and dlse is None:
        return (None, None, None, *_NO_GRADS)
    if ctx.fp8:
        raise NotImplementedError(NO_FP8_BACKWARD)
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = backward_fn(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *ctx.opts, dlse)
    return (dq, dk, dv, *_NO_GRADS)


def _fwd_backward(ctx, dout, dlse):
    return _input_grads(bwd, ctx, dout, dlse)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


class _EagerAttention(torch.autograd.Function):
    """fwd with its autograd, for eager calls on plain tensors: the same implementations as the
    registered ops, without torch.library's per-call Python dispatch around them.

    A custom_op's autograd wrapper, redispatch and output checks cost 100-350 us of host time
    per call on the H200's host (bench/gpu/host_overhead.py), several times the kernels' own
    time at training shapes such as examples/train_gpt.py's (flash-attn's FlashAttnFunc is an
    autograd.Function over C++ ops for the same reason). Compiled code, tensor subclasses, fake
    tensors, torch.func transforms and dispatch modes take the registered ops (use_eager()).
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, q_descale=None,
                k_descale=None, v_descale=None):
        out, lse, ctx.bwd_template = _fwd_run(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts,
                                              float_opts, True, (q_descale, k_descale, v_descale))
        _fwd_setup_context(ctx, (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts),
                           (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        # Grad mode is on here only under create_graph=True: the gradients would be built by the
        # library, outside autograd, so a second derivative through them would silently be zero
        # (once_differentiable only catches it when the incoming gradient requires grad).
        if torch.is_grad_enabled() and any(ctx.needs_input_grad[:3]):
            raise NotImplementedError(_NO_DOUBLE_BACKWARD)
        if ctx.fp8 and (dout is not None or dlse is not None):
            raise NotImplementedError(NO_FP8_BACKWARD)
        if ctx.bwd_template is not None and dlse is None and dout is not None:
            grads = _bwd_fast(ctx, dout)
            if grads is not None:
                return grads
        return _input_grads(_bwd_impl, ctx, dout, dlse)


def _bwd_fast(ctx, dout: Tensor):
    """The common eager backward (a contiguous dout, lse unused) on the forward's parameter values
    (_fwd_run's template): only data pointers and the stream change, so none of _values()' per-tensor
    work runs again. It runs on autograd's device thread, where this Python is the backward's host
    cost (bench/gpu/host_overhead.py). None: take the general path."""
    # saved_tensors also refuses inputs modified in place since the forward.
    saved = ctx.saved_tensors
    template, layouts = ctx.bwd_template
    for t, layout in zip(saved, layouts):
        if _layout(t) != layout:
            return None
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = saved
    if not (dout.dtype == out.dtype and dout.device == out.device and dout.shape == out.shape
            and dout.is_contiguous() and not dout.is_neg()):
        return None
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    values = template.copy()
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse), ("dout", dout), ("dq", dq),
                    ("dk", dk), ("dv", dv)):
        values[_DATA[name]] = t.data_ptr()
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes)):
        if t is not None:
            values[_DATA[name]] = t.data_ptr()
    if not q.is_cuda:
        values[_NUM_THREADS] = torch.get_num_threads()
    _run(True, q, values)
    return (dq, dk, dv, *_NO_GRADS)


_NO_DOUBLE_BACKWARD = ("flashattn: double backward is not supported (create_graph=True reached the attention "
                       "backward, whose gradients are not differentiable); compute higher-order gradients with "
                       "torch.nn.functional.scaled_dot_product_attention instead")


def use_eager(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether a call may take _EagerAttention: plain tensors, no compile, transform or mode that
    must see the operator."""
    return (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and (q.is_cuda or q.is_cpu)  # 'meta' inputs get shapes from the fake implementation
            and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active()
            and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._is_torch_function_mode_enabled())


def _refuse_forward_ad(q: Tensor, k: Tensor, v: Tensor) -> None:
    # Neither path has a forward-mode formula, and both would drop a tangent silently (the eager
    # one too, when nothing requires grad). Outside a dual_level (_current_level -1) no tensor can
    # carry one, so the common call pays one attribute read.
    if (forward_ad._current_level >= 0 and not torch.compiler.is_compiling() and any(
            isinstance(t, Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in (q, k, v))):
        raise NotImplementedError("flashattn: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not "
                                  "supported; q, k or v carries a tangent")


def _refuse_func_reverse_mode() -> None:
    # torch.library's autograd for a custom op (register_autograd) has no functorch rule, so under
    # torch.func.grad / vjp / jacrev it failed with PyTorch's own message about setup_context,
    # naming neither flashattn nor a way out. torch.func.vmap (its own rule) is unaffected.
    if not torch._C._are_functorch_transforms_active():
        return
    try:
        kinds = [i.key().name for i in torch._C._functorch.get_interpreter_stack() or ()]
    except (AttributeError, RuntimeError):  # an older PyTorch without this introspection
        return
    if "Grad" in kinds:
        raise NotImplementedError("flashattn: torch.func.grad, vjp, jacrev and hessian are not supported (the "
                                  "custom op's autograd has no functorch rule); differentiate with "
                                  "torch.autograd.grad or loss.backward() instead (torch.func.vmap works)")


def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              alibi_slopes: Optional[Tensor], int_opts: List[int], float_opts: List[float],
              q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
              v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(out, lse) with autograd: _EagerAttention when use_eager() allows, else the flashattn::fwd op."""
    descales = (q_descale, k_descale, v_descale)
    _refuse_forward_ad(q, k, v)
    if use_eager(q, k, v):
        if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
            # Nothing to differentiate (inference, evaluation): no autograd node to build.
            return _fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, *descales)
        return _EagerAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts,
                                     *descales)
    _refuse_func_reverse_mode()  # (only here: a functorch transform rules out the eager path)
    return _fwd_op(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts, *descales)


_fwd_op = torch.ops.flashattn.fwd.default  # the OpOverload: calling it skips the packet's overload lookup

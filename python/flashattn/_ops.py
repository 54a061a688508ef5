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
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _capi
from ._capi import FlashAttnError

_DTYPE_CODES = {
    torch.float32: _capi.DTYPE_F32,
    torch.float16: _capi.DTYPE_F16,
    torch.bfloat16: _capi.DTYPE_BF16,
    torch.int32: _capi.DTYPE_I32,
}
_ALIGN_CODES = {"bottom_right": _capi.ALIGN_BOTTOM_RIGHT, "top_left": _capi.ALIGN_TOP_LEFT}


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The library takes any strides but needs the last dimension contiguous (as flash-attn does).
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _view(t: Optional[Tensor], name: str) -> _capi.FaTensor:
    """An fa_tensor describing t (an empty one, meaning "not given", for None)."""
    if t is None:
        return _capi.FaTensor()
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise FlashAttnError(f"{name}: expected dtype float32, float16, bfloat16 (int32 for cu_seqlens), got {t.dtype}")
    if t.device.type == "cpu":
        device, index = _capi.DEVICE_CPU, 0
    elif t.device.type == "cuda":
        device, index = _capi.DEVICE_CUDA, t.device.index if t.device.index is not None else torch.cuda.current_device()
    else:
        raise FlashAttnError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
    return _capi.make_tensor(t.data_ptr(), code, device, index, tuple(t.shape), tuple(t.stride()))


def _fill_common(p: _capi.FaParams, q: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, causal_align: str,
                 window_size_left: int, window_size_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                 deterministic: bool) -> None:
    if causal_align not in _ALIGN_CODES:
        raise FlashAttnError(f"causal_align: expected 'bottom_right' or 'top_left', got {causal_align!r}")
    p.cu_seqlens_q = _view(cu_seqlens_q, "cu_seqlens_q")
    p.cu_seqlens_k = _view(cu_seqlens_k, "cu_seqlens_k")
    p.max_seqlen_q = max_seqlen_q
    p.max_seqlen_k = max_seqlen_k
    p.softmax_scale = softmax_scale
    p.causal = int(causal)
    p.causal_align = _ALIGN_CODES[causal_align]
    p.window_size_left = window_size_left
    p.window_size_right = window_size_right
    p.softcap = softcap
    p.alibi_slopes = _view(alibi_slopes, "alibi_slopes")
    p.deterministic = int(deterministic)
    if q.device.type == "cuda":
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
    else:
        # Follow torch's intra-op thread setting rather than the library's "all cores" default.
        p.num_threads = torch.get_num_threads()


def _run(fn, q: Tensor, p: _capi.FaParams) -> None:
    if q.device.type == "cuda":
        # The library launches on the current device; make it q's (as a CUDA kernel launcher must).
        with torch.cuda.device(q.device):
            fn(p)
    else:
        fn(p)


def _lse_shape(q: Tensor, cu_seqlens_q: Optional[Tensor]) -> Tuple[int, ...]:
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise FlashAttnError(f"q: expected rank 4 [batch, seqlen_q, num_heads, head_dim], got shape {tuple(q.shape)}")
        return (q.shape[0], q.shape[2], q.shape[1])
    if q.dim() != 3:
        raise FlashAttnError(f"q: expected rank 3 [total_q, num_heads, head_dim] (varlen), got shape {tuple(q.shape)}")
    return (q.shape[1], q.shape[0])


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, causal_align: str,
        window_size_left: int, window_size_right: int, softcap: float, alibi_slopes: Optional[Tensor],
        deterministic: bool) -> Tuple[Tensor, Tensor]:
    """Attention forward (FA-2 Alg. 1). Returns (out, lse); see the module docstring for layouts.

    softmax_scale 0 means 1/sqrt(head_dim). deterministic only matters to the backward and is
    carried here so that autograd can hand it on.
    """
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    if v.dim() < 1:
        raise FlashAttnError(f"v: expected rank 4 (or 3 when varlen), got shape {tuple(v.shape)}")
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32, device=q.device)
    p = _capi.new_params()
    p.q, p.k, p.v = _view(q, "q"), _view(k, "k"), _view(v, "v")
    p.out, p.lse = _view(out, "out"), _view(lse, "lse")
    _fill_common(p, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align,
                 window_size_left, window_size_right, softcap, alibi_slopes, deterministic)
    _run(_capi.forward, q, p)
    return out, lse


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align,
              window_size_left, window_size_right, softcap, alibi_slopes, deterministic):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
        causal_align: str, window_size_left: int, window_size_right: int, softcap: float,
        alibi_slopes: Optional[Tensor], deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Attention backward (FA-2 Alg. 2). Returns (dq, dk, dv) with the shapes and dtype of q, k, v.

    lse must be the forward's. For GQA, dk/dv of a KV head sum over the query heads that read it.
    """
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    p = _capi.new_params()
    p.q, p.k, p.v = _view(q, "q"), _view(k, "k"), _view(v, "v")
    p.out, p.lse, p.dout = _view(out, "out"), _view(lse, "lse"), _view(dout, "dout")
    p.dq, p.dk, p.dv = _view(dq, "dq"), _view(dk, "dk"), _view(dv, "dv")
    _fill_common(p, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align,
                 window_size_left, window_size_right, softcap, alibi_slopes, deterministic)
    _run(_capi.backward, q, p)
    return dq, dk, dv


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
              causal, causal_align, window_size_left, window_size_right, softcap, alibi_slopes, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align,
     window_size_left, window_size_right, softcap, alibi_slopes, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align, window_size_left,
                window_size_right, softcap)
    ctx.deterministic = deterministic
    # The gradient through lse is not implemented (as in flash-attn): mark it so that autograd says
    # so instead of silently dropping a term.
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    (max_seqlen_q, max_seqlen_k, softmax_scale, causal, causal_align, window_size_left, window_size_right,
     softcap) = ctx.args
    dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, causal_align, window_size_left, window_size_right, softcap, alibi_slopes,
                     ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)

"""The public functions, with the flash-attn package's names, arguments and layouts.

Each computes exact attention the FlashAttention way (Dao et al. 2022; FlashAttention-2, Dao 2023,
Alg. 1 forward and Alg. 2 backward):

    S   = softmax_scale * q k^T                      per (batch, head)
    S   = softcap * tanh(S / softcap)                if softcap > 0
    S   = S - slope_h * |i + offset - j|             if alibi_slopes (Press et al. 2022)
    S   = -inf where the causal / sliding-window mask hides key j from query i
    lse = log sum_j exp(S_ij)                        natural log, float32
    out = softmax(S) v

Masks: query i sees key j when i + offset - window_size[0] <= j <= i + offset + window_size[1]
(a negative bound is unbounded; causal=True means window_size[1] = 0), with offset = seqlen_k -
seqlen_q for causal_align="bottom_right" (flash-attn >= 2.1, the default) and offset = 0 for
"top_left" (PyTorch's is_causal). A query row that sees no key gets out = 0 and lse = -inf.

FP8 forward (FlashAttention-3, Shah et al. 2024, Sec. 3.3; flash_attn_func and the packed forms): q, k, v in
torch.float8_e4m3fn on CUDA (sm_90), head_dim 128, with FlashAttention-3's q_descale, k_descale,
v_descale (float32 dequantization factors, (batch, num_heads_k) or one element; None = 1):

    S   = softmax_scale * (q_descale q)(k_descale k)^T   (then softcap, ALiBi, masks as above)
    out = softmax(S) (v_descale v)                       bfloat16

Forward only: a gradient reaching such a call raises NotImplementedError.

Differences from flash-attn, all loud: dropout_p > 0 and return_attn_probs=True raise ValueError
(not implemented); float32 inputs are accepted besides float16/bfloat16; the lse is returned with
return_lse=True and is differentiable too (d lse_i / d S_ij = P_ij; a gradient reaching lse costs one
more backward pass over the scores); alibi_slopes get no gradient (requires_grad=True raises).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _ops
from ._capi import FlashAttnError

_ALIGNS = tuple(_ops._ALIGN_CODES)  # (both spellings: bottom_right / bottom-right, ...)


def _check_common(dropout_p: float, softmax_scale: Optional[float], window_size: Sequence[int], softcap: float,
                  return_attn_probs: bool, causal_align: str) -> Tuple[float, int, int]:
    """Validates the Python-level arguments; returns (softmax_scale for the library, left, right of window_size)."""
    if isinstance(dropout_p, Tensor) and dropout_p.numel() != 1:
        raise ValueError(f"dropout_p: expected a number (0.0), got a tensor of shape {tuple(dropout_p.shape)}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: expected 0.0 (attention dropout is not implemented by flashattn), got {dropout_p}")
    if return_attn_probs:
        raise ValueError("return_attn_probs: expected False (flashattn never materializes the attention "
                         "probabilities; use return_lse=True for the log-sum-exp), got True")
    if causal_align not in _ALIGNS:
        raise ValueError(f"causal_align: expected 'bottom_right' or 'top_left', got {causal_align!r}")
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair (left, right), got {window_size!r}") from None
    # left and right become ints (or an error naming them) in _ops.pack_options.
    if softmax_scale is None:
        scale = 0.0  # the library's "1/sqrt(head_dim)"
    else:
        scale = _ops.as_float("softmax_scale", softmax_scale)
        # The library takes float32, where 0 means "1/sqrt(head_dim)" and denormals are refused: a
        # value that rounds to 0, to a denormal or to infinity there would become the default,
        # lose its digits or poison every score. Checked here so that the message speaks of None.
        if not _normal_in_float32(scale):
            raise ValueError("softmax_scale: expected None (= 1/sqrt(head_dim)) or a value that is a normal "
                             f"float32 (magnitude in [{_F32_MIN_NORMAL:.6g}, {_F32_INF_FROM:.6g})), "
                             f"got {softmax_scale!r}")
    cap = _ops.as_float("softcap", softcap)
    if not cap >= 0.0:  # also catches NaN
        raise ValueError(f"softcap: expected a number >= 0 (0 = off), got {softcap!r}")
    if cap != 0.0 and not _normal_in_float32(cap):
        raise ValueError("softcap: expected 0 (off) or a value that is a normal float32 (in "
                         f"[{_F32_MIN_NORMAL:.6g}, {_F32_INF_FROM:.6g})), got {softcap!r}")
    return scale, left, right


# The library's range for both (validate.cpp): |x| >= FLT_MIN = 2^-126 (the smallest normal; a
# double just below it rounds to a denormal or to it, so >= 2^-126 is the exact test), and float32
# rounding sends |x| >= 2^128 - 2^103 (half an ulp above the largest finite float32) to infinity.
# Plain float comparisons rather than a float32 round trip, so that torch.compile traces them.
_F32_MIN_NORMAL = 2.0 ** -126
_F32_INF_FROM = 2.0 ** 128 - 2.0 ** 103


def _normal_in_float32(x: float) -> bool:
    return _F32_MIN_NORMAL <= abs(x) < _F32_INF_FROM  # False for NaN too


def _check_tensors(**tensors) -> None:
    """Tensor arguments must be torch.Tensor (alibi_slopes may be None): anything else would fail
    deep inside with an AttributeError that names no argument."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor) and not (t is None and name in _OPTIONAL_TENSORS):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        # A sparse or mkldnn tensor has no strides to describe it: torch's own error named nothing.
        if t is not None and t.layout != torch.strided:
            raise ValueError(f"{name}: expected a dense (strided) tensor, got layout {str(t.layout).removeprefix('torch.')}")


_OPTIONAL_TENSORS = ("alibi_slopes", *_ops.DESCALE_NAMES)


def _check_no_grad_constants(alibi_slopes: Optional[Tensor], **descales: Optional[Tensor]) -> None:
    # The backward returns no gradient for the slopes (nor for FP8 descales, whose call has no
    # backward): refuse to train them rather than leave their .grad silently unset.
    for name, t in (("alibi_slopes", alibi_slopes), *descales.items()):
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{name}: gradients are not supported; pass a tensor with requires_grad=False")


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, return_lse: bool = False,
                    causal_align: str = "bottom_right", q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None,
                    v_descale: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Exact attention over a padded batch (flash-attn's flash_attn_func).

    Args:
        q: [batch, seqlen_q, num_heads, head_dim], float16, bfloat16 or float32, CPU or CUDA; or
            float8_e4m3fn on CUDA (sm_90) with head_dim 128 (the FP8 forward, see q_descale).
        k: [batch, seqlen_k, num_heads_k, head_dim], same dtype and device as q. num_heads must be a
            multiple of num_heads_k (GQA/MQA: query head h reads KV head h // (num_heads // num_heads_k)).
        v: [batch, seqlen_k, num_heads_k, head_dim_v]. head_dim and head_dim_v in 1..256.
        dropout_p: must be 0.0 (dropout is not implemented).
        softmax_scale: scale of q k^T; None means 1 / sqrt(head_dim).
        causal: hide keys after the query's diagonal (see causal_align).
        window_size: (left, right) sliding window in keys around the diagonal j = i + offset
            (offset = seqlen_k - seqlen_q with causal_align="bottom_right", 0 with "top_left"; see
            the module docstring); -1 is unbounded.
        softcap: > 0 applies softcap * tanh(S / softcap) to the scores (Gemma-2); 0 is off.
        alibi_slopes: float32 [num_heads] or [batch, num_heads]; adds -slope * |i + offset - j|
            (offset as for window_size).
            Constants: no gradient flows to them (requires_grad=True raises).
        deterministic: make the backward bitwise-repeatable (no atomics on the GPU).
        return_attn_probs: must be False (the probabilities are never materialized).
        return_lse: also return the log-sum-exp (keyword-only extension).
        causal_align: "bottom_right" (flash-attn >= 2.1; the last query sees the last key) or
            "top_left" (PyTorch's is_causal; query i sees keys <= i). It places the diagonal for
            window_size and alibi_slopes too, with or without causal. Keyword-only extension; the
            CLI's spellings "bottom-right" and "top-left" are accepted too.
        q_descale, k_descale, v_descale: FlashAttention-3's FP8 dequantization factors (Sec. 3.3),
            float8_e4m3fn inputs only: float32 tensors on q's device of shape (batch, num_heads_k)
            (any strides; query head h uses KV head h // (num_heads // num_heads_k)) or of one
            element (per tensor); None = 1. S = softmax_scale * (q_descale q)(k_descale k)^T,
            out = softmax(S) (v_descale v), with P rounded to e4m3 inside (FA-3's rounding: on the
            H200, out within ~1e-3 of float64 on the dequantized inputs at N(0, 1) inputs, lse a few
            1e-3). Values must be finite and > 0, and softmax_scale * q_descale * k_descale (and
            it / softcap when softcap is on) a normal float32 of magnitude <= FLT_MAX / log2(e): the
            kernel reads them (no host synchronization) and gives NaN in out and lse for every
            query head of a (batch, kv head) whose values are not. Keyword-only.

    Returns:
        out [batch, seqlen_q, num_heads, head_dim_v] in q's dtype (bfloat16 for float8_e4m3fn
        inputs, as FlashAttention-3); with return_lse=True the pair
        (out, lse) where lse is float32 [batch, num_heads, seqlen_q] (natural log; -inf for rows
        that see no key). Differentiable in q, k and v through out and lse (a gradient reaching lse
        costs one more backward pass); not in alibi_slopes.

    Raises:
        ValueError: for dropout_p != 0, return_attn_probs=True, a bad causal_align or window_size, a
            softmax_scale or softcap that is not a normal float32 (magnitude below 2^-126 or not
            finite; softcap=0 is off),
            alibi_slopes or descales that require grad (while grad mode is on), or a max_seqlen /
            window_size outside the int64 range.
        FlashAttnError (a ValueError): when the library rejects the call; the message names the
            argument, what was expected and what came (e.g. a dtype, shape or device mismatch;
            float8_e4m3fn on the CPU, with head_dim != 128 or with k / v of another dtype; descales
            with other inputs, not float32, of another shape or device).
        NotImplementedError: when a gradient reaches a float8_e4m3fn call (forward only).
    """
    scale, left, right = _check_common(dropout_p, softmax_scale, window_size, softcap, return_attn_probs,
                                       causal_align)
    _check_tensors(q=q, k=k, v=v, alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
                   v_descale=v_descale)
    _check_no_grad_constants(alibi_slopes, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    int_opts, float_opts = _ops.pack_options(0, 0, scale, causal, causal_align, left, right, softcap, deterministic)
    out, lse = _ops.attention(q, k, v, None, None, alibi_slopes, int_opts, float_opts, q_descale, k_descale,
                              v_descale)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, *, return_lse: bool = False,
                           causal_align: str = "bottom_right") -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Exact attention over a packed batch of variable-length sequences (flash-attn's flash_attn_varlen_func).

    Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1]
    of k and v; sequences never see each other, and masks/ALiBi use each sequence's own lengths.

    Args:
        q: [total_q, num_heads, head_dim], float16, bfloat16 or float32, CPU or CUDA.
        k: [total_k, num_heads_k, head_dim]; v: [total_k, num_heads_k, head_dim_v].
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] on q's device, prefix sums of the lengths
            (starting at 0, ending at total_q / total_k). Sequences may be empty.
        max_seqlen_q, max_seqlen_k: bounds on the longest sequence of each (0: none). On CUDA the
            library reads the actual longest lengths from cu_seqlens (one device sync) and sizes its
            grids and the backward's workspace by them; under CUDA graph capture it cannot, and uses
            these bounds (or the packed totals when 0), so pass them there.
        Other arguments as in flash_attn_func.

    Returns:
        out [total_q, num_heads, head_dim_v]; with return_lse=True also lse float32 [num_heads, total_q].

    Raises:
        ValueError / FlashAttnError as in flash_attn_func; FlashAttnError also for cu_seqlens that are
        not int32, not non-decreasing from 0, or do not end at total_q / total_k (checked on CPU).
    """
    scale, left, right = _check_common(dropout_p, softmax_scale, window_size, softcap, return_attn_probs,
                                       causal_align)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q, cu_seqlens_k: expected int32 tensors [batch + 1], got None")
    _check_tensors(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes)
    _check_no_grad_constants(alibi_slopes)
    int_opts, float_opts = _ops.pack_options(max_seqlen_q, max_seqlen_k, scale, causal, causal_align, left, right,
                                             softcap, deterministic)
    out, lse = _ops.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, int_opts, float_opts)
    return (out, lse) if return_lse else out


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *, return_lse: bool = False,
                              causal_align: str = "bottom_right", q_descale: Optional[Tensor] = None,
                              k_descale: Optional[Tensor] = None,
                              v_descale: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """flash_attn_func on qkv [batch, seqlen, 3, num_heads, head_dim] (q, k, v stacked on dim 2)."""
    _check_tensors(qkv=qkv)
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv: expected shape [batch, seqlen, 3, num_heads, head_dim], got {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, causal_align=causal_align,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *, return_lse: bool = False,
                             causal_align: str = "bottom_right", q_descale: Optional[Tensor] = None,
                             k_descale: Optional[Tensor] = None,
                             v_descale: Optional[Tensor] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """flash_attn_func on q and kv [batch, seqlen_k, 2, num_heads_k, head_dim] (k, v stacked on dim 2)."""
    _check_tensors(q=q, kv=kv)
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv: expected shape [batch, seqlen_k, 2, num_heads_k, head_dim], got {tuple(kv.shape)}")
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, causal_align=causal_align,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


__all__ = [
    "FlashAttnError",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
]

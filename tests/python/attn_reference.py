"""The float64 oracle for the Python tests, and the error criterion of the project's guide.

reference() computes attention with materialized scores in float64 on the CPU, through torch's
math scaled_dot_product_attention (attn_mask carrying the causal/window mask and ALiBi) whenever
it can express the call, and through the explicit formula otherwise (softcap, rows that see no
key, where SDPA returns NaN). Gradients come from autograd through it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Sequence

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True)
def fresh_seed():
    """Fresh random inputs every run (FLASHATTN_TEST_SEED repeats one); the seed is printed so that
    a failure can be replayed. Test modules import it to make it theirs."""
    seed = int(os.environ.get("FLASHATTN_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    torch.manual_seed(seed)
    print(f"FLASHATTN_TEST_SEED={seed}")
    yield


def rand(shape, dtype, device):
    """N(0, 1) drawn in float32 on the CPU (the same values on every device), as a leaf that wants grad."""
    return torch.randn(shape, dtype=torch.float32).to(dtype=dtype, device=device).requires_grad_()


@dataclass
class Case:
    """One attention call's options (the mask and score modifiers)."""

    causal: bool = False
    causal_align: str = "bottom_right"
    window_size: Sequence[int] = (-1, -1)
    softcap: float = 0.0
    softmax_scale: Optional[float] = None


def visible(len_q: int, len_k: int, case: Case, device="cpu") -> torch.Tensor:
    """Bool [len_q, len_k]: True where query i may see key j (flashattn.hpp's mask definition)."""
    offset = len_k - len_q if case.causal_align == "bottom_right" else 0
    i = torch.arange(len_q, device=device).unsqueeze(1)
    j = torch.arange(len_k, device=device).unsqueeze(0)
    left, right = case.window_size
    if case.causal:
        right = 0
    ok = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i + offset - left
    if right >= 0:
        ok &= j <= i + offset + right
    return ok


def alibi_bias(slopes_bh: torch.Tensor, len_q: int, len_k: int, case: Case) -> torch.Tensor:
    """[heads, len_q, len_k] bias -slope * |i + offset - j| for one sequence's slopes [heads]."""
    offset = len_k - len_q if case.causal_align == "bottom_right" else 0
    i = torch.arange(len_q, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(len_k, dtype=torch.float64).unsqueeze(0)
    return -slopes_bh.to(torch.float64).view(-1, 1, 1) * (i + offset - j).abs()


def attention_one(q, k, v, case: Case, slopes=None, use_sdpa=True):
    """Attention for one sequence: q [len_q, H, D], k [len_k, Hk, D], v [len_k, Hk, Dv] (any float dtype).

    Computes in the inputs' dtype (float64 for the oracle, the input precision for the naive
    baseline). Returns (out [len_q, H, Dv], lse [H, len_q] float64).
    """
    len_q, num_heads, head_dim = q.shape
    len_k, num_heads_k = k.shape[0], k.shape[1]
    group = num_heads // num_heads_k
    qh = q.transpose(0, 1)
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
    scale = case.softmax_scale if case.softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    mask = visible(len_q, len_k, case, q.device)
    bias = None
    if slopes is not None:
        bias = alibi_bias(slopes.cpu(), len_q, len_k, case).to(device=q.device, dtype=q.dtype)
    empty_rows = not bool(mask.any(dim=1).all()) if len_q > 0 else False

    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if case.softcap > 0:
        s = case.softcap * torch.tanh(s / case.softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.to(torch.float64), dim=-1)

    if use_sdpa and case.softcap == 0 and not empty_rows and len_q > 0 and len_k > 0:
        attn_mask = torch.zeros(len_q, len_k, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        if bias is not None:
            attn_mask = attn_mask + bias
        out = F.scaled_dot_product_attention(qh.unsqueeze(0), kh.unsqueeze(0), vh.unsqueeze(0),
                                             attn_mask=attn_mask, scale=scale).squeeze(0)
    else:
        m = s.amax(dim=-1, keepdim=True).detach() if len_k > 0 else torch.zeros_like(s[..., :1])
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        out = torch.matmul(p, vh) / torch.where(l > 0, l, torch.ones_like(l))
    return out.transpose(0, 1), lse


def reference(q, k, v, case: Case, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, dtype=torch.float64,
              use_sdpa=True):
    """Attention on batched ([B, S, H, D]) or varlen ([total, H, D]) inputs, computed in `dtype`.

    Returns (out, lse) in the library's layouts (lse float64 [B, H, Sq] or [H, total_q]).
    Differentiable through autograd in q, k, v (which keep their identity when already `dtype`).
    """
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    outs, lses = [], []
    if cu_seqlens_q is None:
        for b in range(q.shape[0]):
            slopes = None
            if alibi_slopes is not None:
                slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
            o, l = attention_one(qd[b], kd[b], vd[b], case, slopes, use_sdpa)
            outs.append(o)
            lses.append(l)
        return torch.stack(outs), torch.stack(lses)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        o, l = attention_one(qd[cq[b]:cq[b + 1]], kd[ck[b]:ck[b + 1]], vd[ck[b]:ck[b + 1]], case, slopes, use_sdpa)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


# Rounding floor per dtype: the error that two roundings of an O(1) value in that dtype can make.
FLOOR = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close_to_oracle(name: str, ours: torch.Tensor, oracle: torch.Tensor, naive: torch.Tensor, dtype):
    """The guide's criterion: max|ours - f64| <= 2 * max|naive - f64| + floor * max(1, max|f64|).

    For float32 the naive error is tiny, so this is close to a 1e-5-relative check. NaN never
    passes; infinities must match exactly (lse of rows that see no key is -inf).
    """
    ours = ours.detach().cpu().to(torch.float64)
    oracle = oracle.detach().cpu().to(torch.float64)
    naive = naive.detach().cpu().to(torch.float64)
    assert ours.shape == oracle.shape, f"{name}: shape {tuple(ours.shape)} != oracle {tuple(oracle.shape)}"
    assert not torch.isnan(ours).any(), f"{name}: NaN in result"
    inf = torch.isinf(oracle)
    assert torch.equal(torch.isinf(ours), inf), f"{name}: infinities differ from the oracle"
    assert torch.equal(ours[inf], oracle[inf]), f"{name}: infinities of the wrong sign"
    finite = ~inf
    if not finite.any():
        return
    err = (ours[finite] - oracle[finite]).abs().max().item()
    naive_err = (naive[finite] - oracle[finite]).abs().nan_to_num(0.0).max().item()
    scale = max(1.0, oracle[finite].abs().max().item())
    bound = 2.0 * naive_err + FLOOR[dtype] * scale
    assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g} (naive {dtype} error {naive_err:.3g})"

"""Gradients through the returned lse: d lse_i / d S_ij = P_ij, checked against the float64 oracle.

A loss that uses lse (alone or with out) must give the exact dq, dk, dv, never a silently dropped
term. CPU tensors (and CUDA ones when a GPU and the CUDA backend are present).
"""


import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from attn_reference import Case, assert_close_to_oracle, fresh_seed, rand, reference  # noqa: E402,F401

CUDA_OK = torch.cuda.is_available() and flashattn.cuda_available()
CUDA_SKIP = pytest.mark.skipif(not CUDA_OK, reason="no CUDA device, or flashattn built without its CUDA backend")
DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.float16, id="cpu-float16"),
    pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=CUDA_SKIP),
]


def loss_grads(out, lse, inputs, dout, dlse):
    """Gradients of sum(out * dout) + sum(lse * dlse) (either term may be absent: None)."""
    loss = 0
    if dout is not None:
        loss = loss + (out.double() * dout.to(out.device).double()).sum()
    if dlse is not None:
        loss = loss + (lse.double() * dlse.to(lse.device).double()).sum()
    gs = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, inputs)]


def check_against_oracle(q, k, v, case, use_out=True, alibi=None, cu_q=None, cu_k=None, max_q=0, max_k=0):
    dtype = q.dtype
    kwargs = dict(softmax_scale=case.softmax_scale, causal=case.causal, window_size=tuple(case.window_size),
                  softcap=case.softcap, alibi_slopes=alibi, return_lse=True, causal_align=case.causal_align)
    if cu_q is None:
        out, lse = flash_attn_func(q, k, v, **kwargs)
    else:
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    assert lse.requires_grad
    dout = torch.randn(out.shape).to(dtype) if use_out else None
    dlse = torch.randn(lse.shape)
    ours = loss_grads(out, lse, (q, k, v), dout, dlse)

    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    o64, l64 = reference(q64, k64, v64, case, cpu(alibi), cpu(cu_q), cpu(cu_k))
    oracle = loss_grads(o64, l64, (q64, k64, v64), dout, dlse)

    qn, kn, vn = (t.detach().cpu().clone().requires_grad_() for t in (q, k, v))
    on, ln = reference(qn, kn, vn, case, cpu(alibi), cpu(cu_q), cpu(cu_k), dtype=dtype, use_sdpa=False)
    naive = loss_grads(on, ln, (qn, kn, vn), dout, dlse)

    for name, a, b, c in zip(("dq", "dk", "dv"), ours, oracle, naive):
        assert_close_to_oracle(name, a, b, c, dtype)
    return ours


CASES = {
    "plain": Case(),
    "causal": Case(causal=True),
    "window_top_left": Case(causal=True, window_size=(5, -1), causal_align="top_left"),
    "softcap_scale": Case(softcap=2.0, softmax_scale=0.3),
}


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("use_out", [True, False], ids=["out_and_lse", "lse_only"])
def test_lse_gradient_batched(device, dtype, case_name, use_out):
    # GQA (4 query heads over 2 KV heads), seqlen_q < seqlen_k so that every row sees a key.
    q, k, v = rand((2, 19, 4, 32), dtype, device), rand((2, 27, 2, 32), dtype, device), \
        rand((2, 27, 2, 32), dtype, device)
    dq, dk, dv = check_against_oracle(q, k, v, CASES[case_name], use_out=use_out)
    if not use_out:
        assert torch.equal(dv, torch.zeros_like(dv))  # lse does not depend on v


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES[:1] + DEVICE_DTYPES[3:])
def test_lse_gradient_alibi(device, dtype):
    q, k, v = rand((2, 13, 3, 16), dtype, device), rand((2, 21, 3, 16), dtype, device), \
        rand((2, 21, 3, 16), dtype, device)
    slopes = (torch.rand(2, 3) * 0.4 + 0.1).to(device)
    check_against_oracle(q, k, v, Case(causal=True), alibi=slopes)


@pytest.mark.parametrize("device, dtype", DEVICE_DTYPES[:1] + DEVICE_DTYPES[3:])
def test_lse_gradient_varlen(device, dtype):
    lq, lk = [5, 17, 9], [9, 30, 9]
    cu_q = torch.tensor([0] + lq).cumsum(0).to(torch.int32).to(device)
    cu_k = torch.tensor([0] + lk).cumsum(0).to(torch.int32).to(device)
    q, k, v = rand((sum(lq), 4, 32), dtype, device), rand((sum(lk), 2, 32), dtype, device), \
        rand((sum(lk), 2, 32), dtype, device)
    check_against_oracle(q, k, v, Case(causal=True), cu_q=cu_q, cu_k=cu_k, max_q=max(lq), max_k=max(lk))


def test_lse_gradient_on_rows_that_see_no_key():
    # Bottom-right causal with seqlen_q > seqlen_k: the first 6 rows see no key (lse = -inf, P = 0),
    # so their dlse contributes nothing; the result must be finite and equal to the gradient with
    # those dlse zeroed.
    q, k, v = rand((1, 10, 2, 16), torch.float32, "cpu"), rand((1, 4, 2, 16), torch.float32, "cpu"), \
        rand((1, 4, 2, 16), torch.float32, "cpu")
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert torch.isneginf(lse[0, :, :6]).all()
    dout, dlse = torch.randn(out.shape), torch.randn(lse.shape)
    g_all = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), (q, k, v), retain_graph=True)
    dlse_visible = dlse.clone()
    dlse_visible[0, :, :6] = 0
    g_visible = torch.autograd.grad((out * dout).sum() + (lse.clamp_min(-1e30) * dlse_visible).sum(), (q, k, v))
    for a, b in zip(g_all, g_visible):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_lse_unused_costs_no_extra_pass(monkeypatch):
    # With return_lse=False (or lse not in the loss) the backward makes one library call, not two.
    from flashattn import _capi

    calls = []
    real = _capi.run_packed
    monkeypatch.setattr(_capi, "run_packed", lambda backward_pass, p: (calls.append(1) if backward_pass else None,
                                                                        real(backward_pass, p))[1])
    q, k, v = (rand((1, 8, 2, 16), torch.float32, "cpu") for _ in range(3))
    flash_attn_func(q, k, v).sum().backward()
    assert len(calls) == 1
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    out.sum().backward()
    assert len(calls) == 2
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    (out.sum() + lse.sum()).backward()
    assert len(calls) == 4


def test_lse_gradient_under_compile():
    torch._dynamo.reset()

    def f(q, k, v):
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out.square().sum() + lse.sum()

    q, k, v = (rand((1, 12, 2, 16), torch.float32, "cpu") for _ in range(3))
    g_eager = torch.autograd.grad(f(q, k, v), (q, k, v))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    g_c = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(g_c, g_eager):
        torch.testing.assert_close(a, b)

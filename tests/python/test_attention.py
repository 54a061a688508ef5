"""flash_attn_func / flash_attn_varlen_func against the float64 oracle: out, lse, dq, dk, dv.

Every case runs on CPU tensors, and on CUDA tensors when a GPU and the CUDA backend are present
(skipped visibly otherwise). Inputs are fresh random numbers each run; the seed is printed so a
failure can be replayed with FLASHATTN_TEST_SEED.
"""


import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from attn_reference import Case, assert_close_to_oracle, fresh_seed, rand, reference  # noqa: E402,F401

CUDA_OK = torch.cuda.is_available() and flashattn.cuda_available()
CUDA_SKIP = pytest.mark.skipif(not CUDA_OK, reason="no CUDA device, or flashattn built without its CUDA backend")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_SKIP)]
# The CUDA kernels take fp16/bf16 only (as flash-attn's); fp32 on CUDA must raise (test_errors.py).
DTYPES_BY_DEVICE = {"cpu": [torch.float32, torch.float16, torch.bfloat16], "cuda": [torch.float16, torch.bfloat16]}


def device_dtypes(dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    """(device, dtype) parameters: every dtype on CPU, the 16-bit ones on CUDA."""
    params = []
    for device in ("cpu", "cuda"):
        marks = [CUDA_SKIP] if device == "cuda" else []
        for dtype in dtypes:
            if dtype in DTYPES_BY_DEVICE[device]:
                params.append(pytest.param(device, dtype, marks=marks, id=f"{device}-{str(dtype)[6:]}"))
    return params


def default_dtype(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def grads(out, inputs, dout):
    gs = torch.autograd.grad(out, inputs, dout, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, inputs)]


def run_and_check(q, k, v, case, alibi=None, cu_q=None, cu_k=None, max_q=0, max_k=0, deterministic=False):
    """Runs ours forward and backward and checks out, lse, dq, dk, dv against the oracle."""
    dtype = q.dtype
    kwargs = dict(softmax_scale=case.softmax_scale, causal=case.causal, window_size=tuple(case.window_size),
                  softcap=case.softcap, alibi_slopes=alibi, deterministic=deterministic, return_lse=True,
                  causal_align=case.causal_align)
    try:
        if cu_q is None:
            out, lse = flash_attn_func(q, k, v, **kwargs)
        else:
            out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    except flashattn.FlashAttnError as e:
        # A documented limit of the CUDA kernels (their plan names it, e.g. head_dim multiples of 8)
        # is a visible skip; anything else is a failure.
        if q.device.type == "cuda" and "on cuda" in str(e):
            pytest.skip(f"the CUDA plan refuses this call: {e}")
        raise
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.device == q.device and lse.device == q.device
    dout = torch.randn(out.shape, dtype=torch.float32).to(dtype=dtype, device=q.device)
    ours = [out, lse] + grads(out, (q, k, v), dout)

    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    o64, l64 = reference(q64, k64, v64, case, cpu(alibi), cpu(cu_q), cpu(cu_k))
    oracle = [o64, l64] + grads(o64, (q64, k64, v64), dout.cpu().double())

    qn, kn, vn = (t.detach().clone().requires_grad_() for t in (q, k, v))
    on, ln = reference(qn, kn, vn, case, alibi, cu_q, cu_k, dtype=dtype, use_sdpa=False)
    naive = [on, ln] + grads(on, (qn, kn, vn), dout)

    for name, a, b, c in zip(("out", "lse", "dq", "dk", "dv"), ours, oracle, naive):
        assert_close_to_oracle(name, a, b, c, dtype)
    return ours


CASES = {
    "plain": Case(),
    "causal_bottom_right": Case(causal=True),
    "causal_top_left": Case(causal=True, causal_align="top_left"),
    "window": Case(window_size=(7, 3)),
    "window_causal_top_left": Case(causal=True, window_size=(5, -1), causal_align="top_left"),
    "window_left_only": Case(window_size=(4, -1)),
    "softcap": Case(softcap=3.0),
    "softcap_causal_scale": Case(causal=True, softcap=2.0, softmax_scale=0.3),
    "scale": Case(softmax_scale=0.05),
}


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("case_name", list(CASES))
def test_batched(device, dtype, case_name):
    b, sq, sk, h, hk, d = 2, 37, 53, 4, 2, 40
    q, k, v = rand((b, sq, h, d), dtype, device), rand((b, sk, hk, d), dtype, device), rand((b, sk, hk, d), dtype, device)
    run_and_check(q, k, v, CASES[case_name])


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes_h", "slopes_bh"])
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_alibi(device, dtype, per_batch, align):
    b, sq, sk, h, hk, d = 2, 29, 41, 4, 4, 32
    q, k, v = rand((b, sq, h, d), dtype, device), rand((b, sk, hk, d), dtype, device), rand((b, sk, hk, d), dtype, device)
    shape = (b, h) if per_batch else (h,)
    slopes = (torch.rand(shape) * 0.5 + 0.05).to(device)
    run_and_check(q, k, v, Case(causal=per_batch, causal_align=align), alibi=slopes)


# (batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, head_dim_v): lengths 1 and off tile
# multiples, seqlen_q > seqlen_k and the reverse, GQA with one KV head, odd head dims, head_dim_v != head_dim.
SHAPES = [
    (1, 1, 1, 1, 1, 8, 8),
    (2, 113, 203, 6, 1, 64, 64),
    (1, 65, 17, 2, 2, 96, 96),
    (1, 17, 65, 4, 2, 59, 59),
    (2, 33, 33, 2, 1, 32, 48),
    (1, 24, 40, 2, 2, 256, 256),
    (1, 33, 47, 2, 1, 24, 24),
    (1, 0, 12, 2, 2, 16, 16),
    (1, 12, 0, 2, 2, 16, 16),
]


@pytest.mark.parametrize("device, dtype", device_dtypes((torch.float32, torch.float16, torch.bfloat16)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_shapes(device, dtype, shape, causal):
    b, sq, sk, h, hk, d, dv = shape
    q, k, v = rand((b, sq, h, d), dtype, device), rand((b, sk, hk, d), dtype, device), rand((b, sk, hk, dv), dtype, device)
    run_and_check(q, k, v, Case(causal=causal))


@pytest.mark.parametrize("device", DEVICES)
def test_rows_that_see_no_key(device):
    # Bottom-right causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing,
    # get out = 0, lse = -inf and no gradient.
    dtype = default_dtype(device)
    q, k, v = rand((1, 10, 2, 16), dtype, device), rand((1, 4, 2, 16), dtype, device), rand((1, 4, 2, 16), dtype, device)
    out, lse, dq, dk, dv = run_and_check(q, k, v, Case(causal=True))
    assert torch.equal(out[0, :6], torch.zeros_like(out[0, :6]))
    assert torch.isneginf(lse[0, :, :6]).all() and torch.isfinite(lse[0, :, 6:]).all()
    assert torch.equal(dq[0, :6], torch.zeros_like(dq[0, :6]))


VARLEN = {
    # name: (lengths_q, lengths_k)
    "with_empty": ([5, 0, 17, 33], [9, 3, 0, 40]),
    "single": ([23], [23]),
    "q_longer": ([12, 30], [7, 30]),
}


@pytest.mark.parametrize("device, dtype", device_dtypes())
@pytest.mark.parametrize("lengths", list(VARLEN))
@pytest.mark.parametrize("case_name", ["plain", "causal_bottom_right", "causal_top_left", "window", "softcap"])
def test_varlen(device, dtype, lengths, case_name):
    lq, lk = VARLEN[lengths]
    h, hk, d = 4, 2, 32
    cu_q = torch.tensor([0] + lq, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    cu_k = torch.tensor([0] + lk, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    q, k, v = rand((sum(lq), h, d), dtype, device), rand((sum(lk), hk, d), dtype, device), \
        rand((sum(lk), hk, d), dtype, device)
    run_and_check(q, k, v, CASES[case_name], cu_q=cu_q, cu_k=cu_k, max_q=max(lq), max_k=max(lk))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_alibi(device):
    lq, lk = [6, 19, 0], [11, 19, 4]
    h, d = 3, 48
    cu_q = torch.tensor([0] + lq).cumsum(0).to(torch.int32).to(device)
    cu_k = torch.tensor([0] + lk).cumsum(0).to(torch.int32).to(device)
    q, k, v = (rand((sum(n), h, d), default_dtype(device), device) for n in (lq, lk, lk))
    slopes = (torch.rand(3, h) * 0.4 + 0.1).to(device)
    run_and_check(q, k, v, Case(causal=True), alibi=slopes, cu_q=cu_q, cu_k=cu_k, max_q=max(lq), max_k=max(lk))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_matches_batched(device):
    # Equal-length sequences, packed, give the batched call's results (to rounding).
    b, s, h, d = 3, 21, 2, 16
    q, k, v = (rand((b, s, h, d), default_dtype(device), device) for _ in range(3))
    out_b, lse_b = flash_attn_func(q, k, v, causal=True, return_lse=True)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=device)
    out_v, lse_v = flash_attn_varlen_func(q.reshape(b * s, h, d), k.reshape(b * s, h, d), v.reshape(b * s, h, d),
                                          cu, cu, s, s, causal=True, return_lse=True)
    tol = 1e-6 if device == "cpu" else 1e-2
    torch.testing.assert_close(out_v.reshape(b, s, h, d), out_b, rtol=tol, atol=tol)
    torch.testing.assert_close(lse_v, lse_b.permute(1, 0, 2).reshape(h, b * s), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_is_bitwise_repeatable(device):
    q, k, v = rand((2, 64, 4, 32), torch.bfloat16, device), rand((2, 80, 1, 32), torch.bfloat16, device), \
        rand((2, 80, 1, 32), torch.bfloat16, device)
    dout = torch.randn(2, 64, 4, 32).to(torch.bfloat16).to(device)
    runs = []
    for _ in range(3):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_and_packed_inputs(device):
    b, s, h, d = 2, 19, 3, 32
    qkv = torch.randn(b, s, 3, h, d).to(device=device, dtype=default_dtype(device)).requires_grad_()
    out_packed = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = qkv.unbind(2)  # strided views: the library reads them in place
    out_views = flash_attn_func(q, k, v, causal=True)
    out_copies = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out_packed, out_copies, rtol=0, atol=0)
    torch.testing.assert_close(out_views, out_copies, rtol=0, atol=0)
    # A last dimension that is not contiguous is copied first (as flash-attn does).
    qt = q.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
    assert qt.stride(-1) != 1
    torch.testing.assert_close(flash_attn_func(qt, k, v, causal=True), out_copies, rtol=0, atol=0)
    kv = torch.stack([k, v], dim=2)
    torch.testing.assert_close(flashattn.flash_attn_kvpacked_func(q, kv, causal=True), out_copies, rtol=0, atol=0)
    out_packed.sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


def test_lse_is_differentiable():
    # Its gradients are checked against the oracle in test_lse_grad.py.
    q, k, v = (rand((1, 8, 2, 16), torch.float32, "cpu") for _ in range(3))
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert out.requires_grad and lse.requires_grad


def test_causal_align_accepts_the_cli_spelling():
    q = rand((1, 9, 2, 16), torch.float32, "cpu")
    k, v = (rand((1, 14, 2, 16), torch.float32, "cpu") for _ in range(2))
    for underscore, hyphen in (("top_left", "top-left"), ("bottom_right", "bottom-right")):
        a = flash_attn_func(q, k, v, causal=True, causal_align=underscore)
        b = flash_attn_func(q, k, v, causal=True, causal_align=hyphen)
        assert torch.equal(a, b), hyphen
    assert not torch.equal(flash_attn_func(q, k, v, causal=True, causal_align="top-left"),
                           flash_attn_func(q, k, v, causal=True))


def test_default_returns_out_only():
    q, k, v = (rand((1, 8, 2, 16), torch.float32, "cpu") for _ in range(3))
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 8, 2, 16)


def test_every_element_written():
    # Through the C API with NaN-poisoned outputs: every element of out and lse must be written.
    from flashattn import _capi, _ops

    q, k, v = (torch.randn(2, 45, 3, 24) for _ in range(3))
    out = torch.full((2, 45, 3, 24), float("nan"))
    lse = torch.full((2, 3, 45), float("nan"))
    p = _capi.new_params()
    p.q, p.k, p.v = _ops._view(q, "q"), _ops._view(k, "k"), _ops._view(v, "v")
    p.out, p.lse = _ops._view(out, "out"), _ops._view(lse, "lse")
    p.causal = 1
    _capi.forward(p)
    assert not out.isnan().any() and not lse.isnan().any()
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    p.dout, p.dq, p.dk, p.dv = (_ops._view(t, n) for t, n in ((dout, "dout"), (dq, "dq"), (dk, "dk"), (dv, "dv")))
    _capi.backward(p)
    assert not dq.isnan().any() and not dk.isnan().any() and not dv.isnan().any()

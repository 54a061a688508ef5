"""The C API (include/flashattn/flashattn.h) through the package's ctypes bindings: enum checks cover
only the tensors the pass uses, as the C++ API reads only those."""

import pytest

torch = pytest.importorskip("torch")

from flashattn import FlashAttnError, _capi, _ops  # noqa: E402


def garbage_tensor(dtype=55, device=0):
    """An fa_tensor with an out-of-range dtype (or device) code, as stale memory could hold."""
    t = _capi.FaTensor()
    t.data = 0x10
    t.dtype, t.device, t.ndim = dtype, device, 4
    for i in range(4):
        t.shape[i], t.stride[i] = 1, 1
    return t


def forward_params():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    out, lse = torch.full((1, 8, 2, 16), float("nan")), torch.full((1, 2, 8), float("nan"))
    p = _capi.new_params()
    p.q, p.k, p.v = _ops._view(q, "q"), _ops._view(k, "k"), _ops._view(v, "v")
    p.out, p.lse = _ops._view(out, "out"), _ops._view(lse, "lse")
    return p, (q, k, v, out, lse)


@pytest.mark.parametrize("field", ["dout", "dq", "dk", "dv"])
@pytest.mark.parametrize("bad", [dict(dtype=55, device=0), dict(dtype=0, device=9)], ids=["dtype", "device"])
def test_forward_ignores_backward_tensors(field, bad):
    p, (q, k, v, out, lse) = forward_params()
    setattr(p, field, garbage_tensor(**bad))
    _capi.forward(p)
    assert not out.isnan().any() and not lse.isnan().any()
    assert _capi.plan(p, backward_pass=False)
    # The backward reads them, so there the same value is refused by name.
    what = "dtype code" if bad["dtype"] == 55 else "device code"
    with pytest.raises(FlashAttnError, match=f"{field}: expected {what}"):
        _capi.backward(p)
    with pytest.raises(FlashAttnError, match=f"{field}: expected {what}"):
        _capi.plan(p, backward_pass=True)


@pytest.mark.parametrize("field", ["q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "alibi_slopes",
                                   "q_descale", "k_descale", "v_descale"])
def test_forward_checks_its_tensors(field):
    p, tensors = forward_params()
    setattr(p, field, garbage_tensor(dtype=55))
    with pytest.raises(FlashAttnError, match=f"{field}: expected dtype code 0..4, got 55"):
        _capi.forward(p)
    with pytest.raises(FlashAttnError, match=f"{field}: expected dtype code 0..4, got 55"):
        _capi.plan(p, backward_pass=False)


@pytest.mark.parametrize("field", ["q_descale", "k_descale", "v_descale"])
def test_a_rank_0_descale_with_data_is_given(field):
    # ndim 0 with a data pointer is one value (per-tensor descale), so its codes are checked too.
    p, tensors = forward_params()
    t = garbage_tensor(dtype=55)
    t.ndim = 0
    setattr(p, field, t)
    with pytest.raises(FlashAttnError, match=f"{field}: expected dtype code 0..4, got 55"):
        _capi.plan(p, backward_pass=False)


def fp8_params(descale_shape=(1, 2)):
    """An e4m3 call on the CPU (validated, then refused by the CPU backend) with float32 descales."""
    e4m3 = torch.float8_e4m3fn
    q, k, v = (torch.randn(1, 8, 2, 128).to(e4m3) for _ in range(3))
    out, lse = torch.full((1, 8, 2, 128), float("nan"), dtype=torch.bfloat16), torch.full((1, 2, 8), float("nan"))
    descales = [torch.rand(descale_shape) + 0.5 for _ in range(3)]
    p = _capi.new_params()
    p.q, p.k, p.v = _ops._view(q, "q"), _ops._view(k, "k"), _ops._view(v, "v")
    p.out, p.lse = _ops._view(out, "out"), _ops._view(lse, "lse")
    p.q_descale, p.k_descale, p.v_descale = (_ops._view(d, n) for d, n in zip(descales, _ops.DESCALE_NAMES))
    return p, (q, k, v, out, lse, *descales)


@pytest.mark.parametrize("shape", [(1, 2), (1,), ()], ids=["per_head", "shape1", "rank0"])
def test_the_c_api_passes_e4m3_and_descales_on(shape):
    # Accepted by validation: the refusal is the CPU backend's, which comes last.
    p, tensors = fp8_params(shape)
    assert _capi.DTYPE_E4M3 == 4
    with pytest.raises(FlashAttnError, match="q: expected a CUDA tensor for e4m3"):
        _capi.plan(p, backward_pass=False)
    with pytest.raises(FlashAttnError, match="q: expected a CUDA tensor for e4m3"):
        _capi.forward(p)
    assert tensors[3].isnan().all() and tensors[4].isnan().all()  # nothing written


def test_the_c_api_checks_descale_shapes_and_dtypes():
    p, tensors = fp8_params((1, 3))
    with pytest.raises(FlashAttnError, match=r"q_descale: expected shape\[1\] \(num_heads_k\) = 2 \(from k\), got 3"):
        _capi.plan(p, backward_pass=False)
    p, tensors = fp8_params()
    p.k_descale = _ops._view(torch.ones(1, 2, dtype=torch.float16), "k")
    with pytest.raises(FlashAttnError, match=r"k_descale: expected dtype fp32 \(float32 dequantization factors\), "
                                             "got fp16"):
        _capi.plan(p, backward_pass=False)
    p, tensors = forward_params()  # fp32 inputs
    d = torch.ones(())
    p.v_descale = _ops._view(d, "v_descale")
    with pytest.raises(FlashAttnError, match="v_descale: expected none .*got a tensor with q in fp32"):
        _capi.plan(p, backward_pass=False)


def test_backward_still_runs_with_valid_tensors():
    p, (q, k, v, out, lse) = forward_params()
    _capi.forward(p)
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    p.dout, p.dq, p.dk, p.dv = (_ops._view(t, n) for t, n in ((dout, "dout"), (dq, "dq"), (dk, "dk"), (dv, "dv")))
    _capi.backward(p)
    assert not dq.isnan().any() and not dk.isnan().any() and not dv.isnan().any()


@pytest.mark.parametrize("field", ["causal", "deterministic"])
@pytest.mark.parametrize("value", [2, -1])
def test_the_c_api_flags_are_0_or_1(field, value):
    # flashattn.h documents both as 0 or 1: another value (stale memory, a C bool mixed up with an
    # enum) is refused by name rather than read as true.
    p, (q, k, v, out, lse) = forward_params()
    setattr(p, field, value)
    for run in (_capi.forward, lambda params: _capi.plan(params, backward_pass=False)):
        with pytest.raises(FlashAttnError, match=f"{field}: expected 0 or 1, got {value}"):
            run(p)
    assert out.isnan().all()

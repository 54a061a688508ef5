"""torch.library integration: opcheck on flashattn::fwd / bwd, and torch.compile(fullgraph=True)."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from flashattn._ops import pack_options  # noqa: E402
from attn_reference import rand  # noqa: E402

CUDA_OK = torch.cuda.is_available() and flashattn.cuda_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA_OK, reason="no CUDA device, or flashattn built without its CUDA backend"))]


def fwd_args(device, dtype=None, varlen=False, alibi=False, causal=True, align="bottom_right",
             softcap=0.0, requires_grad=True):
    h, hk, d = 4, 2, 32
    # The CUDA kernels take fp16/bf16 only.
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    if varlen:
        cu_q = torch.tensor([0, 5, 5, 22], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, 9, 12, 30], dtype=torch.int32, device=device)
        q, k, v = torch.randn(22, h, d), torch.randn(30, hk, d), torch.randn(30, hk, d)
        lens = (17, 18)
    else:
        cu_q = cu_k = None
        q, k, v = torch.randn(2, 13, h, d), torch.randn(2, 21, hk, d), torch.randn(2, 21, hk, d)
        lens = (0, 0)
    q, k, v = (t.to(dtype=dtype, device=device).requires_grad_(requires_grad) for t in (q, k, v))
    slopes = (torch.rand(h) * 0.3 + 0.1).to(device) if alibi else None
    int_opts, float_opts = pack_options(lens[0], lens[1], 0.0, causal, align, -1, -1, softcap, False)
    return (q, k, v, cu_q, cu_k, slopes, int_opts, float_opts)


OPCHECK_CASES = {
    "batched_causal": dict(),
    "batched_top_left_softcap": dict(align="top_left", softcap=4.0),
    "batched_alibi_bf16": dict(alibi=True, dtype=torch.bfloat16),
    "varlen": dict(varlen=True),
    "varlen_full": dict(varlen=True, causal=False),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck_fwd(device, case):
    args = fwd_args(device, **OPCHECK_CASES[case])
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck_bwd(device, case):
    args = fwd_args(device, requires_grad=False, **OPCHECK_CASES[case])
    q, k, v, cu_q, cu_k, slopes, int_opts, float_opts = args
    out, lse = torch.ops.flashattn.fwd(*args)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (dout, q, k, v, out, lse, cu_q, cu_k, slopes, int_opts, float_opts))
    # With the gradient of lse, alone and with dout's.
    dlse = torch.randn_like(lse)
    for d in (dout, None):
        torch.library.opcheck(torch.ops.flashattn.bwd.default,
                              (d, q, k, v, out, lse, cu_q, cu_k, slopes, int_opts, float_opts, dlse))


def attention_block(x, w_qkv, w_o, num_heads):
    b, s, dim = x.shape
    q, k, v = (x @ w_qkv).view(b, s, 3, num_heads, dim // num_heads).unbind(2)
    y = flash_attn_func(q, k, v, causal=True)
    return (y.reshape(b, s, dim) @ w_o).square().mean()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_backward(device, backend):
    if backend == "inductor" and device == "cpu":
        pytest.importorskip("torch._inductor")
    torch._dynamo.reset()
    dim, heads = 64, 4
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    x = torch.randn(2, 24, dim).to(device, dtype)
    w_qkv = (torch.randn(dim, 3 * dim) / dim ** 0.5).to(device, dtype).requires_grad_()
    w_o = (torch.randn(dim, dim) / dim ** 0.5).to(device, dtype).requires_grad_()
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-3)

    loss_eager = attention_block(x, w_qkv, w_o, heads)
    g_eager = torch.autograd.grad(loss_eager, (w_qkv, w_o))

    compiled = torch.compile(attention_block, fullgraph=True, backend=backend)
    loss_c = compiled(x, w_qkv, w_o, heads)
    g_c = torch.autograd.grad(loss_c, (w_qkv, w_o))
    torch.testing.assert_close(loss_c, loss_eager, **tol)
    for a, b in zip(g_c, g_eager):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_varlen_and_lse_no_graph_break(device):
    torch._dynamo.reset()

    def f(q, k, v, cu_q, cu_k):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 18, causal=True, window_size=(6, -1),
                                          causal_align="top_left", return_lse=True)
        return out.sum() + lse.clamp_min(-1e4).sum()

    q, k, v, cu_q, cu_k = fwd_args(device, varlen=True)[:5]
    explain = torch._dynamo.explain(f)(q, k, v, cu_q, cu_k)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, cu_q, cu_k), f(q, k, v, cu_q, cu_k))


def test_compile_dynamic_shapes_forward_backward():
    torch._dynamo.reset()

    def f(q, k, v):
        return flash_attn_func(q, k, v, causal=True).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for s in (9, 17, 33):
        q, k, v = (torch.randn(1, s, 2, 16, requires_grad=True) for _ in range(3))
        loss_c = compiled(q, k, v)
        g_c = torch.autograd.grad(loss_c, (q, k, v))
        loss_e = f(q, k, v)
        g_e = torch.autograd.grad(loss_e, (q, k, v))
        torch.testing.assert_close(loss_c, loss_e)
        for a, b in zip(g_c, g_e):
            torch.testing.assert_close(a, b)


# Eager calls on plain tensors take _ops._EagerAttention (the same implementations without
# torch.library's per-call dispatch, which cost 100-350 us of host time per call); everything
# that must see the operator takes flashattn::fwd. Both must compute the same bits.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["batched_causal", "varlen", "batched_alibi_bf16"])
def test_eager_path_matches_the_registered_op(device, case):
    from flashattn import _ops

    args = fwd_args(device, **OPCHECK_CASES[case])
    q, k, v = args[:3]
    assert _ops.use_eager(q, k, v)
    results = []
    for call in (_ops._EagerAttention.apply, torch.ops.flashattn.fwd.default):
        out, lse = call(*args)
        dout, dlse = torch.ones_like(out), torch.ones_like(lse)
        finite = torch.isfinite(lse)  # rows that see no key have lse = -inf: no gradient through them
        grads = torch.autograd.grad((out * dout).sum() + lse[finite].sum(), (q, k, v))
        results.append((out, lse, *grads))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.fixture
def fast_path_taken(monkeypatch):
    """A list that gets, per eager backward that asks _ops._bwd_fast, whether it took the call."""
    from flashattn import _ops

    taken = []
    fast = _ops._bwd_fast

    def recorded(ctx, dout):
        grads = fast(ctx, dout)
        taken.append(grads is not None)
        return grads

    monkeypatch.setattr(_ops, "_bwd_fast", recorded)
    return taken


# The eager backward reuses the forward's parameter values (_ops._bwd_fast) when dout is contiguous
# and lse unused; it must give the general path's bits, and step aside for anything else.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["batched_causal", "varlen", "batched_alibi_bf16", "packed_qkv",
                                  "strided_dout", "with_lse"])
def test_eager_backward_fast_path_matches_the_general_path(device, case, fast_path_taken):
    from flashattn import _ops

    taken = fast_path_taken
    args = list(fwd_args(device, **OPCHECK_CASES.get(case, {})))
    if case == "packed_qkv":  # q, k, v strided views of one [batch, seqlen, 3, heads, head_dim] tensor
        q = args[0]
        qkv = torch.stack([t.detach() for t in (q, q * 0.5, q * 0.25)], dim=2).requires_grad_()
        args[:3] = qkv.unbind(2)
    leaves = [qkv] if case == "packed_qkv" else list(args[:3])
    out_shape = (*args[0].shape[:-1], args[2].shape[-1])
    dout = rand(out_shape, args[0].dtype, device).detach()
    if case == "strided_dout":
        dout = dout.transpose(0, 1).contiguous().transpose(0, 1)
    results = []
    for call in (_ops._EagerAttention.apply, torch.ops.flashattn.fwd.default):
        out, lse = call(*args)
        loss = (out * dout).sum() + (lse[torch.isfinite(lse)].sum() if case == "with_lse" else 0)
        results.append((out, *torch.autograd.grad(loss, leaves)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    # with_lse never asks it (the general path adds the lse term); strided_dout asks and is sent on.
    assert taken == {"with_lse": [], "strided_dout": [False]}.get(case, [True])


# Saved-tensor hooks may hand the backward copies with other strides (save_on_cpu copies views
# densely), and `x.data = ...` swaps a saved tensor's storage and shape without a version bump: the
# fast path must notice (it reused the forward's layouts: wrong gradients, reads out of bounds).
def test_eager_backward_fast_path_checks_the_saved_layouts(fast_path_taken):
    taken = fast_path_taken
    qkv = rand((2, 9, 3, 2, 16), torch.float32, "cpu")
    dout = rand((2, 9, 2, 16), torch.float32, "cpu").detach()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        out = flash_attn_func(*qkv.unbind(2), causal=True)
    (hooked,) = torch.autograd.grad(out, qkv, dout)
    (plain,) = torch.autograd.grad(flash_attn_func(*qkv.unbind(2), causal=True), qkv, dout)
    assert taken == [False, True]
    assert torch.equal(hooked, plain)

    q, k, v = (rand((2, 12, 2, 8), torch.float32, "cpu") for _ in range(3))
    out = flash_attn_func(q, k, v)
    q.data = torch.randn(1, 1, 1, 1)
    with pytest.raises(flashattn.FlashAttnError, match="expected shape"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def test_negative_bit_tensors_are_read_with_their_sign():
    # x.conj().imag of a complex x is a lazily negated view: the library reads raw memory, so the
    # wrappers must materialize it (the sign was lost before).
    z = [torch.randn(2, 5, 2, 1, dtype=torch.cfloat) for _ in range(3)]
    q, k, v = (t.conj().imag for t in z)
    assert q.is_neg()
    dense = [t.resolve_neg().clone().requires_grad_() for t in (q, k, v)]
    expected = flash_attn_func(*dense, causal=True)
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True), expected, rtol=0, atol=0)
    dout = torch.randn(2, 5, 2, 1, dtype=torch.cfloat).conj().imag
    grads = torch.autograd.grad(expected, dense, dout)
    leaves = [t.clone().requires_grad_() for t in dense]
    got = torch.autograd.grad(flash_attn_func(*leaves, causal=True), leaves, dout)
    for a, b in zip(got, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_modes_and_fake_tensors_see_the_operator():
    from torch.utils._python_dispatch import TorchDispatchMode

    from flashattn import _ops

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = fwd_args("cpu")[:3]
    with Recorder() as rec:
        assert not _ops.use_eager(q, k, v)
        flash_attn_func(q, k, v, causal=True)
    assert "flashattn.fwd.default" in rec.ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert not _ops.use_eager(fq, fk, fv)
        assert flash_attn_func(fq, fk, fv).shape == q.shape


def test_direct_op_calls_with_out_of_range_options_fail_by_name():
    q, k, v, cu_q, cu_k, slopes, int_opts, float_opts = fwd_args("cpu", requires_grad=False)
    # A double beyond float32's range becomes inf, as C's conversion makes it, and is refused by name.
    with pytest.raises(flashattn.FlashAttnError, match="softmax_scale"):
        torch.ops.flashattn.fwd(q, k, v, cu_q, cu_k, slopes, int_opts, [1e39, 0.0])
    bad = list(int_opts)
    bad[2] = 1 << 40  # causal travels as an int32 flag
    with pytest.raises(flashattn.FlashAttnError, match="int_opts: expected"):
        torch.ops.flashattn.fwd(q, k, v, cu_q, cu_k, slopes, bad, float_opts)

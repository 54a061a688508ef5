"""Bad calls raise a clear error naming the argument; nothing is silently ignored."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import (FlashAttnError, flash_attn_func, flash_attn_kvpacked_func,  # noqa: E402
                       flash_attn_qkvpacked_func, flash_attn_varlen_func)


def qkv(b=1, s=8, h=2, hk=2, d=16, dtype=torch.float32):
    return torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, hk, d, dtype=dtype), \
        torch.randn(b, s, hk, d, dtype=dtype)


def test_error_type_is_value_error():
    assert issubclass(FlashAttnError, ValueError)


@pytest.mark.parametrize("kwargs, match", [
    (dict(dropout_p=0.1), "dropout_p"),
    # Found by review: a tensor of two zeros gave torch's "ambiguous" error, naming nothing.
    (dict(dropout_p=torch.zeros(2)), r"dropout_p: expected a number \(0\.0\), got a tensor of shape \(2,\)"),
    (dict(return_attn_probs=True), "return_attn_probs"),
    (dict(causal_align="bottom"), "causal_align"),
    (dict(window_size=(1, 2, 3)), "window_size"),
    (dict(softmax_scale=0.0), "softmax_scale"),
    (dict(softcap=-1.0), "softcap"),
    # float32 is what the library takes, where 0 means "default": values that round to 0 or to
    # infinity there must not pass silently.
    (dict(softmax_scale=1e-50), "softmax_scale"),
    (dict(softmax_scale=-1e-46), "softmax_scale"),
    # Denormal in float32: the message speaks of None and the normal range (the library's own
    # message, which this used to reach, offered 0, which Python refuses).
    (dict(softmax_scale=1e-40), r"softmax_scale: expected None \(= 1/sqrt\(head_dim\)\) or a value that is a "
                                r"normal float32 \(magnitude in \[1\.17549e-38, 3\.40282e\+38\)\), got 1e-40"),
    (dict(softcap=1e-40), "softcap: expected 0 .off. or a value that is a normal float32"),
    # Fixed bug: each fine alone, their ratio below FLT_MIN gave NaN dk on the CPU.
    (dict(softmax_scale=1e-8, softcap=1e38), r"softcap: expected \|softmax_scale / softcap\| >= 1\.1754944e-38"),
    (dict(softcap=3.4e38), r"softcap = 0 turns capping off\), got softmax_scale = 0\.25 and softcap = 3\.4e\+38"),
    (dict(softmax_scale=1e39), "softmax_scale"),
    (dict(softmax_scale=float("inf")), "softmax_scale"),
    (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(softcap=1e-50), "softcap"),
    (dict(softcap=1e39), "softcap"),
    (dict(softcap=float("inf")), "softcap"),
    (dict(softcap=float("nan")), "softcap"),
    # Python ints beyond int64 must name the argument, not torch's int_opts schema list.
    (dict(window_size=(2 ** 64 - 1, 0)), "window_size"),
    (dict(window_size=(-1, -2 ** 63 - 1)), "window_size"),
    # Fixed (session 34): bool() of these is True, so they silently turned the flag on.
    (dict(causal="false"), r"causal: expected True or False, got 'false'"),
    (dict(causal=2), r"causal: expected True or False, got 2"),
    (dict(causal=torch.tensor([0, 1])), r"causal: expected True or False"),
    (dict(deterministic="no"), r"deterministic: expected True or False, got 'no'"),
])
def test_unsupported_python_arguments(kwargs, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        flash_attn_func(q, k, v, **kwargs)


@pytest.mark.parametrize("make, match", [
    (lambda: (*qkv()[:1], *qkv(dtype=torch.bfloat16)[1:]), "k: expected dtype"),
    (lambda: qkv(dtype=torch.float64), "q: expected dtype"),
    (lambda: qkv(h=4, hk=3), "num_heads_k"),
    (lambda: qkv(d=300), "head_dim"),
    (lambda: (torch.randn(8, 2, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16)), "q: expected rank 4"),
    (lambda: (torch.randn(1, 8, 2, 16), torch.randn(1, 9, 2, 16), torch.randn(1, 8, 2, 16)),
     # The whole message, int64s included: a static C++ runtime mixed with PyTorch's formatted them
     # as nothing (or crashed) until python/exports.map kept it private.
     r"v: expected shape\[1\] \(seqlen_k\) = 9 \(from k\), got 8 in shape \[1, 8, 2, 16\]$"),
    (lambda: (torch.randn(2, 8, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)),
     r"k: expected shape\[0\] \(batch\) = 2 \(from q\), got 1 in shape \[1, 8, 2, 16\]$"),
])
def test_library_rejects_bad_tensors(make, match):
    q, k, v = make()
    with pytest.raises(FlashAttnError, match=match):
        flash_attn_func(q, k, v)


def test_an_unloadable_library_is_an_import_error_naming_its_path(tmp_path):
    # Fixed bug: a FLASHATTN_LIBRARY that is not a shared library gave the loader's bare OSError.
    import os
    import subprocess
    import sys

    bad = tmp_path / "libflashattn.so"
    bad.write_text("not a library")
    # The subprocess imports the package this process runs (the checkout's or the installed one).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(flashattn.__file__)))
    env = dict(os.environ, FLASHATTN_LIBRARY=str(bad),
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    code = "import flashattn._capi as c\ntry:\n    c.lib()\nexcept ImportError as e:\n    print(e)\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert f"expected a loadable libflashattn.so at {bad} (from FLASHATTN_LIBRARY)" in r.stdout, r.stdout + r.stderr


def test_the_shared_library_exports_the_c_api_only():
    # python/exports.map: a C++ symbol of the core (flashattn::forward) must not be visible, so that
    # nothing of the library (nor of a C++ runtime linked into it) mixes with other copies in the process.
    lib = flashattn._capi.lib()
    assert hasattr(lib, "fa_forward")
    assert not hasattr(lib, "_ZN9flashattn7forwardERKNS_15AttentionParamsE")


def test_causal_with_right_window():
    q, k, v = qkv()
    with pytest.raises(FlashAttnError, match="window_size_right"):
        flash_attn_func(q, k, v, causal=True, window_size=(-1, 2))


def test_window_below_minus_one():
    q, k, v = qkv()
    with pytest.raises(FlashAttnError, match="window_size_left"):
        flash_attn_func(q, k, v, window_size=(-2, -1))


def test_float32_normal_extremes_are_accepted():
    q, k, v = qkv()
    for scale in (2.0 ** -126, -(2.0 ** -126), 3.4e38):
        assert flash_attn_func(q, k, v, softmax_scale=scale).shape == q.shape
    # softcap and softmax_scale are each checked alone, and their ratio, which scales the scores
    # before tanh, must be a normal float32 too: 3.4e38 with the default scale (1/4) is refused
    # (test_unsupported_python_arguments), with a scale of 1e4 it is not.
    for cap, scale in ((1e-30, None), (3.4e38, 1e4)):
        assert torch.isfinite(flash_attn_func(q, k, v, softcap=cap, softmax_scale=scale)).all()


def test_denormal_softmax_scale_is_not_the_default():
    # 2^-149 survives float32 (as a denormal): the library either runs with it or refuses it by
    # name, but never treats it as 0 (= 1/sqrt(head_dim)).
    q, k, v = qkv()
    try:
        out = flash_attn_func(q, k, v, softmax_scale=2.0 ** -149)
    except ValueError as e:
        assert str(e).startswith("softmax_scale:"), str(e)
        return
    assert not torch.allclose(out, flash_attn_func(q, k, v))


def test_varlen_max_seqlen_beyond_int64():
    q, k, v = varlen_inputs()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, cu, cu, 2 ** 64 + 3, 10)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flash_attn_varlen_func(q, k, v, cu, cu, 10, -2 ** 63 - 1)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this PyTorch has no float8_e4m3fn")
@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_fp8_descales_requiring_grad_are_refused(name):
    # The FP8 call has no backward: a trainable descale would silently get no .grad.
    q, k, v = (torch.randn(1, 3, 2, 128).to(torch.float8_e4m3fn) for _ in range(3))
    with pytest.raises(ValueError, match=f"{name}: gradients are not supported"):
        flash_attn_func(q, k, v, **{name: torch.ones(1, requires_grad=True)})


def test_packed_forms_pass_the_fp8_descales_on():
    # The packed forms take the same keywords (the library then refuses e4m3 on the CPU by name).
    qkv = torch.randn(1, 3, 3, 2, 128).to(torch.float8_e4m3fn)
    with pytest.raises(FlashAttnError, match="q: expected a CUDA tensor for e4m3"):
        flash_attn_qkvpacked_func(qkv, q_descale=torch.ones(1))
    with pytest.raises(FlashAttnError, match="q: expected a CUDA tensor for e4m3"):
        flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], v_descale=torch.ones(1))


def test_alibi_slopes_requiring_grad_are_refused():
    q, k, v = qkv()
    slopes = torch.full((2,), 0.25, requires_grad=True)
    with pytest.raises(ValueError, match="alibi_slopes: gradients are not supported"):
        flash_attn_func(q, k, v, alibi_slopes=slopes)
    q, k, v = varlen_inputs()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="alibi_slopes: gradients are not supported"):
        flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, alibi_slopes=slopes)
    # Without grad mode nothing would be trained, so it runs (inference with a learned table).
    with torch.no_grad():
        out = flash_attn_func(*qkv(), alibi_slopes=slopes)
    assert torch.isfinite(out).all()
    out = flash_attn_func(*qkv(), alibi_slopes=slopes.detach())
    assert torch.isfinite(out).all()


def test_non_contiguous_small_tensors_are_copied():
    # cu_seqlens and alibi_slopes are taken like q, k, v: strided ones are made contiguous, not refused.
    q, k, v = (torch.randn(10, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 0, 4, 4, 10, 10], dtype=torch.int32)
    slopes_table = torch.rand(3, 4) * 0.5
    slopes = slopes_table[:, 1]  # stride 4
    assert not cu[::2].is_contiguous() and not slopes[:2].is_contiguous()
    ours = flash_attn_varlen_func(q, k, v, cu[::2], cu[::2], 6, 6, causal=True, alibi_slopes=slopes[:2])
    ref = flash_attn_varlen_func(q, k, v, cu[::2].contiguous(), cu[::2].contiguous(), 6, 6, causal=True,
                                 alibi_slopes=slopes[:2].contiguous())
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    # Per-batch [batch, num_heads] slopes transposed out of a [num_heads, batch] table.
    qb, kb, vb = (torch.randn(3, 8, 2, 16) for _ in range(3))
    table = torch.rand(2, 3) * 0.5
    ours = flash_attn_func(qb, kb, vb, alibi_slopes=table.t())
    ref = flash_attn_func(qb, kb, vb, alibi_slopes=table.t().contiguous())
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


@pytest.mark.parametrize("slopes, match", [
    (torch.ones(3), "alibi_slopes"),
    (torch.ones(2, dtype=torch.float16), "alibi_slopes: expected dtype float32, got float16"),
    (torch.ones(2, dtype=torch.float64), "alibi_slopes: expected dtype float32, got float64"),
])
def test_bad_alibi_slopes(slopes, match):
    q, k, v = qkv()
    with pytest.raises(FlashAttnError, match=match):
        flash_attn_func(q, k, v, alibi_slopes=slopes)


def varlen_inputs():
    q, k, v = (torch.randn(10, 2, 16) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("cu_q, match", [
    (torch.tensor([0, 4, 10], dtype=torch.int64), "cu_seqlens_q: expected dtype int32, got int64"),
    (torch.tensor([0, 4, 10], dtype=torch.float64), "cu_seqlens_q: expected dtype int32, got float64"),
    (torch.tensor([0, 4, 9], dtype=torch.int32), "cu_seqlens_q: expected last element"),
    (torch.tensor([1, 4, 10], dtype=torch.int32), "cu_seqlens_q: expected element 0"),
    (torch.tensor([0, 6, 4, 10], dtype=torch.int32), "cu_seqlens"),
])
def test_bad_cu_seqlens(cu_q, match):
    q, k, v = varlen_inputs()
    cu_k = torch.tensor([0, 5, 10], dtype=torch.int32)
    with pytest.raises(FlashAttnError, match=match):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 10, 10)


def test_max_seqlen_too_small():
    q, k, v = varlen_inputs()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(FlashAttnError, match="max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, cu, cu, 3, 6)


def test_varlen_needs_cu_seqlens():
    q, k, v = varlen_inputs()
    with pytest.raises(ValueError, match="cu_seqlens"):
        flash_attn_varlen_func(q, k, v, None, None, 10, 10)


@pytest.mark.skipif(not (torch.cuda.is_available() and flashattn.cuda_available()),
                    reason="no CUDA device, or flashattn built without its CUDA backend")
def test_mixed_devices():
    q, k, v = qkv()
    with pytest.raises(FlashAttnError, match="same as q"):
        flash_attn_func(q.cuda(), k, v.cuda())


def test_no_output_written_on_error():
    # The op allocates its outputs, so a failed call returns nothing; the C API promises not to
    # write into given outputs either: check through it with a sentinel-filled out.
    from flashattn import _capi, _ops

    q, k, v = qkv(h=4, hk=3)
    out = torch.full((1, 8, 4, 16), 7.0)
    p = _capi.new_params()
    p.q, p.k, p.v, p.out = (_ops._view(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")))
    with pytest.raises(FlashAttnError, match="num_heads_k"):
        _capi.forward(p)
    assert torch.equal(out, torch.full_like(out, 7.0))


@pytest.mark.skipif(not (torch.cuda.is_available() and flashattn.cuda_available()),
                    reason="no CUDA device, or flashattn built without its CUDA backend")
def test_fp32_on_cuda_runs_or_names_the_limit():
    # The CUDA kernels take fp16/bf16 (as flash-attn's); a plan that refuses fp32 must say so by name.
    q, k, v = (t.cuda() for t in qkv())
    try:
        out = flash_attn_func(q, k, v, causal=True)
    except FlashAttnError as e:
        assert str(e).startswith("q:") and "fp32" in str(e), str(e)
        return
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


# Found by a bad-input review of the eager path (session 8): each was a silent wrong answer, an
# error naming no argument, or a failure on valid input.
def test_double_backward_raises_instead_of_dropping_second_order_terms():
    q = torch.randn(1, 3, 1, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="double backward is not supported"):
        torch.autograd.grad(flash_attn_func(q, q, q).sum(), q, create_graph=True)


def test_forward_mode_ad_raises_instead_of_a_zero_tangent():
    q = torch.randn(1, 3, 1, 8)
    with pytest.raises(NotImplementedError):
        torch.func.jvp(lambda x: flash_attn_func(x, x, x), (q,), (torch.ones_like(q),))


def test_func_grad_raises_naming_flashattn_and_the_way_out():
    # Found by a bad-input helper (session 30): PyTorch's own error about setup_context came instead.
    q = torch.randn(1, 3, 1, 8)
    with pytest.raises(NotImplementedError, match="flashattn: torch.func.grad.*torch.autograd.grad"):
        torch.func.grad(lambda x: flash_attn_func(x, x, x).sum())(q)


def test_backward_takes_an_lse_whose_last_dimension_is_strided():
    # Found by a bad-input helper (session 30): q, k, v, out, dout were copied, lse was refused.
    q = torch.randn(2, 5, 4, 8)
    opts = ([0, 0, 0, 0, -1, -1, 0], [0.0, 0.0])
    out, lse = torch.ops.flashattn.fwd(q, q, q, None, None, None, *opts)
    strided = torch.empty(2, 4, 5, 2)[..., 0]
    strided.copy_(lse)
    dout = torch.randn_like(out)
    want = torch.ops.flashattn.bwd(dout, q, q, q, out, lse, None, None, None, *opts)
    got = torch.ops.flashattn.bwd(dout, q, q, q, out, strided, None, None, None, *opts)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), name


def test_dual_tensor_without_requires_grad_raises_instead_of_dropping_the_tangent():
    # Found by review: the no-grad fast path returned before the forward-mode check, so the
    # output of a dual q (no requires_grad) had no tangent and no error was raised.
    from torch.autograd import forward_ad
    q, k, v = (torch.randn(1, 3, 1, 8) for _ in range(3))
    with forward_ad.dual_level():
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            flash_attn_func(forward_ad.make_dual(q, torch.randn_like(q)), k, v)


def test_backward_of_an_empty_query_gives_zero_gradients():
    q = torch.randn(1, 0, 2, 8, requires_grad=True)
    k = torch.randn(1, 3, 2, 8, requires_grad=True)
    v = torch.randn(1, 3, 2, 8, requires_grad=True)
    flash_attn_func(q, k, v).sum().backward()  # sum() hands back a stride-0 empty gradient
    assert q.grad.shape == q.shape
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))


def test_meta_inputs_give_meta_outputs_and_mixed_devices_are_refused():
    qm = torch.empty(1, 3, 2, 8, device="meta")
    assert flash_attn_func(qm, qm, qm).device.type == "meta"
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(FlashAttnError, match="alibi_slopes: expected a tensor on q's device cpu, got meta"):
        with torch.device("cpu"):  # a function mode: the registered op runs, with its fake kernel
            flash_attn_func(q, q, q, alibi_slopes=torch.ones(2, device="meta"))


@pytest.mark.parametrize("shapes, kwargs, expect", [
    # Found by a bad-input review: the fake kernel returned a [1, 8, 3, 300] out for these.
    (((1, 8, 3, 16), (1, 9, 2, 15), (1, 4, 2, 300)), {}, r"k: expected shape\[3\] \(head_dim\) = 16"),
    (((1, 8, 3, 16), (1, 8, 2, 16), (1, 8, 2, 16)), {}, "num_heads_k"),
    (((1, 8, 2, 16), (1, 8, 2, 16), (1, 8, 2, 16)), dict(window_size=(-3, 0)), "window_size_left"),
    (((1, 8, 2, 264), (1, 8, 2, 264), (1, 8, 2, 264)), {}, "head_dim"),
], ids=["head_dim", "heads", "window", "head_dim_264"])
def test_meta_inputs_are_checked_like_real_ones(shapes, kwargs, expect):
    # The fake kernel asks the library's own checks on a shape-only description (batched, no
    # ALiBi, not e4m3), so meta tensors and torch.compile's tracing refuse what the call would.
    q, k, v = (torch.empty(*s, device="meta") for s in shapes)
    with pytest.raises(FlashAttnError, match=expect):
        flash_attn_func(q, k, v, **kwargs)
    real = [torch.randn(*s) for s in shapes]
    with pytest.raises(FlashAttnError, match=expect):
        flash_attn_func(*real, **kwargs)


def test_meta_inputs_with_strides_and_gradients_pass_the_check():
    q = torch.empty(2, 16, 4, 128, device="meta")[..., ::2]  # last dim strided: copied by the real call
    k, v = (torch.empty(2, 16, 4, 64, device="meta", requires_grad=True) for _ in range(2))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.shape == (2, 16, 4, 64) and out.device.type == "meta"
    out.sum().backward()
    assert k.grad.shape == k.shape
    qm = torch.empty(2, 100, 8, 192, device="meta", dtype=torch.bfloat16)
    km = torch.empty(2, 90, 2, 192, device="meta", dtype=torch.bfloat16)
    vm = torch.empty(2, 90, 2, 128, device="meta", dtype=torch.bfloat16)
    assert flash_attn_func(qm, km, vm).shape == (2, 100, 8, 128)


@pytest.mark.parametrize("kwargs, expect", [
    (dict(window_size=None), "window_size: expected a pair"),
    (dict(window_size=(1.7, 0)), r"window_size\[0\] \(left\): expected an integer, got 1.7"),
    (dict(window_size=(float("nan"), 0)), r"window_size\[0\] \(left\): expected an integer"),
    (dict(softcap=None), "softcap: expected a real number, got None"),
    # Fixed bug: float() parsed strings, so softcap="1" ran with a softcap of 1.
    (dict(softcap="1"), "softcap: expected a real number, got '1'"),
    (dict(softmax_scale="0.5"), "softmax_scale: expected a real number, got '0.5'"),
    (dict(softmax_scale=[0.1]), "softmax_scale: expected a real number"),
    (dict(alibi_slopes=[1.0, 1.0]), "alibi_slopes: expected a torch.Tensor, got list"),
])
def test_wrong_python_types_name_the_argument(kwargs, expect):
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(ValueError, match=expect):
        flash_attn_func(q, q, q, **kwargs)


def test_wrong_types_in_varlen_name_the_argument():
    q = torch.randn(5, 2, 8)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected a torch.Tensor, got list"):
        flash_attn_varlen_func(q, q, q, [0, 5], cu, 5, 5)
    with pytest.raises(ValueError, match=r"max_seqlen_q: expected an integer, got 4.9"):
        flash_attn_varlen_func(q, q, q, cu, cu, 4.9, 5)
    with pytest.raises(ValueError, match="q: expected a torch.Tensor, got NoneType"):
        flash_attn_func(None, q, q)


def test_sparse_tensors_name_the_argument():
    # Fixed bug: a sparse q raised torch's "unsupported memory format option", naming no argument.
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(ValueError, match="q: expected a dense \\(strided\\) tensor, got layout sparse_coo"):
        flash_attn_func(q.to_sparse(), q, q)
    with pytest.raises(ValueError, match="v: expected a dense"):
        flash_attn_func(q, q, q.to_sparse())


def test_integer_q_gets_the_library_dtype_names():
    with pytest.raises(ValueError, match=r"q: expected dtype fp32, fp16, bf16 or e4m3 \(float8_e4m3fn\), got int64"):
        flash_attn_func(*(torch.ones(1, 3, 2, 8, dtype=torch.int64),) * 3)


def test_direct_bwd_call_with_a_rank_0_lse_names_it():
    from flashattn._ops import pack_options

    q = torch.randn(1, 3, 2, 8)
    int_opts, float_opts = pack_options(0, 0, 0.0, False, "bottom_right", -1, -1, 0.0, False)
    with pytest.raises(FlashAttnError, match="lse: expected rank 3"):
        torch.ops.flashattn.bwd(None, q, q, q, q, torch.tensor(0.0), None, None, None, int_opts, float_opts,
                                torch.tensor(0.0))


# ------------------------------------------------------------------------------------------------
# The FP8 (float8_e4m3fn) forward's arguments, checked on the CPU (the CPU backend refuses e4m3
# itself, after validation; the CUDA runs are in test_cuda.py).

E4M3 = getattr(torch, "float8_e4m3fn", None)
needs_fp8 = pytest.mark.skipif(E4M3 is None, reason="this PyTorch has no float8_e4m3fn")


def fp8_qkv(b=2, s=8, h=4, hk=2, d=128, device="cpu"):
    return tuple((torch.randn(b, s, n, d, device=device) * 2).to(E4M3) for n in (h, hk, hk))


def descales(b=2, hk=2, **kw):
    return {name: torch.rand(b, hk, **kw) + 0.5 for name in ("q_descale", "k_descale", "v_descale")}


@needs_fp8
@pytest.mark.parametrize("kwargs", [{}, "per_head", "per_tensor", "rank0"])
def test_fp8_on_the_cpu_says_it_needs_cuda(kwargs):
    extra = {"per_head": descales(), "per_tensor": {"q_descale": torch.tensor([1.5])},
             "rank0": {"v_descale": torch.tensor(0.75)}}.get(kwargs, {}) if isinstance(kwargs, str) else kwargs
    with pytest.raises(FlashAttnError, match=r"q: expected a CUDA tensor for e4m3 \(the FP8 forward runs only on "
                                             r"the CUDA backend, sm_90\), got a CPU tensor"):
        flash_attn_func(*fp8_qkv(), causal=True, **extra)


@needs_fp8
@pytest.mark.parametrize("make, match", [
    (lambda: (fp8_qkv()[0], *qkv(2, 8, 2, 2, 128, torch.float16)[1:]), r"k: expected dtype e4m3 \(same as q\), got fp16"),
    (lambda: fp8_qkv(d=64), r"q: expected shape\[3\] \(head_dim\) = 128 with e4m3 inputs"),
    (lambda: (*fp8_qkv()[:2], fp8_qkv(d=64)[2]), r"v: expected shape\[3\] \(head_dim_v\) = 128 with e4m3"),
], ids=["k_fp16", "head_dim_64", "head_dim_v_64"])
def test_fp8_bad_inputs(make, match):
    with pytest.raises(FlashAttnError, match=match):
        flash_attn_func(*make())


@needs_fp8
@pytest.mark.parametrize("name, value, match", [
    ("q_descale", torch.ones(2, 2, dtype=torch.float16), "q_descale: expected dtype float32, got float16"),
    ("k_descale", torch.ones(2, 2, dtype=torch.float64), "k_descale: expected dtype float32, got float64"),
    ("v_descale", torch.ones(3, 2), r"v_descale: expected shape\[0\] \(batch\) = 2 \(from q\), got 3"),
    ("q_descale", torch.ones(2, 4), r"q_descale: expected shape\[1\] \(num_heads_k\) = 2 \(from k\), got 4"),
    ("k_descale", torch.ones(3), r"k_descale: expected one value \(rank 0, or shape \[1\]\) or shape "
                                 r"\[batch, num_heads_k\] = \[2, 2\], got shape \[3\]"),
    ("v_descale", torch.ones(2, 2, 1), r"v_descale: expected one value .* got shape \[2, 2, 1\]"),
    ("q_descale", torch.ones(2, 2, device="meta"), "q_descale: expected a cpu or cuda tensor, got device meta"),
    ("k_descale", 2.0, "k_descale: expected a torch.Tensor, got float"),
], ids=["fp16", "fp64", "batch", "heads", "shape3", "rank3", "meta_device", "python_float"])
def test_fp8_bad_descales(name, value, match):
    with pytest.raises(ValueError, match=match):
        flash_attn_func(*fp8_qkv(), **{name: value})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_descales_need_e4m3_inputs(dtype):
    for name, value in (("q_descale", torch.ones(2, 2)), ("v_descale", torch.tensor(2.0))):
        with pytest.raises(FlashAttnError, match=f"{name}: expected none \\(descales apply to e4m3 inputs only, "
                                                 f"FlashAttention-3's FP8 forward\\), got a tensor with q in "):
            flash_attn_func(*qkv(2, 8, 4, 2, 16, dtype), **{name: value})


@needs_fp8
def test_fp8_varlen_is_refused():
    q, k, v = (t.reshape(16, t.shape[2], 128) for t in fp8_qkv())
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    with pytest.raises(FlashAttnError, match=r"cu_seqlens_q: expected none with q in e4m3 \(the FP8 forward runs "
                                             r"batched only for now, no varlen\)"):
        flash_attn_varlen_func(q, k, v, cu, cu, 11, 11)


def test_lse_of_another_dtype_names_float32():
    # Found by review: the direct op's message offered q's dtypes for lse.
    from flashattn._ops import pack_options

    q = torch.randn(1, 8, 2, 16)
    lse = torch.zeros(1, 2, 8, dtype=torch.float64)
    int_opts, float_opts = pack_options(0, 0, 0.0, False, "bottom_right", -1, -1, 0.0, False)
    with pytest.raises(FlashAttnError, match=r"lse: expected dtype float32, got float64"):
        torch.ops.flashattn.bwd(torch.ones_like(q), q, q, q, q.clone(), lse, None, None, None, int_opts, float_opts)


@needs_fp8
def test_fp8_backward_is_refused_by_the_library():
    from flashattn._ops import pack_options

    q, k, v = fp8_qkv()
    out = torch.zeros(2, 8, 4, 128, dtype=torch.bfloat16)
    lse = torch.zeros(2, 4, 8)
    int_opts, float_opts = pack_options(0, 0, 0.0, False, "bottom_right", -1, -1, 0.0, False)
    with pytest.raises(FlashAttnError, match=r"q: expected dtype fp32, fp16 or bf16 in the backward \(e4m3 inputs "
                                             r"have a forward pass only"):
        torch.ops.flashattn.bwd(torch.ones_like(out), q, k, v, out, lse, None, None, None, int_opts, float_opts)


@needs_fp8
@pytest.mark.parametrize("return_lse", [False, True])
def test_fp8_fake_gives_bf16_out_and_autograd_refuses_the_backward(return_lse):
    # 'meta' inputs take the registered op's fake implementation (no library call): out is
    # bfloat16, lse float32, and a gradient reaching the call raises instead of being wrong.
    q, k, v = (t.to("meta").requires_grad_() for t in fp8_qkv())
    d = {name: t.to("meta") for name, t in descales().items()}
    res = flash_attn_func(q, k, v, causal=True, return_lse=return_lse, **d)
    out = res[0] if return_lse else res
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 4, 128) and out.device.type == "meta"
    if return_lse:
        assert res[1].dtype == torch.float32 and res[1].shape == (2, 4, 8)
    with pytest.raises(NotImplementedError, match="e4m3 \\(torch.float8_e4m3fn\\) inputs have a forward pass only"):
        (res[1] if return_lse else out).float().sum().backward()

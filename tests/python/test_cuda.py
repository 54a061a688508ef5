"""CUDA specifics: kernels run on torch's current stream, and CUDA graphs capture them.
Skipped (visibly) without a CUDA device or without flashattn's CUDA backend."""

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import flash_attn_func, flash_attn_varlen_func  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and flashattn.cuda_available()),
                                reason="no CUDA device, or flashattn built without its CUDA backend")


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        is_causal=causal).transpose(1, 2)


def test_runs_on_the_current_stream():
    # q is produced on a side stream by a long matmul chain and consumed right after on the same
    # stream: launching on any other stream would read it before it is written.
    side = torch.cuda.Stream()
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        y = x
        for _ in range(8):
            y = (y @ x) * (1.0 / 64)
        q = (y[:2 * 256, :256].reshape(2, 256, 4, 64) * 0 + k).contiguous()
        out = flash_attn_func(q, k, v, causal=True)
    side.synchronize()
    torch.testing.assert_close(out.float(), sdpa(k, k, v, True), rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_forward_and_backward():
    q = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 160, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 160, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(2, 128, 4, 64, device="cuda", dtype=torch.bfloat16)

    def step():
        out = flash_attn_func(q, k, v, causal=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return out, dq, dk, dv

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up outside the capture, as CUDA graphs require
            step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()

    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for name, a, b in zip(("out", "dq", "dk", "dv"), static, eager):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=lambda m: f"{name}: {m}")


def test_cuda_graph_capture_varlen():
    cu = torch.tensor([0, 17, 17, 90], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(90, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flash_attn_varlen_func(q, k, v, cu, cu, 73, 73, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_varlen_func(q, k, v, cu, cu, 73, 73, causal=True)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, flash_attn_varlen_func(q, k, v, cu, cu, 73, 73, causal=True), rtol=0, atol=0)


def test_other_device_index_uses_that_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda:1", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    assert out.device == q.device
    torch.testing.assert_close(out.float(), sdpa(q, k, v, True), rtol=2e-2, atol=2e-2)


def _is_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this PyTorch has no float8_e4m3fn")
@pytest.mark.parametrize("descale", ["per_head", "per_tensor", "none"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_matches_float64_on_the_dequantized_inputs(descale, causal):
    # FlashAttention-3's FP8 forward (Sec. 3.3): P is rounded to e4m3 inside, so the bound is loose;
    # the C++ suite CudaForwardFp8 holds it to the project's criterion against FA-3's own rounding.
    if not _is_sm90():
        pytest.skip(f"the GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}, not sm_90: "
                    "FP8 test skipped")
    b, sq, sk, h, hk, d = 2, 203, 520, 4, 2, 128
    q, k, v = ((torch.randn(b, s, n, d, device="cuda")).to(torch.float8_e4m3fn) for s, n in ((sq, h), (sk, hk), (sk, hk)))
    if descale == "per_head":
        ds = [torch.rand(b, hk, device="cuda") * 1.5 + 0.5 for _ in range(3)]
    elif descale == "per_tensor":
        ds = [torch.rand(1, device="cuda") * 1.5 + 0.5 for _ in range(3)]
    else:
        ds = [None] * 3
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, q_descale=ds[0], k_descale=ds[1],
                               v_descale=ds[2])
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32

    def dequant(x, dsc):
        # [batch, num_heads_k] factors; head h of x uses KV head h // (heads // num_heads_k).
        scale = torch.ones(b, hk, dtype=torch.float64, device="cuda") if dsc is None else dsc.double().expand(b, hk)
        return x.double() * scale.repeat_interleave(x.shape[2] // hk, dim=1)[:, None, :, None]

    qd, kd, vd = dequant(q, ds[0]), dequant(k, ds[1]), dequant(v, ds[2])
    kd, vd = kd.repeat_interleave(h // hk, dim=2), vd.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", qd, kd) / d ** 0.5
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    ref_lse = torch.logsumexp(s, dim=-1)
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), vd)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=0.05 * ref.abs().max().item())
    # Hopper's FP8 tensor cores accumulate with ~14 mantissa bits (DeepSeek-V3 report, Sec. 3.3.2):
    # a score may move by ~2^-13 of its scaled Σ|q_d k_d|, and lse (a smooth max) by as much; 2^-12
    # of the largest leaves a factor 2 (as the C++ suite's fp8_emulated_forward() bound).
    acc_bound = 2.0 ** -12 * (torch.einsum("bihd,bjhd->bhij", qd.abs(), kd.abs()) / d ** 0.5).max().item()
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-4 + acc_bound)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this PyTorch has no float8_e4m3fn")
def test_fp8_backward_raises():
    if not _is_sm90():
        pytest.skip("not an sm_90 GPU: FP8 test skipped")
    q, k, v = (torch.randn(1, 64, 2, 128, device="cuda").to(torch.float8_e4m3fn).requires_grad_() for _ in range(3))
    out = flash_attn_func(q, k, v)
    with pytest.raises(NotImplementedError, match="forward pass only"):
        out.float().sum().backward()

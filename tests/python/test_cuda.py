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

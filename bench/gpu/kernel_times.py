"""Per-kernel GPU time of one attention forward + backward (torch.profiler), ours and the SDPA
backends, at one shape: where the time of a backward goes (preprocess, main kernel, dq
postprocess, memsets) and how it compares kernel by kernel.

  python3 bench/gpu/kernel_times.py --batch 32 --seqlen 512 --heads 32 --head-dim 64 [--heads-k 8] [--causal]
      [--forward-only] [--flush] [--dtype float16]

--flush writes a 256 MB buffer before each call, as triton's do_bench (bench_attention.py) does to
empty the L2 cache: the kernels' own times under the bench's conditions, without its launch gaps.

--heads-k (default: --heads) gives GQA / MQA: the SDPA backends then run with enable_gqa=True, and
one that refuses the shape is reported as skipped.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-k", type=int, default=None, help="KV heads (GQA / MQA); default --heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--forward-only", action="store_true", help="time the forward alone")
    ap.add_argument("--flush", action="store_true", help="256 MB written before each call (L2 emptied)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    args = ap.parse_args()
    heads_k = args.heads if args.heads_k is None else args.heads_k
    if heads_k < 1 or args.heads % heads_k:
        ap.error(f"--heads-k: expected a divisor of --heads ({args.heads}), got {heads_k}")
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    kv_shape = (args.batch, args.seqlen, heads_k, args.head_dim)
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(s, device="cuda", dtype=dtype, requires_grad=True) for s in (shape, kv_shape, kv_shape))
    g = torch.randn(shape, device="cuda", dtype=dtype)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if args.flush else None

    def call(forward, grad):
        """One profiled call: the flush, forward(), and its backward unless --forward-only."""
        def run():
            if flush is not None:
                flush.zero_()
            out = forward()
            if not args.forward_only:
                out.backward(grad)
        return run

    ours = call(lambda: flashattn.flash_attn_func(q, k, v, causal=args.causal), g)

    def sdpa(backend):
        def forward():
            with sdpa_kernel(backend):  # the backend is chosen here; the backward follows it
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal, enable_gqa=heads_k != args.heads)
        return call(forward, g.transpose(1, 2))

    what = "fwd" if args.forward_only else "fwd+bwd"
    print(f"{args.dtype} {shape} heads_k={heads_k} causal={args.causal}: GPU time per {what}, by kernel (us), "
          f"{args.iters} iterations{', L2 flushed before each' if flush is not None else ''}")
    for name, fn in (("ours", ours), ("fa2", sdpa(SDPBackend.FLASH_ATTENTION)), ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION))):
        try:
            for _ in range(3):
                fn()
        except RuntimeError as e:  # a backend that does not take the shape (e.g. GQA)
            print(f"== {name}\n  skipped: {str(e).splitlines()[0][:100]}")
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
        total = 0.0
        rows = []
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None)
            if t is None:
                t = e.cuda_time_total
            if t > 0 and e.key not in ("",):
                rows.append((t / args.iters, e.key))
        rows.sort(reverse=True)
        print(f"== {name}")
        for t, key in rows[:8]:
            total += t
            print(f"  {t:9.1f}  {key[:110]}")
        print(f"  {sum(t for t, _ in rows):9.1f}  total")


if __name__ == "__main__":
    main()

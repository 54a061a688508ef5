"""Forward time of ours against cuDNN at one shape, three ways: CUDA events per call back to back,
events per call after a 256 MB memset (L2 flushed, as do_bench does) and triton's do_bench; the
whole set twice, then nvidia-smi's clocks and clock event reasons. The H200 runs power-capped, and
the second set shows how far one kernel's time drifts within seconds (perf-notes, sm90 forward).

  FLASHATTN_LIBRARY=build-gpu/dist/libflashattn.so PYTHONPATH=python \\
    python3 bench/gpu/clock_drift.py BATCH SEQLEN HEADS HEAD_DIM [causal]
"""
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashattn


def main():
    if len(sys.argv) not in (5, 6) or (len(sys.argv) == 6 and sys.argv[5] != "causal"):
        sys.exit("usage: clock_drift.py BATCH SEQLEN HEADS HEAD_DIM [causal]")
    b, s, h, d = (int(x) for x in sys.argv[1:5])
    causal = len(sys.argv) == 6
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def ours():
        return flashattn.flash_attn_func(q, k, v, causal=causal)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flops = 4 * b * h * s * s * d / (2 if causal else 1)

    def timed(fn, clear, n=50):
        events = []
        for _ in range(n):
            if clear:
                flush.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            events.append((e0, e1))
        torch.cuda.synchronize()
        return sorted(e0.elapsed_time(e1) for e0, e1 in events)[n // 2]

    for name, fn in (("ours", ours), ("cudnn", cudnn)) * 2:
        for _ in range(5):
            fn()
        a, c = timed(fn, False), timed(fn, True)
        db = do_bench(fn, warmup=10, rep=60, return_mode="median")
        print(f"{name:6s} back-to-back {a * 1e3:7.1f} us ({flops / a / 1e9:5.0f} TFLOP/s)  "
              f"flushed {c * 1e3:7.1f} us ({flops / c / 1e9:5.0f})  do_bench {db * 1e3:7.1f} us ({flops / db / 1e9:5.0f})")
    print(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,"
                          "clocks_event_reasons.active", "--format=csv"], capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()

"""Where a benchmarked call's time goes besides its kernels: the GPU's idle gaps inside each timed
call of bench_attention.py's measurement loop, per contender.

bench_attention.py times each call as triton's do_bench does (a 256 MB L2 flush, then CUDA events
around the call, many calls queued without a host sync). If the host keeps ahead of the GPU the
events measure the kernels alone; a call that blocks the host (an implicit synchronization) or
spends longer on the host than the previous call's kernels take lets the GPU idle, and that idle
time is measured too. This script runs the same loop under torch.profiler and reports, per call:
the event time, the kernels' own time, the GPU's idle time between the flush and the call's last
kernel, and the CUDA runtime / driver calls on the host that can synchronize.

  python3 bench/gpu/call_gaps.py --batch 4 --seqlen 4096 --heads 16 --head-dim 128 --causal \
      [--dtype float16] [--pass bwd] [--calls 20]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as ba  # noqa: E402  (the bench's own contenders)

# Host API calls that can block until the GPU catches up (or serialize with it).
SYNCING = ("Synchronize", "cudaMemcpy", "cuMemcpy", "cudaFree", "cuMemFree", "cudaMalloc", "cuMemAlloc",
           "cudaHostAlloc", "cudaEventQuery", "cudaStreamQuery")


def main():
    ap = argparse.ArgumentParser()
    ba.add_shape_args(ap)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    hk, (q, k, v, do) = ba.shape_inputs(args)
    contenders = {"ours": ba.ours, "cudnn": ba.sdpa("CUDNN_ATTENTION"), "fa2": ba.sdpa("FLASH_ATTENTION")}
    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")  # as triton.testing.do_bench
    print(f"{args.dtype} batch {args.batch} seqlen {args.seqlen} heads {args.heads}/{hk} head_dim {args.head_dim} "
          f"causal={args.causal} {args.which}: per call, median of {args.calls} (us)")
    print(f"  {'':6s} {'events':>8s} {'kernels':>8s} {'idle':>7s} {'lead-in':>8s}  host calls that can block (per call)")
    for name, make in contenders.items():
        try:
            fwd, bwd = make(q, k, v, do, args.causal)
        except Exception as e:  # a backend that refuses the shape
            print(f"  {name:6s} skipped: {str(e).splitlines()[0][:90]}")
            continue
        fn = fwd if args.which == "fwd" else bwd
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.calls)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.calls)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(args.calls):
                flush.zero_()
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize()
        ev = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            trace = json.load(open(path))["traceEvents"]
        gpu = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in trace
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy"))
        # Each call starts after its flush: the fill kernel of 256 MB ints.
        flush_idx = [i for i, (_, _, n) in enumerate(gpu) if "FillFunctor<int>" in n]
        kern, idle, lead = [], [], []
        for c, fi in enumerate(flush_idx):
            nxt = flush_idx[c + 1] if c + 1 < len(flush_idx) else len(gpu)
            body = gpu[fi + 1:nxt]
            if not body:
                continue
            t = gpu[fi][1]
            busy = gaps = 0.0
            for s, e, _ in body:
                gaps += max(0.0, s - t)
                busy += e - max(s, t) if e > t else 0.0
                t = max(t, e)
            kern.append(busy)
            idle.append(gaps)
            lead.append(max(0.0, body[0][0] - gpu[fi][1]))
        host = collections.Counter(e["name"] for e in trace if e.get("ph") == "X" and
                                   e.get("cat") in ("cuda_runtime", "cuda_driver") and
                                   any(s in e["name"] for s in SYNCING))
        calls = max(1, len(flush_idx))
        blocking = ", ".join(f"{n} {c / calls:.1f}" for n, c in host.most_common(6)) or "none"
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        print(f"  {name:6s} {med(ev):8.1f} {med(kern):8.1f} {med(idle):7.1f} {med(lead):8.1f}  {blocking}")


if __name__ == "__main__":
    main()

"""How much a timed call depends on what the GPU ran just before it (the H200 runs power-capped).

bench_attention.py times each contender with triton's do_bench, one after the other. This script
times ours and cuDNN at one shape after four different lead-ins, each repeated --repeats times in
alternation: FlashAttention-2 (PyTorch SDPA's FLASH_ATTENTION) timed just before, the other
contender timed just before, a bf16 GEMM load of --heat-ms, and --idle-ms of an idle GPU. It prints
the median time of each (contender, lead-in) and the SM clock that NVML reads after the lead-in.

  python3 bench/gpu/power_order.py --batch 4 --seqlen 4096 --causal --dtype float16 --pass bwd
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as ba  # noqa: E402


def sm_clock():
    try:
        return torch.cuda.clock_rate()  # MHz, through pynvml
    except Exception:
        return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ba.add_shape_args(ap)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=20.0, help="do_bench's rep per timing (the bench's per-round value)")
    ap.add_argument("--heat-ms", type=float, default=200.0)
    ap.add_argument("--idle-ms", type=float, default=300.0)
    args = ap.parse_args()
    hk, (q, k, v, do) = ba.shape_inputs(args)
    made = {}
    for name, make in (("ours", ba.ours), ("cudnn", ba.sdpa("CUDNN_ATTENTION")), ("fa2", ba.sdpa("FLASH_ATTENTION"))):
        fwd, bwd = make(q, k, v, do, args.causal)
        made[name] = fwd if args.which == "fwd" else bwd
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def heat():
        end = time.perf_counter() + args.heat_ms / 1e3
        while time.perf_counter() < end:
            for _ in range(4):
                a @ a
            torch.cuda.synchronize()

    def timed(fn):
        return do_bench(fn, warmup=10, rep=args.rep_ms, return_mode="median") * 1e3

    leadins = {
        "after fa2": lambda other: timed(made["fa2"]),
        "after other": lambda other: timed(made[other]),
        "after gemm": lambda other: heat(),
        "after idle": lambda other: time.sleep(args.idle_ms / 1e3),
    }
    res = {(c, l): [] for c in ("ours", "cudnn") for l in leadins}
    clk = {(c, l): [] for c in ("ours", "cudnn") for l in leadins}
    for r in range(args.repeats):
        for li, (lname, lead) in enumerate(leadins.items()):
            order = ("ours", "cudnn") if (r + li) % 2 == 0 else ("cudnn", "ours")
            for c in order:
                other = "cudnn" if c == "ours" else "ours"
                lead(other)
                torch.cuda.synchronize()
                clk[(c, lname)].append(sm_clock())
                res[(c, lname)].append(timed(made[c]))
    print(f"{args.dtype} batch {args.batch} seqlen {args.seqlen} heads {args.heads}/{hk} head_dim {args.head_dim} "
          f"causal={args.causal} {args.which}: do_bench median (us; rep {args.rep_ms} ms), median of {args.repeats}, "
          "[SM MHz after the lead-in]")
    for lname in leadins:
        o, c = statistics.median(res[("ours", lname)]), statistics.median(res[("cudnn", lname)])
        print(f"  {lname:12s} ours {o:8.1f} [{statistics.median(clk[('ours', lname)]):5.0f}]  "
              f"cudnn {c:8.1f} [{statistics.median(clk[('cudnn', lname)]):5.0f}]  cudnn/ours {c / o:.3f}   "
              f"rounds ours {' '.join(f'{x:.0f}' for x in res[('ours', lname)])} "
              f"cudnn {' '.join(f'{x:.0f}' for x in res[('cudnn', lname)])}")


if __name__ == "__main__":
    main()

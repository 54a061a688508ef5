#!/usr/bin/env python3
"""CPU benchmark: flashattn's CPU backend and PyTorch's CPU scaled_dot_product_attention, same run.

Runs `flashattn bench --json` over the CPU benchmark's sweep (batch 1, 16 heads, head_dim 64 and 128,
seqlen 512..8192, causal and not, forward and backward, fp32 and bf16), then times
torch.nn.functional.scaled_dot_product_attention on the same shapes with the same thread count,
interleaved shape by shape (ours, then torch) so that load changes hit both alike.
GFLOP/s with FLOPs = 4 * batch * heads * seqlen_q * seqlen_k * head_dim (half for causal;
backward 2.5x); medians after a warm-up. Writes JSON, a markdown table and a PNG plot.

Usage: bench_cpu.py --flashattn build/tools/flashattn --out-dir bench/cpu/results [--quick]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention_flops import attention_flops  # noqa: E402


def cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_ours(args, dtypes, head_dims, seqlens, out_json):
    cmd = [args.flashattn, "bench", "--device", "cpu", "--dtype", ",".join(dtypes),
           "--head-dim", ",".join(map(str, head_dims)), "--seqlen", ",".join(map(str, seqlens)),
           "--batch", "1", "--heads", str(args.heads), "--causal", "both", "--pass", "fwd,bwd",
           "--threads", str(args.threads), "--repeats", str(args.repeats),
           "--max-seconds", str(args.max_seconds), "--json", out_json]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    with open(out_json) as fh:
        return json.load(fh)


def time_torch(torch, b, h, s, d, dtype, causal, bwd, repeats, max_seconds):
    F = torch.nn.functional
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=bwd) for _ in range(3))

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if bwd:
            out.backward(gout)
        return out

    gout = torch.randn(b, h, s, d, dtype=dtype)
    step()  # warm-up
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds:
            break
    t = statistics.median(times)
    if bwd:
        # Report the backward alone, as `flashattn bench` does: subtract a forward's median.
        fwd_times = []
        with torch.no_grad():
            for _ in range(max(1, len(times))):
                t0 = time.perf_counter()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fwd_times.append(time.perf_counter() - t0)
        t -= statistics.median(fwd_times)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashattn", default="build/tools/flashattn")
    ap.add_argument("--out-dir", default="bench/cpu/results")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="seqlen 512 and 1024 only")
    args = ap.parse_args()

    seqlens = [512, 1024] if args.quick else [512, 1024, 2048, 4096, 8192]
    head_dims = [64, 128]
    dtypes = ["f32", "bf16"]
    os.makedirs(args.out_dir, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc)
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed: peer column left empty", file=sys.stderr)
    # Interleaved: each shape runs ours, then torch, before the next shape, so that a change in the
    # machine's load during the sweep hits both columns alike.
    rows = []
    version = None
    for dt in dtypes:
        for d in head_dims:
            for s_len in seqlens:
                ours = run_ours(args, [dt], [d], [s_len], os.path.join(args.out_dir, "ours.json"))
                version = ours.get("version", version)
                for r in ours["results"]:
                    row = dict(r)
                    row["torch_gflops"] = None
                    if torch is not None:
                        torch.set_num_threads(args.threads)
                        tdtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[r["dtype"]]
                        bwd = r["pass"] == "bwd"
                        print(f"torch sdpa {r['dtype']} d{r['head_dim']} s{r['seqlen_q']} causal={r['causal']} {r['pass']}",
                              file=sys.stderr, flush=True)
                        t = time_torch(torch, 1, args.heads, r["seqlen_q"], r["head_dim"], tdtype, r["causal"], bwd,
                                       args.repeats, args.max_seconds)
                        row["torch_gflops"] = attention_flops(1, args.heads, r["seqlen_q"], r["seqlen_q"], r["head_dim"], r["causal"], bwd) / t / 1e9
                    rows.append(row)

    meta = {
        "date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "threads": args.threads,
        "torch": torch.__version__ if torch is not None else None,
        "flashattn": version,
    }
    with open(os.path.join(args.out_dir, "cpu_bench.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)

    lines = [f"CPU: {meta['cpu']}, {args.threads} threads, {meta['date']}, torch {meta['torch']}.", "",
             "| dtype | head_dim | seqlen | causal | pass | ours GFLOP/s | torch SDPA GFLOP/s | ours/torch | working memory MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tg = r["torch_gflops"]
        ratio = f"{r['gflops'] / tg:.2f}" if tg else ""
        mem = r.get("work_mib", "")
        mem = f"{mem:.1f}" if isinstance(mem, (int, float)) else mem
        lines.append(f"| {r['dtype']} | {r['head_dim']} | {r['seqlen_q']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['pass']} | {r['gflops']:.1f} | {tg:.1f} | {ratio} | {mem} |" if tg else
                     f"| {r['dtype']} | {r['head_dim']} | {r['seqlen_q']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['pass']} | {r['gflops']:.1f} |  |  | {mem} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out_dir, "cpu_bench.md"), "w") as fh:
        fh.write(table)
    print(table)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return 0
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    combos = [(dt, p, c) for dt in dtypes for p in ("fwd", "bwd") for c in (False, True)]
    for ax, (dt, p, c) in zip(axes.flat, combos):
        for d, style in ((64, "-"), (128, "--")):
            sel = [r for r in rows if r["dtype"] == dt and r["pass"] == p and r["causal"] == c and r["head_dim"] == d]
            xs = [r["seqlen_q"] for r in sel]
            ax.plot(xs, [r["gflops"] for r in sel], "o" + style, color="tab:blue", label=f"flashattn d{d}")
            if any(r["torch_gflops"] for r in sel):
                ax.plot(xs, [r["torch_gflops"] or 0 for r in sel], "s" + style, color="tab:orange", label=f"torch d{d}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dt} {p} {'causal' if c else 'full'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("GFLOP/s")
        ax.legend(fontsize=7)
    fig.suptitle(f"CPU attention: {meta['cpu']}, {args.threads} threads, {meta['date']}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out_dir, "cpu_bench.png"), dpi=80)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 4's summary of one bench_attention.py run: ours / FA-2 and ours / cuDNN per pass over the
FA-2 paper shapes + Llama (and head_dim 256, 192 and MLA's 192 / 128 apart), the points at issue 4's targets (forward >= 1.05x
cuDNN, backward >= 1.0x, seqlen >= 1024), and the FP8 forward against our 16-bit one and cuDNN.

  python3 bench/gpu/summarize.py bench/gpu/results/2026-11-30-h200-session18.json
"""
import json
import statistics
import sys


def main(path):
    with open(path) as f:
        run = json.load(f)
    by = {}
    for r in run["rows"]:
        by.setdefault((r["shape"], r["dtype"], r["causal"]), {})[r["impl"]] = r
    print(f"{path}: {run['meta']}")
    print("| pass | shapes | ours / FA-2 (min · median · max) | ours >= FA-2 | ours / cuDNN (min · median · max) | ours >= cuDNN |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pas in ("fwd", "bwd"):
        for group, pick in (("FA-2 paper + Llama", lambda s: s.startswith(("fa2paper", "llama"))),
                            ("head_dim 256", lambda s: s.startswith("hdim256")),
                            ("head_dim 192", lambda s: s.startswith("hdim192")),
                            ("MLA 192 / 128", lambda s: s.startswith("mla"))):
            fa2, cud = [], []
            for (shape, _, _), impl in by.items():
                if not pick(shape) or "ours" not in impl or f"{pas}_ms" not in impl["ours"]:
                    continue
                t = impl["ours"][f"{pas}_ms"]
                # (A peer that could not run a shape, e.g. FA-2 at head_dim_v != head_dim, has no time.)
                if f"{pas}_ms" in impl.get("fa2", {}):
                    fa2.append(impl["fa2"][f"{pas}_ms"] / t)
                if f"{pas}_ms" in impl.get("cudnn", {}):
                    cud.append(impl["cudnn"][f"{pas}_ms"] / t)
            if not fa2 and not cud:
                continue
            fmt = lambda xs: f"{min(xs):.2f} · {statistics.median(xs):.2f} · {max(xs):.2f}" if xs else "—"
            extra = f" ({sum(x >= 1.05 for x in cud)} >= 1.05)" if pas == "fwd" else ""
            print(f"| {'forward' if pas == 'fwd' else 'backward'} | {group} | {fmt(fa2)} | {sum(x >= 1 for x in fa2)} / {len(fa2)} "
                  f"| {fmt(cud)} | {sum(x >= 1 for x in cud)} / {len(cud)}{extra} |")
    # Issue 4's 44 points: FA-2 paper d64 / d128 at seqlen >= 1024 and Llama, both dtypes, causal or not.
    target = {"fwd": 1.05, "bwd": 1.0}
    for pas in ("fwd", "bwd"):
        miss = []
        n = 0
        for (shape, dtype, causal), impl in sorted(by.items()):
            if not shape.startswith(("fa2paper", "llama")) or "cudnn" not in impl or "ours" not in impl:
                continue
            if shape.startswith("fa2paper") and int(shape.rsplit("_s", 1)[1]) < 1024:
                continue
            n += 1
            ratio = impl["cudnn"][f"{pas}_ms"] / impl["ours"][f"{pas}_ms"]
            if ratio < target[pas]:
                miss.append(f"{shape} {dtype} {'causal' if causal else 'full'} {ratio:.3f}")
        print(f"\n{pas}: {n - len(miss)} / {n} points at >= {target[pas]}x cuDNN; misses:")
        for m in miss:
            print("  " + m)
    fp8 = [(k, impl) for k, impl in sorted(by.items()) if "ours_fp8" in impl]
    if fp8:
        print("\nFP8 forward TFLOP/s (x our 16-bit forward, x cuDNN 16-bit):")
        for (shape, dtype, causal), impl in fp8:
            f = impl["ours_fp8"]["fwd_tflops"]
            print(f"  {shape} {dtype} {'causal' if causal else 'full'}: {f:.0f} "
                  f"({f / impl['ours']['fwd_tflops']:.2f}x, {f / impl['cudnn']['fwd_tflops']:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1])

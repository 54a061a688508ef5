#!/usr/bin/env python3
"""Attention benchmark on one GPU: ours (flashattn's CUDA backend through its Python package) and the
peers in the same run, PyTorch SDPA with SDPBackend.FLASH_ATTENTION (FlashAttention-2) and
SDPBackend.CUDNN_ATTENTION, and FlexAttention (torch.compile'd), on the FlashAttention-2 paper's
shapes (Dao 2023, Sec. 4.1: batch * seqlen = 16384, model dim 2048, head_dim 64 or 128, seqlen
512..16384, causal and not, forward and backward, bf16 and fp16) and the Llama-3.1-8B shape
(32 query / 8 KV heads, head_dim 128, seqlen 8192).

TFLOP/s = FLOPs / median time with FLOPs = 4 * batch * heads * seqlen_q * seqlen_k * head_dim,
halved for causal, times 2.5 for the backward (FA-2's convention); with head_dim_v != head_dim
(the MLA shapes: 192 / 128) 2 * batch * heads * seqlen_q * seqlen_k * (head_dim + head_dim_v). Times from
triton.testing.do_bench (CUDA events, warm-up first, L2 flushed between runs, median), taken in
--rounds interleaved rounds per shape (each contender once per round, the order rotated) and the
median of the rounds kept, so that the GPU's clock drift under its power cap does not decide the
ratios. Before every timed measurement the GPU idles --rest-ms, so that each starts from the same
clock whatever ran before it (as NVBench waits for a throttled GPU to recover): on the power-capped
H200 the lead-in moved one contender's time by up to 20 % and a ratio by up to 9 %, and a rotated
order keeps each contender behind the same neighbour in every round (bench/gpu/power_order.py,
docs/perf-notes.md). Inputs are fresh N(0, 1) draws, never zeros.

Writes bench.json, bench.md (a markdown table) and bench.png (TFLOP/s per shape) to --out, and
prints the table last. Usage:
  FLASHATTN_LIBRARY=build-gpu/dist/libflashattn.so python3 bench/gpu/bench_attention.py --out $OUT
  python3 bench/gpu/bench_attention.py --replot results/X.json --out DIR   # redraw a run's plot
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  (FlexAttention's compile settings)
import torch.nn.functional as F
from triton.testing import do_bench

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
from attention_flops import attention_flops  # noqa: E402




def make_inputs(b, s, h, hk, d, dtype, dv=None):
    dv = d if dv is None else dv
    g = torch.Generator(device="cuda")
    g.manual_seed(int(time.time_ns()) & 0xFFFFFFFF)
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, s, hk, dv, device="cuda", dtype=dtype, generator=g)
    do = torch.randn(b, s, h, dv, device="cuda", dtype=dtype, generator=g)
    return q, k, v, do


def add_shape_args(ap):
    """One shape's flags for the diagnostics that time the bench's contenders (call_gaps.py,
    power_order.py): batch, seqlen, heads (heads_k), head_dim, causal, dtype and the pass."""
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-k", type=int, default=None, help="KV heads (GQA / MQA); default --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="bwd")


def shape_inputs(args):
    """(heads_k, (q, k, v, do)) for add_shape_args()'s flags, fresh N(0, 1) draws."""
    hk = args.heads if args.heads_k is None else args.heads_k
    return hk, make_inputs(args.batch, args.seqlen, args.heads, hk, args.head_dim, getattr(torch, args.dtype))


# ---- the contenders: each returns (fwd_fn, bwd_fn) over [batch, seqlen, heads, dim] inputs ----

_OUR_ENV_KNOBS = set()


def ours(q, k, v, do, causal, variant=None, fwd_kernel=None, env=None):
    """Through the package's public flash_attn_func (its op layer is an internal detail).
    fwd_kernel="sm80" forces the sm80 forward on a Hopper GPU (FLASHATTN_CUDA_FWD); env sets other
    kernel-selection variables (e.g. FLASHATTN_CUDA_BWD=sm80) for this contender only."""
    import flashattn

    env = dict(env or {})
    if variant is not None:  # a FLASHATTN_CUDA_FWD_SWEEP build's alternative tile configuration
        env["FLASHATTN_FWD_VARIANT"] = str(variant)
    if fwd_kernel is not None:
        env["FLASHATTN_CUDA_FWD"] = fwd_kernel
    _OUR_ENV_KNOBS.update(env, {"FLASHATTN_FWD_VARIANT", "FLASHATTN_CUDA_FWD"})

    def fwd():
        _select_env(env)
        with torch.no_grad():
            return flashattn.flash_attn_func(q, k, v, causal=causal)

    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    _select_env(env)
    out = flashattn.flash_attn_func(qg, kg, vg, causal=causal)

    def bwd():
        _select_env(env)
        return torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

    return fwd, bwd


def _select_env(env):
    """Exactly `env` among the kernel-selection variables any contender of ours has set."""
    for name in _OUR_ENV_KNOBS:
        os.environ.pop(name, None)
    os.environ.update(env)


def _env_spec(spec):
    """LABEL=VAR=VALUE[;VAR=VALUE] (--ours-env, --fp8-env) as (label, {VAR: VALUE})."""
    label, _, assigns = spec.partition("=")
    return label, dict(a.split("=", 1) for a in assigns.split(";") if a)


def ours_fp8(q, k, v, do, causal, env=None):
    """The FP8 (e4m3) forward on the same inputs: q, k, v quantized per tensor (scale = amax / 448,
    FlashAttention-3's per-tensor descaling) before timing; out is bf16. Forward only (bwd None).
    env: kernel-selection variables for this contender only, as for ours()."""
    import flashattn

    env = dict(env or {})
    _OUR_ENV_KNOBS.update(env)

    def quant(t):
        scale = (t.abs().amax().float() / 448.0).clamp(min=1e-12)
        return (t.float() / scale).to(torch.float8_e4m3fn), scale.reshape(1)

    (q8, qs), (k8, ks), (v8, vs) = quant(q), quant(k), quant(v)

    def fwd():
        _select_env(env)
        with torch.no_grad():
            return flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)

    return fwd, None


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = getattr(SDPBackend, backend)

    def make(q, k, v, do, causal):
        qt, kt, vt, dot = (t.transpose(1, 2) for t in (q, k, v, do))
        gqa = qt.shape[1] != kt.shape[1]
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (qt, kt, vt))

        def fwd():
            with sdpa_kernel([be]), torch.no_grad():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

        with sdpa_kernel([be]):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)

        def bwd():
            return torch.autograd.grad(out, (qg, kg, vg), dot, retain_graph=True)

        fwd()
        return fwd, bwd

    return make


_flex_compiled = None


def flex(q, k, v, do, causal):
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex_compiled is None:
        # One compiled graph per (shape, dtype, mask, gqa): past dynamo's default of 8 recompiles
        # it silently falls back to the unfused eager path (seen here: 7-31 TFLOP/s).
        # (`import torch._dynamo` here would make `torch` a local of this function: NameError on
        # every later call, seen in the 2026-11-29 21:50 run.)
        dynamo_config = torch._dynamo.config

        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "accumulated_cache_size_limit"):
            dynamo_config.accumulated_cache_size_limit = 4096
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt, dot = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))
    gqa = qt.shape[1] != kt.shape[1]
    s = qt.shape[2]
    bm = None
    if causal:
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, s, s, device="cuda")
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (qt, kt, vt))

    def fwd():
        with torch.no_grad():
            return _flex_compiled(qt, kt, vt, block_mask=bm, enable_gqa=gqa)

    out = _flex_compiled(qg, kg, vg, block_mask=bm, enable_gqa=gqa)

    def bwd():
        return torch.autograd.grad(out, (qg, kg, vg), dot, retain_graph=True)

    fwd()
    return fwd, bwd


def max_rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def error_text(e):
    """A contender's failure as one short line for the results."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def write_plot(rows, impls, meta, out_dir):
    """bench.png in out_dir: TFLOP/s bars per shape, one panel per (dtype, causal, pass)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = [(dt, c, pas) for dt in sorted({r["dtype"] for r in rows}) for c in (False, True)
                  for pas in ("fwd", "bwd")]
        fig, axes = plt.subplots(len(panels) // 4 or 1, 4, figsize=(22, 5 * max(1, len(panels) // 4)), squeeze=False)
        for ax, (dt, c, pas) in zip(axes.flat, panels):
            sel = [r for r in rows if r["dtype"] == dt and r["causal"] == c]
            labels = [k for k in dict.fromkeys(r["shape"] for r in sel)]
            # Each shape's group of bars spans 0.8 around its tick, one slot per contender (an empty
            # slot where a contender did not run that shape, e.g. FlexAttention or FP8).
            width = 0.8 / max(1, len(impls))
            for j, impl in enumerate(impls):
                vals = [next((r.get(f"{pas}_tflops", 0) or 0 for r in sel if r["shape"] == lab and r["impl"] == impl), 0)
                        for lab in labels]
                ax.bar([x - 0.4 + (j + 0.5) * width for x in range(len(labels))], vals, width=width, label=impl)
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels([lab.replace("fa2paper_", "") for lab in labels], rotation=60, fontsize=7)
            ax.set_title(f"{dt} {'causal' if c else 'non-causal'} {pas}")
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize=7)
        fig.suptitle(f"{meta['device']} — {meta['date']}")
        fig.tight_layout()
        fig.savefig(out_dir / "bench.png", dpi=80)
    except Exception:
        traceback.print_exc()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for bench.json/.md/.png")
    ap.add_argument("--quick", action="store_true", help="bf16 only, seqlen 1k/4k/16k, fewer repeats")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--flex-seqlens", default="2048,8192", help="seqlens on which FlexAttention runs ('' = none)")
    ap.add_argument("--rep-ms", type=float, default=60.0, help="measuring time per (contender, pass), split over --rounds")
    ap.add_argument("--rest-ms", type=float, default=100.0,
                    help="GPU idle time before every timed measurement (equal lead-in for every contender)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds per shape (contenders in rotated order each round; the median is kept)")
    ap.add_argument("--ours-variants", default="", help="also time these FLASHATTN_FWD_VARIANT values (sweep builds)")
    ap.add_argument("--peers", default="fa2,cudnn,flex", help="which peers to run")
    ap.add_argument("--ours-sm80", action="store_true", help="also time our sm80 forward on a Hopper GPU")
    ap.add_argument("--ours-env", action="append", default=[],
                    help="LABEL=VAR=VALUE[;VAR=VALUE]: also time ours with these environment variables")
    ap.add_argument("--fp8", action="store_true",
                    help="also time the FP8 (e4m3) forward on the same inputs, quantized per tensor (head_dim 128)")
    ap.add_argument("--fp8-env", action="append", default=[],
                    help="LABEL=VAR=VALUE[;VAR=VALUE]: also time the FP8 forward with these environment variables")
    ap.add_argument("--shapes", default="", help="only shapes whose name contains one of these (comma-separated)")
    ap.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    ap.add_argument("--dtypes", default="", help="bfloat16 and/or float16 (comma-separated; default both, --quick bf16)")
    ap.add_argument("--replot", metavar="JSON", default="",
                    help="only redraw bench.png in --out from an earlier run's bench.json (no GPU needed)")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        write_plot(saved["rows"], list(dict.fromkeys(r["impl"] for r in saved["rows"])), saved["meta"], out_dir)
        return

    contenders = {"ours": None, "fa2": sdpa("FLASH_ATTENTION"), "cudnn": sdpa("CUDNN_ATTENTION"), "flex": flex}
    try:
        import flashattn  # noqa: F401  (registers torch.ops.flashattn)

        contenders["ours"] = ours
        for var in [int(x) for x in args.ours_variants.split(",") if x]:
            contenders[f"ours_v{var}"] = (lambda var: lambda q, k, v, do, c: ours(q, k, v, do, c, var))(var)
        for spec in args.ours_env:
            label, env = _env_spec(spec)
            contenders[f"ours_{label}"] = (lambda env: lambda q, k, v, do, c: ours(q, k, v, do, c, env=env))(env)
        if args.ours_sm80:
            contenders["ours_sm80"] = lambda q, k, v, do, c: ours(q, k, v, do, c, fwd_kernel="sm80")
        if args.fp8:
            contenders["ours_fp8"] = ours_fp8
            for spec in args.fp8_env:
                label, env = _env_spec(spec)
                contenders[f"ours_fp8_{label}"] = (lambda env: lambda q, k, v, do, c: ours_fp8(q, k, v, do, c, env=env))(env)
    except Exception as e:  # report, keep benchmarking the peers
        print(f"ours: unavailable ({e})", file=sys.stderr)
        del contenders["ours"]

    for peer in ("fa2", "cudnn", "flex"):
        if peer not in args.peers.split(","):
            contenders.pop(peer, None)
    flex_seqlens = {int(x) for x in args.flex_seqlens.split(",") if x}
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float16]
    if args.dtypes:
        dtypes = [getattr(torch, x) for x in args.dtypes.split(",")]
    seqlens = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    shapes = []  # (name, batch, seqlen, heads, heads_k, head_dim, head_dim_v)
    for d in (64, 128):
        for s in seqlens:
            shapes.append((f"fa2paper_d{d}_s{s}", 16384 // s, s, 2048 // d, 2048 // d, d, d))
    shapes.append(("llama31_8b_s8192", 1, 8192, 32, 8, 128, 128))
    # head_dim 256 (Gemma's), 16k tokens per batch and 2048 model columns as the FA-2 shapes; head_dim
    # 192, and 192 with head_dim_v 128 (DeepSeek-V2/V3's multi-head latent attention in prefill), 16
    # heads.
    for s in (1024, 4096, 16384):
        shapes.append((f"hdim256_s{s}", 16384 // s, s, 8, 8, 256, 256))
    for s in (1024, 4096, 16384):
        shapes.append((f"hdim192_s{s}", 16384 // s, s, 16, 16, 192, 192))
    for s in (1024, 4096, 16384):
        shapes.append((f"mla_d192_dv128_s{s}", 16384 // s, s, 16, 16, 192, 128))
    if args.shapes:
        shapes = [sh for sh in shapes if any(x in sh[0] for x in args.shapes.split(","))]
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]

    if args.rest_ms < 0:
        ap.error(f"--rest-ms: expected a time >= 0, got {args.rest_ms}")
    rounds = max(1, args.rounds)
    started = time.time()

    def timed(fn):
        torch.cuda.synchronize()
        time.sleep(args.rest_ms / 1e3)
        return do_bench(fn, warmup=10, rep=args.rep_ms / rounds, return_mode="median")

    dev = torch.cuda.get_device_properties(0)
    meta = {"device": dev.name, "sms": dev.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": rounds,
            "rest_ms": args.rest_ms, "rep_ms": args.rep_ms}
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:
        pass
    rows = []
    for dtype in dtypes:
        for (name, b, s, h, hk, d, dv) in shapes:
            for causal in causals:
                q, k, v, do = make_inputs(b, s, h, hk, d, dtype, dv)
                ref_out, ref_impl = None, None
                # The H200 runs power-capped (nvidia-smi: SW power cap, the SM clock 1755 of 1980 MHz
                # under this load), so its clock drifts within a run: one kernel measured 416 and
                # 462 us a few seconds apart. Timing each contender once, one after the other, lets
                # that drift decide ratios near 1; instead every contender is timed in each of
                # --rounds rounds, in rotated order, and keeps the median of its rounds.
                runs = []  # (cname, rec, fwd, bwd, fwd times, bwd times)
                for cname, make in contenders.items():
                    if cname == "flex" and s not in flex_seqlens:
                        continue
                    if cname.startswith("ours_fp8") and d != 128:  # the FP8 forward ships head_dim 128 only
                        continue
                    rec = {"shape": name, "dtype": str(dtype).replace("torch.", ""), "batch": b, "seqlen": s,
                           "heads": h, "heads_k": hk, "head_dim": d, "head_dim_v": dv, "causal": causal,
                           "impl": cname}
                    rows.append(rec)
                    try:
                        fwd, bwd = make(q, k, v, do, causal)
                        o = fwd()
                        o = o[0] if isinstance(o, tuple) else o
                        o = o if o.shape == do.shape else o.transpose(1, 2)
                        # (FA-2 takes no head_dim_v != head_dim: cuDNN's out is the reference there.)
                        if ref_out is None and (cname == "fa2" or cname == "cudnn" and d != dv):
                            ref_out, ref_impl = o.float(), cname
                        rec["out"] = o.float()
                        runs.append((cname, rec, fwd, bwd, [], []))
                    except Exception as e:
                        rec["error"] = error_text(e)
                for rnd in range(rounds):
                    first = rnd % len(runs) if runs else 0
                    for cname, rec, fwd, bwd, tf, tb in runs[first:] + runs[:first]:
                        if "error" in rec:
                            continue
                        try:
                            tf.append(timed(fwd))
                            if not args.no_bwd and bwd is not None:
                                tb.append(timed(bwd))
                        except Exception as e:
                            rec["error"] = error_text(e)
                for cname, rec, fwd, bwd, tf, tb in runs:
                    if "error" in rec:
                        continue
                    t = statistics.median(tf)
                    rec["fwd_ms"] = t
                    rec["fwd_ms_rounds"] = tf
                    rec["fwd_tflops"] = attention_flops(b, h, s, s, d, causal, False, dv) / (t * 1e-3) / 1e12
                    if tb:
                        t = statistics.median(tb)
                        rec["bwd_ms"] = t
                        rec["bwd_ms_rounds"] = tb
                        rec["bwd_tflops"] = attention_flops(b, h, s, s, d, causal, True, dv) / (t * 1e-3) / 1e12
                del runs
                torch.cuda.empty_cache()
                # Agreement with FA-2 (a sanity check, not the accuracy test: tests/cuda does that).
                for rec in rows:
                    o = rec.pop("out", None)
                    if o is not None and ref_out is not None and rec["impl"] != ref_impl and rec["shape"] == name:
                        # (Field name kept from the runs before MLA: the reference is FA-2's out, or
                        # cuDNN's where FA-2 takes no head_dim_v != head_dim; ref_impl says which.)
                        rec["max_rel_diff_vs_fa2"] = max_rel_err(o, ref_out)
                        rec["ref_impl"] = ref_impl
                del q, k, v, do, ref_out
                line = [r for r in rows if r["shape"] == name and r["causal"] == causal and
                        r["dtype"] == str(dtype).replace("torch.", "")]
                print(" | ".join(f"{r['impl']}:{r.get('fwd_tflops', float('nan')):.0f}/"
                                 f"{r.get('bwd_tflops', float('nan')):.0f}" + (" ERR" if "error" in r else "")
                                 for r in line), f"<- {name} {dtype} causal={causal}", flush=True)

    meta["seconds"] = round(time.time() - started)
    (out_dir / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    impls = list(contenders)
    md = [f"# Attention benchmark: {meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, {meta['date']}", "",
          f"TFLOP/s (fwd / bwd; median of {meta['rounds']} interleaved rounds of do_bench medians, "
          f"the GPU idle {meta['rest_ms']:g} ms before each). "
          "FLOPs = 4·b·h·s²·d (2·b·h·s²·(d + dv) where head_dim_v = dv differs), /2 causal, ×2.5 bwd.", "",
          "| shape | dtype | causal | " + " | ".join(impls) +
          " | ours/fa2 fwd | ours/fa2 bwd | ours/cudnn fwd | ours/cudnn bwd |",
          "|---|---|---|" + "---|" * (len(impls) + 4)]
    keys = []
    for r in rows:
        key = (r["shape"], r["dtype"], r["causal"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        cells, by = [], {r["impl"]: r for r in rows if (r["shape"], r["dtype"], r["causal"]) == key}
        for i in impls:
            r = by.get(i)
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("err")
            else:
                # A forward-only contender (the FP8 one, --no-bwd) has no backward number: "—".
                fwd, bwd = (f"{r[k]:.0f}" if k in r else "—" for k in ("fwd_tflops", "bwd_tflops"))
                cells.append(f"{fwd} / {bwd}")

        def ratio(field, peer):
            a, b = by.get("ours", {}).get(field), by.get(peer, {}).get(field)
            return f"{a / b:.2f}" if a and b else ""

        cells += [ratio("fwd_tflops", "fa2"), ratio("bwd_tflops", "fa2"),
                  ratio("fwd_tflops", "cudnn"), ratio("bwd_tflops", "cudnn")]
        md.append(f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | " + " | ".join(cells) + " |")
    errors = [f"- {r['impl']} {r['shape']} {r['dtype']} causal={r['causal']}: {r['error']}" for r in rows if "error" in r]
    if errors:
        md += ["", "Errors:"] + errors
    (out_dir / "bench.md").write_text("\n".join(md) + "\n")

    write_plot(rows, impls, meta, out_dir)
    print("\n".join(md))


if __name__ == "__main__":
    main()

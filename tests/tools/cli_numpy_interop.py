#!/usr/bin/env python3
"""`flashattn run` on files written by numpy (.npy) and by the safetensors package, with outputs
read back by the same libraries and checked against attention computed here in numpy float64
(forward and backward, GQA, causal in both alignments, sliding window, softcap, ALiBi, varlen).

Usage: cli_numpy_interop.py PATH/TO/flashattn. Exits 77 (CTest: skipped) when numpy or
safetensors is not installed (scripts/install-deps.sh installs both).
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print("SKIP: cli_numpy_interop needs numpy and safetensors (pip install numpy safetensors): %s" % e)
    sys.exit(77)

CLI = sys.argv[1]
rng = np.random.default_rng()


def attention64(q, k, v, dout, scale, causal=False, align="bottom-right", window=(-1, -1), softcap=0.0, alibi=None):
    """One sequence: q [Sq, H, D], k/v [Sk, Hk, D], float64. Returns out, lse [H, Sq], dq, dk, dv."""
    sq, h, d = q.shape
    sk, hk, _ = k.shape
    g = h // hk
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * scale
    t = None
    if softcap > 0:
        t = np.tanh(s / softcap)
        s = softcap * t
    offset = sk - sq if align == "bottom-right" else 0
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    if alibi is not None:
        s = s - alibi[:, None, None] * np.abs(i + offset - j)[None]
    left, right = window
    if causal:
        right = 0
    mask = np.ones((sq, sk), bool)
    if left >= 0:
        mask &= j >= i + offset - left
    if right >= 0:
        mask &= j <= i + offset + right
    s = np.where(mask[None], s, -np.inf)
    m = s.max(-1, keepdims=True) if sk else np.zeros((h, sq, 1))
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
        p = np.where(l > 0, p / l, 0.0)
    out = np.einsum("hij,jhd->ihd", p, vv)
    dp = np.einsum("ihd,jhd->hij", dout, vv)
    dd = (dout * out).sum(-1).T
    ds = p * (dp - dd[..., None])
    if t is not None:
        ds = ds * (1 - t * t)
    dq = np.einsum("hij,jhd->ihd", ds, kk) * scale
    dk = (np.einsum("hij,ihd->jhd", ds, q) * scale).reshape(sk, hk, g, d).sum(2)
    dv = np.einsum("hij,ihd->jhd", p, dout).reshape(sk, hk, g, v.shape[2]).sum(2)
    return out, lse, dq, dk, dv


def batched64(q, k, v, dout, **kw):
    outs = [attention64(q[b], k[b], v[b], dout[b], **kw) for b in range(q.shape[0])]
    out, lse, dq, dk, dv = (np.stack(x) for x in zip(*outs))
    return out, lse, dq, dk, dv  # lse [B, H, Sq]


def varlen64(q, k, v, dout, cu_q, cu_k, **kw):
    out, dq = np.zeros(q.shape[:2] + (v.shape[2],)), np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    lse = np.zeros((q.shape[1], q.shape[0]))
    for b in range(len(cu_q) - 1):
        a, e, ka, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        o, l, gq, gk, gv = attention64(q[a:e], k[ka:ke], v[ka:ke], dout[a:e], **kw)
        out[a:e], lse[:, a:e], dq[a:e], dk[ka:ke], dv[ka:ke] = o, l, gq, gk, gv
    return out, lse, dq, dk, dv


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def run(args):
    r = subprocess.run([CLI, "run"] + args, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError("flashattn run failed (exit %d): %s%s" % (r.returncode, r.stdout, r.stderr))
    return r


results = []


def check(case, name, ours, ref, tol):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    ok = ours.shape == ref.shape
    err = float("inf")
    if ok:
        inf_match = np.array_equal(np.isinf(ref), np.isinf(ours)) and np.all(ours[np.isinf(ref)] == ref[np.isinf(ref)])
        fin = np.isfinite(ref)
        scale = max(1.0, float(np.abs(ref[fin]).max())) if fin.any() else 1.0
        err = float(np.abs(ours[fin] - ref[fin]).max()) / scale if fin.any() else 0.0
        ok = inf_match and not np.isnan(ours).any() and err <= tol
    results.append(ok)
    print("%s %-34s %-4s rel err %.2e (tol %.0e)%s" % ("ok  " if ok else "FAIL", case, name, err, tol,
                                                     "" if ours.shape == ref.shape else " shape %s vs %s" % (ours.shape, ref.shape)))


def main():
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)

        # 1. .npy float32, batched, GQA 4/2, seqlen_q != seqlen_k, causal bottom-right, backward.
        B, SQ, SK, H, HK, D = 2, 37, 45, 4, 2, 32
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, SQ, H, D), (B, SK, HK, D), (B, SK, HK, D)))
        dout = rng.standard_normal((B, SQ, H, D)).astype(np.float32)
        for name, arr in dict(q=q, k=k, v=v, dout=dout).items():
            np.save(p(name + ".npy"), arr)
        run(["--q", p("q.npy"), "--k", p("k.npy"), "--v", p("v.npy"), "--dout", p("dout.npy"), "--causal",
             "--out", p("out.npy"), "--lse", p("lse.npy"), "--dq", p("dq.npy"), "--dk", p("dk.npy"), "--dv", p("dv.npy")])
        ref = batched64(*(x.astype(np.float64) for x in (q, k, v, dout)), scale=D ** -0.5, causal=True)
        for name, r in zip(("out", "lse", "dq", "dk", "dv"), ref):
            check("npy f32 GQA causal bottom-right", name, np.load(p(name + ".npy")), r, 1e-5 if name == "lse" else 1e-4)

        # 2. .npy float16, top-left causal + window + softcap + ALiBi + explicit scale.
        B, SQ, SK, H, HK, D = 1, 50, 30, 2, 2, 24
        q, k, v, dout = (rng.standard_normal(s).astype(np.float16)
                         for s in ((B, SQ, H, D), (B, SK, HK, D), (B, SK, HK, D), (B, SQ, H, D)))
        alibi = np.array([0.5, 0.125], np.float32)
        for name, arr in dict(q=q, k=k, v=v, dout=dout, alibi=alibi).items():
            np.save(p("h_" + name + ".npy"), arr)
        run(["--q", p("h_q.npy"), "--k", p("h_k.npy"), "--v", p("h_v.npy"), "--dout", p("h_dout.npy"),
             "--alibi", p("h_alibi.npy"), "--causal", "--causal-align", "top-left", "--window", "6,-1",
             "--softcap", "8", "--scale", "0.3", "--out", p("h_out.npy"), "--lse", p("h_lse.npy"),
             "--dq", p("h_dq.npy"), "--dk", p("h_dk.npy"), "--dv", p("h_dv.npy")])
        ref = batched64(*(x.astype(np.float64) for x in (q, k, v, dout)), scale=0.3, causal=True, align="top-left",
                        window=(6, -1), softcap=8.0, alibi=alibi.astype(np.float64))
        for name, r in zip(("out", "lse", "dq", "dk", "dv"), ref):
            out = np.load(p("h_" + name + ".npy"))
            assert out.dtype == (np.float32 if name == "lse" else np.float16), out.dtype
            check("npy f16 top-left window softcap alibi", name, out, r, 1e-5 if name == "lse" else 2e-3)
        # The Python package's spelling of the alignment gives the same call.
        run(["--q", p("h_q.npy"), "--k", p("h_k.npy"), "--v", p("h_v.npy"), "--alibi", p("h_alibi.npy"),
             "--causal", "--causal-align", "top_left", "--window", "6,-1", "--softcap", "8", "--scale", "0.3",
             "--out", p("h_out_us.npy")])
        assert np.array_equal(np.load(p("h_out_us.npy")), np.load(p("h_out.npy"))), "--causal-align top_left"

        # 3. .safetensors float32 varlen (one empty sequence), every input and output in one file each.
        cu_q = np.array([0, 13, 13, 40], np.int32)
        cu_k = np.array([0, 20, 25, 33], np.int32)
        H, HK, D = 4, 1, 16
        q = rng.standard_normal((cu_q[-1], H, D)).astype(np.float32)
        k = rng.standard_normal((cu_k[-1], HK, D)).astype(np.float32)
        v = rng.standard_normal((cu_k[-1], HK, D)).astype(np.float32)
        dout = rng.standard_normal((cu_q[-1], H, D)).astype(np.float32)
        save_file(dict(q=q, k=k, v=v, dout=dout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k), p("in.safetensors"),
                  metadata={"written_by": "safetensors.numpy"})
        run(["--inputs", p("in.safetensors"), "--causal", "--out", p("all.safetensors")])
        got = load_file(p("all.safetensors"))
        assert set(got) == {"out", "lse", "dq", "dk", "dv"}, set(got)
        ref = varlen64(*(x.astype(np.float64) for x in (q, k, v, dout)), cu_q, cu_k, scale=D ** -0.5, causal=True)
        for name, r in zip(("out", "lse", "dq", "dk", "dv"), ref):
            check("safetensors f32 varlen MQA causal", name, got[name], r, 1e-5 if name == "lse" else 1e-4)

        # 4. .safetensors bfloat16 written by the safetensors package's serializer (numpy has no bf16).
        B, S, H, D = 1, 64, 2, 64
        qb, kb, vb, db = (bf16_bits(rng.standard_normal((B, S, H, D))) for _ in range(4))
        specs = {n: safetensors.TensorSpec(dtype="bfloat16", shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for n, a in dict(q=qb, k=kb, v=vb, dout=db).items()}
        with open(p("bf16.safetensors"), "wb") as f:
            f.write(bytes(safetensors.serialize(specs)))
        run(["--inputs", p("bf16.safetensors"), "--causal", "--out", p("bf16_out.safetensors"), "--check"])
        with open(p("bf16_out.safetensors"), "rb") as f:
            got = {n: t for n, t in safetensors.deserialize(f.read())}
        ref = batched64(*(bf16_value(x).astype(np.float64) for x in (qb, kb, vb, db)), scale=D ** -0.5, causal=True)
        for name, r in zip(("out", "lse", "dq", "dk", "dv"), ref):
            t = got[name]
            raw = np.frombuffer(bytes(t["data"]), np.uint16 if t["dtype"] == "BF16" else np.float32)
            val = bf16_value(raw) if t["dtype"] == "BF16" else raw
            assert t["dtype"] == ("F32" if name == "lse" else "BF16"), t["dtype"]
            check("safetensors bf16 causal (package-written)", name, val.reshape(t["shape"]), r,
                  1e-5 if name == "lse" else 1e-2)

    failed = results.count(False)
    print("%d passed, %d failed" % (len(results) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

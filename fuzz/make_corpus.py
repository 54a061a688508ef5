"""Writes the fuzz seed corpus (fuzz/corpus/) with numpy and the safetensors package.

Run once by hand (python3 fuzz/make_corpus.py); the small outputs are committed.
"""
import os
import struct

import numpy as np
from safetensors import TensorSpec, serialize
from safetensors.numpy import save

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
rng = np.random.default_rng(0)


def put(sub, name, data):
    os.makedirs(os.path.join(here, sub), exist_ok=True)
    with open(os.path.join(here, sub, name), "wb") as f:
        f.write(data)


def npy_bytes(arr, version=None):
    import io
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        np.lib.format.write_array(buf, arr, version=version)
    return buf.getvalue()


put("npy", "f32_2x3.npy", npy_bytes(rng.standard_normal((2, 3)).astype(np.float32)))
put("npy", "f16_5.npy", npy_bytes(rng.standard_normal(5).astype(np.float16)))
put("npy", "i32_scalar.npy", npy_bytes(np.array(7, dtype=np.int32)))
put("npy", "i32_cu_seqlens.npy", npy_bytes(np.array([0, 3, 3, 8], dtype=np.int32)))
put("npy", "f32_4d_v2.npy", npy_bytes(rng.standard_normal((1, 2, 2, 2)).astype(np.float32), version=(2, 0)))
put("npy", "f32_empty_v3.npy", npy_bytes(np.zeros((0, 4), np.float32), version=(3, 0)))
put("npy", "f8_unsupported.npy", npy_bytes(np.ones((2,), np.float64)))
put("npy", "fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 2), np.float32))))

q = rng.standard_normal((1, 3, 2, 4)).astype(np.float32)
put("safetensors", "qkv_f32.safetensors",
    save({"q": q, "k": q.copy(), "v": q.copy(), "cu_seqlens_q": np.array([0, 3], np.int32)},
         metadata={"format": "np"}))
put("safetensors", "f16.safetensors", save({"x": rng.standard_normal((3,)).astype(np.float16)}))
bits = rng.integers(0, 1 << 16, size=(2, 3), dtype=np.uint16)
put("safetensors", "bf16.safetensors",
    bytes(serialize({"q": TensorSpec(dtype="bfloat16", shape=bits.shape, data_ptr=bits.ctypes.data,
                                     data_len=bits.nbytes)})))
put("safetensors", "f64_and_empty.safetensors",
    save({"a": np.ones((2,), np.float64), "e": np.zeros((0, 3), np.float32)}))
header = b'{"q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
put("safetensors", "handmade.safetensors", struct.pack("<Q", len(header)) + header + b"\0" * 8)

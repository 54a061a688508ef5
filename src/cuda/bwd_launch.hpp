// Entry point of the sm80 (mma.sync) backward, called by api.cu after validation.
#pragma once

#include <cuda_runtime.h>

#include "common/params.hpp"

namespace flashattn::cuda {

// FlashAttention-2 backward (Dao 2023, Alg. 2) on tensor cores: writes p.dq, p.dk, p.dv from
// p.q, p.k, p.v, p.out, p.lse, p.dout, asynchronously on `stream`.
//   p: validated Params with device pointers; dtype f16 or bf16; head_dim, head_dim_v multiples of 8,
//      at most 256; strides multiples of 8 elements, 16-byte aligned bases; batched or varlen; GQA;
//      masks, softcap and ALiBi as in params.hpp.
//   p.deterministic: no atomics anywhere; dq comes from a second kernel parallel over query tiles,
//      so the result is bitwise repeatable. Otherwise dq is accumulated with fp32 atomics (faster),
//      and so are dk and dv of the Hopper kernel's split-tail blocks (bwd_split_tail_blocks()).
// Working memory (fp32 D = rowsum(dout ∘ out), lse·log2(e), and the dq accumulator) is taken with
// cudaMallocAsync on the stream and released on it. Throws flashattn::Error with CUDA's message when
// an allocation or a launch fails, or when the device lacks the shared memory a kernel needs.
// use_sm90: run the Hopper dK/dV kernel (bwd_sm90_tma_wgmma.cuh) instead of the sm80 one; the
// caller (api.cu) decides it with bwd_sm90_covers().
void run_bwd_sm80(const detail::Params& p, cudaStream_t stream, bool use_sm90 = false);

// Rows of the resident tile of one backward block (keys in the dK/dV kernel, queries in the
// deterministic dQ kernel): the grid's y dimension is seqlen / this, at most 65535.
int bwd_block_rows(const detail::Params& p, bool use_sm90);

// Whether this build's Hopper dK/dV kernels cover p (any head_dim bucket, not deterministic);
// the device and tensor-map checks are api.cu's.
bool bwd_sm90_covers(const detail::Params& p);

// The head_dim bucket run_bwd_sm80 uses for p (64, 128 or 256): max(head_dim, head_dim_v) rounded up.
int bwd_sm80_head_dim_bucket(const detail::Params& p);

// Dynamic shared memory per block (bytes) that run_bwd_sm80's kernels need for p: plan() can
// compare it with cudaDevAttrMaxSharedMemoryPerBlockOptin (hdim 128 and 256 exceed sm_80's 163 KB).
int bwd_sm80_smem_bytes(const detail::Params& p);

}  // namespace flashattn::cuda

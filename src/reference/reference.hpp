// The float64 oracle every backend is tested against: plain loops over materialized scores, no
// tiling, no online softmax. Deliberately slow and obvious: one score row at a time over every
// visible key, host tensors only.
//
// It computes the definitions in flashattn.hpp directly: S = softmax_scale · Q Kᵀ, optional
// softcap · tanh(S / softcap), ALiBi bias (alibi_bias()), the mask (visible_keys()), then
// P = exp(S − lse), O = P V (FlashAttention-2, Dao 2023, Alg. 1 without the tiling), and the
// backward of FA-2 Alg. 2: dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(dO ∘ O), dS = P ∘ (dP − D),
// dS' = dS · (1 − tanh²) under softcap, dQ = softmax_scale · dS' K, dK = softmax_scale · dS'ᵀ Q.
// Rows that see no key get out = 0, lse = −inf and zero gradients.
// e4m3 inputs (the FP8 forward) are decoded and multiplied by their descales (Params::q_descale,
// ...) in float64; Precision::input then rounds the intermediates to float32, not to e4m3 (the FP8
// forward's own naive formula, FlashAttention-3's, is emulated by the tests, tests/support).
#pragma once

#include <cstdint>

#include "common/params.hpp"

namespace flashattn::reference {

enum class Precision {
  f64,    // every intermediate in float64: the oracle
  input,  // the naive formula with every intermediate (S, tanh, P, lse, O, D, dP, dS, grads) rounded
          // to the input dtype, as PyTorch's math SDPA in fp16/bf16 would; dot products are summed
          // exactly and rounded once, as a matmul with a float32 accumulator. Its error against f64
          // sets the test tolerance: ours must be within 2x of it (plus a floor).
};

// Number of packed query / key rows: batch · seqlen for batched calls, cu_seqlens[batch] for varlen.
int64_t total_q(const detail::Params& p);
int64_t total_k(const detail::Params& p);

// Forward on host Params (p.device == cpu). Writes dense float64 outputs:
//   out [total_q, num_heads, head_dim_v], lse [num_heads, total_q] (natural log; −inf for rows
// that see no key). Query i of sequence b is dense row b · seqlen_q + i (batched) or
// cu_seqlens_q[b] + i (varlen); keys likewise. Ignores p.out and p.lse. Throws flashattn::Error for device tensors.
void forward(const detail::Params& p, Precision prec, double* out, double* lse);

// Backward on host Params. Recomputes the forward from q, k, v (ignores p.out and p.lse), reads
// p.dout, and writes dense float64 gradients:
//   dq [total_q, num_heads, head_dim], dk [total_k, num_heads_k, head_dim],
//   dv [total_k, num_heads_k, head_dim_v]
// (GQA: dk, dv of a KV head sum over its query heads).
void backward(const detail::Params& p, Precision prec, double* dq, double* dk, double* dv);

}  // namespace flashattn::reference

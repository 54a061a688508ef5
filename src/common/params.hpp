// The validated, backend-facing form of an attention call: raw pointers, sizes and int64 strides,
// with the mask already resolved into a window. Produced only by validate() (validate.cpp), so
// every backend can trust it without re-checking.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

struct Params {
  DType dtype;            // of q, k, v, dout, dq, dk, dv
  DType out_dtype;  // of out: dtype, except bf16 when dtype is e4m3
  Device device;
  int32_t device_index;

  int64_t batch;          // number of sequences
  int64_t seqlen_q;       // batched: the seqlen; varlen: max over the batch
  int64_t seqlen_k;
  int64_t num_heads, num_heads_k, head_dim, head_dim_v;
  int64_t rows_q, rows_k;  // rows of the q and k tensors: seqlen, or total_q / total_k when varlen
  bool is_varlen;
  const int32_t* cu_seqlens_q;  // [batch + 1] when is_varlen
  const int32_t* cu_seqlens_k;

  // Strides in elements. For varlen tensors the batch stride is 0 and rows start at cu_seqlens.
  const void* q; int64_t q_batch_stride, q_row_stride, q_head_stride;
  const void* k; int64_t k_batch_stride, k_row_stride, k_head_stride;
  const void* v; int64_t v_batch_stride, v_row_stride, v_head_stride;
  void* out; int64_t o_batch_stride, o_row_stride, o_head_stride;
  // lse float32: batched [batch, num_heads, seqlen_q], varlen [num_heads, total_q]. Row r of
  // (b, h) sits at lse + b*lse_batch_stride + h*lse_head_stride + (row_start_b + r)*lse_row_stride.
  float* lse; int64_t lse_batch_stride, lse_head_stride, lse_row_stride;

  // Backward only (nullptr in the forward).
  const void* dout; int64_t do_batch_stride, do_row_stride, do_head_stride;
  void* dq; int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  void* dk; int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  void* dv; int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  float softmax_scale;
  float softcap;                    // 0 = off
  // Windows wider than rows_q + rows_k (seqlen or varlen totals) arrive as -1, so that
  // i + offset ± window cannot overflow int64 (see validate()).
  int64_t window_size_left;         // < 0 = unbounded
  int64_t window_size_right;        // < 0 = unbounded; causal has been turned into 0
  bool align_bottom_right;          // offset = seqlen_k − seqlen_q (per sequence) when true, else 0
  const float* alibi_slopes;        // nullptr = off
  int64_t alibi_batch_stride;       // 0 for [num_heads]

  bool deterministic;
  int num_threads;
  void* stream;

  // e4m3 only: dequantization factors, float32, element (b, kv head hk) at ptr[b * batch_stride + hk * head_stride]
  // (strides in elements, 0 = broadcast); nullptr = 1.
  const float* q_descale; int64_t q_descale_batch_stride, q_descale_head_stride;
  const float* k_descale; int64_t k_descale_batch_stride, k_descale_head_stride;
  const float* v_descale; int64_t v_descale_batch_stride, v_descale_head_stride;

  // Sequence b's start row and length, for q and k.
  int64_t q_start(int64_t b) const { return is_varlen ? cu_seqlens_q[b] : 0; }
  int64_t k_start(int64_t b) const { return is_varlen ? cu_seqlens_k[b] : 0; }
  int64_t q_len(int64_t b) const { return is_varlen ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q; }
  int64_t k_len(int64_t b) const { return is_varlen ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k; }
};

// Visible key range for query row i of a sequence with lengths (len_q, len_k): keys in
// [lo, hi) are visible (the range may be empty). Shared by every backend and the reference so
// that the mask has a single definition.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange visible_keys(const Params& p, int64_t i, int64_t len_q, int64_t len_k) {
  const int64_t offset = p.align_bottom_right ? len_k - len_q : 0;
  int64_t lo = 0, hi = len_k;
  if (p.window_size_left >= 0) lo = std::max<int64_t>(lo, i + offset - p.window_size_left);
  if (p.window_size_right >= 0) hi = std::min<int64_t>(hi, i + offset + p.window_size_right + 1);
  if (hi < lo) hi = lo;
  return {lo, hi};
}

// ALiBi bias added to score (i, j): −slope · |i + offset − j| (FlashAttention-2's convention, with
// the same offset as the mask so that the diagonal gets bias 0).
inline float alibi_bias(const Params& p, int64_t b, int64_t h, int64_t i, int64_t j, int64_t len_q,
                        int64_t len_k) {
  if (!p.alibi_slopes) return 0.0f;
  const int64_t offset = p.align_bottom_right ? len_k - len_q : 0;
  const float slope = p.alibi_slopes[b * p.alibi_batch_stride + h];
  return -slope * static_cast<float>(std::llabs(i + offset - j));
}

// Validates the public params for a pass; throws flashattn::Error naming the argument.
Params validate(const AttentionParams& params, Pass pass);

// Host values of a cu_seqlens array (batch + 1 of them) checked as a prefix sum from 0 to `total`
// (total_what says where total comes from): the reason, naming `name`, or "" when valid. Sets
// longest to the longest sequence and longest_at to its index. validate() uses it for host arrays,
// the CUDA backend on a copy of device arrays.
std::string cu_seqlens_error(const char* name, const int32_t* cu, int64_t batch, int64_t total,
                             const char* total_what, int64_t& longest, int64_t& longest_at);

// Whether two strided views of one dtype share an element (exact; validate() refuses outputs that
// do): `unknown` once the search has visited `budget` nodes, which nested strides never need
// (definition and method in validate.cpp).
enum class SharedElements { no, yes, unknown };
SharedElements views_share_element(const TensorView& t, const TensorView& other, int64_t budget = int64_t{1} << 16);

}  // namespace flashattn::detail

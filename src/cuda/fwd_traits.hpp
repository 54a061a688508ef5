// Tile shapes of the sm80 (mma.sync) forward kernel, one row per head_dim bucket, and the plain
// struct the kernel receives by value. Tuning these changes speed, never results.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// What the forward kernel reads; filled from detail::Params by api.cu. Pointers are device
// pointers; strides are in elements (int64 so that offsets past 2^31 elements are exact).
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // nullptr: not written
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
  const int32_t* cu_seqlens_q;  // nullptr: batched
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // batched: the lengths; varlen: unused (max_seqlen_q sizes the grid)
  int num_heads, head_ratio;  // head_ratio = num_heads / num_heads_k (GQA)
  int head_dim, head_dim_v;
  float softmax_scale;
  float softcap;  // 0 = off
  int64_t window_size_left, window_size_right;  // < 0 = unbounded
  bool align_bottom_right;
  const float* alibi_slopes;  // nullptr = off
  int64_t alibi_batch_stride;
};

// One row per head_dim bucket (head_dim and head_dim_v both <= kHeadDim; smaller multiples of 8 are
// zero-filled by predicated loads). 4 warps; each warp owns kMTiles 16-row tiles of the query
// block, so block_m = 64 * kMTiles, and reuses every K/V fragment it loads kMTiles times.
//   hdim 64:  block_m 128, block_n 64: S 64 + O 64 fp32 registers per thread; smem 32 KB (block_n
//             128 spilled 536 bytes: S alone is 128 registers then).
//   hdim 128: block_m 128, block_n 64 (FA-2's sm80 choice): S 64 + O 128 registers; smem 64 KB.
//   hdim 256: block_m 64, block_n 64: O alone is 128 registers, so one m-tile per warp; 96 KB.
template <int kHeadDim_>
struct FwdTraits;

template <>
struct FwdTraits<64> {
  static constexpr int kHeadDim = 64, kBlockN = 64, kMTiles = 2;
};
template <>
struct FwdTraits<128> {
  static constexpr int kHeadDim = 128, kBlockN = 64, kMTiles = 2;
};
template <>
struct FwdTraits<256> {
  static constexpr int kHeadDim = 256, kBlockN = 64, kMTiles = 1;
};

template <int kHeadDim>
struct FwdShape {
  using T = FwdTraits<kHeadDim>;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps * T::kMTiles;
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kMTiles = T::kMTiles;
  // Q tile (reused for the output staging), one K tile and one V tile, 2 bytes per element.
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 2;
};

// Launches the forward kernel for one (element type, head_dim bucket), instantiated in the generated
// fwd_sm80_<dtype>_hdim<d>.cu. max_seqlen_q sizes the grid; num_heads and batch span it.
struct F16;
struct BF16;
template <typename Elem, int kHeadDim>
void launch_fwd_sm80(const FwdParams& p, int batch, int max_seqlen_q, void* stream);

}  // namespace flashattn::cuda

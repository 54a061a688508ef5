// Tile shapes of the sm80 (mma.sync) backward, one row per head_dim bucket, and the plain struct
// its kernels receive by value. Tuning these changes speed, never results.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// What the backward kernels read; filled from detail::Params by bwd_sm80_launch.cu. Pointers are
// device pointers; strides are in elements (int64 so that offsets past 2^31 elements are exact).
struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  const float* lse;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
  const int32_t* cu_seqlens_q;  // nullptr: batched
  const int32_t* cu_seqlens_k;
  int batch, seqlen_q, seqlen_k;  // varlen: the maxima (they size the grids and the workspace)
  int num_heads, num_heads_k, head_ratio;  // head_ratio = num_heads / num_heads_k (GQA)
  int head_dim, head_dim_v;
  float softmax_scale;
  float softcap;  // 0 = off
  // < 0 = unbounded; clamped on the host to at most seqlen_q + seqlen_k so that int suffices.
  int window_size_left, window_size_right;
  bool align_bottom_right;
  const float* alibi_slopes;  // nullptr = off
  int64_t alibi_batch_stride;

  // Workspace, each [batch, num_heads, seqlen_q] (row-major, seqlen_q the maximum):
  float* dsum;      // D = rowsum(dout ∘ out), 0 past the sequence end
  float* lse_log2;  // lse · log2(e); +inf where lse = −inf (fully masked row) or past the end
  float* dq_accum;  // [batch, num_heads, seqlen_q, head_dim] fp32; nullptr in deterministic mode
};

// One row per head_dim bucket (head_dim and head_dim_v both <= kHeadDim; smaller multiples of 8
// are zero-filled by predicated loads). Both backward kernels share the shape: a block keeps kRes
// "resident" rows in shared memory (keys in the dK/dV kernel, queries in the deterministic dQ
// kernel) and streams kStr rows of the other side per step, double-buffered. kWarpsRes warps own
// 16 resident rows each; kWarpsCol warps split the streamed columns of the score tile and the
// head-dim columns of the accumulators (which keeps the dK and dV accumulators at 64 fp32
// registers per thread in every bucket).
//   hdim 64:  128 x 64,  8 warps: S+dP 64 regs, dK+dV 64, dQ 16; smem 110 KB.
//   hdim 128: 128 x 64, 16 warps: S+dP 32 regs, dK+dV 64, dQ 16; smem 176 KB.
//   hdim 256:  64 x 64, 16 warps: S+dP 16 regs, dK+dV 64, dQ 32; smem 219 KB (needs sm_90's
//             227 KB per block; on sm_80's 163 KB the launch reports the shortfall).
template <int kHeadDim_>
struct BwdTraits;

template <>
struct BwdTraits<64> {
  static constexpr int kHeadDim = 64, kRes = 128, kStr = 64, kWarpsRes = 8, kWarpsCol = 1;
};
template <>
struct BwdTraits<128> {
  static constexpr int kHeadDim = 128, kRes = 128, kStr = 64, kWarpsRes = 8, kWarpsCol = 2;
};
template <>
struct BwdTraits<256> {
  static constexpr int kHeadDim = 256, kRes = 64, kStr = 64, kWarpsRes = 4, kWarpsCol = 4;
};

template <int kHeadDim>
struct BwdShape {
  using T = BwdTraits<kHeadDim>;
  static constexpr int kRes = T::kRes, kStr = T::kStr;
  static constexpr int kWarpsRes = T::kWarpsRes, kWarpsCol = T::kWarpsCol;
  static constexpr int kWarps = kWarpsRes * kWarpsCol;
  static constexpr int kThreads = 32 * kWarps;
  static_assert(kRes == 16 * kWarpsRes, "each resident warp row owns 16 rows");
  // Shared-memory rows are padded by 8 elements (16 bytes): consecutive rows then start 4 banks
  // apart, so the 8 row addresses of an ldmatrix phase and the packed score stores hit 8 different
  // bank groups without a swizzle, at any column offset.
  static constexpr int kLd = kHeadDim + 8;  // resident and streamed tiles
  static constexpr int kLdx = kStr + 8;     // P and dS tiles: resident rows x streamed columns
  static constexpr int kMaxRows = kRes > kStr ? kRes : kStr;
  static constexpr int kSmemBytes =
      (2 * kRes + 4 * kStr) * kLd * 2 + 2 * kRes * kLdx * 2 + 4 * kMaxRows * 4;
};

// Launches the dK/dV kernel (kDqMode false; also accumulates dq_accum when p.dq_accum) or the
// deterministic dQ kernel (kDqMode true) for one (element type, head_dim bucket); instantiated in
// bwd_sm80_hdim<d>.cu.
struct F16;
struct BF16;
template <typename Elem, int kHeadDim, bool kDqMode>
void launch_bwd_sm80(const BwdParams& p, void* stream);

}  // namespace flashattn::cuda

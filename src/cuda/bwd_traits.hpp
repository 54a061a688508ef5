// Tile shapes of the sm80 (mma.sync) backward, one row per head_dim bucket, and the plain struct
// its kernels receive by value. Tuning these changes speed, never results.
#pragma once

#include <cstdint>

#include "cuda/grid_order.hpp"
#include "cuda/host_device.hpp"
#include "cuda/tile_256.hpp"

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

  // Workspace, each [batch, num_heads, stat_rows] (row-major; stat_rows = seqlen_q, the maximum,
  // rounded up to kStatRowAlign, and then to a multiple of 80 under dq_accum_tile_rows 80, so that
  // every tile reads its statistics without bounds checks):
  int stat_rows;
  float* dsum;      // D = rowsum(dout ∘ out), 0 past the sequence end
  float* lse_log2;  // lse · log2(e); +inf where lse = −inf (fully masked row) or past the end
  float* dq_accum;  // fp32, nullptr in deterministic mode; layout per dq_accum_tiled:
  // 0: [batch, num_heads, stat_rows, head_dim] row-major (the sm80 kernel's atomics);
  // dq_accum_cols > 0: [batch, num_heads, stat_rows / 64, dq_accum_cols / 64] tiles of 64 x 64,
  // element (r, c) of a tile at r * 64 + ((c / 8) ^ (r % 8)) * 8 + c % 8 (the Hopper kernel's bulk
  // reduce-add: the tile is one contiguous block, and the XOR spreads the rows' 32-byte chunks
  // over the banks when the block is written to shared memory);
  // dq_accum_tile_rows 80 (BwdSm90Bm80Config, dq_accum_cols 128): [batch, num_heads, stat_rows /
  // 80, 8] blocks of 80 rows x 16 columns, element (r, c) of a block at (r / 8) · 128 + c · 8 + r % 8
  // (each consumer warp's dQᵀ fragment, 16 columns of 80 rows, adds one block, and its lanes' pairs
  // of consecutive rows land as float2 on distinct banks).
  int dq_accum_cols;
  int tail_pairs;  // (batch, head) pairs taken tile-major at the end of the grid (grouped_block())
  // The split tail (bwd_sm90_tma_wgmma.cuh; grid_order.hpp bwd_split_tail_blocks): blocks from
  // split_first on in grouped_block() order run as kBwdSplitParts launch-order blocks each, one per
  // share of the block's query steps; the parts sum their fp32 dK / dV in split_ws, and the last
  // to end writes dk and dv. split_sync: per consumer warp a ticket and one flag per later part
  // (split_sync_ints ints, zeroed by the preprocess). split_first at or past the grid's blocks: no
  // split (split_ws, split_sync nullptr).
  int64_t split_first;
  float* split_ws;
  int* split_sync;
  int64_t split_sync_ints;
  // Host side: launch the Hopper dK/dV kernel (head_dim 64 / 128; never the head_dim 256 one) with
  // programmatic dependent launch behind the preprocess (launch_kernel(), cuda_check.hpp); the
  // kernel's consumers, and blocks without keys, wait for the preprocess's statistics and zeroed
  // accumulators with griddep_wait(), its producer only before its first statistics load (block_m
  // 80; its K, V, Q and dO loads read only inputs); and the postprocess behind it the same way (it
  // waits first).
  bool pdl;
  int dq_accum_tile_rows;  // 64, or 80 (dq_accum above); stat_rows is then a multiple of it
};

inline constexpr int kBwdSplitParts = 3;

// The launch-order blocks of a dK/dV grid of `blocks` (pair, key tile) blocks whose blocks from
// split_first on run as kBwdSplitParts parts each (BwdParams::split_first).
inline int64_t bwd_launch_blocks(int64_t blocks, int64_t split_first) {
  return split_first < blocks ? split_first + kBwdSplitParts * (blocks - split_first) : blocks;
}

// p as a backward kernel of a (pairs, tiles) grid on `sms` SMs takes it: tail_pairs set by
// bwd_tail_pairs(), whose tail group only a mask (causal or a window) calls for.
inline BwdParams with_block_order(BwdParams p, int64_t pairs, int64_t tiles, int sms) {
  p.tail_pairs = bwd_tail_pairs(pairs, tiles, sms, p.window_size_left >= 0 || p.window_size_right >= 0);
  return p;
}

// Floats per query row of the dq accumulator (see BwdParams): its tile columns, or head_dim.
FLASHATTN_HOST_DEVICE inline int dq_accum_row_floats(const BwdParams& p) {
  return p.dq_accum_cols > 0 ? p.dq_accum_cols : p.head_dim;
}

// Offset of dq element (row, col) of one (batch, head) in the dq accumulator (see BwdParams): 64 x
// 64 tiles, or rows when dq_accum_cols is 0. dq_accum_tile_rows 80 has its own layout, below: the
// kernels that write it and its postprocess call dq_accum_block80_offset (`cols` columns) instead.
FLASHATTN_HOST_DEVICE inline int64_t dq_accum_offset(const BwdParams& p, int64_t row, int col) {
  if (p.dq_accum_cols == 0) return row * p.head_dim + col;
  const int64_t tile = (row / 64) * (p.dq_accum_cols / 64) + col / 64;
  const int r = int(row % 64), c = col % 64;
  return tile * 4096 + r * 64 + (((c / 8) ^ (r % 8)) * 8) + c % 8;
}
FLASHATTN_HOST_DEVICE inline int64_t dq_accum_block80_offset(int cols, int64_t row, int col) {
  const int64_t block = (row / 80) * (cols / 16) + col / 16;
  const int r = int(row % 80), c = col % 16;
  return block * 1280 + (r / 8) * 128 + c * 8 + r % 8;
}

// Multiple of every kRes and kStr below.
constexpr int kStatRowAlign = 128;

// One row per head_dim bucket (head_dim and head_dim_v both <= kHeadDim; smaller multiples of 8
// are zero-filled by predicated loads). Both backward kernels share the shape: a block keeps kRes
// "resident" rows in shared memory (keys in the dK/dV kernel, queries in the deterministic dQ
// kernel) and streams kStr rows of the other side per step, double-buffered. Each of the block's
// products has its own warp grid (rows x kWarps / rows), as in FlashAttention-2's sm80 backward:
//   score  Sᵀ, dPᵀ  [kRes x kStr]  kScoreWarpRows
//   acc    dK, dV (or dQ in the dQ kernel)  [kRes x kHeadDim]  kAccWarpRows
//   dq     dQ partial of the dK/dV kernel  [kStr x kHeadDim]  kDqWarpRows
// Warp tiles of 32 x 32 or larger read at least 16 FLOP per shared-memory byte. Registers: score
// tiles die before the dQ tile is born. Measured on the H200, bf16 (perf-notes.md, v4):
//   hdim 64:  128 x 64, 8 warps, 1 block/SM: S,dP 32x32; dK,dV 32x32; dQ 32x16; smem 110 KB.
//             184 TFLOP/s at s4096; 64-key tiles at 2 blocks/SM gave 161, 128-key tiles at
//             2 blocks/SM (spilling at 128 registers) 176.
//   hdim 128: 128 x 64, 8 warps: S,dP 32x32; dK,dV 32x64; dQ 32x32; smem 176 KB. 235 TFLOP/s at
//             s4096; 16 warps of 128 registers gave 199, 64-key tiles at 2 blocks/SM 174 (v3).
//   hdim 256:  64 x 64, 8 warps: S,dP 32x16; dK,dV 32x64; dQ 32x64; smem 219 KB (needs sm_90's
//             227 KB per block; on sm_80's 163 KB the launch reports the shortfall).
template <int kHeadDim_>
struct BwdTraits;

template <>
struct BwdTraits<64> {
  static constexpr int kHeadDim = 64, kRes = 128, kStr = 64, kWarps = 8, kMinBlocks = 1, kStages = 2;
  static constexpr int kScoreWarpRows = 4, kAccWarpRows = 4, kDqWarpRows = 2;
};
template <>
struct BwdTraits<128> {
  static constexpr int kHeadDim = 128, kRes = 128, kStr = 64, kWarps = 8, kMinBlocks = 1, kStages = 2;
  static constexpr int kScoreWarpRows = 4, kAccWarpRows = 4, kDqWarpRows = 2;
};
template <>
struct BwdTraits<256> {
  static constexpr int kHeadDim = 256, kRes = 64, kStr = 64, kWarps = 8, kMinBlocks = 1, kStages = 2;
  static constexpr int kScoreWarpRows = 2, kAccWarpRows = 2, kDqWarpRows = 2;
};

// A warp grid of kRows x kWarps / kRows over an M x N product: each warp gets kM 16-row tiles
// and kN 8-column tiles.
template <int M, int N, int kWarps, int kRows>
struct WarpGrid {
  static constexpr int kCols = kWarps / kRows;
  static constexpr int kM = M / kRows / 16, kN = N / kCols / 8;
  static_assert(kWarps % kRows == 0 && kM * kRows * 16 == M && kN * kCols * 8 == N && kN % 2 == 0,
                "warp grid must tile the product in 16 x 16 steps");
};

template <int kHeadDim>
struct BwdShape {
  using T = BwdTraits<kHeadDim>;
  static constexpr int kRes = T::kRes, kStr = T::kStr, kWarps = T::kWarps, kMinBlocks = T::kMinBlocks;
  static constexpr int kStages = T::kStages;  // buffers of the streamed tiles (1 or 2)
  static constexpr int kThreads = 32 * kWarps;
  using Score = WarpGrid<kRes, kStr, kWarps, T::kScoreWarpRows>;
  using Acc = WarpGrid<kRes, kHeadDim, kWarps, T::kAccWarpRows>;
  using Dq = WarpGrid<kStr, kHeadDim, kWarps, T::kDqWarpRows>;
  // Shared-memory rows are padded by 8 elements (16 bytes): consecutive rows then start 4 banks
  // apart, so the 8 row addresses of an ldmatrix phase and the packed score stores hit 8 different
  // bank groups without a swizzle, at any column offset.
  static constexpr int kLd = kHeadDim + 8;  // resident and streamed tiles
  static constexpr int kLdx = kStr + 8;     // P and dS tiles: resident rows x streamed columns
  static constexpr int kMaxRows = kRes > kStr ? kRes : kStr;
  static constexpr int kSmemBytes =
      (2 * kRes + 2 * kStages * kStr) * kLd * 2 + 2 * kRes * kLdx * 2 + 4 * kMaxRows * 4;
};

// Launches the dK/dV kernel (kDqMode false; also accumulates dq_accum when p.dq_accum) or the
// deterministic dQ kernel (kDqMode true) for one (element type, head_dim bucket); instantiated in
// bwd_sm80_hdim<d>.cu.
struct F16;
struct BF16;
template <typename Elem, int kHeadDim, bool kDqMode>
void launch_bwd_sm80(const BwdParams& p, void* stream);

}  // namespace flashattn::cuda

namespace flashattn::cuda {

// Tile shapes of the Hopper dK/dV kernel (bwd_sm90_tma_wgmma.cuh): a block keeps block_n = 128
// keys resident (two consumer warpgroups of 64 keys, wgmma's M) and streams block_m query rows per
// step (128 at head_dim 64; at 128, 80 without a mask or under a causal one from seqlen_q 2048,
// never with softcap or ALiBi, else 64) through kStages TMA buffers. Registers per consumer thread
// (240): dK and dV accumulators head_dim / 2 each, Sᵀ and dPᵀ block_m / 2 each, the dQ tile 32 (40
// at block_m 80).
// head_dim 256 does not fit (dK + dV alone would be 256 registers): BwdSm90SplitConfig below.
//   hdim 64:  smem 16 + 16 (K, V) + 2 · (16 + 16) (Q, dO) + 2 · 32 (dSᵀ) + 4 (statistics) + 32 (dQ) ≈ 197 KB.
//   hdim 128: smem 32 + 32 + 2 · (16 + 16) + 2 · 16 + 2 + 32 ≈ 195 KB.
template <int kHeadDim_, int kBlockM_ = (kHeadDim_ <= 64 ? 128 : 64)>
struct BwdSm90Config {
  // head_dim 64 streams 128 query rows per step (N = 128 for Sᵀ and dPᵀ: fewer shared-memory operand
  // bytes per FLOP and half the per-step overhead of 64-row steps; each consumer computes dQ for one
  // of the two 64-row halves, so that the registers fit); head_dim 128 (its dK, dV accumulators are
  // twice as large) takes 80 (BwdSm90Bm80Config) or 64 (launch's rule: bwd_sm80_launch.cu).
  static constexpr int kHeadDim = kHeadDim_, kBlockN = 128, kBlockM = kBlockM_, kStages = 2;
  static constexpr int kThreads = 384;
  // 80-row steps (FA-3's head_dim 128 tile without a mask; here under masks too): wgmma's M is
  // 64, so each consumer computes dQᵀ = Kᵀ dSᵀ for its 64 columns (M) over the 80 queries (N), with
  // dS stored [queries][keys] (K-major B), and the two consumers share one copy of the step's
  // statistics, which the producer loads into the TMA stage (a private copy each would pass 227 KB
  // by 768 bytes).
  static constexpr bool kDqTransposed = kBlockM == 80;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;   // K or V
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;    // one stage of Q or dO
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;    // one dSᵀ (or dS) buffer
  // Each consumer's dQ reads all of dSᵀ (both consumers' rows), so the buffer alternates per step:
  // one consumer may write step t + 1's while the other still reads step t's.
  static constexpr int kDsBuffers = 2;
  static constexpr int kStatBytes = kBlockM * 4;            // lse·log2e or D of one query tile
  // [consumer][buffer][lse, D], or [stage][lse, D] shared by the consumers (kDqTransposed).
  static constexpr int kStatAreaBytes = (kDqTransposed ? 4 : 8) * kStatBytes;
  // One consumer's fp32 dQ tile per step: 64 rows x 64 columns, or 64 columns x 80 rows.
  static constexpr int kDqBytes = 64 * (kDqTransposed ? kBlockM : 64) * 4;
  // (A second dQ staging buffer per consumer, so that a step's tile need not wait for the previous
  // step's reduce, would pass 227 KB at head_dim 64 next to two dSᵀ buffers.)
  static constexpr int kSmemBytes = 2 * kKVBytes + 2 * kStages * kQBytes + kDsBuffers * kDsBytes + kStatAreaBytes +
                                    2 * kDqBytes + 256 + 1024;
  static_assert(kBlockM == 64 || kBlockM == 128 || (kBlockM == 80 && kHeadDim == 128), "query rows per step");
  static_assert(!kDqTransposed || kStages == 2, "the statistics area holds one [lse, D] per stage");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};
// head_dim 128 without softcap or ALiBi (and without a mask, or causal from seqlen_q 2048): 80
// query rows per step (a quarter more work per step for the same per-step latencies). Shared
// memory 32 + 32 (K, V) + 2 · (20 + 20) (Q, dO) + 2 · 20 (dS) + 1.25 (statistics) + 2 · 20 (dQᵀ)
// ≈ 226 KB.
using BwdSm90Bm80Config = BwdSm90Config<128, 80>;
// Under a causal mask the 80-row steps pay from this seqlen_q on (bwd_sm80_launch.cu).
inline constexpr int kBwdBm80MinCausalSeqlenQ = 2048;

// Launches the Hopper dK/dV kernel (dq added into the tiled p.dq_accum by bulk reduce-adds) for one
// (element type, head_dim bucket 64 or 128); instantiated in the generated bwd_sm90_<dtype>_hdim<d>.cu.
template <typename Elem, int kHeadDim>
void launch_bwd_sm90(const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream);

// Tile shapes of the Hopper backward whose consumers split the head dimension
// (bwd_sm90_dsplit.cuh), for head_dim bucket 256: one consumer owning 64 keys of dK and dV would
// need up to 256 accumulator registers, so each owns some of their 64-column panels for all 64
// keys of the block, and Pᵀ / dSᵀ go between the two through shared memory. block_n = 64 keys
// resident, block_m = 64 query rows per step in kStages TMA buffers of Q and dO.
//
// kHeadDim (Q, K, dQ, dK columns) and kHeadDimV (V, dO, dV columns) are multiples of 64; smaller
// head dims of the bucket are zero-filled by TMA. Per step consumer 0 computes Sᵀ (head_dim / 64
// units of 64·64·64), consumer 1 dPᵀ (head_dim_v / 64); then a Q panel owned costs two units (dK and
// dQ) and a V panel one (dV). kQPanels0 / kVPanels0 are consumer 0's panels (the first ones),
// consumer 1 has the rest; chosen so that the consumer whose first product is longer owns less:
//   256 / 256: consumer 0 Sᵀ 4 + 2 Q + 2 V panels = 10, consumer 1 dPᵀ 4 + 2 + 2 = 10 units;
//     dQ staged in the step's own Q / dO buffers (each consumer in the half of the columns it alone
//     reads), which is what makes two stages fit:
//     smem 32 + 32 (K, V) + 2 · (32 + 32) (Q, dO) + 2 · 8 (Pᵀ) + 8 (dSᵀ) + 8 (1 − tanh²) + 1 ≈ 226 KB;
//   192 / 128 (MLA): consumer 0 Sᵀ 3 + 1 Q + 1 V = 6, consumer 1 dPᵀ 2 + 2 Q + 1 V = 7 (13 units
//     against the 256 config's 20: 1664 FLOP per (key, query) pair against 2560); dQ staged in a
//     buffer of its own (the Q / dO halves are too small for 64 x 96 fp32):
//     smem 24 + 16 + 2 · (24 + 16) + 32 + 1 + 48 (dQ) ≈ 202 KB;
//   192 / 192: consumer 0 Sᵀ 3 + 1 Q + 2 V = 7, consumer 1 dPᵀ 3 + 2 Q + 1 V = 8 (15 units):
//     smem 24 + 24 + 2 · (24 + 24) + 32 + 1 + 48 ≈ 226 KB.
template <int kHeadDim_, int kHeadDimV_ = kHeadDim_>
struct BwdSm90SplitConfig {
  static constexpr int kHeadDim = kHeadDim_, kHeadDimV = kHeadDimV_, kBlockN = 64, kBlockM = 64, kStages = 2;
  static constexpr int kThreads = 384;
  static constexpr int kQPanelsAll = kHeadDim / 64, kVPanelsAll = kHeadDimV / 64;
  static constexpr int kQPanels0 = kHeadDim == 256 ? 2 : 1;
  static constexpr int kVPanels0 = kHeadDimV >= 192 ? 2 : 1;
  // dQ staged in the step's Q / dO buffers (only where each consumer's halves hold its fp32 dQ).
  static constexpr bool kDqInStage = kHeadDim == 256 && kHeadDimV == 256;
  static constexpr int kKBytes = kBlockN * kHeadDim * 2, kVBytes = kBlockN * kHeadDimV * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2, kDoBytes = kBlockM * kHeadDimV * 2;  // one stage
  static constexpr int kTileBytes = kBlockN * kBlockM * 2;  // one [keys][queries] 16-bit tile
  static constexpr int kStatBytes = 2 * 2 * kBlockM * 4;    // [consumer][buffer][query] floats
  static constexpr int kDqTileBytes = 64 * 64 * 4;          // one fp32 64 x 64 dQ tile
  static constexpr int kDqBytes = kDqInStage ? 0 : kQPanelsAll * kDqTileBytes;  // the dQ buffer
  // The producer walks the steps for the dQ reduce-adds as well as the loads: 40 registers, which
  // leaves the consumers 232 (128 · (168 − 40) >= 256 · (232 − 168)), all their products need
  // (ptxas: no spills). 24 / 240, the other kernel's split, also compiles without spills; only
  // 40 / 232 has run on the device.
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  // Barriers: K / V full, each stage's full and dQ-ready, the dQ buffer's free.
  static constexpr int kBarBytes = 8 * (2 + 2 * kStages);
  static constexpr int kSmemBytes = kKBytes + kVBytes + kStages * (kQBytes + kDoBytes) + 4 * kTileBytes +
                                    kStatBytes + kDqBytes + kBarBytes + 1024;
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim, "whole 64-column panels");
  static_assert(kQPanels0 < kQPanelsAll && kVPanels0 < kVPanelsAll, "each consumer owns columns of dK and dV");
  static_assert(!kDqInStage || kBlockM * (kHeadDim / 2) * 4 == kQBytes,
                "a consumer's fp32 dQ (64 x head_dim / 2) fills its halves of one Q and one dO buffer");
  static_assert(128 * (168 - kProducerRegs) >= 256 * (kConsumerRegs - 168), "setmaxnreg split");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

// The configs that tile_256() (tile_256.hpp) picks in the 256 bucket: 256 / 256, and
// BwdSm90SplitConfig<kTile192HeadDim> and <kTile192HeadDim, kTileMlaHeadDimV> (bwd_sm90_dsplit.cuh).
// The columns of the dQ accumulator's tiles (BwdParams::dq_accum_cols) under each.
inline int bwd_256_tile_cols(Tile256 tile) {
  return tile == Tile256::d256 ? BwdSm90SplitConfig<256>::kHeadDim : BwdSm90SplitConfig<kTile192HeadDim>::kHeadDim;
}

// Whether a head_dim bucket's Hopper backward is the head-dim-split kernel (bwd_sm90_dsplit.cuh)
// rather than bwd_sm90_tma_wgmma.cuh: the dispatch, the grid limit and plan()'s kernel name.
constexpr bool bwd_sm90_dsplit_bucket(int head_dim_bucket) { return head_dim_bucket > 128; }

// Launches the head-dim-split Hopper backward for one (element type, head_dim bucket 256);
// instantiated in the generated bwd_sm90_<dtype>_hdim256.cu.
template <typename Elem, int kHeadDim>
void launch_bwd_sm90_dsplit(const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream);

}  // namespace flashattn::cuda

// What one block of the Hopper backward kernels (bwd_sm90_tma_wgmma.cuh, bwd_sm90_dsplit.cuh)
// works on, and their launch: a block keeps block_n keys of one (batch, KV head) and steps through
// the query tiles (block_m rows) of the GQA group's heads that see them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/bwd_traits.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_utils.cuh"
#include "cuda/sm90_utils.cuh"

namespace flashattn::cuda {

// Step t of a block visits query tile first + t % count of query head hk · head_ratio + t / count.
// The kernels carry (tile, head) along instead of dividing by `count` (a run-time divisor: ~40
// instructions per division, two per consumer step).
struct BwdStep {
  int tile = 0, head = 0;  // tile index in [0, count), head index in the group
};

template <int BN, int BM>
struct BwdSm90Block {
  int b, hk, n0;             // batch, KV head, first key of the block
  int64_t q_start, k_start;  // the sequence's first row in q / k (varlen), else 0
  int len_q, len_k;
  bool varlen;
  int tma_batch;             // the tensor maps' batch coordinate: 0 when varlen (packed rows)
  int off;                   // key − query offset of the mask's diagonal (bottom-right: len_k − len_q)
  int wl, wr;                // window_size_left / _right, −1 unbounded
  int first, count;          // query tiles [first, first + count) see keys [n0, n0 + BN)
  int head_ratio, iters;     // iters = count · head_ratio steps (a split part's share of them)
  BwdStep start;             // the first step: {0, 0}, or a split part's
  int split, part;           // the split tail (BwdParams::split_first): block index among the split
                             // ones and part in [0, kBwdSplitParts); -1, -1 for a whole block

  __device__ __forceinline__ BwdStep next(BwdStep step) const {
    if (++step.tile == count) {
      step.tile = 0;
      ++step.head;
    }
    return step;
  }
  __device__ __forceinline__ int head_of(BwdStep step) const { return hk * head_ratio + step.head; }
  __device__ __forceinline__ int m0_of(BwdStep step) const { return (first + step.tile) * BM; }
};

// This block's place in the launch order, and, for a split block's part (BwdParams::split_first),
// its split block index and part in [0, kBwdSplitParts) (else split = part = -1); returns the
// linear index of the (pair, tile) block it works on. blockIdx is read through volatile asm, so
// that a kernel which calls this again after its main loop recomputes split and part there instead
// of keeping them in registers through the loop (the consumers use 237 of their 240).
__device__ __forceinline__ int64_t bwd_split_item(const BwdParams& p, int& split, int& part) {
  unsigned x, y;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(y));
  const int64_t linear = int64_t(y) * gridDim.x + x;
  split = part = -1;
  if (linear < p.split_first) return linear;
  const int64_t item = linear - p.split_first;
  split = int(item / kBwdSplitParts);
  part = int(item % kBwdSplitParts);
  return p.split_first + split;
}

// This block's work (grouped_block() order of the (pair, key tile) grid, whose blocks from
// p.split_first on take kBwdSplitParts launch-order blocks each). n0 >= len_k: nothing (a key tile
// past a shorter varlen sequence, or a block past the grid's last part); the kernel returns.
template <int BN, int BM>
__device__ __forceinline__ BwdSm90Block<BN, BM> bwd_sm90_block(const BwdParams& p) {
  BwdSm90Block<BN, BM> blk;
  const int64_t tiles = (p.seqlen_k + BN - 1) / BN, grid_blocks = int64_t(gridDim.x) * tiles;
  const int64_t linear = bwd_split_item(p, blk.split, blk.part);
  const PairTile pt =
      linear < grid_blocks ? grouped_block_at(linear, gridDim.x, tiles, p.tail_pairs) : PairTile{0, int(tiles)};
  blk.b = pt.pair / p.num_heads_k;
  blk.hk = pt.pair % p.num_heads_k;
  blk.n0 = pt.tile * BN;
  blk.q_start = 0;
  blk.k_start = 0;
  blk.len_q = p.seqlen_q;
  blk.len_k = p.seqlen_k;
  blk.varlen = p.cu_seqlens_q != nullptr;
  if (blk.varlen) {
    blk.q_start = p.cu_seqlens_q[blk.b];
    blk.len_q = p.cu_seqlens_q[blk.b + 1] - int(blk.q_start);
    blk.k_start = p.cu_seqlens_k[blk.b];
    blk.len_k = p.cu_seqlens_k[blk.b + 1] - int(blk.k_start);
  }
  blk.tma_batch = blk.varlen ? 0 : blk.b;
  blk.off = p.align_bottom_right ? blk.len_k - blk.len_q : 0;
  blk.wl = p.window_size_left;
  blk.wr = p.window_size_right;
  // Query tiles that see any of keys [n0, j_last] (as in the sm80 kernel).
  const int j_last = min(blk.n0 + BN, blk.len_k) - 1;
  const int i_lo = blk.wr >= 0 ? max(0, blk.n0 - blk.off - blk.wr) : 0;
  const int i_hi = blk.wl >= 0 ? min(blk.len_q, j_last - blk.off + blk.wl + 1) : blk.len_q;
  blk.first = i_hi > i_lo ? i_lo / BM : 0;
  blk.count = i_hi > i_lo ? (i_hi + BM - 1) / BM - blk.first : 0;
  blk.head_ratio = p.head_ratio;
  blk.iters = blk.count * p.head_ratio;
  blk.start = BwdStep{};
  if (blk.part >= 0 && blk.count > 0) {
    // A part's share of the steps, which run head-major over the query tiles as in a whole block.
    const int t0 = blk.iters * blk.part / kBwdSplitParts, t1 = blk.iters * (blk.part + 1) / kBwdSplitParts;
    blk.start = BwdStep{t0 % blk.count, t0 / blk.count};
    blk.iters = t1 - t0;
    if (blk.iters == 0) blk.count = 0;  // no step: zeros into the sum, as a block without query tiles
  }
  return blk;
}

// Zeroes rows [valid, rows) of a swizzled tile of kPanels 64-column panels (sm90_utils.cuh's
// layout) at generic address `tile`: the rows of a varlen tile that belong to the next sequence.
// The 256 consumer threads share the work (ctid their index); the caller fences and meets the
// others on a named barrier before any product reads the tile.
template <int kPanels>
__device__ __forceinline__ void zero_tile_rows(uint8_t* tile, int rows, int valid, int ctid) {
  for (int i = ctid; i < (rows - valid) * kPanels * 8; i += 256) {
    const int r = valid + i / (kPanels * 8), c = i % (kPanels * 8);
    *reinterpret_cast<uint4*>(tile + (c >> 3) * rows * 128 + r * 128 + (((c ^ r) & 7) << 4)) = make_uint4(0, 0, 0, 0);
  }
}

// Launches a Hopper backward kernel of config Cfg (kBlockM, kBlockN, kThreads, kSmemBytes): the
// four TMA maps (q and dout in boxes of block_m rows, k and v of block_n, 64 columns each; rows_q
// / rows_k are the tensors' rows, the packed totals when varlen) and one block per (batch · KV
// head, key tile), taken in grouped_block() order; by programmatic dependent launch when `pdl`
// (only a kernel that calls griddep_wait() on every path before it touches the preprocess's
// workspace).
template <typename Elem, typename Cfg, typename Kernel>
void launch_bwd_sm90_kernel(Kernel kernel, const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream,
                            bool pdl) {
  const int64_t nb = p.cu_seqlens_q != nullptr ? 1 : p.batch;
  const CUtensorMap tq = sm90::make_tensor_map<Elem>("q", p.q, p.head_dim, rows_q, p.num_heads, nb, p.q_row_stride,
                                                     p.q_head_stride, p.q_batch_stride, Cfg::kBlockM);
  const CUtensorMap tdo = sm90::make_tensor_map<Elem>("dout", p.dout, p.head_dim_v, rows_q, p.num_heads, nb,
                                                      p.do_row_stride, p.do_head_stride, p.do_batch_stride,
                                                      Cfg::kBlockM);
  const CUtensorMap tk = sm90::make_tensor_map<Elem>("k", p.k, p.head_dim, rows_k, p.num_heads_k, nb, p.k_row_stride,
                                                     p.k_head_stride, p.k_batch_stride, Cfg::kBlockN);
  const CUtensorMap tv = sm90::make_tensor_map<Elem>("v", p.v, p.head_dim_v, rows_k, p.num_heads_k, nb,
                                                     p.v_row_stride, p.v_head_stride, p.v_batch_stride, Cfg::kBlockN);
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  // (pairs, tiles) blocks, of which those from p.split_first on take kBwdSplitParts each: the grid
  // is x = pairs wide and as many rows of them tall as that needs (bwd_sm90_block()).
  const int64_t pairs = int64_t(p.num_heads_k) * p.batch, tiles = (p.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t blocks = bwd_launch_blocks(pairs * tiles, p.split_first);
  const dim3 grid(unsigned(pairs), unsigned((blocks + pairs - 1) / pairs));
  launch_kernel(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, static_cast<cudaStream_t>(stream), pdl,
                with_block_order(p, pairs, tiles, multiprocessor_count()), tq, tk, tv, tdo);
}

}  // namespace flashattn::cuda

// The query block of one forward kernel block, shared by the sm80 and sm90 forwards: which
// sequence and rows it covers (batched or varlen), and which key tiles any of its rows can see.
#pragma once

#include <cstdint>

#include "cuda/fwd_traits.hpp"

namespace flashattn::cuda {

struct FwdBlock {
  int b, h, h_k;          // batch (sequence), query head, KV head
  int m0;                 // first query row of the block within its sequence (negative when the
                          // tiles are end-aligned: rows m0 .. -1 are not the sequence's)
  int len_q, len_k;       // the sequence's lengths
  int64_t q_start, k_start;  // the sequence's first rows in q/out and k/v (0 when batched)
  int64_t offset;         // causal/window diagonal offset: len_k − len_q bottom-right, else 0
  int64_t last_row;       // the block's last valid query row
  int nb_min, nb_max;     // key tiles [nb_min, nb_max) of block_n keys seen by some row (may be empty)
};

// The key tiles [lo, hi) of kBlockN keys that query rows first_row .. last_row (first_row <= last_row)
// of a sequence can see (params.hpp's visible_keys() over those rows; offset as FwdBlock's); lo = hi
// = 0 when they see none.
template <int kBlockN>
__device__ __forceinline__ void visible_key_tiles(const FwdParams& p, int64_t first_row, int64_t last_row,
                                                  int64_t offset, int len_k, int& lo, int& hi) {
  int64_t key_lo = 0, key_hi = len_k;
  if (p.window_size_left >= 0) key_lo = max(key_lo, first_row + offset - p.window_size_left);
  if (p.window_size_right >= 0) key_hi = min(key_hi, last_row + offset + p.window_size_right + 1);
  lo = key_lo >= key_hi ? 0 : int(key_lo / kBlockN);
  hi = key_lo >= key_hi ? 0 : int((key_hi + kBlockN - 1) / kBlockN);
}

// Fills `blk` for query block m_block of (batch b, query head h). Returns false when the block lies
// past its sequence's end (varlen batches are sized by the longest sequence). The key range is
// visible_key_tiles() over rows max(m0, 0) .. last_row.
// kEndAligned (the sm90 forward): under a mask with a right edge (causal, or a window's), block m
// covers rows m · kBlockM − shift .. with shift = (−len_q) mod kBlockM, so that the last block ends at
// the sequence's end and a partial block holds the first rows, which see the fewest keys.
template <int kBlockM, int kBlockN, bool kEndAligned = false>
__device__ __forceinline__ bool fwd_block_at(const FwdParams& p, int m_block, int h, int b, FwdBlock& blk) {
  blk.h = h;
  blk.b = b;
  blk.q_start = blk.k_start = 0;
  blk.len_q = p.seqlen_q;
  blk.len_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    blk.q_start = p.cu_seqlens_q[blk.b];
    blk.len_q = p.cu_seqlens_q[blk.b + 1] - p.cu_seqlens_q[blk.b];
    blk.k_start = p.cu_seqlens_k[blk.b];
    blk.len_k = p.cu_seqlens_k[blk.b + 1] - p.cu_seqlens_k[blk.b];
  }
  blk.m0 = m_block * kBlockM;
  if (kEndAligned && p.window_size_right >= 0) blk.m0 -= (kBlockM - blk.len_q % kBlockM) % kBlockM;
  if (blk.m0 >= blk.len_q) return false;
  blk.h_k = blk.h / p.head_ratio;
  blk.offset = p.align_bottom_right ? int64_t(blk.len_k) - blk.len_q : 0;
  blk.last_row = min(blk.m0 + kBlockM, blk.len_q) - 1;
  visible_key_tiles<kBlockN>(p, max(blk.m0, 0), blk.last_row, blk.offset, blk.len_k, blk.nb_min, blk.nb_max);
  return true;
}

// fwd_block_at for grid block (gridDim.x − 1 − blockIdx.x, blockIdx.y = head, blockIdx.z = batch):
// query blocks are taken from the end of the sequence first, since under a causal mask the last
// ones see the most keys.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ bool fwd_block(const FwdParams& p, FwdBlock& blk) {
  return fwd_block_at<kBlockM, kBlockN>(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z, blk);
}

}  // namespace flashattn::cuda

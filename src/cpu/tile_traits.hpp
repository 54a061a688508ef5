// Tile shapes of the CPU backend: one constexpr table per pass, keyed by head-dim bucket.
// Tuning changes speed, never results (every tile shape computes the same math; only the
// floating-point summation order of the online softmax differs, within fp32 rounding).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/params.hpp"

namespace flashattn::cpu {

struct TileShape {
  int64_t max_head_dim;  // bucket: max(head_dim, head_dim_v) <= this
  int64_t block_m;       // query rows per tile
  int64_t block_n;       // key rows per tile
};

// Forward (FA-2 Alg. 1). Measured on the 2-core Xeon (AVX-512, 2 FMA units) with
// seqlen 2048, 16 heads, fp32, see docs/perf-notes.md "CPU backend". Larger block_m amortizes
// Eigen's repacking of the K/V tile over more query rows; block_n = 128 keeps the S tile
// (block_m x block_n fp32) and the packed K/V panels inside the 2 MiB L2 while giving the
// softmax row pass long contiguous rows.
inline constexpr TileShape kFwdTiles[] = {
    {64, 256, 128},
    {128, 256, 128},
    {256, 128, 128},
};

// Backward (FA-2 Alg. 2): five tiles live per step (S/P, dP/dS, the Q, dO tiles and the dK, dV
// accumulators), so tiles are smaller than the forward's to stay in L2.
inline constexpr TileShape kBwdTiles[] = {
    {64, 64, 128},
    {128, 64, 128},
    {256, 64, 64},
};

template <std::size_t N>
constexpr TileShape pick_tile(const TileShape (&table)[N], int64_t head_dim) {
  for (const TileShape& t : table)
    if (head_dim <= t.max_head_dim) return t;
  return table[N - 1];
}

inline TileShape fwd_tile(const detail::Params& p) {
  return pick_tile(kFwdTiles, std::max(p.head_dim, p.head_dim_v));
}
inline TileShape bwd_tile(const detail::Params& p) {
  return pick_tile(kBwdTiles, std::max(p.head_dim, p.head_dim_v));
}

}  // namespace flashattn::cpu

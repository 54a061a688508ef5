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

// Forward (FA-2 Alg. 1): block_m query rows run along the vector lanes of Sᵀ = K Qᵀ, block_n keys
// along its rows. Each item streams all its visible K/V rows once, so a larger block_m divides
// that traffic (and the per-tile V copy) over more rows. Sweep on this machine (1 thread, fp32,
// seqlen 2048, 8 heads, quiet moment; % of the 174 GFLOP/s single-core FMA peak, d64 / d128):
//   128x64 61/60, 256x64 54/58, 256x128 53-55/64-65, 256x256 55/58, 512x32 55/66, 512x64 60/65,
//   512x128 61-63/65, 1024x64 51/55; causal 512x128 53-54/55 vs 256x128 49-50/55.
//   d256: 128x128 65, 256x128 66, 256x64 70.
// At 512 x 128 the Qᵀ, Sᵀ and Oᵀ tiles (d x 512, 128 x 512, dv x 512 fp32, 256 KiB each at
// d = 128) stay in the 2 MiB L2, and a Qᵀ panel of the product (d x 32 lanes) in the 48 KiB L1.
inline constexpr TileShape kFwdTiles[] = {
    {64, 512, 128},
    {128, 512, 128},
    {256, 256, 64},
};

// Backward (FA-2 Alg. 2): an item owns block_n keys (along the lanes of S = Q Kᵀ) and walks the
// query rows in tiles of block_m; S, dP (block_m x block_n), Q, dO (block_m x d) and the dK/dV
// accumulators (block_n x d) all live at once, so block_m is smaller than the forward's. 64 x 128
// measured equal to 128 x 128 at d = 64 and 7-15% faster at d = 128 (1 thread, seqlen 2048).
inline constexpr TileShape kBwdTiles[] = {
    {64, 512, 128},
    {128, 512, 128},
    {256, 256, 64},
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

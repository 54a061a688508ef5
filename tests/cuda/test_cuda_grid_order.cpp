// The backward's block order (src/cuda/grid_order.hpp), checked on the host: every block of a
// (pairs, tiles) grid gets a distinct (pair, tile), all of them are covered, the head of the order
// is tile-fastest and the tail group tile-major. A mapping that skipped or repeated a block would
// leave dK/dV rows unwritten or written twice on the GPU. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/grid_order.hpp"

namespace flashattn::cuda {
namespace {

void check_order(int64_t pairs, int64_t tiles, int tail) {
  SCOPED_TRACE("pairs " + std::to_string(pairs) + ", tiles " + std::to_string(tiles) + ", tail " +
               std::to_string(tail));
  std::vector<int> seen(static_cast<size_t>(pairs * tiles), 0);
  PairTile prev{-1, -1};
  for (int64_t linear = 0; linear < pairs * tiles; ++linear) {
    const PairTile pt = grouped_block_at(linear, pairs, tiles, tail);
    ASSERT_GE(pt.pair, 0);
    ASSERT_LT(pt.pair, pairs);
    ASSERT_GE(pt.tile, 0);
    ASSERT_LT(pt.tile, tiles);
    ++seen[static_cast<size_t>(pt.pair * tiles + pt.tile)];
    if (pt.pair < pairs - tail) {
      // Head: tile-fastest, pairs in order.
      EXPECT_EQ(pt.pair, linear / tiles);
      EXPECT_EQ(pt.tile, linear % tiles);
    } else if (prev.pair >= pairs - tail) {
      // Tail: tile-major; the tile index never goes back.
      EXPECT_GE(pt.tile, prev.tile);
      if (pt.tile == prev.tile) EXPECT_EQ(pt.pair, prev.pair + 1);
    } else {
      EXPECT_EQ(pt.tile, 0);  // the tail starts with every tail pair's heaviest tile
      EXPECT_EQ(pt.pair, pairs - tail);
    }
    prev = pt;
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "block (pair, tile) index " << i;
}

TEST(CudaGridOrder, EveryBlockOnceHeadTileFastestTailTileMajor) {
  for (int64_t pairs : {1, 2, 3, 5, 8, 33, 128, 1024})
    for (int64_t tiles : {1, 2, 3, 4, 16, 64, 129})
      for (bool masked : {false, true}) check_order(pairs, tiles, bwd_tail_pairs(pairs, tiles, 132, masked));
  for (int tail : {0, 1, 2, 7}) check_order(7, 5, tail);  // every tail size, down to all pairs
}

TEST(CudaGridOrder, TailPairs) {
  EXPECT_EQ(bwd_tail_pairs(1024, 4, 132, false), 0);  // unmasked: pure tile-fastest
  EXPECT_EQ(bwd_tail_pairs(1024, 4, 132, true), 66);  // >= two waves: 66 pairs x 4 tiles = 264
  EXPECT_EQ(bwd_tail_pairs(8, 64, 132, true), 5);     // Llama-3.1-8B s8192: 5 x 64 = 320 >= 264
  EXPECT_EQ(bwd_tail_pairs(3, 4, 132, true), 3);      // fewer pairs than that: all of them
  EXPECT_EQ(bwd_tail_pairs(16, 1000, 132, true), 1);  // one pair already holds two waves
}

}  // namespace
}  // namespace flashattn::cuda

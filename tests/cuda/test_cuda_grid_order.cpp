// The backward's block order (src/cuda/grid_order.hpp), checked on the host: every block of a
// (pairs, tiles) grid gets a distinct (pair, tile), all of them are covered, the head of the order
// is tile-fastest and the tail group tile-major. A mapping that skipped or repeated a block would
// leave dK/dV rows unwritten or written twice on the GPU. Runs without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
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
  EXPECT_EQ(bwd_tail_pairs(8, 64, 132, true), 8);     // Llama-3.1-8B s8192: 512 blocks, 3.9 waves: all
  EXPECT_EQ(bwd_tail_pairs(16, 66, 132, true), 16);   // 1056 blocks: 8 waves, still all
  EXPECT_EQ(bwd_tail_pairs(17, 66, 132, true), 4);    // one pair more: a two-wave tail, 4 x 66 = 264
  EXPECT_EQ(bwd_tail_pairs(3, 4, 132, true), 3);      // fewer pairs than that: all of them
  EXPECT_EQ(bwd_tail_pairs(16, 1000, 132, true), 1);  // one pair already holds two waves
}

// In-order dispatch of `blocks` blocks onto `sms` SMs, each block taking the SM that frees first
// (how the hardware hands out the blocks of a launch, and how a dynamic tile counter does),
// block `linear` costing cost(linear). Returns the makespan over the mean load per SM: 1 is a
// perfect balance.
template <typename Cost>
double makespan_over_mean(int64_t blocks, int sms, Cost cost) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < sms; ++i) free_at.push(0.0);
  double total = 0, end = 0;
  for (int64_t linear = 0; linear < blocks; ++linear) {
    const double work = cost(linear), start = free_at.top();
    free_at.pop();
    free_at.push(start + work);
    end = std::max(end, start + work);
    total += work;
  }
  return end / (total / sms);
}

// The backward's blocks under a causal mask: key tile `tile` of a square causal grid sees
// (tiles - tile) query tiles of two 64-row steps for each of the `group` query heads of its KV
// head (GQA), plus a fixed cost of six steps (K / V load, pipeline ramp, epilogue; perf-notes bwd).
// On 132 SMs, as the forward's count below.
double causal_makespan_over_mean(int64_t pairs, int64_t tiles, int group, int tail) {
  return makespan_over_mean(pairs * tiles, 132, [&](int64_t linear) {
    return 2.0 * group * double(tiles - grouped_block_at(linear, pairs, tiles, tail).tile) + 6.0;
  });
}

// The balance that bwd_tail_pairs() buys under a causal mask, by that count: within 2 % of the
// mean for grids of few waves (Llama-3.1-8B's 8 x 64 blocks ended 5 % after it with a two-wave
// tail) and within 3.5 % for the FA-2 paper's shapes (2048 blocks in 15.5 waves: most of it is
// the last wave's half-empty SMs).
TEST(CudaGridOrder, CausalBalance) {
  struct Grid {
    int64_t pairs, tiles;
    int group;
    double bound;
  };
  // Llama-3.1-8B at seqlen 8192 (batch 1, 2), 4096 (batch 2) and 16384; FA-2 paper shapes at
  // head_dim 128 (seqlen 8192, 512, 2048, 16384).
  for (const Grid& g : {Grid{8, 64, 4, 1.02}, Grid{16, 64, 4, 1.02}, Grid{16, 32, 4, 1.02}, Grid{8, 128, 4, 1.02},
                        Grid{32, 64, 1, 1.035}, Grid{512, 4, 1, 1.035}, Grid{128, 16, 1, 1.035},
                        Grid{16, 128, 1, 1.035}}) {
    const int tail = bwd_tail_pairs(g.pairs, g.tiles, 132, true);
    EXPECT_LE(causal_makespan_over_mean(g.pairs, g.tiles, g.group, tail), g.bound)
        << "pairs " << g.pairs << ", tiles " << g.tiles << ", tail " << tail;
  }
  // The two-wave tail it replaces (5 pairs there).
  EXPECT_GT(causal_makespan_over_mean(8, 64, 4, two_wave_tail_pairs(8, 64, 132)), 1.04);
}

// The backward's split tail: the last partial wave's blocks, where 3 parts apiece fit in two
// thirds of a wave and each block has at least 2048 query rows.
TEST(CudaGridOrder, BackwardSplitTailBlocks) {
  // FA-2 paper shapes at head_dim 128 and Llama-3.1-8B: 2048 key blocks on 132 SMs, 15 waves and 68.
  EXPECT_EQ(bwd_split_tail_blocks(2048, 132, 2048, 3), 68);
  EXPECT_EQ(bwd_split_tail_blocks(2048, 132, 16384, 3), 68);
  EXPECT_EQ(bwd_split_tail_blocks(2048, 132, 1024, 3), 0);  // seqlen 1024: parts too short to pay
  EXPECT_EQ(bwd_split_tail_blocks(2112, 132, 2048, 3), 0);  // whole waves
  EXPECT_EQ(bwd_split_tail_blocks(132, 132, 2048, 3), 0);   // one wave
  EXPECT_EQ(bwd_split_tail_blocks(100, 132, 2048, 3), 0);
  EXPECT_EQ(bwd_split_tail_blocks(132 + 88, 132, 2048, 3), 88);  // 264 parts: two thirds of a wave
  EXPECT_EQ(bwd_split_tail_blocks(132 + 89, 132, 2048, 3), 0);   // 267: a third wave of parts
  EXPECT_EQ(bwd_split_tail_blocks(153, 132, 2112, 3), 21);       // test_cuda_backward's own-threshold case
  EXPECT_EQ(bwd_split_tail_blocks(2048, 0, 2048, 3), 0);
  EXPECT_EQ(bwd_split_tail_blocks(2048, 132, 2048, 1), 0);
}

// The forward's tile split (FastDiv, grid_order.hpp): n / d by multiply-high and shift equals the
// integer division for every 31-bit n, checked at the edges of each quotient and at random n for
// divisors up to 2^31 - 1 (a wrong quotient would send a persistent block to another tile's rows).
TEST(CudaGridOrder, FastDivMatchesDivision) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<int> divisors;
  for (int d = 1; d <= 4100; ++d) divisors.push_back(d);
  for (int e = 12; e <= 30; ++e)
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << e) + delta);
  divisors.push_back(0x7fffffff);
  for (int i = 0; i < 2000; ++i) divisors.push_back(int(1 + rng() % 0x7fffffff));
  for (const int d : divisors) {
    const FastDiv f(d);
    auto check = [&](int64_t n) {
      if (n < 0 || n > 0x7fffffff) return;
      ASSERT_EQ(f.div(int(n)), int(n / d)) << "n " << n << ", d " << d;
    };
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(d) - 1, int64_t(d), int64_t(d) + 1, int64_t(0x7fffffff),
                      int64_t(0x7ffffffe), int64_t(0x7fffffff) - d})
      check(n);
    for (int64_t q : {int64_t(2), int64_t(3), int64_t(1000), int64_t(0x7fffffff) / d}) {
      check(q * d - 1);
      check(q * d);
      check(q * d + d - 1);
    }
    for (int i = 0; i < 200; ++i) check(int64_t(rng() % 0x80000000ull));
  }
}

// The forward's TileOrder (FastDiv divisions) maps every tile as grouped_block_at() does.
TEST(CudaGridOrder, TileOrderMatchesGroupedBlockAt) {
  for (int64_t pairs : {1, 2, 3, 5, 8, 33, 256, 4096})
    for (int tiles : {1, 2, 3, 4, 16, 64, 129})
      for (int tail : {0, 1, 2, 3, 5, 17, 66}) {
        if (tail > pairs) continue;
        const TileOrder order(pairs, tiles, tail);
        for (int64_t linear = 0; linear < pairs * tiles; ++linear) {
          const PairTile a = order.at(int(linear)), b = grouped_block_at(linear, pairs, tiles, tail);
          ASSERT_EQ(a.pair, b.pair) << "pairs " << pairs << ", tiles " << tiles << ", tail " << tail << ", " << linear;
          ASSERT_EQ(a.tile, b.tile) << "pairs " << pairs << ", tiles " << tiles << ", tail " << tail << ", " << linear;
        }
      }
  EXPECT_EQ(fwd_tail_pairs(256, 8, 132, false), 0);  // unmasked: pair-major throughout
  EXPECT_EQ(fwd_tail_pairs(256, 8, 132, true), 33);  // two waves: 33 x 8 = 264 tiles
  EXPECT_EQ(fwd_tail_pairs(32, 64, 132, true), 5);   // Llama-3.1-8B s8192 (32 heads of 64 tiles)
  EXPECT_EQ(fwd_tail_pairs(4, 16, 132, true), 4);    // fewer pairs than two waves need: all
}

// The forward's causal tiles through TileOrder (tile 0 is a pair's last query block, which sees
// all `tiles` key blocks of block_m keys; tile t sees tiles - t), each costing its key blocks plus
// 1.1 for its set-up and epilogue (the clock64 timeline at head_dim 128, perf-notes forward).
double fwd_causal_makespan_over_mean(int64_t pairs, int tiles, int tail) {
  const TileOrder order(pairs, tiles, tail);
  return makespan_over_mean(pairs * tiles, 132, [&](int64_t linear) {
    return double(tiles - order.at(int(linear)).tile) + 1.1;
  });
}

// Pair-major to the end (tail 0) ends 5-7 % after the mean at the FA-2 paper's causal head_dim 128
// shapes (512 pairs of 4 tiles at seqlen 512 ... 32 of 64 at 8192, as Llama-3.1-8B's);
// fwd_tail_pairs()'s order 1.1-1.6 % after it, 2.9 % at seqlen 512 (the last wave of 2048 tiles).
TEST(CudaGridOrder, ForwardCausalBalance) {
  struct Grid {
    int64_t pairs;
    int tiles;
  };
  for (const Grid& g : {Grid{256, 8}, Grid{128, 16}, Grid{64, 32}, Grid{32, 64}, Grid{512, 4}}) {
    const int tail = fwd_tail_pairs(g.pairs, g.tiles, 132, true);
    EXPECT_GT(fwd_causal_makespan_over_mean(g.pairs, g.tiles, 0), 1.04) << "pairs " << g.pairs << ", tiles " << g.tiles;
    EXPECT_LE(fwd_causal_makespan_over_mean(g.pairs, g.tiles, tail), 1.03)
        << "pairs " << g.pairs << ", tiles " << g.tiles << ", tail " << tail;
  }
}

}  // namespace
}  // namespace flashattn::cuda

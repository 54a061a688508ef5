// The Hopper forward's choice of head_dim 64's short-sequence tile (fwd_short_tile_pays in
// src/cuda/fwd_traits.hpp), checked on the host: the GPU tests' shapes are too small to reach it
// by default (they force it with FLASHATTN_CUDA_FWD_SHORT_TILE=1 instead), so the decision itself
// is tested here. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/fwd_traits.hpp"

namespace flashattn::cuda {
namespace {

using Traits = FwdSm90Traits<64>;
constexpr int kShort = Traits::ShortConfig::kBlockM, kLong = Traits::Config::kBlockM;
constexpr int kSms = 132;  // the H200's

bool pays(int max_seqlen_q, int64_t batch_heads, int sms = kSms) {
  return fwd_short_tile_pays(max_seqlen_q, batch_heads, sms, kShort, kLong, Traits::kShortMaxSeqlenQ);
}

TEST(CudaFwdTiles, ShapesOfTheShortTile) {
  static_assert(kShort == 256 && kLong == 192 && Traits::kShortMaxSeqlenQ == 1024);
  // The FA-2 paper shapes at head_dim 64 (batch · seqlen = 16384, 32 heads): 2048 tiles of 256 rows
  // in 16 waves (4096 row-waves) against 3072 of 192 in 24 (4608).
  EXPECT_TRUE(pays(512, 32 * 32));
  EXPECT_TRUE(pays(1024, 16 * 32));
  // Longer sequences keep block_m 192 whatever the batch (the short tile was 3-10 % slower there).
  EXPECT_FALSE(pays(1025, 16 * 32));
  EXPECT_FALSE(pays(2048, 8 * 32));
  EXPECT_FALSE(pays(16384, 1 * 32));
}

TEST(CudaFwdTiles, FewTilesKeepTheSmallerTile) {
  // Where both fit in one wave, 256-row tiles would take ~4/3 as long as 192-row ones.
  EXPECT_FALSE(pays(1024, 1));   // 4 tiles of 256 against 6 of 192
  EXPECT_FALSE(pays(1024, 22));  // 88 against 132: one wave each
  EXPECT_FALSE(pays(512, 44));   // 88 against 132
  // Where the 192-row tiles need a second wave and the 256-row ones do not, the larger tile wins.
  EXPECT_TRUE(pays(1024, 23));  // 92 (one wave) against 138 (two)
  EXPECT_TRUE(pays(512, 66));   // 132 against 198
}

TEST(CudaFwdTiles, DegenerateInputs) {
  EXPECT_FALSE(pays(1024, 512, 0));  // no multiprocessor count: keep the default tile
  EXPECT_FALSE(pays(1, 1 << 20));    // one-row sequences: as many tiles either way, the smaller is cheaper
  EXPECT_TRUE(pays(1024, int64_t(1) << 40));  // 2^42 tiles: no overflow in the wave count
}

}  // namespace
}  // namespace flashattn::cuda

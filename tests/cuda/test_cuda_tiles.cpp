// The Hopper forward's choice of head_dim 64's short-sequence tile (fwd_short_tile_pays in
// src/cuda/fwd_traits.hpp), checked on the host: the GPU tests' shapes are too small to reach it
// by default (they force it with FLASHATTN_CUDA_FWD_SHORT_TILE=1 instead), so the decision itself
// is tested here; and the key tiles whose softmax skips the mask (mask_free_key_tiles), against
// every (row, key) pair; which of the 256 bucket's configs a call's head dims take in both
// passes (tile_256); and the backward's dq accumulator layouts (dq_accum_offset,
// dq_accum_block80_offset). Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/params.hpp"
#include "cuda/bwd_traits.hpp"
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

TEST(CudaTiles, The256BucketTakesTheNarrowestConfig) {
  // MLA's head_dim 192 / head_dim_v 128 and anything inside it (head_dim 160 / 96, 136 / 40).
  EXPECT_EQ(tile_256(192, 128), Tile256::mla);
  EXPECT_EQ(tile_256(160, 96), Tile256::mla);
  EXPECT_EQ(tile_256(136, 40), Tile256::mla);
  // Both within 192, head_dim_v above 128 (head_dim_v > head_dim too: 64 / 160).
  EXPECT_EQ(tile_256(192, 192), Tile256::d192);
  EXPECT_EQ(tile_256(64, 160), Tile256::d192);
  EXPECT_EQ(tile_256(192, 136), Tile256::d192);
  // Either above 192: the 256 config (200 / 100: head_dim_v alone would fit MLA's).
  EXPECT_EQ(tile_256(200, 100), Tile256::d256);
  EXPECT_EQ(tile_256(128, 200), Tile256::d256);
  EXPECT_EQ(tile_256(256, 256), Tile256::d256);
  // The testing switch keeps the 256 config.
  EXPECT_EQ(tile_256(192, 128, false), Tile256::d256);
  EXPECT_EQ(tile_256(192, 192, false), Tile256::d256);
}

// (head_dim, head_dim_v) of a config, so that both passes' configs are checked alike.
template <class Cfg>
std::pair<int, int> dims() {
  return {Cfg::kHeadDim, Cfg::kHeadDimV};
}

TEST(CudaTiles, EachPassRunsAConfigThatHoldsTheCall) {
  // Forward and backward: the chosen config's head dims hold the call's, the narrower ones are
  // those tile_256() names, and the backward's dQ accumulator tiles match its config's columns.
  using F = FwdSm90Traits<256>;
  const std::pair<int, int> fwd[] = {dims<F::Config>(), dims<F::D192Config>(), dims<F::MlaConfig>()};
  const std::pair<int, int> bwd[] = {dims<BwdSm90SplitConfig<256>>(), dims<BwdSm90SplitConfig<192, 192>>(),
                                     dims<BwdSm90SplitConfig<192, 128>>()};
  for (int d : {64, 136, 160, 192, 200, 256})
    for (int dv : {40, 96, 128, 136, 160, 192, 200, 256}) {
      const int t = static_cast<int>(tile_256(d, dv));
      for (const auto& cfg : {fwd[t], bwd[t]}) {
        EXPECT_LE(d, cfg.first) << d << " / " << dv;
        EXPECT_LE(dv, cfg.second) << d << " / " << dv;
      }
      EXPECT_EQ(tile_256(d, dv, false), Tile256::d256) << d << " / " << dv;
    }
  EXPECT_EQ(fwd[1], (std::pair<int, int>{192, 192}));
  EXPECT_EQ(fwd[2], (std::pair<int, int>{192, 128}));
  EXPECT_EQ(bwd[1], fwd[1]);
  EXPECT_EQ(bwd[2], fwd[2]);
  EXPECT_EQ(bwd_256_tile_cols(Tile256::mla), (BwdSm90SplitConfig<192, 128>::kHeadDim));
  EXPECT_EQ(bwd_256_tile_cols(Tile256::d192), (BwdSm90SplitConfig<192, 192>::kHeadDim));
  EXPECT_EQ(bwd_256_tile_cols(Tile256::d256), (BwdSm90SplitConfig<256>::kHeadDim));
}

TEST(CudaFwdTiles, DegenerateInputs) {
  EXPECT_FALSE(pays(1024, 512, 0));  // no multiprocessor count: keep the default tile
  EXPECT_FALSE(pays(1, 1 << 20));    // one-row sequences: as many tiles either way, the smaller is cheaper
  EXPECT_TRUE(pays(1024, int64_t(1) << 40));  // 2^42 tiles: no overflow in the wave count
}

// Whether every key of tile nb is visible to every row first_row .. last_row, row by row through
// the mask's one definition (params.hpp's visible_keys(), whose offset is len_k − len_q under
// bottom-right alignment: len_q = len_k − offset gives any offset).
template <int kBlockN>
bool tile_whole(int nb, int64_t first_row, int64_t last_row, int64_t offset, int len_k, int left, int right) {
  detail::Params p{};
  p.window_size_left = left;
  p.window_size_right = right;
  p.align_bottom_right = true;
  for (int64_t row = first_row; row <= last_row; ++row) {
    const detail::KeyRange keys = detail::visible_keys(p, row, int64_t(len_k) - offset, len_k);
    if (keys.lo > int64_t(nb) * kBlockN || keys.hi < int64_t(nb + 1) * kBlockN) return false;
  }
  return true;
}

template <int kBlockN>
void check_mask_free(int64_t first_row, int64_t last_row, int64_t offset, int len_k, int left, int right) {
  int lo = -1, hi = -1;
  mask_free_key_tiles<kBlockN>(first_row, last_row, offset, len_k, left, right, lo, hi);
  const std::string where = "block_n " + std::to_string(kBlockN) + " rows " + std::to_string(first_row) + ".." +
                            std::to_string(last_row) + " offset " + std::to_string(offset) + " len_k " +
                            std::to_string(len_k) + " window (" + std::to_string(left) + ", " +
                            std::to_string(right) + ")";
  for (int nb = 0; nb * kBlockN < len_k; ++nb)
    ASSERT_EQ(nb >= lo && nb < hi, tile_whole<kBlockN>(nb, first_row, last_row, offset, len_k, left, right))
        << where << ", key tile " << nb << ", got [" << lo << ", " << hi << ")";
}

TEST(CudaFwdTiles, MaskFreeKeyTilesMatchEveryPair) {
  // Fresh cases each run (the seed is printed with any failure): a warpgroup's 64 rows (partly
  // before row 0 in an end-aligned first tile), causal top-left / bottom-right offsets, windows on
  // either side or none; one case in ten with offsets and windows near ±2^31.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 3000; ++i) {
    const bool huge = uniform(0, 9) == 0;
    const int len_k = uniform(1, 700), len_q = uniform(1, 700);
    const int64_t first_row = uniform(-63, len_q - 1);
    const int64_t last_row = std::min<int64_t>(first_row + 63, len_q - 1);
    const int64_t offset =
        huge ? int64_t(uniform(-0x7fffffff, 0x7fffffff)) : uniform(0, 1) ? int64_t(len_k) - len_q : 0;
    auto window = [&] { return uniform(0, 2) == 0 ? -1 : huge ? uniform(0, 0x7fffffff) : uniform(0, 300); };
    const int left = window(), right = window();
    check_mask_free<64>(first_row, last_row, offset, len_k, left, right);
    check_mask_free<128>(first_row, last_row, offset, len_k, left, right);
    // (The 256 bucket's block_n 80 and 112: floor division where it is not a shift.)
    check_mask_free<80>(first_row, last_row, offset, len_k, left, right);
    check_mask_free<112>(first_row, last_row, offset, len_k, left, right);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaFwdTiles, MaskFreeKeyTilesEdges) {
  int lo = -1, hi = -1;
  // Causal, seqlen_q = seqlen_k = 1024, block_n 64: tiles 0-2 (keys 0..191) are visible to all of
  // rows 192..255; tile 3 (keys 192..255) crosses their diagonal.
  mask_free_key_tiles<64>(192, 255, 0, 1024, -1, 0, lo, hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 3);
  // No mask: every whole tile; a partial last tile (len_k 1000 = 15 · 64 + 40) is masked.
  mask_free_key_tiles<64>(0, 63, 0, 1000, -1, -1, lo, hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 15);
  // Window sizes near INT32_MAX and offsets near ±2^31: no overflow in the bounds.
  // Row 63 sees keys from 63 + 2^31 − (2^31 − 1) = 64 on: tile 0 is cut.
  mask_free_key_tiles<128>(0, 63, int64_t(1) << 31, 4096, 0x7fffffff, 0x7fffffff, lo, hi);
  EXPECT_EQ(lo, 1);
  EXPECT_EQ(hi, 32);
  mask_free_key_tiles<128>(0, 63, -(int64_t(1) << 31), 4096, 0x7fffffff, 0, lo, hi);
  EXPECT_EQ(lo, 0);  // every key lies right of the band: no tile is whole
  EXPECT_LE(hi, 0);
  // block_n 112 (no power of two: floor division), causal: rows 192..255 see keys up to row; tile
  // 1 (keys 112..223) crosses row 192's diagonal, tile 0 does not.
  mask_free_key_tiles<112>(192, 255, 0, 1024, -1, 0, lo, hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 1);
  // block_n 80, a window (100, 0) bottom-right with offset -300 (seqlen_q 1324, seqlen_k 1024):
  // row 400 sees keys 0..100, row 463 keys 63..163: tile 0 (keys 0..79) is cut for row 463, tile 1
  // (80..159) for row 400, so none is whole; a negative right bound floors below 0.
  mask_free_key_tiles<80>(400, 463, -300, 1024, 100, 0, lo, hi);
  EXPECT_EQ(hi, 1);  // keys 0..79 <= row 400's last key 100
  EXPECT_EQ(lo, 1);  // first whole tile starts at or after row 463's first key 63: tile 1
  mask_free_key_tiles<80>(0, 63, -300, 1024, -1, 0, lo, hi);
  EXPECT_EQ(hi, -4);  // rows 0..63 see no key: (0 - 300 + 1) / 80 floors to -4
}

TEST(CudaFwdTiles, The256BucketKeepsBlockN64ForShortMaskedCalls) {
  using T = FwdSm90Traits<256>;
  static_assert(T::Config::kBlockN == 80 && T::D192Config::kBlockN == 112 && T::MaskedShortConfig::kBlockN == 64 &&
                T::D192MaskedShortConfig::kBlockN == 64 && T::kMaskedShortMaxSeqlenK == 1024);
  static_assert(T::D192MaskedShortConfig::kHeadDim == T::D192Config::kHeadDim &&
                T::D192MaskedShortConfig::kHeadDimV == T::D192Config::kHeadDimV &&
                T::MaskedShortConfig::kHeadDim == T::Config::kHeadDim);
  EXPECT_TRUE(fwd_256_masked_short(true, 1));
  EXPECT_TRUE(fwd_256_masked_short(true, 1024));
  EXPECT_FALSE(fwd_256_masked_short(true, 1025));
  EXPECT_FALSE(fwd_256_masked_short(false, 512));  // no mask: the wide tile at every length
  EXPECT_FALSE(fwd_256_masked_short(false, 1 << 30));
}

// The unmasked head_dim 192 forward steps 96 keys where 112 would leave a mostly empty last step.
TEST(CudaFwdTiles, D192StepsOf96WhereTheLastStepOf112WouldBeMostlyEmpty) {
  using T = FwdSm90Traits<256>;
  static_assert(T::D192Bn96Config::kBlockN == 96 && T::D192Bn96Config::kHeadDim == T::D192Config::kHeadDim &&
                T::D192Bn96Config::kHeadDimV == T::D192Config::kHeadDimV);
  EXPECT_EQ(fwd_d192_block_n(1024), 96);  // 11 x 96 (1056) against 10 x 112 (1120)
  EXPECT_EQ(fwd_d192_block_n(1000), 112);   // 9 x 112 (1008)
  EXPECT_EQ(fwd_d192_block_n(512), 112);    // 5 x 112 (560) against 6 x 96 (576)
  EXPECT_EQ(fwd_d192_block_n(2048), 112);   // 19 x 112 (2128) against 22 x 96 (2112): fewer steps
  EXPECT_EQ(fwd_d192_block_n(4096), 112);
  EXPECT_EQ(fwd_d192_block_n(96), 96);      // one whole step of 96 against one of 112
  EXPECT_EQ(fwd_d192_block_n(112), 112);
  EXPECT_EQ(fwd_d192_block_n(1), 96);
  EXPECT_EQ(fwd_d192_block_n(1 << 30), 112);  // no int overflow
}

// Both tiled dq accumulator layouts place every (row, column) of a (batch, head) once inside its
// rows x columns, each tile that one bulk reduce-add writes (a 64 x 64 tile, or an 80 x 16 block)
// on one contiguous range, and, in the 80-row layout, rows 2i and 2i + 1 of a column side by side
// (the kernel stages them as one float2).
TEST(CudaBwdTiles, DqAccumulatorLayoutsAreTiledBijections) {
  for (int tile_rows : {64, 80}) {
    BwdParams p{};
    p.head_dim = 128;
    p.dq_accum_cols = 128;
    const int rows = 320, cols = 128, tr = tile_rows, tc = tile_rows == 80 ? 16 : 64;
    std::vector<int> seen(size_t(rows) * cols, 0);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const int64_t o = tile_rows == 80 ? dq_accum_block80_offset(cols, r, c) : dq_accum_offset(p, r, c);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, int64_t(rows) * cols) << "row " << r << " column " << c;
        ++seen[size_t(o)];
        const int64_t tile = (r / tr) * (cols / tc) + c / tc;
        EXPECT_EQ(o / (tr * tc), tile) << "row " << r << " column " << c << " outside its tile's range";
        if (tile_rows == 80 && r % 2 == 0) EXPECT_EQ(dq_accum_block80_offset(cols, r + 1, c), o + 1);
      }
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "offset " << i << ", tile rows " << tile_rows;
  }
}

}  // namespace
}  // namespace flashattn::cuda

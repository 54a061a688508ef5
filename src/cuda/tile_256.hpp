// Which of the head_dim 256 bucket's configs a call runs, in both passes: the forward
// (FwdSm90Traits<256>, fwd_traits.hpp) and the head-dim-split backward (BwdSm90SplitConfig,
// bwd_traits.hpp) each have a 256 / 256 config and two narrower ones, whose head dims are these
// (each traits header checks its configs against them). Host code, tested without a GPU
// (tests/cuda/test_cuda_tiles.cpp).
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// head_dim and head_dim_v of the narrower configs: 192 / 192, and MLA's 192 / 128 (DeepSeek's
// multi-head latent attention, FA-3's hdim 192 / hdimv 128).
inline constexpr int kTile192HeadDim = 192, kTileMlaHeadDimV = 128;

enum class Tile256 { d256, d192, mla };

// The narrowest config whose head dims hold both of the call's. `narrow` false (testing:
// FLASHATTN_CUDA_FWD_D192=0, FLASHATTN_CUDA_BWD_D192=0) keeps the 256 one.
inline Tile256 tile_256(int64_t head_dim, int64_t head_dim_v, bool narrow = true) {
  if (!narrow || head_dim > kTile192HeadDim || head_dim_v > kTile192HeadDim) return Tile256::d256;
  return head_dim_v <= kTileMlaHeadDimV ? Tile256::mla : Tile256::d192;
}

}  // namespace flashattn::cuda

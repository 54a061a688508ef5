// The backward kernels' block order: which (batch, head) pair and resident tile each block of
// the launch order takes. Host and device code, so that a host test checks the mapping for every
// grid shape it likes (tests/cuda/test_cuda_grid_order.cpp).
//
// The backward grids are (pairs, tiles): x = (batch, head) pairs, y = the resident tiles of one
// pair, so that the limits stay those of the grid's dimensions. Blocks start in linear order (x
// fastest); grouped_block_at() reads that order tile-fastest, except for the last `tail_pairs`
// pairs, whose blocks go tile-major (tile 0 of each of them, then tile 1, ...).
//   - L2: a pair's tiles run together and walk its streamed operands (Q, dO and the dQ
//     accumulator of the dK/dV kernel) in step, so each is read from DRAM about once. Taken
//     pair-fastest, the 132 blocks of an H200 wave each streamed a different pair's, far more
//     than L2 holds (ncu, head_dim 128, seqlen 2048: 31 % L2 hits, DRAM 71 % busy; 90 % and 7 %
//     tile-fastest). Tile-major groups of 66 pairs over the whole grid were 2-7 % slower than
//     tile-fastest at head_dim 64 and seqlen 512 (perf-notes, bwd v10).
//   - Balance: under a causal mask tile 0 is the heaviest (twice the mean), and tile-fastest to
//     the end let the last pairs' heavy tiles start late and set the kernel's end (Llama-3.1-8B
//     causal backward -15 %). The tail group holds at least two waves of blocks, or the whole
//     of a grid of few waves (bwd_tail_pairs()); its heavy tiles start first and end before its
//     light ones.
#pragma once

#include <cstdint>

#include "cuda/host_device.hpp"

namespace flashattn::cuda {

struct PairTile {
  int pair;  // (batch, head) index: batch = pair / heads, head = pair % heads
  int tile;  // resident tile within the pair, in [0, tiles)
};

// Block `linear` of a (pairs, tiles) grid; tail_pairs in [0, pairs].
FLASHATTN_HOST_DEVICE inline PairTile grouped_block_at(int64_t linear, int64_t pairs, int64_t tiles, int tail_pairs) {
  const int64_t first_tail_pair = pairs - tail_pairs;
  if (linear < first_tail_pair * tiles) return {int(linear / tiles), int(linear % tiles)};
  const int64_t i = linear - first_tail_pair * tiles;
  return {int(first_tail_pair + i % tail_pairs), int(i / tail_pairs)};
}

// Pairs of the tail group when the tiles' work differs (`masked`: a causal mask or a window), else
// none: unmasked there is nothing to balance, and the pairs keep their lockstep reuse (the two
// orders measured within noise there: -7 % in one A/B, +0-2 % in the bench of the same call).
//   - A grid of at most kWholeGridWaves waves goes tile-major whole: tile-major is heaviest first
//     under a causal mask, and in-order dispatch of a heaviest-first list ends within a light
//     block of the mean. With a two-wave tail instead, Llama-3.1-8B's causal backward (8 pairs of
//     64 tiles, 3.9 waves) started the tail's 512-step tiles behind the head's third pair and ended
//     5 % after the mean (the list-scheduling count in tests/cuda/test_cuda_grid_order.cpp).
//   - A larger grid keeps a tail of at least two waves: tile-major over hundreds of pairs at
//     seqlen 512 lost the pairs' L2 reuse (-2 to -7 %, perf-notes bwd v10), and there the head's
//     light tiles are many and short enough to fill in around the tail's heavy ones.
inline constexpr int kWholeGridWaves = 8;
inline int two_wave_tail_pairs(int64_t pairs, int64_t tiles, int sms) {
  const int64_t g = (2 * int64_t(sms) + tiles - 1) / tiles;
  return int(g < 1 ? 1 : g > pairs ? pairs : g);
}
inline int bwd_tail_pairs(int64_t pairs, int64_t tiles, int sms, bool masked) {
  if (!masked || pairs < 1 || tiles < 1) return 0;
  if (pairs * tiles <= int64_t(kWholeGridWaves) * sms) return int(pairs);
  return two_wave_tail_pairs(pairs, tiles, sms);
}

// The forward's query tiles (pairs = batch x heads, tiles = query blocks per pair, heaviest first
// within a pair: fwd_sm90_tma_wgmma.cuh), taken from a dynamic counter: the same two orders as
// the backward's blocks. Pair-major keeps a head's K / V in L2 while its query blocks run; under a
// mask the last pairs go tile-major (two waves), so that the grid ends on light tiles. Pair-major
// to the end ended 5-7 % after the mean load per SM at the FA-2 paper's causal shapes and
// Llama-3.1-8B's, with the tail 1-3 % (list-scheduling count, tests/cuda/test_cuda_grid_order.cpp). No
// whole-grid rule here: the forward reads each pair's K / V once per query block, and tile-major
// over all pairs would stream every head's at once.
inline int fwd_tail_pairs(int64_t pairs, int64_t tiles, int sms, bool masked) {
  if (!masked || pairs < 1 || tiles < 1) return 0;
  return two_wave_tail_pairs(pairs, tiles, sms);
}

// The unmasked backward's last partial wave, split along the query steps. Without a mask or varlen
// lengths every block of the dK/dV grid costs the same, one block runs per SM, and `blocks` of them
// on `sms` SMs (blocks = q · sms + r) take q + 1 waves where the work is q + r / sms: at the FA-2
// paper's shapes with head_dim 128, 2048 key blocks on 132 SMs are 15.52 waves of work in 16. The
// last r blocks instead run as `parts` blocks apiece, each a 1 / parts share of the block's query
// steps (their dK / dV summed by the last to end, bwd_sm90_tma_wgmma.cuh): parts · r of them on sms
// SMs end after q + 2 / parts waves when parts · r <= (parts − 1) · sms (r = 68: 204). Returns the
// number of blocks to split (the last ones in launch order), 0 for none: not for a grid of one wave
// or of whole waves, not where the parts would need a third wave of their own, and not for blocks
// of fewer than 2048 query rows (`rows`: steps x block_m, GQA heads included), where a part's fixed
// cost (K and V, the first step's products, the epilogue and the sum) eats the share of a wave it
// saves (measured, session 28: head_dim 128 seqlen 1024, 16 steps of 64 rows, -1 %; 2048 +-0;
// 4096-16384 +1-4 %; head_dim 64 seqlen 2048, 16 steps of 128 rows, +1.3 %).
inline int64_t bwd_split_tail_blocks(int64_t blocks, int sms, int64_t rows, int parts) {
  if (parts < 2 || sms < 1 || blocks <= sms || rows < 2048) return 0;
  const int64_t r = blocks % sms;
  if (r == 0 || parts * r > (parts - 1) * int64_t(sms)) return 0;
  return r;
}

// n / d for 0 <= n < 2^31 and a fixed d >= 1 by a multiply-high and a shift (Granlund and
// Montgomery 1994, Sec. 4: m = ceil(2^(31 + l) / d) with l = ceil(log2 d) is exact for 31-bit n).
// The persistent forward splits a tile index into (batch, head, query block) at every tile, and
// its two divisions by runtime values were ~100 dependent instructions (I2F, MUFU.RCP, F2I, ...)
// between a tile's epilogue and its next first product (bench/gpu/fwd_timeline.cu).
struct FastDiv {
  int d = 1;
  uint32_t mul = 0, shr = 0;  // d = 1: n itself
  FastDiv() = default;
  explicit FastDiv(int divisor) : d(divisor) {
    if (d <= 1) return;
    uint32_t l = 0;
    while ((uint64_t(1) << l) < uint64_t(d)) ++l;
    const uint64_t p = 31 + l;
    mul = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
    shr = uint32_t(p - 32);
  }
  FLASHATTN_HOST_DEVICE int div(int n) const {
    if (d == 1) return n;
#if defined(__CUDA_ARCH__)
    return int(__umulhi(uint32_t(n), mul) >> shr);
#else
    return int(uint32_t((uint64_t(uint32_t(n)) * mul) >> 32) >> shr);
#endif
  }
};

// grouped_block_at() for tile indices below 2^31 with the divisions by FastDiv: the forward maps
// a tile to its (pair, tile) between one tile's epilogue and the next one's first product.
struct TileOrder {
  FastDiv tiles;            // tiles per pair
  FastDiv tail;             // tail pairs (divisor 1 when there are none)
  int tail_start = 0;       // first linear index of the tail group: (pairs - tail) * tiles
  int first_tail_pair = 0;  // pairs - tail
  TileOrder() = default;
  TileOrder(int64_t pairs, int tiles_per_pair, int tail_pairs)
      : tiles(tiles_per_pair),
        tail(tail_pairs < 1 ? 1 : tail_pairs),
        tail_start(int((pairs - tail_pairs) * tiles_per_pair)),
        first_tail_pair(int(pairs - tail_pairs)) {}
  FLASHATTN_HOST_DEVICE PairTile at(int linear) const {
    if (linear < tail_start) {
      const int pair = tiles.div(linear);
      return {pair, linear - pair * tiles.d};
    }
    const int i = linear - tail_start, tile = tail.div(i);
    return {first_tail_pair + i - tile * tail.d, tile};
  }
};

}  // namespace flashattn::cuda

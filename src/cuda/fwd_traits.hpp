// Tile shapes of the sm80 (mma.sync) forward kernel, one row per head_dim bucket, and the plain
// struct the kernel receives by value. Tuning these changes speed, never results.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/host_device.hpp"
#include "cuda/tile_256.hpp"

namespace flashattn::cuda {

// What the forward kernel reads; filled from detail::Params by api.cu. Pointers are device
// pointers; strides are in elements (int64 so that offsets past 2^31 elements are exact).
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // nullptr: not written
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
  const int32_t* cu_seqlens_q;  // nullptr: batched
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // batched: the lengths; varlen: the longest sequences' (under stream
                           // capture the caller's bound); max_seqlen_q sizes the grid
  int num_heads, head_ratio;  // head_ratio = num_heads / num_heads_k (GQA)
  int head_dim, head_dim_v;
  float softmax_scale;
  float softcap;  // 0 = off
  int64_t window_size_left, window_size_right;  // < 0 = unbounded
  bool align_bottom_right;
  const float* alibi_slopes;  // nullptr = off
  int64_t alibi_batch_stride;
  // e4m3 only: dequantization factors of (batch b, kv head hk) at ptr[b * batch_stride + hk *
  // head_stride] (0 strides broadcast; nullptr = 1), and v transposed by the launch into
  // vt [batch, num_heads_k, head_dim_v, vt_cols] (keys permuted within 32-key blocks: fp8_vt_key()).
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_batch_stride, q_descale_head_stride;
  int64_t k_descale_batch_stride, k_descale_head_stride;
  int64_t v_descale_batch_stride, v_descale_head_stride;
  const void* vt;
  int64_t vt_cols;
};

// A tile configuration: head_dim bucket, block_n, m-tiles per warp, and how far the k-step loop of
// S = Q Kᵀ is unrolled (fully unrolled, the compiler hoists every step's fragments and spills).
template <int kHeadDim_, int kBlockN_, int kMTiles_, int kQKUnroll_>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kMTiles = kMTiles_, kQKUnroll = kQKUnroll_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps * kMTiles;
  // Q tile (reused for the output staging), one K tile and one V tile, 2 bytes per element.
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 2;
};

// The shipped configuration per head_dim bucket (head_dim and head_dim_v both <= the bucket;
// smaller multiples of 8 are zero-filled by predicated loads). 4 warps; each warp owns kMTiles
// 16-row tiles of the query block (block_m = 64 · kMTiles) and reuses every K/V fragment it loads
// kMTiles times. Measured on the H200, bf16 forward, FA-2 paper shapes (docs/perf-notes.md):
//   hdim 64:  block_m 128, block_n 128 (FA-2's choice): S 128 + O 64 fp32 registers, 20 bytes
//             spilled, smem 48 KB; 1-4% faster than block_n 64 (no spills) at seqlen >= 1k.
//   hdim 128: block_m 128, block_n 64 (FA-2's choice), S = Q Kᵀ fully unrolled: S 64 + O 128
//             registers, 88 bytes spilled, smem 64 KB; 3-10% faster than the rolled k loop
//             (fewer spills but loop overhead); block_n 32 and block_m 64 were slower.
//   hdim 256: block_m 64, block_n 64, fully unrolled: O alone is 128 registers, so one m-tile per
//             warp; no spills (unroll 2 spilled 252 bytes); smem 96 KB.
template <int kHeadDim>
struct FwdTraits;
template <>
struct FwdTraits<64> {
  using Config = FwdConfig<64, 128, 2, 1>;
};
template <>
struct FwdTraits<128> {
  using Config = FwdConfig<128, 64, 2, 2>;
};
template <>
struct FwdTraits<256> {
  using Config = FwdConfig<256, 64, 1, 4>;
};

// Launches the forward kernel for one (element type, head_dim bucket), instantiated in the generated
// fwd_sm80_<dtype>_hdim<d>.cu. max_seqlen_q sizes the grid; num_heads and batch span it.
struct F16;
struct BF16;
template <typename Elem, int kHeadDim>
void launch_fwd_sm80(const FwdParams& p, int batch, int max_seqlen_q, void* stream);
template <typename Elem, typename Config>
void launch_fwd_sm80_config(const FwdParams& p, int batch, int max_seqlen_q, void* stream);

}  // namespace flashattn::cuda

namespace flashattn::cuda {

// Tile shapes of the Hopper forward kernel (fwd_sm90_tma_wgmma.cuh): block_m = 128 (192, 256) query
// rows as two (three, four) consumer warpgroups of 64 rows (wgmma's M), one producer warpgroup issuing
// TMA, and kStages K and V buffers. Shared memory = Q + kStages · block_n · (head_dim + head_dim_v) · 2
// bytes, plus an O staging buffer (block_m · head_dim_v · 2) where that still fits in 227 KB (the
// persistent grid, kPersistent). Registers per consumer thread (240 after setmaxnreg, 232 persistent,
// 160 with three consumers, 112 with four): S = block_n / 2, P = block_n / 4, O = head_dim_v / 2, and with two consumers Q's A
// fragments head_dim / 4 (kQInRegs), so block_n shrinks as head_dim grows (FA-3's tile_size.h makes
// the same trade).
//   hdim 64:  block_n 128, 3 stages, block_m 192 (three consumers of 160 registers): 144 KB with O;
//             S 64 + P 32 + O 32 registers. Short sequences: block_n 64, 4 stages, block_m 256
//             (four consumers of 112 registers): 128 KB with O; S 32 + P 16 + O 32.
//   hdim 128: block_n 128, 2 stages: 192 KB with O; S 64 + P 32 + O 64 + Q 32.
//   hdim 256: block_n 80, 2 stages: 224 KB, no O buffer (one block per tile); S 40 + P 20 + O 128;
//             head_dim and head_dim_v <= 192 run narrower configs, and short masked calls block_n
//             64 (FwdSm90Traits<256> below).
template <int kHeadDim_, int kBlockN_, int kStages_, int kBlockM_ = 128, int kElemBytes_ = 2, int kExp2PolyEvery_ = 0,
          int kHeadDimV_ = kHeadDim_, bool kPersistentOInQ_ = false>
struct FwdSm90Config {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_;
  // head_dim_v's bucket (V's columns, O's): below head_dim in the MLA shape (head_dim 192,
  // head_dim_v 128), where the 256 bucket would multiply and stage twice O's columns.
  static constexpr int kHeadDimV = kHeadDimV_;
  static_assert(kHeadDimV <= kHeadDim && kHeadDimV % 64 == 0, "head_dim_v: whole 64-column panels, <= head_dim");
  static constexpr int kBlockM = kBlockM_;
  // Every kExp2PolyEvery-th pair of a row's exponentials on the FMA pipe (exp2_fma(), FA-4's
  // emulation) instead of MUFU; 0 = all on MUFU.
  static constexpr int kExp2PolyEvery = kExp2PolyEvery_;
  // 2 (fp16 / bf16), or 1 (e4m3: the FP8 forward, whose out is bf16 and whose V tiles are Vᵀ).
  static constexpr int kElemBytes = kElemBytes_;
  // (The FP8 forward's Vᵀ map, workspace and transpose are sized by kHeadDim: fwd_sm90_fp8.cu.)
  static_assert(kElemBytes == 2 || kHeadDimV == kHeadDim, "FP8: head_dim_v = head_dim");
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  // Registers every thread starts with under __launch_bounds__(kThreads, 1): 168 for 384 threads,
  // 128 for 512, 96 for 640 (scripts/gpu_check.sh build checks ptxas's report against these).
  static constexpr int kEntryRegs = (65536 / kThreads) / 8 * 8;
  static constexpr int kQBytes = kBlockM * kHeadDim * kElemBytes;
  static constexpr int kOutBytes = kBlockM * kHeadDimV * 2;  // out is 16-bit
  // S = Q Kᵀ with Q's A fragments in registers (head_dim / 4 per thread) instead of shared memory:
  // per key tile the two consumers then read 64 KB of operands for S instead of 96 KB, next to
  // P V's 64 KB and the ring's 64 KB of TMA writes, against 128 bytes per clock of shared memory
  // over the tile's 2048 tensor cycles. Two consumers only: with three (160 registers each) the
  // fragments spill. FP8 (head_dim 128 of one byte: 16 registers) needs it more, its products
  // running at twice the rate: 782 -> 843 TFLOP/s at seqlen 16384 (perf-notes).
  static constexpr bool kQInRegs = kHeadDim * kElemBytes <= 256 && kBlockM == 128;
  static constexpr int kKBytes = kBlockN * kHeadDim * kElemBytes;
  static constexpr int kVBytes = kBlockN * kHeadDimV * kElemBytes;
  // The kernel's loops step block_n by 16 (P V's k-steps; 32 for FP8, whose Vᵀ tile is one
  // 128-byte panel of keys), TMA boxes hold at most 256 rows, and every tile starts on the
  // 128-byte swizzle's 1024-byte period.
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "block_n: a multiple of 16, at most 256");
  static_assert(kElemBytes == 2 || kBlockN == 128, "FP8: block_n 128 (Vᵀ's one panel of keys)");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0,
                "tiles must keep the 1024-byte swizzle alignment");
  // A persistent grid (one block per multiprocessor going through tiles) where an O staging buffer
  // of its own fits next to Q and the K/V ring, so that the next tile's Q loads during this one's
  // last products and epilogue and no block pays a launch, barrier setup and first load per tile.
  // (The FP8 tile must have it: its Q tile is half the size of O.)
  static constexpr int kOBytes =
      kQBytes + kOutBytes + kStages * (kKBytes + kVBytes) + 256 + 1024 <= 227 * 1024 ? kOutBytes : 0;
  static_assert(kElemBytes == 2 || kOBytes > 0, "the FP8 forward stages O in a buffer of its own");
  // kPersistentOInQ_: persistent without that buffer, O staged in the Q tile, so that the next
  // tile's Q loads only once this tile's O has been read out of it (its K / V still load during
  // the epilogue, and no block pays a launch per tile). Only where Q stays in shared memory: Q's
  // fragments free the slot at the tile's top, which the epilogue would then overwrite. MLA's
  // config takes it (+2-7 % at seqlen 1024-4096, session 34); at head_dim 192 / 256 it measured
  // -1.4 to +1.7 %, so those stay one block per tile.
  static constexpr bool kOInQ = kOBytes == 0;
  static constexpr bool kPersistent = kOBytes > 0 || kPersistentOInQ_;
  static_assert(!(kPersistentOInQ_ && (kOBytes > 0 || kQInRegs)), "kPersistentOInQ: O in the Q tile, Q not in registers");
  // setmaxnreg split (sm90_utils.cuh; checked against kEntryRegs below and by
  // scripts/sm90_entry_regs.awk): a persistent producer carries its tile loop's state (tile, ring
  // index, counts) and needs 32 registers (with 24 it spilled one at head_dim 128). The consumers
  // share what the producer gives back (setmaxnreg.inc waits for the pool): 240 / 232 with two
  // consumer warpgroups, 160 with three, 112 with four.
  static constexpr int kProducerRegs = kPersistent ? 32 : 24;
  static constexpr int kConsumerRegs =
      std::min(240, (kEntryRegs + (kEntryRegs - kProducerRegs) / kConsumerWarpgroups) / 8 * 8);
  static_assert(128 * (kEntryRegs - kProducerRegs) >= 128 * kConsumerWarpgroups * (kConsumerRegs - kEntryRegs),
                "setmaxnreg: the consumers would wait for registers the producer never frees");
  // Tiles, then the mbarriers, plus 1 KB to align the tiles to the 1024-byte swizzle period.
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes) + kOBytes + 256 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

template <int kHeadDim>
struct FwdSm90Traits;
// Config: the tile shape of the bucket.
// head_dim 64 runs block_m 192 (three consumer warpgroups of 160 registers, as FA-3 does): its
// softmax is issue-bound with two (ncu, perf-notes), and a third warpgroup gave +2-13 % from seqlen
// 512 up. Under a causal mask each warpgroup skips the key tiles its own 64 rows do not see (the
// kernel's per-warpgroup key ranges), so 192-row tiles waste no more of the diagonal than 128-row
// ones: +3-11 % over block_m 128 at seqlen 512-2048 causal, which took 128 until then (perf-notes v6).
//
// Short sequences (max_seqlen_q <= kShortMaxSeqlenQ) take ShortConfig, block_m 256 (four consumers
// of 112 registers: S 32 + P 16 + O 32; block_n 64, 4 stages), where the batch fills the
// multiprocessors: seqlen 512 / 1024 split into whole 256-row tiles, whereas 192 leaves a last tile
// of 128 / 64 rows (the latter costs ~0.6 of a full one), and each softmax hides under three others'
// products. Measured (session 23, kernel alone, bf16, 32 heads): seqlen 512 +9 %, 1024 +6 %, 1024
// causal +1 %; from 2048 it is 3-10 % slower (four turn handoffs per 1024 tensor cycles instead of
// three per 1536), so longer sequences keep block_m 192.
template <>
struct FwdSm90Traits<64> {
  using Config = FwdSm90Config<64, 128, 3, 192>;
  using ShortConfig = FwdSm90Config<64, 64, 4, 256>;
  static constexpr int kShortMaxSeqlenQ = 1024;
};

// The key tiles [free_lo, free_hi) of kBlockN keys that every query row first_row .. last_row of a
// sequence sees whole: each key below len_k and inside the causal / window band
// (−window_size_left <= key − row − offset <= window_size_right, a negative size being no limit;
// offset as FwdBlock's). Their softmax needs no per-element mask. last_row < first_row (a
// warpgroup wholly past its sequence's end, rows that are never stored) gives some range, unused.
// The sm90 forward asks it per
// consumer warpgroup (64 rows), not per block: at block_m 256 and block_n 64 under a causal mask a
// block-level test masked 10 warpgroup-tiles per diagonal where 4 need it (perf-notes, session
// 24). Host and device; tested without a GPU (tests/cuda/test_cuda_tiles.cpp).
template <int kBlockN>
FLASHATTN_HOST_DEVICE inline void mask_free_key_tiles(int64_t first_row, int64_t last_row, int64_t offset, int len_k,
                                                      int window_size_left, int window_size_right, int& free_lo,
                                                      int& free_hi) {
  // (At block_n >= 16 the divided bounds of int32 rows, offsets and windows fit an int.)
  static_assert(kBlockN >= 16 && kBlockN % 16 == 0, "block_n: a multiple of 16");
  // Floor division (the bounds may be negative): a shift where block_n is a power of two.
  const auto floor_div = [](int64_t x) -> int64_t {
    if constexpr ((kBlockN & (kBlockN - 1)) == 0) {
      int s = 0;
      while ((1 << s) < kBlockN) ++s;
      return x >> s;
    } else {
      const int64_t q = x / kBlockN;
      return q * kBlockN > x ? q - 1 : q;
    }
  };
#if defined(__CUDA_ARCH__)
  using ::max;
  using ::min;
#else
  using std::max;
  using std::min;
#endif
  free_lo = 0;
  free_hi = len_k / kBlockN;
  if (window_size_right >= 0)  // nb · kBlockN + kBlockN − 1 <= first_row + offset + window_size_right
    free_hi = int(min(int64_t(free_hi), floor_div(first_row + offset + window_size_right + 1)));
  if (window_size_left >= 0) {  // nb · kBlockN >= last_row + offset − window_size_left
    const int64_t first_free = floor_div(last_row + offset - window_size_left + kBlockN - 1);
    free_lo = int(min(int64_t(INT32_MAX), max(int64_t(0), first_free)));
  }
}

// Whether a bucket with a short-sequence tile takes it (launch_fwd_sm90): max_seqlen_q within
// short_max_seqlen_q, and the larger tile costs no extra wave. A tile costs about its rows (a
// block_m 256 tile ~4/3 of a block_m 192 one), so with few heads (tiles < multiprocessors) the
// smaller tiles finish first. `batch_heads` = batch · num_heads. Host code, tested without a GPU
// (tests/cuda/test_cuda_tiles.cpp).
inline bool fwd_short_tile_pays(int max_seqlen_q, int64_t batch_heads, int multiprocessors, int short_block_m,
                                int long_block_m, int short_max_seqlen_q) {
  if (max_seqlen_q > short_max_seqlen_q || multiprocessors <= 0) return false;
  const auto waves = [&](int block_m) {
    const int64_t tiles = int64_t((max_seqlen_q + block_m - 1) / block_m) * batch_heads;
    return (tiles + multiprocessors - 1) / multiprocessors;
  };
  return waves(short_block_m) * short_block_m <= waves(long_block_m) * long_block_m;
}
template <>
struct FwdSm90Traits<128> {
  using Config = FwdSm90Config<128, 128, 2>;
};
// FP8 (e4m3) forward: head_dim 128, block_m 128 (two consumers, Q in registers), block_n 128 (Vᵀ's
// K-major tile is one 128-byte panel of keys), 3 stages of 16 KB K and 16 KB Vᵀ tiles: 16 KB Q +
// 96 KB ring + 32 KB bf16 O staging. Registers: S 64 + P 16 + O 64 + Q 16. Three consumers (block_m
// 192, 160 registers each) spill 144 bytes. Every 4th pair of a row's exponentials runs on the FMA
// pipe (exp2_fma): at FP8's product rate a warpgroup's 8192 exponentials per tile (512 MUFU cycles
// per warp) are as long as both its products, so the softmax could not hide under the other
// warpgroup's; one in 4 moved gave +5-13 % (one in 3 the same, one in 2 less; 16-bit d128: -10 %).
struct FwdSm90Fp8Traits {
  using Config = FwdSm90Config<128, 128, 3, 128, 1, 4>;
};
// The 256 bucket (head_dim or head_dim_v above 128 when the 128 bucket is built) runs narrower
// configs where both head dims allow, so that zero-filled columns are neither loaded nor multiplied
// (launch_fwd_sm90 picks by tile_256()):
//   Config (256 / 256): block_n 80, 2 stages, 224 KB, no O buffer; S 40 + P 20 + O 128 registers.
//   D192Config (head_dim and head_dim_v <= 192): block_n 112 (FA-3's tile), 2 stages, 216 KB, no O
//     buffer; S 56 + P 28 + O 96. Against the 256 config, 3/4 of the products.
//   MlaConfig (head_dim <= 192, head_dim_v <= 128: DeepSeek's multi-head latent attention, FA-3's
//     hdim 192 / hdimv 128): block_n 128, 2 stages of 48 KB K and 32 KB V, 208 KB, no O buffer
//     but persistent, O staged in the Q tile (kPersistentOInQ); S 64 + P 32 + O 64. Against the
//     256 config, 5/8 of the products.
// Why block_n above 64 there: Q stays in shared memory (its fragments would not fit next to O),
// so S = Q Kᵀ reads 2 KB of Q and block_n · 32 bytes of K per 16-column k-step, from shared
// memory, in block_n / 2 tensor cycles: 128 bytes per cycle at block_n 64, shared memory's whole
// rate, with the ring's TMA writes on top; 101 at 112, 115 at 80 (a larger block_n does not fit
// 227 KB at head_dim 256). Measured (session 33, one call, bf16 and fp16): head_dim 192 from
// seqlen 4096 +6-17 % over block_n 64, head_dim 256 +1-3 %; at seqlen 1024 under a causal mask
// -2 to -7 %: a wider diagonal tile masks more keys, and the narrower one keeps the persistent
// grid's ordered tiles (head_dim 192). So a causal mask or a window over short key sequences
// (fwd_256_masked_short()) keeps the block_n 64 configs:
//   MaskedShortConfig (256 / 256): block_n 64, 192 KB; D192MaskedShortConfig (192 / 192):
//     block_n 64, 144 KB + a 48 KB O buffer (persistent).
// And at head_dim 192 without such a mask, block_n 96 where the keys split into fewer wasted
// columns than at 112 (fwd_d192_block_n()): 1024 keys are 10 steps of 112 whose last holds 16
// keys (8.6 % of the products on nothing), or 11 of 96 (3 %):
//   D192Bn96Config (192 / 192): block_n 96, 2 stages, 192 KB, no O buffer; S 48 + P 24 + O 96.
template <>
struct FwdSm90Traits<256> {
  using Config = FwdSm90Config<256, 80, 2>;
  using D192Config = FwdSm90Config<192, 112, 2, 128, 2, 0, 192>;
  using D192Bn96Config = FwdSm90Config<192, 96, 2, 128, 2, 0, 192>;
  using MlaConfig = FwdSm90Config<192, 128, 2, 128, 2, 0, 128, true>;
  using MaskedShortConfig = FwdSm90Config<256, 64, 2>;
  using D192MaskedShortConfig = FwdSm90Config<192, 64, 2, 128, 2, 0, 192>;
  static constexpr int kMaskedShortMaxSeqlenK = 1024;
};

// Whether a call of the 256 bucket (its 256 and 192 configs) takes the block_n 64 config: under a
// causal mask or a window (`masked`) over at most kMaskedShortMaxSeqlenK keys (the longest
// sequence's). Host code, tested without a GPU (tests/cuda/test_cuda_tiles.cpp).
inline bool fwd_256_masked_short(bool masked, int max_seqlen_k) {
  return masked && max_seqlen_k <= FwdSm90Traits<256>::kMaskedShortMaxSeqlenK;
}

// block_n of an unmasked head_dim 192 forward over max_seqlen_k keys (a varlen batch's longest):
// 96 or 112, whichever has the smaller cost ceil(keys / block_n) · (block_n + kD192StepOverheadKeys),
// a key step costing its keys' products and softmax plus a fixed share (turn handoffs, barrier
// waits, the descriptors) counted as kD192StepOverheadKeys keys. So 96 where a last step of 112
// would hold few keys: at 1024 (10 steps of 112, the last with 16 keys, against 11 of 96), not at
// 512, 2048 or 4096. Host code, tested without a GPU (tests/cuda/test_cuda_tiles.cpp).
inline constexpr int kD192StepOverheadKeys = 24;
inline int fwd_d192_block_n(int max_seqlen_k) {
  const auto cost = [&](int64_t block_n) {
    return (int64_t(max_seqlen_k) + block_n - 1) / block_n * (block_n + kD192StepOverheadKeys);
  };
  return cost(96) < cost(112) ? 96 : 112;
}

// The 256 bucket's configs hold the head dims that tile_256() (tile_256.hpp) picks them for.
static_assert(FwdSm90Traits<256>::D192Config::kHeadDim == kTile192HeadDim &&
              FwdSm90Traits<256>::D192Config::kHeadDimV == kTile192HeadDim &&
              FwdSm90Traits<256>::D192Bn96Config::kHeadDim == kTile192HeadDim &&
              FwdSm90Traits<256>::D192Bn96Config::kHeadDimV == kTile192HeadDim &&
              FwdSm90Traits<256>::D192MaskedShortConfig::kHeadDim == kTile192HeadDim &&
              FwdSm90Traits<256>::D192MaskedShortConfig::kHeadDimV == kTile192HeadDim &&
              FwdSm90Traits<256>::MaskedShortConfig::kHeadDim == FwdSm90Traits<256>::Config::kHeadDim &&
              FwdSm90Traits<256>::MlaConfig::kHeadDim == kTile192HeadDim &&
              FwdSm90Traits<256>::MlaConfig::kHeadDimV == kTileMlaHeadDimV);

// Launches the Hopper forward for one (element type, head_dim bucket); instantiated in the
// generated fwd_sm90_<dtype>_hdim<d>.cu. `rows_q` / `rows_k` are the rows of the q and k tensors
// (seqlen, or the packed totals when varlen): they bound the TMA tensor maps.
template <typename Elem, int kHeadDim>
void launch_fwd_sm90(const FwdParams& p, int batch, int max_seqlen_q, int64_t rows_q, int64_t rows_k, void* stream);

// The FP8 forward (e4m3 q, k, v, bf16 out; batched, head_dim 128): transposes v into a workspace,
// then runs the Hopper forward on it. `p.vt` and `p.vt_cols` are set by this launch.
void launch_fwd_sm90_fp8(const FwdParams& p, int batch, int max_seqlen_q, int64_t rows_q, int64_t rows_k, void* stream);

}  // namespace flashattn::cuda

// FlashAttention forward on Hopper (sm_90a) with TMA, mbarriers, wgmma and warp specialization
// (FlashAttention-3, Shah et al. 2024, Sec. 3.1 and Alg. 1-2).
//
// A tile is block_m query rows of one (batch, head) (128, or at head_dim 64 192, and 256 for short
// sequences: fwd_traits.hpp);
// a block goes through one or (a persistent grid) several tiles with 1 + block_m / 64 warpgroups:
//   - the producer (warpgroup 0, 24 or, persistent, 32 registers after setmaxnreg) issues one
//     thread's TMA copies of each tile's Q and of K(j), V(j) into kStages-deep ring buffers, each
//     completing on a "full" mbarrier, and waits on "empty" mbarriers before reusing a buffer;
//   - two to four consumers (240, persistent 232, with three 160, with four 112 registers each)
//     own 64 query rows each (wgmma's M).
//     Per key tile: S = Q K(j)ᵀ with wgmma, K from shared memory (K-major) and Q as A fragments
//     in registers, loaded once per tile (two consumers; with more, Q is read from shared memory
//     too: the fragments would not fit in 160 or 112 registers), the online softmax on the
//     accumulators (FA-2 Alg. 1 lines 8-10, same code shape as the sm80 kernel), and O += P V(j)
//     with P from registers and V read MN-major from shared memory.
// Intra-warpgroup overlap (FA-3 Alg. 2): S(j+1) = Q K(j+1)ᵀ and O += P(j) V(j) are issued
// back to back and the softmax of S(j+1) runs while the P V product is still on the tensor cores;
// only the rescale of O waits for it.
//
// Each consumer warpgroup computes only the key tiles its own 64 rows see; for the block's others
// it takes its turn and frees their slots (idle_round). Under a mask with a right edge (causal) the
// query tiles are end-aligned (fwd_block_at): a partial tile holds the sequence's first rows, which
// see the fewest keys; its rows before the start (TMA zero fill, or a varlen batch's previous
// sequence) are computed and never written.
//
// Key tiles are visited from the last visible one down, so that tiles crossing the causal
// diagonal or a window edge come first and are the only ones that pay per-element masking; the
// visible key range bounds the loop (block skipping). Softcap and ALiBi are uniform runtime
// branches, as in the sm80 kernel.
//
// Rows past a sequence's end: TMA zero-fills rows outside the tensor, but a varlen tile that
// crosses its sequence's end holds the next sequence's rows. Their scores are masked, and their
// V rows are zeroed in shared memory before the P V product (0 · inf would be NaN).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/fwd_block.cuh"
#include "cuda/fwd_traits.hpp"
#include "cuda/grid_order.hpp"
#include "cuda/kernel_utils.cuh"
#include "cuda/sm90_utils.cuh"

namespace flashattn::cuda {

// Diagnostic timeline (bench/gpu/fwd_timeline.cu, the only build that defines FLASHATTN_FWD_TRACE):
// clock64() at chosen points of each warpgroup's first tiles in the first blocks, to see where a
// tile's time goes between its products (docs/perf-notes.md). Compiled out everywhere else.
// Roles: 0 the producer (its thread 0 records), 1 .. 4 the consumer warpgroups (lane 0 of their
// second warp records, so that no trace store sits in front of thread 0's bulk_wait_read, a
// scoreboard wait; session 23).
#ifdef FLASHATTN_FWD_TRACE
constexpr int kTraceBlocks = 132, kTraceRoles = 5, kTraceTiles = 24, kTraceEvents = 64;
__device__ long long g_fwd_trace[kTraceBlocks][kTraceRoles][kTraceTiles][kTraceEvents];
#define FWD_TRACE(role, j, ev)                                                                     \
  do {                                                                                             \
    if ((threadIdx.x & 127) == ((role) == 0 ? 0 : 32) && blockIdx.x < kTraceBlocks &&              \
        (role) < kTraceRoles && (j) < kTraceTiles && (ev) < kTraceEvents)                           \
      g_fwd_trace[blockIdx.x][role][j][ev] = clock64();                                            \
  } while (0)
// Consumers: round r of a tile's main loop at events 8 + 4r .. 11 + 4r (r < 12); producer: K / V
// load i at 8 + 2i, 9 + 2i (i < 24). Past those, dropped.
#define FWD_TRACE_ROUND(r, k) ((r) < 12 ? 8 + 4 * (r) + (k) : kTraceEvents)
#define FWD_TRACE_LOAD(i, k) ((i) < 24 ? 8 + 2 * (i) + (k) : kTraceEvents)
#else
#define FWD_TRACE(role, j, ev) \
  do {                         \
  } while (0)
#endif

template <typename Elem, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ CUtensorMap tmap_q,
                    const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                    const __grid_constant__ CUtensorMap tmap_o, const bool o_tma, const TileOrder order,
                    const FastDiv heads, const int num_tiles, int* const tile_counter) {
#ifdef FLASHATTN_SM90_ENABLED
  using namespace sm90;
  // FP8 (e4m3): k and Vᵀ tiles K-major for both products (8-bit wgmma has no transpose), out bf16.
  constexpr bool kFp8 = std::is_same_v<Elem, E4M3>;
  using Out = typename OutElem<Elem>::type;
  using OutStorage = typename Out::Storage;
  constexpr int D = Cfg::kHeadDim, Dv = Cfg::kHeadDimV, BM = Cfg::kBlockM, BN = Cfg::kBlockN, S = Cfg::kStages;
  constexpr int kPanels = D * Cfg::kElemBytes / 128;    // 128-byte panels per Q / K row
  constexpr int kPanelsV = Dv * Cfg::kElemBytes / 128;  // per V row (16-bit; FP8's Vᵀ is one panel of keys)
  constexpr int kPanelCols = 128 / Cfg::kElemBytes;
  // wgmma k-steps of 32 bytes along a row: 16 elements of 16 bits, 32 of 8 (k32 instructions).
  constexpr int kKStep = 32 / Cfg::kElemBytes;
  // FP8: P · 2^8 (<= 256 < 448, e4m3's largest) keeps small probabilities out of e4m3's subnormals;
  // the row sum carries the same factor, so out is unchanged, and lse takes it out.
  constexpr float kPBias = kFp8 ? 8.f : 0.f;
  constexpr int kConsumerWarps = 4 * Cfg::kConsumerWarpgroups;
  constexpr float kLn2 = 0.6931471805599453f;

  const bool varlen = p.cu_seqlens_q != nullptr;
  // Tile t = (batch, head, query block), query blocks from the end of the sequence first (under a
  // causal mask the last ones see the most keys), pairs (batch, head) one after the other but the
  // last few under a mask, whose tiles go tile-major (`order`, grid_order.hpp). A block starts
  // with tile blockIdx.x and goes on with blockIdx.x + gridDim.x, ... (static), or, given
  // tile_counter, with gridDim.x plus what an atomic add on it returns (dynamic: a block that
  // finishes early takes the next tile, as the hardware's dispatch of one block per tile would);
  // launch_fwd_sm90 says which. Under dynamic tiles the producer fetches them and hands them to
  // the consumers through a two-entry ring.
  const bool dynamic = Cfg::kPersistent && tile_counter != nullptr;
  // The static order's next tile, saturating at num_tiles: with one block per tile, tile +
  // gridDim.x would pass 2^31 for num_tiles above 2^30.
  auto next_static_tile = [&](int tile) {
    return tile >= num_tiles - int(gridDim.x) ? num_tiles : tile + int(gridDim.x);
  };
  auto tile_block = [&](int tile, FwdBlock& blk) {
    // (pair = batch · heads + head, order.tiles.d query blocks per pair, heads.d = p.num_heads.)
    const PairTile pt = order.at(tile);
    const int b = heads.div(pt.pair), h = pt.pair - b * heads.d;
    return fwd_block_at<BM, BN, true>(p, order.tiles.d - 1 - pt.tile, h, b, blk);
  };

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sQ = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (sQ - raw);  // generic pointer to sQ
  const uint32_t sK = sQ + Cfg::kQBytes;
  const uint32_t sV = sK + S * Cfg::kKBytes;
  // The epilogue stages O in its own buffer where one fits (the next Q then loads while this
  // tile's last products and epilogue run), else in the Q tile. A persistent block with O in the
  // Q tile (MLA's config) frees Q's slot after the epilogue has read O out of it, not after the
  // tile's last S, so the next Q waits for that (its K / V need not).
  const uint32_t sO = Cfg::kOInQ ? sQ : sV + S * Cfg::kVBytes;
  constexpr bool kQHeldToEpilogue = Cfg::kPersistent && Cfg::kOInQ;
  uint8_t* smem_o = smem + (sO - sQ);
  const uint32_t bars = sV + S * Cfg::kVBytes + Cfg::kOBytes;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 8 * (2 + s); };
  auto k_empty = [&](int s) { return bars + 8 * (2 + S + s); };
  auto v_full = [&](int s) { return bars + 8 * (2 + 2 * S + s); };
  auto v_empty = [&](int s) { return bars + 8 * (2 + 3 * S + s); };
  auto tile_full = [&](int e) { return bars + 8 * (2 + 4 * S + e); };
  auto tile_empty = [&](int e) { return bars + 8 * (4 + 4 * S + e); };
  int* tile_ring = reinterpret_cast<int*>(smem + (bars - sQ) + 8 * (6 + 4 * S));
  static_assert(8 * (8 + 4 * S) <= 256, "mbarriers and the tile ring fit in the 256 bytes kept for them");

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kConsumerWarps);
    for (int s = 0; s < S; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), kConsumerWarps);
      mbar_init(v_empty(s), kConsumerWarps);
    }
    for (int e = 0; e < 2; ++e) {
      mbar_init(tile_full(e), 1);
      mbar_init(tile_empty(e), kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- producer warpgroup
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      prefetch_tensormap(&tmap_q);
      prefetch_tensormap(&tmap_k);
      prefetch_tensormap(&tmap_v);
      int stage = 0, loaded = 0;
      uint32_t phase = 0;
      int tile = blockIdx.x;
      for (int j = 0;; ++j) {
        FWD_TRACE(0, j, 0);
        FwdBlock blk;
        bool real = tile < num_tiles && tile_block(tile, blk);
        if (dynamic) {
          // Only the producer decides the sequence, so tiles past their (varlen) sequence's end,
          // which have no rows to write, are skipped here instead of being handed on.
          while (tile < num_tiles && !real) {
            tile = int(gridDim.x) + atomicAdd(tile_counter, 1);
            real = tile < num_tiles && tile_block(tile, blk);
          }
          mbar_wait(tile_empty(j & 1), ((j >> 1) & 1) ^ 1);
          tile_ring[j & 1] = tile;
          mbar_arrive(tile_full(j & 1));  // release: the consumers read the ring entry after it
        }
        if (tile >= num_tiles) break;
        if (real && blk.nb_max > blk.nb_min) {
          const int tma_batch = varlen ? 0 : blk.b;
          for (int nb = blk.nb_max - 1; nb >= blk.nb_min; --nb) {
            const int row = int(blk.k_start) + nb * BN;
            mbar_wait(k_empty(stage), phase ^ 1);
            FWD_TRACE(0, j, FWD_TRACE_LOAD(blk.nb_max - 1 - nb, 0));
            mbar_arrive_expect_tx(k_full(stage), Cfg::kKBytes);
            tma_load_tile<kPanels, BN, kPanelCols>(sK + stage * Cfg::kKBytes, &tmap_k, k_full(stage), row, blk.h_k,
                                                   tma_batch);
            if (nb == blk.nb_max - 1) {
              // Q once the previous tile's consumers have read theirs (into registers, or, where Q
              // stays in shared memory, with the tile's last S = Q Kᵀ), after the first K, so that a
              // free ring slot need not wait for that.
              mbar_wait(q_empty, (loaded & 1) ^ 1);
              FWD_TRACE(0, j, 2);
              mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
              tma_load_tile<kPanels, BM, kPanelCols>(sQ, &tmap_q, q_full, int(blk.q_start) + blk.m0, blk.h, tma_batch);
              ++loaded;
            }
            mbar_wait(v_empty(stage), phase ^ 1);
            FWD_TRACE(0, j, FWD_TRACE_LOAD(blk.nb_max - 1 - nb, 1));
            mbar_arrive_expect_tx(v_full(stage), Cfg::kVBytes);
            if constexpr (kFp8)  // Vᵀ: head_dim rows of block_n key bytes (one panel), keys from nb · block_n
              tma_load_4d(sV + stage * Cfg::kVBytes, &tmap_v, v_full(stage), nb * BN, 0, blk.h_k, tma_batch);
            else
              tma_load_tile<kPanelsV, BN>(sV + stage * Cfg::kVBytes, &tmap_v, v_full(stage), row, blk.h_k, tma_batch);
            if (++stage == S) {
              stage = 0;
              phase ^= 1;
            }
          }
        }
        // The next tile once this one's loads are issued (the producer runs ahead of the consumers
        // by the ring's depth, which hides the atomic's latency; fetching earlier would keep it in
        // a register all along).
        tile = dynamic ? int(gridDim.x) + atomicAdd(tile_counter, 1) : next_static_tile(tile);
      }
      if (dynamic) {
        // The last block to finish fetching re-zeroes the counter for the next launch on its slot.
        __threadfence();
        if (atomicAdd(tile_counter + 1, 1) == int(gridDim.x) - 1) {
          __threadfence();
          tile_counter[0] = 0;
          tile_counter[1] = 0;
        }
      }
    }
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    // Read from lane 0 so that the compiler knows it is warp-uniform and keeps what derives from it
    // (shared-memory addresses, wgmma descriptors) in uniform registers.
    const int cw = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) - 1;  // query rows cw*64 .. cw*64+63

    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = cw * 64 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
    const uint64_t q_mine = make_desc(sQ + cw * 64 * 128, 16, 1024);  // this warpgroup's Q rows (K-major)

    // As in the sm80 kernel: softcap, ALiBi or a negative scale scale the scores first.
    // (FP8: per tile instead, where the scores' scale takes q's and k's descales.)
    const bool modified_all = p.softcap > 0.f || p.alibi_slopes != nullptr || p.softmax_scale < 0.f;
    const float scale_log2_all = modified_all ? kLog2e : p.softmax_scale * kLog2e;
    // Pingpong (FA-3 Sec. 3.1): the consumers take turns issuing their GEMMs, so that one
    // warpgroup's softmax runs while another's GEMMs own the tensor cores. Named barrier 2 + w is
    // warpgroup w's turn: it waits there (128 threads) for the 128 arrivals of the warpgroup before
    // it in the round 0, 1, (2, 3,) 0, ... The turns run on across tiles (warpgroup 0 opens each
    // tile's after the last one closed the previous one's), so that no warpgroup arrives twice on a
    // barrier the next has not passed.
    constexpr int kNC = Cfg::kConsumerWarpgroups;
    // Named barriers: 1 all consumers, 2 .. 1 + kNC the turns, then one per warpgroup for its epilogue.
    constexpr int kEpilogueBarrier = 2 + kNC;
    static_assert(kEpilogueBarrier + kNC - 1 <= 15, "an sm_90 block has 16 named barriers");
    constexpr bool kExpInArms = D >= 128 && !kFp8;  // see max_exp
    auto my_turn = [&] { named_barrier_sync(2 + cw, 256); };
    auto your_turn = [&] { named_barrier_arrive(2 + (cw + 1) % kNC, 256); };
    if (cw == kNC - 1) named_barrier_arrive(2, 256);  // warpgroup 0 goes first
    // The K/V ring's position and the Q tiles' count run on across this block's tiles, as the
    // producer's do.
    int stage = 0, loaded = 0;
    uint32_t phase = 0;
    int static_tile = blockIdx.x;
    for (int j = 0;; ++j) {
      FWD_TRACE(cw + 1, j, 0);
      int tile = static_tile;
      static_tile = next_static_tile(static_tile);
      if (dynamic) {
        // Lane 0 alone reads the entry and frees it: an mbarrier arrive releases only the
        // arriving thread's own accesses, so the other lanes' reads would not be ordered before
        // the producer's next write to it (racecheck reports exactly that); a shuffle hands it on.
        mbar_wait(tile_full(j & 1), (j >> 1) & 1);
        int entry = 0;
        if (lane == 0) {
          entry = tile_ring[j & 1];
          mbar_arrive(tile_empty(j & 1));
        }
        tile = __shfl_sync(0xffffffffu, entry, 0);
      }
      if (tile >= num_tiles) break;
      FwdBlock blk;
      if (!tile_block(tile, blk)) continue;
      const int b = blk.b, h = blk.h, m0 = blk.m0, len_q = blk.len_q, len_k = blk.len_k;
      const int64_t q_start = blk.q_start, offset = blk.offset, last_row = blk.last_row;
      const int nb_min = blk.nb_min, nb_max = blk.nb_max;
      // FP8: the descales of this tile's (batch, kv head); 1 otherwise.
      auto descale = [&](const float* d, int64_t batch_stride, int64_t head_stride) {
        return kFp8 && d != nullptr ? d[b * batch_stride + blk.h_k * head_stride] : 1.f;
      };
      const float q_scale = descale(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride);
      const float k_scale = descale(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride);
      const float score_scale = kFp8 ? p.softmax_scale * q_scale * k_scale : p.softmax_scale;
      const bool modified = kFp8 ? p.softcap > 0.f || p.alibi_slopes != nullptr || score_scale < 0.f : modified_all;
      const float scale_log2 = kFp8 ? (modified ? kLog2e : score_scale * kLog2e) : scale_log2_all;
      const float v_scale = descale(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride);
      // FP8: descales are read here, not on the host (a synchronizing copy per call cost 12-30 % of
      // the FP8 forward's time, perf-notes). A head whose descales are not finite and > 0, or whose
      // score scale (/ softcap) is not a normal float32, gets NaN in out and lse: never a finite
      // result computed from them (flashattn.hpp, AttentionParams::q_descale).
      bool bad_descale = false;
      if constexpr (kFp8) {
        auto positive = [](float x) { return x > 0.f && x <= FLT_MAX; };
        auto normal = [](float x) { return fabsf(x) >= FLT_MIN && fabsf(x) <= kMaxSoftmaxScale; };
        bad_descale = !(positive(q_scale) && positive(k_scale) && positive(v_scale) && normal(score_scale) &&
                        (p.softcap <= 0.f || normal(score_scale / p.softcap)));
      }
      float o[Dv / 2];
#pragma unroll
      for (int i = 0; i < Dv / 2; ++i) o[i] = 0.f;
      float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

      const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;

      if (nb_max > nb_min) {
        float s[BN / 2];
        uint32_t pf[BN / kKStep][4];
        // Q as wgmma A fragments (Cfg::kQInRegs): loaded once per tile, so that S = Q Kᵀ reads
        // only K from shared memory.
        uint32_t qf[Cfg::kQInRegs ? D / kKStep : 1][4];

        // S = Q K(stage)ᵀ: head_dim / 16 k-steps; a k-step moves 32 bytes along a 128-byte row and
        // every 4 steps to the next 64-column panel.
        auto issue_qk = [&](int stage) {
          const uint64_t k_desc = make_desc(sK + stage * Cfg::kKBytes, 16, 1024);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < D / kKStep; ++kk) {
            const uint32_t qa = (kk / 4) * BM * 128 + (kk % 4) * 32;
            const uint32_t ka = (kk / 4) * BN * 128 + (kk % 4) * 32;
            if constexpr (Cfg::kQInRegs)
              Wgmma<Elem, BN>::rk(s, qf[kk], desc_advance(k_desc, ka), kk > 0);
            else
              Wgmma<Elem, BN>::ss(s, desc_advance(q_mine, qa), desc_advance(k_desc, ka), kk > 0);
          }
          wgmma_commit();
        };
        // O += P V(stage): block_n / 16 k-steps of 16 key rows (2048 bytes) each; V is MN-major
        // with its 64-column panels block_n · 128 bytes apart.
        auto issue_pv = [&](int stage) {
          wgmma_fence();
          if constexpr (kFp8) {
            // Vᵀ (K-major, head_dim rows of block_n = 128 key bytes): k-steps of 32 keys, 32 bytes.
            const uint64_t v_desc = make_desc(sV + stage * Cfg::kVBytes, 16, 1024);
#pragma unroll
            for (int kk = 0; kk < BN / kKStep; ++kk) Wgmma<Elem, Dv>::rk(o, pf[kk], desc_advance(v_desc, kk * 32), 1);
          } else {
            const uint64_t v_desc = make_desc(sV + stage * Cfg::kVBytes, BN * 128, 1024);
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) Wgmma<Elem, Dv>::rs(o, pf[kk], desc_advance(v_desc, kk * 16 * 128), 1);
          }
          wgmma_commit();
        };
        // Q's fragments too: the tensor cores read them until S is complete, so the compiler must
        // not reuse their registers before this point.
        auto fence_s = [&] {
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) fence_operand(s[i]);
          if constexpr (Cfg::kQInRegs)
#pragma unroll
            for (int kk = 0; kk < D / kKStep; ++kk)
#pragma unroll
              for (int r = 0; r < 4; ++r) fence_operand(qf[kk][r]);
        };
        // After the P V product completes: O is final for this tile, and P's registers (read by the
        // tensor cores until now) may be reused.
        auto fence_o = [&] {
#pragma unroll
          for (int i = 0; i < Dv / 2; ++i) fence_operand(o[i]);
#pragma unroll
          for (int kk = 0; kk < BN / kKStep; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) fence_operand(pf[kk][r]);
        };
        auto release = [&](uint32_t bar) {
          __syncwarp();
          if (lane == 0) mbar_arrive(bar);
        };
        // A varlen tile that crosses the sequence end holds the next sequence's V rows: zero them
        // (all consumer warpgroups share the work, then meet on named barrier 1).
        auto prepare_v = [&](int nb, int stage) {
          const int valid = len_k - nb * BN;
          if (kFp8 || !varlen || valid >= BN) return;  // (FP8 runs batched only)
          const int ctid = threadIdx.x - 128;
          for (int i = ctid; i < (BN - valid) * kPanelsV * 8; i += 128 * Cfg::kConsumerWarpgroups) {
            const int r = valid + i / (kPanelsV * 8), c = i % (kPanelsV * 8);
            *reinterpret_cast<uint4*>(smem + (sV - sQ) + stage * Cfg::kVBytes +
                                      swizzled_chunk<BN>(r, c)) = make_uint4(0, 0, 0, 0);
          }
          fence_proxy_async();
          // (A warpgroup that does not see this key tile frees it from idle_round(), elsewhere.)
          named_barrier_sync_unaligned(1, 128 * Cfg::kConsumerWarpgroups);
        };

        // The row maxima, alpha and the exponentials (P in s) of the online softmax. At 16-bit
        // head_dim 128 and 256 (kExpInArms) they run in both arms of softmax()'s mask branch, never
        // after it. Why: ptxas schedules a wgmma wait as early as it can within its basic block
        // (it does not move one above a branch), so with these after the branch the steady
        // round's wgmma_wait<0> (P V done) ran before the exponentials, and a warpgroup's softmax
        // never overlapped its own P V, only the other warpgroup's products. In the arms they stay
        // above the wait (no serialization, no spills): head_dim 128 0 to +3 % at seqlen
        // 2048-4096, -0.5 / -1.2 % at 1024 / causal 1024; head_dim 256 +1-6 %. Head_dim 64 (three
        // consumers, a P V half as long) lost 2 % and FP8 lost on 5 of 7 points, so they keep one
        // copy after the branch (perf-notes, forward v9). Nothing but ptxas's current scheduling
        // keeps the two copies apart: after a toolkit update, check the SASS (MUFU.EX2 before the
        // steady round's WARPGROUP.DEPBAR.LE gsb0, 0x0).
        auto max_exp = [&](float (&alpha)[2]) {
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            float mx = row_max[hr];
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]));
            mx = quad_max(mx);
            // A row that has seen only masked keys keeps max −inf and uses 0 as its exponent base,
            // so exp2(−inf − base) = 0 instead of NaN.
            const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
            alpha[hr] = fast_exp2(row_max[hr] * scale_log2 - base);
            const float pbase = base - kPBias;
            row_max[hr] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              constexpr int kEvery = Cfg::kExp2PolyEvery;
              const bool fma_pipe = kEvery > 0 && j % (kEvery > 0 ? kEvery : 1) == kEvery - 1;
              const float x0 = s[4 * j + 2 * hr] * scale_log2 - pbase;
              const float x1 = s[4 * j + 2 * hr + 1] * scale_log2 - pbase;
              const float p0 = fma_pipe ? exp2_fma(x0) : fast_exp2(x0);
              const float p1 = fma_pipe ? exp2_fma(x1) : fast_exp2(x1);
              s[4 * j + 2 * hr] = p0;
              s[4 * j + 2 * hr + 1] = p1;
              sum += p0 + p1;
            }
            row_sum[hr] = row_sum[hr] * alpha[hr] + sum;
          }
        };
        // Mask and modifiers for tile nb, then the online softmax: s becomes P (unnormalized, fp32)
        // and alpha[hr] the factor that rescales O and the running sum (FA-2 Alg. 1 lines 8-10).
        // Key tiles [free_lo, free_hi): all keys below len_k and visible to every row of this
        // warpgroup up to last_row. (Its rows before 0, in an end-aligned first tile, can only
        // narrow the range; max(wg_first, 0) would widen it by a tile there at most.)
        int free_lo, free_hi;
        {
          const int64_t wg_first = int64_t(m0) + cw * 64, wg_last = min(last_row, wg_first + 63);
          mask_free_key_tiles<BN>(wg_first, wg_last, offset, len_k, p.window_size_left, p.window_size_right, free_lo,
                                  free_hi);
        }
        auto softmax = [&](int nb, float (&alpha)[2]) {
          const int n0 = nb * BN;
          const int64_t d_base = n0 + 2 * t - (m0 + row0 + offset);
          if (modified) {
            const float cap = p.softcap;
            if (cap > 0.f) {
              const float pre = score_scale / cap;
#pragma unroll
              for (int i = 0; i < BN / 2; ++i) s[i] = cap * tanhf(s[i] * pre);
            } else {
#pragma unroll
              for (int i = 0; i < BN / 2; ++i) s[i] *= score_scale;
            }
            if (p.alibi_slopes != nullptr) {
              const float base = float(d_base);
#pragma unroll
              for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                  const int k = j * 8 + (c % 2) - (c / 2) * 8;
                  s[4 * j + c] -= slope * fabsf(base + float(k));
                }
            }
          }
          const bool need_mask = nb < free_lo || nb >= free_hi;
          if (need_mask) {
            // Visible iff col < len_k and −window_size_left <= col − row − offset <= window_size_right,
            // as compares of k = (col − row − offset) − d_base, |k| < 2^8, against clamped bounds.
            constexpr int64_t kClamp = 1 << 20;
            auto clamp = [](int64_t x) { return int(x < -kClamp ? -kClamp : (x > kClamp ? kClamp : x)); };
            const int k_end = clamp(len_k - n0 - 2 * t);
            const int k_lo = p.window_size_left >= 0 ? clamp(-p.window_size_left - d_base) : -int(kClamp);
            const int k_hi = p.window_size_right >= 0 ? clamp(p.window_size_right - d_base) : int(kClamp);
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const int kc = j * 8 + (c % 2);
                const int k = kc - (c / 2) * 8;
                if (kc >= k_end || k < k_lo || k > k_hi) s[4 * j + c] = -INFINITY;
              }
            if constexpr (kExpInArms) max_exp(alpha);
          } else if constexpr (kExpInArms) {
            max_exp(alpha);
          }
          if constexpr (!kExpInArms) max_exp(alpha);
        };
        // P as the A operand of k-step kk: accumulator pairs of n8 tiles 2kk and 2kk+1 (the wgmma
        // accumulator and A-fragment layouts agree on rows, as for mma.sync).
        auto pack_p = [&] {
          if constexpr (kFp8) {
            // The 8-bit A fragment of k-step kk wants, per row, positions 4t .. 4t+3 and 16+4t ..
            // 16+4t+3 of its 32 keys; the thread holds keys 2t, 2t+1 of each n8 tile. Vᵀ's keys are
            // permuted within 32-key blocks to match (fp8_vt_key()), so no shuffles are needed.
#pragma unroll
            for (int kk = 0; kk < BN / 32; ++kk) {
              const float* q = s + 16 * kk;
              pf[kk][0] = pack4_e4m3(q[0], q[1], q[4], q[5]);
              pf[kk][1] = pack4_e4m3(q[2], q[3], q[6], q[7]);
              pf[kk][2] = pack4_e4m3(q[8], q[9], q[12], q[13]);
              pf[kk][3] = pack4_e4m3(q[10], q[11], q[14], q[15]);
            }
          } else {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
              pf[kk][0] = pack2<Elem>(s[8 * kk + 0], s[8 * kk + 1]);
              pf[kk][1] = pack2<Elem>(s[8 * kk + 2], s[8 * kk + 3]);
              pf[kk][2] = pack2<Elem>(s[8 * kk + 4], s[8 * kk + 5]);
              pf[kk][3] = pack2<Elem>(s[8 * kk + 6], s[8 * kk + 7]);
            }
          }
        };

        FWD_TRACE(cw + 1, j, 1);
        mbar_wait(q_full, loaded & 1);
        FWD_TRACE(cw + 1, j, 2);
        ++loaded;
        if constexpr (Cfg::kQInRegs) {
          // Warp w's 16 rows as four 8x8 matrices per k-step (rows +0 / +8, columns +0 / +8: the
          // m16n8k16 A fragment order); lane L addresses row L % 16, 16-byte chunk L / 16. The
          // producer may load the next tile's Q as soon as every warp has its fragments.
          const int q_row = cw * 64 + warp * 16 + (lane % 16);
#pragma unroll
          // (e4m3: the same b16 view: bytes 4t .. 4t+3 of a row are the 8-bit A fragment's.)
          for (int kk = 0; kk < D / kKStep; ++kk)
            ldmatrix_x4(qf[kk], sQ + swizzled_chunk<BM>(q_row, 2 * kk + lane / 16));
        // The next write to sQ is the producer's TMA (the async proxy): order these generic-proxy
        // reads before it, as the PTX memory model asks for across proxies.
        fence_proxy_async();
        release(q_empty);
        }
        // This warpgroup's own key tiles [lo, hi): those its 64 rows see. Where they are fewer than
        // the block's (rows past the sequence end in a tile that crosses it, rows before its start
        // in an end-aligned first tile, 64-row steps under a causal mask or a window), the
        // warpgroup skips the others' products and softmax, but still takes its turn and frees
        // their K / V slots, in the same rounds: round r of a tile is S(nb_max - 1 - r) and
        // P(nb_max - r) V for every warpgroup, so the turns stay in step.
        // (Not above head_dim 128, whose registers have no room for the bookkeeping: 2 spills at
        // head_dim 256, 8-12 bytes at 192.)
        int lo = nb_min, hi = nb_min;
        if constexpr (D > 128) {
          lo = nb_min;
          hi = nb_max;
        } else {
          // (A subset of the block's [nb_min, nb_max), as its rows are.)
          const int64_t r_first = max(m0 + cw * 64, 0), r_last = min(int64_t(m0) + cw * 64 + 63, int64_t(len_q) - 1);
          if (r_first <= r_last) visible_key_tiles<BN>(p, r_first, r_last, offset, len_k, lo, hi);
          if (lo >= hi) lo = hi = nb_min;
        }
        auto idle_round = [&](int nb) {
          my_turn();
          your_turn();
          mbar_wait(k_full(stage), phase);
          release(k_empty(stage));
          mbar_wait(v_full(stage), phase);
          if (nb == nb_max - 1) prepare_v(nb, stage);
          release(v_empty(stage));
          stage = stage + 1 == S ? 0 : stage + 1;
          if (stage == 0) phase ^= 1;
        };
        FWD_TRACE(cw + 1, j, 3);
        for (int nb = nb_max - 1; nb >= hi; --nb) idle_round(nb);
        if (lo < hi) {
          float alpha[2];
          // First tile: S, softmax; O is still zero, so nothing to rescale.
          mbar_wait(k_full(stage), phase);
          my_turn();
          FWD_TRACE(cw + 1, j, 4);
          issue_qk(stage);
          your_turn();
          wgmma_wait<0>();
          FWD_TRACE(cw + 1, j, 5);
          fence_s();
          release(k_empty(stage));
          softmax(hi - 1, alpha);
          pack_p();
          FWD_TRACE(cw + 1, j, 6);
          // Only the first (highest) tile can cross the sequence end: prepare its V now, outside the
          // turn-taking (every consumer warpgroup meets on a barrier there, those that do not see
          // the tile from idle_round()).
          mbar_wait(v_full(stage), phase);
          if (hi == nb_max) prepare_v(hi - 1, stage);

          for (int nb = hi - 2; nb >= lo; --nb) {
            const int next = stage + 1 == S ? 0 : stage + 1;
            const uint32_t next_phase = next == 0 ? phase ^ 1 : phase;
            mbar_wait(k_full(next), next_phase);
            FWD_TRACE(cw + 1, j, FWD_TRACE_ROUND(hi - 2 - nb, 0));
            my_turn();
            FWD_TRACE(cw + 1, j, FWD_TRACE_ROUND(hi - 2 - nb, 1));
            issue_qk(next);
            mbar_wait(v_full(stage), phase);
            issue_pv(stage);
            your_turn();
            wgmma_wait<1>();  // S(nb) is done; P(nb+1) V(nb+1) may still run
            FWD_TRACE(cw + 1, j, FWD_TRACE_ROUND(hi - 2 - nb, 2));
            fence_s();
            release(k_empty(next));
            softmax(nb, alpha);
            wgmma_wait<0>();
            FWD_TRACE(cw + 1, j, FWD_TRACE_ROUND(hi - 2 - nb, 3));
            fence_o();
            release(v_empty(stage));
#pragma unroll
            for (int j = 0; j < Dv / 8; ++j) {
              o[4 * j + 0] *= alpha[0];
              o[4 * j + 1] *= alpha[0];
              o[4 * j + 2] *= alpha[1];
              o[4 * j + 3] *= alpha[1];
            }
            pack_p();
            stage = next;
            phase = next_phase;
          }
          // Every S = Q Kᵀ of the tile is complete: the producer may load the next tile's Q.
          if constexpr (!Cfg::kQInRegs && !kQHeldToEpilogue) release(q_empty);
          mbar_wait(v_full(stage), phase);
          my_turn();
          FWD_TRACE(cw + 1, j, 56);
          issue_pv(stage);
          your_turn();
          wgmma_wait<0>();
          FWD_TRACE(cw + 1, j, 57);
          fence_o();
          release(v_empty(stage));
          stage = stage + 1 == S ? 0 : stage + 1;
          if (stage == 0) phase ^= 1;
        } else {
          // No key of the tile is this warpgroup's: one turn for the round that ends the others'
          // last P V.
          my_turn();
          your_turn();
          if constexpr (!Cfg::kQInRegs && !kQHeldToEpilogue) release(q_empty);
        }
        for (int nb = lo - 1; nb >= nb_min; --nb) idle_round(nb);
      }

      // Epilogue: O / l and lse = ln l + m · scale; a row with no visible key has l = 0: out 0,
      // lse −inf. Each warp stages its own 16 rows in the same rows of sO with stmatrix (no other
      // warp reads them; where sO is the Q tile, the other warpgroup's wgmmas read only its own
      // rows). With o_tma (launch_fwd_sm90_config: batched, and out fits a tensor map) one thread
      // per warpgroup then stores its 64 rows with TMA stores, which skip the rows past seqlen_q
      // and the columns past head_dim_v; the warpgroup's 128 threads spend a barrier on that
      // instead of a loop of 16-byte stores on the path to the next tile's first product (~800
      // cycles per tile at head_dim 128, bench/gpu/fwd_timeline.cu). Otherwise each warp reads
      // its rows back and stores them in 16-byte chunks. Named barrier kEpilogueBarrier + cw is the
      // warpgroup's own; its previous TMA store must have read sO before the rows are staged again.
      // (Rows before the sequence's start, m0 + row < 0, belong to no output: end-aligned tiles.)
      if (o_tma) {
        if (tid == 0) bulk_wait_read<0>();
        named_barrier_sync(kEpilogueBarrier + cw, 128);
      }
      FWD_TRACE(cw + 1, j, 60);
      // Both rows' sums first, then branch-free reciprocals: an IEEE division's slow-path call put
      // a branch between the two rows, and each row's shuffles, division and lse ran one after
      // the other (747 -> 435 cycles per tile at head_dim 128 seqlen 1024, timeline; session 23).
      // Where a key is visible, l is about 1 or more (the row maximum's term is exp2 of a rounding
      // error; 2^8 for FP8), far from where __fdividef loses accuracy (a divisor above 2^126).
      float l[2], inv[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) l[hr] = quad_sum(row_sum[hr]);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        // l = 0: no visible key (out 0, lse −inf); l NaN (a NaN score): out and lse NaN.
        const bool seen = !(l[hr] <= 0.f);
        inv[hr] = bad_descale ? NAN : seen ? __fdividef(v_scale, l[hr]) : 0.f;
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const bool seen = !(l[hr] <= 0.f);
        const int row = row0 + hr * 8;
        if (p.lse != nullptr && t == 0 && m0 + row >= 0 && m0 + row < len_q) {
          const float lse = bad_descale ? NAN
                            : seen     ? (row_max[hr] * scale_log2 + __log2f(l[hr]) - kPBias) * kLn2
                                       : -INFINITY;
          p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + (q_start + m0 + row) * p.lse_row_stride] = lse;
        }
      }
      FWD_TRACE(cw + 1, j, 61);
      // O's fragments as 8 x 8 matrices (rows +0 / +8, columns 16kk + 0..7 / 8..15; the wgmma
      // accumulator is the mma.sync one) by stmatrix: lane l gives the 16-byte row of matrix l / 8.
      const int o_row = cw * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      // Where O is staged in the Q tile (kQHeldToEpilogue), a tile without keys holds no Q slot
      // (the producer may be loading the next tile's Q into it): its zeros go straight out.
      const bool staged = !kQHeldToEpilogue || nb_max > nb_min;
#pragma unroll
      for (int kk = 0; kk < Dv / 16 && staged; ++kk) {
        const float* x = o + 8 * kk;
        stmatrix_x4(sO + swizzled_chunk<BM>(o_row, 2 * kk + (lane >> 4)), pack2<Out>(x[0] * inv[0], x[1] * inv[0]),
                    pack2<Out>(x[2] * inv[1], x[3] * inv[1]), pack2<Out>(x[4] * inv[0], x[5] * inv[0]),
                    pack2<Out>(x[6] * inv[1], x[7] * inv[1]));
      }
      FWD_TRACE(cw + 1, j, 58);
      // (A box that starts before row 0, the end-aligned first tile of a sequence, faults on the
      // H200 as an illegal instruction: such rows take the per-thread stores.)
      if (o_tma && staged && m0 + cw * 64 >= 0) {
        fence_proxy_async();  // the staging writes before the async proxy's reads
        named_barrier_sync(kEpilogueBarrier + cw, 128);
        if (tid == 0) {
#pragma unroll
          for (int pn = 0; pn < Dv / 64; ++pn)
            tma_store_4d(&tmap_o, sO + pn * BM * 128 + cw * 64 * 128, pn * 64, m0 + cw * 64, h, b);
          bulk_commit();
        }
      } else {
        __syncwarp();
        OutStorage* const out_base = static_cast<OutStorage*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride;
        constexpr int kChunks = Dv / 8;
#pragma unroll
        for (int it = 0; it < 16 * kChunks / 32; ++it) {
          const int i = lane + it * 32;
          const int row = cw * 64 + warp * 16 + i / kChunks, c = i % kChunks;
          if (m0 + row >= 0 && m0 + row < len_q && c * 8 < p.head_dim_v) {
            const uint4 val =
                staged ? *reinterpret_cast<const uint4*>(smem_o + swizzled_chunk<BM>(row, c)) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4*>(out_base + (q_start + m0 + row) * p.o_row_stride + c * 8) = val;
          }
        }
        __syncwarp();  // this warp's rows of sO are read before the next tile stages its own
      }
      if constexpr (kQHeldToEpilogue) {
        // The tile's Q slot once O has been read out of it: by the warpgroup's TMA store (thread 0
        // waits for its read) or by each warp's own stores; then the async proxy's next write (the
        // next Q) is ordered after these generic accesses.
        if (o_tma && m0 + cw * 64 >= 0) {
          if (tid == 0) bulk_wait_read<0>();
          named_barrier_sync(kEpilogueBarrier + cw, 128);
        }
        if (staged) {
          fence_proxy_async();
          __syncwarp();
          if (lane == 0) mbar_arrive(q_empty);
        }
      }
      FWD_TRACE(cw + 1, j, 59);
      // One block per tile (not persistent): no next tile. Leaving here keeps the tile loop's state
      // out of the registers (head_dim 192 at block_n 112 spilled one such value across the tile).
      if constexpr (!Cfg::kPersistent) break;
    }
    // The stores must be done before the block's shared memory goes.
    if (o_tma && tid == 0) bulk_wait_all();
    if (cw == 0) my_turn();  // consumes the last warpgroup's last arrival
  }
#endif
}

// The zeroed pair of ints (next tile, finished blocks) of a dynamic persistent forward on this
// stream: one pair per (device, stream), allocated and zeroed on the stream once (cudaMemsetAsync:
// ordered before every kernel that uses it, since all of them run on that stream, one after the
// other); each launch's last block re-zeroes it for the next. Launches on other streams have pairs
// of their own, so no two kernels that may run at once share one. While the stream is being
// captured, a pair is allocated, zeroed and freed with the launch (stream-ordered, so the graph
// owns it and replays on any stream never share). nullptr when any of that fails (the caller then
// launches one block per tile). A stream destroyed and another created at the same address reuse
// the pair: by then the old stream's kernels have finished, unless it was destroyed with work
// pending.
struct FwdTileCounter {
  int* ptr = nullptr;         // what the kernel gets
  StreamBuffer launch_alloc;  // allocated for this launch only (capture), freed on its stream
};

inline void fwd_tile_counter(cudaStream_t stream, FwdTileCounter& counter) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> pairs;
  int device = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaGetDevice(&device) != cudaSuccess || cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  constexpr size_t kBytes = 2 * sizeof(int);
  if (capture != cudaStreamCaptureStatusNone) {
    if (counter.launch_alloc.allocate(kBytes, stream) != cudaSuccess) return;
    int* const ptr = static_cast<int*>(counter.launch_alloc.ptr);
    if (cudaMemsetAsync(ptr, 0, kBytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    counter.ptr = ptr;
    return;
  }
  const std::lock_guard<std::mutex> lock(mu);
  int*& ptr = pairs[{device, stream}];
  if (ptr == nullptr) {
    const RelaxedCaptureMode relaxed;  // (another stream may be under capture)
    int* fresh = nullptr;
    if (cudaMalloc(&fresh, kBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (cudaMemsetAsync(fresh, 0, kBytes, stream) != cudaSuccess) {
      cudaFree(fresh);
      (void)cudaGetLastError();
      return;
    }
    ptr = fresh;
  }
  counter.ptr = ptr;
}

template <typename Elem, typename Cfg>
void launch_fwd_sm90_config(const FwdParams& p, int batch, int max_seqlen_q, int64_t rows_q, int64_t rows_k,
                            void* stream) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t nb = varlen ? 1 : batch;
  const int hk = p.num_heads / p.head_ratio;
  const CUtensorMap tq = sm90::make_tensor_map<Elem>("q", p.q, p.head_dim, rows_q, p.num_heads, nb, p.q_row_stride,
                                               p.q_head_stride, p.q_batch_stride, Cfg::kBlockM);
  const CUtensorMap tk = sm90::make_tensor_map<Elem>("k", p.k, p.head_dim, rows_k, hk, nb, p.k_row_stride, p.k_head_stride,
                                               p.k_batch_stride, Cfg::kBlockN);
  const CUtensorMap tv =
      std::is_same_v<Elem, E4M3>
          // Vᵀ [batch, hk, head_dim_v, vt_cols] (launch_fwd_sm90_fp8): boxes of block_n keys x head_dim rows.
          ? sm90::make_tensor_map<Elem>("v", p.vt, p.vt_cols, Cfg::kHeadDim, hk, nb, p.vt_cols, Cfg::kHeadDim * p.vt_cols,
                                        hk * Cfg::kHeadDim * p.vt_cols, Cfg::kHeadDim)
          : sm90::make_tensor_map<Elem>("v", p.v, p.head_dim_v, rows_k, hk, nb, p.v_row_stride, p.v_head_stride,
                                        p.v_batch_stride, Cfg::kBlockN);
  // out by TMA stores where a batched out fits a tensor map (strides of dims longer than 1 in
  // (0, 2^39) elements; the dispatch already asks 16-byte alignment of them and of the pointer). A
  // varlen tile that crosses its sequence's end holds the next sequence's rows, which a box would
  // overwrite: those keep the per-thread stores. FLASHATTN_CUDA_FWD_O_TMA=0 (testing) forces them.
  using Out = typename OutElem<Elem>::type;
  static const bool o_tma_off = env_is("FLASHATTN_CUDA_FWD_O_TMA", "0");
  const bool o_tma = !varlen && !o_tma_off && sm90::tma_dim_fits(rows_q, p.o_row_stride) &&
                     sm90::tma_dim_fits(p.num_heads, p.o_head_stride) && sm90::tma_dim_fits(nb, p.o_batch_stride);
  CUtensorMap to{};
  if (o_tma)
    to = sm90::make_tensor_map<Out>("out", p.out, p.head_dim_v, rows_q, p.num_heads, nb, p.o_row_stride,
                                    p.o_head_stride, p.o_batch_stride, 64);
  auto kernel = fwd_sm90_kernel<Elem, Cfg>;
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  const int num_m_blocks = (max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t num_tiles = int64_t(num_m_blocks) * p.num_heads * batch;
  // Static tiles where every tile costs the same; under a causal mask, a window or varlen lengths a
  // static round-robin would give some blocks several times the work of others (where gridDim.x is
  // a multiple of the query blocks per head, block x gets the same query block of every head), so
  // those take tiles from a counter (dynamic), or one block per tile when there is no counter.
  const bool uniform = !varlen && p.window_size_left < 0 && p.window_size_right < 0;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  FwdTileCounter counter;
  if (Cfg::kPersistent && !uniform) fwd_tile_counter(cuda_stream, counter);
  const bool persistent = Cfg::kPersistent && (uniform || counter.ptr != nullptr);
  // (Not persistent: one block per tile, and the kernel leaves its tile loop after that tile.)
  int64_t blocks = persistent ? std::min<int64_t>(num_tiles, multiprocessor_count()) : num_tiles;
  // FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=N (testing): at most N persistent blocks, so that small
  // test shapes send each block through several tiles.
  static const int64_t cap = env_count("FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS");
  if (persistent && cap > 0) blocks = std::min(blocks, cap);
  // Tile indices are ints: a dynamic fetch returns at most num_tiles + gridDim.x (gridDim.x at most
  // the multiprocessors), and the static step saturates at num_tiles.
  if (num_tiles + multiprocessor_count() > 0x7fffffff)
    throw Error("q: expected fewer than 2^31 query blocks of " + std::to_string(Cfg::kBlockM) +
                " rows over batch and heads on cuda, got " + std::to_string(num_tiles));
  // Under a mask the last pairs' tiles go tile-major (grid_order.hpp fwd_tail_pairs): the grid ends
  // on light tiles instead of a last head's heaviest. Its order serves the dynamic counter and the
  // hardware's in-order dispatch of one block per tile alike; a wave is as many tiles as run at
  // once (so that the testing cap on persistent blocks sends small grids through both orders).
  const int64_t pairs = int64_t(p.num_heads) * batch;
  const int tail = fwd_tail_pairs(pairs, num_m_blocks, int(std::min<int64_t>(blocks, multiprocessor_count())),
                                  p.window_size_left >= 0 || p.window_size_right >= 0);
  kernel<<<dim3(unsigned(blocks)), Cfg::kThreads, Cfg::kSmemBytes, cuda_stream>>>(
      p, tq, tk, tv, to, o_tma, TileOrder(pairs, num_m_blocks, tail), FastDiv(p.num_heads), int(num_tiles),
      persistent ? counter.ptr : nullptr);
  FA_CUDA_CHECK(cudaGetLastError());
}

template <typename Elem, int kHeadDim>
void launch_fwd_sm90(const FwdParams& p, int batch, int max_seqlen_q, int64_t rows_q, int64_t rows_k, void* stream) {
  using Traits = FwdSm90Traits<kHeadDim>;
  if constexpr (requires { typename Traits::ShortConfig; }) {
    using Short = typename Traits::ShortConfig;
    using Long = typename Traits::Config;
    // FLASHATTN_CUDA_FWD_SHORT_TILE=1 / 0 (testing): the short tile at every shape / at none.
    static const bool always = env_is("FLASHATTN_CUDA_FWD_SHORT_TILE", "1");
    static const bool never = env_is("FLASHATTN_CUDA_FWD_SHORT_TILE", "0");
    if (always || (!never && fwd_short_tile_pays(max_seqlen_q, int64_t(batch) * p.num_heads, multiprocessor_count(),
                                                 Short::kBlockM, Long::kBlockM, Traits::kShortMaxSeqlenQ))) {
      launch_fwd_sm90_config<Elem, Short>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
      return;
    }
  }
  // Whether the 256 bucket's 256 or 192 config runs its block_n 64 version (fwd_traits.hpp):
  // FLASHATTN_CUDA_FWD_BN64=1 / 0 (testing, read per call) at every shape / at none.
  // (Asked only where one of those configs would run: not for MLA's.)
  [[maybe_unused]] const bool masked = p.window_size_left >= 0 || p.window_size_right >= 0;
  [[maybe_unused]] auto masked_short = [&] {
    return env_is("FLASHATTN_CUDA_FWD_BN64", "1") ||
           (!env_is("FLASHATTN_CUDA_FWD_BN64", "0") && fwd_256_masked_short(masked, p.seqlen_k));
  };
  // Whether the 192 config steps 96 keys instead of 112: without a causal mask or window, as
  // fwd_d192_block_n() says (its count assumes every query tile sweeps all keys; masked calls keep
  // the measured 112). FLASHATTN_CUDA_FWD_D192_BN=96 / 112 (testing, read per call) forces either
  // wherever the block_n 64 config does not run (masked_short() is asked first; other values are
  // ignored).
  [[maybe_unused]] auto d192_bn96 = [&] {
    if (env_is("FLASHATTN_CUDA_FWD_D192_BN", "96")) return true;
    if (env_is("FLASHATTN_CUDA_FWD_D192_BN", "112")) return false;
    return !masked && fwd_d192_block_n(p.seqlen_k) == 96;
  };
  if constexpr (requires { typename Traits::MlaConfig; }) {
    // FLASHATTN_CUDA_FWD_D192=0 (testing, A/B within one process: read per call, as
    // FLASHATTN_CUDA_FWD is): the 256 config for every call of the bucket.
    switch (tile_256(p.head_dim, p.head_dim_v, !env_is("FLASHATTN_CUDA_FWD_D192", "0"))) {
      case Tile256::mla:
        launch_fwd_sm90_config<Elem, typename Traits::MlaConfig>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
        return;
      case Tile256::d192:
        if (masked_short())
          launch_fwd_sm90_config<Elem, typename Traits::D192MaskedShortConfig>(p, batch, max_seqlen_q, rows_q, rows_k,
                                                                               stream);
        else if (d192_bn96())
          launch_fwd_sm90_config<Elem, typename Traits::D192Bn96Config>(p, batch, max_seqlen_q, rows_q, rows_k,
                                                                        stream);
        else
          launch_fwd_sm90_config<Elem, typename Traits::D192Config>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
        return;
      case Tile256::d256:
        break;
    }
  }
  if constexpr (requires { typename Traits::MaskedShortConfig; })
    if (masked_short()) {
      launch_fwd_sm90_config<Elem, typename Traits::MaskedShortConfig>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
      return;
    }
  launch_fwd_sm90_config<Elem, typename Traits::Config>(p, batch, max_seqlen_q, rows_q, rows_k, stream);
}

}  // namespace flashattn::cuda

// FlashAttention backward dK/dV kernel on Hopper (sm_90a): TMA, mbarriers, wgmma and warp
// specialization (FlashAttention-3, Shah et al. 2024, Sec. 3 and Appendix B.1; the math is
// FA-2's Alg. 2, as in the sm80 kernel, which stays for the deterministic mode; head_dim 256 runs
// bwd_sm90_dsplit.cuh).
//
// One block per (key tile of block_n = 128 keys, KV head, batch), three warpgroups; the last
// partial wave of an unmasked grid runs as three blocks per key tile instead, each a third of its
// query steps, whose dK / dV are summed before the epilogue (the split tail, below):
//   - the producer (warpgroup 0, 24 registers) loads K and V once, then, for every query tile
//     that sees the block's keys and every query head of the GQA group, Q and dO into kStages
//     TMA buffers (each consumer loads the tile's lse·log2e and D = rowsum(dO ∘ O) itself; at
//     block_m 80 the producer loads them into the stage instead);
//   - two consumers (240 registers) own 64 keys each (wgmma's M). Per query tile (block_m = 128
//     rows at head_dim 64; at 128, 80 without a mask or causal from seqlen_q 2048, never with
//     softcap or ALiBi, else 64;
//     dQ in 64-row tiles, or transposed at block_m 80):
//       Sᵀ = K Qᵀ, dPᵀ = V dOᵀ                    wgmma, both operands from shared memory
//       Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e)      (modifiers and mask as in the sm80 kernel)
//       dSᵀ = Pᵀ ∘ (dPᵀ − D) (∘ (1 − tanh²) under softcap)
//       dV += Pᵀ dO, dK += dSᵀ Q                   wgmma with Pᵀ / dSᵀ from registers
//       dQ_accum += dS K                           dSᵀ through shared memory (read as MN-major A);
//                                                  block_m 80: dQᵀ += Kᵀ dSᵀ, dS stored
//                                                  [queries][keys] (K-major B), M = 64 columns;
//                                                  the fp32 tile goes out as bulk reduce-adds,
//                                                  one per warp for its own 16 rows
//     issued in the order dV, dQ, dK, so that dQ's staging runs while dK's product does;
//     dK = scale · dK at the end.
//     The consumers issue their products in a fixed order each step (consumer 0 first: named
//     barriers 14 for Sᵀ / dPᵀ, 15 for dQ), so that the tensor cores finish one consumer's products
//     half way and its element-wise phase runs under the other's (FA-3's pingpong, for a step whose
//     dSᵀ rendezvous realigns the two anyway).
// head_dim 128 splits the dQ product's columns between the two consumers, head_dim 64 (128-query
// steps) its two 64-query tiles: either way each consumer reads all 128 keys of dSᵀ (so they meet
// on a named barrier) and the block adds one dQ over all its keys, BM x head_dim floats per step.
// (Splitting the keys instead, each consumer adding a partial dQ over its own 64, spared that
// barrier but doubled the bulk reduce-add traffic into L2: 512 bytes per query row and block at
// head_dim 64, twice head_dim 128's per FLOP.)
//
// Rows past a sequence's end: TMA zero-fills rows outside a tensor, but varlen tiles that cross
// a sequence end hold the next sequence's rows; they are zeroed in shared memory before any
// product that could multiply them by 0 (0 · inf = NaN), and masked elements get P = dS = 0.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/bwd_sm90_block.cuh"
#include "cuda/bwd_traits.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_utils.cuh"
#include "cuda/sm90_utils.cuh"

namespace flashattn::cuda {

template <typename Elem, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ CUtensorMap tmap_q,
                    const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                    const __grid_constant__ CUtensorMap tmap_do) {
#ifdef FLASHATTN_SM90_ENABLED
  using namespace sm90;
  using Storage = typename Elem::Storage;
  constexpr int D = Cfg::kHeadDim, BN = Cfg::kBlockN, BM = Cfg::kBlockM, S = Cfg::kStages;
  constexpr int kPanels = D / 64;
  constexpr bool kDqSplitN = D >= 128;  // else one 64-query tile each (see the file comment)
  // dQᵀ = Kᵀ dS per consumer (64 columns x BM queries), dS stored [queries][keys] (BM = 80).
  constexpr bool kDqT = Cfg::kDqTransposed;
  constexpr int kDqRegs = kDqT ? BM / 2 : 32;
  static_assert((BM == 64 || BM == 128 || BM == 80) && BN == 128, "dSᵀ panels; two 64-key consumers");
  static_assert(kDqSplitN ? BM == 64 || kDqT : BM == 128, "dQ: 64 columns or 64 queries per consumer");

  const BwdSm90Block<BN, BM> blk = bwd_sm90_block<BN, BM>(p);
  // A block past its sequence's keys still waits for the preprocess (BwdParams::pdl) before it
  // exits: were every block to exit without waiting (varlen lengths all 0 in a captured graph's
  // replay), this grid could complete before the preprocess, and the postprocess, which waits only
  // for this grid, would read a dq accumulator not yet zeroed.
  if (blk.n0 >= blk.len_k) {
    griddep_wait();
    return;
  }
  const int b = blk.b, hk = blk.hk, n0 = blk.n0;
  const int64_t q_start = blk.q_start, k_start = blk.k_start;
  const int len_q = blk.len_q, len_k = blk.len_k;
  const bool varlen = blk.varlen;
  const int tma_batch = blk.tma_batch, off = blk.off, wl = blk.wl, wr = blk.wr;
  const int count = blk.count, iters = blk.iters;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t sK = base, sV = sK + Cfg::kKVBytes;
  const uint32_t sQ0 = sV + Cfg::kKVBytes, sDO0 = sQ0 + S * Cfg::kQBytes;
  const uint32_t sDS0 = sDO0 + S * Cfg::kQBytes;
  // [2 consumers][2 buffers][lse, dsum][BM] floats, or [stage][lse, dsum][BM] (kDqT)
  const uint32_t sStat0 = sDS0 + Cfg::kDsBuffers * Cfg::kDsBytes;
  const uint32_t sDQ0 = sStat0 + Cfg::kStatAreaBytes;  // [2 consumers] 64 x 64 (or 64 x BM) fp32
  const uint32_t bars = sDQ0 + 2 * Cfg::kDqBytes;
  auto sQ = [&](int s) { return sQ0 + s * Cfg::kQBytes; };
  auto sDO = [&](int s) { return sDO0 + s * Cfg::kQBytes; };
  auto sStat = [&](int s) { return sStat0 + s * 2 * Cfg::kStatBytes; };  // kDqT: [stage][lse, D][BM]
  const uint32_t kv_full = bars;
  auto full = [&](int s) { return bars + 8 * (1 + s); };
  auto empty = [&](int s) { return bars + 8 * (1 + S + s); };
  auto gptr = [&](uint32_t a) { return smem + (a - base); };

  // The postprocess behind this grid may take the SMs its last wave leaves free (it waits for
  // this grid's dq accumulator itself).
  griddep_launch_dependents();
  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1);
      // One arrival per consumer warp; per consumer thread at BM = 80, whose threads read the
      // stage's statistics with ordinary loads (each orders its own reads before its arrival).
      mbar_init(empty(s), kDqT ? 256 : 8);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0 && count > 0) {
      prefetch_tensormap(&tmap_q);
      prefetch_tensormap(&tmap_do);
      mbar_arrive_expect_tx(kv_full, 2 * Cfg::kKVBytes);
      tma_load_tile<kPanels, BN>(sK, &tmap_k, kv_full, int(k_start) + n0, hk, tma_batch);
      tma_load_tile<kPanels, BN>(sV, &tmap_v, kv_full, int(k_start) + n0, hk, tma_batch);
      int s = 0;
      uint32_t phase = 0;
      BwdStep step = blk.start;
      for (int t = 0; t < iters; ++t, step = blk.next(step)) {
        const int h = blk.head_of(step), m0 = blk.m0_of(step);
        mbar_wait(empty(s), phase ^ 1);
        mbar_arrive_expect_tx(full(s), 2 * Cfg::kQBytes + (kDqT ? 2 * Cfg::kStatBytes : 0));
        tma_load_tile<kPanels, BM>(sQ(s), &tmap_q, full(s), int(q_start) + m0, h, tma_batch);
        tma_load_tile<kPanels, BM>(sDO(s), &tmap_do, full(s), int(q_start) + m0, h, tma_batch);
        if constexpr (kDqT) {
          // The step's statistics (lse·log2e, then D) with its Q and dO: they come from the
          // preprocess (BwdParams::pdl), so the first step's waits for it.
          if (t == 0) griddep_wait();
          const int64_t stat = (int64_t(b) * p.num_heads + h) * p.stat_rows + m0;
          bulk_load(sStat(s), p.lse_log2 + stat, Cfg::kStatBytes, full(s));
          bulk_load(sStat(s) + Cfg::kStatBytes, p.dsum + stat, Cfg::kStatBytes, full(s));
        }
        if (++s == S) {
          s = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    setmaxnreg_inc<kConsumerRegs>();
    // Launched behind the preprocess (BwdParams::pdl): its statistics, zeroed dq accumulator and
    // split tickets are complete and visible from here on. The producer's loads read only inputs.
    griddep_wait();
    // Read from lane 0 so that the compiler knows it is warp-uniform and keeps what derives from it
    // (shared-memory addresses, wgmma descriptors) in uniform registers.
    const int cw = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) - 1;  // keys cw*64 .. cw*64+63 of the block
    const int ctid = threadIdx.x - 128;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int kr0 = cw * 64 + warp * 16 + g;  // this thread's key rows: kr0 and kr0 + 8
    // K-major descriptors of this consumer's 64 key rows of K and V (the A of Sᵀ and dPᵀ).
    const uint64_t dk_mine = make_desc(sK + cw * 64 * 128, 16, 1024), dv_mine = make_desc(sV + cw * 64 * 128, 16, 1024);

    // dK and dV start from the first step's products (wgmma scale-d = 0), not from zeros: with
    // zero-filled accumulators ptxas kept them in local memory across the step loop (stores at
    // entry, reloads in the epilogue). A block without query tiles zeroes them at the end.
    float dk[D / 2], dv[D / 2];
    const float scale = p.softmax_scale, scale_log2 = scale * kLog2e, cap = p.softcap;
    const bool modified = cap > 0.f || p.alibi_slopes != nullptr;

    if (count > 0) {
      // The statistics of each query tile (lse·log2e and D, 64 each) come straight from the
      // workspace: thread tid of the warpgroup loads element tid of [lse | D] one tile ahead and
      // stores it into this warpgroup's double buffer before the iteration's named barrier, which
      // orders it before the next iteration's reads (and those reads before the next overwrite).
      // Statistics rows are padded to stat_rows (a multiple of 128): whole tiles, no bounds. (At BM
      // = 80 the producer loads them into the TMA ring with the step's Q and dO instead: the two
      // consumers share one copy, as two private ones would pass 227 KB.)
      // [buffer][lse, D][BM] (none at BM = 80: the stage holds them, sStat())
      float* stats = kDqT ? nullptr : reinterpret_cast<float*>(gptr(sStat0)) + cw * 4 * BM;
      // With BM = 128 each thread loads elements tid and tid + 128 of [lse | D].
      constexpr int kStatPerThread = 2 * BM / 128;
      auto load_stat = [&](BwdStep step, int e) {
        const int64_t stat = (int64_t(b) * p.num_heads + blk.head_of(step)) * p.stat_rows + blk.m0_of(step);
        return (e < BM ? p.lse_log2 : p.dsum)[stat + e % BM];
      };
      // This thread's elements of tile t's [lse | D] into registers (0 past the last tile), and
      // from there into buffer t & 1.
      auto load_stats = [&](int t, BwdStep step, float (&v)[kStatPerThread]) {
#pragma unroll
        for (int x = 0; x < kStatPerThread; ++x) v[x] = t < iters ? load_stat(step, tid + 128 * x) : 0.f;
      };
      auto store_stats = [&](int t, const float (&v)[kStatPerThread]) {
#pragma unroll
        for (int x = 0; x < kStatPerThread; ++x) stats[(t & 1) * 2 * BM + tid + 128 * x] = v[x];
      };
      // The first tile's statistics are requested before the wait for K and V, so that the two
      // latencies overlap instead of adding up at every block's start.
      float first_stat[kStatPerThread];
      if constexpr (!kDqT) load_stats(0, blk.start, first_stat);
      mbar_wait(kv_full, 0);
      if (varlen && len_k - n0 < BN) {
        zero_tile_rows<kPanels>(gptr(sK), BN, len_k - n0, ctid);
        zero_tile_rows<kPanels>(gptr(sV), BN, len_k - n0, ctid);
        fence_proxy_async();
        named_barrier_sync(1, 256);
      }
      if constexpr (!kDqT) {
        store_stats(0, first_stat);
        named_barrier_sync(2 + cw, 128);
      }
      int s = 0;
      uint32_t phase = 0;
      BwdStep step = blk.start;
      for (int t = 0; t < iters; ++t) {
        const int h = blk.head_of(step), m0 = blk.m0_of(step);
        const BwdStep next = blk.next(step);
        float next_stat[kStatPerThread];
        if constexpr (!kDqT) load_stats(t + 1, next, next_stat);
        mbar_wait(full(s), phase);
        if (varlen && len_q - m0 < BM) {
          zero_tile_rows<kPanels>(gptr(sQ(s)), BM, len_q - m0, ctid);
          zero_tile_rows<kPanels>(gptr(sDO(s)), BM, len_q - m0, ctid);
          fence_proxy_async();
          named_barrier_sync(1, 256);
        }

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: M = this warpgroup's 64 keys, N = 64 queries, K = head_dim.
        // Consumer 1 issues its products after consumer 0's (named barrier 14), so that the tensor
        // cores run them one after the other instead of interleaved: consumer 0's come back half
        // way and its element-wise phase runs under consumer 1's products (FA-3's pingpong, for
        // one product pair per step; the dSᵀ rendezvous below realigns them every step).
        if (cw == 1) named_barrier_sync(14, 256);
        float st[BM / 2], dp[BM / 2];
        const uint64_t dq_desc = make_desc(sQ(s), 16, 1024), ddo_desc = make_desc(sDO(s), 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t ka = (kk / 4) * BN * 128 + (kk % 4) * 32;
          const uint32_t qa = (kk / 4) * BM * 128 + (kk % 4) * 32;
          Wgmma<Elem, BM>::ss(st, desc_advance(dk_mine, ka), desc_advance(dq_desc, qa), kk > 0);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const uint32_t ka = (kk / 4) * BN * 128 + (kk % 4) * 32;
          const uint32_t qa = (kk / 4) * BM * 128 + (kk % 4) * 32;
          Wgmma<Elem, BM>::ss(dp, desc_advance(dv_mine, ka), desc_advance(ddo_desc, qa), kk > 0);
        }
        wgmma_commit();
        if (cw == 0) named_barrier_arrive(14, 256);
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) {
          fence_operand(st[i]);
          fence_operand(dp[i]);
        }

        // Pᵀ and dSᵀ element by element: key row kr0 + 8·(e / 2), query column 8j + 2·t4 + e % 2.
        const float* lse = kDqT ? reinterpret_cast<const float*>(gptr(sStat(s))) : stats + (t & 1) * 2 * BM;
        const float* dsum = lse + BM;
        const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
        const int kn0 = n0 + cw * 64;
        const bool full_tile = m0 + BM <= len_q && kn0 + 64 <= len_k && (wl < 0 || kn0 >= m0 + BM - 1 + off - wl) &&
                               (wr < 0 || kn0 + 63 <= m0 + off + wr);
        auto scores = [&](auto modified_c, auto edge_c) {
          constexpr bool kModified = decltype(modified_c)::value, kEdge = decltype(edge_c)::value;
#pragma unroll
          for (int j = 0; j < BM / 8; ++j) {
            const float2 l2 = *reinterpret_cast<const float2*>(lse + 8 * j + 2 * t4);
            const float2 d2 = *reinterpret_cast<const float2*>(dsum + 8 * j + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = 8 * j + 2 * t4 + (e & 1);
              const int i = m0 + col, jk = n0 + kr0 + (e >> 1) * 8;
              const float lv = (e & 1) ? l2.y : l2.x, dv_ = (e & 1) ? d2.y : d2.x;
              float pv, dtanh = 1.f;
              if constexpr (!kModified) {
                pv = fast_exp2(st[4 * j + e] * scale_log2 - lv);
              } else {
                float x = st[4 * j + e] * scale;
                if (cap > 0.f) {
                  const float th = tanhf(x / cap);
                  x = cap * th;
                  dtanh = 1.f - th * th;
                }
                x -= slope * fabsf(static_cast<float>(i + off - jk));
                pv = fast_exp2(x * kLog2e - lv);
              }
              float ds = pv * (dp[4 * j + e] - dv_) * dtanh;
              if constexpr (kEdge) {
                const bool vis = (i < len_q) & (jk < len_k) & ((wl < 0) | (jk >= i + off - wl)) &
                                 ((wr < 0) | (jk <= i + off + wr));
                pv = vis ? pv : 0.f;
                ds = vis ? ds : 0.f;
              }
              st[4 * j + e] = pv;
              dp[4 * j + e] = ds;
            }
          }
        };
        // (BwdSm90Bm80Config runs only without softcap and ALiBi, run_bwd_sm80: their element-wise
        // code next to 80-query Sᵀ and dPᵀ spilled.)
        if constexpr (kDqT) {
          if (full_tile) scores(std::false_type{}, std::false_type{});
          else scores(std::false_type{}, std::true_type{});
        } else if (modified) {
          if (full_tile) scores(std::true_type{}, std::false_type{});
          else scores(std::true_type{}, std::true_type{});
        } else {
          if (full_tile) scores(std::false_type{}, std::false_type{});
          else scores(std::false_type{}, std::true_type{});
        }

        // Pᵀ and dSᵀ as A operands (k-step kk = queries 16kk .. 16kk+15), and dSᵀ into shared
        // memory for the dQ product.
        uint32_t pf[BM / 16][4], dsf[BM / 16][4];
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            pf[kk][r] = pack2<Elem>(st[8 * kk + 2 * r], st[8 * kk + 2 * r + 1]);
            dsf[kk][r] = pack2<Elem>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
          }
        // dSᵀ [keys][queries] in 64-query panels of 128-byte rows (the Q tile's swizzle), by
        // stmatrix: dsf[kk] holds the fragments of the 8 x 8 blocks (key rows +0 / +8, queries
        // 16kk + 0..7 / 8..15) in the order stmatrix takes them, so lane l gives the 16-byte row
        // (key warp·16 + l % 8 + 8·(l / 8 % 2), query chunk 2kk + l / 16).
        const uint32_t sDS = sDS0 + (t % Cfg::kDsBuffers) * Cfg::kDsBytes;
        if constexpr (kDqT) {
          // dS [queries][keys] in two 64-key panels of BM 128-byte rows (the K-major B of dQᵀ):
          // stmatrix .trans writes each 8 x 8 block as 8 query rows of 8 keys; lane l gives the
          // row (query 16kk + l % 8 + 8·(l / 16), key chunk of key row cw·64 + warp·16 + 8·(l / 8 % 2)).
          const int ds_chunk = cw * 8 + warp * 2 + ((lane >> 3) & 1);
#pragma unroll
          for (int kk = 0; kk < BM / 16; ++kk)
            stmatrix_x4_trans(sDS + swizzled_chunk<BM>(16 * kk + (lane & 7) + ((lane >> 4) << 3), ds_chunk),
                              dsf[kk][0], dsf[kk][1], dsf[kk][2], dsf[kk][3]);
        } else {
          const int ds_row = cw * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
          for (int kk = 0; kk < BM / 16; ++kk)
            stmatrix_x4(sDS + swizzled_chunk<BN>(ds_row, 2 * kk + (lane >> 4)), dsf[kk][0], dsf[kk][1], dsf[kk][2],
                        dsf[kk][3]);
        }
        fence_proxy_async();

        // dV += Pᵀ dO and dK += dSᵀ Q: B = dO / Q read MN-major (16 query rows per k-step).
        const uint64_t do_mn = make_desc(sDO(s), BM * 128, 1024), q_mn = make_desc(sQ(s), BM * 128, 1024);
        // dV first, dK after dQ, so that dQ's staging runs under dK's product (session 16: -2.7 %
        // kernel time at head_dim 128).
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
          Wgmma<Elem, D>::rs(dv, pf[kk], desc_advance(do_mn, kk * 16 * 128), t > 0 || kk > 0);
        wgmma_commit();

        if constexpr (!kDqT)
          if (t + 1 < iters) store_stats(t + 1, next_stat);

        // dQ = dS K over all 128 keys for one 64 x 64 tile per warpgroup (head_dim 128: columns
        // cw·64.., head_dim 64: queries cw·64..): A = dSᵀ read MN-major, B = K MN-major. The tile
        // leaves as bulk reduce-adds (FA-3's dQ path) from this consumer's staging buffer, in the
        // accumulator's own tiled layout (bwd_traits.hpp dq_accum_offset; dq_accum_block80_offset at
        // BM = 80), one reduce per warp for its own rows (contiguous in both layouts), issued once
        // the warp has staged them: no barrier of the warpgroup on the step's path. A warp's rows
        // are free once its previous reduce has read them: its lane 0 waits for that before the
        // barrier that also publishes both consumers' dSᵀ.
        if (lane == 0) bulk_wait_read<0>();
        named_barrier_sync(1, 256);
        if (cw == 1) named_barrier_sync(15, 256);  // dQ in the same order as Sᵀ / dPᵀ (barrier 14)
        const int col0 = kDqSplitN ? cw * 64 : 0;
        float dq[kDqRegs];
        const uint64_t k_mn = make_desc(kDqSplitN ? sK + cw * BN * 128 : sK, BN * 128, 1024);
        wgmma_fence();
        if constexpr (kDqT) {
          // dQᵀ (64 columns x BM queries) = Kᵀ (A: this consumer's K panel, MN-major) dSᵀ (B: dS,
          // K-major, 16 keys per k-step: 32 bytes within a panel, the next panel after 4).
          const uint64_t ds_desc = make_desc(sDS, 16, 1024);
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            Wgmma<Elem, BM>::ts(dq, desc_advance(k_mn, kk * 16 * 128),
                                desc_advance(ds_desc, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
        } else {
          const uint64_t ds_desc = make_desc(kDqSplitN ? sDS : sDS + cw * BN * 128, 1024, 1024);
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            Wgmma<Elem, 64>::tt(dq, desc_advance(ds_desc, kk * 16 * 128), desc_advance(k_mn, kk * 16 * 128), kk > 0);
        }
        wgmma_commit();
        if (cw == 0) named_barrier_arrive(15, 256);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
          Wgmma<Elem, D>::rs(dk, dsf[kk], desc_advance(q_mn, kk * 16 * 128), t > 0 || kk > 0);
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ done (dK still runs)
#pragma unroll
        for (int i = 0; i < D / 2; ++i) fence_operand(dv[i]);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) fence_operand(pf[kk][r]);
#pragma unroll
        for (int i = 0; i < kDqRegs; ++i) fence_operand(dq[i]);

        const uint32_t sDQ = sDQ0 + cw * Cfg::kDqBytes;
        if constexpr (kDqT) {
          // dQᵀ rows: column warp·16 + g + 8hr of this consumer's 64; columns: queries 8j + 2·t4
          // (+1). Each warp's 16 columns are one block of the accumulator (BwdParams), staged as such.
#pragma unroll
          for (int j = 0; j < BM / 8; ++j)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
              *reinterpret_cast<float2*>(gptr(sDQ) + 4 * (warp * 16 * BM + j * 128 + (g + 8 * hr) * 8 + 2 * t4)) =
                  make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
        } else {
          // dQ rows: query warp*16 + g + 8hr of the tile; columns col0 + 8j + 2·t4 (+1).
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const int r = warp * 16 + g + hr * 8;
              *reinterpret_cast<float2*>(gptr(sDQ) + 4 * (r * 64 + ((j ^ (r & 7)) << 3) + 2 * t4)) =
                  make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
            }
        }
        fence_proxy_async();
        wgmma_wait<0>();  // dK done: Q(s) is free (dO(s) since dV completed)
#pragma unroll
        for (int i = 0; i < D / 2; ++i) fence_operand(dk[i]);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 4; ++r) fence_operand(dsf[kk][r]);
        __syncwarp();  // the warp's staging writes (each lane fenced them for the async proxy)
        if constexpr (kDqT) mbar_arrive(empty(s));
        if (lane == 0) {
          if constexpr (!kDqT) mbar_arrive(empty(s));
          // Rows past the sequence end hold exact zeros (their dS columns are 0); the
          // statistics rows are padded, so the whole tile lies inside the accumulator.
          // (kDqT: the warp's block of 80 rows x 16 columns.)
          float* dst = p.dq_accum + (int64_t(b) * p.num_heads + h) * p.stat_rows * dq_accum_row_floats(p) +
                       (kDqT ? dq_accum_block80_offset(D, m0, col0 + 16 * warp)
                             : dq_accum_offset(p, m0 + (kDqSplitN ? 0 : 64 * cw), col0) +
                                   warp * (Cfg::kDqBytes / 16));
          bulk_reduce_add_f32(dst, sDQ + warp * (Cfg::kDqBytes / 4), Cfg::kDqBytes / 4);
          bulk_commit();
        }
        if (++s == S) {
          s = 0;
          phase ^= 1;
        }
        step = next;
      }
    }

    if (count == 0) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
    }
    // A split block's part (BwdParams::split_first): the parts' dK and dV (fp32, unscaled) are
    // summed in the warp's slot of split_ws in the order in which the parts end, per warp, so that
    // no barrier spans blocks (its 16 key rows and each lane's fragment of them are the same in
    // every part). The warp's ticket says its turn: the first stores its sums into the slot; each
    // later one waits for its predecessor's flag and adds its own into the slot (reductions at L2);
    // all but the last then release the next flag and leave the rows to the last, which loads the
    // slot back as its dK and dV. Only parts past their last step hold tickets, so a part waits for
    // stores already under way, never for a part yet to run. Each lane's D / 2 + D / 2 floats go as
    // float4 columns of the slot, lane-fastest. (The last part adding the slot to its registers
    // instead held the loads beside dK and dV: ptxas spilled 96-240 bytes.) The tickets and flags
    // were zeroed by this backward's preprocess.
    bool write_rows = true;
    int split, part;
    bwd_split_item(p, split, part);
    if (part >= 0) {
      constexpr int kVec = D / 4;  // float4 per lane: dK's D / 8, then dV's
      const int slot = (split * 2 + cw) * 4 + warp;
      int* const sync = p.split_sync + 4 * slot;  // ticket, then the flag of each later turn
      float4* const ws = reinterpret_cast<float4*>(p.split_ws) + int64_t(slot) * kVec * 32 + lane;
      int ticket = 0;
      if (lane == 0) ticket = atomicAdd(sync, 1);
      ticket = __shfl_sync(0xffffffffu, ticket, 0);
      if (ticket > 0)
        while (ld_acquire_gpu(sync + ticket) == 0) {
        }
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        const float4 k4 = make_float4(dk[4 * c], dk[4 * c + 1], dk[4 * c + 2], dk[4 * c + 3]);
        const float4 v4 = make_float4(dv[4 * c], dv[4 * c + 1], dv[4 * c + 2], dv[4 * c + 3]);
        if (ticket == 0) {
          __stcg(ws + 32 * c, k4);
          __stcg(ws + 32 * (D / 8 + c), v4);
        } else {
          atomicAdd(ws + 32 * c, k4);
          atomicAdd(ws + 32 * (D / 8 + c), v4);
        }
      }
      if (ticket < kBwdSplitParts - 1) {
        __threadfence();  // each lane's stores, then the flag (the CUDA guide's last-block pattern)
        __syncwarp();
        if (lane == 0) st_release_gpu(sync + 1 + ticket, 1);
        write_rows = false;
      } else {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const float4 k4 = __ldcg(ws + 32 * c), v4 = __ldcg(ws + 32 * (D / 8 + c));
          dk[4 * c] = k4.x;
          dk[4 * c + 1] = k4.y;
          dk[4 * c + 2] = k4.z;
          dk[4 * c + 3] = k4.w;
          dv[4 * c] = v4.x;
          dv[4 * c + 1] = v4.y;
          dv[4 * c + 2] = v4.z;
          dv[4 * c + 3] = v4.w;
        }
      }
    }
    // Which warps' rows this consumer writes (all but a split block's parts that left theirs).
    __shared__ int warp_writes[8];
    if (lane == 0) warp_writes[cw * 4 + warp] = write_rows;
    // Epilogue: dK = scale · dK and dV through shared memory, so that the global stores are whole
    // 16-byte chunks of a row (stores straight from the accumulators wrote 4 bytes per lane and
    // half of every 32-byte sector: ncu, perf-notes). Each consumer stages its 64 key rows in its
    // own rows of sK / sV (same 128-byte swizzle as the TMA tiles), which no product reads any
    // more once both consumers are past their last dQ (at head_dim 128, dQ reads all 128 keys).
    named_barrier_sync(1, 256);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = kr0 + hr * 8;
        const uint32_t off = swizzled_chunk<BN>(row, j) + 4 * t4;
        *reinterpret_cast<uint32_t*>(gptr(sK + off)) = pack2<Elem>(dk[4 * j + 2 * hr] * scale, dk[4 * j + 2 * hr + 1] * scale);
        *reinterpret_cast<uint32_t*>(gptr(sV + off)) = pack2<Elem>(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]);
      }
    named_barrier_sync(2 + cw, 128);
    const int writers = warp_writes[cw * 4] | warp_writes[cw * 4 + 1] << 1 | warp_writes[cw * 4 + 2] << 2 |
                        warp_writes[cw * 4 + 3] << 3;
    Storage* dk_ptr = static_cast<Storage*>(p.dk) + b * p.dk_batch_stride + (k_start + n0) * p.dk_row_stride +
                      hk * p.dk_head_stride;
    Storage* dv_ptr = static_cast<Storage*>(p.dv) + b * p.dv_batch_stride + (k_start + n0) * p.dv_row_stride +
                      hk * p.dv_head_stride;
    // Rows past the sequence end and columns past head_dim (head_dim_v) are not written.
    for (int i = tid; i < 64 * (D / 8); i += 128) {
      const int row = cw * 64 + i / (D / 8), c8 = i % (D / 8);
      if (row >= len_k - n0) break;  // i grows with the row
      if (!((writers >> (row % 64 / 16)) & 1)) continue;
      // swizzled_chunk<BN>(row, c8) in / and %: c8 is not known to be >= 0 here, and the helper's
      // shifts compile to different SASS than the version of this loop that ran on the H200.
      const uint32_t off = (c8 / 8) * BN * 128 + row * 128 + ((((c8 % 8) ^ row) & 7) << 4);
      if (c8 * 8 < p.head_dim)
        *reinterpret_cast<uint4*>(dk_ptr + row * p.dk_row_stride + c8 * 8) = *reinterpret_cast<const uint4*>(gptr(sK + off));
      if (c8 * 8 < p.head_dim_v)
        *reinterpret_cast<uint4*>(dv_ptr + row * p.dv_row_stride + c8 * 8) = *reinterpret_cast<const uint4*>(gptr(sV + off));
    }
    // The last bulk reduces (their sDQ rows only; the epilogue stages in sK / sV) must finish
    // reading shared memory before the block exits: waited for here by the lanes that issued them,
    // after the stores, rather than before the epilogue, so that their latency hides under them.
    if (lane == 0) bulk_wait_read<0>();
  }
#endif
}

template <typename Elem, int kHeadDim>
void launch_bwd_sm90(const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream) {
  if constexpr (kHeadDim == 128) {
    if (p.dq_accum_tile_rows == BwdSm90Bm80Config::kBlockM) {
      // The 80-row kernel compiles no softcap or ALiBi and writes 128-column blocks: a call
      // outside that is a dispatch error, reported rather than computed wrong.
      if (p.softcap > 0.f || p.alibi_slopes != nullptr || p.dq_accum_cols != kHeadDim)
        throw Error("cuda backward: expected the 80-row Hopper kernel only without softcap or ALiBi "
                    "and with a 128-column dq accumulator (an internal dispatch error)");
      launch_bwd_sm90_kernel<Elem, BwdSm90Bm80Config>(bwd_sm90_kernel<Elem, BwdSm90Bm80Config>, p, rows_q, rows_k,
                                                      stream, p.pdl);
      return;
    }
  }
  using Cfg = BwdSm90Config<kHeadDim>;
  launch_bwd_sm90_kernel<Elem, Cfg>(bwd_sm90_kernel<Elem, Cfg>, p, rows_q, rows_k, stream, p.pdl);
}

}  // namespace flashattn::cuda

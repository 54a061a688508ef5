// FlashAttention backward on Hopper (sm_90a) for head_dim bucket 256: TMA, mbarriers, wgmma and
// warp specialization (FlashAttention-3, Shah et al. 2024, Sec. 3 and Appendix B.1), the math of
// FA-2's Alg. 2 as in bwd_sm90_tma_wgmma.cuh, with the work of a step split by columns.
//
// Why a second kernel: at head_dim 256 a consumer that owns 64 keys of dK and dV needs 256
// accumulator registers for them alone. Here each of the two consumers owns some of the 64-column
// panels of dK and dV (BwdSm90SplitConfig: half of them at 256, 1 + 1 and 2 + 1 of MLA's 192 /
// 128) for all 64 keys of the block, so both need Pᵀ and dSᵀ of every key, and they pass them
// through shared memory.
//
// One block per (key tile of block_n = 64 keys, KV head, batch), three warpgroups:
//   - the producer (warpgroup 0) loads K and V once, then Q and dO of each step (64 query rows of
//     one head of the GQA group, block_m = 64) into kStages TMA buffers, and adds each step's dQ
//     into the fp32 accumulator by bulk reduce-adds once both consumers have staged it;
//   - consumer 0 computes Sᵀ = K Qᵀ and Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) (mask, softcap and
//     ALiBi as in the other kernels) and hands Pᵀ (and 1 − tanh² under softcap) to consumer 1;
//     consumer 1 computes dPᵀ = V dOᵀ meanwhile, then dSᵀ = Pᵀ ∘ (dPᵀ − D) and hands it back;
//   - then each consumer c, for its panels:
//       dV_c += Pᵀ dO_c,  dK_c += dSᵀ Q_c        wgmma, A (Pᵀ / dSᵀ) and B from shared memory
//       dQ_c = dS K_c                            A = dSᵀ read MN-major, B = K MN-major
//     and stages dQ_c, at head_dim 256 in its own half of the step's Q and dO buffers (no other
//     product reads them any more), else in a buffer of its own; the producer's reduce-adds take
//     it from there.
//   dK = scale · dK at the end (dq is scaled by the shared postprocess).
// Per step at head_dim 256: 2 products of 64·64·256 and 3 per consumer of 64·128·64: 10.5 MFLOP,
// as one step of the head_dim 128 kernel; the exchange costs the two consumers' element-wise
// phases their overlap (consumer 1 waits for Pᵀ).
//
// Rows past a sequence's end: TMA zero-fills rows outside a tensor, but varlen tiles that cross a
// sequence end hold the next sequence's rows; they are zeroed in shared memory before any product
// (0 · inf = NaN), and masked elements get P = 0, hence dS = 0.
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
    bwd_sm90_dsplit_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ CUtensorMap tmap_q,
                           const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                           const __grid_constant__ CUtensorMap tmap_do) {
#ifdef FLASHATTN_SM90_ENABLED
  using namespace sm90;
  using Storage = typename Elem::Storage;
  constexpr int D = Cfg::kHeadDim, DV = Cfg::kHeadDimV, BN = Cfg::kBlockN, BM = Cfg::kBlockM, S = Cfg::kStages;
  constexpr int kQPanels = Cfg::kQPanelsAll, kVPanels = Cfg::kVPanelsAll;
  constexpr int kDqTileBytes = Cfg::kDqTileBytes;
  constexpr bool kDqInStage = Cfg::kDqInStage;
  static_assert(BN == 64 && BM == 64, "one 64 x 64 Pᵀ / dSᵀ tile per step, wgmma's M on both sides");
  static_assert(!kDqInStage || (2 * Cfg::kQPanels0 == kQPanels && kVPanels == kQPanels &&
                                Cfg::kVPanels0 == Cfg::kQPanels0 && Cfg::kQPanels0 % 2 == 0),
                "dQ staging in the Q and dO halves: symmetric ownership, whole dQ tiles in each half");
  // Consumer c's 64-column panels: Q, K, dK and dQ panels [q_lo(c), q_lo(c) + q_panels(c)), V, dO
  // and dV panels likewise (BwdSm90SplitConfig).
  constexpr auto q_lo = [](int c) { return c == 0 ? 0 : Cfg::kQPanels0; };
  constexpr auto q_panels = [](int c) { return c == 0 ? Cfg::kQPanels0 : kQPanels - Cfg::kQPanels0; };
  constexpr auto v_lo = [](int c) { return c == 0 ? 0 : Cfg::kVPanels0; };
  constexpr auto v_panels = [](int c) { return c == 0 ? Cfg::kVPanels0 : kVPanels - Cfg::kVPanels0; };

  const BwdSm90Block<BN, BM> blk = bwd_sm90_block<BN, BM>(p);
  if (blk.n0 >= blk.len_k) return;
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
  const uint32_t sK = base, sV = sK + Cfg::kKBytes;
  const uint32_t sQ0 = sV + Cfg::kVBytes, sDO0 = sQ0 + S * Cfg::kQBytes;
  const uint32_t sP0 = sDO0 + S * Cfg::kDoBytes;    // Pᵀ [keys][queries], two buffers (see the step)
  const uint32_t sDS = sP0 + 2 * Cfg::kTileBytes;  // dSᵀ [keys][queries]
  const uint32_t sT = sDS + Cfg::kTileBytes;       // 1 − tanh² [keys][queries] (softcap)
  const uint32_t sStat = sT + Cfg::kTileBytes;     // [consumer][buffer][query]: lse·log2e, D
  const uint32_t sDQ = sStat + Cfg::kStatBytes;    // the dQ buffer (not kDqInStage): one tile per Q panel
  const uint32_t bars = sDQ + Cfg::kDqBytes;
  auto sQ = [&](int s) { return sQ0 + s * Cfg::kQBytes; };
  auto sDO = [&](int s) { return sDO0 + s * Cfg::kDoBytes; };
  // Consumer c's dQ tile jt (of its Q panel q_lo(c) + jt) for stage s: kDqInStage, its own columns'
  // half of the stage's Q buffer, then of dO's; else the dQ buffer's tile of that panel.
  auto dq_tile = [&](int s, int c, int jt) {
    if constexpr (kDqInStage) {
      constexpr int kTilesPerHalf = Cfg::kQPanels0 * BM * 128 / kDqTileBytes;
      const uint32_t half = c * Cfg::kQPanels0 * BM * 128;
      return (jt < kTilesPerHalf ? sQ(s) : sDO(s)) + half + (jt % kTilesPerHalf) * kDqTileBytes;
    } else {
      return sDQ + (q_lo(c) + jt) * kDqTileBytes;
    }
  };
  const uint32_t kv_full = bars;
  auto full = [&](int s) { return bars + 8 * (1 + s); };
  auto dq_ready = [&](int s) { return bars + 8 * (1 + S + s); };
  const uint32_t dq_free = bars + 8 * (1 + 2 * S);  // the dQ buffer read by step t's reduce-adds
  auto gptr = [&](uint32_t a) { return smem + (a - base); };

  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(full(s), 1);
      mbar_init(dq_ready(s), 2);  // one arrival per consumer, after its dQ is staged
    }
    mbar_init(dq_free, 1);
    fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- producer warpgroup
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0 && count > 0) {
      prefetch_tensormap(&tmap_q);
      prefetch_tensormap(&tmap_do);
      mbar_arrive_expect_tx(kv_full, Cfg::kKBytes + Cfg::kVBytes);
      tma_load_tile<kQPanels, BN>(sK, &tmap_k, kv_full, int(k_start) + n0, hk, tma_batch);
      tma_load_tile<kVPanels, BN>(sV, &tmap_v, kv_full, int(k_start) + n0, hk, tma_batch);
      auto load = [&](int s, BwdStep step) {
        const int h = blk.head_of(step), m0 = blk.m0_of(step);
        mbar_arrive_expect_tx(full(s), Cfg::kQBytes + Cfg::kDoBytes);
        tma_load_tile<kQPanels, BM>(sQ(s), &tmap_q, full(s), int(q_start) + m0, h, tma_batch);
        tma_load_tile<kVPanels, BM>(sDO(s), &tmap_do, full(s), int(q_start) + m0, h, tma_batch);
      };
      BwdStep ld;
      for (int t = 0; t < S && t < iters; ++t, ld = blk.next(ld)) load(t, ld);
      int s = 0;
      uint32_t phase = 0;
      BwdStep step;
      for (int t = 0; t < iters; ++t) {
        // Step t's dQ, staged by both consumers: add it into the accumulator. Stage s is free for
        // step t + S once both consumers arrived (their products are done), or, where the dQ was
        // staged in it, once the reduce-adds have read it.
        mbar_wait(dq_ready(s), phase);
        if constexpr (!kDqInStage) {
          if (t + S < iters) {
            load(s, ld);
            ld = blk.next(ld);
          }
        }
        const int h = blk.head_of(step), m0 = blk.m0_of(step);
        float* const acc = p.dq_accum + (int64_t(b) * p.num_heads + h) * p.stat_rows * dq_accum_row_floats(p);
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int jt = 0; jt < q_panels(c); ++jt)
            bulk_reduce_add_f32(acc + dq_accum_offset(p, m0, 64 * (q_lo(c) + jt)), dq_tile(s, c, jt), kDqTileBytes);
        bulk_commit();
        bulk_wait_read<0>();
        if constexpr (kDqInStage) {
          if (t + S < iters) {
            load(s, ld);
            ld = blk.next(ld);
          }
        } else {
          mbar_arrive(dq_free);
        }
        step = blk.next(step);
        if (++s == S) {
          s = 0;
          phase ^= 1;
        }
      }
    }
  } else {
    // ---------------------------------------------------------------- consumer warpgroups
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int ctid = threadIdx.x - 128;
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int kr0 = warp * 16 + g;  // this thread's key rows of Sᵀ / dPᵀ, dK and dV: kr0 and kr0 + 8
    // The row this lane addresses in stmatrix / ldmatrix of a [keys][queries] tile (see below).
    const int x_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const float scale = p.softmax_scale, scale_log2 = scale * kLog2e, cap = p.softcap;
    const bool modified = cap > 0.f || p.alibi_slopes != nullptr;

    // The two consumers' code, each with its own columns' shapes (compile-time CW).
    auto consumer = [&](auto cw_c) {
      constexpr int CW = decltype(cw_c)::value;  // 0: Sᵀ / Pᵀ, 1: dPᵀ / dSᵀ
      constexpr int kQLo = q_lo(CW), kVLo = v_lo(CW);
      constexpr int NQ = 64 * q_panels(CW), NV = 64 * v_panels(CW);  // this consumer's dK / dQ, dV columns
      float dk[NQ / 2], dv[NV / 2];

      if (count > 0) {
        // Each consumer's statistic (lse·log2e for consumer 0, D for consumer 1) of the step's 64
        // queries, loaded one step ahead by threads 0..63 into a double buffer. Consumer 0 reads
        // buffer t & 1 before its arrival on barrier 2 and writes buffer (t + 1) & 1 between that and
        // its wait on barrier 3; consumer 1 reads after its wait on barrier 2 and writes after its
        // arrival on barrier 3. Those barriers order every write between the reads it must follow
        // and the reads it must precede. Rows are padded to stat_rows: no bounds.
        float* const stats = reinterpret_cast<float*>(gptr(sStat)) + CW * 2 * BM;
        const float* const stat_src = CW == 0 ? p.lse_log2 : p.dsum;
        auto load_stat = [&](int t, BwdStep step) {
          return t < iters && tid < BM
                     ? stat_src[(int64_t(b) * p.num_heads + blk.head_of(step)) * p.stat_rows + blk.m0_of(step) + tid]
                     : 0.f;
        };
        float next_stat = load_stat(0, BwdStep{});
        mbar_wait(kv_full, 0);
        if (varlen && len_k - n0 < BN) {
          zero_tile_rows<kQPanels>(gptr(sK), BN, len_k - n0, ctid);
          zero_tile_rows<kVPanels>(gptr(sV), BN, len_k - n0, ctid);
          fence_proxy_async();
          // (Not bar.sync: it is .aligned, and each consumer reaches this barrier from its own
          // copy of the code.)
          named_barrier_sync_unaligned(1, 256);
        }
        if (tid < BM) stats[tid] = next_stat;
        named_barrier_sync(4 + CW, 128);

        // A of this consumer's first product: K (Sᵀ) or V (dPᵀ), K-major, all 64 keys.
        const uint64_t a_desc = make_desc(CW == 0 ? sK : sV, 16, 1024);
        // This consumer's panels of K (B of dQ), Q (B of dK) and dO (B of dV).
        const uint64_t k_mn = make_desc(sK + kQLo * BN * 128, BN * 128, 1024);
        const uint64_t ds_k = make_desc(sDS, 16, 1024);     // dSᵀ as A, K-major (K = queries)
        const uint64_t ds_mn = make_desc(sDS, 1024, 1024);  // dS as A, MN-major (M = queries, K = keys)
        int s = 0;
        uint32_t phase = 0;
        BwdStep step;
        for (int t = 0; t < iters; ++t) {
          const int h = blk.head_of(step), m0 = blk.m0_of(step);
          const BwdStep next = blk.next(step);
          next_stat = load_stat(t + 1, next);
          mbar_wait(full(s), phase);
          if (varlen && len_q - m0 < BM) {
            zero_tile_rows<kQPanels>(gptr(sQ(s)), BM, len_q - m0, ctid);
            zero_tile_rows<kVPanels>(gptr(sDO(s)), BM, len_q - m0, ctid);
            fence_proxy_async();
            named_barrier_sync_unaligned(1, 256);
          }

          // Sᵀ = K Qᵀ (consumer 0, K = head_dim) or dPᵀ = V dOᵀ (consumer 1, K = head_dim_v):
          // M = 64 keys, N = 64 queries.
          float acc[BM / 2];
          const uint64_t b_desc = make_desc(CW == 0 ? sQ(s) : sDO(s), 16, 1024);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < (CW == 0 ? D : DV) / 16; ++kk) {
            const uint32_t ka = (kk / 4) * BN * 128 + (kk % 4) * 32;
            const uint32_t qa = (kk / 4) * BM * 128 + (kk % 4) * 32;
            Wgmma<Elem, BM>::ss(acc, desc_advance(a_desc, ka), desc_advance(b_desc, qa), kk > 0);
          }
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < BM / 2; ++i) fence_operand(acc[i]);

          // Element (key row kr0 + 8·(e / 2), query column 8j + 2·t4 + e % 2) is acc[4j + e]. As
          // 16-bit pairs, x[kk][r] holds elements 8kk + 2r and + 1: the fragments of the four 8 x 8
          // blocks (key rows +0 / +8, queries 16kk + 0..7 / 8..15) in the order stmatrix / ldmatrix
          // .x4 take them when lane l addresses row x_row of query chunk 2kk + l / 16 (the 128-byte
          // swizzle of the TMA tiles, one 64-query panel).
          const float* const stat = stats + (t & 1) * BM;
          const uint32_t sP = sP0 + (t & 1) * Cfg::kTileBytes;
          if constexpr (CW == 0) {
            const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
            const bool full_tile = m0 + BM <= len_q && n0 + BN <= len_k && (wl < 0 || n0 >= m0 + BM - 1 + off - wl) &&
                                   (wr < 0 || n0 + BN - 1 <= m0 + off + wr);
            // Pᵀ in place of Sᵀ; under softcap also 1 − tanh² into sT (pairs, as consumer 1 reads them).
            auto scores = [&](auto modified_c, auto edge_c) {
              constexpr bool kModified = decltype(modified_c)::value, kEdge = decltype(edge_c)::value;
#pragma unroll
              for (int j = 0; j < BM / 8; ++j) {
                const float2 l2 = *reinterpret_cast<const float2*>(stat + 8 * j + 2 * t4);
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                  float dt[2] = {1.f, 1.f};
#pragma unroll
                  for (int e1 = 0; e1 < 2; ++e1) {
                    const int e = 2 * hr + e1;
                    const int i = m0 + 8 * j + 2 * t4 + e1, jk = n0 + kr0 + 8 * hr;
                    const float lv = e1 ? l2.y : l2.x;
                    float pv;
                    if constexpr (!kModified) {
                      pv = fast_exp2(acc[4 * j + e] * scale_log2 - lv);
                    } else {
                      float x = acc[4 * j + e] * scale;
                      if (cap > 0.f) {
                        const float th = tanhf(x / cap);
                        x = cap * th;
                        dt[e1] = 1.f - th * th;
                      }
                      x -= slope * fabsf(static_cast<float>(i + off - jk));
                      pv = fast_exp2(x * kLog2e - lv);
                    }
                    if constexpr (kEdge) {
                      const bool vis = (i < len_q) & (jk < len_k) & ((wl < 0) | (jk >= i + off - wl)) &
                                       ((wr < 0) | (jk <= i + off + wr));
                      pv = vis ? pv : 0.f;
                    }
                    acc[4 * j + e] = pv;
                  }
                  if constexpr (kModified) {
                    if (cap > 0.f)
                      *reinterpret_cast<uint32_t*>(gptr(sT + swizzled_chunk<BN>(kr0 + 8 * hr, j)) + 4 * t4) =
                          pack2<Elem>(dt[0], dt[1]);
                  }
                }
              }
            };
            if (modified) {
              if (full_tile) scores(std::true_type{}, std::false_type{});
              else scores(std::true_type{}, std::true_type{});
            } else {
              if (full_tile) scores(std::false_type{}, std::false_type{});
              else scores(std::false_type{}, std::true_type{});
            }
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
              stmatrix_x4(sP + swizzled_chunk<BN>(x_row, 2 * kk + (lane >> 4)), pack2<Elem>(acc[8 * kk], acc[8 * kk + 1]),
                          pack2<Elem>(acc[8 * kk + 2], acc[8 * kk + 3]), pack2<Elem>(acc[8 * kk + 4], acc[8 * kk + 5]),
                          pack2<Elem>(acc[8 * kk + 6], acc[8 * kk + 7]));
            fence_proxy_async();  // Pᵀ is read by the dV products (async proxy) of both consumers
            named_barrier_arrive(2, 256);
            if (t + 1 < iters && tid < BM) stats[((t + 1) & 1) * BM + tid] = next_stat;
            named_barrier_sync(3, 256);
          } else {
            named_barrier_sync(2, 256);
            uint32_t pf[BM / 16][4], tf[BM / 16][4];
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk) {
              const uint32_t at = swizzled_chunk<BN>(x_row, 2 * kk + (lane >> 4));
              ldmatrix_x4(pf[kk], sP + at);
              if (cap > 0.f) ldmatrix_x4(tf[kk], sT + at);
            }
            uint32_t dsf[BM / 16][4];
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                // Elements 8kk + 2r (+1): n8 tile j = 2kk + r / 2, key row +8 when r is odd.
                const float2 pv = unpack2<Elem>(pf[kk][r]);
                const float2 d2 = *reinterpret_cast<const float2*>(stat + 8 * (2 * kk + r / 2) + 2 * t4);
                float ds0 = pv.x * (acc[8 * kk + 2 * r] - d2.x), ds1 = pv.y * (acc[8 * kk + 2 * r + 1] - d2.y);
                if (cap > 0.f) {
                  const float2 dt = unpack2<Elem>(tf[kk][r]);
                  ds0 *= dt.x;
                  ds1 *= dt.y;
                }
                dsf[kk][r] = pack2<Elem>(ds0, ds1);
              }
#pragma unroll
            for (int kk = 0; kk < BM / 16; ++kk)
              stmatrix_x4(sDS + swizzled_chunk<BN>(x_row, 2 * kk + (lane >> 4)), dsf[kk][0], dsf[kk][1], dsf[kk][2],
                          dsf[kk][3]);
            fence_proxy_async();  // dSᵀ is read by the dK and dQ products of both consumers
            named_barrier_arrive(3, 256);
            if (t + 1 < iters && tid < BM) stats[((t + 1) & 1) * BM + tid] = next_stat;
            // This consumer's dQ product reads (MN-major) the dSᵀ rows of all four of its warps: each
            // waits until the others' are stored. (Not a wait on barrier 3 next to consumer 0's:
            // bar.sync is .aligned, one instruction for all of a barrier's waiting threads, and
            // compute-sanitizer's synccheck reports two of them as divergent.)
            named_barrier_sync(5, 128);
          }

          // dV_c += Pᵀ dO_c and dK_c += dSᵀ Q_c (M = 64 keys, N = this consumer's columns, K = 64
          // queries: 16 query rows per k-step), dQ_c = dS K_c (M = 64 queries, K = 64 keys).
          const uint64_t p_k = make_desc(sP, 16, 1024);
          const uint64_t do_mn = make_desc(sDO(s) + kVLo * BM * 128, BM * 128, 1024);
          const uint64_t q_mn = make_desc(sQ(s) + kQLo * BM * 128, BM * 128, 1024);
          float dq[NQ / 2];
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < BM / 16; ++kk)
            Wgmma<Elem, NV>::st(dv, desc_advance(p_k, kk * 32), desc_advance(do_mn, kk * 16 * 128), t > 0 || kk > 0);
#pragma unroll
          for (int kk = 0; kk < BM / 16; ++kk)
            Wgmma<Elem, NQ>::st(dk, desc_advance(ds_k, kk * 32), desc_advance(q_mn, kk * 16 * 128), t > 0 || kk > 0);
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            Wgmma<Elem, NQ>::tt(dq, desc_advance(ds_mn, kk * 16 * 128), desc_advance(k_mn, kk * 16 * 128), kk > 0);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < NQ / 2; ++i) {
            fence_operand(dk[i]);
            fence_operand(dq[i]);
          }
#pragma unroll
          for (int i = 0; i < NV / 2; ++i) fence_operand(dv[i]);

          // The dQ buffer is free once the previous step's reduce-adds have read it.
          if constexpr (!kDqInStage) {
            if (t > 0) mbar_wait(dq_free, (t - 1) & 1);
          }
          // dQ_c into its staging tiles (tile layout of dq_accum_offset): query row warp·16 + g +
          // 8hr, column 8j + 2·t4 (+1) of this consumer's columns.
#pragma unroll
          for (int j = 0; j < NQ / 8; ++j)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const int r = warp * 16 + g + hr * 8;
              *reinterpret_cast<float2*>(gptr(dq_tile(s, CW, j / 8)) + 4 * (r * 64 + (((j % 8) ^ (r & 7)) << 3) + 2 * t4)) =
                  make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
            }
          fence_proxy_async();
          named_barrier_sync(4 + CW, 128);
          if (tid == 0) mbar_arrive(dq_ready(s));
          if (++s == S) {
            s = 0;
            phase ^= 1;
          }
          step = next;
        }
      }

      if (count == 0) {
#pragma unroll
        for (int i = 0; i < NQ / 2; ++i) dk[i] = 0.f;
#pragma unroll
        for (int i = 0; i < NV / 2; ++i) dv[i] = 0.f;
      }
      // Epilogue: dK = scale · dK and dV staged in this consumer's column panels of sK / sV, so that
      // the global stores are whole 16-byte chunks of a row. No product reads those panels any more:
      // the other consumer's dQ reads only its own panels of K, consumer 0's last Sᵀ finished before
      // barrier 2 and consumer 1's last dPᵀ before barrier 3 of the last step.
#pragma unroll
      for (int j = 0; j < NQ / 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const uint32_t o = swizzled_chunk<BN>(kr0 + hr * 8, kQLo * 8 + j) + 4 * t4;
          *reinterpret_cast<uint32_t*>(gptr(sK + o)) = pack2<Elem>(dk[4 * j + 2 * hr] * scale, dk[4 * j + 2 * hr + 1] * scale);
        }
#pragma unroll
      for (int j = 0; j < NV / 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const uint32_t o = swizzled_chunk<BN>(kr0 + hr * 8, kVLo * 8 + j) + 4 * t4;
          *reinterpret_cast<uint32_t*>(gptr(sV + o)) = pack2<Elem>(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]);
        }
      named_barrier_sync(4 + CW, 128);
      Storage* dk_ptr = static_cast<Storage*>(p.dk) + b * p.dk_batch_stride + (k_start + n0) * p.dk_row_stride +
                        hk * p.dk_head_stride;
      Storage* dv_ptr = static_cast<Storage*>(p.dv) + b * p.dv_batch_stride + (k_start + n0) * p.dv_row_stride +
                        hk * p.dv_head_stride;
      // Rows past the sequence end and columns past head_dim (head_dim_v) are not written.
      auto store = [&](Storage* dst, int64_t row_stride, uint32_t tile, int lo, int chunks, int cols) {
        for (int i = tid; i < BN * chunks; i += 128) {
          const int row = i / chunks, c8 = lo * 8 + i % chunks;
          if (row >= len_k - n0) break;  // i grows with the row
          const uint32_t o = (c8 / 8) * BN * 128 + row * 128 + ((((c8 % 8) ^ row) & 7) << 4);
          if (c8 * 8 < cols)
            *reinterpret_cast<uint4*>(dst + row * row_stride + c8 * 8) = *reinterpret_cast<const uint4*>(gptr(tile + o));
        }
      };
      store(dk_ptr, p.dk_row_stride, sK, kQLo, NQ / 8, p.head_dim);
      store(dv_ptr, p.dv_row_stride, sV, kVLo, NV / 8, p.head_dim_v);
    };
    // Read from lane 0 so that the compiler knows it is warp-uniform.
    if (__shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0) == 1) consumer(std::integral_constant<int, 0>{});
    else consumer(std::integral_constant<int, 1>{});
  }
#endif
}

template <typename Elem, typename Cfg>
void launch_bwd_sm90_dsplit_cfg(const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream) {
  if (p.dq_accum_cols != Cfg::kHeadDim)
    throw Error("backward: internal error, the head_dim 256 Hopper kernel's dQ accumulator has the wrong columns");
  // (Never by programmatic dependent launch: this kernel has no griddep_wait().)
  launch_bwd_sm90_kernel<Elem, Cfg>(bwd_sm90_dsplit_kernel<Elem, Cfg>, p, rows_q, rows_k, stream, false);
}

template <typename Elem, int kHeadDim>
void launch_bwd_sm90_dsplit(const BwdParams& p, int64_t rows_q, int64_t rows_k, void* stream) {
  static_assert(kHeadDim == 256, "the head-dim-split kernel serves the 256 bucket");
  // This kernel has no split tail (BwdParams::split_first): its parts would each write their own
  // partial dK / dV.
  const int64_t blocks =
      int64_t(p.batch) * p.num_heads_k * ((p.seqlen_k + BwdSm90SplitConfig<256>::kBlockN - 1) / BwdSm90SplitConfig<256>::kBlockN);
  if (p.split_first < blocks)
    throw Error("backward: internal error, a split tail was asked of the head_dim 256 Hopper kernel, which has none");
  // The host chose the config with the dQ accumulator's columns (run_bwd_sm80, bwd_256_tile_cols).
  switch (tile_256(p.head_dim, p.head_dim_v, p.dq_accum_cols != 256)) {
    case Tile256::mla:
      launch_bwd_sm90_dsplit_cfg<Elem, BwdSm90SplitConfig<kTile192HeadDim, kTileMlaHeadDimV>>(p, rows_q, rows_k, stream);
      break;
    case Tile256::d192:
      launch_bwd_sm90_dsplit_cfg<Elem, BwdSm90SplitConfig<kTile192HeadDim>>(p, rows_q, rows_k, stream);
      break;
    case Tile256::d256:
      launch_bwd_sm90_dsplit_cfg<Elem, BwdSm90SplitConfig<256>>(p, rows_q, rows_k, stream);
      break;
  }
}

}  // namespace flashattn::cuda

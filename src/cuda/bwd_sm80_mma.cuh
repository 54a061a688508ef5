// FlashAttention-2 backward on tensor cores with mma.sync (sm_80 and later; Dao 2023, Alg. 2 and the
// Sec. 3.2 work partitioning). One kernel template, two roles:
//
// dK/dV kernel (kDqMode = false): one block per (key tile, KV head, batch). K and V stay in shared
// memory; the block walks the query tiles that the mask lets see its keys, for every query head of
// the GQA group (so dK/dV of a KV head are summed inside the block, without atomics), with Q, dO and
// the per-row statistics double-buffered through cp.async. Per query tile:
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ               (fp32 accumulators; one k loop for both products)
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − D) (∘ (1 − tanh²) under softcap)
//   dV += Pᵀ dO, dK += dSᵀ Q               (Pᵀ and dSᵀ go through shared memory as f16/bf16)
//   dQ_accum += dS K                       (fp32 atomics; only when p.dq_accum, the fast default)
// dK = scale · dK at the end (the softmax scale factors out of dS). Each product has its own warp
// grid (bwd_traits.hpp), so warp tiles stay at 32 x 32 or larger.
//
// dQ kernel (kDqMode = true, deterministic mode): one block per (query tile, head, batch); Q and dO
// stay, the block walks the visible key tiles, recomputes S, P, dP, dS and accumulates dQ += dS K in
// registers, then writes scale · dQ. No atomics: every output element has one writer and a fixed
// summation order, so the result is bitwise repeatable.
//
// P = 0 wherever lse = −inf (fully masked rows: the workspace holds +inf there) or the element is
// masked, so no NaN can appear. Masks bound the loops (block skipping); only tiles that cross a
// mask edge or a sequence end pay per-element masking. Softcap and ALiBi are runtime flags tested
// once per tile (four specializations of the score step inside the kernel), so they do not
// multiply the instantiations.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/bwd_traits.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_utils.cuh"

namespace flashattn::cuda {

namespace bwd_detail {

// Copies kRows x kHeadDim elements (row stride in elements) into a padded shared tile of leading
// dimension kLd; rows >= valid_rows and columns >= valid_cols are zero-filled.
template <int kRows, int kHeadDim, int kLd, int kThreads, typename Storage>
__device__ __forceinline__ void load_tile(Storage* smem, const Storage* gmem, int64_t row_stride,
                                          int valid_rows, int valid_cols, const void* fallback) {
  constexpr int kChunks = kHeadDim / 8;
  static_assert((kRows * kChunks) % kThreads == 0, "tile copy must divide evenly among threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / kChunks, c = i % kChunks;
    const bool pred = r < valid_rows && c * 8 < valid_cols;
    const void* src = pred ? static_cast<const void*>(gmem + r * row_stride + c * 8) : fallback;
    cp_async_16(smem_addr(smem + r * kLd + c * 8), src, pred);
  }
}

// One warp: acc[MT][NT] (16·MT x 8·NT, fp32) += A (16·MT x K) · B (K x 8·NT), both from shared
// memory through ldmatrix. A[m][k] = a[m·lda + k], or a[k·lda + m] when kATrans (A stored
// transposed); B[k][n] = b[n·ldb + k], or b[k·ldb + n] when kBTrans. The transposed cases use
// ldmatrix.trans, so every operand layout costs the same.
template <typename Elem, int MT, int NT, int K, bool kATrans, bool kBTrans, typename Storage>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const Storage* a, int lda,
                                          const Storage* b, int ldb) {
  static_assert(NT % 2 == 0 && K % 16 == 0, "x4 ldmatrix loads two n-tiles of 16 k");
  const int lane = threadIdx.x & 31;
  const int li = lane >> 3, lr = lane & 7;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (!kATrans) {
        // matrices: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
        ldmatrix_x4(af[mt], smem_addr(a + (mt * 16 + lr + (li & 1) * 8) * lda + k0 + (li >> 1) * 8));
      } else {
        ldmatrix_x4_trans(af[mt],
                          smem_addr(a + (k0 + lr + (li >> 1) * 8) * lda + mt * 16 + (li & 1) * 8));
      }
    }
    uint32_t bf[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t r[4];
      if constexpr (!kBTrans) {
        // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        ldmatrix_x4(r, smem_addr(b + (nt * 8 + lr + (li >> 1) * 8) * ldb + k0 + (li & 1) * 8));
      } else {
        ldmatrix_x4_trans(r, smem_addr(b + (k0 + lr + (li & 1) * 8) * ldb + nt * 8 + (li >> 1) * 8));
      }
      bf[nt][0] = r[0];
      bf[nt][1] = r[1];
      bf[nt + 1][0] = r[2];
      bf[nt + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_16816<Elem>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  }
}

// Two independent products of one shape in one k loop: acc0 += A0 B0 and acc1 += A1 B1 (same
// layouts and leading dimensions). Interleaving doubles the independent accumulator chains per
// k step, which the dependent-issue stalls of the single products called for (perf-notes.md).
template <typename Elem, int MT, int NT, int K, bool kATrans, bool kBTrans, typename Storage>
__device__ __forceinline__ void warp_gemm2(float (&acc0)[MT][NT][4], const Storage* a0, const Storage* b0,
                                           float (&acc1)[MT][NT][4], const Storage* a1, const Storage* b1,
                                           int lda, int ldb) {
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    warp_gemm<Elem, MT, NT, 16, kATrans, kBTrans>(acc0, a0 + (kATrans ? k0 * lda : k0), lda,
                                                  b0 + (kBTrans ? k0 * ldb : k0), ldb);
    warp_gemm<Elem, MT, NT, 16, kATrans, kBTrans>(acc1, a1 + (kATrans ? k0 * lda : k0), lda,
                                                  b1 + (kBTrans ? k0 * ldb : k0), ldb);
  }
}

// Copies `rows` query-row statistics (lse·log2e and D) starting at workspace index `first` into
// shared memory with 4-byte cp.async (no register round trip). The workspace rows are padded to
// stat_rows and filled by the preprocess, so no bounds check is needed.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_stats(float* s_lse, float* s_dsum, const BwdParams& p, int64_t first) {
  for (int x = threadIdx.x; x < 2 * kRows; x += kThreads) {
    const bool is_lse = x < kRows;
    const int r = is_lse ? x : x - kRows;
    const float* src = (is_lse ? p.lse_log2 : p.dsum) + first + r;
    float* dst = (is_lse ? s_lse : s_dsum) + r;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
  }
}

// The mask of one sequence (params.hpp visible_keys(): query i sees key j when
// i + off − wl <= j <= i + off + wr, each side only when its window is >= 0).
struct SeqMask {
  int len_q, len_k, off, wl, wr;

  __device__ __forceinline__ bool visible(int i, int j) const {
    // Non-short-circuit &, |: one predicate chain, no branches.
    return (i < len_q) & (j < len_k) & ((wl < 0) | (j >= i + off - wl)) & ((wr < 0) | (j <= i + off + wr));
  }
  // True when every (i, j) of the tile [i0, i0 + ti) x [j0, j0 + tj) is visible.
  __device__ __forceinline__ bool tile_full(int i0, int ti, int j0, int tj) const {
    return i0 + ti <= len_q && j0 + tj <= len_k && (wl < 0 || j0 >= i0 + ti - 1 + off - wl) &&
           (wr < 0 || j0 + tj - 1 <= i0 + off + wr);
  }
};

__device__ __forceinline__ void store_u32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }

// dq_accum[i] += (x, y); one 8-byte vector atomic on sm_90, two scalar ones before.
__device__ __forceinline__ void atomic_add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

}  // namespace bwd_detail

template <typename Elem, int kHeadDim, bool kDqMode>
__global__ void __launch_bounds__(BwdShape<kHeadDim>::kThreads, BwdShape<kHeadDim>::kMinBlocks)
    bwd_sm80_kernel(const __grid_constant__ BwdParams p) {
  using Shape = BwdShape<kHeadDim>;
  using Storage = typename Elem::Storage;
  using bwd_detail::load_tile;
  using bwd_detail::warp_gemm;
  using bwd_detail::warp_gemm2;
  constexpr int D = kHeadDim, R = Shape::kRes, S = Shape::kStr;
  constexpr int NTH = Shape::kThreads, LD = Shape::kLd, LDX = Shape::kLdx, MR = Shape::kMaxRows;
  constexpr int ST = Shape::kStages;
  using SG = typename Shape::Score;  // Sᵀ/dPᵀ (or S/dP) [R x S]
  using AG = typename Shape::Acc;    // dK/dV (or dQ) [R x D]
  using QG = typename Shape::Dq;     // dQ partial of the dK/dV kernel [S x D]
  constexpr int SM = SG::kM, SN = SG::kN, AM = AG::kM, AN = AG::kN;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Storage* sR0 = reinterpret_cast<Storage*>(smem_raw);  // K (dK/dV kernel) or Q (dQ kernel)
  Storage* sR1 = sR0 + R * LD;                          // V or dO
  Storage* sS0 = sR1 + R * LD;                          // 2 buffers of Q or K
  Storage* sS1 = sS0 + ST * S * LD;                     // ST buffers of dO or V
  Storage* sX = sS1 + ST * S * LD;                      // Pᵀ [resident][streamed]
  Storage* sY = sX + R * LDX;                           // dSᵀ (dK/dV kernel) or dS (dQ kernel)
  float* sLse = reinterpret_cast<float*>(sY + R * LDX);  // [2][MR] lse·log2e of query rows
  float* sDsum = sLse + 2 * MR;                          // [2][MR] D of query rows

  // Grid: x = (head, batch) pairs, y = resident tiles, taken as grouped_block() says.
  // Within a pair the heaviest tile starts first: under a causal mask the low key tiles (dK/dV
  // kernel) and the high query tiles (dQ kernel) do the most work.
  const int heads = kDqMode ? p.num_heads : p.num_heads_k;
  const PairTile pt = grouped_block(p.tail_pairs);
  const int b = pt.pair / heads, head = pt.pair % heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Warp tile origins (row, column) in each product.
  const int s_row = (warp % (R / (16 * SM))) * SM * 16, s_col = (warp / (R / (16 * SM))) * SN * 8;
  const int a_row = (warp % (R / (16 * AM))) * AM * 16, a_col = (warp / (R / (16 * AM))) * AN * 8;
  const int g = lane >> 2, tq = lane & 3;

  int64_t q_start = 0, k_start = 0;
  int len_q = p.seqlen_q, len_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q_start = p.cu_seqlens_q[b];
    len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    k_start = p.cu_seqlens_k[b];
    len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  }
  const bwd_detail::SeqMask mask{len_q, len_k, p.align_bottom_right ? len_k - len_q : 0,
                                 p.window_size_left, p.window_size_right};
  const Storage* q_base = static_cast<const Storage*>(p.q);
  const Storage* k_base = static_cast<const Storage*>(p.k);
  const Storage* v_base = static_cast<const Storage*>(p.v);
  const Storage* do_base = static_cast<const Storage*>(p.dout);
  const int64_t stat_rows = p.stat_rows;

  // Resident tile: keys [r0, r0 + R) of KV head hk, or queries [r0, r0 + R) of head h.
  const int tile = kDqMode ? int(gridDim.y) - 1 - pt.tile : pt.tile;
  const int r0 = tile * R;
  int first = 0, count = 0;  // streamed tiles [first, first + count) per head
  int hk, h_fixed;
  if constexpr (!kDqMode) {
    if (r0 >= len_k) return;  // varlen: this sequence is shorter than max_seqlen_k
    hk = head;
    h_fixed = 0;
    load_tile<R, D, LD, NTH>(sR0, k_base + b * p.k_batch_stride + (k_start + r0) * p.k_row_stride +
                                      hk * p.k_head_stride,
                             p.k_row_stride, len_k - r0, p.head_dim, p.k);
    load_tile<R, D, LD, NTH>(sR1, v_base + b * p.v_batch_stride + (k_start + r0) * p.v_row_stride +
                                      hk * p.v_head_stride,
                             p.v_row_stride, len_k - r0, p.head_dim_v, p.v);
    // Query rows that see any of keys [r0, j_last]: i >= j − off − wr and i <= j − off + wl.
    const int j_last = min(r0 + R, len_k) - 1;
    const int i_lo = mask.wr >= 0 ? max(0, r0 - mask.off - mask.wr) : 0;
    const int i_hi = mask.wl >= 0 ? min(len_q, j_last - mask.off + mask.wl + 1) : len_q;
    if (i_hi > i_lo) {
      first = i_lo / S;
      count = (i_hi + S - 1) / S - first;
    }
  } else {
    if (r0 >= len_q) return;
    h_fixed = head;
    hk = h_fixed / p.head_ratio;
    load_tile<R, D, LD, NTH>(sR0, q_base + b * p.q_batch_stride + (q_start + r0) * p.q_row_stride +
                                      h_fixed * p.q_head_stride,
                             p.q_row_stride, len_q - r0, p.head_dim, p.q);
    load_tile<R, D, LD, NTH>(sR1, do_base + b * p.do_batch_stride + (q_start + r0) * p.do_row_stride +
                                      h_fixed * p.do_head_stride,
                             p.do_row_stride, len_q - r0, p.head_dim_v, p.dout);
    bwd_detail::load_stats<R, NTH>(sLse, sDsum, p, (static_cast<int64_t>(b) * p.num_heads + h_fixed) * stat_rows + r0);
    // Keys seen by any of queries [r0, i_last]: j >= i + off − wl and j <= i + off + wr.
    const int i_last = min(r0 + R, len_q) - 1;
    const int j_lo = mask.wl >= 0 ? max(0, r0 + mask.off - mask.wl) : 0;
    const int j_hi = mask.wr >= 0 ? min(len_k, i_last + mask.off + mask.wr + 1) : len_k;
    if (j_hi > j_lo) {
      first = j_lo / S;
      count = (j_hi + S - 1) / S - first;
    }
  }
  cp_async_commit();
  const int iters = kDqMode ? count : count * p.head_ratio;

  // Streamed tile t: (query head, query tile) in the dK/dV kernel, key tile in the dQ kernel.
  auto head_of = [&](int t) { return kDqMode ? h_fixed : hk * p.head_ratio + t / count; };
  auto start_of = [&](int t) { return (first + (kDqMode ? t : t % count)) * S; };
  auto issue = [&](int t, int buf) {
    const int s0 = start_of(t);
    Storage* d0 = sS0 + buf * S * LD;
    Storage* d1 = sS1 + buf * S * LD;
    if constexpr (!kDqMode) {
      const int h = head_of(t);
      load_tile<S, D, LD, NTH>(d0, q_base + b * p.q_batch_stride + (q_start + s0) * p.q_row_stride +
                                       h * p.q_head_stride,
                               p.q_row_stride, len_q - s0, p.head_dim, p.q);
      load_tile<S, D, LD, NTH>(d1, do_base + b * p.do_batch_stride +
                                       (q_start + s0) * p.do_row_stride + h * p.do_head_stride,
                               p.do_row_stride, len_q - s0, p.head_dim_v, p.dout);
      bwd_detail::load_stats<S, NTH>(sLse + buf * MR, sDsum + buf * MR, p,
                                     (static_cast<int64_t>(b) * p.num_heads + h) * stat_rows + s0);
    } else {
      load_tile<S, D, LD, NTH>(d0, k_base + b * p.k_batch_stride + (k_start + s0) * p.k_row_stride +
                                       hk * p.k_head_stride,
                               p.k_row_stride, len_k - s0, p.head_dim, p.k);
      load_tile<S, D, LD, NTH>(d1, v_base + b * p.v_batch_stride + (k_start + s0) * p.v_row_stride +
                                       hk * p.v_head_stride,
                               p.v_row_stride, len_k - s0, p.head_dim_v, p.v);
    }
  };

  // dK/dV kernel: acc0 = dK, acc1 = dV. dQ kernel: acc0 = dQ.
  float acc0[AM][AN][4], acc1[AM][AN][4];
#pragma unroll
  for (int m = 0; m < AM; ++m)
#pragma unroll
    for (int n = 0; n < AN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc0[m][n][e] = acc1[m][n][e] = 0.f;

  const float scale = p.softmax_scale, scale_log2 = scale * kLog2e, cap = p.softcap;
  const bool modified = cap > 0.f || p.alibi_slopes != nullptr;

  // Two stages: tile t + 1 is copied while tile t is computed. One stage: the copy waits, and the
  // other resident block of the SM hides it.
  if (ST == 2 && iters > 0) issue(0, 0);
  cp_async_commit();
  for (int t = 0; t < iters; ++t) {
    const int buf = ST == 2 ? t & 1 : 0;
    if (ST == 1) {
      issue(t, 0);
      cp_async_commit();
      cp_async_wait<0>();
    } else if (t + 1 < iters) {
      issue(t + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int h = head_of(t), s0 = start_of(t);
    const Storage* cS0 = sS0 + buf * S * LD;
    const Storage* cS1 = sS1 + buf * S * LD;

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (dK/dV kernel), or S = Q Kᵀ and dP = dO Vᵀ (dQ kernel).
    float acc_s[SM][SN][4], acc_dp[SM][SN][4];
#pragma unroll
    for (int m = 0; m < SM; ++m)
#pragma unroll
      for (int n = 0; n < SN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[m][n][e] = acc_dp[m][n][e] = 0.f;
    warp_gemm2<Elem, SM, SN, D, false, false>(acc_s, sR0 + s_row * LD, cS0 + s_col * LD, acc_dp,
                                              sR1 + s_row * LD, cS1 + s_col * LD, LD, LD);

    // P and dS, element by element. Resident row rl, streamed column cl of the block's tile.
    const int qi0 = kDqMode ? r0 : s0, kj0 = kDqMode ? s0 : r0;
    const bool edge = kDqMode ? !mask.tile_full(r0, R, s0, S) : !mask.tile_full(s0, S, r0, R);
    const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;  // 0: no ALiBi
    const float* lse_row = sLse + (kDqMode ? 0 : buf * MR);
    const float* dsum_row = sDsum + (kDqMode ? 0 : buf * MR);
    // One specialization per (score modifiers, edge tile): the uniform tests stay out of the
    // per-element code (tested per element, they compiled to branches around every element).
    auto scores = [&](auto modified_c, auto edge_c) {
      constexpr bool kModified = decltype(modified_c)::value, kEdge = decltype(edge_c)::value;
#pragma unroll
      for (int m = 0; m < SM; ++m)
#pragma unroll
      for (int n = 0; n < SN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rl = s_row + m * 16 + g + (e >> 1) * 8;
          const int cl = s_col + n * 8 + 2 * tq + (e & 1);
          const int stat = kDqMode ? rl : cl;
          const int i = qi0 + (kDqMode ? rl : cl), j = kj0 + (kDqMode ? cl : rl);
          float pv, dtanh = 1.f;
          if constexpr (!kModified) {
            pv = fast_exp2(acc_s[m][n][e] * scale_log2 - lse_row[stat]);
          } else {
            float x = acc_s[m][n][e] * scale;
            if (cap > 0.f) {
              const float th = tanhf(x / cap);
              x = cap * th;
              dtanh = 1.f - th * th;
            }
            x -= slope * fabsf(static_cast<float>(i + mask.off - j));
            pv = fast_exp2(x * kLog2e - lse_row[stat]);
          }
          if constexpr (kEdge) pv = mask.visible(i, j) ? pv : 0.f;
          acc_s[m][n][e] = pv;
          acc_dp[m][n][e] = pv * (acc_dp[m][n][e] - dsum_row[stat]) * dtanh;
        }
      }
    };
    using True = std::true_type;
    using False = std::false_type;
    if (modified) {
      if (edge) scores(True{}, True{});
      else scores(True{}, False{});
    } else {
      if (edge) scores(False{}, True{});
      else scores(False{}, False{});
    }
#pragma unroll
    for (int m = 0; m < SM; ++m)
#pragma unroll
    for (int n = 0; n < SN; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int rl = s_row + m * 16 + g + hf * 8;
        const int cl = s_col + n * 8 + 2 * tq;
        if constexpr (!kDqMode)
          bwd_detail::store_u32(sX + rl * LDX + cl, pack2<Elem>(acc_s[m][n][2 * hf], acc_s[m][n][2 * hf + 1]));
        bwd_detail::store_u32(sY + rl * LDX + cl, pack2<Elem>(acc_dp[m][n][2 * hf], acc_dp[m][n][2 * hf + 1]));
      }
    }
    __syncthreads();

    if constexpr (!kDqMode) {
      // dV += Pᵀ dO and dK += dSᵀ Q over this tile's S query rows.
      warp_gemm2<Elem, AM, AN, S, false, true>(acc1, sX + a_row * LDX, cS1 + a_col, acc0, sY + a_row * LDX,
                                               cS0 + a_col, LDX, LD);
      if (p.dq_accum != nullptr) {
        // dQ (S x D) += dS K over this block's R keys; dS is read transposed from dSᵀ.
        constexpr int QM = QG::kM, QN = QG::kN;
        const int q_row = (warp % (S / (16 * QM))) * QM * 16, q_col = (warp / (S / (16 * QM))) * QN * 8;
        float acc_q[QM][QN][4];
#pragma unroll
        for (int m = 0; m < QM; ++m)
#pragma unroll
          for (int n = 0; n < QN; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_q[m][n][e] = 0.f;
        warp_gemm<Elem, QM, QN, R, true, true>(acc_q, sY + q_row, LDX, sR0 + q_col, LD);
        float* dqa = p.dq_accum + ((static_cast<int64_t>(b) * p.num_heads + h) * stat_rows + s0) * p.head_dim;
#pragma unroll
        for (int m = 0; m < QM; ++m)
#pragma unroll
        for (int n = 0; n < QN; ++n) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int row = q_row + m * 16 + g + hf * 8, col = q_col + n * 8 + 2 * tq;
            if (row < len_q - s0 && col < p.head_dim)
              bwd_detail::atomic_add2(dqa + static_cast<int64_t>(row) * p.head_dim + col,
                                      acc_q[m][n][2 * hf], acc_q[m][n][2 * hf + 1]);
          }
        }
      }
    } else {
      warp_gemm<Elem, AM, AN, S, false, true>(acc0, sY + a_row * LDX, LDX, cS0 + a_col, LD);
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  // Epilogue: each thread writes pairs of its accumulator row straight to global memory.
  if constexpr (!kDqMode) {
    Storage* dk = static_cast<Storage*>(p.dk) + b * p.dk_batch_stride + (k_start + r0) * p.dk_row_stride +
                  hk * p.dk_head_stride;
    Storage* dv = static_cast<Storage*>(p.dv) + b * p.dv_batch_stride + (k_start + r0) * p.dv_row_stride +
                  hk * p.dv_head_stride;
#pragma unroll
    for (int m = 0; m < AM; ++m)
#pragma unroll
    for (int n = 0; n < AN; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = a_row + m * 16 + g + hf * 8, col = a_col + n * 8 + 2 * tq;
        if (row >= len_k - r0) continue;
        if (col < p.head_dim)
          bwd_detail::store_u32(dk + row * p.dk_row_stride + col,
                                pack2<Elem>(acc0[m][n][2 * hf] * scale, acc0[m][n][2 * hf + 1] * scale));
        if (col < p.head_dim_v)
          bwd_detail::store_u32(dv + row * p.dv_row_stride + col,
                                pack2<Elem>(acc1[m][n][2 * hf], acc1[m][n][2 * hf + 1]));
      }
    }
  } else {
    Storage* dq = static_cast<Storage*>(p.dq) + b * p.dq_batch_stride + (q_start + r0) * p.dq_row_stride +
                  h_fixed * p.dq_head_stride;
#pragma unroll
    for (int m = 0; m < AM; ++m)
#pragma unroll
    for (int n = 0; n < AN; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = a_row + m * 16 + g + hf * 8, col = a_col + n * 8 + 2 * tq;
        if (row < len_q - r0 && col < p.head_dim)
          bwd_detail::store_u32(dq + row * p.dq_row_stride + col,
                                pack2<Elem>(acc0[m][n][2 * hf] * scale, acc0[m][n][2 * hf + 1] * scale));
      }
    }
  }
}

template <typename Elem, int kHeadDim, bool kDqMode>
void launch_bwd_sm80(const BwdParams& p, void* stream) {
  using Shape = BwdShape<kHeadDim>;
  auto kernel = bwd_sm80_kernel<Elem, kHeadDim, kDqMode>;
  const int smem = Shape::kSmemBytes;
  int device = 0, optin = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem > optin)
    throw Error("head_dim: the CUDA backward for head_dim bucket " + std::to_string(kHeadDim) + " needs " +
                std::to_string(smem) + " bytes of shared memory per block, the device offers " +
                std::to_string(optin));
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const int rows = kDqMode ? p.seqlen_q : p.seqlen_k;
  const dim3 grid((kDqMode ? p.num_heads : p.num_heads_k) * p.batch, (rows + Shape::kRes - 1) / Shape::kRes);
  kernel<<<grid, Shape::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      with_block_order(p, grid.x, grid.y, multiprocessor_count()));
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashattn::cuda

// FlashAttention-2 backward on tensor cores with mma.sync (sm_80 and later; Dao 2023, Alg. 2 and the
// Sec. 3.2 work partitioning). One kernel template, two roles:
//
// dK/dV kernel (kDqMode = false): one block per (key tile, KV head, batch). K and V stay in shared
// memory; the block walks the query tiles that the mask lets see its keys, for every query head of
// the GQA group (so dK/dV of a KV head are summed inside the block, without atomics), with Q, dO and
// the per-row statistics double-buffered through cp.async. Per query tile:
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ               (fp32 accumulators; warps own 16 keys each)
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − D) (∘ (1 − tanh²) under softcap)
//   dV += Pᵀ dO, dK += dSᵀ Q               (Pᵀ and dSᵀ go through shared memory as f16/bf16)
//   dQ_accum += dS K                       (fp32 atomics; only when p.dq_accum, the fast default)
// dK = scale · dK at the end (the softmax scale factors out of dS).
//
// dQ kernel (kDqMode = true, deterministic mode): one block per (query tile, head, batch); Q and dO
// stay, the block walks the visible key tiles, recomputes S, P, dP, dS and accumulates dQ += dS K in
// registers, then writes scale · dQ. No atomics: every output element has one writer and a fixed
// summation order, so the result is bitwise repeatable.
//
// P = 0 wherever lse = −inf (fully masked rows: the workspace holds +inf there) or the element is
// masked, so no NaN can appear. Masks bound the loops (block skipping); only tiles that cross a
// mask edge or a sequence end pay per-element masking. Softcap and ALiBi are uniform runtime
// branches, so they do not multiply the instantiations.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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

// The mask of one sequence (params.hpp visible_keys(): query i sees key j when
// i + off − wl <= j <= i + off + wr, each side only when its window is >= 0).
struct SeqMask {
  int len_q, len_k, off, wl, wr;

  __device__ __forceinline__ bool visible(int i, int j) const {
    return i < len_q && j < len_k && (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
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
__global__ void __launch_bounds__(BwdShape<kHeadDim>::kThreads, 1)
    bwd_sm80_kernel(const __grid_constant__ BwdParams p) {
  using Shape = BwdShape<kHeadDim>;
  using Storage = typename Elem::Storage;
  using bwd_detail::load_tile;
  using bwd_detail::warp_gemm;
  constexpr int D = kHeadDim, R = Shape::kRes, S = Shape::kStr;
  constexpr int WR = Shape::kWarpsRes, WC = Shape::kWarpsCol, NW = Shape::kWarps;
  constexpr int NTH = Shape::kThreads, LD = Shape::kLd, LDX = Shape::kLdx, MR = Shape::kMaxRows;
  constexpr int SC = S / WC, NS = SC / 8;  // streamed columns of one warp's score tile
  constexpr int DC = D / WC, ND = DC / 8;  // head-dim columns of one warp's accumulators
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Storage* sR0 = reinterpret_cast<Storage*>(smem_raw);  // K (dK/dV kernel) or Q (dQ kernel)
  Storage* sR1 = sR0 + R * LD;                          // V or dO
  Storage* sS0 = sR1 + R * LD;                          // 2 buffers of Q or K
  Storage* sS1 = sS0 + 2 * S * LD;                      // 2 buffers of dO or V
  Storage* sX = sS1 + 2 * S * LD;                       // Pᵀ [resident][streamed]
  Storage* sY = sX + R * LDX;                           // dSᵀ (dK/dV kernel) or dS (dQ kernel)
  float* sLse = reinterpret_cast<float*>(sY + R * LDX);  // [2][MR] lse·log2e of query rows
  float* sDsum = sLse + 2 * MR;                          // [2][MR] D of query rows

  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrow = warp % WR, wcol = warp / WR;
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
  const int64_t stat_rows = static_cast<int64_t>(p.seqlen_q);

  // Resident tile: keys [r0, r0 + R) of KV head hk, or queries [r0, r0 + R) of head h.
  // Heaviest blocks first: under a causal mask low key tiles and high query tiles do the most work.
  const int tile = kDqMode ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int r0 = tile * R;
  int first = 0, count = 0;  // streamed tiles [first, first + count) per head
  int hk, h_fixed;
  if constexpr (!kDqMode) {
    if (r0 >= len_k) return;  // varlen: this sequence is shorter than max_seqlen_k
    hk = blockIdx.y;
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
    h_fixed = blockIdx.y;
    hk = h_fixed / p.head_ratio;
    load_tile<R, D, LD, NTH>(sR0, q_base + b * p.q_batch_stride + (q_start + r0) * p.q_row_stride +
                                      h_fixed * p.q_head_stride,
                             p.q_row_stride, len_q - r0, p.head_dim, p.q);
    load_tile<R, D, LD, NTH>(sR1, do_base + b * p.do_batch_stride + (q_start + r0) * p.do_row_stride +
                                      h_fixed * p.do_head_stride,
                             p.do_row_stride, len_q - r0, p.head_dim_v, p.dout);
    if (threadIdx.x < R) {
      const int row = r0 + threadIdx.x;
      const int64_t idx = (static_cast<int64_t>(b) * p.num_heads + h_fixed) * stat_rows + row;
      sLse[threadIdx.x] = row < len_q ? p.lse_log2[idx] : INFINITY;
      sDsum[threadIdx.x] = row < len_q ? p.dsum[idx] : 0.f;
    }
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
      if (threadIdx.x < S) {
        const int row = s0 + threadIdx.x;
        const int64_t idx = (static_cast<int64_t>(b) * p.num_heads + h) * stat_rows + row;
        sLse[buf * MR + threadIdx.x] = row < len_q ? p.lse_log2[idx] : INFINITY;
        sDsum[buf * MR + threadIdx.x] = row < len_q ? p.dsum[idx] : 0.f;
      }
    } else {
      load_tile<S, D, LD, NTH>(d0, k_base + b * p.k_batch_stride + (k_start + s0) * p.k_row_stride +
                                       hk * p.k_head_stride,
                               p.k_row_stride, len_k - s0, p.head_dim, p.k);
      load_tile<S, D, LD, NTH>(d1, v_base + b * p.v_batch_stride + (k_start + s0) * p.v_row_stride +
                                       hk * p.v_head_stride,
                               p.v_row_stride, len_k - s0, p.head_dim_v, p.v);
    }
  };

  // dK/dV kernel: acc0 = dK, acc1 = dV (16 keys x DC per warp). dQ kernel: acc0 = dQ.
  float acc0[1][ND][4], acc1[1][ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc0[0][n][e] = acc1[0][n][e] = 0.f;

  const float scale = p.softmax_scale, scale_log2 = scale * kLog2e, cap = p.softcap;
  const bool modified = cap > 0.f || p.alibi_slopes != nullptr;

  if (iters > 0) issue(0, 0);
  cp_async_commit();
  for (int t = 0; t < iters; ++t) {
    const int buf = t & 1;
    if (t + 1 < iters) {
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
    float acc_s[1][NS][4], acc_dp[1][NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[0][n][e] = acc_dp[0][n][e] = 0.f;
    warp_gemm<Elem, 1, NS, D, false, false>(acc_s, sR0 + wrow * 16 * LD, LD, cS0 + wcol * SC * LD, LD);
    warp_gemm<Elem, 1, NS, D, false, false>(acc_dp, sR1 + wrow * 16 * LD, LD, cS1 + wcol * SC * LD, LD);

    // P and dS, element by element. Resident row rl, streamed column cl of the block's tile.
    const int qi0 = kDqMode ? r0 : s0, kj0 = kDqMode ? s0 : r0;
    const bool edge = kDqMode ? !mask.tile_full(r0, R, s0, S) : !mask.tile_full(s0, S, r0, R);
    const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;
    const float* lse_row = sLse + (kDqMode ? 0 : buf * MR);
    const float* dsum_row = sDsum + (kDqMode ? 0 : buf * MR);
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rl = wrow * 16 + g + (e >> 1) * 8;
        const int cl = wcol * SC + n * 8 + 2 * tq + (e & 1);
        const int stat = kDqMode ? rl : cl;
        const int i = qi0 + (kDqMode ? rl : cl), j = kj0 + (kDqMode ? cl : rl);
        const float lse2 = lse_row[stat];
        float pv, dtanh = 1.f;
        if (!modified) {
          pv = fast_exp2(acc_s[0][n][e] * scale_log2 - lse2);
        } else {
          float x = acc_s[0][n][e] * scale;
          if (cap > 0.f) {
            const float th = tanhf(x / cap);
            x = cap * th;
            dtanh = 1.f - th * th;
          }
          if (p.alibi_slopes != nullptr) x -= slope * fabsf(static_cast<float>(i + mask.off - j));
          pv = fast_exp2(x * kLog2e - lse2);
        }
        if (edge && !mask.visible(i, j)) pv = 0.f;
        acc_s[0][n][e] = pv;
        acc_dp[0][n][e] = pv * (acc_dp[0][n][e] - dsum_row[stat]) * dtanh;
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int rl = wrow * 16 + g + hf * 8;
        const int cl = wcol * SC + n * 8 + 2 * tq;
        if constexpr (!kDqMode)
          bwd_detail::store_u32(sX + rl * LDX + cl, pack2<Elem>(acc_s[0][n][2 * hf], acc_s[0][n][2 * hf + 1]));
        bwd_detail::store_u32(sY + rl * LDX + cl, pack2<Elem>(acc_dp[0][n][2 * hf], acc_dp[0][n][2 * hf + 1]));
      }
    }
    __syncthreads();

    if constexpr (!kDqMode) {
      // dV += Pᵀ dO and dK += dSᵀ Q over this tile's S query rows.
      warp_gemm<Elem, 1, ND, S, false, true>(acc1, sX + wrow * 16 * LDX, LDX, cS1 + wcol * DC, LD);
      warp_gemm<Elem, 1, ND, S, false, true>(acc0, sY + wrow * 16 * LDX, LDX, cS0 + wcol * DC, LD);
      if (p.dq_accum != nullptr) {
        // dQ (S x D) += dS K over this block's R keys, split into 16-row x QC-column warp tiles.
        constexpr int RG = S / 16, CG = NW / RG, QC = D / CG, NQ = QC / 8;
        static_assert(NW % RG == 0 && D % CG == 0 && NQ % 2 == 0, "dQ warp tiling");
        const int rg = warp % RG, cg = warp / RG;
        float acc_q[1][NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_q[0][n][e] = 0.f;
        warp_gemm<Elem, 1, NQ, R, true, true>(acc_q, sY + rg * 16, LDX, sR0 + cg * QC, LD);
        float* dqa = p.dq_accum + ((static_cast<int64_t>(b) * p.num_heads + h) * stat_rows + s0) * p.head_dim;
#pragma unroll
        for (int n = 0; n < NQ; ++n) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int row = rg * 16 + g + hf * 8, col = cg * QC + n * 8 + 2 * tq;
            if (row < len_q - s0 && col < p.head_dim)
              bwd_detail::atomic_add2(dqa + static_cast<int64_t>(row) * p.head_dim + col,
                                      acc_q[0][n][2 * hf], acc_q[0][n][2 * hf + 1]);
          }
        }
      }
    } else {
      warp_gemm<Elem, 1, ND, S, false, true>(acc0, sY + wrow * 16 * LDX, LDX, cS0 + wcol * DC, LD);
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
    for (int n = 0; n < ND; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = wrow * 16 + g + hf * 8, col = wcol * DC + n * 8 + 2 * tq;
        if (row >= len_k - r0) continue;
        if (col < p.head_dim)
          bwd_detail::store_u32(dk + row * p.dk_row_stride + col,
                                pack2<Elem>(acc0[0][n][2 * hf] * scale, acc0[0][n][2 * hf + 1] * scale));
        if (col < p.head_dim_v)
          bwd_detail::store_u32(dv + row * p.dv_row_stride + col,
                                pack2<Elem>(acc1[0][n][2 * hf], acc1[0][n][2 * hf + 1]));
      }
    }
  } else {
    Storage* dq = static_cast<Storage*>(p.dq) + b * p.dq_batch_stride + (q_start + r0) * p.dq_row_stride +
                  h_fixed * p.dq_head_stride;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = wrow * 16 + g + hf * 8, col = wcol * DC + n * 8 + 2 * tq;
        if (row < len_q - r0 && col < p.head_dim)
          bwd_detail::store_u32(dq + row * p.dq_row_stride + col,
                                pack2<Elem>(acc0[0][n][2 * hf] * scale, acc0[0][n][2 * hf + 1] * scale));
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
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int rows = kDqMode ? p.seqlen_q : p.seqlen_k;
  const dim3 grid((rows + Shape::kRes - 1) / Shape::kRes, kDqMode ? p.num_heads : p.num_heads_k, p.batch);
  kernel<<<grid, Shape::kThreads, smem, static_cast<cudaStream_t>(stream)>>>(p);
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashattn::cuda

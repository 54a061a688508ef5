// FlashAttention-2 forward on tensor cores with mma.sync (sm_80 and later; Dao 2023, Alg. 1 with
// the Sec. 3.2 work partitioning). One block of 4 warps computes block_m query rows of one
// (batch, head): Q is loaded once into shared memory, then key tiles are visited from the last
// visible one down to the first, K and V each through one cp.async buffer so that the copy of V(j)
// overlaps S = Q K(j)ᵀ and the copy of K(j-1) overlaps the softmax and O += P V(j). Scores stay
// in registers: the online softmax (FA-2 Alg. 1 lines 8-10) works on the mma accumulators, and P
// becomes the A operand of the P V product by packing accumulator pairs (the C and A fragment
// layouts agree on rows, so no shuffle is needed).
//
// Masks: the visible key range of the block bounds the loop (block skipping for causal and sliding
// windows); only tiles that cross a mask boundary or the sequence end pay per-element masking.
// Softcap and ALiBi are uniform runtime branches: they do not change the tensor-core loop, so they
// do not multiply the instantiations (../shared/STYLE.md).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/fwd_block.cuh"
#include "cuda/fwd_traits.hpp"
#include "cuda/kernel_utils.cuh"

namespace flashattn::cuda {

namespace fwd_detail {

// Copies a tile of `rows` x kHeadDim elements (row stride in elements) into swizzled shared memory;
// rows >= valid_rows and columns >= valid_cols are zero-filled.
template <int kRows, int kHeadDim, int kThreads, typename Storage>
__device__ __forceinline__ void load_tile(Storage* smem, const Storage* gmem, int64_t row_stride,
                                          int valid_rows, int valid_cols, const void* fallback) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowsPerIter = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowsPerIter == 0, "tile copy must divide evenly");
  // One 64-bit pointer stepped by a row block per iteration: per-iteration offsets would be
  // hoisted out of the key loop and held in registers (they spilled, ptxas -v).
  const int r0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const Storage* src = gmem + r0 * row_stride + c * 8;
  const int64_t step = kRowsPerIter * row_stride;
  const bool col_ok = c * 8 < valid_cols;
#pragma unroll
  for (int it = 0; it < kRows / kRowsPerIter; ++it) {
    const int r = r0 + it * kRowsPerIter;
    const bool pred = col_ok && r < valid_rows;
    cp_async_16(smem_addr(smem + swizzle_offset<kHeadDim>(r, c)), pred ? static_cast<const void*>(src) : fallback,
                pred);
    src += step;
  }
}

}  // namespace fwd_detail

template <typename Elem, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads) fwd_sm80_kernel(const __grid_constant__ FwdParams p) {
  using Storage = typename Elem::Storage;
  constexpr int D = Shape::kHeadDim, BM = Shape::kBlockM, BN = Shape::kBlockN, MT = Shape::kMTiles;
  constexpr int NT = Shape::kThreads;
  constexpr float kLn2 = 0.6931471805599453f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Storage* sQ = reinterpret_cast<Storage*>(smem_raw);
  Storage* sK = sQ + BM * D;
  Storage* sV = sK + BN * D;

  FwdBlock blk;
  if (!fwd_block<BM, BN>(p, blk)) return;  // varlen: this sequence is shorter than max_seqlen_q
  const int b = blk.b, h = blk.h, h_k = blk.h_k, m0 = blk.m0, len_q = blk.len_q, len_k = blk.len_k;
  const int64_t q_start = blk.q_start, k_start = blk.k_start, offset = blk.offset, last_row = blk.last_row;
  const int nb_min = blk.nb_min, nb_max = blk.nb_max;

  const Storage* q_ptr = static_cast<const Storage*>(p.q) + b * p.q_batch_stride +
                         (q_start + m0) * p.q_row_stride + h * p.q_head_stride;
  const Storage* k_ptr = static_cast<const Storage*>(p.k) + b * p.k_batch_stride +
                         k_start * p.k_row_stride + h_k * p.k_head_stride;
  const Storage* v_ptr = static_cast<const Storage*>(p.v) + b * p.v_batch_stride +
                         k_start * p.v_row_stride + h_k * p.v_head_stride;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  // ldmatrix row addresses. Every row a thread points ldmatrix at is ≡ lane (mod 8), and its
  // chunks are 8q + 2j + h with j = 0..3, so under the XOR swizzle (chunk c of row r at
  // (c & ~7) | ((c ^ r) & 7)) four base addresses per operand plus compile-time offsets cover
  // every fragment load: no per-load address arithmetic in the key loop.
  uint32_t q_addr[4], k_addr[4], v_addr[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int x = lane & 7;
    q_addr[j] = smem_addr(sQ + (warp * 16 + lane % 16) * D + (((2 * j + lane / 16) ^ x) << 3));
    k_addr[j] = smem_addr(sK + ((lane % 8) + (lane / 16) * 8) * D + (((2 * j + (lane / 8) % 2) ^ x) << 3));
    v_addr[j] = smem_addr(sV + ((lane % 8) + ((lane / 8) % 2) * 8) * D + (((2 * j + lane / 16) ^ x) << 3));
  }

  float o[MT][D / 8][4];
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  // With softcap or ALiBi the modifiers are applied to softmax_scale * qk, so the exponent's scale
  // is log2(e) alone; otherwise softmax_scale * log2(e) is folded into one FFMA per score. A
  // negative softmax_scale takes the first path too: the row max must be taken over the scaled
  // scores (max of raw scores times a negative scale is the minimum, and exp2 would overflow).
  const bool modified = p.softcap > 0.f || p.alibi_slopes != nullptr || p.softmax_scale < 0.f;
  const float scale_log2 = modified ? kLog2e : p.softmax_scale * kLog2e;
  const float slope = p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.f;

  if (nb_max > nb_min) {
    fwd_detail::load_tile<BM, D, NT>(sQ, q_ptr, p.q_row_stride, len_q - m0, p.head_dim, p.q);
    {
      const int n0 = (nb_max - 1) * BN;
      fwd_detail::load_tile<BN, D, NT>(sK, k_ptr + n0 * p.k_row_stride, p.k_row_stride, len_k - n0,
                                       p.head_dim, p.k);
    }
    cp_async_commit();

    for (int nb = nb_max - 1; nb >= nb_min; --nb) {
      const int n0 = nb * BN;
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;

      cp_async_wait<0>();
      __syncthreads();  // K(nb) (and Q) landed; every warp is done reading V(nb+1)
      fwd_detail::load_tile<BN, D, NT>(sV, v_ptr + n0 * p.v_row_stride, p.v_row_stride, len_k - n0,
                                       p.head_dim_v, p.v);
      cp_async_commit();

      // S = Q K(nb)ᵀ, in groups of 4 k-steps (64 columns of head_dim). kQKUnroll groups are
      // unrolled: fully unrolled at hdim 128 the compiler hoists every fragment and spills.
#pragma unroll Shape::kQKUnroll
      for (int kq = 0; kq < D / 64; ++kq) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], q_addr[j] + (mt * 64 * D + kq * 64) * 2);
#pragma unroll
          for (int np = 0; np < BN / 16; ++np) {
            uint32_t bk[4];
            ldmatrix_x4(bk, k_addr[j] + (np * 16 * D + kq * 64) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816<Elem>(s[mt][2 * np], a[mt], bk[0], bk[1]);
              mma_16816<Elem>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
            }
          }
        }
      }

      cp_async_wait<0>();
      __syncthreads();  // V(nb) landed; every warp is done reading K(nb)
      if (nb > nb_min) {
        const int n1 = (nb - 1) * BN;
        fwd_detail::load_tile<BN, D, NT>(sK, k_ptr + n1 * p.k_row_stride, p.k_row_stride, len_k - n1,
                                         p.head_dim, p.k);
        cp_async_commit();
      }

      // Score modifiers and the mask work on k = (col − row − offset) − d_base, a compile-time
      // constant per accumulator element, so each thread computes one int64 base per tile and
      // every element costs a few int32 compares. One branch-free loop per modifier keeps the
      // key loop's code small (per-element branches had grown it past the instruction cache).
      const int64_t d_base = n0 + 2 * t - (m0 + warp * 16 + g + offset);
      if (modified) {
        const float cap = p.softcap;
        if (cap > 0.f) {
          const float pre = p.softmax_scale / cap;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) s[mt][j][c] = cap * tanhf(s[mt][j][c] * pre);
        } else {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) s[mt][j][c] *= p.softmax_scale;
        }
        if (p.alibi_slopes != nullptr) {
          // ALiBi: −slope · |i + offset − j| = −slope · |d_base + k|; float(d_base) is exact
          // for |d_base| < 2^24 and within ALiBi's own float rounding beyond.
          const float base = float(d_base);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < BN / 8; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const int k = j * 8 + (c % 2) - mt * 64 - (c / 2) * 8;
                s[mt][j][c] -= slope * fabsf(base + float(k));
              }
        }
      }

      // Per-element masking only where the tile crosses the sequence end or a window edge.
      const bool need_mask = n0 + BN > len_k ||
                             (p.window_size_left >= 0 && n0 < last_row + offset - p.window_size_left) ||
                             (p.window_size_right >= 0 && n0 + BN - 1 > m0 + offset + p.window_size_right);
      // The rest of the tile is instantiated twice, with and without the mask, so that the
      // common unmasked tiles carry no compares (the compiler if-converted a plain branch).
      auto finish_tile = [&](auto masked) {
      if constexpr (decltype(masked)::value) {
        // Visible iff col < len_k, col − row − offset >= −window_size_left and <= window_size_right;
        // in terms of k: k < k_end, k >= k_lo, k <= k_hi. |k| < 2^8, so clamping the bounds to
        // ±2^20 keeps them exact in int32.
        constexpr int64_t kClamp = 1 << 20;
        auto clamp = [](int64_t x) { return int(x < -kClamp ? -kClamp : (x > kClamp ? kClamp : x)); };
        const int k_end = clamp(len_k - n0 - 2 * t);
        const int k_lo = p.window_size_left >= 0 ? clamp(-p.window_size_left - d_base) : -int(kClamp);
        const int k_hi = p.window_size_right >= 0 ? clamp(p.window_size_right - d_base) : int(kClamp);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int kc = j * 8 + (c % 2);                    // col − (n0 + 2t)
              const int k = kc - mt * 64 - (c / 2) * 8;          // (col − row − offset) − d_base
              if (kc >= k_end || k < k_lo || k > k_hi) s[mt][j][c] = -INFINITY;
            }
      }

      // Online softmax (FA-2 Alg. 1 lines 8-10): rescale O and the running sum by
      // exp(m_old − m_new); a row that has seen only masked keys keeps max −inf and uses 0 as
      // its exponent base so that exp2(−inf − base) = 0 instead of NaN.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float mx = row_max[mt][hr];
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hr], s[mt][j][2 * hr + 1]));
          mx = quad_max(mx);
          const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
          const float alpha = fast_exp2(row_max[mt][hr] * scale_log2 - base);
          row_max[mt][hr] = mx;
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const float p0 = fast_exp2(s[mt][j][2 * hr] * scale_log2 - base);
            const float p1 = fast_exp2(s[mt][j][2 * hr + 1] * scale_log2 - base);
            s[mt][j][2 * hr] = p0;
            s[mt][j][2 * hr + 1] = p1;
            sum += p0 + p1;
          }
          row_sum[mt][hr] = row_sum[mt][hr] * alpha + sum;
#pragma unroll
          for (int j = 0; j < D / 8; ++j) {
            o[mt][j][2 * hr] *= alpha;
            o[mt][j][2 * hr + 1] *= alpha;
          }
        }

      // O += P V(nb): accumulator pairs (2j, 2j+1) of S form the A fragment of key step j.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = pack2<Elem>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack2<Elem>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack2<Elem>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2<Elem>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, v_addr[dp % 4] + (kk * 16 * D + (dp / 4) * 64) * 2);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<Elem>(o[mt][2 * dp], pa[mt], bv[0], bv[1]);
            mma_16816<Elem>(o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
          }
        }
      }
      };
      if (need_mask) finish_tile(std::true_type{});
      else finish_tile(std::false_type{});
    }
  }

  // Epilogue: O / l and lse = ln l + m · scale. A row with no visible key has l = 0: out 0, lse −inf.
  // Each warp stages its own rows of O in its own rows of sQ (no other warp reads them), then
  // writes them out with 16-byte stores.
  Storage* out_ptr = static_cast<Storage*>(p.out) + b * p.o_batch_stride + (q_start + m0) * p.o_row_stride +
                     h * p.o_head_stride;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = quad_sum(row_sum[mt][hr]);
      // l = 0: no visible key (out 0, lse −inf); l NaN (a NaN score): out and lse NaN.
      const bool seen = !(l <= 0.f);
      const float inv = seen ? 1.f / l : 0.f;
      const int row = mt * 64 + warp * 16 + g + hr * 8;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const uint32_t packed = pack2<Elem>(o[mt][j][2 * hr] * inv, o[mt][j][2 * hr + 1] * inv);
        *reinterpret_cast<uint32_t*>(sQ + swizzle_offset<D>(row, j) + 2 * t) = packed;
      }
      if (p.lse != nullptr && t == 0 && m0 + row < len_q) {
        const float lse = seen ? (row_max[mt][hr] * scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + (q_start + m0 + row) * p.lse_row_stride] = lse;
      }
    }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int it = 0; it < 16 * kChunks / 32; ++it) {
      const int i = lane + it * 32;
      const int row = mt * 64 + warp * 16 + i / kChunks, c = i % kChunks;
      if (m0 + row < len_q && c * 8 < p.head_dim_v) {
        const uint4 val = *reinterpret_cast<const uint4*>(sQ + swizzle_offset<D>(row, c));
        *reinterpret_cast<uint4*>(out_ptr + row * p.o_row_stride + c * 8) = val;
      }
    }
}

template <typename Elem, typename Shape>
void launch_fwd_sm80_config(const FwdParams& p, int batch, int max_seqlen_q, void* stream) {
  auto kernel = fwd_sm80_kernel<Elem, Shape>;
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), Shape::kSmemBytes);
  const dim3 grid((max_seqlen_q + Shape::kBlockM - 1) / Shape::kBlockM, p.num_heads, batch);
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  FA_CUDA_CHECK(cudaGetLastError());
}

template <typename Elem, int kHeadDim>
void launch_fwd_sm80(const FwdParams& p, int batch, int max_seqlen_q, void* stream) {
  launch_fwd_sm80_config<Elem, typename FwdTraits<kHeadDim>::Config>(p, batch, max_seqlen_q, stream);
}

}  // namespace flashattn::cuda

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
// do not multiply the instantiations (STYLE.md).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_check.hpp"
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

template <typename Elem, int kHeadDim>
__global__ void __launch_bounds__(FwdShape<kHeadDim>::kThreads)
    fwd_sm80_kernel(const __grid_constant__ FwdParams p) {
  using Shape = FwdShape<kHeadDim>;
  using Storage = typename Elem::Storage;
  constexpr int D = kHeadDim, BM = Shape::kBlockM, BN = Shape::kBlockN, MT = Shape::kMTiles;
  constexpr int NT = Shape::kThreads;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Storage* sQ = reinterpret_cast<Storage*>(smem_raw);
  Storage* sK = sQ + BM * D;
  Storage* sV = sK + BN * D;

  // Heaviest query blocks first: under a causal mask the last blocks see the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  int64_t q_start = 0, k_start = 0;
  int len_q = p.seqlen_q, len_k = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    q_start = p.cu_seqlens_q[b];
    len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    k_start = p.cu_seqlens_k[b];
    len_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  }
  const int m0 = m_block * BM;
  if (m0 >= len_q) return;  // varlen: this sequence is shorter than max_seqlen_q
  const int h_k = h / p.head_ratio;

  const Storage* q_ptr = static_cast<const Storage*>(p.q) + b * p.q_batch_stride +
                         (q_start + m0) * p.q_row_stride + h * p.q_head_stride;
  const Storage* k_ptr = static_cast<const Storage*>(p.k) + b * p.k_batch_stride +
                         k_start * p.k_row_stride + h_k * p.k_head_stride;
  const Storage* v_ptr = static_cast<const Storage*>(p.v) + b * p.v_batch_stride +
                         k_start * p.v_row_stride + h_k * p.v_head_stride;

  // Visible keys of the whole block (params.hpp visible_keys over rows m0 .. last_row).
  const int64_t offset = p.align_bottom_right ? int64_t(len_k) - len_q : 0;
  const int64_t last_row = min(m0 + BM, len_q) - 1;
  int64_t key_lo = 0, key_hi = len_k;
  if (p.window_size_left >= 0) key_lo = max(key_lo, m0 + offset - p.window_size_left);
  if (p.window_size_right >= 0) key_hi = min(key_hi, last_row + offset + p.window_size_right + 1);
  const int nb_min = key_lo >= key_hi ? 0 : int(key_lo / BN);
  const int nb_max = key_lo >= key_hi ? 0 : int((key_hi + BN - 1) / BN);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

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
  // is log2(e) alone; otherwise softmax_scale * log2(e) is folded into one FFMA per score.
  const bool modified = p.softcap > 0.f || p.alibi_slopes != nullptr;
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

      // S = Q K(nb)ᵀ. The k-step loop only moves shared-memory addresses, so it stays rolled: fully
      // unrolled, the compiler hoists every step's fragments and spills (ptxas -v, hdim 128).
#pragma unroll 1
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(a[mt], smem_addr(sQ + swizzle_offset<D>(mt * 64 + warp * 16 + (lane % 16),
                                                              ks * 2 + lane / 16)));
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t bk[4];
          ldmatrix_x4(bk, smem_addr(sK + swizzle_offset<D>(np * 16 + (lane % 8) + (lane / 16) * 8,
                                                           ks * 2 + (lane / 8) % 2)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<Elem>(s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_16816<Elem>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
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

      // Score modifiers: softcap · tanh(scale · s / softcap), then ALiBi's −slope · |i + offset − j|.
      if (modified) {
        const float cap = p.softcap;
        const float pre = cap > 0.f ? p.softmax_scale / cap : p.softmax_scale;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              float x = s[mt][j][c] * pre;
              if (cap > 0.f) x = cap * tanhf(x);
              if (p.alibi_slopes != nullptr) {
                const int64_t row = m0 + mt * 64 + warp * 16 + g + (c / 2) * 8;
                const int64_t col = n0 + j * 8 + 2 * t + (c % 2);
                x -= slope * float(llabs(row + offset - col));
              }
              s[mt][j][c] = x;
            }
      }

      // Per-element masking only where the tile crosses the sequence end or a window edge.
      const bool need_mask = n0 + BN > len_k ||
                             (p.window_size_left >= 0 && n0 < last_row + offset - p.window_size_left) ||
                             (p.window_size_right >= 0 && n0 + BN - 1 > m0 + offset + p.window_size_right);
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const int64_t row = m0 + mt * 64 + warp * 16 + g + (c / 2) * 8;
              const int64_t col = n0 + j * 8 + 2 * t + (c % 2);
              const bool visible =
                  col < len_k &&
                  (p.window_size_left < 0 || col >= row + offset - p.window_size_left) &&
                  (p.window_size_right < 0 || col <= row + offset + p.window_size_right);
              if (!visible) s[mt][j][c] = -INFINITY;
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
          ldmatrix_x4_trans(bv, smem_addr(sV + swizzle_offset<D>(kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8,
                                                                 dp * 2 + lane / 16)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<Elem>(o[mt][2 * dp], pa[mt], bv[0], bv[1]);
            mma_16816<Elem>(o[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
          }
        }
      }
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
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = mt * 64 + warp * 16 + g + hr * 8;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const uint32_t packed = pack2<Elem>(o[mt][j][2 * hr] * inv, o[mt][j][2 * hr + 1] * inv);
        *reinterpret_cast<uint32_t*>(sQ + swizzle_offset<D>(row, j) + 2 * t) = packed;
      }
      if (p.lse != nullptr && t == 0 && m0 + row < len_q) {
        const float lse = l > 0.f ? (row_max[mt][hr] * scale_log2 + __log2f(l)) * kLn2 : -INFINITY;
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

template <typename Elem, int kHeadDim>
void launch_fwd_sm80(const FwdParams& p, int batch, int max_seqlen_q, void* stream) {
  using Shape = FwdShape<kHeadDim>;
  auto kernel = fwd_sm80_kernel<Elem, kHeadDim>;
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes));
  const dim3 grid((max_seqlen_q + Shape::kBlockM - 1) / Shape::kBlockM, p.num_heads, batch);
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, static_cast<cudaStream_t>(stream)>>>(p);
  FA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashattn::cuda

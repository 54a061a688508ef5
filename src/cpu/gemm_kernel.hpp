// The one matrix-product shape every CPU attention GEMM is written in:
//
//   C[r][l] (op)= Σ_{k < depth} A(r, k) · B[k][l]      r < rows, l < lanes (a multiple of 16)
//
// A is read element by element and broadcast (A(r, k) = a[r·a_rs + k·a_ks], any strides, so K
// and V tiles serve as A in their natural row layout, and so do Pᵀ, dSᵀ), B and C are row-major
// with vector rows. Writing attention in this form (S = Q Kᵀ as Sᵀ = K Qᵀ, O = P V as
// Oᵀ = Vᵀ Pᵀ, ...) means the only transposes are once per work item, never per tile pair.
//
// Why not Eigen here: Eigen 3.4's gebp uses a 48x4 register block on AVX-512 (12 of 32 zmm
// registers) and repacks both operands on every call; profiled on this machine it spent 19% of
// the forward in packing and reached ~53% of the fp32 FMA peak. The R x C block below keeps
// R·C accumulators in registers, loads C vectors of B and broadcasts R scalars of A per step.
#pragma once

#include <cstdint>

#include "cpu/simd.hpp"

// Builds without AVX-512 also carry an AVX2 + FMA version of the products (avx2:: below; why and
// when it runs: simd.hpp, FLASHATTN_CPU_AVX2).

namespace flashattn::cpu::gemm {

enum class Op {
  store,  // C = A·B
  add,    // C += A·B
  scale,  // C = diag(scale over lanes) · C + A·B (the online softmax rescale, FA-2 Alg. 1 line 10)
};

// Register block: kR rows x kC vectors (16 lanes each) = 16 accumulators of 32 zmm registers.
// 8 x 2 keeps the loads per step (2 vector + 8 broadcast) under the 2 FMAs/cycle x 8 cycles it
// feeds, and divides the usual tile edges (64, 128) exactly. In isolation (L1/L2-resident
// operands) 8x2 ran at 87-97% of peak, 8x3 and 6x4 at 93-100%, 4x4 and 4x3 at 52-65%; inside the
// forward 8x2, 8x3 and 6x4 measured the same (the products there wait on L2, not on registers).
inline constexpr int kR = 8;
inline constexpr int kC = 2;

template <int R, int C, Op op>
inline void micro_kernel(const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t b_rs, int64_t depth,
                         float* c, int64_t c_rs, const float* scale) {
  using namespace simd;
  V16 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) acc[r][j] = zero();
  for (int64_t k = 0; k < depth; ++k) {
    V16 bv[C];
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) bv[j] = load(b + k * b_rs + j * kLanes);
    const float* ak = a + k * a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V16 av = bcast(ak[r * a_rs]);
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) acc[r][j] = fmadd(av, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) {
      float* cp = c + r * c_rs + j * kLanes;
      if constexpr (op == Op::store) {
        store(cp, acc[r][j]);
      } else if constexpr (op == Op::add) {
        store(cp, add(load(cp), acc[r][j]));
      } else {
        store(cp, fmadd(load(scale + j * kLanes), load(cp), acc[r][j]));
      }
    }
  }
}

// The vecs - v < C vectors left of a row block after its full kC panels.
template <int R, Op op, int C = kC - 1>
inline void tail_vecs(int64_t left, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t b_rs,
                      int64_t depth, float* c, int64_t c_rs, const float* scale) {
  if constexpr (C >= 1) {
    if (left == C) {
      micro_kernel<R, C, op>(a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
      return;
    }
    tail_vecs<R, op, C - 1>(left, a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
  }
}

template <int R, Op op>
inline void row_block(int64_t vecs, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t b_rs,
                      int64_t depth, float* c, int64_t c_rs, const float* scale) {
  int64_t v = 0;
  for (; v + kC <= vecs; v += kC)
    micro_kernel<R, kC, op>(a, a_rs, a_ks, b + v * simd::kLanes, b_rs, depth, c + v * simd::kLanes, c_rs,
                            scale ? scale + v * simd::kLanes : nullptr);
  if (v < vecs)
    tail_vecs<R, op>(vecs - v, a, a_rs, a_ks, b + v * simd::kLanes, b_rs, depth, c + v * simd::kLanes, c_rs,
                     scale ? scale + v * simd::kLanes : nullptr);
}

template <Op op, int R = kR>
inline void tail_rows(int64_t left, int64_t vecs, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                      int64_t b_rs, int64_t depth, float* c, int64_t c_rs, const float* scale) {
  if constexpr (R > 1) {
    if (left == R - 1) {
      row_block<R - 1, op>(vecs, a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
      return;
    }
    tail_rows<op, R - 1>(left, vecs, a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
  }
}

struct NoHook {
  void operator()(int64_t, int64_t) const {}
};

#ifdef FLASHATTN_CPU_AVX2
namespace avx2 {

// R rows x 2 ymm registers (one 16-lane vector): 12 accumulators of AVX2's 16 registers at R = 6,
// next to the 2 loads of B and a broadcast of A per step.
inline constexpr int kR = 6;

template <int R, Op op>
FLASHATTN_AVX2 inline void micro_kernel(const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t b_rs,
                                        int64_t depth, float* c, int64_t c_rs, const float* scale) {
  // (The row loops are unrolled by pragma: unrolled only later, as GCC did, acc stayed an array in
  // memory and every step stored all 12 accumulators to the stack.)
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < depth; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * b_rs), b1 = _mm256_loadu_ps(b + k * b_rs + 8);
    const float* ak = a + k * a_ks;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(ak + r * a_rs);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      float* cp = c + r * c_rs + 8 * j;
      if constexpr (op == Op::store) {
        _mm256_storeu_ps(cp, acc[r][j]);
      } else if constexpr (op == Op::add) {
        _mm256_storeu_ps(cp, _mm256_add_ps(_mm256_loadu_ps(cp), acc[r][j]));
      } else {
        _mm256_storeu_ps(cp, _mm256_fmadd_ps(_mm256_loadu_ps(scale + 8 * j), _mm256_loadu_ps(cp), acc[r][j]));
      }
    }
  }
}

template <Op op, int R = kR>
FLASHATTN_AVX2 inline void tail_rows(int64_t left, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                                     int64_t b_rs, int64_t depth, float* c, int64_t c_rs, const float* scale) {
  if constexpr (R > 1) {
    if (left == R - 1) {
      micro_kernel<R - 1, op>(a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
      return;
    }
    tail_rows<op, R - 1>(left, a, a_rs, a_ks, b, b_rs, depth, c, c_rs, scale);
  }
}

// gemm() below for AVX2: one 16-lane vector of columns per panel, row blocks of kR.
template <Op op, class Hook>
FLASHATTN_AVX2 void gemm(int64_t rows, int64_t lanes, int64_t depth, const float* a, int64_t a_rs, int64_t a_ks,
                         const float* b, int64_t b_rs, float* c, int64_t c_rs, const float* scale, const Hook& hook) {
  const int64_t vecs = lanes / simd::kLanes, blocks = (rows + kR - 1) / kR;
  int64_t step = 0;
  for (int64_t v = 0; v < vecs; ++v) {
    const int64_t off = v * simd::kLanes;
    const float* sc = scale ? scale + off : nullptr;
    int64_t r = 0;
    for (; r + kR <= rows; r += kR) {
      hook(step++, vecs * blocks);
      micro_kernel<kR, op>(a + r * a_rs, a_rs, a_ks, b + off, b_rs, depth, c + r * c_rs + off, c_rs, sc);
    }
    if (r < rows) {
      hook(step++, vecs * blocks);
      tail_rows<op>(rows - r, a + r * a_rs, a_rs, a_ks, b + off, b_rs, depth, c + r * c_rs + off, c_rs, sc);
    }
  }
}

}  // namespace avx2
#endif

// C (rows x lanes, row stride c_rs) op= A (rows x depth, strides a_rs, a_ks) · B (depth x lanes,
// row stride b_rs). lanes must be a multiple of 16; scale (lanes floats) is read only for Op::scale.
// Lane panels run in the outer loop so that a B panel (depth x kC vectors) stays in L1 while
// every row block of A streams past it. hook(step, steps) runs before each of the `steps` row
// blocks: the callers spread their prefetches of the next tile over it.
template <Op op, class Hook = NoHook>
inline void gemm(int64_t rows, int64_t lanes, int64_t depth, const float* a, int64_t a_rs, int64_t a_ks,
                 const float* b, int64_t b_rs, float* c, int64_t c_rs, const float* scale = nullptr,
                 const Hook& hook = Hook()) {
#ifdef FLASHATTN_CPU_AVX2
  if (simd::avx2::use()) {
    avx2::gemm<op>(rows, lanes, depth, a, a_rs, a_ks, b, b_rs, c, c_rs, scale, hook);
    return;
  }
#endif
  const int64_t vecs = lanes / simd::kLanes;
  const int64_t panels = (vecs + kC - 1) / kC, blocks = (rows + kR - 1) / kR;
  int64_t step = 0;
  for (int64_t v0 = 0; v0 < vecs; v0 += kC) {
    const int64_t pv = std::min<int64_t>(kC, vecs - v0);
    const int64_t off = v0 * simd::kLanes;
    const float* sc = scale ? scale + off : nullptr;
    int64_t r = 0;
    for (; r + kR <= rows; r += kR) {
      hook(step++, panels * blocks);
      row_block<kR, op>(pv, a + r * a_rs, a_rs, a_ks, b + off, b_rs, depth, c + r * c_rs + off, c_rs, sc);
    }
    if (r < rows) {
      hook(step++, panels * blocks);
      tail_rows<op>(rows - r, pv, a + r * a_rs, a_rs, a_ks, b + off, b_rs, depth, c + r * c_rs + off, c_rs, sc);
    }
  }
}

}  // namespace flashattn::cpu::gemm

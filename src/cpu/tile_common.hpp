// Pieces shared by the CPU forward and backward: strided tile access in any dtype, Eigen views,
// the score policy (scale, softcap, ALiBi, mask) applied to one score tile, and the key/query
// ranges a tile needs (from visible_keys(), the single mask definition).
#pragma once

// The CPU backend parallelizes over tiles itself; Eigen must never spawn threads of its own.
#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif

#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "cpu/simd.hpp"

namespace flashattn::cpu::tiled {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Tile = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstTile = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

inline Tile tile(float* data, int64_t rows, int64_t cols, int64_t ld) {
  return Tile(data, rows, cols, Eigen::OuterStride<>(ld));
}
inline ConstTile ctile(const float* data, int64_t rows, int64_t cols, int64_t ld) {
  return ConstTile(data, rows, cols, Eigen::OuterStride<>(ld));
}

inline int num_threads(const detail::Params& p) {
  return p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
}

// One strided [rows, dim] operand of one (batch, head): base points at row 0 of the sequence.
struct Operand {
  const char* base;
  int64_t row_stride;  // elements
  int64_t elem_size;

  const void* row(int64_t r) const { return base + r * row_stride * elem_size; }
};

inline Operand operand(const detail::Params& p, const void* data, int64_t batch_stride, int64_t row_stride,
                       int64_t head_stride, int64_t b, int64_t row_start, int64_t head) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  const int64_t off = b * batch_stride + row_start * row_stride + head * head_stride;
  return {static_cast<const char*>(data) + off * es, row_stride, es};
}

// A tile of `rows` rows starting at row r0, as fp32 with leading dimension ld. fp32 operands
// without a multiplier are read in place (Eigen packs strided panels itself); others are
// converted into `buf` (rows x dim, ld = dim).
struct TileView {
  const float* data;
  int64_t ld;
};
inline TileView load_tile(DType dt, const Operand& src, int64_t r0, int64_t rows, int64_t dim, float* buf,
                          float mult = 1.0f, bool allow_in_place = true) {
  if (dt == DType::f32 && mult == 1.0f && allow_in_place)
    return {static_cast<const float*>(src.row(r0)), src.row_stride};
  for (int64_t r = 0; r < rows; ++r) simd::load_row(dt, src.row(r0 + r), buf + r * dim, dim, mult);
  return {buf, dim};
}

// Per-sequence geometry.
struct Seq {
  int64_t b, q_start, k_start, len_q, len_k;
};
inline Seq sequence(const detail::Params& p, int64_t b) {
  return {b, p.q_start(b), p.k_start(b), p.q_len(b), p.k_len(b)};
}

// How raw products Q·Kᵀ become log2-domain logits s2 = S · log2(e), so that P = exp2(s2 − m):
//   no softcap: s2 = raw · s_mult                       (s_mult · q_mult = softmax_scale · log2 e)
//   softcap:    t = tanh(raw · s_mult), s2 = t · cap2    (s_mult · q_mult = softmax_scale / softcap)
//   ALiBi adds −slope · |i + offset − j| · log2 e; masked entries become −inf.
// The forward folds the scale into its Q tile (q_mult), the backward keeps Q unscaled for dK.
struct ScorePolicy {
  float q_mult = 1.0f;
  float s_mult = 1.0f;
  float cap2 = 0.0f;    // softcap · log2 e, 0 = off
  float slope2 = 0.0f;  // ALiBi slope · log2 e of this (batch, head), 0 = off
  bool alibi = false;
};

inline ScorePolicy score_policy(const detail::Params& p, int64_t b, int64_t h, bool scale_q) {
  ScorePolicy sp;
  const float total = p.softcap > 0.0f ? p.softmax_scale / p.softcap : p.softmax_scale * kLog2e;
  if (scale_q) sp.q_mult = total; else sp.s_mult = total;
  if (p.softcap > 0.0f) sp.cap2 = p.softcap * kLog2e;
  if (p.alibi_slopes) {
    sp.alibi = true;
    sp.slope2 = p.alibi_slopes[b * p.alibi_batch_stride + h] * kLog2e;
  }
  return sp;
}

// True when every (row, key) pair of the tile is visible (no masking needed). visible_keys()
// bounds are nondecreasing in the row, so the extreme rows decide.
inline bool tile_fully_visible(const detail::Params& p, const Seq& sq, int64_t m0, int64_t mr, int64_t n0,
                               int64_t nc) {
  const detail::KeyRange first = detail::visible_keys(p, m0, sq.len_q, sq.len_k);
  const detail::KeyRange last = detail::visible_keys(p, m0 + mr - 1, sq.len_q, sq.len_k);
  return last.lo <= n0 && first.hi >= n0 + nc && first.lo < first.hi;
}

// Applies the score policy to the tile S (rows m0.., keys n0..), in place. tanh_out (ld as S)
// receives t when softcap is on and tanh_out != nullptr (the backward's chain rule).
inline void finish_scores(const detail::Params& p, const Seq& sq, const ScorePolicy& sp, int64_t m0, int64_t mr,
                          int64_t n0, int64_t nc, float* s, int64_t lds, float* tanh_out, bool mask) {
  const bool scale = sp.s_mult != 1.0f;
  if (!scale && sp.cap2 == 0.0f && !sp.alibi && !mask) return;
  const int64_t offset = p.align_bottom_right ? sq.len_k - sq.len_q : 0;
  for (int64_t r = 0; r < mr; ++r) {
    float* row = s + r * lds;
    if (sp.cap2 > 0.0f) {
      Eigen::Map<Eigen::ArrayXf> a(row, nc);
      a = (a * sp.s_mult).tanh();
      if (tanh_out) Eigen::Map<Eigen::ArrayXf>(tanh_out + r * lds, nc) = a;
      a *= sp.cap2;
    } else if (scale) {
      Eigen::Map<Eigen::ArrayXf>(row, nc) *= sp.s_mult;
    }
    const int64_t i = m0 + r;
    if (sp.alibi) {
      // |i + offset − j| in float is exact below 2^24 (sequence lengths are far smaller).
      const float diag = static_cast<float>(i + offset - n0);
      const float sl = sp.slope2;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) row[j] -= sl * std::fabs(diag - static_cast<float>(j));
    }
    if (mask) {
      const detail::KeyRange kr = detail::visible_keys(p, i, sq.len_q, sq.len_k);
      const int64_t lo = std::clamp<int64_t>(kr.lo - n0, 0, nc);
      const int64_t hi = std::clamp<int64_t>(kr.hi - n0, lo, nc);
      std::fill(row, row + lo, simd::kNegInf);
      std::fill(row + hi, row + nc, simd::kNegInf);
    }
  }
}

// Key range [lo, hi) touched by query rows [m0, m0 + mr).
inline detail::KeyRange tile_key_range(const detail::Params& p, const Seq& sq, int64_t m0, int64_t mr) {
  // An empty row's range may lie past len_k (visible_keys() sets hi = lo), so clamp both ends.
  const int64_t lo = std::min(detail::visible_keys(p, m0, sq.len_q, sq.len_k).lo, sq.len_k);
  const int64_t hi = detail::visible_keys(p, m0 + mr - 1, sq.len_q, sq.len_k).hi;
  return {lo, std::clamp(hi, lo, sq.len_k)};
}

// Query rows [lo, hi) that can see any key of [n0, n0 + nc): contiguous because visible_keys()
// bounds are nondecreasing in the row; found by binary search.
inline detail::KeyRange tile_query_range(const detail::Params& p, const Seq& sq, int64_t n0, int64_t nc) {
  int64_t a = 0, z = sq.len_q;  // first row with hi > n0
  while (a < z) {
    const int64_t mid = a + (z - a) / 2;
    if (detail::visible_keys(p, mid, sq.len_q, sq.len_k).hi > n0) z = mid; else a = mid + 1;
  }
  const int64_t lo = a;
  z = sq.len_q;  // first row with lo >= n0 + nc
  while (a < z) {
    const int64_t mid = a + (z - a) / 2;
    if (detail::visible_keys(p, mid, sq.len_q, sq.len_k).lo >= n0 + nc) z = mid; else a = mid + 1;
  }
  return {lo, a};
}

// Work item: one (batch, head, row tile); head is a query head or a KV head depending on the pass.
struct WorkItem {
  int64_t b, h, r0;
};

// All (batch, head, tile) items, tile rows taken from seqlen_q (use_q) or seqlen_k, in
// (batch, head, tile) order so that neighbouring items share K/V (or Q) in cache.
inline std::vector<WorkItem> work_items(const detail::Params& p, int64_t heads, int64_t block, bool use_q) {
  std::vector<WorkItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = use_q ? p.q_len(b) : p.k_len(b);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r0 = 0; r0 < len; r0 += block) items.push_back({b, h, r0});
  }
  return items;
}

}  // namespace flashattn::cpu::tiled

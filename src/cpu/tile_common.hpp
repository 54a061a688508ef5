// Pieces shared by the CPU forward and backward: strided operand access in any dtype, tile
// copies and transposes into padded fp32 buffers, the score policy (scale, softcap, ALiBi, mask)
// applied to a score tile in either orientation, and the key/query ranges a tile needs (from
// visible_keys(), the single mask definition).
#pragma once

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/params.hpp"
#include "cpu/simd.hpp"

namespace flashattn::cpu::tiled {

inline constexpr float kLog2e = 1.4426950408889634f;

// Threads a pass runs with, for `work_items` independent items: the request (0 = OpenMP's
// default), but at most one per item (a thread without an item only costs memory) and at most 4
// per processor. Above the processor count threads only time-share cores, while every thread
// costs its scratch and, in the backward, 2 dQ buffers of a whole (batch, KV head) group: an
// uncapped num_threads = 4096 on a 16-token problem took 2.5 GB and 3 s. The factor 4 (not 1)
// keeps deliberate oversubscription possible, e.g. to reproduce the backward's summation order,
// which depends on the thread count, from a larger machine. Never less than 1.
inline int effective_threads(const detail::Params& p, int64_t work_items) {
  const int64_t requested = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  const int64_t cap = 4 * static_cast<int64_t>(std::max(1, omp_get_num_procs()));
  return static_cast<int>(std::max<int64_t>(1, std::min({requested, work_items, cap})));
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

struct NoPrefetch {
  void operator()(int64_t, int64_t) const {}
};

// Rows [r0, r0 + rows) of an operand as fp32, converted (or, for fp32, copied) into buf with
// leading dimension dim. The copy matters for fp32 too: a [batch, seqlen, heads, dim] tensor puts
// consecutive rows heads·dim·4 bytes apart (e.g. 2 KiB), which maps a whole key tile onto a few
// L1 sets, and Oᵀ += Vᵀ Pᵀ walks down all of its rows in every step: read in place, V missed L1
// on every step (the P·V product took 25% longer than Q·Kᵀ); K read in place measured the same
// as copied or up to 2% slower.
struct RowsF32 {
  const float* data;
  int64_t ld;
};
inline RowsF32 rows_f32(DType dt, const Operand& src, int64_t r0, int64_t rows, int64_t dim, float* buf) {
  for (int64_t r = 0; r < rows; ++r) simd::load_row(dt, src.row(r0 + r), buf + r * dim, dim, 1.0f);
  return {buf, dim};
}

// Brings the rows of the next tile into L2 while the current tile is computed, one slice per
// row block of a product (the gemm() hook) so that the requests never queue up in a burst. Each
// strided row starts a new stream that the hardware prefetchers pick up too late: without this
// the K/V tile copies stalled on L3 for ~20% of the forward (perf samples on this machine), and
// prefetching a whole tile at once stalled on full fill buffers instead.
struct PrefetchNext {
  const Operand* ops[2];
  int64_t dims[2];
  int64_t r0 = 0, rows = 0;  // rows of the next tile; rows = 0: nothing to fetch

  void operator()(int64_t step, int64_t steps) const {
    const int64_t lo = rows * step / steps, hi = rows * (step + 1) / steps;
    for (int o = 0; o < 2; ++o) {
      const int64_t bytes = dims[o] * ops[o]->elem_size;
      for (int64_t r = lo; r < hi; ++r) {
        const char* row = static_cast<const char*>(ops[o]->row(r0 + r));
        for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(row + c, 0, 2);
      }
    }
  }
};

// dst[r][x] = mult · src[r0 + r][x] for x < dim, 0 for dim <= x < ld (a padded row-major copy).
inline void copy_rows_padded(DType dt, const Operand& src, int64_t r0, int64_t rows, int64_t dim, float* dst,
                             int64_t ld, float mult = 1.0f) {
  for (int64_t r = 0; r < rows; ++r) {
    simd::load_row(dt, src.row(r0 + r), dst + r * ld, dim, mult);
    std::fill(dst + r * ld + dim, dst + (r + 1) * ld, 0.0f);
  }
}

// dst[x][r] = mult · src[r0 + r][x] for r < rows, 0 for rows <= r < ld (a padded transpose).
// Done once per work item, so a scalar scatter is cheap next to the item's products.
// hook(r, rows) runs before each row (callers prefetch their first tile there).
template <class Hook = NoPrefetch>
inline void transpose_rows_padded(DType dt, const Operand& src, int64_t r0, int64_t rows, int64_t dim,
                                  float* dst, int64_t ld, float mult, float* tmp, const Hook& hook = Hook()) {
  const int64_t bytes = dim * src.elem_size;
  for (int64_t r = 0; r < rows; ++r) {
    if (r + 8 < rows) {  // strided rows: fetch ahead, the hardware prefetchers do not
      const char* ahead = static_cast<const char*>(src.row(r0 + r + 8));
      for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(ahead + c, 0, 3);
    }
    hook(r, rows);
    simd::load_row(dt, src.row(r0 + r), tmp, dim, mult);
    for (int64_t x = 0; x < dim; ++x) dst[x * ld + r] = tmp[x];
  }
  for (int64_t x = 0; x < dim; ++x) std::fill(dst + x * ld + rows, dst + (x + 1) * ld, 0.0f);
}

// Per-sequence geometry.
struct Seq {
  int64_t b, q_start, k_start, len_q, len_k;
};
inline Seq sequence(const detail::Params& p, int64_t b) {
  return {b, p.q_start(b), p.k_start(b), p.q_len(b), p.k_len(b)};
}

// How products of a scaled Q tile (q_mult · Q) with K become the scores S (natural units):
//   no softcap: S = raw                     (q_mult = softmax_scale)
//   softcap:    t = tanh(raw), S = t · cap   (q_mult = softmax_scale / softcap)
//   ALiBi adds −slope · |i + offset − j|; masked entries become −inf.
// Both passes fold the scale into their Q tile, so that the backward recomputes the forward's S
// bit for bit (see bwd_item); the backward's dK takes softmax_scale / q_mult in exchange.
// Scores stay in natural units (P = exp2((S − m) · log2 e), one multiply more per score than
// folding log2 e into Q): then lse = m + ln l is rounded once from the row max itself, and
// S − lse in the backward is exact where P matters. Scores in log2 units need lse = (m2 +
// log2 l) · ln 2, a rounding of its own of half an ulp of |lse|, which at |lse| ~ 2000 put the
// backward's P of a dominated row off by 7e-5 relative (3x over the fp32 criterion).
struct ScorePolicy {
  float q_mult = 1.0f;
  float cap = 0.0f;     // softcap, 0 = off
  float slope = 0.0f;   // ALiBi slope of this (batch, head)
  bool alibi = false;
  int64_t offset = 0;   // i + offset − j is the distance to the diagonal
};

inline ScorePolicy score_policy(const detail::Params& p, const struct Seq& sq, int64_t h) {
  ScorePolicy sp;
  sp.q_mult = p.softcap > 0.0f ? p.softmax_scale / p.softcap : p.softmax_scale;
  if (p.softcap > 0.0f) sp.cap = p.softcap;
  if (p.alibi_slopes) {
    sp.alibi = true;
    sp.slope = p.alibi_slopes[sq.b * p.alibi_batch_stride + h];
  }
  sp.offset = p.align_bottom_right ? sq.len_k - sq.len_q : 0;
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

// Softcap over a whole contiguous tile of n floats; t receives tanh when softcap is on and
// t != nullptr (the backward's chain rule). Eigen's tanh is vectorized.
inline void apply_softcap(const ScorePolicy& sp, float* s, int64_t n, float* t) {
  if (sp.cap <= 0.0f) return;
  Eigen::Map<Eigen::ArrayXf> a(s, n);
  a = a.tanh();
  if (t) Eigen::Map<Eigen::ArrayXf>(t, n) = a;
  a *= sp.cap;
}

// Natural orientation: row r is query m0 + r, lane j is key n0 + j (nc valid of np lanes; the
// padding lanes become −inf so that P = 0 there). s has row stride np.
inline void finish_natural(const detail::Params& p, const Seq& sq, const ScorePolicy& sp, int64_t m0, int64_t mr,
                           int64_t n0, int64_t nc, int64_t np, float* s, float* t, bool mask) {
  apply_softcap(sp, s, mr * np, t);
  for (int64_t r = 0; r < mr; ++r) {
    float* row = s + r * np;
    if (sp.alibi) {
      // |i + offset − j| in float is exact below 2^24 (sequence lengths are far smaller).
      const float diag = static_cast<float>(m0 + r + sp.offset - n0);
      const float sl = sp.slope;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) row[j] -= sl * std::fabs(diag - static_cast<float>(j));
    }
    int64_t lo = 0, hi = nc;
    if (mask) {
      const detail::KeyRange kr = detail::visible_keys(p, m0 + r, sq.len_q, sq.len_k);
      lo = std::clamp<int64_t>(kr.lo - n0, 0, nc);
      hi = std::clamp<int64_t>(kr.hi - n0, lo, nc);
    }
    std::fill(row, row + lo, simd::kNegInf);
    std::fill(row + hi, row + np, simd::kNegInf);
  }
}

// Transposed orientation: row r is key n0 + r, lane l is query m0 + l (row stride w). Only lanes
// [la, lb) are touched; lanes >= mr are padding. kr[l] are the lanes' visible key ranges. In a
// masked tile every touched lane outside a key's visible lanes, padding included, becomes −inf.
inline void finish_transposed(const ScorePolicy& sp, int64_t m0, int64_t mr, int64_t w, int64_t la, int64_t lb,
                              int64_t n0, int64_t nc, float* s, const detail::KeyRange* kr, bool mask) {
  int64_t a = la, z = la;  // lanes [a, z) see the current key (bounds nondecreasing in the lane)
  for (int64_t r = 0; r < nc; ++r) {
    float* row = s + r * w;
    apply_softcap(sp, row + la, lb - la, nullptr);
    const int64_t key = n0 + r;
    if (sp.alibi) {
      const float diag = static_cast<float>(m0 + sp.offset - key);
      const float sl = sp.slope;
#pragma omp simd
      for (int64_t l = la; l < lb; ++l) row[l] -= sl * std::fabs(diag + static_cast<float>(l));
    }
    if (mask) {
      while (a < mr && kr[a].hi <= key) ++a;
      while (z < mr && kr[z].lo <= key) ++z;
      const int64_t lo = std::min(a, lb), hi = std::clamp(z, lo, lb);
      std::fill(row + la, row + lo, simd::kNegInf);
      std::fill(row + hi, row + lb, simd::kNegInf);
    }
  }
}

// Lanes [lo, hi) of a query tile (kr[0..mr), nondecreasing bounds) that see any key of
// [n0, n0 + nc), widened to whole vectors.
inline detail::KeyRange active_lanes(const detail::KeyRange* kr, int64_t mr, int64_t n0, int64_t nc) {
  int64_t lo = 0, hi = mr;
  while (lo < mr && kr[lo].hi <= n0) ++lo;
  while (hi > lo && kr[hi - 1].lo >= n0 + nc) --hi;
  if (lo >= hi) return {0, 0};
  return {lo / simd::kLanes * simd::kLanes, simd::round_up(hi, simd::kLanes)};
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

// All (batch, head, tile) items, tiles over seqlen_q (use_q) or seqlen_k, in (batch, head, tile)
// order so that neighbouring items share K/V (or Q) in cache.
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

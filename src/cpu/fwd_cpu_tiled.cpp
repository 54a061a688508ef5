// CPU forward: tiled FlashAttention-2 (Dao 2023, Alg. 1) with an online softmax.
//
// One work item is (batch, query head, block_m query rows). It walks only the key tiles that the
// mask lets its rows see (tile_key_range()), computes S = Q Kᵀ with Eigen into a thread-local
// fp32 tile, turns it into log2-domain logits (scale folded into Q, softcap, ALiBi, mask),
// updates the running row max m and sum l, rescales the output accumulator by exp2(m_old − m_new)
// (Alg. 1 lines 8–10) and accumulates O += P V with Eigen. fp16/bf16 tiles are converted to fp32
// per tile; accumulation is always fp32. Items are independent, so the result does not depend on
// the thread count or schedule (dynamic scheduling balances causal/varlen work).
#include <string>

#include "common/backends.hpp"
#include "cpu/tile_common.hpp"
#include "cpu/tile_traits.hpp"

namespace flashattn::cpu {

namespace {

using namespace tiled;

struct FwdScratch {
  std::vector<float> q, k, v, s, o, m, l;
  FwdScratch(int64_t bm, int64_t bn, int64_t d, int64_t dv)
      : q(bm * d), k(bn * d), v(bn * dv), s(bm * bn), o(bm * dv), m(bm), l(bm) {}
};

void forward_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, FwdScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, bn = ts.block_n;
  const Seq sq = sequence(p, it.b);
  const int64_t h = it.h, kvh = h / (p.num_heads / p.num_heads_k);
  const int64_t m0 = it.r0, mr = std::min(ts.block_m, sq.len_q - m0);
  const ScorePolicy sp = score_policy(p, it.b, h, /*scale_q=*/true);

  const Operand q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, it.b, sq.q_start, h);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);

  const TileView qt = load_tile(p.dtype, q, m0, mr, d, w.q.data(), sp.q_mult, /*allow_in_place=*/false);
  const ConstTile qm = ctile(qt.data, mr, d, qt.ld);
  Tile o = tile(w.o.data(), mr, dv, dv);
  o.setZero();
  float* m = w.m.data();
  float* l = w.l.data();
  std::fill(m, m + mr, simd::kNegInf);
  std::fill(l, l + mr, 0.0f);

  const detail::KeyRange keys = tile_key_range(p, sq, m0, mr);
  for (int64_t n0 = keys.lo; n0 < keys.hi; n0 += bn) {
    const int64_t nc = std::min(bn, keys.hi - n0);
    const TileView kt = load_tile(p.dtype, k, n0, nc, d, w.k.data());
    const TileView vt = load_tile(p.dtype, v, n0, nc, dv, w.v.data());
    Tile s = tile(w.s.data(), mr, nc, bn);
    s.noalias() = qm * ctile(kt.data, nc, d, kt.ld).transpose();
    const bool mask = !tile_fully_visible(p, sq, m0, mr, n0, nc);
    finish_scores(p, sq, sp, m0, mr, n0, nc, w.s.data(), bn, nullptr, mask);

    for (int64_t r = 0; r < mr; ++r) {
      float* row = w.s.data() + r * bn;
      const float m_new = std::max(m[r], simd::row_max(row, nc));
      if (m_new == simd::kNegInf) {  // no visible key yet: P = 0, avoid −inf − (−inf)
        std::fill(row, row + nc, 0.0f);
        continue;
      }
      const float alpha = simd::exp2_scalar(m[r] - m_new);  // m[r] = −inf gives 0
      const float sum = simd::exp2_shift_sum(row, nc, m_new);
      l[r] = l[r] * alpha + sum;
      if (alpha != 1.0f) o.row(r) *= alpha;
      m[r] = m_new;
    }
    o.noalias() += s * ctile(vt.data, nc, dv, vt.ld);
  }

  // O = O / l, lse = ln(l) + m (m in log2 units). Rows that saw no key: out 0, lse −inf.
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  char* out = static_cast<char*>(p.out) +
              (it.b * p.o_batch_stride + (sq.q_start + m0) * p.o_row_stride + h * p.o_head_stride) * es;
  float* lse = p.lse ? p.lse + it.b * p.lse_batch_stride + h * p.lse_head_stride +
                           (sq.q_start + m0) * p.lse_row_stride
                     : nullptr;
  for (int64_t r = 0; r < mr; ++r) {
    const bool empty = l[r] == 0.0f;
    simd::store_row(p.dtype, w.o.data() + r * dv, out + r * p.o_row_stride * es, dv, empty ? 0.0f : 1.0f / l[r]);
    if (lse) lse[r * p.lse_row_stride] = empty ? simd::kNegInf : (m[r] + std::log2(l[r])) * kLn2;
  }
}

}  // namespace

std::string kernel_name(const detail::Params& p, Pass pass) {
  const TileShape ts = pass == Pass::forward ? fwd_tile(p) : bwd_tile(p);
  return std::string(pass == Pass::forward ? "cpu_fwd_tiled" : "cpu_bwd_tiled") + "_bm" +
         std::to_string(ts.block_m) + "_bn" + std::to_string(ts.block_n);
}

void forward(const detail::Params& p) {
  const TileShape ts = fwd_tile(p);
  const std::vector<WorkItem> items = work_items(p, p.num_heads, ts.block_m, /*use_q=*/true);
  if (items.empty()) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(p), static_cast<int64_t>(items.size())));
  // Scratch allocated before the parallel region so that an allocation failure throws here
  // instead of terminating inside OpenMP.
  std::vector<FwdScratch> scratch;
  scratch.reserve(threads);
  for (int t = 0; t < threads; ++t) scratch.emplace_back(ts.block_m, ts.block_n, p.head_dim, p.head_dim_v);
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n_items; ++i) forward_item(p, ts, items[i], scratch[omp_get_thread_num()]);
}

}  // namespace flashattn::cpu

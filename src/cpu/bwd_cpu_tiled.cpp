// CPU backward: tiled FlashAttention-2 (Dao 2023, Alg. 2), deterministic by construction.
//
//   preprocess  D_i = Σ_d dO_id · O_id                     (fp32, one value per query row and head)
//   pass dK/dV  parallel over (batch, KV head, block_n keys): for every query head of the GQA group
//               and every query tile that can see the keys, recompute P = exp(S − lse), then
//               dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D) (· (1 − tanh²) under softcap), dK += dSᵀ Q.
//   pass dQ     parallel over (batch, query head, block_m rows): recompute S, P, dP, dS for the
//               visible key tiles and accumulate dQ += dS K.
//
// Why two passes rather than one pass with per-thread dQ buffers: every output element is owned
// by exactly one work item and summed in a fixed order, so results are bitwise identical for
// any thread count and schedule (stronger than the "same thread count" requirement), no atomics,
// no reduction step, dynamic scheduling can balance causal/varlen work, and working memory is
// O(threads × tile) plus the D vector. The price is recomputing S and dP in the dQ pass
// (7 tile products instead of 5).
#include "common/backends.hpp"
#include "cpu/tile_common.hpp"
#include "cpu/tile_traits.hpp"

namespace flashattn::cpu {

namespace {

using namespace tiled;

struct BwdScratch {
  std::vector<float> q, dout, k, v, p, ds, t, acc_a, acc_b, lse2, delta;
  BwdScratch(int64_t bm, int64_t bn, int64_t d, int64_t dv, bool softcap)
      : q(bm * d), dout(bm * dv), k(bn * d), v(bn * dv), p(bm * bn), ds(bm * bn), t(softcap ? bm * bn : 0),
        acc_a(std::max(bm, bn) * std::max(d, dv)), acc_b(bn * dv), lse2(bm), delta(bm) {}
};

// Row index of (b, i) in the D buffer: [num_heads][rows] with rows = total query rows.
int64_t delta_row(const detail::Params& p, const Seq& sq, int64_t i) {
  return p.is_varlen ? sq.q_start + i : sq.b * p.seqlen_q + i;
}
int64_t total_q_rows(const detail::Params& p) {
  return p.is_varlen ? p.cu_seqlens_q[p.batch] : p.batch * p.seqlen_q;
}

// The query-side operands of one (batch, head) and the per-row lse (log2 units) and D of a tile.
struct QuerySide {
  Operand q, dout;
  const float* lse;  // row 0 of the sequence
  const float* delta;
};

QuerySide query_side(const detail::Params& p, const Seq& sq, int64_t h, const std::vector<float>& delta) {
  QuerySide qs;
  qs.q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, sq.b, sq.q_start, h);
  qs.dout = operand(p, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, sq.b, sq.q_start, h);
  qs.lse = p.lse + sq.b * p.lse_batch_stride + h * p.lse_head_stride + sq.q_start * p.lse_row_stride;
  qs.delta = delta.data() + h * total_q_rows(p) + delta_row(p, sq, 0);
  return qs;
}

struct Tiles {
  TileView q, dout;
};

Tiles load_query_tiles(const detail::Params& p, const QuerySide& qs, int64_t m0, int64_t mr, BwdScratch& w) {
  for (int64_t r = 0; r < mr; ++r) {
    w.lse2[r] = qs.lse[(m0 + r) * p.lse_row_stride] * kLog2e;
    w.delta[r] = qs.delta[m0 + r];
  }
  return {load_tile(p.dtype, qs.q, m0, mr, p.head_dim, w.q.data()),
          load_tile(p.dtype, qs.dout, m0, mr, p.head_dim_v, w.dout.data())};
}

// For one (query tile, key tile) pair: w.p <- P and w.ds <- dS' (softcap derivative applied),
// both mr x nc with leading dimension bn.
void compute_ds(const detail::Params& p, const Seq& sq, const ScorePolicy& sp, int64_t m0, int64_t mr, int64_t n0,
                int64_t nc, int64_t bn, const Tiles& qt, const TileView& kt, const TileView& vt, BwdScratch& w) {
  Tile s = tile(w.p.data(), mr, nc, bn);
  s.noalias() = ctile(qt.q.data, mr, p.head_dim, qt.q.ld) * ctile(kt.data, nc, p.head_dim, kt.ld).transpose();
  const bool mask = !tile_fully_visible(p, sq, m0, mr, n0, nc);
  float* t = sp.cap2 > 0.0f ? w.t.data() : nullptr;
  finish_scores(p, sq, sp, m0, mr, n0, nc, w.p.data(), bn, t, mask);
  for (int64_t r = 0; r < mr; ++r) {
    float* row = w.p.data() + r * bn;
    if (w.lse2[r] == simd::kNegInf) std::fill(row, row + nc, 0.0f);  // row saw no key: P = 0
    else simd::exp2_shift(row, nc, w.lse2[r]);
  }
  Tile ds = tile(w.ds.data(), mr, nc, bn);
  ds.noalias() = ctile(qt.dout.data, mr, p.head_dim_v, qt.dout.ld) * ctile(vt.data, nc, p.head_dim_v, vt.ld).transpose();
  for (int64_t r = 0; r < mr; ++r) {
    float* dsr = w.ds.data() + r * bn;
    const float* pr = w.p.data() + r * bn;
    const float dl = w.delta[r];
    if (t) {
      const float* tr = t + r * bn;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) dsr[j] = pr[j] * (dsr[j] - dl) * (1.0f - tr[j] * tr[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) dsr[j] = pr[j] * (dsr[j] - dl);
    }
  }
}

void store_tile(const detail::Params& p, void* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                int64_t b, int64_t row, int64_t head, const float* src, int64_t rows, int64_t dim, float mult) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  char* dst = static_cast<char*>(base) + (b * batch_stride + row * row_stride + head * head_stride) * es;
  for (int64_t r = 0; r < rows; ++r) simd::store_row(p.dtype, src + r * dim, dst + r * row_stride * es, dim, mult);
}

// D = rowsum(dO ∘ O) for every (query row, head).
void compute_delta(const detail::Params& p, int threads, std::vector<float>& delta) {
  const int64_t rows = total_q_rows(p), dv = p.head_dim_v;
  std::vector<std::vector<float>> buf(threads, std::vector<float>(2 * dv));
  const int64_t n = p.batch * p.num_heads;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t bh = 0; bh < n; ++bh) {
    const int64_t b = bh / p.num_heads, h = bh % p.num_heads;
    const Seq sq = sequence(p, b);
    const Operand o = operand(p, p.out, p.o_batch_stride, p.o_row_stride, p.o_head_stride, b, sq.q_start, h);
    const Operand g = operand(p, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, b, sq.q_start, h);
    float* ob = buf[omp_get_thread_num()].data();
    float* gb = ob + dv;
    float* dst = delta.data() + h * rows + delta_row(p, sq, 0);
    for (int64_t i = 0; i < sq.len_q; ++i) {
      simd::load_row(p.dtype, o.row(i), ob, dv, 1.0f);
      simd::load_row(p.dtype, g.row(i), gb, dv, 1.0f);
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < dv; ++j) acc += ob[j] * gb[j];
      dst[i] = acc;
    }
  }
}

// dK, dV of block_n keys of one KV head, summed over the query heads of its group.
void dkdv_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, const std::vector<float>& delta,
               BwdScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, bm = ts.block_m, bn = ts.block_n;
  const Seq sq = sequence(p, it.b);
  const int64_t kvh = it.h, group = p.num_heads / p.num_heads_k;
  const int64_t n0 = it.r0, nc = std::min(bn, sq.len_k - n0);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);
  const TileView kt = load_tile(p.dtype, k, n0, nc, d, w.k.data());
  const TileView vt = load_tile(p.dtype, v, n0, nc, dv, w.v.data());
  Tile dk = tile(w.acc_a.data(), nc, d, d);
  Tile dvt = tile(w.acc_b.data(), nc, dv, dv);
  dk.setZero();
  dvt.setZero();

  const detail::KeyRange rows = tile_query_range(p, sq, n0, nc);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const ScorePolicy sp = score_policy(p, it.b, h, /*scale_q=*/false);
    const QuerySide qs = query_side(p, sq, h, delta);
    for (int64_t m0 = rows.lo; m0 < rows.hi; m0 += bm) {
      const int64_t mr = std::min(bm, rows.hi - m0);
      const Tiles qt = load_query_tiles(p, qs, m0, mr, w);
      compute_ds(p, sq, sp, m0, mr, n0, nc, bn, qt, kt, vt, w);
      dvt.noalias() += ctile(w.p.data(), mr, nc, bn).transpose() * ctile(qt.dout.data, mr, dv, qt.dout.ld);
      dk.noalias() += ctile(w.ds.data(), mr, nc, bn).transpose() * ctile(qt.q.data, mr, d, qt.q.ld);
    }
  }
  store_tile(p, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, it.b, sq.k_start + n0, kvh,
             w.acc_a.data(), nc, d, p.softmax_scale);
  store_tile(p, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, it.b, sq.k_start + n0, kvh,
             w.acc_b.data(), nc, dv, 1.0f);
}

// dQ of block_m rows of one query head.
void dq_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, const std::vector<float>& delta,
             BwdScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, bn = ts.block_n;
  const Seq sq = sequence(p, it.b);
  const int64_t h = it.h, kvh = h / (p.num_heads / p.num_heads_k);
  const int64_t m0 = it.r0, mr = std::min(ts.block_m, sq.len_q - m0);
  const ScorePolicy sp = score_policy(p, it.b, h, /*scale_q=*/false);
  const QuerySide qs = query_side(p, sq, h, delta);
  const Tiles qt = load_query_tiles(p, qs, m0, mr, w);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);
  Tile dq = tile(w.acc_a.data(), mr, d, d);
  dq.setZero();

  const detail::KeyRange keys = tile_key_range(p, sq, m0, mr);
  for (int64_t n0 = keys.lo; n0 < keys.hi; n0 += bn) {
    const int64_t nc = std::min(bn, keys.hi - n0);
    const TileView kt = load_tile(p.dtype, k, n0, nc, d, w.k.data());
    const TileView vt = load_tile(p.dtype, v, n0, nc, dv, w.v.data());
    compute_ds(p, sq, sp, m0, mr, n0, nc, bn, qt, kt, vt, w);
    dq.noalias() += ctile(w.ds.data(), mr, nc, bn) * ctile(kt.data, nc, d, kt.ld);
  }
  store_tile(p, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, it.b, sq.q_start + m0, h,
             w.acc_a.data(), mr, d, p.softmax_scale);
}

}  // namespace

void backward(const detail::Params& p) {
  const TileShape ts = bwd_tile(p);
  const int threads = std::max(1, num_threads(p));
  std::vector<float> delta(static_cast<size_t>(total_q_rows(p) * p.num_heads));
  std::vector<BwdScratch> scratch;
  scratch.reserve(threads);
  for (int t = 0; t < threads; ++t)
    scratch.emplace_back(ts.block_m, ts.block_n, p.head_dim, p.head_dim_v, p.softcap > 0.0f);

  compute_delta(p, threads, delta);

  const std::vector<WorkItem> kv_items = work_items(p, p.num_heads_k, ts.block_n, /*use_q=*/false);
  const int64_t n_kv = static_cast<int64_t>(kv_items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n_kv; ++i) dkdv_item(p, ts, kv_items[i], delta, scratch[omp_get_thread_num()]);

  const std::vector<WorkItem> q_items = work_items(p, p.num_heads, ts.block_m, /*use_q=*/true);
  const int64_t n_q = static_cast<int64_t>(q_items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n_q; ++i) dq_item(p, ts, q_items[i], delta, scratch[omp_get_thread_num()]);
}

}  // namespace flashattn::cpu

// CPU backward: tiled FlashAttention-2 (Dao 2023, Alg. 2), deterministic by construction.
//
//   preprocess  D_i = Σ_d dO_id · O_id                     (fp32, one value per query row and head)
//   pass dK/dV  parallel over (batch, KV head, block_n keys), keys along the vector lanes: Kᵀ, Vᵀ
//               built once per item; for every query head of the GQA group and every query tile
//               that can see the keys, recompute S = Q Kᵀ, P = exp(S − lse), then
//               dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D) (· (1 − tanh²) under softcap), dK += dSᵀ Q.
//   pass dQ     parallel over (batch, query head, block_m rows), queries along the lanes: Qᵀ, dOᵀ
//               built once per item; for the visible key tiles recompute Sᵀ = K Qᵀ, Pᵀ, dPᵀ = V dOᵀ,
//               dSᵀ, and accumulate dQᵀ += Kᵀ dSᵀ.
//
// Why two passes rather than one pass with per-thread dQ buffers: every output element is owned
// by exactly one work item and summed in a fixed order, so results are bitwise identical for any
// thread count and schedule (stronger than the "same thread count" requirement), with no
// atomics, no reduction step, dynamic scheduling to balance causal/varlen work, and working
// memory O(threads x tile) plus the D vector. The price is recomputing S and dP in the dQ pass
// (7 tile products instead of 5).
#include "common/backends.hpp"
#include "cpu/gemm_kernel.hpp"
#include "cpu/tile_common.hpp"
#include "cpu/tile_traits.hpp"

namespace flashattn::cpu {

namespace {

using namespace tiled;
using simd::V16;

struct BwdScratch {
  // Shared by both passes (sized for the larger use): query-side tiles, key-side tiles, the two
  // score tiles, the tanh tile (softcap), accumulators, per-row lse/D, and one conversion row.
  std::vector<float> qa, qb, ka, kb, s, dp, t, acc_a, acc_b, lse2, delta, tmp;
  std::vector<detail::KeyRange> kr;
  BwdScratch(int64_t bm, int64_t bn, int64_t d, int64_t dv, bool softcap) {
    const int64_t w = simd::round_up(bm, simd::kLanes), np = simd::round_up(bn, simd::kLanes);
    const int64_t dp16 = simd::round_up(d, simd::kLanes), dv16 = simd::round_up(dv, simd::kLanes);
    const int64_t tile = std::max(w, bm) * std::max(np, bn);
    qa.resize(std::max(bm * dp16, d * w));    // Q rows (pass 1) or Qᵀ (pass 2)
    qb.resize(std::max(bm * dv16, dv * w));   // dO rows (pass 1) or dOᵀ (pass 2)
    ka.resize(std::max(d * np, bn * d));      // Kᵀ (pass 1) or converted K rows (pass 2)
    kb.resize(std::max(dv * np, bn * dv));    // Vᵀ (pass 1) or converted V rows (pass 2)
    s.resize(tile);
    dp.resize(tile);
    t.resize(softcap ? tile : 0);
    acc_a.resize(std::max(bn * dp16, d * w));  // dK (pass 1) or dQᵀ (pass 2)
    acc_b.resize(bn * dv16);                   // dV
    lse2.resize(w);
    delta.resize(w);
    tmp.resize(std::max(d, dv));
    kr.resize(w);
  }
};

int64_t total_q_rows(const detail::Params& p) {
  return p.is_varlen ? p.cu_seqlens_q[p.batch] : p.batch * p.seqlen_q;
}
// Row of (sequence, i) in the D buffer [num_heads][total_q_rows].
int64_t delta_row(const detail::Params& p, const Seq& sq, int64_t i) {
  return p.is_varlen ? sq.q_start + i : sq.b * p.seqlen_q + i;
}

// lse in log2 units for rows [m0, m0 + mr) into dst[0..n): +inf for rows that saw no key (lse =
// −inf) and for padding, so that P = exp2(S − lse2) is exactly 0 there. D likewise (0 padding).
void load_row_stats(const detail::Params& p, const Seq& sq, int64_t h, int64_t m0, int64_t mr, int64_t n,
                    const std::vector<float>& delta, float* lse2, float* dl) {
  const float* lse = p.lse + sq.b * p.lse_batch_stride + h * p.lse_head_stride + sq.q_start * p.lse_row_stride;
  const float* dsrc = delta.data() + h * total_q_rows(p) + delta_row(p, sq, 0);
  for (int64_t r = 0; r < n; ++r) {
    const float x = r < mr ? lse[(m0 + r) * p.lse_row_stride] : simd::kNegInf;
    lse2[r] = x == simd::kNegInf ? simd::kPosInf : x * kLog2e;
    dl[r] = r < mr ? dsrc[m0 + r] : 0.0f;
  }
}

// dS = P ∘ (dP − D) (∘ (1 − t²) under softcap) over n contiguous values with one D.
inline void ds_row(float* ds, const float* pr, const float* tr, int64_t n, float dl) {
  if (tr) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) ds[j] = pr[j] * (ds[j] - dl) * (1.0f - tr[j] * tr[j]);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) ds[j] = pr[j] * (ds[j] - dl);
  }
}

void store_rows(const detail::Params& p, void* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                int64_t b, int64_t row, int64_t head, const float* src, int64_t ld, int64_t rows, int64_t dim,
                float mult) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  char* dst = static_cast<char*>(base) + (b * batch_stride + row * row_stride + head * head_stride) * es;
  for (int64_t r = 0; r < rows; ++r) simd::store_row(p.dtype, src + r * ld, dst + r * row_stride * es, dim, mult);
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
  const int64_t d = p.head_dim, dv = p.head_dim_v, bm = ts.block_m;
  const int64_t dp16 = simd::round_up(d, simd::kLanes), dv16 = simd::round_up(dv, simd::kLanes);
  const Seq sq = sequence(p, it.b);
  const int64_t kvh = it.h, group = p.num_heads / p.num_heads_k;
  const int64_t n0 = it.r0, nc = std::min(ts.block_n, sq.len_k - n0);
  const int64_t np = simd::round_up(nc, simd::kLanes);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);
  transpose_rows_padded(p.dtype, k, n0, nc, d, w.ka.data(), np, 1.0f, w.tmp.data());
  transpose_rows_padded(p.dtype, v, n0, nc, dv, w.kb.data(), np, 1.0f, w.tmp.data());
  float* dk = w.acc_a.data();
  float* dvacc = w.acc_b.data();
  std::fill(dk, dk + nc * dp16, 0.0f);
  std::fill(dvacc, dvacc + nc * dv16, 0.0f);
  float* t = p.softcap > 0.0f ? w.t.data() : nullptr;

  const detail::KeyRange rows = tile_query_range(p, sq, n0, nc);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const ScorePolicy sp = score_policy(p, sq, h, /*scale_q=*/false);
    const Operand q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, it.b, sq.q_start, h);
    const Operand g = operand(p, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, it.b, sq.q_start, h);
    for (int64_t m0 = rows.lo; m0 < rows.hi; m0 += bm) {
      const int64_t mr = std::min(bm, rows.hi - m0);
      copy_rows_padded(p.dtype, q, m0, mr, d, w.qa.data(), dp16);
      copy_rows_padded(p.dtype, g, m0, mr, dv, w.qb.data(), dv16);
      load_row_stats(p, sq, h, m0, mr, mr, delta, w.lse2.data(), w.delta.data());
      const PrefetchNext next{{&q, &g}, {d, dv}, m0 + bm, std::clamp<int64_t>(rows.hi - m0 - bm, 0, bm)};
      // S = Q Kᵀ (mr x np), P = exp2(S − lse2) row-wise.
      gemm::gemm<gemm::Op::store>(mr, np, d, w.qa.data(), dp16, 1, w.ka.data(), np, w.s.data(), np, nullptr, next);
      finish_natural(p, sq, sp, m0, mr, n0, nc, np, w.s.data(), t, !tile_fully_visible(p, sq, m0, mr, n0, nc));
      for (int64_t r = 0; r < mr; ++r) {
        const V16 l2 = simd::bcast(w.lse2[r]);
        float* row = w.s.data() + r * np;
        for (int64_t j = 0; j < np; j += simd::kLanes)
          simd::store(row + j, simd::exp2(simd::sub(simd::load(row + j), l2)));
      }
      // dV += Pᵀ dO, dP = dO Vᵀ, dS, dK += dSᵀ Q.
      gemm::gemm<gemm::Op::add>(nc, dv16, mr, w.s.data(), 1, np, w.qb.data(), dv16, dvacc, dv16);
      gemm::gemm<gemm::Op::store>(mr, np, dv, w.qb.data(), dv16, 1, w.kb.data(), np, w.dp.data(), np);
      for (int64_t r = 0; r < mr; ++r)
        ds_row(w.dp.data() + r * np, w.s.data() + r * np, t ? t + r * np : nullptr, np, w.delta[r]);
      gemm::gemm<gemm::Op::add>(nc, dp16, mr, w.dp.data(), 1, np, w.qa.data(), dp16, dk, dp16);
    }
  }
  store_rows(p, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, it.b, sq.k_start + n0, kvh, dk, dp16,
             nc, d, p.softmax_scale);
  store_rows(p, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, it.b, sq.k_start + n0, kvh, dvacc,
             dv16, nc, dv, 1.0f);
}

// dQ of block_m rows of one query head.
void dq_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, const std::vector<float>& delta,
             BwdScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, bn = ts.block_n;
  const Seq sq = sequence(p, it.b);
  const int64_t h = it.h, kvh = h / (p.num_heads / p.num_heads_k);
  const int64_t m0 = it.r0, mr = std::min(ts.block_m, sq.len_q - m0);
  const int64_t wl = simd::round_up(mr, simd::kLanes);
  const ScorePolicy sp = score_policy(p, sq, h, /*scale_q=*/false);
  const Operand q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, it.b, sq.q_start, h);
  const Operand g = operand(p, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, it.b, sq.q_start, h);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);
  transpose_rows_padded(p.dtype, q, m0, mr, d, w.qa.data(), wl, 1.0f, w.tmp.data());
  transpose_rows_padded(p.dtype, g, m0, mr, dv, w.qb.data(), wl, 1.0f, w.tmp.data());
  load_row_stats(p, sq, h, m0, mr, wl, delta, w.lse2.data(), w.delta.data());
  for (int64_t r = 0; r < mr; ++r) w.kr[r] = detail::visible_keys(p, m0 + r, sq.len_q, sq.len_k);
  float* dqt = w.acc_a.data();
  std::fill(dqt, dqt + d * wl, 0.0f);
  float* t = p.softcap > 0.0f ? w.t.data() : nullptr;

  const detail::KeyRange keys = tile_key_range(p, sq, m0, mr);
  for (int64_t n0 = keys.lo; n0 < keys.hi; n0 += bn) {
    const int64_t nc = std::min(bn, keys.hi - n0);
    const RowsF32 kt = rows_f32(p.dtype, k, n0, nc, d, w.ka.data());
    const RowsF32 vt = rows_f32(p.dtype, v, n0, nc, dv, w.kb.data());
    const PrefetchNext next{{&k, &v}, {d, dv}, n0 + bn, std::clamp<int64_t>(keys.hi - n0 - bn, 0, bn)};
    // Sᵀ = K Qᵀ (nc x wl), Pᵀ = exp2(Sᵀ − lse2) lane-wise.
    gemm::gemm<gemm::Op::store>(nc, wl, d, kt.data, kt.ld, 1, w.qa.data(), wl, w.s.data(), wl, nullptr, next);
    finish_transposed(sq, sp, m0, mr, wl, n0, nc, w.s.data(), t, w.kr.data(),
                      !tile_fully_visible(p, sq, m0, mr, n0, nc));
    for (int64_t c = 0; c < wl; c += simd::kLanes) {
      const V16 l2 = simd::load(w.lse2.data() + c);
      for (int64_t r = 0; r < nc; ++r) {
        float* x = w.s.data() + r * wl + c;
        simd::store(x, simd::exp2(simd::sub(simd::load(x), l2)));
      }
    }
    // dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D) lane-wise, dQᵀ += Kᵀ dSᵀ.
    gemm::gemm<gemm::Op::store>(nc, wl, dv, vt.data, vt.ld, 1, w.qb.data(), wl, w.dp.data(), wl);
    for (int64_t c = 0; c < wl; c += simd::kLanes) {
      const V16 dl = simd::load(w.delta.data() + c);
      for (int64_t r = 0; r < nc; ++r) {
        float* ds = w.dp.data() + r * wl + c;
        V16 x = simd::mul(simd::load(w.s.data() + r * wl + c), simd::sub(simd::load(ds), dl));
        if (t) {
          const V16 tv = simd::load(t + r * wl + c);
          x = simd::mul(x, simd::sub(simd::bcast(1.0f), simd::mul(tv, tv)));
        }
        simd::store(ds, x);
      }
    }
    gemm::gemm<gemm::Op::add>(d, wl, nc, kt.data, 1, kt.ld, w.dp.data(), wl, dqt, wl);
  }
  // dQ = softmax_scale · dQᵀᵀ.
  const int64_t es = static_cast<int64_t>(dtype_size(p.dtype));
  char* dst = static_cast<char*>(p.dq) +
              (it.b * p.dq_batch_stride + (sq.q_start + m0) * p.dq_row_stride + h * p.dq_head_stride) * es;
  float* row = w.tmp.data();
  for (int64_t r = 0; r < mr; ++r) {
    for (int64_t x = 0; x < d; ++x) row[x] = dqt[x * wl + r];
    simd::store_row(p.dtype, row, dst + r * p.dq_row_stride * es, d, p.softmax_scale);
  }
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

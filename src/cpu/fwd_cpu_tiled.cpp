// CPU forward: tiled FlashAttention-2 (Dao 2023, Alg. 1) with an online softmax.
//
// One work item is (batch, query head, block_m query rows). It works on transposed tiles so that
// queries run along the 16 vector lanes: Qᵀ (head_dim x block_m, scaled by softmax_scale)
// is built once per item, then for each key tile the mask lets the rows see (tile_key_range())
//   Sᵀ = K Qᵀ                  block_n x block_m, K rows broadcast from a copied K tile
//   softcap / ALiBi / mask      (finish_transposed)
//   m_new = max(m, colmax Sᵀ),  alpha = exp2((m − m_new) log2 e),  Pᵀ = exp2((Sᵀ − m_new) log2 e),
//   l = alpha · l + colsum Pᵀ    (Alg. 1 lines 8–10, every step a lane-wise vector op: no
//                                horizontal reductions, one exp2 per score)
//   Oᵀ = alpha · Oᵀ + Vᵀ Pᵀ      (the rescale fused into the product's epilogue)
// and finally O = Oᵀᵀ / l, lse = m + ln l. fp16/bf16 K/V tiles are converted to fp32
// per tile; accumulation is always fp32. Items are independent, so results do not depend on the
// thread count or schedule (dynamic scheduling balances causal and varlen work).
#include <new>
#include <string>

#include "common/backends.hpp"
#include "cpu/gemm_kernel.hpp"
#include "cpu/tile_common.hpp"
#include "cpu/tile_traits.hpp"

namespace flashattn::cpu {

namespace {

using namespace tiled;
using simd::V16;

struct FwdScratch {
  std::vector<float> qt, k, v, st, ot, m, l, alpha, tmp;
  std::vector<detail::KeyRange> kr;
  FwdScratch(int64_t bm, int64_t bn, int64_t d, int64_t dv) {
    const int64_t w = simd::round_up(bm, simd::kLanes);
    qt.resize(d * w);
    k.resize(bn * d);
    v.resize(bn * dv);
    st.resize(bn * w);
    ot.resize(dv * w);
    m.resize(w);
    l.resize(w);
    alpha.resize(w);
    tmp.resize(std::max(d, dv));
    kr.resize(w);
  }
};

// Online softmax over one Sᵀ tile (nc key rows x w query lanes, row stride ld), in place: Sᵀ
// becomes Pᵀ, and m, l, alpha are updated lane-wise. A lane that has seen no key keeps m = −inf
// and subtracts 0 instead (as FA-2's CUDA kernels do), so P, alpha and l stay exactly 0 there.
// NaN and +inf scores propagate without a flag or a branch: simd::exp2 keeps NaN, a NaN score
// gives a NaN P (or, when the max picked it up, a NaN m_new and so NaN for the whole tile), a
// +inf score makes m_new = +inf and its own P = exp2(inf − inf) = NaN; either way l and Oᵀ turn
// NaN, and stay NaN through every later alpha. Such a row ends with out and lse NaN, as the
// materialized softmax (and PyTorch) gives. A −inf score from finite inputs gets P = 0 like a
// masked key (a row whose scores are all −inf ends as a row that saw no key).
#ifdef FLASHATTN_CPU_AVX2
// online_softmax below in AVX2 intrinsics, 8 lanes at a time (simd.hpp: why).
FLASHATTN_AVX2 void online_softmax_avx2(float* st, int64_t nc, int64_t w, int64_t ld, float* m, float* l, float* alpha) {
  const __m256 log2e = _mm256_set1_ps(kLog2e), zero = _mm256_setzero_ps();
  const __m256 neg_inf = _mm256_set1_ps(simd::kNegInf);
  for (int64_t c = 0; c < w; c += 8) {
    // (max(a, b) as simd::max: the second operand where either is NaN.)
    __m256 mx = neg_inf;
    for (int64_t r = 0; r < nc; ++r) mx = _mm256_max_ps(mx, _mm256_loadu_ps(st + r * ld + c));
    const __m256 m_old = _mm256_loadu_ps(m + c);
    const __m256 m_new = _mm256_max_ps(m_old, mx);
    const __m256 m_sub = _mm256_blendv_ps(m_new, zero, _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
    const __m256 a = simd::avx2::exp2(_mm256_mul_ps(_mm256_sub_ps(m_old, m_sub), log2e));
    __m256 sum = zero;
    for (int64_t r = 0; r < nc; ++r) {
      const __m256 e = simd::avx2::exp2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(st + r * ld + c), m_sub), log2e));
      _mm256_storeu_ps(st + r * ld + c, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(m + c, m_new);
    _mm256_storeu_ps(alpha + c, a);
    _mm256_storeu_ps(l + c, _mm256_fmadd_ps(a, _mm256_loadu_ps(l + c), sum));
  }
}
#endif

void online_softmax(float* st, int64_t nc, int64_t w, int64_t ld, float* m, float* l, float* alpha) {
#ifdef FLASHATTN_CPU_AVX2
  if (simd::avx2::use()) return online_softmax_avx2(st, nc, w, ld, m, l, alpha);
#endif
  const V16 log2e = simd::bcast(kLog2e);
  for (int64_t c = 0; c < w; c += simd::kLanes) {
    V16 mx = simd::bcast(simd::kNegInf);
    for (int64_t r = 0; r < nc; ++r) mx = simd::max(mx, simd::load(st + r * ld + c));
    const V16 m_old = simd::load(m + c);
    const V16 m_new = simd::max(m_old, mx);
    const V16 m_sub = simd::replace_neg_inf(m_new, simd::zero());
    const V16 a = simd::exp2(simd::mul(simd::sub(m_old, m_sub), log2e));
    V16 sum = simd::zero();
    for (int64_t r = 0; r < nc; ++r) {
      // (S − m) first: exact near the max (Sterbenz), so the largest P are exact before exp2.
      const V16 e = simd::exp2(simd::mul(simd::sub(simd::load(st + r * ld + c), m_sub), log2e));
      simd::store(st + r * ld + c, e);
      sum = simd::add(sum, e);
    }
    simd::store(m + c, m_new);
    simd::store(alpha + c, a);
    simd::store(l + c, simd::fmadd(a, simd::load(l + c), sum));
  }
}

FLASHATTN_CPU_CLONES void forward_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, FwdScratch& w) {
  const int64_t d = p.head_dim, dv = p.head_dim_v, bn = ts.block_n;
  const Seq sq = sequence(p, it.b);
  const int64_t h = it.h, kvh = h / (p.num_heads / p.num_heads_k);
  const int64_t m0 = it.r0, mr = std::min(ts.block_m, sq.len_q - m0);
  const int64_t wl = simd::round_up(mr, simd::kLanes);
  const ScorePolicy sp = score_policy(p, sq, h);

  const Operand q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, it.b, sq.q_start, h);
  const Operand k = operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, it.b, sq.k_start, kvh);
  const Operand v = operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, it.b, sq.k_start, kvh);

  const detail::KeyRange keys = tile_key_range(p, sq, m0, mr);
  const PrefetchNext first{{&k, &v}, {d, dv}, keys.lo, std::min(bn, keys.hi - keys.lo)};
  transpose_rows_padded(p.dtype, q, m0, mr, d, w.qt.data(), wl, sp.q_mult, w.tmp.data(), first);
  for (int64_t r = 0; r < mr; ++r) w.kr[r] = detail::visible_keys(p, m0 + r, sq.len_q, sq.len_k);
  std::fill(w.ot.begin(), w.ot.begin() + dv * wl, 0.0f);
  std::fill(w.m.begin(), w.m.begin() + wl, simd::kNegInf);
  std::fill(w.l.begin(), w.l.begin() + wl, 0.0f);

  for (int64_t n0 = keys.lo; n0 < keys.hi; n0 += bn) {
    const int64_t nc = std::min(bn, keys.hi - n0);
    const RowsF32 kt = rows_f32(p.dtype, k, n0, nc, d, w.k.data());
    const RowsF32 vt = rows_f32(p.dtype, v, n0, nc, dv, w.v.data());
    const PrefetchNext next{{&k, &v}, {d, dv}, n0 + bn, std::clamp<int64_t>(keys.hi - n0 - bn, 0, bn)};
    // Only the lanes (queries) that see a key of this tile take part: on a causal diagonal this
    // skips the query vectors above the diagonal instead of computing and masking them.
    const detail::KeyRange lanes = active_lanes(w.kr.data(), mr, n0, nc);
    if (lanes.lo == lanes.hi) continue;
    const int64_t la = lanes.lo, lw = lanes.hi - lanes.lo;
    gemm::gemm<gemm::Op::store>(nc, lw, d, kt.data, kt.ld, 1, w.qt.data() + la, wl, w.st.data() + la, wl, nullptr,
                                next);
    const bool mask = !tile_fully_visible(p, sq, m0 + la, std::min(lanes.hi, mr) - la, n0, nc);
    finish_transposed(sp, m0, mr, wl, la, lanes.hi, n0, nc, w.st.data(), w.kr.data(), mask);
    online_softmax(w.st.data() + la, nc, lw, wl, w.m.data() + la, w.l.data() + la, w.alpha.data() + la);
    gemm::gemm<gemm::Op::scale>(dv, lw, nc, vt.data, 1, vt.ld, w.st.data() + la, wl, w.ot.data() + la, wl,
                                w.alpha.data() + la);
  }

  // O = Oᵀᵀ / l, lse = m + ln l. Rows that saw no key: out 0, lse −inf; rows with a NaN or +inf
  // score: l is NaN, so out and lse are NaN. lse is formed in double and rounded once: at large
  // scores its ulp is the accuracy limit of the backward's P = exp(S − lse).
  const int64_t es = static_cast<int64_t>(dtype_size(p.out_dtype));
  char* out = static_cast<char*>(p.out) +
              (it.b * p.o_batch_stride + (sq.q_start + m0) * p.o_row_stride + h * p.o_head_stride) * es;
  float* lse = p.lse ? p.lse + it.b * p.lse_batch_stride + h * p.lse_head_stride +
                           (sq.q_start + m0) * p.lse_row_stride
                     : nullptr;
  float* row = w.tmp.data();
  for (int64_t r = 0; r < mr; ++r) {
    if (r + 8 < mr) {  // strided output rows: fetch ahead for writing
      const char* ahead = out + (r + 8) * p.o_row_stride * es;
      for (int64_t c = 0; c < dv * es; c += 64) __builtin_prefetch(ahead + c, 1, 3);
    }
    const float l = w.l[r];
    const bool empty = l == 0.0f;
    for (int64_t y = 0; y < dv; ++y) row[y] = w.ot[y * wl + r];
    simd::store_row(p.out_dtype, row, out + r * p.o_row_stride * es, dv, empty ? 0.0f : 1.0f / l);
    if (lse) {
      const double lse_r = static_cast<double>(w.m[r]) + std::log(static_cast<double>(l));
      lse[r * p.lse_row_stride] = empty ? simd::kNegInf : static_cast<float>(lse_r);
    }
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
  const int threads = effective_threads(p, static_cast<int64_t>(items.size()));
  // Scratch is allocated before the parallel region so that an allocation failure throws here
  // (as an Error) instead of terminating inside OpenMP.
  std::vector<FwdScratch> scratch;
  try {
    scratch.reserve(threads);
    for (int t = 0; t < threads; ++t) scratch.emplace_back(ts.block_m, ts.block_n, p.head_dim, p.head_dim_v);
  } catch (const std::bad_alloc&) {
    throw Error("cpu forward: out of memory allocating the scratch tiles of " + std::to_string(threads) +
                " threads; lower num_threads");
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n_items; ++i) forward_item(p, ts, items[i], scratch[omp_get_thread_num()]);
}

}  // namespace flashattn::cpu

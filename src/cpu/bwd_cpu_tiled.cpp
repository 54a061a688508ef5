// CPU backward: tiled FlashAttention-2 (Dao 2023, Alg. 2), deterministic without atomics.
//
//   preprocess  D_i = Σ_d dO_id · O_id                     (fp32, one value per query row and head)
//   main pass   one work item per (batch, KV head, block_n keys), keys along the vector lanes: Kᵀ,
//               Vᵀ built once per item; for every query head of the GQA group and every query tile
//               that can see the keys, recompute S = Q Kᵀ, P = exp(S − lse), then
//               dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D) (· (1 − tanh²) under softcap),
//               dK += dSᵀ Q (owned by the item), and dQ += dS K into the item's list's fp32 buffer.
//   postprocess dQ = softmax_scale · Σ_lists buffer, summed in list order.
//
// Determinism: items are dealt to 2 x num_threads lists by a fixed rule (longest-first onto the
// least loaded list, from the items' visible-row counts); threads claim whole lists dynamically,
// each list runs in item order into its own dQ buffer, and the buffers are summed in list order.
// The result depends only on the thread count, never on timing, and the dynamic claiming keeps
// both cores busy when one is slowed down (a fixed list per thread measured 27% of peak per core
// for causal with 2 threads on this shared machine, the other thread waiting at the barrier).
// This keeps FA-2's five tile products per (query tile, key tile) pair; an earlier version
// recomputed S and dP in a separate dQ pass (seven products) and ran 1.3-1.5x behind PyTorch's
// fp32 backward. dQ buffers cover a batch of (batch, KV head) groups at a time: about 16 MiB in
// all, but at least one group, i.e. lists x (num_heads / num_heads_k) x seqlen_q x head_dim fp32.
#include <cmath>
#include <limits>
#include <new>
#include <string>

#include "common/backends.hpp"
#include "cpu/gemm_kernel.hpp"
#include "cpu/memory.hpp"
#include "cpu/tile_common.hpp"
#include "cpu/tile_traits.hpp"

namespace flashattn::cpu {

namespace {

using namespace tiled;
using simd::V16;

struct BwdScratch {
  // Query-side tiles, key-side tiles, the two score tiles, the tanh tile (softcap), the dK/dV
  // accumulators, per-row lse/D, and one conversion row.
  std::vector<float> qa, qb, ka, kb, kpad, s, dp, t, acc_a, acc_b, lse, delta, tmp;
  BwdScratch(int64_t bm, int64_t bn, int64_t d, int64_t dv, bool softcap) {
    const int64_t w = bm, np = simd::round_up(bn, simd::kLanes);
    const int64_t dp16 = simd::round_up(d, simd::kLanes), dv16 = simd::round_up(dv, simd::kLanes);
    const int64_t tile = std::max(w, bm) * std::max(np, bn);
    qa.resize(bm * dp16);                     // Q rows
    qb.resize(bm * dv16);                     // dO rows
    ka.resize(d * np);                        // Kᵀ
    kb.resize(dv * np);                       // Vᵀ
    kpad.resize(bn * dp16);                    // K rows, padded (dQ += dS K)
    s.resize(tile);
    dp.resize(tile);
    t.resize(softcap ? tile : 0);
    acc_a.resize(bn * dp16);                   // dK
    acc_b.resize(bn * dv16);                   // dV
    lse.resize(w);
    delta.resize(w);
    tmp.resize(std::max(d, dv));
  }
};

int64_t total_q_rows(const detail::Params& p) {
  return p.is_varlen ? p.cu_seqlens_q[p.batch] : p.batch * p.seqlen_q;
}
// Row of (sequence, i) in the D buffer [num_heads][total_q_rows].
int64_t delta_row(const detail::Params& p, const Seq& sq, int64_t i) {
  return p.is_varlen ? sq.q_start + i : sq.b * p.seqlen_q + i;
}

// lse of rows [m0, m0 + mr) into lse_r[0..n): +inf for rows that saw no key (lse = −inf) and for
// padding, so that P = exp(S − lse) is exactly 0 there; NaN stays NaN (a row whose forward was
// NaN), so that its P and everything it touches is NaN. D likewise (0 padding).
void load_row_stats(const detail::Params& p, const Seq& sq, int64_t h, int64_t m0, int64_t mr, int64_t n,
                    const std::vector<float>& delta, float* lse_r, float* dl) {
  const float* lse = p.lse + sq.b * p.lse_batch_stride + h * p.lse_head_stride + sq.q_start * p.lse_row_stride;
  const float* dsrc = delta.data() + h * total_q_rows(p) + delta_row(p, sq, 0);
  for (int64_t r = 0; r < n; ++r) {
    const float x = r < mr ? lse[(m0 + r) * p.lse_row_stride] : simd::kNegInf;
    lse_r[r] = x == simd::kNegInf ? simd::kPosInf : x;
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

// dK, dV of block_n keys of one KV head, summed over the query heads of its group, and their
// contribution to dQ added into dq_acc ([group head][query row][round_up(head_dim, 16)]).
// P = exp2(min(0, S − lse) · log2e) over rows of n values, one lse per row (why the clamp at 0:
// bwd_item, where it is called).
#ifdef FLASHATTN_CPU_AVX2
FLASHATTN_AVX2 void exp_rows_avx2(float* s, int64_t rows, int64_t n, const float* lse) {
  const __m256 log2e = _mm256_set1_ps(kLog2e), zero = _mm256_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const __m256 lse_r = _mm256_set1_ps(lse[r]);
    float* row = s + r * n;
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 x = _mm256_min_ps(zero, _mm256_sub_ps(_mm256_loadu_ps(row + j), lse_r));  // NaN (second) stays NaN
      _mm256_storeu_ps(row + j, simd::avx2::exp2(_mm256_mul_ps(x, log2e)));
    }
  }
}
#endif

inline void exp_rows(float* s, int64_t rows, int64_t n, const float* lse) {
#ifdef FLASHATTN_CPU_AVX2
  if (simd::avx2::use()) return exp_rows_avx2(s, rows, n, lse);
#endif
  const V16 log2e = simd::bcast(kLog2e), zero = simd::zero();
  for (int64_t r = 0; r < rows; ++r) {
    const V16 lse_r = simd::bcast(lse[r]);
    float* row = s + r * n;
    for (int64_t j = 0; j < n; j += simd::kLanes) {
      const V16 x = simd::min(zero, simd::sub(simd::load(row + j), lse_r));  // NaN (second) stays NaN
      simd::store(row + j, simd::exp2(simd::mul(x, log2e)));
    }
  }
}

FLASHATTN_CPU_CLONES void bwd_item(const detail::Params& p, const TileShape& ts, const WorkItem& it, const std::vector<float>& delta,
              float* dq_acc, BwdScratch& w) {
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
  copy_rows_padded(p.dtype, k, n0, nc, d, w.kpad.data(), dp16);
  // Keys of the tile that no query sees (past the last row's window, e.g. a top-left causal mask
  // over a longer key cache) take no part: their copies are zeroed, so a NaN or inf there cannot
  // reach dQ or the other keys' dK / dV through the tile's products (0 · NaN); their own dK and
  // dV come out 0, as the reference's. (Keys some rows see reach the others' products as in
  // FlashAttention: flashattn.hpp.)
  if (sq.len_q > 0) {
    const detail::KeyRange seen = tile_key_range(p, sq, 0, sq.len_q);
    for (int64_t r = 0; r < nc; ++r) {
      if (n0 + r >= seen.lo && n0 + r < seen.hi) continue;
      for (int64_t x = 0; x < d; ++x) w.ka[x * np + r] = 0.0f;
      for (int64_t x = 0; x < dv; ++x) w.kb[x * np + r] = 0.0f;
      std::fill(w.kpad.data() + r * dp16, w.kpad.data() + (r + 1) * dp16, 0.0f);
    }
  }
  float* dk = w.acc_a.data();
  float* dvacc = w.acc_b.data();
  std::fill(dk, dk + nc * dp16, 0.0f);
  std::fill(dvacc, dvacc + nc * dv16, 0.0f);
  float* t = p.softcap > 0.0f ? w.t.data() : nullptr;

  // S is recomputed exactly as the forward computed it: Q scaled by the same q_mult in the same
  // conversion (load_row), the same micro-kernel summing over head_dim in the same order, the
  // same softcap/ALiBi steps, so S − lse here has no error from the recomputation. (Q Kᵀ with
  // unscaled Q, scaled after the sum as before, rounded differently, by several ulps of S: at
  // scores ~1e8 that alone put P far above 1.) dK = softmax_scale · dSᵀ Q therefore takes
  // softmax_scale / q_mult.
  const detail::KeyRange rows = tile_query_range(p, sq, n0, nc);
  const float q_mult = score_policy(p, sq, kvh * group).q_mult;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const ScorePolicy sp = score_policy(p, sq, h);
    const Operand q = operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, it.b, sq.q_start, h);
    const Operand g = operand(p, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, it.b, sq.q_start, h);
    float* dq_head = dq_acc + (h - kvh * group) * sq.len_q * dp16;
    for (int64_t m0 = rows.lo; m0 < rows.hi; m0 += bm) {
      const int64_t mr = std::min(bm, rows.hi - m0);
      copy_rows_padded(p.dtype, q, m0, mr, d, w.qa.data(), dp16, sp.q_mult);
      copy_rows_padded(p.dtype, g, m0, mr, dv, w.qb.data(), dv16);
      load_row_stats(p, sq, h, m0, mr, mr, delta, w.lse.data(), w.delta.data());
      const PrefetchNext next{{&q, &g}, {d, dv}, m0 + bm, std::clamp<int64_t>(rows.hi - m0 - bm, 0, bm)};
      // S = Q Kᵀ (mr x np), P = exp2(min(S − lse, 0) · log2 e) row-wise. With S bit for bit the
      // forward's and lse = m + ln l rounded once from the forward's row max m, S − lse is exact
      // (Sterbenz) where P is not negligible, and what is left is the rounding of lse to float:
      // at most half an ulp of |lse| (~3e-8 |lse|), and 0 for a row dominated by one key (lse
      // rounds to m itself there, as in the naive fp32 formula). All P of a row are scaled by the
      // same e^δ, and so are the row's terms of dV, dK and dQ. Mathematically P <= 1; the clamp
      // keeps that rounding from pushing P above 1, so |dV| <= Σ|dO| holds for any score
      // magnitude: at extreme scores (|lse| ~ 1e8, ulp 8) gradients of rows without a dominant
      // key lose their relative accuracy (P off by up to e^±4) but never blow up.
      gemm::gemm<gemm::Op::store>(mr, np, d, w.qa.data(), dp16, 1, w.ka.data(), np, w.s.data(), np, nullptr, next);
      finish_natural(p, sq, sp, m0, mr, n0, nc, np, w.s.data(), t, !tile_fully_visible(p, sq, m0, mr, n0, nc));
      exp_rows(w.s.data(), mr, np, w.lse.data());
      // dV += Pᵀ dO, dP = dO Vᵀ, dS, dK += dSᵀ Q.
      gemm::gemm<gemm::Op::add>(nc, dv16, mr, w.s.data(), 1, np, w.qb.data(), dv16, dvacc, dv16);
      gemm::gemm<gemm::Op::store>(mr, np, dv, w.qb.data(), dv16, 1, w.kb.data(), np, w.dp.data(), np);
      for (int64_t r = 0; r < mr; ++r)
        ds_row(w.dp.data() + r * np, w.s.data() + r * np, t ? t + r * np : nullptr, np, w.delta[r]);
      gemm::gemm<gemm::Op::add>(nc, dp16, mr, w.dp.data(), 1, np, w.qa.data(), dp16, dk, dp16);
      gemm::gemm<gemm::Op::add>(mr, dp16, nc, w.dp.data(), np, 1, w.kpad.data(), dp16, dq_head + m0 * dp16, dp16);
    }
  }
  store_rows(p, p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, it.b, sq.k_start + n0, kvh, dk, dp16,
             nc, d, static_cast<float>(static_cast<double>(p.softmax_scale) / q_mult));
  store_rows(p, p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, it.b, sq.k_start + n0, kvh, dvacc,
             dv16, nc, dv, 1.0f);
}

// A batch of (batch, KV head) groups whose key tiles run together, and where each group's dQ
// rows sit in the per-list buffers.
inline constexpr double kBatchBytes = 16.0 * 1024 * 1024;

struct GroupBatch {
  std::vector<WorkItem> groups;  // {b, kv head, offset of the group in a dQ buffer}
  int64_t floats = 0;            // dQ buffer size per list
};

// Batches of groups with at least 8 key tiles per list and kBatchBytes of dQ buffers, each run
// as one parallel region followed by its dQ reduction. Few batches mean few barriers: a barrier
// waits for the slowest thread, costly when another process holds a core (one batch per group
// ran 2-thread causal 1.3x slower on this shared machine).
std::vector<GroupBatch> plan_batches(const detail::Params& p, const TileShape& ts, int lists) {
  const int64_t group = p.num_heads / p.num_heads_k, dp16 = simd::round_up(p.head_dim, simd::kLanes);
  std::vector<GroupBatch> batches(1);
  int64_t tiles = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Seq sq = sequence(p, b);
    for (int64_t kvh = 0; kvh < p.num_heads_k; ++kvh) {
      GroupBatch& gb = batches.back();
      gb.groups.push_back({b, kvh, gb.floats});
      gb.floats += group * sq.len_q * dp16;
      tiles += (sq.len_k + ts.block_n - 1) / ts.block_n;
      const double bytes = 4.0 * static_cast<double>(lists) * static_cast<double>(gb.floats);
      if (tiles >= 8 * lists && bytes >= kBatchBytes) {
        batches.emplace_back();
        tiles = 0;
      }
    }
  }
  return batches;
}

// The dQ buffer size per list: the largest batch's.
int64_t dq_list_floats(const std::vector<GroupBatch>& batches) {
  int64_t floats = 0;
  for (const GroupBatch& gb : batches) floats = std::max(floats, gb.floats);
  return floats;
}

}  // namespace

void backward(const detail::Params& p) {
  const TileShape ts = bwd_tile(p);
  int64_t key_tiles = 0;
  for (int64_t b = 0; b < p.batch; ++b) key_tiles += p.num_heads_k * ((p.k_len(b) + ts.block_n - 1) / ts.block_n);
  const int64_t group = p.num_heads / p.num_heads_k, dp16 = simd::round_up(p.head_dim, simd::kLanes);
  // The dQ lists dominate the memory (each covers a whole (batch, KV head) group: MQA with 64 heads
  // at seqlen 4096, head_dim 256 is 268 MB per list). Fewer lists, then fewer threads, when they
  // would take more than half of what is available (memory.hpp says why not wait for bad_alloc).
  // Reading /proc and the cgroup files takes ~0.2 ms, more than a small backward: only plans of
  // 256 MiB and up ask.
  const ListPlan preferred = preferred_dq_lists(effective_threads(p, key_tiles));
  std::vector<GroupBatch> batches = plan_batches(p, ts, preferred.lists);
  int64_t available = std::numeric_limits<int64_t>::max();
  ListPlan fit = preferred;
  if (4 * static_cast<int64_t>(preferred.lists) * dq_list_floats(batches) >= (int64_t{256} << 20)) {
    available = available_memory_bytes();
    fit = fit_dq_lists(preferred.threads, available / 2, [&](int lists) {
      return 4 * static_cast<int64_t>(lists) * dq_list_floats(plan_batches(p, ts, lists));
    });
    if (fit.lists != preferred.lists) batches = plan_batches(p, ts, fit.lists);
  }
  const int threads = fit.threads, lists = fit.lists;
  const int64_t dq_floats = dq_list_floats(batches);
  const double need_bytes = 4.0 * (static_cast<double>(lists) * static_cast<double>(dq_floats) +
                                   static_cast<double>(total_q_rows(p) * p.num_heads));
  auto mib = [](double bytes) { return std::to_string(static_cast<int64_t>(std::ceil(bytes / (1024.0 * 1024.0)))); };
  if (need_bytes > static_cast<double>(available)) {
    throw Error("cpu backward: out of memory: needs " + mib(need_bytes) + " MiB for " + std::to_string(lists) +
                " dQ list(s) of " + std::to_string(dq_floats) + " floats (one (batch, KV head) group: " +
                std::to_string(group) + " query heads x seqlen_q x head_dim) and the row statistics, " +
                mib(static_cast<double>(available)) + " MiB available");
  }

  // Every working buffer is allocated here, before anything is written, and a failure becomes an
  // Error naming the sizes (instead of std::bad_alloc, or a partly written dq/dk/dv).
  std::vector<float> delta;
  std::vector<BwdScratch> scratch;
  std::vector<std::vector<float>> dq_acc(lists);
  std::vector<float> sums;
  try {
    delta.resize(static_cast<size_t>(total_q_rows(p) * p.num_heads));
    scratch.reserve(threads);
    for (int t = 0; t < threads; ++t)
      scratch.emplace_back(ts.block_m, ts.block_n, p.head_dim, p.head_dim_v, p.softcap > 0.0f);
    for (auto& acc : dq_acc) acc.reserve(static_cast<size_t>(dq_floats));
    sums.resize(static_cast<size_t>(threads * dp16));
  } catch (const std::bad_alloc&) {
    throw Error("cpu backward: out of memory allocating " + mib(4.0 * lists * static_cast<double>(dq_floats)) +
                " MiB of dQ buffers (" + std::to_string(lists) + " lists of " + std::to_string(dq_floats) +
                " floats for " + std::to_string(threads) + " threads) and the per-thread scratch; lower num_threads");
  }

  compute_delta(p, threads, delta);

  for (const GroupBatch& gb : batches) {
    if (gb.groups.empty()) continue;
    // Items and their cost (visible query rows), dealt longest-first onto the least loaded list;
    // ties go to the lower index, so the map is a pure function of the shapes and `lists`.
    struct Item {
      WorkItem it;
      int64_t dq_off, cost;
    };
    std::vector<Item> items;
    for (const WorkItem& g : gb.groups) {
      const Seq sq = sequence(p, g.b);
      for (int64_t n0 = 0; n0 < sq.len_k; n0 += ts.block_n) {
        const detail::KeyRange rows = tile_query_range(p, sq, n0, std::min(ts.block_n, sq.len_k - n0));
        items.push_back({{g.b, g.h, n0}, g.r0, 1 + (rows.hi - rows.lo)});
      }
    }
    std::vector<int64_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return items[x].cost > items[y].cost; });
    std::vector<std::vector<int64_t>> list_items(lists);
    std::vector<int64_t> load(lists, 0);
    for (int64_t i : order) {
      const int l = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      list_items[l].push_back(i);
      load[l] += items[i].cost;
    }
    for (int l = 0; l < lists; ++l) {
      std::sort(list_items[l].begin(), list_items[l].end());
      dq_acc[l].assign(static_cast<size_t>(gb.floats), 0.0f);  // within the reserved capacity
    }

    // A thread runs whole lists, so results do not depend on which thread ran which list.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int l = 0; l < lists; ++l)
      for (int64_t i : list_items[l])
        bwd_item(p, ts, items[i].it, delta, dq_acc[l].data() + items[i].dq_off, scratch[omp_get_thread_num()]);

    // dQ = softmax_scale · Σ_l dq_acc[l], lists in order, one (group, head, row) per iteration.
    std::vector<int64_t> row_start(gb.groups.size() + 1, 0);
    for (size_t gi = 0; gi < gb.groups.size(); ++gi)
      row_start[gi + 1] = row_start[gi] + group * p.q_len(gb.groups[gi].b);
    const int64_t n_rows = row_start.back();
#pragma omp parallel num_threads(threads)
    {
      float* sum = sums.data() + omp_get_thread_num() * dp16;
#pragma omp for schedule(static)
      for (int64_t row = 0; row < n_rows; ++row) {
        const size_t gi = static_cast<size_t>(
            std::upper_bound(row_start.begin(), row_start.end(), row) - row_start.begin() - 1);
        const WorkItem& g = gb.groups[gi];
        const Seq sq = sequence(p, g.b);
        const int64_t local = row - row_start[gi], h = g.h * group + local / sq.len_q, i = local % sq.len_q;
        const int64_t off = g.r0 + local * dp16;
        std::copy(dq_acc[0].begin() + off, dq_acc[0].begin() + off + dp16, sum);
        for (int l = 1; l < lists; ++l)
          for (int64_t x = 0; x < dp16; ++x) sum[x] += dq_acc[l][off + x];
        store_rows(p, p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, g.b, sq.q_start + i, h,
                   sum, dp16, 1, p.head_dim, p.softmax_scale);
      }
    }
  }
}

}  // namespace flashattn::cpu

// The float64 oracle (reference.hpp). Plain loops, one materialized score row at a time. The dot
// products may be vectorized (omp simd): float64 summation order changes results by ~1e-16 relative,
// far below any tolerance, and keeps the oracle fast enough for 2k x 2k test shapes.
#include "reference/reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "common/half.hpp"

namespace flashattn::reference {

namespace {

using detail::Params;

// Rounds x to the input dtype (Precision::input) or leaves it exact (Precision::f64).
struct Rounder {
  Precision prec;
  DType dtype;
  double operator()(double x) const {
    if (prec == Precision::f64) return x;
    const float f = static_cast<float>(x);
    switch (dtype) {
      case DType::f16: return detail::fp16_to_float(detail::float_to_fp16(f));
      case DType::bf16: return detail::bf16_to_float(detail::float_to_bf16(f));
      default: return f;
    }
  }
};

double load_element(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::f16: return detail::fp16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::bf16: return detail::bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::e4m3: return detail::e4m3_to_float(static_cast<const uint8_t*>(base)[offset]);
    default: return static_cast<const float*>(base)[offset];
  }
}

// An e4m3 tensor's dequantization factors (Params::q_descale ...): the factor of (batch b, head h)
// of a tensor with `heads` heads, whose KV head is h / (heads / num_heads_k). nullptr = 1.
struct Descale {
  const float* ptr = nullptr;
  int64_t batch_stride = 0, head_stride = 0;
  double at(const Params& p, int64_t b, int64_t h, int64_t heads) const {
    if (!ptr) return 1.0;
    const int64_t hk = h / (heads / p.num_heads_k);
    return ptr[b * batch_stride + hk * head_stride];
  }
};

int64_t dense_start(const Params& p, int64_t b, bool is_q) {
  if (p.is_varlen) return is_q ? p.cu_seqlens_q[b] : p.cu_seqlens_k[b];
  return b * (is_q ? p.seqlen_q : p.seqlen_k);
}

// Copies a strided [batch, rows, heads, dim] (or varlen [rows, heads, dim]) tensor into a dense
// float64 [total_rows, heads, dim] array.
// An e4m3 tensor's elements are multiplied by their descale (in float64, exactly).
std::vector<double> load_dense(const Params& p, bool is_q, const void* base, int64_t batch_stride,
                               int64_t row_stride, int64_t head_stride, int64_t heads, int64_t dim,
                               const Descale& descale = {}) {
  const int64_t total = is_q ? total_q(p) : total_k(p);
  std::vector<double> dense(static_cast<size_t>(total * heads * dim));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t len = is_q ? p.q_len(b) : p.k_len(b);
    const int64_t start = is_q ? p.q_start(b) : p.k_start(b);
    const int64_t row0 = dense_start(p, b, is_q);
    for (int64_t i = 0; i < len; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t src = b * batch_stride + (start + i) * row_stride + h * head_stride;
        double* dst = &dense[static_cast<size_t>(((row0 + i) * heads + h) * dim)];
        const double scale = descale.at(p, b, h, heads);
        for (int64_t d = 0; d < dim; ++d) dst[d] = load_element(base, p.dtype, src + d) * scale;
      }
    }
  }
  return dense;
}

void require_host(const Params& p) {
  if (p.device != Device::cpu) {
    throw Error("device: expected host (cpu) tensors for the float64 reference, got cuda");
  }
}

// One query row of one head: the visible keys [lo, hi), their final scores s, their tanh values
// (softcap), the probabilities and the lse. Shared by forward and backward so both see the same S.
struct Row {
  int64_t lo = 0, hi = 0;
  std::vector<double> s, t, prob;
  double lse = -std::numeric_limits<double>::infinity();
};

struct Inputs {
  std::vector<double> q, k, v;
};

void score_row(const Params& p, const Rounder& rnd, const Inputs& in, int64_t b, int64_t h, int64_t i,
               Row& row) {
  const int64_t len_q = p.q_len(b), len_k = p.k_len(b);
  const int64_t hk = h / (p.num_heads / p.num_heads_k);
  const detail::KeyRange range = detail::visible_keys(p, i, len_q, len_k);
  row.lo = range.lo;
  row.hi = range.hi;
  const int64_t n = range.hi - range.lo;
  row.s.assign(static_cast<size_t>(n), 0.0);
  row.t.assign(static_cast<size_t>(n), 0.0);
  row.prob.assign(static_cast<size_t>(n), 0.0);
  row.lse = -std::numeric_limits<double>::infinity();
  if (n == 0) return;
  const double scale = p.softmax_scale, softcap = p.softcap;
  const double* qi = &in.q[static_cast<size_t>(((dense_start(p, b, true) + i) * p.num_heads + h) * p.head_dim)];
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t jj = 0; jj < n; ++jj) {
    const int64_t j = range.lo + jj;
    const double* kj =
        &in.k[static_cast<size_t>(((dense_start(p, b, false) + j) * p.num_heads_k + hk) * p.head_dim)];
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < p.head_dim; ++d) dot += qi[d] * kj[d];
    double s = rnd(rnd(dot) * scale);
    if (softcap > 0.0) {
      const double t = rnd(std::tanh(rnd(s / softcap)));
      row.t[jj] = t;
      s = rnd(softcap * t);
    }
    s = rnd(s + static_cast<double>(detail::alibi_bias(p, b, h, i, j, len_q, len_k)));
    row.s[jj] = s;
    m = std::max(m, s);
  }
  double sum = 0.0;
  for (int64_t jj = 0; jj < n; ++jj) sum += std::exp(row.s[jj] - m);
  row.lse = rnd(m + std::log(sum));
  // Exact (f64): each key's share exp(s − m) / sum. exp(s − lse) needs lse to keep log(sum) beside
  // m, which float64 does not once |m| passes ~1e16 (tied keys then each got probability 1). In the
  // input precision, the kernels' own formula exp(s − lse) with lse rounded: the naive computation
  // the accuracy criterion compares against.
  for (int64_t jj = 0; jj < n; ++jj)
    row.prob[jj] = rnd.prec == Precision::f64 ? std::exp(row.s[jj] - m) / sum : rnd(std::exp(row.s[jj] - row.lse));
}

// q, k and v in float64, dense, times their descales (e4m3).
Inputs load_inputs(const Params& p) {
  Inputs in;
  in.q = load_dense(p, true, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.num_heads, p.head_dim,
                    {p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride});
  in.k = load_dense(p, false, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.num_heads_k, p.head_dim,
                    {p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride});
  in.v = load_dense(p, false, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.num_heads_k, p.head_dim_v,
                    {p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride});
  return in;
}

}  // namespace

int64_t total_q(const Params& p) { return p.is_varlen ? p.cu_seqlens_q[p.batch] : p.batch * p.seqlen_q; }
int64_t total_k(const Params& p) { return p.is_varlen ? p.cu_seqlens_k[p.batch] : p.batch * p.seqlen_k; }

void forward(const Params& p, Precision prec, double* out, double* lse) {
  require_host(p);
  const Rounder rnd{prec, p.dtype};
  const Inputs in = load_inputs(p);
  const int64_t tq = total_q(p);
  const int64_t group = p.num_heads / p.num_heads_k;
  const int64_t work = p.batch * p.num_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t b = w / p.num_heads, h = w % p.num_heads, hk = h / group;
    Row row;
    for (int64_t i = 0; i < p.q_len(b); ++i) {
      score_row(p, rnd, in, b, h, i, row);
      const int64_t r = dense_start(p, b, true) + i;
      lse[h * tq + r] = row.lse;
      double* o = &out[(r * p.num_heads + h) * p.head_dim_v];
      for (int64_t d = 0; d < p.head_dim_v; ++d) o[d] = 0.0;
      for (int64_t jj = 0; jj < row.hi - row.lo; ++jj) {
        const double* vj =
            &in.v[static_cast<size_t>(((dense_start(p, b, false) + row.lo + jj) * p.num_heads_k + hk) * p.head_dim_v)];
        for (int64_t d = 0; d < p.head_dim_v; ++d) o[d] += row.prob[jj] * vj[d];
      }
      for (int64_t d = 0; d < p.head_dim_v; ++d) o[d] = rnd(o[d]);
    }
  }
}

void backward(const Params& p, Precision prec, double* dq, double* dk, double* dv) {
  require_host(p);
  if (!p.dout) throw Error("dout: expected a tensor for the reference backward, got none");
  const Rounder rnd{prec, p.dtype};
  const Inputs in = load_inputs(p);
  const std::vector<double> dout =
      load_dense(p, true, p.dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride, p.num_heads, p.head_dim_v);
  const int64_t group = p.num_heads / p.num_heads_k;
  const int64_t work = p.batch * p.num_heads_k;
  const double scale = p.softmax_scale;
  const int64_t D = p.head_dim, Dv = p.head_dim_v;
  // One work item per (sequence, KV head): it owns its dk/dv rows, so GQA sums need no atomics.
#pragma omp parallel for schedule(dynamic)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t b = w / p.num_heads_k, hk = w % p.num_heads_k;
    const int64_t len_q = p.q_len(b), len_k = p.k_len(b);
    const int64_t q0 = dense_start(p, b, true), k0 = dense_start(p, b, false);
    std::vector<double> dk_sum(static_cast<size_t>(len_k * D), 0.0), dv_sum(static_cast<size_t>(len_k * Dv), 0.0);
    std::vector<double> dk_acc(dk_sum.size()), dv_acc(dv_sum.size());
    std::vector<double> o(static_cast<size_t>(Dv)), ds;
    Row row;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
      for (int64_t i = 0; i < len_q; ++i) {
        score_row(p, rnd, in, b, h, i, row);
        const int64_t n = row.hi - row.lo;
        double* dqi = &dq[((q0 + i) * p.num_heads + h) * D];
        for (int64_t d = 0; d < D; ++d) dqi[d] = 0.0;
        if (n == 0) continue;
        const double* qi = &in.q[static_cast<size_t>(((q0 + i) * p.num_heads + h) * D)];
        const double* doi = &dout[static_cast<size_t>(((q0 + i) * p.num_heads + h) * Dv)];
        auto k_row = [&](int64_t j) { return &in.k[static_cast<size_t>(((k0 + j) * p.num_heads_k + hk) * D)]; };
        auto v_row = [&](int64_t j) { return &in.v[static_cast<size_t>(((k0 + j) * p.num_heads_k + hk) * Dv)]; };
        // O and D = rowsum(dO ∘ O) of this row (FA-2 Alg. 2's preprocess).
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t jj = 0; jj < n; ++jj) {
          const double* vj = v_row(row.lo + jj);
          for (int64_t d = 0; d < Dv; ++d) o[d] += row.prob[jj] * vj[d];
        }
        double delta = 0.0;
        for (int64_t d = 0; d < Dv; ++d) delta += doi[d] * rnd(o[d]);
        delta = rnd(delta);
        ds.assign(static_cast<size_t>(n), 0.0);
        for (int64_t jj = 0; jj < n; ++jj) {
          const double* vj = v_row(row.lo + jj);
          double dp = 0.0;
#pragma omp simd reduction(+ : dp)
          for (int64_t d = 0; d < Dv; ++d) dp += doi[d] * vj[d];
          double dsj = rnd(row.prob[jj] * (rnd(dp) - delta));
          if (p.softcap > 0.0f) dsj = rnd(dsj * (1.0 - row.t[jj] * row.t[jj]));
          ds[jj] = dsj;
        }
        for (int64_t jj = 0; jj < n; ++jj) {
          const int64_t j = row.lo + jj;
          const double* kj = k_row(j);
          double* dkj = &dk_acc[static_cast<size_t>(j * D)];
          double* dvj = &dv_acc[static_cast<size_t>(j * Dv)];
          for (int64_t d = 0; d < D; ++d) {
            dqi[d] += ds[jj] * kj[d];
            dkj[d] += ds[jj] * qi[d];
          }
          for (int64_t d = 0; d < Dv; ++d) dvj[d] += row.prob[jj] * doi[d];
        }
        for (int64_t d = 0; d < D; ++d) dqi[d] = rnd(rnd(dqi[d]) * scale);
      }
      // This query head's contribution, rounded as its own matmul output would be, then summed
      // over the group (PyTorch: the gradient of repeat_interleave).
      for (size_t x = 0; x < dk_acc.size(); ++x) dk_sum[x] += rnd(rnd(dk_acc[x]) * scale);
      for (size_t x = 0; x < dv_acc.size(); ++x) dv_sum[x] += rnd(dv_acc[x]);
    }
    for (int64_t j = 0; j < len_k; ++j) {
      double* dkj = &dk[((k0 + j) * p.num_heads_k + hk) * D];
      double* dvj = &dv[((k0 + j) * p.num_heads_k + hk) * Dv];
      for (int64_t d = 0; d < D; ++d) dkj[d] = rnd(dk_sum[static_cast<size_t>(j * D + d)]);
      for (int64_t d = 0; d < Dv; ++d) dvj[d] = rnd(dv_sum[static_cast<size_t>(j * Dv + d)]);
    }
  }
}

}  // namespace flashattn::reference

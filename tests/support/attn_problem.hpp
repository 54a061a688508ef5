// One attention problem for the accuracy tests of any backend: a readable config (also the gtest
// name), host tensors filled with fresh N(0, 1) inputs and poisoned outputs, the AttentionParams
// over them, and the float64 / input-precision references in the same dense order as ours.
// A GPU test copies the host tensors' storage (strides included) to the device and back.
#pragma once

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attn_test_support.hpp"
#include "common/params.hpp"
#include "reference/reference.hpp"

namespace flashattn::testing {

enum class Alibi { none, per_head, per_batch_head };

// The FP8 forward's q_descale, k_descale, v_descale (e4m3 problems only): not given, one value as a
// rank-0 tensor, one value as shape [1], or one per (batch, KV head); values uniform in [0.5, 2].
enum class Descale { none, scalar, per_tensor, per_head };

struct ProblemConfig {
  DType dtype = DType::f32;
  int64_t batch = 1;
  int64_t seqlen_q = 1, seqlen_k = 1;  // batched lengths (ignored when lens_q is set)
  std::vector<int32_t> lens_q, lens_k;  // varlen when non-empty: one length per sequence
  int64_t num_heads = 1, num_heads_k = 1;
  int64_t head_dim = 64;
  int64_t head_dim_v = 0;  // 0 = head_dim
  bool causal = false;
  CausalAlign align = CausalAlign::bottom_right;
  int64_t window_size_left = -1, window_size_right = -1;
  float softcap = 0.0f;
  float softmax_scale = 0.0f;
  Alibi alibi = Alibi::none;
  Layout layout = Layout::contiguous;  // of every attention tensor (q ... dv, lse)
  bool with_lse = true;
  int num_threads = 0;
  bool deterministic = false;
  Descale descale = Descale::none;  // e4m3 only
  double stddev = 1.0;              // q, k, v ~ N(0, stddev²) before rounding to dtype
  std::string tag;  // optional prefix for the name, e.g. "Large"

  // A batched problem of these sizes, every other field at its default.
  static ProblemConfig batched(DType dt, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d) {
    ProblemConfig c;
    c.dtype = dt;
    c.batch = b;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.num_heads = h;
    c.num_heads_k = hk;
    c.head_dim = d;
    return c;
  }

  bool varlen() const { return !lens_q.empty(); }
  int64_t dv() const { return head_dim_v ? head_dim_v : head_dim; }
  // out's dtype: dtype's, except bf16 for e4m3 inputs (FlashAttention-3's FP8 forward).
  DType out_dtype() const { return dtype == DType::e4m3 ? DType::bf16 : dtype; }

  // A gtest-safe name: letters, digits and underscores only.
  std::string name() const {
    std::string n = tag.empty() ? "" : tag + "_";
    n += dtype_name(dtype);
    if (varlen()) {
      n += "_varlen";
      for (size_t b = 0; b < lens_q.size(); ++b) n += "_" + std::to_string(lens_q[b]) + "x" + std::to_string(lens_k[b]);
    } else {
      n += "_b" + std::to_string(batch) + "_sq" + std::to_string(seqlen_q) + "_sk" + std::to_string(seqlen_k);
    }
    n += "_h" + std::to_string(num_heads) + "k" + std::to_string(num_heads_k) + "_d" + std::to_string(head_dim);
    if (dv() != head_dim) n += "_dv" + std::to_string(dv());
    if (causal) n += align == CausalAlign::bottom_right ? "_causalBR" : "_causalTL";
    if (window_size_left >= 0 || window_size_right >= 0) {
      n += "_win" + (window_size_left < 0 ? std::string("inf") : std::to_string(window_size_left)) + "_" +
           (window_size_right < 0 ? std::string("inf") : std::to_string(window_size_right));
      if (!causal) n += align == CausalAlign::bottom_right ? "BR" : "TL";
    }
    if (softcap > 0) n += "_softcap" + std::to_string(static_cast<int>(softcap));
    if (softmax_scale != 0) {
      n += std::string("_scale") + (softmax_scale < 0 ? "minus" : "") +
           std::to_string(static_cast<int>(std::fabs(softmax_scale) * 1000));
    }
    if (alibi == Alibi::per_head) n += "_alibiH";
    if (alibi == Alibi::per_batch_head) n += "_alibiBH";
    if (layout != Layout::contiguous) n += std::string("_") + layout_name(layout);
    if (descale == Descale::scalar) n += "_descaleScalar";
    if (descale == Descale::per_tensor) n += "_descaleTensor";
    if (descale == Descale::per_head) n += "_descaleHead";
    if (stddev != 1.0) n += "_std" + std::to_string(static_cast<int>(stddev * 100));
    if (!with_lse) n += "_nolse";
    if (num_threads) n += "_t" + std::to_string(num_threads);
    return n;
  }
};

// Dense float64 results in the reference's order: out [total_q, num_heads, head_dim_v],
// lse [num_heads, total_q], dq [total_q, num_heads, head_dim], dk/dv [total_k, num_heads_k, ...].
struct DenseResults {
  std::vector<double> out, lse, dq, dk, dv;
};

class Problem {
 public:
  Problem(const ProblemConfig& cfg, uint64_t seed) : cfg_(cfg), rng_(seed) {
    const DType dt = cfg.dtype;
    const Layout lay = cfg.layout;
    const int64_t H = cfg.num_heads, Hk = cfg.num_heads_k, D = cfg.head_dim, Dv = cfg.dv();
    if (cfg.varlen()) {
      const int64_t B = static_cast<int64_t>(cfg.lens_q.size());
      std::vector<int32_t> cq(B + 1, 0), ck(B + 1, 0);
      for (int64_t b = 0; b < B; ++b) {
        cq[b + 1] = cq[b] + cfg.lens_q[b];
        ck[b + 1] = ck[b] + cfg.lens_k[b];
      }
      total_q_ = cq[B];
      total_k_ = ck[B];
      cu_q_ = HostTensor(DType::i32, {B + 1});
      cu_k_ = HostTensor(DType::i32, {B + 1});
      std::vector<double> cqd(cq.begin(), cq.end()), ckd(ck.begin(), ck.end());
      cu_q_.set(cqd);
      cu_k_.set(ckd);
      batch_ = B;
      q = HostTensor(dt, {total_q_, H, D}, lay);
      k = HostTensor(dt, {total_k_, Hk, D}, lay);
      v = HostTensor(dt, {total_k_, Hk, Dv}, lay);
      out = HostTensor(cfg.out_dtype(), {total_q_, H, Dv}, lay);
      lse = HostTensor(DType::f32, {H, total_q_}, lay);
    } else {
      batch_ = cfg.batch;
      total_q_ = cfg.batch * cfg.seqlen_q;
      total_k_ = cfg.batch * cfg.seqlen_k;
      q = HostTensor(dt, {cfg.batch, cfg.seqlen_q, H, D}, lay);
      k = HostTensor(dt, {cfg.batch, cfg.seqlen_k, Hk, D}, lay);
      v = HostTensor(dt, {cfg.batch, cfg.seqlen_k, Hk, Dv}, lay);
      out = HostTensor(cfg.out_dtype(), {cfg.batch, cfg.seqlen_q, H, Dv}, lay);
      lse = HostTensor(DType::f32, {cfg.batch, H, cfg.seqlen_q}, lay);
    }
    dout = HostTensor(cfg.out_dtype(), out.shape(), lay);
    dq = HostTensor(dt, q.shape(), lay);
    dk = HostTensor(dt, k.shape(), lay);
    dv = HostTensor(dt, v.shape(), lay);
    q.fill_normal(rng_, cfg.stddev);
    k.fill_normal(rng_, cfg.stddev);
    v.fill_normal(rng_, cfg.stddev);
    dout.fill_normal(rng_);
    if (cfg.descale != Descale::none) {
      std::uniform_real_distribution<double> u(0.5, 2.0);
      for (HostTensor* d : {&q_descale_, &k_descale_, &v_descale_}) {
        *d = cfg.descale == Descale::per_head ? HostTensor(DType::f32, {batch_, Hk}) : HostTensor(DType::f32, {1});
        std::vector<double> x(static_cast<size_t>(d->numel()));
        for (double& e : x) e = u(rng_);
        d->set(x);
      }
    }
    if (cfg.alibi == Alibi::per_head) {
      // The geometric slopes of Press et al. 2022: 2^(-8 (h + 1) / H).
      alibi_ = HostTensor(DType::f32, {H});
      std::vector<double> s(H);
      for (int64_t h = 0; h < H; ++h) s[h] = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(H));
      alibi_.set(s);
    } else if (cfg.alibi == Alibi::per_batch_head) {
      alibi_ = HostTensor(DType::f32, {batch_, H});
      std::uniform_real_distribution<double> u(0.01, 1.0);
      std::vector<double> s(static_cast<size_t>(batch_ * H));
      for (double& x : s) x = u(rng_);
      alibi_.set(s);
    }
  }

  HostTensor q, k, v, out, lse, dout, dq, dk, dv;

  const ProblemConfig& config() const { return cfg_; }
  int64_t total_q() const { return total_q_; }
  int64_t total_k() const { return total_k_; }

  AttentionParams params() {
    AttentionParams a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    if (cfg_.with_lse) a.lse = lse.view();
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    if (cfg_.varlen()) {
      a.cu_seqlens_q = cu_q_.view();
      a.cu_seqlens_k = cu_k_.view();
    }
    a.alibi_slopes = alibi_.view();
    a.softmax_scale = cfg_.softmax_scale;
    a.causal = cfg_.causal;
    a.causal_align = cfg_.align;
    a.window_size_left = cfg_.window_size_left;
    a.window_size_right = cfg_.window_size_right;
    a.softcap = cfg_.softcap;
    a.deterministic = cfg_.deterministic;
    a.num_threads = cfg_.num_threads;
    a.q_descale = descale_view(q_descale_);
    a.k_descale = descale_view(k_descale_);
    a.v_descale = descale_view(v_descale_);
    return a;
  }

  // A descale tensor's view as the config asks: rank 0 (one value) for Descale::scalar.
  TensorView descale_view(HostTensor& d) const {
    TensorView t = d.view();
    if (cfg_.descale == Descale::scalar) t.ndim = 0;
    return t;
  }
  HostTensor& descale(int which) { return which == 0 ? q_descale_ : which == 1 ? k_descale_ : v_descale_; }

  // The references (forward, and backward when `backward`), computed once and cached.
  const DenseResults& reference(reference::Precision prec, bool backward) {
    DenseResults& r = prec == reference::Precision::f64 ? ref64_ : naive_;
    const detail::Params p = detail::validate(params(), backward ? Pass::backward : Pass::forward);
    if (r.out.empty() && total_q_ * cfg_.num_heads * cfg_.dv() > 0) {
      r.out.resize(static_cast<size_t>(total_q_ * cfg_.num_heads * cfg_.dv()));
      r.lse.resize(static_cast<size_t>(total_q_ * cfg_.num_heads));
      reference::forward(p, prec, r.out.data(), r.lse.data());
    }
    if (backward && r.dq.empty()) {
      r.dq.resize(static_cast<size_t>(total_q_ * cfg_.num_heads * cfg_.head_dim));
      r.dk.resize(static_cast<size_t>(total_k_ * cfg_.num_heads_k * cfg_.head_dim));
      r.dv.resize(static_cast<size_t>(total_k_ * cfg_.num_heads_k * cfg_.dv()));
      reference::backward(p, prec, r.dq.data(), r.dk.data(), r.dv.data());
    }
    return r;
  }

  // Our lse in the reference's [num_heads, total_q] order.
  std::vector<double> lse_dense() const {
    const std::vector<double> l = lse.to_dense();
    if (cfg_.varlen()) return l;  // already [num_heads, total_q]
    std::vector<double> r(l.size());
    const int64_t H = cfg_.num_heads, S = cfg_.seqlen_q;
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; ++i) r[static_cast<size_t>(h * total_q_ + b * S + i)] = l[static_cast<size_t>((b * H + h) * S + i)];
    return r;
  }

 private:
  ProblemConfig cfg_;
  std::mt19937_64 rng_;
  int64_t batch_ = 0, total_q_ = 0, total_k_ = 0;
  HostTensor cu_q_, cu_k_, alibi_, q_descale_, k_descale_, v_descale_;
  DenseResults ref64_, naive_;
};

}  // namespace flashattn::testing

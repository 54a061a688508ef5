// The float64 oracle checked on its own: hand-computed tiny cases (plain, causal, softcap, ALiBi,
// fully masked rows) and a finite-difference check of its backward (central differences of
// L = Σ out ∘ dout on tiny fp32 problems, where the reference is exact up to float64 rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attn_problem.hpp"

namespace flashattn::testing {
namespace {

using reference::Precision;

struct Tiny {
  std::vector<double> out, lse;
};

Tiny run_forward(Problem& pr, Precision prec = Precision::f64) {
  const detail::Params p = detail::validate(pr.params(), Pass::forward);
  Tiny t;
  t.out.resize(static_cast<size_t>(pr.total_q() * p.num_heads * p.head_dim_v));
  t.lse.resize(static_cast<size_t>(pr.total_q() * p.num_heads));
  reference::forward(p, prec, t.out.data(), t.lse.data());
  return t;
}

ProblemConfig tiny(int64_t sq, int64_t sk) {
  ProblemConfig c;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.head_dim = 1;
  c.softmax_scale = 1.0f;
  return c;
}

TEST(ReferenceForward, HandComputedTwoKeys) {
  Problem pr(tiny(1, 2), 1);
  pr.q.set({1.0});
  pr.k.set({0.0, 1.0});
  pr.v.set({2.0, -1.0});
  const Tiny t = run_forward(pr);
  const double e = std::exp(1.0);
  EXPECT_NEAR(t.lse[0], std::log(1.0 + e), 1e-15);
  EXPECT_NEAR(t.out[0], (2.0 - e) / (1.0 + e), 1e-15);
}

// Scores near 1e20: lse = m + log(sum) rounds to m in float64, and the probabilities must still be
// each key's share (they summed to the number of tied keys when taken as exp(s − lse)).
TEST(ReferenceForward, HugeTiedScoresKeepTheirShares) {
  Problem pr(tiny(1, 4), 1);
  pr.q.set({1e20});
  pr.k.set({1.0, 1.0, 1.0, 1.0});
  pr.v.set({1.0, 2.0, 3.0, 6.0});
  const Tiny t = run_forward(pr);
  EXPECT_DOUBLE_EQ(t.out[0], 3.0);
  EXPECT_EQ(t.lse[0], static_cast<double>(1e20f));  // the score itself (q is stored as float): log 4 is
                                                     // below half an ulp of it
}

TEST(ReferenceForward, HandComputedSoftcapAndAlibi) {
  ProblemConfig c = tiny(1, 2);
  c.softcap = 2.0f;
  c.alibi = Alibi::per_head;  // H = 1: slope 2^-8
  Problem pr(c, 1);
  pr.q.set({3.0});
  pr.k.set({1.0, -0.5});
  pr.v.set({1.0, 4.0});
  const Tiny t = run_forward(pr);
  // Bottom-right: offset = 1, bias_j = -slope * |0 + 1 - j|.
  const double slope = std::exp2(-8.0);
  const double s0 = 2.0 * std::tanh(3.0 / 2.0) - slope, s1 = 2.0 * std::tanh(-1.5 / 2.0);
  const double lse = std::log(std::exp(s0) + std::exp(s1));
  EXPECT_NEAR(t.lse[0], lse, 1e-12);
  EXPECT_NEAR(t.out[0], std::exp(s0 - lse) * 1.0 + std::exp(s1 - lse) * 4.0, 1e-12);
}

TEST(ReferenceForward, CausalAlignments) {
  // seqlen_q = 2, seqlen_k = 3. Bottom-right: row 0 sees keys 0..1, row 1 sees 0..2.
  // Top-left: row 0 sees key 0, row 1 sees 0..1.
  for (CausalAlign align : {CausalAlign::bottom_right, CausalAlign::top_left}) {
    ProblemConfig c = tiny(2, 3);
    c.causal = true;
    c.align = align;
    Problem pr(c, 1);
    pr.q.set({0.5, -1.0});
    pr.k.set({1.0, 2.0, -1.0});
    pr.v.set({1.0, 2.0, 3.0});
    const Tiny t = run_forward(pr);
    const std::vector<double> s0 = {0.5, 1.0, -0.5}, s1 = {-1.0, -2.0, 1.0}, v = {1.0, 2.0, 3.0};
    auto expect_row = [&](int row, const std::vector<double>& s, int nkeys) {
      double sum = 0, o = 0;
      for (int j = 0; j < nkeys; ++j) sum += std::exp(s[j]);
      for (int j = 0; j < nkeys; ++j) o += std::exp(s[j]) / sum * v[j];
      EXPECT_NEAR(t.lse[row], std::log(sum), 1e-14) << "row " << row;
      EXPECT_NEAR(t.out[row], o, 1e-14) << "row " << row;
    };
    const bool br = align == CausalAlign::bottom_right;
    expect_row(0, s0, br ? 2 : 1);
    expect_row(1, s1, br ? 3 : 2);
  }
}

TEST(ReferenceForward, FullyMaskedRowsGiveZeroAndMinusInf) {
  // Bottom-right causal with seqlen_q = 3 > seqlen_k = 1: rows 0 and 1 see no key.
  ProblemConfig c = tiny(3, 1);
  c.causal = true;
  Problem pr(c, 1);
  pr.q.set({1.0, 2.0, 3.0});
  pr.k.set({0.5});
  pr.v.set({7.0});
  const Tiny t = run_forward(pr);
  EXPECT_EQ(t.out[0], 0.0);
  EXPECT_EQ(t.out[1], 0.0);
  EXPECT_TRUE(std::isinf(t.lse[0]) && t.lse[0] < 0);
  EXPECT_TRUE(std::isinf(t.lse[1]) && t.lse[1] < 0);
  EXPECT_NEAR(t.out[2], 7.0, 1e-15);
  EXPECT_NEAR(t.lse[2], 1.5, 1e-15);

  const detail::Params p = detail::validate(pr.params(), Pass::backward);
  std::vector<double> dq(3), dk(1), dv(1);
  pr.dout.set({1.0, 1.0, 1.0});
  reference::backward(p, Precision::f64, dq.data(), dk.data(), dv.data());
  EXPECT_EQ(dq[0], 0.0);
  EXPECT_EQ(dq[1], 0.0);
  EXPECT_NEAR(dv[0], 1.0, 1e-15);  // only row 2 sees the key, with P = 1
}

TEST(ReferenceForward, InputPrecisionIsCloseButNotExact) {
  ProblemConfig c;
  c.dtype = DType::bf16;
  c.seqlen_q = 17;
  c.seqlen_k = 33;
  c.head_dim = 16;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  const Tiny exact = run_forward(pr, Precision::f64), naive = run_forward(pr, Precision::input);
  double err = 0;
  for (size_t i = 0; i < exact.out.size(); ++i) err = std::max(err, std::fabs(exact.out[i] - naive.out[i]));
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 0.1);
}

// ------------------------------------------------------------------------------------------------
// Finite differences. L(q, k, v) = Σ out ∘ dout; the reference's dq/dk/dv must be its gradient.

double loss(Problem& pr, const std::vector<double>& dout) {
  const Tiny t = run_forward(pr);
  double l = 0;
  for (size_t i = 0; i < t.out.size(); ++i) l += t.out[i] * dout[i];
  return l;
}

void check_gradient(Problem& pr, HostTensor& x, const std::vector<double>& grad, const char* name) {
  const std::vector<double> dout = pr.dout.to_dense();
  const std::vector<int64_t> offs = x.logical_offsets();
  double max_grad = 0;
  for (double g : grad) max_grad = std::max(max_grad, std::fabs(g));
  for (size_t e = 0; e < offs.size(); ++e) {
    const double x0 = to_double(DType::f32, x.data(), offs[e]);
    const double h = 1e-3;
    from_double(DType::f32, x.data(), offs[e], x0 + h);
    const double xp = to_double(DType::f32, x.data(), offs[e]);
    const double lp = loss(pr, dout);
    from_double(DType::f32, x.data(), offs[e], x0 - h);
    const double xm = to_double(DType::f32, x.data(), offs[e]);
    const double lm = loss(pr, dout);
    from_double(DType::f32, x.data(), offs[e], x0);
    const double fd = (lp - lm) / (xp - xm);
    EXPECT_NEAR(grad[e], fd, 1e-5 * std::max(1.0, max_grad)) << name << "[" << e << "]";
  }
}

struct FdCase {
  const char* name;
  ProblemConfig cfg;
};

class ReferenceFiniteDifference : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceFiniteDifference, GradientsMatch) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(GetParam().cfg, seed);
  const detail::Params p = detail::validate(pr.params(), Pass::backward);
  std::vector<double> dq(static_cast<size_t>(pr.q.numel())), dk(static_cast<size_t>(pr.k.numel())),
      dv(static_cast<size_t>(pr.v.numel()));
  reference::backward(p, Precision::f64, dq.data(), dk.data(), dv.data());
  check_gradient(pr, pr.q, dq, "dq");
  check_gradient(pr, pr.k, dk, "dk");
  check_gradient(pr, pr.v, dv, "dv");
}

ProblemConfig fd_base() {
  ProblemConfig c;
  c.batch = 2;
  c.seqlen_q = 3;
  c.seqlen_k = 4;
  c.num_heads = 2;
  c.num_heads_k = 1;
  c.head_dim = 3;
  c.head_dim_v = 2;
  return c;
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> cases;
  cases.push_back({"Plain", fd_base()});
  ProblemConfig c = fd_base();
  c.causal = true;
  c.align = CausalAlign::top_left;
  cases.push_back({"CausalTopLeft", c});
  c = fd_base();
  c.window_size_left = 1;
  c.window_size_right = 0;
  cases.push_back({"Window", c});
  c = fd_base();
  c.softcap = 1.5f;
  c.softmax_scale = 0.9f;
  cases.push_back({"Softcap", c});
  c = fd_base();
  c.alibi = Alibi::per_batch_head;
  c.softcap = 3.0f;
  c.causal = true;
  cases.push_back({"AlibiSoftcapCausal", c});
  c = fd_base();
  c.lens_q = {2, 0, 3};
  c.lens_k = {3, 2, 0};
  c.alibi = Alibi::per_head;
  c.layout = Layout::head_major;
  cases.push_back({"VarlenEmptyAlibiStrided", c});
  c = fd_base();
  c.seqlen_q = 4;
  c.seqlen_k = 2;
  c.causal = true;  // bottom-right: rows 0, 1 fully masked
  cases.push_back({"FullyMaskedRows", c});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceFiniteDifference, ::testing::ValuesIn(fd_cases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace flashattn::testing

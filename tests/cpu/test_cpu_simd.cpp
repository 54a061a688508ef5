// The CPU backend's vector layer (src/cpu/simd.hpp) against scalar math. This file is compiled
// without -march=native, so on x86-64 it checks the generic vector path: the one a portable build
// (FLASHATTN_NATIVE=OFF) runs in every target_clones clone. (The AVX-512 path runs in the native
// library under the accuracy tests.) Added with the whole-vector exp2 of session 30, which
// replaced a libm call per lane.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/simd.hpp"

namespace flashattn::testing {
namespace {

namespace simd = cpu::simd;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> apply_exp2(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += simd::kLanes) simd::store(y.data() + i, simd::exp2(simd::load(x.data() + i)));
  return y;
}

TEST(CpuSimd, Exp2MatchesScalarWithinFourUlp) {
  std::vector<float> x;
  for (float v = -126.0f; v < 128.0f; v += 0.0371f) x.push_back(v);
  for (float v : {-126.0f, -125.5f, -0.5f, -0.0f, 0.0f, 0.5f, 1.0f, 127.0f, 127.99f}) x.push_back(v);
  while (x.size() % simd::kLanes) x.push_back(0.0f);
  const std::vector<float> y = apply_exp2(x);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp2(static_cast<double>(x[i]));
    EXPECT_NEAR(y[i], want, 4.0 * 1.2e-7 * want) << "exp2(" << x[i] << ")";
  }
}

TEST(CpuSimd, Exp2EdgesZeroInfAndNaN) {
  // Below -126: exactly 0 (no denormal enters a product); -inf (a masked score): 0; 128 and above:
  // inf; NaN stays NaN.
  std::vector<float> x = {-126.01f, -127.0f, -127.5f, -1e30f, -kInf, 128.0f, 129.0f, 1e30f, kInf, kNaN};
  while (x.size() % simd::kLanes) x.push_back(kNaN);
  const std::vector<float> y = apply_exp2(x);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y[i], 0.0f) << "exp2(" << x[i] << ")";
  EXPECT_FALSE(std::signbit(y[4]));
  for (int i = 5; i < 9; ++i) EXPECT_EQ(y[i], kInf) << "exp2(" << x[i] << ")";
  for (size_t i = 9; i < x.size(); ++i) EXPECT_TRUE(std::isnan(y[i])) << "lane " << i;
}

TEST(CpuSimd, MaxMinFollowTheX86NaNRuleAndNegInfIsReplaced) {
  // max / min return the second operand when either is NaN (MAXPS / MINPS), which the softmax's
  // row maximum relies on to carry a NaN score when it comes second.
  float a[16], b[16], out[16];
  for (int i = 0; i < 16; ++i) {
    a[i] = i % 3 == 0 ? kNaN : float(i);
    b[i] = i % 3 == 1 ? kNaN : (i % 2 ? -kInf : float(16 - i));
  }
  simd::store(out, simd::max(simd::load(a), simd::load(b)));
  for (int i = 0; i < 16; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]))
      EXPECT_EQ(std::isnan(out[i]), std::isnan(b[i])) << i;
    else
      EXPECT_EQ(out[i], a[i] > b[i] ? a[i] : b[i]) << i;
  }
  simd::store(out, simd::min(simd::load(a), simd::load(b)));
  for (int i = 0; i < 16; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]))
      EXPECT_EQ(std::isnan(out[i]), std::isnan(b[i])) << i;
    else
      EXPECT_EQ(out[i], a[i] < b[i] ? a[i] : b[i]) << i;
  }
  simd::store(out, simd::replace_neg_inf(simd::load(b), simd::bcast(7.0f)));
  for (int i = 0; i < 16; ++i) {
    if (b[i] == -kInf)
      EXPECT_EQ(out[i], 7.0f) << i;
    else if (!std::isnan(b[i]))
      EXPECT_EQ(out[i], b[i]) << i;
  }
}

}  // namespace
}  // namespace flashattn::testing

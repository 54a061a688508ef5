// The shared test toolkit (tests/support) checked on its own, so that a lenient criterion or a
// blind poison check cannot make every backend test pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attn_test_support.hpp"

namespace flashattn::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(CheckClose, CriterionAndFloor) {
  const std::vector<double> ref = {1.0, -2.0, 0.5};
  const std::vector<double> naive = {1.01, -2.0, 0.5};  // naive error 0.01
  // Allowed: 2 * 0.01 + 1e-3 * 2 (fp16 floor at max|ref| = 2) = 0.022.
  EXPECT_TRUE(check_close("x", {1.0, -2.021, 0.5}, ref, naive, DType::f16));
  EXPECT_FALSE(check_close("x", {1.0, -2.023, 0.5}, ref, naive, DType::f16));
  // With an exact naive result only the floor remains.
  EXPECT_TRUE(check_close("x", {1.0, -2.0, 0.5 + 1.5e-2}, ref, ref, DType::bf16));
  EXPECT_FALSE(check_close("x", {1.0, -2.0, 0.5 + 1.7e-2}, ref, ref, DType::bf16));
  EXPECT_TRUE(check_close("x", {1.0, -2.0 + 1.9e-5, 0.5}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("x", {1.0, -2.0 + 2.1e-5, 0.5}, ref, ref, DType::f32));
}

TEST(CheckClose, NaNAndInfinityNeverPass) {
  const std::vector<double> ref = {1.0, -kInf};
  EXPECT_TRUE(check_close("lse", {1.0, -kInf}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("lse", {std::nan(""), -kInf}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("lse", {1.0, std::nan("")}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("lse", {1.0, -1e30}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("lse", {kInf, -kInf}, ref, ref, DType::f32));
  EXPECT_FALSE(check_close("lse", {1.0}, ref, ref, DType::f32));
  const ::testing::AssertionResult r = check_close("out", {1.5, -kInf}, ref, ref, DType::f16);
  EXPECT_NE(std::string(r.message()).find("max|ours - ref| = 0.5"), std::string::npos) << r.message();
}

TEST(HostTensor, LayoutsCoverEveryElementOnce) {
  for (Layout lay : {Layout::contiguous, Layout::padded, Layout::head_major}) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
      HostTensor t(dt, {2, 3, 4, 5}, lay);
      EXPECT_EQ(t.stride()[3], 1);
      std::vector<int64_t> offs = t.logical_offsets();
      std::sort(offs.begin(), offs.end());
      EXPECT_EQ(std::adjacent_find(offs.begin(), offs.end()), offs.end()) << layout_name(lay);
      EXPECT_LT(offs.back(), t.storage_numel());
      if (lay == Layout::contiguous) EXPECT_EQ(t.storage_numel(), 120);
      if (lay != Layout::contiguous) EXPECT_GT(t.storage_numel(), 120);
      if (lay == Layout::head_major) EXPECT_GT(t.stride()[2], t.stride()[1]);  // heads outside rows
      EXPECT_FALSE(t.all_written("t"));
      EXPECT_TRUE(t.padding_intact("t"));
      std::mt19937_64 rng(1);
      t.fill_normal(rng);
      EXPECT_TRUE(t.all_written("t"));
      EXPECT_TRUE(t.padding_intact("t"));
      for (double x : t.to_dense()) EXPECT_EQ(x, round_to(dt, x));
      if (lay != Layout::contiguous) {
        // Write one padding element: the check must notice.
        std::vector<char> logical(static_cast<size_t>(t.storage_numel()), 0);
        for (int64_t off : t.logical_offsets()) logical[static_cast<size_t>(off)] = 1;
        const int64_t pad = std::find(logical.begin(), logical.end(), 0) - logical.begin();
        from_double(dt, t.data(), pad, 0.0);
        EXPECT_FALSE(t.padding_intact("t"));
      }
    }
  }
}

TEST(HostTensor, ViewMatchesShapeAndStrides) {
  HostTensor t(DType::bf16, {3, 4, 5}, Layout::head_major);
  const TensorView v = t.view();
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.dtype, DType::bf16);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(v.shape[d], t.shape()[d]);
    EXPECT_EQ(v.stride[d], t.stride()[d]);
  }
  EXPECT_FALSE(HostTensor().view().defined());
}

TEST(HostTensor, BitwiseEqual) {
  HostTensor a(DType::f16, {4, 4});
  std::mt19937_64 rng(2);
  a.fill_normal(rng);
  HostTensor b = a;
  EXPECT_TRUE(bitwise_equal("a", a, b));
  from_double(DType::f16, b.data(), 5, to_double(DType::f16, b.data(), 5) + 1.0);
  EXPECT_FALSE(bitwise_equal("a", a, b));
}

}  // namespace
}  // namespace flashattn::testing

// exp2_fma (kernel_utils.cuh), the FP8 forward's exponential on the FMA pipe: relative error within
// the fitted polynomial's 8.6e-5 (plus float rounding) over the softmax's range, exact 0 where the
// hardware ex2.approx gives 0 (x = -inf and x <= -127, the masked scores), NaN kept NaN.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/kernel_utils.cuh"
#include "gpu_test_support.hpp"

namespace flashattn::testing {
namespace {

__global__ void exp2_fma_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cuda::exp2_fma(x[i]);
}

// exp2_fma of every x, through the suites' poisoned device buffers (DeviceTensor).
std::vector<float> run_exp2_fma(const std::vector<float>& x) {
  const int n = static_cast<int>(x.size());
  DeviceTensor dx(DType::f32, {n}), dy(DType::f32, {n});
  dx.set(std::vector<double>(x.begin(), x.end()));
  exp2_fma_kernel<<<(n + 255) / 256, 256>>>(static_cast<const float*>(dx.data()), static_cast<float*>(dy.data()), n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<double> y = dy.to_dense();  // synchronizes, and throws on a kernel error
  EXPECT_TRUE(dy.all_written("exp2_fma"));
  return std::vector<float>(y.begin(), y.end());
}

TEST(CudaExp2Fma, RelativeErrorOverTheSoftmaxRange) {
  FLASHATTN_REQUIRE_GPU();
  // Fresh points in [-126, 8] (the FP8 softmax's exponents: scores minus the row max, plus 8),
  // and every integer and half-integer there (the polynomial's ends and middle).
  std::mt19937_64 rng(fresh_seed());
  std::uniform_real_distribution<float> u(-126.f, 8.f);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(u(rng));
  for (int k = -252; k <= 16; ++k) x.push_back(0.5f * float(k));
  const std::vector<float> y = run_exp2_fma(x);
  double worst = 0.0;
  float worst_x = 0.f;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp2(double(x[i]));
    const double rel = std::fabs(double(y[i]) - ref) / ref;
    if (!(rel <= worst)) {
      worst = rel;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 1e-4) << "at x = " << worst_x;
}

TEST(CudaExp2Fma, MaskedScoresGiveZeroAndNaNStaysNaN) {
  FLASHATTN_REQUIRE_GPU();
  const std::vector<float> x = {-INFINITY, -1e30f, -200.f, -127.f, std::nanf(""), 0.f};
  const std::vector<float> y = run_exp2_fma(x);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], 0.f) << "x = " << x[i];
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], 1.f);
}

}  // namespace
}  // namespace flashattn::testing

// The CLI's checker must fail when it should: a perturbed, NaN or unwritten output, or a wrong
// −inf, turns its row to FAIL; a correct run passes; head slicing and the FLOP formula agree with
// their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "commands/common.hpp"

namespace flashattn::cli {
namespace {

ProblemSpec small_spec(DType dtype) {
  ProblemSpec s;
  s.dtype = dtype;
  s.batch = 2;
  s.seqlen_q = 19;
  s.seqlen_k = 23;
  s.num_heads = 4;
  s.num_heads_k = 2;
  s.head_dim = 32;
  s.backward = true;
  s.options.causal = true;
  return s;
}

const ErrorRow& row(const std::vector<ErrorRow>& rows, const std::string& name) {
  for (const ErrorRow& r : rows) {
    if (r.name == name) return r;
  }
  throw std::runtime_error("no row " + name);
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(std::random_device{}());
  return g;
}

TEST(CliCheck, CorrectRunPassesEveryOutput) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const ProblemSpec s = small_spec(dtype);
    Tensors t = make_problem(s, rng());
    run_attention(t, s.options, Device::cpu);
    const auto rows = compare_with_reference(make_params(t, s.options), true);
    ASSERT_EQ(rows.size(), 5u);
    for (const ErrorRow& r : rows) EXPECT_TRUE(r.pass) << r.name << " err " << r.max_abs << " bound " << r.bound;
  }
}

TEST(CliCheck, PerturbedNanAndUnwrittenOutputsFail) {
  const ProblemSpec s = small_spec(DType::f32);
  Tensors t = make_problem(s, rng());
  run_attention(t, s.options, Device::cpu);
  auto* out = reinterpret_cast<float*>(t.out.data.data());
  auto* dq = reinterpret_cast<float*>(t.dq.data.data());
  auto* dv = reinterpret_cast<float*>(t.dv.data.data());
  out[37] += 1e-3f;
  dq[5] = std::numeric_limits<float>::quiet_NaN();
  dv[t.dv.numel() - 1] = std::numeric_limits<float>::infinity();
  const auto rows = compare_with_reference(make_params(t, s.options), true);
  EXPECT_FALSE(row(rows, "out").pass);
  EXPECT_EQ(row(rows, "out").bad, 0);
  EXPECT_GE(row(rows, "out").max_abs, 0.9e-3);
  EXPECT_FALSE(row(rows, "dq").pass);
  EXPECT_EQ(row(rows, "dq").bad, 1);
  EXPECT_FALSE(row(rows, "dv").pass);
  EXPECT_TRUE(row(rows, "lse").pass);
  EXPECT_TRUE(row(rows, "dk").pass);
}

TEST(CliCheck, LseOfARowThatSeesNoKeyMustBeMinusInfinity) {
  // Bottom-right causal with seqlen_q > seqlen_k: the first seqlen_q − seqlen_k rows see no key.
  ProblemSpec s = small_spec(DType::f32);
  s.seqlen_q = 23;
  s.seqlen_k = 19;
  s.backward = false;
  Tensors t = make_problem(s, rng());
  run_attention(t, s.options, Device::cpu);
  auto* lse = reinterpret_cast<float*>(t.lse.data.data());  // [batch, heads, seqlen_q]
  ASSERT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  EXPECT_TRUE(row(compare_with_reference(make_params(t, s.options), false), "lse").pass);
  lse[0] = 0.0f;
  const ErrorRow r = row(compare_with_reference(make_params(t, s.options), false), "lse");
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.bad, 1);
}

TEST(CliCheck, SlicedHeadsCompareTheirOwnRows) {
  ProblemSpec s = small_spec(DType::f32);
  s.num_heads = 8;
  s.num_heads_k = 2;
  Tensors t = make_problem(s, rng());
  run_attention(t, s.options, Device::cpu);
  const AttentionParams full = make_params(t, s.options);
  for (const ErrorRow& r : compare_with_reference(slice_heads(full, 4, 4), true)) EXPECT_TRUE(r.pass) << r.name;
  // Corrupt head 1 (in KV group 0): the slice of group 1 still passes, group 0 fails.
  auto* out = reinterpret_cast<float*>(t.out.data.data());
  out[1 * s.head_dim + 3] += 0.5f;  // row 0, head 1
  EXPECT_TRUE(row(compare_with_reference(slice_heads(full, 4, 4), false), "out").pass);
  EXPECT_FALSE(row(compare_with_reference(slice_heads(full, 0, 4), false), "out").pass);
  EXPECT_THROW(slice_heads(full, 2, 4), Error);  // not whole KV groups
}

TEST(CliCheck, VarlenWithAnEmptySequencePasses) {
  ProblemSpec s = small_spec(DType::bf16);
  s.varlen_q = {7, 0, 12};
  s.varlen_k = {9, 4, 3};
  s.batch = 3;
  Tensors t = make_problem(s, rng());
  run_attention(t, s.options, Device::cpu);
  for (const ErrorRow& r : compare_with_reference(make_params(t, s.options), true)) EXPECT_TRUE(r.pass) << r.name;
}

TEST(CliCheck, FlopFormula) {
  ProblemSpec s;
  s.batch = 1;
  s.num_heads = 16;
  s.seqlen_q = s.seqlen_k = 1024;
  s.head_dim = 64;
  EXPECT_DOUBLE_EQ(attention_flops(s, false), 4.0 * 16 * 1024 * 1024 * 64);
  s.options.causal = true;
  EXPECT_DOUBLE_EQ(attention_flops(s, false), 2.0 * 16 * 1024 * 1024 * 64);
  EXPECT_DOUBLE_EQ(attention_flops(s, true), 2.5 * 2.0 * 16 * 1024 * 1024 * 64);
}

TEST(CliCheck, CudaDeviceIsRefusedWithAReasonWhenAbsent) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    resolve_device("cuda");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_device("auto"), Device::cpu);
}

}  // namespace
}  // namespace flashattn::cli

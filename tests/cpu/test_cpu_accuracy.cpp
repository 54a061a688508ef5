// Accuracy grid of the CPU backend against the float64 reference (../shared/STYLE.md "Tests"): every dtype,
// the hard shapes (lengths 0, 1, just off tile multiples, seqlen_q > seqlen_k and the reverse),
// head dims 1..256, head_dim_v != head_dim, causal in both alignments, sliding windows, softcap,
// ALiBi [H] and [B, H], MHA/GQA/MQA, varlen with empty sequences, fully masked rows, strided
// inputs and outputs, forward and backward (out, lse, dq, dk, dv checked separately), and bitwise
// determinism of the backward.
//
// Each case: fresh N(0, 1) inputs (seed printed on failure), poisoned outputs, forward (then
// backward from our own out and lse), check_close() of each output against the reference, no
// write outside the views (padding keeps its poison), and for backward cases a second backward
// into fresh poisoned buffers that must be bitwise identical. Cases named "Large" hold the long
// sequences (1023, 1024, 2048); CTest labels them `cpu_large` so sanitizer runs can skip them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attn_problem.hpp"

namespace flashattn::testing {
namespace {

using reference::Precision;

struct CpuCase {
  ProblemConfig cfg;
  bool backward = true;
  std::string name() const { return cfg.name() + (backward ? "" : "_fwdonly"); }
};

void PrintTo(const CpuCase& c, std::ostream* os) { *os << c.name(); }

class CpuAccuracy : public ::testing::TestWithParam<CpuCase> {};

TEST_P(CpuAccuracy, MatchesReference) {
  const CpuCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c.cfg, seed);
  const DType dt = c.cfg.dtype;

  forward(pr.params());
  EXPECT_TRUE(pr.out.padding_intact("out"));
  EXPECT_TRUE(pr.out.all_written("out"));
  if (c.cfg.with_lse) {
    EXPECT_TRUE(pr.lse.padding_intact("lse"));
    EXPECT_TRUE(pr.lse.all_written("lse"));
  } else {
    EXPECT_TRUE(pr.lse.padding_intact("lse (not given)"));  // whole storage still poisoned
  }
  const DenseResults& ref = pr.reference(Precision::f64, c.backward);
  const DenseResults& naive = pr.reference(Precision::input, c.backward);
  EXPECT_TRUE(check_close("out", pr.out.to_dense(), ref.out, naive.out, dt));
  if (c.cfg.with_lse) EXPECT_TRUE(check_close("lse", pr.lse_dense(), ref.lse, naive.lse, dt));
  if (!c.backward) return;

  backward(pr.params());
  for (const auto* t : {&pr.dq, &pr.dk, &pr.dv}) {
    const std::string n = t == &pr.dq ? "dq" : t == &pr.dk ? "dk" : "dv";
    EXPECT_TRUE(t->padding_intact(n));
    EXPECT_TRUE(t->all_written(n));
  }
  const double grad_magnitude = max_abs({&ref.dq, &ref.dk, &ref.dv});
  EXPECT_TRUE(check_close("dq", pr.dq.to_dense(), ref.dq, naive.dq, dt, grad_magnitude));
  EXPECT_TRUE(check_close("dk", pr.dk.to_dense(), ref.dk, naive.dk, dt, grad_magnitude));
  EXPECT_TRUE(check_close("dv", pr.dv.to_dense(), ref.dv, naive.dv, dt, grad_magnitude));

  // Determinism: the same call again (same thread count) gives the same bits.
  const HostTensor dq1 = pr.dq, dk1 = pr.dk, dv1 = pr.dv;
  pr.dq.poison();
  pr.dk.poison();
  pr.dv.poison();
  backward(pr.params());
  EXPECT_TRUE(bitwise_equal("dq (second run)", pr.dq, dq1));
  EXPECT_TRUE(bitwise_equal("dk (second run)", pr.dk, dk1));
  EXPECT_TRUE(bitwise_equal("dv (second run)", pr.dv, dv1));
}

// ------------------------------------------------------------------------------------------------
// The grid.

constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

ProblemConfig batched(DType dt, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d, int64_t b = 1) {
  return ProblemConfig::batched(dt, b, sq, sk, h, hk, d);
}

ProblemConfig varlen(DType dt, std::vector<int32_t> lq, std::vector<int32_t> lk, int64_t h, int64_t hk, int64_t d) {
  ProblemConfig c = batched(dt, 0, 0, h, hk, d);
  c.lens_q = std::move(lq);
  c.lens_k = std::move(lk);
  return c;
}

ProblemConfig with_mask(ProblemConfig c, bool causal, CausalAlign align, int64_t left, int64_t right) {
  c.causal = causal;
  c.align = align;
  c.window_size_left = left;
  c.window_size_right = right;
  return c;
}

constexpr auto BR = CausalAlign::bottom_right;
constexpr auto TL = CausalAlign::top_left;

// The seqlen pairs, plus empty sequences. Long ones use one head (the float64 reference
// is O(seqlen_q · seqlen_k · head_dim) per head) and are tagged Large.
std::vector<CpuCase> seqlen_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {1, 239}, {113, 203}, {239, 1}, {0, 5}, {5, 0}}) {
      v.push_back({batched(dt, sq, sk, 3, 1, 64, 2)});
    }
    ProblemConfig c = batched(dt, 1023, 1024, 1, 1, 64);
    c.tag = "Large";
    v.push_back({c});
    if (dt == DType::f32) v.push_back({batched(dt, 5, 7, 2, 1, 64, 0)});  // empty batch
    c = with_mask(batched(dt, 1024, 1023, 2, 1, 32), true, BR, -1, -1);
    c.tag = "Large";
    v.push_back({c});
    c = with_mask(batched(dt, 2048, 2048, 1, 1, 64), true, TL, -1, -1);
    c.tag = "Large";
    v.push_back({c});
  }
  // One long non-causal fp32 case with the widest head, forward only (cheapest way to cover 2048 x
  // 2048 full attention).
  ProblemConfig c = batched(DType::f32, 2048, 2048, 1, 1, 128);
  c.tag = "Large";
  v.push_back({c, false});
  return v;
}

std::vector<CpuCase> head_dim_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    for (int64_t d : {1, 8, 16, 32, 40, 59, 64, 72, 80, 96, 111, 128, 160, 192, 224, 256}) {
      v.push_back({batched(dt, 113, 203, 2, 1, d)});
    }
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{64, 32}, {40, 128}, {256, 59}, {1, 7}, {111, 256}, {160, 96}}) {
      ProblemConfig c = batched(dt, 113, 203, 2, 1, d);
      c.head_dim_v = dv;
      v.push_back({c});
    }
  }
  return v;
}

std::vector<CpuCase> mask_cases() {
  std::vector<CpuCase> v;
  struct Mask {
    bool causal;
    CausalAlign align;
    int64_t left, right;
  };
  const Mask masks[] = {{true, BR, -1, -1}, {true, TL, -1, -1}, {true, BR, 16, -1}, {false, TL, 0, 16},
                        {false, BR, 32, 8}, {false, TL, -1, 7}, {false, BR, 5, -1}, {false, BR, 0, 0}};
  for (DType dt : kDtypes) {
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 203}, {203, 113}, {1, 239}, {239, 1}, {64, 64}}) {
      for (const Mask& m : masks) v.push_back({with_mask(batched(dt, sq, sk, 2, 1, 40), m.causal, m.align, m.left, m.right)});
    }
  }
  return v;
}

// Rows that see no key: out = 0, lse = -inf, zero gradients.
std::vector<CpuCase> fully_masked_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    v.push_back({with_mask(batched(dt, 239, 113, 2, 2, 64), true, BR, -1, -1)});  // rows < 126 see nothing
    v.push_back({with_mask(batched(dt, 239, 100, 2, 2, 64), false, TL, 0, 0)});   // rows >= 100 see nothing
    v.push_back({with_mask(batched(dt, 100, 10, 2, 1, 59), false, BR, 0, 0)});    // only the last 10 rows see a key
    v.push_back({with_mask(batched(dt, 64, 203, 2, 1, 64), false, BR, 3, -1)});   // a pure left window
    v.push_back({with_mask(batched(dt, 64, 64, 2, 1, 64), false, TL, 2, 3)});
    ProblemConfig c = with_mask(batched(dt, 239, 113, 2, 2, 64), true, BR, -1, -1);
    c.alibi = Alibi::per_head;
    c.softcap = 10.0f;
    v.push_back({c});
  }
  return v;
}

std::vector<CpuCase> modifier_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    ProblemConfig c = batched(dt, 113, 203, 4, 2, 64, 2);
    c.softcap = 5.0f;
    v.push_back({c});
    c.softcap = 30.0f;
    c.causal = true;
    v.push_back({c});
    c = batched(dt, 113, 203, 4, 2, 64, 2);
    c.alibi = Alibi::per_head;
    v.push_back({c});
    c.alibi = Alibi::per_batch_head;
    v.push_back({c});
    c = with_mask(batched(dt, 203, 113, 4, 1, 96, 2), true, TL, -1, -1);
    c.alibi = Alibi::per_batch_head;
    c.softcap = 20.0f;
    v.push_back({c});
    c = with_mask(batched(dt, 203, 203, 4, 4, 80, 1), false, BR, 24, 24);
    c.alibi = Alibi::per_head;
    c.softcap = 8.0f;
    c.softmax_scale = 0.3f;
    v.push_back({c});
    c = batched(dt, 113, 203, 2, 1, 64);
    c.softmax_scale = 1.0f;  // large scores: exercises the running-max rescaling
    v.push_back({c});
    c.softmax_scale = -0.2f;  // legal (finite): the row max must be taken after scaling
    v.push_back({c});
    c.softcap = 4.0f;
    v.push_back({c});
  }
  return v;
}

std::vector<CpuCase> head_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    for (auto [h, hk] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {8, 1}}) {
      v.push_back({batched(dt, 113, 203, h, hk, 64, 2)});
      v.push_back({with_mask(batched(dt, 203, 113, h, hk, 128, 2), true, BR, -1, -1)});
    }
  }
  return v;
}

std::vector<CpuCase> varlen_cases() {
  std::vector<CpuCase> v;
  const std::vector<int32_t> lq_a = {0, 113, 1, 0, 57, 30}, lk_a = {17, 0, 203, 0, 57, 1};
  const std::vector<int32_t> lq_b = {239, 1, 64}, lk_b = {1, 239, 64};
  for (DType dt : kDtypes) {
    v.push_back({varlen(dt, lq_a, lk_a, 3, 1, 64)});
    v.push_back({with_mask(varlen(dt, lq_a, lk_a, 3, 1, 64), true, BR, -1, -1)});
    v.push_back({with_mask(varlen(dt, lq_b, lk_b, 4, 2, 40), true, TL, -1, -1)});
    v.push_back({with_mask(varlen(dt, lq_b, lk_b, 4, 2, 40), false, BR, 8, 4)});
    ProblemConfig c = varlen(dt, lq_a, lk_a, 4, 4, 59);
    c.alibi = Alibi::per_batch_head;
    c.softcap = 15.0f;
    v.push_back({c});
    c = varlen(dt, lq_b, lk_b, 2, 1, 96);
    c.head_dim_v = 48;
    c.layout = Layout::head_major;
    v.push_back({c});
    v.push_back({varlen(dt, {0, 0}, {0, 5}, 2, 1, 32)});  // nothing to compute
  }
  ProblemConfig c = with_mask(varlen(DType::bf16, {1023, 0, 5}, {1024, 7, 300}, 2, 1, 64), true, BR, -1, -1);
  c.tag = "Large";
  v.push_back({c});
  return v;
}

std::vector<CpuCase> layout_cases() {
  std::vector<CpuCase> v;
  for (DType dt : kDtypes) {
    for (Layout lay : {Layout::padded, Layout::head_major}) {
      ProblemConfig c = with_mask(batched(dt, 113, 203, 4, 2, 59, 2), true, BR, -1, -1);
      c.layout = lay;
      v.push_back({c});
      c = batched(dt, 239, 1, 2, 1, 128);
      c.layout = lay;
      c.alibi = Alibi::per_head;
      v.push_back({c});
    }
    ProblemConfig c = batched(dt, 113, 203, 2, 1, 64);
    c.with_lse = false;
    v.push_back({c, false});
  }
  return v;
}

std::vector<CpuCase> thread_cases() {
  std::vector<CpuCase> v;
  for (int threads : {1, 3}) {
    ProblemConfig c = with_mask(batched(DType::bf16, 203, 239, 6, 2, 64, 2), true, BR, -1, -1);
    c.num_threads = threads;
    v.push_back({c});
    c.deterministic = true;
    c.dtype = DType::f16;
    v.push_back({c});
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<CpuCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Seqlens, CpuAccuracy, ::testing::ValuesIn(seqlen_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, CpuAccuracy, ::testing::ValuesIn(head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Masks, CpuAccuracy, ::testing::ValuesIn(mask_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(FullyMasked, CpuAccuracy, ::testing::ValuesIn(fully_masked_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Modifiers, CpuAccuracy, ::testing::ValuesIn(modifier_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Heads, CpuAccuracy, ::testing::ValuesIn(head_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Varlen, CpuAccuracy, ::testing::ValuesIn(varlen_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Layouts, CpuAccuracy, ::testing::ValuesIn(layout_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Threads, CpuAccuracy, ::testing::ValuesIn(thread_cases()), case_name);

}  // namespace
}  // namespace flashattn::testing

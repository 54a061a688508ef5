// Every CUDA-only refusal: plan() says ok = false with a reason naming the argument, forward()
// throws flashattn::Error with the same reason, and nothing is written to the outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_support.hpp"

namespace flashattn::testing {
namespace {

ProblemConfig small(DType dt = DType::bf16, int64_t d = 64) {
  ProblemConfig c;
  c.dtype = dt;
  c.batch = 2;
  c.seqlen_q = 40;
  c.seqlen_k = 50;
  c.num_heads = 2;
  c.num_heads_k = 2;
  c.head_dim = d;
  return c;
}

// Runs plan() and forward() (or backward()) on the params that `edit` produced and checks both
// refuse with a reason containing `expect`, leaving out and lse untouched.
void expect_refused(const ProblemConfig& cfg, const std::function<void(AttentionParams&, GpuProblem&)>& edit,
                    const std::string& expect, Pass pass = Pass::forward) {
  Problem pr(cfg, fresh_seed());
  GpuProblem g(pr, GpuLayout::contiguous);
  AttentionParams a = g.params();
  edit(a, g);
  const Plan pl = plan(a, pass);
  EXPECT_FALSE(pl.ok) << "plan accepted a call it should refuse (" << expect << ")";
  EXPECT_NE(pl.reason.find(expect), std::string::npos) << "reason: " << pl.reason;
  try {
    if (pass == Pass::forward) forward(a);
    else backward(a);
    ADD_FAILURE() << (pass == Pass::forward ? "forward" : "backward") << "() did not throw (" << expect << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << "message: " << e.what();
  }
  g.out.download();
  g.lse.download();
  EXPECT_TRUE(g.out.untouched("out"));
  EXPECT_TRUE(g.lse.untouched("lse"));
}

TEST(CudaValidation, Fp32IsRefusedWithAdvice) {
  FLASHATTN_REQUIRE_GPU();
  expect_refused(small(DType::f32), [](AttentionParams&, GpuProblem&) {}, "q: expected fp16, bf16 or e4m3 on cuda, got fp32");
}

TEST(CudaValidation, HeadDimNotMultipleOf8) {
  FLASHATTN_REQUIRE_GPU();
  expect_refused(small(DType::f16, 59), [](AttentionParams&, GpuProblem&) {}, "head_dim: expected a multiple of 8");
}

TEST(CudaValidation, HeadDimVNotMultipleOf8) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = small(DType::f16, 64);
  c.head_dim_v = 44;
  expect_refused(c, [](AttentionParams&, GpuProblem&) {}, "head_dim_v: expected a multiple of 8");
}

TEST(CudaValidation, HeadDim264) {
  FLASHATTN_REQUIRE_GPU();
  // validate() refuses it for every backend; the message still names head_dim.
  expect_refused(small(DType::bf16, 264), [](AttentionParams&, GpuProblem&) {}, "head_dim");
}

TEST(CudaValidation, HostPointer) {
  FLASHATTN_REQUIRE_GPU();
  Problem host_pr(small(), fresh_seed());
  expect_refused(small(), [&](AttentionParams& a, GpuProblem&) { a.k.data = host_pr.k.data(); },
                 "k: expected a device pointer");
}

TEST(CudaValidation, HostAlibiSlopes) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = small();
  c.alibi = Alibi::per_head;
  static float slopes[2] = {0.5f, 0.25f};
  expect_refused(c, [&](AttentionParams& a, GpuProblem&) { a.alibi_slopes.data = slopes; },
                 "alibi_slopes: expected a device pointer");
}

TEST(CudaValidation, MisalignedPointer) {
  FLASHATTN_REQUIRE_GPU();
  // Inside k's buffer (50 rows of the same width as q's 40; inputs may alias): q's own buffer
  // shifted by 2 bytes ends in whatever the allocator placed next (on the H200 once lse, and the
  // call was then refused for aliasing an output instead).
  expect_refused(small(), [](AttentionParams& a, GpuProblem&) { a.q.data = static_cast<char*>(a.k.data) + 2; },
                 "q: expected a data pointer aligned to 16 bytes");
}

TEST(CudaValidation, RowStrideNotMultipleOf8) {
  FLASHATTN_REQUIRE_GPU();
  // v viewed with a row stride 4 elements longer than packed: still inside the buffer when the
  // view has one row fewer.
  expect_refused(small(), [](AttentionParams& a, GpuProblem&) {
                   a.v.shape[1] = 40;
                   a.k.shape[1] = 40;
                   a.v.stride[1] += 4;
                 },
                 "v: expected the row stride to be a multiple of 8");
}

TEST(CudaValidation, OtherDevice) {
  FLASHATTN_REQUIRE_GPU();
  int count = 0;
  cudaGetDeviceCount(&count);
  expect_refused(small(), [&](AttentionParams& a, GpuProblem&) {
                   for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.dout, &a.dq, &a.dk, &a.dv})
                     t->device_index = count;  // one past the last device
                 },
                 "expected tensors on the current CUDA device");
}

TEST(CudaValidation, DecreasingCuSeqlens) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = small();
  c.lens_q = {10, 20};
  c.lens_k = {10, 20};
  expect_refused(c, [](AttentionParams&, GpuProblem& g) { g.cu_q.set({0, 25, 20}); },
                 "cu_seqlens_q: expected non-decreasing values");
}

// Fixed bug: every length within the bound, but the last element past the packed rows sent the
// kernels past the ends of q, k, v, out and lse (the CPU backend refused it already).
TEST(CudaValidation, CuSeqlensPastThePackedRows) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = small();
  c.lens_q = {10, 20};
  c.lens_k = {10, 20};
  expect_refused(c, [](AttentionParams&, GpuProblem& g) { g.cu_q.set({0, 10, 40}); },
                 "cu_seqlens_q: expected last element = 30 (total_q = q.shape[0]), got 40");
  expect_refused(c, [](AttentionParams&, GpuProblem& g) { g.cu_k.set({0, 10, 29}); },
                 "cu_seqlens_k: expected last element = 30 (total_k = k.shape[0]), got 29");
  expect_refused(c, [](AttentionParams&, GpuProblem& g) { g.cu_q.set({0, 10, 40}); },
                 "cu_seqlens_q: expected last element = 30", Pass::backward);
}

TEST(CudaValidation, CuSeqlensLongerThanHint) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = small();
  c.lens_q = {10, 20};
  c.lens_k = {10, 20};
  expect_refused(c, [](AttentionParams& a, GpuProblem&) { a.max_seqlen_q = 15; },
                 "cu_seqlens_q: expected every sequence length <= 15");
}

TEST(CudaValidation, PlanNamesTheKernel) {
  FLASHATTN_REQUIRE_GPU();
  Problem pr(small(DType::f16, 96), fresh_seed());
  GpuProblem g(pr, GpuLayout::contiguous);
  const Plan pl = plan(g.params(), Pass::forward);
  ASSERT_TRUE(pl.ok) << pl.reason;
  // head_dim 96 runs in the 128 bucket; which architecture's kernel is CudaForwardMisc.KernelChoice's test.
  EXPECT_TRUE(pl.kernel == "cuda_fwd_sm80_mma_hdim128" || pl.kernel == "cuda_fwd_sm90_tma_wgmma_hdim128") << pl.kernel;
}

// Backward limits, checked by plan() and backward() before anything runs, on views with far more
// rows than any GPU could hold. The views must still pass validate()'s aliasing checks: every
// tensor moves into one small allocation, inputs first, with the long inputs (k, v) at row stride 0
// so that their ranges stay small, and outputs last, whose long ranges then reach past the
// allocation's end but over no input. dk and dv, both long, interleave their rows (row stride two
// rows, dv one row after dk), which the exact element-overlap check accepts: no element is shared.
// Nothing is ever launched on them.
void expect_backward_refused(int64_t seqlen_k, const std::string& expect) {
  ProblemConfig c = small();
  c.batch = 1;
  c.num_heads = c.num_heads_k = 1;
  std::shared_ptr<void> slab;
  expect_refused(
      c,
      [&](AttentionParams& a, GpuProblem&) {
        constexpr size_t kSlot = size_t{1} << 20;  // each small tensor here needs < 16 KB
        TensorView* order[] = {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.dout, &a.dq, &a.dk, &a.dv};
        void* p = nullptr;
        ASSERT_EQ(cudaMalloc(&p, kSlot * std::size(order)), cudaSuccess);
        slab.reset(p, CudaFree{});
        for (size_t i = 0; i < std::size(order); ++i) order[i]->data = static_cast<char*>(p) + i * kSlot;
        for (TensorView* t : {&a.k, &a.v, &a.dk, &a.dv}) t->shape[1] = seqlen_k;
        a.k.stride[1] = a.v.stride[1] = 0;
        a.dk.stride[1] = a.dv.stride[1] = 2 * a.dk.stride[1];
        a.dv.data = static_cast<char*>(a.dk.data) + a.dk.shape[3] * dtype_size(a.dk.dtype);
      },
      expect, Pass::backward);
}

TEST(CudaValidation, BackwardSeqlenKBeyondTheGrid) {
  FLASHATTN_REQUIRE_GPU();
  // 65535 key blocks is the most a backward grid holds (grid y): one key more is refused by name
  // (it was a bare "invalid configuration" launch error). Blocks hold 128 keys in both kernels at
  // head_dim 64.
  expect_backward_refused(65535 * 128 + 1, "seqlen_k: expected at most 8388480 keys (65535 blocks of 128)");
}

TEST(CudaValidation, BackwardSeqlenSumBeyondInt) {
  FLASHATTN_REQUIRE_GPU();
  expect_backward_refused((int64_t{1} << 31) - 40, "q: expected seqlen_q + seqlen_k < 2^31 for the CUDA backward, got 40 + ");
}

// ---- The FP8 (e4m3) forward's CUDA-side refusals (api.cu check_fp8) ----------------------------

// A device copy of `values` that lives for the test (descales are read from the device).
std::shared_ptr<float> device_floats(std::initializer_list<float> values) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, values.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, values.begin(), values.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  return std::shared_ptr<float>(static_cast<float*>(p), [](float* q) { cudaFree(q); });
}

ProblemConfig fp8_small() {
  ProblemConfig c = small(DType::e4m3, 128);
  c.descale = Descale::per_tensor;
  return c;
}

// Descale values are read by the kernel, not on the host (a synchronizing copy per call): a (batch,
// kv head) whose descales are not finite and > 0, or whose softmax_scale · q_descale · k_descale
// (/ softcap) is not a normal float32, gets NaN in every out and lse element of its query heads,
// and the other heads their usual finite result. `which` is the descale (0 q, 1 k, 2 v) that
// carries `bad` at [1, 0] of a [batch = 2, num_heads_k = 2] tensor; `both_qk` puts it in q's and k's.
void expect_fp8_head_nan(int which, float bad, bool both_qk = false, float softcap = 0.f) {
  int device = 0;
  cudaGetDevice(&device);
  ProblemConfig c = fp8_small();
  c.num_heads = 4;  // two query heads per kv head: both of kv head 0 get NaN
  Problem pr(c, fresh_seed());
  GpuProblem g(pr, GpuLayout::contiguous);
  AttentionParams a = g.params();
  a.softcap = softcap;
  const std::shared_ptr<float> good = device_floats({0.5f, 0.75f, 1.25f, 2.0f});
  const std::shared_ptr<float> marked = device_floats({0.5f, 0.75f, bad, 2.0f});
  TensorView* d[3] = {&a.q_descale, &a.k_descale, &a.v_descale};
  for (int i = 0; i < 3; ++i) {
    const bool is_bad = i == which || (both_qk && i < 2);
    *d[i] = make_tensor(is_bad ? marked.get() : good.get(), DType::f32, {2, 2}, Device::cuda, device);
  }
  ASSERT_NO_THROW(forward(a));
  const std::vector<double> out = g.out.to_dense(), lse = g.lse.to_dense();
  EXPECT_TRUE(g.out.all_written("out"));
  EXPECT_TRUE(g.lse.all_written("lse"));
  EXPECT_EQ(nan_head_mismatches(c, out, lse, [](int64_t b, int64_t h) { return b == 1 && h / 2 == 0; }), 0)
      << "elements whose NaN-ness does not match their head's descales (bad = " << bad << ")";
}

TEST(CudaValidation, Fp8DescaleNotFiniteGivesNaNHead) {
  FLASHATTN_REQUIRE_SM90();
  for (const float bad : {std::nanf(""), INFINITY, 0.0f, -1.0f})
    for (int which = 0; which < 3; ++which) expect_fp8_head_nan(which, bad);
}

TEST(CudaValidation, Fp8DescaleProductOverflowGivesNaNHead) {
  FLASHATTN_REQUIRE_SM90();
  expect_fp8_head_nan(0, 1e30f, /*both_qk=*/true);                    // 1e60 · softmax_scale
  expect_fp8_head_nan(0, 1e-30f, /*both_qk=*/true);                   // below FLT_MIN
  expect_fp8_head_nan(0, 1e-17f, /*both_qk=*/true, /*softcap=*/1e3f);  // normal, but / softcap is not
}

// Found by review: k and v may be views of far less memory (overlapping strides), so nothing bounded
// the Vᵀ workspace's batch · num_heads_k · 128 · seqlen_k bytes, which could wrap size_t into a small
// allocation that the pre-pass writes past. Here 2 · 1024 · 128 · (2^31 − 1024) = 2^49 − 2^28 > 2^48.
TEST(CudaValidation, Fp8WorkspaceBeyond2To48IsRefused) {
  FLASHATTN_REQUIRE_SM90();
  ProblemConfig c = fp8_small();
  c.num_heads = 1024;
  c.num_heads_k = 1024;
  expect_refused(c,
                 [](AttentionParams& a, GpuProblem&) {
                   for (TensorView* t : {&a.k, &a.v}) {
                     // Rows broadcast (stride 0, refused for e4m3 only after this check): the view
                     // stays inside k's storage, so no alias check with out fires first.
                     t->shape[1] = (int64_t{1} << 31) - 1024;
                     t->stride[1] = 0;
                   }
                 },
                 "v: expected the FP8 forward's Vᵀ workspace (batch · num_heads_k · 128 · seqlen_k bytes) below "
                 "2^48 bytes on cuda");
}

// Found by review: the kernels fold log2(e) into the scale, so 2.4e38 .. 3.4e38 (a float32, which
// the CPU takes) made every score NaN on cuda.
TEST(CudaValidation, SoftmaxScaleBeyondFltMaxOverLog2eIsRefused) {
  FLASHATTN_REQUIRE_GPU();
  for (const float scale : {3e38f, -2.4e38f})
    expect_refused(small(DType::bf16, 64), [&](AttentionParams& a, GpuProblem&) { a.softmax_scale = scale; },
                   "softmax_scale: expected |softmax_scale| <= FLT_MAX / log2(e) = 2.3587e+38 on cuda");
}

TEST(CudaValidation, Fp8NoKeys) {
  FLASHATTN_REQUIRE_SM90();
  ProblemConfig c = fp8_small();
  c.seqlen_k = 0;
  expect_refused(c, [](AttentionParams&, GpuProblem&) {}, "k: expected at least one key for e4m3 on cuda");
}

TEST(CudaValidation, Fp8BroadcastKeyRows) {
  FLASHATTN_REQUIRE_SM90();
  // Stride 0 (one key row broadcast to every position) is fine for validate() and the 16-bit
  // kernels' sm80 fallback; the FP8 kernel's TMA maps cannot take it.
  expect_refused(fp8_small(), [](AttentionParams& a, GpuProblem&) { a.k.stride[1] = 0; },
                 "k: expected the row stride in (0, 2^39) elements for e4m3 on cuda");
}

}  // namespace
}  // namespace flashattn::testing

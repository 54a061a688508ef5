// CUDA backward (dq, dk, dv) against the float64 reference with the project's criterion, each
// gradient checked separately, poisoned first; and the deterministic mode: 100 runs bitwise equal.
// Skipped with a message while the build has no CUDA backward (plan() says so).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_support.hpp"

namespace flashattn::testing {
namespace {

using reference::Precision;

struct BwdCase {
  ProblemConfig cfg;
  std::string name() const { return cfg.name(); }
};

// A varlen batch with empty sequences: keys without queries, queries without keys, a tile of 130.
ProblemConfig varlen_with_empty(DType dt, int64_t head_dim, bool causal) {
  ProblemConfig c = base(dt, 0, 0, 0, 2, 1, head_dim);
  c.lens_q = {17, 0, 130, 1};
  c.lens_k = {33, 7, 130, 0};
  c.causal = causal;
  return c;
}

std::vector<BwdCase> backward_cases() {
  std::vector<BwdCase> cases;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (bool det : {false, true}) {
      auto add = [&](ProblemConfig c) {
        c.deterministic = det;
        if (det) c.tag = "det";
        cases.push_back({c});
      };
      add(base(dt, 2, 128, 128, 2, 2, 64));
      add(base(dt, 1, 113, 203, 2, 1, 128));
      ProblemConfig c = base(dt, 1, 203, 113, 4, 2, 128);
      c.causal = true;
      add(c);
      c.align = CausalAlign::top_left;
      add(c);
      c = base(dt, 1, 150, 150, 2, 2, 96);
      c.window_size_left = 20;
      c.window_size_right = 5;
      c.softcap = 10.0f;
      add(c);
      c = base(dt, 2, 90, 130, 2, 2, 256);
      c.alibi = Alibi::per_head;
      c.head_dim_v = 128;
      add(c);
      // head_dim below 32 (the 64 bucket, mostly zero-filled columns) with batch * num_heads *
      // seqlen_q odd: the dq accumulator follows 2 * batch * num_heads * stat_rows floats of
      // statistics in the workspace, and the postprocess reads it with float4 loads, so an
      // unpadded stat count of 1 or 33 once put it 8 bytes off ("misaligned address"). seqlen_k
      // is 3, not 1: with one key dq and dk are exactly 0 and check_close allows no rounding.
      add(base(dt, 1, 1, 3, 1, 1, 8));
      // Empty q or k (fixed bug: the Hopper kernel's TMA maps refused a 0-row tensor).
      add(base(dt, 1, 0, 12, 2, 2, 16));
      add(base(dt, 1, 12, 0, 2, 2, 16));
      add(base(dt, 1, 33, 47, 2, 1, 24));
      for (int64_t d : {8, 16, 24}) add(base(dt, 1, 33, 47, 1, 1, d));
      c = base(dt, 1, 37, 29, 3, 1, 24);
      c.head_dim_v = 8;
      add(c);
      c.causal = true;
      add(c);
      c = varlen_with_empty(dt, 64, true);
      add(c);
      if (det) continue;
      // Many query tiles per key tile, GQA groups of 4, varlen tiles that cross into the next
      // sequence's rows, and softcap + ALiBi over several tiles (the Hopper dK/dV kernel's loops).
      c = base(dt, 2, 300, 517, 8, 2, 128);
      c.causal = true;
      add(c);
      c = base(dt, 1, 700, 300, 4, 1, 64);
      c.window_size_left = 100;
      c.window_size_right = 50;
      add(c);
      c = multi_tile_varlen(dt, 4, 2);
      add(c);
      c.head_dim = 64;
      c.causal = true;
      add(c);
      c = base(dt, 1, 333, 333, 2, 2, 64);
      c.softcap = 15.0f;
      c.alibi = Alibi::per_head;
      c.causal = true;
      add(c);
      // Batched key tiles that no query sees (top-left causal, seqlen_k past seqlen_q: the dK/dV
      // kernel's blocks with no step, which store zeros) in the 64 and 128 buckets, and head_dim_v
      // 64 in the 128 bucket (dv's second 64-column panel wholly past its columns).
      c = base(dt, 1, 50, 300, 2, 1, 64);
      c.causal = true;
      c.align = CausalAlign::top_left;
      add(c);
      c.head_dim = 128;
      add(c);
      // head_dim 128 without a mask steps 80 query rows on sm_90 (BwdSm90Bm80Config): many steps
      // with GQA groups of 4 and a partial last step (300 = 3 · 80 + 60), seqlen_q a multiple of
      // 80 but not of 128 (its statistics and dq accumulator padded to 320 rows), and softcap or
      // ALiBi without a mask, which keep 64-row steps; head_dim 96 in 80-row steps (columns 96..127
      // of q and k zero-filled, dq's not written), and varlen with empty sequences in them.
      add(base(dt, 2, 300, 517, 8, 2, 128));
      add(base(dt, 1, 160, 96, 2, 1, 128));
      add(base(dt, 1, 150, 200, 2, 1, 96));
      c = varlen_with_empty(dt, 128, false);
      add(c);
      c = base(dt, 1, 200, 170, 2, 2, 128);
      c.softcap = 20.0f;
      add(c);
      c = base(dt, 1, 200, 170, 2, 2, 128);
      c.alibi = Alibi::per_head;
      add(c);
      c = base(dt, 1, 150, 200, 2, 1, 128);
      c.head_dim_v = 64;
      add(c);
      // ... and under masks (80-row steps under a causal mask from seqlen_q 2048, below; on every
      // case here with FLASHATTN_CUDA_BWD_BM80=1, gpu_check.sh): a sliding window over several
      // steps and key tiles, a varlen causal batch whose sequences end inside steps (and one
      // without keys), head_dim 96 causal top-left with seqlen_q past seqlen_k.
      c = base(dt, 1, 500, 420, 4, 2, 128);
      c.window_size_left = 90;
      c.window_size_right = 40;
      add(c);
      c = multi_tile_varlen(dt, 4, 2);
      c.causal = true;
      add(c);
      c = varlen_with_empty(dt, 128, true);
      add(c);
      c = base(dt, 1, 250, 170, 2, 1, 96);
      c.causal = true;
      c.align = CausalAlign::top_left;
      add(c);
      if (dt == DType::bf16) {
        // The Hopper dK/dV kernel's split tail at its own threshold on a 132-SM H200
        // (grid_order.hpp bwd_split_tail_blocks): 17 heads x 9 key blocks are 153 blocks, and the
        // last 21 run as three parts of their 26 query steps of 80 rows (the last one partial), summed by
        // the last part of each warp's rows; the last key block holds 6 keys. (Other GPUs split
        // elsewhere or not at all; the backward suite runs again with
        // FLASHATTN_CUDA_BWD_SPLIT_TAIL=1, gpu_check.sh.)
        add(base(dt, 1, 2050, 1030, 17, 17, 128));
        // Causal at seqlen_q 2100: the default's 80-row steps under a causal mask (from seqlen_q
        // 2048; 2100 = 26 · 80 + 20), the diagonal crossing steps.
        c = base(dt, 1, 2100, 2100, 2, 1, 128);
        c.causal = true;
        add(c);
      }
      // head_dim bucket 256 (the Hopper kernel whose consumers split the head dimension and pass
      // Pᵀ / dSᵀ through shared memory): many query tiles per 64-key tile with GQA and a causal
      // mask, a window with softcap at head_dim 192, varlen tiles that cross sequence ends (also
      // head_dim 192 with head_dim_v 128), softcap + ALiBi, and key tiles no query sees.
      c = base(dt, 2, 300, 517, 8, 2, 256);
      c.causal = true;
      add(c);
      c = base(dt, 1, 400, 260, 4, 1, 192);
      c.window_size_left = 70;
      c.window_size_right = 30;
      c.softcap = 12.0f;
      add(c);
      c = multi_tile_varlen(dt, 4, 2);
      c.head_dim = 256;
      add(c);
      c.head_dim = 192;
      c.head_dim_v = 128;
      c.causal = true;
      add(c);
      c = base(dt, 1, 200, 333, 2, 2, 256);
      c.softcap = 15.0f;
      c.alibi = Alibi::per_head;
      c.causal = true;
      add(c);
      c = base(dt, 1, 70, 400, 2, 1, 256);
      c.window_size_left = 10;
      c.window_size_right = 0;
      c.align = CausalAlign::top_left;
      add(c);
      // head_dim 160 with head_dim_v 40 in the 256 bucket: TMA boxes wholly past the columns of k
      // (192..255) and of v (64..255) arrive zero-filled.
      c = base(dt, 1, 150, 90, 2, 1, 160);
      c.head_dim_v = 40;
      add(c);
      // head_dim_v above head_dim (256 bucket: Q and K panels past 128 all zeros), and varlen at
      // head_dim 256 with empty sequences (key tiles no query tile sees).
      c = base(dt, 1, 100, 140, 2, 2, 128);
      c.head_dim_v = 256;
      add(c);
      c = varlen_with_empty(dt, 256, true);
      add(c);
      // The 256 bucket's narrower configs (tile_256): MLA's head_dim 192 / head_dim_v 128
      // (consumer 0 owns one Q and one V panel, consumer 1 two and one; dQ staged in a buffer of
      // its own, freed by the reduce-adds) and 192 / 192, through the cases above: many query
      // tiles with GQA and a causal mask, softcap + ALiBi, key tiles no query sees, varlen with
      // empty sequences and tiles across sequence ends, head_dim_v above head_dim.
      for (int64_t dv : {128, 192}) {
        c = base(dt, 2, 300, 517, 8, 2, 192);
        c.head_dim_v = dv;
        c.causal = true;
        add(c);
        c = base(dt, 1, 200, 333, 2, 2, 192);
        c.head_dim_v = dv;
        c.softcap = 15.0f;
        c.alibi = Alibi::per_head;
        c.causal = true;
        add(c);
        c = base(dt, 1, 70, 400, 2, 1, 192);
        c.head_dim_v = dv;
        c.window_size_left = 10;
        c.window_size_right = 0;
        c.align = CausalAlign::top_left;
        add(c);
        c = varlen_with_empty(dt, 192, true);
        c.head_dim_v = dv;
        add(c);
      }
      c = multi_tile_varlen(dt, 4, 2);
      c.head_dim = 192;
      add(c);
      c = base(dt, 1, 100, 140, 2, 2, 64);
      c.head_dim_v = 160;
      add(c);
      c = base(dt, 1, 130, 70, 4, 1, 136);
      c.head_dim_v = 96;
      add(c);
    }
  }
  return cases;
}

bool backward_shipped(const AttentionParams& a, std::string* reason) {
  const Plan pl = plan(a, Pass::backward);
  if (!pl.ok) *reason = pl.reason;
  return pl.ok;
}

// dq, dk, dv of g (after a backward) each written everywhere and within the project's criterion of
// the float64 reference. The floor scales with the largest gradient of the call, as in the CPU
// accuracy tests (see check_close): without it fp16_b1_sq1_sk3_h1k1_d8 failed for seed
// 5289238725301831211 on the H200 with every backward kernel alike (dq error 8.4e-4 against 7.8e-4
// allowed at max|dq| 0.32, from dS = P (dP - D) rounded to fp16 over 3 keys, where the naive error
// happened to be small).
void expect_gradients_match(GpuProblem& g) {
  const std::vector<double> dq = g.dq.to_dense(), dk = g.dk.to_dense(), dv = g.dv.to_dense();
  EXPECT_TRUE(g.dq.all_written("dq"));
  EXPECT_TRUE(g.dk.all_written("dk"));
  EXPECT_TRUE(g.dv.all_written("dv"));
  const DenseResults& ref = g.problem->reference(Precision::f64, true);
  const DenseResults& naive = g.problem->reference(Precision::input, true);
  const double grad_magnitude = max_abs({&ref.dq, &ref.dk, &ref.dv});
  const DType dt = g.problem->config().dtype;
  if (!dq.empty()) EXPECT_TRUE(check_close("dq", dq, ref.dq, naive.dq, dt, grad_magnitude));
  if (!dk.empty()) EXPECT_TRUE(check_close("dk", dk, ref.dk, naive.dk, dt, grad_magnitude));
  if (!dv.empty()) EXPECT_TRUE(check_close("dv", dv, ref.dv, naive.dv, dt, grad_magnitude));
}

class CudaBackward : public ::testing::TestWithParam<BwdCase> {};

TEST_P(CudaBackward, MatchesReference) {
  FLASHATTN_REQUIRE_GPU();
  const ProblemConfig& cfg = GetParam().cfg;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(cfg, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  // The backward needs the forward's out and lse.
  forward(g.params());
  std::string why;
  if (!backward_shipped(g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  backward(g.params());
  expect_gradients_match(g);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaBackward, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<BwdCase>& i) { return i.param.name(); });

// plan() names the backward kernel: the Hopper dK/dV kernels on sm_90 unless deterministic (or
// FLASHATTN_CUDA_BWD=sm80), the sm80 kernels otherwise.
TEST(CudaBackwardMisc, KernelChoice) {
  FLASHATTN_REQUIRE_GPU();
  const bool sm90 = expect_sm90_kernels("FLASHATTN_CUDA_BWD");
  for (bool det : {false, true}) {
    ProblemConfig c = base(DType::bf16, 1, 64, 64, 2, 2, 128);
    c.deterministic = det;
    Problem pr(c, fresh_seed());
    GpuProblem g(pr, GpuLayout::contiguous);
    const Plan pl = plan(g.params(), Pass::backward);
    ASSERT_TRUE(pl.ok) << pl.reason;
    EXPECT_EQ(pl.kernel, sm90 && !det ? "cuda_bwd_sm90_tma_wgmma_hdim128" : "cuda_bwd_sm80_mma_hdim128");
    if (!det) std::printf("[   INFO   ] backward kernel: %s\n", pl.kernel.c_str());
    // head_dim 192 runs the 256 bucket: on sm_90 the kernel that splits the head dimension.
    c = base(DType::bf16, 1, 64, 64, 2, 2, 192);
    c.deterministic = det;
    Problem pr2(c, fresh_seed());
    GpuProblem g2(pr2, GpuLayout::contiguous);
    const Plan pl2 = plan(g2.params(), Pass::backward);
    ASSERT_TRUE(pl2.ok) << pl2.reason;
    EXPECT_EQ(pl2.kernel, sm90 && !det ? "cuda_bwd_sm90_dsplit_hdim256" : "cuda_bwd_sm80_mma_hdim256");
  }
}

// backward(a) captured into `graph` on the graph's stream (use with ASSERT_NO_FATAL_FAILURE).
void capture_backward(GraphCapture& graph, AttentionParams a) {
  graph.capture([&](cudaStream_t stream) {
    a.stream = stream;
    backward(a);
  });
}

// A backward captured into a CUDA graph and replayed twice: on sm_90 its three kernels
// (preprocess, dK/dV, postprocess) follow each other by programmatic dependent launch, which a
// graph keeps as programmatic edges; each replay (outputs poisoned before it) must match the
// reference, so that no kernel reads its predecessor's workspace early.
TEST(CudaBackwardMisc, UnderGraphCapture) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 2, 257, 385, 4, 2, 128);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  forward(g.params());
  std::string why;
  if (!backward_shipped(g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  GraphCapture graph;
  ASSERT_NO_FATAL_FAILURE(capture_backward(graph, g.params()));
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    g.dq.poison();
    g.dk.poison();
    g.dv.poison();
    ASSERT_NO_FATAL_FAILURE(graph.replay());
    expect_gradients_match(g);
  }
}

// A varlen backward captured with key lengths whose replay finds every key length 0 (the device
// cu_seqlens_k rewritten after capture; under capture the launch trusts max_seqlen_k): every
// dK/dV block then ends without work, and dq must still come out exactly 0, the postprocess
// reading the accumulator only after the preprocess zeroed it (each block of the dK/dV kernel
// waits for the preprocess before it exits, so its grid cannot complete first).
TEST(CudaBackwardMisc, UnderGraphCaptureNoKeysAtReplay) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 0, 0, 0, 4, 2, 128);
  c.lens_q = {70, 129};
  c.lens_k = {40, 300};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  forward(g.params());
  std::string why;
  if (!backward_shipped(g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  AttentionParams a = g.params();
  a.max_seqlen_q = 129;
  a.max_seqlen_k = 300;
  GraphCapture graph;
  ASSERT_NO_FATAL_FAILURE(capture_backward(graph, a));
  g.cu_k.set({0, 0, 0});
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    g.dq.poison();
    ASSERT_NO_FATAL_FAILURE(graph.replay());
    const std::vector<double> dq = g.dq.to_dense();
    EXPECT_TRUE(g.dq.all_written("dq"));
    int64_t nonzero = 0;
    for (double x : dq) nonzero += x != 0.0;
    EXPECT_EQ(nonzero, 0) << "dq elements not 0 where no key is visible";
  }
}

// A causal forward and its backward captured in global mode, as torch.cuda.graph captures: the
// forward's tile counter is then taken with the launch (cudaMallocAsync), and nothing the library
// calls during capture may be one CUDA refuses in that mode.
TEST(CudaBackwardMisc, UnderGlobalModeCapture) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 2, 300, 300, 4, 2, 128);
  c.causal = true;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  std::string why;
  if (!backward_shipped(g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  GraphCapture graph(cudaStreamCaptureModeGlobal);
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t stream) {
    AttentionParams a = g.params();
    a.stream = stream;
    forward(a);
    backward(a);
  }));
  ASSERT_NO_FATAL_FAILURE(graph.replay());
  expect_out_matches(g);
  expect_gradients_match(g);
}

// Calls on a stream that is not being captured while another stream is, in global mode (here, by
// this thread, and below by another thread): the first masked sm90 forward on a stream takes its
// tile counter with cudaMalloc, a varlen call reads its device cu_seqlens back with a
// synchronizing copy, and the backward takes its workspace with cudaMallocAsync. CUDA refuses such
// calls beside a global capture, and the refusal invalidates that capture (H200, CUDA 13.0, driver
// 580: a bare cudaMalloc there returns cudaErrorStreamCaptureUnsupported and the capture's end
// cudaErrorStreamCaptureInvalidated; the backward's cudaMallocAsync failed this test the same
// way), so the library relaxes its thread's capture mode around them. The forward's counter is
// allocated only on a stream's first call: gpu_check.sh also runs these tests alone, each in a
// process whose streams are all fresh.
struct BesideACapture : EagerBesideCapture {
  ProblemConfig c, cv;
  uint64_t seed = fresh_seed();
  Problem pr, prv;
  GpuProblem g, gv;

  static ProblemConfig causal(ProblemConfig cfg) {
    cfg.causal = true;
    return cfg;
  }
  BesideACapture()
      : c(causal(base(DType::bf16, 2, 300, 300, 4, 2, 128))),
        cv(causal(multi_tile_varlen(DType::bf16, 4, 2))),
        pr(c, seed),
        prv(cv, seed + 1),
        g(pr, GpuLayout::contiguous),
        gv(prv, GpuLayout::contiguous) {}
  // The eager calls, each checked not to have ended `cap`'s capture.
  void eager_calls(cudaStream_t cap) {
    AttentionParams a = g.params(), av = gv.params();
    a.stream = av.stream = stream;
    forward(a);
    expect_still_capturing(cap, "the causal forward");
    forward(av);
    expect_still_capturing(cap, "the varlen forward");
    backward(a);
    expect_still_capturing(cap, "the backward");
    backward(av);
    expect_still_capturing(cap, "the varlen backward");
  }
  void expect_results() {
    FLASHATTN_ASSERT_CUDA(cudaStreamSynchronize(stream));
    expect_out_matches(g);
    expect_out_matches(gv);
    expect_gradients_match(g);
    expect_gradients_match(gv);
  }
};

// The eager calls beside a global-mode capture that this thread holds open, or (other_thread)
// another thread.
void calls_beside_a_global_capture(bool other_thread) {
  BesideACapture e;
  SCOPED_TRACE(seed_note(e.seed));
  std::string why;
  if (!backward_shipped(e.g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  ASSERT_NO_FATAL_FAILURE(e.set_up());
  if (!other_thread) {
    GraphCapture graph(cudaStreamCaptureModeGlobal);
    ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t cap) {
      e.record(cap);
      e.eager_calls(cap);
    }));
    ASSERT_NO_FATAL_FAILURE(e.expect_results());
    return;
  }
  cudaStream_t cap = nullptr;
  FLASHATTN_ASSERT_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  std::promise<std::string> begun;  // the capturing thread: "" once its capture is open
  std::promise<void> calls_done;    // this thread: its eager calls are over (or threw)
  std::string ended;                // the capturing thread: "" when its capture ended clean
  int device = 0;
  FLASHATTN_ASSERT_CUDA(cudaGetDevice(&device));
  std::thread capturer([&] {
    cudaSetDevice(device);  // (a new thread's current device is 0)
    cudaError_t err = cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal);
    if (err != cudaSuccess) {
      begun.set_value(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err));
      return;
    }
    std::string failure;
    try {
      e.record(cap);
    } catch (const std::exception& ex) {
      failure = ex.what();
    }
    begun.set_value(failure);
    calls_done.get_future().wait();
    cudaGraph_t graph = nullptr;
    err = cudaStreamEndCapture(cap, &graph);
    if (err != cudaSuccess) {
      ended = std::string("cudaStreamEndCapture: ") + cudaGetErrorName(err);
      (void)cudaGetLastError();
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  });
  const std::string begin_failure = begun.get_future().get();
  std::string call_failure;
  if (begin_failure.empty()) {
    try {
      e.eager_calls(cap);
    } catch (const std::exception& ex) {
      call_failure = ex.what();
    }
  }
  calls_done.set_value();
  capturer.join();
  cudaStreamDestroy(cap);
  ASSERT_EQ(begin_failure, "");
  ASSERT_EQ(call_failure, "") << "(the capture is the other thread's)";
  ASSERT_EQ(ended, "");
  ASSERT_NO_FATAL_FAILURE(e.expect_results());
}

TEST(CudaBackwardMisc, CallsBesideAGlobalCapture) {
  FLASHATTN_REQUIRE_GPU();
  calls_beside_a_global_capture(false);
}

// The same calls while another thread holds a global-mode capture open (a training loop's graph
// captured on one thread, eager calls on another): CUDA's global mode prohibits the unsafe calls
// on every thread, not only the capturing one, and the relaxed mode the library sets is its own
// thread's.
TEST(CudaBackwardMisc, CallsBesideAnotherThreadsGlobalCapture) {
  FLASHATTN_REQUIRE_GPU();
  calls_beside_a_global_capture(true);
}

// deterministic = true: 100 runs give bitwise the same dq, dk, dv (GQA, so dk/dv sum over heads).
TEST(CudaBackwardMisc, Deterministic100RunsBitwiseEqual) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 2, 300, 300, 8, 2, 128);
  c.causal = true;
  c.deterministic = true;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  forward(g.params());
  std::string why;
  if (!backward_shipped(g.params(), &why)) GTEST_SKIP() << "CUDA backward not available: " << why;
  backward(g.params());
  g.dq.download();
  g.dk.download();
  g.dv.download();
  const std::vector<unsigned char> dq0 = g.dq.bytes(), dk0 = g.dk.bytes(), dv0 = g.dv.bytes();
  for (int run = 1; run < 100; ++run) {
    g.dq.poison();
    g.dk.poison();
    g.dv.poison();
    backward(g.params());
    g.dq.download();
    g.dk.download();
    g.dv.download();
    ASSERT_EQ(dq0, g.dq.bytes()) << "dq differs at run " << run;
    ASSERT_EQ(dk0, g.dk.bytes()) << "dk differs at run " << run;
    ASSERT_EQ(dv0, g.dv.bytes()) << "dv differs at run " << run;
  }
}

}  // namespace
}  // namespace flashattn::testing

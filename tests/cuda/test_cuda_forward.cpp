// CUDA forward against the float64 reference (the project's criterion: error <= 2 x the naive
// input-precision error + a floor), and against the CPU backend, over the shared list of hard
// shapes: lengths off tile multiples, seqlen_q > seqlen_k and the reverse, head dims inside every
// bucket, head_dim_v != head_dim, both causal alignments, sliding windows, softcap, ALiBi, GQA/MQA,
// varlen with empty sequences, strided layouts, fully masked rows. Outputs are poisoned first:
// every element must be written and nothing outside the views. Plus a case whose element offsets
// pass 2^31, and a forward captured in a CUDA graph. CudaForwardFp8: the e4m3 forward (FlashAttention-3
// Sec. 3.3) against the float64 reference on the decoded inputs times their descales, with
// FlashAttention-3's own rounding steps (tests/support/fp8_emulation.hpp) as the naive formula.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp8_emulation.hpp"
#include "gpu_test_support.hpp"

namespace flashattn::testing {
namespace {

using reference::Precision;

struct GpuCase {
  ProblemConfig cfg;
  GpuLayout layout = GpuLayout::contiguous;
  std::string name() const {
    return cfg.name() + (layout == GpuLayout::contiguous ? "" : std::string("_") + gpu_layout_name(layout));
  }
};

std::vector<GpuCase> forward_cases() {
  std::vector<GpuCase> cases;
  for (DType dt : {DType::f16, DType::bf16}) {
    auto add = [&](ProblemConfig c, GpuLayout l = GpuLayout::contiguous) { cases.push_back({c, l}); };
    add(base(dt, 2, 128, 128, 4, 4, 64));
    add(base(dt, 1, 1, 1, 1, 1, 64));
    // More query tiles than an H200 has multiprocessors (132), so that the persistent grid's
    // blocks go through several tiles (ragged last round, GQA, the next Q loaded during a tile).
    add(base(dt, 1, 520, 130, 40, 8, 64));
    add(base(dt, 2, 1000, 300, 12, 4, 128));
    add(base(dt, 1, 1, 1023, 2, 2, 128));
    add(base(dt, 1, 113, 203, 2, 2, 128));
    add(base(dt, 1, 1023, 1023, 2, 1, 128));
    for (int64_t d : {32, 40, 72, 80, 96, 112, 160, 192, 256}) add(base(dt, 1, 203, 113, 2, 2, d));
    // head_dim below 32 (mostly zero-filled columns of the 64 bucket), with batch * num_heads *
    // seqlen_q odd, seqlen 1, GQA with one KV head (tests/python SHAPES), and head_dim_v < head_dim.
    add(base(dt, 1, 1, 1, 1, 1, 8));
    // Empty q or k (fixed bug: the Hopper kernel's TMA maps refused a 0-row tensor).
    add(base(dt, 1, 0, 12, 2, 2, 16));
    add(base(dt, 1, 12, 0, 2, 2, 16));
    for (int64_t d : {8, 16, 24}) add(base(dt, 1, 33, 47, 2, 1, d));
    {
      ProblemConfig c = base(dt, 1, 37, 29, 3, 1, 24);
      c.head_dim_v = 8;
      add(c);
      c.causal = true;
      add(c);
    }
    {
      ProblemConfig c = base(dt, 1, 150, 90, 2, 2, 64);
      c.head_dim_v = 128;
      add(c);
      c = base(dt, 1, 90, 150, 2, 2, 128);
      c.head_dim_v = 64;
      add(c);
      c.head_dim = 256;
      c.head_dim_v = 40;
      add(c);
    }
    for (CausalAlign al : {CausalAlign::bottom_right, CausalAlign::top_left}) {
      // Every head_dim bucket: 128-row tiles of two warpgroups, head_dim 64's 192-row tiles of
      // three, whose warpgroups each skip the key tiles their own rows do not see, and head_dim
      // 256's, whose warpgroups all go through the block's key tiles (end-aligned tiles: rows
      // before the start in an active warpgroup).
      for (int64_t d : {128, 64, 256})
        for (auto [sq, sk] : {std::pair<int64_t, int64_t>{203, 113}, {113, 203}, {256, 256}, {1, 300}}) {
          ProblemConfig c = base(dt, 2, sq, sk, 2, 2, d);
          c.causal = true;
          c.align = al;
          add(c);
        }
      ProblemConfig w = base(dt, 1, 300, 257, 2, 2, 64);
      w.window_size_left = 37;
      w.window_size_right = 11;
      w.align = al;
      add(w);
      w.window_size_left = 0;
      w.window_size_right = 0;
      add(w);
      w.window_size_left = 100;
      w.window_size_right = -1;
      add(w);
    }
    {
      ProblemConfig c = base(dt, 1, 200, 200, 2, 2, 128);
      c.softcap = 30.0f;
      add(c);
      c.causal = true;
      c.softcap = 5.0f;
      c.softmax_scale = 0.5f;
      add(c);
      c = base(dt, 2, 150, 170, 4, 2, 64);
      c.alibi = Alibi::per_head;
      add(c);
      c.alibi = Alibi::per_batch_head;
      c.causal = true;
      add(c);
      c.softcap = 20.0f;
      add(c);
    }
    add(base(dt, 2, 130, 130, 8, 2, 128));
    {
      // A negative softmax_scale: the row max must be taken over the scaled scores (fixed bug:
      // the unmodified path took it over the raw ones, so exp2 overflowed to inf / NaN).
      ProblemConfig c = base(dt, 1, 150, 260, 2, 2, 128);
      c.softmax_scale = -0.3f;
      add(c);
      c.head_dim = 64;
      c.causal = true;
      add(c);
    }
    {
      // Many key tiles: the K/V ring buffers wrap several times (2-3 stages), with a window.
      ProblemConfig c = base(dt, 1, 1100, 2000, 2, 1, 64);
      c.window_size_left = 700;
      c.window_size_right = 0;
      add(c);
      c = base(dt, 1, 700, 1300, 2, 2, 256);
      add(c);
    }
    add(base(dt, 1, 130, 77, 4, 1, 64));
    {
      // Per-warpgroup key ranges and end-aligned query tiles (sm90 forward v6, v7). Bottom-right
      // aligned, rows 0-149 see no key: the first 192-row tile (rows -84 .. 107) sees no key tile
      // at all, and in the second one (rows 108 .. 299) warpgroups 0 and 1 skip the upper key tile.
      ProblemConfig c = base(dt, 1, 300, 150, 2, 2, 64);
      c.causal = true;
      add(c);
      // A window: the third tile's middle warpgroup (rows 280 .. 343) skips a key tile above its
      // rows and one below (idle rounds before and after its own), head_dim 64; with two
      // warpgroups (head_dim 128, tiles from row 0) the lower one skips the key tile below its rows.
      c = base(dt, 1, 600, 600, 2, 2, 64);
      c.window_size_left = 100;
      c.window_size_right = 20;
      add(c);
      c = base(dt, 1, 640, 640, 2, 2, 128);
      c.window_size_left = 30;
      c.window_size_right = 0;
      add(c);
      // Top-left aligned, seqlen_q < seqlen_k: a window and a varlen causal batch.
      c = base(dt, 1, 257, 300, 2, 2, 64);
      c.window_size_left = 37;
      c.window_size_right = 11;
      c.align = CausalAlign::top_left;
      add(c);
      c = multi_tile_varlen(dt, 2, 2);
      c.head_dim = 64;
      c.causal = true;
      c.align = CausalAlign::top_left;
      add(c);
    }
    {
      ProblemConfig c = base(dt, 0, 0, 0, 2, 1, 128);
      c.lens_q = {17, 0, 130, 1, 64};
      c.lens_k = {33, 7, 130, 0, 200};
      add(c);
      c.causal = true;
      add(c);
      c.causal = false;
      c.window_size_left = 16;
      c.window_size_right = 8;
      c.head_dim = 64;
      add(c);
      // Multi-tile sequences whose last key tile crosses into the next sequence's rows.
      c = multi_tile_varlen(dt, 2, 2);
      add(c);
      c.causal = true;
      add(c);
      // The same at head_dim 64 (192-row tiles): a warpgroup past its sequence's end idles through
      // more key tiles than the ring has stages, and idle warpgroups take part in the V zeroing.
      c = multi_tile_varlen(dt, 2, 2);
      c.head_dim = 64;
      add(c);
      c.causal = true;
      add(c);
    }
    {
      // The 256 bucket's narrower sm90 configs (fwd_traits.hpp): head_dim <= 192 with head_dim_v
      // <= 128 (MLA's 192 / 128: block_n 128, V and O of 128 columns) and both <= 192 (block_n
      // 112, 96 without a mask where the keys split better (1024, 113), or 64 and persistent
      // where a causal mask or window meets <= 1024 keys): GQA, both causal alignments, a window with softcap, ALiBi, zero-filled
      // columns (head_dim 160, head_dim_v 96 / 40), varlen tiles that cross sequence ends (the V
      // rows zeroed over head_dim_v's panels, out by per-thread stores), and the ring wrapping.
      ProblemConfig c = base(dt, 2, 300, 520, 4, 2, 192);
      c.head_dim_v = 128;
      add(c);
      c.causal = true;
      add(c);
      c = base(dt, 1, 520, 300, 2, 1, 192);
      c.head_dim_v = 128;
      c.causal = true;
      c.align = CausalAlign::top_left;
      add(c);
      c = base(dt, 1, 400, 260, 2, 1, 192);
      c.head_dim_v = 128;
      c.window_size_left = 50;
      c.window_size_right = 10;
      c.softcap = 20.0f;
      add(c);
      c = base(dt, 2, 150, 170, 4, 2, 160);
      c.head_dim_v = 96;
      c.alibi = Alibi::per_batch_head;
      add(c);
      c.head_dim_v = 40;
      c.causal = true;
      add(c);
      c = multi_tile_varlen(dt, 2, 2);
      c.head_dim = 192;
      c.head_dim_v = 128;
      add(c);
      c.causal = true;
      add(c);
      c.head_dim_v = 192;
      add(c);
      c = base(dt, 1, 1100, 700, 2, 2, 192);
      add(c);
      c.causal = true;
      c.head_dim = 64;
      c.head_dim_v = 160;
      add(c);
      c = base(dt, 1, 700, 1100, 2, 1, 192);
      c.head_dim_v = 128;
      c.with_lse = false;
      add(c, GpuLayout::head_major);
      c = base(dt, 2, 300, 1024, 4, 2, 192);  // block_n 96: 11 steps, the last holding 64 keys
      add(c);
    }
    {
      ProblemConfig c = base(dt, 2, 100, 140, 4, 2, 64);
      add(c, GpuLayout::padded);
      add(c, GpuLayout::head_major);
      c.with_lse = false;
      add(c, GpuLayout::head_major);
    }
  }
  return cases;
}

class CudaForward : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudaForward, MatchesReferenceAndCpu) {
  FLASHATTN_REQUIRE_GPU();
  const GpuCase& gc = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(gc.cfg, seed);
  GpuProblem g(pr, gc.layout);

  const Plan pl = plan(g.params(), Pass::forward);
  ASSERT_TRUE(pl.ok) << pl.reason;
  forward(g.params());
  const std::vector<double> out = g.out.to_dense();
  EXPECT_TRUE(g.out.all_written("out"));
  EXPECT_TRUE(g.out.padding_intact("out"));

  if (pr.total_q() * gc.cfg.num_heads * gc.cfg.dv() == 0) return;
  const DenseResults& ref = pr.reference(Precision::f64, false);
  const DenseResults& naive = pr.reference(Precision::input, false);
  EXPECT_TRUE(check_close("out", out, ref.out, naive.out, gc.cfg.dtype));
  if (gc.cfg.with_lse) {
    const std::vector<double> lse = g.lse_dense();
    EXPECT_TRUE(g.lse.all_written("lse"));
    EXPECT_TRUE(g.lse.padding_intact("lse"));
    EXPECT_TRUE(check_close("lse", lse, ref.lse, naive.lse, DType::f32));
  } else {
    g.lse.download();
    EXPECT_TRUE(g.lse.untouched("lse (not given)"));
  }

  // The CPU backend on the same inputs: both are held to the same criterion, so they may differ
  // by at most the sum of their allowances.
  forward(pr.params());
  const std::vector<double> cpu_out = pr.out.to_dense();
  double naive_err = 0, max_ref = 0, diff = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    naive_err = std::max(naive_err, std::fabs(naive.out[i] - ref.out[i]));
    max_ref = std::max(max_ref, std::fabs(ref.out[i]));
    diff = std::max(diff, std::fabs(out[i] - cpu_out[i]));
  }
  EXPECT_LE(diff, 2 * (2 * naive_err + floor_rel(gc.cfg.dtype) * max_ref)) << "GPU vs CPU backend out";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaForward, ::testing::ValuesIn(forward_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& i) { return i.param.name(); });

// ------------------------------------------------------------------------------------------------
// FP8 (e4m3) forward: head_dim 128, batched, sm_90 only. Inputs N(0, 1)·stddev rounded to e4m3
// (fresh every run), descales uniform in [0.5, 2] per tensor, per (batch, KV head) or not given.

std::vector<GpuCase> fp8_cases() {
  std::vector<GpuCase> cases;
  auto add = [&](ProblemConfig c) { cases.push_back({c, GpuLayout::contiguous}); };
  const DType e4m3 = DType::e4m3;
  for (Descale ds : {Descale::per_head, Descale::per_tensor, Descale::scalar, Descale::none}) {
    ProblemConfig c = base(e4m3, 2, 203, 520, 4, 2, 128);  // GQA 4/2, lengths off tile multiples
    c.descale = ds;
    add(c);
  }
  // (150 and 384 keys: inside one key tile of 192 and two whole ones, for other block_n.)
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 113}, {113, 203}, {520, 1000}, {1000, 520}, {203, 1}, {384, 150},
                        {150, 384}}) {
    ProblemConfig c = base(e4m3, 1, sq, sk, 4, 2, 128);
    c.descale = Descale::per_head;
    add(c);
    c.causal = true;
    add(c);
  }
  for (Alibi al : {Alibi::per_head, Alibi::per_batch_head}) {  // ALiBi after the descaled scores
    ProblemConfig c = base(e4m3, 2, 203, 520, 4, 2, 128);
    c.descale = Descale::per_head;
    c.alibi = al;
    c.causal = al == Alibi::per_batch_head;
    add(c);
  }
  {
    ProblemConfig c = base(e4m3, 2, 520, 1000, 4, 2, 128);
    c.descale = Descale::per_head;
    c.causal = true;
    c.align = CausalAlign::top_left;
    add(c);
    c = base(e4m3, 1, 1000, 1000, 4, 2, 128);
    c.descale = Descale::per_tensor;
    c.window_size_left = 100;
    c.window_size_right = 20;
    add(c);
    c = base(e4m3, 1, 203, 520, 4, 2, 128);
    c.descale = Descale::per_head;
    c.softcap = 30.0f;
    add(c);
    c.causal = true;
    c.softcap = 5.0f;
    c.stddev = 3.0;  // larger scores: softcap actually bends them
    add(c);
    c = base(e4m3, 2, 113, 203, 4, 2, 128);
    c.descale = Descale::per_head;
    c.with_lse = false;
    add(c);
    c = base(e4m3, 1, 520, 520, 4, 4, 128);  // no GQA
    c.descale = Descale::per_head;
    c.stddev = 0.25;  // small inputs: e4m3's subnormals
    add(c);
  }
  return cases;
}

// The absolute term of the FP8 criterion. The emulation's error is dominated by P's rounding to
// e4m3 (up to 2^-4 relative per probability), a few 1e-3 and more on these shapes, so 2x of it is the
// real bound; 1e-3 only covers tensors where the emulation is nearly exact by luck (rows that see
// a single key, whose P = 1 rounds exactly), where ours and the emulation may still differ by the
// float32 rounding of v · v_descale before the final bf16 rounding: at most one bf16 ulp at the
// output's magnitude in rare double-rounding cases, ~1e-3 relative at |out| ~ 1 (out ~ v ~ N(0, 1)).
constexpr double kFp8OutFloor = 1e-3;
// lse: the emulation's is exact to float32 rounding (P's e4m3 rounding does not enter the row sum),
// so 1e-4 relative to max|lse| covers ours' float32 sums over ~1000 keys in another order; on top of
// it, the FP8 tensor cores' shorter accumulator (fp8_emulated_forward()'s return value: on the H200 ours
// was 1e-3 to 4e-3 off with 1e-4 relative alone, where that bound was ~1e-2).
constexpr double kFp8LseFloorRel = 1e-4;

class CudaForwardFp8 : public ::testing::TestWithParam<GpuCase> {};

// out (and lse where asked for) of an FP8 forward already run on `g`, against the float64
// reference with the FP8 criterion above; every element written, padding intact, lse untouched
// where not asked for.
void expect_fp8_matches(GpuProblem& g) {
  Problem& pr = *g.problem;
  const std::vector<double> out = g.out.to_dense();
  EXPECT_TRUE(g.out.all_written("out"));
  EXPECT_TRUE(g.out.padding_intact("out"));

  const DenseResults& ref = pr.reference(Precision::f64, false);  // decoded inputs times descales
  const detail::Params hp = detail::validate(pr.params(), Pass::forward);
  std::vector<double> emu_out(ref.out.size()), emu_lse(ref.lse.size());
  const double acc_bound = fp8_emulated_forward(hp, emu_out.data(), emu_lse.data());
  EXPECT_TRUE(check_close_with_floor("out", out, ref.out, emu_out, "FlashAttention-3 fp8 emulation",
                                     [](double) { return kFp8OutFloor; }, "1e-3"));
  if (pr.config().with_lse) {
    const std::vector<double> lse = g.lse_dense();
    EXPECT_TRUE(g.lse.all_written("lse"));
    EXPECT_TRUE(g.lse.padding_intact("lse"));
    EXPECT_TRUE(check_close_with_floor(
        "lse", lse, ref.lse, emu_lse, "float32 lse of the fp8 emulation",
        [&](double max_ref) { return kFp8LseFloorRel * max_ref + acc_bound; },
        "1e-4*max|ref| + the FP8 accumulator bound " + std::to_string(acc_bound)));
  } else {
    g.lse.download();
    EXPECT_TRUE(g.lse.untouched("lse (not given)"));
  }
}

TEST_P(CudaForwardFp8, MatchesReference) {
  FLASHATTN_REQUIRE_SM90();
  const GpuCase& gc = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(gc.cfg, seed);
  GpuProblem g(pr, gc.layout);

  const Plan pl = plan(g.params(), Pass::forward);
  ASSERT_TRUE(pl.ok) << pl.reason;
  std::printf("[   INFO   ] e4m3 forward kernel: %s\n", pl.kernel.c_str());
  forward(g.params());
  expect_fp8_matches(g);
}

// The FP8 forward transposes v into a stream-ordered workspace (cudaMallocAsync) on every call:
// captured in global mode (torch.cuda.graph's) and replayed twice, and called on an eager stream
// while another stream's global-mode capture is open, which a refused allocation would invalidate
// (the library relaxes its thread's capture mode around it: CallsBesideAGlobalCapture's note).
TEST(CudaForwardMisc, Fp8UnderAndBesideAGlobalCapture) {
  FLASHATTN_REQUIRE_SM90();
  ProblemConfig c = base(DType::e4m3, 2, 203, 520, 4, 2, 128);
  c.descale = Descale::per_head;
  c.causal = true;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed), pr_eager(c, seed + 1);
  GpuProblem g(pr, GpuLayout::contiguous), g_eager(pr_eager, GpuLayout::contiguous);
  {
    SCOPED_TRACE("captured, replayed");
    GraphCapture graph(cudaStreamCaptureModeGlobal);
    ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t stream) {
      AttentionParams a = g.params();
      a.stream = stream;
      forward(a);
    }));
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      g.out.poison();
      g.lse.poison();
      ASSERT_NO_FATAL_FAILURE(graph.replay());
      expect_fp8_matches(g);
    }
  }
  SCOPED_TRACE("eager, beside a capture");
  EagerBesideCapture e;
  ASSERT_NO_FATAL_FAILURE(e.set_up());
  GraphCapture graph(cudaStreamCaptureModeGlobal);
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t cap) {
    e.record(cap);
    AttentionParams a = g_eager.params();
    a.stream = e.stream;
    forward(a);
    expect_still_capturing(cap, "the FP8 forward");
  }));
  FLASHATTN_ASSERT_CUDA(cudaStreamSynchronize(e.stream));
  expect_fp8_matches(g_eager);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaForwardFp8, ::testing::ValuesIn(fp8_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& i) { return i.param.name(); });

// plan() names the kernel that forward() runs: the Hopper kernel on an sm_90 device when this
// build has it (unless FLASHATTN_CUDA_FWD=sm80 forces the sm80 one), the sm80 kernel elsewhere.
// Scores that rise by more than 2^8 per key tile towards key 0, the tile the kernels visit last:
// every tile moves the running max by a large step, at different tiles for different rows, so O
// and the row sums are rescaled by factors far from 1 (random inputs rarely move the max by much).
TEST(CudaForwardMisc, RunningMaxRisesAcrossTiles) {
  FLASHATTN_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128, 256}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " head_dim " + std::to_string(d));
      const ProblemConfig c = base(dt, 1, 300, 1100, 2, 2, d);  // head_dim_v = head_dim
      Problem pr(c, seed + static_cast<uint64_t>(d));
      // q rows = u + noise (one u per head), key j = u · ramp(j) + noise, ramp 4 -> 0 over the keys:
      // scores ≈ sqrt(d) · ramp(j), up to ~45 (log2 units ~65) at head_dim 128.
      std::vector<double> q = pr.q.to_dense(), k = pr.k.to_dense();
      std::mt19937_64 rng(seed);
      std::normal_distribution<double> normal;
      for (int64_t h = 0; h < c.num_heads; ++h) {
        std::vector<double> u(static_cast<size_t>(d));
        for (double& x : u) x = normal(rng);
        for (int64_t i = 0; i < c.seqlen_q; ++i)
          for (int64_t x = 0; x < d; ++x) q[(i * c.num_heads + h) * d + x] = u[x] + 0.3 * normal(rng);
        for (int64_t j = 0; j < c.seqlen_k; ++j) {
          const double ramp = 4.0 * (1.0 - static_cast<double>(j) / static_cast<double>(c.seqlen_k));
          for (int64_t x = 0; x < d; ++x) k[(j * c.num_heads_k + h) * d + x] = u[x] * ramp + 0.3 * normal(rng);
        }
      }
      pr.q.set(q);
      pr.k.set(k);
      GpuProblem g(pr, GpuLayout::contiguous);
      forward(g.params());
      const std::vector<double> out = g.out.to_dense();  // downloads
      EXPECT_TRUE(g.out.all_written("out"));
      const DenseResults& ref = pr.reference(Precision::f64, false);
      const DenseResults& naive = pr.reference(Precision::input, false);
      EXPECT_TRUE(check_close("out", out, ref.out, naive.out, dt));
      EXPECT_TRUE(check_close("lse", g.lse_dense(), ref.lse, naive.lse, DType::f32));
    }
}

TEST(CudaForwardMisc, KernelChoice) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 1, 64, 64, 2, 2, 128);
  Problem pr(c, fresh_seed());
  GpuProblem g(pr, GpuLayout::contiguous);
  const Plan pl = plan(g.params(), Pass::forward);
  ASSERT_TRUE(pl.ok) << pl.reason;
  EXPECT_EQ(pl.kernel, expect_sm90_kernels("FLASHATTN_CUDA_FWD") ? "cuda_fwd_sm90_tma_wgmma_hdim128"
                                                                  : "cuda_fwd_sm80_mma_hdim128");
  std::printf("[   INFO   ] forward kernel: %s\n", pl.kernel.c_str());
}

// The same call twice gives bitwise the same out and lse (no atomics, no races in the forward).
TEST(CudaForwardMisc, Repeatable) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::bf16, 2, 333, 333, 4, 2, 128);
  c.causal = true;
  Problem pr(c, fresh_seed());
  GpuProblem g(pr, GpuLayout::contiguous);
  forward(g.params());
  g.out.download();
  g.lse.download();
  const std::vector<unsigned char> out0 = g.out.bytes(), lse0 = g.lse.bytes();
  for (int i = 0; i < 10; ++i) {
    forward(g.params());
    g.out.download();
    g.lse.download();
    ASSERT_EQ(out0, g.out.bytes()) << "run " << i;
    ASSERT_EQ(lse0, g.lse.bytes()) << "run " << i;
  }
}

// A NaN in k (keys 24-31 of kv head 0: on the FP8 forward, scores whose exponentials run on the FMA
// pipe, exp2_fma, as well as MUFU's) gives NaN in every out and lse element of the query heads that
// see it, and the other kv head's heads stay finite. Before exp2_fma kept NaN, the FP8 forward
// turned such a score into 3.4e38 and returned a finite out.
void expect_nan_key_gives_nan(DType dt) {
  ProblemConfig c = base(dt, 1, 70, 100, 4, 2, 128);
  if (dt == DType::e4m3) c.descale = Descale::per_tensor;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  std::vector<double> k = pr.k.to_dense();  // [1, 100, 2, 128]
  for (int key = 24; key < 32; ++key) k[(key * 2 + 0) * 128 + 5] = std::nan("");
  g.k.set(k);
  forward(g.params());
  const std::vector<double> out = g.out.to_dense(), lse = g.lse.to_dense();
  EXPECT_EQ(nan_head_mismatches(c, out, lse, [](int64_t, int64_t h) { return h / 2 == 0; }), 0)
      << dtype_name(dt) << ": elements whose NaN-ness does not match their head";
}

TEST(CudaForwardMisc, NaNKeyGivesNaN) {
  FLASHATTN_REQUIRE_GPU();
  expect_nan_key_gives_nan(DType::bf16);
}

TEST(CudaForwardMisc, Fp8NaNKeyGivesNaN) {
  FLASHATTN_REQUIRE_SM90();
  expect_nan_key_gives_nan(DType::e4m3);
}

// A varlen forward captured into a CUDA graph: plan() skips its synchronizing cu_seqlens check
// under capture and the replay must give the same result as an eager call.
TEST(CudaForwardMisc, VarlenUnderGraphCapture) {
  FLASHATTN_REQUIRE_GPU();
  ProblemConfig c = base(DType::f16, 0, 0, 0, 4, 2, 64);
  c.lens_q = {70, 0, 129};
  c.lens_k = {70, 5, 300};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  GpuProblem g(pr, GpuLayout::contiguous);
  AttentionParams a = g.params();
  a.max_seqlen_q = 129;
  a.max_seqlen_k = 300;
  GraphCapture graph;
  ASSERT_NO_FATAL_FAILURE(graph.capture([&](cudaStream_t stream) {
    a.stream = stream;
    forward(a);
  }));
  ASSERT_NO_FATAL_FAILURE(graph.replay());
  expect_out_matches(g);
}

// Element offsets past 2^31: batch 1 of every tensor starts 2^31 + 8 elements after batch 0, so
// 32-bit index arithmetic anywhere would read or write the wrong place. Only the logical rows are
// copied; the rest of each ~4 GB buffer is never touched.
TEST(CudaForwardMisc, OffsetsPast2to31) {
  FLASHATTN_REQUIRE_GPU();
  const int64_t B = 2, S = 160, H = 2, D = 128;
  const int64_t batch_stride = (int64_t{1} << 31) + 8;
  ProblemConfig c = base(DType::bf16, B, S, S, H, H, D);
  c.causal = true;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  Problem pr(c, seed);
  const size_t bytes = static_cast<size_t>(batch_stride + S * H * D) * 2;
  struct Buf {
    void* p = nullptr;
    ~Buf() { cudaFree(p); }
  } q, k, v, o;
  for (Buf* b : {&q, &k, &v, &o}) {
    const cudaError_t e = cudaMalloc(&b->p, bytes);
    if (e == cudaErrorMemoryAllocation) GTEST_SKIP() << "not enough GPU memory for 4 x " << bytes << " bytes";
    FLASHATTN_ASSERT_CUDA(e);
  }
  const size_t slab = static_cast<size_t>(S * H * D) * 2;
  auto put = [&](Buf& dst, const HostTensor& src) {
    for (int64_t b = 0; b < B; ++b)
      FLASHATTN_ASSERT_CUDA(cudaMemcpy(static_cast<char*>(dst.p) + b * batch_stride * 2,
                                       static_cast<const char*>(src.data()) + b * slab, slab, cudaMemcpyHostToDevice));
  };
  put(q, pr.q);
  put(k, pr.k);
  put(v, pr.v);
  for (int64_t b = 0; b < B; ++b)
    FLASHATTN_ASSERT_CUDA(cudaMemset(static_cast<char*>(o.p) + b * batch_stride * 2, 0xff, slab));  // NaN
  auto view = [&](Buf& buf) {
    TensorView t;
    t.data = buf.p;
    t.dtype = DType::bf16;
    t.device = Device::cuda;
    t.device_index = current_device();
    t.ndim = 4;
    const int64_t shape[4] = {B, S, H, D}, stride[4] = {batch_stride, H * D, D, 1};
    for (int d = 0; d < 4; ++d) {
      t.shape[d] = shape[d];
      t.stride[d] = stride[d];
    }
    return t;
  };
  AttentionParams a;
  a.q = view(q);
  a.k = view(k);
  a.v = view(v);
  a.out = view(o);
  a.causal = true;
  forward(a);
  FLASHATTN_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> host(static_cast<size_t>(B * S * H * D));
  for (int64_t b = 0; b < B; ++b)
    FLASHATTN_ASSERT_CUDA(cudaMemcpy(host.data() + b * S * H * D, static_cast<char*>(o.p) + b * batch_stride * 2, slab,
                                     cudaMemcpyDeviceToHost));
  std::vector<double> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = to_double(DType::bf16, host.data(), static_cast<int64_t>(i));
  const DenseResults& ref = pr.reference(Precision::f64, false);
  const DenseResults& naive = pr.reference(Precision::input, false);
  EXPECT_TRUE(check_close("out", out, ref.out, naive.out, DType::bf16));
}

}  // namespace
}  // namespace flashattn::testing

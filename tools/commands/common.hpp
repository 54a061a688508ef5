// Shared by the CLI commands: owned host tensors for one attention call, random problems, device
// mirroring for --device cuda, and the comparison with the float64 reference that decides PASS/FAIL.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "io/host_tensor.hpp"

namespace flashattn::cli {

using io::HostTensor;

// Every tensor of one call; a tensor with an empty shape is "not given".
struct Tensors {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes;
};

// The scalar options of a call (AttentionParams minus the tensors).
struct CallOptions {
  float softmax_scale = 0.0f;
  bool causal = false;
  CausalAlign causal_align = CausalAlign::bottom_right;
  int64_t window_size_left = -1, window_size_right = -1;
  float softcap = 0.0f;
  bool deterministic = false;
  int num_threads = 0;
};

// Host views of the given tensors plus the options.
AttentionParams make_params(Tensors& t, const CallOptions& o);

// Allocates out and lse (and dq, dk, dv when `backward`) from the shapes of q, k, v, filled with
// NaN so that an element the library fails to write can never pass. Output shapes come from
// untrusted file headers, so before allocating anything it throws Error for the shape rules that
// bound the outputs' size, in validate()'s words: q's rank neither 4 (batched) nor 3 (varlen),
// num_heads < 1, head_dim or v's head_dim_v outside 1..256; and Error("outputs: ...") when the
// outputs need more bytes than the memory available (MemAvailable, capped by ulimit -v). The
// rest of validate() runs on the complete call.
void allocate_outputs(Tensors& t, bool backward);

// A random problem for check / bench / the default command.
struct ProblemSpec {
  DType dtype = DType::f32;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, num_heads = 4, num_heads_k = 4, head_dim = 64, head_dim_v = 0;
  std::vector<int32_t> varlen_q, varlen_k;  // per-sequence lengths: varlen layout when non-empty
  bool alibi = false, alibi_per_batch = false;
  bool backward = false;
  CallOptions options;
};
// Fresh random inputs (q, k, v, dout ~ N(0, 1) rounded to dtype; ALiBi slopes 2^(-8(h+1)/H)),
// NaN-filled outputs.
Tensors make_problem(const ProblemSpec& spec, std::mt19937_64& rng);

// Bytes this process may still allocate (the library's estimate: MemAvailable, cgroup and
// address-space limits; INT64_MAX when nothing says).
uint64_t available_memory();

// One prepared call on `device`: validated on the host (which reads cu_seqlens), and for cuda
// every tensor copied to the GPU once, so that repeated forward()/backward() calls time only the
// kernels. The Tensors must outlive the Runner.
class Runner {
 public:
  Runner(Tensors& t, const CallOptions& o, Device device);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  double forward();   // seconds, synchronized
  double backward();  // seconds, synchronized; needs t.dout
  void download();    // cuda: copies out, lse, dq, dk, dv back to the host tensors (cpu: no-op)
  Plan plan(Pass pass) const;           // plan() for this call on its device
  std::string kernel(Pass pass) const;  // the kernel plan() names, or "none (reason)"
  const AttentionParams& host_params() const { return host_; }

 private:
  struct Device_;
  Tensors& t_;
  AttentionParams host_, run_;
  Device device_;
  std::unique_ptr<Device_> mirror_;
};

// Runs forward (and backward when t.dout is given) once and leaves the outputs in t.
struct RunTimes {
  double forward_s = 0, backward_s = 0;
  std::string forward_kernel, backward_kernel;
};
RunTimes run_attention(Tensors& t, const CallOptions& o, Device device);

// Turns "auto" / "cpu" / "cuda" into a Device; throws Error when cuda is asked for but absent.
Device resolve_device(const std::string& name);

// One output's error against the float64 reference.
struct ErrorRow {
  std::string name;        // out, lse, dq, dk, dv
  double max_abs = 0;      // max |ours − f64|
  double max_ref = 0;      // max |f64| over finite entries
  double naive_abs = 0;    // max |naive input-precision formula − f64|
  double bound = 0;        // 2 · naive_abs + floor
  int64_t bad = 0;         // NaN / inf / unwritten elements where the reference is finite
  bool pass = false;
};

// Compares the outputs held by `params` (host tensors) with reference::forward / backward in
// float64 and in the input precision. Backward rows are added when `backward`.
// Criterion (docs/helpers-brief.md): max_abs <= 2 · naive_abs + floor, floor = c · max(1, max_ref)
// with c = 1e-5 for fp32, 2^-10 for fp16, 2^-7 for bf16 (one ulp of the output); lse uses c = 1e-5
// as it is always float32.
std::vector<ErrorRow> compare_with_reference(const AttentionParams& params, bool backward);

// The views of `params` restricted to query heads [h0, h0 + count) and their KV heads (count must
// be a multiple of the GQA group size, h0 too), for checking a subset of a large call.
AttentionParams slice_heads(const AttentionParams& params, int64_t h0, int64_t count);

// Prints an error table (one row per output) to stdout; returns true when every row passes.
bool print_error_table(const std::vector<ErrorRow>& rows, const std::string& indent = "  ");

// FLOPs of one call, FlashAttention's convention: 4 · batch · heads · seqlen_q · seqlen_k · head_dim
// (two matmuls), halved for causal, 2.5x for the backward.
double attention_flops(const ProblemSpec& spec, bool backward);
double attention_flops(const AttentionParams& params, bool backward);  // same, from a validated call

double now_seconds();

}  // namespace flashattn::cli

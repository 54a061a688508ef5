// The default job (`flashattn` with no command): one attention layer in the Llama-3-8B shape
// (32 query heads, 8 KV heads, head_dim 128, seqlen 2048, batch 1, causal, bf16) forward and
// backward on the CPU, with time, GFLOP/s, and the error against the float64 reference. The
// reference materializes every score in float64 (twice: exact and in the input precision), so it
// checks a subset of whole KV groups by default (--check-heads; 32 checks everything).
#include <cstdio>
#include <random>
#include <string>

#include "commands/commands.hpp"
#include "commands/common.hpp"

namespace flashattn::cli {

namespace {

struct DefaultArgs {
  int threads = 0;
  int64_t check_heads = 4;
  std::string device = "cpu";
  int64_t seqlen = 2048;
};

int main_job(const DefaultArgs& a) {
  ProblemSpec s;
  s.dtype = DType::bf16;
  s.batch = 1;
  s.seqlen_q = s.seqlen_k = a.seqlen;
  s.num_heads = 32;
  s.num_heads_k = 8;
  s.head_dim = 128;
  s.backward = true;
  s.options.causal = true;
  s.options.num_threads = a.threads;
  const Device device = resolve_device(a.device);
  std::printf("flashattn %s: one Llama-3-8B attention layer on %s: batch 1, seqlen %lld, 32 query heads, "
              "8 KV heads, head_dim 128, causal, bf16\n",
              version(), device == Device::cuda ? "cuda" : "cpu", static_cast<long long>(a.seqlen));
  std::mt19937_64 rng(std::random_device{}());
  Tensors t = make_problem(s, rng);
  const RunTimes times = run_attention(t, s.options, device);
  std::printf("forward   %-28s %9.1f ms %9.2f GFLOP/s\n", times.forward_kernel.c_str(), times.forward_s * 1e3,
              attention_flops(s, false) / times.forward_s * 1e-9);
  std::printf("backward  %-28s %9.1f ms %9.2f GFLOP/s\n", times.backward_kernel.c_str(), times.backward_s * 1e3,
              attention_flops(s, true) / times.backward_s * 1e-9);

  const int64_t heads = std::min<int64_t>(std::max<int64_t>(a.check_heads, 4) / 4 * 4, 32);
  const double t0 = now_seconds();
  const AttentionParams full = make_params(t, s.options);
  const std::vector<ErrorRow> rows = compare_with_reference(slice_heads(full, 0, heads), true);
  std::printf("check against the float64 reference on query heads 0-%lld (KV heads 0-%lld; all rows), %.1f s:\n",
              static_cast<long long>(heads - 1), static_cast<long long>(heads / 4 - 1), now_seconds() - t0);
  const bool pass = print_error_table(rows);
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

Command add_default_command(CLI::App& app) {
  auto args = std::make_shared<DefaultArgs>();
  app.add_option("--threads", args->threads, "default job: CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  app.add_option("--check-heads", args->check_heads,
                 "default job: query heads checked against the reference (whole KV groups of 4; 32 = all)")
      ->check(CLI::Range(4, 32));
  app.add_option("--device", args->device, "default job: cpu, cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--seqlen", args->seqlen, "default job: sequence length")->check(CLI::PositiveNumber);
  return {&app, [args] { return main_job(*args); }};
}

}  // namespace flashattn::cli

// The default job (`flashattn` with no command): one attention layer in the Llama-3-8B shape
// (32 query heads, 8 KV heads, head_dim 128, seqlen 2048, batch 1, causal, bf16) forward and
// backward on the CPU, with time, GFLOP/s, and the error against the float64 reference. The
// reference materializes every score in float64 (twice: exact and in the input precision), so by
// default it checks the first and the last KV group (query heads 0-3 and 28-31, all rows), which
// takes about 20 s on two cores; --check-groups 8 checks everything.
#include <cstdio>
#include <random>
#include <string>

#include "commands/commands.hpp"
#include "commands/common.hpp"

namespace flashattn::cli {

namespace {

struct DefaultArgs {
  int threads = 0;
  int64_t check_groups = 2;
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

  // KV groups spread evenly from the first to the last (GQA: a group is one KV head and its 4 query heads).
  const int64_t groups = s.num_heads_k, group_size = s.num_heads / s.num_heads_k;
  const AttentionParams full = make_params(t, s.options);
  bool pass = true;
  for (int64_t i = 0; i < a.check_groups; ++i) {
    const int64_t g = a.check_groups == 1 ? 0 : i * (groups - 1) / (a.check_groups - 1);
    const double t0 = now_seconds();
    const std::vector<ErrorRow> rows = compare_with_reference(slice_heads(full, g * group_size, group_size), true);
    std::printf("check against the float64 reference, KV head %lld (query heads %lld-%lld, all rows), %.1f s:\n",
                static_cast<long long>(g), static_cast<long long>(g * group_size),
                static_cast<long long>((g + 1) * group_size - 1), now_seconds() - t0);
    pass = print_error_table(rows) && pass;
  }
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

Command add_default_command(CLI::App& app) {
  auto args = std::make_shared<DefaultArgs>();
  app.add_option("--threads", args->threads, "default job: CPU threads (0 = all)")->transform(thread_count());
  app.add_option("--check-groups", args->check_groups,
                 "default job: KV groups (4 query heads each) checked against the reference, spread from "
                 "the first to the last; 8 = all")
      ->transform(decimal_integer())
      ->check(CLI::Range(1, 8));
  app.add_option("--device", args->device, "default job: cpu, cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--seqlen", args->seqlen, "default job: sequence length")
      ->transform(decimal_integer())
      ->check(positive_number())
      ->check(int_sized());
  return {&app, [args] { return main_job(*args); }};
}

}  // namespace flashattn::cli

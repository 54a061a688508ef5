// `flashattn check`: a built-in correctness sweep against the float64 reference, covering what the
// kernels special-case: each dtype, causal in both alignments, sliding window, softcap, ALiBi, GQA
// and MQA, varlen with empty sequences and rows that see no key, odd head dims, head_dim_v != head_dim,
// seqlen_q = 1, and the deterministic backward (run twice, compared bitwise). Fresh random inputs
// every run.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "commands/commands.hpp"
#include "commands/common.hpp"

namespace flashattn::cli {

namespace {

struct CheckArgs {
  std::string device = "cpu";
  bool quick = false, verbose = false;
  uint64_t seed = 0;
  int threads = 0;
};

struct Case {
  std::string name;
  ProblemSpec spec;
  bool quick;  // part of --quick
};

ProblemSpec spec(DType dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads, int64_t heads_k,
                 int64_t head_dim) {
  ProblemSpec s;
  s.dtype = dtype;
  s.batch = batch;
  s.seqlen_q = seqlen_q;
  s.seqlen_k = seqlen_k;
  s.num_heads = heads;
  s.num_heads_k = heads_k;
  s.head_dim = head_dim;
  s.backward = true;
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"dense 2x67x67 h4 d64", spec(DType::f32, 2, 67, 67, 4, 4, 64), true});
  {
    ProblemSpec s = spec(DType::f16, 1, 50, 113, 3, 3, 64);
    s.options.causal = true;
    c.push_back({"causal bottom-right q50 k113", s, true});
  }
  {
    ProblemSpec s = spec(DType::bf16, 2, 113, 50, 2, 2, 128);
    s.options.causal = true;
    s.options.causal_align = CausalAlign::top_left;
    c.push_back({"causal top-left q113 k50 d128", s, true});
  }
  {
    ProblemSpec s = spec(DType::bf16, 1, 130, 130, 2, 1, 64);
    s.options.causal = true;
    s.options.causal_align = CausalAlign::bottom_right;
    c.push_back({"causal bottom-right q130 k130 MQA", s, false});
  }
  {
    ProblemSpec s = spec(DType::f16, 1, 203, 203, 2, 2, 64);
    s.options.window_size_left = 32;
    s.options.window_size_right = 8;
    c.push_back({"window (32, 8) q203", s, true});
  }
  {
    ProblemSpec s = spec(DType::f32, 2, 96, 80, 2, 2, 80);
    s.options.softcap = 5.0f;
    s.options.softmax_scale = 0.5f;
    c.push_back({"softcap 5 scale 0.5 d80", s, false});
  }
  {
    ProblemSpec s = spec(DType::f16, 1, 77, 77, 4, 4, 96);
    s.alibi = true;
    s.options.causal = true;
    c.push_back({"alibi [heads] causal d96", s, true});
  }
  {
    ProblemSpec s = spec(DType::f32, 2, 45, 60, 6, 2, 32);
    s.alibi = true;
    s.alibi_per_batch = true;
    c.push_back({"alibi [batch, heads] GQA 6/2", s, false});
  }
  {
    ProblemSpec s = spec(DType::bf16, 1, 64, 64, 8, 1, 128);
    s.options.causal = true;
    c.push_back({"MQA 8/1 causal d128", s, false});
  }
  {
    ProblemSpec s = spec(DType::f16, 4, 0, 0, 4, 2, 64);
    s.varlen_q = {37, 0, 64, 5};
    s.varlen_k = {50, 10, 64, 2};
    s.options.causal = true;
    c.push_back({"varlen {37,0,64,5}/{50,10,64,2} causal", s, true});
  }
  {
    ProblemSpec s = spec(DType::f32, 3, 0, 0, 2, 2, 59);
    s.varlen_q = {9, 33, 0};
    s.varlen_k = {3, 40, 7};
    s.options.causal = true;
    s.options.causal_align = CausalAlign::bottom_right;
    c.push_back({"varlen, rows seeing no key, d59", s, false});
  }
  {
    ProblemSpec s = spec(DType::f32, 1, 31, 31, 2, 2, 59);
    c.push_back({"odd head_dim 59", s, false});
  }
  {
    ProblemSpec s = spec(DType::bf16, 1, 70, 90, 2, 2, 96);
    s.head_dim_v = 64;
    s.options.causal = true;
    c.push_back({"head_dim 96, head_dim_v 64", s, false});
  }
  {
    ProblemSpec s = spec(DType::bf16, 2, 1, 255, 4, 2, 128);
    s.options.causal = true;
    c.push_back({"decode seqlen_q 1 k255", s, true});
  }
  {
    ProblemSpec s = spec(DType::bf16, 1, 256, 256, 2, 2, 128);
    s.options.causal = true;
    s.options.window_size_left = 100;
    s.options.softcap = 30.0f;
    s.alibi = true;
    c.push_back({"window+softcap+alibi q256 d128", s, false});
  }
  {
    ProblemSpec s = spec(DType::f16, 2, 97, 97, 4, 2, 64);
    s.options.causal = true;
    s.options.deterministic = true;
    c.push_back({"deterministic backward (bitwise x2)", s, true});
  }
  return c;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

int check(const CheckArgs& a) {
  const Device device = resolve_device(a.device);
  const uint64_t seed = a.seed ? a.seed : std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  std::mt19937_64 rng(seed);
  std::printf("flashattn check on %s, seed %llu; each cell is err / bound (PASS when <= 1), "
              "bound = 2 x naive-precision error + floor\n",
              device == Device::cuda ? "cuda" : "cpu", static_cast<unsigned long long>(seed));
  std::printf("%-3s %-40s %-5s %7s %7s %7s %7s %7s  %s\n", "#", "case", "dtype", "out", "lse", "dq", "dk", "dv",
              "result");
  int failed = 0, ran = 0, skipped = 0, index = 0;
  for (Case& c : cases()) {
    ++index;
    if (a.quick && !c.quick) continue;
    c.spec.options.num_threads = a.threads;
    Tensors t = make_problem(c.spec, rng);
    // A case the device's kernels do not cover is skipped visibly, with plan()'s reason; only the
    // backward may be missing, and then the forward is still checked.
    bool backward = true;
    std::string note;
    {
      Runner runner(t, c.spec.options, device);
      const Plan fwd = runner.plan(Pass::forward), bwd = runner.plan(Pass::backward);
      if (!fwd.ok) {
        std::printf("%-3d %-40s %-5s SKIP: %s\n", index, c.name.c_str(), io::dtype_label(c.spec.dtype),
                    fwd.reason.c_str());
        ++skipped;
        continue;
      }
      backward = bwd.ok;
      if (!backward) note = " (backward SKIP: " + bwd.reason + ")";
      runner.forward();
      if (backward) runner.backward();
      runner.download();
    }
    if (backward && c.spec.options.deterministic) {
      Tensors again = t;
      allocate_outputs(again, true);
      run_attention(again, c.spec.options, device);
      if (!same_bytes(t.dq, again.dq) || !same_bytes(t.dk, again.dk) || !same_bytes(t.dv, again.dv)) {
        note = " (deterministic backward differs between two runs)";
      }
    }
    ++ran;
    const std::vector<ErrorRow> rows = compare_with_reference(make_params(t, c.spec.options), backward);
    bool pass = note.empty() || note.rfind(" (backward SKIP", 0) == 0;
    std::printf("%-3d %-40s %-5s", index, c.name.c_str(), io::dtype_label(c.spec.dtype));
    for (const ErrorRow& r : rows) {
      pass = pass && r.pass;
      if (r.bad) {
        std::printf(" %7s", "NaN");
      } else {
        std::printf(" %7.3f", r.bound > 0 ? r.max_abs / r.bound : 0.0);
      }
    }
    std::printf("  %s%s\n", pass ? "PASS" : "FAIL", note.c_str());
    if (!pass || a.verbose) print_error_table(rows, "      ");
    failed += pass ? 0 : 1;
  }
  std::printf("%d passed, %d failed, %d skipped\n", ran - failed, failed, skipped);
  std::printf("%s\n", failed == 0 && ran > 0 ? "PASS" : "FAIL");
  return failed == 0 && ran > 0 ? 0 : 1;
}

}  // namespace

Command add_check_command(CLI::App& parent) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* app = parent.add_subcommand("check", "Correctness sweep against the float64 reference; exit 1 on failure.");
  app->add_option("--device", args->device, "cpu, cuda or auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app->add_flag("--quick", args->quick, "a subset of the cases");
  app->add_flag("--verbose", args->verbose, "print every case's error table");
  app->add_option("--seed", args->seed, "random seed (0 = fresh)")->transform(seed_value());
  app->add_option("--threads", args->threads, "CPU threads (0 = all)")->transform(thread_count());
  return {app, [args] { return check(*args); }};
}

}  // namespace flashattn::cli

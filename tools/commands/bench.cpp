// `flashattn bench`: GFLOP/s and working memory over a sweep of shapes. FLOPs follow
// FlashAttention's benchmarks: 4 · batch · heads · seqlen_q · seqlen_k · head_dim per forward, half
// for causal, 2.5x for the backward. Time is the median of the timed runs after one warm-up run.
// Working memory is the peak resident memory during one call minus the resident memory before it,
// with the inputs and outputs already allocated and touched: what the library itself needs.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "commands/commands.hpp"
#include "commands/common.hpp"
#include "io/host_tensor.hpp"

namespace flashattn::cli {

namespace {

struct BenchArgs {
  std::string device = "cpu";
  // The comma lists as given (split and checked by bench(): CLI11's own splitting drops empty
  // entries, so "64,,32" would pass as "64,32").
  std::vector<std::string> dtypes = {"f32,bf16"};
  std::vector<std::string> head_dims_text = {"64,128"};
  std::vector<std::string> seqlens_text = {"512,1024,2048,4096,8192"};
  int64_t batch = 1, heads = 16, heads_k = 0;
  std::string causal = "both";
  std::vector<std::string> passes = {"fwd,bwd"};
  int threads = 0, repeats = 5;
  double max_seconds = 20.0;
  std::string json;
};

// kB value of a "Name:   123 kB" line of /proc/self/status, or -1.
int64_t proc_status_kb(const char* name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(name) + ":";
  while (std::getline(f, line)) {
    if (line.compare(0, key.size(), key) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0, "5" in clear_refs); false when not permitted.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32") return DType::f32;
  if (s == "f16" || s == "fp16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  throw Error("--dtype: expected f32, f16 or bf16, got '" + s + "'");
}

std::vector<bool> parse_causal(const std::string& s) {
  if (s == "both") return {false, true};
  if (s == "true" || s == "on" || s == "yes" || s == "1") return {true};
  if (s == "false" || s == "off" || s == "no" || s == "0") return {false};
  throw Error("--causal: expected both, true or false, got '" + s + "'");
}

struct Measurement {
  double median_s = 0, min_s = 0;
  int runs = 0;
  double work_mib = -1;  // -1 when the peak could not be measured
};

template <class Fn>
Measurement measure(Fn&& call, int repeats, double max_seconds) {
  Measurement m;
  // Give freed heap pages back first so that the library's allocations show up as new RSS.
  malloc_trim(0);
  const int64_t before_kb = proc_status_kb("VmRSS");
  const bool peak_ok = reset_peak_rss();
  call();  // warm-up, also the memory measurement
  const int64_t peak_kb = proc_status_kb("VmHWM");
  if (peak_ok && before_kb >= 0 && peak_kb >= 0) m.work_mib = std::max<int64_t>(0, peak_kb - before_kb) / 1024.0;
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < repeats && (times.empty() || total < max_seconds)) {
    times.push_back(call());
    total += times.back();
  }
  std::sort(times.begin(), times.end());
  m.runs = static_cast<int>(times.size());
  m.min_s = times.front();
  m.median_s = m.runs % 2 ? times[m.runs / 2] : 0.5 * (times[m.runs / 2 - 1] + times[m.runs / 2]);
  return m;
}

// An option's comma lists (each occurrence one list), entries in order; an empty entry is an error.
std::vector<std::string> split_list(const std::string& option, const std::vector<std::string>& lists) {
  std::vector<std::string> entries;
  for (const std::string& list : lists) {
    for (std::size_t start = 0;;) {
      const std::size_t comma = list.find(',', start);
      std::string entry = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (entry.empty()) {
        throw Error(option + ": expected a comma-separated list without empty entries, got '" + list + "'");
      }
      entries.push_back(std::move(entry));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return entries;
}

// A list of positive ints, each entry checked as a single integer option is.
std::vector<int64_t> int_list(const std::string& option, const std::vector<std::string>& lists) {
  std::vector<int64_t> values;
  for (std::string entry : split_list(option, lists)) {
    for (CLI::Validator check : {decimal_integer(), positive_number(), int_sized()}) {
      const std::string problem = check(entry);
      if (!problem.empty()) throw Error(option + ": " + problem);
    }
    values.push_back(std::stoll(entry));
  }
  return values;
}

int bench(const BenchArgs& a) {
  const std::vector<int64_t> head_dims = int_list("--head-dim", a.head_dims_text);
  const std::vector<int64_t> seqlens = int_list("--seqlen", a.seqlens_text);
  const Device device = resolve_device(a.device);
  if (!a.json.empty()) {
    // Before the sweep, not after minutes of it.
    try {
      io::check_writable(a.json);
    } catch (const Error& e) {
      throw Error(std::string("--json: ") + e.what());
    }
  }
  std::vector<DType> dtypes;
  for (const std::string& s : split_list("--dtype", a.dtypes)) dtypes.push_back(parse_dtype(s));
  const std::vector<bool> causals = parse_causal(a.causal);
  bool do_fwd = false, do_bwd = false;
  for (const std::string& p : split_list("--pass", a.passes)) {
    if (p == "fwd") do_fwd = true;
    else if (p == "bwd") do_bwd = true;
    else throw Error("--pass: expected fwd and/or bwd, got '" + p + "'");
  }
  const int64_t heads_k = a.heads_k > 0 ? a.heads_k : a.heads;
  // Before the sweep, in the options' own names (the library would name q's and k's shapes, after
  // the shapes before them had run).
  for (const int64_t hd : head_dims)
    if (hd > kMaxHeadDim)
      throw Error("--head-dim: expected at most " + std::to_string(kMaxHeadDim) + ", got " + std::to_string(hd));
  if (a.heads % heads_k != 0)
    throw Error("--heads-k: expected a divisor of --heads = " + std::to_string(a.heads) + ", got " +
                std::to_string(heads_k));
  // Fixed mmap threshold: large buffers are mmapped and unmapped on free, so they never hide in
  // the heap between measurements (glibc otherwise raises the threshold after the first free).
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);

  nlohmann::json results = nlohmann::json::array();
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::printf("flashattn %s bench on %s, %s threads, batch %lld, heads %lld/%lld, %s\n", version(),
              device == Device::cuda ? "cuda" : "cpu", a.threads ? std::to_string(a.threads).c_str() : "all",
              static_cast<long long>(a.batch), static_cast<long long>(a.heads), static_cast<long long>(heads_k), date);
  std::printf("%-4s %-5s %5s %7s %-6s %11s %10s %10s %5s  %s\n", "pass", "dtype", "hdim", "seqlen", "causal",
              "median ms", "GFLOP/s", "work MiB", "runs", "kernel");
  std::fflush(stdout);
  const std::size_t total = dtypes.size() * head_dims.size() * seqlens.size();
  std::size_t done = 0;
  std::mt19937_64 rng(std::random_device{}());
  for (DType dtype : dtypes) {
    for (int64_t hd : head_dims) {
      for (int64_t sl : seqlens) {
        ++done;
        std::fprintf(stderr, "[%zu/%zu] %s head_dim %lld seqlen %lld\n", done, total, io::dtype_label(dtype),
                     static_cast<long long>(hd), static_cast<long long>(sl));
        for (bool causal : causals) {
          ProblemSpec s;
          s.dtype = dtype;
          s.batch = a.batch;
          s.seqlen_q = s.seqlen_k = sl;
          s.num_heads = a.heads;
          s.num_heads_k = heads_k;
          s.head_dim = hd;
          s.backward = do_bwd;
          s.options.causal = causal;
          s.options.num_threads = a.threads;
          Tensors t = make_problem(s, rng);
          Runner runner(t, s.options, device);
          if (do_bwd) runner.forward();  // the backward needs the forward's out and lse
          for (int pass = 0; pass < 2; ++pass) {
            const bool bwd = pass == 1;
            if ((bwd && !do_bwd) || (!bwd && !do_fwd)) continue;
            Measurement m = measure([&] { return bwd ? runner.backward() : runner.forward(); }, a.repeats,
                                    a.max_seconds);
            if (device == Device::cuda) m.work_mib = -1;  // host RSS says nothing about GPU memory
            const double gflops = attention_flops(s, bwd) / m.median_s * 1e-9;
            const std::string kernel = runner.kernel(bwd ? Pass::backward : Pass::forward);
            std::printf("%-4s %-5s %5lld %7lld %-6s %11.3f %10.2f %10.1f %5d  %s\n", bwd ? "bwd" : "fwd",
                        io::dtype_label(dtype), static_cast<long long>(hd), static_cast<long long>(sl),
                        causal ? "yes" : "no", m.median_s * 1e3, gflops, m.work_mib, m.runs, kernel.c_str());
            std::fflush(stdout);
            results.push_back({{"pass", bwd ? "bwd" : "fwd"},
                               {"dtype", io::dtype_label(dtype)},
                               {"batch", a.batch},
                               {"num_heads", a.heads},
                               {"num_heads_k", heads_k},
                               {"head_dim", hd},
                               {"seqlen_q", sl},
                               {"seqlen_k", sl},
                               {"causal", causal},
                               {"median_ms", m.median_s * 1e3},
                               {"min_ms", m.min_s * 1e3},
                               {"runs", m.runs},
                               {"gflops", gflops},
                               {"flops", attention_flops(s, bwd)},
                               {"work_mib", m.work_mib >= 0 ? nlohmann::json(m.work_mib) : nlohmann::json(nullptr)},
                               {"kernel", kernel}});
          }
        }
      }
    }
  }
  if (!a.json.empty()) {
    const nlohmann::json doc = {{"tool", "flashattn bench"},
                                {"version", version()},
                                {"date", date},
                                {"device", device == Device::cuda ? "cuda" : "cpu"},
                                {"threads", a.threads},
                                {"flops_formula", "4*batch*heads*seqlen_q*seqlen_k*head_dim, /2 causal, x2.5 bwd"},
                                {"results", results}};
    std::ofstream f(a.json);
    f << doc.dump(2) << "\n";
    f.close();  // a full disk shows only when the buffer is written out
    if (!f) throw Error("--json: cannot write '" + a.json + "'");
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& parent) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* app = parent.add_subcommand("bench", "Benchmark GFLOP/s and working memory over a sweep of shapes.");
  app->add_option("--device", args->device, "cpu, cuda or auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app->add_option("--dtype", args->dtypes, "comma-separated: f32, f16, bf16")->type_name("LIST");
  app->add_option("--head-dim", args->head_dims_text, "comma-separated head dims")->type_name("LIST");
  app->add_option("--seqlen", args->seqlens_text, "comma-separated sequence lengths (seqlen_q = seqlen_k)")
      ->type_name("LIST");
  app->add_option("--batch", args->batch, "batch size")
      ->transform(decimal_integer())
      ->check(positive_number())
      ->check(int_sized());
  app->add_option("--heads", args->heads, "query heads")
      ->transform(decimal_integer())
      ->check(positive_number())
      ->check(int_sized());
  app->add_option("--heads-k", args->heads_k, "KV heads (0 = same as --heads)")
      ->transform(decimal_integer())
      ->check(non_negative_number())
      ->check(int_sized());
  app->add_option("--causal", args->causal, "both, true or false");
  app->add_option("--pass", args->passes, "comma-separated: fwd, bwd")->type_name("LIST");
  app->add_option("--threads", args->threads, "CPU threads (0 = all)")->transform(thread_count());
  app->add_option("--repeats", args->repeats, "timed runs after the warm-up (median reported)")
      ->transform(decimal_integer())
      ->check(positive_number())
      ->check(int_sized());
  app->add_option("--max-seconds", args->max_seconds, "stop repeating a shape once its timed runs exceed this")
      ->check(positive_number());
  app->add_option("--json", args->json, "also write the results as JSON to this file");
  return {app, [args] { return bench(*args); }};
}

}  // namespace flashattn::cli

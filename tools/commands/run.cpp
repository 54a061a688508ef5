// `flashattn run`: attention on tensors read from .npy / .safetensors files, outputs written by
// extension. Everything is read and checked (output paths for clashes with each other and with the
// inputs, their directories for write access; the shapes that size the outputs) before any output
// memory is allocated, the call is validated before anything runs, and every output file is written
// to a temporary and renamed only once all are written, so that a bad call writes nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "commands/commands.hpp"
#include "commands/common.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"

namespace flashattn::cli {

namespace {

struct RunArgs {
  std::string inputs, q, k, v, dout, alibi, cu_seqlens_q, cu_seqlens_k;
  std::string out, lse, dq, dk, dv;
  bool causal = false;
  std::string causal_align;  // empty: not given (bottom-right)
  std::string window;
  double softcap = 0.0, scale = 0.0;  // parsed wide: a value that rounds to 0 in float32 is refused, not "off"
  std::string device = "auto";
  int threads = 0;
  bool deterministic = false, check = false;
};

// Reads each input file once; a .safetensors file serves every tensor asked of it by name.
class InputFiles {
 public:
  HostTensor load(const std::string& option, const std::string& path, const std::string& name) {
    Loaded& f = open(option, path);
    try {
      if (f.safetensors) return f.safetensors->get(name);
      return io::read_npy(f.bytes.data(), f.bytes.size());
    } catch (const Error& e) {
      throw Error(option + " '" + path + "': " + e.what());
    }
  }
  bool contains(const std::string& option, const std::string& path, const std::string& name) {
    Loaded& f = open(option, path);
    return f.safetensors && f.safetensors->contains(name);
  }

 private:
  struct Loaded {
    std::vector<uint8_t> bytes;
    std::unique_ptr<io::SafetensorsFile> safetensors;  // points into bytes
  };
  Loaded& open(const std::string& option, const std::string& path) {
    auto it = files_.find(path);
    if (it != files_.end()) return *it->second;
    auto f = std::make_unique<Loaded>();
    try {
      // Bounded by the memory available: a stream such as /dev/zero would otherwise fill it.
      f->bytes = io::read_file(path, available_memory());
      if (io::is_safetensors_path(path)) {
        f->safetensors = std::make_unique<io::SafetensorsFile>(f->bytes.data(), f->bytes.size());
      }
    } catch (const Error& e) {
      throw Error(option + ": " + e.what());
    }
    return *files_.emplace(path, std::move(f)).first->second;
  }
  std::map<std::string, std::unique_ptr<Loaded>> files_;
};

std::pair<int64_t, int64_t> parse_window(const std::string& text) {
  auto fail = [&]() -> Error {
    return Error("--window: expected L,R with integers >= -1 (-1 = unbounded), got '" + text + "'");
  };
  auto parse_int = [&](const std::string& s) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      throw fail();
    }
    if (used != s.size() || v < -1) throw fail();
    return static_cast<int64_t>(v);
  };
  const auto comma = text.find(',');
  if (comma == std::string::npos) throw fail();
  return {parse_int(text.substr(0, comma)), parse_int(text.substr(comma + 1))};
}

// One output tensor: its name, the option that sent it to `path` (--out for the outputs a
// .safetensors --out receives by default), and the path as given.
struct Target {
  std::string name, option, path;
};
// The targets written to one file (several only for .safetensors).
struct OutputFile {
  std::vector<Target> targets;
};

// True when two paths name the same file: equal once made absolute with symlinks, "." and ".."
// resolved (weakly_canonical: the file need not exist), or hard links to one existing file.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec_a, ec_b, ec;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec_a);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, ec), ec_b);
  if (!ec_a && !ec_b && ca == cb) return true;
  if (a == b) return true;
  return fs::equivalent(a, b, ec) && !ec;
}

// A float option given as a double: 0 stays 0 (the option's default meaning); anything else must
// be a finite, normal float32, or it would silently become 0 (1e-50) or inf (1e39).
float float32_option(const char* option, double value) {
  const float f = static_cast<float>(value);
  if (value != 0.0 && !(std::isfinite(value) && std::isnormal(f))) {
    char got[64];
    std::snprintf(got, sizeof got, "%g", value);
    throw Error(std::string(option) + ": expected 0 or a finite value of float32's normal range (" +
                "1.2e-38 to 3.4e38 in magnitude), got " + got);
  }
  return f;
}

int run(const RunArgs& a) {
  CallOptions o;
  o.causal = a.causal;
  // The alignment places the causal or window diagonal; alone it would change nothing.
  if (!a.causal_align.empty() && !a.causal && a.window.empty()) {
    throw Error("--causal-align: applies to --causal or --window, got neither");
  }
  o.causal_align =
      a.causal_align == "top-left" || a.causal_align == "top_left" ? CausalAlign::top_left : CausalAlign::bottom_right;
  if (!a.window.empty()) std::tie(o.window_size_left, o.window_size_right) = parse_window(a.window);
  o.softcap = float32_option("--softcap", a.softcap);
  o.softmax_scale = float32_option("--scale", a.scale);
  o.deterministic = a.deterministic;
  o.num_threads = a.threads;
  Device device = resolve_device(a.device);

  if (!a.inputs.empty() && !io::is_safetensors_path(a.inputs)) {
    throw Error("--inputs: expected a .safetensors file holding q, k, v (and optionally dout, alibi_slopes, "
                "cu_seqlens_q, cu_seqlens_k), got '" + a.inputs + "'");
  }
  InputFiles files;
  Tensors t;
  // Each input: its own option, else the tensor of that name in --inputs (required ones must exist).
  auto input = [&](HostTensor& dst, const std::string& option, const std::string& path, const std::string& name,
                   bool required) {
    std::string from = option;  // the option that named the file it came from
    if (!path.empty()) {
      dst = files.load(option, path, name);
    } else if (!a.inputs.empty() && (required || files.contains("--inputs", a.inputs, name))) {
      dst = files.load("--inputs", a.inputs, name);
      from = "--inputs";
    } else if (required) {
      throw Error(option + ": required (or give --inputs FILE.safetensors holding a tensor named '" + name + "')");
    }
    // An empty shape means "not given" to make_params: a 0-d file must not silently vanish.
    if (dst.numel() == 1 && dst.shape.empty() && !dst.data.empty()) {
      throw Error(from + ": expected a tensor '" + name + "' with at least one dimension, got a 0-d scalar");
    }
  };
  input(t.q, "--q", a.q, "q", true);
  input(t.k, "--k", a.k, "k", true);
  input(t.v, "--v", a.v, "v", true);
  input(t.dout, "--dout", a.dout, "dout", false);
  input(t.alibi_slopes, "--alibi", a.alibi, "alibi_slopes", false);
  input(t.cu_seqlens_q, "--cu-seqlens-q", a.cu_seqlens_q, "cu_seqlens_q", false);
  input(t.cu_seqlens_k, "--cu-seqlens-k", a.cu_seqlens_k, "cu_seqlens_k", false);
  const bool backward = !t.dout.shape.empty();

  // Where each output goes. A .safetensors --out also takes every output not given its own file.
  const bool out_st = io::is_safetensors_path(a.out);
  std::vector<Target> targets = {{"out", "--out", a.out}};
  if (!a.lse.empty()) {
    targets.push_back({"lse", "--lse", a.lse});
  } else if (out_st) {
    targets.push_back({"lse", "--out", a.out});
  }
  const std::pair<const char*, const std::string*> grads[] = {{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}};
  for (const auto& [name, path] : grads) {
    const std::string option = std::string("--") + name;
    if (!backward) {
      if (!path->empty()) throw Error(option + ": needs --dout (the backward pass)");
      continue;
    }
    if (path->empty() && !out_st) {
      throw Error(option + ": required with " + (a.dout.empty() ? "the dout that --inputs holds" : "--dout") +
                  " (or give a .safetensors --out to hold every output)");
    }
    targets.push_back(path->empty() ? Target{name, "--out", a.out} : Target{name, option, *path});
  }
  // The format follows the name: anything else would have been written as .npy under it.
  for (const Target& target : targets) {
    const std::string& path = target.path;
    const bool npy = path.size() > 4 && path.compare(path.size() - 4, 4, ".npy") == 0;
    if (!npy && !io::is_safetensors_path(path)) {
      throw Error(target.option + ": expected a file name ending in .npy or .safetensors, got '" + path + "'");
    }
  }
  // Outputs meet the inputs and each other by the file they name, however it is spelled.
  const std::pair<const char*, const std::string*> inputs[] = {
      {"--inputs", &a.inputs}, {"--q", &a.q}, {"--k", &a.k}, {"--v", &a.v}, {"--dout", &a.dout}, {"--alibi", &a.alibi},
      {"--cu-seqlens-q", &a.cu_seqlens_q}, {"--cu-seqlens-k", &a.cu_seqlens_k}};
  for (const Target& target : targets) {
    for (const auto& [option, path] : inputs) {
      if (!path->empty() && same_file(target.path, *path)) {
        throw Error(target.option + ": refusing to overwrite the input file given to " + option + " ('" + *path +
                    "')");
      }
    }
  }
  std::vector<OutputFile> files_out;  // in the order of first mention
  for (const Target& target : targets) {
    auto it = std::find_if(files_out.begin(), files_out.end(),
                           [&](const OutputFile& f) { return same_file(f.targets[0].path, target.path); });
    if (it == files_out.end()) {
      files_out.push_back({{target}});
      continue;
    }
    const Target& first = it->targets[0];
    if (!io::is_safetensors_path(first.path) || !io::is_safetensors_path(target.path)) {
      throw Error(target.option + ": '" + target.path + "' is the same file as " + first.option + " '" + first.path +
                  "'; a .npy file holds one tensor (use one .safetensors file for several)");
    }
    it->targets.push_back(target);  // several tensors of one .safetensors file
  }
  for (const OutputFile& f : files_out) {
    const Target& first = f.targets[0];
    if (!io::is_safetensors_path(first.path) && first.name != "lse" && t.q.dtype == DType::bf16) {
      throw Error(first.option + " '" + first.path + "': bf16 cannot be stored in .npy (numpy has no bfloat16); "
                  "use a .safetensors file");
    }
    try {
      io::check_writable(first.path);
    } catch (const Error& e) {
      throw Error(first.option + ": " + e.what());
    }
  }

  allocate_outputs(t, backward);  // checks first the shape rules that bound the outputs' size
  if (a.device == "auto" && device == Device::cuda) {
    // auto means "the GPU when it can run this call": ask the CUDA backend's plan() on the
    // uploaded tensors, and fall back to the CPU with the reason. (A probe of the host buffers
    // marked as device tensors was always refused: the backend checks what the pointers are.)
    std::string reason;
    try {
      const Runner probe(t, o, Device::cuda);
      Plan pl = probe.plan(Pass::forward);
      if (pl.ok && backward) pl = probe.plan(Pass::backward);
      if (!pl.ok) reason = pl.reason;
    } catch (const Error& e) {  // e.g. the upload ran out of device memory
      reason = e.what();
    }
    if (!reason.empty()) {
      std::fprintf(stderr, "flashattn: note: --device auto runs this call on the CPU: %s\n", reason.c_str());
      device = Device::cpu;
    }
  }
  const RunTimes times = run_attention(t, o, device);
  const AttentionParams host = make_params(t, o);
  const double fwd_flops = attention_flops(host, false);
  std::printf("forward   %-28s %10.3f ms %9.2f GFLOP/s\n", times.forward_kernel.c_str(), times.forward_s * 1e3,
              fwd_flops / times.forward_s * 1e-9);
  if (backward) {
    std::printf("backward  %-28s %10.3f ms %9.2f GFLOP/s\n", times.backward_kernel.c_str(), times.backward_s * 1e3,
                attention_flops(host, true) / times.backward_s * 1e-9);
  }

  // A result with NaN or inf where the inputs are finite usually means values beyond float32's range
  // (flashattn.hpp, "Range"), which no check can see before the scores exist: say so here, since
  // without --check nothing else would. (lse is −inf by design for rows that see no key.)
  for (const auto& [name, tensor] : {std::pair<const char*, const HostTensor*>{"out", &t.out},
                                     {"dq", &t.dq}, {"dk", &t.dk}, {"dv", &t.dv}}) {
    if (tensor->data.empty()) continue;
    const int64_t bad = io::count_non_finite(*tensor);
    if (bad > 0)
      std::fprintf(stderr,
                   "flashattn: warning: %s has %lld of %lld values NaN or inf (non-finite inputs, or scores "
                   "past float32's range: see flashattn.hpp, Range)\n",
                   name, static_cast<long long>(bad), static_cast<long long>(tensor->numel()));
  }

  bool pass = true;
  if (a.check) {
    std::printf("check against the float64 reference (bound = 2 x naive %s error + floor):\n",
                io::dtype_label(t.q.dtype));
    pass = print_error_table(compare_with_reference(host, backward));
    std::printf("%s\n", pass ? "PASS" : "FAIL");
  }

  // Serialize and write every file to a temporary next to it; rename them only once all are written.
  const std::map<std::string, const HostTensor*> outputs = {
      {"out", &t.out}, {"lse", &t.lse}, {"dq", &t.dq}, {"dk", &t.dk}, {"dv", &t.dv}};
  io::OutputFiles writer;
  for (const OutputFile& f : files_out) {
    const Target& first = f.targets[0];
    try {
      if (io::is_safetensors_path(first.path)) {
        std::vector<std::pair<std::string, const HostTensor*>> named;
        for (const Target& target : f.targets) named.emplace_back(target.name, outputs.at(target.name));
        writer.add(first.path, io::write_safetensors(named));
      } else {
        writer.add(first.path, io::write_npy(*outputs.at(first.name)));
      }
    } catch (const Error& e) {
      throw Error(first.option + ": " + e.what());
    }
  }
  writer.commit();
  return pass ? 0 : 1;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand(
      "run", "Compute attention on tensors from .npy / .safetensors files (layouts as in flashattn.hpp).");
  app->add_option("--inputs", args->inputs,
                  "A .safetensors file holding q, k, v and optionally dout, alibi_slopes, cu_seqlens_q, cu_seqlens_k");
  app->add_option("--q", args->q, "q [batch, seqlen_q, num_heads, head_dim] or [total_q, num_heads, head_dim] "
                                  "(.npy, or the tensor 'q' of a .safetensors file)");
  app->add_option("--k", args->k, "k [batch, seqlen_k, num_heads_k, head_dim] or [total_k, ...]");
  app->add_option("--v", args->v, "v [batch, seqlen_k, num_heads_k, head_dim_v] or [total_k, ...]");
  app->add_option("--out", args->out, "output file for out (.npy or .safetensors; a .safetensors file also "
                                      "receives lse, dq, dk, dv not given their own file)")->required();
  app->add_option("--lse", args->lse, "output file for lse (float32 [batch, num_heads, seqlen_q] or [num_heads, total_q])");
  app->add_flag("--causal", args->causal, "causal mask (window_size_right = 0)");
  // (The Python package's spellings, bottom_right and top_left, are accepted too.)
  app->add_option("--causal-align", args->causal_align, "diagonal alignment when seqlen_q != seqlen_k")
      ->check(CLI::IsMember({"bottom-right", "top-left", "bottom_right", "top_left"}));
  app->add_option("--window", args->window, "sliding window L,R (-1 = unbounded)")->check(non_empty());
  app->add_option("--softcap", args->softcap, "logit soft-capping softcap * tanh(S / softcap) (0 = off)")->check(non_empty());
  app->add_option("--scale", args->scale, "softmax_scale (0 = 1/sqrt(head_dim))")->check(non_empty());
  app->add_option("--alibi", args->alibi, "ALiBi slopes, float32 [num_heads] or [batch, num_heads]");
  app->add_option("--cu-seqlens-q", args->cu_seqlens_q, "int32 [batch + 1] prefix sums (varlen layout)");
  app->add_option("--cu-seqlens-k", args->cu_seqlens_k, "int32 [batch + 1] prefix sums (varlen layout)");
  app->add_option("--dout", args->dout, "gradient of out: also run the backward pass");
  app->add_option("--dq", args->dq, "output file for dq");
  app->add_option("--dk", args->dk, "output file for dk");
  app->add_option("--dv", args->dv, "output file for dv");
  app->add_option("--device", args->device, "auto (cuda when available), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app->add_option("--threads", args->threads, "CPU threads (0 = all)")->transform(thread_count());
  app->add_flag("--deterministic", args->deterministic, "bitwise-repeatable backward");
  app->add_flag("--check", args->check, "compare every output with the float64 reference; exit 1 on FAIL");
  return {app, [args] { return run(*args); }};
}

}  // namespace flashattn::cli

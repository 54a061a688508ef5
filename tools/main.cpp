// flashattn: the command-line program. `flashattn` alone runs one Llama-3-8B attention layer on
// the CPU and checks it; `run` computes attention on tensors from .npy/.safetensors files; `check`
// sweeps varied cases against the float64 reference; `bench` measures GFLOP/s and working memory.
// Every error is one line on stderr starting with "flashattn: error: ", with a non-zero exit.
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands/commands.hpp"
#include "flashattn/flashattn.hpp"

namespace {

// Messages can carry names and bytes read from untrusted files (a tensor name, a JSON parser's
// excerpt of a header): keep them on one line of printable ASCII, every other byte as \xNN.
void print_error(const std::string& message) {
  std::string line;
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      line += c;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", u);
      line += escaped;
    }
  }
  std::fprintf(stderr, "flashattn: error: %s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flashattn::cli;
  CLI::App app{"flashattn: exact attention computed the FlashAttention way (tiles, online softmax, LSE).\n"
               "Without a command: one Llama-3-8B attention layer (bf16, causal, GQA 32/8, head_dim 128,\n"
               "seqlen 2048) forward and backward on the CPU, checked against the float64 reference."};
  app.set_version_flag("--version", flashattn::version());
  app.require_subcommand(0, 1);
  const Command commands[] = {add_run_command(app), add_check_command(app), add_bench_command(app)};
  const Command default_command = add_default_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return 2;
  }
  try {
    for (const Command& c : commands) {
      if (c.app->parsed()) return c.action();
    }
    return default_command.action();
  } catch (const flashattn::Error& e) {
    print_error(e.what());
  } catch (const std::bad_alloc&) {
    print_error("out of memory");
  } catch (const std::exception& e) {
    print_error(std::string("internal: ") + e.what());
  }
  return 1;
}

// The CLI's commands. Each add_*_command registers a CLI11 subcommand and returns the action to
// run once the command line has been parsed; actions return the process exit code and report
// problems by throwing flashattn::Error (main prints it as one line).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace flashattn::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> action;
};

Command add_run_command(CLI::App& parent);
Command add_check_command(CLI::App& parent);
Command add_bench_command(CLI::App& parent);
// The default job (no subcommand): its options are registered on the top-level app.
Command add_default_command(CLI::App& app);

}  // namespace flashattn::cli

// The CLI's commands. Each add_*_command registers a CLI11 subcommand and returns the action to
// run once the command line has been parsed; actions return the process exit code and report
// problems by throwing flashattn::Error (main prints it as one line).
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

namespace flashattn::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> action;
};

// Validators for numeric options. CLI11 2.1's PositiveNumber and NonNegativeNumber are ranges of
// doubles whose message prints DBL_MAX in full ("Value 0 not in range 0.000000 to 1797...", 300
// digits); these say "expected a number > 0, got 0".
inline CLI::Validator number_above(double lowest, bool inclusive, const char* name) {
  const std::string expected = std::string(inclusive ? ">= " : "> ") + (lowest == 0 ? "0" : std::to_string(lowest));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        const bool ok = inclusive ? value >= lowest : value > lowest;
        return ok ? std::string() : "expected a number " + expected + ", got " + text;
      },
      name);
}
// Decimal digits without their leading zeros ("0" for all zeros; digits not empty).
inline std::string without_leading_zeros(const std::string& digits) {
  return digits.substr(std::min(digits.find_first_not_of('0'), digits.size() - 1));
}
// Whether a decimal number (no leading zeros) is above another, compared as digits: past any
// integer type's range too.
inline bool decimal_above(const std::string& value, const std::string& max) {
  return value.size() > max.size() || (value.size() == max.size() && value > max);
}
// Integer options (attach with ->transform(), which may rewrite the text, unlike ->check()):
// decimal digits with an optional sign, leading zeros dropped before CLI11's conversion (which
// reads 010 as octal 8, 0x10 as 16 and refuses 08), and at most `highest`, compared as digits so
// that nothing past the type's range is silently clamped ("99999999999999999999999" used to come
// out as INT64_MAX). Range checks below it keep their own messages.
inline CLI::Validator decimal_integer(int64_t highest = 2147483647) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const bool negative = !text.empty() && text[0] == '-';
        const std::string digits = text.substr(negative ? 1 : 0);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
          return "expected a decimal integer, got '" + text + "'";
        const std::string value = without_leading_zeros(digits);
        const std::string max = std::to_string(highest);
        if (!negative && decimal_above(value, max)) return "expected a number <= " + max + ", got " + text;
        if (negative && value.size() > 18) return "expected a number >= 0, got " + text;
        text = (negative && value != "0" ? "-" : "") + value;
        return std::string();
      },
      "INT");
}
// A uint64 seed: decimal, at most 2^64 - 1 (CLI11 clamps larger values to it).
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::string kMax = "18446744073709551615";
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
          return "expected a decimal integer from 0 to " + kMax + ", got '" + text + "'";
        const std::string value = without_leading_zeros(text);
        if (decimal_above(value, kMax)) return "expected a decimal integer from 0 to " + kMax + ", got " + text;
        text = value;
        return std::string();
      },
      "SEED");
}
inline CLI::Validator positive_number() { return number_above(0, false, "POSITIVE"); }
inline CLI::Validator non_negative_number() { return number_above(0, true, "NONNEGATIVE"); }
// Sizes past int's range would saturate in the conversion and surface as a shape error elsewhere.
inline CLI::Validator number_at_most(double highest, const char* name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        return value <= highest ? std::string() : "expected a number <= " + std::to_string(int64_t(highest)) + ", got " + text;
      },
      name);
}
inline CLI::Validator int_sized() { return number_at_most(2147483647.0, "INT"); }
// --threads: a decimal integer in [0, 4096] (CLI::Range alone called "abc" out of range).
inline CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // Decimal digits only: CLI11 would read 0x10 as 16 and 010 as 8 (so leading zeros are
        // dropped here, before its conversion).
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || decimal_above(without_leading_zeros(text), "4096"))
          return "expected an integer from 0 to 4096 (0 = all cores), got '" + text + "'";
        text = without_leading_zeros(text);
        return std::string();
      },
      "THREADS");
}
// CLI11 converts an empty string to a numeric option's default; an empty value is a mistake.
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("expected a value, got ''") : std::string(); },
                        "NONEMPTY");
}

Command add_run_command(CLI::App& parent);
Command add_check_command(CLI::App& parent);
Command add_bench_command(CLI::App& parent);
// The default job (no subcommand): its options are registered on the top-level app.
Command add_default_command(CLI::App& app);

}  // namespace flashattn::cli

// The command-line conventions of `tern` and its drivers (docs/cli.md), on
// top of CLI11: exact integer flags, exit statuses, one-line errors, and the
// dispatch from a parsed command line to the chosen command's steps.
//
// Integers are not left to CLI11 2.1.2, which converts with strtoull(base 0):
// it takes "0x10", reads "010" as 8, wraps "-1" to 2^64-1 and saturates an
// overflow. The validators below accept plain decimal only, exactly, and
// hand CLI11 a canonical decimal string it converts without loss.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tern/status.h"

namespace tern::cli {

// Exit statuses (docs/cli.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the command ran and failed
inline constexpr int kExitUsage = 2;   // the command line was refused before any work

// "18446744073709551615": decimal digits only (no sign, space, hex, exponent
// or fraction), at most `max`.
Result<uint64_t> ParseUnsigned(std::string_view text,
                               uint64_t max = std::numeric_limits<uint64_t>::max());

// A count or size: an unsigned decimal with an optional decimal suffix
// K (or k) M G T (x1000^n) and, with a suffix, a fraction that leaves a
// whole number ("1.5G", "300K"); exact and at most `max`.
Result<uint64_t> ParseCount(std::string_view text,
                            uint64_t max = std::numeric_limits<uint64_t>::max());

// "a,b,,c" -> {"a", "b", "c"}: the items of a comma-separated flag value,
// empty items dropped (so "" and "," give none), no trimming.
std::vector<std::string> SplitCommas(std::string_view text);

// CLI11 transformers: the value must parse as above; it is replaced by its
// canonical decimal form.
CLI::Validator UnsignedArg(uint64_t max = std::numeric_limits<uint64_t>::max());
CLI::Validator CountArg(uint64_t max = std::numeric_limits<uint64_t>::max());
// A finite decimal floating-point number ("1e-6", "0.9"; not nan or inf).
CLI::Validator FiniteArg();

// Integer options bound to `value`, with a default given as text (shown by
// --help, parsed like a command-line value; empty: none, `value` keeps what
// it holds). T is an unsigned integer type; values above its maximum are
// refused.
template <typename T>
CLI::Option* AddUnsigned(CLI::App& app, const std::string& name, T& value, const std::string& help,
                         const std::string& default_text,
                         uint64_t max = std::numeric_limits<T>::max()) {
  static_assert(std::is_unsigned_v<T>);
  CLI::Option* option =
      app.add_option(name, value, help)
          ->transform(UnsignedArg(std::min<uint64_t>(max, std::numeric_limits<T>::max())))
          ->type_name("N");
  if (default_text.empty()) return option;
  return option->run_callback_for_default()->default_val(default_text);
}
template <typename T>
CLI::Option* AddCount(CLI::App& app, const std::string& name, T& value, const std::string& help,
                      const std::string& default_text,
                      uint64_t max = std::numeric_limits<T>::max()) {
  static_assert(std::is_unsigned_v<T>);
  CLI::Option* option =
      app.add_option(name, value, help)
          ->transform(CountArg(std::min<uint64_t>(max, std::numeric_limits<T>::max())))
          ->type_name("N[K|M|G|T]");
  if (default_text.empty()) return option;
  return option->run_callback_for_default()->default_val(default_text);
}
CLI::Option* AddDouble(CLI::App& app, const std::string& name, double& value, const std::string& help,
                       const std::string& default_text);

// tern's help conventions on an app and the subcommands added after:
// "usage: tern diff [flags] OLD NEW", flags listed with their defaults.
void Configure(CLI::App& app);

// A command's two steps, run after CLI11 has parsed its command line.
// `check` turns flag values into options: an error there is a usage error
// (exit 2). `work` does the job: an error is a failure (exit 1).
struct Steps {
  std::function<Status()> check;
  std::function<Status()> work;
};

// Which steps run for which (sub)command. Errors print one line on stderr,
// "tern diff: <message>", named after the command chain.
class Dispatch {
 public:
  void On(CLI::App* command, Steps steps);
  // Parses argv with `root` and runs the steps of the innermost command
  // chosen; returns the exit status. --help prints help and returns 0.
  int Run(CLI::App& root, int argc, char** argv) const;

 private:
  std::vector<std::pair<CLI::App*, Steps>> commands_;
};

// Prints "<prefix>: <status>" on stderr unless OK; returns 0, or `failure`.
int Report(const std::string& prefix, const Status& status, int failure);

}  // namespace tern::cli

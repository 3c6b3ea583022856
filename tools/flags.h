// A small command-line parser shared by the `tern` subcommands: --name VALUE,
// --name=VALUE, boolean --switch, positional arguments, and generated --help.
// Errors are one line and make the command exit with status 2.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tern/status.h"

namespace tern::cli {

class Flags {
 public:
  Flags(std::string command, std::string summary);

  // Declarations; `help` is shown by --help. A flag without a default is
  // optional unless marked required.
  void Add(const std::string& name, const std::string& help, const std::string& default_value = "",
           bool required = false);
  void AddSwitch(const std::string& name, const std::string& help);
  // Positional arguments, in order; the last may be variadic ("P1 P2 ...").
  void AddPositional(const std::string& name, const std::string& help, bool variadic = false);
  // Appended after the flag list in --help.
  void SetEpilog(const std::string& text) { epilog_ = text; }

  // Parses argv (argv[0] is the subcommand name). Returns kCancelled after
  // printing help for --help/-h.
  Status Parse(int argc, char** argv);

  std::string Get(const std::string& name) const;
  bool Has(const std::string& name) const;  // given on the command line
  bool Switch(const std::string& name) const;
  Result<uint64_t> GetU64(const std::string& name) const;
  Result<double> GetDouble(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  std::string Help() const;

 private:
  struct Def {
    std::string help;
    std::string default_value;
    bool required = false;
    bool is_switch = false;
  };
  struct Pos {
    std::string name;
    std::string help;
    bool variadic = false;
  };
  std::string command_;
  std::string summary_;
  std::string epilog_;
  std::map<std::string, Def> defs_;
  std::vector<std::string> order_;
  std::vector<Pos> pos_defs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Parses sizes such as "10M", "1.5G", "1000000" (decimal suffixes K M G T).
Result<uint64_t> ParseCount(const std::string& text);

// Prints "tern CMD: <message>" to stderr and returns the exit status for it
// (0 for OK, 2 for bad usage, 1 otherwise).
int Report(const std::string& command, const Status& status);

}  // namespace tern::cli

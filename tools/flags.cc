#include "tools/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tern::cli {

Flags::Flags(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void Flags::Add(const std::string& name, const std::string& help, const std::string& default_value,
                bool required) {
  defs_[name] = Def{help, default_value, required, false};
  order_.push_back(name);
}

void Flags::AddSwitch(const std::string& name, const std::string& help) {
  defs_[name] = Def{help, "", false, true};
  order_.push_back(name);
}

void Flags::AddPositional(const std::string& name, const std::string& help, bool variadic) {
  pos_defs_.push_back(Pos{name, help, variadic});
}

std::string Flags::Help() const {
  std::string out = "usage: tern " + command_;
  if (!order_.empty()) out += " [flags]";
  for (const Pos& p : pos_defs_) out += " " + p.name + (p.variadic ? " ..." : "");
  out += "\n\n" + summary_ + "\n";
  if (!pos_defs_.empty()) {
    out += "\narguments:\n";
    for (const Pos& p : pos_defs_) out += "  " + p.name + "\n      " + p.help + "\n";
  }
  out += "\nflags:\n";
  for (const std::string& name : order_) {
    const Def& d = defs_.at(name);
    out += "  --" + name + (d.is_switch ? "" : " VALUE");
    if (d.required) out += "  (required)";
    if (!d.default_value.empty()) out += "  (default " + d.default_value + ")";
    out += "\n      " + d.help + "\n";
  }
  out += "  --help\n      show this help\n";
  if (!epilog_.empty()) out += "\n" + epilog_ + "\n";
  return out;
}

Status Flags::Parse(int argc, char** argv) {
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!only_positional && (arg == "--help" || arg == "-h")) {
      std::fputs(Help().c_str(), stdout);
      return Status(Code::kCancelled, "help shown");
    }
    if (!only_positional && arg == "--") {
      only_positional = true;
      continue;
    }
    if (!only_positional && arg.size() > 2 && arg.rfind("--", 0) == 0) {
      std::string name = arg.substr(2);
      std::string value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      auto it = defs_.find(name);
      if (it == defs_.end())
        return Status(Code::kInvalidArgument, "unknown flag --" + name + " (see --help)");
      if (it->second.is_switch) {
        if (has_value) return Status(Code::kInvalidArgument, "--" + name + " takes no value");
        values_[name] = "1";
        continue;
      }
      if (!has_value) {
        if (i + 1 >= argc) return Status(Code::kInvalidArgument, "--" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
      continue;
    }
    if (!only_positional && arg == "-o") {  // common short form of --out / -o
      if (i + 1 >= argc) return Status(Code::kInvalidArgument, "-o needs a value");
      auto it = defs_.find("o");
      if (it == defs_.end()) it = defs_.find("out");
      if (it == defs_.end()) return Status(Code::kInvalidArgument, "unknown flag -o");
      values_[it->first] = argv[++i];
      continue;
    }
    positional_.push_back(arg);
  }
  for (const auto& [name, def] : defs_)
    if (def.required && !values_.count(name))
      return Status(Code::kInvalidArgument, "missing --" + name + " (see --help)");
  size_t min_pos = 0;
  bool variadic = false;
  for (const Pos& p : pos_defs_) {
    if (p.variadic) variadic = true;
    ++min_pos;
  }
  if (positional_.size() < min_pos)
    return Status(Code::kInvalidArgument,
                  "expected " + std::to_string(min_pos) + " argument(s), got " +
                      std::to_string(positional_.size()) + " (see --help)");
  if (!variadic && positional_.size() > min_pos)
    return Status(Code::kInvalidArgument, "unexpected argument '" + positional_[min_pos] + "'");
  return Status::Ok();
}

std::string Flags::Get(const std::string& name) const {
  auto v = values_.find(name);
  if (v != values_.end()) return v->second;
  auto d = defs_.find(name);
  TERN_ASSERT(d != defs_.end(), "undeclared flag ", name);
  return d->second.default_value;
}

bool Flags::Has(const std::string& name) const { return values_.count(name) > 0; }
bool Flags::Switch(const std::string& name) const { return values_.count(name) > 0; }

Result<uint64_t> Flags::GetU64(const std::string& name) const {
  auto r = ParseCount(Get(name));
  if (!r.ok()) return Status(Code::kInvalidArgument, "--" + name + ": " + r.status().message());
  return r;
}

Result<double> Flags::GetDouble(const std::string& name) const {
  const std::string text = Get(name);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v))
    return Status(Code::kInvalidArgument, "--" + name + ": not a number: '" + text + "'");
  return v;
}

Result<uint64_t> ParseCount(const std::string& text) {
  if (text.empty()) return Status(Code::kInvalidArgument, "empty number");
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  double mult = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") mult = 1e3;
  else if (suffix == "M") mult = 1e6;
  else if (suffix == "G") mult = 1e9;
  else if (suffix == "T") mult = 1e12;
  else if (!suffix.empty()) return Status(Code::kInvalidArgument, "not a count: '" + text + "'");
  v *= mult;
  if (errno != 0 || !std::isfinite(v) || v < 0 || v > 1.8e19 || end == text.c_str())
    return Status(Code::kInvalidArgument, "not a count: '" + text + "'");
  if (v != std::floor(v)) return Status(Code::kInvalidArgument, "not a whole number: '" + text + "'");
  return static_cast<uint64_t>(v);
}

int Report(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  if (status.code() == Code::kCancelled && status.message() == "help shown") return 0;
  std::fprintf(stderr, "tern %s: %s\n", command.c_str(), status.ToString().c_str());
  return status.code() == Code::kInvalidArgument ? 2 : 1;
}

}  // namespace tern::cli

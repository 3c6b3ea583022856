#include "tools/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "base/text.h"

namespace tern::cli {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Quoted for an error message, cut so one bad argument keeps it one line.
std::string Quote(std::string_view text) {
  std::string out = "'";
  for (char c : text.substr(0, 64)) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out + (text.size() > 64 ? "...'" : "'");
}

Status TooLarge(std::string_view text, uint64_t max) {
  return Status(Code::kOutOfRange, Quote(text) + " is larger than " + std::to_string(max));
}

CLI::Validator Canonical(std::function<Result<uint64_t>(std::string_view)> parse) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& text) -> std::string {
        Result<uint64_t> v = parse(text);
        if (!v.ok()) return v.status().message();
        text = std::to_string(*v);
        return "";
      },
      /*validator_desc=*/"");
}

}  // namespace

Result<uint64_t> ParseUnsigned(std::string_view text, uint64_t max) {
  // The parse is base's; the messages quote the user's own text unescaped.
  Result<uint64_t> v = ParseDecimal(text, max);
  if (v.ok()) return v;
  if (v.status().code() == Code::kOutOfRange) return TooLarge(text, max);
  return Status(Code::kInvalidArgument, Quote(text) + " is not an unsigned decimal integer");
}

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

Result<uint64_t> ParseCount(std::string_view text, uint64_t max) {
  const Status bad(Code::kInvalidArgument,
                   Quote(text) + " is not a count (digits with an optional K, M, G or T)");
  std::string_view number = text;
  int thousands = 0;  // the suffix's power of 1000
  if (!number.empty()) {
    switch (number.back()) {
      case 'K': case 'k': thousands = 1; break;
      case 'M': thousands = 2; break;
      case 'G': thousands = 3; break;
      case 'T': thousands = 4; break;
      default: break;
    }
  }
  if (thousands > 0) number.remove_suffix(1);
  std::string_view whole = number, fraction;
  if (const size_t dot = number.find('.'); dot != std::string_view::npos) {
    whole = number.substr(0, dot);
    fraction = number.substr(dot + 1);
    if (!AllDigits(fraction)) return bad;
  }
  if (!AllDigits(whole)) return bad;
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  const size_t scale_digits = 3 * static_cast<size_t>(thousands);
  if (fraction.size() > scale_digits)
    return Status(Code::kInvalidArgument, Quote(text) + " is not a whole number");

  uint64_t scale = 1;
  for (size_t i = 0; i < scale_digits; ++i) scale *= 10;
  auto w = ParseUnsigned(whole);
  if (!w.ok()) return TooLarge(text, max);  // digits only, so it overflowed
  uint64_t v = 0, part = 0;
  if (!fraction.empty()) {  // fraction.size() <= 12: fits, and part < scale
    part = ParseUnsigned(fraction).value();
    for (size_t i = fraction.size(); i < scale_digits; ++i) part *= 10;
  }
  if (__builtin_mul_overflow(*w, scale, &v) || __builtin_add_overflow(v, part, &v) || v > max)
    return TooLarge(text, max);
  return v;
}

CLI::Validator UnsignedArg(uint64_t max) {
  return Canonical([max](std::string_view t) { return ParseUnsigned(t, max); });
}

CLI::Validator CountArg(uint64_t max) {
  return Canonical([max](std::string_view t) { return ParseCount(t, max); });
}

CLI::Validator FiniteArg() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        // Decimal only: strtod would also take hex floats, "nan" and "inf".
        const bool decimal = !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
        char* end = nullptr;
        errno = 0;
        const double v = decimal ? std::strtod(text.c_str(), &end) : 0;
        if (!decimal || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v))
          return Quote(text) + " is not a finite decimal number";
        return "";
      },
      /*validator_desc=*/"");
}

CLI::Option* AddDouble(CLI::App& app, const std::string& name, double& value, const std::string& help,
                       const std::string& default_text) {
  return app.add_option(name, value, help)
      ->check(FiniteArg())
      ->type_name("X")
      ->run_callback_for_default()
      ->default_val(default_text);
}

void Configure(CLI::App& app) {
  auto format = std::make_shared<CLI::Formatter>();
  format->label("Usage", "usage");
  format->label("OPTIONS", "flags");
  format->label("Positionals", "arguments");
  format->label("SUBCOMMAND", "COMMAND");
  format->label("Subcommands", "commands");
  format->label("REQUIRED", "(required)");
  format->column_width(34);
  app.formatter(format);
  app.option_defaults()->group("flags");
  app.set_help_flag("-h,--help", "show this help")->group("flags");
}

namespace {

// CLI11 gives a subcommand its help flag before it inherits the option
// defaults, and lists subcommands under "Subcommands": one "flags" and one
// "commands" group everywhere, hidden commands (group "") left hidden.
void TidyHelp(CLI::App& app) {
  if (CLI::Option* help = app.get_help_ptr()) help->group("flags");
  for (CLI::App* sub : app.get_subcommands({})) {
    if (!sub->get_group().empty()) sub->group("commands");
    TidyHelp(*sub);
  }
}

}  // namespace

void Dispatch::On(CLI::App* command, Steps steps) {
  commands_.emplace_back(command, std::move(steps));
}

int Report(const std::string& prefix, const Status& status, int failure) {
  if (status.ok()) return kExitOk;
  std::fprintf(stderr, "%s: %s\n", prefix.c_str(), status.ToString().c_str());
  return failure;
}

int Dispatch::Run(CLI::App& root, int argc, char** argv) const {
  // The innermost command chosen so far (also after a parse error) and the
  // name errors are reported under: "tern xfer get".
  auto innermost = [&root](std::string* prefix) {
    CLI::App* at = &root;
    *prefix = root.get_name();
    for (std::vector<CLI::App*> subs = at->get_subcommands(); !subs.empty();
         subs = at->get_subcommands()) {
      at = subs.front();
      *prefix += " " + at->get_name();
    }
    return at;
  };
  TidyHelp(root);
  std::string prefix;
  try {
    root.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << root.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << root.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    CLI::App* at = innermost(&prefix);
    std::string message = e.what();
    const std::vector<std::string> rest = at->remaining();
    if (!at->get_subcommands({}).empty() && (rest.empty() || rest.front().rfind("-", 0) != 0)) {
      // No command was recognized: "tern", "tern nonsense", "tern xfer".
      message = rest.empty() ? "a command is required" : "unknown command " + Quote(rest.front());
    }
    for (char& c : message)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "%s: %s (see %s --help)\n", prefix.c_str(), message.c_str(), prefix.c_str());
    return kExitUsage;
  }
  CLI::App* chosen = innermost(&prefix);
  for (const auto& [command, steps] : commands_) {
    if (command != chosen) continue;
    if (steps.check) {
      const int code = Report(prefix, steps.check(), kExitUsage);
      if (code != kExitOk) return code;
    }
    return Report(prefix, steps.work(), kExitFailed);
  }
  // Only a command registered without steps gets here (commands with
  // subcommands require one, as `tern` and `tern xfer` do): show its help.
  std::fprintf(stderr, "%s", chosen->help().c_str());
  return kExitUsage;
}

}  // namespace tern::cli

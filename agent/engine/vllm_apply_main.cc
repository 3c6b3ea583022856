// engine_vllm_apply: one VllmAdapter::Apply against a real engine, for the
// engine tests (tests/engine/test_tern_vllm.py drives the adapter through
// it until tern-agent does, with --engine vllm). Not installed.
//
//   engine_vllm_apply --url URL --root DIR --slot SLOT --version N
//                     [--base B --changed NAME,NAME,... | --full]
//                     [--pause keep|wait|abort] [--no-cache-reset]
//                     [--attempts N] [--update-timeout-ms MS]
//   engine_vllm_apply --url URL --root DIR --served
//
// Prints one JSON line: the report ({"ok": true, "version", "attempts",
// "pause_ms", "update_ms", "full", "prefix_cache_reset"}) or {"ok": false,
// "code", "error"}; exits 0 only when the update was applied.
#include <charconv>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "agent/engine/engine_adapter.h"

namespace {

bool ParseU64(std::string_view s, uint64_t* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

int Fail(const std::string& message) {
  std::printf("%s\n", nlohmann::json{{"ok", false}, {"code", "usage"}, {"error", message}}
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                          .c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tern;
  using namespace tern::agent;
  VllmAdapterOptions options;
  EngineUpdate update;
  bool served = false;
  bool full = false;
  std::string changed;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    uint64_t n = 0;
    const char* v = nullptr;
    if (flag == "--served") {
      served = true;
    } else if (flag == "--full") {
      full = true;
    } else if (flag == "--no-cache-reset") {
      options.reset_prefix_cache = false;
    } else if ((v = value()) == nullptr) {
      return Fail(std::string("missing value for ") + argv[i]);
    } else if (flag == "--url") {
      options.url = v;
    } else if (flag == "--root") {
      options.root = v;
    } else if (flag == "--slot") {
      update.slot_dir = v;
    } else if (flag == "--changed") {
      changed = v;
    } else if (flag == "--pause") {
      auto mode = ParsePauseMode(v);
      if (!mode.ok()) return Fail(mode.status().message());
      options.pause = *mode;
    } else if (flag == "--version" && ParseU64(v, &n)) {
      update.version = n;
    } else if (flag == "--base" && ParseU64(v, &n)) {
      update.base_version = n;
    } else if (flag == "--attempts" && ParseU64(v, &n) && n <= 16) {
      options.attempts = static_cast<uint32_t>(n);
    } else if (flag == "--update-timeout-ms" && ParseU64(v, &n) && n <= UINT32_MAX) {
      options.update_timeout_ms = static_cast<uint32_t>(n);
    } else {
      return Fail(std::string("bad flag or value: ") + std::string(flag));
    }
  }
  if (!full) {
    update.changed.emplace();
    for (size_t pos = 0; pos < changed.size();) {
      size_t comma = changed.find(',', pos);
      if (comma == std::string::npos) comma = changed.size();
      update.changed->push_back(changed.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  auto adapter = VllmAdapter::Create(options, SteadyClock());
  if (!adapter.ok()) return Fail(adapter.status().ToString());
  nlohmann::json out;
  int rc = 0;
  if (served) {
    auto v = (*adapter)->ServedVersion();
    if (v.ok())
      out = {{"ok", true}, {"version", v->has_value() ? nlohmann::json(**v) : nullptr}};
    else
      out = {{"ok", false},
             {"code", static_cast<int>(v.status().code())},
             {"error", v.status().ToString()}};
    rc = v.ok() ? 0 : 1;
  } else {
    auto r = (*adapter)->Apply(update);
    if (r.ok())
      out = {{"ok", true},
             {"version", r->version},
             {"attempts", r->attempts},
             {"pause_ms", r->pause_ms},
             {"update_ms", r->update_ms},
             {"full", r->full},
             {"prefix_cache_reset", r->prefix_cache_reset}};
    else
      out = {{"ok", false},
             {"code", static_cast<int>(r.status().code())},
             {"error", r.status().ToString()}};
    rc = r.ok() ? 0 : 1;
  }
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return rc;
}

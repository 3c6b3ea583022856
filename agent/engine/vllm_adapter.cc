#include <nlohmann/json.hpp>

#include "agent/engine/engine_adapter.h"
#include "agent/engine/engine_http.h"

namespace tern::agent {
namespace {

// The `tern` backend starts the message of every update it refuses as bad
// input with this (engines/vllm/tern_vllm/backend.py, BAD_UPDATE); vLLM
// answers it with HTTP 500 like any worker failure.
constexpr std::string_view kBadUpdate = "tern: bad update: ";
constexpr size_t kNameBytesMax = 1024;

bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > kNameBytesMax) return false;
  for (unsigned char c : name)
    if (c < 0x21 || c > 0x7e || c == '"' || c == '\\') return false;
  return true;
}

std::string Clip(std::string_view s) { return ClipEngineText(s); }

}  // namespace

Result<PauseMode> ParsePauseMode(std::string_view text) {
  if (text == "keep") return PauseMode::kKeep;
  if (text == "wait") return PauseMode::kWait;
  if (text == "abort") return PauseMode::kAbort;
  return TERN_ERROR(kInvalidArgument, "engine: pause mode must be keep, wait or abort, not ", text);
}

const char* PauseModeName(PauseMode mode) {
  switch (mode) {
    case PauseMode::kKeep:
      return "keep";
    case PauseMode::kWait:
      return "wait";
    case PauseMode::kAbort:
      return "abort";
  }
  return "keep";
}

struct VllmAdapter::Reply {
  int status = 0;
  std::string body;
};

Result<std::unique_ptr<VllmAdapter>> VllmAdapter::Create(VllmAdapterOptions options, Clock& clock) {
  TERN_ASSIGN_OR_RETURN(EngineEndpoint engine, ParseEngineUrl(options.url));
  TERN_REQUIRE(options.root.starts_with('/') && options.root.size() < 4096, kInvalidArgument,
               "engine: the member directory must be an absolute path, not '", options.root, "'");
  TERN_REQUIRE(options.attempts >= 1 && options.attempts <= 16, kInvalidArgument,
               "engine: attempts must be 1..16, not ", options.attempts);
  TERN_REQUIRE(options.connect_timeout_ms > 0 && options.step_timeout_ms > 0 &&
                   options.pause_timeout_ms > 0 && options.update_timeout_ms > 0,
               kInvalidArgument, "engine: every timeout must be > 0 ms");
  TERN_REQUIRE(options.changed_max > 0 && options.changed_max <= (size_t{1} << 20),
               kInvalidArgument, "engine: changed_max must be 1..2^20");
  return std::unique_ptr<VllmAdapter>(
      new VllmAdapter(std::move(options), std::move(engine.host), engine.port, clock));
}

VllmAdapter::VllmAdapter(VllmAdapterOptions options, std::string host, int port, Clock& clock)
    : options_(std::move(options)), host_(std::move(host)), port_(port), clock_(clock) {}

VllmAdapter::~VllmAdapter() = default;

Result<VllmAdapter::Reply> VllmAdapter::Call(const char* method, const std::string& path,
                                             const std::string& body, uint32_t timeout_ms) {
  TERN_ASSIGN_OR_RETURN(EngineReply r,
                        EngineHttpCall(EngineEndpoint{host_, port_}, options_.connect_timeout_ms,
                                       method, path, body, timeout_ms, clock_));
  return Reply{r.status, std::move(r.body)};
}

Status VllmAdapter::Step(const char* method, const std::string& path, const std::string& body,
                         uint32_t timeout_ms, Reply* out) {
  TERN_ASSIGN_OR_RETURN(Reply reply, Call(method, path, body, timeout_ms));
  if (reply.status != 200) {
    const std::string text = EngineErrorText(reply.body);
    // Bad input is the caller's to fix; a retry would meet the same refusal.
    const Code code = text.find(kBadUpdate) != std::string::npos ? Code::kInvalidArgument
                      : reply.status >= 500                      ? Code::kUnavailable
                                                                 : Code::kProtocol;
    // vLLM 0.32 serves its update routes only with VLLM_SERVER_DEV_MODE=1.
    const char* hint =
        reply.status == 404 ? " (is the engine vLLM with VLLM_SERVER_DEV_MODE=1?)" : "";
    return Status(code, internal::StrCat("engine: ", method, " ", path, ": HTTP ", reply.status,
                                         hint, ": ", text));
  }
  if (out != nullptr) *out = std::move(reply);
  return Status::Ok();
}

Result<std::optional<uint64_t>> VllmAdapter::ServedVersion() {
  MutexLock lock(mu_);
  return ServedVersionLocked();
}

Result<std::optional<uint64_t>> VllmAdapter::ServedVersionLocked() {
  Reply reply;
  TERN_RETURN_IF_ERROR(Step("GET", "/weight_info", "", options_.step_timeout_ms, &reply));
  return ServedWeightVersion(reply.body, "/weight_info");
}

Status VllmAdapter::Attempt(const EngineUpdate& update, bool full, EngineUpdateReport* report,
                            bool* uncertain) {
  // Before the pause: the backend reads the schema of the checkpoint the
  // engine loaded; init again each time, so that a restarted engine is
  // initialized before its first update. It is told the version it serves
  // (when that is one of ours), against which it checks `base_version`.
  TERN_ASSIGN_OR_RETURN(std::optional<uint64_t> served, ServedVersionLocked());
  nlohmann::json init = {{"root", options_.root}};
  if (served.has_value()) init["version"] = *served;
  TERN_RETURN_IF_ERROR(Step("POST", "/init_weight_transfer_engine",
                            DumpEngineJson(nlohmann::json{{"init_info", init}}), options_.step_timeout_ms));

  nlohmann::json info = {{"slot", update.slot_dir}, {"version", update.version}};
  if (update.changed.has_value() && !full) {
    info["changed"] = *update.changed;
    if (update.base_version != 0) info["base"] = update.base_version;
  } else {
    info["changed"] = nullptr;
  }
  const std::string update_body = DumpEngineJson(nlohmann::json{{"update_info", info}});

  const uint64_t paused_us = clock_.NowUs();
  Status s = Step("POST", std::string("/pause?mode=") + PauseModeName(options_.pause), "",
                  options_.pause_timeout_ms);
  if (s.ok()) {
    s = Step("POST", "/start_weight_update", "", options_.step_timeout_ms);
    // A session left open by an update that outlived its deadline (vLLM
    // runs it to the end): close it without naming a version, then start.
    if (!s.ok() && s.message().find("already active") != std::string::npos) {
      s = Step("POST", "/finish_weight_update", "{}", options_.step_timeout_ms);
      if (s.ok()) s = Step("POST", "/start_weight_update", "", options_.step_timeout_ms);
    }
  }
  if (s.ok()) {
    const uint64_t t = clock_.NowUs();
    s = Step("POST", "/update_weights", update_body, options_.update_timeout_ms);
    report->update_ms = static_cast<int64_t>((clock_.NowUs() - t) / 1000);
    // A refusal loads nothing. Any other failure from here on (a timeout:
    // vLLM runs the update to its end anyway) may leave the new weights
    // loaded under the old version's name.
    *uncertain = !s.ok() ? s.code() != Code::kInvalidArgument : false;
  }
  if (s.ok()) {
    *uncertain = true;
    s = Step("POST", "/finish_weight_update",
             DumpEngineJson(nlohmann::json{{"weight_version", std::to_string(update.version)}}),
             options_.step_timeout_ms);
    if (s.ok()) *uncertain = false;
  }
  report->prefix_cache_reset = false;
  if (s.ok() && options_.reset_prefix_cache) {
    // {"success": false} while requests hold blocks (pause mode keep):
    // reported, not an error; the sidecar's per-version cache salt keeps
    // one version's prefixes from serving another's requests.
    Reply reply;
    s = Step("POST", "/reset_prefix_cache", "", options_.step_timeout_ms, &reply);
    auto j = nlohmann::json::parse(reply.body, nullptr, false);
    report->prefix_cache_reset = s.ok() && j.is_object() && j.value("success", false);
  }
  // Resume whatever happened above: even a pause that timed out may have
  // taken effect. An update that failed left the old weights in place.
  Status resumed = Step("POST", "/resume", "", options_.step_timeout_ms);
  report->pause_ms = static_cast<int64_t>((clock_.NowUs() - paused_us) / 1000);
  if (!s.ok()) {
    return resumed.ok()
               ? s
               : s.WithContext(internal::StrCat("(and resume failed: ", resumed.message(), ") "));
  }
  TERN_RETURN_IF_ERROR(resumed);
  TERN_ASSIGN_OR_RETURN(served, ServedVersionLocked());
  TERN_REQUIRE(served.has_value() && *served == update.version, kMismatch,
               "engine: finished version ", update.version, " but the engine says it serves ",
               served.has_value() ? std::to_string(*served) : std::string("no version"));
  report->version = *served;
  return Status::Ok();
}

Result<EngineUpdateReport> VllmAdapter::Apply(const EngineUpdate& update) {
  TERN_REQUIRE(update.version > 0, kInvalidArgument, "engine: version must be > 0");
  TERN_REQUIRE(update.slot_dir.starts_with('/') && update.slot_dir.size() < 4096 &&
                   update.slot_dir.find('\0') == std::string::npos,
               kInvalidArgument, "engine: slot must be an absolute path, not '",
               Clip(update.slot_dir), "'");
  if (update.changed.has_value()) {
    TERN_REQUIRE(update.changed->size() <= options_.changed_max, kResourceExhausted,
                 "engine: ", update.changed->size(), " changed tensors (at most ",
                 options_.changed_max, ")");
    for (const std::string& name : *update.changed)
      TERN_REQUIRE(PlainName(name), kInvalidArgument, "engine: '", Clip(name),
                   "' is not a tensor name (empty, over ", kNameBytesMax,
                   " bytes, or not printable ASCII)");
  }
  auto round_trip = nlohmann::json::parse(DumpEngineJson(update.slot_dir), nullptr, false);
  TERN_REQUIRE(round_trip.is_string() && round_trip.get<std::string>() == update.slot_dir,
               kInvalidArgument, "engine: slot path is not valid UTF-8");
  MutexLock lock(mu_);
  EngineUpdateReport report;
  Status last = RetryEngineAttempts(options_.attempts, options_.retry_backoff_ms, clock_,
                                    [&](uint32_t attempt) REQUIRES(mu_) {
                                      report.attempts = attempt;
                                      // After an update whose effect is unknown, only a
                                      // full one (every tensor, no base) brings the
                                      // engine to a known version.
                                      report.full = weights_uncertain_ || !update.changed.has_value();
                                      return Attempt(update, report.full, &report,
                                                     &weights_uncertain_);
                                    });
  if (last.ok()) return report;
  return last.WithContext(internal::StrCat("update to version ", update.version, " after ",
                                           report.attempts, " attempt(s)"));
}

}  // namespace tern::agent

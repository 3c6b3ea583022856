#include "agent/engine/sglang_adapter.h"

#include <nlohmann/json.hpp>

namespace tern::agent {
namespace {

// SGLang's pause_generation modes (io_struct.py, PauseGenerationReqInput).
const char* SglangPauseMode(PauseMode mode) {
  switch (mode) {
    case PauseMode::kKeep:
      return "in_place";
    case PauseMode::kAbort:
      return "abort";
    case PauseMode::kWait:
      return nullptr;  // no pause: the update's writer lock drains
  }
  return nullptr;
}

}  // namespace

Result<std::unique_ptr<SglangAdapter>> SglangAdapter::Create(SglangAdapterOptions options,
                                                             Clock& clock) {
  TERN_ASSIGN_OR_RETURN(EngineEndpoint engine, ParseEngineUrl(options.url));
  TERN_REQUIRE(options.root.starts_with('/') && options.root.size() < 4096, kInvalidArgument,
               "engine: the member directory must be an absolute path, not '", options.root, "'");
  TERN_REQUIRE(options.attempts >= 1 && options.attempts <= 16, kInvalidArgument,
               "engine: attempts must be 1..16, not ", options.attempts);
  TERN_REQUIRE(options.connect_timeout_ms > 0 && options.step_timeout_ms > 0 &&
                   options.pause_timeout_ms > 0 && options.update_timeout_ms > 0,
               kInvalidArgument, "engine: every timeout must be > 0 ms");
  return std::unique_ptr<SglangAdapter>(
      new SglangAdapter(std::move(options), std::move(engine), clock));
}

SglangAdapter::SglangAdapter(SglangAdapterOptions options, EngineEndpoint engine, Clock& clock)
    : options_(std::move(options)), engine_(std::move(engine)), clock_(clock) {}

Status SglangAdapter::Step(const char* method, const std::string& path, const std::string& body,
                           uint32_t timeout_ms, EngineReply* out) {
  TERN_ASSIGN_OR_RETURN(EngineReply reply,
                        EngineHttpCall(engine_, options_.connect_timeout_ms, method, path, body,
                                       timeout_ms, clock_));
  if (reply.status < 200 || reply.status > 299) {
    // SGLang answers a failed operation with 400 {"success": false,
    // "message"} (the engine kept its state: worth another attempt), and
    // a body it cannot parse with 400 {"object": "error", "message"} (ours
    // to fix: not retried).
    auto j = nlohmann::json::parse(reply.body, nullptr, false);
    const bool failed_operation = j.is_object() && j.contains("success");
    const Code code = reply.status >= 500 || failed_operation ? Code::kUnavailable : Code::kProtocol;
    const char* hint = reply.status == 404 ? " (is the engine an SGLang server?)" : "";
    return Status(code, internal::StrCat("engine: ", method, " ", path, ": HTTP ", reply.status,
                                         hint, ": ", EngineErrorText(reply.body)));
  }
  if (out != nullptr) *out = std::move(reply);
  return Status::Ok();
}

Result<std::optional<uint64_t>> SglangAdapter::ServedVersion() {
  MutexLock lock(mu_);
  return ServedVersionLocked();
}

Result<std::optional<uint64_t>> SglangAdapter::ServedVersionLocked() {
  EngineReply reply;
  Status s = Step("GET", info_route_, "", options_.step_timeout_ms, &reply);
  if (!s.ok() && info_route_ == "/model_info" && s.message().find("HTTP 404") != std::string::npos) {
    // Releases before /model_info serve the same object at /get_model_info.
    info_route_ = "/get_model_info";
    s = Step("GET", info_route_, "", options_.step_timeout_ms, &reply);
  }
  TERN_RETURN_IF_ERROR(s);
  // "default" (SGLang's --weight-version) reads as none of ours.
  return ServedWeightVersion(reply.body, info_route_);
}

Status SglangAdapter::Attempt(const EngineUpdate& update, EngineUpdateReport* report) {
  const char* mode = SglangPauseMode(options_.pause);
  // Only with wait is the engine idle when its post-update flush runs.
  const bool flush_in_update = mode == nullptr && options_.reset_prefix_cache;
  const nlohmann::json body = {{"model_path", update.slot_dir},
                               {"weight_version", std::to_string(update.version)},
                               {"flush_cache", flush_in_update},
                               {"abort_all_requests", options_.pause == PauseMode::kAbort}};

  const uint64_t paused_us = clock_.NowUs();
  Status s;
  if (mode != nullptr) {
    s = Step("POST", "/pause_generation", DumpEngineJson(nlohmann::json{{"mode", mode}}),
             options_.step_timeout_ms);
  }
  if (s.ok()) {
    const uint32_t timeout_ms =
        mode == nullptr ? options_.pause_timeout_ms + options_.update_timeout_ms
                        : options_.update_timeout_ms;
    const uint64_t t = clock_.NowUs();
    EngineReply reply;
    s = Step("POST", "/update_weights_from_disk", DumpEngineJson(body), timeout_ms, &reply);
    report->update_ms = static_cast<int64_t>((clock_.NowUs() - t) / 1000);
    if (s.ok()) {
      auto j = nlohmann::json::parse(reply.body, nullptr, false);
      if (!j.is_object() || !j.contains("success") || !j["success"].is_boolean()) {
        s = TERN_ERROR(kProtocol, "engine: POST /update_weights_from_disk: no \"success\" in ",
                       ClipEngineText(reply.body));
      } else if (!j["success"].get<bool>()) {
        s = TERN_ERROR(kUnavailable, "engine: POST /update_weights_from_disk: ",
                       EngineErrorText(reply.body));
      }
    }
  }
  report->prefix_cache_reset = s.ok() && flush_in_update;
  if (s.ok() && mode != nullptr && options_.reset_prefix_cache) {
    // 400 while requests hold the cache (in_place keeps them running):
    // reported, not an error.
    EngineReply reply;
    const Status flushed = Step("POST", "/flush_cache", "", options_.step_timeout_ms, &reply);
    if (!flushed.ok() && flushed.message().find("HTTP 400") == std::string::npos) s = flushed;
    report->prefix_cache_reset = flushed.ok();
  }
  // Continue whatever happened above: a pause that timed out may have taken
  // effect, and an earlier attempt's pause may still hold.
  const Status resumed = Step("POST", "/continue_generation", "{}", options_.step_timeout_ms);
  report->pause_ms = static_cast<int64_t>((clock_.NowUs() - paused_us) / 1000);
  if (!s.ok()) {
    return resumed.ok() ? s
                        : s.WithContext(internal::StrCat("(and continue_generation failed: ",
                                                         resumed.message(), ") "));
  }
  TERN_RETURN_IF_ERROR(resumed);
  TERN_ASSIGN_OR_RETURN(std::optional<uint64_t> served, ServedVersionLocked());
  TERN_REQUIRE(served.has_value() && *served == update.version, kMismatch, "engine: loaded version ",
               update.version, " but the engine says it serves ",
               served.has_value() ? std::to_string(*served) : std::string("no version"));
  report->version = *served;
  return Status::Ok();
}

Result<EngineUpdateReport> SglangAdapter::Apply(const EngineUpdate& update) {
  TERN_REQUIRE(update.version > 0, kInvalidArgument, "engine: version must be > 0");
  TERN_REQUIRE(update.slot_dir.starts_with('/') && update.slot_dir.size() < 4096 &&
                   update.slot_dir.find('\0') == std::string::npos,
               kInvalidArgument, "engine: slot must be an absolute path, not '",
               ClipEngineText(update.slot_dir), "'");
  const std::string& root = options_.root;
  TERN_REQUIRE(update.slot_dir.starts_with(root.ends_with('/') ? root : root + "/") &&
                   update.slot_dir.find("/../") == std::string::npos &&
                   !update.slot_dir.ends_with("/.."),
               kInvalidArgument, "engine: slot '", ClipEngineText(update.slot_dir),
               "' is not inside the member directory ", root);
  auto round_trip = nlohmann::json::parse(DumpEngineJson(update.slot_dir), nullptr, false);
  TERN_REQUIRE(round_trip.is_string() && round_trip.get<std::string>() == update.slot_dir,
               kInvalidArgument, "engine: slot path is not valid UTF-8");
  MutexLock lock(mu_);
  EngineUpdateReport report;
  report.full = true;  // SGLang reloads the model path whole
  Status last = RetryEngineAttempts(options_.attempts, options_.retry_backoff_ms, clock_,
                                    [&](uint32_t attempt) REQUIRES(mu_) {
                                      report.attempts = attempt;
                                      return Attempt(update, &report);
                                    });
  if (last.ok()) return report;
  return last.WithContext(internal::StrCat("update to version ", update.version, " after ",
                                           report.attempts, " attempt(s)"));
}

}  // namespace tern::agent

// SglangAdapter: the engine adapter for an SGLang server, over the HTTP API
// SGLang documents for RL weight updates (docs/engines.md, "SGLang"):
//
//   POST /pause_generation          {"mode": "in_place" | "abort"}
//   POST /update_weights_from_disk  {"model_path": SLOT, "weight_version": "N",
//                                    "flush_cache": bool, "abort_all_requests": bool}
//   POST /flush_cache
//   POST /continue_generation       {}
//   GET  /model_info                {"weight_version": "N", ...}
//                                   (/get_model_info on releases without it)
//
// SGLang reloads every tensor from the model path it is given: an update
// is never sparse (EngineUpdate::changed is not sent; every report says
// `full`). The weight version changes together with the weights, only when
// the load succeeded, so the version SGLang names is the one it loaded (a
// timed-out update may still land later; the next read-back says so). A
// load that fails half-way rolls back by re-reading SGLang's previous
// model path, the previous version's slot, which the member may have
// rewritten as its spare since: until a retry succeeds such an engine may
// hold other weights under its old version (docs/engines.md, "SGLang",
// known gaps).
//
// Pause policy (PauseMode) onto SGLang:
//   keep  -> pause_generation mode in_place: requests stay in the engine
//            with their KV cache and continue on the new weights;
//   wait  -> no pause: the update itself waits, holding SGLang's model-update
//            writer lock, until the requests in flight have finished, and
//            holds new ones back until it is done (its deadline is the pause's
//            plus the update's);
//   abort -> pause_generation mode abort (and abort_all_requests).
// Prefix cache (reset_prefix_cache): with wait, flush_cache in the update
// (the engine is idle there); with keep and abort, the update never asks
// for it (SGLang's scheduler asserts that its post-update flush succeeded,
// and a flush fails while requests are held or being aborted: the assert
// would take the engine down) and a separate POST /flush_cache follows
// before continue_generation; its 400 (requests hold the cache) is reported
// as not reset, not as an error: the sidecar's per-version `extra_key`
// keeps one version's prefixes from serving another's requests.
//
// Contract: EngineAdapter's. Every step has a deadline; continue_generation
// is sent whatever failed; a refused or failed update ({"success": false})
// leaves the engine on its version and is retried up to `attempts` times, as
// are an unreachable engine, a timeout and a 5xx; a request SGLang rejects
// as malformed (400 without "success") and a route it does not serve (404)
// are not. Thread-safe: calls are serialized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "agent/engine/engine_adapter.h"
#include "agent/engine/engine_http.h"
#include "base/mutex.h"
#include "tern/clock.h"
#include "tern/status.h"

namespace tern::agent {

struct SglangAdapterOptions {
  std::string url;   // http://HOST:PORT of `python -m sglang.launch_server --model-path DIR/current`
  std::string root;  // the member's directory (absolute): every slot must be inside it
  PauseMode pause = PauseMode::kKeep;
  bool reset_prefix_cache = true;  // flush SGLang's radix cache with the new weights
  uint32_t connect_timeout_ms = 2000;
  uint32_t step_timeout_ms = 10000;     // pause (keep, abort), flush, continue, model_info
  uint32_t pause_timeout_ms = 60000;    // with wait: the drain before the update
  uint32_t update_timeout_ms = 300000;  // update_weights_from_disk: reads and loads every tensor
  uint32_t attempts = 2;                // sequences per Apply, 1..16
  uint32_t retry_backoff_ms = 500;
};

class SglangAdapter final : public EngineAdapter {
 public:
  // kInvalidArgument for a URL that is not http://HOST:PORT, a relative
  // root, attempts outside 1..16 or a zero timeout. `clock` times the steps
  // and the backoff; it must outlive the adapter.
  static Result<std::unique_ptr<SglangAdapter>> Create(SglangAdapterOptions options, Clock& clock);

  Result<EngineUpdateReport> Apply(const EngineUpdate& update) override;
  Result<std::optional<uint64_t>> ServedVersion() override;

 private:
  SglangAdapter(SglangAdapterOptions options, EngineEndpoint engine, Clock& clock);
  // One request; a non-2xx reply is an error whose code says whether a
  // retry may help. `reply` gets the body of a 2xx reply.
  Status Step(const char* method, const std::string& path, const std::string& body,
              uint32_t timeout_ms, EngineReply* reply = nullptr);
  Result<std::optional<uint64_t>> ServedVersionLocked() REQUIRES(mu_);
  // One sequence: pause, update, flush, continue, read back.
  Status Attempt(const EngineUpdate& update, EngineUpdateReport* report) REQUIRES(mu_);

  const SglangAdapterOptions options_;
  const EngineEndpoint engine_;
  Clock& clock_;
  Mutex mu_;  // one Apply or ServedVersion at a time
  // The route the version is read from: /model_info, or /get_model_info
  // once the engine answered 404 to it (SGLang releases before /model_info).
  std::string info_route_ GUARDED_BY(mu_) = "/model_info";
};

}  // namespace tern::agent

// The agent's engine adapter: loads a version the member serves on disk
// into the serving engine beside it, and reads back the version the engine
// serves (docs/engines.md, "The engine adapter").
//
// An update names the slot that holds the version (DIR/views/a or b, a
// checkpoint directory) and the tensors that changed since `base_version`
// (or none: every tensor). The adapter drives the engine's own update
// routes; the engine reads the tensors from the slot (for vLLM: the `tern`
// weight-transfer backend, engines/vllm/).
//
// Contract of Apply: every step has a deadline; whatever fails, the
// adapter asks the engine to resume serving before it returns, and a
// failed update leaves the engine on the version it had (the backend
// validates the whole update before it loads anything), except after a
// timeout: vLLM finishes an update it started, so the weights may be the
// new version's under the old name; the adapter then sends the next
// attempt, and the next update, full (every tensor). Failures the
// engine may get over (unreachable, timed out, 5xx) are retried up to
// `attempts` times; an update the engine refuses as bad input, and an
// engine that does not speak these routes (4xx), are not. Thread-safe:
// calls are serialized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "tern/clock.h"
#include "tern/status.h"

namespace httplib {
class Client;
}

namespace tern::agent {

struct EngineUpdate {
  uint64_t version = 0;       // the version to load, > 0
  uint64_t base_version = 0;  // what `changed` is relative to; 0: not stated
  std::string slot_dir;       // absolute path of the checkpoint directory
  // The tensors that differ from base_version; nullopt: load every tensor.
  std::optional<std::vector<std::string>> changed;
};

struct EngineUpdateReport {
  uint64_t version = 0;   // the version the engine says it serves afterwards
  uint32_t attempts = 0;  // update sequences run (1 without a retry)
  int64_t pause_ms = 0;   // the last attempt's pause -> resume, as the engine saw it
  int64_t update_ms = 0;  // its update call (read + load)
  bool prefix_cache_reset = false;
  bool full = false;  // every tensor was loaded (asked, or after an unknown outcome)
};

class EngineAdapter {
 public:
  virtual ~EngineAdapter() = default;
  // Loads `update` (see the contract above). On error the report of what
  // happened is in the message; the engine serves the version it had.
  virtual Result<EngineUpdateReport> Apply(const EngineUpdate& update) = 0;
  // The version the engine says it serves; nullopt when it names none
  // (a fresh engine) or a name that is not a version number.
  virtual Result<std::optional<uint64_t>> ServedVersion() = 0;
};

// What an engine does with requests in flight while it updates (vLLM's
// /pause?mode=): keep them (frozen, resumed on the new weights), wait for
// them to finish, or abort them.
enum class PauseMode { kKeep, kWait, kAbort };
Result<PauseMode> ParsePauseMode(std::string_view text);
const char* PauseModeName(PauseMode mode);

struct VllmAdapterOptions {
  std::string url;   // http://HOST:PORT of `vllm serve ... --weight-transfer-config
                     // '{"backend": "tern"}'` with VLLM_SERVER_DEV_MODE=1
  std::string root;  // the member's directory (absolute): every slot is inside it
  PauseMode pause = PauseMode::kKeep;
  bool reset_prefix_cache = true;  // after the new weights, before resuming
  uint32_t connect_timeout_ms = 2000;
  // Each step's deadline: the connection, every read, and the whole reply.
  uint32_t step_timeout_ms = 10000;     // init, start, finish, cache reset, resume, version
  uint32_t pause_timeout_ms = 60000;    // pause (mode wait drains requests)
  uint32_t update_timeout_ms = 300000;  // update_weights: reads and loads the tensors
  uint32_t attempts = 2;                // sequences per Apply, >= 1
  uint32_t retry_backoff_ms = 500;
  size_t changed_max = 1 << 20;  // names per update (the backend's bound)
};

class VllmAdapter final : public EngineAdapter {
 public:
  // kInvalidArgument for a URL that is not http://HOST:PORT, a relative
  // root, zero attempts or zero timeouts. `clock` times the steps and the
  // retry backoff; it must outlive the adapter.
  static Result<std::unique_ptr<VllmAdapter>> Create(VllmAdapterOptions options, Clock& clock);
  ~VllmAdapter() override;

  Result<EngineUpdateReport> Apply(const EngineUpdate& update) override;
  Result<std::optional<uint64_t>> ServedVersion() override;

 private:
  struct Reply;
  VllmAdapter(VllmAdapterOptions options, std::string host, int port, Clock& clock);
  // One request with its own deadline; the reply body bounded.
  Result<Reply> Call(const char* method, const std::string& path, const std::string& body,
                     uint32_t timeout_ms);
  Status Step(const char* method, const std::string& path, const std::string& body,
              uint32_t timeout_ms, Reply* reply = nullptr);
  Result<std::optional<uint64_t>> ServedVersionLocked() REQUIRES(mu_);
  // One sequence: init, pause, start, update, finish, cache reset, resume.
  // `full`: send every tensor. Sets *uncertain when the engine may hold
  // weights other than those of the version it names.
  Status Attempt(const EngineUpdate& update, bool full, EngineUpdateReport* report, bool* uncertain)
      REQUIRES(mu_);

  const VllmAdapterOptions options_;
  const std::string host_;
  const int port_;
  Clock& clock_;
  Mutex mu_;  // one Apply or ServedVersion at a time
  // An update failed after the engine may have loaded it (a timeout, a
  // failed finish): the next one is sent full. Guarded by mu_.
  bool weights_uncertain_ GUARDED_BY(mu_) = false;
};

}  // namespace tern::agent

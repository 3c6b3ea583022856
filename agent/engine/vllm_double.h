// A test double of vLLM's weight-update routes (vLLM 0.32 with
// VLLM_SERVER_DEV_MODE=1 and the `tern` backend), for the adapter's tests.
// It is NOT an engine: it loads nothing, it keeps the state vLLM keeps
// (paused, an update session, the weight version) and obeys the same
// order rules, and it can be told to fail, hang or die on any route:
//
//   GET  /weight_info                  {"weight_version": "..."} ("default" at start)
//   POST /init_weight_transfer_engine  {"init_info": {"root", "version"?}}
//   POST /pause?mode=keep|wait|abort   /resume   GET /is_paused
//   POST /start_weight_update          500 if a session is open or not initialized
//   POST /update_weights               {"update_info": {...}}: 500 outside a session
//   POST /finish_weight_update         {"weight_version": "N"}: 500 outside a session
//   POST /reset_prefix_cache           {"success": !cache_busy}
//
// Errors are vLLM's shape: HTTP 500 {"error": {"message", "type", "code"}};
// a failed update closes the session, as vLLM's worker does. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tern::agent::testing {

enum class Fault {
  kFail,       // HTTP 500, a worker failure
  kBadUpdate,  // HTTP 500 whose message starts "tern: bad update: "
  kHang,       // answers only after hang_ms (or at EndHangs or Stop)
  kDie,        // the engine dies: the reply is cut and the port closes
};

class VllmDouble {
 public:
  VllmDouble();  // listens on 127.0.0.1, any port
  ~VllmDouble();
  std::string url() const;  // http://127.0.0.1:PORT
  void Stop();

  // The next `times` requests to `route` (a path without query, e.g.
  // "/update_weights") meet `fault`.
  void Inject(const std::string& route, Fault fault, uint32_t times = 1);

  std::atomic<uint32_t> hang_ms{5000};
  // Requests hanging now answer at once (as usual, as a slow engine does).
  void EndHangs();
  std::atomic<bool> cache_busy{false};

  std::string weight_version() const;
  void set_weight_version(const std::string& v);
  bool paused() const;
  bool session_open() const;
  std::string pause_mode() const;        // of the last pause
  std::string last_update_info() const;  // JSON of the last update_info received
  std::string last_init_info() const;
  uint64_t updates_loaded() const;          // update_weights calls that succeeded
  std::vector<std::string> routes() const;  // "POST /pause", in arrival order

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent::testing

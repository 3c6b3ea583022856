// SglangDouble: a TEST DOUBLE of SGLang's HTTP weight-update API, for the
// adapter's and the agent's tests. It is NOT an engine: it loads nothing and
// generates nothing. It keeps the state SGLang's server keeps for these
// routes (paused and how, requests held, the weight version, the model
// path), answers with SGLang's status codes and body shapes, rejects the
// bodies SGLang rejects, and can be told to fail, hang or die on any route.
// Followed: sgl-project/sglang docs/advanced_features/sglang_for_rl.md
// (commit 6614f984), io_struct.py (commit 001067ff) and http_server.py
// (docs/engines.md, "SGLang"):
//
//   GET  /model_info, /get_model_info  {"model_path", "weight_version", ...}
//   GET  /get_weight_version            404 (deprecated in favour of /model_info)
//   POST /pause_generation    {"mode": "abort"|"retract"|"in_place"}  400 for another mode
//   POST /continue_generation
//   POST /update_weights_from_disk  {"model_path" (required), "weight_version"?,
//        "flush_cache"? (default true), "abort_all_requests"?, ...}: 200 {"success": true,
//        "message", "num_paused_requests"}; 400 {"success": false, ...} when the load fails
//        (the weights and the version stay); 400 {"object": "error", ...} for a bad body
//   POST|GET /flush_cache     200, or 400 while requests are running or waiting
//
// Requests in flight are a count (`set_running`): pause abort (or
// abort_all_requests) drops them, in_place keeps them running, retract
// moves them to the waiting queue (where flush_cache still succeeds, as
// SGLang documents); an update while not paused waits for them to finish
// (SGLang's model-update writer lock): the double lets them finish at once
// and counts the drain. An update with flush_cache while requests are held
// kills the double, as SGLang's scheduler assert does. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tern::agent::testing {

enum class SglangFault {
  kFail,  // update: 400 {"success": false} (the load failed, rolled back); else HTTP 500
  kHang,  // answers only after hang_ms (or at Stop), then as usual
  kDie,   // the engine dies: the reply is cut and the port closes
};

class SglangDouble {
 public:
  // Listens on 127.0.0.1, any port. `legacy`: an SGLang release without
  // /model_info (only /get_model_info).
  explicit SglangDouble(bool legacy = false);
  ~SglangDouble();
  SglangDouble(const SglangDouble&) = delete;
  SglangDouble& operator=(const SglangDouble&) = delete;

  std::string url() const;  // http://127.0.0.1:PORT
  void Stop();

  // The next `times` requests to `route` (a path, e.g.
  // "/update_weights_from_disk") meet `fault`.
  void Inject(const std::string& route, SglangFault fault, uint32_t times = 1);
  void set_hang_ms(uint32_t ms);

  std::string weight_version() const;  // "default" at start, as SGLang's --weight-version
  void set_weight_version(const std::string& v);
  std::string model_path() const;
  void set_running(uint32_t requests);  // requests in flight
  uint32_t running() const;
  uint32_t waiting() const;
  bool paused() const;
  std::string pause_mode() const;  // of the last pause
  std::string last_update() const;  // JSON body of the last update_weights_from_disk
  uint64_t updates_loaded() const;
  uint64_t drains() const;       // updates that waited for requests in flight
  uint64_t cache_flushes() const;  // flushes that succeeded (in updates or alone)
  bool dead() const;
  std::vector<std::string> routes() const;  // "POST /pause_generation", in arrival order

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent::testing

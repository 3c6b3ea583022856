// A test double of an OpenAI-compatible engine (vLLM's and SGLang's
// generation routes, nothing else of them): tests and the overhead bench
// put tern-sidecar in front of it. It is NOT an engine: it generates
// nothing, it reports the version the test says it serves.
//
// POST /v1/completions, /v1/chat/completions, /generate:
//   whole:    {"id", "object", "choices": [{"index": 0, "text": "ok"}],
//              "engine_version_start": V0, "engine_version_end": V1}
//             (/generate: {"text": "ok", "meta_info": {"engine_version_start",
//             "engine_version_end"}}), V0 read when the request arrives,
//             V1 after delay_ms;
//   "stream": true: `max_tokens` (default 4) events "data: {...,
//             "engine_version": V}", V read as each is sent, delay_ms apart,
//             then "data: [DONE]".
// Anything else: GET /v1/models answers a list, every other route answers
// {"route": PATH} (control routes included, so a test sees what got through).
// Thread-safe; Stop ends it (a kill: open streams are cut).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tern::agent::testing {

class FakeEngine {
 public:
  FakeEngine();  // listens on 127.0.0.1, any port
  ~FakeEngine();
  std::string url() const;  // http://127.0.0.1:PORT
  int port() const;
  void Stop();

  std::atomic<uint64_t> version{0};      // what it "serves"
  std::atomic<uint32_t> delay_ms{0};     // per whole reply, or between events
  std::atomic<uint64_t> streams_cut{0};  // streams whose reader went away
  std::atomic<uint64_t> requests{0};

  std::string last_body() const;  // the last generation request's body
  std::vector<std::string> routes_seen() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent::testing

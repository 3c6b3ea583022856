// The sidecar's side of the engine: keep-alive HTTP connections to one
// OpenAI-compatible engine (cpp-httplib 0.11's client), a bounded set of
// idle ones reused by requests.
//
// Call sends one request and hands the reply to the caller as it arrives:
// `on_head` once with the status and headers (return false to abandon the
// reply), then `on_body` per piece (return false to abandon it: the
// connection is closed, which is how vLLM and SGLang learn that a client
// went away and abort the generation). A connection whose reply was
// abandoned or failed is not reused. Thread-safe.
#pragma once

#include <chrono>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tern/status.h"

namespace httplib {
class Client;
}

namespace tern::agent {

struct EngineOptions {
  std::string url;  // http://HOST:PORT (no path)
  uint32_t connect_timeout_ms = 2000;
  uint32_t read_timeout_ms = 3600000;  // per read: a long prefill sends nothing for a while
  uint32_t max_idle = 64;              // idle connections kept
  // An idle connection older than this is closed, not reused: engines' HTTP
  // servers close idle keep-alive connections (uvicorn, vLLM's: after 5 s),
  // and a request sent on one as it closes fails.
  uint32_t idle_ms_max = 2000;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct EngineHead {
  int status = 0;
  HeaderList headers;
  std::string content_type;
};

// Cancels one Call from another thread: closes its connection (the engine
// sees the client go), or keeps it from starting. Thread-safe.
class CallCanceller {
 public:
  void Cancel();

 private:
  friend class EngineClient;
  std::mutex mu_;
  httplib::Client* client_ = nullptr;  // the Call's, while it runs
  bool cancelled_ = false;
};

class EngineClient {
 public:
  // kInvalidArgument for a URL that is not http://HOST:PORT.
  static Result<std::unique_ptr<EngineClient>> Create(EngineOptions options);
  ~EngineClient();

  // kUnavailable when the engine cannot be reached or drops the connection
  // before the reply ends; kCancelled when a callback abandoned the reply.
  // A reused idle connection that fails before any reply came (the engine
  // closed it as the request went out) is retried once on a new one.
  Status Call(std::string_view method, std::string_view path_and_query, const HeaderList& headers,
              std::string body, const std::function<bool(const EngineHead&)>& on_head,
              const std::function<bool(std::string_view)>& on_body,
              CallCanceller* canceller = nullptr);

 private:
  explicit EngineClient(EngineOptions options, std::string host, int port);
  // A pooled connection (*reused = true) or a new one.
  std::unique_ptr<httplib::Client> Take(bool* reused);
  void Give(std::unique_ptr<httplib::Client> client);
  std::unique_ptr<httplib::Client> NewClient();

  const EngineOptions options_;
  const std::string host_;
  const int port_;
  std::mutex mu_;
  struct Idle {
    std::unique_ptr<httplib::Client> client;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Idle> idle_;  // newest last
};

}  // namespace tern::agent

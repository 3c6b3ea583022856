// A test double of the sidecar's commit point (agent/sidecar/commit_point.h,
// POST /tern/commit/begin and /end), for the engine driver's tests: it
// records every call, answers with what `answer` says (200 by default),
// and checks the admin token. It is NOT the sidecar: it holds no gate.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tern::agent::testing {

class CommitPointDouble {
 public:
  struct Call {
    bool begin = false;
    uint64_t version = 0;
    bool loaded = false;  // end only
  };
  // Called on each authenticated call, before it is answered; returns the
  // HTTP status to answer with.
  using Answer = std::function<int(const Call&)>;

  explicit CommitPointDouble(std::string token, Answer answer = nullptr);
  ~CommitPointDouble();
  std::string address() const;  // 127.0.0.1:PORT
  std::vector<Call> calls() const;
  uint64_t refused_tokens() const;  // calls without the right token (403)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent::testing

// The sidecar's commit point, seen from the member's engine driver
// (tern-agent --engine-sidecar; docs/engines.md, "The commit point").
//
// Before the driver pauses the engine it asks the sidecar in front of it to
// begin a commit of the version (admission closes, the requests that must
// not cross the change finish); after the update it ends it, saying whether
// the engine loaded the version. So no request is stamped with a version
// it did not run on (agent/sidecar/commit_point.h is the other side).
//
// Thread-safe: calls are serialized by the caller (one driver thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/status.h"

namespace tern::agent {

class EngineCommitPoint {
 public:
  virtual ~EngineCommitPoint() = default;
  // Ok once the sidecar holds the commit of `version` open for at most
  // hold_ms; an error when it did not open it (unreachable, requests that
  // did not drain, refused): the engine must then not change.
  virtual Status Begin(uint64_t version, uint32_t hold_ms) = 0;
  // The engine loaded `version` (true) or kept the version it had (false).
  virtual Status End(uint64_t version, bool loaded) = 0;
};

struct SidecarCommitOptions {
  std::string address;  // the sidecar's HOST:PORT (loopback or the replica's private network)
  std::string token;    // its --admin-token-file token, sent as X-Tern-Admin-Token
  // Per call: a Begin waits for the sidecar's drain (its --drain-timeout-ms,
  // 60 s by default) plus its slack.
  uint32_t timeout_ms = 90000;
};

// kInvalidArgument for a malformed address or token.
Result<std::unique_ptr<EngineCommitPoint>> NewSidecarCommitPoint(SidecarCommitOptions options);

}  // namespace tern::agent

// tern-sidecar: the version-aware reverse proxy in front of one
// OpenAI-compatible engine (vLLM, SGLang) on a replica (docs/engines.md,
// "The sidecar").
//
// Rollout requests on /v1/completions, /v1/chat/completions and /generate
// say which versions they accept (the seed system's body field
// "weight_version": {"min_version", "exact_version"}, or tern's headers
// X-Tern-Min-Version / X-Tern-Max-Staleness); the sidecar serves each only
// on such a version, says which version served it (weight_version_start /
// weight_version_end in the body, X-Tern-Version in a header), answers 409
// WeightVersionNotReady otherwise, and keeps engine control routes from
// clients. It learns the served version from the local member's admin
// /status or from a version file, and changes it at a commit point that
// no request crosses unlabelled.
//
// Thread safety: Start/Stop from one thread; address() from any.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/export.h"
#include "tern/log.h"
#include "tern/status.h"

namespace tern {

struct SidecarConfig {
  std::string listen = "127.0.0.1:8100";  // HOST:PORT (port 0: any)
  std::string engine_url;                 // http://HOST:PORT
  // Where the served version comes from: exactly one of the member's admin
  // port ([https://]HOST:PORT; its /status "served_version") or a version
  // file.
  std::string agent_admin;
  std::string version_file;
  std::string agent_token;  // the member's admin token, if it has one
  // An https:// agent_admin: the CA (PEM) its certificate must chain to;
  // empty: the system's trust store.
  std::string agent_ca_pem;
  // An https:// agent_admin whose port requires a client certificate
  // (tern-agent --admin-tls-client-ca): ours and its unencrypted key
  // (PEM), both or neither.
  std::string agent_cert_pem, agent_key_pem;
  std::string admin_token;  // lets a request reach control routes; empty: none can
  bool quiesce = false;     // false: in place (only exact-version requests drain)
  bool cache_salt = true;   // key the engine's prefix cache by version
  // While the member reports itself stale (no valid HEAD beacon, behind, or
  // its /status unreadable; docs/security.md "Freshness"): true refuses
  // every versioned request with a retryable 503 MemberStale; false only
  // those that say X-Tern-Max-Staleness.
  bool refuse_when_stale = false;
  uint32_t catchup_wait_ms = 2000;
  uint32_t poll_ms = 200;
  uint32_t drain_timeout_ms = 60000;
  uint32_t workers = 128;
  uint32_t client_timeout_ms = 30000;
  uint32_t engine_timeout_ms = 3600000;
  uint64_t max_body_bytes = 16 << 20;
  uint64_t max_response_bytes = 64 << 20;
  LogFn log;  // null: stderr
};

class TERN_EXPORT SidecarService {
 public:
  // Starts following the served version and serving clients
  // (kInvalidArgument for bad options, kIo when the port cannot be bound).
  static Result<std::unique_ptr<SidecarService>> Start(SidecarConfig config);
  virtual ~SidecarService() = default;
  virtual std::string address() const = 0;  // the bound HOST:PORT
  // Closes the port, waits for requests in flight, stops following.
  virtual void Stop() = 0;
};

}  // namespace tern

// tern-sidecar: the version-aware reverse proxy in front of one
// OpenAI-compatible engine on a replica (docs/engines.md, "The sidecar").
//
// Routes:
//  * POST /v1/completions, /v1/chat/completions, /generate: the request lane
//    (request_lane.h). The body is parsed as JSON whatever its content type
//    (400 when it is not a JSON object or its lane is malformed, 413 over
//    max_body_bytes), admitted through the gate (version_gate.h: 409
//    WeightVersionNotReady when it cannot be served, after waiting up to
//    catchup_wait_ms when the version it needs is known but not yet
//    applied), forwarded without "weight_version" and with a per-version
//    prefix-cache key (vLLM's "cache_salt" on the OpenAI routes, SGLang's
//    "extra_key" on /generate; a client's own value is kept after it), and
//    the reply stamped: JSON replies get weight_version_start/_end, streamed
//    replies (text/event-stream, "stream": true) are passed on event by
//    event with each "data:" object stamped. Header X-Tern-Version: the
//    start version (and X-Tern-Version-End on a whole reply).
//  * GET /health: 503 {"ready": false, "reason"} until a version is
//    applied, then 200 {"ready": true}. GET /server_info: {"ready",
//    "applied" (the seed's identity, "weight_v000007"), "sync_state",
//    "reason", "applied_version", "head_version", "commit_mode",
//    "active_requests"}. GET /metrics: the sidecar's metrics (Prometheus
//    text).
//  * POST /tern/commit/begin {"version": N, "hold_ms": H} and
//    /tern/commit/end {"version": N, "loaded": true|false}, with the admin
//    token: the commit point the member's engine driver holds open across
//    an engine update (commit_point.h). 200 {"applied"}; 400 malformed;
//    403 without the token; 409 another commit open / none to end; 503
//    the requests that must finish first did not within drain_timeout_ms.
//  * Engine control routes (control_routes: pause, weight updates, cache
//    flushes, ...): 403 RouteBlocked unless the request carries
//    "X-Tern-Admin-Token: <admin_token>"; everything else is forwarded as
//    is, unversioned.
// The engine down or dropping the connection: 503 EngineUnavailable with
// Retry-After (mid-stream: a last "data:" event with that error). A client
// that goes away mid-stream closes the engine connection (vLLM and SGLang
// abort the generation); a whole (non-streamed) reply runs to its end:
// cpp-httplib 0.11 does not tell a handler that its client left.
//
// Bounds: max_body_bytes per request, max_response_bytes per whole reply
// (over: 502), stream_buffer_bytes between the engine and a slow client
// (the engine connection is read no faster than the client takes it),
// client_timeout_ms per read or write from a client (a slow client is
// dropped), `workers` requests at once (a streamed one also holds one
// engine thread). TODO(security): httplib 0.11 bounds neither the number
// of header lines nor a request's total time, and queues connections past
// `workers` without bound: listen on the replica's private network, not on
// the internet (the agent's admin port puts a byte-relaying guard in front
// for this reason; agent/ops/admin_guard.h).
//
// Thread-safe; Stop (also the destructor) closes the port and waits for
// every handler and engine call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agent/sidecar/engine_client.h"
#include "agent/sidecar/version_gate.h"
#include "tern/log.h"
#include "tern/status.h"

namespace tern::agent {

// vLLM's and SGLang's routes that change what the engine serves.
std::vector<std::string> DefaultControlRoutes();

struct SidecarOptions {
  std::string listen = "127.0.0.1:8100";  // HOST:PORT (port 0: any; see address())
  EngineOptions engine;
  std::string admin_token;  // empty: control routes are refused to everyone
  uint32_t workers = 128;
  uint64_t max_body_bytes = 16 << 20;
  uint64_t max_response_bytes = 64 << 20;
  uint64_t stream_buffer_bytes = 1 << 20;
  uint32_t catchup_wait_ms = 2000;
  uint32_t client_timeout_ms = 30000;
  // The commit point: how long a commit waits for the requests that must
  // finish first, and the longest a driver may hold one open.
  uint32_t drain_timeout_ms = 60000;
  uint32_t commit_hold_ms_max = 900000;
  bool cache_salt = true;
  // Refuse every versioned request while the member reports itself stale
  // (ReplicaState::member_stale) with a retryable 503 MemberStale; false:
  // only those with X-Tern-Max-Staleness (they ask for a fresh version).
  bool refuse_when_stale = false;
  std::vector<std::string> control_routes = DefaultControlRoutes();
  LogFn log;  // null: stderr
};

// What /server_info and /health say besides the gate's versions.
struct ReplicaState {
  std::string sync_state = "IDLE";
  std::string reason;
  // The member cannot show that its version is fresh (VersionFollower::
  // member_stale), and why.
  bool member_stale = false;
  std::string stale_reason;
  // The member serves a number a supersede withdrew (VersionFollower::
  // superseded: its served epoch is below HEAD's): versioned requests get
  // 409 whatever their numbers say.
  bool superseded = false;
};

class Sidecar {
 public:
  // `gate` must outlive the sidecar; `state` (may be null) is called from
  // handler threads.
  static Result<std::unique_ptr<Sidecar>> Start(SidecarOptions options, VersionGate& gate,
                                                std::function<ReplicaState()> state = nullptr);
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  std::string address() const;  // the bound "HOST:PORT"
  std::string MetricsText() const;
  void Stop();

  struct Impl;

 private:
  explicit Sidecar(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent

// Private to agent/sidecar/: the proxy's state, shared by sidecar.cc (the
// server, its routes, /health, /server_info, /metrics) and sidecar_proxy.cc
// (forwarding to the engine, whole and streamed replies).
#pragma once

#include <httplib.h>

#include <mutex>
#include <set>
#include <thread>

#include "agent/ops/metrics.h"
#include "agent/sidecar/commit_point.h"
#include "agent/sidecar/request_lane.h"
#include "agent/sidecar/sidecar.h"
#include "base/text.h"

namespace tern::agent {

inline constexpr const char* kJson = "application/json";
inline constexpr const char* kAdminHeader = "X-Tern-Admin-Token";
// Versions whose per-version series stay in /metrics (older ones are dropped
// so that a long run does not grow the registry without bound).
inline constexpr uint64_t kVersionsKept = 16;

struct Sidecar::Impl {
  SidecarOptions options;
  VersionGate& gate;
  std::function<ReplicaState()> state;
  std::unique_ptr<EngineClient> engine;
  std::unique_ptr<CommitPoint> commit;
  std::set<std::string, std::less<>> control;
  httplib::Server http;
  std::thread http_thread;
  std::string bound_address;
  std::once_flag stop_once;

  mutable MetricsRegistry metrics;
  std::mutex versions_mu;
  uint64_t newest_counted = 0;

  Impl(SidecarOptions o, VersionGate& g, std::function<ReplicaState()> s)
      : options(std::move(o)), gate(g), state(std::move(s)) {}

  ReplicaState State() const { return state ? state() : ReplicaState{}; }

  void Count(const char* name, const char* help, const Labels& labels) {
    if (auto c = metrics.GetCounter(name, help, labels); c.ok()) (*c)->Add();
  }
  void Refused(const char* reason) {
    Count("tern_sidecar_refusals_total", "Requests refused by the sidecar, by reason.",
          {{"reason", reason}});
  }
  void CountServed(const std::string& route, uint64_t version) {
    Count("tern_sidecar_requests_total",
          "Versioned requests admitted, by route and the version they started on.",
          {{"route", route}, {"version", std::to_string(version)}});
    std::lock_guard<std::mutex> lock(versions_mu);
    if (version <= newest_counted) return;
    for (uint64_t v = newest_counted > kVersionsKept ? newest_counted - kVersionsKept : 0;
         v + kVersionsKept < version && v <= newest_counted; ++v)
      for (const char* r : {"/v1/completions", "/v1/chat/completions", "/generate"})
        metrics.Remove("tern_sidecar_requests_total",
                       {{"route", r}, {"version", std::to_string(v)}});
    newest_counted = version;
  }

  void Reply(httplib::Response& res, int status, const std::string& body) {
    res.status = status;
    res.set_content(body, kJson);
  }
  void Error(httplib::Response& res, int status, const char* reason, std::string_view type,
             std::string_view message, bool retryable = false) {
    Refused(reason);
    Reply(res, status, ErrorBody(type, message, retryable));
  }
  void EngineUnavailable(httplib::Response& res, const Status& why) {
    options.log("sidecar: engine unavailable: " + why.ToString());
    res.headers.erase("X-Tern-Version");  // nothing was served
    Error(res, 503, "engine_unavailable", "EngineUnavailable",
          "the local inference engine is unavailable", true);
    res.set_header("Retry-After", "1");
  }

  void Health(httplib::Response& res);
  void ServerInfo(httplib::Response& res);
  std::string RenderMetrics() const;

  bool AdminAuthenticated(const httplib::Request& req) const {
    if (options.admin_token.empty() || !req.has_header(kAdminHeader)) return false;
    return SecretEquals(options.admin_token, req.get_header_value(kAdminHeader));
  }

  void Handle(const httplib::Request& req, httplib::Response& res);
  // POST /tern/commit/begin and /tern/commit/end (commit_point.h).
  void CommitRoute(const httplib::Request& req, httplib::Response& res, const std::string& path);
  void Forward(const httplib::Request& req, httplib::Response& res, const std::string& path);
  void Versioned(const httplib::Request& req, httplib::Response& res, const std::string& path);
  void WholeReply(httplib::Response& res, const std::string& path, HeaderList headers,
                  std::string body, std::optional<VersionGate::Ticket> ticket);
  void SendWhole(httplib::Response& res, const EngineHead& head, std::string reply, uint64_t start,
                 uint64_t end);
  void Streamed(httplib::Response& res, const std::string& path, HeaderList headers,
                std::string body, VersionGate::Ticket ticket);
};

}  // namespace tern::agent

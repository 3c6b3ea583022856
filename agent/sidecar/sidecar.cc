#include "agent/sidecar/sidecar.h"

#include <httplib.h>
#include <sys/socket.h>

#include <mutex>
#include <set>
#include <thread>

#include "agent/ops/admin_http.h"
#include "agent/sidecar/sidecar_impl.h"
#include "base/text.h"

namespace tern::agent {
namespace {

bool IsVersionedRoute(const std::string& path) {
  return path == "/v1/completions" || path == "/v1/chat/completions" || path == "/generate";
}

// "/a//b/./c/../d/" -> "/a/b/d": the engine's router sees the same path the
// control-route check saw.
std::string NormalizePath(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string_view::npos) slash = path.size();
    std::string_view part = path.substr(pos, slash - pos);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    pos = slash + 1;
  }
  std::string out;
  for (auto p : parts) (out += '/') += p;
  return out.empty() ? "/" : out;
}

}  // namespace

std::vector<std::string> DefaultControlRoutes() {
  return {// vLLM (serve's dev and RL endpoints)
          "pause", "resume", "sleep", "wake_up", "reset_prefix_cache", "reset_mm_cache",
          "collective_rpc", "init_weight_transfer_engine", "start_weight_update", "update_weights",
          "finish_weight_update", "scale_elastic_ep", "start_profile", "stop_profile",
          "v1/load_lora_adapter", "v1/unload_lora_adapter",
          // SGLang (the seed system's list and the rest of its control surface)
          "update_weights_from_disk", "update_weights_from_cpu", "update_weights_from_distributed",
          "update_weights_from_tensor", "update_weight_version", "init_weights_update_group",
          "destroy_weights_update_group", "stage_weight_update", "flush_cache", "pause_generation",
          "continue_generation", "abort_request", "release_memory_occupation",
          "resume_memory_occupation", "load_lora_adapter", "unload_lora_adapter",
          "start_expert_distribution_record", "stop_expert_distribution_record",
          "dump_expert_distribution_record", "configure_logging", "slow_down",
          "clear_hicache_storage_backend"};
}

void Sidecar::Impl::Health(httplib::Response& res) {
  auto applied = gate.applied();
  if (!applied) {
    ReplicaState s = State();
    Json j{{"ready", false},
           {"reason", s.reason.empty() ? "no version applied yet (sync_state " + s.sync_state + ")"
                                       : s.reason}};
    Reply(res, 503, j.dump(-1, ' ', false, Json::error_handler_t::replace));
    return;
  }
  Reply(res, 200, R"({"ready":true})");
}

void Sidecar::Impl::ServerInfo(httplib::Response& res) {
  ReplicaState s = State();
  auto applied = gate.applied();
  Json j;
  j["ready"] = applied.has_value();
  if (applied) {
    char identity[40];
    std::snprintf(identity, sizeof identity, "weight_v%06llu",
                  static_cast<unsigned long long>(*applied));
    j["applied"] = identity;
  } else {
    j["applied"] = nullptr;
  }
  j["sync_state"] = s.sync_state;
  j["reason"] = s.reason.empty() ? Json(nullptr) : Json(s.reason);
  j["member_stale"] = s.member_stale;
  j["superseded"] = s.superseded || (s.member_stale && s.stale_reason == "superseded");
  j["stale_reason"] = s.member_stale ? Json(s.stale_reason) : Json(nullptr);
  j["applied_version"] = applied ? Json(*applied) : Json(nullptr);
  j["head_version"] = gate.head();
  j["commit_mode"] = gate.mode() == CommitMode::kQuiesce ? "quiesce" : "in_place";
  j["active_requests"] = gate.in_flight();
  Reply(res, 200, j.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string Sidecar::Impl::RenderMetrics() const {
  auto gauge = [&](const char* name, const char* help, double v) {
    if (auto g = metrics.GetGauge(name, help); g.ok()) (*g)->Set(v);
  };
  auto applied = gate.applied();
  const uint64_t head = gate.head();
  gauge("tern_sidecar_applied_version", "Version this replica serves (0: none yet).",
        static_cast<double>(applied.value_or(0)));
  gauge("tern_sidecar_head_version", "Newest version the member knows.", static_cast<double>(head));
  gauge("tern_sidecar_staleness_versions", "Versions between the newest known and the served.",
        static_cast<double>(head - std::min(head, applied.value_or(0))));
  gauge("tern_sidecar_in_flight_requests", "Versioned requests admitted and not finished.",
        static_cast<double>(gate.in_flight()));
  return metrics.Render();
}

void Sidecar::Impl::Handle(const httplib::Request& req, httplib::Response& res) {
  const std::string path = NormalizePath(req.path);
  if (req.method == "GET" && path == "/health") return Health(res);
  if (req.method == "GET" && path == "/server_info") return ServerInfo(res);
  if (req.method == "GET" && path == "/metrics") {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4");
    return;
  }
  if (path == "/tern/commit/begin" || path == "/tern/commit/end") return CommitRoute(req, res, path);
  if (control.count(std::string_view(path).substr(1)) && !AdminAuthenticated(req))
    return Error(res, 403, "forbidden", "RouteBlocked", path + " is managed by the sidecar");
  if (req.method == "POST" && IsVersionedRoute(path)) return Versioned(req, res, path);
  Forward(req, res, path);
}

void Sidecar::Impl::CommitRoute(const httplib::Request& req, httplib::Response& res,
                                const std::string& path) {
  if (req.method != "POST")
    return Error(res, 405, "bad_request", "BadRequest", path + " takes POST");
  if (!AdminAuthenticated(req))
    return Error(res, 403, "forbidden", "RouteBlocked", path + " needs the admin token");
  const bool begin = path == "/tern/commit/begin";
  auto j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  uint64_t version = 0;
  uint64_t hold_ms = 0;
  bool loaded = false;
  bool ok = j.is_object();
  if (ok) {
    for (auto& [key, v] : j.items()) {
      if (key == "version" && v.is_number_unsigned()) {
        version = v.get<uint64_t>();
      } else if (begin && key == "hold_ms" && v.is_number_unsigned()) {
        hold_ms = v.get<uint64_t>();
      } else if (!begin && key == "loaded" && v.is_boolean()) {
        loaded = v.get<bool>();
      } else {
        ok = false;
      }
    }
  }
  if (!ok || version == 0 || (begin && hold_ms == 0))
    return Error(res, 400, "bad_request", "BadRequest",
                 begin ? "expected {\"version\": N > 0, \"hold_ms\": H > 0}"
                       : "expected {\"version\": N > 0, \"loaded\": true|false}");
  // A longer hold than the sidecar allows is cut to its bound: past it the
  // commit ends as not loaded and the follower reads the engine's version.
  hold_ms = std::min<uint64_t>(hold_ms, options.commit_hold_ms_max);
  Status s = begin ? commit->Begin(version, static_cast<uint32_t>(hold_ms))
                   : commit->End(version, loaded);
  if (!s.ok()) {
    const int code = s.code() == Code::kInvalidArgument ? 400
                     : s.code() == Code::kTimeout        ? 503
                                                         : 409;
    options.log("sidecar: " + s.ToString());
    return Error(res, code, "commit", "CommitRefused", s.message(), code != 400);
  }
  auto applied = gate.applied();
  Reply(res, 200, Json{{"applied", applied ? Json(*applied) : Json(nullptr)}}.dump());
}

Result<std::unique_ptr<Sidecar>> Sidecar::Start(SidecarOptions options, VersionGate& gate,
                                                std::function<ReplicaState()> state) {
  TERN_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(options.listen));
  TERN_REQUIRE(options.workers >= 1 && options.workers <= 4096, kInvalidArgument,
               "sidecar: workers must be 1..4096");
  TERN_REQUIRE(options.max_body_bytes >= 1024 && options.stream_buffer_bytes >= 4096 &&
                   options.max_response_bytes >= 4096 && options.client_timeout_ms >= 1,
               kInvalidArgument, "sidecar: bounds too small");
  TERN_REQUIRE(options.admin_token.size() <= 1024 && IsPrintable(options.admin_token),
               kInvalidArgument, "sidecar: admin token must be printable ASCII");
  if (!options.log) options.log = StderrLog();
  auto impl = std::make_unique<Impl>(std::move(options), gate, std::move(state));
  Impl* p = impl.get();
  TERN_ASSIGN_OR_RETURN(p->engine, EngineClient::Create(p->options.engine));
  p->commit = std::make_unique<CommitPoint>(gate, p->options.drain_timeout_ms,
                                            p->options.commit_hold_ms_max);
  for (const auto& r : p->options.control_routes) p->control.insert(NormalizePath(r).substr(1));

  auto& http = p->http;
  const uint32_t workers = p->options.workers;
  http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  http.set_payload_max_length(p->options.max_body_bytes);
  http.set_read_timeout(std::chrono::milliseconds(p->options.client_timeout_ms));
  http.set_write_timeout(std::chrono::milliseconds(p->options.client_timeout_ms));
  http.set_keep_alive_max_count(10000);
  http.set_tcp_nodelay(true);
  auto handler = [p](const httplib::Request& req, httplib::Response& res) { p->Handle(req, res); };
  http.Get(".*", handler);
  http.Post(".*", handler);
  http.Put(".*", handler);
  http.Delete(".*", handler);
  http.Patch(".*", handler);
  // httplib's own refusals (unparsable requests, bodies over the bound) get
  // a JSON body saying why; a handler's reply keeps its own.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([p](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string why = res.status == 413
                              ? "the request body is over the sidecar's max_body_bytes (" +
                                    std::to_string(p->options.max_body_bytes) + ")"
                          : res.status == 414 ? "the request URI is too long"
                          : res.status == 404 ? "no such route"
                                              : "the request is not HTTP/1.x the sidecar can parse";
        p->Refused(res.status == 413 ? "too_large" : "bad_request");
        res.set_content(ErrorBody(res.status == 413 ? "PayloadTooLarge" : "BadRequest", why, false),
                        kJson);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [p](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        p->Error(res, 500, "internal", "InternalError", "the sidecar failed on this request");
      });
  // httplib 0.11 listens with a backlog of 5: a burst of rollout clients
  // would overflow it (dropped handshakes, resets). The socket's fd is caught
  // as it is created and listen() is called again with a real backlog.
  int listen_fd = -1;
  http.set_socket_options([&listen_fd](int fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    listen_fd = fd;
  });
  int port = hp.port == 0 ? http.bind_to_any_port(hp.host)
                          : (http.bind_to_port(hp.host, hp.port) ? hp.port : -1);
  TERN_REQUIRE(port > 0, kIo, "sidecar: cannot listen on ", p->options.listen);
  if (listen_fd >= 0 && ::listen(listen_fd, 1024) != 0)
    return TERN_ERRNO("sidecar: listen backlog on ", p->options.listen);
  p->bound_address = (hp.host.find(':') != std::string::npos ? "[" + hp.host + "]" : hp.host) +
                     ":" + std::to_string(port);
  p->http_thread = std::thread([p] { p->http.listen_after_bind(); });
  // The port already queues connections; the wait only keeps an immediate
  // Stop from racing httplib's start (bounded: listen_after_bind may fail).
  for (int i = 0; i < 5000 && !p->http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<Sidecar>(new Sidecar(std::move(impl)));
}

Sidecar::Sidecar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sidecar::~Sidecar() { Stop(); }

std::string Sidecar::address() const { return impl_->bound_address; }
std::string Sidecar::MetricsText() const { return impl_->RenderMetrics(); }

void Sidecar::Stop() {
  std::call_once(impl_->stop_once, [&] {
    impl_->gate.Close();
    if (impl_->http_thread.joinable()) {
      impl_->http.stop();
      impl_->http_thread.join();
    }
  });
}

}  // namespace tern::agent

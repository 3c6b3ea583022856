#include "agent/sidecar/sidecar.h"

#include <httplib.h>
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "agent/ops/admin_http.h"
#include "agent/ops/metrics.h"
#include "agent/sidecar/request_lane.h"
#include "base/text.h"

namespace tern::agent {
namespace {

constexpr const char* kJson = "application/json";
constexpr const char* kAdminHeader = "X-Tern-Admin-Token";
// Versions whose per-version series stay in /metrics (older ones are dropped
// so that a long run does not grow the registry without bound).
constexpr uint64_t kVersionsKept = 16;

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

std::string EncodeQuery(const httplib::Params& params) {
  std::string out;
  auto encode = [&](const std::string& s) {
    static const char* hex = "0123456789ABCDEF";
    for (unsigned char c : s) {
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
        out += static_cast<char>(c);
      } else {
        out += '%';
        out += hex[c >> 4];
        out += hex[c & 15];
      }
    }
  };
  for (const auto& [k, v] : params) {
    out += out.empty() ? '?' : '&';
    encode(k);
    out += '=';
    encode(v);
  }
  return out;
}

bool HopByHop(std::string_view name) {
  static const std::set<std::string, std::less<>> kDrop = {
      "connection",     "keep-alive",  "transfer-encoding", "te",
      "trailer",        "upgrade",     "proxy-connection",  "proxy-authorization",
      "content-length", "host",        "accept-encoding",   "content-encoding",
      "remote_addr",    "remote_port", "local_addr",        "local_port"};
  std::string lower(name);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return kDrop.count(lower) > 0 || lower.starts_with("x-tern-");
}

HeaderList ForwardHeaders(const httplib::Headers& in) {
  HeaderList out;
  for (const auto& [k, v] : in)
    if (!HopByHop(k)) out.emplace_back(k, v);
  return out;
}

void CopyReplyHeaders(const EngineHead& head, httplib::Response& res) {
  for (const auto& [k, v] : head.headers)
    if (!HopByHop(k) && k != "Content-Type" && k != "content-type") res.set_header(k, v);
}

// The per-version prefix-cache key: a version's cached prefixes never serve
// another version's request.
void SaltForVersion(Json& body, bool generate_route, uint64_t version) {
  const char* key = generate_route ? "extra_key" : "cache_salt";
  std::string salt = "tern-v" + std::to_string(version);
  auto it = body.find(key);
  if (it != body.end() && it->is_string()) salt += ";" + it->get<std::string>();
  body[key] = salt;
}

// One streamed reply between the engine thread (producer) and the server's
// content provider (consumer), bounded by buffer_bytes.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  uint64_t buffered_bytes = 0;
  bool head_ready = false, done = false, cancelled = false;
  EngineHead head;
  Status result;
  CallCanceller canceller;
  std::thread engine_thread;
  std::optional<VersionGate::Ticket> ticket;

  void Cancel() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled = true;
    }
    cv.notify_all();
    canceller.Cancel();
  }
  void Join() {
    if (engine_thread.joinable()) engine_thread.join();
  }
};

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

struct Sidecar::Impl {
  SidecarOptions options;
  VersionGate& gate;
  std::function<ReplicaState()> state;
  std::unique_ptr<EngineClient> engine;
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

  void Health(httplib::Response& res) {
    auto applied = gate.applied();
    if (!applied) {
      ReplicaState s = State();
      Json j{
          {"ready", false},
          {"reason", s.reason.empty() ? "no version applied yet (sync_state " + s.sync_state + ")"
                                      : s.reason}};
      Reply(res, 503, j.dump(-1, ' ', false, Json::error_handler_t::replace));
      return;
    }
    Reply(res, 200, R"({"ready":true})");
  }

  void ServerInfo(httplib::Response& res) {
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
    j["applied_version"] = applied ? Json(*applied) : Json(nullptr);
    j["head_version"] = gate.head();
    j["commit_mode"] = gate.mode() == CommitMode::kQuiesce ? "quiesce" : "in_place";
    j["active_requests"] = gate.in_flight();
    Reply(res, 200, j.dump(-1, ' ', false, Json::error_handler_t::replace));
  }

  std::string RenderMetrics() const {
    auto gauge = [&](const char* name, const char* help, double v) {
      if (auto g = metrics.GetGauge(name, help); g.ok()) (*g)->Set(v);
    };
    auto applied = gate.applied();
    const uint64_t head = gate.head();
    gauge("tern_sidecar_applied_version", "Version this replica serves (0: none yet).",
          static_cast<double>(applied.value_or(0)));
    gauge("tern_sidecar_head_version", "Newest version the member knows.",
          static_cast<double>(head));
    gauge("tern_sidecar_staleness_versions", "Versions between the newest known and the served.",
          static_cast<double>(head - std::min(head, applied.value_or(0))));
    gauge("tern_sidecar_in_flight_requests", "Versioned requests admitted and not finished.",
          static_cast<double>(gate.in_flight()));
    return metrics.Render();
  }

  bool AdminAuthenticated(const httplib::Request& req) const {
    if (options.admin_token.empty() || !req.has_header(kAdminHeader)) return false;
    return SecretEquals(options.admin_token, req.get_header_value(kAdminHeader));
  }

  void Handle(const httplib::Request& req, httplib::Response& res);
  void Forward(const httplib::Request& req, httplib::Response& res, const std::string& path);
  void Versioned(const httplib::Request& req, httplib::Response& res, const std::string& path);
  void WholeReply(httplib::Response& res, const std::string& path, HeaderList headers,
                  std::string body, std::optional<VersionGate::Ticket> ticket);
  void Streamed(httplib::Response& res, const std::string& path, HeaderList headers,
                std::string body, VersionGate::Ticket ticket);
};

void Sidecar::Impl::Handle(const httplib::Request& req, httplib::Response& res) {
  const std::string path = NormalizePath(req.path);
  if (req.method == "GET" && path == "/health") return Health(res);
  if (req.method == "GET" && path == "/server_info") return ServerInfo(res);
  if (req.method == "GET" && path == "/metrics") {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4");
    return;
  }
  if (control.count(std::string_view(path).substr(1)) && !AdminAuthenticated(req))
    return Error(res, 403, "forbidden", "RouteBlocked", path + " is managed by the sidecar");
  if (req.method == "POST" && IsVersionedRoute(path)) return Versioned(req, res, path);
  Forward(req, res, path);
}

// Unversioned: forwarded as is, the whole reply passed back.
void Sidecar::Impl::Forward(const httplib::Request& req, httplib::Response& res,
                            const std::string& path) {
  EngineHead head;
  std::string body;
  bool too_big = false;
  Status s = engine->Call(
      req.method, path + EncodeQuery(req.params), ForwardHeaders(req.headers), req.body,
      [&](const EngineHead& h) {
        head = h;
        return true;
      },
      [&](std::string_view piece) {
        if (body.size() + piece.size() > options.max_response_bytes) return !(too_big = true);
        body.append(piece);
        return true;
      });
  if (too_big)
    return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                 "the engine's reply is over the sidecar's max_response_bytes");
  if (!s.ok()) return EngineUnavailable(res, s);
  CopyReplyHeaders(head, res);
  res.status = head.status;
  res.set_content(std::move(body), head.content_type.empty() ? "text/plain" : head.content_type);
}

void Sidecar::Impl::Versioned(const httplib::Request& req, httplib::Response& res,
                              const std::string& path) {
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object())
    return Error(res, 400, "bad_request", "BadRequest",
                 body.is_discarded() ? "the request body is not valid JSON"
                                     : "the request body must be a JSON object");
  auto lane = TakeConstraint(body);
  if (lane.ok())
    lane = WithHeaders(*lane, req.get_header_value("X-Tern-Min-Version"),
                       req.get_header_value("X-Tern-Max-Staleness"), gate.head());
  if (!lane.ok()) return Error(res, 400, "bad_request", "BadRequest", lane.status().message());

  VersionGate::Admission admission = gate.Admit(*lane, options.catchup_wait_ms);
  if (admission.waited)
    Count("tern_sidecar_catchup_waits_total",
          "Requests that waited for their version to be applied.", {});
  if (!admission.ticket) {
    Refused("not_ready");
    res.set_header("Retry-After", "1");
    return Reply(res, 409, NotReadyBody(*lane, admission.applied));
  }
  const uint64_t start = admission.ticket->start_version();
  CountServed(path, start);
  if (options.cache_salt) SaltForVersion(body, path == "/generate", start);
  const bool stream = body.value("stream", false) == true;
  std::string forwarded = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  HeaderList headers = ForwardHeaders(req.headers);
  headers.emplace_back("Content-Type", kJson);
  res.set_header("X-Tern-Version", std::to_string(start));
  if (stream)
    return Streamed(res, path, std::move(headers), std::move(forwarded),
                    std::move(*admission.ticket));
  WholeReply(res, path, std::move(headers), std::move(forwarded), std::move(admission.ticket));
}

void Sidecar::Impl::WholeReply(httplib::Response& res, const std::string& path, HeaderList headers,
                               std::string body, std::optional<VersionGate::Ticket> ticket) {
  EngineHead head;
  std::string reply;
  bool too_big = false;
  Status s = engine->Call(
      "POST", path, headers, std::move(body),
      [&](const EngineHead& h) {
        head = h;
        return true;
      },
      [&](std::string_view piece) {
        if (reply.size() + piece.size() > options.max_response_bytes) return !(too_big = true);
        reply.append(piece);
        return true;
      });
  const uint64_t start = ticket->start_version();
  // The end version is read while the request still holds its ticket: in
  // place, a commit may have moved it; quiesced, it cannot have.
  const uint64_t end = gate.SettledVersion().value_or(start);
  ticket.reset();
  if (too_big)
    return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                 "the engine's reply is over the sidecar's max_response_bytes");
  if (!s.ok()) return EngineUnavailable(res, s);
  CopyReplyHeaders(head, res);
  res.status = head.status;
  res.set_header("X-Tern-Version-End", std::to_string(end));
  if (head.status / 100 == 2 && head.content_type.find("json") != std::string::npos) {
    Json j = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      StampResponse(j, start, end);
      return res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), kJson);
    }
  }
  res.set_content(std::move(reply), head.content_type.empty() ? "text/plain" : head.content_type);
}

void Sidecar::Impl::Streamed(httplib::Response& res, const std::string& path, HeaderList headers,
                             std::string body, VersionGate::Ticket ticket) {
  auto st = std::make_shared<Stream>();
  st->ticket.emplace(std::move(ticket));
  const uint64_t limit = options.stream_buffer_bytes;
  st->engine_thread = std::thread(
      [this, st, path, headers = std::move(headers), body = std::move(body), limit]() mutable {
        Status s = engine->Call(
            "POST", path, headers, std::move(body),
            [&](const EngineHead& h) {
              std::lock_guard<std::mutex> lock(st->mu);
              st->head = h;
              st->head_ready = true;
              st->cv.notify_all();
              return !st->cancelled;
            },
            [&](std::string_view piece) {
              std::unique_lock<std::mutex> lock(st->mu);
              st->cv.wait(lock, [&] { return st->cancelled || st->buffered_bytes < limit; });
              if (st->cancelled) return false;
              st->pieces.emplace_back(piece);
              st->buffered_bytes += piece.size();
              st->cv.notify_all();
              return true;
            },
            &st->canceller);
        std::lock_guard<std::mutex> lock(st->mu);
        st->result = std::move(s);
        st->done = true;
        st->cv.notify_all();
      });

  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait(lock, [&] { return st->head_ready || st->done; });
  const bool is_stream = st->head_ready && st->head.status == 200 &&
                         st->head.content_type.find("text/event-stream") != std::string::npos;
  if (!is_stream) {
    // An error reply (or an engine that did not stream): passed back whole.
    st->cv.wait(lock, [&] {
      return st->done || st->buffered_bytes >= std::min(limit, options.max_response_bytes);
    });
    const bool overflow = !st->done;
    lock.unlock();
    if (overflow) st->Cancel();
    st->Join();
    st->ticket.reset();
    if (overflow)
      return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                   "the engine's unstreamed reply is over the sidecar's stream buffer");
    if (!st->head_ready) return EngineUnavailable(res, st->result);
    std::string reply;
    for (auto& p : st->pieces) reply += p;
    CopyReplyHeaders(st->head, res);
    res.status = st->head.status;
    return res.set_content(std::move(reply),
                           st->head.content_type.empty() ? "text/plain" : st->head.content_type);
  }
  CopyReplyHeaders(st->head, res);
  lock.unlock();
  res.status = 200;
  auto stamper = std::make_shared<EventStamper>(st->ticket->start_version(), path == "/generate");
  res.set_chunked_content_provider(
      st->head.content_type,
      [this, st, stamper](size_t, httplib::DataSink& sink) {
        std::deque<std::string> pieces;
        bool done;
        Status result;
        {
          std::unique_lock<std::mutex> lock(st->mu);
          st->cv.wait(lock, [&] { return !st->pieces.empty() || st->done; });
          pieces.swap(st->pieces);
          st->buffered_bytes = 0;
          done = st->done;
          if (done) result = st->result;
          st->cv.notify_all();
        }
        std::string out;
        const uint64_t end = gate.SettledVersion().value_or(st->ticket->start_version());
        for (const auto& p : pieces) stamper->Feed(p, end, out);
        if (done) stamper->Flush(out);
        if (done && !result.ok()) {
          Refused("engine_unavailable");
          out += "data: " +
                 ErrorBody("EngineUnavailable", "the local inference engine stopped mid-stream",
                           true) +
                 "\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          Count("tern_sidecar_client_aborts_total",
                "Streams whose client went away (the engine request was closed).", {});
          st->Cancel();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [st](bool) {
        st->Cancel();
        st->Join();
        st->ticket.reset();
      });
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
  while (!p->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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

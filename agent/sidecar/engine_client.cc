#include "agent/sidecar/engine_client.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <iterator>

namespace tern::agent {

Result<std::unique_ptr<EngineClient>> EngineClient::Create(EngineOptions options) {
  std::string_view url = options.url;
  TERN_REQUIRE(url.starts_with("http://"), kInvalidArgument,
               "sidecar: engine URL must be http://HOST:PORT, not ", url);
  url.remove_prefix(7);
  while (url.ends_with('/')) url.remove_suffix(1);
  size_t colon = url.rfind(':');
  TERN_REQUIRE(
      colon != std::string_view::npos && colon > 0 && url.find('/') == std::string_view::npos,
      kInvalidArgument, "sidecar: engine URL must be http://HOST:PORT, not ", options.url);
  int port = 0;
  std::string_view port_text = url.substr(colon + 1);
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  TERN_REQUIRE(
      ec == std::errc() && end == port_text.data() + port_text.size() && port > 0 && port < 65536,
      kInvalidArgument, "sidecar: bad port in engine URL ", options.url);
  std::string host(url.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return std::unique_ptr<EngineClient>(new EngineClient(std::move(options), std::move(host), port));
}

EngineClient::EngineClient(EngineOptions options, std::string host, int port)
    : options_(std::move(options)), host_(std::move(host)), port_(port) {}

EngineClient::~EngineClient() = default;

std::unique_ptr<httplib::Client> EngineClient::Take(bool* reused) {
  std::vector<Idle> expired;  // closed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto oldest = std::chrono::steady_clock::now() -
                        std::chrono::milliseconds(options_.idle_ms_max);
    auto fresh = std::find_if(idle_.begin(), idle_.end(),
                              [&](const Idle& i) { return i.since >= oldest; });
    expired.assign(std::make_move_iterator(idle_.begin()), std::make_move_iterator(fresh));
    idle_.erase(idle_.begin(), fresh);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back().client);
      idle_.pop_back();
      *reused = true;
      return c;
    }
  }
  *reused = false;
  return NewClient();
}

std::unique_ptr<httplib::Client> EngineClient::NewClient() {
  auto c = std::make_unique<httplib::Client>(host_, port_);
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);
  c->set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
  c->set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  c->set_write_timeout(std::chrono::milliseconds(options_.connect_timeout_ms * 5));
  c->set_decompress(false);
  return c;
}

void EngineClient::Give(std::unique_ptr<httplib::Client> client) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < options_.max_idle)
    idle_.push_back(Idle{std::move(client), std::chrono::steady_clock::now()});
}

void CallCanceller::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (client_) client_->stop();
}

Status EngineClient::Call(std::string_view method, std::string_view path_and_query,
                          const HeaderList& headers, std::string body,
                          const std::function<bool(const EngineHead&)>& on_head,
                          const std::function<bool(std::string_view)>& on_body,
                          CallCanceller* canceller) {
  bool reused = false;
  auto client = Take(&reused);
  for (;;) {
    if (canceller) {
      std::lock_guard<std::mutex> lock(canceller->mu_);
      if (canceller->cancelled_) return Status(Code::kCancelled, "sidecar: call cancelled");
      canceller->client_ = client.get();
    }
    httplib::Request req;
    req.method = std::string(method);
    req.path = std::string(path_and_query);
    for (const auto& [k, v] : headers) req.headers.emplace(k, v);
    req.body = body;
    bool abandoned = false;
    bool head_seen = false;
    req.response_handler = [&](const httplib::Response& r) {
      head_seen = true;
      EngineHead head;
      head.status = r.status;
      for (const auto& [k, v] : r.headers) head.headers.emplace_back(k, v);
      head.content_type = r.get_header_value("Content-Type");
      if (!on_head(head)) abandoned = true;
      return !abandoned;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (!on_body(std::string_view(data, n))) abandoned = true;
      return !abandoned;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    const bool ok = client->send(req, res, error);
    bool cancelled = false;
    if (canceller) {
      std::lock_guard<std::mutex> lock(canceller->mu_);
      canceller->client_ = nullptr;
      cancelled = canceller->cancelled_;
    }
    if (cancelled) return Status(Code::kCancelled, "sidecar: call cancelled");
    if (ok) {
      Give(std::move(client));
      return Status::Ok();
    }
    if (abandoned) return Status(Code::kCancelled, "sidecar: reply abandoned");
    if (reused && !head_seen) {
      // A pooled connection the engine closed as the request went out;
      // nothing reached the client yet: once more, on a new connection.
      client = NewClient();
      reused = false;
      continue;
    }
    return TERN_ERROR(kUnavailable, "engine ", host_, ":", port_, ": ", httplib::to_string(error));
  }
}

}  // namespace tern::agent

#include "agent/engine/commit_point_double.h"

#include <httplib.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace tern::agent::testing {

struct CommitPointDouble::Impl {
  std::string token;
  Answer answer;
  httplib::Server http;
  std::thread thread;
  int port = 0;
  mutable std::mutex mu;
  std::vector<Call> calls;
  uint64_t refused = 0;
};

CommitPointDouble::CommitPointDouble(std::string token, Answer answer) : impl_(new Impl) {
  Impl* p = impl_.get();
  p->token = std::move(token);
  p->answer = std::move(answer);
  auto handler = [p](const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("X-Tern-Admin-Token") != p->token) {
      std::lock_guard<std::mutex> lock(p->mu);
      ++p->refused;
      res.status = 403;
      return;
    }
    auto j = nlohmann::json::parse(req.body, nullptr, false);
    Call c;
    c.begin = req.path == "/tern/commit/begin";
    if (!j.is_object() || !j.contains("version") || !j["version"].is_number_unsigned() ||
        (c.begin ? !j.contains("hold_ms") : !j.contains("loaded"))) {
      res.status = 400;
      return;
    }
    c.version = j["version"];
    if (!c.begin) c.loaded = j["loaded"];
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->calls.push_back(c);
    }
    res.status = p->answer ? p->answer(c) : 200;
    res.set_content(R"({"applied":null})", "application/json");
  };
  p->http.Post("/tern/commit/begin", handler);
  p->http.Post("/tern/commit/end", handler);
  p->port = p->http.bind_to_any_port("127.0.0.1");
  p->thread = std::thread([p] { p->http.listen_after_bind(); });
  for (int i = 0; i < 5000 && !p->http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

CommitPointDouble::~CommitPointDouble() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string CommitPointDouble::address() const {
  return "127.0.0.1:" + std::to_string(impl_->port);
}

std::vector<CommitPointDouble::Call> CommitPointDouble::calls() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->calls;
}

uint64_t CommitPointDouble::refused_tokens() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->refused;
}

}  // namespace tern::agent::testing

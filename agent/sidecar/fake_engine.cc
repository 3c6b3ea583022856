#include "agent/sidecar/fake_engine.h"

#include <httplib.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace tern::agent::testing {

struct FakeEngine::Impl {
  httplib::Server http;
  std::thread thread;
  int port = 0;
  mutable std::mutex mu;
  std::string last_body;
  std::vector<std::string> routes;
};

FakeEngine::FakeEngine() : impl_(std::make_unique<Impl>()) {
  auto& http = impl_->http;
  http.new_task_queue = [] { return new httplib::ThreadPool(96); };
  auto generate = [this](const httplib::Request& req, httplib::Response& res) {
    ++requests;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->last_body = req.body;
    }
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      res.status = 400;
      res.set_content(R"({"error":"bad json"})", "application/json");
      return;
    }
    const bool gen = req.path == "/generate";
    if (body.contains("stream") && body["stream"] == true) {
      const uint64_t tokens = body.value("max_tokens", 4);
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, tokens, gen, i = uint64_t{0}](size_t, httplib::DataSink& sink) mutable {
            if (i > 0 && delay_ms.load() > 0)
              std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
            std::string event;
            if (i < tokens) {
              nlohmann::json e =
                  gen ? nlohmann::json{{"text", "t"},
                                       {"meta_info", {{"engine_version", version.load()}}}}
                      : nlohmann::json{{"id", "cmpl-1"},
                                       {"choices", {{{"index", 0}, {"text", "t"}}}},
                                       {"engine_version", version.load()}};
              event = "data: " + e.dump() + "\n\n";
            } else {
              event = "data: [DONE]\n\n";
            }
            if (!sink.write(event.data(), event.size())) {
              ++streams_cut;
              return false;
            }
            if (i++ >= tokens) sink.done();
            return true;
          });
      return;
    }
    const uint64_t v0 = version.load();
    if (delay_ms.load() > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    const uint64_t v1 = version.load();
    nlohmann::json reply;
    if (gen) {
      reply = {{"text", "ok"},
               {"meta_info", {{"engine_version_start", v0}, {"engine_version_end", v1}}}};
    } else {
      reply = {{"id", "cmpl-1"},
               {"object", req.path == "/v1/completions" ? "text_completion" : "chat.completion"},
               {"choices", {{{"index", 0}, {"text", "ok"}}}},
               {"engine_version_start", v0},
               {"engine_version_end", v1}};
    }
    res.set_content(reply.dump(), "application/json");
  };
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/generate"})
    http.Post(route, generate);
  http.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object":"list","data":[{"id":"fake"}]})", "application/json");
  });
  auto other = [this](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->routes.push_back(req.path);
    }
    res.set_content(nlohmann::json{{"route", req.path}}.dump(), "application/json");
  };
  http.Get(".*", other);
  http.Post(".*", other);
  int listen_fd = -1;  // httplib 0.11's backlog is 5 (sidecar.cc says why that matters)
  http.set_socket_options([&listen_fd](int fd) { listen_fd = fd; });
  http.set_keep_alive_timeout(1);
  http.set_tcp_nodelay(true);  // as uvicorn (vLLM, SGLang) does
  impl_->port = http.bind_to_any_port("127.0.0.1");
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

FakeEngine::~FakeEngine() { Stop(); }

void FakeEngine::Stop() {
  if (impl_->thread.joinable()) {
    impl_->http.stop();
    impl_->thread.join();
  }
}

std::string FakeEngine::url() const { return "http://127.0.0.1:" + std::to_string(impl_->port); }
int FakeEngine::port() const { return impl_->port; }

std::string FakeEngine::last_body() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_body;
}

std::vector<std::string> FakeEngine::routes_seen() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->routes;
}

}  // namespace tern::agent::testing

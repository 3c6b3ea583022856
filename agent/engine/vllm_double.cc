#include "agent/engine/vllm_double.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace tern::agent::testing {

struct VllmDouble::Impl {
  httplib::Server http;
  std::thread thread;
  std::thread killer;  // stops the server for Fault::kDie; joined by Stop
  int port = 0;
  mutable std::mutex mu;
  std::condition_variable stopping_cv;
  bool stopping = false;
  uint64_t hangs_ended = 0;  // EndHangs() calls
  std::map<std::string, std::pair<Fault, uint32_t>> faults;
  std::string weight_version = "default";
  bool initialized = false;
  bool paused = false;
  bool session = false;
  std::string pause_mode;
  std::string last_update_info;
  std::string last_init_info;
  uint64_t updates_loaded = 0;
  std::vector<std::string> routes;
};

namespace {

void Error(httplib::Response& res, const std::string& message, int status = 500) {
  res.status = status;
  res.set_content(nlohmann::json{{"error",
                                  {{"message", message},
                                   {"type", "InternalServerError"},
                                   {"param", nullptr},
                                   {"code", status}}}}
                      .dump(),
                  "application/json");
}

void Ok(httplib::Response& res, const nlohmann::json& body) {
  res.set_content(body.dump(), "application/json");
}

}  // namespace

VllmDouble::VllmDouble() : impl_(std::make_unique<Impl>()) {
  auto& http = impl_->http;
  http.new_task_queue = [] { return new httplib::ThreadPool(8); };
  // Every route goes through here: log it, apply an injected fault, then
  // run the route's rule under the lock.
  auto route = [this](const char* method, const std::string& path, auto rule) {
    return [this, method, path, rule](const httplib::Request& req, httplib::Response& res) {
      std::unique_lock<std::mutex> lock(impl_->mu);
      impl_->routes.push_back(std::string(method) + " " + path);
      auto f = impl_->faults.find(path);
      if (f != impl_->faults.end() && f->second.second > 0) {
        const Fault fault = f->second.first;
        if (--f->second.second == 0) impl_->faults.erase(f);
        switch (fault) {
          case Fault::kFail:
            if (path == "/update_weights") impl_->session = false;
            Error(res,
                  "Call to collective_rpc method failed: Worker failed with error "
                  "'double: injected failure'");
            return;
          case Fault::kBadUpdate:
            if (path == "/update_weights") impl_->session = false;
            Error(res,
                  "Call to collective_rpc method failed: Worker failed with error "
                  "'tern: bad update: double: tensor x is missing'");
            return;
          case Fault::kHang: {
            const uint64_t ended = impl_->hangs_ended;
            impl_->stopping_cv.wait_for(lock, std::chrono::milliseconds(hang_ms.load()), [&] {
              return impl_->stopping || impl_->hangs_ended != ended;
            });
            break;  // then answer as usual, as a slow engine does
          }
          case Fault::kDie:
            // The reply is cut (a provider that gives up closes the
            // connection) and the port closes behind it.
            impl_->stopping = true;
            if (!impl_->killer.joinable())
              impl_->killer = std::thread([this] { impl_->http.stop(); });
            res.set_content_provider(1 << 20, "application/json",
                                     [](size_t, size_t, httplib::DataSink&) { return false; });
            return;
        }
      }
      rule(req, res);
    };
  };
  http.Get("/weight_info",
           route("GET", "/weight_info", [this](const httplib::Request&, httplib::Response& res) {
             Ok(res, {{"weight_version", impl_->weight_version}});
           }));
  http.Get("/is_paused",
           route("GET", "/is_paused", [this](const httplib::Request&, httplib::Response& res) {
             Ok(res, {{"is_paused", impl_->paused}});
           }));
  http.Post("/init_weight_transfer_engine",
            route("POST", "/init_weight_transfer_engine",
                  [this](const httplib::Request& req, httplib::Response& res) {
                    auto j = nlohmann::json::parse(req.body, nullptr, false);
                    if (!j.is_object() || !j.contains("init_info") || !j["init_info"].is_object() ||
                        !j["init_info"].contains("root") || !j["init_info"]["root"].is_string())
                      return Error(res, "double: init_info.root missing");
                    impl_->last_init_info = j["init_info"].dump();
                    impl_->initialized = true;
                    Ok(res, {{"message", "Weight transfer initialized"}});
                  }));
  http.Post("/pause",
            route("POST", "/pause", [this](const httplib::Request& req, httplib::Response& res) {
              const std::string mode =
                  req.has_param("mode") ? req.get_param_value("mode") : "abort";
              if (mode != "keep" && mode != "wait" && mode != "abort")
                return Error(res, "bad mode", 422);
              impl_->pause_mode = mode;
              impl_->paused = true;
              Ok(res, {{"status", "paused"}});
            }));
  http.Post("/resume",
            route("POST", "/resume", [this](const httplib::Request&, httplib::Response& res) {
              impl_->paused = false;
              Ok(res, {{"status", "resumed"}});
            }));
  http.Post("/start_weight_update",
            route("POST", "/start_weight_update",
                  [this](const httplib::Request&, httplib::Response& res) {
                    if (!impl_->initialized) return Error(res, "tern: not initialized");
                    if (impl_->session)
                      return Error(res,
                                   "start_weight_update called while a weight update is "
                                   "already active");
                    impl_->session = true;
                    Ok(res, {{"message", "Weight update started"}});
                  }));
  http.Post(
      "/update_weights",
      route("POST", "/update_weights", [this](const httplib::Request& req, httplib::Response& res) {
        if (!impl_->session)
          return Error(res, "start_weight_update must be called before update_weights.");
        auto j = nlohmann::json::parse(req.body, nullptr, false);
        if (!j.is_object() || !j.contains("update_info")) {
          impl_->session = false;
          return Error(res, "update_info missing", 422);
        }
        impl_->last_update_info = j["update_info"].dump();
        ++impl_->updates_loaded;
        Ok(res, {{"message", "Weights updated"}});
      }));
  http.Post(
      "/finish_weight_update",
      route("POST", "/finish_weight_update",
            [this](const httplib::Request& req, httplib::Response& res) {
              if (!impl_->session)
                return Error(res,
                             "finish_weight_update called without a matching "
                             "start_weight_update.");
              auto j = nlohmann::json::parse(req.body, nullptr, false);
              impl_->session = false;
              if (j.is_object() && j.contains("weight_version") && j["weight_version"].is_string())
                impl_->weight_version = j["weight_version"].get<std::string>();
              Ok(res, {{"message", "Weight update finished"}});
            }));
  http.Post("/reset_prefix_cache", route("POST", "/reset_prefix_cache",
                                         [this](const httplib::Request&, httplib::Response& res) {
                                           Ok(res, {{"success", !cache_busy.load()}});
                                         }));
  impl_->port = http.bind_to_any_port("127.0.0.1");
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

VllmDouble::~VllmDouble() { Stop(); }

void VllmDouble::EndHangs() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->hangs_ended;
  }
  impl_->stopping_cv.notify_all();
}

void VllmDouble::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->stopping_cv.notify_all();
  if (impl_->killer.joinable()) impl_->killer.join();
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string VllmDouble::url() const { return "http://127.0.0.1:" + std::to_string(impl_->port); }

void VllmDouble::Inject(const std::string& route, Fault fault, uint32_t times) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->faults[route] = {fault, times};
}

std::string VllmDouble::weight_version() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->weight_version;
}
void VllmDouble::set_weight_version(const std::string& v) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->weight_version = v;
}
bool VllmDouble::paused() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->paused;
}
bool VllmDouble::session_open() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session;
}
std::string VllmDouble::pause_mode() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->pause_mode;
}
std::string VllmDouble::last_update_info() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_update_info;
}
std::string VllmDouble::last_init_info() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last_init_info;
}
uint64_t VllmDouble::updates_loaded() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->updates_loaded;
}
std::vector<std::string> VllmDouble::routes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->routes;
}

}  // namespace tern::agent::testing

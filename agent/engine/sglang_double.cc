#include "agent/engine/sglang_double.h"

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace tern::agent::testing {

struct SglangDouble::Impl {
  httplib::Server http;
  std::thread thread;
  std::thread killer;  // stops the server when it dies; joined by Stop
  int port = 0;
  bool legacy = false;
  Mutex mu;
  CondVar stopping_cv{&mu};
  bool stopping GUARDED_BY(mu) = false;
  bool dead GUARDED_BY(mu) = false;
  uint32_t hang_ms GUARDED_BY(mu) = 5000;
  std::map<std::string, std::pair<SglangFault, uint32_t>> faults GUARDED_BY(mu);
  std::string weight_version GUARDED_BY(mu) = "default";
  std::string model_path GUARDED_BY(mu) = "/models/initial";
  uint32_t running GUARDED_BY(mu) = 0;
  uint32_t waiting GUARDED_BY(mu) = 0;
  bool paused GUARDED_BY(mu) = false;
  std::string pause_mode GUARDED_BY(mu);
  std::string last_update GUARDED_BY(mu);
  uint64_t updates_loaded GUARDED_BY(mu) = 0;
  uint64_t drains GUARDED_BY(mu) = 0;
  uint64_t cache_flushes GUARDED_BY(mu) = 0;
  std::vector<std::string> routes GUARDED_BY(mu);

  // SGLang's flush: refused while requests run (in_place) or wait outside
  // a retract pause.
  bool Flush() REQUIRES(mu) {
    if (running > 0 || (waiting > 0 && pause_mode != "retract")) return false;
    ++cache_flushes;
    return true;
  }
  // The engine dies: the reply is cut and the port closes behind it.
  void Die(httplib::Response& res) REQUIRES(mu) {
    dead = true;
    stopping = true;
    if (!killer.joinable()) killer = std::thread([this] { http.stop(); });
    res.set_content_provider(1 << 20, "application/json",
                             [](size_t, size_t, httplib::DataSink&) { return false; });
  }
};

namespace {

// FastAPI's answer to a body that does not validate, which SGLang turns
// into 400 (http_server.py, validation_exception_handler).
void BadRequest(httplib::Response& res, const std::string& message) {
  res.status = 400;
  res.set_content(nlohmann::json{{"object", "error"},
                                 {"message", message},
                                 {"type", "Bad Request"},
                                 {"param", nullptr},
                                 {"code", 400}}
                      .dump(),
                  "application/json");
}

void Json(httplib::Response& res, const nlohmann::json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

}  // namespace

SglangDouble::SglangDouble(bool legacy) : impl_(std::make_unique<Impl>()) {
  impl_->legacy = legacy;
  auto& http = impl_->http;
  http.new_task_queue = [] { return new httplib::ThreadPool(8); };
  Impl* d = impl_.get();
  // Every route goes through here: log it, apply an injected fault, then
  // run the route's rule under the lock.
  auto route = [d](const char* method, const std::string& path, auto rule) {
    return [d, method, path, rule](const httplib::Request& req, httplib::Response& res) {
      MutexLock lock(d->mu);
      d->routes.push_back(std::string(method) + " " + path);
      auto f = d->faults.find(path);
      if (f != d->faults.end() && f->second.second > 0) {
        const SglangFault fault = f->second.first;
        if (--f->second.second == 0) d->faults.erase(f);
        switch (fault) {
          case SglangFault::kFail:
            if (path == "/update_weights_from_disk")
              return Json(res,
                          {{"success", false},
                           {"message",
                            "Failed to update weights: double: injected failure.\n"
                            "Rolling back to original weights."},
                           {"num_paused_requests", 0}},
                          400);
            return Json(res, {{"error", {{"message", "double: injected failure"}}}}, 500);
          case SglangFault::kHang: {
            const auto until =
                std::chrono::steady_clock::now() + std::chrono::milliseconds(d->hang_ms);
            d->stopping_cv.WaitUntil(until, [d]() REQUIRES(d->mu) { return d->stopping; });
            if (d->stopping) return;  // Stop: no reply
            break;                    // then answer as usual, as a slow engine does
          }
          case SglangFault::kDie:
            return d->Die(res);
        }
      }
      rule(req, res);
    };
  };
  auto model_info = [d](const httplib::Request&, httplib::Response& res) NO_THREAD_SAFETY_ANALYSIS {
    Json(res, {{"model_path", d->model_path},
               {"tokenizer_path", d->model_path},
               {"is_generation", true},
               {"preferred_sampling_params", nullptr},
               {"weight_version", d->weight_version}});
  };
  if (!legacy) http.Get("/model_info", route("GET", "/model_info", model_info));
  http.Get("/get_model_info", route("GET", "/get_model_info", model_info));
  http.Get("/get_weight_version",
           route("GET", "/get_weight_version", [](const httplib::Request&, httplib::Response& res) {
             Json(res,
                  {{"object", "error"},
                   {"message",
                    "Endpoint '/get_weight_version' or '/weight_version' is deprecated. "
                    "Please use '/model_info' instead."},
                   {"type", "404"},
                   {"code", 404}},
                  404);
           }));
  http.Post("/pause_generation",
            route("POST", "/pause_generation",
                  [d](const httplib::Request& req, httplib::Response& res)
                      NO_THREAD_SAFETY_ANALYSIS {
                        auto j = nlohmann::json::parse(req.body, nullptr, false);
                        if (!j.is_object()) return BadRequest(res, "body is not a JSON object");
                        const nlohmann::json mode = j.value("mode", nlohmann::json("abort"));
                        if (!mode.is_string() ||
                            (mode != "abort" && mode != "retract" && mode != "in_place"))
                          return BadRequest(res, "mode: Input should be 'abort', 'retract' or "
                                                 "'in_place'");
                        d->pause_mode = mode.get<std::string>();
                        d->paused = true;
                        if (d->pause_mode == "abort") {
                          d->running = 0;
                          d->waiting = 0;
                        } else if (d->pause_mode == "retract") {
                          d->waiting += d->running;
                          d->running = 0;
                        }
                        Json(res, {{"message", "Generation paused successfully."},
                                   {"status", "ok"}});
                      }));
  http.Post("/continue_generation",
            route("POST", "/continue_generation",
                  [d](const httplib::Request&, httplib::Response& res) NO_THREAD_SAFETY_ANALYSIS {
                    d->paused = false;
                    d->running += d->waiting;  // retracted requests run again
                    d->waiting = 0;
                    Json(res, {{"message", "Generation continued successfully."},
                               {"status", "ok"}});
                  }));
  http.Post(
      "/update_weights_from_disk",
      route("POST", "/update_weights_from_disk",
            [d](const httplib::Request& req, httplib::Response& res) NO_THREAD_SAFETY_ANALYSIS {
              auto j = nlohmann::json::parse(req.body, nullptr, false);
              if (!j.is_object()) return BadRequest(res, "body is not a JSON object");
              if (!j.contains("model_path") || !j["model_path"].is_string())
                return BadRequest(res, "model_path: Field required");
              if (j.contains("weight_version") && !j["weight_version"].is_null() &&
                  !j["weight_version"].is_string())
                return BadRequest(res, "weight_version: Input should be a valid string");
              for (const char* flag : {"flush_cache", "abort_all_requests"})
                if (j.contains(flag) && !j[flag].is_boolean())
                  return BadRequest(res, std::string(flag) + ": Input should be a valid boolean");
              d->last_update = j.dump();
              if (j.value("abort_all_requests", false)) {
                d->running = 0;
                d->waiting = 0;
              }
              if (!d->paused && d->running + d->waiting > 0) {
                // The writer lock waits for the requests in flight.
                ++d->drains;
                d->running = 0;
                d->waiting = 0;
              }
              const std::string path = j["model_path"].get<std::string>();
              std::error_code ec;
              if (!std::filesystem::is_directory(path, ec))
                return Json(res,
                            {{"success", false},
                             {"message", "Failed to get weights iterator: no such directory " +
                                             path + "."},
                             {"num_paused_requests", 0}},
                            400);
              // The scheduler asserts that its post-update flush succeeded.
              if (j.value("flush_cache", true) && !d->Flush()) return d->Die(res);
              d->model_path = path;
              ++d->updates_loaded;
              std::string message = "Succeeded to update model weights.";
              if (j.contains("weight_version") && j["weight_version"].is_string()) {
                d->weight_version = j["weight_version"].get<std::string>();
                message += " Weight version updated to " + d->weight_version + ".";
              }
              Json(res, {{"success", true}, {"message", message}, {"num_paused_requests", 0}});
            }));
  auto flush = [d](const httplib::Request&, httplib::Response& res) NO_THREAD_SAFETY_ANALYSIS {
    const bool ok = d->Flush();
    res.status = ok ? 200 : 400;
    res.set_content(
        "Cache flushed.\nPlease check backend logs for more details. (When there are running "
        "or waiting requests, the operation will not be performed.)\n",
        "text/plain");
  };
  http.Post("/flush_cache", route("POST", "/flush_cache", flush));
  http.Get("/flush_cache", route("GET", "/flush_cache", flush));
  impl_->port = http.bind_to_any_port("127.0.0.1");
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

SglangDouble::~SglangDouble() { Stop(); }

void SglangDouble::Stop() {
  {
    MutexLock lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->stopping_cv.SignalAll();
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  // The killer thread is started under the lock; join it without.
  std::thread killer;
  {
    MutexLock lock(impl_->mu);
    killer = std::move(impl_->killer);
  }
  if (killer.joinable()) killer.join();
}

std::string SglangDouble::url() const { return "http://127.0.0.1:" + std::to_string(impl_->port); }

void SglangDouble::Inject(const std::string& route, SglangFault fault, uint32_t times) {
  MutexLock lock(impl_->mu);
  impl_->faults[route] = {fault, times};
}

#define TERN_DOUBLE_GET(type, name)            \
  type SglangDouble::name() const {            \
    MutexLock lock(impl_->mu);                 \
    return impl_->name;                        \
  }
TERN_DOUBLE_GET(std::string, weight_version)
TERN_DOUBLE_GET(std::string, model_path)
TERN_DOUBLE_GET(uint32_t, running)
TERN_DOUBLE_GET(uint32_t, waiting)
TERN_DOUBLE_GET(bool, paused)
TERN_DOUBLE_GET(std::string, pause_mode)
TERN_DOUBLE_GET(std::string, last_update)
TERN_DOUBLE_GET(uint64_t, updates_loaded)
TERN_DOUBLE_GET(uint64_t, drains)
TERN_DOUBLE_GET(uint64_t, cache_flushes)
TERN_DOUBLE_GET(bool, dead)
TERN_DOUBLE_GET(std::vector<std::string>, routes)
#undef TERN_DOUBLE_GET

void SglangDouble::set_hang_ms(uint32_t ms) {
  MutexLock lock(impl_->mu);
  impl_->hang_ms = ms;
}
void SglangDouble::set_weight_version(const std::string& v) {
  MutexLock lock(impl_->mu);
  impl_->weight_version = v;
}
void SglangDouble::set_running(uint32_t requests) {
  MutexLock lock(impl_->mu);
  impl_->running = requests;
}

}  // namespace tern::agent::testing

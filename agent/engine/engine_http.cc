#include "agent/engine/engine_http.h"

#include <httplib.h>

#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>

namespace tern::agent {
namespace {

constexpr size_t kMessageBytesMax = 600;

}  // namespace

Result<EngineEndpoint> ParseEngineUrl(const std::string& text) {
  std::string_view url = text;
  TERN_REQUIRE(url.starts_with("http://"), kInvalidArgument,
               "engine: URL must be http://HOST:PORT, not ", text);
  url.remove_prefix(7);
  while (url.ends_with('/')) url.remove_suffix(1);
  const size_t colon = url.rfind(':');
  TERN_REQUIRE(
      colon != std::string_view::npos && colon > 0 && url.find('/') == std::string_view::npos,
      kInvalidArgument, "engine: URL must be http://HOST:PORT, not ", text);
  int port = 0;
  const std::string_view port_text = url.substr(colon + 1);
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  TERN_REQUIRE(
      ec == std::errc() && end == port_text.data() + port_text.size() && port > 0 && port < 65536,
      kInvalidArgument, "engine: bad port in URL ", text);
  std::string host(url.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return EngineEndpoint{std::move(host), port};
}

Result<EngineReply> EngineHttpCall(const EngineEndpoint& engine, uint32_t connect_timeout_ms,
                                   const char* method, const std::string& path,
                                   const std::string& body, uint32_t timeout_ms, Clock& clock) {
  httplib::Client client(engine.host, engine.port);
  client.set_keep_alive(false);
  client.set_connection_timeout(std::chrono::milliseconds(connect_timeout_ms));
  client.set_read_timeout(std::chrono::milliseconds(timeout_ms));
  client.set_write_timeout(std::chrono::milliseconds(timeout_ms));
  const uint64_t deadline_us = clock.NowUs() + uint64_t{timeout_ms} * 1000;
  EngineReply reply;
  bool too_long = false;
  bool too_large = false;
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.body = body;
  if (!body.empty()) req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (clock.NowUs() > deadline_us) return !(too_long = true);
    if (reply.body.size() + n > kEngineReplyBytesMax) return !(too_large = true);
    reply.body.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = client.send(req, res, err);
  const std::string what = std::string(method) + " " + path;
  TERN_REQUIRE(!too_long, kTimeout, "engine: ", what, ": no whole reply within ", timeout_ms,
               " ms");
  TERN_REQUIRE(!too_large, kResourceExhausted, "engine: ", what, ": reply over ",
               kEngineReplyBytesMax, " bytes");
  if (!sent) {
    if (err == httplib::Error::Read || err == httplib::Error::ConnectionTimeout) {
      if (clock.NowUs() >= deadline_us || err == httplib::Error::ConnectionTimeout)
        return TERN_ERROR(kTimeout, "engine: ", what, ": no reply within ", timeout_ms, " ms (",
                          httplib::to_string(err), ")");
    }
    return TERN_ERROR(kUnavailable, "engine: ", what, ": ", httplib::to_string(err));
  }
  reply.status = res.status;
  return reply;
}

std::string ClipEngineText(std::string_view s) {
  return std::string(s.substr(0, kMessageBytesMax)) + (s.size() > kMessageBytesMax ? "..." : "");
}

Result<std::optional<uint64_t>> ServedWeightVersion(const std::string& body,
                                                    const std::string& route) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  TERN_REQUIRE(j.is_object() && j.contains("weight_version"), kProtocol, "engine: GET ", route,
               ": no weight_version in ", ClipEngineText(body));
  const auto& v = j["weight_version"];
  if (v.is_null()) return std::optional<uint64_t>();
  TERN_REQUIRE(v.is_string(), kProtocol, "engine: GET ", route, ": weight_version is not a string");
  const std::string text = v.get<std::string>();
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return std::optional<uint64_t>();  // a name, not one of our versions
  return std::optional<uint64_t>(n);
}

std::string EngineErrorText(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_string()) return ClipEngineText(e->get<std::string>());
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        return ClipEngineText((*e)["message"].get<std::string>());
    }
    if (auto m = j.find("message"); m != j.end() && m->is_string())
      return ClipEngineText(m->get<std::string>());
    if (auto d = j.find("detail"); d != j.end()) return ClipEngineText(d->dump());
  }
  return ClipEngineText(body);
}

std::string DumpEngineJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status RetryEngineAttempts(uint32_t attempts, uint32_t backoff_ms, Clock& clock,
                           const std::function<Status(uint32_t)>& attempt) {
  Status last;
  for (uint32_t n = 1; n <= attempts; ++n) {
    last = attempt(n);
    if (last.ok() || last.code() == Code::kInvalidArgument || last.code() == Code::kMismatch ||
        last.code() == Code::kProtocol)
      return last;
    if (n < attempts) clock.SleepUs(uint64_t{backoff_ms} * 1000 * n);
  }
  return last;
}

}  // namespace tern::agent

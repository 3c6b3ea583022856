#include "agent/engine/commit_client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "base/text.h"

namespace tern::agent {
namespace {

constexpr size_t kReplyBytesMax = 64 << 10;
constexpr size_t kMessageBytesMax = 600;

class SidecarCommitPoint final : public EngineCommitPoint {
 public:
  SidecarCommitPoint(SidecarCommitOptions o, const HostPort& hp)
      : options_(std::move(o)), client_(hp.host, hp.port) {
    const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
    client_.set_connection_timeout(std::chrono::milliseconds(std::min<uint32_t>(options_.timeout_ms, 5000)));
    client_.set_read_timeout(timeout);
    client_.set_write_timeout(timeout);
    client_.set_keep_alive(false);
  }

  Status Begin(uint64_t version, uint32_t hold_ms) override {
    return Post("/tern/commit/begin", {{"version", version}, {"hold_ms", hold_ms}});
  }
  Status End(uint64_t version, bool loaded) override {
    return Post("/tern/commit/end", {{"version", version}, {"loaded", loaded}});
  }

 private:
  Status Post(const char* path, const nlohmann::json& body) {
    httplib::Headers headers;
    if (!options_.token.empty()) headers.emplace("X-Tern-Admin-Token", options_.token);
    auto res = client_.Post(path, headers, body.dump(), "application/json");
    if (!res)
      return TERN_ERROR(kUnavailable, "sidecar ", options_.address, path, ": ",
                        httplib::to_string(res.error()));
    const std::string reply = res->body.substr(0, kReplyBytesMax);
    if (res->status != 200) {
      const std::string why = reply.substr(0, kMessageBytesMax);
      if (res->status == 503)  // the requests that must finish first did not
        return TERN_ERROR(kTimeout, "sidecar ", options_.address, path, ": HTTP 503 ", why);
      return TERN_ERROR(kUnavailable, "sidecar ", options_.address, path, ": HTTP ", res->status,
                        " ", why);
    }
    return Status::Ok();
  }

  const SidecarCommitOptions options_;
  httplib::Client client_;
};

}  // namespace

Result<std::unique_ptr<EngineCommitPoint>> NewSidecarCommitPoint(SidecarCommitOptions options) {
  TERN_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(options.address));
  TERN_REQUIRE(options.token.size() <= 1024 && IsPrintable(options.token), kInvalidArgument,
               "engine: the sidecar's admin token must be printable ASCII");
  TERN_REQUIRE(options.timeout_ms >= 1, kInvalidArgument, "engine: sidecar timeout must be > 0");
  return std::unique_ptr<EngineCommitPoint>(new SidecarCommitPoint(std::move(options), hp));
}

}  // namespace tern::agent

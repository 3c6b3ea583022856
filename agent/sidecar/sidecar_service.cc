// The public face (include/tern/sidecar.h): a gate, the version follower
// feeding it and the proxy serving through it, wired as tern-sidecar runs
// them.
#include "agent/sidecar/sidecar.h"
#include "agent/sidecar/version_follower.h"
#include "tern/sidecar.h"

namespace tern {
namespace {

class Service final : public SidecarService {
 public:
  explicit Service(bool quiesce)
      : gate_(quiesce ? agent::CommitMode::kQuiesce : agent::CommitMode::kInPlace) {}
  ~Service() override { Stop(); }

  Status Start(const SidecarConfig& c) {
    agent::FollowerOptions f;
    f.agent_admin = c.agent_admin;
    f.version_file = c.version_file;
    f.admin_token = c.agent_token;
    f.admin_ca_pem = c.agent_ca_pem;
    f.admin_cert_pem = c.agent_cert_pem;
    f.admin_key_pem = c.agent_key_pem;
    f.poll_ms = c.poll_ms;
    f.drain_timeout_ms = c.drain_timeout_ms;
    f.log = c.log;
    agent::SidecarOptions s;
    s.listen = c.listen;
    s.engine.url = c.engine_url;
    s.engine.read_timeout_ms = c.engine_timeout_ms;
    s.admin_token = c.admin_token;
    s.workers = c.workers;
    s.max_body_bytes = c.max_body_bytes;
    s.max_response_bytes = c.max_response_bytes;
    s.catchup_wait_ms = c.catchup_wait_ms;
    s.drain_timeout_ms = c.drain_timeout_ms;
    s.client_timeout_ms = c.client_timeout_ms;
    s.cache_salt = c.cache_salt;
    s.refuse_when_stale = c.refuse_when_stale;
    s.log = c.log;
    TERN_ASSIGN_OR_RETURN(follower_, agent::VersionFollower::Start(std::move(f), gate_));
    agent::VersionFollower* follower = follower_.get();
    TERN_ASSIGN_OR_RETURN(
        sidecar_, agent::Sidecar::Start(std::move(s), gate_, [follower] {
          agent::ReplicaState r;
          r.sync_state = follower->sync_state();
          r.reason = follower->last_error();
          r.member_stale = follower->member_stale(&r.stale_reason);
          r.superseded = follower->superseded();
          return r;
        }));
    return Status::Ok();
  }

  std::string address() const override { return sidecar_->address(); }

  void Stop() override {
    if (sidecar_) sidecar_->Stop();
    if (follower_) follower_->Stop();
  }

 private:
  agent::VersionGate gate_;
  std::unique_ptr<agent::VersionFollower> follower_;
  std::unique_ptr<agent::Sidecar> sidecar_;
};

}  // namespace

Result<std::unique_ptr<SidecarService>> SidecarService::Start(SidecarConfig config) {
  auto service = std::make_unique<Service>(config.quiesce);
  TERN_RETURN_IF_ERROR(service->Start(config));
  return std::unique_ptr<SidecarService>(std::move(service));
}

}  // namespace tern

// The root's operator calls (include/tern/agent.h: DrainMember,
// RemoveMember, SetRetention) and their admin routes, POST /members/drain,
// /members/remove and /retention (docs/agent/operations.md "Draining and
// removing members"): what a scheduler does ahead of preempting a node, when
// it knows a node is gone, and when it changes how much history the board
// keeps.
#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>

#include "agent/daemon/admin_jobs.h"
#include "agent/daemon/agent_impl.h"
#include "agent/ops/admin_http.h"
#include "base/text.h"

namespace tern::agent {

Status AgentImpl::DrainMember(const std::string& id) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "drain: this agent is not the root");
  Outbox out;
  {
    MutexLock lock(mu_);
    TERN_REQUIRE(!stopping_ && membership_, kUnavailable, "drain: the root is not running");
    const bool was = membership_->Has(id) && membership_->members().at(id).draining;
    std::vector<std::string> notify;
    TERN_RETURN_IF_ERROR(membership_->Drain(id, &notify));
    if (!was) {
      RootNotifyParents(notify, out);
      EmitMember(AgentEvent::Kind::kMemberDrained, id);
      Log("drained " + id + " (an operator's request): a leaf from now on; moved " +
          std::to_string(notify.size()) + " member(s)");
    }
  }
  Flush(out);
  return Status::Ok();
}

Status AgentImpl::RemoveMember(const std::string& id, uint32_t rejoin_after_ms) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "remove: this agent is not the root");
  TERN_REQUIRE(!id.empty() && id.size() <= 256, kInvalidArgument, "remove: a member id is 1..256 bytes");
  TERN_REQUIRE(rejoin_after_ms <= 86400000u, kOutOfRange, "remove: rejoin_after_ms ", rejoin_after_ms,
               " is more than a day");
  Outbox out;
  std::shared_ptr<Connection> conn;
  bool joined = false;
  {
    MutexLock lock(mu_);
    TERN_REQUIRE(!stopping_ && membership_, kUnavailable, "remove: the root is not running");
    const uint64_t now = clock_.NowUs();
    for (auto it = removed_until_us_.begin(); it != removed_until_us_.end();)
      it = it->second <= now ? removed_until_us_.erase(it) : std::next(it);
    if (rejoin_after_ms > 0) {
      if (removed_until_us_.size() >= kMaxRemoved && !removed_until_us_.count(id)) {
        auto oldest = std::min_element(removed_until_us_.begin(), removed_until_us_.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
        removed_until_us_.erase(oldest);
      }
      removed_until_us_[id] = now + uint64_t{rejoin_after_ms} * 1000;
    } else {
      removed_until_us_.erase(id);
    }
    joined = membership_->Has(id);
    if (joined) {
      if (auto it = member_conns_.find(id); it != member_conns_.end()) {
        conn = it->second;
        member_conns_.erase(it);
      }
      std::vector<std::string> notify;
      membership_->Leave(id, &notify);
      for (auto& [v, ids] : waiting_) ids.erase(id);
      RootNotifyParents(notify, out);
      EmitMember(AgentEvent::Kind::kMemberRemoved, id);
      Log("removed " + id + " (an operator's request); re-planned " + std::to_string(notify.size()) +
          " member(s); its joins are refused for " + std::to_string(rejoin_after_ms) + " ms");
    }
  }
  Flush(out);
  if (conn) conn->Close();  // its on_closed finds nothing left to drop
  TERN_REQUIRE(joined, kNotFound, "remove: member '", id, "' is not joined (its joins are refused for ",
               rejoin_after_ms, " ms)");
  return Status::Ok();
}

Status AgentImpl::SetRetention(uint32_t keep_patches, uint32_t keyframe_every) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "retention: this agent is not the root");
  TERN_REQUIRE(keep_patches >= 1 && keyframe_every >= 1, kInvalidArgument,
               "retention: keep_patches and keyframe_every must be at least 1");
  MutexLock publish_lock(publish_mu_);  // between publications, never inside one
  TERN_REQUIRE(board_ != nullptr, kUnavailable, "retention: the root has no board yet");
  TERN_RETURN_IF_ERROR(board_->SetOptions(BoardOptions{keep_patches, keyframe_every}));
  Log("retention: keep " + std::to_string(keep_patches) + " patches, a keyframe at least every " +
      std::to_string(keyframe_every) + " versions");
  return Status::Ok();
}

namespace {

AdminResponse Reply(const Status& s, nlohmann::json ok) {
  if (s.ok()) return AdminResponse{200, "application/json", ok.dump() + "\n"};
  return AdminResponse{AdminHttpStatusOf(s), "text/plain", s.ToString() + "\n"};
}

AdminResponse BadRequest(std::string_view what) {
  return AdminResponse{400, "text/plain", "expected " + std::string(what) + "\n"};
}

}  // namespace

std::vector<AdminRoute> AgentImpl::OperatorRoutes() {
  std::vector<AdminRoute> routes;
  routes.push_back({"POST", "/members/drain",
                    [this](const AdminRequest& req) {
                      nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
                      if (!j.is_object() || !j.contains("id") || !j["id"].is_string())
                        return BadRequest("{\"id\": MEMBER}");
                      const std::string id = j["id"].get<std::string>();
                      return Reply(DrainMember(id), {{"drained", id}});
                    },
                    /*mutating=*/true});
  routes.push_back({"POST", "/members/remove",
                    [this](const AdminRequest& req) {
                      nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
                      if (!j.is_object() || !j.contains("id") || !j["id"].is_string() ||
                          (j.contains("rejoin_after_ms") && !j["rejoin_after_ms"].is_number_unsigned()))
                        return BadRequest("{\"id\": MEMBER[, \"rejoin_after_ms\": N]}");
                      const std::string id = j["id"].get<std::string>();
                      const uint64_t ms = j.value("rejoin_after_ms", uint64_t{60000});
                      if (ms > 86400000u) return BadRequest("rejoin_after_ms of at most 86400000");
                      return Reply(RemoveMember(id, static_cast<uint32_t>(ms)),
                                   {{"removed", id}, {"rejoin_after_ms", ms}});
                    },
                    /*mutating=*/true});
  routes.push_back({"POST", "/retention",
                    [this](const AdminRequest& req) {
                      nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
                      auto small = [&](const char* k) {
                        return j.contains(k) && j[k].is_number_unsigned() &&
                               j[k].get<uint64_t>() >= 1 && j[k].get<uint64_t>() <= 1000000;
                      };
                      if (!j.is_object() || !small("keep_patches") || !small("keyframe_every"))
                        return BadRequest("{\"keep_patches\": 1..1000000, \"keyframe_every\": 1..1000000}");
                      const auto keep = j["keep_patches"].get<uint32_t>();
                      const auto every = j["keyframe_every"].get<uint32_t>();
                      return Reply(SetRetention(keep, every),
                                   {{"keep_patches", keep}, {"keyframe_every", every}});
                    },
                    /*mutating=*/true});
  return routes;
}

}  // namespace tern::agent

namespace tern {
namespace {

Status Post(const std::string& admin_address, std::string_view path, const nlohmann::json& body,
            const AgentClientOptions& options) {
  agent::AdminClientOptions o = agent::AdminRequestOf(options);
  o.timeout_ms = options.timeout_ms;
  return agent::AdminPost(admin_address, path, body.dump(), o).status();
}

}  // namespace

Status DrainMemberAt(const std::string& admin_address, const std::string& member_id,
                     const AgentClientOptions& options) {
  return Post(admin_address, "/members/drain", {{"id", member_id}}, options);
}

Status RemoveMemberAt(const std::string& admin_address, const std::string& member_id,
                      uint32_t rejoin_after_ms, const AgentClientOptions& options) {
  return Post(admin_address, "/members/remove", {{"id", member_id}, {"rejoin_after_ms", rejoin_after_ms}},
              options);
}

Status SetRetentionAt(const std::string& admin_address, uint32_t keep_patches, uint32_t keyframe_every,
                      const AgentClientOptions& options) {
  return Post(admin_address, "/retention",
              {{"keep_patches", keep_patches}, {"keyframe_every", keyframe_every}}, options);
}

Status RotateKeysAt(const std::string& admin_address, std::string_view signed_key_set,
                    const std::string& signing_key_file, const AgentClientOptions& options) {
  nlohmann::json body = nlohmann::json::object();
  if (!signed_key_set.empty())
    body["key_set_hex"] = Hex({reinterpret_cast<const uint8_t*>(signed_key_set.data()), signed_key_set.size()});
  if (!signing_key_file.empty()) body["signing_key_file"] = signing_key_file;
  return Post(admin_address, "/keys/rotate", body, options);
}

}  // namespace tern

// The agent's events (include/tern/agent.h, AgentEvent): what is pushed
// where, Agent::WaitEvents, and GET /events on the admin port
// (docs/agent/operations.md "Events"; agent/daemon/agent_impl.h).
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "agent/daemon/agent_impl.h"
#include "agent/daemon/event_json.h"
#include "agent/ops/admin_http.h"
#include "tern/patch.h"

namespace tern::agent {
namespace {

// GET /events: at most this many listeners wait at once (each holds one of
// the admin port's workers), each at most kEventsWaitMsMax: the admin
// port's request deadline is 10 s.
constexpr uint32_t kEventsListenersMax = 4;
constexpr uint32_t kEventsWaitMsMax = 5000;

Result<uint64_t> ParamU64(const AdminRequest& req, const std::string& name, uint64_t fallback) {
  auto it = req.params.find(name);
  if (it == req.params.end()) return fallback;
  const std::string& v = it->second;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  TERN_REQUIRE(
      !v.empty() && v.size() <= 20 && v[0] != '-' && end == v.c_str() + v.size() && errno == 0,
      kInvalidArgument, "events: ", name, "=", v.substr(0, 32), " is not a non-negative integer");
  return static_cast<uint64_t>(x);
}

AdminResponse ErrorResponse(const Status& s) {
  int code = 500;
  switch (s.code()) {
    case Code::kInvalidArgument:
      code = 400;
      break;
    case Code::kResourceExhausted:
      code = 503;
      break;
    case Code::kUnavailable:
      code = 503;
      break;
    default:
      break;
  }
  nlohmann::json j;
  j["error"] = s.message();
  return AdminResponse{code, "application/json", j.dump()};
}

}  // namespace

Status AgentImpl::WaitEvents(uint64_t after_seq, size_t max_events, uint32_t timeout_ms,
                             std::vector<AgentEvent>* out) {
  TERN_REQUIRE(out != nullptr, kInvalidArgument, "WaitEvents: out is null");
  return events_->Wait(after_seq, max_events, timeout_ms, out);
}

std::vector<std::string> ChangedTensors(std::span<const uint8_t> patch, bool* all) {
  std::vector<std::string> names;
  *all = false;
  auto head = InspectHead(patch);
  if (!head.ok() || !head->has_value()) {
    *all = true;  // cannot say: the whole view may have changed
    return names;
  }
  for (const TensorPatchInfo& t : (*head)->tensors)
    if (t.segments > 0) names.push_back(t.name);
  if (names.size() > kMaxEventTensors) {
    names.clear();
    *all = true;
  }
  return names;  // the patch's manifest order: sorted by name
}

std::string AgentImpl::CurrentSlot() const {
  char real[PATH_MAX];
  const std::string current = opt_.data_dir + "/current";
  return ::realpath(current.c_str(), real) != nullptr ? std::string(real) : std::string();
}

void AgentImpl::EmitServed(uint64_t version, const ViewDigest& digest, bool all,
                           std::vector<std::string> changed) {
  AgentEvent e;
  e.kind = AgentEvent::Kind::kVersionServed;
  e.version = version;
  {
    MutexLock lock(mu_);
    e.epoch = ServedEpochLocked();  // the version just switched in
  }
  e.digest = digest;
  e.member = id_;
  // The slot DIR/current points at now (absolute): stable while served.
  e.slot_dir = CurrentSlot();
  if (e.slot_dir.empty()) e.slot_dir = opt_.data_dir + "/current";
  e.all_tensors = all;
  e.changed_tensors = std::move(changed);
  events_->Push(std::move(e));
}

void AgentImpl::EmitPublished(uint64_t version, const ViewDigest& digest, bool all,
                              std::vector<std::string> changed) {
  AgentEvent e;
  e.kind = AgentEvent::Kind::kVersionPublished;
  e.version = version;
  if (board_)
    if (auto pos = board_->PosOf(version); pos.ok()) e.epoch = pos->epoch;
  e.digest = digest;
  e.member = id_;
  e.all_tensors = all;
  e.changed_tensors = std::move(changed);
  events_->Push(std::move(e));
}

void AgentImpl::EmitMember(AgentEvent::Kind kind, const std::string& member) {
  AgentEvent e;
  e.kind = kind;
  e.member = member;
  events_->Push(std::move(e));
}

AdminRoute AgentImpl::EventsRoute() {
  AdminRoute r;
  r.method = "GET";
  r.path = "/events";
  r.private_read = true;  // slot paths and tensor names: the token, when one is set
  r.handler = [this](const AdminRequest& req) -> AdminResponse {
    auto after = ParamU64(req, "after", 0);
    auto max = ParamU64(req, "max", 256);
    auto timeout = ParamU64(req, "timeout_ms", 0);
    for (const auto* p : {&after, &max, &timeout})
      if (!p->ok()) return ErrorResponse(p->status());
    if (events_listeners_.fetch_add(1) >= kEventsListenersMax) {
      events_listeners_.fetch_sub(1);
      return ErrorResponse(TERN_ERROR(kResourceExhausted, "events: ", kEventsListenersMax,
                                      " listeners already wait; try again"));
    }
    std::vector<AgentEvent> events;
    Status st = events_->Wait(*after, std::clamp<uint64_t>(*max, 1, kMaxEventsPerWait),
                              static_cast<uint32_t>(std::min<uint64_t>(*timeout, kEventsWaitMsMax)),
                              &events);
    events_listeners_.fetch_sub(1);
    if (!st.ok()) return ErrorResponse(st);
    return AdminResponse{200, "application/json",
                         EventsReplyJson(events, *after, events_->last_seq(), events_->run())};
  };
  return r;
}

}  // namespace tern::agent

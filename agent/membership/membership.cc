#include "agent/membership/membership.h"

#include <algorithm>
#include <utility>

namespace tern::agent {

topology::Member ToTopologyMember(const MemberInfo& info) {
  topology::Member m;
  m.id = info.id;
  m.region = info.region;
  m.cluster = info.cluster;
  // Unknown rates (0) plan as 1 Gbit/s: the planner needs positive rates, and
  // a member that measured nothing yet should not look like a dead link.
  m.uplink_bytes_per_s = info.uplink_bytes_per_s > 0 ? info.uplink_bytes_per_s : 1.25e8;
  m.downlink_bytes_per_s = info.downlink_bytes_per_s > 0 ? info.downlink_bytes_per_s : 1.25e8;
  m.may_relay = info.may_relay;
  m.intra_backend = info.intra_address.empty() ? "" : info.intra_backend;
  m.relay_only = info.relay_only;
  return m;
}

Membership::Membership(MemberInfo root_info, topology::PlanOptions options, uint64_t dead_after_us,
                       ProbationOptions probation, uint64_t parent_stall_us)
    : root_info_(std::move(root_info)),
      dead_after_us_(dead_after_us),
      parent_stall_us_(parent_stall_us),
      probation_(probation) {
  auto empty = topology::MakePlan(ToTopologyMember(root_info_), {}, options);
  if (empty.ok()) {
    plan_ = std::move(empty).value();
  } else {
    init_status_ = empty.status();
    plan_.root = ToTopologyMember(root_info_);
    plan_.options = options;
  }
}

void Membership::Replan(topology::Plan next, std::vector<std::string>* notify) {
  std::set<std::string> seen(notify->begin(), notify->end());
  for (const auto& move : topology::Diff(plan_, next)) {
    if (move.new_parent.empty()) continue;  // the one leaving
    if (seen.insert(move.id).second) notify->push_back(move.id);
  }
  plan_ = std::move(next);
  ++epoch_;
}

Status Membership::Join(const MemberInfo& info, uint64_t served_version, uint64_t now_us,
                        std::vector<std::string>* notify) {
  TERN_REQUIRE(!info.id.empty() && info.id != root_info_.id, kInvalidArgument,
               "member id '", info.id, "' is empty or the root's");
  TERN_RETURN_IF_ERROR(init_status_);
  if (members_.count(info.id)) return TERN_ERROR(kAlreadyExists, "member '", info.id, "' is already joined");
  auto next = topology::AddMember(plan_, ToTopologyMember(info));
  if (!next.ok()) return next.status();
  MemberRecord rec;
  rec.info = info;
  rec.joined_us = now_us;
  rec.last_seen_us = now_us;
  rec.bytes_in_moved_us = now_us;
  rec.served_version = served_version;
  members_.emplace(info.id, std::move(rec));
  notify->push_back(info.id);
  Replan(std::move(next).value(), notify);
  return Status::Ok();
}

void Membership::Leave(const std::string& id, std::vector<std::string>* notify) {
  auto it = members_.find(id);
  if (it == members_.end()) return;
  members_.erase(it);
  auto next = topology::RemoveMember(plan_, id);
  // RemoveMember only fails for an id not in the plan, which Join prevents.
  if (next.ok()) Replan(std::move(next).value(), notify);
}

Status Membership::Heartbeat(const std::string& id, const agent::Heartbeat& hb, uint64_t now_us) {
  auto it = members_.find(id);
  if (it == members_.end()) return TERN_ERROR(kNotFound, "member '", id, "' is not joined");
  if (hb.bytes_in != it->second.last.bytes_in) it->second.bytes_in_moved_us = now_us;
  // Growth only: a redial restarts the count at zero, which is no progress.
  if (hb.wire_bytes_in > it->second.last.wire_bytes_in) it->second.wire_moved_us = now_us;
  auto& samples = it->second.bytes_in_samples;
  samples.emplace_back(now_us, hb.bytes_in);
  const uint64_t keep_us = 2 * std::max(parent_stall_us_, dead_after_us_);
  while (samples.size() > MemberRecord::kMaxBytesInSamples ||
         (samples.size() > 1 && samples.front().first + keep_us < now_us)) {
    samples.pop_front();
  }
  it->second.last = hb;
  it->second.last_seen_us = now_us;
  it->second.served_version = hb.served_version;
  // Figures only: bad ones (the codec refuses them anyway) are ignored.
  if (auto next = topology::UpdateFigures(plan_, id, 0, 0, hb.rtt_to_root_s); next.ok())
    plan_ = std::move(next).value();
  // Each stripe's receive rate is a lower bound on that stripe's parent's
  // uplink (the root's own figures are configured, not measured).
  for (size_t st = 0; st < hb.parents.size() && st < plan_.parent.size(); ++st) {
    const double rate = hb.parents[st].rate_in_bytes_per_s;
    auto p = plan_.parent[st].find(id);
    auto parent = p == plan_.parent[st].end() ? members_.end() : members_.find(p->second);
    if (parent == members_.end() || rate <= parent->second.measured_uplink_bytes_per_s) continue;
    parent->second.measured_uplink_bytes_per_s = rate;
    if (auto next = topology::UpdateFigures(plan_, parent->first, rate, 0, 0); next.ok())
      plan_ = std::move(next).value();
  }
  return Status::Ok();
}

Status Membership::ReportParent(const std::string& id, const ParentReport& report, uint64_t now_us,
                                std::vector<std::string>* notify) {
  auto it = members_.find(id);
  if (it == members_.end()) return TERN_ERROR(kNotFound, "member '", id, "' is not joined");
  // Starving, whatever becomes of the report: reports on it are discounted.
  if (report.fault == ParentFault::kStalled)
    it->second.stall_reported_us = std::max<uint64_t>(now_us, 1);
  TERN_REQUIRE(report.stripe < plan_.parent.size(), kMismatch, "stripe ", report.stripe, " of ",
               plan_.parent.size());
  auto p = plan_.parent[report.stripe].find(id);
  TERN_REQUIRE(p != plan_.parent[report.stripe].end() && p->second == report.parent_id, kMismatch,
               "'", report.parent_id, "' is not the parent of '", id, "' in stripe ", report.stripe,
               " any more");
  TERN_REQUIRE(report.parent_id != root_info_.id, kMismatch, "the root is not planned around");
  auto parent = members_.find(report.parent_id);
  TERN_REQUIRE(parent != members_.end(), kMismatch, "'", report.parent_id, "' is not joined");
  const uint64_t reported = parent->second.stall_reported_us;
  if (report.fault == ParentFault::kStalled) {
    TERN_REQUIRE(reported == 0 || now_us > reported + dead_after_us_, kMismatch, "'",
                 report.parent_id, "' reported its own parent stalled ",
                 (now_us - std::min(now_us, reported)) / 1000, " ms ago: it starves too");
    // The relative rule: the parent's own last heartbeat, heard well inside
    // the reporter's stall time, shows no byte in for a whole stall time;
    // excused for one more stall time at most, so a parent that cannot
    // receive (or hangs off a root that starves it) is moved after all.
    const MemberRecord& rec = parent->second;
    const uint64_t heard_within = std::min(dead_after_us_, parent_stall_us_ / 2);
    const bool heard = now_us <= rec.last_seen_us + heard_within;
    const bool flat = rec.bytes_in_moved_us + parent_stall_us_ <= rec.last_seen_us;
    const bool recent = now_us < rec.bytes_in_moved_us + 2 * parent_stall_us_;
    const bool newer = rec.served_version > it->second.served_version;
    TERN_REQUIRE(parent_stall_us_ == 0 || !heard || !flat || !recent || newer, kMismatch, "'",
                 report.parent_id, "' has received nothing itself for ",
                 (now_us - rec.bytes_in_moved_us) / 1000,
                 " ms by its heartbeats and holds nothing newer than version ",
                 it->second.served_version, ": it starves too");
    // Mid-chunk: no whole chunk for the stall time, but bytes still coming
    // off its own parent links within it. A relay forwards verified chunks
    // only, so over a slow link (a 40 MB object's ten 4 MiB chunks in
    // flight at once on 8 streams at 10 Mbit/s: ~27 s before the first is
    // whole) its children get nothing while it receives at line rate.
    // Moving them would send each its own copy over the same link. While
    // the bytes grow it is excused, for kMidChunkStallTimes stall times
    // without a whole chunk at most (a first chunk that slow is a link too
    // slow to relay on, and a member that reports bytes it never completes
    // must not keep its place for good); once they stop, the rule above.
    const bool mid_chunk = rec.wire_moved_us != 0 &&
                           now_us < rec.wire_moved_us + parent_stall_us_ &&
                           now_us < rec.bytes_in_moved_us + kMidChunkStallTimes * parent_stall_us_;
    TERN_REQUIRE(
        parent_stall_us_ == 0 || !heard || !flat || !mid_chunk || newer, kMismatch, "'",
        report.parent_id, "' has no whole chunk for ", (now_us - rec.bytes_in_moved_us) / 1000,
        " ms but took bytes off its own parent's link ", (now_us - rec.wire_moved_us) / 1000,
        " ms ago: it is still receiving a chunk to forward");
  }
  TERN_ASSIGN_OR_RETURN(topology::Plan next, topology::DemoteRelay(plan_, report.parent_id));
  parent->second.demoted = true;
  RecordDemotion(probation_, report.fault, now_us, &parent->second.probation);
  Replan(std::move(next), notify);
  return Status::Ok();
}

std::string Membership::StallEvidence(const std::string& id, uint64_t now_us) const {
  auto it = members_.find(id);
  if (it == members_.end()) return "";
  const MemberRecord& rec = it->second;
  std::string out = "its last heartbeat " +
                    std::to_string((now_us - std::min(now_us, rec.last_seen_us)) / 1000) +
                    " ms ago";
  if (!rec.bytes_in_samples.empty()) {
    // The growth from the newest sample at least one stall time older than
    // the last (else the oldest kept) to the last.
    const uint64_t window_us = parent_stall_us_ ? parent_stall_us_ : dead_after_us_;
    const auto& last = rec.bytes_in_samples.back();
    auto from = rec.bytes_in_samples.front();
    for (const auto& s : rec.bytes_in_samples) {
      if (s.first + window_us > last.first) break;
      from = s;
    }
    out += ", bytes in +" + std::to_string(last.second - std::min(last.second, from.second)) +
           " over the " + std::to_string((last.first - from.first) / 1000) + " ms before it";
  }
  out += ", serving " + std::to_string(rec.served_version);
  if (rec.stall_reported_us != 0)
    out += ", its own report of a stalled parent " +
           std::to_string((now_us - std::min(now_us, rec.stall_reported_us)) / 1000) + " ms ago";
  return out;
}

Status Membership::Drain(const std::string& id, std::vector<std::string>* notify) {
  auto it = members_.find(id);
  if (it == members_.end()) return TERN_ERROR(kNotFound, "member '", id, "' is not joined");
  if (it->second.draining) return Status::Ok();
  TERN_ASSIGN_OR_RETURN(topology::Plan next, topology::DemoteRelay(plan_, id));
  it->second.draining = true;
  Replan(std::move(next), notify);
  return Status::Ok();
}

std::vector<std::string> Membership::EndProbations(uint64_t now_us) {
  std::vector<std::string> out;
  for (auto& [id, rec] : members_) {
    if (!rec.demoted || rec.draining || !rec.info.may_relay || !ProbationOver(rec.probation, now_us)) continue;
    auto next = topology::PromoteRelay(plan_, id);
    if (!next.ok()) continue;         // only an id missing from the plan, which Join prevents
    plan_ = std::move(next).value();  // no edge moved: same epoch, nobody to tell
    rec.demoted = false;
    RecordPromotion(now_us, &rec.probation);
    out.push_back(id);
  }
  return out;
}

std::vector<std::string> Membership::Silent(uint64_t now_us) const {
  std::vector<std::string> out;
  for (const auto& [id, rec] : members_)
    if (now_us > rec.last_seen_us && now_us - rec.last_seen_us > dead_after_us_) out.push_back(id);
  return out;
}

Result<Parents> Membership::ParentsOf(const std::string& id, std::vector<std::string>* notes) {
  auto self = members_.find(id);
  if (self == members_.end()) return TERN_ERROR(kNotFound, "member '", id, "' is not joined");
  const MemberInfo& child = self->second.info;
  Parents out;
  out.epoch = epoch_;
  for (uint32_t s = 0; s < plan_.parent.size(); ++s) {
    auto p = plan_.parent[s].find(id);
    if (p == plan_.parent[s].end()) return TERN_ERROR(kInternal, "member '", id, "' has no parent in stripe ", s);
    ParentRef ref;
    ref.stripe = s;
    ref.id = p->second;
    const MemberInfo* parent = &root_info_;
    if (p->second != root_info_.id) {
      auto m = members_.find(p->second);
      if (m == members_.end()) return TERN_ERROR(kInternal, "parent '", p->second, "' is not joined");
      parent = &m->second.info;
    }
    // The edge's transport: the intra-cluster one when the edge stays in
    // one cluster and both ends run the same backend, else the one every
    // agent has.
    const topology::Member from = ToTopologyMember(*parent), to = ToTopologyMember(child);
    const topology::EdgeTransport t = topology::ChooseEdgeTransport(from, to);
    ref.intra = t == topology::EdgeTransport::kIntra;
    if (t == topology::EdgeTransport::kMainBackendsDiffer && notes) {
      const auto [lo, hi] = std::minmax(from.intra_backend, to.intra_backend);
      const std::string key = child.region + "/" + child.cluster + " " + lo + " " + hi;
      if (backend_notes_.size() < kMaxBackendNotes && backend_notes_.insert(key).second)
        notes->push_back("cluster " + child.region + "/" + child.cluster +
                         " mixes intra-cluster backends: " + parent->id + " runs " +
                         from.intra_backend + ", " + child.id + " runs " + to.intra_backend +
                         "; edges between such members use the main transport");
    }
    ref.data_address = ref.intra ? parent->intra_address : parent->data_address;
    out.parents.push_back(std::move(ref));
  }
  return out;
}

void Membership::MarkSent(const std::string& id, uint64_t epoch) {
  auto it = members_.find(id);
  if (it != members_.end()) it->second.parents_epoch = epoch;
}

uint32_t Membership::DepthOf(const std::string& id) const {
  auto d = topology::Depth(plan_, 0, id);
  return d.ok() ? *d : 0;
}

}  // namespace tern::agent

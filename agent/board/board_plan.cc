// Board: cheapest catch-up paths, the keyframe policy and retention
// (agent/board/board.h; rules in docs/agent/board.md §4-5).
//
// The objects on disk form a graph over versions plus a node 0, "nothing":
// patch(p -> v) and squash(a -> v) are edges p -> v and a -> v, keyframe(v)
// an edge 0 -> v (anyone can start from nothing). Every edge goes to a later
// position (epoch, version) on the chain (docs/agent/board.md §4a: a
// supersede's patch runs to a lower number, never to an earlier position),
// so relaxing edges in order of their target's position is a complete
// shortest-path search (a DAG), linear in the number of objects.
#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "agent/board/board.h"

namespace tern::agent {
namespace {

struct Best {
  uint64_t bytes = std::numeric_limits<uint64_t>::max();
  uint64_t objects = 0;
  const ObjectRef* via = nullptr;  // the edge into this node
};

uint64_t EdgeFrom(const ObjectRef& ref) { return ref.kind == ObjectKind::kKeyframe ? 0 : ref.from; }

}  // namespace

Result<Board::Path> Board::CheapestPathLocked(uint64_t from, uint64_t to,
                                              bool also_from_nothing) const {
  const std::optional<BoardPos> to_pos = PosLocked(to), from_pos = PosLocked(from);
  TERN_REQUIRE(to_pos && to != 0, kNotFound, "board: no version ", to);
  TERN_REQUIRE(from_pos.has_value(), kNotFound, "board: no version ", from);
  TERN_REQUIRE(*from_pos < *to_pos, kInvalidArgument, "board: no path from ", from, " to ", to);
  std::vector<std::pair<BoardPos, const ObjectRef*>> edges;
  for (const auto& [ref, info] : objects_) {
    if (!info.present) continue;
    const std::optional<BoardPos> at = PosLocked(ref.to);
    if (at && *at <= *to_pos && *at > *from_pos) edges.push_back({*at, &ref});
  }
  std::stable_sort(edges.begin(), edges.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::map<uint64_t, Best> best;
  best[from] = Best{0, 0, nullptr};
  if (also_from_nothing) best[0] = Best{0, 0, nullptr};
  for (const auto& [at, e] : edges) {
    auto src = best.find(EdgeFrom(*e));
    if (src == best.end()) continue;
    const uint64_t bytes = src->second.bytes + objects_.at(*e).bytes;
    const uint64_t count = src->second.objects + 1;
    Best& dst = best[e->to];
    // Fewer bytes first, then fewer objects (fewer manifests, applies).
    if (std::pair(bytes, count) < std::pair(dst.bytes, dst.objects)) dst = Best{bytes, count, e};
  }
  auto end = best.find(to);
  TERN_REQUIRE(end != best.end() && end->second.via != nullptr, kNotFound,
               "board: no objects on disk lead from version ", from, " to ", to);
  Path path;
  for (uint64_t at = to; at != from && !(also_from_nothing && at == 0);) {
    const ObjectRef* e = best.at(at).via;
    TERN_ASSERT(e != nullptr && path.size() <= objects_.size(), "broken catch-up path");
    path.push_back(*e);
    at = EdgeFrom(*e);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

Result<std::vector<ObjectRef>> Board::CheapestPath(uint64_t from, uint64_t to) const {
  MutexLock lock(mu_);
  return CheapestPathLocked(from, to, /*also_from_nothing=*/from == 0);
}

CatchUpRoute Board::RouteFromPathLocked(const Path& path) const {
  CatchUpRoute plan;
  std::set<std::pair<uint64_t, uint32_t>> listed;
  for (const ObjectRef& ref : path) {
    if (plan.objects.size() == kMaxCatchUpObjects) break;
    const ObjectInfo& info = objects_.at(ref);
    plan.objects.push_back(ref);
    plan.bytes += info.bytes;
    if (listed.insert({info.version, info.seq}).second)
      plan.signed_manifests.push_back(versions_.at(info.version).signed_manifests.at(info.seq));
    plan.reaches = ref.to;
  }
  return plan;
}

Result<CatchUpRoute> Board::PlanCatchUp(uint64_t have, uint64_t target,
                                       const MakeSquashFn& make_squash) {
  uint64_t start = 0;
  {
    MutexLock lock(mu_);
    const std::optional<BoardPos> target_pos = PosLocked(target), have_pos = PosLocked(have);
    TERN_REQUIRE(target_pos && target != 0, kNotFound, "board: no version ", target);
    // An unindexed number has no position; above the target within epoch 0
    // it can only be ahead (or invented).
    const bool ahead = have_pos ? *have_pos > *target_pos : target_pos->epoch == 0 && have > target;
    TERN_REQUIRE(!ahead, kInvalidArgument, "board: member at ", have, " is ahead of target ",
                 target);
    if (have == target) return CatchUpRoute{target, {}, {}, 0};
    if (!have_pos) have = 0;  // unknown or dropped: start from nothing
    TERN_ASSIGN_OR_RETURN(Path path, CheapestPathLocked(have, target, true));
    if (!make_squash || path.size() < 2) return RouteFromPathLocked(path);
    // One squash replaces the whole path: squash(start -> target) from the
    // member's version, or from nothing a late keyframe(target).
    start = EdgeFrom(path.front());
    const ObjectRef squash = start == 0 ? ObjectRef{ObjectKind::kKeyframe, target, target}
                                        : ObjectRef{ObjectKind::kSquash, start, target};
    auto known = objects_.find(squash);
    if (known != objects_.end() && known->second.present) return RouteFromPathLocked(path);
  }
  Status st = make_squash(start, target);  // takes mu_ itself (Record)
  if (!st.ok())
    log_fn_("board: squash " + std::to_string(start) + "->" + std::to_string(target) +
            " failed, sending the chain: " + st.ToString());
  MutexLock lock(mu_);
  TERN_ASSIGN_OR_RETURN(Path path, CheapestPathLocked(have, target, true));
  return RouteFromPathLocked(path);
}

bool Board::KeyframeDue(uint64_t version, uint64_t patch_bytes) const {
  MutexLock lock(mu_);
  // The newest keyframe on the chain (`version` is the one being published,
  // after every indexed one).
  const std::pair<const ObjectRef, ObjectInfo>* newest = nullptr;
  BoardPos newest_pos;
  for (const auto& entry : objects_) {
    if (entry.first.kind != ObjectKind::kKeyframe || entry.first.to == version) continue;
    const std::optional<BoardPos> at = PosLocked(entry.first.to);
    if (at && (newest == nullptr || *at > newest_pos)) {
      newest = &entry;
      newest_pos = *at;
    }
  }
  if (newest == nullptr) return true;
  // Publications since the keyframe, this one included; and their patches' bytes.
  uint64_t since = 1, chain_bytes = patch_bytes;
  for (auto it = chain_.upper_bound(newest_pos); it != chain_.end(); ++it) {
    ++since;
    const VersionManifest& pub = versions_.at(it->version).publication;
    auto patch = objects_.find({ObjectKind::kPatch, pub.parent, pub.version});
    if (patch != objects_.end()) chain_bytes += patch->second.bytes;
  }
  return since >= options_.keyframe_every || chain_bytes > newest->second.bytes;
}

Status Board::Retain(const std::set<uint64_t>& held) {
  MutexLock writer(record_mu_);
  MutexLock lock(mu_);
  if (head_.version == 0) return Status::Ok();
  const uint64_t head = head_.version;
  std::set<ObjectRef> keep;
  auto keep_path = [&](uint64_t from) {
    mu_.AssertHeld();  // called below, under the lock (lambdas are not analysed)
    auto path = CheapestPathLocked(from, head, true);
    if (path.ok()) keep.insert(path->begin(), path->end());
  };
  uint32_t kept_patches = 0;
  for (auto it = chain_.rbegin(); it != chain_.rend() && kept_patches < options_.keep_patches;
       ++it, ++kept_patches) {
    const VersionManifest& pub = versions_.at(it->version).publication;
    if (pub.parent != 0) keep.insert({ObjectKind::kPatch, pub.parent, pub.version});
  }
  // The newest keyframe on disk and what leads from it to HEAD: a new member's
  // path even when a late keyframe or squash is cheaper today.
  const ObjectRef* newest_keyframe = nullptr;
  BoardPos newest_pos;
  for (const auto& [ref, info] : objects_) {
    if (ref.kind != ObjectKind::kKeyframe || !info.present) continue;
    const std::optional<BoardPos> at = PosLocked(ref.to);
    if (at && (newest_keyframe == nullptr || *at > newest_pos)) {
      newest_keyframe = &ref;
      newest_pos = *at;
    }
  }
  if (newest_keyframe != nullptr) {
    keep.insert(*newest_keyframe);
    if (newest_pos < head_) {
      auto path = CheapestPathLocked(newest_keyframe->to, head, false);
      if (path.ok()) keep.insert(path->begin(), path->end());
    }
  }
  for (uint64_t h : held) {
    const std::optional<BoardPos> at = PosLocked(h);
    if (h != 0 && at && *at < head_) keep_path(h);
  }

  uint64_t removed = 0, removed_bytes = 0;
  for (auto& [ref, info] : objects_) {
    if (!info.present || keep.contains(ref)) continue;
    Status st = env_.RemoveFile(ObjectPath(ref));
    if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("board retention");
    info.present = false;
    ++removed;
    removed_bytes += info.bytes;
  }
  if (removed > 0) {
    TERN_RETURN_IF_ERROR(env_.SyncPath(objects_dir_));
    log_fn_("board: retention removed " + std::to_string(removed) + " objects, " +
            std::to_string(removed_bytes) + " bytes");
  }
  // Records before the earliest position a kept object starts from (or
  // HEAD) name nothing anyone can use any more.
  BoardPos floor = head_;
  for (const ObjectRef& ref : keep) {
    const std::optional<BoardPos> start = PosLocked(EdgeFrom(ref) > 0 ? ref.from : ref.to);
    if (start) floor = std::min(floor, *start);
  }
  if (!chain_.empty() && floor > *chain_.begin()) {
    TERN_RETURN_IF_ERROR(log_->DropBelow(floor));
    std::erase_if(objects_, [&](const auto& entry) {
      mu_.AssertHeld();
      const std::optional<BoardPos> at = PosLocked(entry.first.to);
      return !at || *at < floor;
    });
    for (auto it = chain_.begin(); it != chain_.end() && *it < floor;) {
      versions_.erase(it->version);
      it = chain_.erase(it);
    }
  }
  return Status::Ok();
}

}  // namespace tern::agent

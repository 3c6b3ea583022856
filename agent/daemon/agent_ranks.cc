// The root's side of publishing from trainer ranks (Agent::PublishRankPart,
// include/tern/rank_publish.h): parts gathered per version under a
// deadline, then joined and committed as one version (agent/daemon/agent_impl.h).
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/board/publish.h"
#include "agent/daemon/admin_jobs.h"
#include "agent/daemon/agent_impl.h"
#include "agent/daemon/view_rows.h"
#include "tern/patch.h"

namespace tern::agent {
namespace {

constexpr uint32_t kMaxRankTimeoutMs = 600000;
constexpr uint32_t kMaxWorldSize = 65536;
constexpr size_t kKeptOutcomes = 64;

std::string MissingRanks(const std::map<uint32_t, RankPart>& parts, uint32_t world_size) {
  std::string out;
  uint32_t listed = 0;
  for (uint32_t r = 0; r < world_size; ++r) {
    if (parts.count(r)) continue;
    if (listed++ == 16) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

// A private anonymous mapping: pages cost memory only once written.
class ScratchMap {
 public:
  static Result<ScratchMap> Create(uint64_t bytes) {
    void* p = mmap(nullptr, std::max<uint64_t>(bytes, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TERN_REQUIRE(p != MAP_FAILED, kResourceExhausted, "publish from ranks: no address space for ",
                 bytes, " scratch bytes");
    return ScratchMap(static_cast<uint8_t*>(p), std::max<uint64_t>(bytes, 1));
  }
  ScratchMap(ScratchMap&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  ScratchMap& operator=(ScratchMap&&) = delete;
  ~ScratchMap() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  uint8_t* data() const { return data_; }

 private:
  ScratchMap(uint8_t* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  uint8_t* data_;
  uint64_t bytes_;
};

// Byte range [first, end) holding elements [first_element, first_element + count).
std::pair<uint64_t, uint64_t> ByteRange(DType dtype, uint64_t first_element, uint64_t count) {
  const uint64_t bits = static_cast<uint64_t>(ElementBits(dtype));
  return {first_element * bits / 8, ((first_element + count) * bits + 7) / 8};
}

// Decodes one rank's records against the root's view before anything is
// recorded: joined into a patch and applied to a scratch view that holds
// only the segments they touch, copied from `current` (null: the zero view
// of a first version); Apply computes the digest from the decoded changes,
// so records whose bytes are not what their digest deltas (and so the
// rank's terms) claim are refused here, not after the version is on the
// board. Memory: the scratch pages written, about the bytes of the rank's
// changed segments.
Status VerifyRankRecords(const std::vector<TensorDesc>& layout, const ServeView* current,
                         uint64_t head, uint64_t version, const ViewDigest& base_digest,
                         const RankPart& part, ThreadPool& pool) {
  if (part.records.empty()) return Status::Ok();
  ServeView descs;
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const TensorDesc& d : layout) {
    descs.tensors.push_back({&d, nullptr});
    offsets.push_back(total);
    total += (d.bytes() + 63) / 64 * 64;
  }
  PatchBuilder builder(descs, head, version, base_digest, part.format_version);
  for (const SegmentRecord& r : part.records) TERN_RETURN_IF_ERROR(builder.Add(r));
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch, builder.Finish());
  TERN_ASSIGN_OR_RETURN(ScratchMap scratch, ScratchMap::Create(total));
  MutableServeView view;
  for (size_t i = 0; i < layout.size(); ++i) view.tensors.push_back({&layout[i], scratch.data() + offsets[i]});
  if (current != nullptr) {
    for (const SegmentRecord& r : part.records) {
      const TensorDesc& d = layout[r.tensor_index];
      const auto [from, to] = ByteRange(d.dtype, r.first_element, r.element_count);
      std::memcpy(view.tensors[r.tensor_index].data + from, current->tensors[r.tensor_index].data + from,
                  to - from);
    }
  }
  ApplyOptions options;
  options.exclusive_view = true;  // the scratch view is ours alone
  return Apply(view, patch, base_digest, pool, options);
}

}  // namespace

Status AgentImpl::PublishRankPart(RankPart part, uint32_t timeout_ms) {
  return GatherRankPart(std::move(part), timeout_ms, /*resume=*/false);
}

Status AgentImpl::ResumeRankPart(RankPart part, uint32_t timeout_ms) {
  return GatherRankPart(std::move(part), timeout_ms, /*resume=*/true);
}

Status AgentImpl::GatherRankPart(RankPart part, uint32_t timeout_ms, bool resume) {
  TERN_REQUIRE(opt_.root, kInvalidArgument, "publish from ranks: this agent is not the root");
  TERN_REQUIRE(!leadership_lost_, kUnavailable, "publish from ranks: this root no longer leads the board");
  TERN_REQUIRE(timeout_ms >= 1 && timeout_ms <= kMaxRankTimeoutMs, kInvalidArgument,
               "publish from ranks: timeout_ms ", timeout_ms, ": want 1..", kMaxRankTimeoutMs);
  TERN_REQUIRE(part.world_size >= 1 && part.world_size <= kMaxWorldSize, kInvalidArgument,
               "publish from ranks: world size ", part.world_size, ": want 1..", kMaxWorldSize);
  TERN_REQUIRE(part.rank < part.world_size, kInvalidArgument, "publish from ranks: unknown rank ",
               part.rank, " (world size ", part.world_size, ")");
  const uint64_t version = part.version;
  const uint32_t rank = part.rank;
  // Hashed before the part joins, outside ranks_mu_ (a shard's bytes at
  // about a memcpy's speed): the terms committed parts left (rank_terms_)
  // are lost on a restart or a takeover, the root's view is not.
  const std::optional<ViewDigest> own_terms =
      resume ? BaseTermsInOwnView(part) : std::optional<ViewDigest>();
  MutexLock lock(ranks_mu_);
  TERN_REQUIRE(!ranks_closed_, kCancelled, "publish from ranks: the agent is stopping");
  const auto now = std::chrono::steady_clock::now();
  if (assembly_ && !assembly_->committing && assembly_->deadline <= now) {
    // Its waiters are gone or about to wake: fail it here, not later.
    rank_outcomes_[assembly_->generation] = TERN_ERROR(
        kTimeout, "publish from ranks: version ", assembly_->version, ": no part from rank(s) ",
        MissingRanks(assembly_->parts, assembly_->world_size), " within ", assembly_->timeout_ms,
        " ms; nothing published");
    assembly_.reset();
    ranks_cv_.SignalAll();
  }
  if (resume) {
    // A resumed part never opens a version: the one it belongs to is gone
    // (committed, failed at its deadline, or never started), and a lone
    // part would only time out. Checked before it joins, so a wrong resume
    // fails nobody else's part.
    const bool open = assembly_ && assembly_->version == version && !assembly_->committing;
    // The messages fit the admin client's 300 bytes of an answer.
    TERN_REQUIRE(open, kMismatch, "resume: version ", version, " is not being gathered (HEAD ",
                 board_->head(), "); nothing taken: if HEAD is ", version,
                 " it committed; else publish it anew on every rank, this one from HEAD");
    const RankAssembly& a = *assembly_;
    TERN_REQUIRE(!a.parts.count(rank), kMismatch, "resume: rank ", rank, "'s part of version ",
                 version, " is here already; nothing taken: wait for the version's outcome");
    TERN_REQUIRE(a.parts.empty() || a.parts.begin()->second.base_version == part.base_version,
                 kMismatch, "resume: rank ", rank, " starts at version ", part.base_version,
                 ", the other parts at ", a.parts.begin()->second.base_version,
                 "; nothing taken: resume from that version's bytes");
    // Its base against the root's own view of that version, or else what
    // its part of that version committed, when this root committed it: a
    // wrong base would otherwise fail every rank's part at the assembly's
    // digest check.
    std::optional<ViewDigest> expected = own_terms;
    const char* against = "the root's view";
    if (!expected) {
      if (auto known = rank_terms_.find(rank); rank_terms_version_ == part.base_version &&
                                                 known != rank_terms_.end() &&
                                                 known->second.shards == part.shards) {
        expected = known->second.terms;
        against = "its committed part's";
      }
    }
    if (expected)
      TERN_REQUIRE(*expected == part.base_terms, kMismatch, "resume: rank ", rank, "'s base is not version ",
                   part.base_version, "'s bytes of its shards (their digest terms differ from ", against,
                   "); nothing taken: resume from a view serving ", part.base_version);
  }
  if (!assembly_) {
    assembly_.emplace();
    assembly_->generation = next_generation_++;
    assembly_->version = version;
    assembly_->world_size = part.world_size;
    assembly_->timeout_ms = timeout_ms;
    assembly_->deadline = now + std::chrono::milliseconds(timeout_ms);
  }
  RankAssembly& a = *assembly_;
  TERN_REQUIRE(a.version == version, kUnavailable, "publish from ranks: rank ", rank,
               "'s part of version ", version, " while version ", a.version,
               " is being gathered; nothing of it was taken");
  TERN_REQUIRE(!a.committing, kInvalidArgument, "publish from ranks: rank ", rank,
               " sent a part of version ", version, " after every rank's part was there");
  TERN_REQUIRE(a.world_size == part.world_size, kInvalidArgument, "publish from ranks: rank ", rank,
               " says the world has ", part.world_size, " ranks, the first part of version ",
               version, " said ", a.world_size);
  TERN_REQUIRE(!a.parts.count(rank), kInvalidArgument, "publish from ranks: rank ", rank,
               " already sent its part of version ", version);
  const uint64_t generation = a.generation;
  a.parts.emplace(rank, std::move(part));
  if (a.parts.size() == a.world_size) {
    // The last part: this caller commits, the others wait for its outcome.
    a.committing = true;
    std::vector<RankPart> parts;
    for (auto& [r, p] : a.parts) parts.push_back(std::move(p));
    const uint32_t world = a.world_size;
    a.parts.clear();
    std::map<uint32_t, RankTerms> committed_terms;
    for (const RankPart& p : parts) committed_terms[p.rank] = {p.shards, p.target_terms};
    lock.Unlock();
    Status s;
    {
      MutexLock publish_lock(publish_mu_);
      s = CommitRankParts(std::move(parts), version, world);
    }
    lock.Lock();
    if (s.ok()) {
      rank_terms_version_ = version;
      rank_terms_ = std::move(committed_terms);
    }
    rank_outcomes_[generation] = s;
    while (rank_outcomes_.size() > kKeptOutcomes) rank_outcomes_.erase(rank_outcomes_.begin());
    assembly_.reset();
    ranks_cv_.SignalAll();
    return s;
  }
  const auto deadline = a.deadline;
  const bool done = ranks_cv_.WaitUntil(deadline, [&]() REQUIRES(ranks_mu_) {
    return rank_outcomes_.count(generation) > 0 ||
           (assembly_ && assembly_->generation == generation && assembly_->committing);
  });
  if (!done && assembly_ && assembly_->generation == generation && !assembly_->committing) {
    rank_outcomes_[generation] = TERN_ERROR(
        kTimeout, "publish from ranks: version ", version, ": no part from rank(s) ",
        MissingRanks(assembly_->parts, assembly_->world_size), " within ", assembly_->timeout_ms,
        " ms; nothing published");
    assembly_.reset();
    ranks_cv_.SignalAll();
  }
  // Committing: bounded by the publish itself.
  ranks_cv_.Wait([&]() REQUIRES(ranks_mu_) { return rank_outcomes_.count(generation) > 0; });
  return rank_outcomes_[generation];
}

std::optional<ViewDigest> AgentImpl::BaseTermsInOwnView(const RankPart& part) {
  MutexLock publish_lock(publish_mu_);
  if (part.base_version == 0 || store_->version() != part.base_version) return std::nullopt;
  OpenOptions open;
  open.env = &env_;
  auto current = Checkpoint::Open(store_->current_path(), open);
  if (!current.ok()) return std::nullopt;
  const ServeView& view = (*current)->view();
  ViewDigest terms;
  for (const RankShardRange& r : part.shards) {
    const TensorRef* t = view.Find(r.tensor);
    if (t == nullptr) return std::nullopt;
    const auto said = std::find_if(part.layout.begin(), part.layout.end(),
                                   [&](const TensorDesc& d) { return d.name == r.tensor; });
    if (said == part.layout.end() || !said->SameLayout(*t->desc)) return std::nullopt;
    const uint64_t n = t->desc->elements();
    if (r.element_count == 0 || r.first_element > n || r.element_count > n - r.first_element)
      return std::nullopt;
    terms += ComputeElementTerms(*t, r.first_element, r.first_element + r.element_count);
  }
  return terms;
}

AdminRoute AgentImpl::ViewRowsRoute() {
  return {"GET", "/view/rows", [this](const AdminRequest& req) { return ViewRows(req); },
          /*mutating=*/false, /*private_read=*/true};
}

AdminResponse AgentImpl::ViewRows(const AdminRequest& req) {
  auto request = ParseViewRowsRequest(req);
  if (!request.ok()) return TextAnswer(400, request.status().message());
  if (!publish_mu_.TryLockFor(std::chrono::milliseconds(kViewRowsWaitMs)))
    return TextAnswer(
        503, "view rows: the root is publishing a version (its view is changing); ask again");
  MutexLock publish_lock(publish_mu_, AdoptLock{});
  // The version first: a mismatch needs no open of the view.
  const uint64_t served = store_->version();
  Result<std::string> rows = ReadViewRows(ServeView{}, served, *request);
  if (served == request->version) {
    if (!rows_view_ || rows_view_version_ != served) {
      rows_view_.reset();
      OpenOptions open;
      open.env = &env_;
      auto current = Checkpoint::Open(store_->current_path(), open);
      if (current.ok()) {
        rows_view_ = std::move(current).value();
        rows_view_version_ = served;
      } else {
        rows = current.status().WithContext("view rows: the root's view");
      }
    }
    if (rows_view_) rows = ReadViewRows(rows_view_->view(), served, *request);
  }
  publish_lock.Unlock();
  if (!rows.ok()) return TextAnswer(ViewRowsHttpStatus(rows.status()), rows.status().message());
  return AdminResponse{200, "application/octet-stream", std::move(rows).value()};
}

void AgentImpl::CloseRankParts() {
  MutexLock lock(ranks_mu_);
  ranks_closed_ = true;
  if (assembly_ && !assembly_->committing) {
    rank_outcomes_[assembly_->generation] =
        TERN_ERROR(kCancelled, "publish from ranks: version ", assembly_->version,
                   ": the root is stopping; nothing published");
    assembly_.reset();
  }
  ranks_cv_.SignalAll();
}

Status AgentImpl::CommitRankParts(std::vector<RankPart> parts, uint64_t version, uint32_t world_size) {
  const double t0 = NowS();
  const uint64_t head = board_->head();
  TERN_REQUIRE(version > head, kInvalidArgument, "publish from ranks: version ", version,
               " is not newer than HEAD ", head);
  TERN_REQUIRE(store_->version() == head, kUnavailable, "publish from ranks: the root serves version ",
               store_->version(), ", not HEAD ", head,
               " (it took the board over): publish one version from a checkpoint or memory first");
  std::vector<TensorDesc> layout;
  ViewDigest base_digest;
  std::unique_ptr<Checkpoint> current;  // the root's view of HEAD (none before the first version)
  if (head != 0) {
    OpenOptions open;
    open.env = &env_;
    TERN_ASSIGN_OR_RETURN(current, Checkpoint::Open(store_->current_path(), open));
    for (const auto& t : current->view().tensors) layout.push_back(*t.desc);
    base_digest = store_->digest();
  } else {
    layout = parts.front().layout;
    base_digest = ZeroViewDigest(layout);
  }
  uint64_t view_bytes = 0;
  for (const TensorDesc& d : layout) view_bytes += d.bytes();
  ViewDigest target;
  auto patch = AssembleRankParts(layout, head, version, base_digest, parts, world_size, &target);
  if (!patch.ok()) return patch.status().WithContext("publish from ranks: version " + std::to_string(version));
  for (const RankPart& part : parts) {
    Status s = VerifyRankRecords(layout, current ? &current->view() : nullptr, head, version,
                                 base_digest, part, pool_);
    TERN_REQUIRE(s.ok(), kMismatch, "publish from ranks: version ", version, ": rank ", part.rank,
                 "'s records do not decode to the digest deltas they claim (", s.ToString(),
                 "); nothing published");
  }
  current.reset();
  parts.clear();
  const bool keyframe_due = head != 0 && board_->KeyframeDue(version, patch->size());
  PublishOptions options;
  options.segment_elements = opt_.segment_elements;
  options.nibble_coding = opt_.patch_nibbles;
  TERN_ASSIGN_OR_RETURN(PublishResult result,
                        PublishPatch(*board_, *Signer(), std::move(patch).value(), version, options, pool_));
  TERN_REQUIRE(result.manifest.target_digest == target, kInternal, "publish from ranks: version ",
               version, " recorded with another target digest than its parts'");
  TERN_RETURN_IF_ERROR(ServeAndAnnounceLocked(t0, NowS(), version, result, view_bytes, "", {}));
  if (keyframe_due) {
    // A late keyframe from the board's own objects (the root never held the
    // version's full view before it applied the patch).
    auto keyframe = MakeSquash(*board_, *Signer(), 0, version, options, pool_);
    if (keyframe.ok()) Log("made a late keyframe of version " + std::to_string(version));
    else Log("no keyframe of version " + std::to_string(version) + ": " + keyframe.status().ToString());
  }
  Log("published version " + std::to_string(version) + " from " + std::to_string(world_size) +
      " ranks in " + std::to_string(NowS() - t0) + " s");
  return Status::Ok();
}

}  // namespace tern::agent

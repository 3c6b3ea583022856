// ViewStore (agent/view_store/view_store.h): two checkpoint buffers, a kept patch and a
// commit record; here the apply, the switch and the spare. The record, Open
// and crash recovery: view_store_open.cc. Sequence and crash analysis:
// docs/agent/apply.md.
#include "agent/view_store/view_store.h"

#include <functional>
#include <optional>

#include "agent/view_store/view_store_state.h"
#include "base/path.h"
#include "tern/checkpoint.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern::agent {

using view_store_internal::EncodeState;
using view_store_internal::KeptName;
using view_store_internal::Paths;
using view_store_internal::Relink;
using view_store_internal::SyncServed;
using view_store_internal::WriteState;

Result<SlotWriter> SlotWriter::Open(Env& env, const std::string& path) {
  SlotWriter w;
  OpenOptions options;
  options.env = &env;
  TERN_ASSIGN_OR_RETURN(w.checkpoint, Checkpoint::Open(path, options));
  for (const std::string& file : w.checkpoint->files()) {
    TERN_ASSIGN_OR_RETURN(auto map, env.Map(path + "/" + file, MapMode::kReadWrite));
    w.maps.push_back(std::move(map));
  }
  const auto& descs = w.checkpoint->tensors();
  const auto& locations = w.checkpoint->locations();
  for (size_t i = 0; i < descs.size(); ++i) {
    const TensorLocation& loc = locations[i];
    const MappedFile& map = *w.maps[loc.file_index];
    // The file was validated by Open through another mapping; someone may
    // have changed it since.
    TERN_REQUIRE(loc.offset_bytes <= map.size() && loc.size_bytes <= map.size() - loc.offset_bytes,
                 kCorrupt, map.path(), " changed while it was opened for writing");
    w.view.tensors.push_back(MutableTensorRef{&descs[i], map.data() + loc.offset_bytes});
  }
  return w;
}

Status SlotWriter::Sync() {
  for (auto& map : maps) TERN_RETURN_IF_ERROR(map->Sync());
  return Status::Ok();
}

ViewStore::ViewStore(Env& env, std::string dir, ThreadPool& pool, LogFn log,
                     ViewStoreOptions options)
    : env_(env),
      dir_(std::move(dir)),
      pool_(pool),
      log_(log ? std::move(log) : StderrLog()),
      options_(options),
      state_(std::make_unique<State>()) {}

ViewStore::~ViewStore() = default;

uint64_t ViewStore::version() const { return state_->version; }
uint32_t ViewStore::epoch() const { return state_->epoch; }
ViewDigest ViewStore::digest() const { return state_->digest; }
std::string ViewStore::current_path() const { return dir_ + "/current"; }

namespace {

// Seed and InstallKeyframe: `build` writes a complete, synced checkpoint
// directory at the spare's path (which is empty when it runs); then commit
// and switch. The old current becomes an unusable spare (no patch leads from
// its version to the new one).
Status InstallInSpare(Env& env, const Paths& p, ViewStore::State& s, std::string& recorded,
                      LogFn& log, uint64_t version, uint32_t epoch, const ViewDigest& digest,
                      const std::vector<SlotFile>& files,
                      const std::function<Status(const std::string& slot_path)>& build) {
  if (!s.current.empty()) {
    // The served slot is what a crash while the spare is rebuilt falls back
    // to: durable first (the deferred sync), recorded in the same write.
    TERN_RETURN_IF_ERROR(SyncServed(env, p, s));
    // Also when memory already says unusable: a commit that failed after
    // its rename may have left state.json ahead of memory; this puts it back.
    ViewStore::State marked = s;
    marked.spare_usable = false;
    TERN_RETURN_IF_ERROR(WriteState(env, p, marked, recorded));
    s.spare_usable = false;
  }
  s.prepared.reset();  // the spare is rebuilt
  s.stream.reset();
  s.stream_slot.reset();
  const std::string slot = s.current.empty() ? "a" : s.spare();
  TERN_RETURN_IF_ERROR(RemoveTree(env, p.slot(slot)));
  TERN_RETURN_IF_ERROR(build(p.slot(slot)));
  TERN_RETURN_IF_ERROR(WriteSlotFiles(env, p.slot(slot), files));
  ViewStore::State next;
  next.current = slot;
  next.version = version;
  next.epoch = epoch;
  next.digest = digest;
  TERN_RETURN_IF_ERROR(WriteState(env, p, next, recorded));  // the commit point
  const std::string old_kept = s.kept;
  s = next;
  Status linked = Relink(env, p, slot);
  if (!linked.ok()) {
    s.link_dirty = true;
    return linked;
  }
  if (!old_kept.empty()) {
    Status removed = RemoveTree(env, p.slot(old_kept));
    if (!removed.ok()) log("view_store: " + removed.ToString());
  }
  log("view_store: serving version " + std::to_string(version) +
      (epoch != 0 ? " of epoch " + std::to_string(epoch) : std::string()) + " (" +
      digest.ToString() + ")");
  return Status::Ok();
}

// Positions (epoch, version) only go up (docs/agent/board.md §4a).
bool Above(uint32_t epoch, uint64_t version, const ViewStore::State& s) {
  return std::pair(epoch, version) > std::pair(s.epoch, s.version);
}

}  // namespace

Status ViewStore::Seed(const std::string& checkpoint_path, uint64_t version,
                       const ViewDigest& expected, const std::vector<SlotFile>& files,
                       uint32_t epoch) {
  State& s = *state_;
  TERN_REQUIRE(Above(epoch, version, s), kInvalidArgument, "view store: seed version ", version,
               " (epoch ", epoch, ") is not newer than the served ", s.version, " (epoch ",
               s.epoch, ")");
  OpenOptions options;
  options.env = &env_;
  TERN_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(checkpoint_path, options));
  const ViewDigest got = ComputeDigest(base->view(), pool_);
  TERN_REQUIRE(got == expected, kMismatch, "view store: ", checkpoint_path, " has digest ",
               got.ToString(), ", version ", version, " is ", expected.ToString());
  TERN_ASSIGN_OR_RETURN(FileType type, env_.TypeOf(checkpoint_path, /*follow_links=*/true));
  auto build = [&](const std::string& slot) -> Status {
    CloneOptions clone_options;
    clone_options.env = &env_;
    if (type == FileType::kDirectory) {
      TERN_ASSIGN_OR_RETURN(auto copy,
                            WritableCheckpoint::CloneForWrite(*base, slot, clone_options));
      return copy->Commit();
    }
    // A single file becomes a directory holding it as model.safetensors, so
    // both slots and the link always have one form.
    const std::string staging = slot + ".tmp-" + RandomHex();
    TERN_RETURN_IF_ERROR(env_.CreateDir(staging));
    Status st = [&]() -> Status {
      TERN_ASSIGN_OR_RETURN(auto copy, WritableCheckpoint::CloneForWrite(
                                           *base, staging + "/model.safetensors", clone_options));
      TERN_RETURN_IF_ERROR(copy->Commit());
      TERN_RETURN_IF_ERROR(env_.SyncPath(staging));
      TERN_RETURN_IF_ERROR(env_.Rename(staging, slot, RenameMode::kNoReplace));
      return env_.SyncPath(ParentDir(slot));
    }();
    if (!st.ok()) (void)RemoveTree(env_, staging);
    return st;
  };
  return InstallInSpare(env_, Paths(dir_), s, recorded_, log_, version, epoch, expected, files,
                        build);
}

Status ViewStore::InstallKeyframe(std::span<const uint8_t> keyframe, uint64_t version,
                                  const std::vector<SlotFile>& files, uint32_t epoch) {
  State& s = *state_;
  TERN_REQUIRE(Above(epoch, version, s), kInvalidArgument, "view store: keyframe version ",
               version, " (epoch ", epoch, ") is not newer than the served ", s.version,
               " (epoch ", s.epoch, ")");
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(keyframe));
  TERN_REQUIRE(info.target_version == version, kMismatch, "view store: keyframe targets version ",
               info.target_version, ", expected ", version);
  std::vector<TensorDesc> descs;
  descs.reserve(info.tensors.size());
  for (const TensorPatchInfo& t : info.tensors)
    descs.push_back(TensorDesc{t.name, t.dtype, t.shape});
  SortLikeReferenceWriter(descs);
  auto build = [&](const std::string& slot) -> Status {
    CreateOptions options;
    options.env = &env_;
    TERN_ASSIGN_OR_RETURN(auto w, WritableCheckpoint::Create(slot, descs, {}, options));
    // The zero view's digest is a function of the layout alone, but only the
    // full computation over the (sparse, zero) bytes is the digest Apply
    // checks against, so a keyframe whose base is not the zero view fails.
    const ViewDigest zero = ComputeDigest(AsConst(w->view()), pool_);
    ApplyOptions apply;
    apply.exclusive_view = true;  // a staging copy nobody else sees
    TERN_RETURN_IF_ERROR(Apply(w->view(), keyframe, zero, pool_, apply));
    return w->Commit();
  };
  // Apply verified that the bytes reach the patch's target digest.
  return InstallInSpare(env_, Paths(dir_), s, recorded_, log_, version, epoch, info.target_digest,
                        files, build);
}

namespace {

// Opens the spare (which state.json must already call unusable) and brings
// it to the served version with the kept patch, in place, unsynced. Fails
// when no kept patch leads there or it does not reach the served digest.
Result<SlotWriter> OpenSpareAtServed(Env& env, const Paths& p, const ViewStore::State& s,
                                     ThreadPool& pool) {
  TERN_ASSIGN_OR_RETURN(SlotWriter w, SlotWriter::Open(env, p.slot(s.spare())));
  if (s.spare_version != s.version) {
    TERN_REQUIRE(!s.kept.empty() && s.kept_from == s.spare_version && s.kept_to == s.version,
                 kNotFound, "no kept patch from ", s.spare_version, " to ", s.version);
    TERN_ASSIGN_OR_RETURN(auto kept, env.Map(p.slot(s.kept), MapMode::kReadOnly));
    ApplyOptions exclusive;
    exclusive.exclusive_view = true;  // the spare is private until the switch
    ViewDigest reached;
    TERN_RETURN_IF_ERROR(Apply(w.view, kept->bytes(), s.spare_digest, pool, exclusive, &reached));
    TERN_REQUIRE(reached == s.digest, kMismatch, "kept patch reaches ", reached.ToString());
  }
  return w;
}

// One full copy of the served slot into the spare's directory (holes stay
// holes), not yet committed: the caller patches it or commits it as is.
Result<std::unique_ptr<WritableCheckpoint>> CloneServedIntoSpare(Env& env, const Paths& p,
                                                                 const ViewStore::State& s,
                                                                 LogFn& log) {
  log("view_store: copying views/" + s.current + " to views/" + s.spare());
  const std::string spare_path = p.slot(s.spare());
  TERN_RETURN_IF_ERROR(RemoveTree(env, spare_path));
  OpenOptions options;
  options.env = &env;
  TERN_ASSIGN_OR_RETURN(auto served, Checkpoint::Open(p.slot(s.current), options));
  CloneOptions clone_options;
  clone_options.env = &env;
  return WritableCheckpoint::CloneForWrite(*served, spare_path, clone_options);
}

// Nothing writes the spare while state.json calls it usable. Written even
// when memory already says unusable (a commit that failed after its rename
// may have left state.json ahead of memory; this puts it back), unless the
// last write of state.json succeeded with exactly this record: then the
// write and its two fsyncs would change nothing (Advance after an in-place
// PrepareSpare, which marked the spare, saves them on the critical path).
//
// Before the spare is written the served slot must be durable (the deferred
// sync of the last switch): it is what a crash while the spare is written
// falls back to, and it becomes the (usable, so durable) spare at the next
// commit. Its "synced" goes into the same record.
Status MarkSpareUnusable(Env& env, const Paths& p, ViewStore::State& s, std::string& recorded) {
  TERN_RETURN_IF_ERROR(SyncServed(env, p, s));
  ViewStore::State marked = s;
  marked.spare_usable = false;
  if (recorded.empty() || EncodeState(marked) != recorded)
    TERN_RETURN_IF_ERROR(WriteState(env, p, marked, recorded));
  s.spare_usable = false;
  return Status::Ok();
}

}  // namespace

Status ViewStore::PrepareSpare() {
  State& s = *state_;
  // A stream owns the spare (it was ready when the stream began, so the
  // served slot was synced).
  if (s.current.empty() || s.stream) return Status::Ok();
  const Paths p(dir_);
  Clock& clock = env_.clock();
  const uint64_t start_us = clock.NowUs();
  if (!s.synced) {
    // The deferred sync of the last switch, off the critical path.
    TERN_RETURN_IF_ERROR(SyncServed(env_, p, s));
    if (spare_ready()) TERN_RETURN_IF_ERROR(WriteState(env_, p, s, recorded_));
    log_(internal::StrCat("view_store: views/", s.current, " synced (version ", s.version, ") in ",
                          (clock.NowUs() - start_us) / 1000, " ms"));
  }
  if (spare_ready()) return Status::Ok();
  const bool usable = s.spare_usable;
  TERN_RETURN_IF_ERROR(MarkSpareUnusable(env_, p, s, recorded_));
  if (usable) {
    auto w = OpenSpareAtServed(env_, p, s, pool_);
    if (w.ok()) {
      // Not synced and not recorded: see State::prepared.
      s.prepared = std::make_shared<SlotWriter>(std::move(w).value());
      log_(internal::StrCat("view_store: spare views/", s.spare(), " at version ", s.version,
                            " (in place, synced after the next switch) in ",
                            (clock.NowUs() - start_us) / 1000, " ms"));
      return Status::Ok();
    }
    log_("view_store: spare views/" + s.spare() + " unusable: " + w.status().ToString());
  }
  {
    TERN_ASSIGN_OR_RETURN(auto copy, CloneServedIntoSpare(env_, p, s, log_));
    TERN_RETURN_IF_ERROR(copy->Commit());
  }
  // The spare's bytes are durable; now the record may say so. The kept
  // patch is of no further use (a crash before its removal: Open removes it).
  State next = s;
  next.spare_usable = true;
  next.spare_version = s.version;
  next.spare_epoch = s.epoch;
  next.spare_digest = s.digest;
  next.kept.clear();
  next.kept_from = next.kept_to = 0;
  TERN_RETURN_IF_ERROR(WriteState(env_, p, next, recorded_));
  const std::string old_kept = s.kept;
  s = next;
  if (!old_kept.empty()) {
    Status removed = env_.RemoveFile(p.slot(old_kept));
    if (!removed.ok()) log_("view_store: " + removed.ToString());
  }
  log_(internal::StrCat("view_store: spare views/", s.spare(), " at version ", s.version,
                        " (copied) in ", (clock.NowUs() - start_us) / 1000, " ms"));
  return Status::Ok();
}

bool ViewStore::served_synced() const { return state_->synced; }

bool ViewStore::spare_ready() const {
  return state_->prepared != nullptr ||
         (state_->spare_usable && state_->spare_version == state_->version);
}

Status ViewStore::AdvancePrefix(std::span<const uint8_t> prefix) {
  State& s = *state_;
  if (s.current.empty()) return Status::Ok();
  const Paths p(dir_);
  if (!s.stream) {
    if (!spare_ready()) return Status::Ok();  // the whole-patch path will copy or catch up
    // Nothing about the patch is known before its manifest: wait for it, so
    // that a patch for another base never touches the spare.
    TERN_ASSIGN_OR_RETURN(std::optional<PatchInfo> head, InspectHead(prefix));
    if (!head) return Status::Ok();
    const PatchInfo& info = *head;
    if (info.base_version != s.version || info.base_digest != s.digest ||
        info.target_version <= s.version)
      return Status::Ok();
    if (s.link_dirty) {
      TERN_RETURN_IF_ERROR(Relink(env_, p, s.current));
      s.link_dirty = false;
    }
    std::shared_ptr<SlotWriter> slot = std::move(s.prepared);  // at version(), unsynced
    s.prepared.reset();
    TERN_RETURN_IF_ERROR(MarkSpareUnusable(env_, p, s, recorded_));
    if (!slot) {
      // spare_ready(): the spare holds version() durably; no patch to apply.
      TERN_ASSIGN_OR_RETURN(SlotWriter w, SlotWriter::Open(env_, p.slot(s.spare())));
      slot = std::make_shared<SlotWriter>(std::move(w));
    }
    s.stream_slot = std::move(slot);
    s.stream = std::make_shared<PatchStreamApply>(s.stream_slot->view, s.digest, pool_);
    s.stream_first_us = env_.clock().NowUs();
  }
  Status st = s.stream->Feed(prefix);
  if (!st.ok()) {
    log_("view_store: streamed apply into views/" + s.spare() + " failed: " + st.ToString() +
         "; the spare is unusable");
    AbortAdvance();
  }
  return st;
}

void ViewStore::AbortAdvance() {
  State& s = *state_;
  s.stream.reset();
  s.stream_slot.reset();  // state.json already calls the spare unusable
  s.spare_usable = false;
}

bool ViewStore::advancing() const { return state_->stream != nullptr; }

Status ViewStore::Advance(std::span<const uint8_t> patch, const std::vector<SlotFile>& files,
                          uint32_t epoch) {
  State& s = *state_;
  const Paths p(dir_);
  TERN_REQUIRE(!s.current.empty(), kInvalidArgument,
               "view store: nothing served yet (Seed or InstallKeyframe first)");
  // Only the manifest here: the records are decoded once, by Apply (which
  // restores the spare if any of them is bad: exclusive_view) or by the
  // stream's Finish. Inspecting them all first decoded every record twice,
  // the first time single-threaded, on the critical path; only a full copy
  // is worth avoiding for a bad patch, and that path still inspects first.
  TERN_ASSIGN_OR_RETURN(std::optional<PatchInfo> head, InspectHead(patch));
  TERN_REQUIRE(head.has_value(), kCorrupt, "view store: truncated patch: ", patch.size(),
               " bytes, no complete manifest");
  const PatchInfo& info = *head;
  TERN_REQUIRE(info.base_version == s.version && info.base_digest == s.digest, kMismatch,
               "view store: patch base is version ", info.base_version, " (",
               info.base_digest.ToString(), "), serving ", s.version, " (", s.digest.ToString(),
               ")");
  TERN_REQUIRE(Above(epoch, info.target_version, s) && epoch >= s.epoch, kMismatch,
               "view store: patch target version ", info.target_version, " (epoch ", epoch,
               ") is not newer than ", s.version, " (epoch ", s.epoch, ")");
  if (s.link_dirty) {
    TERN_RETURN_IF_ERROR(Relink(env_, p, s.current));
    s.link_dirty = false;
  }
  // Phase times for the log line (the agent's apply-time metric).
  Clock& clock = env_.clock();
  const uint64_t start_us = clock.NowUs();
  uint64_t catch_up_us = 0, apply_us = 0, sync_us = 0;
  ApplyOptions exclusive;
  exclusive.exclusive_view = true;  // the spare is private until the switch

  ViewDigest target;
  const char* mode = "streamed";
  bool streamed = false;
  // The spare's mapping after an in-place or streamed apply: its pages are
  // dirty, synced here only with sync_at_switch, else after the commit
  // (the deferred sync). Null after a copy (Commit synced it).
  std::shared_ptr<SlotWriter> written;
  if (s.stream) {
    // The records that arrived before the last chunk are in the spare; the
    // rest, the digest check and the sync remain.
    std::shared_ptr<PatchStreamApply> stream = std::move(s.stream);
    std::shared_ptr<SlotWriter> slot = std::move(s.stream_slot);
    s.stream.reset();
    s.stream_slot.reset();
    const uint64_t before = stream->records_written();
    uint64_t t_us = clock.NowUs();
    Status st = stream->target_version() == info.target_version
                    ? stream->Finish(patch, &target)
                    : TERN_ERROR(kMismatch, "it was for version ", stream->target_version());
    if (st.ok()) {
      apply_us = clock.NowUs() - t_us;
      written = std::move(slot);
      streamed = true;
      log_(internal::StrCat("view_store: ", before, " of ", stream->records_written(),
                            " records applied while the patch arrived (from ",
                            (start_us - s.stream_first_us) / 1000, " ms before it completed)"));
    } else {
      log_("view_store: streamed apply into views/" + s.spare() + " failed: " + st.ToString() +
           "; applying the whole patch to a copy");
    }
  }
  if (!streamed) {
    const bool usable = s.spare_usable;
    {
      // The last switch's deferred sync, when this version came before
      // PrepareSpare did it: on the critical path, as the sync was before.
      const uint64_t t_us = clock.NowUs();
      TERN_RETURN_IF_ERROR(SyncServed(env_, p, s));
      sync_us += clock.NowUs() - t_us;
    }
    TERN_RETURN_IF_ERROR(MarkSpareUnusable(env_, p, s, recorded_));
    std::shared_ptr<SlotWriter> slot = std::move(s.prepared);  // at version(), unsynced
    s.prepared.reset();
    if (!slot && usable) {
      // Bring the spare to the served version: in place, with the kept patch
      // (nothing to do when PrepareSpare already did it).
      const uint64_t t_us = clock.NowUs();
      auto w = OpenSpareAtServed(env_, p, s, pool_);
      if (w.ok()) {
        slot = std::make_shared<SlotWriter>(std::move(w).value());
      } else {
        log_("view_store: spare views/" + s.spare() + " unusable: " + w.status().ToString());
      }
      catch_up_us = clock.NowUs() - t_us;
    }
    mode = slot ? "in place" : "copied";
    uint64_t t_us = clock.NowUs();
    if (slot) {
      Status st = Apply(slot->view, patch, s.digest, pool_, exclusive, &target);
      if (!st.ok()) {
        // Apply restored the spare: it holds the served version, complete. Say
        // so, to spare the next Advance a copy; an error here costs only that.
        State restored = s;
        if (slot->Sync().ok()) {
          restored.spare_usable = true;
          restored.spare_version = s.version;
          restored.spare_epoch = s.epoch;
          restored.spare_digest = s.digest;
          if (WriteState(env_, p, restored, recorded_).ok()) s = restored;
        }
        return st;
      }
      apply_us = clock.NowUs() - t_us;
      written = std::move(slot);
    } else {
      // One full copy of the served slot (holes stay holes), patched before it
      // is committed; Commit fsyncs it. A damaged patch is refused before
      // the copy is made.
      TERN_RETURN_IF_ERROR(Inspect(patch).status());
      TERN_ASSIGN_OR_RETURN(auto copy, CloneServedIntoSpare(env_, p, s, log_));
      TERN_RETURN_IF_ERROR(Apply(copy->view(), patch, s.digest, pool_, exclusive, &target));
      apply_us = clock.NowUs() - t_us;  // with the copy
      t_us = clock.NowUs();
      TERN_RETURN_IF_ERROR(copy->Commit());
      sync_us += clock.NowUs() - t_us;
    }
  }
  if (written && options_.sync_at_switch) {
    const uint64_t t_us = clock.NowUs();
    TERN_RETURN_IF_ERROR(written->Sync());
    sync_us += clock.NowUs() - t_us;
    written.reset();
  }
  // The new version's model files, durable before the commit (the spare is
  // unusable in state.json until then, so a failure here serves nothing).
  TERN_RETURN_IF_ERROR(WriteSlotFiles(env_, p.slot(s.spare()), files));

  // The kept patch is written but not synced: it only saves a copy, and it
  // is checked whenever it is used (every record's checksum, and the digest
  // it reaches must be the served one, OpenSpareAtServed), so a kept file a
  // power loss emptied, truncated or lost costs one copy of the served slot,
  // never a wrong spare. Renamed into place so that no partial file carries
  // its name while the store runs.
  const std::string kept = KeptName(s.version, info.target_version);
  {
    const std::string tmp = p.slot(kept) + ".tmp-" + RandomHex();
    TERN_RETURN_IF_ERROR(WriteNewFile(env_, tmp, patch));
    Status st = env_.Rename(tmp, p.slot(kept), RenameMode::kReplace);
    if (!st.ok()) {
      (void)env_.RemoveFile(tmp);
      return st;
    }
  }
  State next;
  next.current = s.spare();
  next.version = info.target_version;
  next.epoch = epoch;
  next.digest = target;
  // Unsynced: the digest was verified from the changes and the page cache
  // holds every byte, so readers of the running member see the whole
  // version; after a power loss Open verifies the bytes before serving them.
  next.synced = written == nullptr;
  next.unsynced = written;
  // The old served slot, synced before the spare was first written.
  next.spare_usable = true;
  next.spare_version = s.version;
  next.spare_epoch = s.epoch;
  next.spare_digest = s.digest;
  next.kept = kept;
  next.kept_from = s.version;
  next.kept_to = info.target_version;
  // The commit point. If it fails, state.json may hold either record (the
  // rename may have happened); memory keeps the old one with an unusable
  // spare, which the next call writes back before it touches anything.
  TERN_RETURN_IF_ERROR(WriteState(env_, p, next, recorded_));
  const std::string old_kept = s.kept;
  s = next;
  Status linked = Relink(env_, p, s.current);
  if (!linked.ok()) {
    s.link_dirty = true;
    return linked;
  }
  if (!old_kept.empty() && old_kept != kept) {
    Status removed = env_.RemoveFile(p.slot(old_kept));
    if (!removed.ok()) log_("view_store: " + removed.ToString());
  }
  const uint64_t total_us = clock.NowUs() - start_us;
  log_(internal::StrCat("view_store: serving version ", s.version,
                        s.epoch != 0 ? internal::StrCat(" of epoch ", s.epoch) : std::string(), " (", mode,
                        "): ", total_us / 1000, " ms = catch-up ", catch_up_us / 1000, " + apply ",
                        apply_us / 1000, " + sync ", sync_us / 1000,
                        " + state, kept patch, switch ",
                        (total_us - catch_up_us - apply_us - sync_us) / 1000, " ms"));
  return Status::Ok();
}

}  // namespace tern::agent

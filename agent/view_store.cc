// ViewStore (agent/view_store.h): two checkpoint buffers, a kept patch and a
// commit record. Sequence and crash analysis: docs/agent/apply.md.
#include "agent/view_store.h"

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/path.h"
#include "tern/checkpoint.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern::agent {
namespace {

constexpr const char* kStateName = "state.json";
constexpr int kStateFormat = 1;
// state.json is a few hundred bytes; anything near this is not ours.
constexpr uint64_t kStateBytesMax = 64 * 1024;
// views/ and DIR hold a handful of entries; a bound for the cleanup listing.
constexpr uint64_t kDirEntriesMax = 100'000;

std::string KeptName(uint64_t from, uint64_t to) {
  return "keep-" + std::to_string(from) + "-" + std::to_string(to) + ".patch";
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// An existing checkpoint directory opened for in-place writes: the tensor
// table from Checkpoint::Open (validated), bytes through read-write mappings.
struct SlotWriter {
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<MappedFile>> maps;
  MutableServeView view;

  static Result<SlotWriter> Open(Env& env, const std::string& path) {
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
      TERN_REQUIRE(
          loc.offset_bytes <= map.size() && loc.size_bytes <= map.size() - loc.offset_bytes,
          kCorrupt, map.path(), " changed while it was opened for writing");
      w.view.tensors.push_back(MutableTensorRef{&descs[i], map.data() + loc.offset_bytes});
    }
    return w;
  }

  Status Sync() {
    for (auto& map : maps) TERN_RETURN_IF_ERROR(map->Sync());
    return Status::Ok();
  }
};

}  // namespace

// What state.json records, and what the store believes.
struct ViewStore::State {
  std::string current;  // "a" or "b"; empty: nothing served
  uint64_t version = 0;
  ViewDigest digest;
  // The spare slot holds spare_version (digest spare_digest) completely and
  // durably; false: unknown contents, never used without a full copy.
  bool spare_usable = false;
  uint64_t spare_version = 0;
  ViewDigest spare_digest;
  std::string kept;  // views/<kept>: patch kept_from -> kept_to; empty: none
  uint64_t kept_from = 0, kept_to = 0;
  // current was not re-pointed after the last commit (its rename failed).
  bool link_dirty = false;
  // Not recorded: PrepareSpare brought the spare to `version` in place and
  // kept its mapping, unsynced (state.json calls the spare unusable, so a
  // crash costs a copy, never a wrong spare). Advance applies through the
  // same mapping: its pages are dirty and mapped writable, so the apply
  // takes no write faults, and one sync covers both patches.
  std::shared_ptr<SlotWriter> prepared;
  // Not recorded: a streaming Advance in progress (AdvancePrefix), writing
  // the spare through stream_slot; state.json calls the spare unusable.
  std::shared_ptr<SlotWriter> stream_slot;
  std::shared_ptr<PatchStreamApply> stream;
  uint64_t stream_first_us = 0;  // env clock at the first write

  std::string spare() const { return current == "a" ? "b" : "a"; }
};

namespace {

std::string EncodeState(const ViewStore::State& s) {
  nlohmann::json j;
  j["format"] = kStateFormat;
  j["current"] = s.current;
  j["version"] = s.version;
  j["digest"] = s.digest.ToString();
  j["spare"] = {{"usable", s.spare_usable},
                {"version", s.spare_version},
                {"digest", s.spare_digest.ToString()}};
  if (s.kept.empty()) {
    j["kept"] = nullptr;
  } else {
    j["kept"] = {{"file", s.kept}, {"from", s.kept_from}, {"to", s.kept_to}};
  }
  return j.dump(1) + "\n";
}

// Strict: every field present with its type; anything else is kCorrupt.
Result<ViewStore::State> DecodeState(const std::string& text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TERN_REQUIRE(j.is_object(), kCorrupt, path, ": not a JSON object");
  auto u64 = [&](const nlohmann::json& o, const char* key) -> Result<uint64_t> {
    TERN_REQUIRE(o.is_object() && o.contains(key) && o[key].is_number_unsigned(), kCorrupt, path,
                 ": '", key, "' missing or not an unsigned integer");
    return o[key].get<uint64_t>();
  };
  auto str = [&](const nlohmann::json& o, const char* key) -> Result<std::string> {
    TERN_REQUIRE(o.is_object() && o.contains(key) && o[key].is_string(), kCorrupt, path, ": '", key,
                 "' missing or not a string");
    return o[key].get<std::string>();
  };
  auto digest = [&](const nlohmann::json& o, const char* key) -> Result<ViewDigest> {
    TERN_ASSIGN_OR_RETURN(std::string text, str(o, key));
    auto d = ViewDigest::Parse(text);
    TERN_REQUIRE(d.ok(), kCorrupt, path, ": '", key, "': ", d.status().ToString());
    return *d;
  };
  TERN_ASSIGN_OR_RETURN(uint64_t format, u64(j, "format"));
  TERN_REQUIRE(format == kStateFormat, kUnsupported, path, ": format ", format,
               " (this build reads ", kStateFormat, ")");
  ViewStore::State s;
  TERN_ASSIGN_OR_RETURN(s.current, str(j, "current"));
  TERN_REQUIRE(s.current == "a" || s.current == "b", kCorrupt, path, ": current must be a or b");
  TERN_ASSIGN_OR_RETURN(s.version, u64(j, "version"));
  TERN_REQUIRE(s.version > 0, kCorrupt, path, ": version 0 is never served");
  TERN_ASSIGN_OR_RETURN(s.digest, digest(j, "digest"));
  TERN_REQUIRE(j.contains("spare") && j["spare"].is_object(), kCorrupt, path, ": 'spare' missing");
  const nlohmann::json& spare = j["spare"];
  TERN_REQUIRE(spare.contains("usable") && spare["usable"].is_boolean(), kCorrupt, path,
               ": 'usable' missing or not a boolean");
  s.spare_usable = spare["usable"].get<bool>();
  TERN_ASSIGN_OR_RETURN(s.spare_version, u64(spare, "version"));
  TERN_ASSIGN_OR_RETURN(s.spare_digest, digest(spare, "digest"));
  TERN_REQUIRE(!s.spare_usable || s.spare_version <= s.version, kCorrupt, path, ": spare version ",
               s.spare_version, " is newer than the served ", s.version);
  TERN_REQUIRE(j.contains("kept"), kCorrupt, path, ": 'kept' missing");
  if (!j["kept"].is_null()) {
    TERN_ASSIGN_OR_RETURN(s.kept, str(j["kept"], "file"));
    TERN_ASSIGN_OR_RETURN(s.kept_from, u64(j["kept"], "from"));
    TERN_ASSIGN_OR_RETURN(s.kept_to, u64(j["kept"], "to"));
    TERN_REQUIRE(s.kept == KeptName(s.kept_from, s.kept_to), kCorrupt, path, ": kept file '",
                 s.kept, "' does not name its versions");
  }
  return s;
}

}  // namespace

ViewStore::ViewStore(Env& env, std::string dir, ThreadPool& pool, LogFn log)
    : env_(env),
      dir_(std::move(dir)),
      pool_(pool),
      log_(log ? std::move(log) : StderrLog()),
      state_(std::make_unique<State>()) {}

ViewStore::~ViewStore() = default;

uint64_t ViewStore::version() const { return state_->version; }
ViewDigest ViewStore::digest() const { return state_->digest; }
std::string ViewStore::current_path() const { return dir_ + "/current"; }

namespace {

struct Paths {
  std::string dir, views, state;
  explicit Paths(const std::string& d)
      : dir(d), views(d + "/views"), state(d + "/views/" + kStateName) {}
  std::string slot(const std::string& name) const { return views + "/" + name; }
};

// current.tmp-<hex> -> views/<slot>, renamed over DIR/current. Not synced:
// the link is derived from state.json, and Open re-points it from there after
// every restart, so a link the crash rolled back is repaired before anyone
// reads it (a reader sees the rename at once, durable or not).
Status Relink(Env& env, const Paths& p, const std::string& slot) {
  const std::string tmp = p.dir + "/current.tmp-" + RandomHex();
  TERN_RETURN_IF_ERROR(env.CreateSymlink("views/" + slot, tmp));
  Status st = env.Rename(tmp, p.dir + "/current", RenameMode::kReplace);
  if (!st.ok()) (void)env.RemoveFile(tmp);
  return st;
}

}  // namespace

Result<std::unique_ptr<ViewStore>> ViewStore::Open(Env& env, std::string dir, ThreadPool& pool,
                                                   LogFn log) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  TERN_REQUIRE(!dir.empty(), kInvalidArgument, "view store: empty directory name");
  std::unique_ptr<ViewStore> store(new ViewStore(env, dir, pool, std::move(log)));
  const Paths p(store->dir_);
  TERN_RETURN_IF_ERROR(CreateDirs(env, p.views));
  State& s = *store->state_;
  TERN_ASSIGN_OR_RETURN(FileType state_type, env.TypeOf(p.state, false));
  if (state_type != FileType::kMissing) {
    std::string text;
    TERN_RETURN_IF_ERROR(ReadFileToString(env, p.state, kStateBytesMax, &text));
    TERN_ASSIGN_OR_RETURN(s, DecodeState(text, p.state));
    TERN_ASSIGN_OR_RETURN(FileType cur, env.TypeOf(p.slot(s.current), false));
    TERN_REQUIRE(cur == FileType::kDirectory, kCorrupt, p.state, " serves views/", s.current,
                 ", which is missing");
  }
  // Leftovers of an interrupted run: staging copies, temporaries of atomic
  // writes, kept patches no longer named. Both slots stay, whatever they
  // hold: an unusable spare is replaced by the next Advance.
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(p.views, kDirEntriesMax));
  for (const std::string& name : names) {
    if (name == kStateName || name == "a" || name == "b" || (!s.kept.empty() && name == s.kept))
      continue;
    store->log_("view_store: removing leftover " + p.slot(name));
    TERN_RETURN_IF_ERROR(RemoveTree(env, p.slot(name)));
  }
  TERN_ASSIGN_OR_RETURN(names, env.ListDir(p.dir, kDirEntriesMax));
  for (const std::string& name : names) {
    if (name.starts_with("current.tmp-")) TERN_RETURN_IF_ERROR(env.RemoveFile(p.dir + "/" + name));
  }
  if (s.spare_usable) {
    TERN_ASSIGN_OR_RETURN(FileType spare, env.TypeOf(p.slot(s.spare()), false));
    if (spare != FileType::kDirectory) s.spare_usable = false;
  }
  if (!s.kept.empty()) {
    TERN_ASSIGN_OR_RETURN(FileType kept, env.TypeOf(p.slot(s.kept), false));
    if (kept != FileType::kRegular) s.kept.clear();
  }
  if (!s.current.empty()) {
    // state.json is the commit record; the link may lag it by one switch.
    TERN_RETURN_IF_ERROR(Relink(env, p, s.current));
    store->log_("view_store: serving version " + std::to_string(s.version) + " (" +
                s.digest.ToString() + ") from views/" + s.current);
  }
  return store;
}

namespace {

// `recorded` is what state.json is known to hold (empty: unknown), so that
// MarkSpareUnusable can skip a write that changes nothing.
Status WriteState(Env& env, const Paths& p, const ViewStore::State& s, std::string& recorded) {
  std::string text = EncodeState(s);
  recorded.clear();  // a failed write may or may not have renamed
  TERN_RETURN_IF_ERROR(WriteFileAtomic(env, p.state, Bytes(text), /*overwrite=*/true));
  recorded = std::move(text);
  return Status::Ok();
}

}  // namespace

namespace {

// Seed and InstallKeyframe: `build` writes a complete, synced checkpoint
// directory at the spare's path (which is empty when it runs); then commit
// and switch. The old current becomes an unusable spare (no patch leads from
// its version to the new one).
Status InstallInSpare(Env& env, const Paths& p, ViewStore::State& s, std::string& recorded,
                      LogFn& log, uint64_t version, const ViewDigest& digest,
                      const std::function<Status(const std::string& slot_path)>& build) {
  if (!s.current.empty()) {
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
  ViewStore::State next;
  next.current = slot;
  next.version = version;
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
  log("view_store: serving version " + std::to_string(version) + " (" + digest.ToString() + ")");
  return Status::Ok();
}

}  // namespace

Status ViewStore::Seed(const std::string& checkpoint_path, uint64_t version,
                       const ViewDigest& expected) {
  State& s = *state_;
  TERN_REQUIRE(version > s.version, kInvalidArgument, "view store: seed version ", version,
               " is not newer than the served ", s.version);
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
  return InstallInSpare(env_, Paths(dir_), s, recorded_, log_, version, expected, build);
}

Status ViewStore::InstallKeyframe(std::span<const uint8_t> keyframe, uint64_t version) {
  State& s = *state_;
  TERN_REQUIRE(version > s.version, kInvalidArgument, "view store: keyframe version ", version,
               " is not newer than the served ", s.version);
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
  return InstallInSpare(env_, Paths(dir_), s, recorded_, log_, version, info.target_digest, build);
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
                                                                 const ViewStore::State& s, LogFn& log) {
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
Status MarkSpareUnusable(Env& env, const Paths& p, ViewStore::State& s, std::string& recorded) {
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
  // A stream owns the spare (it was ready when the stream began).
  if (s.current.empty() || spare_ready() || s.stream) return Status::Ok();
  const Paths p(dir_);
  Clock& clock = env_.clock();
  const uint64_t start_us = clock.NowUs();
  const bool usable = s.spare_usable;
  TERN_RETURN_IF_ERROR(MarkSpareUnusable(env_, p, s, recorded_));
  if (usable) {
    auto w = OpenSpareAtServed(env_, p, s, pool_);
    if (w.ok()) {
      // Not synced and not recorded: see State::prepared.
      s.prepared = std::make_shared<SlotWriter>(std::move(w).value());
      log_(internal::StrCat("view_store: spare views/", s.spare(), " at version ", s.version,
                            " (in place, synced with the next version) in ",
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

Status ViewStore::Advance(std::span<const uint8_t> patch) {
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
  TERN_REQUIRE(info.target_version > s.version, kMismatch, "view store: patch target version ",
               info.target_version, " is not newer than ", s.version);
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
      t_us = clock.NowUs();
      TERN_RETURN_IF_ERROR(slot->Sync());
      sync_us = clock.NowUs() - t_us;
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
          restored.spare_digest = s.digest;
          if (WriteState(env_, p, restored, recorded_).ok()) s = restored;
        }
        return st;
      }
      apply_us = clock.NowUs() - t_us;
      t_us = clock.NowUs();
      TERN_RETURN_IF_ERROR(slot->Sync());
      sync_us = clock.NowUs() - t_us;
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
      sync_us = clock.NowUs() - t_us;
    }
  }

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
  next.digest = target;
  next.spare_usable = true;
  next.spare_version = s.version;
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
  log_(internal::StrCat("view_store: serving version ", s.version, " (", mode,
                        "): ", total_us / 1000, " ms = catch-up ", catch_up_us / 1000, " + apply ",
                        apply_us / 1000, " + sync ", sync_us / 1000,
                        " + state, kept patch, switch ",
                        (total_us - catch_up_us - apply_us - sync_us) / 1000, " ms"));
  return Status::Ok();
}

}  // namespace tern::agent

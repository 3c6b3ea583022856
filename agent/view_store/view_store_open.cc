// ViewStore (agent/view_store/view_store.h): the commit record (state.json), Open, and
// the recovery of a served slot committed unsynced. The crash analysis:
// docs/agent/apply.md "Deferred sync".
#include <nlohmann/json.hpp>

#include "agent/view_store/view_store.h"
#include "agent/view_store/view_store_state.h"
#include "base/path.h"
#include "tern/checkpoint.h"
#include "tern/thread_pool.h"

namespace tern::agent {
namespace view_store_internal {
namespace {

// Format 2 adds "synced" (the served slot's bytes are durable); format 1
// records were always synced. A build that reads only format 1 refuses a
// format 2 record (kUnsupported) rather than serve a slot it cannot know
// to be whole.
constexpr int kStateFormat = 2;
constexpr int kStateFormatSynced = 1;
// state.json is a few hundred bytes; anything near this is not ours.
constexpr uint64_t kStateBytesMax = 64 * 1024;
// views/ and DIR hold a handful of entries; a bound for the cleanup listing.
constexpr uint64_t kDirEntriesMax = 100'000;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// fsync of every file of the checkpoint directory at `path` (no mapping:
// the pages a crashed process dirtied are in the page cache, and fsync on
// any descriptor writes them).
Status SyncSlotFiles(Env& env, const std::string& path) {
  OpenOptions options;
  options.env = &env;
  TERN_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(path, options));
  for (const std::string& file : checkpoint->files())
    TERN_RETURN_IF_ERROR(env.SyncPath(path + "/" + file));
  return Status::Ok();
}

// "" when the checkpoint at `path` has digest `want`, else why not. Any
// failure to open it (a torn header after a power loss) is a "no": the
// slot is not served, whatever the reason.
std::string SlotDiffers(Env& env, const std::string& path, const ViewDigest& want,
                        ThreadPool& pool) {
  OpenOptions options;
  options.env = &env;
  auto checkpoint = Checkpoint::Open(path, options);
  if (!checkpoint.ok()) return checkpoint.status().ToString();
  const ViewDigest got = ComputeDigest((*checkpoint)->view(), pool);
  return got == want ? "" : "its digest is " + got.ToString();
}

// state.json says the served slot was committed unsynced: a power loss may
// have left any mix of its old and new pages (a process crash leaves the
// page cache whole). Serve it only if its digest is the recorded one (then
// sync it, so this is asked once); else the spare, if it is usable (always
// durable: a slot becomes the spare only once synced) and its digest
// matches, one version lower; else nothing (version 0: the agent catches up
// with a keyframe). Never a slot whose bytes are not the version named.
Status RecoverUnsynced(Env& env, const Paths& p, ViewStore::State& s, std::string& recorded,
                       ThreadPool& pool, LogFn& log) {
  const std::string served = p.slot(s.current);
  const std::string why = SlotDiffers(env, served, s.digest, pool);
  if (why.empty()) {
    TERN_RETURN_IF_ERROR(SyncSlotFiles(env, served));
    ViewStore::State next = s;
    next.synced = true;
    TERN_RETURN_IF_ERROR(WriteState(env, p, next, recorded));
    s = next;
    log("view_store: views/" + s.current + " was committed unsynced; verified version " +
        std::to_string(s.version) + " and synced it");
    return Status::Ok();
  }
  log("view_store: views/" + s.current + " does not hold version " + std::to_string(s.version) +
      " (committed unsynced, then a crash): " + why);
  if (s.spare_usable) {
    const std::string spare = p.slot(s.spare());
    TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(spare, false));
    const std::string spare_why = type == FileType::kDirectory
                                      ? SlotDiffers(env, spare, s.spare_digest, pool)
                                      : std::string("missing");
    if (spare_why.empty()) {
      TERN_RETURN_IF_ERROR(SyncSlotFiles(env, spare));
      ViewStore::State back;
      back.current = s.spare();
      back.version = s.spare_version;
      back.epoch = s.spare_epoch;
      back.digest = s.spare_digest;
      // The torn slot is the spare now, unusable: the next Advance copies.
      TERN_RETURN_IF_ERROR(WriteState(env, p, back, recorded));
      s = back;
      log("view_store: serving the previous version " + std::to_string(s.version) + " from views/" +
          s.current + " instead (the agent catches up)");
      return Status::Ok();
    }
    log("view_store: the spare views/" + s.spare() + " does not hold version " +
        std::to_string(s.spare_version) + " either: " + spare_why);
  }
  // The link first: a crash between the two removals finds the record
  // unsynced again and comes back here.
  const std::string link = p.dir + "/current";
  TERN_ASSIGN_OR_RETURN(FileType link_type, env.TypeOf(link, false));
  if (link_type != FileType::kMissing) TERN_RETURN_IF_ERROR(env.RemoveFile(link));
  TERN_RETURN_IF_ERROR(env.RemoveFile(p.state));
  TERN_RETURN_IF_ERROR(env.SyncPath(p.views));
  recorded.clear();
  s = ViewStore::State{};
  log("view_store: serving nothing; the agent catches up from a keyframe");
  return Status::Ok();
}

}  // namespace

std::string KeptName(uint64_t from, uint64_t to) {
  return "keep-" + std::to_string(from) + "-" + std::to_string(to) + ".patch";
}

std::string EncodeState(const ViewStore::State& s) {
  nlohmann::json j;
  j["format"] = kStateFormat;
  j["synced"] = s.synced;
  j["current"] = s.current;
  j["version"] = s.version;
  if (s.epoch != 0) j["epoch"] = s.epoch;  // absent: epoch 0, as before epochs
  j["digest"] = s.digest.ToString();
  j["spare"] = {{"usable", s.spare_usable},
                {"version", s.spare_version},
                {"digest", s.spare_digest.ToString()}};
  if (s.spare_epoch != 0) j["spare"]["epoch"] = s.spare_epoch;
  if (s.kept.empty()) {
    j["kept"] = nullptr;
  } else {
    j["kept"] = {{"file", s.kept}, {"from", s.kept_from}, {"to", s.kept_to}};
  }
  return j.dump(1) + "\n";
}

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
  TERN_REQUIRE(format == kStateFormat || format == kStateFormatSynced, kUnsupported, path,
               ": format ", format, " (this build reads ", kStateFormatSynced, " and ",
               kStateFormat, ")");
  ViewStore::State s;
  if (format == kStateFormat) {
    TERN_REQUIRE(j.contains("synced") && j["synced"].is_boolean(), kCorrupt, path,
                 ": 'synced' missing or not a boolean");
    s.synced = j["synced"].get<bool>();
  }
  TERN_ASSIGN_OR_RETURN(s.current, str(j, "current"));
  TERN_REQUIRE(s.current == "a" || s.current == "b", kCorrupt, path, ": current must be a or b");
  TERN_ASSIGN_OR_RETURN(s.version, u64(j, "version"));
  TERN_REQUIRE(s.version > 0, kCorrupt, path, ": version 0 is never served");
  // The board epoch (docs/agent/board.md §4a): absent is 0.
  auto epoch = [&](const nlohmann::json& o) -> Result<uint32_t> {
    if (!o.contains("epoch")) return uint32_t{0};
    TERN_ASSIGN_OR_RETURN(uint64_t e, u64(o, "epoch"));
    TERN_REQUIRE(e <= UINT32_MAX, kCorrupt, path, ": epoch ", e, " is out of range");
    return uint32_t(e);
  };
  TERN_ASSIGN_OR_RETURN(s.epoch, epoch(j));
  TERN_ASSIGN_OR_RETURN(s.digest, digest(j, "digest"));
  TERN_REQUIRE(j.contains("spare") && j["spare"].is_object(), kCorrupt, path, ": 'spare' missing");
  const nlohmann::json& spare = j["spare"];
  TERN_REQUIRE(spare.contains("usable") && spare["usable"].is_boolean(), kCorrupt, path,
               ": 'usable' missing or not a boolean");
  s.spare_usable = spare["usable"].get<bool>();
  TERN_ASSIGN_OR_RETURN(s.spare_version, u64(spare, "version"));
  TERN_ASSIGN_OR_RETURN(s.spare_digest, digest(spare, "digest"));
  TERN_ASSIGN_OR_RETURN(s.spare_epoch, epoch(spare));
  TERN_REQUIRE(!s.spare_usable || std::pair(s.spare_epoch, s.spare_version) <= std::pair(s.epoch, s.version),
               kCorrupt, path, ": spare version ", s.spare_version, " (epoch ", s.spare_epoch,
               ") is newer than the served ", s.version, " (epoch ", s.epoch, ")");
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

// `recorded` is what state.json is known to hold (empty: unknown), so that
Status WriteState(Env& env, const Paths& p, const ViewStore::State& s, std::string& recorded) {
  std::string text = EncodeState(s);
  recorded.clear();  // a failed write may or may not have renamed
  TERN_RETURN_IF_ERROR(WriteFileAtomic(env, p.state, Bytes(text), /*overwrite=*/true));
  recorded = std::move(text);
  return Status::Ok();
}

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

Status SyncServed(Env& env, const Paths& p, ViewStore::State& s) {
  if (s.synced || s.current.empty()) return Status::Ok();
  if (s.unsynced) {
    TERN_RETURN_IF_ERROR(s.unsynced->Sync());
  } else {
    TERN_RETURN_IF_ERROR(SyncSlotFiles(env, p.slot(s.current)));
  }
  s.unsynced.reset();
  s.synced = true;
  return Status::Ok();
}

}  // namespace view_store_internal

using namespace view_store_internal;  // NOLINT: this file's own helpers

Result<std::unique_ptr<ViewStore>> ViewStore::Open(Env& env, std::string dir, ThreadPool& pool,
                                                   LogFn log, ViewStoreOptions options) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  TERN_REQUIRE(!dir.empty(), kInvalidArgument, "view store: empty directory name");
  std::unique_ptr<ViewStore> store(new ViewStore(env, dir, pool, std::move(log), options));
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
    if (!s.synced) {
      TERN_RETURN_IF_ERROR(RecoverUnsynced(env, p, s, store->recorded_, pool, store->log_));
    }
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

}  // namespace tern::agent

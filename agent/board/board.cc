// Board: opening and recovery, the index, Record (agent/board/board.h). The path
// search and retention are in board_plan.cc.
#include "agent/board/board.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "base/text.h"

namespace tern::agent {
namespace {

// Entries a scan of objects_dir accepts (objects, temporaries, the relay's parts).
constexpr uint64_t kObjectDirEntriesMax = uint64_t{1} << 20;

// The inverse of ObjectName, or nullopt for any other name.
std::optional<ObjectRef> ParseObjectName(std::string_view name) {
  for (ObjectKind kind : {ObjectKind::kPatch, ObjectKind::kKeyframe, ObjectKind::kSquash}) {
    const std::string_view prefix = ObjectKindName(kind);
    if (name.size() <= prefix.size() + 1 || name.substr(0, prefix.size()) != prefix ||
        name[prefix.size()] != '-')
      continue;
    const std::string_view rest = name.substr(prefix.size() + 1);
    const size_t dash = rest.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    // Canonical only: one spelling per object, as ObjectName writes it.
    auto from = ParseCanonicalDecimal(rest.substr(0, dash));
    auto to = ParseCanonicalDecimal(rest.substr(dash + 1));
    if (!from.ok() || !to.ok()) return std::nullopt;
    return ObjectRef{kind, *from, *to};
  }
  return std::nullopt;
}

std::string Where(uint64_t version, uint32_t seq) {
  return "board record " + std::to_string(version) + "/" + std::to_string(seq);
}

}  // namespace

Board::Board(Env& env, std::string objects_dir, std::unique_ptr<BoardLog> log,
             const ManifestVerifier& verifier, BoardOptions options, LogFn log_fn)
    : env_(env),
      objects_dir_(std::move(objects_dir)),
      log_(std::move(log)),
      verifier_(verifier),
      log_fn_(log_fn ? std::move(log_fn) : StderrLog()) {
  options_ = options;  // guarded: not in the initializer list, below log_fn_
}

BoardOptions Board::options() const {
  MutexLock lock(mu_);
  return options_;
}

Status Board::SetOptions(BoardOptions options) {
  TERN_REQUIRE(options.keep_patches >= 1 && options.keyframe_every >= 1, kInvalidArgument,
               "board: keep_patches and keyframe_every must be at least 1");
  MutexLock lock(mu_);
  options_ = options;
  return Status::Ok();
}

Result<std::unique_ptr<Board>> Board::Open(Env& env, std::string objects_dir,
                                           std::unique_ptr<BoardLog> log,
                                           const ManifestVerifier& verifier, BoardOptions options,
                                           LogFn log_fn) {
  TERN_REQUIRE(log != nullptr, kInvalidArgument, "board: no log");
  TERN_REQUIRE(!objects_dir.empty(), kInvalidArgument, "board: empty objects directory");
  TERN_REQUIRE(verifier.key_count() > 0, kInvalidArgument, "board: the verifier trusts no key");
  TERN_REQUIRE(options.keep_patches >= 1 && options.keyframe_every >= 1, kInvalidArgument,
               "board: keep_patches and keyframe_every must be at least 1");
  TERN_RETURN_IF_ERROR(CreateDirs(env, objects_dir));
  std::unique_ptr<Board> board(
      new Board(env, std::move(objects_dir), std::move(log), verifier, options, std::move(log_fn)));
  BoardId candidate;
  TERN_REQUIRE(getrandom(candidate.data(), candidate.size(), 0) ==
                   static_cast<ssize_t>(candidate.size()),
               kIo, "board: getrandom failed");
  TERN_ASSIGN_OR_RETURN(board->id_, board->log_->InitId(candidate));
  TERN_RETURN_IF_ERROR(board->Recover());
  return board;
}

Status Board::Recover() {
  MutexLock lock(mu_);
  TERN_ASSIGN_OR_RETURN(std::vector<BoardRecord> records, log_->LoadAll());
  TERN_ASSIGN_OR_RETURN(const uint64_t head, log_->Head());
  std::sort(records.begin(), records.end(), [](const BoardRecord& a, const BoardRecord& b) {
    return std::pair(a.version, a.seq) < std::pair(b.version, b.seq);
  });
  // Every record verified first; then the publications are ordered by
  // walking parents back from HEAD (positions, not numbers, order them).
  std::vector<VersionManifest> manifests(records.size());
  std::map<uint64_t, size_t> publications;  // version -> index in records
  for (size_t i = 0; i < records.size(); ++i) {
    const BoardRecord& r = records[i];
    const std::string where = Where(r.version, r.seq);
    TERN_REQUIRE(r.version >= 1 && r.seq < kMaxManifestsPerVersion, kCorrupt, where,
                 ": version or seq out of range");
    auto m = verifier_.Verify(r.signed_manifest);
    if (!m.ok()) return m.status().WithContext(where);
    TERN_REQUIRE(m->version == r.version, kCorrupt, where, " holds a manifest of version ",
                 m->version);
    TERN_REQUIRE(m->epoch == r.epoch, kCorrupt, where, " is stored at epoch ", r.epoch,
                 " but its manifest is of epoch ", m->epoch);
    TERN_REQUIRE(m->board_id == id_, kMismatch, where, " is of another board");
    if (r.seq == 0) publications[r.version] = i;
    manifests[i] = std::move(*m);
  }
  TERN_REQUIRE(head != 0 || publications.empty(), kCorrupt,
               Where(publications.empty() ? 0 : publications.begin()->first, 0),
               " is newer than HEAD 0");
  TERN_REQUIRE(head == 0 || publications.contains(head), kCorrupt, "board HEAD ", head,
               " has no publication record");
  std::vector<size_t> chain;  // HEAD first
  for (uint64_t v = head; v != 0;) {
    auto it = publications.find(v);
    if (it == publications.end()) break;  // dropped by retention
    TERN_ASSERT(chain.size() < publications.size() + 1, "board chain loops");
    const VersionManifest& m = manifests[it->second];
    auto parent = publications.find(m.parent);
    if (parent != publications.end()) {
      const VersionManifest& p = manifests[parent->second];
      const std::string where = Where(v, 0);
      TERN_REQUIRE(m.base_digest == p.target_digest, kMismatch, where, ": parent ", m.parent,
                   " does not chain to version ", p.version);
      const bool same_epoch = !m.supersede && m.epoch == p.epoch && m.version > p.version;
      const bool supersede = m.supersede && m.epoch == p.epoch + 1 && m.version < p.version;
      TERN_REQUIRE(same_epoch || supersede, kMismatch, where, ": epoch ", m.epoch,
                   m.supersede ? " (supersede)" : "", " does not follow version ", p.version,
                   " of epoch ", p.epoch);
    }
    chain.push_back(it->second);
    v = m.parent;
  }
  if (chain.size() != publications.size()) {
    std::vector<bool> on_chain(records.size(), false);
    for (size_t i : chain) on_chain[i] = true;
    for (const auto& [v, i] : publications) {
      if (on_chain[i]) continue;
      const VersionManifest& h = manifests[publications.at(head)];
      const bool newer = BoardPos{manifests[i].epoch, v} > BoardPos{h.epoch, head};
      return newer ? TERN_ERROR(kCorrupt, Where(v, 0), " is newer than HEAD ", head)
                   : TERN_ERROR(kMismatch, Where(v, 0), " is not on the chain to HEAD ", head,
                                " (it reaches back to ", manifests[chain.back()].version, ")");
    }
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const BoardRecord& r = records[*it];
    versions_[r.version].publication = manifests[*it];
    chain_.insert({manifests[*it].epoch, r.version});
    TERN_RETURN_IF_ERROR(CheckAndIndex(r.version, 0, r.signed_manifest, manifests[*it], true));
  }
  uint64_t orphans = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const BoardRecord& r = records[i];
    if (r.seq == 0) continue;
    if (!versions_.contains(r.version)) {
      ++orphans;  // its publication went first in an interrupted DropBelow
      continue;
    }
    TERN_RETURN_IF_ERROR(CheckLaterManifest(Where(r.version, r.seq), manifests[i]));
    TERN_RETURN_IF_ERROR(CheckAndIndex(r.version, r.seq, r.signed_manifest, manifests[i], true));
  }
  head_ = head == 0 ? BoardPos{} : BoardPos{versions_.at(head).publication.epoch, head};
  if (orphans > 0)
    log_fn_("board: ignored " + std::to_string(orphans) +
            " manifests whose publication was dropped by retention");
  uint64_t absent = 0;
  for (const auto& [ref, info] : objects_) absent += info.present ? 0 : 1;
  if (absent > 0)
    log_fn_("board: " + std::to_string(absent) + " of " + std::to_string(objects_.size()) +
            " objects named by manifests are not on disk (retention or loss)");
  return RemoveStrayFiles();
}

// Checks a verified manifest of (version, seq) against the index and, with
// check_files, looks for its objects on disk; then indexes it. The caller
// holds mu_ and has set versions_[version].publication for seq 0.
Status Board::CheckAndIndex(uint64_t version, uint32_t seq, const std::string& signed_bytes,
                            const VersionManifest& m, bool check_files) {
  const std::string where = Where(version, seq);
  VersionInfo& info = versions_.at(version);
  for (const ManifestObject& o : m.objects) {
    const ObjectRef ref{o.kind, o.from_version, o.to_version};
    auto it = objects_.find(ref);
    if (it != objects_.end() && it->second.present) continue;  // first naming wins
    ObjectInfo oi{o.bytes, version, seq, false};
    if (check_files) {
      auto size = env_.FileSize(ObjectPath(ref));
      oi.present = size.ok() && *size == o.bytes;
      if (size.ok() && !oi.present)
        log_fn_("board: " + ObjectName(ref) + " has " + std::to_string(*size) +
                " bytes, its manifest says " + std::to_string(o.bytes) + "; treated as absent");
    }
    objects_[ref] = oi;
  }
  info.signed_manifests.resize(std::max<size_t>(info.signed_manifests.size(), seq + 1));
  info.signed_manifests[seq] = signed_bytes;
  return Status::Ok();
}

Status Board::CheckLaterManifest(const std::string& where, const VersionManifest& m) const {
  const VersionManifest& pub = versions_.at(m.version).publication;
  TERN_REQUIRE(m.parent == pub.parent && m.base_digest == pub.base_digest &&
                   m.target_digest == pub.target_digest,
               kMismatch, where, ": parent or digests differ from the publication's");
  TERN_REQUIRE(m.epoch == pub.epoch && !m.supersede, kMismatch, where, ": epoch ", m.epoch,
               m.supersede ? " with the supersede flag" : "", " but the publication's is ",
               pub.epoch, " (a later manifest repeats it, never superseding)");
  for (const ManifestObject& o : m.objects) {
    TERN_REQUIRE(o.kind != ObjectKind::kPatch, kMismatch, where,
                 ": a later manifest names the publication's patch again");
    if (o.kind != ObjectKind::kSquash || m.epoch == 0) continue;  // epoch 0: the codec's rule
    // From epoch 1 on numbers do not order the chain: a squash from an
    // indexed version must start before the parent. One from a number the
    // board no longer indexes (retention dropped it) is no edge anyone can
    // start from, so it is kept but never routed.
    const auto from = PosLocked(o.from_version), parent = PosLocked(m.parent);
    TERN_REQUIRE(!from || (parent && *from < *parent), kMismatch, where, ": squash ",
                 o.from_version, "->", o.to_version, " does not start before parent ", m.parent,
                 " on the chain");
  }
  return Status::Ok();
}

std::optional<BoardPos> Board::PosLocked(uint64_t v) const {
  if (v == 0) return BoardPos{};
  auto it = versions_.find(v);
  if (it == versions_.end()) return std::nullopt;
  return BoardPos{it->second.publication.epoch, v};
}

Result<BoardPos> Board::PosOf(uint64_t v) const {
  MutexLock lock(mu_);
  auto pos = PosLocked(v);
  TERN_REQUIRE(pos.has_value(), kNotFound, "board: no version ", v);
  return *pos;
}

Status Board::RemoveStrayFiles() {
  TERN_ASSIGN_OR_RETURN(auto names, env_.ListDir(objects_dir_, kObjectDirEntriesMax));
  uint64_t removed = 0;
  for (const std::string& name : names) {
    const size_t tmp = name.find(".tmp-");
    auto ref = ParseObjectName(tmp == std::string::npos ? name : name.substr(0, tmp));
    if (!ref) continue;  // not the board's (a relay's .part, an operator's file)
    if (tmp == std::string::npos) {
      auto it = objects_.find(*ref);
      if (it != objects_.end() && it->second.present) continue;
    }
    Status st = env_.RemoveFile(objects_dir_ + "/" + name);
    if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("board: removing a stray file");
    ++removed;
  }
  if (removed > 0)
    log_fn_("board: removed " + std::to_string(removed) +
            " object files no manifest names (a publish interrupted before its record)");
  return Status::Ok();
}

uint64_t Board::head() const {
  MutexLock lock(mu_);
  return head_.version;
}

BoardPos Board::head_pos() const {
  MutexLock lock(mu_);
  return head_;
}

std::vector<uint64_t> Board::Versions() const {
  MutexLock lock(mu_);
  std::vector<uint64_t> out;
  out.reserve(versions_.size());
  for (const auto& [v, info] : versions_) out.push_back(v);
  return out;
}

Result<VersionManifest> Board::Manifest(uint64_t v) const {
  MutexLock lock(mu_);
  auto it = versions_.find(v);
  TERN_REQUIRE(it != versions_.end(), kNotFound, "board: no version ", v);
  return it->second.publication;
}

std::vector<std::string> Board::SignedManifests(uint64_t v) const {
  MutexLock lock(mu_);
  auto it = versions_.find(v);
  if (it == versions_.end()) return {};
  std::vector<std::string> out;
  for (const auto& s : it->second.signed_manifests)
    if (!s.empty()) out.push_back(s);
  return out;
}

std::string Board::ObjectPath(const ObjectRef& ref) const {
  return objects_dir_ + "/" + ObjectName(ref);
}

bool Board::HasObject(const ObjectRef& ref) const {
  MutexLock lock(mu_);
  auto it = objects_.find(ref);
  return it != objects_.end() && it->second.present;
}

Result<uint64_t> Board::ObjectBytes(const ObjectRef& ref) const {
  MutexLock lock(mu_);
  auto it = objects_.find(ref);
  TERN_REQUIRE(it != objects_.end(), kNotFound, "board: no object ", ObjectName(ref));
  return it->second.bytes;
}

Status Board::Record(std::string signed_manifest) {
  TERN_REQUIRE(signed_manifest.size() <= kMaxBoardRecordBytes, kInvalidArgument,
               "board: a signed manifest of ", signed_manifest.size(), " bytes");
  TERN_ASSIGN_OR_RETURN(VersionManifest m, verifier_.Verify(signed_manifest));
  TERN_REQUIRE(m.board_id == id_, kMismatch, "board: manifest of version ", m.version,
               " is of another board");
  // record_mu_ orders writers; mu_ is dropped around the log's I/O (an etcd
  // round trip, an fsync) so readers are not held up by it.
  MutexLock writer(record_mu_);
  bool publication = false;
  uint32_t seq = 0;
  BoardPos head_pos;
  {
    MutexLock lock(mu_);
    head_pos = head_;
    const uint64_t head = head_.version;
    auto it = versions_.find(m.version);
    publication = it == versions_.end();
    if (publication) {
      if (m.supersede) {
        TERN_REQUIRE(head != 0 && m.version < head && m.epoch == head_.epoch + 1, kInvalidArgument,
                     "board: a supersede of version ", m.version, " (epoch ", m.epoch,
                     ") must renumber below HEAD ", head, " into epoch ", head_.epoch + 1);
      } else {
        TERN_REQUIRE(m.version > head, kInvalidArgument, "board: version ", m.version,
                     " is not newer than HEAD ", head);
        TERN_REQUIRE(m.epoch == head_.epoch, kInvalidArgument, "board: version ", m.version,
                     " is of epoch ", m.epoch, ", HEAD's is ", head_.epoch);
      }
      TERN_REQUIRE(m.parent == head, kMismatch, "board: version ", m.version, " has parent ",
                   m.parent, ", HEAD is ", head);
      TERN_REQUIRE(head == 0 || m.base_digest == versions_.at(head).publication.target_digest,
                   kMismatch, "board: version ", m.version, "'s base digest is not D(", head, ")");
    } else {
      // A number the log holds, withdrawn or not, names one version only.
      const VersionManifest& pub = it->second.publication;
      TERN_REQUIRE(!m.supersede && m.parent == pub.parent, kAlreadyExists, "board: version ",
                   m.version, " is in the log already (epoch ", pub.epoch,
                   "); a number is not used twice while the log holds it");
      seq = static_cast<uint32_t>(it->second.signed_manifests.size());
      TERN_REQUIRE(seq < kMaxManifestsPerVersion, kResourceExhausted, "board: version ",
                   m.version, " has ", seq, " manifests already");
      for (const ManifestObject& o : m.objects) {
        auto known = objects_.find({o.kind, o.from_version, o.to_version});
        TERN_REQUIRE(known == objects_.end() || !known->second.present, kAlreadyExists,
                     "board: ", ObjectName({o.kind, o.from_version, o.to_version}), " exists");
      }
      TERN_RETURN_IF_ERROR(CheckLaterManifest("board: version " + std::to_string(m.version), m));
    }
  }
  for (const ManifestObject& o : m.objects) {
    const ObjectRef ref{o.kind, o.from_version, o.to_version};
    TERN_ASSIGN_OR_RETURN(const uint64_t size, env_.FileSize(ObjectPath(ref)));
    TERN_REQUIRE(size == o.bytes, kMismatch, "board: ", ObjectName(ref), " has ", size,
                 " bytes, the manifest says ", o.bytes);
  }
  Status appended = log_->Append({m.epoch, m.version}, seq, signed_manifest, publication,
                                 publication ? head_pos : BoardPos{});
  if (!appended.ok()) {
    // A storage error leaves the record there or not (board_log.h); if it is
    // there, the index must say so, or the publisher would delete its bytes.
    if (appended.code() == Code::kMismatch || appended.code() == Code::kAlreadyExists ||
        appended.code() == Code::kInvalidArgument || !RecordStored(m.version, seq, publication))
      return appended;
  }
  MutexLock lock(mu_);
  if (publication) {
    versions_[m.version].publication = m;
    chain_.insert({m.epoch, m.version});
    head_ = {m.epoch, m.version};
  }
  // Files were checked above; CheckAndIndex marks them present.
  Status st = CheckAndIndex(m.version, seq, signed_manifest, m, /*check_files=*/false);
  for (const ManifestObject& o : m.objects)
    objects_[{o.kind, o.from_version, o.to_version}].present = true;
  if (!appended.ok()) return appended.WithContext("recorded, but the log reported");
  return st;
}

bool Board::RecordStored(uint64_t version, uint32_t seq, bool publication) {
  if (publication) {
    auto head = log_->Head();
    return head.ok() && *head == version;
  }
  auto all = log_->LoadAll();
  if (!all.ok()) return false;
  for (const BoardRecord& r : *all)
    if (r.version == version && r.seq == seq) return true;
  return false;
}

}  // namespace tern::agent

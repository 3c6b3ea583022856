// The board: the root's index of published versions over a BoardLog
// (agent/board/board_log.h) and the object files in objects_dir
// (docs/agent/board.md). PublishVersion and MakeSquash (agent/board/publish.h)
// add to it; the control plane asks it what to send whom (PlanCatchUp) and
// what it may delete (Retain).
//
// Versions and objects. Version v is named by its publication manifest
// (record seq 0): parent = the previous HEAD, objects patch(parent -> v)
// and/or keyframe(v). Publications are ordered by position (epoch, v)
// (docs/agent/board.md §4a): a supersede opens epoch e + 1 below HEAD's
// number, so "newer" means a higher position, and a number is never used
// twice while the log holds it. Later manifests for v (seq >= 1) add a squash(a -> v)
// or a late keyframe(v). Object bytes live in objects_dir/ObjectName(ref),
// written (fsynced) before the record that names them is appended, so a
// record never names bytes that were never there.
//
// Recovery (Open): every record is verified with the ManifestVerifier and
// must belong to the log's board id and chain (each publication's
// base_digest is its parent's target_digest; later manifests of v repeat
// v's parent and digests). A record that fails any check makes Open fail
// (kAuth/kCorrupt/kMismatch naming version and seq): the log is the root's
// own, so a forged or damaged record means tampering, and a board that
// silently skipped it could serve a history nobody signed. Objects whose
// file is missing or has the wrong size are marked absent and logged (the
// versions stay known; catch-up routes around them). Files in objects_dir
// that look like objects but no manifest names (a crash between writing the
// bytes and appending the record), and temporaries of interrupted writes,
// are removed: objects_dir belongs to the board on the root.
//
// Errors: kNotFound for an unknown version or object; kInvalidArgument for
// impossible requests (have > target); others from the log and the Env.
//
// Ownership: the Board owns its log; env and verifier must outlive it.
//
// Thread safety: every method may be called from any thread at once. The
// index is guarded by one mutex, held neither across a MakeSquashFn call nor
// across the log's I/O in Record; Record and Retain are ordered by a second.
// Publications on one Board must be serialized by the caller (Record
// re-checks HEAD, so a racing one fails cleanly rather than forking).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/board/board_log.h"
#include "agent/manifest/object_ref.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/env.h"
#include "tern/log.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

struct BoardOptions {
  uint32_t keep_patches = 16;    // the last K publications keep their patch
  uint32_t keyframe_every = 32;  // a keyframe at least every M versions
};

// At most this many objects per route: each names its own manifest, and a
// control message carries at most 64 (agent/control/control_wire.h).
inline constexpr size_t kMaxCatchUpObjects = 64;

struct CatchUpRoute {
  // The version the objects lead to: the target, or for a path longer than
  // kMaxCatchUpObjects a version on the way (ask again from there; the rest
  // of a cheapest path is the cheapest path from there, so nothing is lost).
  uint64_t reaches = 0;
  // Apply order; empty when have == target. A route that starts with a
  // keyframe starts from nothing (a zero view of the layout), whatever the
  // member holds.
  std::vector<ObjectRef> objects;
  // The signed manifests naming those objects, in the same order, each once;
  // the first one's version and digests tell a new member what it starts from.
  std::vector<std::string> signed_manifests;
  uint64_t bytes = 0;  // sum of the objects' sizes
};

// Makes, signs and records squash(from -> to) (from == 0: a late keyframe(to));
// MakeSquash in agent/board/publish.h, bound to a signer and a pool.
using MakeSquashFn = std::function<Status(uint64_t from, uint64_t to)>;

class Board {
 public:
  static Result<std::unique_ptr<Board>> Open(Env& env, std::string objects_dir,
                                             std::unique_ptr<BoardLog> log,
                                             const ManifestVerifier& verifier,
                                             BoardOptions options, LogFn log_fn);

  const BoardId& id() const { return id_; }
  BoardOptions options() const;
  // Retention changed while the board runs (an operator's or scheduler's
  // call): the next KeyframeDue and Retain use it. kInvalidArgument for a
  // zero, as at Open.
  Status SetOptions(BoardOptions options);
  Env& env() const { return env_; }
  uint64_t head() const;
  BoardPos head_pos() const;               // HEAD's (epoch, version)
  std::vector<uint64_t> Versions() const;  // published and still indexed, ascending
  // The position of an indexed version (kNotFound otherwise).
  Result<BoardPos> PosOf(uint64_t v) const;

  Result<VersionManifest> Manifest(uint64_t v) const;  // the publication manifest
  std::vector<std::string> SignedManifests(uint64_t v) const;  // all for v, by seq

  std::string ObjectPath(const ObjectRef& ref) const;
  bool HasObject(const ObjectRef& ref) const;  // named by a manifest and on disk
  Result<uint64_t> ObjectBytes(const ObjectRef& ref) const;

  // Cheapest path by bytes from `have` (0, or a version the board no longer
  // indexes: nothing) to `target` (at or after have's position), over the objects on disk: chained
  // patches, squashes, or a keyframe plus patches. With make_squash, a path
  // of two or more objects is offered for squashing first (one call; its
  // error is logged and the unsquashed path returned), and the squash is
  // used when it is smaller. A path longer than kMaxCatchUpObjects is cut
  // (route.reaches < target).
  Result<CatchUpRoute> PlanCatchUp(uint64_t have, uint64_t target,
                                  const MakeSquashFn& make_squash = nullptr);
  // Cheapest path as above but without squashing, from `from` only (0:
  // from nothing, so it starts with a keyframe): what MakeSquash squashes.
  Result<std::vector<ObjectRef>> CheapestPath(uint64_t from, uint64_t to) const;

  // Keyframe policy: whether publishing `version` with a patch of patch_bytes
  // should add keyframe(version): no keyframe yet, keyframe_every versions
  // since the newest one, or the patches since it would outweigh it.
  bool KeyframeDue(uint64_t version, uint64_t patch_bytes) const;

  // Deletes the object files nobody needs: keeps the last keep_patches
  // patches, the newest keyframe and the cheapest path from it to HEAD (a
  // new member's), and for each version in `held` its cheapest path; then
  // drops the log's records below the oldest version still needed.
  Status Retain(const std::set<uint64_t>& held);

  // Verifies a signed manifest whose objects are already in objects_dir
  // (right sizes), appends it to the log and indexes it. A new version is a
  // publication: parent == HEAD, base_digest == D(HEAD) (kMismatch
  // otherwise), and either of HEAD's epoch with version > HEAD, or a
  // supersede of epoch HEAD's + 1 with version < HEAD (kInvalidArgument
  // otherwise). A number the log holds is never published again
  // (kAlreadyExists). A known version gets the next seq; its epoch, parent
  // and digests must match the publication, it names no patch and no
  // supersede, a squash starts before its parent on the chain, and its
  // objects must be new.
  // When the log fails but the record landed anyway (board_log.h: kIo may
  // or may not append), the manifest is indexed and the error returned with
  // "recorded, but": its objects are then HasObject and must be kept.
  Status Record(std::string signed_manifest);

 private:
  struct ObjectInfo {
    uint64_t bytes = 0;
    uint64_t version = 0;  // the manifest that names it: (version, seq)
    uint32_t seq = 0;
    bool present = false;
  };
  struct VersionInfo {
    VersionManifest publication;
    std::vector<std::string> signed_manifests;  // index = seq
  };
  using Path = std::vector<ObjectRef>;

  Board(Env& env, std::string objects_dir, std::unique_ptr<BoardLog> log,
        const ManifestVerifier& verifier, BoardOptions options, LogFn log_fn);
  Status Recover();
  Status CheckAndIndex(uint64_t version, uint32_t seq, const std::string& signed_bytes,
                       const VersionManifest& m, bool check_files) REQUIRES(mu_);
  // A later manifest (seq >= 1) against v's publication: the rules above.
  Status CheckLaterManifest(const std::string& where, const VersionManifest& m) const REQUIRES(mu_);
  // 0 ("nothing") sorts first; an unindexed version has no position.
  std::optional<BoardPos> PosLocked(uint64_t v) const REQUIRES(mu_);
  Result<Path> CheapestPathLocked(uint64_t from, uint64_t to, bool also_from_nothing) const
      REQUIRES(mu_);
  CatchUpRoute RouteFromPathLocked(const Path& path) const REQUIRES(mu_);
  Status RemoveStrayFiles() REQUIRES(mu_);
  bool RecordStored(uint64_t version, uint32_t seq, bool publication);

  Env& env_;
  const std::string objects_dir_;
  const std::unique_ptr<BoardLog> log_;
  const ManifestVerifier& verifier_;
  const LogFn log_fn_;
  BoardId id_{};

  // record_mu_ orders Record and Retain (writers of the log); mu_ guards the
  // index and is dropped around the log's I/O.
  Mutex record_mu_ ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  BoardPos head_ GUARDED_BY(mu_);
  BoardOptions options_ GUARDED_BY(mu_);
  std::map<uint64_t, VersionInfo> versions_ GUARDED_BY(mu_);  // by number (unique)
  std::set<BoardPos> chain_ GUARDED_BY(mu_);                  // the same, in chain order
  std::map<ObjectRef, ObjectInfo> objects_ GUARDED_BY(mu_);
};

}  // namespace tern::agent

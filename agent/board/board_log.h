// BoardLog: where the root's version log lives (docs/agent/board.md). One
// record per signed manifest, plus HEAD, the newest published version. The
// Board (agent/board/board.h) indexes a log; this interface is what a backend
// implements: files (OpenFileBoardLog, below) or etcd (agent/etcd/etcd_board_log.h),
// which lets a standby root take over with nothing lost.
//
// Records. A record is (version, seq, signed manifest bytes). seq 0 is the
// version's publication manifest, appended with advance_head; seq >= 1 are
// later manifests for the same version (a squash for catch-up, a late
// keyframe), appended without. The log stores bytes; it does not verify
// signatures (the Board does, at recovery and before appending).
//
// Contract (every implementation):
// Positions (docs/agent/board.md §4a). Publications are ordered by their
// position (epoch, version), not by version alone: a supersede opens epoch
// e + 1 with a number below HEAD's. Numbers stay unique in a log (the
// Board's rule), so a version names one record of any epoch.
//
// Contract (every implementation):
//  * Append(pos, seq, bytes, advance_head, expected_head) is atomic and
//    durable when it returns OK: afterwards LoadAll returns the record and,
//    with advance_head, Head() == pos.version; after a crash or error it is
//    either wholly there or wholly absent. pos.epoch is the epoch of the
//    version's publication (later manifests repeat it). With advance_head it
//    is a compare-and-swap of HEAD: it succeeds only when HEAD ==
//    expected_head ({0, 0}: empty log).
//    Errors: kInvalidArgument for version 0, seq >= kMaxManifestsPerVersion,
//    empty bytes or more than kMaxBoardRecordBytes, advance_head != (seq == 0),
//    or advance_head with pos <= expected_head; kAlreadyExists when
//    (version, seq) is already recorded (nothing changed); kMismatch when
//    HEAD != expected_head (HEAD moved: another publisher won; nothing
//    changed); kIo / kUnavailable when the storage failed (the record may
//    or may not be there: LoadAll tells).
//  * LoadAll returns every record, in any order; kResourceExhausted beyond
//    kMaxBoardRecords, kCorrupt (naming the record) for stored bytes the
//    backend's own framing rejects. Never crashes on what it reads.
//  * Head() is the version of the newest record appended with advance_head
//    (0 for an empty log).
//  * DropBelow(floor) removes every record whose position is below floor
//    (retention); floor must be at most HEAD's position (kInvalidArgument),
//    so HEAD's own record always stays. Idempotent; a crash part-way leaves
//    a subset removed.
//  * InitId(candidate) returns the board id stored in the log; an empty log
//    stores `candidate` first (atomically: of two racing callers one wins and
//    both get the winner's id). The id names the board in every manifest.
//
// Thread safety: every method may be called from any thread at once. The
// file log assumes one process per directory (the daemon holds it); two
// processes appending to one directory may both advance HEAD. Use the etcd
// log for a root with standbys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tern/env.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

// A signed manifest is at most 128 + 64 * 72 + 72 bytes; records leave room.
inline constexpr size_t kMaxBoardRecordBytes = 64 * 1024;
inline constexpr uint64_t kMaxBoardRecords = uint64_t{1} << 20;
inline constexpr uint32_t kMaxManifestsPerVersion = 64;  // seq < this

// Where a publication stands on the board's chain; compared lexicographically.
struct BoardPos {
  uint32_t epoch = 0;
  uint64_t version = 0;
  auto operator<=>(const BoardPos&) const = default;
};

struct BoardRecord {
  uint64_t version = 0;
  uint32_t seq = 0;  // 0: the publication manifest
  std::string signed_manifest;
  uint32_t epoch = 0;  // as stored beside it (the Board checks the manifest's)
};

class BoardLog {
 public:
  virtual ~BoardLog() = default;

  virtual Result<BoardId> InitId(const BoardId& candidate) = 0;
  virtual Status Append(BoardPos pos, uint32_t seq, std::string signed_manifest, bool advance_head,
                        BoardPos expected_head) = 0;
  virtual Result<std::vector<BoardRecord>> LoadAll() = 0;
  virtual Result<uint64_t> Head() = 0;  // HEAD's version (numbers are unique)
  virtual Status DropBelow(BoardPos floor) = 0;
};

// Records as files under `dir` (created if missing): one file per record,
// written to a temporary name, fsynced, renamed into place, directory fsynced;
// HEAD is derived from the records, so there is no second file to tear.
// Format and recovery: docs/agent/board.md.
Result<std::unique_ptr<BoardLog>> OpenFileBoardLog(Env& env, std::string dir);

}  // namespace tern::agent

// The client's partial copy of one remote file: LOCAL.tern-part (the bytes,
// written through a shared mapping by the transport) and
// LOCAL.tern-part.state (which version it is of and which chunks it holds,
// docs/format/xfer.md "Resume state").
//
// Contract:
// * Before the size is known a fresh copy can open a head window: the start
//   of the part file, reserved on disk (MapHead). Chunks landing there are
//   counted once Map sized the copy.
// * Every block a mapping covers is reserved first (fallocate): a full disk
//   is kResourceExhausted, never SIGBUS.
// * Bounds: while a head window is open the part file is at most
//   max(size, head window <= 1 GiB); once it is closed, at most the remote
//   file's size; the state file is at most xfer::kMaxPartStateBytes.
// * Kept between runs only when it can be resumed: Abandon removes both
//   files unless the copy holds at least one acknowledged chunk and resume
//   is on. Commit removes them (the copy renamed to LOCAL, or discarded on
//   a checksum mismatch).
// Thread safety: Land may run on transport threads concurrently with the
// rest; everything else is called by the one fetching thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tern/transport.h"
#include "tern/xfer_chunks.h"
#include "xfer/xfer_wire.h"

namespace tern::xfer {

class PartFile {
 public:
  PartFile(Transport& transport, const std::string& local, uint64_t chunk_bytes, bool resume);
  ~PartFile();
  PartFile(const PartFile&) = delete;
  PartFile& operator=(const PartFile&) = delete;

  const std::string& path() const { return part_; }
  const std::string& state_path() const { return state_path_; }

  // Picks up the copy the state file names (same chunk size), so the first
  // GET can carry its bitmap; returns the bytes held (0: none). A state that
  // does not parse or fit is ignored.
  uint64_t LoadResume();

  // The version held: (size, tag, bitmap); tag 0 when none.
  struct Held {
    uint64_t size_bytes = 0;
    uint64_t tag = 0;
    std::string bitmap;
  };
  Held held();
  // What LoadResume found, until the copy is discarded.
  uint64_t resumed_bytes() const { return resumed_bytes_; }
  const MemoryRegion& region() const { return region_; }  // the whole copy, once mapped

  // The head window: the first `head_bytes` (rounded down to whole chunks,
  // at least one, at most kMaxHeadBytes) of a fresh part file.
  Status MapHead(uint64_t head_bytes);
  uint64_t head_bytes() const { return head_bytes_; }
  const MemoryRegion& head_region() const { return head_region_; }
  // Only once the head window is closed: drops the mapping and gives back
  // what the window reserved past the copy's size.
  void UnmapHead();
  // Gives up a head window MapHead could not open: unmaps it and empties the
  // part file (a reservation that half succeeded is given back).
  Status DropHead();

  // Starts version (size, tag) from zero: the old copy and its state go.
  // Sizing and reserving run without the lock, so chunks keep landing in an
  // open head window meanwhile.
  Status Prepare(uint64_t size_bytes, uint64_t tag);

  // A chunk write completed at [offset, offset + length). Only a whole chunk
  // where one starts counts.
  struct Landed {
    bool fresh = false;     // a chunk not held before
    bool complete = false;  // it completed the copy
  };
  Landed Land(uint64_t offset, uint64_t length);

  // The server's whole-file hash for the version held. One that differs
  // from the resume state's means the copy is of another version after all:
  // kUnavailable, and discard_pending() until Discard.
  Status LearnHash(uint64_t xxh3, const std::string& name);
  bool discard_pending() const { return discard_pending_; }
  // Drops the copy's version and state (the bytes stay until overwritten).
  void Discard();

  struct Progress {
    uint64_t total_bytes = 0, done_bytes = 0;
    bool complete = false, hash_known = false;
  };
  Progress progress();

  // Writes the state file (resume on, a version held).
  void SaveState();

  // Verifies the complete copy against the whole-file hash and renames it
  // to LOCAL; on a mismatch both files are removed (kCorrupt). Returns the
  // digest.
  Result<uint64_t> Commit(const std::string& local, const std::string& name);

  // The fetch failed: removes both files unless they can be resumed.
  void Abandon();

 private:
  Status Map(uint64_t size_bytes, uint64_t tag);
  Status Reserve(int fd, uint64_t size);
  bool MarkLocked(uint64_t offset, uint64_t length, bool* fresh);
  void DiscardLocked();
  void UnmapLocked();

  Transport& t_;
  const std::string part_, state_path_;
  const uint64_t chunk_bytes_;
  const bool resume_;
  bool discard_pending_ = false;
  uint64_t resumed_bytes_ = 0;

  std::mutex mu_;  // guards the copy against the landing callbacks
  ChunkMap map_;
  uint64_t size_ = 0, tag_ = 0;  // the version held (tag 0: none)
  bool hash_known_ = false;
  uint64_t xxh3_ = 0;
  bool mapped_ = false;
  // TODO(env): the Env's MappedFile (tern/env.h) replaces these two mappings.
  int fd_ = -1;
  void* base_ = nullptr;
  MemoryRegion region_;
  // The head window, and what landed in it before the size was known (more
  // than the head holds can only be a bad server's).
  static constexpr size_t kMaxPending = (kMaxHeadBytes / kMinChunkBytes) + 64;
  std::vector<std::pair<uint64_t, uint64_t>> pending_;
  int head_fd_ = -1;
  void* head_base_ = nullptr;
  uint64_t head_bytes_ = 0;
  MemoryRegion head_region_;
};

}  // namespace tern::xfer

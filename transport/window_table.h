// The receive windows of one connection, shared by every backend: what
// PostReceive opened, the checks a landing chunk must pass, and the
// bookkeeping that lets CancelReceive and Close wait for a chunk landing in
// a window (its bytes still being written, or its on_landed running) before
// the caller may free the memory (transport.h). Not part of the public API.
//
// A chunk lands in three steps:
//   Begin   checks the window and range (kNotFound, kOutOfRange, kUnavailable
//           once closed) and counts the landing;
//           the backend writes the bytes to Landing::dst (memcpy, a socket
//           read, a UCX rendezvous, an RDMA READ);
//   Finish  while the window is still open: verifies the checksum and runs
//           on_landed; then uncounts the landing. Or Abort when no bytes
//           were written (a read that never started).
// Every Landing that Begin returned ends exactly once, by Finish or Abort
// (or all at once by EndAll).
//
// Windows are told apart by a generation: a window cancelled and posted again
// under the same transfer id is a new window, and a landing for the old one
// finishes as cancelled.
//
// Thread safety: every method from any thread. The table's lock is the
// innermost one and no callback runs under it, so callers may hold their own
// lock around Post, Begin, Abort, Remove and Close, but not around Finish
// (it runs on_landed) or the waits (a landing may need that lock to finish).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "tern/status.h"
#include "tern/transport.h"

namespace tern::transport {

// One chunk landing in a window, from Begin to Finish or Abort.
struct Landing {
  uint64_t id = 0;
  uint64_t transfer_id = 0;
  uint64_t generation = 0;
  uint64_t offset = 0;     // in the window
  uint64_t length = 0;
  uint8_t* dst = nullptr;  // where the bytes go: window start + offset
  uint64_t handle = 0;     // the window's backend handle (Post's `handle`)
};

// Whether and how long a canceller waits for landings in progress.
struct LandingWait {
  // False on the thread that finishes landings (a backend's progress or
  // delivery thread): waiting there would wait for itself. The window is
  // then closed but a landing in progress may still write it after return.
  bool wait = true;
  // 0: until the landings end. Else at most this long (a backend whose
  // landing can hang bounds it by an op timeout that fails the connection).
  uint64_t timeout_ms = 0;
};

class WindowTable {
 public:
  // `backend` prefixes error messages ("ucx").
  explicit WindowTable(std::string backend) : backend_(std::move(backend)) {}
  WindowTable(const WindowTable&) = delete;
  WindowTable& operator=(const WindowTable&) = delete;

  // Opens window `transfer_id` over [dst_offset, dst_offset + length_bytes) of
  // registered memory `dst`. kInvalidArgument when dst is not registered
  // (null base or handle 0) or the range leaves it, kAlreadyExists for an
  // open id, kUnavailable once closed. `handle` is the backend's own key for
  // the memory (UCX memh, verbs lkey), handed back in each Landing.
  Status Post(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
              uint64_t length_bytes, ChunkLanded on_landed, uint64_t handle = 0);

  // A chunk of `length` bytes for `offset` in window `transfer_id` starts to
  // land. The refusal is what the sender hears: kNotFound (no such window),
  // kOutOfRange (outside it), kUnavailable (closed).
  Result<Landing> Begin(uint64_t transfer_id, uint64_t offset, uint64_t length);

  // The bytes arrived (`arrived` OK) or their transfer failed. Returns the
  // status for the sender: `arrived`'s error; kUnavailable once closed;
  // kNotFound when the window was cancelled meanwhile (its memory is not
  // read: it may be freed); kCorrupt when the bytes do not match `xxh3`;
  // else OK, after on_landed ran. on_landed runs while the landing still
  // counts, so a Cancel from another thread returns only after it; a
  // Cancel from inside on_landed does not wait for its own landing.
  Status Finish(const Landing& landing, Status arrived, uint64_t xxh3);
  // Ends a landing that wrote nothing (e.g. a read refused before it was
  // posted); on_landed does not run.
  void Abort(const Landing& landing);

  // CancelReceive: closes the window, then waits per `wait` for its
  // landings in progress. Nothing happens for an unknown id.
  void Cancel(uint64_t transfer_id, LandingWait wait);
  // Cancel in two steps, for a backend that must act between them with its
  // own lock held (verbs drops reads not yet posted): Remove returns the
  // closed window's generation (nullopt for an unknown id), WaitLandings
  // waits for that generation's landings. Returns whether they ended.
  std::optional<uint64_t> Remove(uint64_t transfer_id);
  bool WaitLandings(uint64_t generation, LandingWait wait);

  // The connection ended: Post and Begin fail, Finish runs no on_landed, and
  // the windows' callbacks are released (after the table's lock, so their
  // captures may be destroyed safely). Windows stay known, so Cancel still
  // waits for landings in progress. Idempotent.
  void Close();
  // Waits per `wait` for every landing in progress (Close of a backend whose
  // landings outlive its I/O). Returns whether they ended.
  bool WaitIdle(LandingWait wait);
  // The backend guarantees that nothing writes any window any more (its
  // device queue is destroyed): every landing in progress counts as ended,
  // waiters wake, and a later Finish or Abort of one of them does nothing.
  void EndAll();

  // Landings in progress (tests and assertions).
  uint64_t landings() const;

 private:
  struct Window {
    uint8_t* base;
    uint64_t length;
    uint64_t handle;
    uint64_t generation;
    ChunkLanded on_landed;  // null once closed
  };

  // Uncounts a landing; false when it was not counted (EndAll).
  bool End(uint64_t id);
  bool Wait(std::unique_lock<std::mutex>& lock, LandingWait wait, uint64_t generation);

  const std::string backend_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  uint64_t next_generation_ = 1;
  uint64_t next_landing_ = 1;
  std::map<uint64_t, Window> windows_;         // transfer id -> window
  std::map<uint64_t, uint64_t> landing_gen_;   // landing id -> generation
  std::map<uint64_t, uint32_t> gen_landings_;  // generation -> landings in progress
};

}  // namespace tern::transport

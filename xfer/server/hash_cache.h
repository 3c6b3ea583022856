// Whole-file hashes of served file versions: computed by a bounded pool of
// background hashers, shared by the sessions that wait for them, and kept
// for re-GETs and resumes.
//
// Contract:
// * Entries are keyed by Identity (device, inode, size, mtime, ctime): a
//   file changed in any of these is another entry, so a stale digest is
//   never found for it. Only digests that are ok and cacheable (the file
//   settled `settle_ns` before hashing began, see hasher.h) stay; a job
//   whose file changed, or that was cancelled, is taken out when it ends.
// * At most kMaxEntries entries; the least recently used finished one is
//   evicted for a new one (none finished: no new job, For returns null).
// * A job is held by tickets (For's results); when the last ticket is gone
//   before the job ran to its end, the job is cancelled and dropped.
// * At most max(1, threads) hashes run at once, background and session ones
//   together (AcquireSlot); at most max(1, max_queued) jobs wait to start.
// Thread-safe. The destructor stops and joins the hashers; sessions using
// the cache must have ended before it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/thread_tracker.h"
#include "tern/transport.h"
#include "xfer/server/hasher.h"
#include "xfer/server/served_file.h"

namespace tern::xfer {

// The whole-file hash of one file version, being computed or cached.
struct HashJob {
  Identity id;
  int fd = -1;  // its own descriptor (dup'ed), closed once hashed
  std::string path;
  uint64_t last_use = 0;  // guarded by HashCache::mu_
  std::atomic<int> waiters{0};  // live tickets
  std::mutex mu;
  std::condition_variable cv;
  bool cancelled = false;  // guarded by HashCache::mu_ and mu
  bool done = false;       // guarded by mu, as are the results below
  bool ok = false;         // the file was unchanged from open to digest
  bool cacheable = false;
  uint64_t xxh3 = 0;
  std::atomic<bool> finished{false};  // done, readable without the lock
  ~HashJob();
};

class HashCache {
 public:
  static constexpr size_t kMaxEntries = 1024;

  struct Options {
    uint32_t threads = 2;
    size_t max_queued = 64;
    uint64_t settle_ns = 0;
    // Called on a hasher before it reads a file (path as served); may block.
    std::function<void(const std::string& path)> on_hash_start;
    LogFn log;
  };

  explicit HashCache(Options options) : options_(std::move(options)) {}
  ~HashCache();
  HashCache(const HashCache&) = delete;
  HashCache& operator=(const HashCache&) = delete;

  // Stops the hashers and every AcquireSlot wait; For still answers from
  // the cache but queues nothing that runs.
  void Stop();
  bool stopped() const { return stopped_.load(); }
  uint64_t settle_ns() const { return options_.settle_ns; }

  // A ticket for the hash of `file`'s version: a finished job from the
  // cache, a queued or running one, or a new one queued for the hashers
  // (`path` is only named to on_hash_start and in log lines). Null when too
  // many are queued or the cache is full of unfinished jobs: the caller
  // hashes itself (AcquireSlot, HashFd, Insert).
  std::shared_ptr<HashJob> For(const ServedFile& file, const std::string& path);

  // Caches a digest a session computed itself, unless one is there.
  void Insert(const Identity& id, uint64_t xxh3);

  // Takes one of the hashing slots; false when `stop` was raised (or the
  // cache stopped) while waiting.
  bool AcquireSlot(const std::function<bool()>& stop);
  void ReleaseSlot();

  // Entries held (finished or not); for tests.
  size_t size();

 private:
  static std::shared_ptr<HashJob> Ticket(std::shared_ptr<HashJob> job);
  bool MakeRoomLocked();
  bool CancelIfUnwanted(const std::shared_ptr<HashJob>& job);
  void Finish(const std::shared_ptr<HashJob>& job, const HashOutcome& h, bool cancelled);
  void HashLoop();

  const Options options_;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;  // guards the entries, the queue and the hasher count
  std::map<Identity, std::shared_ptr<HashJob>> entries_;
  std::deque<std::shared_ptr<HashJob>> queue_;
  uint32_t hashers_ = 0;
  uint64_t use_clock_ = 0;
  std::mutex slot_mu_;  // guards hashing_
  std::condition_variable slot_cv_;
  uint32_t hashing_ = 0;
  ThreadTracker threads_;  // last member: joined first
};

}  // namespace tern::xfer

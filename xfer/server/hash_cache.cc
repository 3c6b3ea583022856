// The hash cache and its background hashers (hash_cache.h).
#include "xfer/server/hash_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "base/text.h"

namespace tern::xfer {

HashJob::~HashJob() {
  if (fd >= 0) ::close(fd);
}

HashCache::~HashCache() {
  Stop();
  threads_.WaitAll();
}

void HashCache::Stop() {
  stopped_ = true;
  std::lock_guard<std::mutex> lock(slot_mu_);
  slot_cv_.notify_all();
}

size_t HashCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

bool HashCache::AcquireSlot(const std::function<bool()>& stop) {
  std::unique_lock<std::mutex> lock(slot_mu_);
  for (;;) {
    if (stopped_.load() || stop()) return false;
    if (hashing_ < std::max<uint32_t>(1, options_.threads)) {
      ++hashing_;
      return true;
    }
    slot_cv_.wait_for(lock, std::chrono::milliseconds(100));  // `stop` is polled
  }
}

void HashCache::ReleaseSlot() {
  std::lock_guard<std::mutex> lock(slot_mu_);
  --hashing_;
  slot_cv_.notify_one();
}

// While any ticket lives the job is not cancelled. Called under mu_.
std::shared_ptr<HashJob> HashCache::Ticket(std::shared_ptr<HashJob> job) {
  job->waiters.fetch_add(1);
  HashJob* raw = job.get();
  return std::shared_ptr<HashJob>(raw, [job = std::move(job)](HashJob*) { job->waiters.fetch_sub(1); });
}

void HashCache::Insert(const Identity& id, uint64_t xxh3) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count(id) != 0) return;
  auto job = std::make_shared<HashJob>();
  job->id = id;
  job->ok = job->cacheable = job->done = true;
  job->xxh3 = xxh3;
  job->finished.store(true);
  job->last_use = ++use_clock_;
  if (MakeRoomLocked()) entries_.emplace(id, std::move(job));
}

// Evicts the least recently used finished entry when the cache is full
// (O(n), n bounded); false when none can go.
bool HashCache::MakeRoomLocked() {
  if (entries_.size() < kMaxEntries) return true;
  auto victim = entries_.end();
  for (auto i = entries_.begin(); i != entries_.end(); ++i) {
    if (i->second->finished.load() &&
        (victim == entries_.end() || i->second->last_use < victim->second->last_use)) {
      victim = i;
    }
  }
  if (victim == entries_.end()) return false;
  entries_.erase(victim);
  return true;
}

std::shared_ptr<HashJob> HashCache::For(const ServedFile& file, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(file.id);
  if (it != entries_.end()) {
    // Only finished entries that are ok and cacheable stay in the map;
    // cancelled ones are taken out when cancelled (under this lock).
    it->second->last_use = ++use_clock_;
    return Ticket(it->second);
  }
  if (queue_.size() >= std::max<size_t>(1, options_.max_queued)) return nullptr;
  const int fd = ::fcntl(file.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  auto job = std::make_shared<HashJob>();
  job->id = file.id;
  job->fd = fd;
  job->path = path;
  job->last_use = ++use_clock_;
  if (!MakeRoomLocked()) return nullptr;
  entries_.emplace(file.id, job);
  queue_.push_back(job);
  if (hashers_ < std::max<uint32_t>(1, options_.threads)) {
    ++hashers_;
    threads_.Spawn([this] { HashLoop(); });
  }
  return Ticket(std::move(job));
}

// Cancels `job` when no session waits for it any more (decided under mu_,
// so For never hands out a ticket for a cancelled job).
bool HashCache::CancelIfUnwanted(const std::shared_ptr<HashJob>& job) {
  if (job->waiters.load() > 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (job->waiters.load() > 0) return false;
  auto it = entries_.find(job->id);
  if (it != entries_.end() && it->second == job) entries_.erase(it);
  std::lock_guard<std::mutex> jl(job->mu);
  job->cancelled = true;
  return true;
}

void HashCache::Finish(const std::shared_ptr<HashJob>& job, const HashOutcome& h, bool cancelled) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled || h.end != HashOutcome::kOk || !h.cacheable) {
      auto it = entries_.find(job->id);
      if (it != entries_.end() && it->second == job) entries_.erase(it);
    }
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->cancelled = job->cancelled || cancelled;
    job->ok = h.end == HashOutcome::kOk;
    job->cacheable = h.cacheable;
    job->xxh3 = job->ok ? h.xxh3 : 0;
    if (job->fd >= 0) ::close(job->fd);  // the cache keeps the digest, not the file
    job->fd = -1;
    job->done = true;
    job->finished.store(true);
  }
  job->cv.notify_all();
}

void HashCache::HashLoop() {
  for (;;) {
    std::shared_ptr<HashJob> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty() || stopped_) {
        --hashers_;
        return;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    if (CancelIfUnwanted(job)) {  // nobody waits for it any more
      Finish(job, HashOutcome{}, true);
      continue;
    }
    if (options_.on_hash_start) options_.on_hash_start(job->path);
    bool cancelled = false;
    auto stop = [&] {
      if (stopped_.load()) return true;
      cancelled = CancelIfUnwanted(job);
      return cancelled;
    };
    if (!AcquireSlot(stop)) {
      Finish(job, HashOutcome{}, true);
      continue;
    }
    const HashOutcome h = HashFd(job->fd, job->id, stop, options_.settle_ns);
    ReleaseSlot();
    Finish(job, h, cancelled || h.end == HashOutcome::kStopped);
    if (h.end == HashOutcome::kChanged && !stopped_) {
      LogLine(options_.log, "xfer: " + Printable(job->path) + " changed while it was hashed");
    }
  }
}

}  // namespace tern::xfer

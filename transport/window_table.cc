#include "transport/window_table.h"

#include <chrono>
#include <vector>

#include "transport/internal.h"

namespace tern::transport {

namespace {

// The landing whose on_landed this thread runs now, so that a Cancel (or
// WaitIdle) from inside it does not wait for itself.
struct Running {
  const WindowTable* table = nullptr;
  uint64_t generation = 0;
};
thread_local Running t_running;

// Generation 0 stands for "every window" in Wait (real ones start at 1).
constexpr uint64_t kAllWindows = 0;

}  // namespace

Status WindowTable::Post(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                         uint64_t length_bytes, ChunkLanded on_landed, uint64_t handle) {
  TERN_REQUIRE(dst.base != nullptr && dst.handle != 0, kInvalidArgument, backend_,
               ": window memory not registered");
  TERN_REQUIRE(dst_offset <= dst.size_bytes && length_bytes <= dst.size_bytes - dst_offset,
               kInvalidArgument, backend_, ": window outside its registered memory");
  std::lock_guard<std::mutex> lock(mu_);
  TERN_REQUIRE(!closed_, kUnavailable, backend_, ": connection closed");
  TERN_REQUIRE(!windows_.count(transfer_id), kAlreadyExists, backend_, ": window ", transfer_id,
               " already open");
  windows_.emplace(transfer_id, Window{static_cast<uint8_t*>(dst.base) + dst_offset, length_bytes,
                                       handle, next_generation_++, std::move(on_landed)});
  return Status::Ok();
}

Result<Landing> WindowTable::Begin(uint64_t transfer_id, uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  TERN_REQUIRE(!closed_, kUnavailable, backend_, ": connection closed");
  auto it = windows_.find(transfer_id);
  TERN_REQUIRE(it != windows_.end(), kNotFound, backend_, ": no receive window ", transfer_id);
  const Window& w = it->second;
  TERN_REQUIRE(offset <= w.length && length <= w.length - offset, kOutOfRange, backend_, ": chunk [",
               offset, ", +", length, ") outside window ", transfer_id, " of ", w.length, " bytes");
  Landing l{next_landing_++, transfer_id, w.generation, offset, length, w.base + offset, w.handle};
  landing_gen_.emplace(l.id, l.generation);
  ++gen_landings_[l.generation];
  return l;
}

Status WindowTable::Finish(const Landing& landing, Status arrived, uint64_t xxh3) {
  ChunkLanded landed;
  Status status = std::move(arrived);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Ended by EndAll: its window may be freed already.
    if (!landing_gen_.count(landing.id)) return TERN_ERROR(kUnavailable, backend_, ": connection closed");
    auto it = windows_.find(landing.transfer_id);
    const bool open = it != windows_.end() && it->second.generation == landing.generation;
    if (status.ok() && closed_) {
      status = TERN_ERROR(kUnavailable, backend_, ": connection closed");
    } else if (status.ok() && !open) {
      status = TERN_ERROR(kNotFound, backend_, ": receive window ", landing.transfer_id, " was cancelled");
    } else if (status.ok()) {
      landed = it->second.on_landed;
    }
  }
  // Read only while the landing counts: a Cancel that closed the window
  // after the check above waits for us before the memory may go.
  if (status.ok() && Xxh3(landing.dst, landing.length) != xxh3) {
    landed = nullptr;
    status = TERN_ERROR(kCorrupt, backend_, ": chunk at ", landing.offset, " of transfer ",
                        landing.transfer_id, " failed its checksum");
  }
  if (landed) {
    const Running outer = t_running;
    t_running = Running{this, landing.generation};
    landed(landing.offset, landing.length);
    t_running = outer;
  }
  End(landing.id);
  return status;
}

void WindowTable::Abort(const Landing& landing) { End(landing.id); }

bool WindowTable::End(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = landing_gen_.find(id);
  if (it == landing_gen_.end()) return false;
  auto g = gen_landings_.find(it->second);
  if (--g->second == 0) gen_landings_.erase(g);
  landing_gen_.erase(it);
  cv_.notify_all();
  return true;
}

void WindowTable::Cancel(uint64_t transfer_id, LandingWait wait) {
  if (std::optional<uint64_t> generation = Remove(transfer_id)) WaitLandings(*generation, wait);
}

std::optional<uint64_t> WindowTable::Remove(uint64_t transfer_id) {
  ChunkLanded release;  // destroyed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(transfer_id);
  if (it == windows_.end()) return std::nullopt;
  const uint64_t generation = it->second.generation;
  release = std::move(it->second.on_landed);
  windows_.erase(it);
  return generation;
}

bool WindowTable::WaitLandings(uint64_t generation, LandingWait wait) {
  std::unique_lock<std::mutex> lock(mu_);
  return Wait(lock, wait, generation);
}

bool WindowTable::WaitIdle(LandingWait wait) {
  std::unique_lock<std::mutex> lock(mu_);
  return Wait(lock, wait, kAllWindows);
}

bool WindowTable::Wait(std::unique_lock<std::mutex>& lock, LandingWait wait, uint64_t generation) {
  // A thread inside on_landed counts as one landing it must not wait for.
  const bool inside = t_running.table == this &&
                      (generation == kAllWindows || t_running.generation == generation);
  const uint64_t own = inside ? 1 : 0;
  auto done = [&] {
    if (generation == kAllWindows) return landing_gen_.size() <= own;
    auto it = gen_landings_.find(generation);
    return (it == gen_landings_.end() ? 0 : it->second) <= own;
  };
  if (!wait.wait) return done();
  if (wait.timeout_ms == 0) {
    cv_.wait(lock, done);
    return true;
  }
  return cv_.wait_for(lock, std::chrono::milliseconds(wait.timeout_ms), done);
}

void WindowTable::Close() {
  std::vector<ChunkLanded> release;  // destroyed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [id, w] : windows_) {
    if (w.on_landed) release.push_back(std::move(w.on_landed));
    w.on_landed = nullptr;
  }
}

void WindowTable::EndAll() {
  std::lock_guard<std::mutex> lock(mu_);
  landing_gen_.clear();
  gen_landings_.clear();
  cv_.notify_all();
}

uint64_t WindowTable::landings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return landing_gen_.size();
}

}  // namespace tern::transport

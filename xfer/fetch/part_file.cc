// The partial copy on disk and its resume state (part_file.h).
#include "xfer/fetch/part_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <ios>

#include <xxhash.h>

namespace tern::xfer {

namespace {

// Read and written whole (bounded by kMaxPartStateBytes).
Result<PartState> LoadState(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_REQUIRE(in.good(), kNotFound, "no resume state");
  std::string block(4096, '\0');
  std::string all;
  while (in.read(block.data(), block.size()) || in.gcount() > 0) {
    all.append(block.data(), static_cast<size_t>(in.gcount()));
    TERN_REQUIRE(all.size() <= kMaxPartStateBytes, kCorrupt, "resume state ", path, " is too long");
  }
  auto st = ParsePartState(all);
  if (!st.ok()) return st.status().WithContext(path);
  return st;
}

void SaveStateFile(const std::string& path, const PartState& st) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << FormatPartState(st);
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

PartFile::PartFile(Transport& transport, const std::string& local, uint64_t chunk_bytes, bool resume)
    : t_(transport), part_(local + ".tern-part"), state_path_(part_ + ".state"), chunk_bytes_(chunk_bytes),
      resume_(resume) {}

PartFile::~PartFile() {
  UnmapHead();
  std::lock_guard<std::mutex> lock(mu_);
  UnmapLocked();
}

uint64_t PartFile::LoadResume() {
  auto st = LoadState(state_path_);
  if (!st.ok() || st->chunk_bytes != chunk_bytes_ || ::access(part_.c_str(), F_OK) != 0) return 0;
  if (!Map(st->size_bytes, st->tag).ok()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (!map_.SetBits(st->bitmap).ok()) {
    UnmapLocked();
    return 0;
  }
  hash_known_ = st->hash_known;
  xxh3_ = st->xxh3;
  resumed_bytes_ = map_.done_bytes();
  return resumed_bytes_;
}

PartFile::Held PartFile::held() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!mapped_) return {};
  return {size_, tag_, std::string(map_.bits().begin(), map_.bits().end())};
}

Status PartFile::MapHead(uint64_t head_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t head =
      std::max<uint64_t>(chunk_bytes_, std::min(head_bytes, kMaxHeadBytes) / chunk_bytes_ * chunk_bytes_);
  head_fd_ = ::open(part_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (head_fd_ < 0) return TERN_ERRNO("open ", part_);
  if (::ftruncate(head_fd_, static_cast<off_t>(head)) != 0) return TERN_ERRNO("resize ", part_);
  TERN_RETURN_IF_ERROR(Reserve(head_fd_, head));
  void* base = ::mmap(nullptr, head, PROT_READ | PROT_WRITE, MAP_SHARED, head_fd_, 0);
  if (base == MAP_FAILED) return TERN_ERRNO("mmap ", part_);
  head_base_ = base;
  head_bytes_ = head;
  TERN_ASSIGN_OR_RETURN(head_region_, t_.RegisterMemory(head_base_, head, MemoryKind::kHost));
  pending_.clear();
  return Status::Ok();
}

void PartFile::UnmapHead() {
  std::lock_guard<std::mutex> lock(mu_);
  if (head_region_.handle != 0) t_.DeregisterMemory(head_region_).IgnoreError();
  head_region_ = {};
  if (head_base_ != nullptr) ::munmap(head_base_, head_bytes_);
  head_base_ = nullptr;
  if (head_fd_ >= 0) {
    // The window reserved head_bytes_ however small the file: give back what
    // lies past the copy (all of it when no version is held: chunks that
    // landed before INFO are recorded nowhere). A failed ftruncate leaves
    // it longer; Commit cuts it to size anyway.
    if (!mapped_ || head_bytes_ > size_) (void)::ftruncate(head_fd_, static_cast<off_t>(mapped_ ? size_ : 0));
    ::close(head_fd_);
  }
  head_fd_ = -1;
  head_bytes_ = 0;
  pending_.clear();
}

Status PartFile::DropHead() {
  UnmapHead();
  if (::truncate(part_.c_str(), 0) != 0 && errno != ENOENT) return TERN_ERRNO("resize ", part_);
  return Status::Ok();
}

// Reserves the blocks of [0, size) before anything is stored through a
// mapping: a store into a file the filesystem cannot hold raises SIGBUS,
// which no error path survives. Filesystems without fallocate keep the old
// behaviour.
Status PartFile::Reserve(int fd, uint64_t size) {
  if (size > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 && errno != EOPNOTSUPP) {
    const int e = errno;
    return Status(e == ENOSPC || e == EDQUOT ? Code::kResourceExhausted : Code::kUnavailable,
                  "cannot reserve " + std::to_string(size) + " bytes for " + part_ + ": " + std::strerror(e));
  }
  return Status::Ok();
}

Status PartFile::Prepare(uint64_t size_bytes, uint64_t tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DiscardLocked();
  }
  return Map(size_bytes, tag);
}

// Maps the part file at `size` bytes with an empty chunk map. Only the
// fetching thread maps and unmaps.
Status PartFile::Map(uint64_t size, uint64_t tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    UnmapLocked();
  }
  struct Pending {  // released into the members on success
    explicit Pending(Transport& transport) : t(transport) {}
    Transport& t;
    int fd = -1;
    void* base = nullptr;
    uint64_t size = 0;
    MemoryRegion region;
    ~Pending() {
      if (region.handle != 0) t.DeregisterMemory(region).IgnoreError();
      if (base != nullptr) ::munmap(base, size);
      if (fd >= 0) ::close(fd);
    }
  } m{t_};
  m.size = size;
  TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(size, chunk_bytes_));
  m.fd = ::open(part_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (m.fd < 0) return TERN_ERRNO("open ", part_);
  // Never below an open head window (UnmapHead and Commit cut it to size).
  const uint64_t file_bytes = std::max(size, head_bytes_);
  if (::ftruncate(m.fd, static_cast<off_t>(file_bytes)) != 0) return TERN_ERRNO("resize ", part_);
  TERN_RETURN_IF_ERROR(Reserve(m.fd, file_bytes));
  if (size > 0) {
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    if (base == MAP_FAILED) return TERN_ERRNO("mmap ", part_);
    m.base = base;
    TERN_ASSIGN_OR_RETURN(m.region, t_.RegisterMemory(m.base, size, MemoryKind::kHost));
  }
  std::lock_guard<std::mutex> lock(mu_);
  fd_ = std::exchange(m.fd, -1);
  base_ = std::exchange(m.base, nullptr);
  region_ = std::exchange(m.region, MemoryRegion{});
  size_ = size;
  tag_ = tag;
  map_ = std::move(map);
  mapped_ = true;
  // What landed in the head window before the size was known.
  for (const auto& [offset, length] : pending_) MarkLocked(offset, length, nullptr);
  pending_.clear();
  return Status::Ok();
}

PartFile::Landed PartFile::Land(uint64_t offset, uint64_t length) {
  Landed landed;
  std::lock_guard<std::mutex> lock(mu_);
  if (mapped_) {
    landed.complete = MarkLocked(offset, length, &landed.fresh);
  } else if (pending_.size() < kMaxPending) {
    pending_.emplace_back(offset, length);  // into the head window before INFO sized the map
  }
  return landed;
}

// True when that completed the map.
bool PartFile::MarkLocked(uint64_t offset, uint64_t length, bool* fresh) {
  const uint64_t i = map_.ChunkAt(offset);
  if (i >= map_.chunks() || length != map_.ChunkLength(i) || map_.done(i)) return false;
  map_.MarkDone(i);
  if (fresh != nullptr) *fresh = true;
  return map_.complete();
}

Status PartFile::LearnHash(uint64_t xxh3, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (hash_known_ && xxh3_ != xxh3) {
    discard_pending_ = true;  // once the window is closed
    return TERN_ERROR(kUnavailable, "the server's hash of '", name,
                      "' differs from the one this partial copy was fetched under; starting over");
  }
  hash_known_ = true;
  xxh3_ = xxh3;
  return Status::Ok();
}

void PartFile::Discard() {
  std::lock_guard<std::mutex> lock(mu_);
  DiscardLocked();
  discard_pending_ = false;
}

void PartFile::DiscardLocked() {
  UnmapLocked();
  ::unlink(state_path_.c_str());
  hash_known_ = false;
  xxh3_ = 0;
  resumed_bytes_ = 0;
}

void PartFile::UnmapLocked() {
  if (region_.handle != 0) t_.DeregisterMemory(region_).IgnoreError();
  region_ = {};
  if (base_ != nullptr) ::munmap(base_, size_);
  base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  mapped_ = false;
  tag_ = 0;
}

PartFile::Progress PartFile::progress() {
  std::lock_guard<std::mutex> lock(mu_);
  return {size_, map_.done_bytes(), mapped_ && map_.complete(), hash_known_};
}

void PartFile::SaveState() {
  if (!resume_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!mapped_) return;
  if (base_ != nullptr) ::msync(base_, size_, MS_ASYNC);
  SaveStateFile(state_path_, PartState{size_, tag_, hash_known_, xxh3_, chunk_bytes_,
                                       std::string(map_.bits().begin(), map_.bits().end())});
}

Result<uint64_t> PartFile::Commit(const std::string& local, const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  TERN_ASSERT(mapped_ && map_.complete() && hash_known_, "a copy committed before it was complete");
  if (base_ != nullptr) ::msync(base_, size_, MS_SYNC);
  const uint64_t got = XXH3_64bits(base_, size_);
  const uint64_t size = size_;
  const uint64_t want = xxh3_;
  UnmapLocked();
  lock.unlock();
  if (got != want) {
    ::unlink(state_path_.c_str());
    ::unlink(part_.c_str());
    return TERN_ERROR(kCorrupt, "whole-file checksum mismatch for '", name, "' (", std::hex, got, " != ", want,
                      "); partial file discarded");
  }
  // A head window may have left the file longer than its content.
  if (::truncate(part_.c_str(), static_cast<off_t>(size)) != 0) return TERN_ERRNO("resize ", part_);
  if (std::rename(part_.c_str(), local.c_str()) != 0) return TERN_ERRNO("rename to ", local);
  ::unlink(state_path_.c_str());
  return got;
}

void PartFile::Abandon() {
  UnmapHead();
  std::lock_guard<std::mutex> lock(mu_);
  if (resume_ && mapped_ && map_.done_bytes() > 0) return;
  UnmapLocked();
  ::unlink(state_path_.c_str());
  ::unlink(part_.c_str());
}

}  // namespace tern::xfer

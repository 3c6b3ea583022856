// The `tern xfer get` side of the file service: resumable, retried pulls.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "tern/xfer.h"
#include "xfer/xfer_wire.h"

namespace tern {

namespace {

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> messages;
  bool closed = false;
  bool landed_all = false;  // the last missing chunk landed
  Status why;
};

// Resume state: read and written whole (bounded by xfer::ParsePartState).
Result<xfer::PartState> LoadState(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_REQUIRE(in.good(), kNotFound, "no resume state");
  std::string text(4096, '\0');
  std::string all;
  while (in.read(text.data(), text.size()) || in.gcount() > 0) {
    all.append(text.data(), static_cast<size_t>(in.gcount()));
    TERN_REQUIRE(all.size() <= xfer::kMaxPartStateBytes, kCorrupt, "resume state ", path,
                 " is too long");
  }
  auto st = xfer::ParsePartState(all);
  if (!st.ok()) return st.status().WithContext(path);
  return st;
}

void SaveState(const std::string& path, const xfer::PartState& st) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << xfer::FormatPartState(st);
  }
  std::rename(tmp.c_str(), path.c_str());
}

class Fetch {
 public:
  Fetch(Transport& t, const std::string& address, const std::string& name, const std::string& local,
        const FetchOptions& o, Clock& clock)
      : t_(t), address_(address), name_(name), local_(local), part_(local + ".tern-part"),
        state_path_(part_ + ".state"), o_(o), clock_(clock) {}

  ~Fetch() { Unmap(); }

  Result<FetchResult> Run() {
    start_us_ = clock_.NowUs();
    if (o_.resume) LoadResume();
    const bool resumed = result_.resumed_bytes > 0;
    Result<FetchResult> done = Fetched();
    // A resumed copy can fail its final check through no fault of this run
    // (a damaged partial file, state saved before a power loss): the copy
    // was discarded, so one more run from zero fixes it.
    if (!done.ok() && done.status().code() == Code::kCorrupt && resumed) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        DiscardLocked();
      }
      done = Fetched();
    }
    return done;
  }

 private:
  Result<FetchResult> Fetched() {
    Status last;
    uint64_t backoff_ms = o_.retry.backoff_ms;
    for (uint32_t attempt = 0;; ++attempt) {
      Status st = Attempt();
      if (st.ok()) break;
      last = st;
      if (discard_) {
        std::lock_guard<std::mutex> lock(mu_);
        DiscardLocked();
        discard_ = false;
      }
      const bool retryable = st.code() == Code::kUnavailable || st.code() == Code::kTimeout ||
                             st.code() == Code::kCorrupt;
      SaveProgress();
      if (!retryable || attempt + 1 >= std::max<uint32_t>(1, o_.retry.attempts)) return last;
      ++result_.reconnects;
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms = std::min(o_.retry.backoff_ms_max, backoff_ms * 2);
    }
    return Finish();
  }

  // One connection's worth of work; returns OK when every chunk landed and
  // the whole-file hash is known.
  Status Attempt() {
    auto inbox = std::make_shared<Inbox>();
    ConnectionHandlers h;
    h.on_message = [inbox](std::string m) {
      std::lock_guard<std::mutex> lock(inbox->mu);
      // The server answers each request once; a flood is a protocol error.
      if (inbox->messages.size() < 64) {
        inbox->messages.push_back(std::move(m));
      } else if (!inbox->closed) {
        inbox->closed = true;
        inbox->why = TERN_ERROR(kProtocol, "server sent more than 64 unrequested messages");
      }
      inbox->cv.notify_all();
    };
    h.on_closed = [inbox](Status why) {
      std::lock_guard<std::mutex> lock(inbox->mu);
      if (inbox->closed) return;  // already failed (a message flood)
      inbox->closed = true;
      inbox->why = why.ok() ? TERN_ERROR(kUnavailable, "server closed the connection") : why;
      inbox->cv.notify_all();
    };
    RetryPolicy connect_retry = o_.retry;
    TERN_ASSIGN_OR_RETURN(auto conn, ConnectWait(t_, address_, h, o_.connect_timeout_ms, connect_retry));
    result_.link = conn->Describe();
    // Declared before the closer, so it runs after the windows are closed.
    struct HeadUnmapper {
      Fetch* f;
      ~HeadUnmapper() { f->UnmapHead(); }
    } head_unmapper{this};
    struct Closer {
      std::shared_ptr<Connection> c;
      std::vector<uint64_t> posted;  // the open receive windows
      void Cancel() {
        for (uint64_t id : posted) c->CancelReceive(id);
        posted.clear();
      }
      ~Closer() {
        Cancel();
        c->Close();
      }
    } closer{conn, {}};

    // Window ids are this client's to choose: a fresh one per window, so a
    // cancelled window's late chunks can never count for the next.
    const uint64_t get_id = ++last_window_;
    xfer::GetRequest get{o_.chunk_bytes, get_id, name_, 0, 0, {}};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (mapped_) {  // a version held: its window opens before GET (no WANT round trip)
        get.have_size = size_;
        get.have_tag = tag_;
        get.have_bitmap.assign(map_.bits().begin(), map_.bits().end());
      }
    }
    if (get.have_tag != 0 && size_ > 0) {
      TERN_RETURN_IF_ERROR(conn->PostReceive(get_id, region_, 0, size_, Landing(inbox)));
      closer.posted.push_back(get_id);
    } else if (get.have_tag == 0 && o_.head_bytes > 0) {
      // A fresh copy: the size is not known yet, but the start of the file
      // can already receive, so the first chunks need no WANT round trip.
      // A disk too small for the head (a small file onto a small disk) goes
      // without one: the first chunks then wait for WANT, as in v1.
      if (MapHead().ok()) {
        TERN_RETURN_IF_ERROR(conn->PostReceive(get_id, head_region_, 0, head_bytes_, Landing(inbox)));
        closer.posted.push_back(get_id);
        get.head_bytes = head_bytes_;
      } else {
        UnmapHead();
        if (::truncate(part_.c_str(), 0) != 0 && errno != ENOENT) return TERN_ERRNO("resize ", part_);
      }
    }
    conn->SendMessage(xfer::EncodeGet(get), nullptr);
    TERN_ASSIGN_OR_RETURN(std::string reply, Next(*inbox, o_.connect_timeout_ms));
    if (xfer::TypeOf(reply) == xfer::kError) {
      Status refused;
      TERN_RETURN_IF_ERROR(xfer::DecodeStatus(reply, xfer::kError, &refused));
      return refused.ok() ? TERN_ERROR(kProtocol, "server sent an error without a code") : refused;
    }
    TERN_ASSIGN_OR_RETURN(xfer::Info info, xfer::DecodeInfo(reply));
    TERN_REQUIRE(info.transfer_id == get_id, kProtocol, "INFO for transfer ", info.transfer_id,
                 ", asked ", get_id);
    // Bounded before the partial file is sized or the chunk map allocated.
    TERN_RETURN_IF_ERROR(xfer::ChunkCount(info.size_bytes, o_.chunk_bytes).status());
    const bool same_version = get.have_tag == info.tag && get.have_size == info.size_bytes;
    TERN_REQUIRE(!info.sending() || same_version, kProtocol,
                 "server sends without WANT for a version this client does not hold");
    TERN_REQUIRE(!info.head() || (get.head_bytes > 0 && info.size_bytes > 0), kProtocol,
                 "server sends a head this client did not open");
    if (!same_version) {
      if (!info.head()) closer.Cancel();  // nothing lands in the old copy from here on
      TERN_RETURN_IF_ERROR(Prepare(info.size_bytes, info.tag));
    }
    if (info.hash_known()) TERN_RETURN_IF_ERROR(LearnHash(info.xxh3));
    {
      std::lock_guard<std::mutex> lock(mu_);
      landed_us_ = clock_.NowUs();
      complete_us_ = 0;
    }
    const bool head_is_all = info.head() && size_ <= get.head_bytes;
    if (!info.sending() && !head_is_all) {
      if (!info.head()) closer.Cancel();  // the head window stays: its chunks are coming
      const uint64_t window = ++last_window_;
      if (size_ > 0) {
        TERN_RETURN_IF_ERROR(conn->PostReceive(window, region_, 0, size_, Landing(inbox)));
        closer.posted.push_back(window);
      }
      std::lock_guard<std::mutex> lock(mu_);
      conn->SendMessage(xfer::EncodeWant(window, std::string_view(reinterpret_cast<const char*>(
                                                                     map_.bits().data()),
                                                                 map_.bits().size())),
                        nullptr);
    }

    uint64_t last_save_us = clock_.NowUs(), last_report_us = 0;
    bool hash_message_seen = info.hash_known();
    for (;;) {
      std::string msg;
      bool closed = false;
      Status why;
      {
        std::unique_lock<std::mutex> lock(inbox->mu);
        inbox->cv.wait_for(lock, std::chrono::milliseconds(100), [&] {
          return inbox->closed || inbox->landed_all || !inbox->messages.empty();
        });
        inbox->landed_all = false;
        if (!inbox->messages.empty()) {
          msg = std::move(inbox->messages.front());
          inbox->messages.pop_front();
        } else if (inbox->closed) {
          closed = true;
          why = inbox->why;
        }
      }
      const uint64_t now = clock_.NowUs();
      if (now - last_report_us > 250000) {
        Report();
        last_report_us = now;
      }
      if (now - last_save_us > 1000000) {
        SaveProgress();
        last_save_us = now;
      }
      if (xfer::TypeOf(msg) == xfer::kHash) {
        TERN_ASSIGN_OR_RETURN(xfer::HashMsg hash, xfer::DecodeHash(msg));
        TERN_REQUIRE(!hash_message_seen, kProtocol, "server sent the whole-file hash twice");
        TERN_REQUIRE(hash.transfer_id == get_id, kProtocol, "HASH for transfer ", hash.transfer_id,
                     ", asked ", get_id);
        hash_message_seen = true;
        TERN_RETURN_IF_ERROR(LearnHash(hash.xxh3));
      } else if (!msg.empty()) {
        Status finished;
        TERN_RETURN_IF_ERROR(xfer::DecodeStatus(msg, xfer::kDone, &finished));
        TERN_RETURN_IF_ERROR(finished);
        std::lock_guard<std::mutex> lock(mu_);
        TERN_REQUIRE(map_.complete(), kProtocol, "server finished with chunks missing");
        TERN_REQUIRE(hash_known_, kProtocol, "server finished without the whole-file hash");
        return Status::Ok();
      }
      std::lock_guard<std::mutex> lock(mu_);
      // Every chunk and the hash: done, without waiting a round trip for DONE.
      if (map_.complete() && hash_known_) return Status::Ok();
      if (closed) return why;
      // landed_us_ is stamped by stream threads and may be later than `now`
      // (read before the lock): without the guard the difference wraps and
      // a busy transfer is reported as stalled. Only a chunk not held
      // before stamps it, so duplicates cannot keep a stalled fetch alive.
      if (!map_.complete()) {
        TERN_REQUIRE(now <= landed_us_ || now - landed_us_ <= o_.stall_timeout_ms * 1000, kTimeout,
                     "no new chunk landed for ", o_.stall_timeout_ms, " ms");
      } else {
        // Every chunk is here and the hash is not: the server may still be
        // hashing (in the background, behind other files). It gets the stall
        // timeout plus the file's size at 50 MB/s, still a bound.
        if (complete_us_ == 0) complete_us_ = std::max(now, landed_us_);
        const uint64_t allowed_us = o_.stall_timeout_ms * 1000 + size_ / 50;
        TERN_REQUIRE(now <= complete_us_ || now - complete_us_ <= allowed_us, kTimeout,
                     "no whole-file hash ", allowed_us / 1000, " ms after the last chunk");
      }
    }
  }

  ChunkLanded Landing(const std::shared_ptr<Inbox>& inbox) {
    return [this, inbox](uint64_t offset, uint64_t length) {
      bool complete = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        bool fresh = false;
        if (mapped_) {
          complete = MarkLocked(offset, length, &fresh);
        } else if (pending_.size() < kMaxPending) {
          // Into the head window before INFO sized the chunk map: counted
          // once it is (more than the head holds can only be a bad server's).
          pending_.emplace_back(offset, length);
        }
        if (fresh) landed_us_ = clock_.NowUs();
        if (first_landed_us_ == 0) first_landed_us_ = clock_.NowUs();
      }
      if (complete) {
        std::lock_guard<std::mutex> lock(inbox->mu);
        inbox->landed_all = true;
        inbox->cv.notify_all();
      }
    };
  }

  // Only a whole chunk where one starts counts (*fresh: it was not held
  // before). True when that completed the map.
  bool MarkLocked(uint64_t offset, uint64_t length, bool* fresh = nullptr) {
    const uint64_t i = map_.ChunkAt(offset);
    if (i >= map_.chunks() || length != map_.ChunkLength(i) || map_.done(i)) return false;
    map_.MarkDone(i);
    if (fresh != nullptr) *fresh = true;
    return map_.complete();
  }

  // The head window of a fresh copy: the start of LOCAL.tern-part, mapped
  // before the size is known.
  Status MapHead() {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t head = std::max<uint64_t>(
        o_.chunk_bytes, std::min(o_.head_bytes, xfer::kMaxHeadBytes) / o_.chunk_bytes * o_.chunk_bytes);
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

  // Only once the head window is closed.
  void UnmapHead() {
    std::lock_guard<std::mutex> lock(mu_);
    if (head_region_.handle != 0) t_.DeregisterMemory(head_region_).IgnoreError();
    head_region_ = {};
    if (head_base_ != nullptr) ::munmap(head_base_, head_bytes_);
    head_base_ = nullptr;
    if (head_fd_ >= 0) ::close(head_fd_);
    head_fd_ = -1;
    head_bytes_ = 0;
    pending_.clear();
  }

  // Reserves the blocks of [0, size) before anything is stored through a
  // mapping: a store into a file the filesystem cannot hold raises SIGBUS,
  // which no error path survives. Filesystems without fallocate keep the
  // old behaviour.
  Status Reserve(int fd, uint64_t size) {
    if (size > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0 && errno != EOPNOTSUPP) {
      const int e = errno;
      return Status(e == ENOSPC || e == EDQUOT ? Code::kResourceExhausted : Code::kUnavailable,
                    "cannot reserve " + std::to_string(size) + " bytes for " + part_ + ": " +
                        std::strerror(e));
    }
    return Status::Ok();
  }

  // The server's whole-file hash for the version held. A different one than
  // the resume state's means the copy is of another version after all:
  // discarded, and the next attempt starts over.
  Status LearnHash(uint64_t xxh3) {
    std::lock_guard<std::mutex> lock(mu_);
    if (hash_known_ && xxh3_ != xxh3) {
      discard_ = true;  // once the window is closed (Run)
      return TERN_ERROR(kUnavailable, "the server's hash of '", name_,
                        "' differs from the one this partial copy was fetched under; starting over");
    }
    hash_known_ = true;
    xxh3_ = xxh3;
    return Status::Ok();
  }
  Result<std::string> Next(Inbox& inbox, uint64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(inbox.mu);
    inbox.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return inbox.closed || !inbox.messages.empty(); });
    if (!inbox.messages.empty()) {
      std::string m = std::move(inbox.messages.front());
      inbox.messages.pop_front();
      return m;
    }
    if (inbox.closed) return inbox.why;
    return TERN_ERROR(kTimeout, "server did not answer within ", timeout_ms, " ms");
  }

  // Picks up LOCAL.tern-part for the version its state names, so the first
  // GET can carry the bitmap. A state that does not parse or fit is ignored.
  void LoadResume() {
    auto st = LoadState(state_path_);
    if (!st.ok() || st->chunk_bytes != o_.chunk_bytes || ::access(part_.c_str(), F_OK) != 0) return;
    if (!Map(st->size_bytes, st->tag).ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!map_.SetBits(st->bitmap).ok()) {
      UnmapLocked();
      return;
    }
    hash_known_ = st->hash_known;
    xxh3_ = st->xxh3;
    result_.resumed_bytes = map_.done_bytes();
  }

  // Starts version (size, tag) from zero: a copy of another version is
  // worthless, and its state goes with it.
  Status Prepare(uint64_t size, uint64_t tag) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      DiscardLocked();
    }
    return Map(size, tag);
  }

  void DiscardLocked() {
    UnmapLocked();
    ::unlink(state_path_.c_str());
    hash_known_ = false;
    xxh3_ = 0;
    result_.resumed_bytes = 0;
  }

  // Maps the partial file at `size` bytes with an empty chunk map. Sizing,
  // reserving (seconds for a large file on tmpfs, which zeroes its pages)
  // and mapping happen without mu_, so chunks keep landing in an open head
  // window meanwhile; only this thread maps and unmaps.
  Status Map(uint64_t size, uint64_t tag) {
    Unmap();
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
    TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(size, o_.chunk_bytes));
    m.fd = ::open(part_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (m.fd < 0) return TERN_ERRNO("open ", part_);
    // Never below an open head window (Finish cuts the file to size).
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
    for (const auto& [offset, length] : pending_) MarkLocked(offset, length);
    pending_.clear();
    return Status::Ok();
  }

  void Unmap() {
    std::lock_guard<std::mutex> lock(mu_);
    UnmapLocked();
  }

  void UnmapLocked() {
    if (region_.handle != 0) t_.DeregisterMemory(region_).IgnoreError();
    region_ = {};
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    mapped_ = false;
    tag_ = 0;
  }

  void SaveProgress() {
    if (!o_.resume) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!mapped_) return;
    if (base_ != nullptr) ::msync(base_, size_, MS_ASYNC);
    SaveState(state_path_,
              xfer::PartState{size_, tag_, hash_known_, xxh3_, o_.chunk_bytes,
                              std::string(map_.bits().begin(), map_.bits().end())});
  }

  void Report() {
    if (!o_.on_progress) return;
    FetchProgress p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p.total_bytes = size_;
      p.done_bytes = map_.done_bytes();
    }
    p.resumed_bytes = result_.resumed_bytes;
    p.seconds = (clock_.NowUs() - start_us_) / 1e6;
    o_.on_progress(p);
  }

  Result<FetchResult> Finish() {
    Report();
    if (base_ != nullptr) ::msync(base_, size_, MS_SYNC);
    const uint64_t got = XXH3_64bits(base_, size_);
    const uint64_t size = size_;
    const uint64_t want = xxh3_;
    TERN_ASSERT(hash_known_, "a fetch finished without the whole-file hash");
    Unmap();
    if (got != want) {
      ::unlink(state_path_.c_str());
      ::unlink(part_.c_str());
      return TERN_ERROR(kCorrupt, "whole-file checksum mismatch for '", name_, "' (", std::hex, got,
                        " != ", want, "); partial file discarded");
    }
    // A head window may have left the file longer than its content.
    if (::truncate(part_.c_str(), static_cast<off_t>(size)) != 0) return TERN_ERRNO("resize ", part_);
    if (std::rename(part_.c_str(), local_.c_str()) != 0) return TERN_ERRNO("rename to ", local_);
    ::unlink(state_path_.c_str());
    result_.bytes = size;
    result_.xxh3 = got;
    result_.seconds = (clock_.NowUs() - start_us_) / 1e6;
    if (first_landed_us_ != 0) result_.first_chunk_seconds = (first_landed_us_ - start_us_) / 1e6;
    return result_;
  }

  Transport& t_;
  const std::string address_, name_, local_, part_, state_path_;
  const FetchOptions& o_;
  Clock& clock_;
  uint64_t start_us_ = 0;
  FetchResult result_;

  uint64_t last_window_ = 0;  // receive window ids used so far
  bool discard_ = false;      // the copy turned out to be of another version

  std::mutex mu_;  // guards the copy's state against the landing callbacks
  ChunkMap map_;
  uint64_t landed_us_ = 0;         // the last chunk not held before landed
  uint64_t complete_us_ = 0;       // the map completed (0: not yet, this attempt)
  uint64_t first_landed_us_ = 0;  // 0 until a chunk landed in this run
  uint64_t size_ = 0, tag_ = 0;   // the version held (tag 0: none)
  // The head window of a fresh copy, and what landed in it before INFO.
  static constexpr size_t kMaxPending = (xfer::kMaxHeadBytes / xfer::kMinChunkBytes) + 64;
  std::vector<std::pair<uint64_t, uint64_t>> pending_;
  int head_fd_ = -1;
  void* head_base_ = nullptr;
  uint64_t head_bytes_ = 0;
  MemoryRegion head_region_;
  bool hash_known_ = false;
  uint64_t xxh3_ = 0;
  bool mapped_ = false;
  int fd_ = -1;
  void* base_ = nullptr;
  MemoryRegion region_;
};

}  // namespace

Result<FetchResult> FetchFile(Transport& transport, const std::string& address,
                              const std::string& remote_name, const std::string& local_path,
                              const FetchOptions& options, Clock& clock) {
  TERN_REQUIRE(options.chunk_bytes >= 4096 && options.chunk_bytes <= kMaxChunkBytes, kInvalidArgument,
               "chunk size ", options.chunk_bytes, " outside [4096, ", kMaxChunkBytes, "]");
  Fetch fetch(transport, address, remote_name, local_path, options, clock);
  return fetch.Run();
}

}  // namespace tern

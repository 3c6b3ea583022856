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

#include <xxhash.h>

#include "tern/file_transfer.h"
#include "transport/xfer_wire.h"

namespace tern {

namespace {

struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> messages;
  bool closed = false;
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
    TERN_REQUIRE(all.size() <= 128 + 2 * (xfer::kMaxChunks / 8), kCorrupt, "resume state ", path,
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
    Status last;
    uint64_t backoff_ms = o_.retry.backoff_ms;
    for (uint32_t attempt = 0;; ++attempt) {
      Status st = Attempt();
      if (st.ok()) break;
      last = st;
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

 private:
  // One connection's worth of work; returns OK when every chunk landed.
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
    struct Closer {
      std::shared_ptr<Connection> c;
      uint64_t id = 0;
      bool posted = false;
      ~Closer() {
        if (posted) c->CancelReceive(id);
        c->Close();
      }
    } closer{conn};

    conn->SendMessage(xfer::EncodeGet({o_.chunk_bytes, name_}), nullptr);
    TERN_ASSIGN_OR_RETURN(std::string reply, Next(*inbox, o_.connect_timeout_ms));
    if (xfer::TypeOf(reply) == xfer::kError) {
      Status refused;
      TERN_RETURN_IF_ERROR(xfer::DecodeStatus(reply, xfer::kError, &refused));
      return refused.ok() ? TERN_ERROR(kProtocol, "server sent an error without a code") : refused;
    }
    TERN_ASSIGN_OR_RETURN(xfer::Info info, xfer::DecodeInfo(reply));
    const uint64_t size = info.size_bytes, xxh3 = info.xxh3, transfer_id = info.transfer_id;
    // Bounded before the partial file is sized or the chunk map allocated.
    TERN_RETURN_IF_ERROR(xfer::ChunkCount(size, o_.chunk_bytes).status());
    TERN_RETURN_IF_ERROR(Prepare(size, xxh3));
    if (size == 0) return Status::Ok();

    TERN_RETURN_IF_ERROR(conn->PostReceive(transfer_id, region_, 0, size,
                                           [this](uint64_t offset, uint64_t length) {
                                             std::lock_guard<std::mutex> lock(mu_);
                                             // Only a whole chunk where one starts counts.
                                             const uint64_t i = map_.ChunkAt(offset);
                                             if (i < map_.chunks() && length == map_.ChunkLength(i)) {
                                               map_.MarkDone(i);
                                             }
                                             landed_us_ = clock_.NowUs();
                                             if (first_landed_us_ == 0) first_landed_us_ = landed_us_;
                                           }));
    closer.id = transfer_id;
    closer.posted = true;
    std::string want;
    {
      std::lock_guard<std::mutex> lock(mu_);
      want = xfer::EncodeWant(transfer_id, std::string_view(reinterpret_cast<const char*>(map_.bits().data()),
                                                            map_.bits().size()));
      landed_us_ = clock_.NowUs();
    }
    conn->SendMessage(std::move(want), nullptr);

    uint64_t last_save_us = clock_.NowUs(), last_report_us = 0;
    for (;;) {
      std::string done;
      {
        std::unique_lock<std::mutex> lock(inbox->mu);
        inbox->cv.wait_for(lock, std::chrono::milliseconds(100),
                           [&] { return inbox->closed || !inbox->messages.empty(); });
        if (!inbox->messages.empty()) {
          done = std::move(inbox->messages.front());
          inbox->messages.pop_front();
        } else if (inbox->closed) {
          return inbox->why;
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
      if (!done.empty()) {
        Status finished;
        TERN_RETURN_IF_ERROR(xfer::DecodeStatus(done, xfer::kDone, &finished));
        TERN_RETURN_IF_ERROR(finished);
        std::lock_guard<std::mutex> lock(mu_);
        TERN_REQUIRE(map_.complete(), kProtocol, "server finished with chunks missing");
        return Status::Ok();
      }
      std::lock_guard<std::mutex> lock(mu_);
      // landed_us_ is stamped by stream threads and may be later than `now`
      // (read before the lock): without the guard the difference wraps and
      // a busy transfer is reported as stalled.
      TERN_REQUIRE(now <= landed_us_ || now - landed_us_ <= o_.stall_timeout_ms * 1000, kTimeout,
                   "no chunk landed for ",
                   o_.stall_timeout_ms, " ms");
    }
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

  // Maps the partial file and loads or resets the chunk map for (size, xxh3).
  Status Prepare(uint64_t size, uint64_t xxh3) {
    std::lock_guard<std::mutex> lock(mu_);
    if (mapped_ && size == size_ && xxh3 == xxh3_) return Status::Ok();  // same file: keep progress
    Unmap();
    size_ = size;
    xxh3_ = xxh3;
    TERN_ASSIGN_OR_RETURN(map_, ChunkMap::Make(size, o_.chunk_bytes));
    if (o_.resume) {
      auto st = LoadState(state_path_);
      if (st.ok() && st->size_bytes == size && st->xxh3 == xxh3 && st->chunk_bytes == o_.chunk_bytes &&
          ::access(part_.c_str(), F_OK) == 0) {
        if (map_.SetBits(st->bitmap).ok()) result_.resumed_bytes = map_.done_bytes();
      }
    }
    fd_ = ::open(part_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return TERN_ERRNO("open ", part_);
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return TERN_ERRNO("resize ", part_);
    // Reserve the blocks before the transfer: a store through the mapping
    // into a file the filesystem cannot hold raises SIGBUS, which no error
    // path survives. Filesystems without fallocate keep the old behaviour.
    if (size > 0 && ::fallocate(fd_, 0, 0, static_cast<off_t>(size)) != 0 && errno != EOPNOTSUPP) {
      const int e = errno;
      return Status(e == ENOSPC || e == EDQUOT ? Code::kResourceExhausted : Code::kUnavailable,
                    "cannot reserve " + std::to_string(size) + " bytes for " + part_ + ": " +
                        std::strerror(e));
    }
    if (size > 0) {
      void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (base == MAP_FAILED) return TERN_ERRNO("mmap ", part_);
      base_ = base;
      TERN_ASSIGN_OR_RETURN(region_, t_.RegisterMemory(base_, size, MemoryKind::kHost));
    }
    mapped_ = true;
    return Status::Ok();
  }

  void Unmap() {
    if (region_.handle != 0) t_.DeregisterMemory(region_).IgnoreError();
    region_ = {};
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = nullptr;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    mapped_ = false;
  }

  void SaveProgress() {
    if (!o_.resume) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!mapped_) return;
    if (base_ != nullptr) ::msync(base_, size_, MS_ASYNC);
    SaveState(state_path_, xfer::PartState{size_, xxh3_, o_.chunk_bytes,
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
    Unmap();
    if (got != want) {
      ::unlink(state_path_.c_str());
      ::unlink(part_.c_str());
      return TERN_ERROR(kCorrupt, "whole-file checksum mismatch for '", name_, "' (", std::hex, got,
                        " != ", want, "); partial file discarded");
    }
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

  std::mutex mu_;  // guards map_ and landed_us_ against the landing callbacks
  ChunkMap map_;
  uint64_t landed_us_ = 0;
  uint64_t first_landed_us_ = 0;  // 0 until a chunk landed in this run
  uint64_t size_ = 0, xxh3_ = 0;
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

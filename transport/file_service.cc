// The `tern xfer` file service: a pull protocol over messages plus chunk
// windows, with resume kept entirely on the client side.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <xxhash.h>

#include "tern/file_transfer.h"
#include "transport/internal.h"

namespace tern {

using transport_internal::LogLine;
using transport_internal::ThreadTracker;

namespace {

constexpr uint32_t kXferVersion = 1;
constexpr uint32_t kMaxNameBytes = 4096;

// ---- message encoding: little-endian fields, every length bounded ----------
class Out {
 public:
  explicit Out(char type) { s_.push_back(type); }
  Out& U16(uint16_t v) { return Raw(v, 2); }
  Out& U32(uint32_t v) { return Raw(v, 4); }
  Out& U64(uint64_t v) { return Raw(v, 8); }
  Out& Bytes(std::string_view b) {
    U32(static_cast<uint32_t>(b.size()));
    s_.append(b);
    return *this;
  }
  std::string Take() { return std::move(s_); }

 private:
  Out& Raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  std::string s_;
};

class In {
 public:
  explicit In(std::string_view s) : s_(s) {}
  char type() const { return s_.empty() ? 0 : s_[0]; }
  Result<uint64_t> Int(int n) {
    TERN_REQUIRE(pos_ + n <= s_.size(), kCorrupt, "xfer message truncated");
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(s_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }
  Result<std::string_view> Bytes(uint64_t max_bytes) {
    TERN_ASSIGN_OR_RETURN(uint64_t n, Int(4));
    TERN_REQUIRE(n <= max_bytes && n <= s_.size() - pos_, kCorrupt, "xfer field of ", n,
                 " bytes out of bounds");
    std::string_view out = s_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  Status End() const {
    TERN_REQUIRE(pos_ == s_.size(), kCorrupt, "xfer message has ", s_.size() - pos_,
                 " trailing bytes");
    return Status::Ok();
  }

 private:
  std::string_view s_;
  size_t pos_ = 1;
};

std::string StatusMessage(char type, const Status& st) {
  return Out(type).U16(static_cast<uint16_t>(st.code())).Bytes(st.message().substr(0, 4096)).Take();
}

// A read-only or read-write shared mapping of a whole file.
struct Mapping {
  int fd = -1;
  void* base = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
};

Result<std::unique_ptr<Mapping>> MapFile(const std::string& path, bool write, uint64_t size) {
  auto m = std::make_unique<Mapping>();
  m->fd = ::open(path.c_str(), write ? (O_RDWR | O_CREAT | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC), 0644);
  if (m->fd < 0) return TERN_ERRNO("open ", path);
  if (write) {
    if (::ftruncate(m->fd, static_cast<off_t>(size)) != 0) return TERN_ERRNO("resize ", path);
  } else {
    struct stat st {};
    if (::fstat(m->fd, &st) != 0) return TERN_ERRNO("stat ", path);
    TERN_REQUIRE(S_ISREG(st.st_mode), kInvalidArgument, path, " is not a regular file");
    size = static_cast<uint64_t>(st.st_size);
  }
  m->size = size;
  if (size > 0) {
    m->base = ::mmap(nullptr, size, write ? (PROT_READ | PROT_WRITE) : PROT_READ, MAP_SHARED, m->fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = nullptr;
      return TERN_ERRNO("mmap ", path);
    }
    ::madvise(m->base, size, MADV_SEQUENTIAL);
  }
  return m;
}

// ---- server ----------------------------------------------------------------

class Server;

// One client connection: its messages are handled in order on the session's
// own thread, so a long send never blocks the transport's threads.
struct Session {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> inbox;
  bool closed = false;
  std::shared_ptr<Connection> conn;
};

class Server final : public FileServer {
 public:
  Server(Transport& transport, std::string root, bool root_is_file, FileServerOptions options, Clock& clock)
      : transport_(transport), root_(std::move(root)), root_is_file_(root_is_file),
        options_(std::move(options)), clock_(clock) {}
  ~Server() override {
    if (listener_) listener_->Close();
    std::vector<std::shared_ptr<Session>> sessions;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& w : sessions_) {
        if (auto s = w.lock()) sessions.push_back(s);
      }
    }
    for (auto& s : sessions) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->closed = true;
        s->cv.notify_all();
      }
      if (s->conn) s->conn->Close();
    }
    threads_.WaitAll();
  }

  std::string address() const override { return listener_->address(); }

  Status Listen(const std::string& address) {
    TERN_ASSIGN_OR_RETURN(listener_, transport_.Listen(address, [this](std::shared_ptr<Connection> c) {
      return Accept(std::move(c));
    }));
    return Status::Ok();
  }

 private:
  ConnectionHandlers Accept(std::shared_ptr<Connection> conn) {
    auto s = std::make_shared<Session>();
    s->conn = conn;
    bool refuse = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(),
                                     [](auto& w) { return w.expired(); }),
                      sessions_.end());
      refuse = stopping_ || sessions_.size() >= options_.max_sessions;
      if (!refuse) sessions_.push_back(s);
    }
    ConnectionHandlers h;
    std::weak_ptr<Session> weak = s;
    h.on_message = [weak](std::string m) {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mu);
        if (s->inbox.size() < 16) s->inbox.push_back(std::move(m));  // a client has <= 2 in flight
        s->cv.notify_all();
      }
    };
    h.on_closed = [weak](Status) {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mu);
        s->closed = true;
        s->cv.notify_all();
      }
    };
    if (refuse) {
      LogLine(options_.log, "xfer: refusing " + conn->peer_address() + ": too many sessions");
      conn->SendMessage(StatusMessage('E', TERN_ERROR(kResourceExhausted, "server busy")), nullptr);
      s->closed = true;
    } else {
      threads_.Spawn([this, s] { Serve(s); });
    }
    return h;
  }

  Result<std::string> Resolve(std::string_view name) {
    TERN_REQUIRE(!name.empty() && name.size() <= kMaxNameBytes &&
                     name.find('\0') == std::string_view::npos,
                 kInvalidArgument, "bad file name");
    if (root_is_file_) {
      const std::string base = root_.substr(root_.find_last_of('/') + 1);
      TERN_REQUIRE(name == base, kNotFound, "this server serves only '", base, "'");
      return root_;
    }
    TERN_REQUIRE(name[0] != '/', kInvalidArgument, "absolute path refused: '", name, "'");
    std::stringstream parts{std::string(name)};
    std::string part;
    while (std::getline(parts, part, '/')) {
      TERN_REQUIRE(part != "..", kInvalidArgument, "path escapes the served root: '", name, "'");
    }
    const std::string joined = root_ + "/" + std::string(name);
    char real[PATH_MAX];
    TERN_REQUIRE(::realpath(joined.c_str(), real) != nullptr, kNotFound, "no file '", name, "'");
    const std::string r(real);
    TERN_REQUIRE(r.size() > root_.size() && r.compare(0, root_.size(), root_) == 0 &&
                     r[root_.size()] == '/',
                 kInvalidArgument, "path escapes the served root: '", name, "'");
    return r;
  }

  // The session thread.
  void Serve(std::shared_ptr<Session> s) {
    std::unique_ptr<Mapping> file;
    MemoryRegion region;
    uint64_t chunk_bytes = 0, transfer_id = 0;
    auto release = [&] {
      if (region.handle != 0) transport_.DeregisterMemory(region).IgnoreError();
      region = {};
      file.reset();
    };
    for (;;) {
      std::string msg;
      {
        std::unique_lock<std::mutex> lock(s->mu);
        s->cv.wait(lock, [&] { return s->closed || !s->inbox.empty(); });
        if (s->closed) break;
        msg = std::move(s->inbox.front());
        s->inbox.pop_front();
      }
      In in(msg);
      Status bad;
      if (in.type() == 'G') {
        release();
        auto info = Open(in, &file, &region, &chunk_bytes);
        if (!info.ok()) {
          LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": " + info.status().ToString());
          s->conn->SendMessage(StatusMessage('E', info.status()), nullptr);
          continue;
        }
        transfer_id = next_transfer_.fetch_add(1);
        s->conn->SendMessage(Out('I').U64(file->size).U64(*info).U64(transfer_id).Take(), nullptr);
      } else if (in.type() == 'W') {
        Status st = Send(in, *s->conn, file.get(), region, chunk_bytes, transfer_id);
        s->conn->SendMessage(StatusMessage('D', st), nullptr);
      } else {
        LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": unknown request type, closing");
        break;
      }
    }
    release();
    s->conn->Close();
  }

  Result<uint64_t> Open(In& in, std::unique_ptr<Mapping>* file, MemoryRegion* region,
                        uint64_t* chunk_bytes) {
    TERN_ASSIGN_OR_RETURN(uint64_t version, in.Int(4));
    TERN_REQUIRE(version == kXferVersion, kProtocol, "client speaks xfer version ", version);
    TERN_ASSIGN_OR_RETURN(*chunk_bytes, in.Int(8));
    TERN_REQUIRE(*chunk_bytes >= 4096 && *chunk_bytes <= kMaxChunkBytes, kOutOfRange,
                 "chunk size ", *chunk_bytes, " outside [4096, ", kMaxChunkBytes, "]");
    TERN_ASSIGN_OR_RETURN(std::string_view name, in.Bytes(kMaxNameBytes));
    TERN_RETURN_IF_ERROR(in.End());
    TERN_ASSIGN_OR_RETURN(std::string path, Resolve(name));
    TERN_ASSIGN_OR_RETURN(*file, MapFile(path, false, 0));
    if ((*file)->size > 0) {
      TERN_ASSIGN_OR_RETURN(*region, transport_.RegisterMemory((*file)->base, (*file)->size, MemoryKind::kHost));
    }
    return XXH3_64bits((*file)->base, (*file)->size);
  }

  Status Send(In& in, Connection& conn, Mapping* file, const MemoryRegion& region,
              uint64_t chunk_bytes, uint64_t transfer_id) {
    TERN_REQUIRE(file != nullptr, kProtocol, "WANT before GET");
    TERN_ASSIGN_OR_RETURN(uint64_t id, in.Int(8));
    TERN_REQUIRE(id == transfer_id, kProtocol, "WANT for unknown transfer ", id);
    TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(file->size, chunk_bytes));
    TERN_ASSIGN_OR_RETURN(std::string_view bits, in.Bytes(map.bits().size()));
    TERN_RETURN_IF_ERROR(in.End());
    TERN_RETURN_IF_ERROR(map.SetBits(bits));
    if (map.complete()) return Status::Ok();
    return SendChunks(conn, region, 0, transfer_id, map, options_.send, clock_);
  }

  Transport& transport_;
  const std::string root_;
  const bool root_is_file_;
  const FileServerOptions options_;
  Clock& clock_;
  std::unique_ptr<Listener> listener_;
  std::atomic<uint64_t> next_transfer_{1};
  std::mutex mu_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<Session>> sessions_;
  ThreadTracker threads_;  // last member: joined before the rest is destroyed
};

}  // namespace

Result<std::unique_ptr<FileServer>> FileServer::Start(Transport& transport,
                                                      const std::string& listen_address,
                                                      const std::string& root,
                                                      FileServerOptions options, Clock& clock) {
  char real[PATH_MAX];
  TERN_REQUIRE(::realpath(root.c_str(), real) != nullptr, kNotFound, "cannot serve '", root,
               "': ", std::strerror(errno));
  struct stat st {};
  TERN_REQUIRE(::stat(real, &st) == 0 && (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)),
               kInvalidArgument, "'", root, "' is neither a directory nor a regular file");
  auto server = std::make_unique<Server>(transport, real, S_ISREG(st.st_mode), std::move(options), clock);
  TERN_RETURN_IF_ERROR(server->Listen(listen_address));
  return std::unique_ptr<FileServer>(std::move(server));
}

Result<uint64_t> HashFile(const std::string& path) {
  TERN_ASSIGN_OR_RETURN(auto m, MapFile(path, false, 0));
  return XXH3_64bits(m->base, m->size);
}

}  // namespace tern

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
#include "transport/xfer_wire.h"

namespace tern {

using transport_internal::LogLine;
using transport_internal::Printable;
using transport_internal::ThreadTracker;

namespace {

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
  // A client has at most two requests in flight (GET, then WANT); one that
  // queues more is not following the protocol and is disconnected.
  static constexpr size_t kMaxInbox = 16;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> inbox;
  bool closed = false;
  bool flooded = false;  // closed because the inbox overflowed
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
        if (s->inbox.size() < Session::kMaxInbox) {
          s->inbox.push_back(std::move(m));
        } else {
          s->flooded = s->closed = true;
        }
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
      conn->SendMessage(xfer::EncodeStatus(xfer::kError, TERN_ERROR(kResourceExhausted, "server busy")),
                        nullptr);
      s->closed = true;
    } else {
      threads_.Spawn([this, s] { Serve(s); });
    }
    return h;
  }

  Result<std::string> Resolve(std::string_view name) {
    TERN_REQUIRE(!name.empty() && name.size() <= xfer::kMaxNameBytes &&
                     name.find('\0') == std::string_view::npos,
                 kInvalidArgument, "bad file name");
    if (root_is_file_) {
      const std::string base = root_.substr(root_.find_last_of('/') + 1);
      TERN_REQUIRE(name == base, kNotFound, "this server serves only '", base, "'");
      return root_;
    }
    TERN_REQUIRE(name[0] != '/', kInvalidArgument, "absolute path refused: '", Printable(name), "'");
    std::stringstream parts{std::string(name)};
    std::string part;
    while (std::getline(parts, part, '/')) {
      TERN_REQUIRE(part != "..", kInvalidArgument, "path escapes the served root: '", Printable(name), "'");
    }
    const std::string joined = root_ + "/" + std::string(name);
    char real[PATH_MAX];
    TERN_REQUIRE(::realpath(joined.c_str(), real) != nullptr, kNotFound, "no file '", Printable(name), "'");
    const std::string r(real);
    TERN_REQUIRE(r.size() > root_.size() && r.compare(0, root_.size(), root_) == 0 &&
                     r[root_.size()] == '/',
                 kInvalidArgument, "path escapes the served root: '", Printable(name), "'");
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
        if (s->flooded) {
          LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": more than " +
                                    std::to_string(Session::kMaxInbox) +
                                    " requests queued, closing");
        }
        if (s->closed) break;
        msg = std::move(s->inbox.front());
        s->inbox.pop_front();
      }
      const char type = xfer::TypeOf(msg);
      if (type == xfer::kGet) {
        release();
        auto info = Open(msg, &file, &region, &chunk_bytes);
        if (!info.ok()) {
          release();  // a half-opened file must not serve a later WANT
          LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": " + info.status().ToString());
          s->conn->SendMessage(xfer::EncodeStatus(xfer::kError, info.status()), nullptr);
          continue;
        }
        transfer_id = next_transfer_.fetch_add(1);
        s->conn->SendMessage(xfer::EncodeInfo({file->size, *info, transfer_id}), nullptr);
      } else if (type == xfer::kWant) {
        Status st = Send(msg, *s->conn, file.get(), region, chunk_bytes, transfer_id);
        s->conn->SendMessage(xfer::EncodeStatus(xfer::kDone, st), nullptr);
      } else {
        LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": unknown request type '" +
                                  Printable(std::string_view(msg).substr(0, 1)) + "', closing");
        break;
      }
    }
    release();
    s->conn->Close();
  }

  Result<uint64_t> Open(std::string_view msg, std::unique_ptr<Mapping>* file, MemoryRegion* region,
                        uint64_t* chunk_bytes) {
    TERN_ASSIGN_OR_RETURN(xfer::GetRequest get, xfer::DecodeGet(msg));
    TERN_ASSIGN_OR_RETURN(std::string path, Resolve(get.name));
    TERN_ASSIGN_OR_RETURN(*file, MapFile(path, false, 0));
    TERN_RETURN_IF_ERROR(xfer::ChunkCount((*file)->size, get.chunk_bytes).status());
    *chunk_bytes = get.chunk_bytes;
    if ((*file)->size > 0) {
      TERN_ASSIGN_OR_RETURN(*region, transport_.RegisterMemory((*file)->base, (*file)->size, MemoryKind::kHost));
    }
    return XXH3_64bits((*file)->base, (*file)->size);
  }

  Status Send(std::string_view msg, Connection& conn, Mapping* file, const MemoryRegion& region,
              uint64_t chunk_bytes, uint64_t transfer_id) {
    TERN_REQUIRE(file != nullptr, kProtocol, "WANT before GET");
    TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(file->size, chunk_bytes));
    TERN_ASSIGN_OR_RETURN(xfer::Want want, xfer::DecodeWant(msg, map.bits().size()));
    TERN_REQUIRE(want.transfer_id == transfer_id, kProtocol, "WANT for unknown transfer ", want.transfer_id);
    TERN_RETURN_IF_ERROR(map.SetBits(want.bitmap));
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

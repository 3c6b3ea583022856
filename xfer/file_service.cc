// The `tern xfer` file service: a pull protocol over messages plus chunk
// windows, with resume kept entirely on the client side.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include <optional>
#include <mutex>
#include <sstream>

#include <xxhash.h>

#include "tern/xfer.h"
#include "transport/internal.h"
#include "xfer/xfer_wire.h"

namespace tern {

using transport_internal::LogLine;
using transport_internal::Printable;
using transport_internal::ThreadTracker;

namespace {

// What names one version of a served file: the tag in INFO is derived from
// it and the hash cache is keyed by it. A write through the file system
// changes mtime and ctime (ctime cannot be set back by a user); a
// replacement by rename changes the inode.
struct Identity {
  uint64_t dev = 0, ino = 0, size = 0, mtime_ns = 0, ctime_ns = 0;
  auto operator<=>(const Identity&) const = default;
  static Identity Of(const struct stat& st) {
    return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
            static_cast<uint64_t>(st.st_size),
            static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000u + st.st_mtim.tv_nsec,
            static_cast<uint64_t>(st.st_ctim.tv_sec) * 1000000000u + st.st_ctim.tv_nsec};
  }
  uint64_t Tag() const {
    const uint64_t fields[5] = {dev, ino, size, mtime_ns, ctime_ns};
    const uint64_t tag = XXH3_64bits(fields, sizeof(fields));
    return tag != 0 ? tag : 1;  // 0 means "no version" on the wire
  }
};

// A read-only shared mapping of a whole file, for sending its chunks.
struct Mapping {
  int fd = -1;
  void* base = nullptr;
  uint64_t size = 0;
  Identity id;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
  // Whether the file still is the version that was opened.
  bool Unchanged() const {
    struct stat st {};
    return ::fstat(fd, &st) == 0 && Identity::Of(st) == id;
  }
};

// Opens a regular file for reading. O_NONBLOCK: opening a FIFO (or a device)
// must not block the session thread; only regular files are served.
// With `nofollow` a symbolic link as the last component is refused (served
// paths are resolved by realpath first: one there now was swapped in since).
Result<int> OpenRegular(const std::string& path, struct stat* st, bool nofollow) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (nofollow ? O_NOFOLLOW : 0));
  if (fd < 0 && errno == ELOOP) return TERN_ERROR(kInvalidArgument, path, " is a symbolic link");
  if (fd < 0) return TERN_ERRNO("open ", path);
  if (::fstat(fd, st) != 0) {
    Status s = TERN_ERRNO("stat ", path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    return TERN_ERROR(kInvalidArgument, path, " is not a regular file");
  }
  return fd;
}

Result<std::shared_ptr<Mapping>> MapFile(const std::string& path) {
  auto m = std::make_shared<Mapping>();
  struct stat st {};
  TERN_ASSIGN_OR_RETURN(m->fd, OpenRegular(path, &st, /*nofollow=*/true));
  m->id = Identity::Of(st);
  m->size = static_cast<uint64_t>(st.st_size);
  if (m->size > 0) {
    m->base = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, m->fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = nullptr;
      return TERN_ERRNO("mmap ", path);
    }
    ::madvise(m->base, m->size, MADV_SEQUENTIAL);
  }
  return m;
}

// How one whole-file hash ended.
struct HashOutcome {
  enum End { kOk, kChanged, kStopped } end = kStopped;
  uint64_t xxh3 = 0;
  // The file's mtime and ctime were more than `settle_ns` before hashing began:
  // a later same-size write within one timestamp tick (which keeps the
  // identity) cannot have gone unseen, so the digest may be cached under it
  // ("racy git" rule).
  bool cacheable = false;
};

constexpr uint64_t kHashBlockBytes = 16 << 20;

uint64_t WallNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// XXH3-64 of the file version `id` open on `fd`, read with pread into a
// bounded buffer (never through a mapping: a file truncated under a mapping
// raises SIGBUS). A short read or an identity change is kChanged; `stop`,
// polled between blocks, is kStopped.
HashOutcome HashFd(int fd, const Identity& id, const std::function<bool()>& stop, uint64_t settle_ns) {
  HashOutcome out;
  const uint64_t started = WallNs();
  struct stat st {};
  if (::fstat(fd, &st) != 0 || Identity::Of(st) != id) {
    out.end = HashOutcome::kChanged;
    return out;
  }
  std::unique_ptr<char[]> buf(new char[std::max<uint64_t>(1, std::min(kHashBlockBytes, id.size))]);
  XXH3_state_t* state = XXH3_createState();
  TERN_ASSERT(state != nullptr);
  XXH3_64bits_reset(state);
  uint64_t at = 0;
  out.end = HashOutcome::kOk;
  while (at < id.size) {
    if (stop && stop()) {
      out.end = HashOutcome::kStopped;
      break;
    }
    const ssize_t n = ::pread(fd, buf.get(), std::min(kHashBlockBytes, id.size - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // an error or a short file: not the version that was opened
      out.end = HashOutcome::kChanged;
      break;
    }
    XXH3_64bits_update(state, buf.get(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  if (out.end == HashOutcome::kOk) {
    out.xxh3 = XXH3_64bits_digest(state);
    if (::fstat(fd, &st) != 0 || Identity::Of(st) != id) out.end = HashOutcome::kChanged;
    out.cacheable = id.mtime_ns + settle_ns < started && id.ctime_ns + settle_ns < started;
  }
  XXH3_freeState(state);
  if (out.end != HashOutcome::kOk) out.xxh3 = 0;
  return out;
}

// The whole-file hash of one file version, computed by a background hasher
// or cached from a session's own hash.
struct HashJob {
  Identity id;
  int fd = -1;  // its own descriptor (dup'ed), closed once hashed
  std::string path;
  uint64_t last_use = 0;  // guarded by Server::hash_mu_
  // Sessions holding a ticket for it (see Server::Ticket); a queued or
  // running job nobody waits for is cancelled (decided under hash_mu_).
  std::atomic<int> waiters{0};
  bool cancelled = false;  // guarded by Server::hash_mu_ and mu
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;  // guarded by mu
  bool ok = false;    // the file was unchanged from open to digest
  bool cacheable = false;
  uint64_t xxh3 = 0;
  std::atomic<bool> finished{false};  // done, readable without the lock
  ~HashJob() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- server ----------------------------------------------------------------

// One client connection: its messages are handled in order on the session's
// own thread, so a long send never blocks the transport's threads.
struct Session {
  // A client has at most two requests in flight (GET, then WANT); one that
  // queues more is not following the protocol and is disconnected.
  static constexpr size_t kMaxInbox = 16;
  // The longest legal request: a GET with the longest name and the bitmap of
  // kMaxChunks chunks (a WANT is shorter). Longer messages close the session
  // before they are queued.
  static constexpr size_t kMaxRequestBytes =
      1 + 4 + 8 + 8 + 4 + xfer::kMaxNameBytes + 8 + 8 + 4 + xfer::kMaxChunks / 8 + 8;
  // The bytes queued at once: two requests of the longest kind.
  static constexpr size_t kMaxInboxBytes = 2 * kMaxRequestBytes;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> inbox;
  size_t inbox_bytes = 0;
  bool closed = false;
  std::string refused;  // why on_message closed the session (logged once)
  std::shared_ptr<Connection> conn;
};

// The chunks of a head window, sent on a helper thread so the rest can start
// as soon as WANT arrives (a send only ends once all its chunks are
// acknowledged: one after the other, the link would idle a round trip).
struct HeadSend {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });  // bounded by SendChunks' stall timeout
    return status;
  }
};

// The file a session's last GET opened.
struct Served {
  std::shared_ptr<Mapping> file;
  MemoryRegion region;
  uint64_t chunk_bytes = 0;
  uint64_t transfer_id = 0;  // the GET's: named by INFO and HASH
  uint64_t window_id = 0;    // the client's window the chunks go to (GET's or WANT's)
  bool hash_known = false;  // INFO or HASH carried it
  uint64_t xxh3 = 0;
  std::shared_ptr<HashJob> job;  // a ticket (Server::Ticket); null when known or self-hashed
  bool awaiting_want = false;
  uint64_t head_chunks = 0;  // chunks sent into the client's head window
  std::shared_ptr<HeadSend> head;  // that send, while it runs on its own thread
};


class Server final : public FileServer {
 public:
  // Files this small are hashed before INFO: cheaper than a HASH message.
  static constexpr uint64_t kInlineHashBytes = 64 << 10;
  static constexpr size_t kMaxCachedHashes = 1024;

  Server(Transport& transport, std::string root, bool root_is_file, FileServerOptions options, Clock& clock)
      : transport_(transport), root_(std::move(root)), root_is_file_(root_is_file),
        options_(std::move(options)), clock_(clock) {}

  // The "racy git" window: a digest is cached only for files last written
  // longer ago than this before hashing began.
  uint64_t SettleNs() const { return options_.hash_cache_settle_ms * 1000000; }
  ~Server() override {
    stop_hashing_ = true;
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
        if (s->closed) return;
        if (m.size() > Session::kMaxRequestBytes) {
          s->refused = "a message of " + std::to_string(m.size()) + " bytes (at most " +
                       std::to_string(Session::kMaxRequestBytes) + " allowed), closing";
          s->closed = true;
        } else if (s->inbox.size() >= Session::kMaxInbox ||
                   s->inbox_bytes + m.size() > Session::kMaxInboxBytes) {
          s->refused = "more than " + std::to_string(Session::kMaxInbox) + " requests or " +
                       std::to_string(Session::kMaxInboxBytes) + " bytes queued, closing";
          s->closed = true;
        } else {
          s->inbox_bytes += m.size();
          s->inbox.push_back(std::move(m));
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
      s->closed = true;
      // ERROR "server busy", then Close once it went out: the completion
      // (run on a transport thread) only calls Close, thread-safe and never
      // blocking on this server's locks. A backend that cannot send yet from
      // inside the accept handler fails that send; then the client's first
      // request is answered instead (once).
      auto answered = std::make_shared<std::atomic<bool>>(true);
      auto busy = [] { return xfer::EncodeStatus(xfer::kError, TERN_ERROR(kResourceExhausted, "server busy")); };
      std::weak_ptr<Connection> wc = conn;
      h.on_message = [wc, answered, busy](std::string) {
        auto c = wc.lock();
        if (!c || answered->exchange(true)) return;
        c->SendMessage(busy(), [c](Status) { c->Close(); });
      };
      conn->SendMessage(busy(), [conn, answered](Status st) {
        if (st.ok()) {
          conn->Close();
        } else {
          answered->store(false);
        }
      });
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

  bool Closed(Session& s) {
    std::lock_guard<std::mutex> lock(s.mu);
    return s.closed;
  }

  // The session thread.
  void Serve(std::shared_ptr<Session> s) {
    Served f;
    auto release = [&] {
      if (f.head) f.head->Wait().IgnoreError();  // it reads f's region
      if (f.region.handle != 0) transport_.DeregisterMemory(f.region).IgnoreError();
      f = Served{};
    };
    for (;;) {
      std::string msg;
      {
        std::unique_lock<std::mutex> lock(s->mu);
        s->cv.wait(lock, [&] { return s->closed || !s->inbox.empty(); });
        if (!s->refused.empty()) {
          LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": " + s->refused);
        }
        if (s->closed) break;
        msg = std::move(s->inbox.front());
        s->inbox.pop_front();
        s->inbox_bytes -= msg.size();
      }
      const char type = xfer::TypeOf(msg);
      if (type == xfer::kGet) {
        release();
        std::string have;
        auto info = Open(msg, &f, &have);
        if (!info.ok()) {
          release();  // a half-opened file must not serve a later WANT
          LogLine(options_.log, "xfer: " + s->conn->peer_address() + ": " + info.status().ToString());
          s->conn->SendMessage(xfer::EncodeStatus(xfer::kError, info.status()), nullptr);
          continue;
        }
        s->conn->SendMessage(xfer::EncodeInfo(*info), nullptr);
        if (info->sending() || (info->head() && f.head_chunks == Chunks(f))) {
          s->conn->SendMessage(xfer::EncodeStatus(xfer::kDone, Transfer(*s, f, have)), nullptr);
        } else {
          if (info->head()) StartHead(*s, f);
          f.awaiting_want = true;
        }
      } else if (type == xfer::kWant) {
        Status st = TERN_ERROR(kProtocol, "WANT without a GET waiting for one");
        if (f.awaiting_want) {
          f.awaiting_want = false;
          auto want = DecodeWant(msg, f);
          if (want.ok()) {
            f.window_id = want->transfer_id;
            // The head's chunks are on their way already.
            for (uint64_t i = 0; i < f.head_chunks; ++i) want->bitmap[i >> 3] |= static_cast<char>(1u << (i & 7));
            st = Transfer(*s, f, want->bitmap);
            if (f.head) {
              Status head = f.head->Wait();
              f.head.reset();
              if (st.ok()) st = head;
            }
          } else {
            st = want.status();
          }
        }
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

  // Opens the file a GET names and answers with its INFO; *have is the
  // client's bitmap when the server sends without waiting for WANT.
  Result<xfer::Info> Open(std::string_view msg, Served* f, std::string* have) {
    TERN_ASSIGN_OR_RETURN(xfer::GetRequest get, xfer::DecodeGet(msg));
    TERN_ASSIGN_OR_RETURN(std::string path, Resolve(get.name));
    TERN_ASSIGN_OR_RETURN(f->file, MapFile(path));
    const uint64_t size = f->file->size;
    TERN_RETURN_IF_ERROR(xfer::ChunkCount(size, get.chunk_bytes).status());
    f->chunk_bytes = get.chunk_bytes;
    f->transfer_id = f->window_id = get.transfer_id;
    if (size > 0) {
      TERN_ASSIGN_OR_RETURN(f->region, transport_.RegisterMemory(f->file->base, size, MemoryKind::kHost));
    }
    xfer::Info info{size, f->file->id.Tag(), get.transfer_id, 0, 0};
    if (size <= kInlineHashBytes) {
      // Cheaper than a HASH message; a racy or changed file is hashed again
      // after its data went out (FinishHash).
      const HashOutcome h = HashFd(f->file->fd, f->file->id, [this] { return stop_hashing_.load(); }, SettleNs());
      if (h.end == HashOutcome::kOk && h.cacheable) {
        f->hash_known = true;
        f->xxh3 = h.xxh3;
      }
    } else {
      f->job = HashFor(*f->file, path);
      if (f->job && f->job->finished.load()) {
        std::lock_guard<std::mutex> lock(f->job->mu);
        if (f->job->ok && f->job->cacheable) {
          f->hash_known = true;
          f->xxh3 = f->job->xxh3;
          f->job.reset();
        }
      }
    }
    if (f->hash_known) {
      info.flags |= xfer::kInfoHashKnown;
      info.xxh3 = f->xxh3;
    }
    // The bitmap was checked against (have_size, chunk_bytes) by DecodeGet.
    if (get.have_tag == info.tag && get.have_size == size) {
      info.flags |= xfer::kInfoSending;
      *have = std::move(get.have_bitmap);
    } else if (get.head_bytes > 0 && size > 0) {
      // The chunks wholly inside the head window: all when the file fits.
      const uint64_t chunks = Chunks(*f);
      f->head_chunks = size <= get.head_bytes ? chunks : get.head_bytes / get.chunk_bytes;
      info.flags |= xfer::kInfoHead;
      // Everything past the head counts as present for this send.
      have->assign((chunks + 7) / 8, '\0');
      for (uint64_t i = f->head_chunks; i < chunks; ++i) (*have)[i >> 3] |= static_cast<char>(1u << (i & 7));
    }
    return info;
  }

  static uint64_t Chunks(const Served& f) {
    return f.file->size / f.chunk_bytes + (f.file->size % f.chunk_bytes != 0);
  }

  // Sends the head's chunks on a helper thread; WANT then sends the rest
  // on the session thread at the same time.
  void StartHead(Session& s, Served& f) {
    auto head = std::make_shared<HeadSend>();
    f.head = head;
    auto map = ChunkMap::Make(f.file->size, f.chunk_bytes);
    std::string past_head((Chunks(f) + 7) / 8, '\0');
    for (uint64_t i = f.head_chunks; i < Chunks(f); ++i) past_head[i >> 3] |= static_cast<char>(1u << (i & 7));
    if (map.ok()) map->SetBits(past_head).IgnoreError();  // fits: sized from the same map
    SendOptions so = options_.send;
    so.on_progress = nullptr;  // the caller's hook runs on session threads only
    threads_.Spawn([this, head, conn = s.conn, region = f.region, window = f.window_id,
                    map = std::move(map), so]() mutable {
      Status st = map.ok() ? SendChunks(*conn, region, 0, window, *map, so, clock_) : map.status();
      std::lock_guard<std::mutex> lock(head->mu);
      head->status = std::move(st);
      head->done = true;
      head->cv.notify_all();
    });
  }

  Result<xfer::Want> DecodeWant(std::string_view msg, const Served& f) {
    TERN_ASSIGN_OR_RETURN(uint64_t chunks, xfer::ChunkCount(f.file->size, f.chunk_bytes));
    TERN_ASSIGN_OR_RETURN(xfer::Want want, xfer::DecodeWant(msg, (chunks + 7) / 8));
    TERN_RETURN_IF_ERROR(xfer::CheckBitmap(want.bitmap, chunks));
    return want;
  }

  // Sends the chunks missing from `have` into the client's window, then
  // makes sure the client has the whole-file hash (HASH is sent as soon as
  // the background hasher has it, between acknowledgements).
  Status Transfer(Session& s, Served& f, std::string_view have) {
    TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(f.file->size, f.chunk_bytes));
    TERN_RETURN_IF_ERROR(map.SetBits(have));
    if (!map.complete()) {
      SendOptions so = options_.send;
      so.on_progress = [&, user = options_.send.on_progress](uint64_t done_bytes) {
        MaybeSendHash(s, f);
        if (user) user(done_bytes);
      };
      TERN_RETURN_IF_ERROR(SendChunks(*s.conn, f.region, 0, f.window_id, map, so, clock_));
    }
    TERN_RETURN_IF_ERROR(FinishHash(s, f));
    TERN_REQUIRE(f.file->Unchanged(), kUnavailable, "the file changed while it was served; fetch again");
    return Status::Ok();
  }

  void MaybeSendHash(Session& s, Served& f) {
    if (f.hash_known || !f.job || !f.job->finished.load()) return;
    std::lock_guard<std::mutex> lock(f.job->mu);
    if (!f.job->ok) return;  // FinishHash reports it (or hashes itself when cancelled)
    f.hash_known = true;
    f.xxh3 = f.job->xxh3;
    s.conn->SendMessage(xfer::EncodeHash({f.transfer_id, f.xxh3}), nullptr);
  }

  Status FinishHash(Session& s, Served& f) {
    if (f.hash_known) return Status::Ok();
    if (f.job) {
      for (;;) {  // bounded by hashing one file; ends early when the client leaves
        {
          std::unique_lock<std::mutex> lock(f.job->mu);
          if (f.job->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return f.job->done; })) break;
        }
        TERN_REQUIRE(!Closed(s), kCancelled, "client left before the hash was ready");
      }
      bool cancelled = false;
      {
        std::lock_guard<std::mutex> lock(f.job->mu);
        cancelled = f.job->cancelled;
      }
      if (!cancelled) {
        MaybeSendHash(s, f);
        TERN_REQUIRE(f.hash_known, kUnavailable, "the file changed while it was hashed; fetch again");
        return Status::Ok();
      }
      f.job.reset();  // dropped before this session took it: hash here
    }
    // The hash queue was full (or the job was dropped): hash here, after the
    // data went out, in one of the bounded hashing slots; it stops when the
    // client leaves, and its digest is cached like a background one.
    auto stop = [&] { return stop_hashing_.load() || Closed(s); };
    TERN_REQUIRE(AcquireHashSlot(stop), kCancelled, "client left before the hash was ready");
    const HashOutcome h = HashFd(f.file->fd, f.file->id, stop, SettleNs());
    ReleaseHashSlot();
    TERN_REQUIRE(h.end != HashOutcome::kStopped, kCancelled, "client left before the hash was ready");
    TERN_REQUIRE(h.end == HashOutcome::kOk, kUnavailable, "the file changed while it was hashed; fetch again");
    if (h.cacheable) CacheHash(f.file->id, h.xxh3);
    f.hash_known = true;
    f.xxh3 = h.xxh3;
    s.conn->SendMessage(xfer::EncodeHash({f.transfer_id, f.xxh3}), nullptr);
    return Status::Ok();
  }

  // At most max(1, hash_threads) whole-file hashes run at once, background
  // and session ones together. False when `stop` was raised while waiting.
  bool AcquireHashSlot(const std::function<bool()>& stop) {
    std::unique_lock<std::mutex> lock(slot_mu_);
    for (;;) {
      if (stop()) return false;
      if (hashing_ < std::max<uint32_t>(1, options_.hash_threads)) {
        ++hashing_;
        return true;
      }
      slot_cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }
  void ReleaseHashSlot() {
    std::lock_guard<std::mutex> lock(slot_mu_);
    --hashing_;
    slot_cv_.notify_one();
  }

  // A session's interest in a job: while any ticket lives the job is not
  // cancelled. Called under hash_mu_.
  static std::shared_ptr<HashJob> Ticket(std::shared_ptr<HashJob> job) {
    job->waiters.fetch_add(1);
    HashJob* raw = job.get();
    return std::shared_ptr<HashJob>(raw, [job = std::move(job)](HashJob*) { job->waiters.fetch_sub(1); });
  }

  // Inserts a finished entry (a session's own hash) unless one is there.
  void CacheHash(const Identity& id, uint64_t xxh3) {
    std::lock_guard<std::mutex> lock(hash_mu_);
    if (hashes_.count(id) != 0) return;
    auto job = std::make_shared<HashJob>();
    job->id = id;
    job->ok = job->cacheable = job->done = true;
    job->xxh3 = xxh3;
    job->finished.store(true);
    job->last_use = ++use_clock_;
    if (MakeRoomLocked()) hashes_.emplace(id, std::move(job));
  }

  // Evicts the least recently used finished entry when the cache is full
  // (O(n), n bounded); false when none can go.
  bool MakeRoomLocked() {
    if (hashes_.size() < kMaxCachedHashes) return true;
    auto victim = hashes_.end();
    for (auto i = hashes_.begin(); i != hashes_.end(); ++i) {
      if (i->second->finished.load() && (victim == hashes_.end() || i->second->last_use < victim->second->last_use)) {
        victim = i;
      }
    }
    if (victim == hashes_.end()) return false;
    hashes_.erase(victim);
    return true;
  }

  // A ticket for the hash job of a file version: a finished one from the
  // cache, a running or queued one, or a new one queued for the hashers.
  // Null when too many are queued (the caller hashes after sending).
  std::shared_ptr<HashJob> HashFor(const Mapping& file, const std::string& path) {
    std::lock_guard<std::mutex> lock(hash_mu_);
    auto it = hashes_.find(file.id);
    if (it != hashes_.end()) {
      // Only finished entries that are ok and cacheable stay in the map;
      // cancelled ones are taken out when cancelled (under this lock).
      it->second->last_use = ++use_clock_;
      return Ticket(it->second);
    }
    if (hash_queue_.size() >= std::max<size_t>(1, options_.max_sessions)) return nullptr;
    const int fd = ::fcntl(file.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    auto job = std::make_shared<HashJob>();
    job->id = file.id;
    job->fd = fd;
    job->path = path;
    job->last_use = ++use_clock_;
    if (!MakeRoomLocked()) return nullptr;
    hashes_.emplace(file.id, job);
    hash_queue_.push_back(job);
    if (hashers_ < std::max<uint32_t>(1, options_.hash_threads)) {
      ++hashers_;
      threads_.Spawn([this] { HashLoop(); });
    }
    return Ticket(std::move(job));
  }

  // Cancels `job` when no session waits for it any more (decided under
  // hash_mu_, so HashFor never hands out a ticket for a cancelled job).
  bool CancelIfUnwanted(const std::shared_ptr<HashJob>& job) {
    if (job->waiters.load() > 0) return false;
    std::lock_guard<std::mutex> lock(hash_mu_);
    if (job->waiters.load() > 0) return false;
    auto it = hashes_.find(job->id);
    if (it != hashes_.end() && it->second == job) hashes_.erase(it);
    std::lock_guard<std::mutex> jl(job->mu);
    job->cancelled = true;
    return true;
  }

  void Finish(const std::shared_ptr<HashJob>& job, const HashOutcome& h, bool cancelled) {
    {
      std::lock_guard<std::mutex> lock(hash_mu_);
      if (cancelled || h.end != HashOutcome::kOk || !h.cacheable) {
        auto it = hashes_.find(job->id);
        if (it != hashes_.end() && it->second == job) hashes_.erase(it);
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

  void HashLoop() {
    for (;;) {
      std::shared_ptr<HashJob> job;
      {
        std::lock_guard<std::mutex> lock(hash_mu_);
        if (hash_queue_.empty() || stop_hashing_) {
          --hashers_;
          return;
        }
        job = std::move(hash_queue_.front());
        hash_queue_.pop_front();
      }
      if (CancelIfUnwanted(job)) {  // nobody waits for it any more
        Finish(job, HashOutcome{}, true);
        continue;
      }
      if (options_.on_hash_start) options_.on_hash_start(job->path);
      bool cancelled = false;
      auto stop = [&] {
        if (stop_hashing_.load()) return true;
        cancelled = CancelIfUnwanted(job);
        return cancelled;
      };
      if (!AcquireHashSlot(stop)) {
        Finish(job, HashOutcome{}, true);
        continue;
      }
      const HashOutcome h = HashFd(job->fd, job->id, stop, SettleNs());
      ReleaseHashSlot();
      Finish(job, h, cancelled || h.end == HashOutcome::kStopped);
      if (h.end == HashOutcome::kChanged && !stop_hashing_) {
        LogLine(options_.log, "xfer: " + Printable(job->path) + " changed while it was hashed");
      }
    }
  }

  Transport& transport_;
  const std::string root_;
  const bool root_is_file_;
  const FileServerOptions options_;
  Clock& clock_;
  std::unique_ptr<Listener> listener_;
  std::mutex mu_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<Session>> sessions_;
  std::atomic<bool> stop_hashing_{false};
  std::mutex hash_mu_;  // guards the hash cache, queue and hasher count
  std::map<Identity, std::shared_ptr<HashJob>> hashes_;
  std::deque<std::shared_ptr<HashJob>> hash_queue_;
  uint32_t hashers_ = 0;
  uint64_t use_clock_ = 0;
  std::mutex slot_mu_;  // guards hashing_ (AcquireHashSlot)
  std::condition_variable slot_cv_;
  uint32_t hashing_ = 0;
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
  struct stat st {};
  TERN_ASSIGN_OR_RETURN(int fd, OpenRegular(path, &st, /*nofollow=*/false));
  const HashOutcome h = HashFd(fd, Identity::Of(st), nullptr, 0);
  ::close(fd);
  TERN_REQUIRE(h.end == HashOutcome::kOk, kUnavailable, path, " changed while it was hashed");
  return h.xxh3;
}

}  // namespace tern

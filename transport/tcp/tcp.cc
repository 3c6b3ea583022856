// The TCP backend (docs/format/wire.md). A connection is N TCP streams; each
// stream has one I/O thread that owns its socket (and TLS session) and does
// both directions with non-blocking I/O and poll, so TLS needs no locking
// and a slow peer never blocks our acknowledgements behind our own writes.
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "tern/tcp_transport.h"
#include "transport/internal.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/pipe.h"

namespace tern {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::Io;
using tcp::kHeaderBytes;
using tcp::Pipe;
using transport_internal::Complete;
using transport_internal::LogLine;
using transport_internal::ThreadTracker;
using transport_internal::Xxh3;

uint32_t ChooseTcpStreams(const TcpOptions& o) {
  const uint32_t cap = std::max<uint32_t>(1, o.max_streams);
  if (o.streams != 0) return std::min(o.streams, cap);
  if (o.rate_bps_hint == 0 || o.rtt_us_hint == 0) return std::min<uint32_t>(8, cap);
  // A single flow on a lossy long path holds a few MB in flight at best
  // (Mathis: rate <= MSS/RTT/sqrt(p)); spread the bandwidth-delay product
  // over flows of about 2 MiB each.
  const double bdp_bytes = static_cast<double>(o.rate_bps_hint) / 8.0 * (o.rtt_us_hint / 1e6);
  const double streams = std::ceil(bdp_bytes / (2.0 * 1024 * 1024));
  return static_cast<uint32_t>(std::clamp<double>(streams, 2, cap));
}

namespace {

// SIGPIPE is per thread for synchronous signals: blocking it in our I/O
// threads turns a write to a dead peer into EPIPE without touching the
// process-wide disposition.
void BlockSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

Status StatusFromCode(uint64_t code, const char* what) {
  if (code == 0) return Status::Ok();
  const Code c = code <= static_cast<uint64_t>(Code::kAuth) ? static_cast<Code>(code) : Code::kInternal;
  return Status(c, std::string("peer: ") + what);
}

struct OutFrame {
  uint8_t header[kHeaderBytes];
  std::string owned;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t sent = 0;  // over header + data
  Completion on_written;
};

OutFrame MakeFrame(FrameType type, uint64_t a0 = 0, uint64_t a1 = 0, uint64_t a2 = 0,
                   uint64_t a3 = 0, uint32_t payload_bytes = 0) {
  OutFrame f;
  FrameHeader h;
  h.type = type;
  h.payload_bytes = payload_bytes;
  h.arg[0] = a0;
  h.arg[1] = a1;
  h.arg[2] = a2;
  h.arg[3] = a3;
  tcp::EncodeHeader(h, f.header);
  return f;
}

struct Window {
  uint8_t* base;
  uint64_t length;
  ChunkLanded on_landed;
  uint32_t writers = 0;  // streams writing into it now; guarded by the connection's mu_
};

struct Stream {
  std::unique_ptr<Pipe> pipe;
  int wake_fd = -1;
  uint32_t index = 0;
  std::mutex mu;
  std::deque<OutFrame> control;  // guarded by mu: acks, pings, messages
  std::atomic<bool> stop{false};
  // Held by the stream thread around each socket read and write; Fail()
  // passes it once after setting stop, so once a connection has failed no
  // I/O touches registered memory (chunk sources, receive windows) again:
  // their owners may free it when the ops complete or Close() returns.
  std::mutex io_mu;
  ~Stream() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
  }
};

class TcpConnection final : public Connection, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(std::vector<std::unique_ptr<Pipe>> pipes, std::string peer, std::string describe,
                const TcpOptions& options, Clock& clock)
      : peer_(std::move(peer)), describe_(std::move(describe)), options_(options), clock_(clock) {
    encrypted_ = !pipes.empty() && pipes[0]->encrypted();
    for (uint32_t i = 0; i < pipes.size(); ++i) {
      auto s = std::make_unique<Stream>();
      s->pipe = std::move(pipes[i]);
      s->index = i;
      s->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      streams_.push_back(std::move(s));
    }
  }

  void SetHandlers(ConnectionHandlers handlers) {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_ = std::move(handlers);
  }
  // Before Start: answers every stream's hello.
  bool SendHelloAcks(const uint8_t header[kHeaderBytes], uint64_t deadline_us) {
    for (auto& s : streams_) {
      if (!tcp::WriteFull(*s->pipe, header, kHeaderBytes, deadline_us, clock_).ok()) return false;
    }
    return true;
  }
  void Start(ThreadTracker& threads) {
    for (auto& s : streams_) {
      auto self = shared_from_this();
      Stream* stream = s.get();
      threads.Spawn([self, stream] {
        BlockSigpipe();
        self->RunStream(*stream);
      });
    }
  }

  std::string peer_address() const override { return peer_; }
  uint32_t capabilities() const override {
    return kCapCrossHost | kCapChunkChecksum | (streams_.size() > 1 ? uint32_t{kCapMultiStream} : 0u) |
           (encrypted_ ? uint32_t{kCapEncrypted} : 0u);
  }
  std::string Describe() const override { return describe_; }

  void SendMessage(std::string payload, Completion done) override {
    if (payload.size() > kMaxMessageBytes) {
      return Complete(done, TERN_ERROR(kOutOfRange, "message of ", payload.size(),
                                       " bytes exceeds ", kMaxMessageBytes));
    }
    OutFrame f = MakeFrame(FrameType::kMessage, 0, 0, 0, 0, static_cast<uint32_t>(payload.size()));
    f.owned = std::move(payload);  // f.data stays null: a moved short string relocates
    f.size = f.owned.size();
    f.on_written = std::move(done);
    Status st = PushControl(*streams_[0], std::move(f), /*bounded=*/true);
    if (!st.ok()) Complete(done, st);
  }

  void SendChunk(const ChunkSend& c, Completion done) override {
    if (c.length == 0 || c.length > kMaxChunkBytes || c.src.base == nullptr || c.src.handle == 0 ||
        c.src_offset > c.src.size_bytes || c.length > c.src.size_bytes - c.src_offset) {
      return Complete(done, TERN_ERROR(kInvalidArgument, "chunk outside its registered source"));
    }
    const uint8_t* data = static_cast<const uint8_t*>(c.src.base) + c.src_offset;
    const uint64_t sum = c.xxh3 ? *c.xxh3 : Xxh3(data, c.length);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return Complete(done, close_status_);
      if (chunks_.size() + pending_.size() >= options_.max_queued_frames) {
        return Complete(done, TERN_ERROR(kResourceExhausted, "more than ",
                                         options_.max_queued_frames, " chunks queued"));
      }
      const uint64_t op = next_op_++;
      OutFrame f = MakeFrame(FrameType::kChunk, c.transfer_id, c.dst_offset, sum, op,
                             static_cast<uint32_t>(c.length));
      f.data = data;
      f.size = c.length;
      chunks_.push_back(std::move(f));
      pending_[op] = std::move(done);
    }
    for (auto& s : streams_) s->Wake();
  }

  Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                     uint64_t length_bytes, ChunkLanded on_landed) override {
    TERN_REQUIRE(dst.base != nullptr && dst.handle != 0, kInvalidArgument, "window memory not registered");
    TERN_REQUIRE(dst_offset <= dst.size_bytes && length_bytes <= dst.size_bytes - dst_offset,
                 kInvalidArgument, "window outside its registered memory");
    std::lock_guard<std::mutex> lock(mu_);
    TERN_REQUIRE(!closed_, kUnavailable, "connection closed");
    TERN_REQUIRE(!windows_.count(transfer_id), kAlreadyExists, "window ", transfer_id, " already open");
    windows_[transfer_id] = std::make_shared<Window>(
        Window{static_cast<uint8_t*>(dst.base) + dst_offset, length_bytes, std::move(on_landed)});
    return Status::Ok();
  }

  void CancelReceive(uint64_t transfer_id) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = windows_.find(transfer_id);
    if (it == windows_.end()) return;
    std::shared_ptr<Window> w = it->second;
    windows_.erase(it);
    window_cv_.wait(lock, [&] { return w->writers == 0; });
  }

  void Close() override { Fail(TERN_ERROR(kCancelled, "connection closed"), Status::Ok()); }

  // Ends the connection once: pending operations get `ops`, on_closed gets
  // `closed`.
  void Fail(Status ops, Status closed) {
    std::map<uint64_t, Completion> pending;
    std::vector<Completion> written;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (closed_) {
        // Close() promises quiet memory when it returns, even when another
        // thread's Fail is still at the barrier below; a stream thread of
        // this connection must not wait (the barrier may be waiting for it).
        if (stream_owner_ != this) quiesced_cv_.wait(lock, [&] { return quiesced_; });
        return;
      }
      closed_ = true;
      close_status_ = ops;
      pending.swap(pending_);
      chunks_.clear();
      // windows_ stays: CancelReceive must still wait for a stream that is
      // mid-chunk into one before the caller may free the memory.
    }
    for (auto& s : streams_) {
      std::lock_guard<std::mutex> lock(s->mu);
      for (auto& f : s->control) {
        if (f.on_written) written.push_back(std::move(f.on_written));
      }
      s->control.clear();
      s->stop = true;
      s->pipe->Shutdown();
      s->Wake();
    }
    for (auto& s : streams_) std::lock_guard<std::mutex> barrier(s->io_mu);
    {
      std::lock_guard<std::mutex> lock(mu_);
      quiesced_ = true;
    }
    quiesced_cv_.notify_all();
    for (auto& [op, done] : pending) Complete(done, ops);
    for (auto& done : written) Complete(done, ops);
    ConnectionHandlers handlers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handlers = std::move(handlers_);
      handlers_ = {};
    }
    if (handlers.on_closed) handlers.on_closed(closed);
  }

 private:
  Status PushControl(Stream& s, OutFrame f, bool bounded) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.stop) return TERN_ERROR(kUnavailable, "connection closed");
      if (bounded && s.control.size() >= options_.max_queued_frames) {
        return TERN_ERROR(kResourceExhausted, "more than ", options_.max_queued_frames,
                          " frames queued");
      }
      s.control.push_back(std::move(f));
    }
    s.Wake();
    return Status::Ok();
  }

  // Per-stream receive state; touched only by that stream's thread.
  struct Reader {
    uint8_t header[kHeaderBytes];
    size_t header_got = 0;
    uint64_t header_start_us = 0;
    bool in_payload = false;
    FrameHeader h;
    uint8_t* dest = nullptr;
    uint64_t got = 0;
    std::string message;
    std::shared_ptr<Window> window;
    Status refuse;  // chunk read and dropped, then refused with this
    uint8_t scratch[64 * 1024];
  };

  void ProtocolFailure(const Status& why) {
    LogLine(options_.log, "tcp: dropping connection from " + peer_ + ": " + why.ToString());
    Fail(why, why);
  }

  // Returns false when the stream must stop.
  bool StartPayload(Stream& s, Reader& r) {
    const FrameHeader& h = r.h;
    r.got = 0;
    r.dest = nullptr;
    r.refuse = Status::Ok();
    switch (h.type) {
      case FrameType::kMessage:
        if (s.index != 0) {
          ProtocolFailure(TERN_ERROR(kProtocol, "message on stream ", s.index, " (only stream 0)"));
          return false;
        }
        r.message.resize(h.payload_bytes);
        r.dest = reinterpret_cast<uint8_t*>(r.message.data());
        break;
      case FrameType::kChunk: {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = windows_.find(h.arg[0]);
        if (it == windows_.end()) {
          r.refuse = Status(Code::kNotFound, "no receive window");
        } else if (h.arg[1] > it->second->length || h.payload_bytes > it->second->length - h.arg[1]) {
          r.refuse = Status(Code::kOutOfRange, "chunk outside the receive window");
        } else {
          r.window = it->second;
          ++r.window->writers;
          r.dest = r.window->base + h.arg[1];
        }
        break;
      }
      case FrameType::kHello:
      case FrameType::kHelloAck:
        ProtocolFailure(TERN_ERROR(kProtocol, "handshake frame on an established stream"));
        return false;
      default:
        break;
    }
    r.in_payload = h.payload_bytes > 0;
    if (!r.in_payload) return FinishFrame(s, r);
    return true;
  }

  bool FinishFrame(Stream& s, Reader& r) {
    r.in_payload = false;
    r.header_got = 0;
    const FrameHeader& h = r.h;
    switch (h.type) {
      case FrameType::kMessage: {
        std::function<void(std::string)> on_message;
        {
          std::lock_guard<std::mutex> lock(mu_);
          on_message = handlers_.on_message;
        }
        if (on_message) on_message(std::move(r.message));
        r.message = std::string();
        break;
      }
      case FrameType::kChunk: {
        Status result = r.refuse;
        if (r.window) {
          if (Xxh3(r.dest, h.payload_bytes) != h.arg[2]) {
            result = Status(Code::kCorrupt, "chunk failed its checksum on landing");
          }
          ChunkLanded landed;
          {
            std::lock_guard<std::mutex> lock(mu_);
            --r.window->writers;
            auto it = windows_.find(h.arg[0]);
            if (it != windows_.end() && it->second == r.window) landed = r.window->on_landed;
            window_cv_.notify_all();
          }
          r.window.reset();
          if (result.ok() && landed) landed(h.arg[1], h.payload_bytes);
        }
        PushControl(s, MakeFrame(FrameType::kAck, h.arg[3], static_cast<uint64_t>(result.code())),
                    /*bounded=*/false)
            .IgnoreError();
        break;
      }
      case FrameType::kAck: {
        Completion done;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = pending_.find(h.arg[0]);
          if (it != pending_.end()) {
            done = std::move(it->second);
            pending_.erase(it);
          }
        }
        const Code code = h.arg[1] <= 15 ? static_cast<Code>(h.arg[1]) : Code::kInternal;
        Complete(done, StatusFromCode(h.arg[1], code == Code::kCorrupt
                                                    ? "chunk failed its checksum on landing"
                                                    : "chunk refused"));
        break;
      }
      default:
        break;
    }
    return true;
  }

  // Reads what is available; false when the stream must stop.
  bool ReadSome(Stream& s, Reader& r, bool* more, uint64_t* last_progress_us) {
    *more = false;
    for (int round = 0; round < 64; ++round) {
      tcp::IoResult io;
      std::unique_lock<std::mutex> io_lock(s.io_mu);
      if (s.stop) return false;
      if (!r.in_payload) {
        io = s.pipe->Read(r.header + r.header_got, kHeaderBytes - r.header_got);
        io_lock.unlock();
        if (io.io == Io::kOk && io.bytes > 0) {
          if (r.header_got == 0) r.header_start_us = clock_.NowUs();
          r.header_got += io.bytes;
          if (r.header_got == kHeaderBytes) {
            Status st = tcp::DecodeHeader(r.header, &r.h);
            if (!st.ok()) {
              ProtocolFailure(st);
              return false;
            }
            *last_progress_us = clock_.NowUs();
            if (!StartPayload(s, r)) return false;
          }
          continue;
        }
      } else {
        const uint64_t left = r.h.payload_bytes - r.got;
        if (r.dest != nullptr) {
          io = s.pipe->Read(r.dest + r.got, left);
        } else {
          io = s.pipe->Read(r.scratch, std::min<uint64_t>(left, sizeof r.scratch));
        }
        io_lock.unlock();
        if (io.io == Io::kOk && io.bytes > 0) {
          r.got += io.bytes;
          *last_progress_us = clock_.NowUs();
          if (r.got == r.h.payload_bytes && !FinishFrame(s, r)) return false;
          continue;
        }
      }
      if (io.io == Io::kWantRead || io.io == Io::kWantWrite) {
        if (io.io == Io::kWantWrite) want_write_for_read_ = true;
        return true;
      }
      if (io.io == Io::kEof || (io.io == Io::kOk && io.bytes == 0)) {
        Fail(TERN_ERROR(kUnavailable, "connection closed by peer ", peer_),
             r.header_got == 0 && !r.in_payload ? Status::Ok()
                                                 : TERN_ERROR(kUnavailable, "peer closed mid-frame"));
        return false;
      }
      Status why = s.pipe->encrypted() && io.error.rfind("TLS: ", 0) == 0
                       ? TERN_ERROR(kAuth, io.error)
                       : TERN_ERROR(kUnavailable, "read from ", peer_, ": ", io.error);
      Fail(why, why);
      return false;
    }
    *more = true;  // yielded to the writer; data may still be waiting
    return true;
  }

  // Writes what the socket takes; sets *blocked when it stopped on a full socket.
  bool WriteSome(Stream& s, std::optional<OutFrame>& cur, bool* blocked, uint64_t* last_write_us) {
    *blocked = false;
    for (;;) {
      if (!cur) {
        {
          std::lock_guard<std::mutex> lock(s.mu);
          if (!s.control.empty()) {
            cur = std::move(s.control.front());
            s.control.pop_front();
          }
        }
        if (!cur) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!chunks_.empty()) {
            cur = std::move(chunks_.front());
            chunks_.pop_front();
          }
        }
        if (!cur) return true;
      }
      OutFrame& f = *cur;
      tcp::IoResult io;
      {
        std::lock_guard<std::mutex> io_lock(s.io_mu);
        if (s.stop) return false;
        if (f.sent < kHeaderBytes) {
          io = s.pipe->Write(f.header + f.sent, kHeaderBytes - f.sent);
        } else {
          const uint64_t off = f.sent - kHeaderBytes;
          const uint8_t* data = f.data ? f.data : reinterpret_cast<const uint8_t*>(f.owned.data());
          io = s.pipe->Write(data + off, std::min<uint64_t>(f.size - off, 16u << 20));
        }
      }
      if (io.io == Io::kOk) {
        f.sent += io.bytes;
        *last_write_us = clock_.NowUs();
        if (f.sent == kHeaderBytes + f.size) {
          Completion done = std::move(f.on_written);
          cur.reset();
          Complete(done, Status::Ok());
        }
        continue;
      }
      if (io.io == Io::kWantWrite || io.io == Io::kWantRead) {
        *blocked = io.io == Io::kWantWrite;
        return true;
      }
      Status why = TERN_ERROR(kUnavailable, "write to ", peer_, ": ",
                              io.io == Io::kEof ? "connection closed" : io.error);
      Fail(why, why);
      return false;
    }
  }

  void RunStream(Stream& s) {
    stream_owner_ = this;
    auto reader = std::make_unique<Reader>();
    std::optional<OutFrame> cur;
    uint64_t last_progress_us = clock_.NowUs();
    uint64_t last_write_us = last_progress_us;
    const uint64_t idle_us = options_.idle_timeout_ms * 1000;
    bool more = false, blocked = false;
    while (!s.stop) {
      pollfd fds[2] = {{s.pipe->fd(), POLLIN, 0}, {s.wake_fd, POLLIN, 0}};
      if (blocked || want_write_for_read_) fds[0].events |= POLLOUT;
      const int wait_ms = (more || s.pipe->HasBuffered()) ? 0 : 50;
      if (::poll(fds, 2, wait_ms) < 0 && errno != EINTR) break;
      if (fds[1].revents & POLLIN) {
        uint64_t n;
        [[maybe_unused]] ssize_t rc = ::read(s.wake_fd, &n, sizeof n);
      }
      if (s.stop) break;
      want_write_for_read_ = false;
      if (!ReadSome(s, *reader, &more, &last_progress_us)) break;
      if (!WriteSome(s, cur, &blocked, &last_write_us)) break;

      const uint64_t now = clock_.NowUs();
      if (reader->header_got > 0 && !reader->in_payload &&
          now - reader->header_start_us > options_.header_timeout_ms * 1000) {
        ProtocolFailure(TERN_ERROR(kTimeout, "partial frame header for more than ",
                                   options_.header_timeout_ms, " ms"));
        break;
      }
      if (now - last_progress_us > idle_us) {
        ProtocolFailure(TERN_ERROR(kTimeout, "peer silent for more than ",
                                   options_.idle_timeout_ms, " ms"));
        break;
      }
      if (!cur && now - last_write_us > idle_us / 3) {
        PushControl(s, MakeFrame(FrameType::kPing), false).IgnoreError();
        last_write_us = now;
      }
    }
    if (cur && cur->on_written) {
      Status why;
      {
        std::lock_guard<std::mutex> lock(mu_);
        why = close_status_;
      }
      Complete(cur->on_written, why.ok() ? TERN_ERROR(kUnavailable, "connection closed") : why);
    }
    if (reader->window) {
      std::lock_guard<std::mutex> lock(mu_);
      --reader->window->writers;
      window_cv_.notify_all();
    }
    stream_owner_ = nullptr;
  }

  const std::string peer_;
  const std::string describe_;
  const TcpOptions options_;
  Clock& clock_;
  bool encrypted_ = false;
  std::vector<std::unique_ptr<Stream>> streams_;
  // A TLS read that needs to write first (renegotiation-like records); per
  // I/O thread, as each thread serves exactly one stream.
  static thread_local bool want_write_for_read_;
  // The connection whose stream this thread serves (null elsewhere).
  static thread_local const TcpConnection* stream_owner_;

  std::mutex mu_;
  std::condition_variable window_cv_;
  bool closed_ = false;
  bool quiesced_ = false;  // the first Fail has passed its I/O barrier
  std::condition_variable quiesced_cv_;
  Status close_status_;
  ConnectionHandlers handlers_;
  std::map<uint64_t, std::shared_ptr<Window>> windows_;
  std::map<uint64_t, Completion> pending_;
  std::deque<OutFrame> chunks_;
  uint64_t next_op_ = 1;
};

thread_local bool TcpConnection::want_write_for_read_ = false;
thread_local const TcpConnection* TcpConnection::stream_owner_ = nullptr;

// ---- listening and connecting ----------------------------------------------

// Shared by a listener, its accept thread and the handshake threads, which
// may outlive the Listener object by a handshake timeout.
struct ListenState {
  int fd = -1;
  int wake_fd = -1;
  std::atomic<bool> closed{false};
  std::atomic<uint32_t> sockets{0};  // accepted and not yet handed to a connection
  AcceptHandler on_accept;
  std::string address;

  struct Partial {
    uint32_t count = 0;
    uint32_t arrived = 0;
    uint64_t started_us = 0;
    std::vector<std::unique_ptr<Pipe>> pipes;
  };
  std::mutex mu;
  std::map<uint64_t, Partial> partial;  // by connection id

  ~ListenState() {
    if (fd >= 0) ::close(fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

class TcpTransport;

class TcpListener final : public Listener {
 public:
  explicit TcpListener(std::shared_ptr<ListenState> state) : state_(std::move(state)) {}
  ~TcpListener() override { Close(); }
  std::string address() const override { return state_->address; }
  void Close() override {
    if (state_->closed.exchange(true)) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(state_->wake_fd, &one, sizeof one);
  }

 private:
  std::shared_ptr<ListenState> state_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(TcpOptions options, Clock& clock, std::unique_ptr<tcp::TlsContext> tls)
      : options_(std::move(options)), clock_(clock), tls_(std::move(tls)) {}

  ~TcpTransport() override {
    std::vector<std::weak_ptr<ListenState>> listeners;
    std::vector<std::weak_ptr<TcpConnection>> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listeners.swap(listeners_);
      conns.swap(conns_);
    }
    for (auto& w : listeners) {
      if (auto l = w.lock()) TcpListener(l).Close();
    }
    shutting_down_ = true;
    for (auto& w : conns) {
      if (auto c = w.lock()) c->Close();
    }
    threads_.WaitAll();
  }

  std::string name() const override { return tls_ ? "tcp+tls" : "tcp"; }
  uint32_t capabilities() const override {
    return kCapCrossHost | kCapChunkChecksum | kCapMultiStream | (tls_ ? uint32_t{kCapEncrypted} : 0u);
  }

  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override {
    TERN_REQUIRE(kind == MemoryKind::kHost, kUnsupported,
                 "tcp registers host memory only (stage GPU memory through the host)");
    TERN_REQUIRE(base != nullptr || size_bytes == 0, kInvalidArgument, "null memory");
    return MemoryRegion{base, size_bytes, kind, next_handle_.fetch_add(1)};
  }
  Status DeregisterMemory(const MemoryRegion&) override { return Status::Ok(); }

  Result<std::unique_ptr<Listener>> Listen(const std::string& address, AcceptHandler on_accept) override {
    TERN_ASSIGN_OR_RETURN(int fd, tcp::ListenSocket(address, options_));
    auto state = std::make_shared<ListenState>();
    state->fd = fd;
    state->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    state->on_accept = std::move(on_accept);
    state->address = tcp::SocketAddress(fd, false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      listeners_.push_back(state);
    }
    threads_.Spawn([this, state] {
      BlockSigpipe();
      AcceptLoop(state);
    });
    return std::unique_ptr<Listener>(std::make_unique<TcpListener>(state));
  }

  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override {
    threads_.Spawn([this, address, handlers = std::move(handlers), done = std::move(done)]() mutable {
      BlockSigpipe();
      auto conn = Dial(address, std::move(handlers));
      if (!conn.ok()) return done(std::move(conn).take_status());
      std::shared_ptr<TcpConnection> c = *conn;
      done(std::shared_ptr<Connection>(c));
      c->Start(threads_);
    });
  }

 private:
  void Log(const std::string& line) { LogLine(options_.log, line); }

  void Track(const std::shared_ptr<TcpConnection>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](auto& w) { return w.expired(); }),
                 conns_.end());
    conns_.push_back(c);
  }

  Result<std::shared_ptr<TcpConnection>> Dial(const std::string& address, ConnectionHandlers handlers) {
    const uint32_t n = ChooseTcpStreams(options_);
    const uint64_t deadline = clock_.NowUs() + options_.connect_timeout_ms * 1000;
    const uint64_t conn_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    std::vector<std::unique_ptr<Pipe>> pipes;
    std::string congestion;
    for (uint32_t i = 0; i < n; ++i) {
      TERN_ASSIGN_OR_RETURN(int fd, tcp::ConnectSocket(address, options_, deadline, clock_));
      congestion = tcp::TuneSocket(fd, options_);
      std::unique_ptr<Pipe> pipe;
      if (tls_) {
        TERN_ASSIGN_OR_RETURN(pipe, tcp::TlsHandshake(*tls_, fd, false, deadline, clock_));
      } else {
        pipe = tcp::NewPlainPipe(fd);
      }
      OutFrame hello = MakeFrame(FrameType::kHello, conn_id, tcp::PackStream(i, n));
      TERN_RETURN_IF_ERROR(tcp::WriteFull(*pipe, hello.header, kHeaderBytes, deadline, clock_));
      pipes.push_back(std::move(pipe));
    }
    for (auto& pipe : pipes) {
      uint8_t raw[kHeaderBytes];
      Status st = tcp::ReadFull(*pipe, raw, kHeaderBytes, deadline, clock_);
      if (!st.ok() && tls_ && st.code() == Code::kUnavailable) {
        // In TLS 1.3 the server judges our certificate after our side of the
        // handshake is done; a hang-up here is almost always that verdict
        // (its alert can be lost to a reset).
        return TERN_ERROR(kAuth, "server closed the TLS connection before accepting it "
                                 "(our certificate refused?): ", st.message());
      }
      if (!st.ok()) return st.WithContext("waiting for the server's hello");
      FrameHeader h;
      TERN_RETURN_IF_ERROR(tcp::DecodeHeader(raw, &h));
      TERN_REQUIRE(h.type == FrameType::kHelloAck && h.arg[0] == conn_id, kProtocol,
                   "server answered the hello with frame type ", int(h.type));
      std::string reason(h.payload_bytes, '\0');
      TERN_RETURN_IF_ERROR(tcp::ReadFull(*pipe, reason.data(), reason.size(), deadline, clock_));
      if (h.arg[1] != 0) return StatusFromCode(h.arg[1], ("refused: " + reason).c_str());
    }
    const std::string describe = "tcp " + std::to_string(n) + " streams " + congestion +
                                 (tls_ ? " tls1.3" : "");
    auto conn = std::make_shared<TcpConnection>(std::move(pipes), address, describe, options_, clock_);
    conn->SetHandlers(std::move(handlers));
    Track(conn);
    return conn;
  }

  void AcceptLoop(const std::shared_ptr<ListenState>& st) {
    while (!st->closed && !shutting_down_) {
      pollfd fds[2] = {{st->fd, POLLIN, 0}, {st->wake_fd, POLLIN, 0}};
      ::poll(fds, 2, 100);
      ExpirePartial(*st);
      if (!(fds[0].revents & POLLIN)) continue;
      for (;;) {
        int fd = ::accept4(st->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (st->sockets.load() >= options_.max_connections) {
          Log("tcp: refusing " + tcp::SocketAddress(fd, true) + ": " +
              std::to_string(options_.max_connections) + " sockets already open");
          ::close(fd);
          continue;
        }
        ++st->sockets;
        threads_.Spawn([this, st, fd] {
          BlockSigpipe();
          Handshake(st, fd);
        });
      }
    }
    std::lock_guard<std::mutex> lock(st->mu);
    st->partial.clear();
  }

  void ExpirePartial(ListenState& st) {
    const uint64_t now = clock_.NowUs();
    std::lock_guard<std::mutex> lock(st.mu);
    for (auto it = st.partial.begin(); it != st.partial.end();) {
      if (now - it->second.started_us > options_.handshake_timeout_ms * 1000) {
        Log("tcp: dropping half-open connection: " + std::to_string(it->second.arrived) + " of " +
            std::to_string(it->second.count) + " streams arrived in time");
        st.sockets -= it->second.arrived;
        it = st.partial.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Runs on its own thread per accepted socket, bounded by max_connections.
  void Handshake(const std::shared_ptr<ListenState>& st, int fd) {
    const std::string peer = tcp::SocketAddress(fd, true);
    const uint64_t deadline = clock_.NowUs() + options_.handshake_timeout_ms * 1000;
    std::string congestion = tcp::TuneSocket(fd, options_);
    auto reject = [&](const Status& why) {
      Log("tcp: rejected " + peer + ": " + why.ToString());
      --st->sockets;
    };
    std::unique_ptr<Pipe> pipe;
    if (tls_) {
      auto r = tcp::TlsHandshake(*tls_, fd, true, deadline, clock_);
      if (!r.ok()) return reject(r.status());
      pipe = std::move(r).value();
    } else {
      pipe = tcp::NewPlainPipe(fd);
    }
    uint8_t raw[kHeaderBytes];
    Status s = tcp::ReadFull(*pipe, raw, kHeaderBytes, deadline, clock_);
    if (!s.ok()) return reject(s.WithContext("waiting for hello"));
    FrameHeader h;
    s = tcp::DecodeHeader(raw, &h);
    if (s.ok() && h.type != FrameType::kHello) {
      s = TERN_ERROR(kProtocol, "first frame has type ", int(h.type), ", expected hello");
    }
    const uint32_t index = static_cast<uint32_t>(h.arg[1]);
    const uint32_t count = static_cast<uint32_t>(h.arg[1] >> 32);
    if (s.ok() && (count == 0 || count > options_.max_streams || index >= count)) {
      s = TERN_ERROR(kOutOfRange, "hello for stream ", index, " of ", count, " (max ",
                     options_.max_streams, ")");
    }
    if (!s.ok()) {
      // Tell the peer why (in our version) before hanging up; best effort.
      std::string reason = s.message().substr(0, tcp::kMaxReasonBytes);
      OutFrame ack = MakeFrame(FrameType::kHelloAck, h.arg[0], static_cast<uint64_t>(s.code()), 0, 0,
                               static_cast<uint32_t>(reason.size()));
      if (tcp::WriteFull(*pipe, ack.header, kHeaderBytes, deadline, clock_).ok()) {
        tcp::WriteFull(*pipe, reason.data(), reason.size(), deadline, clock_).IgnoreError();
      }
      return reject(s);
    }
    std::vector<std::unique_ptr<Pipe>> pipes;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->closed) return reject(TERN_ERROR(kUnavailable, "listener closed"));
      ListenState::Partial& p = st->partial[h.arg[0]];
      if (p.count == 0) {
        p.count = count;
        p.started_us = clock_.NowUs();
        p.pipes.resize(count);
      }
      if (p.count != count || p.pipes[index]) {
        return reject(TERN_ERROR(kProtocol, "conflicting hello for connection ", h.arg[0]));
      }
      p.pipes[index] = std::move(pipe);
      if (++p.arrived < p.count) return;  // the last stream's thread assembles
      pipes = std::move(p.pipes);
      st->partial.erase(h.arg[0]);
      st->sockets -= count;
    }
    const std::string describe = "tcp " + std::to_string(count) + " streams " + congestion +
                                 (tls_ ? " tls1.3" : "");
    auto conn = std::make_shared<TcpConnection>(std::move(pipes), peer, describe, options_, clock_);
    OutFrame ack = MakeFrame(FrameType::kHelloAck, h.arg[0], 0);
    if (!conn->SendHelloAcks(ack.header, deadline)) {
      Log("tcp: lost " + peer + " during the handshake");
      return;
    }
    conn->SetHandlers(st->on_accept(conn));
    Track(conn);
    conn->Start(threads_);
  }

  const TcpOptions options_;
  Clock& clock_;
  std::unique_ptr<tcp::TlsContext> tls_;
  std::atomic<uint64_t> next_handle_{1};
  std::atomic<bool> shutting_down_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<ListenState>> listeners_;
  std::vector<std::weak_ptr<TcpConnection>> conns_;
  ThreadTracker threads_;
};

}  // namespace

Result<std::unique_ptr<Transport>> NewTcpTransport(TcpOptions options, Clock& clock) {
  std::unique_ptr<tcp::TlsContext> tls;
  if (options.tls.enabled) {
    TERN_ASSIGN_OR_RETURN(tls, tcp::TlsContext::Load(options.tls));
  }
  TERN_REQUIRE(options.idle_timeout_ms >= 3 && options.max_streams >= 1, kInvalidArgument,
               "idle timeout below 3 ms or no streams allowed");
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(std::move(options), clock, std::move(tls)));
}

}  // namespace tern

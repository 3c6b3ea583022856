// The TCP connection engine (see connection.h): one I/O thread per stream,
// chunks pulled by the stream that finishes them first, ACK on the carrying
// stream.
#include "transport/tcp/connection.h"

#include <openssl/crypto.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>

#include "base/wire_status.h"

namespace tern::tcp {

using transport::Complete;
using transport::LogLine;
using transport::Xxh3;

void BlockSigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

IoThreadScope::~IoThreadScope() { OPENSSL_thread_stop(); }

OutFrame MakeFrame(uint8_t version, FrameType type, uint64_t a0, uint64_t a1, uint64_t a2,
                   uint64_t a3, uint32_t payload_bytes) {
  OutFrame f;
  FrameHeader h;
  h.version = version;
  h.type = type;
  h.payload_bytes = payload_bytes;
  h.arg[0] = a0;
  h.arg[1] = a1;
  h.arg[2] = a2;
  h.arg[3] = a3;
  EncodeHeader(h, f.header);
  return f;
}

thread_local bool TcpConnection::want_write_for_read_ = false;
thread_local const TcpConnection* TcpConnection::stream_owner_ = nullptr;

TcpConnection::TcpConnection(std::vector<std::unique_ptr<Pipe>> pipes, std::string peer,
                             std::string describe, uint8_t wire_version,
                             const TcpOptions& options, Clock& clock)
    : peer_(std::move(peer)),
      describe_(std::move(describe)),
      wire_version_(wire_version),
      options_(options),
      clock_(clock) {
  encrypted_ = !pipes.empty() && pipes[0]->encrypted();
  for (uint32_t i = 0; i < pipes.size(); ++i) {
    auto s = std::make_unique<Stream>();
    s->pipe = std::move(pipes[i]);
    s->index = i;
    s->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    streams_.push_back(std::move(s));
  }
  MutexLock lock(mu_);
  views_.resize(streams_.size());
}

void TcpConnection::SetHandlers(ConnectionHandlers handlers) {
  MutexLock lock(mu_);
  handlers_ = std::move(handlers);
}

bool TcpConnection::SendHelloAcks(const uint8_t header[kHeaderBytes], uint64_t deadline_us) {
  for (auto& s : streams_) {
    if (!WriteFull(*s->pipe, header, kHeaderBytes, deadline_us, clock_).ok()) return false;
  }
  return true;
}

void TcpConnection::Start(transport::ThreadTracker& threads) {
  for (auto& s : streams_) {
    auto self = shared_from_this();
    Stream* stream = s.get();
    threads.Spawn([self, stream] {
      IoThreadScope io_thread;
      self->RunStream(*stream);
    });
  }
}

void TcpConnection::SendMessage(std::string payload, Completion done) {
  if (payload.size() > kMaxMessageBytes) {
    return Complete(done, TERN_ERROR(kOutOfRange, "message of ", payload.size(), " bytes exceeds ",
                                     kMaxMessageBytes));
  }
  // Version 2 checks the payload end to end across the hop: without TLS a
  // control message has nothing else above TCP's 16-bit checksum.
  const uint64_t check = wire_version_ >= 2 ? MessageCheck(payload) : 0;
  OutFrame f = MakeFrame(wire_version_, FrameType::kMessage, 0, 0, check, 0,
                         static_cast<uint32_t>(payload.size()));
  f.owned = std::move(payload);  // f.data stays null: a moved short string relocates
  f.size = f.owned.size();
  f.on_written = std::move(done);
  Status st = PushControl(*streams_[0], std::move(f), /*bounded=*/true);
  // Refused, f is still ours (done was moved into it: completing `done`
  // here completed nothing, and a send on a closed connection never did).
  if (!st.ok()) Complete(f.on_written, st);
}

void TcpConnection::SendChunk(const ChunkSend& c, Completion done) {
  if (c.length == 0 || c.length > kMaxChunkBytes || c.src.base == nullptr || c.src.handle == 0 ||
      c.src_offset > c.src.size_bytes || c.length > c.src.size_bytes - c.src_offset) {
    return Complete(done, TERN_ERROR(kInvalidArgument, "chunk outside its registered source"));
  }
  const uint8_t* data = static_cast<const uint8_t*>(c.src.base) + c.src_offset;
  const uint64_t sum = c.xxh3 ? *c.xxh3 : Xxh3(data, c.length);
  {
    MutexLock lock(mu_);
    if (closed_) return Complete(done, close_status_);
    if (chunks_.size() + pending_.size() >= options_.max_queued_frames) {
      return Complete(done, TERN_ERROR(kResourceExhausted, "more than ", options_.max_queued_frames,
                                       " chunks queued"));
    }
    const uint64_t op = next_op_++;
    OutFrame f = MakeFrame(wire_version_, FrameType::kChunk, c.transfer_id, c.dst_offset, sum, op,
                           static_cast<uint32_t>(c.length));
    f.data = data;
    f.size = c.length;
    f.op = op;
    chunks_.push_back(std::move(f));
    queued_chunks_.store(chunks_.size(), std::memory_order_release);
    pending_[op] = std::move(done);
  }
  for (auto& s : streams_) s->Wake();
}

Status TcpConnection::PostReceive(uint64_t transfer_id, const MemoryRegion& dst,
                                  uint64_t dst_offset, uint64_t length_bytes,
                                  ChunkLanded on_landed) {
  return windows_.Post(transfer_id, dst, dst_offset, length_bytes, std::move(on_landed));
}

// A stream mid-chunk finishes (or fails) in bounded time (header and
// minimum-rate timeouts), so the wait needs no bound of its own; another
// stream's thread may wait here, a stream's own landing is not waited for.
void TcpConnection::CancelReceive(uint64_t transfer_id) {
  windows_.Cancel(transfer_id, transport::LandingWait{});
}

void TcpConnection::Close() { Fail(TERN_ERROR(kCancelled, "connection closed"), Status::Ok()); }

void TcpConnection::Fail(Status ops, Status closed) {
  std::map<uint64_t, Completion> pending;
  std::vector<Completion> written;
  {
    MutexLock lock(mu_);
    if (closed_) {
      // Close() promises quiet memory when it returns, even when another
      // thread's Fail is still at the barrier below; a stream thread of
      // this connection must not wait (the barrier may be waiting for it).
      if (stream_owner_ != this) quiesced_cv_.Wait([&]() REQUIRES(mu_) { return quiesced_; });
      return;
    }
    closed_ = true;
    close_status_ = ops;
    pending.swap(pending_);
    chunks_.clear();
    queued_chunks_.store(0, std::memory_order_release);
  }
  // The windows stay known: CancelReceive must still wait for a stream that
  // is mid-chunk into one before the caller may free the memory.
  windows_.Close();
  for (auto& s : streams_) {
    MutexLock lock(s->mu);
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
    MutexLock lock(mu_);
    quiesced_ = true;
  }
  quiesced_cv_.SignalAll();
  for (auto& [op, done] : pending) Complete(done, ops);
  for (auto& done : written) Complete(done, ops);
  ConnectionHandlers handlers;
  {
    MutexLock lock(mu_);
    handlers = std::move(handlers_);
    handlers_ = {};
  }
  if (handlers.on_closed) handlers.on_closed(closed);
}

Status TcpConnection::PushControl(Stream& s, OutFrame&& f, bool bounded) {
  {
    MutexLock lock(s.mu);
    if (s.stop) return TERN_ERROR(kUnavailable, "connection closed");
    if (bounded && s.control.size() >= options_.max_queued_frames) {
      return TERN_ERROR(kResourceExhausted, "more than ", options_.max_queued_frames,
                        " frames queued");
    }
    // ACKs are owed to the peer, one per chunk it sent; a peer with the same
    // limits never has more than max_queued_frames chunks unacknowledged, so
    // a queue past twice that (plus messages' and pings' share) means it
    // sends without reading, and would otherwise grow without bound.
    const uint64_t owed_max = 2 * uint64_t{options_.max_queued_frames} + 64;
    if (!bounded && s.control.size() >= owed_max) {
      return TERN_ERROR(kResourceExhausted, "peer does not read what we send: ", s.control.size(),
                        " frames queued on stream ", s.index);
    }
    s.control.push_back(std::move(f));
  }
  s.Wake();
  return Status::Ok();
}

// Per-stream receive state; touched only by that stream's thread.
struct TcpConnection::Reader {
  uint8_t header[kHeaderBytes];
  size_t header_got = 0;
  uint64_t header_start_us = 0;
  bool in_payload = false;
  FrameHeader h;
  uint8_t* dest = nullptr;
  uint64_t got = 0;
  std::string message;
  uint64_t frames = 0;  // headers received on this stream, for error messages
  std::optional<transport::Landing> landing;
  Status refuse;  // chunk read and dropped, then refused with this
  uint8_t scratch[64 * 1024];
};

void TcpConnection::ProtocolFailure(const Status& why) {
  LogLine(options_.log, "tcp: dropping connection from " + peer_ + ": " + why.ToString());
  Fail(why, why);
}

bool TcpConnection::StartPayload(Stream& s, Reader& r) {
  const FrameHeader& h = r.h;
  ++r.frames;
  if (h.version != wire_version_) {
    ProtocolFailure(TERN_ERROR(kProtocol, "frame ", r.frames, " on stream ", s.index,
                               " is in wire version ", int{h.version}, ", the connection's is ",
                               int{wire_version_}));
    return false;
  }
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
      Result<transport::Landing> landing = windows_.Begin(h.arg[0], h.arg[1], h.payload_bytes);
      if (landing.ok()) {
        r.landing = *landing;
        r.dest = landing->dst;
      } else {
        r.refuse = landing.status();
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

bool TcpConnection::FinishFrame(Stream& s, Reader& r) {
  r.in_payload = false;
  r.header_got = 0;
  const FrameHeader& h = r.h;
  switch (h.type) {
    case FrameType::kMessage: {
      if (wire_version_ >= 2) {
        // Checked before delivery: a corrupted control message never
        // reaches the agent's parser.
        const uint64_t sum = MessageCheck(r.message);
        if (sum != h.arg[2]) {
          ProtocolFailure(TERN_ERROR(kCorrupt, "message check mismatch from ", peer_, " on stream ",
                                     s.index, ", frame ", r.frames, " (", h.payload_bytes,
                                     " payload bytes): the frame carries XXH3-64 0x", std::hex,
                                     h.arg[2], ", the payload hashes to 0x", sum));
          return false;
        }
      }
      std::function<void(std::string)> on_message;
      {
        MutexLock lock(mu_);
        on_message = handlers_.on_message;
      }
      if (on_message) on_message(std::move(r.message));
      r.message = std::string();
      break;
    }
    case FrameType::kChunk: {
      Status result = r.refuse;
      if (r.landing) {
        result = windows_.Finish(*r.landing, Status::Ok(), h.arg[2]);
        r.landing.reset();
      }
      Status queued = PushControl(
          s, MakeFrame(wire_version_, FrameType::kAck, h.arg[3], WireCode(result)),
          /*bounded=*/false);
      if (queued.code() == Code::kResourceExhausted) {
        ProtocolFailure(queued);
        return false;
      }
      break;
    }
    case FrameType::kAck: {
      Completion done;
      {
        MutexLock lock(mu_);
        auto it = pending_.find(h.arg[0]);
        if (it != pending_.end()) {
          done = std::move(it->second);
          pending_.erase(it);
        }
      }
      Complete(done, StatusFromWire(h.arg[1], "peer", h.arg[1] == static_cast<uint64_t>(Code::kCorrupt)
                                                      ? "chunk failed its checksum on landing"
                                                      : "chunk refused"));
      break;
    }
    default:
      break;
  }
  return true;
}

// Reads what is available.
bool TcpConnection::ReadSome(Stream& s, Reader& r, bool* more, uint64_t* last_progress_us) {
  *more = false;
  for (int round = 0; round < 64; ++round) {
    IoResult io;
    std::unique_lock<std::mutex> io_lock(s.io_mu);
    if (s.stop) return false;
    if (!r.in_payload) {
      io = s.pipe->Read(r.header + r.header_got, kHeaderBytes - r.header_got);
      io_lock.unlock();
      if (io.io == Io::kOk && io.bytes > 0) {
        if (r.header_got == 0) r.header_start_us = clock_.NowUs();
        r.header_got += io.bytes;
        if (r.header_got == kHeaderBytes) {
          Status st = DecodeHeader(r.header, &r.h);
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
        if (r.landing) chunk_bytes_received_.fetch_add(io.bytes, std::memory_order_relaxed);
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
    // A TLS record that failed here (corrupted on the wire or cut) is the
    // link's fault, not proof against the peer: PipeError makes it the
    // same kUnavailable as a reset (kAuth only for an alert refusing our
    // certificate, which comes right after the handshake if at all).
    Status why = PipeError(*s.pipe, io).WithContext("read from " + peer_);
    Fail(why, why);
    return false;
  }
  *more = true;  // yielded to the writer; data may still be waiting
  return true;
}

// Stream choice. Chunks wait in one queue, and a stream whose socket has
// room asks for the next one (ChooseChunkStream, stream_choice.h, has the
// rules and their reasons). In a connection's first transfer the streams
// fill in index order: an object that fits in stream 0's window (congestion
// window plus TCP_NOTSENT_LOWAT) goes out on it alone instead of on a
// stream that never sent and starts from the initial window (10 segments,
// one round trip per doubling; measured on the WAN testbed, docs/agent.md
// §8), and a bulk transfer engages stream 1 when stream 0 fills, and so on.
// Once several streams have carried chunks, each chunk goes to the warm
// stream whose pacing finishes it first. Under BBR a stream that shared a
// bulk transfer paces at its share of the link, about rate / N, and keeps
// that estimate between objects; a small object that stayed on stream 0
// went at that share (docs/transport.md, "Streams and BBR"). Spread over
// the warm streams by their pacing rates and unsent bytes, it goes at their
// sum. The asking stream reads the warm streams' sockets (TCP_INFO) before
// it takes mu_ (a read takes that socket's lock, which its owner holds while
// it writes): their descriptors stay open until the connection is destroyed
// (Fail only shuts them down). A stream that handed a chunk to another
// takes it itself if it is still first in the queue kHandOffUs later (the
// other may be busy in a callback), so a hand-off between warm streams costs
// at most that (by the connection's clock: a frozen test clock turns the
// bound off, and the stream looks again every 10 ms).
void TcpConnection::ReadSendStates(Stream& s) {
  s.send_states.assign(streams_.size(), SendState{});
  if (queued_chunks_.load(std::memory_order_acquire) == 0) return;
  if (s.chunks_sent.load(std::memory_order_relaxed) == 0) return;
  uint32_t warm = 0;
  for (const auto& t : streams_) warm += t->chunks_sent.load(std::memory_order_relaxed) > 0;
  if (warm < 2) return;
  for (uint32_t i = 0; i < streams_.size(); ++i) {
    const Stream& t = *streams_[i];
    // Full streams cannot take the chunk, and their owners are writing.
    if (t.chunks_sent.load(std::memory_order_relaxed) == 0 ||
        t.stop.load(std::memory_order_relaxed) ||
        (&t != &s && t.full.load(std::memory_order_relaxed))) {
      continue;
    }
    if (!ReadSendState(t.pipe->fd(), &s.send_states[i])) s.send_states[i] = SendState{};
  }
}

ChunkChoice TcpConnection::ChooseFor(const Stream& s, uint64_t bytes) {
  for (uint32_t i = 0; i < streams_.size(); ++i) {
    const Stream& t = *streams_[i];
    StreamView& v = views_[i];
    v = StreamView{};
    v.open = &t == &s || (!t.full.load(std::memory_order_relaxed) &&
                          !t.stop.load(std::memory_order_relaxed));
    v.warm = t.chunks_sent.load(std::memory_order_relaxed) > 0;
    if (i < s.send_states.size() && s.send_states[i].pacing_bytes_per_s > 0) {
      v.pacing_bytes_per_s = s.send_states[i].pacing_bytes_per_s;
      v.backlog_bytes =
          s.send_states[i].notsent_bytes + t.unwritten_bytes.load(std::memory_order_relaxed);
    }
  }
  return ChooseChunkStream(views_, s.index, bytes);
}

std::vector<uint64_t> TcpConnection::StreamChunkCounts() const {
  std::vector<uint64_t> out;
  for (const auto& s : streams_) out.push_back(s->chunks_sent.load());
  return out;
}

// Writes what the socket takes; sets *blocked when it stopped on a full socket.
bool TcpConnection::WriteSome(Stream& s, std::optional<OutFrame>& cur, bool* blocked,
                              uint64_t* last_write_us) {
  *blocked = false;
  for (;;) {
    if (!cur) {
      {
        MutexLock lock(s.mu);
        if (!s.control.empty()) {
          cur = std::move(s.control.front());
          s.control.pop_front();
        }
      }
      if (!cur && queued_chunks_.load(std::memory_order_acquire) == 0) s.declined_op = 0;
      if (!cur && queued_chunks_.load(std::memory_order_acquire) > 0) {
        ReadSendStates(s);
        int wake = -1;
        {
          MutexLock lock(mu_);
          if (!chunks_.empty()) {
            const uint64_t head = chunks_.front().op, now = clock_.NowUs();
            // Only a warm stream takes back what it handed on: a cold one
            // declined by the rules of a first transfer, which hold
            // however long the stream it named takes to be scheduled.
            const bool warm = s.chunks_sent.load(std::memory_order_relaxed) > 0;
            const ChunkChoice choice =
                warm && head == s.declined_op && now - s.declined_us >= kHandOffUs
                    ? ChunkChoice{true, -1}
                    : ChooseFor(s, kHeaderBytes + chunks_.front().size);
            if (choice.take) {
              cur = std::move(chunks_.front());
              chunks_.pop_front();
              queued_chunks_.store(chunks_.size(), std::memory_order_release);
              s.unwritten_bytes.store(kHeaderBytes + cur->size, std::memory_order_relaxed);
              s.chunks_sent.fetch_add(1, std::memory_order_relaxed);
              s.declined_op = 0;
            } else {
              wake = choice.wake;
              if (warm && head != s.declined_op) {
                s.declined_op = head;
                s.declined_us = now;
              }
            }
          }
        }
        if (wake >= 0 && static_cast<uint32_t>(wake) != s.index) streams_[wake]->Wake();
      }
      if (!cur) return true;
      s.unwritten_bytes.store(kHeaderBytes + cur->size - cur->sent, std::memory_order_relaxed);
    }
    OutFrame& f = *cur;
    IoResult io;
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
      s.unwritten_bytes.store(kHeaderBytes + f.size - f.sent, std::memory_order_relaxed);
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
    Status why = PipeError(*s.pipe, io).WithContext("write to " + peer_);
    Fail(why, why);
    return false;
  }
}

TcpConnection::StreamDeadlines TcpConnection::Deadlines(const Reader& reader, bool writing,
                                                        uint64_t last_progress_us,
                                                        uint64_t last_write_us) const {
  const uint64_t idle_us = options_.idle_timeout_ms * 1000;
  StreamDeadlines d;
  d.silent_us = last_progress_us + idle_us;
  if (!writing) d.ping_us = last_write_us + idle_us / 3;
  if (reader.header_got > 0 && !reader.in_payload) {
    d.header_us = reader.header_start_us + options_.header_timeout_ms * 1000;
  }
  if (reader.in_payload && options_.min_frame_bytes_per_s > 0) {
    d.frame_us = reader.header_start_us + FrameAllowedUs(reader.h.payload_bytes);
  }
  return d;
}

int TcpConnection::IdleWaitMs(const StreamDeadlines& d) const {
  // Each check fires once the clock is past its deadline: wake 1 us after.
  const uint64_t next_us = std::min({d.silent_us, d.ping_us, d.header_us, d.frame_us}) + 1;
  const uint64_t now = clock_.NowUs();
  const uint64_t wait_us = next_us > now ? std::min(next_us - now, kIdlePollCapUs) : 0;
  return static_cast<int>((wait_us + 999) / 1000);
}

uint64_t TcpConnection::FrameAllowedUs(uint64_t payload_bytes) const {
  // 64-bit before the multiply: a 4 MiB frame times 10^6 overflows 32 bits
  // (it gave a 4 MiB chunk 10 s instead of 74 s at 64 KiB/s).
  return options_.header_timeout_ms * 1000 +
         payload_bytes * 1000000 / options_.min_frame_bytes_per_s;
}

void TcpConnection::RunStream(Stream& s) {
  stream_owner_ = this;
  auto reader = std::make_unique<Reader>();
  std::optional<OutFrame> cur;
  uint64_t last_progress_us = clock_.NowUs();
  uint64_t last_write_us = last_progress_us;
  bool more = false, blocked = false;
  while (!s.stop) {
    pollfd fds[2] = {{s.pipe->fd(), POLLIN, 0}, {s.wake_fd, POLLIN, 0}};
    if (blocked || want_write_for_read_) fds[0].events |= POLLOUT;
    // A stream that handed a chunk on looks again after kHandOffUs; an idle
    // one sleeps until its next deadline (the checks below), at most
    // kIdlePollCapUs.
    int wait_ms = 0;
    if (!more && !s.pipe->HasBuffered()) {
      wait_ms =
          s.declined_op != 0
              ? static_cast<int>(kHandOffUs / 1000)
              : IdleWaitMs(Deadlines(*reader, cur.has_value(), last_progress_us, last_write_us));
    }
    if (::poll(fds, 2, wait_ms) < 0 && errno != EINTR) {
      // Leaving without Fail would leave a stream that looks open to the
      // stream choice and serves nobody.
      const int err = errno;
      Status why = TERN_ERROR(kInternal, "poll on a stream to ", peer_, ": ", std::strerror(err));
      Fail(why, why);
      break;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t n;
      [[maybe_unused]] ssize_t rc = ::read(s.wake_fd, &n, sizeof n);
    }
    if (s.stop) break;
    want_write_for_read_ = false;
    if (!ReadSome(s, *reader, &more, &last_progress_us)) break;
    if (!WriteSome(s, cur, &blocked, &last_write_us)) break;
    // A stream that fills hands the waiting chunks to the others: each may
    // have declined them in its favour.
    if (blocked != s.full.exchange(blocked) && blocked && streams_.size() > 1) {
      bool waiting;
      {
        MutexLock lock(mu_);
        waiting = !chunks_.empty();
      }
      if (waiting) {
        for (auto& other : streams_) {
          if (other.get() != &s) other->Wake();
        }
      }
    }

    // The same deadlines the poll slept until, from the state the reads and
    // writes left.
    const StreamDeadlines due =
        Deadlines(*reader, cur.has_value(), last_progress_us, last_write_us);
    const uint64_t now = clock_.NowUs();
    if (now > due.header_us) {
      ProtocolFailure(TERN_ERROR(kTimeout, "partial frame header for more than ",
                                 options_.header_timeout_ms, " ms"));
      break;
    }
    if (now > due.frame_us) {
      ProtocolFailure(TERN_ERROR(
          kTimeout, "frame of ", reader->h.payload_bytes, " bytes still incomplete after ",
          (due.frame_us - reader->header_start_us) / 1000, " ms (below the minimum rate of ",
          options_.min_frame_bytes_per_s, " bytes/s)"));
      break;
    }
    if (now > due.silent_us) {
      ProtocolFailure(
          TERN_ERROR(kTimeout, "peer silent for more than ", options_.idle_timeout_ms, " ms"));
      break;
    }
    if (now > due.ping_us) {
      PushControl(s, MakeFrame(wire_version_, FrameType::kPing), false).IgnoreError();
      last_write_us = now;
    }
  }
  if (cur && cur->on_written) {
    Status why;
    {
      MutexLock lock(mu_);
      why = close_status_;
    }
    Complete(cur->on_written, why.ok() ? TERN_ERROR(kUnavailable, "connection closed") : why);
  }
  if (reader->landing) windows_.Abort(*reader->landing);
  stream_owner_ = nullptr;
}

}  // namespace tern::tcp

// The TCP backend's connection engine (internal): N streams, each served by
// one I/O thread that owns its socket (and TLS session) and does both
// directions with non-blocking I/O and poll, so TLS needs no locking and a
// slow peer never blocks our acknowledgements behind our own writes. The
// listener, dialer and handshake that build connections are in tcp.cc.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "tern/tcp_transport.h"
#include "tern/transport.h"
#include "transport/internal.h"
#include "transport/window_table.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/pipe.h"
#include "transport/tcp/stream_choice.h"

namespace tern::tcp {

// SIGPIPE is per thread for synchronous signals: blocking it in our I/O
// threads turns a write to a dead peer into EPIPE without touching the
// process-wide disposition.
void BlockSigpipe();

// For the body of every thread the TCP backend spawns: blocks SIGPIPE, and
// on the way out frees the thread's OpenSSL state (error queue) at once.
// Our thread trackers count a thread done when its body returns, before the
// thread's own exit handlers run, so without this a process could exit with
// that state still allocated (LeakSanitizer saw 904-byte ERR_STATEs).
struct IoThreadScope {
  IoThreadScope() { BlockSigpipe(); }
  ~IoThreadScope();
  IoThreadScope(const IoThreadScope&) = delete;
  IoThreadScope& operator=(const IoThreadScope&) = delete;
};

// A frame queued for sending: its encoded header and a payload that is
// either owned (messages) or borrowed from registered memory (chunks).
struct OutFrame {
  uint8_t header[kHeaderBytes];
  std::string owned;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t sent = 0;  // over header + data
  uint64_t op = 0;    // a chunk's operation number (0 for other frames)
  Completion on_written;
};

// How long a chunk a warm stream handed to another may wait for it before
// the stream that handed it on takes it back (the other may be busy in a
// callback, or slow to be scheduled on a loaded machine).
inline constexpr uint64_t kHandOffUs = 10'000;

// The longest an idle stream sleeps in poll: it wakes for its socket, its
// wake-up fd or its next deadline (ping, the peer's silence, a partial
// frame), and at least this often besides, so that a missed wake-up costs
// at most this much. Every 50 ms until 2026-12-05: 20 wake-ups a second
// per idle stream thread (an idle agent with 8 streams per link woke
// 600-1,700 times a second; docs/benchmarks.md).
inline constexpr uint64_t kIdlePollCapUs = 1'000'000;

OutFrame MakeFrame(uint8_t version, FrameType type, uint64_t a0 = 0, uint64_t a1 = 0,
                   uint64_t a2 = 0, uint64_t a3 = 0, uint32_t payload_bytes = 0);

struct Stream {
  std::unique_ptr<Pipe> pipe;
  int wake_fd = -1;
  uint32_t index = 0;
  Mutex mu;
  std::deque<OutFrame> control GUARDED_BY(mu);  // acks, pings, messages
  std::atomic<bool> stop{false};
  // The socket took no more bytes at the last write (send buffer or
  // TCP_NOTSENT_LOWAT reached): other streams take the chunks.
  std::atomic<bool> full{false};
  std::atomic<uint64_t> chunks_sent{0};
  // Bytes of the frame the stream's thread holds that the socket has not
  // yet taken (its own backlog above the kernel's unsent bytes).
  std::atomic<uint64_t> unwritten_bytes{0};
  // The stream's thread's own: the other streams' sockets as it last read
  // them, and the chunk it last handed to another stream and when (it takes
  // that chunk itself if it is still first in the queue kHandOffUs later).
  std::vector<SendState> send_states;
  uint64_t declined_op = 0;
  uint64_t declined_us = 0;
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
  // `pipes` are the connection's streams, handshake done, in index order;
  // `wire_version` is the one their HELLO exchange settled: every frame
  // sent is in it, a frame received in another ends the connection.
  TcpConnection(std::vector<std::unique_ptr<Pipe>> pipes, std::string peer, std::string describe,
                uint8_t wire_version, const TcpOptions& options, Clock& clock);

  void SetHandlers(ConnectionHandlers handlers);
  // Before Start: answers every stream's hello.
  bool SendHelloAcks(const uint8_t header[kHeaderBytes], uint64_t deadline_us);
  // Spawns one I/O thread per stream.
  void Start(transport::ThreadTracker& threads);

  std::string peer_address() const override { return peer_; }
  uint32_t capabilities() const override {
    return kCapCrossHost | kCapChunkChecksum |
           (streams_.size() > 1 ? uint32_t{kCapMultiStream} : 0u) |
           (encrypted_ ? uint32_t{kCapEncrypted} : 0u);
  }
  std::string Describe() const override { return describe_; }

  void SendMessage(std::string payload, Completion done) override;
  void SendChunk(const ChunkSend& c, Completion done) override;
  Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                     uint64_t length_bytes, ChunkLanded on_landed) override;
  void CancelReceive(uint64_t transfer_id) override;
  void Close() override;
  uint64_t chunk_bytes_received() const override {
    return chunk_bytes_received_.load(std::memory_order_relaxed);
  }

  // Chunks each stream has written, in index order (tests, diagnostics).
  std::vector<uint64_t> StreamChunkCounts() const;
  // Stream i's socket, for tests that shape one stream (SO_MAX_PACING_RATE).
  int StreamSocketForTesting(uint32_t i) const { return streams_.at(i)->pipe->fd(); }
  uint8_t wire_version() const { return wire_version_; }

  // Ends the connection once: pending operations get `ops`, on_closed gets
  // `closed`.
  void Fail(Status ops, Status closed);

 private:
  // Payload bytes read into open windows, as they come off the sockets.
  std::atomic<uint64_t> chunk_bytes_received_{0};
  struct Reader;

  // Queues f on s; refused (an error), f is left as it was.
  Status PushControl(Stream& s, OutFrame&& f, bool bounded);
  void ProtocolFailure(const Status& why);
  // Each returns false when the stream must stop.
  bool StartPayload(Stream& s, Reader& r);
  bool FinishFrame(Stream& s, Reader& r);
  bool ReadSome(Stream& s, Reader& r, bool* more, uint64_t* last_progress_us);
  // RunStream's deadlines (clock_'s us): past one, its check fires.
  // kNoDeadline where it does not apply.
  static constexpr uint64_t kNoDeadline = UINT64_MAX - 1;
  struct StreamDeadlines {
    uint64_t silent_us = kNoDeadline;  // the peer silent too long
    uint64_t ping_us = kNoDeadline;    // a ping due (nothing being written)
    uint64_t header_us = kNoDeadline;  // a partial frame header
    uint64_t frame_us = kNoDeadline;   // a frame below the minimum rate
  };
  StreamDeadlines Deadlines(const Reader& r, bool writing, uint64_t last_progress_us,
                            uint64_t last_write_us) const;
  // How long RunStream's poll may sleep with nothing to do: until the
  // first deadline, at most kIdlePollCapUs (rounded up to a ms).
  int IdleWaitMs(const StreamDeadlines& d) const;
  // How long a frame of this payload may take from its first header byte
  // (header_timeout_ms, then min_frame_bytes_per_s).
  uint64_t FrameAllowedUs(uint64_t payload_bytes) const;
  bool WriteSome(Stream& s, std::optional<OutFrame>& cur, bool* blocked, uint64_t* last_write_us);
  // Reads the sockets of the warm streams (stream_choice.h) into
  // s.send_states when two or more could take a waiting chunk; outside mu_.
  void ReadSendStates(Stream& s);
  // Whether stream s takes the queued chunk of `bytes`, else which stream
  // should (stream_choice.h; the stream choice in connection.cc).
  ChunkChoice ChooseFor(const Stream& s, uint64_t bytes) REQUIRES(mu_);
  void RunStream(Stream& s);

  const std::string peer_;
  const std::string describe_;
  const uint8_t wire_version_;
  const TcpOptions options_;
  Clock& clock_;
  bool encrypted_ = false;
  std::vector<std::unique_ptr<Stream>> streams_;
  // A TLS read that needs to write first (renegotiation-like records); per
  // I/O thread, as each thread serves exactly one stream.
  static thread_local bool want_write_for_read_;
  // The connection whose stream this thread serves (null elsewhere).
  static thread_local const TcpConnection* stream_owner_;

  Mutex mu_;
  bool closed_ GUARDED_BY(mu_) = false;
  bool quiesced_ GUARDED_BY(mu_) = false;  // the first Fail has passed its I/O barrier
  CondVar quiesced_cv_{&mu_};
  Status close_status_ GUARDED_BY(mu_);
  ConnectionHandlers handlers_ GUARDED_BY(mu_);
  // Streams landing chunks in parallel; CancelReceive waits for them.
  transport::WindowTable windows_{"tcp"};
  std::map<uint64_t, Completion> pending_ GUARDED_BY(mu_);
  std::deque<OutFrame> chunks_ GUARDED_BY(mu_);
  std::atomic<uint64_t> queued_chunks_{0};  // chunks_.size(), read without mu_
  std::vector<StreamView> views_ GUARDED_BY(mu_);  // ChooseFor's scratch
  uint64_t next_op_ GUARDED_BY(mu_) = 1;
};

}  // namespace tern::tcp

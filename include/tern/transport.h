// The transport interface: backends that only move bytes between peers.
//
// A Transport (one per backend: loopback, tcp, ucx, verbs, or a decorator
// such as the fault injector) listens on and connects to address strings and
// yields Connections. A Connection carries two kinds of traffic:
//  * messages: ordered, reliable byte strings up to kMaxMessageBytes (control
//    traffic: requests, manifests, acks of higher layers);
//  * chunks: up to kMaxChunkBytes copied from registered memory on the sender
//    into a receive window the peer has posted, each verified on landing with
//    an XXH3-64 checksum and acknowledged. Chunks may land out of order (a
//    multi-stream backend stripes them).
// Retry, resume, windows, scheduling and failover do NOT live here; they
// live above, in each of the two users of chunks, over any backend:
//  * xfer (include/tern/xfer_chunks.h, xfer.h): point-to-point copies of a
//    byte range or file, with their chunk scheduler, bounded window, retry
//    of corrupt chunks and resume from the acknowledged chunks;
//  * the agent's relay (agent/relay/relay.h): a cut-through tree that
//    forwards each chunk once verified, with its own per-chunk windows,
//    credits per child and resends.
//
// Asynchrony: every operation completes exactly once through its callback
// (OK, or the error that ended it; kCancelled after Close()). Callbacks run on
// backend threads; they must not block for long and may call back into the
// Connection (backends never hold their locks while calling out). A
// Connection's on_message callbacks are serialized, in send order.
//
// Timeouts: every wait inside a backend is bounded (connect, handshake, idle
// peer); a stuck peer ends as a closed Connection with kTimeout, never a hang.
//
// Thread safety: all methods of Transport, Listener and Connection may be
// called from any thread concurrently. Objects are owned by the caller
// (Transport outlives its Listeners and Connections).
//
// Lifetime of handlers: a connection's callbacks may still run after Close()
// returns (on_closed in particular may be on its way); none runs once its
// Transport is destroyed. What the handlers use must outlive the Transport,
// or be owned by them (capture a shared_ptr, or a weak_ptr checked on entry).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tern/clock.h"  // Clock, SteadyClock(): backends take the clock passed in
#include "tern/export.h"
#include "tern/log.h"  // LogFn: how backends report what no caller waits for
#include "tern/status.h"

namespace tern {

// Where registered memory lives. kCuda is accepted only by backends with
// kCapGpuMemory; others refuse it with kUnsupported (callers stage via host).
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// Capability flags, reported by Transport (what it can do) and Connection
// (what this link does).
enum Capability : uint32_t {
  kCapGpuMemory = 1u << 0,       // registers kCuda memory, moves it without staging
  kCapOneSidedWrite = 1u << 1,   // ExportRegion/Write into peer memory
  kCapEncrypted = 1u << 2,       // wire encrypted, both peers authenticated
  kCapMultiStream = 1u << 3,     // chunks striped over parallel streams
  kCapCrossHost = 1u << 4,       // can reach other hosts (loopback cannot)
  kCapChunkChecksum = 1u << 5,   // every chunk checked with XXH3-64 on landing
};

inline constexpr uint64_t kMaxMessageBytes = uint64_t{16} << 20;  // 16 MiB
inline constexpr uint64_t kMaxChunkBytes = uint64_t{64} << 20;    // 64 MiB

// Memory a backend may read chunks from or write chunks into. Obtained from
// Transport::RegisterMemory; the bytes must outlive the registration.
struct MemoryRegion {
  void* base = nullptr;
  uint64_t size_bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  uint64_t handle = 0;  // backend-private; 0 means "not registered"
};

using Completion = std::function<void(Status)>;

// One chunk to copy to the peer's receive window `transfer_id` at dst_offset.
struct ChunkSend {
  MemoryRegion src;
  uint64_t src_offset = 0;
  uint64_t length = 0;  // 1 .. kMaxChunkBytes
  uint64_t transfer_id = 0;
  uint64_t dst_offset = 0;
  // The chunk's XXH3-64 when the caller already holds it (a relay forwarding
  // a chunk keeps the original's checksum end to end); else computed here.
  std::optional<uint64_t> xxh3;
};

// Called on the receiver for each chunk that landed in its window and passed
// its checksum (offset relative to the window start).
using ChunkLanded = std::function<void(uint64_t offset, uint64_t length)>;

struct ConnectionHandlers {
  std::function<void(std::string payload)> on_message;
  // Exactly once, when the connection ends for any reason (OK after a clean
  // Close by either side).
  std::function<void(Status why)> on_closed;
};

class Connection {
 public:
  virtual ~Connection() = default;

  virtual std::string peer_address() const = 0;
  virtual uint32_t capabilities() const = 0;
  // Human-readable link description ("tcp 8 streams bbr tls1.3").
  virtual std::string Describe() const = 0;

  // Queues a message (<= kMaxMessageBytes). done fires when it was handed to
  // the wire, not when the peer handled it.
  virtual void SendMessage(std::string payload, Completion done) = 0;

  // Sends a chunk. done(OK) once the peer verified and placed it; kCorrupt if
  // its checksum failed on landing; kNotFound if the peer had no matching
  // window; kUnavailable/kTimeout if the connection broke first. src must stay
  // registered and unchanged until done fires.
  virtual void SendChunk(const ChunkSend& chunk, Completion done) = 0;

  // Opens receive window `transfer_id`: chunks for it land at
  // dst.base + dst_offset + offset, 0 <= offset, offset + length <= length_bytes.
  // Chunks outside any open window are refused (the sender sees kNotFound or
  // kOutOfRange) and the connection stays up.
  virtual Status PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                             uint64_t length_bytes, ChunkLanded on_landed) = 0;
  // After return, nothing more is written into the window and on_landed is
  // not called again.
  virtual void CancelReceive(uint64_t transfer_id) = 0;

  // Bytes of chunks received into open windows on this connection so far,
  // counted as they arrive, before a chunk is whole: a slow link's progress,
  // where on_landed says only "whole" (a 4 MiB chunk at 300 kB/s lands
  // after 14 s). Never decreases. 0 where the backend does not count them
  // (UCX and verbs land a chunk in one operation).
  virtual uint64_t chunk_bytes_received() const { return 0; }

  // One-sided writes (kCapOneSidedWrite): the owner exports a region as an
  // opaque key, ships it in a message, and the peer Writes into it.
  virtual Result<std::string> ExportRegion(const MemoryRegion& region);
  virtual void Write(const MemoryRegion& src, uint64_t src_offset, std::string_view remote_key,
                     uint64_t dst_offset, uint64_t length, Completion done);

  // Ends the connection; pending operations complete with kCancelled and
  // on_closed fires (once). When Close returns (called from outside a
  // callback of this connection) the backend no longer reads chunk sources
  // or writes windows of this connection. Idempotent.
  virtual void Close() = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // The bound address (the real port when asked to listen on port 0).
  virtual std::string address() const = 0;
  // Stops accepting; established connections are unaffected. Idempotent.
  // When it returns (called from outside the accept handler) the handler is
  // not running and is never called again: a peer whose handshake ends
  // later is refused, and what the handler uses may be destroyed. Called
  // from inside the handler it only stops accepting. A handler must not
  // close another listener whose handler may be closing this one.
  virtual void Close() = 0;
};

// Called once per accepted connection, before any of its traffic is
// delivered; returns the handlers for it.
using AcceptHandler = std::function<ConnectionHandlers(std::shared_ptr<Connection>)>;
using ConnectDone = std::function<void(Result<std::shared_ptr<Connection>>)>;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;  // "loopback", "tcp", "tcp+tls", "fault(tcp)"
  virtual uint32_t capabilities() const = 0;

  virtual Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) = 0;
  virtual Status DeregisterMemory(const MemoryRegion& region) = 0;

  // Address syntax is the backend's ("HOST:PORT" for tcp, any name for
  // loopback).
  virtual Result<std::unique_ptr<Listener>> Listen(const std::string& address,
                                                   AcceptHandler on_accept) = 0;
  // done fires before any on_message of the new connection.
  virtual void Connect(const std::string& address, ConnectionHandlers handlers,
                       ConnectDone done) = 0;
};

}  // namespace tern

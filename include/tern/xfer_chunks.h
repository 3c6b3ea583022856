// The transfer layer for point-to-point copies: the windows, retry and
// resume of one byte range sent from one peer to another, over any
// Transport. (The agent's relay tree keeps its own per-chunk windows and
// resends, agent/relay/relay.h: it forwards each chunk as soon as it is
// verified, to several children, which a point-to-point copy never does.)
//
//  * ChunkMap: which fixed-size chunks of a byte range are acknowledged; the
//    state a resumed transfer starts from (serializable).
//  * SendChunks: streams every missing chunk of a range over a Connection
//    with a bounded window, recording acknowledgements in the map, retrying
//    chunks that failed their checksum; on a broken connection it returns the
//    error and the map says exactly what still has to go.
//
// Thread safety: ChunkMap is a value, not synchronized. SendChunks blocks
// the calling thread (never a backend callback thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/transport.h"

namespace tern {

class TERN_EXPORT ChunkMap {
 public:
  ChunkMap() = default;
  // chunk_bytes in [1, kMaxChunkBytes].
  static Result<ChunkMap> Make(uint64_t total_bytes, uint64_t chunk_bytes);

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return chunks_; }
  uint64_t ChunkOffset(uint64_t i) const { return i * chunk_bytes_; }
  uint64_t ChunkLength(uint64_t i) const;
  // The chunk that starts at `offset`, or chunks() when none does.
  uint64_t ChunkAt(uint64_t offset) const;

  bool done(uint64_t i) const { return (bits_[i >> 3] >> (i & 7)) & 1; }
  void MarkDone(uint64_t i);
  uint64_t done_chunks() const { return done_chunks_; }
  uint64_t done_bytes() const { return done_bytes_; }
  bool complete() const { return done_chunks_ == chunks_; }

  // One bit per chunk, chunk i in bit (i % 8) of byte i / 8.
  const std::vector<uint8_t>& bits() const { return bits_; }
  // Replaces the done set; kCorrupt when the bitmap does not fit this map.
  Status SetBits(std::string_view bits);

 private:
  uint64_t total_bytes_ = 0;
  uint64_t chunk_bytes_ = 1;
  uint64_t chunks_ = 0;
  uint64_t done_chunks_ = 0;
  uint64_t done_bytes_ = 0;
  std::vector<uint8_t> bits_;
};

struct SendOptions {
  uint32_t window_chunks = 32;     // chunks in flight at once
  uint32_t max_chunk_retries = 3;  // per chunk, after kCorrupt
  uint64_t stall_timeout_ms = 60000;  // no acknowledgement for this long fails
  std::function<void(uint64_t done_bytes)> on_progress;  // on the calling thread
};

// Sends the chunks of `map` not yet done: chunk i is src[src_offset +
// ChunkOffset(i), +ChunkLength(i)) to the peer's window transfer_id at
// ChunkOffset(i).
TERN_EXPORT Status SendChunks(Connection& conn, const MemoryRegion& src, uint64_t src_offset,
                              uint64_t transfer_id, ChunkMap& map, const SendOptions& options,
                              Clock& clock);

}  // namespace tern

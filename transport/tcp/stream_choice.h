// Which of a connection's streams carries the next chunk: the policy alone,
// apart from the sockets, so that its cases are tested directly
// (stream_choice_test.cc). The connection (connection.cc, "Stream choice")
// fills in what each stream's socket says and acts on the answer.
#pragma once

#include <cstdint>
#include <span>

namespace tern::tcp {

struct StreamView {
  // Could take a chunk now: not stopped, and its socket took everything at
  // its last write (not full).
  bool open = false;
  // Has carried a chunk before: its congestion window and its pacing rate
  // are a measurement, not the initial window.
  bool warm = false;
  // What the kernel paces the socket at (TCP_INFO tcpi_pacing_rate), bytes
  // per second; 0 where unknown.
  uint64_t pacing_bytes_per_s = 0;
  // Bytes the stream has still to put on the wire: the kernel's unsent
  // bytes (tcpi_notsent_bytes) plus what its thread took and not yet wrote.
  uint64_t backlog_bytes = 0;
};

struct ChunkChoice {
  bool take = false;  // the asking stream takes the chunk
  int wake = -1;      // else the stream that should (-1: none can now)
};

// A stream within this factor of the best estimate takes the chunk itself:
// estimates are read at slightly different moments by different threads,
// and two streams must not keep handing a chunk to each other.
inline constexpr double kChunkChoiceSlack = 1.25;

// For stream `self` (which is asking, so it has room whatever its view's
// `open` says) and a chunk of `bytes` (header included):
// * while no other warm stream is open, the lowest-index open stream takes
//   it, as in a connection's first transfer (a cold stream starts from the
//   initial window, so small objects stay on one stream, and a bulk
//   transfer engages the next stream only when the ones before it fill);
// * a cold stream never takes a chunk while a warm one is open;
// * among open warm streams, the one whose pacing finishes the chunk first,
//   (backlog + bytes) / pacing rate, takes it; the asking stream takes it if
//   it is within kChunkChoiceSlack of that. Where any of them has no
//   pacing rate, the lowest index takes it.
ChunkChoice ChooseChunkStream(std::span<const StreamView> streams, uint32_t self, uint64_t bytes);

}  // namespace tern::tcp

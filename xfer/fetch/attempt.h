// One connection's worth of a fetch: connect, GET (with the held version's
// bitmap, or a head window for a fresh copy), INFO or ERROR, WANT, then
// chunks landing in the part file and HASH/DONE, until the copy is complete
// and its whole-file hash known (protocol in docs/format/xfer.md).
//
// Contract: returns OK only when every chunk landed and the hash is known;
// else the attempt's error: the server's refusal as it sent it, kProtocol
// for a server breaking the protocol, kTimeout when no new chunk landed for
// stall_timeout_ms (or the hash did not follow the last chunk within that
// plus the file's size at 50 MB/s), kUnavailable for a lost connection.
// Every receive window it opened is closed and the head window unmapped
// before it returns. Blocks its caller; landing callbacks run on transport
// threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "tern/xfer.h"
#include "xfer/fetch/part_file.h"

namespace tern::xfer {

struct AttemptContext {
  Transport& transport;
  const std::string& address;
  const std::string& name;
  const FetchOptions& options;
  Clock& clock;
  PartFile& part;
  std::function<void()> report;  // called about every 250 ms
};

// What attempts of one run share.
struct AttemptLog {
  uint64_t last_window = 0;      // receive window ids used so far: a fresh one per window
  std::atomic<uint64_t> first_landed_us{0};  // 0 until a chunk landed in this run
  std::string link;              // Connection::Describe() of the last connection
};

Status RunAttempt(const AttemptContext& cx, AttemptLog& log);

}  // namespace tern::xfer

// A fault-injecting decorator over any Transport, seeded and deterministic:
// refuse connections, drop a connection after N bytes sent, delay sends,
// corrupt one byte of a chunk in flight (below the chunk checksum, so the
// receiver must detect it). It also plays an adversary the transport cannot
// see: a sender that rewrites chunk bytes and their checksum (tamper), or
// that rewrites, injects or drops messages (a man in the middle). Used by the
// conformance suite and by tests of the layers above that must survive these
// faults, or catch these lies themselves (the agent's signed chunk hashes).
//
// Thread safety: as transport.h. The inner transport must outlive this one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tern/export.h"
#include "tern/transport.h"

namespace tern {

struct FaultPolicy {
  uint64_t seed = 1;
  // Connect() fails for the first N attempts, with refuse_code
  // (kUnavailable: nobody answered; kAuth: as a TLS dial whose certificate
  // was refused, by either side).
  uint32_t refuse_connects = 0;
  Code refuse_code = Code::kUnavailable;
  // A connection made or accepted here is closed (kUnavailable) once more
  // than this many bytes (messages + chunks, sent and received) crossed it;
  // 0 = never. Applies to the first `drop_connections` connections that
  // carry traffic through this transport (refused, failed or unused
  // connections do not count), so a retry can succeed and the number of
  // drops a transfer sees does not depend on timing.
  uint64_t drop_after_bytes = 0;
  uint32_t drop_connections = 1;
  // Every send is held back this long before it reaches the inner backend.
  uint64_t delay_us = 0;
  // The chunk that carries byte number corrupt_at_byte (counted over all
  // chunk bytes sent through this transport) gets one seeded byte flipped in
  // flight; UINT64_MAX = never. Only the first such chunk.
  uint64_t corrupt_at_byte = UINT64_MAX;
  // A lying sender above the transport: the chunk that carries byte number
  // tamper_at_byte (counted as for corrupt_at_byte) gets one seeded byte
  // rewritten *and its XXH3 recomputed* over the rewritten bytes, so the
  // receiving transport accepts it; only a check above the transport (the
  // agent's signed SHA-256 per chunk) can catch it. The next
  // tamper_chunks - 1 chunks sent after it are rewritten too (one seeded
  // byte each; UINT32_MAX: every chunk from then on, a sender that keeps
  // lying; 0 counts as 1). UINT64_MAX = never.
  uint64_t tamper_at_byte = UINT64_MAX;
  uint32_t tamper_chunks = 1;
  // A man in the middle on the messages sent through this transport: each
  // is passed to it, and what it returns is sent instead, in order (none:
  // the message is dropped and its completion reports OK). Unset: messages
  // pass unchanged. Called on the sending thread, for every connection made
  // or accepted here; it must be thread safe.
  std::function<std::vector<std::string>(std::string message)> rewrite_message;
  // A host cut off without a word (its link gone, not its process): while
  // this returns true, connections made through this transport drop what
  // is sent or received on them (sends report OK) and ignore Close, so the
  // peers they were made to see silence, not a close, until this transport
  // is destroyed. Connections it accepted behave as usual (an agent that
  // stops closes them: its children see that at once). Checked on every
  // call; it must be thread safe. Unset: never.
  std::function<bool()> silence_made_connections;
};

// Counters for assertions in tests.
struct FaultStats {
  uint64_t refused = 0;
  uint64_t dropped = 0;
  uint64_t corrupted = 0;
  uint64_t tampered = 0;  // chunks rewritten with a matching checksum
};

class FaultTransport : public Transport {
 public:
  virtual FaultStats stats() const = 0;
};

TERN_EXPORT std::unique_ptr<FaultTransport> NewFaultTransport(Transport& inner, FaultPolicy policy);

}  // namespace tern

// A fault-injecting decorator over any Transport, seeded and deterministic:
// refuse connections, drop a connection after N bytes sent, delay sends,
// corrupt one byte of a chunk in flight (below the chunk checksum, so the
// receiver must detect it). Used by the conformance suite and by tests of the
// layers above that must survive these faults.
//
// Thread safety: as transport.h. The inner transport must outlive this one.
#pragma once

#include <cstdint>
#include <memory>

#include "tern/export.h"
#include "tern/transport.h"

namespace tern {

struct FaultPolicy {
  uint64_t seed = 1;
  // Connect() fails with kUnavailable for the first N attempts.
  uint32_t refuse_connects = 0;
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
};

// Counters for assertions in tests.
struct FaultStats {
  uint64_t refused = 0;
  uint64_t dropped = 0;
  uint64_t corrupted = 0;
};

class FaultTransport : public Transport {
 public:
  virtual FaultStats stats() const = 0;
};

TERN_EXPORT std::unique_ptr<FaultTransport> NewFaultTransport(Transport& inner, FaultPolicy policy);

}  // namespace tern

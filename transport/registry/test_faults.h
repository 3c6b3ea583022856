// TEST ONLY: a FaultPolicy (include/tern/fault_transport.h) from text, for
// process-level tests that cannot build one in code: tern-agent wraps its
// transport with it when TERN_TEST_FAULTS is set, so that the soak
// (tests/soak/soak.py, docs/soak.md) can make a relay corrupt or rewrite the
// chunks it forwards the way the in-process tests do. Public entry point:
// NewTestFaultTransport (include/tern/transport_registry.h).
//
// Syntax: comma-separated KEY=VALUE, every value a plain decimal u64:
//   seed, corrupt_at_byte, tamper_at_byte, tamper_chunks,
//   drop_after_bytes, drop_connections
// (the FaultPolicy fields of the same names). Anything else is refused, so a
// typo fails the start instead of silently injecting nothing.
#pragma once

#include <string_view>

#include "tern/fault_transport.h"
#include "tern/status.h"

namespace tern::transport_internal {

Result<FaultPolicy> ParseFaultPolicy(std::string_view text);

}  // namespace tern::transport_internal

// The TCP backend: N parallel streams per connection with chunks striped over
// them (in a connection's first transfer stream k takes chunks only while
// streams 0..k-1 are full; once warm, each chunk goes to the stream whose
// pacing finishes it first), autotuned socket buffers, BBR when the kernel
// has it, an XXH3-64 checksum
// and an acknowledgement per chunk, and optional TLS 1.3 with mutual
// authentication. Wire format: docs/format/tcp.md.
//
// Each stream has one I/O thread (non-blocking socket + poll), so threads are
// bounded by streams x connections, and both are capped (max_streams,
// max_connections). Every wait is bounded: connect, handshake, header and
// idle timeouts.
//
// Thread safety: as transport.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/export.h"
#include "tern/transport.h"
#include "tern/transport_options.h"  // TcpOptions, UcxOptions, VerbsOptions

namespace tern {

// Fails (kInvalidArgument / kIo) when TLS is enabled and the files do not
// load, or a name or fingerprint in TlsConfig is malformed.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewTcpTransport(TcpOptions options,
                                                              Clock& clock = SteadyClock());

}  // namespace tern

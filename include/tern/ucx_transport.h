// The UCX backend (ucp API): one UCX context and one worker per Transport,
// driven by one progress thread; connections are UCX client/server
// endpoints. Messages travel as active messages (sequence-numbered, so the
// receiver delivers them in send order even when large ones take UCX's
// rendezvous path); a chunk is an active message whose data UCX moves by
// rendezvous (zero-copy, RDMA where the fabric has it) straight into the
// posted window, then checksummed and acknowledged; Write is ucp_put_nbx into
// a region the peer exported with ExportRegion. Design:
// docs/transport-rdma.md; wire protocol: docs/format/ucx.md.
//
// UCX picks its transports at run time (tcp, shared memory, cma, verbs, cuda
// where built and present). UcxOptions::tls / net_devices restrict them for
// this context only (the process environment is not touched): tests use
// tls = "tcp" or "sm,self,tcp" (shared memory for data, UCX's tcp connection
// manager for setup) with net_devices = "lo" so nothing binds beyond
// loopback.
//
// Memory: kCuda regions are accepted only when this UCX build reports CUDA
// memory support (probed at run time); they may be exported and written with
// Write, while chunks must come from and land in host memory (the checksum is
// computed on the host).
//
// Close() from outside this transport's callbacks is synchronous, as
// transport.h asks: it sends a bye, waits for the peer's answer (or its
// disconnect), lets rendezvous receives in flight finish, and returns once
// UCX has closed the endpoint; pending work has completed and on_closed has
// fired by then. Each stage is bounded (about 2 s in all); past that Close
// logs and returns. Called from a callback on the progress thread it cannot
// wait, and the close finishes behind it. Completions of pending work are
// held until UCX has let go of the endpoint, so a failed chunk's source may
// be freed as soon as its completion fires.
//
// CancelReceive from another thread waits (bounded by op_timeout_ms) for a
// chunk landing in that window. Called from one of this transport's
// callbacks it cannot wait: a rendezvous chunk already landing may still
// write its bytes into the window after return (on_landed is not called and
// the sender gets kNotFound), so keep the memory until on_closed or a later
// callback.
//
// Every wait is bounded: connect, handshake and per-operation timeouts; a
// connection whose peer stops answering ends with kTimeout.
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

// kUnavailable with UCX's reason when the context or worker cannot be made.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewUcxTransport(UcxOptions options,
                                                              Clock& clock = SteadyClock());

}  // namespace tern

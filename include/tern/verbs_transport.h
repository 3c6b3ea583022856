// The raw-verbs backend: libibverbs reliable-connected (RC) queue pairs,
// one per connection, brought up over a small TCP side channel.
//
//  * Messages and control travel as SEND/RECV into pre-posted receive
//    buffers, with credit-based flow control (a SEND is only posted when the
//    peer has a receive posted for it, so the link never depends on
//    receiver-not-ready retries).
//  * Chunks are PULLED: the sender announces a chunk (source address, rkey,
//    length, XXH3-64) and the receiver, which owns its windows, checks the
//    window and range and issues an RDMA READ straight into the window, then
//    verifies the checksum and acknowledges. So refusals (kNotFound,
//    kOutOfRange, kCorrupt) are decided where the window lives, and
//    CancelReceive only has to wait for reads this side started.
//  * Write (kCapOneSidedWrite) is an RDMA WRITE into a region the peer
//    exported; it completes when the peer's NIC acknowledged it.
//  * The side channel stays open: its close without a bye tells a peer died
//    at once, instead of at the next RDMA retry timeout.
// Wire protocol: docs/format/verbs.md.
//
// libibverbs is dlopen()ed at run time (VerbsOptions::library), so binaries
// start on machines without RDMA; NewVerbsTransport fails with kUnavailable
// and the probe's reason where there is no usable device. Tests run the same
// code against softverbs (transport/verbs/soft), an emulated in-process
// device with libibverbs' ABI.
//
// Trust: every region registered with this transport is readable and
// writable by connected peers that learn its rkey (a chunk announcement or
// ExportRegion hands one out); no encryption. Use it inside one cluster's
// trust domain; across clusters the agent's edges run on its main
// transport, TCP with TLS (docs/agent.md, "Transport per edge").
//
// Close() and CancelReceive() from outside this transport's callbacks are
// synchronous as transport.h asks (the queue pair is moved to the error
// state and every posted work request flushed before Close returns).
// CancelReceive called from one of this transport's callbacks cannot wait:
// a read already landing may still write the window after return.
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

// kUnavailable with the reason when the library, a device or an active port
// is missing.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewVerbsTransport(VerbsOptions options,
                                                                Clock& clock = SteadyClock());

}  // namespace tern

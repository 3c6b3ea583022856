// Bringing an RC queue pair up, as pure functions of the exchanged
// endpoints (so they are tested without a device), and the link state
// machine every verbs connection follows:
//
//   kIdle -> kInit (QP created, moved to INIT, our endpoint sent over the
//                   TCP side channel)
//         -> kReadyToReceive (peer's endpoint received, QP at RTR)
//         -> kReadyToSend (QP at RTS)
//         -> kOpen (hello over SEND/RECV acknowledged)
//         -> kDraining (bye sent or received; sends refused, acks still land)
//         -> kClosed
// Any state may fail into kError, which only moves on to kClosed.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "tern/status.h"
#include "transport/verbs/wire.h"

namespace tern::verbs {

struct QpTransition {
  ibv_qp_attr attr{};
  int mask = 0;
};

// RESET -> INIT: port, pkey 0, and the remote access the peer's WRITE WITH
// IMM needs (remote write; local write for receives).
QpTransition InitTransition(uint8_t port);
// INIT -> RTR: the peer's QP number and PSN, path MTU = min of both sides,
// and its address: LID on InfiniBand, GRH with the peer's GID on RoCE.
// kMismatch when the link layers differ.
Result<QpTransition> ReadyToReceiveTransition(const QpEndpoint& local, const QpEndpoint& remote);
// RTR -> RTS: our PSN and bounded retries (a dead peer ends in an error
// completion, not a hang: timeout 14 = 67 ms x retry_cnt 7).
QpTransition ReadyToSendTransition(const QpEndpoint& local);

enum class LinkState { kIdle, kInit, kReadyToReceive, kReadyToSend, kOpen, kDraining, kClosed, kError };
enum class LinkEvent { kQpInit, kQpRtr, kQpRts, kHelloDone, kBye, kDrained, kFailure };

const char* LinkStateName(LinkState state);
// The next state, or kInternal naming the illegal step (our bug or a peer's
// message out of order; the caller closes the link either way).
Result<LinkState> Step(LinkState state, LinkEvent event);

}  // namespace tern::verbs

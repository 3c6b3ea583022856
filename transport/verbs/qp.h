// Bringing an RC queue pair up, as pure functions of the exchanged
// endpoints (so they are tested without a device), and the link state
// machine every verbs connection follows:
//
//   kIdle -> kInit (QP created, moved to INIT, our endpoint sent over the
//                   TCP side channel)
//         -> kReadyToReceive (peer's endpoint received, QP at RTR)
//         -> kReadyToSend (QP at RTS)
//         -> kOpen (the dialler's ready crossed the side channel)
//         -> kDraining (bye sent or received, also from kReadyToSend when a
//                       connection is closed inside on_accept/ConnectDone)
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

// RESET -> INIT: port, pkey 0, and the remote access the peer needs: READ
// (it pulls the chunks we announce) and WRITE (one-sided Write into a
// region we exported); local write for receives.
QpTransition InitTransition(uint8_t port);
// INIT -> RTR: the peer's QP number and PSN, path MTU = min of both sides,
// and its address: LID on InfiniBand, GRH with the peer's GID on RoCE.
// kMismatch when the link layers differ.
// max_dest_rd_atomic: RDMA READs the peer may have in flight against us.
Result<QpTransition> ReadyToReceiveTransition(const QpEndpoint& local, const QpEndpoint& remote,
                                              uint8_t max_dest_rd_atomic = 1);
// RTR -> RTS: our PSN and bounded retries (a dead peer ends in an error
// completion, not a hang: timeout 14 = 67 ms x retry_cnt 7).
// max_rd_atomic: RDMA READs we may have in flight (the device's
// max_qp_init_rd_atom bounds it).
QpTransition ReadyToSendTransition(const QpEndpoint& local, uint8_t max_rd_atomic = 1);

enum class LinkState { kIdle, kInit, kReadyToReceive, kReadyToSend, kOpen, kDraining, kClosed, kError };
enum class LinkEvent { kQpInit, kQpRtr, kQpRts, kHelloDone, kBye, kDrained, kFailure };

const char* LinkStateName(LinkState state);
// The next state, or kInternal naming the illegal step (our bug or a peer's
// message out of order; the caller closes the link either way).
Result<LinkState> Step(LinkState state, LinkEvent event);

}  // namespace tern::verbs

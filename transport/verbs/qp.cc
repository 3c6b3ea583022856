#include "transport/verbs/qp.h"

#include "transport/verbs/ibv_api.h"

#include <algorithm>
#include <cstring>

namespace tern::verbs {

QpTransition InitTransition(uint8_t port) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = port;
  t.attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

Result<QpTransition> ReadyToReceiveTransition(const QpEndpoint& local, const QpEndpoint& remote,
                                              uint8_t max_dest_rd_atomic) {
  TERN_REQUIRE(local.ethernet == remote.ethernet, kMismatch, "verbs: link layers differ (local ",
               local.ethernet ? "RoCE" : "InfiniBand", ", peer ", remote.ethernet ? "RoCE" : "InfiniBand",
               ")");
  TERN_ASSIGN_OR_RETURN(ibv_mtu mtu, MtuFromBytes(std::min(local.mtu_bytes, remote.mtu_bytes)));
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = mtu;
  t.attr.dest_qp_num = remote.qpn;
  t.attr.rq_psn = remote.psn;
  t.attr.max_dest_rd_atomic = std::max<uint8_t>(max_dest_rd_atomic, 1);
  t.attr.min_rnr_timer = 12;  // 0.64 ms between receiver-not-ready retries
  t.attr.ah_attr.port_num = local.port;
  t.attr.ah_attr.sl = 0;
  if (remote.ethernet) {
    t.attr.ah_attr.is_global = 1;
    std::memcpy(t.attr.ah_attr.grh.dgid.raw, remote.gid, 16);
    t.attr.ah_attr.grh.sgid_index = local.gid_index;
    t.attr.ah_attr.grh.hop_limit = 64;
  } else {
    t.attr.ah_attr.dlid = remote.lid;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition ReadyToSendTransition(const QpEndpoint& local, uint8_t max_rd_atomic) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.sq_psn = local.psn;
  t.attr.timeout = 14;
  t.attr.retry_cnt = 7;
  t.attr.rnr_retry = 7;
  t.attr.max_rd_atomic = std::max<uint8_t>(max_rd_atomic, 1);
  t.mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

const char* LinkStateName(LinkState state) {
  switch (state) {
    case LinkState::kIdle: return "idle";
    case LinkState::kInit: return "init";
    case LinkState::kReadyToReceive: return "rtr";
    case LinkState::kReadyToSend: return "rts";
    case LinkState::kOpen: return "open";
    case LinkState::kDraining: return "draining";
    case LinkState::kClosed: return "closed";
    case LinkState::kError: return "error";
  }
  return "?";
}

Result<LinkState> Step(LinkState s, LinkEvent e) {
  using S = LinkState;
  using E = LinkEvent;
  if (e == E::kFailure) {
    if (s != S::kClosed) return S::kError;
  } else if (e == E::kDrained) {
    if (s == S::kDraining || s == S::kError) return S::kClosed;
  } else if (e == E::kBye) {
    if (s == S::kReadyToSend || s == S::kOpen || s == S::kDraining) return S::kDraining;
  } else {
    struct Edge {
      S from;
      E on;
      S to;
    };
    static constexpr Edge kEdges[] = {
        {S::kIdle, E::kQpInit, S::kInit},
        {S::kInit, E::kQpRtr, S::kReadyToReceive},
        {S::kReadyToReceive, E::kQpRts, S::kReadyToSend},
        {S::kReadyToSend, E::kHelloDone, S::kOpen},
    };
    for (const Edge& edge : kEdges) {
      if (edge.from == s && edge.on == e) return edge.to;
    }
  }
  return TERN_ERROR(kInternal, "verbs link: event ", static_cast<int>(e), " not allowed in state ",
                    LinkStateName(s));
}

}  // namespace tern::verbs

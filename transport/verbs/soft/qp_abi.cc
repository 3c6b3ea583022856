// Queue pairs: create, the RC state machine with the attribute masks real
// drivers require, destroy, posting (the ops behind ibv_post_send and
// ibv_post_recv), and the break-the-link knob. Execution is fabric.cc's.
#include <cstring>

#include "transport/verbs/soft/abi.h"

namespace tern::softverbs {
namespace {

// Attribute masks per (current, next) state of an RC QP, as the kernel's
// ib_modify_qp_is_ok() has them.
struct Rule {
  ibv_qp_state from, to;
  int required, optional;
};
constexpr int kPathOpt = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
constexpr Rule kRules[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | kPathOpt},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | kPathOpt},
};

int CheckAttrs(const ibv_qp_attr& a, int mask, bool roce) {
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a.qp_access_flags & ~kKnownAccess) != 0) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_PORT) && a.port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096))
    return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return EINVAL;
  if (mask & IBV_QP_AV) {
    if (a.ah_attr.port_num != 1) return EINVAL;
    // RoCE routes by GID: an address vector without a GRH is refused.
    if (roce && (!a.ah_attr.is_global || a.ah_attr.grh.sgid_index != 0)) return EINVAL;
    if (a.ah_attr.is_global && a.ah_attr.grh.sgid_index != 0) return EINVAL;
  }
  return 0;
}

constexpr int kAllMaskBits = (1 << 21) - 1;

bool ValidSges(const ibv_sge* list, int n) { return n == 0 || list != nullptr; }

}  // namespace

int PostSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Fabric& f = TheFabric();
  Qp* qp = QpOf(ibqp);
  std::lock_guard<std::mutex> lock(f.mu);
  int err = 0;
  for (; wr != nullptr; wr = wr->next) {
    const ibv_qp_state st = qp->state;
    if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
      err = EINVAL;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge ||
        !ValidSges(wr->sg_list, wr->num_sge)) {
      err = EINVAL;
      break;
    }
    switch (wr->opcode) {
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_IMM:
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
      case IBV_WR_RDMA_READ:
        break;
      default:
        err = EINVAL;
        break;  // atomics, MW, TSO, ...: not emulated
    }
    if (err != 0) break;
    if (qp->sq_used >= qp->cap.max_send_wr) {
      err = ENOMEM;
      break;
    }
    SendWqe w;
    w.wr_id = wr->wr_id;
    w.opcode = wr->opcode;
    w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
    w.imm = wr->imm_data;
    w.remote_addr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    if (wr->send_flags & IBV_SEND_INLINE) {
      if (wr->opcode == IBV_WR_RDMA_READ) {
        err = EINVAL;
        break;
      }
      uint64_t total = 0;
      for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
      if (total > qp->cap.max_inline_data) {
        err = EINVAL;
        break;
      }
      // Inline data is read at post time: the buffer may be reused at once.
      w.is_inline = true;
      w.inline_data.resize(total);
      size_t at = 0;
      for (int i = 0; i < wr->num_sge; ++i) {
        if (wr->sg_list[i].length == 0) continue;
        std::memcpy(w.inline_data.data() + at, reinterpret_cast<const void*>(wr->sg_list[i].addr),
                    wr->sg_list[i].length);
        at += wr->sg_list[i].length;
      }
    } else {
      for (int i = 0; i < wr->num_sge; ++i) {
        w.sges.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
      }
    }
    qp->sq.push_back(std::move(w));
    ++qp->sq_used;
  }
  if (err != 0 && bad_wr != nullptr) *bad_wr = wr;
  f.Wake();
  return err;
}

int PostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Fabric& f = TheFabric();
  Qp* qp = QpOf(ibqp);
  std::lock_guard<std::mutex> lock(f.mu);
  int err = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET) {
      err = EINVAL;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge ||
        !ValidSges(wr->sg_list, wr->num_sge)) {
      err = EINVAL;
      break;
    }
    if (qp->rq_used >= qp->cap.max_recv_wr) {
      err = ENOMEM;
      break;
    }
    RecvWqe r;
    r.wr_id = wr->wr_id;
    for (int i = 0; i < wr->num_sge; ++i) {
      r.sges.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
    }
    qp->rq.push_back(std::move(r));
    ++qp->rq_used;
  }
  if (err != 0 && bad_wr != nullptr) *bad_wr = wr;
  f.Wake();
  return err;
}

}  // namespace tern::softverbs

using namespace tern::softverbs;

SOFTVERBS_EXPORT ibv_qp* ibv_create_qp(ibv_pd* ibpd, ibv_qp_init_attr* init) {
  if (ibpd == nullptr || init == nullptr) return Fail<ibv_qp>(EINVAL);
  if (init->qp_type != IBV_QPT_RC || init->srq != nullptr) return Fail<ibv_qp>(EINVAL);
  if (init->send_cq == nullptr || init->recv_cq == nullptr) return Fail<ibv_qp>(EINVAL);
  const ibv_qp_cap& cap = init->cap;
  if (cap.max_send_wr > kMaxQpWr || cap.max_recv_wr > kMaxQpWr || cap.max_send_sge > kMaxSge ||
      cap.max_recv_sge > kMaxSge || cap.max_inline_data > kMaxInlineBytes) {
    return Fail<ibv_qp>(EINVAL);
  }
  auto* qp = new (std::nothrow) Qp{};
  if (qp == nullptr) return Fail<ibv_qp>(ENOMEM);
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Pd* pd = PdOf(ibpd);
  qp->qp.context = pd->pd.context;
  qp->qp.qp_context = init->qp_context;
  qp->qp.pd = ibpd;
  qp->qp.send_cq = init->send_cq;
  qp->qp.recv_cq = init->recv_cq;
  qp->qp.qp_num = f.NewQpnLocked();
  qp->qp.handle = qp->qp.qp_num;
  qp->qp.state = IBV_QPS_RESET;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->pd = pd;
  qp->send_cq = CqOf(init->send_cq);
  qp->recv_cq = CqOf(init->recv_cq);
  qp->cap = cap;  // exactly what was asked (real providers may round up)
  qp->sq_sig_all = init->sq_sig_all != 0;
  ++qp->send_cq->qps;
  ++qp->recv_cq->qps;
  ++pd->users;
  ++CtxOf(qp->qp.context)->objects;
  f.qps[qp->qp.qp_num] = qp;
  return &qp->qp;
}

SOFTVERBS_EXPORT int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  if (ibqp == nullptr || attr == nullptr) return EINVAL;
  if ((mask & ~kAllMaskBits) != 0) return EINVAL;
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Qp* qp = QpOf(ibqp);
  const ibv_qp_state cur = qp->state;
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    if ((mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE)) != 0) return EINVAL;
    if (next == IBV_QPS_RESET) {
      f.PurgeLocked(qp);
      qp->state = qp->qp.state = IBV_QPS_RESET;
    } else {
      f.MoveToErrorLocked(qp);
      qp->qp.state = IBV_QPS_ERR;
    }
    return 0;
  }
  const Rule* rule = nullptr;
  for (const Rule& r : kRules) {
    if (r.from == cur && r.to == next) rule = &r;
  }
  if (rule == nullptr) return EINVAL;
  const int extra = mask & ~(IBV_QP_STATE | rule->required | rule->optional);
  if ((mask & rule->required) != rule->required || extra != 0) return EINVAL;
  f.ReadEnvLocked();
  if (const int err = CheckAttrs(*attr, mask, f.roce); err != 0) return err;

  if (mask & IBV_QP_ACCESS_FLAGS) qp->access = attr->qp_access_flags;
  if (mask & IBV_QP_AV) qp->ah = attr->ah_attr;
  if (mask & IBV_QP_PATH_MTU) qp->path_mtu = attr->path_mtu;
  if (mask & IBV_QP_DEST_QPN) qp->dest_qpn = attr->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) qp->rq_psn = attr->rq_psn & 0xffffff;
  if (mask & IBV_QP_SQ_PSN) qp->sq_psn = attr->sq_psn & 0xffffff;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp->max_rd_atomic = attr->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) qp->min_rnr_timer = attr->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) qp->timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) qp->retry_cnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) qp->rnr_retry = attr->rnr_retry;
  qp->state = qp->qp.state = next;
  f.Wake();
  return 0;
}

SOFTVERBS_EXPORT int ibv_destroy_qp(ibv_qp* ibqp) {
  Fabric& f = TheFabric();
  std::unique_lock<std::mutex> lock(f.mu);
  f.WaitIdleLocked(lock);
  Qp* qp = QpOf(ibqp);
  f.PurgeLocked(qp);
  f.qps.erase(qp->qp.qp_num);
  --qp->send_cq->qps;
  --qp->recv_cq->qps;
  --qp->pd->users;
  --CtxOf(qp->qp.context)->objects;
  delete qp;
  return 0;
}

SOFTVERBS_EXPORT int tern_softverbs_break_qp(uint32_t qpn) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Qp* qp = f.FindQpLocked(qpn);
  if (qp == nullptr) return ENOENT;
  if (qp->state != IBV_QPS_RESET) f.MoveToErrorLocked(qp);
  return 0;
}

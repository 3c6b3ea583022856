// The fabric worker: executes each RTS queue pair's send queue in order, as
// an RC requester and responder would, and posts the completions.
#include "transport/verbs/soft/fabric.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tern::softverbs {

namespace {

constexpr auto kRnrWait = std::chrono::milliseconds(1);
constexpr auto kRetryPoll = std::chrono::milliseconds(2);

// One memcpy of a WR's data, prepared under the lock.
struct Span {
  uint8_t* dst;
  const uint8_t* src;
  size_t bytes;
};

bool InRange(uint64_t addr, uint64_t bytes, const ibv_mr& mr) {
  const uint64_t base = reinterpret_cast<uintptr_t>(mr.addr);
  return addr >= base && bytes <= mr.length && addr - base <= mr.length - bytes;
}

// Every SGE inside an MR of `pd` with that lkey (and local write access when
// the data lands there).
bool LocalSgesOk(const Fabric& f, const std::vector<Sge>& sges, const Pd* pd, bool writes) {
  for (const Sge& s : sges) {
    auto it = f.lkeys.find(s.lkey);
    if (it == f.lkeys.end()) return false;
    const Mr* mr = it->second;
    if (reinterpret_cast<const Pd*>(mr->mr.pd) != pd) return false;
    if (!InRange(s.addr, s.length, mr->mr)) return false;
    if (writes && (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0) return false;
  }
  return true;
}

// The responder's MR for [addr, addr+bytes) with `need` access, or null.
const Mr* RemoteMr(const Fabric& f, const Qp* dst, uint32_t rkey, uint64_t addr, uint64_t bytes,
                   int need) {
  auto it = f.rkeys.find(rkey);
  if (it == f.rkeys.end()) return nullptr;
  const Mr* mr = it->second;
  if (reinterpret_cast<const Pd*>(mr->mr.pd) != dst->pd) return nullptr;
  if ((mr->access & need) != need || (static_cast<int>(dst->access) & need) != need) return nullptr;
  if (!InRange(addr, bytes, mr->mr)) return nullptr;
  return mr;
}

// Pairs a gather list with a scatter list into memcpy spans.
void Pair(const std::vector<std::pair<const uint8_t*, size_t>>& from,
          const std::vector<std::pair<uint8_t*, size_t>>& to, std::vector<Span>* out) {
  size_t fi = 0, fo = 0, ti = 0, to_off = 0;
  while (fi < from.size() && ti < to.size()) {
    const size_t n = std::min(from[fi].second - fo, to[ti].second - to_off);
    if (n > 0) out->push_back({to[ti].first + to_off, from[fi].first + fo, n});
    fo += n;
    to_off += n;
    if (fo == from[fi].second) ++fi, fo = 0;
    if (to_off == to[ti].second) ++ti, to_off = 0;
  }
}

std::vector<std::pair<const uint8_t*, size_t>> Gather(const SendWqe& w) {
  std::vector<std::pair<const uint8_t*, size_t>> out;
  if (w.is_inline) {
    out.emplace_back(w.inline_data.data(), w.inline_data.size());
  } else {
    for (const Sge& s : w.sges)
      out.emplace_back(reinterpret_cast<const uint8_t*>(s.addr), s.length);
  }
  return out;
}

std::vector<std::pair<uint8_t*, size_t>> Scatter(const std::vector<Sge>& sges) {
  std::vector<std::pair<uint8_t*, size_t>> out;
  for (const Sge& s : sges) out.emplace_back(reinterpret_cast<uint8_t*>(s.addr), s.length);
  return out;
}

ibv_wc ErrorWc(uint64_t wr_id, uint32_t qpn, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = kPoisonOpcode;
  wc.qp_num = qpn;
  return wc;
}

ibv_wc_opcode SendOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    default:
      return IBV_WC_SEND;
  }
}

}  // namespace

uint64_t SendWqe::Bytes() const {
  if (is_inline) return inline_data.size();
  uint64_t n = 0;
  for (const Sge& s : sges) n += s.length;
  return n;
}

void Fabric::ReadEnvLocked() {
  const char* link = std::getenv("TERN_SOFTVERBS_LINK");
  roce = link != nullptr && std::strcmp(link, "roce") == 0;
  retry_timeout = std::chrono::milliseconds(100);
  const char* retry = std::getenv("TERN_SOFTVERBS_RETRY_MS");
  if (retry != nullptr && *retry != '\0') {
    char* end = nullptr;
    const unsigned long ms = std::strtoul(retry, &end, 10);
    if (*end == '\0' && ms > 0 && ms <= 600000) retry_timeout = std::chrono::milliseconds(ms);
  }
}

ibv_gid PortGid(bool roce) {
  ibv_gid gid{};
  if (roce) {
    gid.raw[10] = 0xff, gid.raw[11] = 0xff;
    gid.raw[12] = 127, gid.raw[15] = 1;
  } else {
    gid.raw[0] = 0xfe, gid.raw[1] = 0x80;
    const uint8_t guid[8] = {0x02, 0x74, 0x65, 0x72, 0x6e, 0x00, 0x00, 0x01};  // "tern"
    std::memcpy(gid.raw + 8, guid, 8);
  }
  return gid;
}

Fabric& TheFabric() {
  static Fabric fabric;
  return fabric;
}

Fabric::Fabric() {
  device_.node_type = IBV_NODE_CA;
  device_.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(device_.name, sizeof(device_.name), "tern_soft0");
  std::snprintf(device_.dev_name, sizeof(device_.dev_name), "uverbs_tern0");
  std::snprintf(device_.dev_path, sizeof(device_.dev_path),
                "/sys/class/infiniband_verbs/uverbs_tern0");
  std::snprintf(device_.ibdev_path, sizeof(device_.ibdev_path), "/sys/class/infiniband/tern_soft0");
}

Fabric::~Fabric() {
  // Library unload with contexts still open (a leak in the caller): the
  // worker must not outlive the code it runs.
  std::lock_guard<std::mutex> life(life_mu_);
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }
}

void Fabric::AddContext() {
  std::lock_guard<std::mutex> life(life_mu_);
  if (contexts_++ == 0) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_ = false;
    }
    worker_ = std::thread([this] { Run(); });
  }
}

void Fabric::RemoveContext() {
  std::lock_guard<std::mutex> life(life_mu_);
  if (--contexts_ == 0) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }
}

uint32_t Fabric::NewQpnLocked() {
  for (;;) {
    const uint32_t qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & 0xffffff;
    if (next_qpn_ < 0x100) next_qpn_ = 0x100;  // low numbers are special (QP0/1)
    if (qps.count(qpn) == 0) return qpn;
  }
}

Qp* Fabric::FindQpLocked(uint32_t qpn) {
  auto it = qps.find(qpn);
  return it == qps.end() ? nullptr : it->second;
}

void Fabric::MoveToErrorLocked(Qp* qp) {
  qp->state = IBV_QPS_ERR;
  qp->head_blocked = false;
  work_cv_.notify_all();
}

void Fabric::PurgeLocked(Qp* qp) {
  qp->sq.clear();
  qp->rq.clear();
  qp->sq_used = qp->rq_used = qp->unsignaled_done = 0;
  qp->head_blocked = false;
  for (Cq* cq : {qp->send_cq, qp->recv_cq}) {
    if (cq == nullptr) continue;
    std::erase_if(cq->entries, [&](const Completion& c) { return c.wc.qp_num == qp->qp.qp_num; });
  }
}

void Fabric::WaitIdleLocked(std::unique_lock<std::mutex>& lock) {
  idle_cv_.wait(lock, [this] { return !copying_; });
}

bool Fabric::HasWorkLocked(const Qp& qp) const {
  if (qp.state == IBV_QPS_ERR) return !qp.sq.empty() || !qp.rq.empty();
  return qp.state == IBV_QPS_RTS && !qp.sq.empty();
}

void Fabric::PushLocked(Cq* cq, const Completion& c) {
  if (cq->entries.size() >= static_cast<size_t>(cq->cq.cqe)) {
    ++stats.cq_overruns;
    if (!cq->overrun) {
      std::fprintf(stderr,
                   "softverbs: CQ %p overrun (%d entries not polled): completion of QP 0x%x "
                   "dropped; every QP on this CQ moves to ERR\n",
                   static_cast<void*>(&cq->cq), cq->cq.cqe, c.wc.qp_num);
    }
    cq->overrun = true;
    for (auto& [qpn, qp] : qps) {
      if ((qp->send_cq == cq || qp->recv_cq == cq) && qp->state != IBV_QPS_RESET) {
        MoveToErrorLocked(qp);
      }
    }
    return;
  }
  cq->entries.push_back(c);
  if (cq->armed && cq->channel != nullptr) {
    cq->armed = false;
    cq->channel->events.push_back(cq);
    const uint64_t one = 1;
    if (write(cq->channel->ch.fd, &one, sizeof(one)) != sizeof(one)) {
      std::fprintf(stderr, "softverbs: cannot signal completion channel fd %d\n",
                   cq->channel->ch.fd);
    }
  }
}

void Fabric::CompleteSendLocked(Qp* qp, const SendWqe& w, ibv_wc_status status, uint32_t byte_len) {
  const bool signaled = w.signaled || qp->sq_sig_all || status != IBV_WC_SUCCESS;
  if (!signaled) {
    ++qp->unsignaled_done;
    return;
  }
  Completion c;
  c.wc = ErrorWc(w.wr_id, qp->qp.qp_num, status);
  if (status == IBV_WC_SUCCESS) {
    c.wc.opcode = SendOpcode(w.opcode);
    c.wc.byte_len = byte_len;
  }
  c.send_slots = 1 + qp->unsignaled_done;
  qp->unsignaled_done = 0;
  PushLocked(qp->send_cq, c);
}

void Fabric::FlushLocked(Qp* qp) {
  while (!qp->sq.empty()) {
    SendWqe w = std::move(qp->sq.front());
    qp->sq.pop_front();
    CompleteSendLocked(qp, w, IBV_WC_WR_FLUSH_ERR, 0);
  }
  while (!qp->rq.empty()) {
    Completion c;
    c.wc = ErrorWc(qp->rq.front().wr_id, qp->qp.qp_num, IBV_WC_WR_FLUSH_ERR);
    c.recv_slots = 1;
    qp->rq.pop_front();
    PushLocked(qp->recv_cq, c);
  }
}

bool Fabric::ReachableLocked(const Qp* qp, const Qp* dst) const {
  if (dst == nullptr) return false;
  if (dst->state != IBV_QPS_RTR && dst->state != IBV_QPS_RTS) return false;
  if (dst->dest_qpn != qp->qp.qp_num) return false;
  // Packets carry our PSN; a responder expecting another sequence NAKs them.
  if (dst->rq_psn != qp->sq_psn) return false;
  // Both address vectors must name this port (the only one on the fabric).
  for (const Qp* q : {qp, dst}) {
    if (roce) {
      const ibv_gid gid = PortGid(true);
      if (!q->ah.is_global || std::memcmp(q->ah.grh.dgid.raw, gid.raw, 16) != 0) return false;
    } else if (q->ah.dlid != kPortLid) {
      return false;
    }
  }
  return true;
}

bool Fabric::StepHeadLocked(std::unique_lock<std::mutex>& lock, Qp* qp) {
  const SendWqe& head = qp->sq.front();
  const auto now = Clock::now();
  const auto fail = [&](ibv_wc_status status) {
    SendWqe w = std::move(qp->sq.front());
    qp->sq.pop_front();
    qp->head_blocked = false;
    MoveToErrorLocked(qp);
    CompleteSendLocked(qp, w, status, 0);
    return true;
  };

  Qp* dst = FindQpLocked(qp->dest_qpn);
  if (!ReachableLocked(qp, dst)) {
    if (qp->head_blocked && now - qp->head_since >= retry_timeout) {
      ++stats.retries_exceeded;
      return fail(IBV_WC_RETRY_EXC_ERR);
    }
    if (!qp->head_blocked) {
      qp->head_blocked = true;
      qp->head_since = now;
    }
    qp->next_try = now + kRetryPoll;
    return false;
  }
  const bool is_read = head.opcode == IBV_WR_RDMA_READ;
  const bool is_send = head.opcode == IBV_WR_SEND || head.opcode == IBV_WR_SEND_WITH_IMM;
  const bool consumes_recv = is_send || head.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const uint64_t bytes = head.Bytes();
  if (bytes > kMaxMessageBytes) return fail(IBV_WC_LOC_LEN_ERR);
  if (!head.is_inline && !LocalSgesOk(*this, head.sges, qp->pd, is_read))
    return fail(IBV_WC_LOC_PROT_ERR);
  if (is_read && qp->max_rd_atomic == 0) {
    std::fprintf(stderr, "softverbs: RDMA READ on QP 0x%x whose max_rd_atomic is 0\n",
                 qp->qp.qp_num);
    return fail(IBV_WC_LOC_QP_OP_ERR);
  }
  if (!is_send) {
    if (is_read && dst->max_dest_rd_atomic == 0) return fail(IBV_WC_REM_INV_REQ_ERR);
    // A zero-length RDMA operation carries no key to check (as on HW).
    if (bytes > 0 &&
        RemoteMr(*this, dst, head.rkey, head.remote_addr, bytes,
                 is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE) == nullptr) {
      return fail(IBV_WC_REM_ACCESS_ERR);
    }
  }
  if (consumes_recv && dst->rq.empty()) {
    // Receiver not ready: retried after the RNR timer, forever at rnr_retry 7.
    ++stats.rnr_waits;
    if (!qp->head_blocked) {
      qp->head_blocked = true;
      qp->head_since = now;
      qp->rnr_attempts = 0;
    } else if (++qp->rnr_attempts > qp->rnr_retry && qp->rnr_retry != 7) {
      return fail(IBV_WC_RNR_RETRY_EXC_ERR);
    }
    qp->next_try = now + kRnrWait;
    return false;
  }
  qp->head_blocked = false;

  // The WR runs: take it (and the receive it consumes) off the queues before
  // the lock may be dropped for the copy. `head` dangles from here on.
  SendWqe w = std::move(qp->sq.front());
  qp->sq.pop_front();
  RecvWqe recv;
  if (consumes_recv) {
    recv = std::move(dst->rq.front());
    dst->rq.pop_front();
  }
  if (is_send) {
    uint64_t room = 0;
    for (const Sge& s : recv.sges) room += s.length;
    const auto fail_both = [&](ibv_wc_status responder, ibv_wc_status requester) {
      Completion c;
      c.wc = ErrorWc(recv.wr_id, dst->qp.qp_num, responder);
      c.recv_slots = 1;
      MoveToErrorLocked(dst);
      PushLocked(dst->recv_cq, c);
      MoveToErrorLocked(qp);
      CompleteSendLocked(qp, w, requester, 0);
      return true;
    };
    if (bytes > room) return fail_both(IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR);
    if (!LocalSgesOk(*this, recv.sges, dst->pd, true))
      return fail_both(IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR);
  }

  std::vector<Span> spans;
  switch (w.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      Pair(Gather(w), Scatter(recv.sges), &spans);
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      if (bytes > 0) {
        Pair(Gather(w), {{reinterpret_cast<uint8_t*>(w.remote_addr), bytes}}, &spans);
      }
      break;
    case IBV_WR_RDMA_READ:
      if (bytes > 0) {
        Pair({{reinterpret_cast<const uint8_t*>(w.remote_addr), bytes}}, Scatter(w.sges), &spans);
      }
      break;
    default:
      break;  // post_send admits nothing else
  }
  if (bytes > kUnlockedCopyBytes) {
    // destroy_qp, dereg_mr and friends wait for copying_ to clear, so qp,
    // dst and the registered ranges stay valid while unlocked.
    copying_ = true;
    lock.unlock();
    for (const Span& s : spans) std::memmove(s.dst, s.src, s.bytes);
    lock.lock();
    copying_ = false;
    idle_cv_.notify_all();
  } else {
    for (const Span& s : spans) std::memmove(s.dst, s.src, s.bytes);
  }
  stats.bytes_moved += bytes;
  ++stats.wrs_executed;

  // A QP reset meanwhile has discarded its work; anything else completes.
  if (consumes_recv && dst->state != IBV_QPS_RESET) {
    Completion c;
    c.wc.wr_id = recv.wr_id;
    c.wc.status = IBV_WC_SUCCESS;
    c.wc.opcode = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    c.wc.byte_len = static_cast<uint32_t>(bytes);
    c.wc.qp_num = dst->qp.qp_num;
    c.wc.src_qp = qp->qp.qp_num;
    if (w.opcode != IBV_WR_SEND) {
      c.wc.wc_flags = IBV_WC_WITH_IMM;
      c.wc.imm_data = w.imm;
    }
    c.wc.slid = roce ? 0 : kPortLid;
    c.recv_slots = 1;
    PushLocked(dst->recv_cq, c);
  }
  if (qp->state != IBV_QPS_RESET) {
    CompleteSendLocked(qp, w, IBV_WC_SUCCESS,
                       w.opcode == IBV_WR_RDMA_READ ? static_cast<uint32_t>(bytes) : 0);
  }
  return true;
}

void Fabric::Run() {
  std::unique_lock<std::mutex> lock(mu);
  std::vector<uint32_t> ready;
  while (!stop_) {
    ready.clear();
    for (const auto& [qpn, qp] : qps) {
      if (HasWorkLocked(*qp)) ready.push_back(qpn);
    }
    bool progressed = false;
    auto wake = Clock::time_point::max();
    // One WR per queue pair per pass: queues share the fabric fairly.
    for (uint32_t qpn : ready) {
      Qp* qp = FindQpLocked(qpn);
      if (qp == nullptr || !HasWorkLocked(*qp)) continue;
      if (qp->state == IBV_QPS_ERR) {
        FlushLocked(qp);
        progressed = true;
        continue;
      }
      if (qp->head_blocked && qp->next_try > Clock::now()) {
        wake = std::min(wake, qp->next_try);
        continue;
      }
      if (StepHeadLocked(lock, qp)) {
        progressed = true;
      } else {
        wake = std::min(wake, qp->next_try);
      }
    }
    if (progressed || stop_) continue;
    if (wake == Clock::time_point::max()) {
      work_cv_.wait(lock);
    } else {
      work_cv_.wait_until(lock, wake);
    }
  }
}

}  // namespace tern::softverbs

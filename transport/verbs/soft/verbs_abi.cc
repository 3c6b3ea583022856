// libibverbs' exported ABI (the 22 symbols IbvApi resolves), the ops that
// verbs.h's inline verbs dispatch through, and softverbs' fault knobs.
// Return conventions follow rdma-core: int verbs return an errno value,
// pointer verbs return NULL with errno set, get_cq_event returns -1/errno.
#include <endian.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "transport/verbs/soft/fabric.h"

// verbs.h turns these into inline wrappers; the library exports the
// functions themselves.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define SOFTVERBS_EXPORT extern "C" __attribute__((visibility("default")))

namespace tern::softverbs {
namespace {

Ctx* CtxOf(ibv_context* c) {
  return reinterpret_cast<Ctx*>(reinterpret_cast<uint8_t*>(c) - offsetof(verbs_context, context));
}
Pd* PdOf(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
Mr* MrOf(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
Cq* CqOf(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
Channel* ChannelOf(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }
Qp* QpOf(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }

template <class T>
T* Fail(int err) {
  errno = err;
  return nullptr;
}

void FillPortAttr(ibv_port_attr* a, bool roce) {
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 1;
  a->port_cap_flags = 0;
  a->max_msg_sz = static_cast<uint32_t>(kMaxMessageBytes);
  a->pkey_tbl_len = 1;
  a->lid = roce ? 0 : kPortLid;
  a->sm_lid = roce ? 0 : kPortLid;
  a->max_vl_num = 1;
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // HDR
  a->phys_state = 5;     // LinkUp
  a->link_layer = roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
}

int QueryPortEx(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (ctx == nullptr || attr == nullptr) return EINVAL;
  if (port != 1) return EINVAL;
  ibv_port_attr full{};
  {
    Fabric& f = TheFabric();
    std::lock_guard<std::mutex> lock(f.mu);
    f.ReadEnvLocked();
    FillPortAttr(&full, f.roce);
  }
  std::memcpy(attr, &full, std::min(attr_len, sizeof(full)));
  return 0;
}

bool ValidSges(const ibv_sge* list, int n) { return n == 0 || list != nullptr; }

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

int PollCq(ibv_cq* ibcq, int num_entries, ibv_wc* wc) {
  Fabric& f = TheFabric();
  Cq* cq = CqOf(ibcq);
  std::lock_guard<std::mutex> lock(f.mu);
  int n = 0;
  while (n < num_entries && !cq->entries.empty()) {
    const Completion& c = cq->entries.front();
    wc[n++] = c.wc;
    // Polling a completion frees the queue slots it retires.
    if (Qp* qp = f.FindQpLocked(c.wc.qp_num)) {
      qp->sq_used -= std::min(qp->sq_used, c.send_slots);
      qp->rq_used -= std::min(qp->rq_used, c.recv_slots);
    }
    cq->entries.pop_front();
  }
  return n;
}

int ReqNotifyCq(ibv_cq* ibcq, int solicited_only) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  // Only completions added after this call raise the event, as on HW:
  // callers poll once more after arming.
  CqOf(ibcq)->armed = true;
  return 0;
}

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

constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

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

}  // namespace
}  // namespace tern::softverbs

using namespace tern::softverbs;

SOFTVERBS_EXPORT ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = new (std::nothrow) ibv_device*[2];
  if (list == nullptr) return Fail<ibv_device*>(ENOMEM);
  list[0] = TheFabric().device();
  list[1] = nullptr;
  if (num_devices != nullptr) *num_devices = 1;
  return list;
}

SOFTVERBS_EXPORT void ibv_free_device_list(ibv_device** list) { delete[] list; }

SOFTVERBS_EXPORT const char* ibv_get_device_name(ibv_device* device) {
  return device == nullptr ? nullptr : device->name;
}

SOFTVERBS_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  Fabric& f = TheFabric();
  if (device != f.device()) return Fail<ibv_context>(ENODEV);
  auto* ctx = new (std::nothrow) Ctx{};
  if (ctx == nullptr) return Fail<ibv_context>(ENOMEM);
  verbs_context& v = ctx->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = &QueryPortEx;
  ibv_context& c = v.context;
  c.device = device;
  c.ops.post_send = &PostSend;
  c.ops.post_recv = &PostRecv;
  c.ops.poll_cq = &PollCq;
  c.ops.req_notify_cq = &ReqNotifyCq;
  c.cmd_fd = -1;
  c.async_fd = -1;
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    f.ReadEnvLocked();
  }
  f.AddContext();
  return &c;
}

SOFTVERBS_EXPORT int ibv_close_device(ibv_context* context) {
  Fabric& f = TheFabric();
  Ctx* ctx = CtxOf(context);
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (ctx->objects != 0) {
      // rdma-core would close and leak them; a test should hear about it.
      std::fprintf(stderr,
                   "softverbs: ibv_close_device with %d PDs/MRs/CQs/QPs/channels still open\n",
                   ctx->objects);
      return EBUSY;
    }
  }
  f.RemoveContext();
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  return 0;
}

SOFTVERBS_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* a) {
  if (context == nullptr || a == nullptr) return EINVAL;
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "tern-softverbs 1");
  a->node_guid = htobe64(0x027465726e000001ull);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = kMaxMrBytes;
  a->page_size_cap = 4096;
  a->max_qp = 1 << 16;
  a->max_qp_wr = static_cast<int>(kMaxQpWr);
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = static_cast<int>(kMaxSge);
  a->max_sge_rd = static_cast<int>(kMaxSge);
  a->max_cq = 1 << 16;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = kMaxRdAtomic;
  a->max_res_rd_atom = kMaxRdAtomic * (1 << 16);
  a->max_qp_init_rd_atom = kMaxRdAtomic;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
  return 0;
}

// The compat entry point: the pre-v17 layout of ibv_port_attr ends at
// link_layer, so only that prefix is written.
SOFTVERBS_EXPORT int ibv_query_port(ibv_context* context, uint8_t port_num,
                                    _compat_ibv_port_attr* port_attr) {
  return QueryPortEx(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr),
                     offsetof(ibv_port_attr, link_layer) + 1);
}

SOFTVERBS_EXPORT int ibv_query_gid(ibv_context* context, uint8_t port_num, int index,
                                   ibv_gid* gid) {
  if (context == nullptr || gid == nullptr || port_num != 1 || index != 0) return -1;
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  f.ReadEnvLocked();
  *gid = PortGid(f.roce);
  return 0;
}

SOFTVERBS_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (context == nullptr) return Fail<ibv_pd>(EINVAL);
  Fabric& f = TheFabric();
  auto* pd = new (std::nothrow) Pd{};
  if (pd == nullptr) return Fail<ibv_pd>(ENOMEM);
  std::lock_guard<std::mutex> lock(f.mu);
  pd->pd.context = context;
  pd->pd.handle = f.NewKeyLocked();
  ++CtxOf(context)->objects;
  return &pd->pd;
}

SOFTVERBS_EXPORT int ibv_dealloc_pd(ibv_pd* ibpd) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Pd* pd = PdOf(ibpd);
  if (pd->users != 0) return EBUSY;
  --CtxOf(pd->pd.context)->objects;
  delete pd;
  return 0;
}

SOFTVERBS_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* ibpd, void* addr, size_t length, int access) {
  if (ibpd == nullptr || length == 0 || length > kMaxMrBytes || (addr == nullptr)) {
    return Fail<ibv_mr>(EINVAL);
  }
  if ((static_cast<unsigned>(access) & ~kKnownAccess) != 0) return Fail<ibv_mr>(EINVAL);
  // Remote write and atomic access need local write (IB spec, and every
  // provider refuses it).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    return Fail<ibv_mr>(EINVAL);
  }
  Fabric& f = TheFabric();
  auto* mr = new (std::nothrow) Mr{};
  if (mr == nullptr) return Fail<ibv_mr>(ENOMEM);
  std::lock_guard<std::mutex> lock(f.mu);
  Pd* pd = PdOf(ibpd);
  mr->mr.context = pd->pd.context;
  mr->mr.pd = ibpd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  // Distinct lkey and rkey: using one for the other fails here as it does on
  // providers where they differ.
  mr->mr.lkey = f.NewKeyLocked();
  mr->mr.rkey = f.NewKeyLocked();
  mr->mr.handle = mr->mr.lkey;
  mr->access = access;
  f.lkeys[mr->mr.lkey] = mr;
  f.rkeys[mr->mr.rkey] = mr;
  ++pd->users;
  ++CtxOf(pd->pd.context)->objects;
  return &mr->mr;
}

SOFTVERBS_EXPORT int ibv_dereg_mr(ibv_mr* ibmr) {
  Fabric& f = TheFabric();
  std::unique_lock<std::mutex> lock(f.mu);
  f.WaitIdleLocked(lock);
  Mr* mr = MrOf(ibmr);
  f.lkeys.erase(mr->mr.lkey);
  f.rkeys.erase(mr->mr.rkey);
  --PdOf(mr->mr.pd)->users;
  --CtxOf(mr->mr.context)->objects;
  delete mr;
  return 0;
}

SOFTVERBS_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (context == nullptr) return Fail<ibv_comp_channel>(EINVAL);
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* ch = new (std::nothrow) Channel{};
  if (ch == nullptr) {
    close(fd);
    return Fail<ibv_comp_channel>(ENOMEM);
  }
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  ch->ch.context = context;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  ++CtxOf(context)->objects;
  return &ch->ch;
}

SOFTVERBS_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Channel* ch = ChannelOf(channel);
  if (ch->cqs != 0) return EBUSY;
  close(ch->ch.fd);
  --CtxOf(ch->ch.context)->objects;
  delete ch;
  return 0;
}

SOFTVERBS_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                       ibv_comp_channel* channel, int comp_vector) {
  if (context == nullptr || cqe < 1 || cqe > kMaxCqe) return Fail<ibv_cq>(EINVAL);
  if (comp_vector < 0 || comp_vector >= context->num_comp_vectors) return Fail<ibv_cq>(EINVAL);
  auto* cq = new (std::nothrow) Cq{};
  if (cq == nullptr) return Fail<ibv_cq>(ENOMEM);
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  cq->cq.context = context;
  cq->cq.channel = channel;
  cq->cq.cq_context = cq_context;
  cq->cq.cqe = cqe;  // exactly what was asked: no rounding up to hide overruns
  cq->cq.handle = f.NewKeyLocked();
  cq->channel = channel == nullptr ? nullptr : ChannelOf(channel);
  if (cq->channel != nullptr) ++cq->channel->cqs, ++cq->channel->ch.refcnt;
  ++CtxOf(context)->objects;
  return &cq->cq;
}

SOFTVERBS_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  Fabric& f = TheFabric();
  std::unique_lock<std::mutex> lock(f.mu);
  f.WaitIdleLocked(lock);
  Cq* cq = CqOf(ibcq);
  if (cq->qps != 0) return EBUSY;
  if (cq->events_unacked != 0) {
    // rdma-core blocks here until every event is acked, forever if the
    // caller forgot: say so instead.
    std::fprintf(stderr, "softverbs: ibv_destroy_cq with %u completion events not acked\n",
                 cq->events_unacked);
    return EBUSY;
  }
  if (cq->channel != nullptr) {
    std::erase(cq->channel->events, cq);  // events never got are dropped
    --cq->channel->cqs, --cq->channel->ch.refcnt;
  }
  --CtxOf(cq->cq.context)->objects;
  delete cq;
  return 0;
}

SOFTVERBS_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  Fabric& f = TheFabric();
  Channel* ch = ChannelOf(channel);
  for (;;) {
    uint64_t one = 0;
    // Blocks unless the caller made the fd non-blocking (then EAGAIN).
    const ssize_t got = read(ch->ch.fd, &one, sizeof(one));
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof(one))) return -1;
    std::lock_guard<std::mutex> lock(f.mu);
    if (ch->events.empty()) continue;  // the CQ was destroyed before this event was got
    Cq* c = ch->events.front();
    ch->events.pop_front();
    ++c->events_unacked;
    *cq = &c->cq;
    *cq_context = c->cq.cq_context;
    return 0;
  }
}

SOFTVERBS_EXPORT void ibv_ack_cq_events(ibv_cq* ibcq, unsigned int nevents) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Cq* cq = CqOf(ibcq);
  if (nevents > cq->events_unacked) {
    std::fprintf(stderr, "softverbs: ibv_ack_cq_events(%u) with only %u events got\n", nevents,
                 cq->events_unacked);
    nevents = cq->events_unacked;
  }
  cq->events_unacked -= nevents;
}

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

SOFTVERBS_EXPORT const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const kNames[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM software rendezvous",
  };
  const auto i = static_cast<size_t>(status);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "unknown";
}

SOFTVERBS_EXPORT int tern_softverbs_break_qp(uint32_t qpn) {
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  Qp* qp = f.FindQpLocked(qpn);
  if (qp == nullptr) return ENOENT;
  if (qp->state != IBV_QPS_RESET) f.MoveToErrorLocked(qp);
  return 0;
}

SOFTVERBS_EXPORT int tern_softverbs_stats(tern_softverbs_counters* out) {
  if (out == nullptr) return EINVAL;
  Fabric& f = TheFabric();
  std::lock_guard<std::mutex> lock(f.mu);
  *out = f.stats;
  return 0;
}

// softverbs driven exactly as the verbs backend drives libibverbs: loaded
// through IbvApi::Load, queue pairs brought up with qp.h's transitions, the
// inline verbs (post, poll, notify) dispatching through the context. Each
// test asserts bytes, statuses and opcodes, so a wrong emulation fails.
#include "transport/verbs/soft/softverbs.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/verbs/ibv_api.h"
#include "transport/verbs/qp.h"
#include "transport/verbs/wire.h"

namespace tern::verbs {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

class SoftVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("TERN_SOFTVERBS_LINK");
    unsetenv("TERN_SOFTVERBS_RETRY_MS");
    auto api = IbvApi::Load(TERN_SOFTVERBS_PATH);
    ASSERT_TRUE(api.ok()) << api.status().ToString();
    api_ = *api;
    int n = 0;
    ibv_device** devs = api_->get_device_list(&n);
    ASSERT_NE(devs, nullptr);
    ASSERT_EQ(n, 1);
    ctx_ = api_->open_device(devs[0]);
    api_->free_device_list(devs);
    ASSERT_NE(ctx_, nullptr);
    pd_ = api_->alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
  }

  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(api_->destroy_qp(qp), 0);
    for (ibv_mr* mr : mrs_) EXPECT_EQ(api_->dereg_mr(mr), 0);
    for (ibv_cq* cq : cqs_) EXPECT_EQ(api_->destroy_cq(cq), 0);
    for (ibv_comp_channel* ch : channels_) EXPECT_EQ(api_->destroy_comp_channel(ch), 0);
    if (pd_ != nullptr) {
      EXPECT_EQ(api_->dealloc_pd(pd_), 0);
    }
    if (ctx_ != nullptr) {
      EXPECT_EQ(api_->close_device(ctx_), 0);
    }
    unsetenv("TERN_SOFTVERBS_LINK");
    unsetenv("TERN_SOFTVERBS_RETRY_MS");
  }

  template <class Fn>
  Fn Knob(const char* name) {
    void* sym = dlsym(api_->handle.get(), name);
    EXPECT_NE(sym, nullptr) << name;
    return reinterpret_cast<Fn>(sym);
  }

  ibv_cq* Cq(int cqe = 256, ibv_comp_channel* ch = nullptr, void* cq_context = nullptr) {
    ibv_cq* cq = api_->create_cq(ctx_, cqe, cq_context, ch, 0);
    EXPECT_NE(cq, nullptr);
    if (cq != nullptr) cqs_.push_back(cq);
    return cq;
  }

  ibv_qp* Qp(ibv_cq* cq, uint32_t max_wr = 64, uint32_t inline_bytes = 0, int sq_sig_all = 0) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.cap.max_send_wr = max_wr;
    init.cap.max_recv_wr = max_wr;
    init.cap.max_send_sge = 2;
    init.cap.max_recv_sge = 2;
    init.cap.max_inline_data = inline_bytes;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = sq_sig_all;
    ibv_qp* qp = api_->create_qp(pd_, &init);
    EXPECT_NE(qp, nullptr);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }

  ibv_mr* Reg(void* addr, size_t bytes, int access = kRw) {
    ibv_mr* mr = api_->reg_mr(pd_, addr, bytes, access);
    EXPECT_NE(mr, nullptr);
    if (mr != nullptr) mrs_.push_back(mr);
    return mr;
  }

  QpEndpoint Endpoint(ibv_qp* qp, uint32_t psn) {
    QpEndpoint ep;
    ep.qpn = qp->qp_num;
    ep.psn = psn;
    ibv_port_attr attr{};
    EXPECT_EQ(api_->query_port(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(&attr)), 0);
    ep.lid = attr.lid;
    ep.ethernet = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    ep.mtu_bytes = MtuBytes(attr.active_mtu);
    ep.port = 1;
    ep.gid_index = 0;
    ibv_gid gid{};
    EXPECT_EQ(api_->query_gid(ctx_, 1, 0, &gid), 0);
    std::memcpy(ep.gid, gid.raw, 16);
    return ep;
  }

  // Brings `qp` to RTS toward `peer` with qp.h's transitions, as the backend
  // will. `extra_access` adds QP access flags to InitTransition's.
  void BringUp(ibv_qp* qp, const QpEndpoint& local, const QpEndpoint& remote,
               int extra_access = 0) {
    QpTransition init = InitTransition(1);
    init.attr.qp_access_flags |= extra_access;
    ASSERT_EQ(api_->modify_qp(qp, &init.attr, init.mask), 0);
    auto rtr = ReadyToReceiveTransition(local, remote);
    ASSERT_TRUE(rtr.ok()) << rtr.status().ToString();
    ASSERT_EQ(api_->modify_qp(qp, &rtr->attr, rtr->mask), 0);
    QpTransition rts = ReadyToSendTransition(local);
    ASSERT_EQ(api_->modify_qp(qp, &rts.attr, rts.mask), 0);
  }

  void Connect(ibv_qp* a, ibv_qp* b, int extra_access = 0) {
    const QpEndpoint ea = Endpoint(a, 0x111111), eb = Endpoint(b, 0x222222);
    BringUp(a, ea, eb, extra_access);
    BringUp(b, eb, ea, extra_access);
  }

  // Polls until `n` completions arrived or 20 s passed (loaded machine, ASan).
  std::vector<ibv_wc> Poll(ibv_cq* cq, size_t n, std::chrono::milliseconds limit = 20000ms) {
    std::vector<ibv_wc> out;
    const auto deadline = Clock::now() + limit;
    while (out.size() < n && Clock::now() < deadline) {
      ibv_wc wc[16];
      const int got = ibv_poll_cq(cq, 16, wc);
      EXPECT_GE(got, 0);
      out.insert(out.end(), wc, wc + got);
      if (got == 0) std::this_thread::sleep_for(200us);
    }
    return out;
  }

  int PostRecv(ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t bytes, uint32_t lkey) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(addr), bytes, lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
  }

  int Post(ibv_qp* qp, uint64_t wr_id, ibv_wr_opcode op, void* addr, uint32_t bytes, uint32_t lkey,
           uint64_t remote_addr = 0, uint32_t rkey = 0, uint32_t imm = 0,
           unsigned flags = IBV_SEND_SIGNALED) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(addr), bytes, lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = htobe32(imm);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }

  std::shared_ptr<const IbvApi> api_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<ibv_mr*> mrs_;
  std::vector<ibv_cq*> cqs_;
  std::vector<ibv_comp_channel*> channels_;
};

// A connected pair on one CQ each, with registered buffers.
class SoftVerbsPair : public SoftVerbs {
 protected:
  void SetUp() override {
    SoftVerbs::SetUp();
    if (HasFatalFailure()) return;
    cq_a_ = Cq();
    cq_b_ = Cq();
    a_ = Qp(cq_a_);
    b_ = Qp(cq_b_);
    buf_a_.assign(1 << 16, 0);
    buf_b_.assign(1 << 16, 0);
    mr_a_ = Reg(buf_a_.data(), buf_a_.size());
    mr_b_ = Reg(buf_b_.data(), buf_b_.size());
  }
  uint8_t* A(size_t off = 0) { return buf_a_.data() + off; }
  uint8_t* B(size_t off = 0) { return buf_b_.data() + off; }
  uint64_t RemoteB(size_t off = 0) { return reinterpret_cast<uintptr_t>(B(off)); }

  ibv_cq *cq_a_ = nullptr, *cq_b_ = nullptr;
  ibv_qp *a_ = nullptr, *b_ = nullptr;
  std::vector<uint8_t> buf_a_, buf_b_;
  ibv_mr *mr_a_ = nullptr, *mr_b_ = nullptr;
};

TEST_F(SoftVerbs, ListPortsSeesOneActiveInfiniBandPort) {
  auto ports = ListPorts(*api_);
  ASSERT_TRUE(ports.ok()) << ports.status().ToString();
  ASSERT_EQ(ports->size(), 1u);
  const PortInfo& p = ports->front();
  EXPECT_EQ(p.device, "tern_soft0");
  EXPECT_EQ(p.port, 1);
  EXPECT_TRUE(p.active);
  EXPECT_FALSE(p.ethernet);
  EXPECT_EQ(p.lid, 1);
  EXPECT_EQ(p.active_mtu_bytes, 4096u);

  ibv_device_attr dev{};
  ASSERT_EQ(api_->query_device(ctx_, &dev), 0);
  EXPECT_EQ(dev.phys_port_cnt, 1);
  EXPECT_EQ(dev.max_qp_wr, 16384);
  EXPECT_EQ(dev.max_sge, 4);
  EXPECT_EQ(dev.max_cqe, 65536);
  EXPECT_EQ(dev.max_qp_rd_atom, 16);
  EXPECT_EQ(dev.max_qp_init_rd_atom, 16);
  EXPECT_GE(dev.max_mr_size, uint64_t{1} << 32);

  // The extended op is what verbs.h and IbvApi use; the compat symbol
  // answers the same for the pre-v17 prefix.
  verbs_context* vctx = verbs_get_ctx_op(ctx_, query_port);
  ASSERT_NE(vctx, nullptr);
  ibv_port_attr compat{};
  ASSERT_EQ(api_->query_port(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(&compat)), 0);
  EXPECT_EQ(compat.lid, 1);
  EXPECT_EQ(compat.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_NE(api_->query_port(ctx_, 2, reinterpret_cast<_compat_ibv_port_attr*>(&compat)), 0);

  setenv("TERN_SOFTVERBS_LINK", "roce", 1);
  ports = ListPorts(*api_);
  ASSERT_TRUE(ports.ok());
  ASSERT_EQ(ports->size(), 1u);
  EXPECT_TRUE(ports->front().ethernet);
  EXPECT_EQ(ports->front().lid, 0);
}

TEST_F(SoftVerbsPair, SendRecvWithAndWithoutImmediate) {
  Connect(a_, b_);
  ASSERT_EQ(PostRecv(b_, 501, B(), 4096, mr_b_->lkey), 0);
  ASSERT_EQ(PostRecv(b_, 502, B(4096), 4096, mr_b_->lkey), 0);
  const auto msg = Pattern(3000, 1);
  std::memcpy(A(), msg.data(), msg.size());
  ASSERT_EQ(Post(a_, 7, IBV_WR_SEND_WITH_IMM, A(), 3000, mr_a_->lkey, 0, 0, 0xdeadbeef), 0);
  ASSERT_EQ(Post(a_, 8, IBV_WR_SEND, A(), 100, mr_a_->lkey), 0);

  auto recv = Poll(cq_b_, 2);
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv[0].wr_id, 501u);
  EXPECT_EQ(recv[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(recv[0].byte_len, 3000u);
  EXPECT_TRUE(recv[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(be32toh(recv[0].imm_data), 0xdeadbeefu);
  EXPECT_EQ(recv[0].qp_num, b_->qp_num);
  EXPECT_EQ(recv[0].src_qp, a_->qp_num);
  EXPECT_EQ(recv[1].wr_id, 502u);
  EXPECT_EQ(recv[1].opcode, IBV_WC_RECV);
  EXPECT_EQ(recv[1].byte_len, 100u);
  EXPECT_FALSE(recv[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(std::memcmp(B(), msg.data(), 3000), 0);
  EXPECT_EQ(std::memcmp(B(4096), msg.data(), 100), 0);

  auto sent = Poll(cq_a_, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].wr_id, 7u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(sent[0].qp_num, a_->qp_num);
  EXPECT_EQ(sent[1].wr_id, 8u);
}

TEST_F(SoftVerbsPair, RdmaWriteAndWriteWithImmLandBitExact) {
  Connect(a_, b_);
  const auto data = Pattern(10000, 2);
  std::memcpy(A(), data.data(), data.size());
  std::memset(B(), 0xee, 20000);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 5000, mr_a_->lkey, RemoteB(100), mr_b_->rkey), 0);
  // WRITE WITH IMM consumes a receive (its buffer unused) and reports the
  // written length.
  ASSERT_EQ(PostRecv(b_, 77, B(30000), 16, mr_b_->lkey), 0);
  ASSERT_EQ(Post(a_, 2, IBV_WR_RDMA_WRITE_WITH_IMM, A(5000), 5000, mr_a_->lkey, RemoteB(5100),
                 mr_b_->rkey, 0x00010002),
            0);
  auto sent = Poll(cq_a_, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[1].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(sent[1].status, IBV_WC_SUCCESS);
  auto recv = Poll(cq_b_, 1);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].wr_id, 77u);
  EXPECT_EQ(recv[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(recv[0].byte_len, 5000u);
  EXPECT_EQ(be32toh(recv[0].imm_data), 0x00010002u);
  EXPECT_EQ(std::memcmp(B(100), data.data(), 10000), 0);
  for (size_t i : {size_t{0}, size_t{99}, size_t{10100}, size_t{19999}})
    EXPECT_EQ(*B(i), 0xee) << i;
}

TEST_F(SoftVerbsPair, RdmaReadNeedsRemoteReadAndReadCredits) {
  Connect(a_, b_);
  // RTS -> RTS may change the access flags: without remote read at the
  // responder QP, RC hardware refuses the READ even if the MR allows it.
  ibv_qp_attr attr{};
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(api_->modify_qp(b_, &attr, IBV_QP_ACCESS_FLAGS), 0);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_READ, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR) << api_->wc_status_str(wc[0].status);

  // A requester with max_rd_atomic 0 may not issue READs at all.
  ibv_qp* c = Qp(cq_a_);
  ibv_qp* d = Qp(cq_b_);
  const QpEndpoint ec = Endpoint(c, 1), ed = Endpoint(d, 2);
  BringUp(d, ed, ec);
  QpTransition init = InitTransition(1);
  ASSERT_EQ(api_->modify_qp(c, &init.attr, init.mask), 0);
  auto rtr = ReadyToReceiveTransition(ec, ed);
  ASSERT_TRUE(rtr.ok());
  ASSERT_EQ(api_->modify_qp(c, &rtr->attr, rtr->mask), 0);
  QpTransition rts = ReadyToSendTransition(ec);
  rts.attr.max_rd_atomic = 0;
  ASSERT_EQ(api_->modify_qp(c, &rts.attr, rts.mask), 0);
  ASSERT_EQ(Post(c, 2, IBV_WR_RDMA_READ, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_QP_OP_ERR) << api_->wc_status_str(wc[0].status);
}

TEST_F(SoftVerbsPair, RdmaReadWithMaxRdAtomicOne) {
  // qp.h's transitions (max_rd_atomic = max_dest_rd_atomic = 1); remote read
  // is OR'd in so this holds whether or not InitTransition grants it.
  Connect(a_, b_, IBV_ACCESS_REMOTE_READ);
  const auto data = Pattern(9000, 3);
  std::memcpy(B(2000), data.data(), data.size());
  ASSERT_EQ(Post(a_, 9, IBV_WR_RDMA_READ, A(10), 9000, mr_a_->lkey, RemoteB(2000), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, 9000u);
  EXPECT_EQ(std::memcmp(A(10), data.data(), 9000), 0);
  EXPECT_EQ(Poll(cq_b_, 1, 20ms).size(), 0u);  // no completion at the responder
}

TEST_F(SoftVerbs, SixtyFourMiBWriteAndReadBitExact) {
  constexpr size_t kBytes = 64u << 20;
  ibv_cq* cq = Cq();
  ibv_qp* a = Qp(cq);
  ibv_qp* b = Qp(cq);
  Connect(a, b, IBV_ACCESS_REMOTE_READ);
  std::vector<uint8_t> src = Pattern(kBytes, 4), dst(kBytes, 0), back(kBytes, 0);
  ibv_mr* ms = Reg(src.data(), kBytes);
  ibv_mr* md = Reg(dst.data(), kBytes);
  ibv_mr* mb = Reg(back.data(), kBytes);
  ASSERT_EQ(Post(a, 1, IBV_WR_RDMA_WRITE, src.data(), kBytes, ms->lkey,
                 reinterpret_cast<uintptr_t>(dst.data()), md->rkey),
            0);
  // RC orders the READ behind the WRITE on the same QP.
  ASSERT_EQ(Post(a, 2, IBV_WR_RDMA_READ, back.data(), kBytes, mb->lkey,
                 reinterpret_cast<uintptr_t>(dst.data()), md->rkey),
            0);
  auto wc = Poll(cq, 2, 60000ms);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].byte_len, kBytes);
  EXPECT_TRUE(dst == src);
  EXPECT_TRUE(back == src);
}

TEST_F(SoftVerbs, CompletionChannelWakesPollAndCountsAcks) {
  ibv_comp_channel* ch = api_->create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  channels_.push_back(ch);
  int cookie = 0;
  ibv_cq* cq = Cq(64, ch, &cookie);
  ibv_qp* a = Qp(cq);
  ibv_qp* b = Qp(cq);
  Connect(a, b);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = Reg(buf.data(), buf.size());
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);

  ibv_cq* got = nullptr;
  void* got_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(api_->get_cq_event(ch, &got, &got_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  pollfd pfd{ch->fd, POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 0), 0);  // nothing yet
  ASSERT_EQ(Post(a, 1, IBV_WR_RDMA_WRITE, buf.data(), 64, mr->lkey,
                 reinterpret_cast<uintptr_t>(buf.data() + 1024), mr->rkey),
            0);
  ASSERT_EQ(poll(&pfd, 1, 10000), 1);
  EXPECT_TRUE(pfd.revents & POLLIN);
  ASSERT_EQ(api_->get_cq_event(ch, &got, &got_ctx), 0);
  EXPECT_EQ(got, cq);
  EXPECT_EQ(got_ctx, &cookie);
  EXPECT_EQ(Poll(cq, 1).size(), 1u);

  // Armed once: a second completion without re-arming raises no event.
  ASSERT_EQ(Post(a, 2, IBV_WR_RDMA_WRITE, buf.data(), 64, mr->lkey,
                 reinterpret_cast<uintptr_t>(buf.data() + 2048), mr->rkey),
            0);
  EXPECT_EQ(Poll(cq, 1).size(), 1u);
  EXPECT_EQ(poll(&pfd, 1, 50), 0);

  // An event got and not acked keeps the CQ alive, loudly.
  EXPECT_EQ(api_->destroy_cq(cq), EBUSY);  // QPs still on it
  for (ibv_qp* qp : qps_) ASSERT_EQ(api_->destroy_qp(qp), 0);
  qps_.clear();
  EXPECT_EQ(api_->destroy_cq(cq), EBUSY);            // the unacked event
  EXPECT_EQ(api_->destroy_comp_channel(ch), EBUSY);  // a CQ still uses it
  api_->ack_cq_events(cq, 1);
}

TEST_F(SoftVerbs, BlockingGetCqEventReturnsWhenACompletionArrives) {
  ibv_comp_channel* ch = api_->create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  channels_.push_back(ch);
  ibv_cq* cq = Cq(64, ch);
  ibv_qp* a = Qp(cq);
  ibv_qp* b = Qp(cq);
  Connect(a, b);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = Reg(buf.data(), buf.size());
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    ibv_cq* got = nullptr;
    void* ctx = nullptr;
    if (api_->get_cq_event(ch, &got, &ctx) == 0 && got == cq) woke = true;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(woke.load());
  ASSERT_EQ(Post(a, 1, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey,
                 reinterpret_cast<uintptr_t>(buf.data() + 8), mr->rkey),
            0);
  waiter.join();
  EXPECT_TRUE(woke.load());
  api_->ack_cq_events(cq, 1);
  EXPECT_EQ(Poll(cq, 1).size(), 1u);
}

TEST_F(SoftVerbsPair, BadLkeyIsLocalProtectionErrorAndFlushesTheRest) {
  Connect(a_, b_);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey + 1000, RemoteB(), mr_b_->rkey), 0);
  ASSERT_EQ(Post(a_, 2, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  // Outside the MR: also a protection error (on a fresh pair below).
  auto wc = Poll(cq_a_, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(*B(), 0);  // nothing moved
  // As in rdma-core, qp->state is what modify_qp last set: the error the
  // device hit is seen in completions, not there.
  EXPECT_EQ(a_->state, IBV_QPS_RTS);
  // rkey used as lkey: refused too (the keys differ here, as on many NICs).
  ibv_qp* c = Qp(cq_a_);
  ibv_qp* d = Qp(cq_b_);
  Connect(c, d);
  ASSERT_EQ(Post(c, 3, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->rkey, RemoteB(), mr_b_->rkey), 0);
  ASSERT_EQ(
      Post(c, 4, IBV_WR_RDMA_WRITE, A(buf_a_.size() - 10), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey),
      0);
  wc = Poll(cq_a_, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(SoftVerbsPair, RemoteKeyRangeAndAccessAreChecked) {
  Connect(a_, b_, IBV_ACCESS_REMOTE_READ);
  std::vector<uint8_t> ro(4096, 0x5a);
  ibv_mr* mr_ro = Reg(ro.data(), ro.size(), IBV_ACCESS_REMOTE_READ);
  struct Case {
    ibv_wr_opcode op;
    uint64_t addr;
    uint32_t rkey;
  };
  const Case cases[] = {
      {IBV_WR_RDMA_WRITE, RemoteB(), mr_b_->rkey + 7},                           // unknown rkey
      {IBV_WR_RDMA_WRITE, RemoteB(), mr_b_->lkey},                               // lkey as rkey
      {IBV_WR_RDMA_WRITE, RemoteB(buf_b_.size() - 8), mr_b_->rkey},              // past the end
      {IBV_WR_RDMA_WRITE, reinterpret_cast<uintptr_t>(ro.data()), mr_ro->rkey},  // no REMOTE_WRITE
      {IBV_WR_RDMA_READ, RemoteB(), mr_a_->rkey},  // a valid rkey of another range
  };
  for (const Case& c : cases) {
    ibv_qp* x = Qp(cq_a_);
    ibv_qp* y = Qp(cq_b_);
    Connect(x, y, IBV_ACCESS_REMOTE_READ);
    ASSERT_EQ(Post(x, 1, c.op, A(), 64, mr_a_->lkey, c.addr, c.rkey), 0);
    ASSERT_EQ(Post(x, 2, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
    auto wc = Poll(cq_a_, 2);
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR) << api_->wc_status_str(wc[0].status);
    EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  }
  EXPECT_EQ(ro[0], 0x5a);
  std::vector<uint8_t> wo(4096, 0);
  ibv_mr* mr_wo = Reg(wo.data(), wo.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(Post(a_, 5, IBV_WR_RDMA_READ, A(), 64, mr_a_->lkey,
                 reinterpret_cast<uintptr_t>(wo.data()), mr_wo->rkey),
            0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);  // no REMOTE_READ on the MR
}

TEST_F(SoftVerbsPair, ReadIntoReadOnlyMemoryIsLocalProtectionError) {
  Connect(a_, b_, IBV_ACCESS_REMOTE_READ);
  std::vector<uint8_t> ro(256);
  ibv_mr* mr_ro = Reg(ro.data(), ro.size(), 0);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_READ, ro.data(), 64, mr_ro->lkey, RemoteB(), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(SoftVerbsPair, SendLargerThanReceiveIsLengthErrorOnBothSides) {
  Connect(a_, b_);
  ASSERT_EQ(PostRecv(b_, 10, B(), 100, mr_b_->lkey), 0);
  ASSERT_EQ(PostRecv(b_, 11, B(100), 100, mr_b_->lkey), 0);
  ASSERT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 101, mr_a_->lkey), 0);
  auto sent = Poll(cq_a_, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_INV_REQ_ERR);
  auto recv = Poll(cq_b_, 2);
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[0].wr_id, 10u);
  EXPECT_EQ(recv[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(recv[1].wr_id, 11u);
  EXPECT_EQ(recv[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(SoftVerbsPair, ReceiveIntoMemoryWithoutLocalWriteFailsBothSides) {
  Connect(a_, b_);
  std::vector<uint8_t> ro(256);
  ibv_mr* mr_ro = Reg(ro.data(), ro.size(), 0);
  ASSERT_EQ(PostRecv(b_, 10, ro.data(), 256, mr_ro->lkey), 0);
  ASSERT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 10, mr_a_->lkey), 0);
  auto sent = Poll(cq_a_, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_REM_OP_ERR);
  auto recv = Poll(cq_b_, 1);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(SoftVerbsPair, StateMachineAndPostingStatesAreEnforced) {
  ibv_recv_wr rwr{};
  ibv_recv_wr* rbad = nullptr;
  ibv_sge sge{reinterpret_cast<uintptr_t>(B()), 64, mr_b_->lkey};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  EXPECT_EQ(ibv_post_recv(a_, &rwr, &rbad), EINVAL);  // RESET
  EXPECT_EQ(rbad, &rwr);
  EXPECT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 8, mr_a_->lkey), EINVAL);

  const QpEndpoint ea = Endpoint(a_, 1), eb = Endpoint(b_, 2);
  QpTransition init = InitTransition(1);
  auto rtr = ReadyToReceiveTransition(ea, eb);
  ASSERT_TRUE(rtr.ok());
  QpTransition rts = ReadyToSendTransition(ea);
  EXPECT_EQ(api_->modify_qp(a_, &rtr->attr, rtr->mask), EINVAL);  // RESET -> RTR
  EXPECT_EQ(api_->modify_qp(a_, &init.attr, init.mask & ~IBV_QP_ACCESS_FLAGS), EINVAL);
  EXPECT_EQ(api_->modify_qp(a_, &init.attr, init.mask | IBV_QP_SQ_PSN),
            EINVAL);  // not allowed here
  ASSERT_EQ(api_->modify_qp(a_, &init.attr, init.mask), 0);
  EXPECT_EQ(a_->state, IBV_QPS_INIT);
  EXPECT_EQ(ibv_post_recv(a_, &rwr, &rbad), 0);  // allowed from INIT on
  EXPECT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 8, mr_a_->lkey), EINVAL);
  EXPECT_EQ(api_->modify_qp(a_, &rts.attr, rts.mask), EINVAL);  // INIT -> RTS
  for (int bit : {IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN,
                  IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER}) {
    EXPECT_EQ(api_->modify_qp(a_, &rtr->attr, rtr->mask & ~bit), EINVAL) << bit;
  }
  ASSERT_EQ(api_->modify_qp(a_, &rtr->attr, rtr->mask), 0);
  EXPECT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 8, mr_a_->lkey), EINVAL);  // RTR
  for (int bit : {IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY,
                  IBV_QP_MAX_QP_RD_ATOMIC}) {
    EXPECT_EQ(api_->modify_qp(a_, &rts.attr, rts.mask & ~bit), EINVAL) << bit;
  }
  ASSERT_EQ(api_->modify_qp(a_, &rts.attr, rts.mask), 0);
  EXPECT_EQ(a_->state, IBV_QPS_RTS);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(api_->modify_qp(a_, &attr, IBV_QP_STATE), 0);
  // In ERR every posted WR (and the receive posted at INIT) flushes.
  EXPECT_EQ(Post(a_, 9, IBV_WR_SEND, A(), 8, mr_a_->lkey), 0);
  auto wc = Poll(cq_a_, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const ibv_wc& w : wc) EXPECT_EQ(w.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(api_->modify_qp(a_, &init.attr, init.mask), EINVAL);  // ERR -> INIT
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(api_->modify_qp(a_, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(api_->modify_qp(a_, &init.attr, init.mask), 0);

  ibv_qp_init_attr ud{};
  ud.send_cq = ud.recv_cq = cq_a_;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = ud.cap.max_recv_wr = 1;
  errno = 0;
  EXPECT_EQ(api_->create_qp(pd_, &ud), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(SoftVerbs, QueueDepthCountsUnsignaledSendsUntilASignaledOneIsPolled) {
  ibv_cq* cq = Cq();
  ibv_qp* a = Qp(cq, 3);
  ibv_qp* b = Qp(cq, 3);
  Connect(a, b);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = Reg(buf.data(), buf.size());
  const uint64_t dst = reinterpret_cast<uintptr_t>(buf.data() + 2048);
  auto stats = Knob<tern_softverbs_stats_fn>("tern_softverbs_stats");
  ASSERT_NE(stats, nullptr);
  tern_softverbs_counters before{}, after{};
  ASSERT_EQ(stats(&before), 0);
  ASSERT_EQ(Post(a, 1, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey, dst, mr->rkey, 0, 0), 0);
  ASSERT_EQ(Post(a, 2, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey, dst, mr->rkey, 0, 0), 0);
  const auto deadline = Clock::now() + 10s;
  do {
    std::this_thread::sleep_for(1ms);
    ASSERT_EQ(stats(&after), 0);
  } while (after.wrs_executed < before.wrs_executed + 2 && Clock::now() < deadline);
  ASSERT_GE(after.wrs_executed, before.wrs_executed + 2);
  // Both ran, yet their slots stay taken: one slot is left.
  ASSERT_EQ(Post(a, 3, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey, dst, mr->rkey), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf.data()), 8, mr->lkey};
  ibv_send_wr w1{}, w2{};
  w1.wr_id = 4, w1.sg_list = &sge, w1.num_sge = 1, w1.opcode = IBV_WR_RDMA_WRITE;
  w1.send_flags = IBV_SEND_SIGNALED, w1.wr.rdma.remote_addr = dst, w1.wr.rdma.rkey = mr->rkey;
  w2 = w1;
  w2.wr_id = 5;
  w1.next = &w2;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, &w1, &bad), ENOMEM);
  EXPECT_EQ(bad, &w1);
  auto wc = Poll(cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  // Polling the signaled completion freed all three slots.
  bad = nullptr;
  EXPECT_EQ(ibv_post_send(a, &w1, &bad), 0);
  EXPECT_EQ(Poll(cq, 2).size(), 2u);

  // Receive queue depth and SGE count.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostRecv(b, i, buf.data(), 8, mr->lkey), 0);
  EXPECT_EQ(PostRecv(b, 3, buf.data(), 8, mr->lkey), ENOMEM);
  ibv_sge sges[3] = {sge, sge, sge};
  ibv_send_wr many{};
  many.sg_list = sges;
  many.num_sge = 3;
  many.opcode = IBV_WR_SEND;
  EXPECT_EQ(ibv_post_send(a, &many, &bad), EINVAL);  // max_send_sge is 2
}

TEST_F(SoftVerbs, InlineDataIsCopiedAtPostTimeAndBounded) {
  ibv_cq* cq = Cq();
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = 512;
  errno = 0;
  EXPECT_EQ(api_->create_qp(pd_, &init), nullptr);
  EXPECT_EQ(errno, EINVAL);

  ibv_qp* a = Qp(cq, 4, 64);
  ibv_qp* b = Qp(cq, 4);
  Connect(a, b);
  std::vector<uint8_t> recv(256, 0);
  ibv_mr* mr = Reg(recv.data(), recv.size());
  ASSERT_EQ(PostRecv(b, 1, recv.data(), 256, mr->lkey), 0);
  // Inline needs no lkey; the buffer may change right after the post.
  uint8_t msg[48];
  std::memset(msg, 0x42, sizeof(msg));
  ASSERT_EQ(
      Post(a, 2, IBV_WR_SEND, msg, sizeof(msg), 0, 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
      0);
  std::memset(msg, 0x99, sizeof(msg));
  auto wc = Poll(cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const ibv_wc& w : wc) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv[0], 0x42);
  EXPECT_EQ(recv[47], 0x42);
  EXPECT_EQ(recv[48], 0);
  uint8_t big[65] = {};
  EXPECT_EQ(Post(a, 3, IBV_WR_SEND, big, sizeof(big), 0, 0, 0, 0, IBV_SEND_INLINE), EINVAL);
}

TEST_F(SoftVerbsPair, DeadPeerEndsInRetryExceededWithinBoundedTime) {
  setenv("TERN_SOFTVERBS_RETRY_MS", "100", 1);
  Connect(a_, b_);
  ASSERT_EQ(api_->destroy_qp(b_), 0);
  std::erase(qps_, b_);
  const auto start = Clock::now();
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  ASSERT_EQ(Post(a_, 2, IBV_WR_SEND, A(), 64, mr_a_->lkey), 0);
  auto wc = Poll(cq_a_, 2, 20000ms);
  const auto took = Clock::now() - start;
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_GE(took, 90ms);
  // The bound is the 100 ms retry timeout; 10 s (100 x) is room for a loaded
  // machine under ASan and still fails retries that never end (20 s here).
  EXPECT_LT(took, 10000ms);
}

TEST_F(SoftVerbsPair, UnconnectedOrMisaddressedPeersAreUnreachable) {
  setenv("TERN_SOFTVERBS_RETRY_MS", "30", 1);
  // b points back at someone else: a's packets are not accepted.
  ibv_qp* other = Qp(cq_b_);
  const QpEndpoint ea = Endpoint(a_, 5), eb = Endpoint(b_, 6), eo = Endpoint(other, 7);
  BringUp(a_, ea, eb);
  BringUp(b_, eb, eo);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  // A wrong LID in the address vector.
  ibv_qp* c = Qp(cq_a_);
  ibv_qp* d = Qp(cq_b_);
  QpEndpoint ec = Endpoint(c, 1), ed = Endpoint(d, 2);
  QpEndpoint ed_wrong = ed;
  ed_wrong.lid = 9;
  BringUp(c, ec, ed_wrong);
  BringUp(d, ed, ec);
  ASSERT_EQ(Post(c, 2, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(*B(), 0);
}

TEST_F(SoftVerbsPair, RoceNeedsAGrhWithThePortGid) {
  setenv("TERN_SOFTVERBS_LINK", "roce", 1);
  Connect(a_, b_);  // qp.h builds a GRH with the peer's GID on RoCE
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 64, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  // An address vector without a GRH is refused on RoCE.
  ibv_qp* c = Qp(cq_a_);
  QpTransition init = InitTransition(1);
  ASSERT_EQ(api_->modify_qp(c, &init.attr, init.mask), 0);
  QpEndpoint ec = Endpoint(c, 1), ed = Endpoint(b_, 2);
  auto rtr = ReadyToReceiveTransition(ec, ed);
  ASSERT_TRUE(rtr.ok());
  rtr->attr.ah_attr.is_global = 0;
  EXPECT_EQ(api_->modify_qp(c, &rtr->attr, rtr->mask), EINVAL);
}

TEST_F(SoftVerbsPair, BrokenLinkFlushesAndThePeerSeesRetryExceeded) {
  setenv("TERN_SOFTVERBS_RETRY_MS", "30", 1);
  Connect(a_, b_);
  auto break_qp = Knob<tern_softverbs_break_qp_fn>("tern_softverbs_break_qp");
  ASSERT_NE(break_qp, nullptr);
  ASSERT_EQ(PostRecv(b_, 20, B(), 64, mr_b_->lkey), 0);
  ASSERT_EQ(PostRecv(b_, 21, B(64), 64, mr_b_->lkey), 0);
  ASSERT_EQ(break_qp(b_->qp_num), 0);
  EXPECT_EQ(break_qp(0xabcdef), ENOENT);
  auto recv = Poll(cq_b_, 2);
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[0].wr_id, 20u);
  EXPECT_EQ(recv[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(recv[0].qp_num, b_->qp_num);
  EXPECT_EQ(recv[1].status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 8, mr_a_->lkey), 0);
  auto sent = Poll(cq_a_, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(SoftVerbs, CqOverrunIsLoudAndErrorsItsQueuePairs) {
  ibv_cq* small = Cq(2);
  ibv_qp* a = Qp(small);
  ibv_cq* other = Cq();
  ibv_qp* b = Qp(other);
  Connect(a, b);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = Reg(buf.data(), buf.size());
  auto stats = Knob<tern_softverbs_stats_fn>("tern_softverbs_stats");
  tern_softverbs_counters before{}, after{};
  ASSERT_EQ(stats(&before), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(Post(a, i, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey,
                   reinterpret_cast<uintptr_t>(buf.data() + 1024), mr->rkey),
              0);
  }
  const auto deadline = Clock::now() + 10s;
  do {
    std::this_thread::sleep_for(1ms);
    ASSERT_EQ(stats(&after), 0);
  } while (after.cq_overruns == before.cq_overruns && Clock::now() < deadline);
  EXPECT_GT(after.cq_overruns, before.cq_overruns);
  auto wc = Poll(small, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 0u);
  EXPECT_EQ(wc[1].wr_id, 1u);
  // The QP is in ERR now: a new WR flushes.
  ASSERT_EQ(Post(a, 9, IBV_WR_RDMA_WRITE, buf.data(), 8, mr->lkey,
                 reinterpret_cast<uintptr_t>(buf.data() + 1024), mr->rkey),
            0);
  wc = Poll(small, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(SoftVerbsPair, ReceiverNotReadyIsRetriedUntilAReceiveIsPosted) {
  Connect(a_, b_);
  auto stats = Knob<tern_softverbs_stats_fn>("tern_softverbs_stats");
  tern_softverbs_counters before{}, after{};
  ASSERT_EQ(stats(&before), 0);
  std::memcpy(A(), "late receive", 12);
  ASSERT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 12, mr_a_->lkey), 0);
  EXPECT_EQ(Poll(cq_a_, 1, 150ms).size(), 0u);  // RNR, retried (rnr_retry 7)
  ASSERT_EQ(stats(&after), 0);
  EXPECT_GT(after.rnr_waits, before.rnr_waits);
  EXPECT_LT(after.rnr_waits - before.rnr_waits, 1000u);  // ~1 ms apart, no spinning
  ASSERT_EQ(PostRecv(b_, 2, B(), 64, mr_b_->lkey), 0);
  auto sent = Poll(cq_a_, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  auto recv = Poll(cq_b_, 1);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].byte_len, 12u);
  EXPECT_EQ(std::memcmp(B(), "late receive", 12), 0);
}

TEST_F(SoftVerbsPair, BoundedRnrRetryEndsInRnrRetryExceeded) {
  const QpEndpoint ea = Endpoint(a_, 1), eb = Endpoint(b_, 2);
  BringUp(b_, eb, ea);
  QpTransition init = InitTransition(1);
  ASSERT_EQ(api_->modify_qp(a_, &init.attr, init.mask), 0);
  auto rtr = ReadyToReceiveTransition(ea, eb);
  ASSERT_TRUE(rtr.ok());
  ASSERT_EQ(api_->modify_qp(a_, &rtr->attr, rtr->mask), 0);
  QpTransition rts = ReadyToSendTransition(ea);
  rts.attr.rnr_retry = 2;
  ASSERT_EQ(api_->modify_qp(a_, &rts.attr, rts.mask), 0);
  ASSERT_EQ(Post(a_, 1, IBV_WR_SEND, A(), 8, mr_a_->lkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR) << api_->wc_status_str(wc[0].status);
}

TEST_F(SoftVerbsPair, PsnMismatchIsUnreachable) {
  setenv("TERN_SOFTVERBS_RETRY_MS", "20", 1);
  QpEndpoint ea = Endpoint(a_, 100), eb = Endpoint(b_, 200);
  BringUp(a_, ea, eb);
  ea.psn = 101;  // b expects another first PSN than a sends
  BringUp(b_, eb, ea);
  ASSERT_EQ(Post(a_, 1, IBV_WR_RDMA_WRITE, A(), 8, mr_a_->lkey, RemoteB(), mr_b_->rkey), 0);
  auto wc = Poll(cq_a_, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(SoftVerbs, EventsNeverGotDieWithTheirCq) {
  ibv_comp_channel* ch = api_->create_comp_channel(ctx_);
  ASSERT_NE(ch, nullptr);
  channels_.push_back(ch);
  ibv_cq* cq = Cq(16, ch);
  ibv_qp* a = Qp(cq, 4);
  ASSERT_NE(a, nullptr);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(api_->modify_qp(a, &attr, IBV_QP_STATE), 0);
  std::vector<uint8_t> buf(64);
  ibv_mr* mr = Reg(buf.data(), buf.size());
  ASSERT_EQ(PostRecv(a, 1, buf.data(), 8, mr->lkey), 0);  // flushes: one event
  pollfd pfd{ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 10000), 1);
  // Destroyed before the event was got: that is allowed, and the event goes.
  ASSERT_EQ(api_->destroy_qp(a), 0);
  std::erase(qps_, a);
  ASSERT_EQ(api_->destroy_cq(cq), 0);
  std::erase(cqs_, cq);
  ASSERT_EQ(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), 0);
  ibv_cq* got = nullptr;
  void* ctx = nullptr;
  errno = 0;
  EXPECT_EQ(api_->get_cq_event(ch, &got, &ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(SoftVerbs, ConcurrentPostersKeepPerQueueOrder) {
  constexpr int kMessages = 2000;
  ibv_cq* cq_a = Cq(4096);
  ibv_cq* cq_b = Cq(4096);
  ibv_qp* a = Qp(cq_a, 256);
  ibv_qp* b = Qp(cq_b, 256);
  Connect(a, b);
  std::vector<uint8_t> src(kMessages * 8), dst(kMessages * 8, 0);
  ibv_mr* ms = Reg(src.data(), src.size());
  ibv_mr* md = Reg(dst.data(), dst.size());
  // The receiver keeps receives posted from its own thread while the sender
  // posts from another, as the backend's CQ and user threads will.
  const auto deadline = Clock::now() + 60s;
  std::thread receiver([&] {
    int posted = 0, done = 0;
    while (done < kMessages && Clock::now() < deadline) {
      while (posted < kMessages && posted - done < 128) {
        if (PostRecv(b, posted, dst.data() + posted * 8, 8, md->lkey) != 0) break;
        ++posted;
      }
      ibv_wc wc[32];
      const int n = ibv_poll_cq(cq_b, 32, wc);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
        ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(done));
        ++done;
      }
      if (n == 0) std::this_thread::sleep_for(100us);
    }
  });
  int sent = 0, completed = 0;
  while (completed < kMessages && Clock::now() < deadline) {
    while (sent < kMessages && sent - completed < 128) {
      std::memcpy(src.data() + sent * 8, &sent, sizeof(sent));
      if (Post(a, sent, IBV_WR_SEND, src.data() + sent * 8, 8, ms->lkey) != 0) break;
      ++sent;
    }
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_a, 32, wc);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
      ASSERT_EQ(wc[i].wr_id, static_cast<uint64_t>(completed));
      ++completed;
    }
    if (n == 0) std::this_thread::sleep_for(100us);
  }
  receiver.join();
  EXPECT_EQ(completed, kMessages);
  EXPECT_TRUE(src == dst);
}

TEST_F(SoftVerbs, CloseWithOpenObjectsIsRefusedAndPdInUseIsBusy) {
  ibv_cq* cq = Cq();
  ibv_qp* qp = Qp(cq);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(api_->dealloc_pd(pd_), EBUSY);
  EXPECT_EQ(api_->close_device(ctx_), EBUSY);
  std::vector<uint8_t> buf(64);
  errno = 0;
  EXPECT_EQ(api_->reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);  // remote write needs local write
  EXPECT_EQ(api_->create_cq(ctx_, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_STREQ(api_->wc_status_str(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
}

}  // namespace
}  // namespace tern::verbs

// One verbs connection: an RC queue pair with its completion queue and
// control buffers. Control (messages, chunk announcements, acks, credits,
// bye) is SEND/RECV under credit flow control; chunks are pulled by the
// receiver with RDMA READ into its window; Write is RDMA WRITE.
// Design: docs/transport-rdma.md; wire: docs/format/verbs.md.
#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/wire_status.h"
#include "transport/verbs/verbs_impl.h"

namespace tern::verbs {

using transport::CheckWriteRanges;
using transport::Complete;
using transport::Printable;
using transport::Xxh3;

namespace {

constexpr uint32_t kMaxWrites = 16;
// A peer that closes its side channel gets this long to deliver its bye.
constexpr uint64_t kEofGraceUs = 200000;
// Our bye's send completion, then the flush of every posted request.
constexpr uint64_t kByeWaitUs = 500000;
constexpr uint64_t kFlushWaitUs = 1000000;
constexpr uint64_t kDeadlineScanUs = 100000;

const char* WrName(WrKind kind) {
  switch (kind) {
    case WrKind::kRecv: return "receive";
    case WrKind::kSend: return "send";
    case WrKind::kRead: return "RDMA read";
    case WrKind::kWrite: return "RDMA write";
  }
  return "work request";
}

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

}  // namespace

VerbsConn::VerbsConn(VerbsTransport* transport, std::string peer)
    : t_(transport),
      peer_(std::move(peer)),
      recv_count_(transport->options().recv_buffers),
      send_count_(std::min<uint32_t>(transport->options().recv_buffers, 64)),
      sq_depth_(send_count_ + transport->options().max_reads + kMaxWrites) {}

VerbsConn::~VerbsConn() { DestroyResources(); }

uint8_t* VerbsConn::RecvBuffer(uint64_t i) const { return buffers_.get() + i * kControlBufferBytes; }
uint8_t* VerbsConn::SendBuffer(uint64_t i) const {
  return buffers_.get() + (recv_count_ + i) * kControlBufferBytes;
}

Status VerbsConn::Create() {
  const IbvApi& api = t_->api();
  channel_ = api.create_comp_channel(t_->context());
  TERN_REQUIRE(channel_ != nullptr, kResourceExhausted, "verbs: completion channel: ", std::strerror(errno));
  const int flags = ::fcntl(channel_->fd, F_GETFL);
  TERN_REQUIRE(flags >= 0 && ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) == 0, kIo,
               "verbs: completion channel non-blocking: ", std::strerror(errno));
  cq_ = api.create_cq(t_->context(), static_cast<int>(recv_count_ + sq_depth_ + 16), this, channel_, 0);
  TERN_REQUIRE(cq_ != nullptr, kResourceExhausted, "verbs: completion queue: ", std::strerror(errno));
  const size_t bytes = size_t{recv_count_ + send_count_} * kControlBufferBytes;
  buffers_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  buffers_mr_ = api.reg_mr(t_->pd(), buffers_.get(), bytes, IBV_ACCESS_LOCAL_WRITE);
  TERN_REQUIRE(buffers_mr_ != nullptr, kResourceExhausted, "verbs: registering ", bytes,
               " bytes of control buffers: ", std::strerror(errno), " (check ulimit -l)");
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;
  init.cap.max_send_wr = sq_depth_;
  init.cap.max_recv_wr = recv_count_;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  qp_ = api.create_qp(t_->pd(), &init);
  TERN_REQUIRE(qp_ != nullptr, kResourceExhausted, "verbs: queue pair: ", std::strerror(errno));
  QpTransition to_init = InitTransition(t_->port());
  int rc = api.modify_qp(qp_, &to_init.attr, to_init.mask);
  TERN_REQUIRE(rc == 0, kUnavailable, "verbs: queue pair to INIT: ", std::strerror(rc));
  MutexLock lock(mu_);
  TERN_ASSIGN_OR_RETURN(link_, Step(link_, LinkEvent::kQpInit));
  for (uint32_t i = 0; i < recv_count_; ++i) RepostReceiveLocked(i);
  TERN_REQUIRE(recv_posted_ == recv_count_, kResourceExhausted, "verbs: posting receives to ", peer_,
               " failed");
  sq_free_ = sq_depth_;
  for (uint32_t i = send_count_; i-- > 0;) free_send_.push_back(i);
  local_.qpn = qp_->qp_num;
  local_.psn = RandomPsn();
  local_.lid = t_->lid();
  local_.mtu_bytes = t_->mtu_bytes();
  local_.port = t_->port();
  local_.gid_index = t_->options().gid_index;
  local_.ethernet = t_->ethernet();
  std::memcpy(local_.gid, t_->gid(), 16);
  local_.credits = recv_count_;
  local_.rd_atomic = t_->rd_atomic();
  return Status::Ok();
}

Status VerbsConn::BringUp(const QpEndpoint& remote) {
  const IbvApi& api = t_->api();
  TERN_ASSIGN_OR_RETURN(QpTransition rtr, ReadyToReceiveTransition(local_, remote, t_->rd_atomic()));
  int rc = api.modify_qp(qp_, &rtr.attr, rtr.mask);
  TERN_REQUIRE(rc == 0, kUnavailable, "verbs: queue pair to RTR towards ", peer_, ": ", std::strerror(rc));
  // Never more reads in flight than the peer accepts (two different NICs).
  QpTransition rts = ReadyToSendTransition(local_, std::min(t_->rd_atomic(), remote.rd_atomic));
  rc = api.modify_qp(qp_, &rts.attr, rts.mask);
  TERN_REQUIRE(rc == 0, kUnavailable, "verbs: queue pair to RTS towards ", peer_, ": ", std::strerror(rc));
  MutexLock lock(mu_);
  TERN_ASSIGN_OR_RETURN(link_, Step(link_, LinkEvent::kQpRtr));
  TERN_ASSIGN_OR_RETURN(link_, Step(link_, LinkEvent::kQpRts));
  remote_ = remote;
  send_credits_ = remote.credits;
  return Status::Ok();
}

uint32_t VerbsConn::capabilities() const { return t_->capabilities(); }

std::string VerbsConn::Describe() const {
  return "verbs rc " + t_->device_name() + ":" + std::to_string(t_->port()) +
         (t_->ethernet() ? " RoCE" : " IB") + " mtu " +
         std::to_string(std::min(local_.mtu_bytes, remote_.mtu_bytes)) + " qp " +
         std::to_string(local_.qpn) + "->" + std::to_string(remote_.qpn) + " credits " +
         std::to_string(remote_.credits) + " reads " + std::to_string(t_->options().max_reads);
}

Status VerbsConn::AdmitLocked() {
  TERN_REQUIRE(!closed_, kUnavailable, "verbs: connection to ", peer_, " is closed");
  TERN_REQUIRE(in_flight_ < t_->options().max_queued_ops, kResourceExhausted, "verbs: ", in_flight_,
               " operations already in flight to ", peer_);
  ++in_flight_;
  return Status::Ok();
}

bool VerbsConn::RepostReceiveLocked(uint64_t index) {
  ibv_sge sge{reinterpret_cast<uint64_t>(RecvBuffer(index)), static_cast<uint32_t>(kControlBufferBytes),
              buffers_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = WrId(WrKind::kRecv, index);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(qp_, &wr, &bad) != 0) return false;
  ++recv_posted_;
  return true;
}

void VerbsConn::SendMessage(std::string payload, Completion done) {
  if (payload.size() > kMaxMessageBytes) {
    return Complete(done, TERN_ERROR(kOutOfRange, "verbs: message of ", payload.size(),
                                     " bytes exceeds ", kMaxMessageBytes));
  }
  MutexLock lock(mu_);
  Status st = AdmitLocked();
  if (!st.ok()) {
    lock.Unlock();
    return Complete(done, std::move(st));
  }
  Outgoing o;
  o.queued_us = t_->NowUs();
  o.message = true;
  o.header.type = ControlType::kMessage;
  o.header.a[0] = next_message_seq_++;
  o.header.a[1] = payload.size();
  o.payload = std::move(payload);
  o.done = std::move(done);
  outbox_.push_back(std::move(o));
  PumpLocked();
}

void VerbsConn::SendChunk(const ChunkSend& chunk, Completion done) {
  if (chunk.length == 0 || chunk.length > kMaxChunkBytes) {
    return Complete(done, TERN_ERROR(kInvalidArgument, "verbs: chunk of ", chunk.length,
                                     " bytes outside [1, ", kMaxChunkBytes, "]"));
  }
  if (chunk.src.kind != MemoryKind::kHost) {
    return Complete(done, TERN_ERROR(kUnsupported, "verbs: chunks must come from host memory"));
  }
  auto mem = t_->Lookup(chunk.src);
  if (!mem.ok()) return Complete(done, mem.status());
  if (chunk.src_offset > mem->size_bytes || chunk.length > mem->size_bytes - chunk.src_offset) {
    return Complete(done, TERN_ERROR(kInvalidArgument, "verbs: chunk source outside its registered region"));
  }
  const uint8_t* src = mem->base + chunk.src_offset;
  const uint64_t xxh3 = chunk.xxh3 ? *chunk.xxh3 : Xxh3(src, chunk.length);
  MutexLock lock(mu_);
  Status st = AdmitLocked();
  if (!st.ok()) {
    lock.Unlock();
    return Complete(done, std::move(st));
  }
  const uint64_t op = next_op_++;
  pending_[op] = PendingOp{std::move(done), t_->NowUs() + t_->options().op_timeout_ms * 1000, true};
  Outgoing o;
  o.queued_us = t_->NowUs();
  o.header.type = ControlType::kChunk;
  o.header.rkey = mem->rkey;
  o.header.a[0] = op;
  o.header.a[1] = chunk.transfer_id;
  o.header.a[2] = chunk.dst_offset;
  o.header.a[3] = chunk.length;
  o.header.a[4] = xxh3;
  o.header.a[5] = reinterpret_cast<uint64_t>(src);
  outbox_.push_back(std::move(o));
  PumpLocked();
}

Status VerbsConn::PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                              uint64_t length_bytes, ChunkLanded on_landed) {
  TERN_REQUIRE(dst.kind == MemoryKind::kHost, kUnsupported,
               "verbs: chunk windows must be host memory (checksums are verified on the host)");
  TERN_ASSIGN_OR_RETURN(VerbsTransport::LocalMemory mem, t_->Lookup(dst));
  return windows_.Post(transfer_id, dst, dst_offset, length_bytes, std::move(on_landed), mem.lkey);
}

void VerbsConn::CancelReceive(uint64_t transfer_id) {
  std::optional<uint64_t> generation;
  {
    MutexLock lock(mu_);
    generation = windows_.Remove(transfer_id);
    if (!generation) return;
    // Reads not yet posted never start; the sender hears kNotFound.
    for (auto l = landings_.begin(); l != landings_.end();) {
      if (l->second.window.generation == *generation && !l->second.posted) {
        QueueAckLocked(l->second.op, TERN_ERROR(kNotFound, "window ", transfer_id, " was cancelled"));
        windows_.Abort(l->second.window);
        l = landings_.erase(l);
      } else {
        ++l;
      }
    }
    PumpLocked();
  }
  // A read already posted is written by the NIC: wait for its completion
  // unless we are the thread that handles it. Bounded: a read that never
  // completes fails its connection by the op timeout (and Release ends
  // every landing).
  windows_.WaitLandings(
      *generation, transport::LandingWait{!t_->OnProgressThread(), t_->options().op_timeout_ms});
}

Result<std::string> VerbsConn::ExportRegion(const MemoryRegion& region) {
  TERN_ASSIGN_OR_RETURN(VerbsTransport::LocalMemory mem, t_->Lookup(region));
  return EncodeRegionKey({mem.rkey, reinterpret_cast<uint64_t>(mem.base), mem.size_bytes});
}

void VerbsConn::Write(const MemoryRegion& src, uint64_t src_offset, std::string_view remote_key,
                      uint64_t dst_offset, uint64_t length, Completion done) {
  RegionKey key;
  Status st = DecodeRegionKey(remote_key, &key);
  if (st.ok()) st = CheckWriteRanges("verbs", src, src_offset, key.size_bytes, dst_offset, length);
  if (st.ok() && length > t_->max_message_bytes()) {
    st = TERN_ERROR(kInvalidArgument, "verbs: one write moves at most ", t_->max_message_bytes(),
                    " bytes (the port's max_msg_sz)");
  }
  auto mem = st.ok() ? t_->Lookup(src) : Result<VerbsTransport::LocalMemory>(st);
  if (!mem.ok()) return Complete(done, mem.status());
  MutexLock lock(mu_);
  st = AdmitLocked();
  if (!st.ok()) {
    lock.Unlock();
    return Complete(done, std::move(st));
  }
  const uint64_t op = next_op_++;
  pending_[op] = PendingOp{std::move(done), t_->NowUs() + t_->options().op_timeout_ms * 1000};
  writes_.push_back(PendingWrite{op, reinterpret_cast<uint64_t>(mem->base + src_offset), length,
                                 key.address + dst_offset, mem->lkey, key.rkey});
  PumpLocked();
}

void VerbsConn::QueueAckLocked(uint64_t op, const Status& status) {
  if (closed_) return;  // the peer fails the op when the link ends
  Outgoing o;
  o.queued_us = t_->NowUs();
  o.header.type = ControlType::kAck;
  o.header.a[0] = op;
  o.header.a[1] = WireCode(status);
  if (!status.ok()) o.payload = status.message().substr(0, kMaxAckReason);
  outbox_.push_back(std::move(o));
}

Status VerbsConn::PostControlLocked(Outgoing& o, bool* finished) {
  const uint32_t slot = free_send_.back();
  ControlHeader h = o.header;
  std::string_view payload = o.payload;
  if (o.message) {
    const uint64_t n = std::min<uint64_t>(kMaxControlPayload, o.payload.size() - o.offset);
    h.a[2] = o.offset;
    payload = payload.substr(o.offset, n);
  }
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  h.credits = static_cast<uint16_t>(std::min<uint32_t>(owed_credits_, 0xffff));
  uint8_t* buf = SendBuffer(slot);
  const std::string header = EncodeControl(h);
  std::memcpy(buf, header.data(), kControlBytes);
  if (!payload.empty()) std::memcpy(buf + kControlBytes, payload.data(), payload.size());
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(kControlBytes + payload.size()),
              buffers_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = WrId(WrKind::kSend, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, &wr, &bad);
  TERN_REQUIRE(rc == 0, kUnavailable, "verbs: posting a send to ", peer_, ": ", std::strerror(rc));
  free_send_.pop_back();
  --sq_free_;
  --send_credits_;
  owed_credits_ -= h.credits;
  if (h.type == ControlType::kCredit) credit_queued_ = false;
  if (h.type == ControlType::kBye) bye_slot_ = slot;
  if (o.message) o.offset += payload.size();
  *finished = !o.message || o.offset == o.payload.size();
  if (*finished && o.message) send_done_[slot] = std::move(o.done);
  return Status::Ok();
}

Status VerbsConn::PostRdmaLocked(WrKind kind, uint64_t id, uint64_t local_address, uint64_t length,
                                 uint32_t lkey, uint64_t remote_address, uint32_t rkey) {
  // length <= kMaxChunkBytes (reads) or the port's max_msg_sz, itself
  // capped below 4 GiB (writes): it fits the SGE's 32 bits.
  ibv_sge sge{local_address, static_cast<uint32_t>(length), lkey};
  ibv_send_wr wr{};
  wr.wr_id = WrId(kind, id);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = kind == WrKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_address;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp_, &wr, &bad);
  TERN_REQUIRE(rc == 0, kUnavailable, "verbs: posting an ", WrName(kind), " with ", peer_, ": ",
               std::strerror(rc));
  return Status::Ok();
}

void VerbsConn::PumpLocked() {
  if (qp_gone_) return;
  Status failed;
  // Credits go back on their own once half the receives wait to be
  // reported (else they ride on the next header). Credits are kept in
  // reserve: ordinary sends need three, a credit return two and the bye one,
  // so a credit return and then the bye can always go out.
  if (!closed_ && owed_credits_ >= recv_count_ / 2 && !credit_queued_) {
    Outgoing o;
    o.header.type = ControlType::kCredit;
    outbox_.push_front(std::move(o));
    credit_queued_ = true;
  }
  while (!outbox_.empty() && failed.ok()) {
    Outgoing& o = outbox_.front();
    const uint32_t need = o.header.type == ControlType::kBye ? 1u : o.header.type == ControlType::kCredit ? 2u : 3u;
    if (send_credits_ < need || free_send_.empty() || sq_free_ == 0) break;
    bool finished = false;
    failed = PostControlLocked(o, &finished);
    if (failed.ok() && finished) outbox_.pop_front();
  }
  while (!closed_ && failed.ok() && !read_queue_.empty() && reads_posted_ < t_->options().max_reads &&
         sq_free_ > 0) {
    const uint64_t id = read_queue_.front();
    read_queue_.pop_front();
    auto it = landings_.find(id);
    if (it == landings_.end()) continue;
    Landing& l = it->second;
    failed = PostRdmaLocked(WrKind::kRead, id, reinterpret_cast<uint64_t>(l.window.dst), l.window.length,
                            static_cast<uint32_t>(l.window.handle), l.remote_address, l.rkey);
    if (!failed.ok()) break;
    l.posted = true;
    ++reads_posted_;
    --sq_free_;
  }
  while (!closed_ && failed.ok() && !writes_.empty() && writes_posted_ < kMaxWrites && sq_free_ > 0) {
    const PendingWrite& w = writes_.front();
    failed = PostRdmaLocked(WrKind::kWrite, w.op, w.local_address, w.length, w.lkey, w.remote_address,
                            w.rkey);
    if (!failed.ok()) break;
    writes_.pop_front();
    ++writes_posted_;
    --sq_free_;
  }
  if (!failed.ok()) {
    // Posting only fails on a broken queue pair (or a bug); end the link
    // from the progress thread, outside this lock.
    auto self = shared_from_this();
    t_->Post([self, failed] { self->Shutdown(failed, Code::kUnavailable, false); });
  }
}

void VerbsConn::FinishOpLocked(uint64_t op, Status status, Deferred* deferred) {
  auto it = pending_.find(op);
  if (it == pending_.end()) return;  // late (after a timeout) or made up by the peer: ignored
  Completion done = std::move(it->second.done);
  pending_.erase(it);
  --in_flight_;
  if (done) deferred->push_back([done = std::move(done), status = std::move(status)] { done(status); });
}

int VerbsConn::channel_fd() const { return channel_ != nullptr ? channel_->fd : -1; }

void VerbsConn::SetHandlers(ConnectionHandlers handlers) {
  std::function<void(Status)> closed;
  Status why;
  {
    MutexLock lock(mu_);
    handlers_ = std::move(handlers);
    handlers_set_ = true;
    // Closed inside on_accept, before we had its handlers: tell them now.
    if (closed_unannounced_) {
      closed_unannounced_ = false;
      closed = std::move(handlers_.on_closed);
      why = closed_why_;
    }
  }
  if (closed) closed(why);
}

void VerbsConn::Open() {
  if (shut_ || cq_ == nullptr) return;
  {
    MutexLock lock(mu_);
    auto next = Step(link_, LinkEvent::kHelloDone);
    if (next.ok()) link_ = *next;
  }
  opened_ = true;
  ibv_req_notify_cq(cq_, 0);
  DrainCq();
}

void VerbsConn::OnChannelReadable() {
  if (channel_ == nullptr) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (t_->api().get_cq_event(channel_, &cq, &context) == 0) t_->api().ack_cq_events(cq, 1);
  ibv_req_notify_cq(cq_, 0);
  DrainCq();
}

void VerbsConn::DrainCq() {
  // Bounded per call, so one busy connection cannot keep the progress
  // thread from commands, deadlines and other connections; the rest is
  // drained on the next turn (backlog()).
  constexpr int kBatch = 32, kMaxPerCall = 256;
  ibv_wc wcs[kBatch];
  int handled = 0;
  backlog_ = false;
  while (cq_ != nullptr) {
    if (handled >= kMaxPerCall) {
      backlog_ = true;
      return;
    }
    const int n = ibv_poll_cq(cq_, kBatch, wcs);
    if (n < 0) {
      Shutdown(TERN_ERROR(kUnavailable, "verbs: polling the completion queue of ", peer_, " failed"),
               Code::kUnavailable, false);
      break;
    }
    if (n == 0) break;
    handled += n;
    for (int i = 0; i < n && cq_ != nullptr; ++i) {
      Deferred deferred;
      OnCompletion(wcs[i], &deferred);
      for (auto& fn : deferred) fn();
    }
  }
  MaybeRelease();
}

void VerbsConn::OnCompletion(const ibv_wc& wc, Deferred* deferred) {
  const WrKind kind = WrKindOf(wc.wr_id);
  const uint64_t index = WrIndex(wc.wr_id);
  const bool ok = wc.status == IBV_WC_SUCCESS;
  if (!ok && !shut_) {
    const char* why = t_->api().wc_status_str(wc.status);
    Shutdown(TERN_ERROR(kUnavailable, "verbs: ", WrName(kind), " with ", peer_, " failed: ",
                        why ? why : "unknown status"),
             Code::kUnavailable, false);
  }
  switch (kind) {
    case WrKind::kRecv: {
      {
        MutexLock lock(mu_);
        --recv_posted_;
      }
      if (ok && !shut_) OnReceive(index, wc.byte_len, deferred);
      return;
    }
    case WrKind::kSend: {
      MutexLock lock(mu_);
      ++sq_free_;
      free_send_.push_back(static_cast<uint32_t>(index));
      if (bye_slot_ == static_cast<int64_t>(index)) {
        bye_slot_ = -1;
        bye_wait_ = false;
      }
      auto it = send_done_.find(index);
      if (ok && it != send_done_.end()) {
        Completion done = std::move(it->second);
        send_done_.erase(it);
        --in_flight_;
        if (done) deferred->push_back([done = std::move(done)] { done(Status::Ok()); });
      }
      PumpLocked();
      TryPostByeLocked();
      break;
    }
    case WrKind::kRead:
      OnReadDone(index, ok);
      break;
    case WrKind::kWrite: {
      MutexLock lock(mu_);
      ++sq_free_;
      --writes_posted_;
      if (ok) FinishOpLocked(index, Status::Ok(), deferred);
      PumpLocked();
      break;
    }
    default:
      t_->Log("verbs: completion with an unknown work request id from " + peer_);
  }
  if (shut_ && bye_wait_ == false && !flushing_) MoveToError();
}

void VerbsConn::OnReceive(uint64_t index, uint32_t byte_len, Deferred* deferred) {
  const uint8_t* buf = RecvBuffer(index);
  ControlHeader h;
  Status st = byte_len >= kControlBytes
                  ? DecodeControl(std::string_view(reinterpret_cast<const char*>(buf), kControlBytes), &h)
                  : TERN_ERROR(kProtocol, "verbs: control message of ", byte_len, " bytes");
  if (st.ok() && byte_len != kControlBytes + h.payload_bytes) {
    st = TERN_ERROR(kProtocol, "verbs: control message of ", byte_len, " bytes, its header says ",
                    kControlBytes + h.payload_bytes);
  }
  const std::string_view payload(reinterpret_cast<const char*>(buf) + kControlBytes,
                                 st.ok() ? h.payload_bytes : 0);
  std::string message;
  bool deliver = false;
  if (st.ok() && h.type == ControlType::kMessage) {
    auto complete = assembler_.Add(h, payload);
    st = complete.status();
    if (st.ok() && *complete) {
      message = assembler_.take();
      deliver = true;
    }
  }
  if (st.ok() && h.type == ControlType::kBye) bye_seen_ = true;
  {
    MutexLock lock(mu_);
    if (st.ok() && uint64_t{send_credits_} + h.credits > remote_.credits) {
      st = TERN_ERROR(kProtocol, "verbs: ", peer_, " returned more credits than it has receives");
    }
    if (st.ok()) {
      send_credits_ += h.credits;
      switch (h.type) {
        case ControlType::kChunk: {
          const uint64_t op = h.a[0], transfer = h.a[1], offset = h.a[2], length = h.a[3];
          if (closed_) break;
          Result<transport::Landing> w = windows_.Begin(transfer, offset, length);
          if (!w.ok()) {
            QueueAckLocked(op, w.status());
            break;
          }
          if (landings_.size() >= t_->options().max_queued_ops) {
            windows_.Abort(*w);
            QueueAckLocked(op, TERN_ERROR(kResourceExhausted, landings_.size(),
                                          " chunks already landing from ", peer_));
            break;
          }
          Landing l;
          l.op = op;
          l.xxh3 = h.a[4];
          l.window = *w;
          l.remote_address = h.a[5];
          l.rkey = h.rkey;
          const uint64_t id = next_landing_++;
          landings_.emplace(id, std::move(l));
          read_queue_.push_back(id);
          break;
        }
        case ControlType::kAck: {
          auto op = pending_.find(h.a[0]);
          if (op != pending_.end() && !op->second.ackable) {
            st = TERN_ERROR(kProtocol, "verbs: ", peer_, " acknowledged op ", h.a[0], ", which is not a chunk");
            break;
          }
          FinishOpLocked(h.a[0], StatusFromWire(h.a[1], "peer", payload), deferred);
          break;
        }
        case ControlType::kMessage:
        case ControlType::kCredit:
        case ControlType::kBye:
          break;
      }
      if (st.ok() && !bye_seen_) {
        if (RepostReceiveLocked(index)) {
          ++owed_credits_;
        } else {
          st = TERN_ERROR(kUnavailable, "verbs: re-posting a receive for ", peer_, " failed");
        }
      }
      if (st.ok()) PumpLocked();
    }
  }
  if (!st.ok()) {
    t_->Log("verbs: " + peer_ + ": " + st.ToString());
    return Shutdown(st, Code::kUnavailable, false);
  }
  if (deliver && handlers_.on_message) {
    deferred->push_back([this, m = std::move(message)]() mutable { handlers_.on_message(std::move(m)); });
  }
  if (bye_seen_) {
    // The peer closed: what we still owe it fails as unavailable.
    auto self = shared_from_this();
    deferred->push_back([self] { self->Shutdown(Status::Ok(), Code::kUnavailable, false); });
  }
}

void VerbsConn::OnReadDone(uint64_t id, bool ok) {
  Landing l;
  {
    MutexLock lock(mu_);
    ++sq_free_;
    --reads_posted_;
    auto it = landings_.find(id);
    if (it == landings_.end()) return;
    l = std::move(it->second);
    landings_.erase(it);
  }
  // A failed read ends the connection (its completion error does), so its
  // status is never acknowledged.
  const Status status = windows_.Finish(
      l.window, ok ? Status::Ok() : TERN_ERROR(kUnavailable, "verbs: RDMA read failed"), l.xxh3);
  MutexLock lock(mu_);
  if (ok && !closed_) QueueAckLocked(l.op, status);
  PumpLocked();
}

void VerbsConn::OnSideReadable() {
  if (!side_) return;
  char buf[64];
  const ssize_t n = ::recv(side_->fd(), buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n > 0) {
    const Status st = TERN_ERROR(kProtocol, "verbs: ", peer_, " sent bytes on the side channel after set-up");
    t_->Log(st.ToString());
    return Shutdown(st, Code::kUnavailable, false);
  }
  // The peer's side channel closed: after a bye that is the normal end;
  // without one the peer died. Its bye may still be in our queue: give it
  // a moment.
  side_.reset();
  if (!shut_ && !bye_seen_) eof_deadline_us_ = t_->NowUs() + kEofGraceUs;
}

void VerbsConn::CheckDeadlines(uint64_t now_us) {
  if (cq_ == nullptr) return;
  if (shut_) {
    DrainCq();  // flushes arrive here even on a CQ that was never armed
    if (cq_ == nullptr) return;
    if (bye_wait_ && now_us >= drain_deadline_us_) {
      bye_wait_ = false;
      {
        MutexLock lock(mu_);
        bye_pending_ = false;
      }
      MoveToError();
    }
    if (flushing_ && now_us >= drain_deadline_us_) {
      t_->Log("verbs: " + peer_ + ": work requests still posted " +
              std::to_string(kFlushWaitUs / 1000) + " ms after the flush; freeing the queue pair");
      Release();
    }
    return;
  }
  if (eof_deadline_us_ != 0 && now_us >= eof_deadline_us_) {
    DrainCq();  // a bye already in the queue makes this a clean close
    if (shut_ || cq_ == nullptr) return;
    return Shutdown(TERN_ERROR(kUnavailable, "verbs: ", peer_, " closed its side channel without a bye"),
                    Code::kUnavailable, false);
  }
  if (now_us < next_deadline_check_us_) return;
  next_deadline_check_us_ = now_us + kDeadlineScanUs;
  const uint64_t timeout_us = t_->options().op_timeout_ms * 1000;
  bool expired = false, starved = false;
  {
    MutexLock lock(mu_);
    for (const auto& [op, p] : pending_) expired |= now_us >= p.deadline_us;
    // Control that cannot leave (no credits: the peer stopped taking
    // receives) ends the link too, messages included.
    starved = !outbox_.empty() && now_us - std::min(now_us, outbox_.front().queued_us) > timeout_us;
  }
  if (expired || starved) {
    Shutdown(TERN_ERROR(kTimeout, "verbs: ", peer_,
                        expired ? " did not acknowledge within " : " took no control message within ",
                        t_->options().op_timeout_ms, " ms"),
             Code::kTimeout, false);
  }
}

void VerbsConn::FailOutboxLocked() {
  for (auto& o : outbox_) {
    if (o.message) unsent_.push_back(std::move(o.done));
  }
  outbox_.clear();
}

void VerbsConn::TryPostByeLocked() {
  if (!bye_pending_ || send_credits_ < 1 || free_send_.empty() || sq_free_ == 0) return;
  bye_pending_ = false;
  Outgoing o;
  o.header.type = ControlType::kBye;
  bool finished = false;
  if (!PostControlLocked(o, &finished).ok()) bye_wait_ = false;  // broken: straight to ERR
}

void VerbsConn::Shutdown(Status why, Code pending_code, bool bye) {
  if (shut_ || cq_ == nullptr) return;
  shut_ = true;
  why_ = std::move(why);
  pending_code_ = pending_code;
  {
    MutexLock lock(mu_);
    const bool up = link_ == LinkState::kOpen || link_ == LinkState::kReadyToSend;
    auto next = Step(link_, why_.ok() ? LinkEvent::kBye : LinkEvent::kFailure);
    if (next.ok()) link_ = *next;
    closed_ = true;
    // Queued (unposted) reads never start.
    for (auto l = landings_.begin(); l != landings_.end();) {
      if (!l->second.posted) {
        windows_.Abort(l->second.window);
        l = landings_.erase(l);
      } else {
        ++l;
      }
    }
    read_queue_.clear();
    cv_.SignalAll();
    FailOutboxLocked();
    if (bye && up && !bye_seen_) {
      // The bye waits (bounded) for a send buffer and queue slot if none is
      // free; a credit is always kept for it.
      bye_pending_ = true;
      bye_wait_ = true;
      drain_deadline_us_ = t_->NowUs() + kByeWaitUs;
      TryPostByeLocked();
    }
  }
  // Outside our lock: the windows' on_landed captures are released here and
  // may call back into this connection. No landing begins any more (closed_).
  windows_.Close();
  if (!bye_wait_) MoveToError();
}

void VerbsConn::MoveToError() {
  if (flushing_ || qp_ == nullptr) return;
  flushing_ = true;
  drain_deadline_us_ = t_->NowUs() + kFlushWaitUs;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  const int rc = t_->api().modify_qp(qp_, &attr, IBV_QP_STATE);
  if (rc != 0) t_->Log("verbs: moving the queue pair to " + peer_ + " to ERR: " + std::strerror(rc));
  if (!opened_) ibv_req_notify_cq(cq_, 0);
}

bool VerbsConn::DrainedLocked() const {
  return recv_posted_ == 0 && sq_free_ == sq_depth_;
}

void VerbsConn::MaybeRelease() {
  if (!flushing_ || cq_ == nullptr) return;
  bool drained;
  {
    MutexLock lock(mu_);
    drained = DrainedLocked();
  }
  if (drained) Release();
}

void VerbsConn::DestroyResources() {
  if (qp_ == nullptr && cq_ == nullptr && channel_ == nullptr && buffers_mr_ == nullptr) {
    buffers_.reset();
    side_.reset();
    return;
  }
  const IbvApi& api = t_->api();
  if (qp_ != nullptr) api.destroy_qp(qp_);
  qp_ = nullptr;
  if (cq_ != nullptr) api.destroy_cq(cq_);
  cq_ = nullptr;
  if (channel_ != nullptr) api.destroy_comp_channel(channel_);
  channel_ = nullptr;
  if (buffers_mr_ != nullptr) api.dereg_mr(buffers_mr_);
  buffers_mr_ = nullptr;
  buffers_.reset();
  side_.reset();
}

void VerbsConn::Release() {
  if (release_started_) return;
  release_started_ = true;
  {
    // No thread posts to the queue pair from here on (PumpLocked checks).
    MutexLock lock(mu_);
    qp_gone_ = true;
  }
  DestroyResources();
  std::vector<Completion> fail = std::move(unsent_);
  unsent_.clear();
  std::function<void(Status)> closed;
  {
    MutexLock lock(mu_);
    link_ = LinkState::kClosed;
    for (auto& [op, p] : pending_) fail.push_back(std::move(p.done));
    pending_.clear();
    for (auto& [slot, done] : send_done_) fail.push_back(std::move(done));
    send_done_.clear();
    writes_.clear();
    landings_.clear();
    windows_.EndAll();  // CancelReceive: nothing writes a window any more
    in_flight_ = 0;
    cv_.SignalAll();
    closed_why_ = why_;
    if (handlers_set_) {
      closed = std::move(handlers_.on_closed);
    } else {
      closed_unannounced_ = true;  // SetHandlers reports it
    }
  }
  const Status failed(pending_code_, why_.ok() ? "verbs: connection to " + peer_ + " closed"
                                               : why_.message());
  for (auto& done : fail) Complete(done, failed);
  if (closed) closed(why_);
  // Only now: Close() returns once every completion and on_closed ran.
  MutexLock lock(mu_);
  released_ = true;
  cv_.SignalAll();
}

void VerbsConn::Abandon() {
  if (release_started_) return;
  if (!shut_) {
    shut_ = true;
    why_ = TERN_ERROR(kCancelled, "verbs: transport destroyed");
    pending_code_ = Code::kCancelled;
    MutexLock lock(mu_);
    closed_ = true;
    FailOutboxLocked();
  }
  Release();
}

bool VerbsConn::released() const {
  MutexLock lock(mu_);
  return released_;
}

void VerbsConn::Close() {
  auto self = shared_from_this();
  if (t_->OnProgressThread()) return Shutdown(Status::Ok(), Code::kCancelled, true);
  t_->Post([self] { self->Shutdown(Status::Ok(), Code::kCancelled, true); });
  MutexLock lock(mu_);
  // Bounded: the bye's send completion and the flush each have their own
  // bound on the progress thread.
  const auto wait = std::chrono::milliseconds(kByeWaitUs / 1000 + kFlushWaitUs / 1000 + 1000);
  if (!cv_.WaitUntil(std::chrono::steady_clock::now() + wait,
                     [&]() REQUIRES(mu_) { return released_; })) {
    t_->Log("verbs: close of the connection to " + peer_ + " did not finish in time");
  }
}

}  // namespace tern::verbs

// One UCX connection: handshake, ordered messages, checksummed chunks landed
// by rendezvous into posted windows, one-sided writes, close.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/wire_status.h"
#include "transport/internal.h"
#include "transport/ucx/ucx_impl.h"

namespace tern::ucx {

using transport::CheckWriteRanges;
using transport::Complete;
using transport::Xxh3;

namespace {

// A message seq may run this far ahead of the next one due before the peer
// is treated as broken (bounds the reorder buffer's key space).
constexpr uint64_t kMaxSeqGap = 1 << 16;
// How long a closing connection waits for the peer's answering bye before
// it closes its endpoint anyway.
constexpr uint64_t kByeWaitUs = 500'000;
// How long a closing endpoint waits for its rendezvous receives in flight.
constexpr uint64_t kDrainUs = 500'000;
// How long an endpoint close may take before we stop waiting for UCX.
constexpr uint64_t kReleaseUs = 750'000;
// Close() waits at most this (the three above plus deadline pacing).
constexpr auto kCloseWait = std::chrono::milliseconds(2000);

struct SendCtx {
  std::shared_ptr<void> keep;
  std::function<void(Status)> on_sent;
  UcxTransport* t;
};

void OnSent(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<SendCtx> ctx(static_cast<SendCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  if (ctx->on_sent) {
    Status s = status == UCS_OK ? Status::Ok() : FromUcs(status, "send");
    ctx->t->Defer([fn = std::move(ctx->on_sent), s = std::move(s)]() mutable { fn(std::move(s)); });
  }
}

// Runs a UCX request to completion through `cb`, handling the immediate
// (NULL) and failed-to-start (error pointer) cases the same way.
template <class Ctx>
void Track(void* req, Ctx* ctx, void (*cb)(void*, ucs_status_t, void*)) {
  if (req == nullptr) {
    cb(nullptr, UCS_OK, ctx);
  } else if (UCS_PTR_IS_ERR(req)) {
    cb(nullptr, UCS_PTR_STATUS(req), ctx);
  }
}

}  // namespace

// A chunk or a rendezvous message being received.
struct UcxConn::Landing {
  std::shared_ptr<UcxConn> conn;
  // Chunks: the sender's op, the checksum it announced, the window landing.
  uint64_t op = 0, xxh3 = 0;
  transport::Landing window;
  // Messages: the buffer a rendezvous message lands in.
  uint64_t seq = 0;
  std::string message;
  bool counted = false;  // in rndv_in_flight_
};

UcxConn::UcxConn(UcxTransport* transport, std::string peer, State s, uint64_t deadline_us)
    : state(s), t_(transport), peer_(std::move(peer)), deadline_us_(deadline_us) {}

uint32_t UcxConn::capabilities() const { return t_->capabilities(); }

std::string UcxConn::Describe() const {
  MutexLock lock(mu_);
  return "ucx lanes: " + (lanes_.empty() ? std::string("?") : lanes_);
}

void UcxConn::RecordLanes() {
  char* text = nullptr;
  size_t text_bytes = 0;
  FILE* out = open_memstream(&text, &text_bytes);
  if (out == nullptr) return;
  ucp_ep_print_info(ep, out);
  std::fclose(out);
  const std::string info(text, text_bytes);
  std::free(text);
  // Lines look like "#                lane[0]:  2:tcp/lo.0 md[1] ...".
  std::set<std::string> names;
  for (size_t at = info.find("lane["); at != std::string::npos; at = info.find("lane[", at + 1)) {
    const size_t colon = info.find(':', info.find("]:", at) + 2);
    if (colon == std::string::npos) break;
    const size_t end = info.find_first_of(" \n", colon);
    std::string name = info.substr(colon + 1, end - colon - 1);
    if (const size_t dot = name.rfind('.'); dot != std::string::npos && name.find('/') < dot) {
      name.resize(dot);  // "tcp/lo.0" -> "tcp/lo"
    }
    names.insert(name);
  }
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : " ") + n;
  MutexLock lock(mu_);
  lanes_ = joined;
}

Status UcxConn::Admit() {
  MutexLock lock(mu_);
  TERN_REQUIRE(!closed_, kUnavailable, "ucx: connection to ", peer_, " is closed");
  TERN_REQUIRE(in_flight_ < t_->options().max_queued_ops, kResourceExhausted, "ucx: ", in_flight_,
               " operations already in flight to ", peer_);
  ++in_flight_;
  return Status::Ok();
}

void UcxConn::Release() {
  MutexLock lock(mu_);
  --in_flight_;
}

uint64_t UcxConn::AddPending(Completion done) {
  MutexLock lock(mu_);
  const uint64_t op = next_op_++;
  pending_[op] = PendingOp{std::move(done), t_->NowUs() + t_->options().op_timeout_ms * 1000};
  return op;
}

void UcxConn::FinishOp(uint64_t op, Status status) {
  Completion done;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(op);
    if (it == pending_.end()) return;
    done = std::move(it->second.done);
    pending_.erase(it);
    --in_flight_;
  }
  Complete(done, std::move(status));
}

void UcxConn::SendAm(unsigned id, std::string_view header, const void* data, size_t length,
                     ucp_mem_h memh, std::shared_ptr<void> keep,
                     std::function<void(Status)> on_sent) {
  auto* ctx = new SendCtx{std::move(keep), std::move(on_sent), t_};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = OnSent;
  param.user_data = ctx;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  Track(ucp_am_send_nbx(ep, id, header.data(), header.size(), data, length, &param), ctx, OnSent);
}

void UcxConn::SendHello() {
  auto header = std::make_shared<std::string>(EncodeHello(Hello{}));
  SendAm(kAmHello, *header, nullptr, 0, nullptr, header, nullptr);
}

void UcxConn::SendAck(uint64_t op, const Status& status) {
  auto header = std::make_shared<std::string>(
      EncodeStatus(StatusHeader{op, WireCode(status)}));
  std::string reason = status.message().substr(0, kMaxReasonBytes);
  auto keep = std::make_shared<std::pair<std::string, std::string>>(std::move(*header), std::move(reason));
  SendAm(kAmAck, keep->first, keep->second.data(), keep->second.size(), nullptr, keep, nullptr);
}

void UcxConn::SendMessage(std::string payload, Completion done) {
  if (payload.size() > kMaxMessageBytes) {
    return Complete(done, TERN_ERROR(kOutOfRange, "ucx: message of ", payload.size(),
                                     " bytes exceeds ", kMaxMessageBytes));
  }
  Status admitted = Admit();
  if (!admitted.ok()) return Complete(done, std::move(admitted));
  auto self = shared_from_this();
  t_->Post([self, payload = std::move(payload), done = std::move(done)]() mutable {
    if (self->state != State::kOpen) {
      self->Release();
      return Complete(done, TERN_ERROR(kUnavailable, "ucx: connection to ", self->peer_, " is closed"));
    }
    auto keep = std::make_shared<std::pair<std::string, std::string>>(
        EncodeMessage(self->next_send_seq_++), std::move(payload));
    self->SendAm(kAmMessage, keep->first, keep->second.data(), keep->second.size(), nullptr, keep,
                 [self, done = std::move(done)](Status s) {
                   self->Release();
                   Complete(done, std::move(s));
                 });
  });
}

void UcxConn::SendChunk(const ChunkSend& chunk, Completion done) {
  const MemoryRegion& src = chunk.src;
  if (chunk.length == 0 || chunk.length > kMaxChunkBytes || src.base == nullptr ||
      chunk.src_offset > src.size_bytes || chunk.length > src.size_bytes - chunk.src_offset) {
    return Complete(done, TERN_ERROR(kInvalidArgument, "ucx: chunk outside its registered source"));
  }
  if (src.kind != MemoryKind::kHost) {
    return Complete(done, TERN_ERROR(kUnsupported, "ucx: chunks must come from host memory "
                                                   "(their checksum is computed on the host)"));
  }
  Result<ucp_mem_h> memh = t_->Lookup(src);
  if (!memh.ok()) return Complete(done, memh.status());
  Status admitted = Admit();
  if (!admitted.ok()) return Complete(done, std::move(admitted));
  const uint8_t* data = static_cast<const uint8_t*>(src.base) + chunk.src_offset;
  ChunkHeader h{0, chunk.transfer_id, chunk.dst_offset, chunk.length,
                chunk.xxh3 ? *chunk.xxh3 : Xxh3(data, chunk.length)};
  h.op = AddPending(std::move(done));  // keeps the admission slot until FinishOp
  auto self = shared_from_this();
  t_->Post([self, h, data, memh = *memh] {
    if (self->state != State::kOpen) {
      return self->FinishOp(h.op, TERN_ERROR(kUnavailable, "ucx: connection to ", self->peer_, " is closed"));
    }
    auto header = std::make_shared<std::string>(EncodeChunk(h));
    self->SendAm(kAmChunk, *header, data, h.length, memh, header, [self, op = h.op](Status s) {
      if (!s.ok()) self->FinishOp(op, std::move(s));  // else the peer's ack finishes it
    });
  });
}

Status UcxConn::PostReceive(uint64_t transfer_id, const MemoryRegion& dst, uint64_t dst_offset,
                            uint64_t length_bytes, ChunkLanded on_landed) {
  TERN_REQUIRE(dst.kind == MemoryKind::kHost, kUnsupported,
               "ucx: chunk windows must be host memory (checksums are verified on the host)");
  TERN_ASSIGN_OR_RETURN(ucp_mem_h memh, t_->Lookup(dst));
  return windows_.Post(transfer_id, dst, dst_offset, length_bytes, std::move(on_landed),
                       reinterpret_cast<uint64_t>(memh));
}

void UcxConn::CancelReceive(uint64_t transfer_id) {
  // A landing in progress may still write (UCX owns the receive); wait for
  // it unless we are the thread that would finish it. Bounded: a receive
  // that never completes is failed by the op timeout of its connection.
  windows_.Cancel(transfer_id,
                  transport::LandingWait{!t_->OnProgressThread(), t_->options().op_timeout_ms});
}

Result<std::string> UcxConn::ExportRegion(const MemoryRegion& region) { return t_->PackKey(region); }

void UcxConn::Write(const MemoryRegion& src, uint64_t src_offset, std::string_view remote_key,
                    uint64_t dst_offset, uint64_t length, Completion done) {
  RemoteKey key;
  Status st = DecodeRemoteKey(remote_key, &key);
  if (st.ok()) st = CheckWriteRanges("ucx", src, src_offset, key.size_bytes, dst_offset, length);
  Result<ucp_mem_h> memh = st.ok() ? t_->Lookup(src) : Result<ucp_mem_h>(st);
  if (!memh.ok()) return Complete(done, memh.status());
  Status admitted = Admit();
  if (!admitted.ok()) return Complete(done, std::move(admitted));
  const uint64_t op = AddPending(std::move(done));
  auto self = shared_from_this();
  const uint8_t* data = static_cast<const uint8_t*>(src.base) + src_offset;
  t_->Post([self, op, data, length, key = std::move(key), dst_offset, memh = *memh] {
    if (self->state != State::kOpen) {
      return self->FinishOp(op, TERN_ERROR(kUnavailable, "ucx: connection to ", self->peer_, " is closed"));
    }
    ucp_rkey_h rkey = nullptr;
    ucs_status_t us = ucp_ep_rkey_unpack(self->ep, key.rkey.data(), &rkey);
    if (us != UCS_OK) return self->FinishOp(op, FromUcs(us, "unpacking the peer's rkey"));
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
    void* put = ucp_put_nbx(self->ep, data, length, key.base + dst_offset, rkey, &param);
    if (UCS_PTR_IS_ERR(put)) {
      ucp_rkey_destroy(rkey);
      return self->FinishOp(op, FromUcs(UCS_PTR_STATUS(put), "ucp_put_nbx"));
    }
    if (put != nullptr) ucp_request_free(put);  // the flush below reports completion
    // Remote completion: the flush ends after the put is in the peer's memory.
    auto* ctx = new SendCtx{nullptr, [self, op, rkey](Status s) {
                              ucp_rkey_destroy(rkey);
                              self->FinishOp(op, std::move(s));
                            },
                            self->t_};
    ucp_request_param_t fp{};
    fp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    fp.cb.send = OnSent;
    fp.user_data = ctx;
    Track(ucp_ep_flush_nbx(self->ep, &fp), ctx, OnSent);
  });
}

// Synchronous (transport.h): waits until the endpoint is closed, so UCX no
// longer reads our chunk sources or writes our windows. From a callback on
// the progress thread it cannot wait; the close then finishes behind it.
void UcxConn::Close() {
  auto self = shared_from_this();
  {
    MutexLock lock(mu_);
    if (released_) return;
  }
  t_->Post([self] { self->Shutdown(Status::Ok(), Code::kCancelled, Bye::kSend); });
  if (t_->OnProgressThread()) return;
  MutexLock lock(mu_);
  if (!cv_.WaitUntil(std::chrono::steady_clock::now() + kCloseWait,
                     [&]() REQUIRES(mu_) { return released_; })) {
    t_->Log("ucx: close of " + peer_ + " did not finish in time");
  }
}

// ---- progress thread ----

void UcxConn::ProtocolError(const Status& why) {
  if (state == State::kClosed) return;  // traffic racing our close
  t_->Log("ucx: closing " + peer_ + ": " + why.ToString());
  auto self = shared_from_this();
  t_->Defer([self, why] { self->Shutdown(why, Code::kUnavailable, Bye::kNone); });
}

void UcxConn::OnHello(std::string_view header) {
  if (state != State::kAwaitHello) return ProtocolError(TERN_ERROR(kProtocol, "unexpected ucx hello"));
  Hello hello;
  Status st = DecodeHello(header, &hello);
  if (!st.ok()) return RefuseHello(st);
  state = State::kOpen;
  t_->Defer([self = shared_from_this()] {
    if (self->state != State::kOpen) return;
    self->RecordLanes();
    const bool accepted =
        self->on_accept->Call(self, [&](ConnectionHandlers h) { self->handlers = std::move(h); });
    self->on_accept.reset();
    if (!accepted) return self->RefuseHello(TERN_ERROR(kUnavailable, "ucx: the listener is closed"));
    auto header = std::make_shared<std::string>(EncodeStatus(StatusHeader{}));
    self->SendAm(kAmHelloAck, *header, nullptr, 0, nullptr, header, nullptr);
  });
}

void UcxConn::RefuseHello(const Status& why) {
  t_->Log("ucx: rejected " + peer_ + ": " + why.ToString());
  auto keep = std::make_shared<std::pair<std::string, std::string>>(
      EncodeStatus(StatusHeader{0, WireCode(why)}), why.message().substr(0, kMaxReasonBytes));
  SendAm(kAmHelloAck, keep->first, keep->second.data(), keep->second.size(), nullptr, keep, nullptr);
  // Flushed, so the hello-ack with the reason reaches the peer first.
  t_->Defer([self = shared_from_this(), why] { self->Shutdown(why, Code::kUnavailable, Bye::kNoneFlush); });
  state = State::kClosed;  // nothing more is accepted from it
}

void UcxConn::OnHelloAck(std::string_view header, std::string_view reason) {
  if (state != State::kConnecting) return ProtocolError(TERN_ERROR(kProtocol, "unexpected ucx hello-ack"));
  StatusHeader h;
  Status st = DecodeStatus(header, &h);
  if (st.ok()) st = StatusFromWire(h.code, "peer", reason);
  auto self = shared_from_this();
  if (!st.ok()) {
    t_->Defer([self, st] { self->Shutdown(st, Code::kUnavailable, Bye::kNone); });
    return;
  }
  state = State::kOpen;
  t_->Defer([self] {
    if (self->ep != nullptr) self->RecordLanes();
    ConnectDone done = std::move(self->connect_done);
    self->connect_done = nullptr;
    if (done) done(std::shared_ptr<Connection>(self));
  });
}

ucs_status_t UcxConn::OnMessage(std::string_view header, void* data, size_t length, bool rndv) {
  uint64_t seq = 0;
  Status st = state == State::kOpen ? DecodeMessage(header, &seq)
                                    : TERN_ERROR(kProtocol, "ucx message before the handshake");
  if (st.ok() && (seq < next_recv_seq_ || seq - next_recv_seq_ > kMaxSeqGap || reorder_.count(seq))) {
    st = TERN_ERROR(kProtocol, "ucx message seq ", seq, " unexpected (next ", next_recv_seq_, ")");
  }
  if (st.ok() && length > kMaxMessageBytes) {
    st = TERN_ERROR(kProtocol, "ucx message of ", length, " bytes exceeds ", kMaxMessageBytes);
  }
  if (st.ok() && inbound_bytes_ + length > t_->options().max_inbound_bytes) {
    st = TERN_ERROR(kResourceExhausted, "ucx: peer has ", inbound_bytes_ + length,
                    " message bytes buffered, over ", t_->options().max_inbound_bytes);
  }
  if (!st.ok()) {
    ProtocolError(st);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  inbound_bytes_ += length;
  if (!rndv) {
    Deliver(seq, std::string(static_cast<const char*>(data), length));
    return UCS_OK;
  }
  auto* landing = new Landing{shared_from_this(), 0, 0, {}, seq, std::string(length, '\0')};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    std::unique_ptr<Landing> l(static_cast<Landing*>(user_data));
    if (request != nullptr) ucp_request_free(request);
    auto* conn = l->conn.get();
    if (l->counted) conn->RndvDone();
    conn->t_->Defer([l = std::shared_ptr<Landing>(std::move(l)), status] {
      UcxConn* c = l->conn.get();
      if (status != UCS_OK) return c->ProtocolError(FromUcs(status, "receiving a message"));
      c->Deliver(l->seq, std::move(l->message));
    });
  };
  param.user_data = landing;
  void* req = ucp_am_recv_data_nbx(t_->worker(), data, landing->message.data(), length, &param);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    param.cb.recv_am(nullptr, req == nullptr ? UCS_OK : UCS_PTR_STATUS(req), length, landing);
  } else {
    landing->counted = true;
    ++rndv_in_flight_;
  }
  return UCS_INPROGRESS;
}

void UcxConn::Deliver(uint64_t seq, std::string payload) {
  if (state != State::kOpen) return;
  reorder_.emplace(seq, std::move(payload));
  auto self = shared_from_this();
  for (auto it = reorder_.begin(); it != reorder_.end() && it->first == next_recv_seq_;
       it = reorder_.erase(it)) {
    ++next_recv_seq_;
    inbound_bytes_ -= it->second.size();
    t_->Defer([self, p = std::move(it->second)]() mutable {
      if (self->state == State::kOpen && self->handlers.on_message) self->handlers.on_message(std::move(p));
    });
  }
}

ucs_status_t UcxConn::OnChunk(std::string_view header, void* data, size_t length, bool rndv) {
  ChunkHeader h;
  Status st = state == State::kOpen ? DecodeChunk(header, length, &h)
                                    : TERN_ERROR(kProtocol, "ucx chunk before the handshake");
  if (!st.ok()) {
    ProtocolError(st);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  Result<transport::Landing> placed = windows_.Begin(h.transfer_id, h.dst_offset, h.length);
  if (!placed.ok()) {
    SendAck(h.op, placed.status());
    return UCS_OK;  // drops a rendezvous descriptor; the sender sees our ack
  }
  auto landing = std::make_unique<Landing>(Landing{shared_from_this(), h.op, h.xxh3, *placed, 0, {}});
  auto* memh = reinterpret_cast<ucp_mem_h>(placed->handle);
  if (!rndv) {
    std::memcpy(landing->window.dst, data, h.length);
    t_->Defer([l = std::shared_ptr<Landing>(std::move(landing))]() mutable {
      l->conn->FinishLanding(std::make_unique<Landing>(std::move(*l)), Status::Ok());
    });
    return UCS_OK;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMH;
  param.memh = memh;
  param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    std::shared_ptr<Landing> l(static_cast<Landing*>(user_data));
    if (request != nullptr) ucp_request_free(request);
    if (l->counted) l->conn->RndvDone();
    Status s = status == UCS_OK ? Status::Ok() : FromUcs(status, "receiving a chunk");
    l->conn->t_->Defer([l, s]() mutable {
      l->conn->FinishLanding(std::make_unique<Landing>(std::move(*l)), std::move(s));
    });
  };
  Landing* raw = landing.release();
  param.user_data = raw;
  void* req = ucp_am_recv_data_nbx(t_->worker(), data, raw->window.dst, h.length, &param);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    param.cb.recv_am(nullptr, req == nullptr ? UCS_OK : UCS_PTR_STATUS(req), h.length, raw);
  } else {
    raw->counted = true;
    ++rndv_in_flight_;
  }
  return UCS_INPROGRESS;
}

void UcxConn::FinishLanding(std::unique_ptr<Landing> l, Status status) {
  status = windows_.Finish(l->window, std::move(status), l->xxh3);
  if (state == State::kOpen) SendAck(l->op, status);
}

void UcxConn::OnAck(std::string_view header, std::string_view reason) {
  StatusHeader h;
  Status st = DecodeStatus(header, &h);
  if (!st.ok()) return ProtocolError(st);
  auto self = shared_from_this();
  t_->Defer([self, op = h.op, s = StatusFromWire(h.code, "peer", reason)]() mutable {
    self->FinishOp(op, std::move(s));
  });
}

void UcxConn::CheckDeadlines(uint64_t now_us) {
  if (closing_) {
    if (now_us >= deadline_us_) ByeAnswered();  // no answer: close anyway
    return;
  }
  if (draining_) {
    if (now_us >= deadline_us_) CloseEndpointNow(/*flush=*/true);
    return;
  }
  if (shut_) {
    if (now_us >= deadline_us_ && finish_) {
      t_->Log("ucx: closing the endpoint to " + peer_ + " did not finish in time");
      Released();
    }
    return;
  }
  if (state == State::kConnecting || state == State::kAwaitHello) {
    if (now_us < deadline_us_) return;
    Shutdown(TERN_ERROR(kTimeout, "ucx: ", state == State::kConnecting ? "connect to " : "hello from ",
                        peer_, " timed out"),
             Code::kTimeout, Bye::kNone);
    return;
  }
  bool expired = false;
  {
    MutexLock lock(mu_);
    for (auto& [op, p] : pending_) expired |= p.deadline_us <= now_us;
  }
  if (expired) {
    Shutdown(TERN_ERROR(kTimeout, "ucx: ", peer_, " did not acknowledge within ",
                        t_->options().op_timeout_ms, " ms"),
             Code::kTimeout, Bye::kNone);
  }
}

void UcxConn::ByeAnswered() {
  if (!closing_) return;
  closing_ = false;
  // Flush mode: requests still in flight finish first (Close waits, bounded
  // by kReleaseUs). A forced close is no shortcut here: UCX 1.13 aborts
  // (ucp_ep_destroy_base: proto_reqs not empty) when it meets a rendezvous
  // receive still in flight on a healthy endpoint.
  CloseEndpoint(/*flush=*/true);
}

void UcxConn::Abandon() {
  closing_ = false;
  if (ep != nullptr) CloseEndpointNow(/*flush=*/true);
}

void UcxConn::CloseEndpoint(bool flush) {
  if (ep != nullptr && flush && rndv_in_flight_ > 0) {
    draining_ = true;  // RndvDone or CheckDeadlines closes it
    deadline_us_ = t_->NowUs() + kDrainUs;
    return;
  }
  CloseEndpointNow(flush);
}

void UcxConn::RndvDone() {
  --rndv_in_flight_;
  if (rndv_in_flight_ > 0 || !draining_) return;
  // Called inside UCX: close after this progress call returns.
  auto self = shared_from_this();
  t_->Defer([self] {
    if (self->draining_) self->CloseEndpointNow(/*flush=*/true);
  });
}

void UcxConn::CloseEndpointNow(bool flush) {
  draining_ = false;
  deadline_us_ = t_->NowUs() + kReleaseUs;
  if (ep == nullptr) return Released();
  ucp_ep_h closing = ep;
  ep = nullptr;
  t_->CloseEp(shared_from_this(), closing, flush);
}

void UcxConn::Released() {
  std::function<void()> finish = std::move(finish_);
  finish_ = nullptr;
  if (finish) finish();
  windows_.EndAll();  // UCX has let go of the endpoint: no receive writes a window now
  MutexLock lock(mu_);
  released_ = true;
  cv_.SignalAll();
}

void UcxConn::Shutdown(Status why, Code pending_code, Bye bye) {
  if (shut_) return;
  shut_ = true;
  const State prev = state;
  state = State::kClosed;
  std::map<uint64_t, PendingOp> pending;
  {
    MutexLock lock(mu_);
    closed_ = true;
    pending.swap(pending_);
    in_flight_ -= static_cast<uint32_t>(pending.size());
  }
  windows_.Close();  // nothing lands from here on; landings in flight end with the endpoint
  // Completions wait for Released: a pending chunk's source stays in use
  // until UCX has let go of the endpoint's requests.
  const Status pending_status =
      pending_code == Code::kCancelled
          ? TERN_ERROR(kCancelled, "ucx: connection closed")
          : Status(pending_code, why.ok() ? "ucx: peer closed the connection" : why.message());
  ConnectDone connect = prev == State::kConnecting ? std::move(connect_done) : nullptr;
  std::function<void(Status)> on_closed;
  if (prev == State::kOpen && !on_accept) on_closed = std::move(handlers.on_closed);
  handlers = {};
  on_accept.reset();
  connect_done = nullptr;
  finish_ = [this, pending = std::move(pending), pending_status, connect = std::move(connect),
             on_closed = std::move(on_closed), why]() mutable {
    for (auto& [op, p] : pending) Complete(p.done, pending_status);
    if (connect) connect(why.ok() ? TERN_ERROR(kUnavailable, "ucx: connect to ", peer_, " closed") : why);
    if (on_closed) on_closed(why);
  };
  const bool open = prev == State::kOpen && ep != nullptr;
  if (open && bye == Bye::kSend) {
    SendAm(kAmBye, {}, nullptr, 0, nullptr, nullptr, nullptr);
    closing_ = true;
    deadline_us_ = t_->NowUs() + kByeWaitUs;
    return;
  }
  if (open && bye == Bye::kAnswer) SendAm(kAmBye, {}, nullptr, 0, nullptr, nullptr, nullptr);
  CloseEndpoint(/*flush=*/bye != Bye::kNone);
}

}  // namespace tern::ucx

// The UCX backend: context, worker, progress thread, listeners, memory
// registration. One endpoint's protocol lives in ucx_conn.cc.
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "base/text.h"
#include "transport/internal.h"
#include "transport/net/socket.h"
#include "transport/ucx/ucx_impl.h"

namespace tern {
namespace ucx {

namespace {

// Wake-ups are event driven; this bounds the wait in case a UCX transport
// cannot raise events, and paces deadline checks.
constexpr int kPollMs = 5;
constexpr uint64_t kDeadlineCheckUs = 20'000;
constexpr uint64_t kCloseDrainUs = 2'000'000;

Status Resolve(const std::string& address, bool passive, sockaddr_storage* out, socklen_t* len) {
  TERN_ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string service = std::to_string(hp.port);
  const int rc = getaddrinfo(hp.host.c_str(), service.c_str(), &hints, &res);
  TERN_REQUIRE(rc == 0, kInvalidArgument, "ucx: cannot resolve '", address, "': ", gai_strerror(rc));
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return Status::Ok();
}

struct EpCloseCtx {
  UcxTransport* t;
  std::shared_ptr<UcxConn> conn;
};

void OnEpClosed(void* request, ucs_status_t, void* user_data) {
  std::unique_ptr<EpCloseCtx> ctx(static_cast<EpCloseCtx*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  ctx->t->Defer([t = ctx->t, conn = std::move(ctx->conn)] { t->EpClosed(conn); });
}

void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* t = static_cast<UcxTransport*>(arg);
  if (UcxConn* conn = t->Find(ep)) {
    auto self = conn->shared_from_this();
    t->Defer([self, status] {
      if (self->closing()) return self->ByeAnswered();
      self->Shutdown(FromUcs(status, "peer " + self->peer_address()), Code::kUnavailable,
                     UcxConn::Bye::kNone);
    });
  }
}

void OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* state = static_cast<ListenState*>(arg);
  state->transport->Accept(state, request);
}

UcxConn* ConnOf(void* arg, const ucp_am_recv_param_t* param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
  return static_cast<UcxTransport*>(arg)->Find(param->reply_ep);
}

std::string_view View(const void* p, size_t n) { return {static_cast<const char*>(p), n}; }

ucs_status_t AmHello(void* arg, const void* header, size_t header_length, void*, size_t,
                     const ucp_am_recv_param_t* param) {
  if (UcxConn* c = ConnOf(arg, param)) c->OnHello(View(header, header_length));
  return UCS_OK;
}
ucs_status_t AmHelloAck(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  UcxConn* c = ConnOf(arg, param);
  if (c == nullptr) return UCS_OK;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) length = 0;  // reasons are short
  c->OnHelloAck(View(header, header_length), View(data, std::min<size_t>(length, kMaxReasonBytes)));
  return UCS_OK;
}
ucs_status_t AmMessage(void* arg, const void* header, size_t header_length, void* data,
                       size_t length, const ucp_am_recv_param_t* param) {
  UcxConn* c = ConnOf(arg, param);
  if (c == nullptr) return UCS_OK;
  return c->OnMessage(View(header, header_length), data, length,
                      param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
}
ucs_status_t AmChunk(void* arg, const void* header, size_t header_length, void* data,
                     size_t length, const ucp_am_recv_param_t* param) {
  UcxConn* c = ConnOf(arg, param);
  if (c == nullptr) return UCS_OK;
  return c->OnChunk(View(header, header_length), data, length,
                    param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
}
ucs_status_t AmAck(void* arg, const void* header, size_t header_length, void* data, size_t length,
                   const ucp_am_recv_param_t* param) {
  UcxConn* c = ConnOf(arg, param);
  if (c == nullptr) return UCS_OK;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) length = 0;
  c->OnAck(View(header, header_length), View(data, std::min<size_t>(length, kMaxReasonBytes)));
  return UCS_OK;
}
ucs_status_t AmBye(void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t* param) {
  UcxConn* c = ConnOf(arg, param);
  if (c == nullptr) return UCS_OK;
  auto self = c->shared_from_this();
  static_cast<UcxTransport*>(arg)->Defer([self] {
    if (self->closing()) return self->ByeAnswered();  // the answer to our bye
    // Answer with our own bye, so the peer may close its endpoint.
    self->Shutdown(Status::Ok(), Code::kUnavailable, UcxConn::Bye::kAnswer);
  });
  return UCS_OK;
}

class UcxListener final : public Listener {
 public:
  UcxListener(UcxTransport* t, std::shared_ptr<ListenState> state, std::string address)
      : t_(t), state_(std::move(state)), address_(std::move(address)) {}
  ~UcxListener() override { Close(); }
  std::string address() const override { return address_; }
  void Close() override {
    if (!state_->closed.exchange(true)) {
      auto state = state_;
      t_->RunSync([state] {
        if (state->listener != nullptr) ucp_listener_destroy(state->listener);
        state->listener = nullptr;
      });
    }
    state_->on_accept->Close();  // the progress thread may be in the handler
  }

 private:
  UcxTransport* t_;
  std::shared_ptr<ListenState> state_;
  std::string address_;
};

}  // namespace

Status FromUcs(ucs_status_t status, std::string_view what) {
  Code code = Code::kIo;
  switch (status) {
    case UCS_ERR_CANCELED: code = Code::kCancelled; break;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT: code = Code::kTimeout; break;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: code = Code::kUnavailable; break;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT: code = Code::kResourceExhausted; break;
    case UCS_ERR_UNSUPPORTED: code = Code::kUnsupported; break;
    case UCS_ERR_INVALID_PARAM: code = Code::kInvalidArgument; break;
    default: break;
  }
  return Status(code, internal::StrCat("ucx: ", what, ": ", ucs_status_string(status)));
}

UcxTransport::UcxTransport(UcxOptions options, Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

Status UcxTransport::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return FromUcs(st, "reading UCX configuration");
  if (!options_.tls.empty()) st = ucp_config_modify(config, "TLS", options_.tls.c_str());
  if (st == UCS_OK && !options_.net_devices.empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", options_.net_devices.c_str());
  }
  if (st != UCS_OK) {
    ucp_config_release(config);
    return FromUcs(st, "setting TLS='" + options_.tls + "' NET_DEVICES='" + options_.net_devices + "'");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // RegisterMemory runs on callers' threads
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return FromUcs(st, "ucp_init");

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &attr) == UCS_OK) {
    cuda_ = attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA);
  }

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return FromUcs(st, "ucp_worker_create");
  if (ucp_worker_get_efd(worker_, &worker_fd_) != UCS_OK) worker_fd_ = -1;

  struct Handler {
    AmId id;
    ucp_am_recv_callback_t cb;
  };
  for (const Handler& h : {Handler{kAmHello, AmHello}, Handler{kAmHelloAck, AmHelloAck},
                           Handler{kAmMessage, AmMessage}, Handler{kAmChunk, AmChunk},
                           Handler{kAmAck, AmAck}, Handler{kAmBye, AmBye}}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = h.id;
    hp.cb = h.cb;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) return FromUcs(st, "ucp_worker_set_am_recv_handler");
  }

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return TERN_ERRNO("ucx: eventfd");
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    Post([this] {
      std::vector<std::shared_ptr<UcxConn>> conns;
      for (auto& [ep, conn] : eps_) conns.push_back(conn);
      for (auto& conn : conns) {
        // No time to wait for answers: bye, flush, close.
        conn->Shutdown(TERN_ERROR(kCancelled, "ucx transport destroyed"), Code::kCancelled,
                       UcxConn::Bye::kAnswer);
        conn->Abandon();
      }
      for (auto& state : listens_) {
        state->closed = true;
        if (state->listener != nullptr) ucp_listener_destroy(state->listener);
        state->listener = nullptr;
      }
      MutexLock lock(cmd_mu_);
      stop_ = true;
    });
    thread_.join();
    // Closes that did not finish within kCloseDrainUs: complete their work
    // anyway (bounded; UCX is torn down below).
    for (const auto& conn : std::vector<std::shared_ptr<UcxConn>>(releasing_.begin(), releasing_.end())) {
      conn->Released();
    }
    releasing_.clear();
  }
  {
    MutexLock lock(reg_mu_);
    for (auto& [handle, reg] : registrations_) ucp_mem_unmap(context_, reg.memh);
    registrations_.clear();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxTransport::Post(std::function<void()> fn) {
  {
    MutexLock lock(cmd_mu_);
    commands_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void UcxTransport::RunSync(const std::function<void()>& fn) {
  if (OnProgressThread()) return fn();
  std::promise<void> done;
  Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

void UcxTransport::RunCommandsAndDeferred() {
  // Bounded per round so a flood of commands cannot starve UCX progress.
  for (int round = 0; round < 1024; ++round) {
    std::function<void()> fn;
    {
      MutexLock lock(cmd_mu_);
      if (commands_.empty()) break;
      fn = std::move(commands_.front());
      commands_.pop_front();
    }
    fn();
  }
  while (!deferred_.empty()) {
    std::vector<std::function<void()>> batch;
    batch.swap(deferred_);
    for (auto& fn : batch) fn();
  }
}

void UcxTransport::Run() {
  thread_id_ = std::this_thread::get_id();
  uint64_t next_check_us = 0;
  uint64_t drain_until_us = 0;
  for (;;) {
    RunCommandsAndDeferred();
    for (int i = 0; i < 256 && ucp_worker_progress(worker_) != 0; ++i) {
    }
    RunCommandsAndDeferred();
    const uint64_t now = NowUs();
    if (now >= next_check_us) {
      next_check_us = now + kDeadlineCheckUs;
      std::vector<std::shared_ptr<UcxConn>> conns;
      for (auto& [ep, conn] : eps_) conns.push_back(conn);
      conns.insert(conns.end(), releasing_.begin(), releasing_.end());
      for (auto& conn : conns) conn->CheckDeadlines(now);
    }
    {
      MutexLock lock(cmd_mu_);
      if (stop_) {
        if (drain_until_us == 0) drain_until_us = now + kCloseDrainUs;
        if (releasing_.empty() || now >= drain_until_us) return;
        continue;  // keep progressing until endpoints finished closing
      }
      if (!commands_.empty()) continue;
    }
    if (!deferred_.empty()) continue;
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {worker_fd_, POLLIN, 0}};
    const bool armed = worker_fd_ >= 0 && ucp_worker_arm(worker_) == UCS_OK;
    if (worker_fd_ >= 0 && !armed) continue;  // UCS_ERR_BUSY: events pending
    poll(fds, armed ? 2 : 1, kPollMs);
    uint64_t drained;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof(drained));
  }
}

uint32_t UcxTransport::capabilities() const {
  return kCapChunkChecksum | kCapOneSidedWrite | kCapCrossHost | (cuda_ ? uint32_t{kCapGpuMemory} : 0u);
}

Result<MemoryRegion> UcxTransport::RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) {
  TERN_REQUIRE(base != nullptr && size_bytes > 0, kInvalidArgument, "ucx: registering null or empty memory");
  TERN_REQUIRE(kind == MemoryKind::kHost || cuda_, kUnsupported,
               "ucx: this UCX build has no CUDA memory support (stage GPU memory through the host)");
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = base;
  mp.length = size_bytes;
  mp.memory_type = kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  ucp_mem_h memh = nullptr;
  const ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
  if (st != UCS_OK) return FromUcs(st, internal::StrCat("ucp_mem_map of ", size_bytes, " bytes"));
  MutexLock lock(reg_mu_);
  const uint64_t handle = next_handle_++;
  registrations_[handle] = Registration{base, size_bytes, kind, memh};
  return MemoryRegion{base, size_bytes, kind, handle};
}

Status UcxTransport::DeregisterMemory(const MemoryRegion& region) {
  ucp_mem_h memh;
  {
    MutexLock lock(reg_mu_);
    auto it = registrations_.find(region.handle);
    TERN_REQUIRE(it != registrations_.end() && it->second.base == region.base, kNotFound,
                 "ucx: region ", region.handle, " is not registered here");
    memh = it->second.memh;
    registrations_.erase(it);
  }
  const ucs_status_t st = ucp_mem_unmap(context_, memh);
  return st == UCS_OK ? Status::Ok() : FromUcs(st, "ucp_mem_unmap");
}

Result<ucp_mem_h> UcxTransport::Lookup(const MemoryRegion& region) const {
  MutexLock lock(reg_mu_);
  auto it = registrations_.find(region.handle);
  TERN_REQUIRE(it != registrations_.end() && it->second.base == region.base &&
                   it->second.size_bytes == region.size_bytes && it->second.kind == region.kind,
               kInvalidArgument, "ucx: memory region not registered with this transport");
  return it->second.memh;
}

Result<std::string> UcxTransport::PackKey(const MemoryRegion& region) {
  TERN_ASSIGN_OR_RETURN(ucp_mem_h memh, Lookup(region));
  void* buffer = nullptr;
  size_t size = 0;
  const ucs_status_t st = ucp_rkey_pack(context_, memh, &buffer, &size);
  if (st != UCS_OK) return FromUcs(st, "ucp_rkey_pack");
  RemoteKey key{reinterpret_cast<uint64_t>(region.base), region.size_bytes,
                std::string(static_cast<const char*>(buffer), size)};
  ucp_rkey_buffer_release(buffer);
  TERN_REQUIRE(key.rkey.size() <= kMaxRkeyBytes, kResourceExhausted, "ucx: rkey of ",
               key.rkey.size(), " bytes exceeds ", kMaxRkeyBytes);
  return EncodeRemoteKey(key);
}

UcxConn* UcxTransport::Find(ucp_ep_h ep) {
  auto it = eps_.find(ep);
  return it == eps_.end() ? nullptr : it->second.get();
}

void UcxTransport::CloseEp(const std::shared_ptr<UcxConn>& conn, ucp_ep_h ep, bool flush) {
  eps_.erase(ep);
  releasing_.insert(conn);
  auto* ctx = new EpCloseCtx{this, conn};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA;
  // A forced close is only defined when both sides detect peer failure. It
  // fails the endpoint's outstanding requests, so UCX stops touching their
  // buffers once it completes.
  param.flags = flush || !options_.detect_peer_failure ? 0u : uint32_t{UCP_EP_CLOSE_FLAG_FORCE};
  param.cb.send = OnEpClosed;
  param.user_data = ctx;
  void* req = ucp_ep_close_nbx(ep, &param);
  if (!UCS_PTR_IS_PTR(req)) OnEpClosed(nullptr, UCS_PTR_STATUS(req), ctx);  // done (or failed) at once
}

void UcxTransport::EpClosed(const std::shared_ptr<UcxConn>& conn) {
  releasing_.erase(conn);
  conn->Released();
}

void UcxTransport::Accept(ListenState* state, ucp_conn_request_h request) {
  if (state->closed || state->listener == nullptr) {
    if (state->listener != nullptr) ucp_listener_reject(state->listener, request);
    return;
  }
  std::string peer = "?";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer = net::SockaddrText(reinterpret_cast<const sockaddr*>(&attr.client_address));
  }
  if (eps_.size() >= options_.max_connections) {
    Log("ucx: rejected " + peer + ": " + std::to_string(eps_.size()) + " connections open");
    ucp_listener_reject(state->listener, request);
    return;
  }
  auto conn = std::make_shared<UcxConn>(this, peer, UcxConn::State::kAwaitHello,
                                        NowUs() + options_.handshake_timeout_ms * 1000);
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.conn_request = request;
  ep_params.err_mode = ErrMode();
  ep_params.err_handler.cb = OnEpError;
  ep_params.err_handler.arg = this;
  const ucs_status_t st = ucp_ep_create(worker_, &ep_params, &conn->ep);
  if (st != UCS_OK) {
    Log(FromUcs(st, "accepting " + peer).ToString());
    return;
  }
  conn->on_accept = state->on_accept;
  eps_[conn->ep] = conn;
}

Result<std::unique_ptr<Listener>> UcxTransport::Listen(const std::string& address,
                                                       AcceptHandler on_accept) {
  sockaddr_storage sa{};
  socklen_t sa_len = 0;
  TERN_RETURN_IF_ERROR(Resolve(address, /*passive=*/true, &sa, &sa_len));
  auto state = std::make_shared<ListenState>();
  state->on_accept = std::make_shared<transport::AcceptGate>(std::move(on_accept));
  state->transport = this;
  Status status;
  std::string bound;
  RunSync([&] {
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sa_len;
    lp.conn_handler.cb = OnConnRequest;
    lp.conn_handler.arg = state.get();
    ucs_status_t st = ucp_listener_create(worker_, &lp, &state->listener);
    if (st != UCS_OK) {
      state->listener = nullptr;
      status = FromUcs(st, "listen on " + address);
      return;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(state->listener, &attr);
    bound = st == UCS_OK ? net::SockaddrText(reinterpret_cast<const sockaddr*>(&attr.sockaddr))
                         : address;
    listens_.push_back(state);
  });
  TERN_RETURN_IF_ERROR(status);
  return std::unique_ptr<Listener>(std::make_unique<UcxListener>(this, state, bound));
}

void UcxTransport::Connect(const std::string& address, ConnectionHandlers handlers,
                           ConnectDone done) {
  sockaddr_storage sa{};
  socklen_t sa_len = 0;
  Status resolved = Resolve(address, /*passive=*/false, &sa, &sa_len);
  if (!resolved.ok()) return done(std::move(resolved));
  Post([this, address, sa, sa_len, handlers = std::move(handlers), done = std::move(done)]() mutable {
    auto conn = std::make_shared<UcxConn>(this, address, UcxConn::State::kConnecting,
                                          NowUs() + options_.connect_timeout_ms * 1000);
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    ep_params.sockaddr.addrlen = sa_len;
    ep_params.err_mode = ErrMode();
    ep_params.err_handler.cb = OnEpError;
    ep_params.err_handler.arg = this;
    const ucs_status_t st = ucp_ep_create(worker_, &ep_params, &conn->ep);
    if (st != UCS_OK) {
      Defer([done = std::move(done), s = FromUcs(st, "connect to " + address)]() { done(s); });
      return;
    }
    conn->handlers = std::move(handlers);
    conn->connect_done = std::move(done);
    eps_[conn->ep] = conn;
    conn->SendHello();
  });
}

}  // namespace ucx

Result<std::unique_ptr<Transport>> NewUcxTransport(UcxOptions options, Clock& clock) {
  auto t = std::make_unique<ucx::UcxTransport>(std::move(options), clock);
  Status st = t->Init();
  if (!st.ok()) return Status(Code::kUnavailable, st.message());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tern

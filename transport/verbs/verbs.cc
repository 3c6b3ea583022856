// The raw-verbs Transport: the device and protection domain, memory
// registration, the progress thread that handles every connection's
// completions, and the TCP side channel (listener, dialler, handshake) that
// brings queue pairs up. One connection's data path is verbs_conn.cc.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "transport/net/socket.h"
#include "transport/verbs/verbs_impl.h"

namespace tern {
namespace verbs {

using transport::Printable;

struct ListenState {
  ~ListenState() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  std::atomic<bool> closed{false};
  std::unique_ptr<transport::AcceptGate> gate;  // the accept handler
  int fd = -1;
  int wake_fd = -1;
  std::string address;
  Mutex mu;
  CondVar cv{&mu};
  bool loop_done GUARDED_BY(mu) = false;  // the accept loop let go of the sockets
};

namespace {

class VerbsListener final : public Listener {
 public:
  explicit VerbsListener(std::shared_ptr<ListenState> state) : state_(std::move(state)) {}
  ~VerbsListener() override { Close(); }
  std::string address() const override { return state_->address; }
  void Close() override {
    if (!state_->closed.exchange(true)) {
      const uint64_t one = 1;
      (void)!::write(state_->wake_fd, &one, sizeof one);
    }
    // The accept loop owns the sockets; it is gone once it said so.
    {
      MutexLock lock(state_->mu);
      state_->cv.Wait([&]() REQUIRES(state_->mu) { return state_->loop_done; });
    }
    state_->gate->Close();  // a handshake thread may be in the handler
  }

 private:
  std::shared_ptr<ListenState> state_;
};

// The side channel's blocking-with-deadline reads and writes.
Status WriteSide(net::Pipe& pipe, SideKind kind, std::string_view payload, uint64_t deadline_us,
                 Clock& clock) {
  const std::string bytes = EncodeSide(kind, payload);
  return net::WriteFull(pipe, bytes.data(), bytes.size(), deadline_us, clock);
}

Status ReadSide(net::Pipe& pipe, SideKind* kind, std::string* payload, uint64_t deadline_us,
                Clock& clock) {
  char header[kSideHeaderBytes];
  TERN_RETURN_IF_ERROR(net::ReadFull(pipe, header, sizeof header, deadline_us, clock));
  uint32_t length = 0;
  TERN_RETURN_IF_ERROR(DecodeSideHeader(std::string_view(header, sizeof header), kind, &length));
  payload->assign(length, '\0');
  if (length > 0) TERN_RETURN_IF_ERROR(net::ReadFull(pipe, payload->data(), length, deadline_us, clock));
  return Status::Ok();
}

}  // namespace

VerbsTransport::VerbsTransport(VerbsOptions options, Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

Status VerbsTransport::Init() {
  TERN_REQUIRE(options_.recv_buffers >= 4 && options_.recv_buffers <= 4096, kInvalidArgument,
               "verbs: recv_buffers ", options_.recv_buffers, " outside [4, 4096]");
  TERN_REQUIRE(options_.max_reads >= 1 && options_.max_reads <= 1024, kInvalidArgument,
               "verbs: max_reads ", options_.max_reads, " outside [1, 1024]");
  TERN_ASSIGN_OR_RETURN(api_, IbvApi::Load(options_.library));
  int count = 0;
  ibv_device** devices = api_->get_device_list(&count);
  TERN_REQUIRE(devices != nullptr && count > 0, kUnavailable, "verbs: ", options_.library,
               " loaded, 0 devices");
  Status found = TERN_ERROR(kUnavailable, "verbs: no active port",
                            options_.device.empty() ? "" : " on device " + options_.device);
  for (int d = 0; d < count && ctx_ == nullptr; ++d) {
    const std::string name = api_->get_device_name(devices[d]);
    if (!options_.device.empty() && name != options_.device) continue;
    ibv_context* ctx = api_->open_device(devices[d]);
    if (ctx == nullptr) {
      found = TERN_ERRNO("verbs: opening ", name);
      continue;
    }
    ibv_device_attr dev{};
    if (api_->query_device(ctx, &dev) != 0) {
      found = TERN_ERRNO("verbs: querying ", name);
      api_->close_device(ctx);
      continue;
    }
    for (uint8_t p = 1; p <= dev.phys_port_cnt && ctx_ == nullptr; ++p) {
      if (options_.port != 0 && p != options_.port) continue;
      ibv_port_attr attr{};
      if (QueryPort(*api_, ctx, p, &attr) != 0 || attr.state != IBV_PORT_ACTIVE) continue;
      ctx_ = ctx;
      device_name_ = name;
      port_ = p;
      ethernet_ = attr.link_layer == IBV_LINK_LAYER_ETHERNET;
      lid_ = attr.lid;
      mtu_bytes_ = MtuBytes(attr.active_mtu);
      // One SGE carries a Write: its length field has 32 bits.
      if (attr.max_msg_sz != 0) max_msg_bytes_ = std::min<uint64_t>(attr.max_msg_sz, 0xffffffffu);
      rd_atomic_ = static_cast<uint8_t>(
          std::clamp<int>(std::min(dev.max_qp_init_rd_atom, dev.max_qp_rd_atom), 1, 16));
      if (ethernet_) {
        ibv_gid gid{};
        if (api_->query_gid(ctx, p, options_.gid_index, &gid) != 0) {
          found = TERN_ERRNO("verbs: GID ", int{options_.gid_index}, " of ", name, ":", int{p});
          ctx_ = nullptr;
          continue;
        }
        std::memcpy(gid_, gid.raw, 16);
      }
    }
    if (ctx_ == nullptr) api_->close_device(ctx);
  }
  api_->free_device_list(devices);
  if (ctx_ == nullptr) return found;
  TERN_REQUIRE(mtu_bytes_ != 0, kUnavailable, "verbs: ", device_name_, " reports an unknown MTU");
  pd_ = api_->alloc_pd(ctx_);
  TERN_REQUIRE(pd_ != nullptr, kUnavailable, "verbs: allocating a protection domain on ",
               device_name_, ": ", std::strerror(errno));
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  TERN_REQUIRE(wake_fd_ >= 0, kUnavailable, "verbs: eventfd: ", std::strerror(errno));
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

VerbsTransport::~VerbsTransport() {
  {
    MutexLock lock(listen_mu_);
    for (auto& l : listens_) {
      if (l->closed.exchange(true)) continue;
      const uint64_t one = 1;
      (void)!::write(l->wake_fd, &one, sizeof one);
    }
  }
  threads_.WaitAll();  // accept loops and handshakes end (their sockets close)
  if (thread_.joinable()) {
    Post([this] {
      for (auto& c : conns_) c->Abandon();
      conns_.clear();
      MutexLock lock(cmd_mu_);
      stop_ = true;
    });
    thread_.join();
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  for (auto& [handle, r] : registrations_) api_->dereg_mr(r.mr);
  if (pd_ != nullptr) api_->dealloc_pd(pd_);
  if (ctx_ != nullptr) api_->close_device(ctx_);
}

Result<MemoryRegion> VerbsTransport::RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) {
  TERN_REQUIRE(kind == MemoryKind::kHost, kUnsupported,
               "verbs: GPU memory is not registered by this backend yet (stage via host, or use ucx)");
  TERN_REQUIRE(base != nullptr && size_bytes > 0, kInvalidArgument, "verbs: empty region");
  ibv_mr* mr = api_->reg_mr(pd_, base, size_bytes,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  TERN_REQUIRE(mr != nullptr, kResourceExhausted, "verbs: registering ", size_bytes, " bytes: ",
               std::strerror(errno), " (check ulimit -l)");
  MutexLock lock(reg_mu_);
  const uint64_t handle = next_handle_++;
  registrations_[handle] = {static_cast<uint8_t*>(base), size_bytes, mr};
  return MemoryRegion{base, size_bytes, kind, handle};
}

Status VerbsTransport::DeregisterMemory(const MemoryRegion& region) {
  ibv_mr* mr = nullptr;
  {
    MutexLock lock(reg_mu_);
    auto it = registrations_.find(region.handle);
    TERN_REQUIRE(it != registrations_.end() && it->second.base == region.base, kNotFound,
                 "verbs: region not registered with this transport");
    mr = it->second.mr;
    registrations_.erase(it);
  }
  TERN_REQUIRE(api_->dereg_mr(mr) == 0, kInternal, "verbs: deregistering: ", std::strerror(errno));
  return Status::Ok();
}

Result<VerbsTransport::LocalMemory> VerbsTransport::Lookup(const MemoryRegion& region) const {
  MutexLock lock(reg_mu_);
  auto it = registrations_.find(region.handle);
  TERN_REQUIRE(it != registrations_.end() && it->second.base == region.base &&
                   it->second.size_bytes == region.size_bytes,
               kInvalidArgument, "verbs: memory not registered with this transport");
  return LocalMemory{it->second.base, it->second.size_bytes, it->second.mr->lkey, it->second.mr->rkey};
}

void VerbsTransport::Post(std::function<void()> fn) {
  {
    MutexLock lock(cmd_mu_);
    commands_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void VerbsTransport::Register(std::shared_ptr<VerbsConn> conn) {
  Post([this, conn = std::move(conn)] { conns_.push_back(conn); });
}

bool VerbsTransport::AdmitConnection() {
  uint32_t n = connections_.load();
  while (n < options_.max_connections) {
    if (connections_.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}

void VerbsTransport::ConnectionGone() { connections_.fetch_sub(1); }

void VerbsTransport::Run() {
  thread_id_.store(std::this_thread::get_id());
  std::vector<pollfd> fds;
  std::vector<VerbsConn*> owners;  // per fds entry after the first
  for (;;) {
    std::deque<std::function<void()>> commands;
    {
      MutexLock lock(cmd_mu_);
      if (stop_) break;
      commands.swap(commands_);
    }
    for (auto& fn : commands) fn();
    {
      MutexLock lock(cmd_mu_);
      if (stop_) break;
    }
    const uint64_t now = clock_.NowUs();
    for (auto& c : conns_) c->CheckDeadlines(now);
    std::erase_if(conns_, [this](const std::shared_ptr<VerbsConn>& c) {
      if (!c->released()) return false;
      ConnectionGone();
      return true;
    });
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    owners.assign(1, nullptr);
    for (auto& c : conns_) {
      if (!c->polling()) continue;
      if (c->channel_fd() >= 0) {
        fds.push_back({c->channel_fd(), POLLIN, 0});
        owners.push_back(c.get());
      }
      if (c->side_fd() >= 0) {
        fds.push_back({c->side_fd(), POLLIN | POLLRDHUP, 0});
        owners.push_back(c.get());
      }
    }
    bool backlog = false;
    for (auto& c : conns_) backlog |= c->backlog();
    // 20 ms: the pace of deadline checks (ops, byes, flushes).
    const int ready = ::poll(fds.data(), fds.size(), backlog ? 0 : 20);
    if (backlog) {
      for (auto& c : conns_) {
        if (c->backlog()) c->DrainCq();
      }
    }
    if (ready <= 0) continue;
    if (fds[0].revents != 0) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof n);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == owners[i]->channel_fd()) {
        owners[i]->OnChannelReadable();
      } else {
        owners[i]->OnSideReadable();
      }
    }
  }
  thread_id_.store({});
}

Result<std::unique_ptr<Listener>> VerbsTransport::Listen(const std::string& address,
                                                          AcceptHandler on_accept) {
  TERN_ASSIGN_OR_RETURN(int fd, net::ListenSocket(address, /*buffer_bytes=*/0));
  auto state = std::make_shared<ListenState>();
  state->fd = fd;
  state->gate = std::make_unique<transport::AcceptGate>(std::move(on_accept));
  state->address = net::SocketAddress(fd, false);
  state->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (state->wake_fd < 0) {
    ::close(fd);
    return TERN_ERRNO("verbs: eventfd");
  }
  {
    MutexLock lock(listen_mu_);
    std::erase_if(listens_, [](const auto& l) { return l->closed.load(); });
    listens_.push_back(state);
  }
  threads_.Spawn([this, state] { AcceptLoop(state); });
  return std::unique_ptr<Listener>(std::make_unique<VerbsListener>(state));
}

void VerbsTransport::AcceptLoop(std::shared_ptr<ListenState> state) {
  while (!state->closed) {
    pollfd fds[2] = {{state->fd, POLLIN, 0}, {state->wake_fd, POLLIN, 0}};
    if (::poll(fds, 2, 500) <= 0 || state->closed) continue;
    int fd = ::accept4(state->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (!AdmitConnection()) {
      Log("verbs: refusing " + net::SocketAddress(fd, true) + ": " +
          std::to_string(options_.max_connections) + " connections open");
      auto pipe = net::NewPlainPipe(fd);
      const uint64_t deadline = clock_.NowUs() + 100000;
      WriteSide(*pipe, SideKind::kRefusal, "too many connections", deadline, clock_).IgnoreError();
      continue;
    }
    threads_.Spawn([this, state, fd] { ServeHandshake(state, fd); });
  }
  ::close(state->fd);  // the port is free once Close returns; wake_fd lives with the state
  MutexLock lock(state->mu);
  state->loop_done = true;
  state->cv.SignalAll();
}

void VerbsTransport::ServeHandshake(std::shared_ptr<ListenState> state, int fd) {
  const std::string peer = net::SocketAddress(fd, true);
  const uint64_t deadline = clock_.NowUs() + options_.handshake_timeout_ms * 1000;
  auto pipe = net::NewPlainPipe(fd);
  std::shared_ptr<VerbsConn> conn;
  Status st = [&]() -> Status {
    SideKind kind;
    std::string payload;
    TERN_RETURN_IF_ERROR(ReadSide(*pipe, &kind, &payload, deadline, clock_));
    TERN_REQUIRE(kind == SideKind::kEndpoint, kProtocol, "verbs: expected the peer's endpoint first");
    QpEndpoint remote;
    TERN_RETURN_IF_ERROR(DecodeEndpoint(payload, &remote));
    conn = std::make_shared<VerbsConn>(this, peer);
    TERN_RETURN_IF_ERROR(conn->Create());
    TERN_RETURN_IF_ERROR(conn->BringUp(remote));
    TERN_RETURN_IF_ERROR(
        WriteSide(*pipe, SideKind::kEndpoint, EncodeEndpoint(conn->LocalEndpoint()), deadline, clock_));
    TERN_RETURN_IF_ERROR(ReadSide(*pipe, &kind, &payload, deadline, clock_));
    TERN_REQUIRE(kind == SideKind::kReady, kProtocol, "verbs: expected ready from the peer");
    TERN_REQUIRE(!state->closed, kCancelled, "verbs: listener closed");
    return Status::Ok();
  }();
  if (!st.ok()) {
    Log("verbs: rejected " + peer + ": " + st.ToString());
    if (st.code() != Code::kTimeout && st.code() != Code::kUnavailable) {
      WriteSide(*pipe, SideKind::kRefusal, st.message().substr(0, kMaxSideReason),
                clock_.NowUs() + 100000, clock_)
          .IgnoreError();
    }
    conn.reset();  // frees its queue pair; the pipe closes the socket
    ConnectionGone();
    return;
  }
  conn->AdoptSide(std::move(pipe));  // the connection owns the socket from here on
  Register(conn);
  if (!state->gate->Call(conn, [&](ConnectionHandlers h) { conn->SetHandlers(std::move(h)); })) {
    conn->Close();  // the listener closed since the check above: as if the handler had closed it
    conn->SetHandlers({});
  }
  Post([conn] { conn->Open(); });
}

Result<std::shared_ptr<VerbsConn>> VerbsTransport::DialHandshake(const std::string& address, int fd,
                                                                 uint64_t deadline_us) {
  auto pipe = net::NewPlainPipe(fd);
  auto conn = std::make_shared<VerbsConn>(this, address);
  TERN_RETURN_IF_ERROR(conn->Create());
  TERN_RETURN_IF_ERROR(
      WriteSide(*pipe, SideKind::kEndpoint, EncodeEndpoint(conn->LocalEndpoint()), deadline_us, clock_));
  SideKind kind;
  std::string payload;
  TERN_RETURN_IF_ERROR(ReadSide(*pipe, &kind, &payload, deadline_us, clock_));
  if (kind == SideKind::kRefusal) {
    return TERN_ERROR(kUnavailable, "verbs: ", address, " refused: ", Printable(payload));
  }
  TERN_REQUIRE(kind == SideKind::kEndpoint, kProtocol, "verbs: ", address, " sent no endpoint");
  QpEndpoint remote;
  TERN_RETURN_IF_ERROR(DecodeEndpoint(payload, &remote));
  TERN_RETURN_IF_ERROR(conn->BringUp(remote));
  TERN_RETURN_IF_ERROR(WriteSide(*pipe, SideKind::kReady, "", deadline_us, clock_));
  conn->AdoptSide(std::move(pipe));
  return conn;
}

void VerbsTransport::Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) {
  if (!AdmitConnection()) {
    return done(TERN_ERROR(kResourceExhausted, "verbs: ", options_.max_connections,
                           " connections open"));
  }
  threads_.Spawn([this, address, handlers = std::move(handlers), done = std::move(done)]() mutable {
    const uint64_t deadline = clock_.NowUs() + options_.connect_timeout_ms * 1000;
    auto fd = net::ConnectSocket(address, /*buffer_bytes=*/0, deadline, clock_);
    Result<std::shared_ptr<VerbsConn>> conn =
        fd.ok() ? DialHandshake(address, *fd, deadline) : Result<std::shared_ptr<VerbsConn>>(fd.status());
    if (!conn.ok()) {
      ConnectionGone();
      return done(conn.status());
    }
    (*conn)->SetHandlers(std::move(handlers));
    Register(*conn);
    done(std::shared_ptr<Connection>(*conn));
    Post([c = *conn] { c->Open(); });
  });
}

}  // namespace verbs

Result<std::unique_ptr<Transport>> NewVerbsTransport(VerbsOptions options, Clock& clock) {
  auto t = std::make_unique<verbs::VerbsTransport>(std::move(options), clock);
  TERN_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace tern

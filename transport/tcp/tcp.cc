// The TCP backend (docs/format/tcp.md): listening, dialing and the
// per-stream handshake that assemble N accepted or dialed streams into one
// TcpConnection (the stream engine is in connection.cc).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "base/text.h"
#include "base/wire_status.h"
#include "tern/tcp_transport.h"
#include "transport/internal.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/pipe.h"

namespace tern {

using tcp::FrameHeader;
using tcp::FrameType;
using tcp::IoThreadScope;
using tcp::kHeaderBytes;
using tcp::MakeFrame;
using tcp::OutFrame;
using tcp::Pipe;
using tcp::TcpConnection;
using transport::AcceptGate;
using transport::LogLine;
using transport::ThreadTracker;

uint32_t ChooseTcpStreams(const TcpOptions& o) {
  const uint32_t cap = std::max<uint32_t>(1, o.max_streams);
  if (o.streams != 0) return std::min(o.streams, cap);
  if (o.rate_bps_hint == 0 || o.rtt_us_hint == 0) return std::min<uint32_t>(8, cap);
  // A single flow on a lossy long path holds a few MB in flight at best
  // (Mathis: rate <= MSS/RTT/sqrt(p)); spread the bandwidth-delay product
  // over flows of about 2 MiB each.
  const double bdp_bytes = static_cast<double>(o.rate_bps_hint) / 8.0 * (o.rtt_us_hint / 1e6);
  const double streams = std::ceil(bdp_bytes / (2.0 * 1024 * 1024));
  return static_cast<uint32_t>(std::clamp<double>(streams, 2, cap));
}

namespace {

// ---- listening and connecting ----------------------------------------------

// Shared by a listener, its accept thread and the handshake threads, which
// may outlive the Listener object by a handshake timeout.
struct ListenState {
  int fd = -1;
  int wake_fd = -1;
  std::atomic<bool> closed{false};
  std::atomic<uint32_t> sockets{0};  // accepted and not yet handed to a connection
  std::unique_ptr<AcceptGate> gate;  // the accept handler
  std::string address;

  struct Partial {
    uint32_t count = 0;
    uint8_t version = 0;  // the wire version of its first stream's hello
    uint32_t arrived = 0;
    uint64_t started_us = 0;
    std::string identity;  // of the first stream; every stream must match it
    std::vector<std::unique_ptr<Pipe>> pipes;
  };
  Mutex mu;
  std::map<uint64_t, Partial> partial GUARDED_BY(mu);  // by connection id
  CondVar cv{&mu};
  bool loop_done GUARDED_BY(mu) = false;  // the accept loop ended and closed fd

  ~ListenState() {
    if (fd >= 0) ::close(fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

class TcpTransport;

class TcpListener final : public Listener {
 public:
  explicit TcpListener(std::shared_ptr<ListenState> state) : state_(std::move(state)) {}
  ~TcpListener() override { Close(); }
  std::string address() const override { return state_->address; }
  void Close() override {
    if (!state_->closed.exchange(true)) {
      uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(state_->wake_fd, &one, sizeof one);
    }
    {
      // The port is free once Close returns: a dialer is refused at once
      // rather than left waiting for a hello-ack, and it can be listened on.
      MutexLock lock(state_->mu);
      state_->cv.Wait([&]() REQUIRES(state_->mu) { return state_->loop_done; });
    }
    state_->gate->Close();  // a handshake thread may be in the handler
  }

 private:
  std::shared_ptr<ListenState> state_;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(TcpOptions options, Clock& clock, std::unique_ptr<tcp::TlsContext> tls)
      : options_(std::move(options)), clock_(clock), tls_(std::move(tls)) {}

  ~TcpTransport() override {
    std::vector<std::weak_ptr<ListenState>> listeners;
    std::vector<std::weak_ptr<TcpConnection>> conns;
    {
      MutexLock lock(mu_);
      listeners.swap(listeners_);
      conns.swap(conns_);
    }
    for (auto& w : listeners) {
      if (auto l = w.lock()) TcpListener(l).Close();
    }
    shutting_down_ = true;
    for (auto& w : conns) {
      if (auto c = w.lock()) c->Close();
    }
    threads_.WaitAll();
  }

  std::string name() const override { return tls_ ? "tcp+tls" : "tcp"; }
  uint32_t capabilities() const override {
    return kCapCrossHost | kCapChunkChecksum | kCapMultiStream | (tls_ ? uint32_t{kCapEncrypted} : 0u);
  }

  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size_bytes, MemoryKind kind) override {
    TERN_REQUIRE(kind == MemoryKind::kHost, kUnsupported,
                 "tcp registers host memory only (stage GPU memory through the host)");
    TERN_REQUIRE(base != nullptr || size_bytes == 0, kInvalidArgument, "null memory");
    return MemoryRegion{base, size_bytes, kind, next_handle_.fetch_add(1)};
  }
  Status DeregisterMemory(const MemoryRegion&) override { return Status::Ok(); }

  Result<std::unique_ptr<Listener>> Listen(const std::string& address, AcceptHandler on_accept) override {
    TERN_ASSIGN_OR_RETURN(int fd, net::ListenSocket(address, options_.socket_buffer_bytes));
    auto state = std::make_shared<ListenState>();
    state->fd = fd;
    state->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    state->gate = std::make_unique<AcceptGate>(std::move(on_accept));
    state->address = net::SocketAddress(fd, false);
    {
      MutexLock lock(mu_);
      listeners_.push_back(state);
    }
    threads_.Spawn([this, state] {
      IoThreadScope io_thread;
      AcceptLoop(state);
    });
    return std::unique_ptr<Listener>(std::make_unique<TcpListener>(state));
  }

  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override {
    threads_.Spawn([this, address, handlers = std::move(handlers), done = std::move(done)]() mutable {
      IoThreadScope io_thread;
      auto conn = Dial(address, std::move(handlers));
      if (!conn.ok()) return done(std::move(conn).take_status());
      std::shared_ptr<TcpConnection> c = *conn;
      done(std::shared_ptr<Connection>(c));
      c->Start(threads_);
    });
  }

 private:
  void Log(const std::string& line) { LogLine(options_.log, line); }

  // tern does not change net.ipv4.tcp_slow_start_after_idle (a setting of
  // the whole network namespace, and it needs CAP_NET_ADMIN); it says once
  // when it costs: with 1 and a congestion control other than BBR, a
  // connection idle longer than its retransmission timeout (a tree edge
  // between versions) restarts from the initial window, a round trip per
  // doubling for the next object. BBR keeps its window across idle periods
  // (measured: docs/agent.md §8), so BBR needs nothing.
  void NoteSlowStartAfterIdle(const std::string& congestion) {
    if (congestion == "bbr" || warned_slow_start_.exchange(true)) return;
    char c = 0;
    const int fd = ::open("/proc/sys/net/ipv4/tcp_slow_start_after_idle", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    const bool one = ::read(fd, &c, 1) == 1 && c == '1';
    ::close(fd);
    if (one) {
      Log("tcp: congestion control " + congestion +
          " with net.ipv4.tcp_slow_start_after_idle=1: a connection idle longer than its "
          "retransmission timeout restarts from the initial window (extra round trips for small "
          "objects over long RTTs); use BBR or set the sysctl to 0");
    }
  }

  void Track(const std::shared_ptr<TcpConnection>& c) {
    MutexLock lock(mu_);
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](auto& w) { return w.expired(); }),
                 conns_.end());
    conns_.push_back(c);
  }

  // Offers our highest wire version; a server that refuses it in an older
  // one (its highest: a version-1 tern answers every other version so) is
  // dialled again in that one, unless it is below our minimum. The version
  // only goes down, so this ends; the connect timeout bounds all attempts.
  Result<std::shared_ptr<TcpConnection>> Dial(const std::string& address, ConnectionHandlers handlers) {
    const uint64_t deadline = clock_.NowUs() + options_.connect_timeout_ms * 1000;
    uint8_t version = static_cast<uint8_t>(options_.max_wire_version);
    for (;;) {
      uint8_t server_max = 0;
      auto conn = DialVersion(address, version, deadline, &server_max);
      if (conn.ok()) {
        (*conn)->SetHandlers(std::move(handlers));
        Track(*conn);
        return conn;
      }
      if (server_max == 0) return conn;
      if (server_max < options_.min_wire_version) {
        return TERN_ERROR(kProtocol, "server ", address, " speaks wire protocol version ",
                          int{server_max}, " at most, below this side's minimum ",
                          options_.min_wire_version, " (", conn.status().message(), ")");
      }
      Log("tcp: " + address + " speaks wire protocol version " + std::to_string(server_max) +
          " at most (refused our version " + std::to_string(version) + "); dialling again in it");
      version = server_max;
    }
  }

  // One attempt in `version`. When the server refused it because it speaks
  // an older one, *server_max is that version (else left 0).
  Result<std::shared_ptr<TcpConnection>> DialVersion(const std::string& address, uint8_t version,
                                                     uint64_t deadline, uint8_t* server_max) {
    const uint32_t n = ChooseTcpStreams(options_);
    TERN_ASSIGN_OR_RETURN(const HostPort dialled, ParseHostPort(address));
    const uint64_t conn_id = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
    // The streams connect (and shake hands) at once: one after the other
    // cost a round trip each, 0.8 s of 8 streams at 100 ms (1.6 s with TLS).
    std::vector<std::string> congestions(n);
    std::vector<std::unique_ptr<Pipe>> pipes(n);
    std::vector<Status> failed(n);
    auto open_stream = [&](uint32_t i) -> Result<std::unique_ptr<Pipe>> {
      TERN_ASSIGN_OR_RETURN(int fd, net::ConnectSocket(address, options_.socket_buffer_bytes, deadline, clock_));
      congestions[i] = tcp::TuneSocket(fd, options_);
      std::unique_ptr<Pipe> pipe;
      if (tls_) {
        TERN_ASSIGN_OR_RETURN(pipe, tcp::TlsHandshake(*tls_, fd, false, dialled.host, deadline, clock_));
      } else {
        pipe = tcp::NewPlainPipe(fd);
      }
      OutFrame hello = MakeFrame(version, FrameType::kHello, conn_id, tcp::PackStream(i, n));
      TERN_RETURN_IF_ERROR(tcp::WriteFull(*pipe, hello.header, kHeaderBytes, deadline, clock_));
      return pipe;
    };
    {
      std::vector<std::thread> openers;
      for (uint32_t i = 1; i < n; ++i) {
        openers.emplace_back([&, i] {
          IoThreadScope io_thread;
          auto pipe = open_stream(i);
          if (pipe.ok()) {
            pipes[i] = std::move(pipe).value();
          } else {
            failed[i] = pipe.status();
          }
        });
      }
      auto first = open_stream(0);
      if (first.ok()) {
        pipes[0] = std::move(first).value();
      } else {
        failed[0] = first.status();
      }
      for (auto& t : openers) t.join();
    }
    for (const Status& st : failed) TERN_RETURN_IF_ERROR(st);
    const std::string congestion = congestions[0];
    for (auto& pipe : pipes) {
      uint8_t raw[kHeaderBytes];
      Status st = tcp::ReadFull(*pipe, raw, kHeaderBytes, deadline, clock_);
      if (!st.ok() && tls_ && st.code() == Code::kAuth) {
        // In TLS 1.3 the server judges our certificate after our side of
        // the handshake is done, so its verdict arrives here, as an alert
        // (PipeError makes only that kAuth).
        return TERN_ERROR(kAuth,
                          "the server refused our TLS certificate (signed by another CA, "
                          "or not among the clients it allows or pins?): ",
                          st.message());
      }
      if (!st.ok() && tls_ && st.code() == Code::kUnavailable) {
        // A bare hang-up is usually a refusal whose alert was lost to a
        // reset, but also a server that died or a connection cut just then,
        // and a record that failed its MAC was corrupted on the wire. All
        // kUnavailable, so that no one takes a dead or unlucky peer for one
        // that refused us (or, in the agent, for a liar).
        return TERN_ERROR(kUnavailable,
                          "the connection failed right after the TLS handshake: the server "
                          "refused our TLS certificate (signed by another CA, or not among the "
                          "clients it allows or pins?) and its alert was lost, or it went away, "
                          "or a record failed on the wire: ",
                          st.message());
      }
      if (!st.ok()) return st.WithContext("waiting for the server's hello");
      FrameHeader h;
      TERN_RETURN_IF_ERROR(tcp::DecodeHeader(raw, &h));
      std::string reason;
      if (h.type == FrameType::kHelloAck) {  // else ParseHelloAck refuses it unread
        reason.resize(h.payload_bytes);      // <= kMaxReasonBytes (DecodeHeader)
        TERN_RETURN_IF_ERROR(tcp::ReadFull(*pipe, reason.data(), reason.size(), deadline, clock_));
      }
      Status verdict = tcp::ParseHelloAck(h, conn_id, reason);
      if (!verdict.ok() && verdict.code() == Code::kProtocol && h.version < version) {
        *server_max = h.version;  // refused in an older version: all the server speaks
      }
      TERN_RETURN_IF_ERROR(verdict);
      TERN_REQUIRE(h.version == version, kProtocol, "server accepted our wire version ",
                   int{version}, " hello in version ", int{h.version});
    }
    NoteSlowStartAfterIdle(congestion);
    return std::make_shared<TcpConnection>(std::move(pipes), address,
                                           Describe(n, congestion, version), version, options_,
                                           clock_);
  }

  std::string Describe(uint32_t streams, const std::string& congestion, uint8_t version) const {
    return "tcp " + std::to_string(streams) + " streams " + congestion + (tls_ ? " tls1.3" : "") +
           " wire v" + std::to_string(version);
  }

  void AcceptLoop(const std::shared_ptr<ListenState>& st) {
    while (!st->closed && !shutting_down_) {
      pollfd fds[2] = {{st->fd, POLLIN, 0}, {st->wake_fd, POLLIN, 0}};
      ::poll(fds, 2, 100);
      ExpirePartial(*st);
      if (!(fds[0].revents & POLLIN)) continue;
      for (;;) {
        int fd = ::accept4(st->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (st->sockets.load() >= options_.max_connections) {
          Log("tcp: refusing " + net::SocketAddress(fd, true) + ": " +
              std::to_string(options_.max_connections) + " sockets already open");
          ::close(fd);
          continue;
        }
        ++st->sockets;
        threads_.Spawn([this, st, fd] {
          IoThreadScope io_thread;
          Handshake(st, fd);
        });
      }
    }
    MutexLock lock(st->mu);
    st->partial.clear();
    ::close(st->fd);
    st->fd = -1;
    st->loop_done = true;
    st->cv.SignalAll();
  }

  void ExpirePartial(ListenState& st) {
    MutexLock lock(st.mu);
    // Read the clock under the lock: a handshake thread may have stamped a
    // partial after an earlier reading, and `now - started_us` would then
    // wrap and expire a connection that had just begun (seen in CI as a
    // peer hanging up during the hello, under ASan and parallel tests).
    const uint64_t now = clock_.NowUs();
    for (auto it = st.partial.begin(); it != st.partial.end();) {
      if (now > it->second.started_us &&
          now - it->second.started_us > options_.handshake_timeout_ms * 1000) {
        Log("tcp: dropping half-open connection: " + std::to_string(it->second.arrived) + " of " +
            std::to_string(it->second.count) + " streams arrived in time");
        st.sockets -= it->second.arrived;
        it = st.partial.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Runs on its own thread per accepted socket, bounded by max_connections.
  void Handshake(const std::shared_ptr<ListenState>& st, int fd) {
    const std::string peer = net::SocketAddress(fd, true);
    const uint64_t deadline = clock_.NowUs() + options_.handshake_timeout_ms * 1000;
    std::string congestion = tcp::TuneSocket(fd, options_);
    auto reject = [&](const Status& why) {
      Log("tcp: rejected " + peer + ": " + why.ToString());
      --st->sockets;
    };
    std::unique_ptr<Pipe> pipe;
    if (tls_) {
      auto r = tcp::TlsHandshake(*tls_, fd, true, /*dialled_host=*/"", deadline, clock_);
      if (!r.ok()) return reject(r.status());
      pipe = std::move(r).value();
    } else {
      pipe = tcp::NewPlainPipe(fd);
    }
    uint8_t raw[kHeaderBytes];
    Status s = tcp::ReadFull(*pipe, raw, kHeaderBytes, deadline, clock_);
    if (!s.ok()) return reject(s.WithContext("waiting for hello"));
    FrameHeader h;
    s = tcp::DecodeHeader(raw, &h);
    tcp::Hello hello;
    const uint32_t offered = raw[4];
    const uint32_t min_version = options_.min_wire_version, max_version = options_.max_wire_version;
    if (s.ok() && offered < min_version) {
      s = TERN_ERROR(kProtocol, "peer offers wire protocol version ", offered,
                     ", below this side's minimum ", min_version, " (min_wire_version)");
    } else if (s.ok() && offered > max_version) {
      s = TERN_ERROR(kProtocol, "peer speaks wire protocol version ", offered,
                     ", this side speaks ", min_version, "..", max_version);
    }
    if (s.ok()) {
      auto parsed = tcp::ParseHello(h, options_.max_streams);
      if (parsed.ok()) hello = *parsed;
      s = parsed.status();
    }
    // Answers are in the hello's version when this side may speak it; a
    // refusal of a newer one is in our highest, which tells the client
    // what to dial again in (docs/format/tcp.md §3a).
    const uint8_t reply_version = static_cast<uint8_t>(offered > max_version     ? max_version
                                                       : offered < tcp::kMinVersion ? min_version
                                                                                   : offered);
    // Tells the peer why before hanging up; best effort.
    auto tell = [&](Pipe& p, uint64_t connection_id, const Status& why) {
      std::string reason = why.message().substr(0, tcp::kMaxReasonBytes);
      OutFrame ack = MakeFrame(reply_version, FrameType::kHelloAck, connection_id, WireCode(why), 0,
                               0, static_cast<uint32_t>(reason.size()));
      if (tcp::WriteFull(p, ack.header, kHeaderBytes, deadline, clock_).ok()) {
        tcp::WriteFull(p, reason.data(), reason.size(), deadline, clock_).IgnoreError();
      }
    };
    const Status closed = TERN_ERROR(kUnavailable, "the listener is closed");
    if (!s.ok()) {
      tell(*pipe, h.arg[0], s);
      return reject(s);
    }
    if (st->closed) {
      tell(*pipe, hello.connection_id, closed);
      return reject(closed);
    }
    std::vector<std::unique_ptr<Pipe>> pipes;
    {
      MutexLock lock(st->mu);
      if (st->closed) return reject(closed);
      ListenState::Partial& p = st->partial[hello.connection_id];
      if (p.count == 0) {
        p.count = hello.count;
        p.version = h.version;
        p.started_us = clock_.NowUs();
        p.identity = pipe->peer_identity();
        p.pipes.resize(hello.count);
      }
      if (p.count != hello.count || p.version != h.version || p.pipes[hello.index]) {
        return reject(TERN_ERROR(kProtocol, "conflicting hello for connection ", hello.connection_id));
      }
      // With TLS, a connection id names streams of one authenticated peer:
      // another certificate cannot join (or hijack) someone else's connection.
      if (pipe->peer_identity() != p.identity) {
        return reject(TERN_ERROR(kAuth, "hello for connection ", hello.connection_id,
                                 " from another TLS identity than its first stream"));
      }
      p.pipes[hello.index] = std::move(pipe);
      if (++p.arrived < p.count) return;  // the last stream's thread assembles
      pipes = std::move(p.pipes);
      st->partial.erase(hello.connection_id);
      st->sockets -= hello.count;
    }
    if (st->closed) {  // the dialer learns why from every stream's hello-ack
      Log("tcp: refusing " + peer + ": " + closed.message());
      for (auto& p : pipes) tell(*p, hello.connection_id, closed);
      return;
    }
    NoteSlowStartAfterIdle(congestion);
    auto conn = std::make_shared<TcpConnection>(std::move(pipes), peer,
                                                Describe(hello.count, congestion, h.version),
                                                h.version, options_, clock_);
    OutFrame ack = MakeFrame(h.version, FrameType::kHelloAck, hello.connection_id, 0);
    if (!conn->SendHelloAcks(ack.header, deadline)) {
      Log("tcp: lost " + peer + " during the handshake");
      return;
    }
    // Started inside the gate; closed since the acks went out, the dialer
    // sees its new connection end.
    if (!st->gate->Call(conn, [&](ConnectionHandlers h) {
          conn->SetHandlers(std::move(h));
          Track(conn);
          conn->Start(threads_);
        })) {
      conn->Close();
    }
  }

  const TcpOptions options_;
  Clock& clock_;
  std::unique_ptr<tcp::TlsContext> tls_;
  std::atomic<uint64_t> next_handle_{1};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> warned_slow_start_{false};
  Mutex mu_;
  std::vector<std::weak_ptr<ListenState>> listeners_ GUARDED_BY(mu_);
  std::vector<std::weak_ptr<TcpConnection>> conns_ GUARDED_BY(mu_);
  ThreadTracker threads_;
};

}  // namespace

Result<std::unique_ptr<Transport>> NewTcpTransport(TcpOptions options, Clock& clock) {
  std::unique_ptr<tcp::TlsContext> tls;
  if (options.tls.enabled) {
    TERN_ASSIGN_OR_RETURN(tls, tcp::TlsContext::Load(options.tls));
  }
  TERN_REQUIRE(options.idle_timeout_ms >= 3 && options.max_streams >= 1, kInvalidArgument,
               "idle timeout below 3 ms or no streams allowed");
  // A stream's deadlines are start + timeout in microseconds: bounded, no
  // sum can wrap (a timeout meant as "never" must not fire at once).
  TERN_REQUIRE(
      options.idle_timeout_ms <= kMaxTcpTimeoutMs && options.header_timeout_ms <= kMaxTcpTimeoutMs,
      kInvalidArgument, "idle or header timeout above ", kMaxTcpTimeoutMs, " ms (one year)");
  TERN_REQUIRE(options.min_wire_version >= tcp::kMinVersion &&
                   options.min_wire_version <= options.max_wire_version &&
                   options.max_wire_version <= tcp::kMaxVersion,
               kInvalidArgument, "wire versions ", options.min_wire_version, "..",
               options.max_wire_version, ": this build speaks ", int{tcp::kMinVersion}, "..",
               int{tcp::kMaxVersion});
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(std::move(options), clock, std::move(tls)));
}

}  // namespace tern

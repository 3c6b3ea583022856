#include "agent/ops/admin_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "agent/ops/admin_test_util.h"
#include "agent/ops/metrics.h"
#include "base/loopback_testing.h"
#include "base/text.h"
#include "transport/test_certs.h"

namespace tern::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

AdminClientOptions WithToken(std::string t) {
  AdminClientOptions o;
  o.token = std::move(t);
  return o;
}
AdminClientOptions WithTimeout(uint32_t ms) {
  AdminClientOptions o;
  o.timeout_ms = ms;
  return o;
}
AdminClientOptions WithMaxReply(uint64_t bytes) {
  AdminClientOptions o;
  o.max_reply_bytes = bytes;
  return o;
}

uint16_t PortOf(const AdminServer& s) { return ParseHostPort(s.address())->port; }

// Reads until EOF or the deadline; the bytes read.
std::string ReadAll(int fd, std::chrono::milliseconds timeout) {
  std::string out;
  const auto end = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` (as much as the server takes; it may refuse and close
// early) and returns the whole reply, on a real loopback socket.
std::string Exchange(uint16_t port, const std::string& request,
                     std::chrono::milliseconds timeout = 5000ms) {
  int fd = Dial(port);
  size_t off = 0;
  while (off < request.size()) {
    const ssize_t n = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // refused mid-send: read what it said
    off += static_cast<size_t>(n);
  }
  std::string reply = ReadAll(fd, timeout);
  ::close(fd);
  return reply;
}

struct Logs {
  std::mutex mu;
  std::vector<std::string> lines;
  LogFn fn() {
    return [this](std::string_view l) {
      std::lock_guard lock(mu);
      lines.emplace_back(l);
    };
  }
  bool Has(std::string_view needle) {
    std::lock_guard lock(mu);
    for (auto& l : lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
};

class AdminTest : public ::testing::Test {
 protected:
  void StartServer(AdminOptions o = {}) {
    o.log = logs_.fn();
    auto status = [](const AdminRequest&) {
      return AdminResponse{200, "application/json", R"({"version":7})"};
    };
    auto publish = [this](const AdminRequest& r) {
      std::lock_guard lock(mu_);
      published_.emplace_back(r.body);
      return AdminResponse{200, "application/json", R"({"ok":true})"};
    };
    auto boom = [](const AdminRequest&) -> AdminResponse { throw std::runtime_error("boom"); };
    auto big = [](const AdminRequest&) {
      return AdminResponse{200, "text/plain", std::string(100000, 'x')};
    };
    auto huge = [](const AdminRequest&) {
      return AdminResponse{200, "text/plain", std::string(size_t{32} << 20, 'x')};
    };
    auto slow = [](const AdminRequest&) {
      std::this_thread::sleep_for(1500ms);
      return AdminResponse{200, "text/plain", "late"};
    };
    auto c = registry_.GetCounter("tern_test_total", "A test counter.", {{"member", "m1"}});
    ASSERT_TRUE(c.ok());
    (*c)->Add(3);
    auto s = AdminServer::Start(o, {MetricsRoute([this] { return registry_.Render(); }),
                                    {"GET", "/status", status, false},
                                    {"POST", "/publish", publish, true},
                                    {"GET", "/boom", boom, false},
                                    {"GET", "/big", big, false},
                                    {"GET", "/huge", huge, false},
                                    {"GET", "/slow", slow, false}});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    port_ = PortOf(*server_);
  }
  std::vector<std::string> Published() {
    std::lock_guard lock(mu_);
    return published_;
  }
  // The server still answers a well-formed request.
  void ExpectServing() {
    auto r = AdminGet(server_->address(), "/status");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, R"({"version":7})");
  }

  Logs logs_;
  MetricsRegistry registry_;
  std::unique_ptr<AdminServer> server_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<std::string> published_;
};

TEST_F(AdminTest, RoutesServeStatusMetricsAndPublish) {
  StartServer();
  ExpectServing();
  const std::string metrics = Exchange(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(metrics.rfind("HTTP/1.1 200", 0), 0u) << metrics;
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.find("tern_test_total{member=\"m1\"} 3\n"), std::string::npos) << metrics;
  auto p = AdminPost(server_->address(), "/publish", R"({"version":8})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, R"({"ok":true})");
  EXPECT_EQ(Published(), std::vector<std::string>{R"({"version":8})"});
  auto missing = AdminGet(server_->address(), "/nope");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("404: admin: 404 no such route"), std::string::npos)
      << missing.status().ToString();
  // A POST route is not a GET route.
  EXPECT_EQ(AdminGet(server_->address(), "/publish").status().code(), Code::kNotFound);
}

TEST_F(AdminTest, MutatingRoutesNeedTheToken) {
  AdminOptions o;
  o.token = "s3cret";
  StartServer(o);
  auto none = AdminPost(server_->address(), "/publish", "{}");
  EXPECT_EQ(none.status().code(), Code::kAuth) << none.status().ToString();
  EXPECT_NE(none.status().message().find("missing or wrong bearer token"), std::string::npos);
  auto wrong = AdminPost(server_->address(), "/publish", "{}", WithToken("s3cres"));
  EXPECT_EQ(wrong.status().code(), Code::kAuth);
  auto longer = AdminPost(server_->address(), "/publish", "{}", WithToken("s3cret2"));
  EXPECT_EQ(longer.status().code(), Code::kAuth);
  EXPECT_TRUE(Published().empty());
  auto right = AdminPost(server_->address(), "/publish", "{}", WithToken("s3cret"));
  EXPECT_TRUE(right.ok()) << right.status().ToString();
  EXPECT_EQ(Published().size(), 1u);
  ExpectServing();  // reads need no token
  EXPECT_TRUE(logs_.Has("admin: 401 for POST /publish"));
}

TEST_F(AdminTest, OversizedBodyIsRefusedBeforeTheHandler) {
  AdminOptions o;
  o.max_body_bytes = 1000;
  StartServer(o);
  auto r = AdminPost(server_->address(), "/publish", std::string(1001, 'x'));
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().ToString();
  EXPECT_TRUE(Published().empty());
  EXPECT_TRUE(AdminPost(server_->address(), "/publish", std::string(1000, 'x')).ok());
  // A lying Content-Length that promises little but sends a lot is cut by the relay.
  const std::string flood =
      "POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
      std::string(200000, 'a');
  const std::string reply = Exchange(port_, flood);
  EXPECT_EQ(reply.rfind("HTTP/1.1 4", 0), 0u) << reply.substr(0, 200);
  EXPECT_EQ(Published().size(), 1u);
  ExpectServing();
}

TEST_F(AdminTest, MalformedHttpIsRefusedAndServingContinues) {
  StartServer();
  struct Case {
    const char* name;
    std::string bytes;
    const char* status;
  };
  const std::vector<Case> cases = {
      {"garbage", std::string("\x00\x01\xff garbage\r\n\r\n", 15), "HTTP/1.1 400"},
      {"http/0.9", "GET /status\r\n\r\n", "HTTP/1.1 400"},
      {"bad version", "GET /status HTTP/9.9\r\n\r\n", "HTTP/1.1 400"},
      {"binary request line", std::string(100, '\x80') + "\r\n\r\n", "HTTP/1.1 400"},
      {"header line over 8 KiB",
       "GET /status HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n", "HTTP/1.1 400"},
      {"URI over 8 KiB", "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n", "HTTP/1.1 414"},
      // 0.11 has no bound on header lines or on one line without newline:
      // the relay cuts both at max_head_bytes + max_body_bytes.
      {"200k header lines",
       [] {
         std::string s = "GET /status HTTP/1.1\r\n";
         for (int i = 0; i < 200000; ++i) s += "X-" + std::to_string(i) + ": v\r\n";
         return s + "\r\n";
       }(),
       "HTTP/1.1 413"},
      {"endless line", "GET /" + std::string(3 << 20, 'a'), "HTTP/1.1 413"},
  };
  for (const auto& c : cases) {
    const std::string reply = Exchange(port_, c.bytes);
    EXPECT_EQ(reply.rfind(c.status, 0), 0u) << c.name << ": " << reply.substr(0, 200);
    EXPECT_NE(reply.find("admin: "), std::string::npos) << c.name << ": no reason given";
    ExpectServing();
  }
  EXPECT_TRUE(logs_.Has("request over"));
}

// The two deadline tests below measure a 500-600 ms request deadline against
// well-behaved requests served beside the bad ones. Under ThreadSanitizer
// (5-15x slower, more on a loaded machine) a well-behaved /status or the
// 32 MiB answer itself outlasts the deadline, so they ran flaky there (one
// failure in two runs on a machine shared with six builds); they run in the
// release and ASan builds, and TSan covers the server's threads through the
// other AdminTest cases.
#if defined(__SANITIZE_THREAD__)
#define SKIP_TIMING_UNDER_TSAN() GTEST_SKIP() << "deadline margins do not hold under TSan"
#else
#define SKIP_TIMING_UNDER_TSAN() (void)0
#endif

TEST_F(AdminTest, SlowlorisGetsTimedOutAndOthersAreServed) {
  SKIP_TIMING_UNDER_TSAN();
  AdminOptions o;
  o.max_connections = 4;
  o.request_timeout_ms = 600;
  StartServer(o);
  const auto start = Clock::now();
  std::vector<int> slow;
  for (int i = 0; i < 3; ++i) {  // one slot stays free
    slow.push_back(Dial(port_));
    ASSERT_EQ(::send(slow.back(), "GET /status HTTP/1.1\r\n", 22, MSG_NOSIGNAL), 22);
  }
  ExpectServing();
  // Drip one header byte every 100 ms: each recv is quick, the request never ends.
  std::string replies[3];
  for (int tick = 0; tick < 20; ++tick) {
    for (int fd : slow) (void)::send(fd, "X", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
  }
  for (int i = 0; i < 3; ++i) {
    replies[i] = ReadAll(slow[i], 2000ms);
    ::close(slow[i]);
    EXPECT_EQ(replies[i].rfind("HTTP/1.1 408", 0), 0u) << replies[i];
  }
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_TRUE(logs_.Has("no complete exchange within 600 ms"));
  ExpectServing();
}

// A client that sends its request and never reads a 32 MiB answer (more
// than the kernel's socket buffers take) holds a slot only until the request
// deadline, not forever.
TEST_F(AdminTest, ClientThatDoesNotReadIsCutAtTheDeadline) {
  SKIP_TIMING_UNDER_TSAN();
  AdminOptions o;
  o.request_timeout_ms = 500;
  StartServer(o);
  int fd = Dial(port_);
  const std::string req = "GET /huge HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::this_thread::sleep_for(1500ms);
  EXPECT_TRUE(logs_.Has("no complete exchange within 500 ms"));
  ExpectServing();
  const auto t0 = Clock::now();
  const std::string got = ReadAll(fd, 5000ms);
  ::close(fd);
  EXPECT_LT(Clock::now() - t0, 4s) << "no end of stream after the cut";
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_LT(got.size(), size_t{32} << 20) << "the stalled answer should have been cut";
}

TEST_F(AdminTest, ServesOnIpv6Loopback) {
  int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool v6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (probe >= 0) ::close(probe);
  if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  AdminOptions o;
  o.address = "[::1]:0";
  StartServer(o);
  EXPECT_EQ(server_->address().rfind("[::1]:", 0), 0u) << server_->address();
  ExpectServing();
}

TEST_F(AdminTest, ConnectionsOverTheBoundAreRefusedAtOnce) {
  AdminOptions o;
  o.max_connections = 2;
  o.request_timeout_ms = 1500;
  StartServer(o);
  int a = Dial(port_), b = Dial(port_);
  std::this_thread::sleep_for(100ms);  // both accepted and relayed
  const auto t0 = Clock::now();
  const std::string third = Exchange(port_, "GET /status HTTP/1.1\r\n\r\n", 3000ms);
  EXPECT_EQ(third.rfind("HTTP/1.1 503", 0), 0u) << third;
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(logs_.Has("busy (2 connections open)"));
  ::close(a);
  ::close(b);
  std::this_thread::sleep_for(200ms);  // the relays notice and finish
  ExpectServing();
}

TEST_F(AdminTest, HandlerExceptionIs500AndServingContinues) {
  StartServer();
  auto r = AdminGet(server_->address(), "/boom");
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("500: admin: internal error"), std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(logs_.Has("handler threw: boom"));
  ExpectServing();
}

TEST_F(AdminTest, ManyClientsAtOnce) {
  AdminOptions o;
  o.max_connections = 64;
  o.workers = 2;
  StartServer(o);
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        auto r = AdminGet(server_->address(), "/status");
        EXPECT_TRUE(r.ok()) << r.status().ToString();
        ok += r.ok();
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(AdminTest, StopEndsOpenConnectionsPromptly) {
  AdminOptions o;
  o.request_timeout_ms = 60000;
  o.io_timeout_ms = 30000;
  StartServer(o);
  const std::string addr = server_->address();
  int idle = Dial(port_);
  int half = Dial(port_);
  ASSERT_EQ(::send(half, "GET /status HTTP/1.1\r\n", 22, MSG_NOSIGNAL), 22);
  std::this_thread::sleep_for(100ms);
  const auto t0 = Clock::now();
  server_->Stop();
  // Neither the 60 s request deadline nor httplib's 30 s read wait: Stop
  // closes the relayed sockets, which ends httplib's reads at once.
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(ReadAll(idle, 1000ms), "");  // closed
  ::close(idle);
  ::close(half);
  server_->Stop();  // idempotent
  auto after = AdminGet(addr, "/status", WithTimeout(1000));
  EXPECT_EQ(after.status().code(), Code::kUnavailable) << after.status().ToString();
}

TEST_F(AdminTest, ClientBoundsReplySizeAndTime) {
  StartServer();
  auto big = AdminGet(server_->address(), "/big", WithMaxReply(1000));
  EXPECT_EQ(big.status().code(), Code::kResourceExhausted) << big.status().ToString();
  EXPECT_TRUE(AdminGet(server_->address(), "/big", WithMaxReply(100000)).ok());
  const auto t0 = Clock::now();
  auto slow = AdminGet(server_->address(), "/slow", WithTimeout(300));
  EXPECT_EQ(slow.status().code(), Code::kTimeout) << slow.status().ToString();
  EXPECT_LT(Clock::now() - t0, 1200ms);
}

// httplib bounds each read by itself: a server sending its head (or its
// TLS handshake) one byte per 100 ms would hold a call for ever. The call
// ends at its deadline either way.
TEST(AdminClient, ATricklingServerIsCutAtTheDeadline) {
  for (const bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "https" : "http");
    testnet::LoopbackListener listener(4);
    ASSERT_TRUE(listener.ok());
    std::atomic<bool> stop{false};
    // An HTTP head that never ends, or a TLS handshake record of 16 KiB.
    const std::string bytes = tls ? std::string("\x16\x03\x03\x40\x00", 5) + std::string(4000, '\0')
                                  : "HTTP/1.1 200 OK\r\nX-Pad: " + std::string(4000, 'a');
    std::thread trickle([&] {
      const int c = ::accept(listener.fd(), nullptr, nullptr);
      if (c < 0) return;
      for (size_t i = 0; i < bytes.size() && !stop; ++i) {
        if (::send(c, &bytes[i], 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(100ms);
      }
      ::close(c);
    });
    const auto t0 = Clock::now();
    auto r = AdminGet(std::string(tls ? "https://" : "") + listener.address(), "/status",
                      WithTimeout(1000));
    const auto took = Clock::now() - t0;
    stop = true;
    ::shutdown(listener.fd(), SHUT_RDWR);
    trickle.join();
    EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().ToString();
    EXPECT_NE(r.status().message().find("no complete reply within 1000 ms"), std::string::npos)
        << r.status().ToString();
    EXPECT_LT(took, 5s);  // 1 s and a watchdog's wake-up; unbounded before
  }
}

TEST(AdminClient, NobodyListeningIsUnavailable) {
  const std::string unused = testnet::UnusedLoopbackAddress();
  ASSERT_FALSE(unused.empty());
  auto r = AdminGet(unused, "/status", WithTimeout(1000));
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_EQ(AdminGet("127.0.0.1:1", "/bad path").status().code(), Code::kInvalidArgument);
  // A query of names, numbers, '=', '&', '.', '-' and percent escapes goes
  // out (nobody listens there); anything else in it is refused before a
  // byte is sent.
  for (const char* ok : {"/events?after=3&max=8", "/events?a=%2F&b=1.5-2"})
    EXPECT_EQ(AdminGet("127.0.0.1:1", ok, WithTimeout(1000)).status().code(), Code::kUnavailable) << ok;
  for (const char* bad : {"/events?after=1 2", "/events?a=<b>", "/events?a=1?b", "/bad path?a=1",
                          "/events?a=\"x\"", "/events?a=1#frag"})
    EXPECT_EQ(AdminGet("127.0.0.1:1", bad).status().code(), Code::kInvalidArgument) << bad;
}

TEST(AdminStart, RefusesBadOptionsAndRoutes) {
  auto h = [](const AdminRequest&) { return AdminResponse{}; };
  auto with = [](auto set) {
    AdminOptions o;
    set(o);
    return AdminServer::Start(o, {}).status().code();
  };
  EXPECT_EQ(with([](AdminOptions& o) { o.address = "nope"; }), Code::kInvalidArgument);
  EXPECT_EQ(with([](AdminOptions& o) { o.max_connections = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(with([](AdminOptions& o) { o.workers = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(with([](AdminOptions& o) { o.token = "has space"; }), Code::kInvalidArgument);
  EXPECT_EQ(with([](AdminOptions& o) { o.request_timeout_ms = 0; }), Code::kInvalidArgument);
  EXPECT_EQ(AdminServer::Start({}, {{"PUT", "/x", h, false}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(AdminServer::Start({}, {{"GET", "x", h, false}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(AdminServer::Start({}, {{"GET", "/a(b)", h, false}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(AdminServer::Start({}, {{"GET", "/x", nullptr, false}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      AdminServer::Start({}, {{"GET", "/x", h, false}, {"GET", "/x", h, false}}).status().code(),
      Code::kInvalidArgument);
  // A port in use.
  auto first = AdminServer::Start({}, {});
  ASSERT_TRUE(first.ok());
  AdminOptions same;
  same.address = (*first)->address();
  auto second = AdminServer::Start(same, {});
  EXPECT_EQ(second.status().code(), Code::kIo) << second.status().ToString();
}

// ---- TLS (docs/agent/operations.md "TLS") ----

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_FALSE(s.str().empty()) << path;
  return s.str();
}

const testing::TestPki& Pki() {
  const testing::TestPki& pki = testing::TestCerts();
  EXPECT_TRUE(pki.ok) << pki.error;
  return pki;
}

AdminOptions TlsOptions(const TlsConfig& cert, std::string token = "") {
  AdminOptions o;
  o.tls_cert_pem = Slurp(cert.cert_file);
  o.tls_key_pem = Slurp(cert.key_file);
  o.token = std::move(token);
  return o;
}

AdminClientOptions Trusting(const std::string& ca_file, std::string token = "") {
  AdminClientOptions o;
  o.ca_pem = Slurp(ca_file);
  o.token = std::move(token);
  o.timeout_ms = 5000;
  return o;
}

std::string Https(const AdminServer& s) { return "https://" + s.address(); }

TEST_F(AdminTest, TlsServesWithTheTokenAndRefusesWithoutIt) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  StartServer(TlsOptions(pki.server, "s3cret"));
  auto status = AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, R"({"version":7})");
  auto none = AdminPost(Https(*server_), "/publish", "{}", Trusting(pki.server.ca_file));
  EXPECT_EQ(none.status().code(), Code::kAuth) << none.status().ToString();
  EXPECT_NE(none.status().message().find("401"), std::string::npos) << none.status().ToString();
  EXPECT_TRUE(Published().empty());
  auto right = AdminPost(Https(*server_), "/publish", R"({"v":1})",
                         Trusting(pki.server.ca_file, "s3cret"));
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  EXPECT_EQ(*right, R"({"ok":true})");
  EXPECT_EQ(Published(), std::vector<std::string>{R"({"v":1})"});
  // A name the certificate holds works as well as its IP (DNS:localhost).
  auto by_name = AdminGet("https://localhost:" + std::to_string(port_), "/status",
                          Trusting(pki.server.ca_file));
  EXPECT_TRUE(by_name.ok()) << by_name.status().ToString();
}

TEST_F(AdminTest, PlainHttpToATlsPortIsRefusedInPlainWords) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  StartServer(TlsOptions(pki.server));
  auto plain = AdminGet(server_->address(), "/status", WithTimeout(3000));
  EXPECT_EQ(plain.status().code(), Code::kInvalidArgument) << plain.status().ToString();
  EXPECT_NE(plain.status().message().find("this port speaks TLS: use https://"), std::string::npos)
      << plain.status().ToString();
  const std::string raw = Exchange(port_, "POST /publish HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(raw.rfind("HTTP/1.1 400", 0), 0u) << raw;
  EXPECT_TRUE(Published().empty());
  // Garbage that is not HTTP either: refused the same way, and serving goes on.
  EXPECT_EQ(Exchange(port_, std::string("\x00\x01\x02", 3)).rfind("HTTP/1.1 400", 0), 0u);
  auto ok = AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(logs_.Has("this port speaks TLS"));
}

TEST_F(AdminTest, AWrongCaOrAWrongNameIsRefused) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  StartServer(TlsOptions(pki.server, "s3cret"));
  // The rogue CA did not sign the server's certificate.
  const std::string rogue_ca = pki.dir + "/rogue-ca.pem";
  auto wrong_ca = AdminPost(Https(*server_), "/publish", "{}", Trusting(rogue_ca, "s3cret"));
  EXPECT_EQ(wrong_ca.status().code(), Code::kAuth) << wrong_ca.status().ToString();
  EXPECT_NE(wrong_ca.status().message().find("certificate was refused"), std::string::npos)
      << wrong_ca.status().ToString();
  EXPECT_NE(wrong_ca.status().message().find("--admin-cacert"), std::string::npos);
  // The system's trust store does not know the test CA either.
  AdminClientOptions system;
  system.token = "s3cret";
  system.timeout_ms = 5000;
  EXPECT_EQ(AdminPost(Https(*server_), "/publish", "{}", system).status().code(), Code::kAuth);
  EXPECT_TRUE(Published().empty());
  server_->Stop();

  // Signed by our CA, but for another name than the one dialled.
  auto other = testing::MintCert("admin-other", "DNS:other.example", "serverAuth");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  StartServer(TlsOptions(*other));
  auto wrong_name = AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file));
  EXPECT_EQ(wrong_name.status().code(), Code::kAuth) << wrong_name.status().ToString();
  EXPECT_NE(wrong_name.status().message().find("mismatch"), std::string::npos)
      << wrong_name.status().ToString();
  EXPECT_NE(wrong_name.status().message().find("127.0.0.1"), std::string::npos);
}

AdminClientOptions WithCert(const TlsConfig& cert, std::string token = "") {
  AdminClientOptions o = Trusting(Pki().server.ca_file, std::move(token));
  o.cert_pem = Slurp(cert.cert_file);
  o.key_pem = Slurp(cert.key_file);
  return o;
}

// Mutual TLS: the port asks for a client certificate our CA signed, and
// still wants the token where a route does.
TEST_F(AdminTest, MutualTlsNeedsAClientCertificateFromTheCa) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  AdminOptions o = TlsOptions(pki.server, "s3cret");
  o.tls_client_ca_pem = Slurp(pki.server.ca_file);
  StartServer(o);
  auto expect_refused = [](const Result<std::string>& r, const char* what) {
    EXPECT_EQ(r.status().code(), Code::kAuth) << what << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find("client certificate"), std::string::npos)
        << what << ": " << r.status().ToString();
    std::printf("%s: %s\n", what, r.status().ToString().c_str());
  };
  expect_refused(AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file)),
                 "no client certificate");
  expect_refused(
      AdminPost(Https(*server_), "/publish", "{}", Trusting(pki.server.ca_file, "s3cret")),
      "no client certificate, with the token");
  expect_refused(AdminGet(Https(*server_), "/status", WithCert(pki.rogue_client)),
                 "a certificate from another CA");
  // A certificate our CA signed for servers only (extendedKeyUsage
  // serverAuth) is not one for clients.
  auto server_only = testing::MintCert("admin-server-only", "DNS:localhost", "serverAuth");
  ASSERT_TRUE(server_only.ok()) << server_only.status().ToString();
  expect_refused(AdminGet(Https(*server_), "/status", WithCert(*server_only)),
                 "a server-only certificate");
  EXPECT_TRUE(Published().empty());

  auto status = AdminGet(Https(*server_), "/status", WithCert(pki.client));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(*status, R"({"version":7})");
  auto no_token = AdminPost(Https(*server_), "/publish", "{}", WithCert(pki.client));
  EXPECT_EQ(no_token.status().code(), Code::kAuth) << no_token.status().ToString();
  EXPECT_NE(no_token.status().message().find("401"), std::string::npos);
  EXPECT_TRUE(Published().empty());
  auto right = AdminPost(Https(*server_), "/publish", R"({"v":2})", WithCert(pki.client, "s3cret"));
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  EXPECT_EQ(Published(), std::vector<std::string>{R"({"v":2})"});
  // Another certificate of the same CA is as good.
  EXPECT_TRUE(AdminGet(Https(*server_), "/status", WithCert(pki.other_client)).ok());
  // A client certificate for a plain address is a mistake worth naming.
  AdminClientOptions plain;
  plain.cert_pem = Slurp(pki.client.cert_file);
  plain.key_pem = Slurp(pki.client.key_file);
  EXPECT_EQ(AdminGet("127.0.0.1:1", "/status", plain).status().code(), Code::kInvalidArgument);
}

// A TLS 1.2 server that shares no cipher suite with the client sends the
// same "handshake failure" alert a TLS 1.2 server sends for a missing client
// certificate: the client names both causes and claims neither.
TEST(AdminClient, AHandshakeFailureAlertNamesBothLikelyCauses) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  testnet::LoopbackListener listener;
  ASSERT_TRUE(listener.ok());
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_server_method()),
                                                        &SSL_CTX_free);
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(SSL_CTX_set_max_proto_version(ctx.get(), TLS1_2_VERSION), 1);
  ASSERT_EQ(SSL_CTX_use_certificate_chain_file(ctx.get(), pki.server.cert_file.c_str()), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey_file(ctx.get(), pki.server.key_file.c_str(), SSL_FILETYPE_PEM),
            1);
  // A pre-shared-key suite: no client offers it without a PSK of its own.
  if (SSL_CTX_set_cipher_list(ctx.get(), "PSK-AES128-CBC-SHA") != 1)
    GTEST_SKIP() << "this OpenSSL offers no PSK-AES128-CBC-SHA to a server";
  std::thread server([&] {
    pollfd pfd{listener.fd(), POLLIN, 0};
    if (::poll(&pfd, 1, 30'000) != 1) return;  // the client never dialled: its error says why
    const int fd = ::accept(listener.fd(), nullptr, nullptr);
    if (fd < 0) return;
    SSL* ssl = SSL_new(ctx.get());
    SSL_set_fd(ssl, fd);
    EXPECT_NE(SSL_accept(ssl), 1) << "the handshake should have found no shared cipher";
    ERR_clear_error();
    SSL_free(ssl);
    ::close(fd);
  });
  auto r = AdminGet("https://" + listener.address(), "/status", Trusting(pki.server.ca_file));
  server.join();
  EXPECT_EQ(r.status().code(), Code::kAuth) << r.status().ToString();
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("handshake failure"), std::string::npos) << m;
  EXPECT_NE(m.find("it may require a client certificate"), std::string::npos) << m;
  EXPECT_NE(m.find("shares no cipher suite"), std::string::npos) << m;
  EXPECT_EQ(m.find("the server requires a client certificate"), std::string::npos) << m;
}

TEST(AdminStart, RefusesABadClientCa) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  AdminOptions plain;
  plain.tls_client_ca_pem = Slurp(pki.server.ca_file);
  auto s = AdminServer::Start(plain, {});
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("needs TLS"), std::string::npos) << s.status().ToString();
  AdminOptions bad = TlsOptions(pki.server);
  bad.tls_client_ca_pem = "not a certificate";
  s = AdminServer::Start(bad, {});
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("--admin-tls-client-ca"), std::string::npos)
      << s.status().ToString();
}

TEST_F(AdminTest, HttpsToAPlainPortFailsCleanly) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  StartServer();
  auto r = AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file));
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("TLS handshake failed"), std::string::npos)
      << r.status().ToString();
  // A CA for a plain address is a mistake worth naming.
  auto mixed = AdminGet(server_->address(), "/status", Trusting(pki.server.ca_file));
  EXPECT_EQ(mixed.status().code(), Code::kInvalidArgument) << mixed.status().ToString();
  ExpectServing();
}

// IPv6 over TLS: the certificate's IP SANs mix IPv4 and IPv6 (httplib 0.11's
// own matcher over-read there; OpenSSL checks instead).
TEST_F(AdminTest, TlsOnIpv6Loopback) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  AdminOptions o = TlsOptions(pki.server);
  o.address = "[::1]:0";
  AdminOptions probe;
  probe.address = "[::1]:0";
  if (!AdminServer::Start(probe, {}).ok()) GTEST_SKIP() << "no IPv6 loopback here";
  StartServer(o);
  auto r = AdminGet(Https(*server_), "/status", Trusting(pki.server.ca_file));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, R"({"version":7})");
}

TEST(AdminStart, RefusesBadTlsMaterial) {
  const auto& pki = Pki();
  ASSERT_TRUE(pki.ok);
  const std::string cert = Slurp(pki.server.cert_file), key = Slurp(pki.server.key_file);
  auto start = [](std::string c, std::string k) {
    AdminOptions o;
    o.tls_cert_pem = std::move(c);
    o.tls_key_pem = std::move(k);
    return AdminServer::Start(o, {}).status();
  };
  auto expect = [](const Status& s, const char* word) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(word), std::string::npos) << "'" << word << "' not in " << s.ToString();
  };
  expect(start(cert, ""), "--admin-tls-key");
  expect(start("", key), "--admin-tls-cert");
  expect(start("not a certificate", key), "holds no PEM certificate");
  expect(start(cert, "not a key"), "unencrypted PEM private key");
  expect(start(cert, Slurp(pki.client.key_file)), "does not match");
  expect(start(std::string(100 << 10, 'x'), key), "PEM over");
  EXPECT_TRUE(start(cert, key).ok());
}

TEST(AdminClient, AddressForms) {
  auto t = ParseAdminAddress("https://[::1]:8443");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->tls);
  EXPECT_EQ(t->host, "::1");
  EXPECT_EQ(t->port, 8443);
  t = ParseAdminAddress("http://127.0.0.1:80");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->tls);
  t = ParseAdminAddress("localhost:9090");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->tls);
  EXPECT_EQ(t->host, "localhost");
  for (const char* bad : {"https://h:1/path", "ftp://h:1", "https://h", "https://:1", "h:0",
                          "https://h:99999", "", "https://"}) {
    EXPECT_EQ(ParseAdminAddress(bad).status().code(), Code::kInvalidArgument) << bad;
  }
}

// A SIGKILLed agent leaves its private socket's directory behind; the next
// start in the same directory removes those nobody listens on, and only
// those: a live server's, a young one (its agent may not listen yet), one
// without a socket (its agent may not have bound yet) and anything that is
// not such a directory stay.
TEST(AdminStart, RemovesSocketDirectoriesKilledAgentsLeft) {
  namespace fs = std::filesystem;
  char templ[] = "/tmp/tern-admin-sweep-XXXXXX";
  ASSERT_NE(::mkdtemp(templ), nullptr);
  const std::string root = templ;
  struct RemoveAll {
    std::string dir;
    ~RemoveAll() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{root};
  auto age = [](const std::string& d) {  // an hour old
    const timespec t[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
    EXPECT_EQ(::utimensat(AT_FDCWD, d.c_str(), t, 0), 0) << d;
  };
  auto make_dir = [&](const std::string& name, bool with_socket, bool old) {
    const std::string d = root + "/" + name;
    EXPECT_EQ(::mkdir(d.c_str(), 0700), 0) << d;
    if (with_socket) {  // bound, never listening, closed: what a killed agent leaves
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      EXPECT_GE(fd, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      const std::string sock = d + "/http.sock";
      std::memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
      EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << sock;
      ::close(fd);
    }
    if (old) age(d);
    return d;
  };
  const std::string killed = make_dir("tern-admin-aaaaaa", true, true);
  const std::string unbound = make_dir("tern-admin-bbbbbb", false, true);
  const std::string young = make_dir("tern-admin-cccccc", true, false);
  const std::string other = make_dir("tern-admin-dddddd", true, true);
  { std::ofstream(other + "/keep") << "not ours to remove"; }
  age(other);
  const std::string misnamed = make_dir("tern-admin-eeee", true, true);

  AdminOptions o;
  o.address = "127.0.0.1:0";
  o.socket_dir = root;
  std::mutex mu;
  std::string log;
  o.log = [&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    log += std::string(line) + "\n";
  };
  auto live = AdminServer::Start(o, {});
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(unbound));
  EXPECT_TRUE(fs::exists(young + "/http.sock"));
  EXPECT_TRUE(fs::exists(other + "/keep"));  // its dead socket is gone, the rest stays
  EXPECT_TRUE(fs::exists(misnamed + "/http.sock"));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(log.find("removed 1 socket directory in"), std::string::npos) << log;
  }

  // The live server's directory, made old, survives a second start.
  std::string live_dir;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string p = e.path().string();
    if (p != unbound && p != young && p != other && p != misnamed) live_dir = p;
  }
  ASSERT_FALSE(live_dir.empty());
  age(live_dir);
  auto second = AdminServer::Start(o, {});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(fs::exists(live_dir + "/http.sock"));
  // It still answers through its socket (no routes: 404).
  EXPECT_EQ(AdminGet((*live)->address(), "/status", WithTimeout(5000)).status().code(),
            Code::kNotFound);
  second->reset();
  live->reset();
}

}  // namespace
}  // namespace tern::agent

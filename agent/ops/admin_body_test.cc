// The admin port decides from a request's head, before reading its body:
// the token, the route, the body's framing and its size against the
// route's own limit; and it bounds how many large bodies it holds at once
// (agent/ops/admin_http.h). Real sockets on loopback; what the server read
// is taken from its counters, what the client managed to send from its
// own count.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "agent/ops/admin_http.h"
#include "agent/ops/admin_test_util.h"
#include "base/text.h"

namespace tern::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kRankPartLimit = uint64_t{64} << 20;
constexpr uint64_t kSixtyMb = 60'000'000;
// What the server may read of a body it refused from the head: the relay's
// buffer and the Unix socket's before httplib answers, then at most 1 MiB
// dropped while the relay lingers (admin_guard.cc kLingerBytes).
constexpr uint64_t kRefusedReadMax = uint64_t{2} << 20;

struct Exchanged {
  std::string reply;
  uint64_t body_sent = 0;  // body bytes the client's kernel took
};

// Sends `head`, then up to `body_bytes` of body while reading: a client
// that reads the answer as soon as it comes, as curl does. Ends at the
// answer's end of stream, or the deadline.
Exchanged SendWhileReading(uint16_t port, const std::string& head, uint64_t body_bytes,
                           std::chrono::milliseconds timeout = 10000ms) {
  Exchanged out;
  const int fd = Dial(port);
  EXPECT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const std::string chunk(64 << 10, 'x');
  bool can_send = true;
  const auto end = Clock::now() + timeout;
  char buf[4096];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (can_send && out.body_sent < body_bytes) p.events |= POLLOUT;
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        out.reply.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EAGAIN) continue;
      break;  // end of stream (or reset)
    }
    if (p.revents & POLLOUT) {
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(chunk.size(), body_bytes - out.body_sent));
      const ssize_t n = ::send(fd, chunk.data(), want, MSG_NOSIGNAL);
      if (n > 0) out.body_sent += static_cast<uint64_t>(n);
      if (n < 0 && errno != EAGAIN) can_send = false;
    }
  }
  ::close(fd);
  return out;
}

std::string Head(const std::string& path, uint64_t content_length, const std::string& extra = "") {
  return "POST " + path +
         " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(content_length) + "\r\n" +
         extra + "\r\n";
}

class AdminBodyTest : public ::testing::Test {
 protected:
  void Start(AdminOptions o = {}) {
    o.token = "s3cret";
    o.log = [](std::string_view) {};
    auto record = [this](const AdminRequest& r) {
      std::lock_guard lock(mu_);
      bodies_.push_back(r.body.size());
      last_byte_ = r.body.empty() ? 0 : r.body.back();
      return AdminResponse{200, "application/json", R"({"ok":true})"};
    };
    auto s = AdminServer::Start(o, {{"GET", "/status",
                                     [](const AdminRequest&) {
                                       return AdminResponse{200, "application/json", "{}"};
                                     }},
                                    {"POST", "/publish", record, /*mutating=*/true},
                                    {"POST", "/publish/rank-part", record, /*mutating=*/true, false,
                                     static_cast<uint32_t>(kRankPartLimit)}});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    port_ = ParseHostPort(server_->address())->port;
  }
  // The counters once no connection is open: a connection the client has
  // closed may still be dropping what it had sent (a lingering close reads
  // up to 1 MiB), and those bytes must not count to the next request.
  AdminCounters Settled() {
    const auto end = Clock::now() + 20s;
    AdminCounters c = server_->counters();
    while (c.connections_open > 0 && Clock::now() < end) {
      std::this_thread::sleep_for(5ms);
      c = server_->counters();
    }
    EXPECT_EQ(c.connections_open, 0u) << "a connection still open after 20 s";
    return c;
  }
  std::vector<size_t> Bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }
  AdminClientOptions Token(std::string t = "s3cret") {
    AdminClientOptions o;
    o.token = std::move(t);
    o.timeout_ms = 20000;
    return o;
  }

  std::unique_ptr<AdminServer> server_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<size_t> bodies_;
  char last_byte_ = 0;
};

// The exposure this closes: every unauthenticated connection could make the
// root buffer a whole 64 MiB body before the token was looked at.
TEST_F(AdminBodyTest, UnauthenticatedLargeBodyIsRefusedBeforeItIsRead) {
  Start();
  for (const std::string auth : {"", "Authorization: Bearer wrong\r\n"}) {
    const AdminCounters before = Settled();
    const Exchanged x =
        SendWhileReading(port_, Head("/publish/rank-part", kSixtyMb, auth), kSixtyMb);
    const AdminCounters after = Settled();
    EXPECT_EQ(x.reply.rfind("HTTP/1.1 401", 0), 0u) << x.reply.substr(0, 200);
    EXPECT_NE(x.reply.find("missing or wrong bearer token"), std::string::npos);
    const uint64_t read = after.client_bytes_read - before.client_bytes_read;
    EXPECT_EQ(after.body_bytes_read, before.body_bytes_read) << "no body byte reached a route";
    EXPECT_EQ(after.refused_from_head, before.refused_from_head + 1);
    EXPECT_LE(read, kRefusedReadMax) << "the server read " << read << " bytes of a refused request";
    EXPECT_LT(x.body_sent, kSixtyMb) << "the client could send the whole body";
    std::printf(
        "unauthenticated 60 MB POST (%s): 401; client sent %llu body bytes, server read %llu\n",
        auth.empty() ? "no token" : "wrong token", static_cast<unsigned long long>(x.body_sent),
        static_cast<unsigned long long>(read));
  }
  // The case docs/security.md had: 16 such connections at once (every slot).
  const AdminCounters before = Settled();
  std::vector<std::thread> ts;
  std::atomic<int> refused{0};
  for (int i = 0; i < 16; ++i) {
    ts.emplace_back([&] {
      const Exchanged x = SendWhileReading(port_, Head("/publish/rank-part", kSixtyMb), kSixtyMb);
      refused += x.reply.rfind("HTTP/1.1 401", 0) == 0 || x.reply.rfind("HTTP/1.1 503", 0) == 0;
    });
  }
  for (auto& t : ts) t.join();
  const AdminCounters after = Settled();
  EXPECT_EQ(refused.load(), 16);
  EXPECT_EQ(after.body_bytes_read, before.body_bytes_read);
  EXPECT_LE(after.client_bytes_read - before.client_bytes_read, 16 * kRefusedReadMax);
  std::printf(
      "16 unauthenticated 60 MB POSTs at once: server read %llu bytes in all, buffered none\n",
      static_cast<unsigned long long>(after.client_bytes_read - before.client_bytes_read));
  // Our own client writes the whole body before it reads the answer.
  auto client = AdminPost(server_->address(), "/publish/rank-part", std::string(kSixtyMb, 'x'),
                          Token("wrong"));
  EXPECT_FALSE(client.ok());
  EXPECT_TRUE(client.status().code() == Code::kAuth ||
              client.status().message().find("before the whole body") != std::string::npos)
      << client.status().ToString();
  std::printf("tern's client, wrong token, 60 MB: %s\n", client.status().ToString().c_str());
  EXPECT_TRUE(Bodies().empty());
  EXPECT_TRUE(AdminGet(server_->address(), "/status").ok());
}

// A client that asks first (curl does for large bodies) never sends the body.
TEST_F(AdminBodyTest, ExpectContinueIsAnsweredFromTheHead) {
  Start();
  const Exchanged refused =
      SendWhileReading(port_, Head("/publish/rank-part", kSixtyMb, "Expect: 100-continue\r\n"), 0);
  EXPECT_EQ(refused.reply.rfind("HTTP/1.1 401", 0), 0u) << refused.reply.substr(0, 200);
  const Exchanged too_big = SendWhileReading(
      port_, Head("/publish", 2 << 20, "Authorization: Bearer s3cret\r\nExpect: 100-continue\r\n"),
      0);
  EXPECT_EQ(too_big.reply.rfind("HTTP/1.1 413", 0), 0u) << too_big.reply.substr(0, 200);

  // Accepted: "100 Continue", then the body, then the answer.
  const int fd = Dial(port_);
  const std::string head =
      Head("/publish", 5, "Authorization: Bearer s3cret\r\nExpect: 100-continue\r\n");
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue", 0), 0u);
  ASSERT_EQ(::send(fd, "hello", 5, MSG_NOSIGNAL), 5);
  std::string reply;
  for (ssize_t m; (m = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    reply.append(buf, static_cast<size_t>(m));
  ::close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_EQ(Bodies(), std::vector<size_t>{5});
}

TEST_F(AdminBodyTest, EachRouteHasItsOwnBodyLimit) {
  Start();
  // 2 MiB to /publish (1 MiB, the default): refused from the declared length.
  AdminCounters before = Settled();
  const Exchanged x = SendWhileReading(
      port_, Head("/publish", 2 << 20, "Authorization: Bearer s3cret\r\n"), 2 << 20);
  AdminCounters after = Settled();
  EXPECT_EQ(x.reply.rfind("HTTP/1.1 413", 0), 0u) << x.reply.substr(0, 200);
  EXPECT_NE(x.reply.find("over this route's limit of 1048576 bytes"), std::string::npos) << x.reply;
  EXPECT_EQ(after.body_bytes_read, before.body_bytes_read);
  EXPECT_LE(after.client_bytes_read - before.client_bytes_read, kRefusedReadMax);
  // Our own client writes its whole body before it reads: it gets the 413
  // when the body fits the sockets' buffers, else a closed connection.
  auto client = AdminPost(server_->address(), "/publish", std::string(2 << 20, 'x'), Token());
  EXPECT_FALSE(client.ok());
  EXPECT_TRUE(client.status().code() == Code::kResourceExhausted ||
              client.status().message().find("before the whole body") != std::string::npos)
      << client.status().ToString();

  // Chunked framing declares no length: cut at the limit as it is read.
  before = server_->counters();
  std::string chunked =
      "POST /publish HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const std::string piece(64 << 10, 'y');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
  for (int i = 0; i < 32; ++i) chunked += size_line + piece + "\r\n";  // 2 MiB
  chunked += "0\r\n\r\n";
  const Exchanged c = SendWhileReading(port_, chunked, 0);
  after = server_->counters();
  EXPECT_EQ(c.reply.rfind("HTTP/1.1 413", 0), 0u) << c.reply.substr(0, 200);
  EXPECT_LE(after.body_bytes_read - before.body_bytes_read, uint64_t{1} << 20);

  // Up to the limit is fine; the large route takes 2 MiB.
  EXPECT_TRUE(AdminPost(server_->address(), "/publish", std::string(1 << 20, 'x'), Token()).ok());
  EXPECT_TRUE(
      AdminPost(server_->address(), "/publish/rank-part", std::string(2 << 20, 'x'), Token()).ok());
  EXPECT_EQ(Bodies(), (std::vector<size_t>{1 << 20, 2 << 20}));
}

TEST_F(AdminBodyTest, AuthenticatedSixtyMegabyteRankPartIsRead) {
  Start();
  std::string part(kSixtyMb, 'p');
  part.back() = 'z';
  const AdminCounters before = server_->counters();
  auto r = AdminPost(server_->address(), "/publish/rank-part", part, Token());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Bodies(), std::vector<size_t>{kSixtyMb});
  EXPECT_EQ(last_byte_, 'z');
  EXPECT_EQ(server_->counters().body_bytes_read - before.body_bytes_read, kSixtyMb);
  // Over the route's 64 MiB: refused from the head.
  const Exchanged over = SendWhileReading(
      port_, Head("/publish/rank-part", kRankPartLimit + 1, "Authorization: Bearer s3cret\r\n"),
      kRankPartLimit + 1);
  EXPECT_EQ(over.reply.rfind("HTTP/1.1 413", 0), 0u) << over.reply.substr(0, 200);
}

TEST_F(AdminBodyTest, HeadsThatCannotBeReadSafelyAreRefused) {
  Start();
  const std::string auth = "Authorization: Bearer s3cret\r\n";
  struct Case {
    const char* name;
    std::string head;
    const char* status;
  };
  const std::vector<Case> cases = {
      {"no such route", Head("/nope", 1 << 20), "HTTP/1.1 404"},
      {"a GET route", Head("/status", 1 << 20, auth), "HTTP/1.1 404"},
      {"gzip", Head("/publish", 100, auth + "Content-Encoding: gzip\r\n"), "HTTP/1.1 415"},
      {"no length", "POST /publish HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n", "HTTP/1.1 411"},
      {"two lengths", Head("/publish", 5, auth + "Content-Length: 5\r\n"), "HTTP/1.1 400"},
      {"length and chunked", Head("/publish", 5, auth + "Transfer-Encoding: chunked\r\n"),
       "HTTP/1.1 400"},
      {"signed length", "POST /publish HTTP/1.1\r\nContent-Length: -1\r\n" + auth + "\r\n",
       "HTTP/1.1 400"},
      {"body on a GET", "GET /status HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789",
       "HTTP/1.1 400"},
  };
  for (const auto& c : cases) {
    const AdminCounters before = server_->counters();
    const Exchanged x = SendWhileReading(port_, c.head, 1 << 20);
    EXPECT_EQ(x.reply.rfind(c.status, 0), 0u) << c.name << ": " << x.reply.substr(0, 200);
    EXPECT_NE(x.reply.find("admin: "), std::string::npos) << c.name << ": no reason given";
    EXPECT_EQ(server_->counters().body_bytes_read, before.body_bytes_read) << c.name;
    EXPECT_EQ(server_->counters().refused_from_head, before.refused_from_head + 1) << c.name;
  }
  EXPECT_TRUE(Bodies().empty());
  EXPECT_TRUE(AdminGet(server_->address(), "/status").ok());
}

// Several authenticated large bodies at once: read one after another (the
// bound), and every one served.
TEST_F(AdminBodyTest, LargeBodiesAreReadAFewAtATime) {
  AdminOptions o;
  o.max_large_bodies = 1;
  Start(o);
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&] {
      auto r =
          AdminPost(server_->address(), "/publish/rank-part", std::string(8 << 20, 'x'), Token());
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      ok += r.ok();
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(Bodies().size(), 4u);
  EXPECT_EQ(server_->counters().large_bodies_peak, 1u);
  // Small bodies are not counted against it.
  EXPECT_TRUE(AdminPost(server_->address(), "/publish", "{}", Token()).ok());
  EXPECT_EQ(server_->counters().large_bodies_peak, 1u);
}

TEST(AdminBodyStart, RefusesBadBodyLimits) {
  auto h = [](const AdminRequest&) { return AdminResponse{}; };
  auto start = [&](AdminRoute r, AdminOptions o = {}) {
    return AdminServer::Start(o, {std::move(r)}).status();
  };
  EXPECT_EQ(start({"GET", "/a", h, false, false, 1000}).code(), Code::kInvalidArgument);
  EXPECT_EQ(start({"POST", "/a", h, true, false, kMaxAdminBodyBytes + 1}).code(),
            Code::kInvalidArgument);
  AdminOptions none;
  none.max_large_bodies = 0;
  EXPECT_EQ(start({"POST", "/a", h, true}, none).code(), Code::kInvalidArgument);
  EXPECT_TRUE(start({"POST", "/a", h, true, false, kMaxAdminBodyBytes}).ok());
}

}  // namespace
}  // namespace tern::agent

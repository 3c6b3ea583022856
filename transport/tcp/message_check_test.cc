// TCP wire version 2 (docs/format/tcp.md): the XXH3-64 of every MESSAGE's
// payload, and the HELLO exchange that settles a connection's version with
// peers that speak only version 1. Servers run on 127.0.0.1; hostile and
// old peers are raw sockets that write frames by hand.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "base/loopback_testing.h"
#include "tern/connect.h"
#include "tern/tcp_transport.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/raw_peer_testing.h"

namespace tern::tcp {
namespace {

using namespace std::chrono_literals;
using namespace testpeer;

// The version-2 MESSAGE header, pinned: the payload `hello` (whose XXH3-64
// docs/format/tcp.md §4 also gives for a CHUNK) rides in arg2.
TEST(MessageWire, Version2MessageHeaderMatchesTheSpec) {
  EXPECT_EQ(MessageCheck("hello"), 0x9555e8555c62dcfdull);
  const std::string raw = RawHeader(2, FrameType::kMessage, 5, 0, 0, MessageCheck("hello"));
  const uint8_t spec[kHeaderBytes] = {
      0x54, 0x45, 0x52, 0x4e, 0x02, 0x03, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0xd1, 0xdf, 0x8a, 0x88,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0xfd, 0xdc, 0x62, 0x5c, 0x55, 0xe8, 0x55, 0x95, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(std::memcmp(raw.data(), spec, kHeaderBytes), 0);
}

TEST(MessageWire, MessageArgsPerVersion) {
  auto decode = [](uint8_t version, int arg) {
    FrameHeader h;
    h.version = version;
    h.type = FrameType::kMessage;
    h.payload_bytes = 1;
    if (arg >= 0) h.arg[arg] = 0x1234;
    uint8_t raw[kHeaderBytes];
    EncodeHeader(h, raw);
    FrameHeader out;
    return DecodeHeader(raw, &out);
  };
  EXPECT_TRUE(decode(1, -1).ok());
  EXPECT_EQ(decode(1, 2).code(), Code::kProtocol);  // version 1: no check
  EXPECT_TRUE(decode(2, 2).ok());
  EXPECT_TRUE(decode(2, -1).ok());  // a sum of 0 is a sum (checked against the payload)
  for (int arg : {0, 1, 3}) EXPECT_EQ(decode(2, arg).code(), Code::kProtocol) << "arg" << arg;
}

TEST(MessageWire, OptionsOutsideTheSpokenVersionsAreRefused) {
  for (auto [min, max] : {std::pair<uint32_t, uint32_t>{0, 2}, {1, 3}, {2, 1}, {3, 3}}) {
    TcpOptions o;
    o.min_wire_version = min;
    o.max_wire_version = max;
    auto t = NewTcpTransport(o);
    ASSERT_FALSE(t.ok()) << min << ".." << max;
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(t.status().message().find("wire versions"), std::string::npos) << t.status().ToString();
  }
}

TEST(TcpOptionsBounds, TimeoutsTooLongForTheDeadlineSumsAreRefused) {
  // A stream's deadlines are start + timeout in us: a timeout meant as
  // "never" (UINT64_MAX) would wrap and fire at once; it is refused instead.
  for (int which = 0; which < 2; ++which) {
    TcpOptions o;
    (which == 0 ? o.idle_timeout_ms : o.header_timeout_ms) = UINT64_MAX;
    auto t = NewTcpTransport(o);
    ASSERT_FALSE(t.ok()) << which;
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(t.status().message().find("one year"), std::string::npos) << t.status().ToString();
    (which == 0 ? o.idle_timeout_ms : o.header_timeout_ms) = kMaxTcpTimeoutMs;
    EXPECT_TRUE(NewTcpTransport(o).ok()) << which;
  }
}

class MessageWireServer : public ::testing::Test {
 protected:
  // A server with its own options; its log, its messages and how its
  // connections ended are collected.
  void Serve(const std::function<void(TcpOptions&)>& tweak = nullptr) {
    TcpOptions o = Quick();
    if (tweak) tweak(o);
    o.log = log_.Sink();
    auto t = NewTcpTransport(o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    server_ = std::move(t).value();
    auto l = server_->Listen("127.0.0.1:0", [this](std::shared_ptr<Connection> c) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        accepted_ = c;
        cv_.notify_all();
      }
      ConnectionHandlers h;
      h.on_message = [this, c](std::string m) {
        std::lock_guard<std::mutex> lock(mu_);
        messages_.push_back(m);
        cv_.notify_all();
        c->SendMessage("echo " + m, nullptr);
      };
      h.on_closed = [this](Status why) {
        std::lock_guard<std::mutex> lock(mu_);
        closed_.push_back(why);
        cv_.notify_all();
      };
      return h;
    });
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(l).value();
    port_ = PortOf(listener_->address());
  }

  static TcpOptions Quick() {
    TcpOptions o;
    o.streams = 2;
    o.handshake_timeout_ms = 5000;
    o.header_timeout_ms = 2000;
    o.idle_timeout_ms = 5000;
    return o;
  }

  // A transport client with `tweak`ed options; its log goes to client_log_.
  Result<std::shared_ptr<Connection>> Dial(const std::function<void(TcpOptions&)>& tweak,
                                           ConnectionHandlers handlers = {}) {
    TcpOptions o = Quick();
    if (tweak) tweak(o);
    o.log = client_log_.Sink();
    auto t = NewTcpTransport(o);
    if (!t.ok()) return t.status();
    client_ = std::move(t).value();
    return ConnectWait(*client_, listener_->address(), std::move(handlers), 30000,
                       RetryPolicy{1, 10, 10});
  }

  // Sends a message each way and checks both arrive.
  void ExpectMessagesFlow(Connection& conn) {
    conn.SendMessage("ping", nullptr);
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 20s, [&] {
      return std::find(messages_.begin(), messages_.end(), "ping") != messages_.end();
    })) << log_.Text();
    EXPECT_TRUE(cv_.wait_for(lock, 20s, [&] { return echoes_ > 0; })) << log_.Text();
  }
  ConnectionHandlers CountEchoes() {
    ConnectionHandlers h;
    h.on_message = [this](std::string m) {
      std::lock_guard<std::mutex> lock(mu_);
      if (m == "echo ping") ++echoes_;
      cv_.notify_all();
    };
    return h;
  }

  std::shared_ptr<Connection> Accepted() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 20s, [&] { return accepted_ != nullptr; }));
    return accepted_;
  }
  static uint8_t VersionOf(const std::shared_ptr<Connection>& c) {
    auto* tcp = dynamic_cast<TcpConnection*>(c.get());
    EXPECT_NE(tcp, nullptr);
    return tcp ? tcp->wire_version() : 0;
  }

  int Handshaken(uint8_t version) { return RawHandshake(port_, version); }

  // Declared before the transports: their handlers use these until the
  // transports are destroyed.
  std::mutex mu_;
  std::condition_variable cv_;
  LogCapture log_, client_log_;
  std::vector<std::string> messages_;
  std::vector<Status> closed_;
  int echoes_ = 0;
  int port_ = 0;
  std::shared_ptr<Connection> accepted_;
  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Listener> listener_;
};

// A payload byte flipped past TCP's checksum, the frame header intact and
// correctly checked: refused before delivery, the connection ended with
// kCorrupt naming the stream, the frame and both sums.
TEST_F(MessageWireServer, CorruptedPayloadIsRefusedAndNotDelivered) {
  Serve();
  int fd = Handshaken(2);
  const std::string good = "first control message";
  SendAll(fd, RawHeader(2, FrameType::kMessage, good.size(), 0, 0, MessageCheck(good)) + good);
  std::string bad = "second control message";
  const uint64_t sent_sum = MessageCheck(bad);
  bad[7] ^= 0x04;  // "second " -> "second$"
  SendAll(fd, RawHeader(2, FrameType::kMessage, bad.size(), 0, 0, sent_sum) + bad);
  EXPECT_TRUE(ClosedByServer(fd, 20s));
  ::close(fd);
  std::unique_lock<std::mutex> lock(mu_);
  ASSERT_TRUE(cv_.wait_for(lock, 20s, [&] { return !closed_.empty(); })) << log_.Text();
  EXPECT_EQ(closed_[0].code(), Code::kCorrupt) << closed_[0].ToString();
  const std::string why = closed_[0].message();
  EXPECT_NE(why.find("stream 0, frame 2 "), std::string::npos) << why;
  char sums[2][32];
  std::snprintf(sums[0], sizeof sums[0], "0x%llx", static_cast<unsigned long long>(sent_sum));
  std::snprintf(sums[1], sizeof sums[1], "0x%llx",
                static_cast<unsigned long long>(MessageCheck(bad)));
  EXPECT_NE(why.find(sums[0]), std::string::npos) << why;
  EXPECT_NE(why.find(sums[1]), std::string::npos) << why;
  EXPECT_TRUE(log_.Has("message check mismatch")) << log_.Text();
  // The good message was delivered, the corrupted one was not.
  EXPECT_EQ(messages_, std::vector<std::string>{good});
}

// A frame in another version than the connection settled is refused.
TEST_F(MessageWireServer, FrameInAnotherVersionThanTheConnectionsIsRefused) {
  Serve();
  int fd = Handshaken(1);
  SendAll(fd, RawHeader(2, FrameType::kPing, 0));
  EXPECT_TRUE(ClosedByServer(fd, 20s));
  ::close(fd);
  EXPECT_TRUE(log_.Has("is in wire version 2, the connection's is 1")) << log_.Text();
}

TEST_F(MessageWireServer, Version2BothSides) {
  Serve();
  auto c = Dial(nullptr, CountEchoes());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(VersionOf(*c), 2);
  EXPECT_EQ(VersionOf(Accepted()), 2);
  EXPECT_NE((*c)->Describe().find("wire v2"), std::string::npos) << (*c)->Describe();
  ExpectMessagesFlow(**c);
}

// A server that speaks only version 1 refuses the version-2 hello in
// version 1; the client dials again in version 1.
TEST_F(MessageWireServer, Version2ClientFallsBackToAVersion1Server) {
  Serve([](TcpOptions& o) { o.max_wire_version = 1; });
  auto c = Dial(nullptr, CountEchoes());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(VersionOf(*c), 1);
  EXPECT_EQ(VersionOf(Accepted()), 1);
  EXPECT_TRUE(log_.Has("peer speaks wire protocol version 2, this side speaks 1..1")) << log_.Text();
  EXPECT_NE(client_log_.Text().find("dialling again"), std::string::npos) << client_log_.Text();
  ExpectMessagesFlow(**c);
}

TEST_F(MessageWireServer, Version1ClientToAVersion2Server) {
  Serve();
  auto c = Dial([](TcpOptions& o) { o.max_wire_version = 1; }, CountEchoes());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(VersionOf(*c), 1);
  EXPECT_EQ(VersionOf(Accepted()), 1);
  EXPECT_EQ(client_log_.Text().find("dialling again"), std::string::npos) << client_log_.Text();
  ExpectMessagesFlow(**c);
}

TEST_F(MessageWireServer, MinimumVersion2ServerRefusesAVersion1Client) {
  Serve([](TcpOptions& o) { o.min_wire_version = 2; });
  auto c = Dial([](TcpOptions& o) { o.max_wire_version = 1; });
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kProtocol) << c.status().ToString();
  EXPECT_NE(c.status().message().find("version 1, below this side's minimum 2"), std::string::npos)
      << c.status().ToString();
  EXPECT_TRUE(log_.Has("below this side's minimum 2")) << log_.Text();
  // A version-2 client is served.
  auto ok = Dial(nullptr, CountEchoes());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(VersionOf(*ok), 2);
  ExpectMessagesFlow(**ok);
}

TEST_F(MessageWireServer, MinimumVersion2ClientDoesNotFallBack) {
  Serve([](TcpOptions& o) { o.max_wire_version = 1; });
  auto c = Dial([](TcpOptions& o) { o.min_wire_version = 2; });
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kProtocol) << c.status().ToString();
  EXPECT_NE(c.status().message().find("version 1 at most, below this side's minimum 2"),
            std::string::npos)
      << c.status().ToString();
}

// The version-1 tern that shipped, by hand: it refuses any other version's
// hello with a version-1 HELLO_ACK of code 14 and connection id 0 (it could
// not decode the hello), and accepts a version-1 hello.
TEST(MessageWire, Version2ClientFallsBackToTheShippedVersion1Server) {
  testnet::LoopbackListener listener(4);
  ASSERT_TRUE(listener.ok());
  const int listen_fd = listener.fd();
  // Before the thread: a failed ASSERT must not leave it joinable.
  TcpOptions o;
  o.streams = 1;
  o.log = [](std::string_view) {};
  auto t = NewTcpTransport(o);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> offered;
  std::thread old_server([&] {
    for (int attempt = 0; attempt < 2; ++attempt) {
      pollfd p{listen_fd, POLLIN, 0};
      if (::poll(&p, 1, 20000) <= 0) return;
      int fd = ::accept(listen_fd, nullptr, nullptr);
      BoundWaits(fd);
      const std::string hello = ReceiveExactly(fd, kHeaderBytes);
      if (hello.size() != kHeaderBytes) {
        ::close(fd);
        return;
      }
      offered.push_back(static_cast<uint8_t>(hello[4]));
      if (hello[4] == 1) {
        FrameHeader h;
        if (DecodeHeader(reinterpret_cast<const uint8_t*>(hello.data()), &h).ok()) {
          SendAll(fd, RawHeader(1, FrameType::kHelloAck, 0, h.arg[0], 0));
          ReceiveExactly(fd, kHeaderBytes);  // until the client hangs up
        }
      } else {
        const std::string reason = "peer speaks wire protocol version " +
                                   std::to_string(int{static_cast<uint8_t>(hello[4])}) +
                                   ", this side speaks 1";
        SendAll(fd, RawHeader(1, FrameType::kHelloAck, reason.size(), 0,
                        static_cast<uint64_t>(Code::kProtocol)) +
                     reason);
      }
      ::close(fd);
    }
  });
  auto c = ConnectWait(**t, listener.address(), {}, 30000, RetryPolicy{1, 10, 10});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) {
    auto* tcp = dynamic_cast<TcpConnection*>(c->get());
    EXPECT_NE(tcp, nullptr);
    if (tcp) {
      EXPECT_EQ(tcp->wire_version(), 1);
    }
    (*c)->Close();
  }
  old_server.join();  // (waits out its 20 s accept when the client gave up)
  EXPECT_EQ(offered, (std::vector<uint8_t>{2, 1}));
}

}  // namespace
}  // namespace tern::tcp

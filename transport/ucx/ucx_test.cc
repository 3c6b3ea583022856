// The UCX backend end to end, over UCX's tcp and shared-memory transports on
// loopback only (net_devices = "lo"). Every wait is bounded.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "tern/transport_probe.h"
#include "tern/ucx_transport.h"

namespace tern {
namespace {

constexpr auto kWait = std::chrono::seconds(30);

// A UCX configuration under test.
struct Tls {
  const char* name;
  const char* tls;
  bool detect_peer_failure;
  const char* lane;  // a transport the connection must end up using
};

UcxOptions Options(const Tls& tls) {
  UcxOptions o;
  o.tls = tls.tls;
  o.detect_peer_failure = tls.detect_peer_failure;
  o.net_devices = "lo";
  // Below kWait, yet generous: a loaded 2-core machine under ASan.
  o.connect_timeout_ms = 15000;
  o.handshake_timeout_ms = 15000;
  o.op_timeout_ms = 10000;
  o.log = [](std::string_view) {};
  return o;
}

// The value, or kTimeout after kWait (a bare get() would hang the binary
// until the watchdog).
template <class T>
T Await(std::future<T>& f) {
  if (f.wait_for(kWait) != std::future_status::ready) {
    ADD_FAILURE() << "timed out";
    return T(Status(Code::kTimeout, "test: no completion"));
  }
  return f.get();
}

// A completion whose result a test waits for. The promise is shared with
// the callback, so a completion that comes late (after a timed-out wait,
// or after the test returned) has somewhere to go; and a test never
// relies on a completion running inline.
template <class T = Status>
struct Done {
  std::shared_ptr<std::promise<T>> p = std::make_shared<std::promise<T>>();
  std::future<T> f = p->get_future();
  std::function<void(T)> Fn() {
    return [p = p](T v) { p->set_value(std::move(v)); };
  }
  T Wait() { return Await(f); }
};

// One side of a connection as a test sees it.
struct Peer {
  std::mutex mu;
  std::vector<std::string> messages;
  std::promise<Status> closed;
  std::atomic<bool> closed_fired{false};
  std::shared_ptr<Connection> conn;
  std::condition_variable cv;

  ConnectionHandlers Handlers() {
    ConnectionHandlers h;
    h.on_message = [this](std::string m) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(std::move(m));
      cv.notify_all();
    };
    h.on_closed = [this](Status why) {
      EXPECT_FALSE(closed_fired.exchange(true)) << "on_closed fired twice";
      closed.set_value(std::move(why));
    };
    return h;
  }
  bool WaitMessages(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWait, [&] { return messages.size() >= n; });
  }
};

class UcxTest : public ::testing::TestWithParam<Tls> {
 protected:
  void SetUp() override {
    BackendProbe probe = ProbeUcx();
    if (!probe.available) GTEST_SKIP() << "ucx unavailable: " << probe.detail;
    auto s = NewUcxTransport(Options(GetParam()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    auto c = NewUcxTransport(Options(GetParam()));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    auto l = server_->Listen("127.0.0.1:0", [this](std::shared_ptr<Connection> conn) {
      std::lock_guard<std::mutex> lock(server_peer_.mu);
      server_peer_.conn = conn;
      server_peer_.cv.notify_all();
      return server_peer_.Handlers();
    });
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(*l);
  }

  void ConnectClient() {
    Done<Result<std::shared_ptr<Connection>>> connected;
    client_->Connect(listener_->address(), client_peer_.Handlers(), connected.Fn());
    auto r = connected.Wait();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    client_peer_.conn = *r;
    // The server's accept handler runs on its progress thread, not
    // necessarily before the client's connect completes: wait for it (and
    // see its write of conn) before the test reads server_peer_.conn.
    std::unique_lock<std::mutex> lock(server_peer_.mu);
    ASSERT_TRUE(server_peer_.cv.wait_for(lock, kWait, [&] { return server_peer_.conn != nullptr; }));
  }

  Status SendChunkAndWait(const ChunkSend& chunk) {
    Done<> sent;
    client_peer_.conn->SendChunk(chunk, sent.Fn());
    return sent.Wait();
  }

  // Destroyed in reverse: listener, transports (whose shutdown still calls
  // the peers' handlers), then the peers.
  Peer server_peer_, client_peer_;
  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(UcxTest, MessagesArriveInOrderBothWays) {
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  EXPECT_NE(client_peer_.conn->capabilities() & kCapChunkChecksum, 0u);
  // The data really travels over the transport under test.
  EXPECT_NE(client_peer_.conn->Describe().find(GetParam().lane), std::string::npos)
      << client_peer_.conn->Describe();
  EXPECT_NE(server_peer_.conn->Describe().find(GetParam().lane), std::string::npos)
      << server_peer_.conn->Describe();
  // Small ones go eager, 4 MiB ones take UCX's rendezvous path; order holds.
  std::vector<std::string> sent;
  for (int i = 0; i < 300; ++i) {
    const size_t size = i % 50 == 7 ? (4u << 20) + i : static_cast<size_t>(i);
    std::string m(size, static_cast<char>('a' + i % 26));
    if (!m.empty()) m[0] = static_cast<char>(i);
    sent.push_back(m);
    client_peer_.conn->SendMessage(std::move(m), nullptr);
  }
  ASSERT_TRUE(server_peer_.WaitMessages(sent.size()));
  {
    std::lock_guard<std::mutex> lock(server_peer_.mu);
    ASSERT_EQ(server_peer_.messages.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(server_peer_.messages[i], sent[i]) << i;
  }
  Done<> handed;
  server_peer_.conn->SendMessage("pong", handed.Fn());
  EXPECT_TRUE(handed.Wait().ok());
  ASSERT_TRUE(client_peer_.WaitMessages(1));
  {
    std::lock_guard<std::mutex> lock(client_peer_.mu);
    EXPECT_EQ(client_peer_.messages[0], "pong");
  }

  Done<> too_big;
  client_peer_.conn->SendMessage(std::string(kMaxMessageBytes + 1, 'x'), too_big.Fn());
  EXPECT_EQ(too_big.Wait().code(), Code::kOutOfRange);
}

TEST_P(UcxTest, ChunksLandVerifiedInPostedWindow) {
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  const uint64_t size = 24ull << 20;
  std::vector<uint8_t> src(size), dst(size + 4096, 0);
  std::mt19937_64 rng(7);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  auto src_reg = client_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto dst_reg = server_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_reg.ok() && dst_reg.ok());

  std::mutex mu;
  std::set<std::pair<uint64_t, uint64_t>> landed;
  // On every way out: the window and its on_landed use this test's locals.
  struct CancelOnExit {
    Connection& c;
    ~CancelOnExit() { c.CancelReceive(9); }
  } cancel_on_exit{*server_peer_.conn};
  ASSERT_TRUE(server_peer_.conn
                  ->PostReceive(9, *dst_reg, 4096, size,
                                [&](uint64_t off, uint64_t len) {
                                  std::lock_guard<std::mutex> lock(mu);
                                  landed.insert({off, len});
                                })
                  .ok());
  // Out of order, mixed sizes: one eager-sized chunk and large rendezvous ones.
  const uint64_t piece = 8ull << 20;
  std::vector<Done<>> results(4);
  const std::pair<uint64_t, uint64_t> chunks[] = {
      {2 * piece, piece}, {0, 1000}, {1000, piece - 1000}, {piece, piece}};
  for (int i = 0; i < 4; ++i) {
    ChunkSend c{*src_reg, chunks[i].first, chunks[i].second, 9, chunks[i].first, std::nullopt};
    client_peer_.conn->SendChunk(c, results[i].Fn());
  }
  for (auto& r : results) EXPECT_TRUE(r.Wait().ok());
  {
    // Under mu first: the landing callbacks ran after their copies into
    // dst on the server's thread; the sender's completions order nothing
    // on this side (UCX's own synchronization is invisible to TSan).
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(landed.size(), 4u);
    for (auto& [off, len] : chunks) EXPECT_TRUE(landed.count({off, len})) << off;
  }
  EXPECT_EQ(std::memcmp(dst.data() + 4096, src.data(), size), 0);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 4096, [](uint8_t b) { return b == 0; }));

  // Refusals leave the connection up.
  EXPECT_EQ(SendChunkAndWait({*src_reg, 0, 100, 77, 0, std::nullopt}).code(), Code::kNotFound);
  EXPECT_EQ(SendChunkAndWait({*src_reg, 0, 4096, 9, size - 100, std::nullopt}).code(), Code::kOutOfRange);
  // A wrong checksum stands for corruption on the wire.
  EXPECT_EQ(SendChunkAndWait({*src_reg, 0, 100, 9, 0, uint64_t{12345}}).code(), Code::kCorrupt);
  EXPECT_EQ(SendChunkAndWait({*src_reg, 0, 2u << 20, 9, 0, uint64_t{12345}}).code(), Code::kCorrupt);
  // An unregistered source is refused locally.
  MemoryRegion bogus{src.data(), size, MemoryKind::kHost, 999};
  EXPECT_EQ(SendChunkAndWait({bogus, 0, 100, 9, 0, std::nullopt}).code(), Code::kInvalidArgument);

  server_peer_.conn->CancelReceive(9);
  EXPECT_EQ(SendChunkAndWait({*src_reg, 0, 100, 9, 0, std::nullopt}).code(), Code::kNotFound);
  EXPECT_TRUE(client_->DeregisterMemory(*src_reg).ok());
  EXPECT_TRUE(server_->DeregisterMemory(*dst_reg).ok());
}

TEST_P(UcxTest, OneSidedWriteIntoExportedRegion) {
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  ASSERT_NE(client_->capabilities() & kCapOneSidedWrite, 0u);
  std::vector<uint8_t> src(3 << 20), dst(4 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  auto src_reg = client_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto dst_reg = server_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_reg.ok() && dst_reg.ok());
  auto key = server_peer_.conn->ExportRegion(*dst_reg);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  server_peer_.conn->SendMessage(*key, nullptr);
  ASSERT_TRUE(client_peer_.WaitMessages(1));

  std::string remote_key;
  {
    std::lock_guard<std::mutex> lock(client_peer_.mu);
    remote_key = client_peer_.messages[0];
  }
  Done<> written;
  client_peer_.conn->Write(*src_reg, 0, remote_key, 1 << 20, src.size(), written.Fn());
  ASSERT_TRUE(written.Wait().ok());
  // A message after the write, received: orders this thread's reads of dst
  // after the server's progress thread placed the bytes (TSan sees no
  // other edge through UCX).
  client_peer_.conn->SendMessage("written", nullptr);
  ASSERT_TRUE(server_peer_.WaitMessages(1));
  EXPECT_EQ(std::memcmp(dst.data() + (1 << 20), src.data(), src.size()), 0);
  EXPECT_EQ(dst[(1 << 20) - 1], 0);

  Done<> outside;
  client_peer_.conn->Write(*src_reg, 0, remote_key, 2 << 20, src.size(), outside.Fn());
  EXPECT_EQ(outside.Wait().code(), Code::kOutOfRange);
  Done<> garbage;
  client_peer_.conn->Write(*src_reg, 0, "not a key", 0, 10, garbage.Fn());
  EXPECT_EQ(garbage.Wait().code(), Code::kCorrupt);
}

TEST_P(UcxTest, CleanCloseReachesPeerOnce) {
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  client_peer_.conn->Close();
  client_peer_.conn->Close();  // idempotent
  auto mine = client_peer_.closed.get_future();
  auto theirs = server_peer_.closed.get_future();
  EXPECT_TRUE(Await(mine).ok());
  Status peer = Await(theirs);
  EXPECT_TRUE(peer.ok()) << peer.ToString();
  Done<> after;
  client_peer_.conn->SendMessage("late", after.Fn());
  EXPECT_EQ(after.Wait().code(), Code::kUnavailable);
}

TEST_P(UcxTest, PeerGoingAwayFailsPendingWorkWithoutHanging) {
  if (std::string(GetParam().name) == "sm")
    GTEST_SKIP() << "UCX 1.13 over shared memory aborts inside ucp_am_handler_reply "
                    "(assertion ep->worker == worker) about 1 run in 6 when the peer's "
                    "endpoint is torn down mid-rendezvous; TODO(close): find whether our "
                    "teardown or UCX is at fault before re-enabling";
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  std::vector<uint8_t> src(8 << 20, 1);
  auto src_reg = client_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  ASSERT_TRUE(src_reg.ok());
  // No window posted and the server disappears: the chunk must finish with
  // an error (kNotFound if it was answered first, else a connection error).
  Done<> sent;
  client_peer_.conn->SendChunk({*src_reg, 0, src.size(), 1, 0, std::nullopt}, sent.Fn());
  listener_.reset();
  server_peer_.conn.reset();
  server_.reset();
  EXPECT_FALSE(sent.Wait().ok());
  auto closed = client_peer_.closed.get_future();
  EXPECT_EQ(closed.wait_for(kWait), std::future_status::ready);
}

TEST_P(UcxTest, ConnectToNobodyFailsWithinTimeout) {
  listener_->Close();
  Done<Result<std::shared_ptr<Connection>>> first;
  client_->Connect(listener_->address(), client_peer_.Handlers(), first.Fn());
  auto r = first.Wait();
  EXPECT_FALSE(r.ok());
  Done<Result<std::shared_ptr<Connection>>> second;
  client_->Connect("not-an-address", client_peer_.Handlers(), second.Fn());
  EXPECT_EQ(second.Wait().status().code(), Code::kInvalidArgument);
}

TEST_P(UcxTest, GpuMemoryOnlyWhereUcxHasCuda) {
  std::vector<uint8_t> buf(4096);
  auto reg = client_->RegisterMemory(buf.data(), buf.size(), MemoryKind::kCuda);
  if (client_->capabilities() & kCapGpuMemory) {
    GTEST_SKIP() << "this UCX has CUDA support; host memory cannot stand in for a device pointer";
  }
  EXPECT_EQ(reg.status().code(), Code::kUnsupported);
}

// Every TCP socket this process listens on must be bound to loopback.
std::set<std::string> ListeningAddresses() {
  std::set<uint64_t> inodes;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      unsigned long long inode;
      if (std::sscanf(target, "socket:[%llu]", &inode) == 1) inodes.insert(inode);
    }
    closedir(d);
  }
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout;
      uint64_t inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.insert(local.substr(0, local.find(':')));
    }
  }
  return out;
}

TEST_P(UcxTest, BindsOnlyToLoopback) {
  ASSERT_NO_FATAL_FAILURE(ConnectClient());
  const std::set<std::string> bound = ListeningAddresses();
  EXPECT_FALSE(bound.empty());
  for (const std::string& addr : bound) {
    EXPECT_TRUE(addr == "0100007F" || addr == "00000000000000000000000001000000")
        << "listening on non-loopback address (hex) " << addr;
  }
}

// "tcp": UCX's tcp transport on lo. "sm": shared memory (posix/sysv/cma)
// for data, UCX's tcp connection manager for setup only.
INSTANTIATE_TEST_SUITE_P(Tls, UcxTest,
                         ::testing::Values(Tls{"tcp", "tcp", true, "tcp/lo"},
                                           Tls{"sm", "sm,self,tcp", false, "/memory"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tern

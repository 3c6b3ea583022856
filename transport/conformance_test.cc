// The transport conformance suite: every backend available here must pass
// it. Adding a backend is one entry in Backends() below.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "base/hash.h"
#include "tern/fault_transport.h"
#include "tern/loopback_transport.h"
#include "tern/tcp_transport.h"
#include "tern/verbs_transport.h"
#include "tern/xfer.h"
#include "tern/xfer_chunks.h"
#include "transport/test_certs.h"
#include "transport/ucx/test_pair.h"
#include "xfer/xfer_wire.h"

namespace tern {
namespace {

using namespace std::chrono_literals;

// A server and a client transport of one backend kind.
struct Pair {
  std::unique_ptr<LoopbackNetwork> net;
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  std::string listen_address;
};

struct Backend {
  std::string name;
  std::function<Result<Pair>(const TlsConfig* client_tls)> make;
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

Result<Pair> MakeTcp(bool tls, const TlsConfig* client_tls) {
  Pair p;
  TcpOptions o;
  o.streams = 4;
  o.log = [](std::string_view) {};
  TcpOptions c = o;
  if (tls) {
    const auto& pki = testing::TestCerts();
    TERN_REQUIRE(pki.ok, kUnavailable, pki.error);
    o.tls = pki.server;
    c.tls = client_tls ? *client_tls : pki.client;
  }
  TERN_ASSIGN_OR_RETURN(p.server, NewTcpTransport(o));
  TERN_ASSIGN_OR_RETURN(p.client, NewTcpTransport(c));
  p.listen_address = "127.0.0.1:0";
  return p;
}

Result<Pair> MakeVerbs(const std::string& library) {
  VerbsOptions o;
  o.library = library;
  o.log = [](std::string_view) {};
  Pair p;
  TERN_ASSIGN_OR_RETURN(p.server, NewVerbsTransport(o));
  TERN_ASSIGN_OR_RETURN(p.client, NewVerbsTransport(o));
  p.listen_address = "127.0.0.1:0";
  return p;
}

std::vector<Backend> Backends() {
  return {
      {"loopback",
       [](const TlsConfig*) -> Result<Pair> {
         Pair p;
         p.net = std::make_unique<LoopbackNetwork>();
         p.server = NewLoopbackTransport(*p.net);
         p.client = NewLoopbackTransport(*p.net);
         p.listen_address = "conformance";
         return p;
       }},
      {"tcp", [](const TlsConfig* t) { return MakeTcp(false, t); }},
      {"tcp_tls", [](const TlsConfig* t) { return MakeTcp(true, t); }},
      {"ucx", [](const TlsConfig*) -> Result<Pair> { TERN_ASSIGN_OR_RETURN(auto t, ucx::NewLoopbackPairForTests()); return Pair{nullptr, std::move(t.first), std::move(t.second), "127.0.0.1:0"}; }},
      // A real RDMA device where there is one (skipped here with the reason).
      {"verbs", [](const TlsConfig*) { return MakeVerbs("libibverbs.so.1"); }},
#ifdef TERN_SOFTVERBS_PATH
      // The same verbs code over softverbs, the emulated in-process device.
      {"verbs_soft", [](const TlsConfig*) { return MakeVerbs(TERN_SOFTVERBS_PATH); }},
#endif
  };
}

// Connect deadlines in these tests. An attempt given up on fails a test
// that dials once, and its late connection shifts Accepted(i) and the fault
// injector's counts; ConnectWait giving up was seen under ASan on a loaded
// machine (FileFetchSurvivesDropsAndVerifies). A connect that works takes
// milliseconds, so a long deadline costs nothing.
constexpr uint64_t kConnectMs = 60000;

// Collects what a server-side connection receives.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> messages;
  std::vector<std::shared_ptr<Connection>> conns;
  int closed = 0;

  // Handlers that record this connection's messages and close.
  ConnectionHandlers Handlers() {
    ConnectionHandlers h;
    h.on_message = [this](std::string m) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(std::move(m));
      cv.notify_all();
    };
    h.on_closed = [this](Status) {
      std::lock_guard<std::mutex> lock(mu);
      ++closed;
      cv.notify_all();
    };
    return h;
  }
  AcceptHandler Handler() {
    return [this](std::shared_ptr<Connection> c) {
      {
        std::lock_guard<std::mutex> lock(mu);
        conns.push_back(c);
        cv.notify_all();
      }
      return Handlers();
    };
  }
  template <class Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, pred);
  }
};

std::vector<uint8_t> Pattern(uint64_t size, uint64_t seed) {
  std::vector<uint8_t> v(size);
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i + 8 <= size; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  return v;
}

class Conformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    auto p = GetParam().make(nullptr);
    if (!p.ok() && p.status().code() == Code::kUnavailable) GTEST_SKIP() << p.status().ToString();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    pair_ = std::move(p).value();
    auto l = pair_.server->Listen(pair_.listen_address, sink_.Handler());
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(l).value();
  }
  void TearDown() override {
    if (listener_) listener_->Close();
  }

  std::shared_ptr<Connection> Dial(Transport& t, ConnectionHandlers h = {}) {
    auto c = ConnectWait(t, listener_->address(), std::move(h), kConnectMs, RetryPolicy{1, 10, 10});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
  }

  // Server connection number i, once accepted.
  std::shared_ptr<Connection> Accepted(size_t i) {
    EXPECT_TRUE(sink_.WaitFor([&] { return sink_.conns.size() > i; }));
    std::lock_guard<std::mutex> lock(sink_.mu);
    return sink_.conns.size() > i ? sink_.conns[i] : nullptr;
  }

  // Sends `src` to a window over `dst` on the accepted side through `conn`.
  Status Move(Connection& conn, Connection& accepted, Transport& client_t, std::vector<uint8_t>& src,
              std::vector<uint8_t>& dst, uint64_t transfer_id, ChunkMap& map,
              const SendOptions& so = {}) {
    TERN_ASSIGN_OR_RETURN(MemoryRegion s, client_t.RegisterMemory(src.data(), src.size(), MemoryKind::kHost));
    TERN_ASSIGN_OR_RETURN(MemoryRegion d,
                          pair_.server->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost));
    TERN_RETURN_IF_ERROR(accepted.PostReceive(transfer_id, d, 0, dst.size(), nullptr));
    Status st = SendChunks(conn, s, 0, transfer_id, map, so, SteadyClock());
    accepted.CancelReceive(transfer_id);
    return st;
  }

  // The sinks are declared before pair_ so that they outlive it: their
  // handlers run on backend threads until the transports are destroyed, and
  // on_closed may still be on its way when Close() returns (transport.h).
  Sink sink_;
  Sink replies_;  // a test's own client connection
  Pair pair_;
  std::unique_ptr<Listener> listener_;
};

#ifndef TERN_CONFORMANCE_BIG

TEST_P(Conformance, ManySmallMessagesArriveInOrder) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  constexpr int kCount = 3000;
  for (int i = 0; i < kCount; ++i) conn->SendMessage("m" + std::to_string(i), nullptr);
  conn->SendMessage(std::string(100000, 'x'), nullptr);
  ASSERT_TRUE(sink_.WaitFor([&] { return sink_.messages.size() == kCount + 1; }))
      << sink_.messages.size();
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(sink_.messages[i], "m" + std::to_string(i));
  EXPECT_EQ(sink_.messages.back(), std::string(100000, 'x'));
}

TEST_P(Conformance, OversizedMessageRefusedLocally) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  // (shared: a completion later than the wait must not reach a dead local)
  auto done = std::make_shared<std::promise<Status>>();
  conn->SendMessage(std::string(kMaxMessageBytes + 1, 'x'), [done](Status s) { done->set_value(s); });
  auto f = done->get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(f.get().code(), Code::kOutOfRange);
}

TEST_P(Conformance, BulkTransferLandsBitExact) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  auto src = Pattern(48 << 20, 1);
  std::vector<uint8_t> dst(src.size() + 1000);  // an odd-sized last chunk
  src.resize(dst.size(), 7);
  auto map = ChunkMap::Make(src.size(), 1 << 20);
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(Move(*conn, *accepted, *pair_.client, src, dst, 1, *map).ok());
  EXPECT_TRUE(map->complete());
  EXPECT_EQ(src, dst);
}

TEST_P(Conformance, ChunkForUnknownWindowIsRefusedAndLinkSurvives) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  std::vector<uint8_t> buf(4096, 1);
  auto r = pair_.client->RegisterMemory(buf.data(), buf.size(), MemoryKind::kHost);
  ASSERT_TRUE(r.ok());
  auto done = std::make_shared<std::promise<Status>>();  // (as above)
  ChunkSend c{*r, 0, buf.size(), 99, 0, std::nullopt};
  conn->SendChunk(c, [done](Status s) { done->set_value(s); });
  auto f = done->get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(f.get().code(), Code::kNotFound);
  conn->SendMessage("still here", nullptr);
  ASSERT_TRUE(sink_.WaitFor([&] { return !sink_.messages.empty(); }));
  EXPECT_EQ(sink_.messages[0], "still here");
}

// transport.h: after CancelReceive returns, on_landed is not called again,
// so one already running must have finished.
TEST_P(Conformance, CancelReceiveWaitsForALandingCallbackInProgress) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  std::vector<uint8_t> src(1 << 20, 3), dst(src.size());
  auto s = pair_.client->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto d = pair_.server->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(s.ok() && d.ok());
  std::promise<void> entered;
  std::atomic<bool> finished{false};
  ASSERT_TRUE(accepted->PostReceive(1, *d, 0, dst.size(), [&](uint64_t, uint64_t) {
    entered.set_value();
    std::this_thread::sleep_for(200ms);
    finished = true;
  }).ok());
  conn->SendChunk(ChunkSend{*s, 0, src.size(), 1, 0, std::nullopt}, nullptr);
  ASSERT_EQ(entered.get_future().wait_for(20s), std::future_status::ready);
  accepted->CancelReceive(1);
  EXPECT_TRUE(finished.load());
  // src is the sender's until its op completes or Close returns: that the
  // receiver holds the bytes says nothing about the sender's thread being
  // done with them (TSan saw src freed under a send()).
  conn->Close();
}

TEST_P(Conformance, ManyConcurrentPeers) {
  constexpr int kPeers = 12;
  auto src = Pattern(2 << 20, 2);
  std::vector<std::shared_ptr<Connection>> conns;
  for (int i = 0; i < kPeers; ++i) {
    conns.push_back(Dial(*pair_.client));
    ASSERT_TRUE(conns.back());
  }
  ASSERT_TRUE(sink_.WaitFor([&] { return sink_.conns.size() == kPeers; }));
  // Peer i sends to window 100 + i, which every accepted connection maps
  // onto dsts[i]: whichever connection is peer i, its bytes land there.
  std::vector<std::vector<uint8_t>> dsts(kPeers, std::vector<uint8_t>(src.size()));
  auto srcs = std::vector<std::vector<uint8_t>>(kPeers, src);
  for (int i = 0; i < kPeers; ++i) srcs[i][0] = static_cast<uint8_t>(i);
  for (int c = 0; c < kPeers; ++c) {
    for (int i = 0; i < kPeers; ++i) {
      auto d = pair_.server->RegisterMemory(dsts[i].data(), src.size(), MemoryKind::kHost);
      ASSERT_TRUE(d.ok());
      ASSERT_TRUE(sink_.conns[c]->PostReceive(100 + i, *d, 0, src.size(), nullptr).ok());
    }
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kPeers; ++i) {
    threads.emplace_back([&, i] {
      auto map = ChunkMap::Make(src.size(), 256 << 10);
      auto s = pair_.client->RegisterMemory(srcs[i].data(), src.size(), MemoryKind::kHost);
      if (map.ok() && s.ok() && SendChunks(*conns[i], *s, 0, 100 + i, *map, {}, SteadyClock()).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kPeers);
  for (int i = 0; i < kPeers; ++i) EXPECT_EQ(dsts[i], srcs[i]) << "peer " << i;
}

TEST_P(Conformance, PeerDyingMidTransferSurfacesAnErrorWithoutHanging) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  auto src = Pattern(64 << 20, 3);
  std::vector<uint8_t> dst(src.size());
  auto s = pair_.client->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto d = pair_.server->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(s.ok() && d.ok());
  std::atomic<int> landed{0};
  ASSERT_TRUE(accepted->PostReceive(1, *d, 0, dst.size(), [&](uint64_t, uint64_t) {
    if (++landed == 2) accepted->Close();  // the receiver dies mid-transfer
  }).ok());
  auto map = ChunkMap::Make(src.size(), 1 << 20);
  SendOptions so;
  so.window_chunks = 4;
  so.stall_timeout_ms = 5000;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = SendChunks(*conn, *s, 0, 1, *map, so, SteadyClock());
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == Code::kUnavailable || st.code() == Code::kCancelled ||
              st.code() == Code::kTimeout)
      << st.ToString();
  // The real bound is the 5 s stall timeout (a close is usually seen at
  // once); 30 s leaves 25 s for a loaded machine under ASan, and still
  // fails a sender that waits for the 60 s default or for ever.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  // The receiver died inside its landing callback, so even the chunks it
  // placed may never have been acknowledged; what matters is that the
  // sender knows the transfer is incomplete.
  EXPECT_LT(map->done_chunks(), map->chunks());
  // The sender learns of the close before the receiver's Close() has
  // returned on its callback thread; only CancelReceive (or our own Close)
  // says no stream still writes into dst.
  accepted->CancelReceive(1);
}

// A connection closed by its peer while another thread sends on it: every
// send completes, the ones after the close with an error, and nothing races
// (issue 24: the loopback end's delivery thread reset its peer pointer while
// a sender read it; ThreadSanitizer's build runs this).
TEST_P(Conformance, SendsRacingThePeersCloseFailCleanly) {
  for (size_t round = 0; round < 10; ++round) {
    auto conn = Dial(*pair_.client, replies_.Handlers());
    ASSERT_TRUE(conn);
    auto accepted = Accepted(round);
    ASSERT_TRUE(accepted);
    struct Sent {
      std::atomic<int> done{0}, failed{0};
    };
    auto sent = std::make_shared<Sent>();  // completions may outlive the round
    std::atomic<bool> started{false};
    std::thread sender([&] {
      for (int i = 0; i < 20000 && sent->failed == 0; ++i) {
        conn->SendMessage("m", [sent](Status s) {
          if (!s.ok()) ++sent->failed;
          ++sent->done;
        });
        started = true;
      }
    });
    while (!started) std::this_thread::yield();
    accepted->Close();
    sender.join();
    EXPECT_TRUE(replies_.WaitFor([&] { return replies_.closed > int(round); }))
        << "the client end never saw the close";
    // Once the client end saw the close, a send fails.
    auto after = std::make_shared<std::promise<Status>>();
    conn->SendMessage("late", [after](Status s) { after->set_value(s); });
    auto f = after->get_future();
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
    EXPECT_FALSE(f.get().ok());
    conn->Close();
  }
}

TEST_P(Conformance, ResumesFromAcknowledgedChunksAfterADroppedConnection) {
  FaultPolicy fp;
  fp.drop_after_bytes = 20 << 20;
  auto faulty = NewFaultTransport(*pair_.client, fp);
  auto conn = Dial(*faulty);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  auto src = Pattern(48 << 20, 4);
  std::vector<uint8_t> dst(src.size());
  auto map = ChunkMap::Make(src.size(), 1 << 20);
  SendOptions so;
  so.window_chunks = 8;
  Status st = Move(*conn, *accepted, *faulty, src, dst, 1, *map, so);
  ASSERT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_EQ(faulty->stats().dropped, 1u);
  const uint64_t first = map->done_chunks();
  EXPECT_GT(first, 0u);
  EXPECT_LE(map->done_bytes(), uint64_t{20} << 20);

  auto conn2 = Dial(*faulty);  // the fault applies to the first connection only
  ASSERT_TRUE(conn2);
  auto accepted2 = Accepted(1);
  ASSERT_TRUE(accepted2);
  uint64_t resent = 0;
  so.on_progress = [&](uint64_t done) { resent = done; };
  ASSERT_TRUE(Move(*conn2, *accepted2, *faulty, src, dst, 2, *map, so).ok());
  EXPECT_TRUE(map->complete());
  EXPECT_EQ(src, dst);
}

TEST_P(Conformance, CorruptionIsDetectedAndRetried) {
  FaultPolicy fp;
  fp.corrupt_at_byte = (5 << 20) + 12345;
  auto faulty = NewFaultTransport(*pair_.client, fp);
  auto conn = Dial(*faulty);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  auto src = Pattern(16 << 20, 5);
  std::vector<uint8_t> dst(src.size());
  auto map = ChunkMap::Make(src.size(), 1 << 20);
  SendOptions no_retry;
  no_retry.max_chunk_retries = 0;
  Status st = Move(*conn, *accepted, *faulty, src, dst, 1, *map, no_retry);
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
  EXPECT_EQ(faulty->stats().corrupted, 1u);
  EXPECT_FALSE(map->done(5));
  // Retrying the bad chunk on the same (still healthy) connection repairs it.
  ASSERT_TRUE(Move(*conn, *accepted, *faulty, src, dst, 2, *map).ok());
  EXPECT_EQ(src, dst);
}

// A sender that rewrites a chunk and its checksum (tamper_at_byte) is, by
// design, invisible to the transport: the chunk lands, nothing is retried,
// and only its bytes differ. Where corrupt_at_byte (above) is caught, this
// is what the agent's signed SHA-256 per chunk exists for. tamper_chunks
// makes the sender keep lying: that many chunks differ, one byte each.
TEST_P(Conformance, TamperingAboveTheChecksumIsNotCaught) {
  FaultPolicy fp;
  fp.tamper_at_byte = (5 << 20) + 12345;
  fp.tamper_chunks = 3;
  auto faulty = NewFaultTransport(*pair_.client, fp);
  auto conn = Dial(*faulty);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  auto src = Pattern(16 << 20, 5);
  const auto sent = src;
  std::vector<uint8_t> dst(src.size());
  auto map = ChunkMap::Make(src.size(), 1 << 20);
  SendOptions no_retry;
  no_retry.max_chunk_retries = 0;
  no_retry.window_chunks = 1;  // chunks leave in order, so the lies are chunks 5, 6 and 7
  ASSERT_TRUE(Move(*conn, *accepted, *faulty, src, dst, 1, *map, no_retry).ok());
  EXPECT_TRUE(map->complete());
  EXPECT_EQ(faulty->stats().tampered, 3u);
  EXPECT_EQ(faulty->stats().corrupted, 0u);
  EXPECT_EQ(src, sent) << "the sender's own bytes were changed";
  std::vector<uint64_t> differ;
  for (uint64_t i = 0; i < src.size(); ++i)
    if (src[i] != dst[i]) differ.push_back(i);
  ASSERT_EQ(differ.size(), 3u);
  EXPECT_EQ(differ[0], uint64_t{(5 << 20) + 12345});
  EXPECT_EQ(differ[1] >> 20, 6u);
  EXPECT_EQ(differ[2] >> 20, 7u);
}

// A relay forwards a chunk with the checksum it received it with
// (ChunkSend::xxh3). A liar's chunk still lands: it carries the checksum of
// the rewritten bytes. A flip on the wire keeps the given one and is refused.
TEST_P(Conformance, TamperedChunkCarriesTheChecksumOfTheLie) {
  size_t dialled = 0;
  for (const bool tamper : {true, false}) {
    SCOPED_TRACE(tamper ? "tamper" : "corrupt");
    FaultPolicy fp;
    (tamper ? fp.tamper_at_byte : fp.corrupt_at_byte) = 100;
    auto faulty = NewFaultTransport(*pair_.client, fp);
    auto conn = Dial(*faulty);
    ASSERT_TRUE(conn);
    auto accepted = Accepted(dialled++);
    ASSERT_TRUE(accepted);
    auto src = Pattern(64 << 10, 9);
    std::vector<uint8_t> dst(src.size());
    auto s = faulty->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
    auto d = pair_.server->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
    ASSERT_TRUE(s.ok() && d.ok());
    ASSERT_TRUE(accepted->PostReceive(1, *d, 0, dst.size(), nullptr).ok());
    auto done = std::make_shared<std::promise<Status>>();
    conn->SendChunk(ChunkSend{*s, 0, src.size(), 1, 0, Xxh3(src.data(), src.size())},
                    [done](Status st) { done->set_value(st); });
    auto f = done->get_future();
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
    const Status st = f.get();
    accepted->CancelReceive(1);
    if (tamper) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(faulty->stats().tampered, 1u);
      std::vector<size_t> differ;
      for (size_t i = 0; i < src.size(); ++i)
        if (src[i] != dst[i]) differ.push_back(i);
      EXPECT_EQ(differ, std::vector<size_t>{100});
    } else {
      EXPECT_EQ(st.code(), Code::kCorrupt) << st.ToString();
      EXPECT_EQ(faulty->stats().corrupted, 1u);
    }
    EXPECT_TRUE(faulty->DeregisterMemory(*s).ok());
    EXPECT_TRUE(pair_.server->DeregisterMemory(*d).ok());
  }
}

// The man in the middle on messages: each is rewritten, multiplied or
// dropped as rewrite_message says, in order; the transport passes them on.
TEST_P(Conformance, RewrittenMessagesArriveAsRewritten) {
  FaultPolicy fp;
  fp.rewrite_message = [](std::string m) -> std::vector<std::string> {
    if (m == "drop") return {};
    if (m == "twice") return {"once", "again"};
    return {"<" + m + ">"};
  };
  auto faulty = NewFaultTransport(*pair_.client, fp);
  auto conn = Dial(*faulty);
  ASSERT_TRUE(conn);
  auto dropped = std::make_shared<std::promise<Status>>();
  conn->SendMessage("a", nullptr);
  conn->SendMessage("drop", [dropped](Status s) { dropped->set_value(s); });
  conn->SendMessage("twice", nullptr);
  conn->SendMessage("b", nullptr);
  ASSERT_TRUE(sink_.WaitFor([&] { return sink_.messages.size() == 4; }));
  EXPECT_EQ(sink_.messages, (std::vector<std::string>{"<a>", "once", "again", "<b>"}));
  auto f = dropped->get_future();
  ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
}

TEST_P(Conformance, FileFetchSurvivesDropsAndVerifies) {
  listener_->Close();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tern-conf-" + GetParam().name + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "root");
  auto data = Pattern((20 << 20) + 333, 6);
  std::ofstream(dir / "root" / "w.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), data.size());
  FileServerOptions so;
  so.log = [](std::string_view) {};
  auto server = FileServer::Start(*pair_.server, pair_.listen_address == "conformance" ? "files" : "127.0.0.1:0",
                                  (dir / "root").string(), so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  FaultPolicy fp;
  fp.drop_after_bytes = 8 << 20;
  fp.drop_connections = 2;
  fp.refuse_connects = 1;
  auto faulty = NewFaultTransport(*pair_.client, fp);
  FetchOptions fo;
  fo.chunk_bytes = 1 << 20;
  fo.retry = RetryPolicy{6, 10, 50};
  fo.connect_timeout_ms = kConnectMs;  // a connect given up on would be one more reconnect
  auto r = FetchFile(*faulty, (*server)->address(), "w.bin", (dir / "out.bin").string(), fo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, data.size());
  // Exactly both scheduled drops force a resume, whatever the timing: only
  // connections that carry traffic use up a drop (not the refused connect,
  // nor one ConnectWait gave up on under load, the likely cause of the
  // single resume once seen under ASan),
  // and a connection drops once 8 MiB crossed it, so the first two each land
  // less than 8 MiB of the 20 MiB file and leave the next more than 8 MiB.
  EXPECT_EQ(faulty->stats().refused, 1u);
  EXPECT_EQ(faulty->stats().dropped, 2u);
  EXPECT_EQ(r->reconnects, 2u);
  std::ifstream in(dir / "out.bin", std::ios::binary);
  std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, data);
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin.tern-part"));
  std::filesystem::remove_all(dir);
}

// A served directory with one file, and a FileServer on this backend.
struct FileFixture {
  std::filesystem::path dir;
  std::vector<uint8_t> data;
  std::unique_ptr<FileServer> server;
  ~FileFixture() {
    server.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  void Write(const std::vector<uint8_t>& bytes) {
    data = bytes;
    std::ofstream(dir / "root" / "w.bin", std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  std::vector<uint8_t> Read(const std::string& name) const {
    std::ifstream in(dir / name, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string Out(const std::string& name) const { return (dir / name).string(); }
};

std::unique_ptr<FileFixture> ServeFile(const Pair& pair, const std::string& test, uint64_t size_bytes,
                                       FileServerOptions so = {}) {
  auto f = std::make_unique<FileFixture>();
  f->dir = std::filesystem::temp_directory_path() / ("tern-conf-" + test + std::to_string(::getpid()));
  std::filesystem::remove_all(f->dir);
  std::filesystem::create_directories(f->dir / "root");
  f->Write(Pattern(size_bytes, 11));
  if (!so.log) so.log = [](std::string_view) {};
  auto server = FileServer::Start(*pair.server, pair.listen_address == "conformance" ? "files" : "127.0.0.1:0",
                                  (f->dir / "root").string(), std::move(so));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (server.ok()) f->server = std::move(server).value();
  return f;
}

// The resume state a fetch left behind, as done bytes (0 when absent).
uint64_t StateDoneBytes(const std::string& state_path, uint64_t size_bytes, uint64_t chunk_bytes) {
  std::ifstream in(state_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto st = xfer::ParsePartState(text);
  if (!st.ok()) return 0;
  auto map = ChunkMap::Make(size_bytes, chunk_bytes);
  if (!map.ok() || !map->SetBits(st->bitmap).ok()) return 0;
  return map->done_bytes();
}

// Fetches through a connection that drops after 8 MiB and without retries:
// leaves a partial copy and its resume state behind.
//
// Only if INFO reached the client before the drop: chunks that land before
// INFO sized the copy are recorded nowhere (docs/format/xfer.md "Partial
// file"), and the fetch then rightly keeps nothing. A head window past the
// drop point does not guarantee that on a multi-stream backend: the server
// sends the head's chunks with INFO, INFO rides one stream, the chunks all
// of them, so under load 8 MiB of chunks can cross before INFO is read (seen
// on tcp as "not a version 2 tern-part resume state" from an absent state
// file). A head below the drop point can: what lies past it is sent only
// after the client's WANT, which follows INFO.
void InterruptedFetch(Transport& client, FileFixture& f, const std::string& out,
                      uint64_t head_bytes = 4 << 20) {
  FaultPolicy fp;
  fp.drop_after_bytes = 8 << 20;
  fp.drop_connections = 1;
  ASSERT_LT(head_bytes, fp.drop_after_bytes) << "the drop could come before INFO";
  auto faulty = NewFaultTransport(client, fp);
  FetchOptions fo;
  fo.chunk_bytes = 1 << 20;
  fo.retry = RetryPolicy{1, 10, 10};
  fo.connect_timeout_ms = kConnectMs;  // one attempt: a slow connect would end it with kTimeout
  fo.head_bytes = head_bytes;
  auto r = FetchFile(*faulty, f.server->address(), "w.bin", f.Out(out), fo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_EQ(faulty->stats().dropped, 1u);
  EXPECT_TRUE(std::filesystem::exists(f.Out(out + ".tern-part.state")))
      << "the interrupted fetch kept no resume state";
}

TEST_P(Conformance, FileFetchSendsBeforeTheWholeFileHashAndCachesIt) {
  listener_->Close();
  // The hasher is held until the client saw chunks land: if INFO (or the
  // data) waited for the hash, nothing could land and the gate would time out.
  std::mutex mu;
  std::condition_variable cv;
  bool landed = false;
  int hashes_started = 0;
  bool gate_saw_data = false;
  FileServerOptions so;
  so.hash_cache_settle_ms = 0;  // the file was written a moment ago
  so.on_hash_start = [&](const std::string&) {
    std::unique_lock<std::mutex> lock(mu);
    ++hashes_started;
    gate_saw_data = cv.wait_for(lock, 20s, [&] { return landed; });
  };
  auto f = ServeFile(pair_, "hashlater-" + GetParam().name, (6 << 20) + 77, so);
  ASSERT_TRUE(f->server);
  FetchOptions fo;
  fo.chunk_bytes = 1 << 20;
  fo.on_progress = [&](const FetchProgress& p) {
    if (p.done_bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    landed = true;
    cv.notify_all();
  };
  auto r = FetchFile(*pair_.client, f->server->address(), "w.bin", f->Out("a.bin"), fo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(f->Read("a.bin"), f->data);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(hashes_started, 1);
    EXPECT_TRUE(gate_saw_data) << "no chunk landed while the whole-file hash was held back";
  }
  // A second GET of the unchanged file finds the hash cached: no new hashing.
  auto again = FetchFile(*pair_.client, f->server->address(), "w.bin", f->Out("b.bin"), FetchOptions{});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->xxh3, r->xxh3);
  EXPECT_EQ(f->Read("b.bin"), f->data);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(hashes_started, 1);
}

TEST_P(Conformance, FileFetchResumesExactlyAcrossRunsAndRestartsForAChangedFile) {
  listener_->Close();
  const uint64_t size = (20 << 20) + 333;
  auto f = ServeFile(pair_, "resume-" + GetParam().name, size);
  ASSERT_TRUE(f->server);
  FetchOptions fo;
  fo.chunk_bytes = 1 << 20;
  fo.head_bytes = 4 << 20;  // a head smaller than the file: its chunks, then the rest after WANT

  // Same version: the next run resumes from exactly the acknowledged chunks
  // (its GET carries them; the server sends the rest without a WANT).
  InterruptedFetch(*pair_.client, *f, "same.bin", fo.head_bytes);
  const uint64_t had = StateDoneBytes(f->Out("same.bin.tern-part.state"), size, fo.chunk_bytes);
  EXPECT_GT(had, 0u);
  EXPECT_LT(had, size);
  auto r = FetchFile(*pair_.client, f->server->address(), "w.bin", f->Out("same.bin"), fo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->resumed_bytes, had);
  EXPECT_EQ(r->reconnects, 0u);
  EXPECT_EQ(f->Read("same.bin"), f->data);
  EXPECT_FALSE(std::filesystem::exists(f->Out("same.bin.tern-part.state")));

  // Changed between runs (same size, other bytes): the partial copy is of
  // another version, so the fetch starts from zero and gets the new bytes.
  InterruptedFetch(*pair_.client, *f, "changed.bin", fo.head_bytes);
  EXPECT_GT(StateDoneBytes(f->Out("changed.bin.tern-part.state"), size, fo.chunk_bytes), 0u);
  std::this_thread::sleep_for(20ms);  // a visibly later mtime on coarse clocks too
  auto changed = f->data;
  for (size_t i = 0; i < changed.size(); i += 4096) changed[i] ^= 0xA5;
  f->Write(changed);
  auto c = FetchFile(*pair_.client, f->server->address(), "w.bin", f->Out("changed.bin"), fo);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->resumed_bytes, 0u);
  EXPECT_EQ(f->Read("changed.bin"), changed);
}

TEST_P(Conformance, FileFetchFreshHeadArrivesWithoutWant) {
  // Protocol level: a client that opened a head window gets its chunks
  // right after INFO without ever sending WANT; the rest waits for one.
  listener_->Close();
  const uint64_t size = (6 << 20) + 5;
  auto f = ServeFile(pair_, "head-" + GetParam().name, size);
  ASSERT_TRUE(f->server);
  Sink& replies = replies_;
  auto conn = ConnectWait(*pair_.client, f->server->address(), replies.Handlers(), kConnectMs,
                          RetryPolicy{1, 10, 10});
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  const uint64_t head = 4 << 20;
  std::vector<uint8_t> window(head);
  auto region = pair_.client->RegisterMemory(window.data(), window.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  std::atomic<uint64_t> landed_bytes{0};
  // On every way out (a failed ASSERT too): the server keeps sending into
  // `window` and calling on_landed (which uses landed_bytes) until the
  // window is cancelled; both are locals of this test.
  struct CloseWindow {
    Transport& t;
    Connection& c;
    MemoryRegion r;
    ~CloseWindow() {
      c.CancelReceive(9);
      c.Close();
      t.DeregisterMemory(r).IgnoreError();
    }
  } close_window{*pair_.client, **conn, *region};
  ASSERT_TRUE((*conn)->PostReceive(9, *region, 0, head, [&](uint64_t, uint64_t length) {
    landed_bytes += length;
    std::lock_guard<std::mutex> lock(replies.mu);
    replies.cv.notify_all();
  }).ok());
  (*conn)->SendMessage(xfer::EncodeGet({1 << 20, 9, "w.bin", 0, 0, "", head}), nullptr);
  ASSERT_TRUE(replies.WaitFor([&] { return !replies.messages.empty() && landed_bytes == head; }))
      << landed_bytes.load() << " head bytes landed";
  {
    std::lock_guard<std::mutex> lock(replies.mu);
    auto info = xfer::DecodeInfo(replies.messages[0]);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_TRUE(info->head());
    EXPECT_FALSE(info->sending());
    EXPECT_EQ(info->size_bytes, size);
  }
  EXPECT_TRUE(std::equal(window.begin(), window.end(), f->data.begin()));
  // Nothing past the head moves without WANT, and no DONE comes for it.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(landed_bytes.load(), head);
  {
    std::lock_guard<std::mutex> lock(replies.mu);
    for (size_t i = 1; i < replies.messages.size(); ++i) {
      EXPECT_NE(xfer::TypeOf(replies.messages[i]), xfer::kDone);
    }
  }
}

// A resumed copy damaged behind its state's back fails the final check; it
// is discarded and fetched once more from zero.
TEST_P(Conformance, FileFetchRefetchesADamagedResumeFromZero) {
  listener_->Close();
  const uint64_t size = (20 << 20) + 333;
  auto f = ServeFile(pair_, "mismatch-" + GetParam().name, size);
  ASSERT_TRUE(f->server);
  InterruptedFetch(*pair_.client, *f, "m.bin");
  std::ifstream state_in(f->Out("m.bin.tern-part.state"), std::ios::binary);
  auto state = xfer::ParsePartState(
      std::string((std::istreambuf_iterator<char>(state_in)), std::istreambuf_iterator<char>()));
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  auto map = ChunkMap::Make(size, 1 << 20);
  ASSERT_TRUE(map.ok() && map->SetBits(state->bitmap).ok());
  uint64_t held = 0;
  while (held < map->chunks() && !map->done(held)) ++held;
  ASSERT_LT(held, map->chunks()) << "the interrupted run acknowledged no chunk";
  {
    // Damage a chunk the state says is present, behind the state's back.
    const uint64_t at = held * (1 << 20) + 100;
    std::fstream part(f->Out("m.bin.tern-part"), std::ios::in | std::ios::out | std::ios::binary);
    part.seekp(static_cast<std::streamoff>(at));
    part.put(static_cast<char>(f->data[at] ^ 0xFF));
  }
  FetchOptions fo;
  fo.chunk_bytes = 1 << 20;
  auto r = FetchFile(*pair_.client, f->server->address(), "w.bin", f->Out("m.bin"), fo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->resumed_bytes, 0u);  // the damaged copy was not reused
  std::ifstream in(f->Out("m.bin"), std::ios::binary);
  std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(got == f->data);
  EXPECT_FALSE(std::filesystem::exists(f->Out("m.bin.tern-part")));
  EXPECT_FALSE(std::filesystem::exists(f->Out("m.bin.tern-part.state")));
}

// A fresh copy whose bytes do not match the server's whole-file hash is
// never renamed into place.
TEST_P(Conformance, FileFetchHashMismatchRefusesToRename) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tern-conf-badhash-" + GetParam().name + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<uint8_t> chunks(3 * 4096 + 1, 0x5A);
  auto region = pair_.server->RegisterMemory(chunks.data(), chunks.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  FetchOptions fo;
  fo.chunk_bytes = 4096;
  fo.head_bytes = 0;
  fo.retry = RetryPolicy{1, 10, 10};
  fo.connect_timeout_ms = kConnectMs;  // one attempt: a slow connect would end it with kTimeout
  const std::string out = (dir / "bad.bin").string();
  auto fetch = std::async(std::launch::async, [&] {
    return FetchFile(*pair_.client, listener_->address(), "w.bin", out, fo);
  });
  // (messages is appended to on a backend thread: read it under the lock)
  auto message = [&](size_t i) {
    std::lock_guard<std::mutex> lock(sink_.mu);
    return sink_.messages.at(i);
  };
  ASSERT_TRUE(sink_.WaitFor([&] { return !sink_.messages.empty(); }));
  auto get = xfer::DecodeGet(message(0));
  auto accepted = Accepted(0);
  ASSERT_TRUE(get.ok() && accepted);
  accepted->SendMessage(
      xfer::EncodeInfo({chunks.size(), 5, get->transfer_id, xfer::kInfoHashKnown, 0x1234}), nullptr);
  ASSERT_TRUE(sink_.WaitFor([&] { return sink_.messages.size() >= 2; }));
  auto want = xfer::DecodeWant(message(1), 1);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  for (uint64_t at = 0; at < chunks.size(); at += 4096) {
    const uint64_t n = std::min<uint64_t>(4096, chunks.size() - at);
    accepted->SendChunk(ChunkSend{*region, at, n, want->transfer_id, at, std::nullopt}, nullptr);
  }
  auto r = fetch.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt) << r.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tern-part"));
  accepted->Close();
  pair_.server->DeregisterMemory(*region).IgnoreError();
  std::filesystem::remove_all(dir);
}

TEST_P(Conformance, FileFetchRefusesAServerBreakingTheProtocol) {
  // The fixture's sink plays a hostile server; each case must end the fetch
  // with kProtocol (not retried) and expose nothing.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tern-conf-hostile-" + GetParam().name + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  size_t seen = 0;  // sink messages consumed so far
  auto next = [&](char type) -> std::string {
    std::string m;
    EXPECT_TRUE(sink_.WaitFor([&] { return sink_.messages.size() > seen; })) << "no '" << type << "'";
    std::lock_guard<std::mutex> lock(sink_.mu);
    if (sink_.messages.size() > seen) m = sink_.messages[seen++];
    EXPECT_EQ(xfer::TypeOf(m), type);
    return m;
  };
  const uint64_t size = 3 * 4096 + 1;
  auto run_case = [&](size_t conn_index, const std::function<void(Connection&, uint64_t)>& serve) {
    FetchOptions fo;
    fo.chunk_bytes = 4096;
    fo.head_bytes = 0;
    // Every case ends on a message; a stall or connect timeout instead
    // (a loaded machine) would be retried on a new connection and shift
    // the connection and message counts of the cases after it.
    fo.stall_timeout_ms = 30000;
    fo.connect_timeout_ms = kConnectMs;
    fo.retry = RetryPolicy{3, 10, 10};
    const std::string out = (dir / ("h" + std::to_string(conn_index))).string();
    auto fetch = std::async(std::launch::async, [&] {
      return FetchFile(*pair_.client, listener_->address(), "w.bin", out, fo);
    });
    auto get = xfer::DecodeGet(next(xfer::kGet));
    auto accepted = Accepted(conn_index);
    if (get.ok() && accepted) serve(*accepted, get->transfer_id);
    auto r = fetch.get();
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kProtocol) << r.status().ToString();
    EXPECT_FALSE(std::filesystem::exists(out));
  };
  // Resume-style sending for a version the client never named.
  run_case(0, [&](Connection& c, uint64_t id) {
    c.SendMessage(xfer::EncodeInfo({size, 5, id, xfer::kInfoSending, 0}), nullptr);
  });
  // The whole-file hash twice.
  run_case(1, [&](Connection& c, uint64_t id) {
    c.SendMessage(xfer::EncodeInfo({size, 5, id, 0, 0}), nullptr);
    next(xfer::kWant);
    c.SendMessage(xfer::EncodeHash({id, 1}), nullptr);
    c.SendMessage(xfer::EncodeHash({id, 1}), nullptr);
  });
  // INFO for another transfer than the GET's.
  run_case(2, [&](Connection& c, uint64_t id) {
    c.SendMessage(xfer::EncodeInfo({size, 5, id + 1, 0, 0}), nullptr);
  });
  // DONE with every chunk missing.
  run_case(3, [&](Connection& c, uint64_t id) {
    c.SendMessage(xfer::EncodeInfo({size, 5, id, xfer::kInfoHashKnown, 7}), nullptr);
    next(xfer::kWant);
    c.SendMessage(xfer::EncodeStatus(xfer::kDone, Status::Ok()), nullptr);
  });
  std::filesystem::remove_all(dir);
}

TEST_P(Conformance, FileFetchRefusesAnotherXferVersionClearly) {
  // A version 3 server answers a version 1 GET with ERROR 14 naming both.
  listener_->Close();
  auto f = ServeFile(pair_, "version-" + GetParam().name, 100000);
  ASSERT_TRUE(f->server);
  Sink& replies = replies_;
  auto conn = ConnectWait(*pair_.client, f->server->address(), replies.Handlers(), kConnectMs,
                          RetryPolicy{1, 10, 10});
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  std::string v1_get("G\x01\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x05\x00\x00\x00w.bin", 22);
  (*conn)->SendMessage(v1_get, nullptr);
  ASSERT_TRUE(replies.WaitFor([&] { return !replies.messages.empty(); }));
  Status verdict;
  {
    std::lock_guard<std::mutex> lock(replies.mu);
    ASSERT_TRUE(xfer::DecodeStatus(replies.messages[0], xfer::kError, &verdict).ok());
  }
  EXPECT_EQ(verdict.code(), Code::kProtocol);
  EXPECT_NE(verdict.message().find("version 1, this side 3"), std::string::npos) << verdict.ToString();
  (*conn)->Close();
}

// Listener::Close() returns only once the accept handler is not running
// (transport.h): the handler's state may be destroyed after it. The handler
// here blocks until released; Close must still be waiting by then.
TEST_P(Conformance, ListenerCloseWaitsForTheAcceptHandler) {
  listener_->Close();
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;
    bool release = false;
    bool closed = false;
  };
  auto g = std::make_shared<Gate>();
  auto l = pair_.server->Listen(pair_.listen_address, [g](std::shared_ptr<Connection>) {
    std::unique_lock<std::mutex> lock(g->mu);
    ++g->calls;
    g->cv.notify_all();
    g->cv.wait(lock, [&] { return g->release; });
    return ConnectionHandlers{};
  });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const std::string address = (*l)->address();
  // Dialled from a thread: loopback runs the handler inside Connect.
  std::thread dialer([&] { (void)ConnectWait(*pair_.client, address, {}, kConnectMs, RetryPolicy{1, 10, 10}); });
  bool entered = false;
  {
    std::unique_lock<std::mutex> lock(g->mu);
    entered = g->cv.wait_for(lock, 20s, [&] { return g->calls == 1; });
  }
  if (!entered) {
    // Not an ASSERT: returning with `dialer` joinable would terminate the
    // binary, and a handler still blocked would hang the transports' teardown.
    {
      std::lock_guard<std::mutex> lock(g->mu);
      g->release = true;
      g->cv.notify_all();
    }
    dialer.join();
    FAIL() << "the accept handler did not run within 20 s";
  }
  std::thread closer([&] {
    (*l)->Close();
    std::lock_guard<std::mutex> lock(g->mu);
    g->closed = true;
    g->cv.notify_all();
  });
  std::this_thread::sleep_for(200ms);  // a Close that does not wait returns well within this
  {
    std::lock_guard<std::mutex> lock(g->mu);
    EXPECT_FALSE(g->closed) << "Close() returned while the accept handler ran";
    g->release = true;
    g->cv.notify_all();
  }
  closer.join();
  dialer.join();
  EXPECT_TRUE(g->closed);
  // Closed: nobody more is accepted, and the handler is not called again.
  auto again = ConnectWait(*pair_.client, address, {}, 2000, RetryPolicy{1, 10, 10});
  EXPECT_FALSE(again.ok());
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard<std::mutex> lock(g->mu);
    EXPECT_EQ(g->calls, 1);
  }
  // The address is free again once Close returned (the connection accepted
  // above still holds the port: listeners bind with SO_REUSEADDR). UCX 1.13
  // does so only with UCX_TCP_CM_REUSEADDR=y in the environment (its config
  // API does not reach the connection manager).
  if (GetParam().name == "ucx" && std::getenv("UCX_TCP_CM_REUSEADDR") == nullptr) return;
  auto relisten = pair_.server->Listen(address, [](std::shared_ptr<Connection>) { return ConnectionHandlers{}; });
  EXPECT_TRUE(relisten.ok()) << relisten.status().ToString();
}

// A handler may close its own listener (Close() does not wait for itself).
TEST_P(Conformance, AcceptHandlerMayCloseItsListener) {
  listener_->Close();
  auto closed = std::make_shared<std::promise<void>>();
  std::unique_ptr<Listener> l;
  std::mutex mu;  // l is set before the first dial
  auto made = pair_.server->Listen(pair_.listen_address, [&, closed](std::shared_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu);
    l->Close();
    closed->set_value();
    return sink_.Handler()(std::move(c));
  });
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  {
    std::lock_guard<std::mutex> lock(mu);
    l = std::move(made).value();
  }
  auto fut = closed->get_future();
  auto conn = ConnectWait(*pair_.client, l->address(), {}, kConnectMs, RetryPolicy{1, 10, 10});
  ASSERT_EQ(fut.wait_for(20s), std::future_status::ready) << "the handler's Close() did not return";
  EXPECT_TRUE(conn.ok()) << conn.status().ToString();  // the connection it accepted stays up
  if (conn.ok()) (*conn)->Close();
}

// Two handlers (on two handshake threads) that each close their listener
// at once must not wait for each other. A backend that runs handlers one at
// a time (ucx: its progress thread) meets only one of them; the rendezvous
// gives up after 3 s then, and the second peer is refused.
TEST_P(Conformance, TwoHandlersClosingTheirListenerAtOnceDoNotDeadlock) {
  listener_->Close();
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    int in = 0;
    int returned = 0;
    std::unique_ptr<Listener> l;
  };
  auto g = std::make_shared<State>();
  auto made = pair_.server->Listen(pair_.listen_address, [g](std::shared_ptr<Connection>) {
    Listener* l = nullptr;
    {
      std::unique_lock<std::mutex> lock(g->mu);
      ++g->in;
      g->cv.notify_all();
      g->cv.wait_for(lock, 3s, [&] { return g->in >= 2; });
      l = g->l.get();
    }
    l->Close();
    std::lock_guard<std::mutex> lock(g->mu);
    ++g->returned;
    g->cv.notify_all();
    return ConnectionHandlers{};
  });
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const std::string address = (*made)->address();
  {
    std::lock_guard<std::mutex> lock(g->mu);
    g->l = std::move(made).value();
  }
  std::vector<std::thread> dialers;
  for (int i = 0; i < 2; ++i) {
    dialers.emplace_back([&] { (void)ConnectWait(*pair_.client, address, {}, kConnectMs, RetryPolicy{1, 10, 10}); });
  }
  bool all_returned = false;
  {
    std::unique_lock<std::mutex> lock(g->mu);
    all_returned = g->cv.wait_for(lock, 30s, [&] { return g->in >= 1 && g->returned == g->in; });
  }
  for (auto& t : dialers) t.join();
  std::unique_ptr<Listener> l;  // the state owns the listener whose handler owns the state: break the cycle
  {
    std::lock_guard<std::mutex> lock(g->mu);
    EXPECT_TRUE(all_returned) << g->in << " handlers ran, " << g->returned << " of their Close() calls returned";
    l = std::move(g->l);
  }
}

TEST_P(Conformance, WrongCertificateIsRefused) {
  if (GetParam().name != "tcp_tls") GTEST_SKIP() << "backend without authentication";
  auto rogue = GetParam().make(&testing::TestCerts().rogue_client);
  ASSERT_TRUE(rogue.ok());
  // (a refusal comes at once; a short deadline under load would turn it into kTimeout)
  auto c = ConnectWait(*rogue->client, listener_->address(), {}, kConnectMs, RetryPolicy{1, 10, 10});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().ToString();
  // The server keeps serving good peers.
  auto good = Dial(*pair_.client);
  ASSERT_TRUE(good);
  good->SendMessage("hi", nullptr);
  ASSERT_TRUE(sink_.WaitFor([&] { return !sink_.messages.empty(); }));
  EXPECT_TRUE(good->capabilities() & kCapEncrypted);
}

// The CA vouches for every host it signed: a client also checks that the
// server's certificate names the server it expected.
TEST_P(Conformance, WrongServerIdentityIsRefused) {
  if (GetParam().name != "tcp_tls") GTEST_SKIP() << "backend without authentication";
  TlsConfig expects_another = testing::TestCerts().client;
  expects_another.server_name = "another-host.tern.test";
  auto wrong = GetParam().make(&expects_another);
  ASSERT_TRUE(wrong.ok());
  auto c = ConnectWait(*wrong->client, listener_->address(), {}, kConnectMs, RetryPolicy{1, 10, 10});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().ToString();
  EXPECT_NE(c.status().message().find("does not name another-host.tern.test"), std::string::npos)
      << c.status().ToString();
  auto good = Dial(*pair_.client);
  ASSERT_TRUE(good);
  EXPECT_TRUE(good->capabilities() & kCapEncrypted);
}

#else  // TERN_CONFORMANCE_BIG: the >= 1 GiB case, labelled slow.

TEST_P(Conformance, OneGibibyteTransfer) {
  auto conn = Dial(*pair_.client);
  ASSERT_TRUE(conn);
  auto accepted = Accepted(0);
  ASSERT_TRUE(accepted);
  // Bounded memory: a 64 MiB source sent 16 times into a 64 MiB window.
  auto src = Pattern(64 << 20, 7);
  std::vector<uint8_t> dst(src.size());
  for (int round = 0; round < 16; ++round) {
    src[round] ^= 0x5A;  // every round carries different bytes
    auto map = ChunkMap::Make(src.size(), 4 << 20);
    ASSERT_TRUE(Move(*conn, *accepted, *pair_.client, src, dst, 100 + round, *map).ok());
    ASSERT_EQ(src, dst) << "round " << round;
  }
}

#endif

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tern

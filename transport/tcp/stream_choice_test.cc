// Which of a connection's streams carries a chunk (connection.cc, "Stream
// choice"): objects that fit in the first stream's window stay on it, so
// they never start on a stream that has not sent before (initial window);
// a bulk transfer that fills a stream spreads over the others.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <vector>

#include "tern/connect.h"
#include "tern/tcp_transport.h"
#include "transport/tcp/connection.h"

namespace tern::tcp {
namespace {

class StreamChoice : public ::testing::Test {
 protected:
  void Start(uint64_t notsent_lowat_bytes) {
    TcpOptions o;
    o.streams = 8;
    o.notsent_lowat_bytes = notsent_lowat_bytes;
    o.log = [](std::string_view) {};
    auto server = NewTcpTransport(o);
    auto client = NewTcpTransport(o);
    ASSERT_TRUE(server.ok() && client.ok());
    server_ = std::move(*server);
    client_ = std::move(*client);
    auto l = server_->Listen("127.0.0.1:0", [this](std::shared_ptr<Connection> c) {
      std::lock_guard<std::mutex> lock(mu_);
      accepted_ = c;
      cv_.notify_all();
      return ConnectionHandlers{};
    });
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(*l);
    auto c = ConnectWait(*client_, listener_->address(), {}, 60000, RetryPolicy{1, 10, 10});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    conn_ = *c;
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(20), [&] { return accepted_ != nullptr; }));
  }
  void TearDown() override {
    if (conn_) conn_->Close();
    if (accepted_) accepted_->Close();
    if (listener_) listener_->Close();
  }
  std::vector<uint64_t> Counts() {
    auto* tcp = dynamic_cast<TcpConnection*>(conn_.get());
    EXPECT_NE(tcp, nullptr);
    return tcp ? tcp->StreamChunkCounts() : std::vector<uint64_t>{};
  }

  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Listener> listener_;
  std::shared_ptr<Connection> conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Connection> accepted_;
};

// One small object at a time (a relay forwarding a small patch): every
// chunk on stream 0. Chunks used to go to whichever of the 8 stream threads
// woke first.
TEST_F(StreamChoice, SmallObjectsStayOnTheFirstStream) {
  Start(1 << 20);
  std::vector<uint8_t> src(64 << 10, 7), dst(src.size());
  auto s = client_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto d = server_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(s.ok() && d.ok());
  ASSERT_TRUE(accepted_->PostReceive(1, *d, 0, dst.size(), nullptr).ok());
  constexpr int kChunks = 40;
  for (int i = 0; i < kChunks; ++i) {
    std::promise<Status> done;
    ChunkSend c;
    c.src = *s;
    c.length = src.size();
    c.transfer_id = 1;
    conn_->SendChunk(c, [&](Status st) { done.set_value(st); });
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    ASSERT_TRUE(f.get().ok());
  }
  std::vector<uint64_t> want(8, 0);
  want[0] = kChunks;
  EXPECT_EQ(Counts(), want);
  accepted_->CancelReceive(1);
}

// Many chunks at once through sockets that hold little unsent data: the
// first stream fills and the others take over; every byte lands.
TEST_F(StreamChoice, BulkTransferSpreadsOverStreamsThatFill) {
  Start(16 << 10);
  constexpr uint64_t kChunk = 256 << 10, kChunks = 128;
  std::vector<uint8_t> src(kChunk * kChunks), dst(src.size());
  std::mt19937_64 rng(3);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  auto s = client_->RegisterMemory(src.data(), src.size(), MemoryKind::kHost);
  auto d = server_->RegisterMemory(dst.data(), dst.size(), MemoryKind::kHost);
  ASSERT_TRUE(s.ok() && d.ok());
  ASSERT_TRUE(accepted_->PostReceive(2, *d, 0, dst.size(), nullptr).ok());
  std::mutex mu;
  std::condition_variable cv;
  uint64_t completed = 0, failed = 0;
  for (uint64_t i = 0; i < kChunks; ++i) {
    ChunkSend c;
    c.src = *s;
    c.src_offset = i * kChunk;
    c.length = kChunk;
    c.transfer_id = 2;
    c.dst_offset = i * kChunk;
    conn_->SendChunk(c, [&](Status st) {
      std::lock_guard<std::mutex> lock(mu);
      ++completed;
      failed += !st.ok();
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return completed == kChunks; }));
  }
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  const auto counts = Counts();
  uint64_t total = 0, used = 0;
  for (uint64_t n : counts) {
    total += n;
    used += n > 0;
  }
  EXPECT_EQ(total, kChunks);
  EXPECT_GE(used, 2u) << "a bulk transfer that fills stream 0 must engage more streams";
  accepted_->CancelReceive(2);
}

}  // namespace
}  // namespace tern::tcp

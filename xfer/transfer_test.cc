// The transfer layer and file service over the loopback backend, and the
// peer-selection policy.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "tern/clock.h"
#include "tern/fault_transport.h"
#include "tern/xfer.h"
#include "tern/loopback_transport.h"
#include "tern/tcp_transport.h"
#include "tern/xfer_chunks.h"
#include "xfer/xfer_wire.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

TEST(ChunkMap, CountsChunksAndBytes) {
  auto m = ChunkMap::Make(10, 4);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->chunks(), 3u);
  EXPECT_EQ(m->ChunkLength(2), 2u);
  EXPECT_EQ(m->ChunkAt(8), 2u);
  EXPECT_EQ(m->ChunkAt(5), 3u);  // not a chunk start
  m->MarkDone(2);
  m->MarkDone(2);
  EXPECT_EQ(m->done_bytes(), 2u);
  EXPECT_FALSE(m->complete());
  m->MarkDone(0);
  m->MarkDone(1);
  EXPECT_TRUE(m->complete());
  EXPECT_FALSE(ChunkMap::Make(10, 0).ok());
  EXPECT_FALSE(ChunkMap::Make(10, kMaxChunkBytes + 1).ok());
}

TEST(ChunkMap, BitmapRoundTripsAndRejectsMisfits) {
  auto m = ChunkMap::Make(100, 10);
  ASSERT_TRUE(m.ok());
  m->MarkDone(3);
  m->MarkDone(9);
  auto copy = ChunkMap::Make(100, 10);
  const std::string bits(m->bits().begin(), m->bits().end());
  ASSERT_TRUE(copy->SetBits(bits).ok());
  EXPECT_TRUE(copy->done(3) && copy->done(9) && !copy->done(4));
  EXPECT_EQ(copy->done_bytes(), 20u);
  EXPECT_EQ(copy->SetBits("x").code(), Code::kCorrupt);
  std::string spare = bits;
  spare[1] = static_cast<char>(spare[1] | 0x80);  // chunk 15 does not exist
  EXPECT_EQ(copy->SetBits(spare).code(), Code::kCorrupt);
}

TEST(ChooseTcpStreams, FollowsTheBandwidthDelayProduct) {
  TcpOptions o;
  EXPECT_EQ(ChooseTcpStreams(o), 8u);
  o.rate_bps_hint = 1'000'000'000;
  o.rtt_us_hint = 100'000;  // 12.5 MB in flight
  EXPECT_EQ(ChooseTcpStreams(o), 6u);
  o.rtt_us_hint = 1000;
  EXPECT_EQ(ChooseTcpStreams(o), 2u);
  o.rate_bps_hint = 400'000'000'000;
  o.rtt_us_hint = 200'000;
  EXPECT_EQ(ChooseTcpStreams(o), o.max_streams);
  o.streams = 3;
  EXPECT_EQ(ChooseTcpStreams(o), 3u);
}

class FileServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tern-xfer-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root" / "sub");
    data_.resize((3 << 20) + 17);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<char>(i * 131 + (i >> 13));
    std::ofstream(dir_ / "root" / "sub" / "f.bin", std::ios::binary).write(data_.data(), data_.size());
    std::ofstream(dir_ / "secret.txt") << "outside the root";
    std::ofstream(dir_ / "root" / "empty");
    fs::create_symlink(dir_ / "secret.txt", dir_ / "root" / "link");
    server_t_ = NewLoopbackTransport(net_);
    client_t_ = NewLoopbackTransport(net_);
    FileServerOptions so;
    so.log = [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu_);
      log_ += std::string(l) + "\n";
    };
    auto s = FileServer::Start(*server_t_, "files", (dir_ / "root").string(), so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    fo_.chunk_bytes = 64 << 10;
    fo_.retry = RetryPolicy{3, 5, 20};
    // Tests run single attempts: a connect given up on under load would
    // end one with kTimeout (or count one more reconnect).
    fo_.connect_timeout_ms = 60000;
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  std::string Read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // The server's log handler uses mu_ and log_: declared before the
  // transports, so that they outlive any backend thread on its way out.
  std::mutex mu_;
  std::string log_;
  LoopbackNetwork net_;
  std::unique_ptr<Transport> server_t_, client_t_;
  std::unique_ptr<FileServer> server_;
  fs::path dir_;
  std::string data_;
  FetchOptions fo_;
};

TEST_F(FileServiceTest, FetchesAndVerifies) {
  auto r = FetchFile(*client_t_, "files", "sub/f.bin", (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, data_.size());
  EXPECT_EQ(Read(dir_ / "out"), data_);
  auto h = HashFile((dir_ / "out").string());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, r->xxh3);
  auto e = FetchFile(*client_t_, "files", "empty", (dir_ / "empty-out").string(), fo_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(fs::file_size(dir_ / "empty-out"), 0u);
}

TEST_F(FileServiceTest, RefusesPathsEscapingTheRoot) {
  for (const char* name : {"../secret.txt", "/etc/passwd", "sub/../../secret.txt", "link", "nope"}) {
    auto r = FetchFile(*client_t_, "files", name, (dir_ / "out").string(), fo_);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_TRUE(r.status().code() == Code::kInvalidArgument || r.status().code() == Code::kNotFound)
        << name << ": " << r.status().ToString();
    EXPECT_FALSE(fs::exists(dir_ / "out"));
    // Refused before any byte arrived: nothing is kept for a resume (the
    // head window's 64 MiB part file was left behind).
    EXPECT_FALSE(fs::exists(dir_ / "out.tern-part")) << name;
    EXPECT_FALSE(fs::exists(dir_ / "out.tern-part.state")) << name;
  }
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_NE(log_.find("escapes the served root"), std::string::npos) << log_;
}

// `tern xfer serve /` serves every file by its absolute path without the
// leading '/' (it refused each one as escaping the root), and still
// refuses `..`.
TEST_F(FileServiceTest, ServesTheFileSystemRoot) {
  FileServerOptions so;
  so.log = [](std::string_view) {};
  auto slash = FileServer::Start(*server_t_, "slash", "/", so);
  ASSERT_TRUE(slash.ok()) << slash.status().ToString();
  const std::string name = fs::canonical(dir_ / "root" / "sub" / "f.bin").string().substr(1);
  auto r = FetchFile(*client_t_, "slash", name, (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Read(dir_ / "out"), data_);
  auto up = FetchFile(*client_t_, "slash", "../" + name, (dir_ / "up").string(), fo_);
  EXPECT_EQ(up.status().code(), Code::kInvalidArgument) << up.status().ToString();
  EXPECT_FALSE(fs::exists(dir_ / "up"));
}

TEST_F(FileServiceTest, ResumesAcrossRunsFromTheStateFile) {
  FaultPolicy fp;
  fp.drop_after_bytes = 1 << 20;
  auto faulty = NewFaultTransport(*client_t_, fp);
  FetchOptions once = fo_;
  once.retry.attempts = 1;  // the first "run" dies with the connection
  auto r1 = FetchFile(*faulty, "files", "sub/f.bin", (dir_ / "out").string(), once);
  ASSERT_FALSE(r1.ok());
  ASSERT_TRUE(fs::exists(dir_ / "out.tern-part.state"));
  // Kept for the resume, no larger than the file (the 64 MiB head window
  // it was opened with is given back).
  EXPECT_LE(fs::file_size(dir_ / "out.tern-part"), data_.size());
  auto r2 = FetchFile(*client_t_, "files", "sub/f.bin", (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_GT(r2->resumed_bytes, 0u);
  EXPECT_LT(r2->resumed_bytes, data_.size());
  EXPECT_EQ(Read(dir_ / "out"), data_);
  EXPECT_FALSE(fs::exists(dir_ / "out.tern-part.state"));
}

// A fetch that fails with nothing to resume leaves no part file: a server
// that went away before answering, and an interrupted fetch without resume.
TEST_F(FileServiceTest, FailedFetchesWithNothingToResumeLeaveNothing) {
  FetchOptions once = fo_;
  once.retry.attempts = 1;
  auto silent = NewLoopbackTransport(net_);
  auto l = silent->Listen("silent", [](std::shared_ptr<Connection> c) {
    ConnectionHandlers h;  // hangs up on the GET, before INFO
    h.on_message = [weak = std::weak_ptr<Connection>(c)](std::string) {
      if (auto conn = weak.lock()) conn->Close();
    };
    return h;
  });
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto gone = FetchFile(*client_t_, "silent", "sub/f.bin", (dir_ / "out").string(), once);
  EXPECT_EQ(gone.status().code(), Code::kUnavailable) << gone.status().ToString();
  EXPECT_FALSE(fs::exists(dir_ / "out.tern-part"));
  (*l)->Close();

  FaultPolicy fp;
  fp.drop_after_bytes = 1 << 20;
  auto faulty = NewFaultTransport(*client_t_, fp);
  once.resume = false;
  auto cut = FetchFile(*faulty, "files", "sub/f.bin", (dir_ / "out").string(), once);
  EXPECT_EQ(cut.status().code(), Code::kUnavailable) << cut.status().ToString();
  EXPECT_EQ(faulty->stats().dropped, 1u);
  EXPECT_FALSE(fs::exists(dir_ / "out.tern-part"));
  EXPECT_FALSE(fs::exists(dir_ / "out.tern-part.state"));
}

// A destination that cannot hold the file fails cleanly before any byte
// moves (a store through the mapping would otherwise raise SIGBUS).
TEST_F(FileServiceTest, FullDiskFailsCleanlyInsteadOfCrashing) {
  const fs::path small = dir_ / "small";
  fs::create_directories(small);
  if (::mount("tern-test", small.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (needs root): " << std::strerror(errno);
  }
  auto r = FetchFile(*client_t_, "files", "sub/f.bin", (small / "out").string(), fo_);
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("cannot reserve"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(fs::exists(small / "out"));
  // A file that fits still comes, although the 64 MiB head window does not.
  std::ofstream(dir_ / "root" / "small.bin") << std::string(1000, 's');
  auto fits = FetchFile(*client_t_, "files", "small.bin", (small / "small").string(), fo_);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(Read(small / "small"), std::string(1000, 's'));
  ::umount2(small.c_str(), MNT_DETACH);
}

TEST_F(FileServiceTest, StaleStateForAChangedFileIsIgnored) {
  std::ofstream(dir_ / "out.tern-part.state") << "tern-part 1 5 abc 65536 01\n";
  std::ofstream(dir_ / "out.tern-part") << "junk!";
  auto r = FetchFile(*client_t_, "files", "sub/f.bin", (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->resumed_bytes, 0u);
  EXPECT_EQ(Read(dir_ / "out"), data_);
}

// Both backoffs of a fetch (ConnectWait's between refused connects, the
// fetch's own between attempts) sleep on the clock passed in: on a FakeClock
// minutes of backoff take no real time.
TEST_F(FileServiceTest, FetchBacksOffOnTheGivenClock) {
  FaultPolicy fp;
  fp.refuse_connects = 2;         // two ConnectWait retries
  fp.drop_after_bytes = 1 << 20;  // then one dropped attempt: a fetch retry
  auto faulty = NewFaultTransport(*client_t_, fp);
  FetchOptions o = fo_;
  o.retry = RetryPolicy{5, 60'000, 600'000};  // 1 min, 2 min, ...: real sleeps would hang here
  FakeClock clock;
  std::atomic<bool> done{false};
  Result<FetchResult> r{Status(Code::kInternal, "not run")};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread fetch([&] {
    r = FetchFile(*faulty, "files", "sub/f.bin", (dir_ / "out").string(), o, clock);
    done = true;
  });
  int wakeups = 0;
  while (!done) wakeups += clock.AdvanceToNextSleeper(/*real_wait_ms=*/10);
  fetch.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Read(dir_ / "out"), data_);
  EXPECT_EQ(r->reconnects, 1u);
  EXPECT_EQ(wakeups, 3);
  EXPECT_EQ(clock.sleeps_done(), 3u);
  EXPECT_GE(clock.NowUs(), uint64_t{60 + 120 + 60} * 1'000'000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_EQ(faulty->stats().refused, 2u);
  EXPECT_EQ(faulty->stats().dropped, 1u);
}

// A connection that carried nothing (like a late one ConnectWait gave up
// on) must not use up a scheduled drop, or tests that count drops flake.
TEST_F(FileServiceTest, UnusedConnectionsDoNotUseUpScheduledDrops) {
  FaultPolicy fp;
  fp.drop_after_bytes = 1 << 20;  // the first connection with traffic only
  auto faulty = NewFaultTransport(*client_t_, fp);
  auto idle = ConnectWait(*faulty, "files", {}, 60000);
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  (*idle)->Close();
  FetchOptions once = fo_;
  once.retry.attempts = 1;
  auto r = FetchFile(*faulty, "files", "sub/f.bin", (dir_ / "out").string(), once);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_EQ(faulty->stats().dropped, 1u);
  // The next connection with traffic has no drop scheduled.
  auto r2 = FetchFile(*faulty, "files", "sub/f.bin", (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(Read(dir_ / "out"), data_);
  EXPECT_EQ(faulty->stats().dropped, 1u);
}

// A state file garbled on disk used to throw out of std::stoul (abort);
// now it is ignored and the fetch starts over.
TEST_F(FileServiceTest, GarbledStateIsIgnored) {
  std::ofstream(dir_ / "out.tern-part.state") << "tern-part 1 5 abc 65536 zz\n";
  std::ofstream(dir_ / "out.tern-part") << "junk!";
  auto r = FetchFile(*client_t_, "files", "sub/f.bin", (dir_ / "out").string(), fo_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->resumed_bytes, 0u);
  EXPECT_EQ(Read(dir_ / "out"), data_);
}

// A server that lands the same chunk again and again (or sends every chunk
// and never the hash) must not keep the client waiting past its bounds.
TEST(FetchFromAHostileServer, RepeatedChunksDoNotHoldOffTheStallTimeout) {
  // What the server's handlers use is declared first, so that it outlives
  // the transports (handlers may still run until they are destroyed).
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::thread> senders;
  std::vector<std::shared_ptr<Connection>> conns;
  uint64_t file_size = 2 * 4096;
  static std::vector<char> data(2 * 4096, 'x');
  LoopbackNetwork net;
  auto server = NewLoopbackTransport(net);
  auto client = NewLoopbackTransport(net);
  auto region = server->RegisterMemory(data.data(), data.size(), MemoryKind::kHost);
  ASSERT_TRUE(region.ok());
  auto l = server->Listen("hostile", [&](std::shared_ptr<Connection> c) {
    std::lock_guard<std::mutex> lock(mu);
    conns.push_back(c);
    ConnectionHandlers h;
    std::weak_ptr<Connection> weak = c;
    h.on_message = [&, weak](std::string m) {
      auto conn = weak.lock();
      if (!conn) return;
      if (xfer::TypeOf(m) == xfer::kGet) {
        auto get = xfer::DecodeGet(m);
        conn->SendMessage(xfer::EncodeInfo({file_size, 5, get->transfer_id, 0, 0}), nullptr);
      } else if (xfer::TypeOf(m) == xfer::kWant) {
        auto want = xfer::DecodeWant(m, 100);
        const uint64_t window = want->transfer_id;
        std::lock_guard<std::mutex> lock(mu);
        senders.emplace_back([&, conn, window] {
          while (!stop) {  // chunk 0 over and over; chunk 1 of 2 never
            conn->SendChunk(ChunkSend{*region, 0, 4096, window, 0, std::nullopt}, nullptr);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        });
      }
    };
    return h;
  });
  ASSERT_TRUE(l.ok());
  const fs::path dir = fs::temp_directory_path() / ("tern-hostile-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (uint64_t size : {uint64_t{2 * 4096}, uint64_t{4096}}) {  // a chunk missing; the hash missing
    file_size = size;
    FetchOptions fo;
    fo.chunk_bytes = 4096;
    fo.head_bytes = 0;
    fo.stall_timeout_ms = 500;
    fo.retry = RetryPolicy{1, 10, 10};
    fo.resume = false;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = FetchFile(*client, "hostile", "w.bin", (dir / "out").string(), fo);
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().ToString();
    // The hash wait adds the file's size at 50 MB/s: nothing at this size,
    // so the bound is the 500 ms stall timeout. A client whose stall timer
    // the repeated chunk re-arms never returns; 15 s (30 x) separates the
    // two with room for a loaded machine under ASan.
    EXPECT_LT(took, std::chrono::seconds(15)) << "size " << size;
    stop = true;
    for (auto& t : senders) t.join();
    senders.clear();
    stop = false;
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : conns) c->Close();
    conns.clear();
  }
  (*l)->Close();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tern

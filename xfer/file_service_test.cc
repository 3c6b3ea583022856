// The `tern xfer` server against hostile or unlucky clients and files,
// driven by raw protocol messages over the loopback transport.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tern/xfer.h"
#include "tern/loopback_transport.h"
#include "tern/xfer_chunks.h"
#include "xfer/xfer_wire.h"

namespace tern {
namespace {

using namespace std::chrono_literals;

// A client connection that queues what the server sends (its handlers own
// the queue: they may run after the RawClient is gone).
struct RawClient {
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> msgs;
    bool closed = false;
  };
  std::shared_ptr<Queue> q = std::make_shared<Queue>();
  std::shared_ptr<Connection> conn;

  ConnectionHandlers Handlers() {
    ConnectionHandlers h;
    h.on_message = [q = q](std::string m) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->msgs.push_back(std::move(m));
      q->cv.notify_all();
    };
    h.on_closed = [q = q](Status) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->closed = true;
      q->cv.notify_all();
    };
    return h;
  }
  // The next message, or "" when none came within `wait` (or the connection closed).
  std::string Next(std::chrono::milliseconds wait = 20s) {
    std::unique_lock<std::mutex> lock(q->mu);
    q->cv.wait_for(lock, wait, [&] { return !q->msgs.empty() || q->closed; });
    if (q->msgs.empty()) return "";
    std::string m = std::move(q->msgs.front());
    q->msgs.pop_front();
    return m;
  }
  bool WaitClosed(std::chrono::milliseconds wait = 20s) {
    std::unique_lock<std::mutex> lock(q->mu);
    return q->cv.wait_for(lock, wait, [&] { return q->closed; });
  }
  ~RawClient() {
    if (conn) conn->Close();
  }
};

class FileServiceServer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tern-fsvc-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "root");
    server_t_ = NewLoopbackTransport(net_);
    client_t_ = NewLoopbackTransport(net_);
  }
  void TearDown() override {
    server_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string Write(const std::string& name, uint64_t size) {
    std::string bytes(size, '\0');
    for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + 7) >> 3);
    std::ofstream(dir_ / "root" / name, std::ios::binary).write(bytes.data(), bytes.size());
    return (dir_ / "root" / name).string();
  }
  void Start(FileServerOptions so) {
    so.log = [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.emplace_back(line);
    };
    auto s = FileServer::Start(*server_t_, "fsvc", (dir_ / "root").string(), std::move(so));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  std::unique_ptr<RawClient> Connect() {
    auto c = std::make_unique<RawClient>();
    auto conn = ConnectWait(*client_t_, server_->address(), c->Handlers(), 30000, RetryPolicy{1, 10, 10});
    EXPECT_TRUE(conn.ok()) << conn.status().ToString();
    if (conn.ok()) c->conn = *conn;
    return c;
  }
  static std::string Get(const std::string& name, uint64_t chunk_bytes, uint64_t id) {
    xfer::GetRequest g;
    g.chunk_bytes = chunk_bytes;
    g.transfer_id = id;
    g.name = name;
    return xfer::EncodeGet(g);
  }
  // The DONE or ERROR verdict in `m`.
  static Status Verdict(const std::string& m, char type) {
    Status verdict;
    Status st = xfer::DecodeStatus(m, type, &verdict);
    return st.ok() ? verdict : st;
  }
  bool Logged(const std::string& part) {
    std::lock_guard<std::mutex> lock(log_mu_);
    for (auto& l : log_) {
      if (l.find(part) != std::string::npos) return true;
    }
    return false;
  }

  std::filesystem::path dir_;
  // The server's log handler uses these; declared before the transports
  // so that they outlive any backend thread still on its way out.
  std::mutex log_mu_;
  std::vector<std::string> log_;
  LoopbackNetwork net_;
  std::unique_ptr<Transport> server_t_, client_t_;
  std::unique_ptr<FileServer> server_;
};

constexpr uint64_t kChunk = 64 << 10;

// A file truncated while the background hasher reads it: the hasher used to
// read through the mapping and died of SIGBUS; now the session is told the
// file changed.
TEST_F(FileServiceServer, FileTruncatedWhileHashedIsReportedAsChanged) {
  const std::string path = Write("t.bin", 4 << 20);
  FileServerOptions so;
  // (by value: the hasher thread may call it until server_ is reset in TearDown)
  so.on_hash_start = [path](const std::string&) { ASSERT_EQ(::truncate(path.c_str(), 4096), 0); };
  Start(so);
  auto c = Connect();
  ASSERT_TRUE(c->conn);
  c->conn->SendMessage(Get("t.bin", kChunk, 7), nullptr);
  auto info = xfer::DecodeInfo(c->Next());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size_bytes, 4u << 20);
  EXPECT_FALSE(info->hash_known());
  // Claims every chunk: only the hash is left to deliver.
  const uint64_t chunks = (4 << 20) / kChunk;
  c->conn->SendMessage(xfer::EncodeWant(7, std::string(chunks / 8, '\xff')), nullptr);
  std::string m = c->Next();
  while (xfer::TypeOf(m) == xfer::kHash) m = c->Next();  // none expected; tolerated
  Status done = Verdict(m, xfer::kDone);
  EXPECT_EQ(done.code(), Code::kUnavailable) << done.ToString();
  EXPECT_NE(done.message().find("changed"), std::string::npos) << done.ToString();
}

// With the hash queue full, a session hashes the file itself; its digest is
// cached, and queued jobs no session waits for any more are dropped.
TEST_F(FileServiceServer, SessionHashIsCachedAndAbandonedJobsAreDropped) {
  for (const char* n : {"a.bin", "b.bin", "c.bin", "d.bin"}) Write(n, 1 << 20);
  // The hasher thread waits in on_hash_start, and server_ (which joins it)
  // lives until TearDown: its state is shared, not this test's locals, and
  // it is released on every way out (a failed ASSERT too), so that the
  // server's shutdown does not wait out the 20 s.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    std::vector<std::string> started;
    void Release() {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
      cv.notify_all();
    }
  };
  auto gate = std::make_shared<Gate>();
  struct ReleaseOnExit {
    std::shared_ptr<Gate> g;
    ~ReleaseOnExit() { g->Release(); }
  } release_on_exit{gate};
  std::mutex& mu = gate->mu;
  std::condition_variable& cv = gate->cv;
  std::vector<std::string>& started = gate->started;
  FileServerOptions so;
  so.max_sessions = 2;  // the hash queue holds at most 2 jobs
  so.hash_threads = 1;
  so.hash_cache_settle_ms = 0;  // the files were written a moment ago
  so.on_hash_start = [gate](const std::string& p) {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->started.push_back(std::filesystem::path(p).filename().string());
    gate->cv.notify_all();
    gate->cv.wait_for(lock, 20s, [&] { return gate->release; });
  };
  Start(so);
  auto c = Connect();
  ASSERT_TRUE(c->conn);
  uint64_t id = 1;
  auto get_info = [&](const std::string& name) {
    c->conn->SendMessage(Get(name, kChunk, id), nullptr);
    auto info = xfer::DecodeInfo(c->Next());
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? *info : xfer::Info{};
  };
  // a: taken by the only hasher, held in on_hash_start.
  get_info("a.bin");
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return !started.empty(); }));
  }
  ++id;
  get_info("b.bin");  // queued
  ++id;
  get_info("c.bin");  // queued: the queue is full
  ++id;
  auto d = get_info("d.bin");  // no job: this session hashes after sending
  EXPECT_FALSE(d.hash_known());
  const uint64_t chunks = (1 << 20) / kChunk;
  c->conn->SendMessage(xfer::EncodeWant(id, std::string(chunks / 8, '\xff')), nullptr);
  auto hash = xfer::DecodeHash(c->Next());
  ASSERT_TRUE(hash.ok()) << hash.status().ToString();
  ASSERT_TRUE(Verdict(c->Next(), xfer::kDone).ok());
  auto want = HashFile((dir_ / "root" / "d.bin").string());
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(hash->xxh3, *want);
  // A new GET of d finds the session's digest cached (the queue is still full).
  ++id;
  auto again = get_info("d.bin");
  EXPECT_TRUE(again.hash_known());
  EXPECT_EQ(again.xxh3, *want);
  // b and c were abandoned by this session's later GETs: never hashed.
  c.reset();
  gate->Release();
  // (a late start shows only if it comes within 300 ms: slowness can hide a
  // regression here, never fail a correct server)
  std::this_thread::sleep_for(300ms);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(started, std::vector<std::string>{"a.bin"});
}

// A message longer than any legal request closes the session before it is
// queued (an inbox of such messages would hold 16 x 16 MiB).
TEST_F(FileServiceServer, OversizedMessageClosesTheSession) {
  Start({});
  auto c = Connect();
  ASSERT_TRUE(c->conn);
  std::string big = Get("x.bin", kChunk, 1);
  big.resize(8 * 1024 * 1024 + 8192, 'z');
  c->conn->SendMessage(big, nullptr);
  EXPECT_TRUE(c->WaitClosed());
  EXPECT_EQ(c->Next(10ms), "") << "the server answered instead of closing";
  server_.reset();
  EXPECT_TRUE(Logged("bytes (at most"));
}

// A server with an access token serves nothing to a GET without it or with
// another one (ERROR auth, no file created, not retried), and serves a GET
// that carries it. Without the check every fetch here succeeds.
TEST_F(FileServiceServer, AccessTokenIsRequiredBeforeAnyByte) {
  Write("x.bin", 3 * kChunk + 17);
  FileServerOptions so;
  so.access_token = "join-token-of-this-board";
  Start(so);
  FetchOptions fo;
  fo.chunk_bytes = kChunk;
  fo.retry = RetryPolicy{3, 1, 1};
  const std::string local = (dir_ / "got.bin").string();
  for (const std::string token : {"", "join-token-of-this-boarD", "join-token-of-this-board-"}) {
    fo.access_token = token;
    auto r = FetchFile(*client_t_, server_->address(), "x.bin", local, fo);
    ASSERT_FALSE(r.ok()) << "token '" << token << "' was served";
    EXPECT_EQ(r.status().code(), Code::kAuth) << r.status().ToString();
    EXPECT_FALSE(std::filesystem::exists(local)) << "bytes landed for token '" << token << "'";
  }
  fo.access_token = so.access_token;
  auto r = FetchFile(*client_t_, server_->address(), "x.bin", local, fo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 3 * kChunk + 17);
  EXPECT_EQ(r->reconnects, 0u);
  server_.reset();
  EXPECT_TRUE(Logged("access token"));
}

// A connection refused for lack of sessions gets ERROR and is then closed.
TEST_F(FileServiceServer, BusyRefusalClosesTheConnection) {
  FileServerOptions so;
  so.max_sessions = 1;
  Start(so);
  auto first = Connect();
  ASSERT_TRUE(first->conn);
  auto second = Connect();
  ASSERT_TRUE(second->conn);
  // (A backend may not deliver a message sent from inside its accept
  // handler: then the server answers the first request.)
  second->conn->SendMessage(Get("x.bin", kChunk, 1), nullptr);
  Status err = Verdict(second->Next(), xfer::kError);
  EXPECT_EQ(err.code(), Code::kResourceExhausted) << err.ToString();
  EXPECT_TRUE(second->WaitClosed()) << "the refused connection was left open";
  EXPECT_FALSE(first->WaitClosed(10ms));
}

// A FIFO inside the served root: opening it for reading used to block the
// session (and the server's shutdown) forever.
TEST_F(FileServiceServer, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = (dir_ / "root" / "p").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Start({});
  auto c = Connect();
  ASSERT_TRUE(c->conn);
  c->conn->SendMessage(Get("p", kChunk, 1), nullptr);
  const std::string m = c->Next();
  if (m.empty()) {  // unblock a server stuck in open() so the test can end
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  Status err = Verdict(m, xfer::kError);
  EXPECT_EQ(err.code(), Code::kInvalidArgument) << err.ToString();
  EXPECT_NE(err.message().find("not a regular file"), std::string::npos) << err.ToString();
}

// "Racy git": a file written moments before it is hashed may be rewritten
// within the same timestamp tick, so its digest is not cached; a settled
// one is, and a second fetch hashes nothing.
TEST_F(FileServiceServer, DigestsOfJustWrittenFilesAreNotCached) {
  for (uint64_t settle_ms : {uint64_t{60000}, uint64_t{0}}) {
    const std::string name = settle_ms ? "fresh.bin" : "settled.bin";
    Write(name, 300 << 10);  // above the size hashed before INFO
    // Shared: after a failed ASSERT, server_ and its hasher outlive this loop.
    auto hashes = std::make_shared<std::atomic<int>>(0);
    FileServerOptions so;
    so.hash_cache_settle_ms = settle_ms;
    so.on_hash_start = [hashes](const std::string&) { ++*hashes; };
    Start(so);
    FetchOptions fo;
    fo.chunk_bytes = 64 << 10;
    fo.resume = false;
    for (int i = 0; i < 2; ++i) {
      auto r = FetchFile(*client_t_, server_->address(), name, (dir_ / ("out" + std::to_string(i))).string(), fo);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
    EXPECT_EQ(hashes->load(), settle_ms ? 2 : 1) << "settle " << settle_ms << " ms";
    server_.reset();
  }
}

}  // namespace
}  // namespace tern

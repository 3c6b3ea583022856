// HashCache on its own: which digests are kept, found, invalidated and
// dropped.
#include "xfer/server/hash_cache.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include <xxhash.h>

namespace tern::xfer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class HashCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tern-hashcache-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << bytes;
    return (dir_ / name).string();
  }
  // Waits for a job to end (bounded) and returns its digest (0 when not ok).
  static uint64_t Wait(HashJob& job) {
    std::unique_lock<std::mutex> lock(job.mu);
    EXPECT_TRUE(job.cv.wait_for(lock, 20s, [&] { return job.done; }));
    return job.ok ? job.xxh3 : 0;
  }
  static uint64_t Xxh3(const std::string& s) { return XXH3_64bits(s.data(), s.size()); }
  fs::path dir_;
};

TEST_F(HashCacheTest, AnUnchangedFileIsHashedOnceAndAChangedOneAgain) {
  HashCache cache({1, 8, /*settle_ns=*/0, nullptr, [](std::string_view) {}});
  const std::string path = Write("a", std::string(100000, 'a'));
  auto f1 = MapServedFile(path);
  ASSERT_TRUE(f1.ok()) << f1.status().ToString();
  auto job = cache.For(**f1, path);
  ASSERT_TRUE(job);
  EXPECT_EQ(Wait(*job), Xxh3(std::string(100000, 'a')));
  // Same identity: the finished job itself, no new hashing.
  auto again = cache.For(**f1, path);
  ASSERT_TRUE(again);
  EXPECT_EQ(again.get(), job.get());
  EXPECT_EQ(cache.size(), 1u);
  // Rewritten with the same size: mtime/ctime (and so the identity) change,
  // the cached digest must not be found for it.
  std::this_thread::sleep_for(20ms);  // a visibly later mtime on coarse clocks too
  Write("a", std::string(100000, 'b'));
  auto f2 = MapServedFile(path);
  ASSERT_TRUE(f2.ok());
  ASSERT_NE((*f2)->id, (*f1)->id);
  auto changed = cache.For(**f2, path);
  ASSERT_TRUE(changed);
  EXPECT_NE(changed.get(), job.get());
  EXPECT_EQ(Wait(*changed), Xxh3(std::string(100000, 'b')));
  EXPECT_EQ(cache.size(), 2u);
}

// A digest of a file written within the settle window is computed but not
// kept: a same-size write in the same timestamp tick would keep its identity.
TEST_F(HashCacheTest, DigestsOfUnsettledFilesAreNotKept) {
  HashCache cache({1, 8, /*settle_ns=*/3600ull * 1000000000, nullptr, [](std::string_view) {}});
  const std::string path = Write("fresh", "just written");
  auto f = MapServedFile(path);
  ASSERT_TRUE(f.ok());
  auto job = cache.For(**f, path);
  ASSERT_TRUE(job);
  EXPECT_EQ(Wait(*job), Xxh3("just written"));
  {
    std::lock_guard<std::mutex> lock(job->mu);
    EXPECT_FALSE(job->cacheable);
  }
  job.reset();
  EXPECT_EQ(cache.size(), 0u);
  auto next = cache.For(**f, path);  // hashed again, not found
  ASSERT_TRUE(next);
  EXPECT_EQ(Wait(*next), Xxh3("just written"));
}

// A queued job whose last ticket went is cancelled and dropped, not hashed.
TEST_F(HashCacheTest, AJobNobodyWaitsForIsDropped) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::string> started;
  HashCache::Options o{1, 8, 0, nullptr, [](std::string_view) {}};
  o.on_hash_start = [&](const std::string& p) {
    std::unique_lock<std::mutex> lock(mu);
    started.push_back(p);
    cv.notify_all();
    cv.wait_for(lock, 20s, [&] { return release; });
  };
  HashCache cache(o);
  const std::string a = Write("a", "first"), b = Write("b", "second");
  auto fa = MapServedFile(a), fb = MapServedFile(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  auto ja = cache.For(**fa, a);  // the one hasher holds this one in on_hash_start
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return started.size() == 1; }));
  }
  auto jb = cache.For(**fb, b);  // queued behind it
  ASSERT_TRUE(ja && jb);
  jb.reset();  // the only ticket for b
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  EXPECT_EQ(Wait(*ja), Xxh3("first"));
  // b's entry goes when the hasher finds nobody waiting for it (bounded poll).
  for (int i = 0; i < 2000 && cache.size() != 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cache.size(), 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(started, std::vector<std::string>{a});  // b was never read
  }
  // Asked for again, b gets a job of its own that runs.
  auto again = cache.For(**fb, b);
  ASSERT_TRUE(again);
  EXPECT_EQ(Wait(*again), Xxh3("second"));
}

// Full: the least recently used entry goes; one just looked up stays.
TEST_F(HashCacheTest, EvictsTheLeastRecentlyUsed) {
  HashCache cache({1, 8, 0, nullptr, [](std::string_view) {}});
  auto id = [](uint64_t i) { return Identity{1, i, 10, 1, 1}; };
  for (uint64_t i = 1; i <= HashCache::kMaxEntries; ++i) cache.Insert(id(i), i);
  EXPECT_EQ(cache.size(), HashCache::kMaxEntries);
  ServedFile probe;  // fd -1: a lookup that misses cannot queue a job
  probe.id = id(1);
  ASSERT_TRUE(cache.For(probe, "1"));  // 1 is now the most recently used
  cache.Insert(id(HashCache::kMaxEntries + 1), 7);
  EXPECT_EQ(cache.size(), HashCache::kMaxEntries);
  EXPECT_TRUE(cache.For(probe, "1"));
  probe.id = id(2);
  EXPECT_FALSE(cache.For(probe, "2"));  // evicted
  probe.id = id(HashCache::kMaxEntries + 1);
  auto newest = cache.For(probe, "new");
  ASSERT_TRUE(newest);
  EXPECT_EQ(newest->xxh3, 7u);
}

}  // namespace
}  // namespace tern::xfer

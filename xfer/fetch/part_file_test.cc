// PartFile on its own: which landings count, the head window, the resume
// state, the final check, and what a failed fetch leaves on disk.
#include "xfer/fetch/part_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <xxhash.h>

#include "tern/loopback_transport.h"

namespace tern::xfer {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kChunk = 4096;

class PartFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tern-partfile-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    local_ = (dir_ / "out").string();
    t_ = NewLoopbackTransport(net_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Writes `bytes` at `offset` of the part file, as a transport would.
  void Put(uint64_t offset, const std::string& bytes) {
    const int fd = ::open((local_ + ".tern-part").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  bool Exists(const std::string& suffix) const { return fs::exists(local_ + suffix); }

  LoopbackNetwork net_;
  std::unique_ptr<Transport> t_;
  fs::path dir_;
  std::string local_;
};

TEST_F(PartFileTest, OnlyWholeChunksAtChunkStartsCount) {
  PartFile p(*t_, local_, kChunk, true);
  const uint64_t size = 3 * kChunk + 1;
  ASSERT_TRUE(p.Prepare(size, 5).ok());
  EXPECT_FALSE(p.Land(1, kChunk).fresh);          // not where a chunk starts
  EXPECT_FALSE(p.Land(0, 100).fresh);             // not a whole chunk
  EXPECT_FALSE(p.Land(4 * kChunk, kChunk).fresh);  // past the end
  EXPECT_TRUE(p.Land(0, kChunk).fresh);
  EXPECT_FALSE(p.Land(0, kChunk).fresh);  // a duplicate
  EXPECT_FALSE(p.Land(kChunk, kChunk).complete);
  EXPECT_FALSE(p.Land(2 * kChunk, kChunk).complete);
  const PartFile::Landed last = p.Land(3 * kChunk, 1);
  EXPECT_TRUE(last.fresh && last.complete);
  EXPECT_EQ(p.progress().done_bytes, size);
  EXPECT_TRUE(p.progress().complete);
}

// Chunks that land in the head window before INFO count once the copy is
// sized; closing the window cuts the file back to the copy's size.
TEST_F(PartFileTest, HeadWindowChunksCountOnceSizedAndTheWindowIsGivenBack) {
  PartFile p(*t_, local_, kChunk, true);
  ASSERT_TRUE(p.MapHead(5 * kChunk + 7).ok());
  EXPECT_EQ(p.head_bytes(), 5 * kChunk);  // whole chunks
  EXPECT_EQ(fs::file_size(local_ + ".tern-part"), 5 * kChunk);
  EXPECT_FALSE(p.Land(0, kChunk).fresh);  // size unknown yet: pending
  const uint64_t size = kChunk + 10;
  ASSERT_TRUE(p.Prepare(size, 9).ok());
  EXPECT_EQ(p.progress().done_bytes, kChunk);
  EXPECT_EQ(fs::file_size(local_ + ".tern-part"), 5 * kChunk);  // not below the open window
  p.UnmapHead();
  EXPECT_EQ(fs::file_size(local_ + ".tern-part"), size);
}

TEST_F(PartFileTest, StateRoundTripsForTheSameChunkSizeOnly) {
  const uint64_t size = 3 * kChunk + 1;
  {
    PartFile p(*t_, local_, kChunk, true);
    ASSERT_TRUE(p.Prepare(size, 5).ok());
    p.Land(0, kChunk);
    p.Land(2 * kChunk, kChunk);
    ASSERT_TRUE(p.LearnHash(0x1234, "w").ok());
    p.SaveState();
  }
  {
    PartFile q(*t_, local_, kChunk, true);
    EXPECT_EQ(q.LoadResume(), 2 * kChunk);
    EXPECT_EQ(q.resumed_bytes(), 2 * kChunk);
    const PartFile::Held held = q.held();
    EXPECT_EQ(held.size_bytes, size);
    EXPECT_EQ(held.tag, 5u);
    EXPECT_EQ(held.bitmap, std::string(1, '\x05'));
    // The server's hash for the version held must match the state's.
    EXPECT_EQ(q.LearnHash(0x9999, "w").code(), Code::kUnavailable);
    EXPECT_TRUE(q.discard_pending());
    q.Discard();
    EXPECT_EQ(q.held().tag, 0u);
    EXPECT_EQ(q.resumed_bytes(), 0u);
    EXPECT_FALSE(Exists(".tern-part.state"));
  }
  {
    PartFile p(*t_, local_, kChunk, true);
    ASSERT_TRUE(p.Prepare(size, 5).ok());
    p.Land(0, kChunk);
    p.SaveState();
  }
  PartFile other(*t_, local_, 2 * kChunk, true);
  EXPECT_EQ(other.LoadResume(), 0u);  // another chunk size: not this copy
  EXPECT_EQ(other.held().tag, 0u);
}

TEST_F(PartFileTest, CommitRenamesOnlyAMatchingCopy) {
  const std::string bytes(2 * kChunk + 3, 'z');
  const uint64_t xxh3 = XXH3_64bits(bytes.data(), bytes.size());
  {
    PartFile p(*t_, local_, kChunk, true);
    ASSERT_TRUE(p.Prepare(bytes.size(), 5).ok());
    Put(0, bytes);
    for (uint64_t at = 0; at < bytes.size(); at += kChunk) p.Land(at, std::min(kChunk, bytes.size() - at));
    ASSERT_TRUE(p.LearnHash(xxh3 ^ 1, "w").ok());
    p.SaveState();
    auto bad = p.Commit(local_, "w");
    EXPECT_EQ(bad.status().code(), Code::kCorrupt) << bad.status().ToString();
    EXPECT_FALSE(Exists(""));
    EXPECT_FALSE(Exists(".tern-part"));
    EXPECT_FALSE(Exists(".tern-part.state"));
  }
  PartFile p(*t_, local_, kChunk, true);
  ASSERT_TRUE(p.Prepare(bytes.size(), 5).ok());
  Put(0, bytes);
  for (uint64_t at = 0; at < bytes.size(); at += kChunk) p.Land(at, std::min(kChunk, bytes.size() - at));
  ASSERT_TRUE(p.LearnHash(xxh3, "w").ok());
  p.SaveState();
  auto good = p.Commit(local_, "w");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(*good, xxh3);
  std::ifstream in(local_, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), bytes);
  EXPECT_FALSE(Exists(".tern-part"));
  EXPECT_FALSE(Exists(".tern-part.state"));
}

// What a failed fetch leaves: nothing unless a chunk can be resumed.
TEST_F(PartFileTest, AbandonKeepsOnlyAResumableCopy) {
  {
    PartFile p(*t_, local_, kChunk, true);  // refused before INFO
    ASSERT_TRUE(p.MapHead(16 * kChunk).ok());
    p.Land(0, kChunk);
    p.Abandon();
    EXPECT_FALSE(Exists(".tern-part"));
  }
  {
    PartFile p(*t_, local_, kChunk, true);  // sized, nothing arrived
    ASSERT_TRUE(p.MapHead(16 * kChunk).ok());
    ASSERT_TRUE(p.Prepare(3 * kChunk, 5).ok());
    p.SaveState();
    p.Abandon();
    EXPECT_FALSE(Exists(".tern-part"));
    EXPECT_FALSE(Exists(".tern-part.state"));
  }
  {
    PartFile p(*t_, local_, kChunk, /*resume=*/false);  // a chunk, but resume off
    ASSERT_TRUE(p.Prepare(3 * kChunk, 5).ok());
    p.Land(0, kChunk);
    p.Abandon();
    EXPECT_FALSE(Exists(".tern-part"));
  }
  PartFile p(*t_, local_, kChunk, true);  // a chunk arrived: kept, at most the file's size
  ASSERT_TRUE(p.MapHead(16 * kChunk).ok());
  ASSERT_TRUE(p.Prepare(3 * kChunk, 5).ok());
  p.Land(0, kChunk);
  p.SaveState();
  p.Abandon();
  EXPECT_TRUE(Exists(".tern-part.state"));
  ASSERT_TRUE(Exists(".tern-part"));
  EXPECT_EQ(fs::file_size(local_ + ".tern-part"), 3 * kChunk);
  PartFile next(*t_, local_, kChunk, true);
  EXPECT_EQ(next.LoadResume(), kChunk);
}

}  // namespace
}  // namespace tern::xfer

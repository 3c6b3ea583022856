// A tensor of more than 4 GiB and 2^31 elements: only a few pages are ever
// written, so it costs little time. Env::CreateMapped allocates a new file's
// blocks (fallocate: a full disk fails the create instead of a later store
// through the mapping raising SIGBUS), so the file takes its 4 GiB of disk
// for the test's duration (unwritten extents: instant on ext4 and xfs).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <filesystem>

#include "tern/checkpoint.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Free bytes for an unprivileged writer on the file system that holds dir.
uint64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// Removes the test's directory however the test ends: a failed assertion
// must not leave 4 GiB behind for the next test (or the next CI run) to
// trip over.
struct RemoveOnExit {
  std::string dir;
  ~RemoveOnExit() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

TEST(CheckpointLarge, TensorBeyond4GiBRoundTripsAndClones) {
  std::string tmpl = (fs::path(::testing::TempDir()) / "tern_big_XXXXXX").string();
  const std::string dir = ::mkdtemp(tmpl.data());
  RemoveOnExit cleanup{dir};
  // The file and its clone each allocate their 4 GiB (see the top): say so
  // plainly when the disk cannot hold them, rather than failing in Create.
  const uint64_t needed = (uint64_t{9} << 30);
  ASSERT_GE(FreeBytes(dir), needed) << "this test needs 9 GiB free in " << dir
                                    << " (two fallocated 4 GiB files); set TMPDIR to a larger disk";
  const std::string path = dir + "/big.safetensors";
  const uint64_t elements = (uint64_t{1} << 31) + 3;  // > 2^31 elements, > 4 GiB of BF16
  std::vector<TensorDesc> tensors = {{"big", DType::kBF16, {elements}}, {"tail", DType::kU8, {5}}};
  {
    auto w = WritableCheckpoint::Create(path, tensors, {{"note", "sparse"}});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto& big = (*w)->view().tensors[0];
    ASSERT_EQ(big.desc->name, "big");
    ASSERT_EQ(big.desc->bytes(), elements * 2);
    const uint64_t last = big.desc->bytes() - 2;
    big.data[0] = 0x11;
    big.data[1] = 0x22;
    big.data[last] = 0x33;
    big.data[last + 1] = 0x44;
    auto& tail = (*w)->view().tensors[1];
    for (int i = 0; i < 5; ++i) tail.data[i] = static_cast<uint8_t>(i + 1);
    ASSERT_TRUE((*w)->Commit().ok());
  }
  const uint64_t allocated = AllocatedBytes(path);
  EXPECT_NE(allocated, UINT64_MAX);

  auto c = Checkpoint::Open(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const TensorRef* big = (*c)->view().Find("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->desc->elements(), elements);
  const uint64_t last = big->desc->bytes() - 2;
  EXPECT_EQ(big->data[0], 0x11);
  EXPECT_EQ(big->data[1], 0x22);
  EXPECT_EQ(big->data[last], 0x33);
  EXPECT_EQ(big->data[last + 1], 0x44);
  EXPECT_EQ(big->data[uint64_t{1} << 32], 0);  // a hole reads as zeros
  auto tail = (*c)->Locate("tail");
  ASSERT_TRUE(tail.ok());
  EXPECT_GT(tail->offset_bytes, uint64_t{1} << 32);
  EXPECT_EQ((*c)->view().Find("tail")->data[4], 5);

  // Cloning copies the source's extents as they are: never more than it.
  const std::string clone_path = dir + "/clone.safetensors";
  auto clone = WritableCheckpoint::CloneForWrite(**c, clone_path);
  ASSERT_TRUE(clone.ok()) << clone.status().ToString();
  (*clone)->view().tensors[0].data[last] = 0x55;
  ASSERT_TRUE((*clone)->Commit().ok());
  EXPECT_LE(AllocatedBytes(clone_path), allocated + (uint64_t{64} << 20));
  auto reopened = Checkpoint::Open(clone_path);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  const TensorRef* big2 = (*reopened)->view().Find("big");
  EXPECT_EQ(big2->data[0], 0x11);
  EXPECT_EQ(big2->data[last], 0x55);
  EXPECT_EQ(big2->data[last + 1], 0x44);
  EXPECT_EQ((*reopened)->view().Find("tail")->data[0], 1);
  EXPECT_EQ((*reopened)->metadata("clone.safetensors").at("note"), "sparse");
  c->reset();
  reopened->reset();
}

}  // namespace
}  // namespace tern

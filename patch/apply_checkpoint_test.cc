// ApplyCheckpoint on real files: a good apply is bitwise the target, and every
// failure (bad base, corrupt patch, refusal or error at commit) leaves nothing
// at OUT and no staged files behind.
#include "tern/apply_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tests/support/files.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using testing::Slurp;
using testing::TempDir;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<TensorDesc> Layout() {
  return {{"a.weight", DType::kBF16, {64, 33}},
          {"b.weight", DType::kF32, {17, 5}},
          {"c.bias", DType::kF16, {129}}};
}

// Writes a checkpoint whose bytes come from `seed`; `changes` bytes of it
// then differ by a seeded flip (the "next step" of the same training run).
void WriteCheckpoint(const std::string& path, uint64_t shard_bytes_max, int changes) {
  CreateOptions options;
  options.shard_bytes_max = shard_bytes_max;
  auto ckpt = WritableCheckpoint::Create(path, Layout(), {{"format", "pt"}}, options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::mt19937_64 rng(7);
  for (auto& t : (*ckpt)->view().tensors)
    for (uint64_t i = 0; i < t.desc->bytes(); ++i) t.data[i] = static_cast<uint8_t>(rng());
  std::mt19937_64 flips(11);
  for (int c = 0; c < changes; ++c) {
    auto& t = (*ckpt)->view().tensors[flips() % (*ckpt)->view().tensors.size()];
    t.data[flips() % t.desc->bytes()] ^= static_cast<uint8_t>(1 + flips() % 255);
  }
  ASSERT_TRUE((*ckpt)->Commit().ok());
}

class ApplyCheckpointTest : public ::testing::TestWithParam<bool> {
 protected:
  // GetParam(): sharded directory (true) or single file.
  void SetUp() override {
    const std::string ext = GetParam() ? "" : ".safetensors";
    base_ = in_ / ("base" + ext);
    target_ = in_ / ("target" + ext);
    out_ = out_dir_ / ("out" + ext);
    const uint64_t shard = GetParam() ? 4096 : 0;
    WriteCheckpoint(base_, shard, 0);
    WriteCheckpoint(target_, shard, 40);
    auto b = Checkpoint::Open(base_);
    auto t = Checkpoint::Open(target_);
    ASSERT_TRUE(b.ok() && t.ok());
    auto patch = Diff((*b)->view(), (*t)->view(), DiffOptions{}, pool_);
    ASSERT_TRUE(patch.ok()) << patch.status().ToString();
    patch_ = std::move(*patch);
    base_ckpt_ = std::move(*b);
  }

  // Nothing at OUT, nothing staged beside it.
  void ExpectNoOutput() { EXPECT_EQ(Entries(out_dir_.path()), std::vector<std::string>{}); }

  TempDir in_{"tern_apply"}, out_dir_{"tern_apply_out"};
  std::string base_, target_, out_;
  std::vector<uint8_t> patch_;
  std::unique_ptr<Checkpoint> base_ckpt_;
  ThreadPool pool_{2};
};

TEST_P(ApplyCheckpointTest, GoodApplyIsBitwiseTheTarget) {
  ApplyCheckpointOptions options;
  options.verify_full = true;
  auto r = ApplyCheckpoint(*base_ckpt_, patch_, out_, pool_, options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto target = Checkpoint::Open(target_);
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(r->target_digest, ComputeDigest((*target)->view(), pool_));
  EXPECT_GT(r->changed_elements, 0u);
  // Same files, byte for byte (headers included: both written alike).
  if (GetParam()) {
    EXPECT_GT((*target)->files().size(), 1u);
    EXPECT_EQ(Entries(out_), Entries(target_));
    for (const std::string& f : Entries(target_)) EXPECT_EQ(Slurp(out_ + "/" + f), Slurp(target_ + "/" + f)) << f;
  } else {
    EXPECT_EQ(Slurp(out_), Slurp(target_));
  }
  EXPECT_EQ(Entries(out_dir_.path()), std::vector<std::string>{fs::path(out_).filename().string()});
}

TEST_P(ApplyCheckpointTest, WrongBaseLeavesNoOutput) {
  auto target = Checkpoint::Open(target_);
  ASSERT_TRUE(target.ok());
  auto r = ApplyCheckpoint(**target, patch_, out_, pool_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("is not this patch's base"), std::string::npos);
  ExpectNoOutput();
}

TEST_P(ApplyCheckpointTest, CorruptPatchLeavesNoOutput) {
  // A flipped bit anywhere (framing, manifest, a segment) and a cut patch.
  for (size_t at : {size_t{3}, patch_.size() / 2, patch_.size() - 3}) {
    std::vector<uint8_t> bad = patch_;
    bad[at] ^= 0x10;
    auto r = ApplyCheckpoint(*base_ckpt_, bad, out_, pool_);
    ASSERT_FALSE(r.ok()) << "flip at " << at;
    EXPECT_TRUE(r.status().code() == Code::kCorrupt || r.status().code() == Code::kUnsupported)
        << r.status().ToString();
    ExpectNoOutput();
  }
  auto r = ApplyCheckpoint(*base_ckpt_, std::span(patch_).first(patch_.size() - 1), out_, pool_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt) << r.status().ToString();
  ExpectNoOutput();
}

TEST_P(ApplyCheckpointTest, ErrorBeforeCommitLeavesNoOutput) {
  bool called = false;
  ApplyCheckpointOptions options;
  options.before_commit = [&] {
    called = true;
    return TERN_ERROR(kUnavailable, "told to stop");
  };
  auto r = ApplyCheckpoint(*base_ckpt_, patch_, out_, pool_, options);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(called);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  ExpectNoOutput();
}

TEST_P(ApplyCheckpointTest, FailedCommitRemovesTheStagedCopy) {
  // Something takes OUT while the apply runs: Commit refuses to replace it,
  // and what it found there is left alone.
  ApplyCheckpointOptions options;
  options.before_commit = [&] {
    std::ofstream(out_) << "someone else's";
    return Status::Ok();
  };
  auto r = ApplyCheckpoint(*base_ckpt_, patch_, out_, pool_, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists) << r.status().ToString();
  EXPECT_EQ(Entries(out_dir_.path()), std::vector<std::string>{fs::path(out_).filename().string()});
  EXPECT_EQ(Slurp(out_), "someone else's");
}

TEST_P(ApplyCheckpointTest, ExistingOutputIsKeptUnlessOverwrite) {
  std::ofstream(out_) << "old";
  auto r = ApplyCheckpoint(*base_ckpt_, patch_, out_, pool_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  EXPECT_EQ(Slurp(out_), "old");
  if (GetParam()) return;  // a directory cannot replace a plain file
  ApplyCheckpointOptions options;
  options.overwrite = true;
  ASSERT_TRUE(ApplyCheckpoint(*base_ckpt_, patch_, out_, pool_, options).ok());
  EXPECT_EQ(Slurp(out_), Slurp(target_));
}

INSTANTIATE_TEST_SUITE_P(Forms, ApplyCheckpointTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Sharded" : "SingleFile"; });

}  // namespace
}  // namespace tern

// FaultEnv injects what it promises, and WriteFileAtomic never lets a
// half-written target be seen under any of those faults.
#include "tern/fault_env.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/path.h"

namespace tern {
namespace {

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(FaultEnv, FailsTheNthOfEachKindAndCounts) {
  auto mem = NewMemEnv();
  EnvFaultPolicy p;
  p.fail_write_nth = 2;
  p.fail_sync_nth = 1;
  p.fail_rename_nth = 1;
  FaultEnv env(*mem, p);
  auto w = env.OpenWritable("/f", CreateMode::kNew);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Append(Bytes("one")).ok());
  Status second = (*w)->Append(Bytes("two"));
  EXPECT_EQ(second.code(), Code::kIo);
  EXPECT_NE(second.message().find("injected"), std::string::npos) << second.ToString();
  EXPECT_TRUE((*w)->Append(Bytes("three")).ok());
  EXPECT_EQ((*w)->Sync().code(), Code::kIo);
  EXPECT_TRUE((*w)->Sync().ok());
  EXPECT_EQ(env.Rename("/f", "/g", RenameMode::kReplace).code(), Code::kIo);
  EXPECT_TRUE(env.Rename("/f", "/g", RenameMode::kReplace).ok());
  const EnvFaultStats s = env.stats();
  EXPECT_EQ(s.writes, 3u);
  EXPECT_EQ(s.syncs, 2u);
  EXPECT_EQ(s.renames, 2u);
  EXPECT_EQ(s.failed, 3u);
  std::string got;
  ASSERT_TRUE(ReadFileToString(*mem, "/g", 100, &got).ok());
  EXPECT_EQ(got, "onethree");  // no short writes asked for: the failed one wrote nothing
}

TEST(FaultEnv, ShortWritesLeaveASeededPrefix) {
  auto mem = NewMemEnv();
  EnvFaultPolicy p;
  p.fail_write_nth = 1;
  p.short_writes = true;
  p.seed = 7;
  std::string first;
  for (int run = 0; run < 2; ++run) {  // same seed, same prefix
    FaultEnv env(*mem, p);
    const std::string path = "/s" + std::to_string(run);
    auto w = env.OpenWritable(path, CreateMode::kNew);
    ASSERT_TRUE(w.ok());
    const std::string payload(1000, 'p');
    EXPECT_EQ((*w)->Append(Bytes(payload)).code(), Code::kIo);
    std::string got;
    ASSERT_TRUE(ReadFileToString(*mem, path, 2000, &got).ok());
    EXPECT_LT(got.size(), payload.size());
    if (run == 0) first = got;
    EXPECT_EQ(got, first);
  }
}

TEST(FaultEnv, WriteFailureRateIsSeeded) {
  auto mem = NewMemEnv();
  EnvFaultPolicy p;
  p.write_failure_rate = 0.5;
  auto failures = [&](uint64_t seed) {
    p.seed = seed;
    FaultEnv env(*mem, p);
    auto w = env.OpenWritable("/r", CreateMode::kTruncate);
    std::vector<bool> out;
    for (int i = 0; i < 64; ++i) out.push_back(!(*w)->Append(Bytes("x")).ok());
    return out;
  };
  const auto a = failures(3), b = failures(3), c = failures(4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const auto n = std::count(a.begin(), a.end(), true);
  EXPECT_GT(n, 10);
  EXPECT_LT(n, 54);
}

// Every write, sync and rename that WriteFileAtomic does is failed in turn,
// with short writes: the target must always hold all of the old contents or
// all of the new ones, and no temporary may be left behind.
void CheckAtomicReplaceUnderFaults(Env& base, const std::string& dir) {
  const std::string target = dir + "/target";
  const std::string old_bytes(5000, 'o');
  const std::string new_bytes(7000, 'n');
  int failed_runs = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (uint64_t nth = 1; nth <= 3; ++nth) {
      ASSERT_TRUE(RemoveTree(base, target).ok());
      ASSERT_TRUE(WriteFileAtomic(base, target, Bytes(old_bytes), false).ok());
      EnvFaultPolicy p;
      p.short_writes = true;
      p.seed = nth * 31 + kind;
      (kind == 0 ? p.fail_write_nth : kind == 1 ? p.fail_sync_nth : p.fail_rename_nth) = nth;
      FaultEnv env(base, p);
      Status st = WriteFileAtomic(env, target, Bytes(new_bytes), /*overwrite=*/true);
      std::string got;
      ASSERT_TRUE(ReadFileToString(base, target, 1 << 20, &got).ok());
      if (st.ok()) {
        EXPECT_EQ(got, new_bytes) << "kind " << kind << " nth " << nth;
      } else {
        ++failed_runs;
        EXPECT_EQ(st.code(), Code::kIo) << st.ToString();
        // A failed fsync of the directory comes after the rename: then the new
        // contents are in place (just not known durable). Otherwise: the old.
        EXPECT_TRUE(got == old_bytes || got == new_bytes) << "kind " << kind << " nth " << nth
                                                          << ": " << got.size() << " bytes";
        if (kind != 1) {
          EXPECT_EQ(got, old_bytes) << "kind " << kind << " nth " << nth;
        }
      }
      auto names = base.ListDir(dir, 100);
      ASSERT_TRUE(names.ok());
      EXPECT_EQ(*names, std::vector<std::string>{"target"}) << "kind " << kind << " nth " << nth;
    }
  }
  // One write, two syncs (file, directory), one rename: 4 of the 9 runs fail.
  EXPECT_EQ(failed_runs, 4);
}

TEST(FaultEnv, AtomicReplaceNeverShowsAHalfWrittenTargetOnMemEnv) {
  auto mem = NewMemEnv();
  CheckAtomicReplaceUnderFaults(*mem, "/");
}

TEST(FaultEnv, AtomicReplaceNeverShowsAHalfWrittenTargetOnPosix) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("tern-fault-env-" + RandomHex())).string();
  ASSERT_TRUE(DefaultEnv().CreateDir(dir).ok());
  CheckAtomicReplaceUnderFaults(DefaultEnv(), dir);
  EXPECT_TRUE(RemoveTree(DefaultEnv(), dir).ok());
}

}  // namespace
}  // namespace tern

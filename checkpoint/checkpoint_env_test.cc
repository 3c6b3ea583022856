// The checkpoint writer on an in-memory and a fault-injecting Env: whatever
// write, fsync or rename fails, the path holds the old checkpoint or the
// whole new one, and no staging files are left behind.
#include <gtest/gtest.h>

#include <cstring>

#include "tern/checkpoint.h"
#include "tern/fault_env.h"

namespace tern {
namespace {

std::vector<TensorDesc> OldTensors() { return {{"w", DType::kF32, {64}}}; }
std::vector<TensorDesc> NewTensors() { return {{"u", DType::kU8, {300}}, {"w", DType::kF32, {64}}}; }

void Fill(MutableServeView& view, uint8_t seed) {
  for (auto& t : view.tensors)
    for (uint64_t i = 0; i < t.desc->bytes(); ++i) t.data[i] = static_cast<uint8_t>(seed + i * 7);
}

// "old", "new", or what is wrong.
std::string WhichCheckpoint(Env& env, const std::string& path) {
  OpenOptions o;
  o.env = &env;
  auto c = Checkpoint::Open(path, o);
  if (!c.ok()) return "unreadable: " + c.status().ToString();
  const ServeView& v = (*c)->view();
  const uint8_t seed = v.tensors.size() == 1 ? 1 : 2;
  if (v.tensors.size() != (seed == 1 ? OldTensors() : NewTensors()).size()) return "wrong tensors";
  for (const auto& t : v.tensors)
    for (uint64_t i = 0; i < t.desc->bytes(); ++i)
      if (t.data[i] != static_cast<uint8_t>(seed + i * 7)) return "half-written " + t.desc->name;
  return seed == 1 ? "old" : "new";
}

Status Write(Env& env, const std::string& path, std::vector<TensorDesc> tensors, uint8_t seed,
             bool overwrite) {
  CreateOptions o;
  o.env = &env;
  o.overwrite = overwrite;
  o.shard_bytes_max = 256;  // the new directory checkpoint: two shards and an index
  TERN_ASSIGN_OR_RETURN(auto w, WritableCheckpoint::Create(path, std::move(tensors), {}, o));
  Fill(w->view(), seed);
  return w->Commit();
}

class CheckpointOnFaultEnv : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointOnFaultEnv, CommitLeavesOldOrNewNeverHalf) {
  const std::string path = GetParam();
  auto mem = NewMemEnv();
  ASSERT_TRUE(Write(*mem, path, OldTensors(), 1, false).ok());
  ASSERT_EQ(WhichCheckpoint(*mem, path), "old");
  int failed = 0, succeeded = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (uint64_t nth = 1; nth <= 8; ++nth) {
      SCOPED_TRACE("kind " + std::to_string(kind) + " nth " + std::to_string(nth));
      EnvFaultPolicy p;
      p.short_writes = true;
      (kind == 0 ? p.fail_write_nth : kind == 1 ? p.fail_sync_nth : p.fail_rename_nth) = nth;
      FaultEnv env(*mem, p);
      Status st = Write(env, path, NewTensors(), 2, /*overwrite=*/true);
      const std::string now = WhichCheckpoint(*mem, path);
      if (st.ok()) {
        ++succeeded;
        EXPECT_EQ(now, "new");
      } else {
        ++failed;
        EXPECT_EQ(st.code(), Code::kIo) << st.ToString();
        // Only the directory fsync after the rename fails with the new one in place.
        EXPECT_TRUE(now == "old" || (kind == 1 && now == "new")) << now << " after " << st.ToString();
      }
      auto names = mem->ListDir("/", 100);
      ASSERT_TRUE(names.ok());
      EXPECT_EQ(*names, std::vector<std::string>{path.substr(1)}) << "staging left behind";
      // Back to the old one for the next round.
      if (now == "new") {
        ASSERT_TRUE(RemoveTree(*mem, path).ok());
        ASSERT_TRUE(Write(*mem, path, OldTensors(), 1, false).ok());
      }
    }
  }
  EXPECT_GT(failed, 3);  // the faults did hit the writer...
  EXPECT_GT(succeeded, 3);  // ...and an N past its last operation did not
}

INSTANTIATE_TEST_SUITE_P(SingleFileAndSharded, CheckpointOnFaultEnv,
                         ::testing::Values("/m.safetensors", "/ckpt"),
                         [](const auto& info) {
                           return std::string(info.param) == "/ckpt" ? "Sharded" : "SingleFile";
                         });

TEST(CheckpointOnMemEnv, CloneCopiesPassengersAndAFailedCopyLeavesNothing) {
  auto mem = NewMemEnv();
  ASSERT_TRUE(Write(*mem, "/base", NewTensors(), 2, false).ok());
  ASSERT_TRUE(WriteNewFile(*mem, "/base/config.json", {reinterpret_cast<const uint8_t*>("{}"), 2}).ok());
  OpenOptions oo;
  oo.env = mem.get();
  auto base = Checkpoint::Open("/base", oo);
  ASSERT_TRUE(base.ok()) << base.status().ToString();

  for (uint64_t nth = 1; nth <= 4; ++nth) {
    EnvFaultPolicy p;
    p.fail_write_nth = nth;  // copies count as writes
    FaultEnv env(*mem, p);
    CloneOptions co;
    co.env = &env;
    auto clone = WritableCheckpoint::CloneForWrite(**base, "/clone", co);
    EXPECT_FALSE(clone.ok()) << nth;  // 4 files to copy: each fails in turn
    EXPECT_EQ(*mem->ListDir("/", 10), std::vector<std::string>{"base"}) << nth;
  }
  auto clone = WritableCheckpoint::CloneForWrite(**base, "/clone");
  ASSERT_TRUE(clone.ok()) << clone.status().ToString();
  ASSERT_TRUE((*clone)->Commit().ok());
  EXPECT_EQ(WhichCheckpoint(*mem, "/clone"), "new");
  std::string config;
  ASSERT_TRUE(ReadFileToString(*mem, "/clone/config.json", 100, &config).ok());
  EXPECT_EQ(config, "{}");
}

}  // namespace
}  // namespace tern

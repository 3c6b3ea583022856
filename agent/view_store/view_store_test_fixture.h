// Shared by the view store's tests (view_store_test.cc: apply, switch and
// spare; view_store_crash_test.cc: faults, crashes and power loss): a trace
// of versions, a bitwise check of a served checkpoint, the fixture.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "agent/view_store/view_store.h"
#include "tern/checkpoint.h"
#include "tern/fault_env.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tests/support/files.h"
#include "tests/support/owned_view.h"

namespace tern::agent::view_store_testing {

using tern::testing::OwnedView;
using tern::testing::TempDir;

// versions[v]: the view of version v (v >= 1), each a few changes on the last.
class Trace {
 public:
  explicit Trace(int count) {
    std::mt19937_64 rng(7);
    OwnedView v1;
    v1.Add("emb.weight", DType::kBF16, {64, 33});
    v1.Add("layer.0.w", DType::kF32, {100});
    v1.Add("layer.1.w", DType::kF16, {3, 50});
    v1.Add("tok.bytes", DType::kU8, {7});
    for (auto& d : v1.data)
      for (auto& b : d) b = static_cast<uint8_t>(rng());
    views_.push_back(OwnedView());  // version 0: unused
    views_.push_back(std::move(v1));
    for (int v = 2; v <= count; ++v) {
      OwnedView next(views_.back().View());
      for (auto& d : next.data)
        for (int k = 0; k < 5; ++k) d[rng() % d.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      views_.push_back(std::move(next));
    }
  }
  ServeView view(uint64_t v) const { return views_.at(v).View(); }
  ViewDigest digest(uint64_t v) {
    ThreadPool pool(1);
    return ComputeDigest(view(v), pool);
  }
  std::vector<uint8_t> Patch(uint64_t from, uint64_t to) {
    ThreadPool pool(1);
    DiffOptions o;
    o.segment_elements = 64;
    o.base_version = from;
    o.target_version = to;
    auto p = Diff(view(from), view(to), o, pool);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }
  // Diff(zero view of the layout, view(v)).
  std::vector<uint8_t> Keyframe(uint64_t v) {
    OwnedView zero;
    for (const auto& t : view(v).tensors) zero.Add(t.desc->name, t.desc->dtype, t.desc->shape);
    ThreadPool pool(1);
    DiffOptions o;
    o.target_version = v;
    auto p = Diff(zero.View(), view(v), o, pool);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }
  // Writes version v as a checkpoint (a directory, or one file if `path`
  // ends in .safetensors).
  void Write(uint64_t v, const std::string& path) {
    std::vector<TensorDesc> descs;
    for (const auto& t : view(v).tensors) descs.push_back(*t.desc);
    auto w = WritableCheckpoint::Create(path, descs, {});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (const auto& t : (*w)->view().tensors)
      std::memcpy(t.data, view(v).Find(t.desc->name)->data, t.desc->bytes());
    if (path.find(".safetensors") == std::string::npos) {
      ASSERT_TRUE((*w)->AddFile("config.json", {}).ok());
    }
    ASSERT_TRUE((*w)->Commit().ok());
  }

 private:
  std::vector<OwnedView> views_;
};

// "" when the checkpoint at path is bitwise version v, else what differs.
inline std::string Differs(const std::string& path, Trace& trace, uint64_t v) {
  auto c = Checkpoint::Open(path);
  if (!c.ok()) return c.status().ToString();
  const ServeView want = trace.view(v);
  const ServeView& got = (*c)->view();
  if (got.tensors.size() != want.tensors.size()) return "tensor count";
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    if (!got.tensors[i].desc->SameLayout(*want.tensors[i].desc))
      return "layout of " + got.tensors[i].desc->name;
    if (std::memcmp(got.tensors[i].data, want.tensors[i].data, got.tensors[i].desc->bytes()) != 0)
      return "bytes of " + got.tensors[i].desc->name + " are not version " + std::to_string(v);
  }
  return "";
}

class ViewStoreTest : public ::testing::Test {
 protected:
  ViewStoreTest() : trace_(12), dir_(tmp_ / "data") {}

  std::unique_ptr<ViewStore> OpenStore(Env& env) {
    auto s = ViewStore::Open(env, dir_, pool_,
                             [this](std::string_view line) { log_.emplace_back(line); });
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<ViewStore> OpenStore() { return OpenStore(DefaultEnv()); }
  // Seeds version 1 from a checkpoint directory.
  std::unique_ptr<ViewStore> Seeded() {
    trace_.Write(1, tmp_ / "seed");
    auto store = OpenStore();
    EXPECT_TRUE(store->Seed(tmp_ / "seed", 1, trace_.digest(1)).ok());
    return store;
  }
  int Copies() const {
    return static_cast<int>(std::count_if(log_.begin(), log_.end(), [](const std::string& l) {
      return l.find("copying") != std::string::npos;
    }));
  }
  // The fault-at-every-step tests: which operation fails, and a policy
  // failing the nth of that kind (with short writes).
  enum Kind { kWrite, kSync, kRename };
  static EnvFaultPolicy FailNth(Kind kind, uint64_t n) {
    EnvFaultPolicy policy;
    (kind == kWrite  ? policy.fail_write_nth
     : kind == kSync ? policy.fail_sync_nth
                     : policy.fail_rename_nth) = n;
    policy.short_writes = true;
    return policy;
  }
  // dir_ again as the copy at `start` holds it.
  void RestoreDir(const std::string& start) {
    std::filesystem::remove_all(dir_);
    std::filesystem::copy(
        start, dir_,
        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
  }
  std::vector<std::string> Views() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/views"))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  ThreadPool pool_{2};
  Trace trace_;
  TempDir tmp_{"view_store"};
  std::string dir_;
  std::vector<std::string> log_;
};

// Feeds `patch` to AdvancePrefix in pieces of `piece` bytes, all but the
// last byte (the caller's Advance brings the whole patch).
inline Status StreamAllButLast(ViewStore& store, std::span<const uint8_t> patch, uint64_t piece) {
  for (uint64_t end = piece; end < patch.size(); end += piece)
    TERN_RETURN_IF_ERROR(store.AdvancePrefix(patch.first(end)));
  return store.AdvancePrefix(patch.first(patch.size() - 1));
}

inline int Count(const std::vector<std::string>& log, const std::string& what) {
  return static_cast<int>(std::count_if(log.begin(), log.end(), [&](const std::string& l) {
    return l.find(what) != std::string::npos;
  }));
}

// What a power loss may leave of pages written since their last sync: some
// old, some new. Emulated by overwriting the end of every data file of the
// slot (the FaultEnv cannot drop page cache).
inline void TearSlot(const std::string& slot) {
  if (!std::filesystem::is_directory(slot)) return;  // a copy had removed it
  for (const auto& e : std::filesystem::directory_iterator(slot)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.write("torn torn torn torn torn torn torn torn!", 40);
  }
}

// The slot state.json serves and whether it says "unsynced".
inline std::string RecordedSlot(const std::string& dir) {
  const std::string state = tern::testing::Slurp(dir + "/views/state.json");
  return state.find("\"current\": \"a\"") != std::string::npos ? "a" : "b";
}
inline bool RecordedUnsynced(const std::string& dir) {
  if (!std::filesystem::exists(dir + "/views/state.json")) return false;
  return tern::testing::Slurp(dir + "/views/state.json").find("\"synced\": false") !=
         std::string::npos;
}

}  // namespace tern::agent::view_store_testing

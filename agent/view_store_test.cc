// ViewStore: every version served is bitwise the published one, switched
// atomically; bad patches switch nothing; a failure at any I/O step leaves a
// store that reopens serving the old or the new version, never a mix; the
// spare is advanced in place (one copy in all, not one per version).
#include "agent/view_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "tern/checkpoint.h"
#include "tern/fault_env.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tests/support/files.h"
#include "tests/support/owned_view.h"

namespace tern::agent {
namespace {

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
std::string Differs(const std::string& path, Trace& trace, uint64_t v) {
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

TEST_F(ViewStoreTest, SeedThenManyVersionsInPlace) {
  auto store = Seeded();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->version(), 1u);
  EXPECT_EQ(store->digest(), trace_.digest(1));
  EXPECT_EQ(Differs(store->current_path(), trace_, 1), "");
  for (uint64_t v = 2; v <= 12; ++v) {
    ASSERT_TRUE(store->Advance(trace_.Patch(v - 1, v)).ok()) << v;
    EXPECT_EQ(store->version(), v);
    EXPECT_EQ(store->digest(), trace_.digest(v));
    EXPECT_EQ(Differs(store->current_path(), trace_, v), "");
    EXPECT_EQ(std::filesystem::read_symlink(store->current_path()).string(),
              v % 2 == 0 ? "views/b" : "views/a");
    // Bounded space: two buffers, the state and one kept patch, nothing else.
    EXPECT_EQ(Views(),
              (std::vector<std::string>{
                  "a", "b", "keep-" + std::to_string(v - 1) + "-" + std::to_string(v) + ".patch",
                  "state.json"}));
  }
  // One full copy when the spare was first made, none per version after.
  EXPECT_EQ(Copies(), 1);
}

TEST_F(ViewStoreTest, SeedFromSingleFileAndPassengerFilesKept) {
  trace_.Write(3, tmp_ / "one.safetensors");
  auto store = OpenStore();
  ASSERT_TRUE(store->Seed(tmp_ / "one.safetensors", 3, trace_.digest(3)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");

  trace_.Write(5, tmp_ / "dir5");
  ASSERT_TRUE(store->Seed(tmp_ / "dir5", 5, trace_.digest(5)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
  EXPECT_TRUE(std::filesystem::exists(store->current_path() + "/config.json"));
}

TEST_F(ViewStoreTest, SeedWithWrongDigestServesNothing) {
  trace_.Write(1, tmp_ / "seed");
  auto store = OpenStore();
  Status st = store->Seed(tmp_ / "seed", 1, trace_.digest(2));
  EXPECT_EQ(st.code(), Code::kMismatch) << st.ToString();
  EXPECT_EQ(store->version(), 0u);
  EXPECT_FALSE(std::filesystem::exists(store->current_path()));
  EXPECT_EQ(store->Advance(trace_.Patch(1, 2)).code(), Code::kInvalidArgument);
  ASSERT_TRUE(store->Seed(tmp_ / "seed", 1, trace_.digest(1)).ok());
  EXPECT_EQ(store->Seed(tmp_ / "seed", 1, trace_.digest(1)).code(), Code::kInvalidArgument);
}

TEST_F(ViewStoreTest, KeyframeInstallsFromZeroView) {
  auto store = OpenStore();
  const auto kf = trace_.Keyframe(6);
  EXPECT_EQ(store->InstallKeyframe(kf, 7).code(), Code::kMismatch);
  EXPECT_EQ(store->version(), 0u);
  ASSERT_TRUE(store->InstallKeyframe(kf, 6).ok());
  EXPECT_EQ(store->version(), 6u);
  EXPECT_EQ(store->digest(), trace_.digest(6));
  EXPECT_EQ(Differs(store->current_path(), trace_, 6), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(6, 7)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 7), "");
  // A keyframe over a served version (a member far behind) replaces it.
  ASSERT_TRUE(store->InstallKeyframe(trace_.Keyframe(10), 10).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 10), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(10, 11)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 11), "");
}

TEST_F(ViewStoreTest, KeyframeWhoseBaseIsNotZeroIsRefused) {
  auto store = Seeded();
  // A patch 1 -> 8 labelled as if it started from nothing.
  ThreadPool pool(1);
  DiffOptions o;
  o.target_version = 8;
  auto fake = Diff(trace_.view(1), trace_.view(8), o, pool);
  ASSERT_TRUE(fake.ok());
  EXPECT_EQ(store->InstallKeyframe(*fake, 8).code(), Code::kMismatch);
  EXPECT_EQ(store->version(), 1u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 1), "");
}

TEST_F(ViewStoreTest, CorruptPatchSwitchesNothing) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  auto bad = trace_.Patch(2, 3);
  for (size_t at : {bad.size() / 2, bad.size() - 1, size_t{9}}) {
    auto flipped = bad;
    flipped[at] ^= 0x40;
    Status st = store->Advance(flipped);
    EXPECT_FALSE(st.ok()) << at;
    EXPECT_EQ(store->version(), 2u);
    EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  }
  EXPECT_EQ(store->Advance(std::span<const uint8_t>(bad).first(bad.size() / 3)).code(),
            Code::kCorrupt);
  EXPECT_EQ(store->Advance({}).code(), Code::kCorrupt);
  ASSERT_TRUE(store->Advance(bad).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_EQ(Copies(), 1);
}

// Feeds `patch` to AdvancePrefix in pieces of `piece` bytes, all but the
// last byte (the caller's Advance brings the whole patch).
Status StreamAllButLast(ViewStore& store, std::span<const uint8_t> patch, uint64_t piece) {
  for (uint64_t end = piece; end < patch.size(); end += piece)
    TERN_RETURN_IF_ERROR(store.AdvancePrefix(patch.first(end)));
  return store.AdvancePrefix(patch.first(patch.size() - 1));
}

int Count(const std::vector<std::string>& log, const std::string& what) {
  return static_cast<int>(std::count_if(log.begin(), log.end(), [&](const std::string& l) {
    return l.find(what) != std::string::npos;
  }));
}

// Streamed into a prepared spare, every version is bitwise the published
// one, nothing is served before Advance, and records were applied while the
// patch "arrived".
TEST_F(ViewStoreTest, StreamedAdvanceEqualsWholeAdvance) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  for (uint64_t v = 3; v <= 8; ++v) {
    SCOPED_TRACE(v);
    ASSERT_TRUE(store->PrepareSpare().ok());
    const std::vector<uint8_t> patch = trace_.Patch(v - 1, v);
    ASSERT_TRUE(StreamAllButLast(*store, patch, 1 + v * 37).ok());
    EXPECT_TRUE(store->advancing());
    EXPECT_EQ(store->version(), v - 1);
    EXPECT_EQ(Differs(store->current_path(), trace_, v - 1), "");  // the spare is not served
    ASSERT_TRUE(store->Advance(patch).ok());
    EXPECT_FALSE(store->advancing());
    EXPECT_EQ(store->version(), v);
    EXPECT_EQ(store->digest(), trace_.digest(v));
    EXPECT_EQ(Differs(store->current_path(), trace_, v), "");
  }
  EXPECT_EQ(Count(log_, "records applied while the patch arrived"), 6);
  EXPECT_EQ(Count(log_, "(streamed)"), 6);
  EXPECT_EQ(Copies(), 1);  // the first spare only
  // Reopened, it advances in place from the kept patch like any other.
  store.reset();
  store = OpenStore();
  ASSERT_TRUE(store->Advance(trace_.Patch(8, 9)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 9), "");
  EXPECT_EQ(Copies(), 1);
}

// Without PrepareSpare the spare may still be read (the reader rule): no
// stream starts and Advance takes the whole path. A patch for another base
// does not start one either.
TEST_F(ViewStoreTest, StreamWaitsForAReadySpareAndItsBase) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  const std::vector<uint8_t> patch = trace_.Patch(2, 3);
  ASSERT_TRUE(StreamAllButLast(*store, patch, 50).ok());
  EXPECT_FALSE(store->advancing());
  ASSERT_TRUE(store->PrepareSpare().ok());
  const std::vector<uint8_t> later = trace_.Patch(3, 4);
  ASSERT_TRUE(StreamAllButLast(*store, later, 50).ok());
  EXPECT_FALSE(store->advancing());
  ASSERT_TRUE(store->Advance(patch).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_EQ(Count(log_, "(streamed)"), 0);
}

// A damaged record in a stream: nothing is served, the spare is given up
// (recorded unusable, so a restart copies too), and the good patch then
// advances through a copy.
TEST_F(ViewStoreTest, DamagedStreamServesNothingAndTheSpareIsCopied) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  const std::vector<uint8_t> good = trace_.Patch(2, 3);
  for (uint64_t at : {good.size() / 2, good.size() - 40, good.size() - 2}) {
    SCOPED_TRACE(at);
    ASSERT_TRUE(store->PrepareSpare().ok());
    std::vector<uint8_t> bad = good;
    bad[at] ^= 0x10;
    Status fed = StreamAllButLast(*store, bad, 64);
    Status st = store->Advance(bad);
    EXPECT_FALSE(st.ok());
    EXPECT_FALSE(store->advancing());
    EXPECT_EQ(store->version(), 2u);
    EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
    EXPECT_FALSE(store->spare_ready());
    // state.json says so too: a reopened store copies.
    store.reset();
    log_.clear();
    store = OpenStore();
    ASSERT_TRUE(store->PrepareSpare().ok());
    EXPECT_EQ(Copies(), 1);
  }
  ASSERT_TRUE(StreamAllButLast(*store, good, 64).ok());
  ASSERT_TRUE(store->Advance(good).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
}

// A stream of one patch, then another patch to another version completes
// first: the stream is dropped and the other patch applied to a copy.
TEST_F(ViewStoreTest, AnotherPatchDropsTheStream) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  ASSERT_TRUE(store->PrepareSpare().ok());
  const std::vector<uint8_t> squash = trace_.Patch(2, 4);
  ASSERT_TRUE(StreamAllButLast(*store, squash, 64).ok());
  ASSERT_TRUE(store->advancing());
  log_.clear();
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  EXPECT_FALSE(store->advancing());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_EQ(Copies(), 1);
}

TEST_F(ViewStoreTest, WrongBaseIsRefused) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  EXPECT_EQ(store->Advance(trace_.Patch(3, 4)).code(), Code::kMismatch);  // a gap
  EXPECT_EQ(store->Advance(trace_.Patch(1, 2)).code(), Code::kMismatch);  // a replay
  // Right version number, another base: patch 1 -> 3 relabelled as 2 -> 3.
  ThreadPool pool(1);
  DiffOptions o;
  o.base_version = 2;
  o.target_version = 3;
  auto relabelled = Diff(trace_.view(1), trace_.view(3), o, pool);
  ASSERT_TRUE(relabelled.ok());
  EXPECT_EQ(store->Advance(*relabelled).code(), Code::kMismatch);
  // The right base digest with an old target version number.
  o.base_version = 2;
  o.target_version = 2;
  auto backwards = Diff(trace_.view(2), trace_.view(3), o, pool);
  ASSERT_TRUE(backwards.ok());
  EXPECT_EQ(store->Advance(*backwards).code(), Code::kMismatch);
  // A patch that claims base 2 (its digest too) but was made from 1: it
  // passes every check up to the apply, which finds the digest off and
  // restores the spare.
  const ViewDigest d2 = trace_.digest(2);
  o.target_version = 3;
  auto forged = Diff(trace_.view(1), trace_.view(3), o, pool, &d2);
  ASSERT_TRUE(forged.ok());
  Status forged_status = store->Advance(*forged);
  EXPECT_EQ(forged_status.code(), Code::kCorrupt) << forged_status.ToString();
  EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  const int copies = Copies();
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_EQ(Copies(), copies);  // the restored spare was reused, not copied
}

TEST_F(ViewStoreTest, SquashAdvancesSeveralVersions) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  const auto p23 = trace_.Patch(2, 3), p34 = trace_.Patch(3, 4), p45 = trace_.Patch(4, 5);
  std::vector<std::span<const uint8_t>> chain{p23, p34, p45};
  auto squash = Squash(chain, pool_);
  ASSERT_TRUE(squash.ok()) << squash.status().ToString();
  ASSERT_TRUE(store->Advance(*squash).ok());
  EXPECT_EQ(store->version(), 5u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
  // The spare is brought from 2 to 5 with the kept squash, then to 6.
  ASSERT_TRUE(store->Advance(trace_.Patch(5, 6)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 6), "");
  EXPECT_EQ(Copies(), 1);
}

// PrepareSpare does between versions what Advance would do first (the kept
// patch into the spare, or the copy after a seed), so Advance only applies;
// the slot the last switch left holds the previous version until then.
TEST_F(ViewStoreTest, PrepareSpareBringsTheSpareUpBetweenVersions) {
  auto store = Seeded();
  EXPECT_FALSE(store->spare_ready());
  ASSERT_TRUE(store->PrepareSpare().ok());  // after a seed: the one copy
  EXPECT_EQ(Copies(), 1);
  EXPECT_TRUE(store->spare_ready());
  const std::string a = dir_ + "/views/a", b = dir_ + "/views/b";
  EXPECT_EQ(Differs(b, trace_, 1), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  EXPECT_FALSE(store->spare_ready());
  // The reader rule: the slot switched away from is untouched until
  // PrepareSpare (or the next Advance).
  EXPECT_EQ(Differs(a, trace_, 1), "");
  ASSERT_TRUE(store->PrepareSpare().ok());
  EXPECT_TRUE(store->spare_ready());
  EXPECT_EQ(Differs(a, trace_, 2), "");
  EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  ASSERT_TRUE(store->PrepareSpare().ok());  // nothing to do
  // Advance needs the kept patch no more: without it, still no copy and no
  // unusable spare.
  std::filesystem::remove(dir_ + "/views/keep-1-2.patch");
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_EQ(Differs(b, trace_, 2), "");
  EXPECT_EQ(Copies(), 1);
  for (const std::string& line : log_) EXPECT_EQ(line.find("unusable"), std::string::npos) << line;
  // The prepared spare is not durable (state.json says unusable): after a
  // restart the next Advance copies, and serves the right bytes.
  ASSERT_TRUE(store->PrepareSpare().ok());
  store.reset();
  store = OpenStore();
  EXPECT_FALSE(store->spare_ready());
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_EQ(Copies(), 2);
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
  // A keyframe leaves an unusable spare: PrepareSpare copies it.
  ASSERT_TRUE(store->PrepareSpare().ok());
  ASSERT_TRUE(store->InstallKeyframe(trace_.Keyframe(5), 5).ok());
  EXPECT_FALSE(store->spare_ready());
  ASSERT_TRUE(store->PrepareSpare().ok());
  EXPECT_EQ(Copies(), 3);
  ASSERT_TRUE(store->Advance(trace_.Patch(5, 6)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 6), "");
  EXPECT_EQ(Copies(), 3);
}

// A kept patch that no longer reaches the served digest (damaged on disk):
// PrepareSpare says so and copies instead; nothing served changes.
TEST_F(ViewStoreTest, PrepareSpareWithDamagedKeptPatchCopies) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  const std::string kept = dir_ + "/views/keep-2-3.patch";
  ASSERT_TRUE(std::filesystem::exists(kept));
  {
    std::fstream f(kept, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.write("XXXXXXXX", 8);
  }
  const int copies = Copies();
  ASSERT_TRUE(store->PrepareSpare().ok());
  EXPECT_EQ(Copies(), copies + 1);
  EXPECT_TRUE(store->spare_ready());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
}

// The switch after a prepared spare syncs only the commit record (its file
// and views/): not the spare's data (deferred: the record says "unsynced"
// and PrepareSpare syncs it between versions), not the kept patch (checked
// when used), not the link (Open re-derives it), and state.json is not
// rewritten to say "unusable" again (PrepareSpare did). Each sync costs tens
// of milliseconds on a busy disk; this was 8, then 3 with the data file.
TEST_F(ViewStoreTest, SwitchDefersTheDataSyncToPrepareSpare) {
  {
    auto seeded = Seeded();
    ASSERT_TRUE(seeded->Advance(trace_.Patch(1, 2)).ok());
  }
  FaultEnv counting(DefaultEnv(), EnvFaultPolicy{});
  auto store = OpenStore(counting);
  ASSERT_EQ(store->version(), 2u);
  ASSERT_TRUE(store->PrepareSpare().ok());
  ASSERT_TRUE(store->spare_ready());
  EnvFaultStats before = counting.stats();
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  EnvFaultStats after = counting.stats();
  // state.json's temporary and views/.
  EXPECT_EQ(after.syncs - before.syncs, 2u);
  // kept patch, state.json, the link.
  EXPECT_EQ(after.renames - before.renames, 3u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  EXPECT_FALSE(store->served_synced());
  EXPECT_NE(tern::testing::Slurp(dir_ + "/views/state.json").find("\"synced\": false"),
            std::string::npos);
  // The deferred sync: the served slot's one data file, then the record
  // (its file and views/) saying "synced" and the spare unusable, written
  // once; then the kept patch into the spare, unsynced as before.
  before = counting.stats();
  ASSERT_TRUE(store->PrepareSpare().ok());
  after = counting.stats();
  EXPECT_EQ(after.syncs - before.syncs, 3u);
  EXPECT_TRUE(store->served_synced());
  EXPECT_NE(tern::testing::Slurp(dir_ + "/views/state.json").find("\"synced\": true"),
            std::string::npos);
  // The next switch finds the served slot durable: it syncs nothing more.
  before = counting.stats();
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  after = counting.stats();
  EXPECT_EQ(after.syncs - before.syncs, 2u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
}

// A version that arrives before PrepareSpare ran: Advance syncs the served
// slot before it writes the spare (which that slot falls back to after a
// crash); the old fully synced switch (ViewStoreOptions::sync_at_switch)
// syncs the new slot before the commit and never records "unsynced".
TEST_F(ViewStoreTest, UnpreparedSwitchSyncsTheServedSlotFirst) {
  {
    auto seeded = Seeded();
    ASSERT_TRUE(seeded->Advance(trace_.Patch(1, 2)).ok());
    ASSERT_TRUE(seeded->Advance(trace_.Patch(2, 3)).ok());
    EXPECT_FALSE(seeded->served_synced());
  }
  // Reopened: the unsynced slot is verified and synced (its record too).
  FaultEnv counting(DefaultEnv(), EnvFaultPolicy{});
  auto store = OpenStore(counting);
  EXPECT_TRUE(store->served_synced());
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_FALSE(store->served_synced());
  // Not prepared: the served slot (4's data file), the "unusable" record
  // (2), the commit (2).
  EnvFaultStats before = counting.stats();
  ASSERT_TRUE(store->Advance(trace_.Patch(4, 5)).ok());
  EnvFaultStats after = counting.stats();
  EXPECT_EQ(after.syncs - before.syncs, 5u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
  store.reset();

  ViewStoreOptions synced;
  synced.sync_at_switch = true;
  auto old = ViewStore::Open(counting, dir_, pool_, nullptr, synced);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_TRUE((*old)->PrepareSpare().ok());
  before = counting.stats();
  ASSERT_TRUE((*old)->Advance(trace_.Patch(5, 6)).ok());
  after = counting.stats();
  EXPECT_EQ(after.syncs - before.syncs, 3u);  // the data file, the record (2)
  EXPECT_TRUE((*old)->served_synced());
  EXPECT_NE(tern::testing::Slurp(dir_ + "/views/state.json").find("\"synced\": true"),
            std::string::npos);
}

// What a power loss may do to what the switch no longer syncs, and the store
// still serves the right bytes and never a wrong spare: the kept patch lost,
// emptied or cut short (each costs one copy), and the link rolled back to
// the slot it pointed at before (Open re-points it from state.json).
TEST_F(ViewStoreTest, UnsyncedKeptPatchAndLinkLostInACrash) {
  for (int damage = 0; damage < 3; ++damage) {
    SCOPED_TRACE(damage);
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(tmp_ / "seed");
    log_.clear();
    {
      auto store = Seeded();
      ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
      ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
    }
    const std::string kept = dir_ + "/views/keep-2-3.patch";
    ASSERT_TRUE(std::filesystem::exists(kept));
    if (damage == 0) std::filesystem::remove(kept);
    if (damage == 1) std::filesystem::resize_file(kept, 0);
    if (damage == 2) std::filesystem::resize_file(kept, std::filesystem::file_size(kept) / 2);
    // The link as it was before the last switch (views/b served 3, a was 2).
    const std::string link = dir_ + "/current";
    const std::string served = std::filesystem::read_symlink(link).string();
    std::filesystem::remove(link);
    std::filesystem::create_directory_symlink(served == "views/a" ? "views/b" : "views/a", link);
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->version(), 3u);
    EXPECT_EQ(std::filesystem::read_symlink(link).string(), served);
    EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
    const int copies = Copies();
    ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
    EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
    EXPECT_EQ(Copies(), copies + 1);  // the spare is rebuilt, not trusted
    ASSERT_TRUE(store->PrepareSpare().ok());
    ASSERT_TRUE(store->Advance(trace_.Patch(4, 5)).ok());
    EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
    EXPECT_EQ(Copies(), copies + 1);
  }
}

// What a power loss may leave of pages written since their last sync: some
// old, some new. Emulated by overwriting the end of every data file of the
// slot (the FaultEnv cannot drop page cache).
void TearSlot(const std::string& slot) {
  if (!std::filesystem::is_directory(slot)) return;  // a copy had removed it
  for (const auto& e : std::filesystem::directory_iterator(slot)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.write("torn torn torn torn torn torn torn torn!", 40);
  }
}

// The slot state.json serves and whether it says "unsynced".
std::string RecordedSlot(const std::string& dir) {
  const std::string state = tern::testing::Slurp(dir + "/views/state.json");
  return state.find("\"current\": \"a\"") != std::string::npos ? "a" : "b";
}
bool RecordedUnsynced(const std::string& dir) {
  if (!std::filesystem::exists(dir + "/views/state.json")) return false;
  return tern::testing::Slurp(dir + "/views/state.json").find("\"synced\": false") !=
         std::string::npos;
}

// A power loss after a switch committed unsynced: Open serves the version
// only if the slot's digest is the recorded one; else the previous version
// from the spare (verified); else nothing, and the store starts over.
TEST_F(ViewStoreTest, PowerLossAfterAnUnsyncedSwitch) {
  for (int damage = 0; damage < 3; ++damage) {
    SCOPED_TRACE(damage);
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(tmp_ / "seed");
    log_.clear();
    std::string served, spare;
    {
      auto store = Seeded();
      ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
      ASSERT_TRUE(store->PrepareSpare().ok());
      ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
      ASSERT_FALSE(store->served_synced());
      served = dir_ + "/views/" + RecordedSlot(dir_);
      spare = dir_ + "/views/" + (RecordedSlot(dir_) == "a" ? "b" : "a");
    }
    // 0: a process crash (the page cache holds every byte); 1: the served
    // slot's unsynced pages lost; 2: the spare damaged as well (it cannot
    // be by a power loss, being synced; it shows Open checks it too).
    if (damage >= 1) TearSlot(served);
    if (damage >= 2) TearSlot(spare);
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    const uint64_t want = damage == 0 ? 3 : damage == 1 ? 2 : 0;
    ASSERT_EQ(store->version(), want);
    EXPECT_FALSE(RecordedUnsynced(dir_));
    if (want == 0) {
      EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(dir_ + "/current")));
      ASSERT_TRUE(store->InstallKeyframe(trace_.Keyframe(5), 5).ok());
      EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
      continue;
    }
    EXPECT_EQ(store->digest(), trace_.digest(want));
    EXPECT_EQ(Differs(store->current_path(), trace_, want), "");
    EXPECT_EQ(OpenStore()->version(), want);  // recorded, and synced
    for (uint64_t next = want + 1; next <= 5; ++next) {
      ASSERT_TRUE(store->Advance(trace_.Patch(next - 1, next)).ok()) << next;
      EXPECT_EQ(Differs(store->current_path(), trace_, next), "");
      ASSERT_TRUE(store->PrepareSpare().ok());
    }
  }
}

// A failure at the Nth write, sync or rename of switches and their deferred
// syncs, the store abandoned there, then a power loss: every slot the
// record does not call durable (the served one when "unsynced", the spare
// when unusable) loses pages. Reopened, the store serves a version whose
// digest and bytes are that version's (the one it reported, the one it was
// committing, the one before as a fallback, or none), never a mix, and
// keeps advancing.
TEST_F(ViewStoreTest, PowerLossAtEveryStepServesAWholeVersion) {
  enum Kind { kWrite, kSync, kRename };
  {
    auto store = Seeded();
    ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
    ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
    ASSERT_TRUE(store->PrepareSpare().ok());
  }
  const std::string start = tmp_ / "start";
  std::filesystem::rename(dir_, start);
  std::set<uint64_t> served;  // versions served after the power loss
  int torn = 0;               // runs that found the served slot unsynced
  for (Kind kind : {kWrite, kSync, kRename}) {
    for (uint64_t n = 1; n < 100; ++n) {
      SCOPED_TRACE(::testing::Message() << "kind " << kind << " n " << n);
      std::filesystem::remove_all(dir_);
      std::filesystem::copy(
          start, dir_,
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
      EnvFaultPolicy policy;
      (kind == kWrite  ? policy.fail_write_nth
       : kind == kSync ? policy.fail_sync_nth
                       : policy.fail_rename_nth) = n;
      policy.short_writes = true;
      FaultEnv faulty(DefaultEnv(), policy);
      bool done = false;
      uint64_t reported = 3;
      {
        auto s = ViewStore::Open(faulty, dir_, pool_, [](std::string_view) {});
        if (s.ok()) {
          // Prepared switches, an unprepared one, a streamed one.
          Status st = (*s)->Advance(trace_.Patch(3, 4));
          if (st.ok()) st = (*s)->PrepareSpare();
          if (st.ok()) st = (*s)->Advance(trace_.Patch(4, 5));
          if (st.ok()) st = (*s)->Advance(trace_.Patch(5, 6));
          if (st.ok()) st = (*s)->PrepareSpare();
          const std::vector<uint8_t> patch = trace_.Patch(6, 7);
          if (st.ok()) st = StreamAllButLast(**s, patch, 64);
          if (st.ok()) st = (*s)->Advance(patch);
          done = st.ok();
          EXPECT_EQ(done, faulty.stats().failed == 0) << st.ToString();
          reported = (*s)->version();
        }
      }
      // The power loss. state.json and its directory are synced at every
      // write, so the record on disk is the last one written.
      const std::string state = tern::testing::Slurp(dir_ + "/views/state.json");
      const std::string cur = RecordedSlot(dir_);
      if (RecordedUnsynced(dir_)) {
        TearSlot(dir_ + "/views/" + cur);
        ++torn;
      }
      if (state.find("\"usable\": false") != std::string::npos)
        TearSlot(dir_ + "/views/" + (cur == "a" ? "b" : "a"));
      auto store = OpenStore();
      ASSERT_NE(store, nullptr);
      const uint64_t v = store->version();
      served.insert(v);
      EXPECT_TRUE(v + 1 >= reported && v <= reported + 1) << v << " " << reported;
      EXPECT_NE(v, 0u);  // a usable spare is durable: there is always one
      EXPECT_EQ(store->digest(), trace_.digest(v));
      EXPECT_EQ(Differs(store->current_path(), trace_, v), "");
      for (uint64_t next = v + 1; next <= v + 2; ++next) {
        ASSERT_TRUE(store->Advance(trace_.Patch(next - 1, next)).ok()) << next;
        EXPECT_EQ(Differs(store->current_path(), trace_, next), "");
      }
      if (done) {
        std::printf("kind %d: failed each of its first %llu operations\n", kind,
                    static_cast<unsigned long long>(n - 1));
        break;
      }
    }
  }
  // Some crashes found the served slot unsynced, torn, and fell back.
  EXPECT_GT(torn, 0);
  EXPECT_GE(served.size(), 4u);
}

TEST_F(ViewStoreTest, RestartKeepsVersionAndAdvancesInPlace) {
  {
    auto store = Seeded();
    for (uint64_t v = 2; v <= 4; ++v) ASSERT_TRUE(store->Advance(trace_.Patch(v - 1, v)).ok());
  }
  auto store = OpenStore();
  EXPECT_EQ(store->version(), 4u);
  EXPECT_EQ(store->digest(), trace_.digest(4));
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
  const int copies = Copies();
  ASSERT_TRUE(store->Advance(trace_.Patch(4, 5)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
  EXPECT_EQ(Copies(), copies);  // the kept patch 3 -> 4 survived the restart
}

TEST_F(ViewStoreTest, OpenRemovesLeftoversAndRepairsTheLink) {
  {
    auto store = Seeded();
    ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  }
  std::filesystem::create_directory(dir_ + "/views/a.tmp-0123456789abcdef");
  { std::ofstream(dir_ + "/views/keep-0-1.patch") << "stale"; }
  { std::ofstream(dir_ + "/views/state.json.tmp-42") << "{"; }
  std::filesystem::create_symlink("views/nowhere", dir_ + "/current.tmp-99");
  // The link lags state.json (a crash between commit and switch).
  std::filesystem::remove(dir_ + "/current");
  std::filesystem::create_symlink("views/a", dir_ + "/current");
  auto store = OpenStore();
  EXPECT_EQ(store->version(), 2u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  EXPECT_EQ(Views(), (std::vector<std::string>{"a", "b", "keep-1-2.patch", "state.json"}));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(dir_ + "/current.tmp-99")));
}

TEST_F(ViewStoreTest, UnusableSpareIsRederivedNotServed) {
  {
    auto store = Seeded();
    ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
    ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  }
  // A crash in the middle of writing the spare (views/b, at 2): state.json
  // said "unusable" before the first byte was written.
  std::string state = tern::testing::Slurp(dir_ + "/views/state.json");
  const size_t at = state.find("\"usable\": true");
  ASSERT_NE(at, std::string::npos) << state;
  state.replace(at, 14, "\"usable\": false");
  { std::ofstream(dir_ + "/views/state.json", std::ios::trunc) << state; }
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/views/b")) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-40, std::ios::end);
    f.write("garbage garbage garbage garbage garbage!", 40);
  }
  auto store = OpenStore();
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  const int copies = Copies();
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_EQ(Copies(), copies + 1);
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
  ASSERT_TRUE(store->Advance(trace_.Patch(4, 5)).ok());
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
}

TEST_F(ViewStoreTest, DamagedStateFileIsAClearError) {
  { auto store = Seeded(); }
  const std::string path = dir_ + "/views/state.json";
  const std::string good = tern::testing::Slurp(path);
  for (std::string bad : {std::string("{"), std::string(""), std::string("[]"),
                          good.substr(0, good.size() / 2), std::string(100'000, ' ')}) {
    { std::ofstream(path, std::ios::trunc) << bad; }
    auto s = ViewStore::Open(DefaultEnv(), dir_, pool_, nullptr);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(s.status().code() == Code::kCorrupt ||
                s.status().code() == Code::kResourceExhausted)
        << s.status().ToString();
  }
  std::string other = good;
  other.replace(other.find("\"current\": \"a\""), 14, "\"current\": \".\"");  // views/. exists
  { std::ofstream(path, std::ios::trunc) << other; }
  auto s = ViewStore::Open(DefaultEnv(), dir_, pool_, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("state.json"), std::string::npos) << s.status().ToString();
  { std::ofstream(path, std::ios::trunc) << good; }
  EXPECT_EQ(OpenStore()->version(), 1u);
}

// A failure at the Nth write, sync or rename, for every N the operations
// reach. Then either the store is abandoned there (as a crash would, minus
// the lost page cache) or the same store goes on (the fault was one-shot);
// reopened on a healthy disk it serves one whole version, the one it
// reported, and keeps advancing in place.
TEST_F(ViewStoreTest, FailureAtEveryStepLeavesOldOrNew) {
  enum Kind { kWrite, kSync, kRename };
  std::set<uint64_t> outcomes;  // version() right after a failure
  {
    auto store = Seeded();  // serving 3 from views/a, spare views/b at 2
    ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
    ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  }
  const std::string start = tmp_ / "start";
  std::filesystem::rename(dir_, start);
  for (bool go_on : {false, true}) {
    for (Kind kind : {kWrite, kSync, kRename}) {
      for (uint64_t n = 1; n < 100; ++n) {
        SCOPED_TRACE(::testing::Message() << "kind " << kind << " n " << n << " go_on " << go_on);
        std::filesystem::remove_all(dir_);
        std::filesystem::copy(start, dir_,
                              std::filesystem::copy_options::recursive |
                                  std::filesystem::copy_options::copy_symlinks);
        EnvFaultPolicy policy;
        (kind == kWrite  ? policy.fail_write_nth
         : kind == kSync ? policy.fail_sync_nth
                         : policy.fail_rename_nth) = n;
        policy.short_writes = true;
        FaultEnv faulty(DefaultEnv(), policy);
        bool done = false;
        uint64_t reported = 3, attempted = 4;
        {
          auto s = ViewStore::Open(faulty, dir_, pool_, [](std::string_view) {});
          if (s.ok()) {
            // Each version followed by PrepareSpare, as the agent does:
            // in place (kept patch), then a copy after the keyframe.
            Status st = (*s)->Advance(trace_.Patch(3, 4));
            if (st.ok()) st = (*s)->PrepareSpare();
            if (st.ok()) st = (*s)->Advance(trace_.Patch(4, 5));
            if (st.ok()) st = (*s)->PrepareSpare();
            if (st.ok()) st = (*s)->InstallKeyframe(trace_.Keyframe(7), 7);
            if (st.ok()) st = (*s)->PrepareSpare();
            done = st.ok();
            EXPECT_EQ(done, faulty.stats().failed == 0) << st.ToString();
            reported = (*s)->version();
            attempted = reported == 3 ? 4 : reported == 4 ? 5 : 7;
            if (!done) outcomes.insert(reported);
            if (!done && go_on) {
              ASSERT_TRUE((*s)->Advance(trace_.Patch(reported, reported + 1)).ok());
              ++reported;
              EXPECT_EQ(Differs((*s)->current_path(), trace_, reported), "");
            }
          }
        }
        auto store = OpenStore();
        ASSERT_NE(store, nullptr);
        const uint64_t v = store->version();
        // What the store reported, or, when it was abandoned after a failed
        // commit (state.json renamed, its directory's fsync failed), the
        // version it was committing. A store that went on wrote its own
        // record back first.
        if (go_on || done) {
          EXPECT_EQ(v, reported);
        } else {
          EXPECT_TRUE(v == reported || v == attempted) << v << " " << reported;
        }
        EXPECT_EQ(store->digest(), trace_.digest(v));
        EXPECT_EQ(Differs(store->current_path(), trace_, v), "");
        log_.clear();
        for (uint64_t next = v + 1; next <= v + 2; ++next) {
          ASSERT_TRUE(store->Advance(trace_.Patch(next - 1, next)).ok()) << next;
          EXPECT_EQ(Differs(store->current_path(), trace_, next), "");
        }
        // state.json never called a spare usable that was not: the store did
        // not have to find out by a failing apply (which Apply's digest check
        // would catch, at the cost of a copy).
        for (const std::string& line : log_)
          EXPECT_EQ(line.find("unusable"), std::string::npos) << line;
        if (done) {
          std::printf("kind %d: failed each of its first %llu operations\n", kind,
                      static_cast<unsigned long long>(n - 1));
          break;  // N passed the last operation of its kind
        }
      }
    }
  }
  // Failures landed before and after each commit point (7: the keyframe
  // committed, its link not re-pointed until the next call or reopen).
  EXPECT_EQ(outcomes, (std::set<uint64_t>{3, 4, 5, 7}));
}

// The streamed path under a failure at the Nth write, sync or rename (and
// a short write): reopened on a healthy disk the store serves one whole
// version, never a spare a stream touched, and keeps advancing.
TEST_F(ViewStoreTest, StreamedFailureAtEveryStepLeavesOldOrNew) {
  enum Kind { kWrite, kSync, kRename };
  {
    auto store = Seeded();
    ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
    ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  }
  const std::string start = tmp_ / "start";
  std::filesystem::rename(dir_, start);
  std::set<uint64_t> outcomes;
  for (Kind kind : {kWrite, kSync, kRename}) {
    for (uint64_t n = 1; n < 100; ++n) {
      SCOPED_TRACE(::testing::Message() << "kind " << kind << " n " << n);
      std::filesystem::remove_all(dir_);
      std::filesystem::copy(
          start, dir_,
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
      EnvFaultPolicy policy;
      (kind == kWrite  ? policy.fail_write_nth
       : kind == kSync ? policy.fail_sync_nth
                       : policy.fail_rename_nth) = n;
      policy.short_writes = true;
      FaultEnv faulty(DefaultEnv(), policy);
      bool done = false;
      uint64_t reported = 3;
      {
        auto s = ViewStore::Open(faulty, dir_, pool_, [](std::string_view) {});
        if (s.ok()) {
          Status st = Status::Ok();
          for (uint64_t v = 4; v <= 5 && st.ok(); ++v) {
            st = (*s)->PrepareSpare();
            const std::vector<uint8_t> patch = trace_.Patch(v - 1, v);
            if (st.ok()) st = StreamAllButLast(**s, patch, 64);
            if (st.ok()) st = (*s)->Advance(patch);
          }
          done = st.ok();
          EXPECT_EQ(done, faulty.stats().failed == 0) << st.ToString();
          reported = (*s)->version();
          if (!done) outcomes.insert(reported);
        }
      }
      auto store = OpenStore();
      ASSERT_NE(store, nullptr);
      const uint64_t v = store->version();
      EXPECT_TRUE(v == reported || v == reported + 1) << v << " " << reported;
      EXPECT_EQ(store->digest(), trace_.digest(v));
      EXPECT_EQ(Differs(store->current_path(), trace_, v), "");
      log_.clear();
      ASSERT_TRUE(store->PrepareSpare().ok());
      const std::vector<uint8_t> next = trace_.Patch(v, v + 1);
      ASSERT_TRUE(StreamAllButLast(*store, next, 64).ok());
      ASSERT_TRUE(store->Advance(next).ok());
      EXPECT_EQ(Differs(store->current_path(), trace_, v + 1), "");
      for (const std::string& line : log_)
        EXPECT_EQ(line.find("unusable"), std::string::npos) << line;
      if (done) break;
    }
  }
  // Failures landed before the first commit and between the two.
  EXPECT_TRUE(outcomes.count(3) && outcomes.count(4));
}

}  // namespace
}  // namespace tern::agent

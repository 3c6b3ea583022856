// ViewStore: every version served is bitwise the published one, switched
// atomically; bad patches switch nothing; the spare is advanced in place (one
// copy in all, not one per version). Faults and crashes:
// view_store_crash_test.cc.
#include "agent/view_store/view_store_test_fixture.h"

namespace tern::agent::view_store_testing {
namespace {

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

// A version's model files, as the agent passes them: a source per file,
// checked against its signed SHA-256.
std::vector<SlotFile> ModelFiles(const std::string& dir,
                                 const std::vector<std::pair<std::string, std::string>>& files) {
  std::filesystem::create_directories(dir);
  std::vector<SlotFile> out;
  for (const auto& [name, text] : files) {
    const std::string source = dir + "/" + name + ".src";
    std::ofstream(source, std::ios::binary) << text;
    out.push_back({{name, text.size(),
                    Sha256Of({reinterpret_cast<const uint8_t*>(text.data()), text.size()})},
                   source});
  }
  return out;
}

std::set<std::string> NonTensorFiles(const std::string& slot) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(slot))
    if (e.path().extension() != ".safetensors") out.insert(e.path().filename().string());
  return out;
}

// Every slot a version is served from holds exactly its model files, from
// the first version (keyframe or seed) through in-place and copied advances.
TEST_F(ViewStoreTest, ModelFilesTravelWithEveryVersion) {
  const std::string src = tmp_ / "files";
  auto store = OpenStore();
  auto v1 = ModelFiles(src + "/1", {{"config.json", "{\"v\": 1}"}, {"tokenizer.json", "tok"}});
  ASSERT_TRUE(store->InstallKeyframe(trace_.Keyframe(1), 1, v1).ok());
  const std::string cur = store->current_path();
  EXPECT_EQ(NonTensorFiles(cur), (std::set<std::string>{"config.json", "tokenizer.json"}));
  EXPECT_EQ(tern::testing::Slurp(cur + "/config.json"), "{\"v\": 1}");
  // v2: config changes, the tokenizer goes, a quantization config comes.
  auto v2 = ModelFiles(src + "/2", {{"config.json", "{\"v\": 2}"}, {"quant_config.json", "q"}});
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2), v2).ok());
  EXPECT_EQ(NonTensorFiles(cur), (std::set<std::string>{"config.json", "quant_config.json"}));
  EXPECT_EQ(tern::testing::Slurp(cur + "/config.json"), "{\"v\": 2}");
  EXPECT_EQ(Differs(cur, trace_, 2), "");
  // v3 in place on the old slot, which still holds v1's files: replaced.
  ASSERT_TRUE(store->PrepareSpare().ok());
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3), v2).ok());
  EXPECT_EQ(NonTensorFiles(cur), (std::set<std::string>{"config.json", "quant_config.json"}));
  EXPECT_EQ(Differs(cur, trace_, 3), "");
  // A format-1 version (no files) leaves the slot's files as they are.
  ASSERT_TRUE(store->Advance(trace_.Patch(3, 4)).ok());
  EXPECT_EQ(store->version(), 4u);
}

// A source whose bytes are not the signed ones is refused like a bad chunk:
// nothing is switched, and the version goes in once the bytes are right.
TEST_F(ViewStoreTest, TamperedModelFileSwitchesNothing) {
  const std::string src = tmp_ / "files";
  auto store = Seeded();
  ASSERT_NE(store, nullptr);
  auto v2 = ModelFiles(src, {{"config.json", "{\"v\": 2}"}});
  std::ofstream(v2[0].source_path, std::ios::binary) << "{\"v\": 9}";  // same size, other bytes
  Status st = store->Advance(trace_.Patch(1, 2), v2);
  EXPECT_EQ(st.code(), Code::kAuth) << st.ToString();
  EXPECT_EQ(store->version(), 1u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 1), "");
  std::ofstream(v2[0].source_path, std::ios::binary) << "{\"v\": 2} and more";  // longer
  EXPECT_EQ(store->Advance(trace_.Patch(1, 2), v2).code(), Code::kAuth);
  std::ofstream(v2[0].source_path, std::ios::binary) << "{\"v\": 2}";
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2), v2).ok());
  EXPECT_EQ(tern::testing::Slurp(store->current_path() + "/config.json"), "{\"v\": 2}");
  EXPECT_EQ(Differs(store->current_path(), trace_, 2), "");
  // Seed with files: the seed's own passenger config.json is replaced, and
  // what else its copy brought along goes.
  trace_.Write(5, tmp_ / "dir5");
  std::filesystem::create_directories(tmp_ / "dir5/subdir");
  std::ofstream(tmp_ / "dir5/.hidden") << "x";
  auto v5 = ModelFiles(src + "/5", {{"config.json", "five"}});
  ASSERT_TRUE(store->Seed(tmp_ / "dir5", 5, trace_.digest(5), v5).ok());
  EXPECT_EQ(tern::testing::Slurp(store->current_path() + "/config.json"), "five");
  EXPECT_EQ(NonTensorFiles(store->current_path()), (std::set<std::string>{"config.json"}));
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

// Positions (docs/agent/board.md §4a): a supersede moves a member to a higher
// epoch with a lower number, by the backwards patch(withdrawn -> version);
// nothing moves it back to a lower position, and the epoch survives a
// restart in state.json. Trace views 4 and 5 are published as 2 and 3 of
// epoch 1 on top of the withdrawn 3 of epoch 0.
TEST_F(ViewStoreTest, ASupersedeMovesToAHigherEpochWithALowerNumber) {
  auto store = Seeded();
  ASSERT_TRUE(store->Advance(trace_.Patch(1, 2)).ok());
  ASSERT_TRUE(store->Advance(trace_.Patch(2, 3)).ok());
  EXPECT_EQ(store->epoch(), 0u);
  auto relabel = [&](uint64_t from_view, uint64_t to_view, uint64_t base, uint64_t target) {
    ThreadPool pool(1);
    DiffOptions o;
    o.segment_elements = 64;
    o.base_version = base;
    o.target_version = target;
    auto p = Diff(trace_.view(from_view), trace_.view(to_view), o, pool);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  };
  const std::vector<uint8_t> backwards = relabel(3, 4, 3, 2);  // patch(3 -> 2), epoch 1
  // In the same epoch a lower number is refused and changes nothing.
  Status same_epoch = store->Advance(backwards);
  EXPECT_EQ(same_epoch.code(), Code::kMismatch) << same_epoch.ToString();
  EXPECT_NE(same_epoch.message().find("is not newer than 3 (epoch 0)"), std::string::npos)
      << same_epoch.ToString();
  EXPECT_EQ(store->version(), 3u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 3), "");
  ASSERT_TRUE(store->PrepareSpare().ok());
  const int copies = Copies();
  Status s = store->Advance(backwards, {}, /*epoch=*/1);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(store->version(), 2u);
  EXPECT_EQ(store->epoch(), 1u);
  EXPECT_EQ(store->digest(), trace_.digest(4));
  EXPECT_EQ(Differs(store->current_path(), trace_, 4), "");
  // The kept backwards patch brings the spare up in place: no copy.
  ASSERT_TRUE(store->PrepareSpare().ok());
  EXPECT_EQ(Copies(), copies);
  EXPECT_TRUE(store->spare_ready());
  // A higher number of the old epoch (a replayed or stale publication) is a
  // lower position: refused, whatever its base.
  const std::vector<uint8_t> old_epoch = relabel(4, 5, 2, 7);
  EXPECT_EQ(store->Advance(old_epoch).code(), Code::kMismatch);
  EXPECT_EQ(store->InstallKeyframe(trace_.Keyframe(7), 7).code(), Code::kInvalidArgument);
  EXPECT_EQ(store->version(), 2u);
  EXPECT_EQ(store->epoch(), 1u);
  // The epoch is recorded with the version: a restart serves 2 of epoch 1.
  store.reset();
  EXPECT_NE(tern::testing::Slurp(dir_ + "/views/state.json").find("\"epoch\": 1"),
            std::string::npos);
  store = OpenStore();
  EXPECT_EQ(store->version(), 2u);
  EXPECT_EQ(store->epoch(), 1u);
  ASSERT_TRUE(store->Advance(relabel(4, 5, 2, 3), {}, 1).ok());
  EXPECT_EQ(store->version(), 3u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 5), "");
  // A keyframe of the epoch installs; one of an older epoch never does.
  EXPECT_EQ(store->InstallKeyframe(trace_.Keyframe(6), 6).code(), Code::kInvalidArgument);
  ASSERT_TRUE(store->InstallKeyframe(trace_.Keyframe(6), 6, {}, 1).ok());
  EXPECT_EQ(store->epoch(), 1u);
  EXPECT_EQ(Differs(store->current_path(), trace_, 6), "");
}

// state.json before epochs has no "epoch": it is epoch 0; a bad one is a
// clear error.
TEST_F(ViewStoreTest, StateWithoutAnEpochIsEpochZeroAndABadOneIsRefused) {
  { auto store = Seeded(); }
  const std::string path = dir_ + "/views/state.json";
  const std::string good = tern::testing::Slurp(path);
  EXPECT_EQ(good.find("epoch"), std::string::npos);  // epoch 0 writes what it always wrote
  EXPECT_EQ(OpenStore()->epoch(), 0u);
  for (const char* bad : {"\"epoch\": -1, ", "\"epoch\": \"1\", ", "\"epoch\": 4294967296, "}) {
    std::string text = good;
    text.insert(text.find("\"version\""), bad);
    { std::ofstream(path, std::ios::trunc) << text; }
    auto s = ViewStore::Open(DefaultEnv(), dir_, pool_, nullptr);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kCorrupt) << s.status().ToString();
  }
}

}  // namespace
}  // namespace tern::agent::view_store_testing

// ViewStore under faults and crashes: a failure at any I/O step, or a power
// loss after it, leaves a store that reopens serving one whole, verified
// version (the old, the new, or after a power loss that tore an unsynced
// slot, the one before), never a mix; what the switch syncs and defers.
#include "agent/view_store/view_store_test_fixture.h"

namespace tern::agent::view_store_testing {
namespace {

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
// committing, or the one before as a fallback), never none (a usable spare
// is durable), never a mix, and keeps advancing.
TEST_F(ViewStoreTest, PowerLossAtEveryStepServesAWholeVersion) {
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
      RestoreDir(start);
      FaultEnv faulty(DefaultEnv(), FailNth(kind, n));
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

// A failure at the Nth write, sync or rename, for every N the operations
// reach. Then either the store is abandoned there (as a crash would, minus
// the lost page cache) or the same store goes on (the fault was one-shot);
// reopened on a healthy disk it serves one whole version, the one it
// reported, and keeps advancing in place.
TEST_F(ViewStoreTest, FailureAtEveryStepLeavesOldOrNew) {
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
        RestoreDir(start);
        FaultEnv faulty(DefaultEnv(), FailNth(kind, n));
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
      RestoreDir(start);
      FaultEnv faulty(DefaultEnv(), FailNth(kind, n));
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
}  // namespace tern::agent::view_store_testing

// The file BoardLog: the interface contract (agent/board/board_log.h), crash
// safety under injected write/sync/rename failures, and refusal of damaged
// records at open.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "agent/board/board_log.h"
#include "base/coding.h"
#include "tern/fault_env.h"
#include "tests/support/files.h"

namespace tern::agent {
namespace {

std::string Bytes(uint64_t v, uint32_t seq) {
  return "manifest v" + std::to_string(v) + " s" + std::to_string(seq);
}

std::vector<std::pair<uint64_t, uint32_t>> Keys(BoardLog& log) {
  auto all = log.LoadAll();
  EXPECT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::pair<uint64_t, uint32_t>> keys;
  if (!all.ok()) return keys;
  for (const auto& r : *all) {
    EXPECT_EQ(r.signed_manifest, Bytes(r.version, r.seq));
    keys.emplace_back(r.version, r.seq);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::unique_ptr<BoardLog> MustOpen(Env& env, const std::string& dir) {
  auto log = OpenFileBoardLog(env, dir);
  EXPECT_TRUE(log.ok()) << log.status().ToString();
  return log.ok() ? std::move(*log) : nullptr;
}

TEST(FileBoardLog, AppendsSurviveReopen) {
  auto env = NewMemEnv();
  {
    auto log = MustOpen(*env, "/b");
    ASSERT_EQ(*log->Head(), 0u);
    ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
    ASSERT_TRUE(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 1}).ok());
    ASSERT_TRUE(log->Append({0, 1}, 1, Bytes(1, 1), false, {0, 0}).ok());
    EXPECT_EQ(*log->Head(), 3u);
  }
  auto log = MustOpen(*env, "/b");
  EXPECT_EQ(*log->Head(), 3u);
  EXPECT_EQ(Keys(*log), (std::vector<std::pair<uint64_t, uint32_t>>{{1, 0}, {1, 1}, {3, 0}}));
}

TEST(FileBoardLog, RefusesWhatTheContractRefuses) {
  auto env = NewMemEnv();
  auto log = MustOpen(*env, "/b");
  ASSERT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 0}).ok());
  EXPECT_EQ(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 2}).code(),
            Code::kInvalidArgument);  // not newer
  EXPECT_EQ(log->Append({0, 5}, 0, Bytes(5, 0), true, {0, 1}).code(),
            Code::kMismatch);  // HEAD moved
  EXPECT_EQ(log->Append({0, 2}, 0, "x", false, {0, 0}).code(),
            Code::kInvalidArgument);  // seq 0 w/o head
  EXPECT_EQ(log->Append({0, 2}, 1, "x", true, {0, 0}).code(),
            Code::kInvalidArgument);  // head on seq 1
  EXPECT_EQ(log->Append({0, 0}, 0, "x", true, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 2}, kMaxManifestsPerVersion, "x", false, {0, 0}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 2}, 1, "", false, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(
      log->Append({0, 2}, 1, std::string(kMaxBoardRecordBytes + 1, 'x'), false, {0, 0}).code(),
      Code::kInvalidArgument);
  ASSERT_TRUE(log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0}).ok());
  EXPECT_EQ(log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0}).code(), Code::kAlreadyExists);
  EXPECT_EQ(*log->Head(), 2u);
  EXPECT_EQ(Keys(*log), (std::vector<std::pair<uint64_t, uint32_t>>{{2, 0}, {2, 1}}));
}

TEST(FileBoardLog, ConcurrentPublishersExactlyOneWins) {
  auto env = NewMemEnv();
  auto log = MustOpen(*env, "/b");
  std::atomic<int> won{0}, lost{0};
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      Status st = log->Append({0, 10 + t}, 0, Bytes(10 + t, 0), true, {0, 0});
      if (st.ok())
        ++won;
      else if (st.code() == Code::kMismatch)
        ++lost;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), 7);
  EXPECT_EQ(Keys(*log).size(), 1u);
}

TEST(FileBoardLog, IdIsCreatedOnceAndKept) {
  auto env = NewMemEnv();
  BoardId a{}, b{};
  a[0] = 1;
  b[0] = 2;
  {
    auto log = MustOpen(*env, "/b");
    EXPECT_EQ(*log->InitId(a), a);
    EXPECT_EQ(*log->InitId(b), a);
  }
  EXPECT_EQ(*MustOpen(*env, "/b")->InitId(b), a);
  std::string bytes;
  ASSERT_TRUE(ReadFileToString(*env, "/b/board_id", 1000, &bytes).ok());
  bytes[9] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(*env, "/b/board_id",
                              {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, true)
                  .ok());
  EXPECT_EQ(MustOpen(*env, "/b")->InitId(b).status().code(), Code::kCorrupt);
}

TEST(FileBoardLog, DropBelowKeepsHeadAndSurvivesReopen) {
  auto env = NewMemEnv();
  auto log = MustOpen(*env, "/b");
  for (uint64_t v = 1; v <= 5; ++v)
    ASSERT_TRUE(log->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}).ok());
  ASSERT_TRUE(log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0}).ok());
  EXPECT_EQ(log->DropBelow({0, 6}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(log->DropBelow({0, 3}).ok());
  ASSERT_TRUE(log->DropBelow({0, 3}).ok());  // idempotent
  EXPECT_EQ(Keys(*log), (std::vector<std::pair<uint64_t, uint32_t>>{{3, 0}, {4, 0}, {5, 0}}));
  log.reset();
  log = MustOpen(*env, "/b");  // the chain starts at 3 now: still valid
  EXPECT_EQ(*log->Head(), 5u);
  EXPECT_TRUE(log->Append({0, 6}, 0, Bytes(6, 0), true, {0, 5}).ok());
}

// A supersede (docs/agent/board.md §4a): epoch 1 opens below HEAD's
// number. The chain is followed by expected_head, not by file name; epoch-0
// records stay format 1 byte for byte, epoch 1's are format 2.
TEST(FileBoardLog, SupersedeChainsByPositionNotByNumber) {
  auto env = NewMemEnv();
  std::string before;  // record 1 as a log without epochs wrote it
  {
    auto log = MustOpen(*env, "/b");
    ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
    ASSERT_TRUE(
        ReadFileToString(*env, "/b/00000000000000000001-0000000000.rec", 1 << 20, &before).ok());
    ASSERT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).ok());
    ASSERT_TRUE(log->Append({0, 9}, 0, Bytes(9, 0), true, {0, 2}).ok());
    // Not after HEAD: a lower number in the same epoch, or an older epoch.
    EXPECT_EQ(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 9}).code(), Code::kInvalidArgument);
    ASSERT_TRUE(log->Append({1, 3}, 0, Bytes(3, 0), true, {0, 9}).ok());
    EXPECT_EQ(*log->Head(), 3u);
    // HEAD is (1, 3) now: a CAS naming (0, 3) or (0, 9) fails.
    EXPECT_EQ(log->Append({1, 4}, 0, Bytes(4, 0), true, {0, 9}).code(), Code::kMismatch);
    EXPECT_EQ(log->Append({0, 10}, 0, Bytes(10, 0), true, {1, 3}).code(), Code::kInvalidArgument);
    // A later manifest repeats its publication's epoch.
    EXPECT_EQ(log->Append({0, 3}, 1, Bytes(3, 1), false, {}).code(), Code::kInvalidArgument);
    ASSERT_TRUE(log->Append({1, 3}, 1, Bytes(3, 1), false, {}).ok());
    ASSERT_TRUE(log->Append({1, 4}, 0, Bytes(4, 0), true, {1, 3}).ok());
  }
  std::string after;
  ASSERT_TRUE(
      ReadFileToString(*env, "/b/00000000000000000001-0000000000.rec", 1 << 20, &after).ok());
  EXPECT_EQ(after, before);
  EXPECT_EQ(DecodeFixed16(reinterpret_cast<const uint8_t*>(after.data()) + 8), 1u);
  std::string rec3;
  ASSERT_TRUE(
      ReadFileToString(*env, "/b/00000000000000000003-0000000000.rec", 1 << 20, &rec3).ok());
  const auto* p = reinterpret_cast<const uint8_t*>(rec3.data());
  EXPECT_EQ(DecodeFixed16(p + 8), 2u);   // format
  EXPECT_EQ(DecodeFixed16(p + 10), 3u);  // advance_head | supersede
  EXPECT_EQ(DecodeFixed32(p + 12), 1u);  // epoch
  EXPECT_EQ(DecodeFixed64(p + 32), 9u);  // the HEAD it replaced, a higher number

  auto log = MustOpen(*env, "/b");
  EXPECT_EQ(*log->Head(), 4u);
  auto all = log->LoadAll();
  ASSERT_TRUE(all.ok());
  std::map<std::pair<uint64_t, uint32_t>, uint32_t> epochs;
  for (const BoardRecord& r : *all) epochs[{r.version, r.seq}] = r.epoch;
  EXPECT_EQ(epochs,
            (std::map<std::pair<uint64_t, uint32_t>, uint32_t>{
                {{1, 0}, 0}, {{2, 0}, 0}, {{9, 0}, 0}, {{3, 0}, 1}, {{3, 1}, 1}, {{4, 0}, 1}}));
  // Below (1, 3) lies 9 too, though its number is higher; 3 and 4 stay.
  EXPECT_EQ(log->DropBelow({1, 5}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(log->DropBelow({1, 3}).ok());
  EXPECT_EQ(Keys(*log), (std::vector<std::pair<uint64_t, uint32_t>>{{3, 0}, {3, 1}, {4, 0}}));
  log.reset();
  log = MustOpen(*env, "/b");  // the chain now starts at the supersede
  EXPECT_EQ(*log->Head(), 4u);
  EXPECT_TRUE(log->Append({1, 5}, 0, Bytes(5, 0), true, {1, 4}).ok());
}

// The record the supersede replaced is gone: the chain falls apart into two
// pieces, and open says a record is missing.
TEST(FileBoardLog, MissingRecordBeforeASupersedeIsRefused) {
  auto env = NewMemEnv();
  {
    auto log = MustOpen(*env, "/b");
    ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
    ASSERT_TRUE(log->Append({0, 9}, 0, Bytes(9, 0), true, {0, 1}).ok());
    ASSERT_TRUE(log->Append({1, 2}, 0, Bytes(2, 0), true, {0, 9}).ok());
  }
  ASSERT_TRUE(env->RemoveFile("/b/00000000000000000009-0000000000.rec").ok());
  auto log = OpenFileBoardLog(*env, "/b");
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), Code::kCorrupt);
  EXPECT_NE(log.status().message().find("missing"), std::string::npos) << log.status().ToString();
}

// Every write, sync and rename of an append fails in turn (short writes
// included); after each, a fresh open sees the log before or after the
// append, never something else, and appending again works.
TEST(FileBoardLog, CrashAtEveryStepLeavesOldOrNew) {
  for (int kind = 0; kind < 3; ++kind) {
    for (uint64_t nth = 1; nth <= 4; ++nth) {
      SCOPED_TRACE(::testing::Message() << "kind " << kind << " nth " << nth);
      auto mem = NewMemEnv();
      { ASSERT_TRUE(MustOpen(*mem, "/b")->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok()); }
      EnvFaultPolicy policy;
      policy.seed = nth;
      policy.short_writes = true;
      (kind == 0 ? policy.fail_write_nth : kind == 1 ? policy.fail_sync_nth
                                                     : policy.fail_rename_nth) = nth;
      FaultEnv faulty(*mem, policy);
      Status st;
      uint64_t head_seen = 0;  // what the failing log believed
      {
        auto log = MustOpen(faulty, "/b");
        ASSERT_NE(log, nullptr);
        st = log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1});
        if (st.ok()) st = log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0});
        head_seen = *log->Head();
      }
      auto log = MustOpen(*mem, "/b");
      ASSERT_NE(log, nullptr);
      const auto keys = Keys(*log);
      const uint64_t head = *log->Head();
      EXPECT_TRUE(head == 1 || head == 2) << head;
      EXPECT_EQ(head, head_seen);
      EXPECT_EQ(keys.front(), (std::pair<uint64_t, uint32_t>{1, 0}));
      EXPECT_EQ(head == 2, std::find(keys.begin(), keys.end(),
                                     std::pair<uint64_t, uint32_t>{2, 0}) != keys.end());
      if (faulty.stats().failed == 0) {
        EXPECT_TRUE(st.ok());
      }
      // The interrupted write's temporary is gone and the log goes on.
      auto names = mem->ListDir("/b", 100);
      for (const auto& n : *names) EXPECT_EQ(n.find(".tmp-"), std::string::npos) << n;
      if (head == 1) {
        EXPECT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).ok());
      }
      EXPECT_TRUE(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 2}).ok());
    }
  }
}

TEST(FileBoardLog, OpenRemovesTemporariesOfACrashedWrite) {
  auto env = NewMemEnv();
  { ASSERT_TRUE(MustOpen(*env, "/b")->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok()); }
  const std::string tmp = "/b/00000000000000000002-0000000000.rec.tmp-0123456789abcdef";
  ASSERT_TRUE(WriteNewFile(*env, tmp, {}).ok());
  auto log = MustOpen(*env, "/b");
  EXPECT_EQ(*env->TypeOf(tmp, false), FileType::kMissing);
  EXPECT_EQ(*log->Head(), 1u);
}

void Rewrite(Env& env, const std::string& path, const std::function<void(std::string&)>& edit) {
  std::string bytes;
  ASSERT_TRUE(ReadFileToString(env, path, 1 << 20, &bytes).ok());
  edit(bytes);
  ASSERT_TRUE(
      WriteFileAtomic(env, path, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, true)
          .ok());
}

TEST(FileBoardLog, DamagedRecordsAreRefusedAtOpen) {
  const std::string rec2 = "/b/00000000000000000002-0000000000.rec";
  struct Case {
    const char* name;
    std::function<void(Env&)> damage;
  };
  const std::vector<Case> cases = {
      {"flipped payload byte", [&](Env& e) { Rewrite(e, rec2, [](std::string& b) { b[50] ^= 4; }); }},
      {"flipped header byte", [&](Env& e) { Rewrite(e, rec2, [](std::string& b) { b[17] ^= 1; }); }},
      {"truncated", [&](Env& e) { Rewrite(e, rec2, [](std::string& b) { b.resize(b.size() - 1); }); }},
      {"empty", [&](Env& e) { Rewrite(e, rec2, [](std::string& b) { b.clear(); }); }},
      {"oversized", [&](Env& e) { Rewrite(e, rec2, [](std::string& b) { b.resize(1 << 17); }); }},
      {"renamed to another version",
       [&](Env& e) {
         ASSERT_TRUE(e.Rename(rec2, "/b/00000000000000000009-0000000000.rec", RenameMode::kNoReplace).ok());
       }},
      {"missing middle publication", [&](Env& e) { ASSERT_TRUE(e.RemoveFile(rec2).ok()); }},
      {"stray file", [&](Env& e) { ASSERT_TRUE(WriteNewFile(e, "/b/notes.txt", {}).ok()); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto env = NewMemEnv();
    {
      auto log = MustOpen(*env, "/b");
      for (uint64_t v = 1; v <= 3; ++v)
        ASSERT_TRUE(log->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}).ok());
    }
    c.damage(*env);
    auto log = OpenFileBoardLog(*env, "/b");
    ASSERT_FALSE(log.ok());
    EXPECT_EQ(log.status().code(), Code::kCorrupt) << log.status().ToString();
  }
}

TEST(FileBoardLog, WorksOnRealFiles) {
  testing::TempDir dir("board_log");
  {
    auto log = MustOpen(DefaultEnv(), dir / "board");
    ASSERT_TRUE(log->Append({0, 7}, 0, Bytes(7, 0), true, {0, 0}).ok());
  }
  auto log = MustOpen(DefaultEnv(), dir / "board");
  EXPECT_EQ(*log->Head(), 7u);
  EXPECT_EQ(Keys(*log), (std::vector<std::pair<uint64_t, uint32_t>>{{7, 0}}));
}

}  // namespace
}  // namespace tern::agent

// EtcdBoardLog against a real etcd on loopback: board_log.h's contract, CAS
// conflicts between two roots, fencing across a leader change, and what a
// foreign writer can leave under the prefix; the key-set chain kept beside
// the log (etcd_key_sets.h).
#include "agent/etcd/etcd_board_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "agent/etcd/etcd_key_sets.h"
#include "agent/testing/etcd_suite.h"

namespace tern::agent {
namespace {

class EtcdBoardLogTest : public SharedEtcdTest<EtcdBoardLogTest> {
 protected:
  void SetUp() override {
    SharedEtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // A prefix per test: the tests share one etcd.
    prefix_ = std::string("/b/") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto c = EtcdClient::Create(Etcd());
    ASSERT_TRUE(c.ok());
    raw_ = std::move(*c);
  }
  static EtcdOptions Etcd(uint32_t timeout_ms = 3000) {
    EtcdOptions o;
    o.endpoints = {etcd().endpoint()};
    o.timeout_ms = timeout_ms;
    o.log = [](std::string_view) {};
    return o;
  }
  std::unique_ptr<EtcdBoardLog> Open(uint32_t page_records = 256) {
    EtcdBoardLogOptions o;
    o.prefix = prefix_;
    o.page_records = page_records;
    auto log = EtcdBoardLog::Open(Etcd(), o);
    EXPECT_TRUE(log.ok()) << log.status().ToString();
    return log.ok() ? std::move(*log) : nullptr;
  }
  // Campaigns as `id` under this test's prefix (3 s lease).
  Result<std::unique_ptr<Election>> Lead(const std::string& id) {
    ElectionOptions e;
    e.prefix = prefix_;
    e.id = id;
    e.lease_ttl_s = 3;
    e.log = [](std::string_view) {};
    return Election::Campaign(Etcd(), e, SteadyClock(), 5000);
  }
  static std::string Bytes(uint64_t v, uint32_t seq) {
    return "signed manifest v" + std::to_string(v) + " seq " + std::to_string(seq);
  }
  static std::vector<std::pair<uint64_t, uint32_t>> Sorted(const std::vector<BoardRecord>& rs) {
    std::vector<std::pair<uint64_t, uint32_t>> out;
    for (const BoardRecord& r : rs) {
      EXPECT_EQ(r.signed_manifest, Bytes(r.version, r.seq));
      out.emplace_back(r.version, r.seq);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string prefix_;
  std::unique_ptr<EtcdClient> raw_;
};

using Names = std::vector<std::pair<uint64_t, uint32_t>>;

TEST_F(EtcdBoardLogTest, AppendsLoadsAndAdvancesHead) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(*log->Head(), 0u);
  auto all = log->LoadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  ASSERT_TRUE(log->Append({0, 1}, 1, Bytes(1, 1), false, {0, 0}).ok());  // a late squash for v1
  ASSERT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).ok());
  ASSERT_TRUE(log->Append({0, 10}, 0, Bytes(10, 0), true, {0, 2}).ok());  // gaps are fine
  EXPECT_EQ(*log->Head(), 10u);
  all = log->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(Sorted(*all), (Names{{1, 0}, {1, 1}, {2, 0}, {10, 0}}));
  // A second process sees the same log.
  auto other = Open();
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(*other->Head(), 10u);
  EXPECT_EQ(Sorted(*other->LoadAll()), (Names{{1, 0}, {1, 1}, {2, 0}, {10, 0}}));
}

TEST_F(EtcdBoardLogTest, CompareAndSwapConflictsChangeNothing) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  ASSERT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).ok());
  // HEAD moved: expected 1, it is 2.
  Status s = log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 1});
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_NE(s.message().find("HEAD is 2"), std::string::npos) << s.ToString();
  // Expected an empty log, it is not.
  EXPECT_EQ(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 0}).code(), Code::kMismatch);
  // The same (v, seq) twice, with or without HEAD.
  s = log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(log->Append({0, 2}, 1, "other bytes", false, {0, 0}).code(), Code::kAlreadyExists);
  EXPECT_EQ(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 2}).code(), Code::kOk);
  EXPECT_EQ(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 3}).code(), Code::kInvalidArgument);
  EXPECT_EQ(*log->Head(), 3u);
  EXPECT_EQ(Sorted(*log->LoadAll()), (Names{{1, 0}, {2, 0}, {2, 1}, {3, 0}}));
}

TEST_F(EtcdBoardLogTest, TwoRootsRacingForTheNextVersionOneWins) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  for (uint64_t v = 2; v < 12; ++v) {
    Status sa, sb;
    std::thread ta([&] { sa = a->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}); });
    std::thread tb([&] { sb = b->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}); });
    ta.join();
    tb.join();
    EXPECT_NE(sa.ok(), sb.ok()) << "v" << v << ": " << sa.ToString() << " / " << sb.ToString();
    const Status& loser = sa.ok() ? sb : sa;
    EXPECT_TRUE(loser.code() == Code::kAlreadyExists || loser.code() == Code::kMismatch)
        << loser.ToString();
  }
  EXPECT_EQ(*a->Head(), 11u);
  EXPECT_EQ(a->LoadAll()->size(), 11u);
}

TEST_F(EtcdBoardLogTest, RefusesBadArguments) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->Append({0, 0}, 0, "x", true, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 1}, kMaxManifestsPerVersion, "x", false, {0, 0}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 1}, 0, "", true, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 1}, 0, std::string(kMaxBoardRecordBytes + 1, 'x'), true, {0, 0}).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 1}, 1, "x", true, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 1}, 0, "x", false, {0, 0}).code(), Code::kInvalidArgument);
  EXPECT_EQ(log->Append({0, 5}, 0, "x", true, {0, 5}).code(), Code::kInvalidArgument);
  EXPECT_TRUE(log->LoadAll()->empty()) << "nothing refused was written";
  // The largest record fits (etcd's 1.5 MiB request limit is above it).
  EXPECT_TRUE(log->Append({0, 1}, 0, std::string(kMaxBoardRecordBytes, 'x'), true, {0, 0}).ok());
  EtcdBoardLogOptions o;
  o.prefix = "/b/";
  EXPECT_EQ(EtcdBoardLog::Open(Etcd(), o).status().code(), Code::kInvalidArgument);
  o.prefix = "";
  EXPECT_EQ(EtcdBoardLog::Open(Etcd(), o).status().code(), Code::kInvalidArgument);
}

TEST_F(EtcdBoardLogTest, InitIdFirstWriterWins) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  BoardId ida{}, idb{};
  ida.fill(0xaa);
  idb.fill(0xbb);
  Result<BoardId> ra = Status(Code::kInternal, ""), rb = Status(Code::kInternal, "");
  std::thread ta([&] { ra = a->InitId(ida); });
  std::thread tb([&] { rb = b->InitId(idb); });
  ta.join();
  tb.join();
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status().ToString() << rb.status().ToString();
  EXPECT_EQ(*ra, *rb);
  EXPECT_TRUE(*ra == ida || *ra == idb);
  auto again = a->InitId(idb == *ra ? ida : idb);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *ra);
}

TEST_F(EtcdBoardLogTest, LoadAllPagesThroughOneSnapshot) {
  auto log = Open(/*page_records=*/3);
  ASSERT_NE(log, nullptr);
  Names want;
  for (uint64_t v = 1; v <= 8; ++v) {
    ASSERT_TRUE(log->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}).ok());
    want.emplace_back(v, 0);
    if (v % 3 == 0) {
      ASSERT_TRUE(log->Append({0, v}, 1, Bytes(v, 1), false, {0, 0}).ok());
      want.emplace_back(v, 1);
    }
  }
  auto all = log->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(Sorted(*all), want);
  // Version 1e19 sorts after 9 (fixed-width keys).
  ASSERT_TRUE(log->Append({0, 10'000'000'000'000'000'000u}, 0,
                          Bytes(10'000'000'000'000'000'000u, 0), true, {0, 8})
                  .ok());
  EXPECT_EQ(log->LoadAll()->size(), want.size() + 1);
}

TEST_F(EtcdBoardLogTest, DropBelowKeepsHead) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  for (uint64_t v = 1; v <= 5; ++v)
    ASSERT_TRUE(log->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}).ok());
  ASSERT_TRUE(log->Append({0, 2}, 1, Bytes(2, 1), false, {0, 0}).ok());
  EXPECT_EQ(log->DropBelow({0, 6}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(log->DropBelow({0, 3}).ok());
  EXPECT_EQ(Sorted(*log->LoadAll()), (Names{{3, 0}, {4, 0}, {5, 0}}));
  ASSERT_TRUE(log->DropBelow({0, 3}).ok());  // idempotent
  ASSERT_TRUE(log->DropBelow({0, 5}).ok());
  EXPECT_EQ(Sorted(*log->LoadAll()), (Names{{5, 0}}));
  EXPECT_EQ(*log->Head(), 5u);
  // Keys beside the versions are not touched.
  EXPECT_TRUE(log->Append({0, 6}, 0, Bytes(6, 0), true, {0, 5}).ok());
}

// A supersede (docs/agent/board.md §4a): epoch 1 opens below HEAD's
// number; HEAD's value names the epoch, so a CAS that expects the same
// number in epoch 0 fails; keys sort by position, so DropBelow drops the
// withdrawn 9 with 1 and 2 while the lower-numbered 3 stays.
TEST_F(EtcdBoardLogTest, SupersedeOrdersRecordsByPosition) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  ASSERT_TRUE(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).ok());
  ASSERT_TRUE(log->Append({0, 9}, 0, Bytes(9, 0), true, {0, 2}).ok());
  EXPECT_EQ(log->Append({0, 3}, 0, Bytes(3, 0), true, {0, 9}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(log->Append({1, 3}, 0, Bytes(3, 0), true, {0, 9}).ok());
  ASSERT_TRUE(log->Append({1, 3}, 1, Bytes(3, 1), false, {}).ok());
  EXPECT_EQ(*log->Head(), 3u);
  auto head = raw_->Get(prefix_ + "/head");
  ASSERT_TRUE(head.ok());
  ASSERT_EQ(head->kvs.size(), 1u);
  EXPECT_EQ(head->kvs[0].value, "3@1");
  Status s = log->Append({1, 4}, 0, Bytes(4, 0), true, {0, 3});
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  ASSERT_TRUE(log->Append({1, 4}, 0, Bytes(4, 0), true, {1, 3}).ok());

  auto other = Open();  // a standby reads the same positions
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(*other->Head(), 4u);
  auto all = other->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::map<std::pair<uint64_t, uint32_t>, uint32_t> epochs;
  for (const BoardRecord& r : *all) {
    EXPECT_EQ(r.signed_manifest, Bytes(r.version, r.seq));
    epochs[{r.version, r.seq}] = r.epoch;
  }
  EXPECT_EQ(epochs,
            (std::map<std::pair<uint64_t, uint32_t>, uint32_t>{
                {{1, 0}, 0}, {{2, 0}, 0}, {{9, 0}, 0}, {{3, 0}, 1}, {{3, 1}, 1}, {{4, 0}, 1}}));
  EXPECT_EQ(log->DropBelow({1, 5}).code(), Code::kInvalidArgument);
  ASSERT_TRUE(log->DropBelow({1, 3}).ok());
  EXPECT_EQ(Sorted(*log->LoadAll()), (Names{{3, 0}, {3, 1}, {4, 0}}));
  ASSERT_TRUE(log->Append({1, 5}, 0, Bytes(5, 0), true, {1, 4}).ok());
  EXPECT_EQ(*log->Head(), 5u);
}

TEST_F(EtcdBoardLogTest, ForeignDataUnderThePrefixIsCorruptNotACrash) {
  auto log = Open();
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  const std::string versions = prefix_ + "/versions/";
  for (const std::string& bad :
       {versions + "junk", versions + "00000000000000000001/64",
        versions + "00000000000000000000/00", versions + "0000000000000000000x/00",
        versions + "00000000000000000001/001", versions + "99999999999999999999/00",
        versions + "e0000000000-00000000000000000001/00",  // epoch 0 has no 'e' key
        versions + "e0000000001-0000000000000000001/00", versions + "e1-00000000000000000001/00",
        versions + "e4294967296-00000000000000000001/00"}) {
    ASSERT_TRUE(raw_->Put(bad, "x").ok());
    auto all = log->LoadAll();
    EXPECT_EQ(all.status().code(), Code::kCorrupt) << bad;
    EXPECT_NE(all.status().message().find("foreign key"), std::string::npos);
    ASSERT_TRUE(raw_->Delete(bad).ok());
  }
  ASSERT_TRUE(raw_->Put(versions + "00000000000000000002/00", "").ok());
  EXPECT_EQ(log->LoadAll().status().code(), Code::kCorrupt);
  ASSERT_TRUE(
      raw_->Put(versions + "00000000000000000002/00", std::string(kMaxBoardRecordBytes + 1, 'x'))
          .ok());
  EXPECT_EQ(log->LoadAll().status().code(), Code::kCorrupt);
  ASSERT_TRUE(raw_->Delete(versions + "00000000000000000002/00").ok());
  EXPECT_TRUE(log->LoadAll().ok());

  for (const char* head : {"", "0", "-1", "01", "abc", "18446744073709551616", "2@0", "2@", "@1",
                           "2@01", "2@1@1", "2@4294967296"}) {
    ASSERT_TRUE(raw_->Put(prefix_ + "/head", head).ok());
    EXPECT_EQ(log->Head().status().code(), Code::kCorrupt) << head;
    EXPECT_EQ(log->Append({0, 2}, 0, Bytes(2, 0), true, {0, 1}).code(), Code::kCorrupt) << head;
  }
  ASSERT_TRUE(raw_->Put(prefix_ + "/id", "short").ok());
  BoardId id{};
  EXPECT_EQ(log->InitId(id).status().code(), Code::kCorrupt);
}

TEST_F(EtcdBoardLogTest, FencedAppendsFollowTheLeader) {
  auto a = Lead("root-a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto log_a = Open();
  ASSERT_NE(log_a, nullptr);
  log_a->SetFence((*a)->Fence());
  for (uint64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(log_a->Append({0, v}, 0, Bytes(v, 0), true, {0, v - 1}).ok());
  }
  // Root a stalls long enough to lose its lease (revoked here, as if it expired).
  ASSERT_TRUE(raw_->LeaseRevoke((*a)->lease_id()).ok());
  Status late = log_a->Append({0, 4}, 0, Bytes(4, 0), true, {0, 3});
  EXPECT_EQ(late.code(), Code::kMismatch) << late.ToString();
  EXPECT_NE(late.message().find("no longer holds"), std::string::npos) << late.ToString();
  EXPECT_EQ(log_a->DropBelow({0, 2}).code(), Code::kMismatch);
  // Standby b takes over and continues the log: nothing a published is lost.
  auto b = Lead("root-b");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto log_b = Open();
  ASSERT_NE(log_b, nullptr);
  log_b->SetFence((*b)->Fence());
  auto head = log_b->Head();
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, 3u);
  EXPECT_EQ(Sorted(*log_b->LoadAll()), (Names{{1, 0}, {2, 0}, {3, 0}}));
  ASSERT_TRUE(log_b->Append({0, 4}, 0, Bytes(4, 0), true, {0, 3}).ok());
  // a's fence still fails under b's leadership.
  EXPECT_EQ(log_a->Append({0, 5}, 0, Bytes(5, 0), true, {0, 4}).code(), Code::kMismatch);
  EXPECT_EQ(*log_b->Head(), 4u);
}

// The key-set chain beside the log (agent/etcd/etcd_key_sets.h): kept in
// order, written once per number, never forked, fenced like the log.
TEST_F(EtcdBoardLogTest, KeySetsAreKeptInOrderAndNeverForked) {
  EtcdKeySetsOptions ko;
  ko.prefix = prefix_;
  ko.max_key_sets = 4;
  ko.max_key_set_bytes = 64;
  auto ks = EtcdKeySets::Open(Etcd(), ko);
  ASSERT_TRUE(ks.ok()) << ks.status().ToString();
  EXPECT_EQ(*(*ks)->Load(), std::vector<std::string>{});
  // Not past a gap, and not over the bounds: nothing written.
  EXPECT_EQ((*ks)->Put(2, "two").code(), Code::kMismatch);
  EXPECT_EQ((*ks)->Put(0, "zero").code(), Code::kInvalidArgument);
  EXPECT_EQ((*ks)->Put(5, "five").code(), Code::kInvalidArgument);
  EXPECT_EQ((*ks)->Put(1, std::string(65, 'x')).code(), Code::kInvalidArgument);
  EXPECT_EQ((*ks)->Put(1, "").code(), Code::kInvalidArgument);
  EXPECT_EQ(*(*ks)->Load(), std::vector<std::string>{});
  ASSERT_TRUE((*ks)->Put(1, "one").ok());
  ASSERT_TRUE((*ks)->Put(2, "two").ok());
  // A retried write that landed is fine; other bytes under a number are a fork.
  EXPECT_TRUE((*ks)->Put(2, "two").ok());
  Status fork = (*ks)->Put(2, "TWO");
  EXPECT_EQ(fork.code(), Code::kMismatch) << fork.ToString();
  EXPECT_NE(fork.message().find("fork"), std::string::npos) << fork.ToString();
  EXPECT_EQ(*(*ks)->Load(), (std::vector<std::string>{"one", "two"}));
  // Beside the log, not in it: the board log does not see them.
  auto log = Open();
  ASSERT_NE(log, nullptr);
  ASSERT_TRUE(log->Append({0, 1}, 0, Bytes(1, 0), true, {0, 0}).ok());
  EXPECT_EQ(log->LoadAll()->size(), 1u);
  EXPECT_EQ((*ks)->Load()->size(), 2u);
}

TEST_F(EtcdBoardLogTest, KeySetsRefuseWhatPutNeverWrites) {
  EtcdKeySetsOptions ko;
  ko.prefix = prefix_;
  ko.max_key_sets = 3;
  ko.max_key_set_bytes = 8;
  auto ks = EtcdKeySets::Open(Etcd(), ko);
  ASSERT_TRUE(ks.ok()) << ks.status().ToString();
  const std::string dir = prefix_ + "/key-sets/";
  auto key = [&](int seq) {
    char b[24];
    snprintf(b, sizeof(b), "%020d", seq);
    return dir + b;
  };
  auto corrupt = [&](const std::string& why) {
    auto loaded = (*ks)->Load();
    EXPECT_EQ(loaded.status().code(), Code::kCorrupt) << why;
    ASSERT_TRUE(raw_->DeletePrefix(dir).ok());
  };
  ASSERT_TRUE(raw_->Put(key(2), "two").ok());
  corrupt("a gap: 2 without 1");
  ASSERT_TRUE(raw_->Put(dir + "1", "one").ok());
  corrupt("a key of the wrong width");
  ASSERT_TRUE(raw_->Put(key(1), "123456789").ok());
  corrupt("a value over the bound");
  for (int i = 1; i <= 4; ++i) ASSERT_TRUE(raw_->Put(key(i), "k").ok());
  corrupt("more entries than the bound");
  ASSERT_TRUE(raw_->Put(key(1), "one").ok());
  EXPECT_EQ(*(*ks)->Load(), std::vector<std::string>{"one"});
}

TEST_F(EtcdBoardLogTest, KeySetsAreFencedByTheElection) {
  auto a = Lead("root-a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EtcdKeySetsOptions ko;
  ko.prefix = prefix_;
  ko.fence = (*a)->Fence();
  auto ks = EtcdKeySets::Open(Etcd(), ko);
  ASSERT_TRUE(ks.ok()) << ks.status().ToString();
  ASSERT_TRUE((*ks)->Put(1, "one").ok());
  ASSERT_TRUE(raw_->LeaseRevoke((*a)->lease_id()).ok());  // a lost its lease
  Status late = (*ks)->Put(2, "two");
  EXPECT_EQ(late.code(), Code::kMismatch) << late.ToString();
  EXPECT_NE(late.message().find("no longer holds"), std::string::npos) << late.ToString();
  EXPECT_EQ(*(*ks)->Load(), std::vector<std::string>{"one"});
}

TEST(EtcdBoardUrlTest, ParsesTheBoardFlag) {
  auto one = ParseEtcdBoardUrl("etcd://127.0.0.1:2379/tern/main");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->endpoints, std::vector<std::string>{"http://127.0.0.1:2379"});
  EXPECT_EQ(one->prefix, "/tern/main");
  auto three = ParseEtcdBoardUrl("etcd://a:1,b:2,[::1]:3/x");
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(three->endpoints,
            (std::vector<std::string>{"http://a:1", "http://b:2", "http://[::1]:3"}));
  EXPECT_EQ(three->prefix, "/x");
  // etcds://: TLS to every endpoint. The URL is syntax only: an endpoint off
  // loopback is refused (or not) where the client is made.
  auto tls = ParseEtcdBoardUrl("etcds://etcd-1.example:2379,10.0.0.2:2379/tern/main");
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_EQ(tls->endpoints, (std::vector<std::string>{"https://etcd-1.example:2379",
                                                      "https://10.0.0.2:2379"}));
  for (const char* bad :
       {"", "etcd://", "etcd:///x", "http://a:1/x", "etcd://a:1", "etcd://a:1/", "etcd://a:1/x/",
        "etcd://a/x", "etcd://a:1,/x", "etcd://a:99999/x", "etcd://a:1,,b:2/x", "etcds://a:1",
        "etcdss://a:1/x", "etcd://https://a:1/x"}) {
    EXPECT_EQ(ParseEtcdBoardUrl(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseEtcdBoardUrl("etcd://a:1/" + std::string(600, 'p')).status().code(),
            Code::kInvalidArgument);
}

TEST(EtcdBoardLogServerTest, SurvivesAnEtcdRestartAndReportsAnOutage) {
  auto started = EtcdTestServer::Start();
  if (!started.ok() && started.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << started.status().ToString();
  }
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  EtcdTestServer& server = **started;
  EtcdOptions o;
  o.endpoints = {server.endpoint()};
  o.timeout_ms = 1000;
  o.log = [](std::string_view) {};
  EtcdBoardLogOptions lo;
  lo.prefix = "/restart";
  auto log = EtcdBoardLog::Open(o, lo);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_TRUE((*log)->Append({0, 1}, 0, "one", true, {0, 0}).ok());
  ASSERT_TRUE((*log)->Append({0, 2}, 0, "two", true, {0, 1}).ok());
  ASSERT_TRUE(server.Kill().ok());  // a crash, not a clean stop
  Status down = (*log)->Append({0, 3}, 0, "three", true, {0, 2});
  EXPECT_EQ(down.code(), Code::kUnavailable) << down.ToString();
  EXPECT_EQ(EtcdBoardLog::Open(o, lo).status().code(), Code::kUnavailable);
  ASSERT_TRUE(server.Restart().ok());
  Status up;
  for (int i = 0; i < 50; ++i) {  // the client reconnects on its own
    up = (*log)->Append({0, 3}, 0, "three", true, {0, 2});
    if (up.code() != Code::kUnavailable) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(up.ok()) << up.ToString();
  EXPECT_EQ(*(*log)->Head(), 3u);
  auto all = (*log)->LoadAll();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
}

}  // namespace
}  // namespace tern::agent

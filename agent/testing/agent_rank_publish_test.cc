// Publishing from trainer ranks end to end (Agent::PublishRankPart): 2 and 4
// ranks, each owning row shards of every tensor, publish versions that reach
// members bit for bit, keyframes and a late member's catch-up included; a
// rank that never sends leaves no version and an error naming it; unknown
// ranks and overlapping shards are refused.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/daemon/view_rows.h"
#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/env.h"
#include "tern/rank_publish.h"

namespace tern {
namespace {

using agent_test::WaitFor;

// Rank r's rows of each tensor: rows [r*R/world, (r+1)*R/world) of a tensor
// of R rows (the whole of a 1-D tensor or scalar to rank 0).
std::vector<RankShardRange> RowShards(const std::vector<TensorDesc>& layout, uint32_t r,
                                      uint32_t world) {
  std::vector<RankShardRange> out;
  for (const TensorDesc& d : layout) {
    const uint64_t n = d.elements();
    if (d.shape.size() < 2) {
      if (r == 0) out.push_back({d.name, 0, n});
      continue;
    }
    const uint64_t rows = d.shape[0], row = n / rows;
    const uint64_t r0 = rows * r / world, r1 = rows * (r + 1) / world;
    if (r1 > r0) out.push_back({d.name, r0 * row, (r1 - r0) * row});
  }
  return out;
}

std::vector<RankShard> ShardsIn(const ServeView& view, const std::vector<RankShardRange>& ranges) {
  std::vector<RankShard> out;
  for (const RankShardRange& r : ranges) {
    const TensorRef* t = view.Find(r.tensor);
    const uint64_t esize = static_cast<uint64_t>(ElementBits(t->desc->dtype)) / 8;
    out.push_back({r, t->data + r.first_element * esize, r.element_count * esize});
  }
  return out;
}

// DefaultEnv whose syncs of a version's objects wait until the test opens
// the gate: a publish that outlasts a rank's fetch, holding the root's
// publish lock all along.
class HeldPublishEnv : public EnvWrapper {
 public:
  explicit HeldPublishEnv(Env& target) : EnvWrapper(target) {}
  void Close() { closed_ = true; }
  void Open() {
    std::lock_guard lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  bool held() const { return held_; }

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override {
    TERN_ASSIGN_OR_RETURN(auto file, target().OpenWritable(path, mode));
    if (path.find("/published/patch-") == std::string::npos) return file;
    return std::unique_ptr<WritableFile>(std::make_unique<HeldFile>(std::move(file), *this));
  }

 private:
  class HeldFile : public WritableFile {
   public:
    HeldFile(std::unique_ptr<WritableFile> inner, HeldPublishEnv& env)
        : inner_(std::move(inner)), env_(env) {}
    Status Append(std::span<const uint8_t> bytes) override { return inner_->Append(bytes); }
    Status Sync() override {
      std::unique_lock lock(env_.mu_);
      env_.held_ = env_.closed_.load();
      env_.cv_.wait(lock, [&] { return !env_.closed_; });
      return inner_->Sync();
    }
    Status Close() override { return inner_->Close(); }

   private:
    std::unique_ptr<WritableFile> inner_;
    HeldPublishEnv& env_;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> closed_{false}, held_{false};
};

class AgentRankPublishTest : public agent_test::AgentSystemFixture {
 protected:
  void TearDown() override {
    if (held_env_) held_env_->Open();  // a failed test must not leave a publish held
    AgentSystemFixture::TearDown();
  }

  void MakeRanks(uint32_t world, const std::string& first_step) {
    auto c = Checkpoint::Open(first_step);
    ASSERT_TRUE(c.ok());
    layout_.clear();
    for (const auto& t : (*c)->view().tensors) layout_.push_back(*t.desc);
    ranks_.clear();
    for (uint32_t r = 0; r < world; ++r) {
      RankPublisherOptions o;
      o.segment_elements = 4096;
      auto p = RankPublisher::Create(r, world, layout_, RowShards(layout_, r, world), o);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      ranks_.push_back(std::move(p).value());
    }
  }

  // Every rank of `send` encodes its shards of `path` and sends its part
  // from a thread of its own; the outcome per rank.
  std::vector<Status> PublishFromRanks(uint64_t version, const std::string& path,
                                       const std::vector<uint32_t>& send, uint32_t timeout_ms) {
    auto c = Checkpoint::Open(path);
    EXPECT_TRUE(c.ok());
    const uint32_t world = static_cast<uint32_t>(ranks_.size());
    std::vector<std::future<Status>> futures;
    for (uint32_t r : send) {
      futures.push_back(std::async(std::launch::async, [&, r] {
        auto part = ranks_[r]->Encode(version, ShardsIn((*c)->view(), RowShards(layout_, r, world)));
        if (!part.ok()) return part.status();
        Status s = root_->PublishRankPart(std::move(part).value(), timeout_ms);
        if (s.ok()) s = ranks_[r]->Committed();
        else ranks_[r]->Abandon();
        return s;
      }));
    }
    std::vector<Status> out;
    for (auto& f : futures) out.push_back(f.get());
    return out;
  }

  std::vector<uint32_t> All() const {
    std::vector<uint32_t> v;
    for (uint32_t r = 0; r < ranks_.size(); ++r) v.push_back(r);
    return v;
  }

  std::vector<TensorDesc> layout_;
  std::vector<std::unique_ptr<RankPublisher>> ranks_;
  std::unique_ptr<HeldPublishEnv> held_env_;  // outlives the agents (TearDown resets them)
};

class AgentRankWorldTest : public AgentRankPublishTest,
                           public ::testing::WithParamInterface<uint32_t> {};

TEST_P(AgentRankWorldTest, RanksCommitVersionsThatReachMembersBitwise) {
  CaptureLogs();
  StartRoot();
  StartMember("a", "us");
  StartMember("b", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  // keyframe_every is 4: a version after the first keyframe gets a late
  // keyframe from the board's objects.
  for (uint64_t v = 1; v <= 6; ++v) {
    const std::string path = NextStep();
    if (v == 1) MakeRanks(GetParam(), path);
    for (const Status& s : PublishFromRanks(v, path, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(root_->Snapshot().head, v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
    ExpectBitwiseEqual(v);
    EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), steps_[v]), "")
        << "the root's own view at v" << v;
  }
  EXPECT_GT(Logged("root", "made a late keyframe of version"), 0u);
  // A member that comes later catches up from a board no checkpoint built.
  StartMember("c", "ap");
  ASSERT_TRUE(AllServe(6)) << Lagging(6);
  ExpectBitwiseEqual(6);
}

INSTANTIATE_TEST_SUITE_P(World, AgentRankWorldTest, ::testing::Values(2u, 4u));

// A restarted root has forgotten the terms each rank's part committed (they
// live in memory); it hashes the resumed part's shards in its own view of
// the base version instead, before the part joins: a wrong base is refused
// at once (kMismatch, naming the rank), the waiting part of rank 0 is not
// failed, and the right base then commits the version with it.
TEST_F(AgentRankPublishTest, AWrongResumeBaseIsRefusedAtOnceAfterARootRestart) {
  tweak_ = [](AgentOptions& o) {
    if (o.id != "root") return;
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "rank-token";
  };
  StartRoot();
  const std::string v1 = NextStep();
  MakeRanks(2, v1);
  for (const Status& s : PublishFromRanks(1, v1, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  root_->Stop();
  root_.reset();
  transports_.erase("root");
  StartRoot();  // same DIR: HEAD 1, the rank terms gone
  ASSERT_EQ(root_->Snapshot().head, 1u);
  AgentClientOptions client;
  client.token = "rank-token";
  client.timeout_ms = 60000;
  const std::string admin = root_->Snapshot().admin_address;

  // Version 2: rank 0 sends its part and waits; rank 1's process restarted.
  const std::string v2 = NextStep();
  auto c1 = Checkpoint::Open(v1);
  auto c2 = Checkpoint::Open(v2);
  ASSERT_TRUE(c1.ok() && c2.ok());
  auto rank0 = std::async(std::launch::async, [&] {
    auto part = ranks_[0]->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 0, 2)));
    return part.ok() ? root_->PublishRankPart(std::move(part).value(), 60000) : part.status();
  });
  // Rank 1 resumes from `base`, sending until rank 0's part is being
  // gathered (before, the root answers "not being gathered").
  auto resume_from = [&](const std::string& base) {
    auto fresh = RankPublisher::Create(1, 2, layout_, RowShards(layout_, 1, 2), {});
    if (!fresh.ok()) return fresh.status();
    auto b = Checkpoint::Open(base);
    if (!b.ok()) return b.status();
    Status r = (*fresh)->Resume(1, ShardsIn((*b)->view(), RowShards(layout_, 1, 2)));
    if (!r.ok()) return r;
    auto part = (*fresh)->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 1, 2)));
    if (!part.ok()) return part.status();
    auto bytes = EncodeRankPart(*part);
    if (!bytes.ok()) return bytes.status();
    for (int i = 0; i < 1500; ++i) {
      Status s = ResumeRankPart(admin, *bytes, 2, 1, 60000, client);
      if (s.message().find("not being gathered") == std::string::npos) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return TERN_ERROR(kTimeout, "rank 0's part was never gathered");
  };
  Status wrong = resume_from(v2);  // the new version's own bytes, not version 1's
  EXPECT_EQ(wrong.code(), Code::kMismatch) << wrong.ToString();
  EXPECT_NE(wrong.message().find("rank 1's base is not version 1's bytes"), std::string::npos)
      << wrong.ToString();
  EXPECT_EQ(rank0.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "rank 0's part was failed by rank 1's wrong resume";
  Status right = resume_from(v1);
  EXPECT_TRUE(right.ok()) << right.ToString();
  Status s0 = rank0.get();
  ASSERT_TRUE(s0.ok()) << s0.ToString();
  EXPECT_EQ(root_->Snapshot().head, 2u);
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), v2), "");
}

TEST_F(AgentRankPublishTest, ARankThatNeverSendsLeavesNoVersionAndIsNamed) {
  StartRoot();
  const std::string v1 = NextStep();
  MakeRanks(4, v1);
  ASSERT_TRUE(PublishFromRanks(1, v1, All(), 60000)[0].ok());
  const std::string v2 = NextStep();
  // Rank 2 dies before it sends: ranks 0, 1 and 3 wait out the deadline.
  for (const Status& s : PublishFromRanks(2, v2, {0, 1, 3}, 300)) {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_NE(s.message().find("no part from rank(s) 2 within 300 ms; nothing published"),
              std::string::npos)
        << s.ToString();
  }
  EXPECT_EQ(root_->Snapshot().head, 1u);
  // Everyone again (rank 2 restarted from the same previous view): version 2.
  for (const Status& s : PublishFromRanks(2, v2, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(root_->Snapshot().head, 2u);
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), v2), "");
}

TEST_F(AgentRankPublishTest, UnknownRanksAndOverlappingShardsAreRefused) {
  StartRoot();
  const std::string v1 = NextStep();
  MakeRanks(2, v1);
  auto c = Checkpoint::Open(v1);
  ASSERT_TRUE(c.ok());
  auto part = ranks_[1]->Encode(1, ShardsIn((*c)->view(), RowShards(layout_, 1, 2)));
  ASSERT_TRUE(part.ok());
  RankPart unknown = *part;
  unknown.rank = 5;
  Status s = root_->PublishRankPart(unknown, 1000);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown rank 5 (world size 2)"), std::string::npos) << s.ToString();
  ranks_[1]->Abandon();
  // Rank 1 claims rank 0's last row of the first 2-D tensor too.
  std::vector<RankShardRange> wide = RowShards(layout_, 1, 2);
  const TensorDesc* two_d = nullptr;
  for (const TensorDesc& d : layout_)
    if (d.shape.size() == 2 && d.shape[0] >= 2) {
      two_d = &d;
      break;
    }
  ASSERT_NE(two_d, nullptr);
  for (RankShardRange& r : wide)
    if (r.tensor == two_d->name) {
      r.first_element -= two_d->shape[1];
      r.element_count += two_d->shape[1];
    }
  auto overlapping = RankPublisher::Create(1, 2, layout_, wide);
  ASSERT_TRUE(overlapping.ok());
  ranks_[1] = std::move(overlapping).value();
  std::vector<Status> out;
  {
    // RowShards would not give rank 1 the wide ranges: encode by hand.
    auto p1 = ranks_[1]->Encode(1, ShardsIn((*c)->view(), wide));
    ASSERT_TRUE(p1.ok()) << p1.status().ToString();
    auto p0 = ranks_[0]->Encode(1, ShardsIn((*c)->view(), RowShards(layout_, 0, 2)));
    ASSERT_TRUE(p0.ok());
    auto f = std::async(std::launch::async, [&] { return root_->PublishRankPart(*p0, 60000); });
    out.push_back(root_->PublishRankPart(*p1, 60000));
    out.push_back(f.get());
  }
  for (const Status& e : out) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument) << e.ToString();
    EXPECT_NE(e.message().find("tensor " + two_d->name + ": rank 1's shard"), std::string::npos)
        << e.ToString();
    EXPECT_NE(e.message().find("overlaps rank 0's"), std::string::npos) << e.ToString();
  }
  EXPECT_EQ(root_->Snapshot().head, 0u);
}

TEST_F(AgentRankPublishTest, RecordsThatContradictTheirDigestDeltasAreRefusedBeforeTheRecord) {
  StartRoot();
  const std::string v1 = NextStep();
  MakeRanks(2, v1);
  for (const Status& s : PublishFromRanks(1, v1, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string v2 = NextStep();
  auto c2 = Checkpoint::Open(v2);
  ASSERT_TRUE(c2.ok());
  auto honest = ranks_[1]->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 1, 2)));
  ASSERT_TRUE(honest.ok()) << honest.status().ToString();
  ASSERT_FALSE(honest->records.empty());
  // The same rank from the same previous view, encoding other values of
  // its first changed segment: valid records whose bytes say something
  // else than the honest digest deltas and terms it keeps.
  auto c1 = Checkpoint::Open(v1);
  ASSERT_TRUE(c1.ok());
  RankPublisherOptions o;
  o.segment_elements = 4096;
  auto twin = RankPublisher::Create(1, 2, layout_, RowShards(layout_, 1, 2), o);
  ASSERT_TRUE(twin.ok());
  ASSERT_TRUE((*twin)->Encode(1, ShardsIn((*c1)->view(), RowShards(layout_, 1, 2))).ok());
  ASSERT_TRUE((*twin)->Committed().ok());
  const SegmentRecord& first = honest->records.front();
  const TensorDesc& d = layout_[first.tensor_index];
  const TensorRef* t = (*c2)->view().Find(d.name);
  std::vector<uint8_t> altered(t->data, t->data + d.bytes());
  altered[first.first_element * ElementBits(d.dtype) / 8] ^= 0x40;  // inside the changed segment
  std::vector<RankShard> shards = ShardsIn((*c2)->view(), RowShards(layout_, 1, 2));
  for (RankShard& s : shards)
    if (s.range.tensor == d.name)
      s.data = altered.data() + s.range.first_element * ElementBits(d.dtype) / 8;
  auto lie = (*twin)->Encode(2, shards);
  ASSERT_TRUE(lie.ok()) << lie.status().ToString();
  RankPart forged = *honest;
  bool swapped = false;
  for (const SegmentRecord& r : lie->records)
    if (r.tensor_index == first.tensor_index && r.first_element == first.first_element) {
      ASSERT_NE(r.bytes, forged.records.front().bytes);
      forged.records.front().bytes = r.bytes;
      swapped = true;
    }
  ASSERT_TRUE(swapped);
  auto p0 = ranks_[0]->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 0, 2)));
  ASSERT_TRUE(p0.ok());
  auto f = std::async(std::launch::async, [&] { return root_->PublishRankPart(*p0, 60000); });
  const Status s1 = root_->PublishRankPart(forged, 60000);
  const Status s0 = f.get();
  for (const Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("rank 1's records do not decode to the digest deltas they claim"),
              std::string::npos)
        << s.ToString();
  }
  // Nothing was recorded: HEAD and the root's view are still version 1's,
  // and the honest parts publish version 2.
  EXPECT_EQ(root_->Snapshot().head, 1u);
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), v1), "");
  ranks_[0]->Abandon();
  ranks_[1]->Abandon();
  for (const Status& s : PublishFromRanks(2, v2, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), v2), "");
}

// Ranks whose processes restart fetch their base from the root itself
// (GET /view/rows; FetchRankBase): no member's slot is read. Rank 1 dies
// while the root gathers version 2 and resumes it from HEAD's bytes the
// root sent; rank 0 dies between versions and rebases before version 3.
// Each fetch is many small pieces. A wrong token and a member's admin port
// are refused, and a refused fetch leaves the publisher at the zero view.
TEST_F(AgentRankPublishTest, RestartedRanksFetchTheirBaseFromTheRoot) {
  tweak_ = [](AgentOptions& o) {
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "rank-token";
  };
  StartRoot();
  StartMember("a", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  AgentClientOptions client;
  client.token = "rank-token";
  client.timeout_ms = 60000;
  const std::string admin = root_->Snapshot().admin_address;
  const std::string v1 = NextStep();
  MakeRanks(2, v1);
  auto fresh = [&](uint32_t r) {
    RankPublisherOptions o;
    o.segment_elements = 4096;
    auto p = RankPublisher::Create(r, 2, layout_, RowShards(layout_, r, 2), o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  };
  // An empty board: the zero view a new publisher holds is HEAD's.
  auto early = fresh(1);
  auto none = FetchRankBase(admin, *early, client);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, 0u);
  for (const Status& s : PublishFromRanks(1, v1, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();

  // Refusals leave the publisher as it was.
  auto refused = fresh(1);
  AgentClientOptions wrong = client;
  wrong.token = "not-the-token";
  auto bad = FetchRankBase(admin, *refused, wrong);
  EXPECT_EQ(bad.status().code(), Code::kAuth) << bad.status().ToString();
  auto member = FetchRankBase(members_["a"].agent->Snapshot().admin_address, *refused, client);
  EXPECT_EQ(member.status().code(), Code::kInvalidArgument) << member.status().ToString();
  EXPECT_NE(member.status().message().find("is not a root's admin port"), std::string::npos)
      << member.status().ToString();
  EXPECT_EQ(refused->version(), 0u);
  auto used = FetchRankBase(admin, *ranks_[0], client);  // it committed version 1
  EXPECT_EQ(used.status().code(), Code::kMismatch) << used.status().ToString();

  // Version 2: rank 0's part waits at the root; rank 1 comes back, fetches
  // version 1's rows in 16 KiB pieces and resumes.
  const std::string v2 = NextStep();
  auto c2 = Checkpoint::Open(v2);
  ASSERT_TRUE(c2.ok());
  auto rank0 = std::async(std::launch::async, [&] {
    auto part = ranks_[0]->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 0, 2)));
    if (!part.ok()) return part.status();
    Status s = root_->PublishRankPart(std::move(part).value(), 60000);
    if (s.ok())
      s = ranks_[0]->Committed();
    else
      ranks_[0]->Abandon();
    return s;
  });
  ranks_[1] = fresh(1);
  auto base = agent::FetchRankBaseInPieces(admin, *ranks_[1], client, 16 << 10);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  EXPECT_EQ(*base, 1u);
  EXPECT_EQ(ranks_[1]->version(), 1u);
  auto part = ranks_[1]->Encode(2, ShardsIn((*c2)->view(), RowShards(layout_, 1, 2)));
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  auto bytes = EncodeRankPart(*part);
  ASSERT_TRUE(bytes.ok());
  Status resumed;
  for (int i = 0; i < 1500; ++i) {  // until rank 0's part is being gathered
    resumed = ResumeRankPart(admin, *bytes, 2, 1, 60000, client);
    if (resumed.message().find("not being gathered") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(resumed.ok()) << resumed.ToString();
  ASSERT_TRUE(ranks_[1]->Committed().ok());
  ASSERT_TRUE(rank0.get().ok());
  EXPECT_EQ(root_->Snapshot().head, 2u);

  // Rank 0 restarts between versions: it rebases, and version 3 commits
  // from both ranks and reaches the member bit for bit.
  ranks_[0] = fresh(0);
  auto head = agent::FetchRankBaseInPieces(admin, *ranks_[0], client, 16 << 10);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(*head, 2u);
  const std::string v3 = NextStep();
  for (const Status& s : PublishFromRanks(3, v3, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
}

// A fetch while the root publishes (its view is about to change) is
// answered 503 and asked again until the client's deadline, then fails
// saying so, leaving the publisher untouched; once the publish ends the
// same fetch returns the new HEAD.
TEST_F(AgentRankPublishTest, AFetchDuringALongPublishWaitsThenSaysTheRootWasPublishing) {
  held_env_ = std::make_unique<HeldPublishEnv>(DefaultEnv());
  HeldPublishEnv* env = held_env_.get();
  tweak_ = [env](AgentOptions& o) {
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "rank-token";
    o.env = env;
  };
  StartRoot();
  const std::string v1 = NextStep();
  MakeRanks(2, v1);
  for (const Status& s : PublishFromRanks(1, v1, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string admin = root_->Snapshot().admin_address;
  env->Close();
  const std::string v2 = NextStep();
  auto publish = std::async(std::launch::async, [&] { return root_->Publish(v2, 2); });
  // Destroyed before `publish`, whose destructor waits for the publish: a
  // failed assertion below must not leave it held.
  struct OpenAtExit {
    HeldPublishEnv* env;
    ~OpenAtExit() { env->Open(); }
  } open_at_exit{env};
  ASSERT_TRUE(WaitFor([&] { return env->held(); }, 60)) << "the publish never reached its sync";
  AgentClientOptions client;
  client.token = "rank-token";
  client.timeout_ms = 2500;  // past the root's 1 s wait for its lock, twice
  auto p = RankPublisher::Create(0, 2, layout_, RowShards(layout_, 0, 2), {});
  ASSERT_TRUE(p.ok());
  auto busy = FetchRankBase(admin, **p, client);
  EXPECT_EQ(busy.status().code(), Code::kTimeout) << busy.status().ToString();
  EXPECT_NE(
      busy.status().message().find("the root was publishing a version within the client's 2500 ms"),
      std::string::npos)
      << busy.status().ToString();
  EXPECT_EQ((*p)->version(), 0u);
  env->Open();
  ASSERT_TRUE(publish.get().ok());
  client.timeout_ms = 60000;
  auto head = FetchRankBase(admin, **p, client);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(*head, 2u);
  // Its bytes are version 2's: the root takes them as rank 0's base.
  ranks_[0] = std::move(p).value();
  auto p1 = RankPublisher::Create(1, 2, layout_, RowShards(layout_, 1, 2), {});
  ASSERT_TRUE(p1.ok());
  ASSERT_TRUE(FetchRankBase(admin, **p1, client).ok());
  ranks_[1] = std::move(p1).value();
  const std::string v3 = NextStep();
  for (const Status& s : PublishFromRanks(3, v3, All(), 60000)) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), v3), "");
}

}  // namespace
}  // namespace tern

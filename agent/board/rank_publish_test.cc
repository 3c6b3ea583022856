// Publishing from ranks (include/tern/rank_publish.h): 2 and 4 ranks, each
// owning row shards, encode their parts; the assembled patch takes the
// previous view to the next bit for bit (first version: from zeros, a
// keyframe) with the whole view's digest; every bad part set is refused
// with a message naming the rank and the tensor.
#include "tern/rank_publish.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "agent/board/rank_publish_testing.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

struct Model {
  std::vector<TensorDesc> layout{{"a.weight", DType::kBF16, {64, 48}},
                                 {"b.bias", DType::kF32, {100}},
                                 {"c.weight", DType::kF8E4M3, {32, 16}}};
  std::vector<std::vector<uint8_t>> bytes;

  explicit Model(uint32_t seed) {
    std::mt19937 rng(seed);
    for (const TensorDesc& d : layout) {
      bytes.emplace_back(d.bytes());
      for (auto& b : bytes.back()) b = static_cast<uint8_t>(rng());
    }
  }
  // ~1% of bytes flipped in their low bit.
  void Step(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& t : bytes)
      for (auto& b : t)
        if (rng() % 100 == 0) b ^= 1;
  }
  MutableServeView View() {
    MutableServeView v;
    for (size_t i = 0; i < layout.size(); ++i) v.tensors.push_back({&layout[i], bytes[i].data()});
    return v;
  }
};

// Rank r of `world` owns rows [r*64/world, (r+1)*64/world) of a.weight, the
// same share of c.weight's rows, and rank 0 all of b.bias.
std::vector<RankShardRange> ShardsOf(uint32_t r, uint32_t world) {
  std::vector<RankShardRange> s;
  s.push_back({"a.weight", uint64_t{r} * 64 / world * 48, uint64_t{64} / world * 48});
  s.push_back({"c.weight", uint64_t{r} * 32 / world * 16, uint64_t{32} / world * 16});
  if (r == 0) s.push_back({"b.bias", 0, 100});
  return s;
}

std::vector<RankShard> CurrentShards(const Model& m, const std::vector<RankShardRange>& ranges) {
  std::vector<RankShard> out;
  for (const RankShardRange& r : ranges) {
    size_t t = 0;
    while (m.layout[t].name != r.tensor) ++t;
    const uint64_t esize = static_cast<uint64_t>(ElementBits(m.layout[t].dtype)) / 8;
    out.push_back({r, m.bytes[t].data() + r.first_element * esize, r.element_count * esize});
  }
  return out;
}

class RankPublishTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    world_ = GetParam();
    for (uint32_t r = 0; r < world_; ++r) {
      RankPublisherOptions o;
      o.segment_elements = 500;  // several segments per shard
      auto p = RankPublisher::Create(r, world_, model_.layout, ShardsOf(r, world_), o);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      ranks_.push_back(std::move(p).value());
    }
  }
  std::vector<RankPart> Parts(uint64_t version) {
    std::vector<RankPart> parts;
    for (uint32_t r = 0; r < world_; ++r) {
      auto part = ranks_[r]->Encode(version, CurrentShards(model_, ShardsOf(r, world_)));
      EXPECT_TRUE(part.ok()) << part.status().ToString();
      if (part.ok()) parts.push_back(std::move(part).value());
    }
    return parts;
  }
  Status Assemble(uint64_t base, uint64_t version, const ViewDigest& base_digest,
                  const std::vector<RankPart>& parts) {
    return AssembleRankParts(model_.layout, base, version, base_digest, parts, world_, nullptr)
        .status();
  }

  uint32_t world_ = 0;
  Model model_{1};
  ThreadPool pool_{1};
  std::vector<std::unique_ptr<RankPublisher>> ranks_;
};

TEST_P(RankPublishTest, PartsAssembleIntoTheWholeViewsPatch) {
  Model root(1);  // the root's view: zeros until the first version
  for (auto& t : root.bytes) std::fill(t.begin(), t.end(), uint8_t{0});
  MutableServeView root_view = root.View();
  ViewDigest root_digest = ZeroViewDigest(model_.layout);
  ASSERT_EQ(root_digest, ComputeDigest(AsConst(root_view), pool_));
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model_.Step(static_cast<uint32_t>(v));
    std::vector<RankPart> parts = Parts(v);
    ASSERT_EQ(parts.size(), world_);
    ViewDigest target;
    auto patch = AssembleRankParts(model_.layout, v - 1, v, root_digest, parts, world_, &target);
    ASSERT_TRUE(patch.ok()) << patch.status().ToString();
    EXPECT_EQ(target, ComputeDigest(AsConst(model_.View()), pool_)) << "v" << v;
    ViewDigest applied;
    ASSERT_TRUE(Apply(root_view, *patch, root_digest, pool_, &applied).ok());
    EXPECT_EQ(applied, target);
    EXPECT_EQ(root.bytes, model_.bytes) << "v" << v;
    root_digest = applied;
    for (auto& r : ranks_) ASSERT_TRUE(r->Committed().ok());
    if (v > 1) {
      EXPECT_LT(patch->size(), model_.View().total_bytes() / 4) << "a sparse patch";
    }
  }
}

TEST_P(RankPublishTest, RefusesBadPartSetsNamingTheRankAndTensor) {
  const ViewDigest zero = ZeroViewDigest(model_.layout);
  const std::vector<RankPart> good = Parts(1);
  ASSERT_TRUE(Assemble(0, 1, zero, good).ok());
  auto refused = [&](const std::vector<RankPart>& parts, Code code, const std::string& part) {
    Status s = Assemble(0, 1, zero, parts);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString() << " lacks: " << part;
  };
  auto parts = good;
  parts.back().rank = world_ + 3;
  refused(parts, Code::kInvalidArgument, "unknown rank " + std::to_string(world_ + 3));
  parts = good;
  parts.back().rank = 0;
  refused(parts, Code::kInvalidArgument, "rank 0 sent two parts");
  parts = good;
  parts.pop_back();
  refused(parts, Code::kInvalidArgument, "parts for a world of");
  // Rank 1 claims a row of rank 0's a.weight: an overlap.
  parts = good;
  parts[1].shards[0].first_element -= 48;
  parts[1].shards[0].element_count += 48;
  refused(parts, Code::kInvalidArgument, "tensor a.weight: rank 1's shard");
  // Rank 1 drops its first row (and, to be consistent, every change):
  // elements nobody owns.
  parts = good;
  parts[1].shards[0].first_element += 48;
  parts[1].shards[0].element_count -= 48;
  parts[1].records.clear();
  parts[1].target_terms = parts[1].base_terms;
  refused(parts, Code::kInvalidArgument, "a.weight: elements");
  parts = good;
  parts[1].shards[0].tensor = "z.unknown";
  refused(parts, Code::kInvalidArgument, "rank 1: tensor z.unknown is not in the layout");
  parts = good;
  parts[1].layout[1].dtype = DType::kF16;
  refused(parts, Code::kMismatch, "rank 1's layout differs from the served one at tensor b.bias");
  parts = good;
  parts[1].base_terms.lanes[0] += 1;
  parts[1].target_terms.lanes[0] += 1;
  refused(parts, Code::kMismatch, "previous view is not the root's");
  parts = good;
  parts[1].target_terms.lanes[2] += 1;
  refused(parts, Code::kMismatch, "rank 1's segments do not take");
  parts = good;
  parts[1].version = 2;
  refused(parts, Code::kInvalidArgument, "rank 1's part is 0 -> 2");
  parts = good;
  ASSERT_FALSE(parts[1].records.empty());
  parts[1].records[0].first_element = 0;  // rank 0's rows
  parts[1].records[0].tensor_index = 0;
  refused(parts, Code::kInvalidArgument, "rank 1's segment");
}

TEST(RankPublisherTest, RefusesBadShards) {
  Model m(2);
  EXPECT_EQ(RankPublisher::Create(2, 2, m.layout, ShardsOf(0, 2)).status().code(),
            Code::kInvalidArgument);
  EXPECT_NE(RankPublisher::Create(0, 2, m.layout, {{"nope", 0, 1}}).status().message().find(
                "tensor nope is not in the layout"),
            std::string::npos);
  EXPECT_NE(RankPublisher::Create(0, 2, m.layout, {{"b.bias", 90, 20}}).status().message().find(
                "outside its 100 elements"),
            std::string::npos);
  EXPECT_NE(RankPublisher::Create(0, 2, m.layout, {{"b.bias", 0, 50}, {"b.bias", 40, 20}})
                .status()
                .message()
                .find("overlap"),
            std::string::npos);
  auto p = RankPublisher::Create(0, 2, m.layout, ShardsOf(0, 2));
  ASSERT_TRUE(p.ok());
  auto shards = CurrentShards(m, ShardsOf(0, 2));
  shards[0].bytes -= 2;
  EXPECT_NE((*p)->Encode(1, shards).status().message().find("bytes"), std::string::npos);
  shards = CurrentShards(m, ShardsOf(0, 2));
  shards[0].range.first_element += 48;
  EXPECT_NE((*p)->Encode(1, shards).status().message().find("is not one it owns"), std::string::npos);
  shards = CurrentShards(m, ShardsOf(0, 2));
  ASSERT_TRUE((*p)->Encode(1, shards).ok());
  (*p)->Abandon();
  EXPECT_EQ((*p)->version(), 0u);
  ASSERT_TRUE((*p)->Encode(1, shards).ok());
  ASSERT_TRUE((*p)->Committed().ok());
  EXPECT_EQ((*p)->version(), 1u);
  EXPECT_EQ((*p)->Encode(1, shards).status().code(), Code::kMismatch);
}

// A commit whose own records cannot be applied (no input does this: a bug
// or an allocation failure would) leaves a publisher whose previous view
// may be half advanced: every call is refused with one error that says
// what to do, Resume included, and a new publisher resumes from HEAD.
TEST(RankPublisherTest, AFailedCommitRefusesEveryCallAfterIt) {
  Model m(3);
  const std::vector<RankShardRange> owned = ShardsOf(0, 1);
  auto p = RankPublisher::Create(0, 1, m.layout, owned);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE((*p)->Encode(1, CurrentShards(m, owned)).ok());
  ASSERT_TRUE((*p)->Committed().ok());
  const Model v1 = m;
  m.Step(4);
  ASSERT_TRUE((*p)->Encode(2, CurrentShards(m, owned)).ok());
  RankPublisherTestPeer::DamagePendingRecords(**p);
  const Status failed = (*p)->Committed();
  ASSERT_EQ(failed.code(), Code::kInternal) << failed.ToString();
  EXPECT_NE(failed.message().find("rank 0: its previous view could not be advanced to version 2"),
            std::string::npos)
      << failed.message();
  EXPECT_NE(failed.message().find("create a new publisher and Resume it"), std::string::npos);
  EXPECT_EQ((*p)->version(), 1u);
  auto same = [&](const Status& s) {
    return s.code() == failed.code() && s.message() == failed.message();
  };
  m.Step(5);
  EXPECT_TRUE(same((*p)->Encode(3, CurrentShards(m, owned)).status()));
  EXPECT_TRUE(same((*p)->Committed()));
  EXPECT_TRUE(same((*p)->Resume(1, CurrentShards(v1, owned))));
  // What the message says to do: a new publisher resumed from HEAD (1).
  auto fresh = RankPublisher::Create(0, 1, m.layout, owned);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->Resume(1, CurrentShards(v1, owned)).ok());
  auto part = (*fresh)->Encode(2, CurrentShards(m, owned));
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_TRUE((*fresh)->Committed().ok());
  EXPECT_EQ((*fresh)->version(), 2u);
}

// The last rank's process restarts after version 1 committed: a new
// publisher starts from zeros, whose part the root refuses (its terms are
// not HEAD's); resumed from HEAD's bytes of its shards (what a member
// serves), its part of version 2 assembles with the others' bit for bit.
TEST_P(RankPublishTest, ARestartedRankResumesFromHeadsBytes) {
  Model root(1);
  for (auto& t : root.bytes) std::fill(t.begin(), t.end(), uint8_t{0});
  MutableServeView root_view = root.View();
  ViewDigest head = ZeroViewDigest(model_.layout);
  auto v1 = AssembleRankParts(model_.layout, 0, 1, head, Parts(1), world_, nullptr);
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  ASSERT_TRUE(Apply(root_view, *v1, head, pool_, &head).ok());
  for (auto& r : ranks_) ASSERT_TRUE(r->Committed().ok());

  const uint32_t last = world_ - 1;
  RankPublisherOptions o;
  o.segment_elements = 500;
  auto fresh = RankPublisher::Create(last, world_, model_.layout, ShardsOf(last, world_), o);
  ASSERT_TRUE(fresh.ok());
  ranks_[last] = std::move(fresh).value();
  model_.Step(2);
  std::vector<RankPart> parts = Parts(2);
  ASSERT_EQ(parts.size(), world_);
  EXPECT_EQ(parts[last].base_version, 0u);
  Status s = Assemble(1, 2, head, parts);
  EXPECT_FALSE(s.ok()) << "a restarted rank's zero view is not HEAD's";

  // HEAD's bytes of its shards, as the root (or a member) serves them.
  ASSERT_TRUE(ranks_[last]->Resume(1, CurrentShards(root, ShardsOf(last, world_))).ok());
  EXPECT_EQ(ranks_[last]->version(), 1u);
  auto resumed = ranks_[last]->Encode(2, CurrentShards(model_, ShardsOf(last, world_)));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  parts[last] = std::move(resumed).value();
  ViewDigest target;
  auto v2 = AssembleRankParts(model_.layout, 1, 2, head, parts, world_, &target);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  ASSERT_TRUE(Apply(root_view, *v2, head, pool_, &head).ok());
  EXPECT_EQ(head, target);
  EXPECT_EQ(root.bytes, model_.bytes);
  ASSERT_TRUE(ranks_[last]->Committed().ok());
  EXPECT_EQ(ranks_[last]->version(), 2u);

  // Only a publisher that has committed nothing resumes; bad input is named.
  s = ranks_[last]->Resume(2, CurrentShards(model_, ShardsOf(last, world_)));
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_NE(s.message().find("send its parts as usual"), std::string::npos) << s.ToString();
  auto another = RankPublisher::Create(last, world_, model_.layout, ShardsOf(last, world_), o);
  ASSERT_TRUE(another.ok());
  s = (*another)->Resume(0, CurrentShards(model_, ShardsOf(last, world_)));
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  std::vector<RankShard> short_base = CurrentShards(model_, ShardsOf(last, world_));
  short_base[0].bytes -= 1;
  s = (*another)->Resume(2, short_base);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(short_base[0].range.tensor), std::string::npos) << s.ToString();
  EXPECT_EQ((*another)->version(), 0u) << "a refused resume changes nothing";
}

INSTANTIATE_TEST_SUITE_P(Ranks, RankPublishTest, ::testing::Values(2u, 4u));

}  // namespace
}  // namespace tern

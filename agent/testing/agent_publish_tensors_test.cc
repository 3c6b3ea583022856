// Publishing from memory (Agent::PublishTensors) end to end: versions
// published from the caller's buffers reach members bit for bit as the same
// steps published from checkpoint files do, mixed with checkpoint publishes,
// across keyframes and a member's catch-up; a bad set of tensors publishes
// nothing and says which tensor is wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/digest.h"

namespace tern {
namespace {

using agent_test::WaitFor;

class AgentPublishTensorsTest : public agent_test::AgentSystemFixture {
 protected:
  // The trace's next step, published from a private copy of its bytes in
  // memory (the checkpoint file is kept only to compare against).
  Status PublishFromMemory(uint64_t version) {
    const std::string path = NextStep();
    EXPECT_EQ(gen_->step(), version);
    auto ckpt = Checkpoint::Open(path);
    if (!ckpt.ok()) return ckpt.status();
    std::vector<std::vector<uint8_t>> copies;
    std::vector<PublishTensor> tensors;
    for (const auto& t : (*ckpt)->view().tensors) {
      copies.emplace_back(t.data, t.data + t.desc->bytes());
      tensors.push_back({t.desc->name, t.desc->dtype, t.desc->shape, copies.back().data(),
                         copies.back().size()});
    }
    ckpt->reset();  // nothing of the file is mapped while it publishes
    return root_->PublishTensors(version, tensors);
  }

  ViewDigest DigestOf(const std::string& path) {
    auto c = Checkpoint::Open(path);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? ComputeDigest((*c)->view(), pool_) : ViewDigest{};
  }
};

TEST_F(AgentPublishTensorsTest, ReachMembersBitwiseAcrossKeyframesAndCatchUp) {
  StartRoot();
  StartMember("a", "us");
  StartMember("b", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  // keyframe_every is 4: versions 4 and 8 carry keyframes. Versions 3 and 6
  // come from checkpoint files, the rest from memory, version 1 included.
  for (uint64_t v = 1; v <= 9; ++v) {
    if (v == 3 || v == 6) {
      Publish(v);
    } else {
      Status s = PublishFromMemory(v);
      ASSERT_TRUE(s.ok()) << "v" << v << ": " << s.ToString();
    }
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
    ExpectBitwiseEqual(v);
    EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), steps_[v]), "")
        << "the root's own view at v" << v;
    EXPECT_EQ(root_->Snapshot().served_digest, DigestOf(steps_[v])) << "v" << v;
    if (v == 4) StopMember("b");  // away for versions 5..9
  }
  const AgentSnapshot snap = root_->Snapshot();
  ASSERT_FALSE(snap.versions.empty());
  EXPECT_GT(snap.versions.back().patch_bytes, 0u);
  // b comes back behind, c is new: both catch up from a board whose root
  // never read a checkpoint file for most of its versions.
  StartMember("b", "eu");
  StartMember("c", "ap");
  ASSERT_TRUE(AllServe(9)) << Lagging(9);
  ExpectBitwiseEqual(9);
  ASSERT_TRUE(PublishFromMemory(10).ok());
  ASSERT_TRUE(AllServe(10)) << Lagging(10);
  ExpectBitwiseEqual(10);
}

TEST_F(AgentPublishTensorsTest, ABadTensorPublishesNothingAndSaysWhich) {
  StartRoot();
  ASSERT_TRUE(PublishFromMemory(1).ok());
  auto ckpt = Checkpoint::Open(NextStep());
  ASSERT_TRUE(ckpt.ok());
  std::vector<PublishTensor> good;
  for (const auto& t : (*ckpt)->view().tensors)
    good.push_back({t.desc->name, t.desc->dtype, t.desc->shape, t.data, t.desc->bytes()});
  ASSERT_GE(good.size(), 2u);
  const std::string name = good[1].name;
  auto refused = [&](std::vector<PublishTensor> tensors, Code code, const std::string& part) {
    Status s = root_->PublishTensors(2, tensors);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(part), std::string::npos) << s.ToString() << " lacks " << part;
    EXPECT_EQ(root_->Snapshot().head, 1u);
  };
  auto t = good;
  t[1].dtype = t[1].dtype == DType::kF32 ? DType::kI32 : DType::kF32;
  t[1].bytes = DTypeBytes(t[1].dtype, (*ckpt)->view().tensors[1].desc->elements());
  refused(t, Code::kMismatch, "tensor " + name + " is ");
  t = good;
  t[1].shape.insert(t[1].shape.begin(), 1);  // same bytes, another shape
  refused(t, Code::kMismatch, "tensor " + name + " has shape");
  t = good;
  t.erase(t.begin() + 1);
  refused(t, Code::kMismatch, "tensor " + name + " of the served layout is missing");
  t = good;
  t.push_back({"not.a.tensor", DType::kU8, {1}, good[0].data, 1});
  refused(t, Code::kMismatch, "tensor not.a.tensor is not in the served layout");
  t = good;
  t[1].data = nullptr;
  refused(t, Code::kInvalidArgument, "tensor " + name + " has a null data pointer");
  Status stale = root_->PublishTensors(1, good);
  EXPECT_EQ(stale.code(), Code::kInvalidArgument) << stale.ToString();
  // The same tensors, right this time, publish.
  Status s = root_->PublishTensors(2, good);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(root_->Snapshot().head, 2u);
  EXPECT_EQ(agent_test::FirstDifference((dir_ / "root" / "current").string(), steps_[2]), "");
  // Only the root publishes.
  StartMember("a", "us");
  Status member = members_["a"].agent->PublishTensors(3, good);
  EXPECT_EQ(member.code(), Code::kInvalidArgument) << member.ToString();
}

}  // namespace
}  // namespace tern

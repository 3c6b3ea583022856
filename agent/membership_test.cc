#include "agent/membership.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tern::agent {
namespace {

MemberInfo Info(const std::string& id, const std::string& region, double up = 1e9) {
  MemberInfo m;
  m.id = id;
  m.region = region;
  m.data_address = id + ":1";
  m.uplink_bytes_per_s = up;
  m.downlink_bytes_per_s = 1e9;
  return m;
}

topology::PlanOptions Options(uint32_t fanout = 2, uint32_t stripes = 1) {
  topology::PlanOptions o;
  o.fanout_max = fanout;
  o.root_fanout_max = 2;
  o.stripes = stripes;
  return o;
}

TEST(Membership, JoinTellsTheNewMemberItsParentsWithAddresses) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  EXPECT_EQ(notify, std::vector<std::string>{"a"});
  auto p = m.ParentsOf("a");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->parents.size(), 1u);
  EXPECT_EQ(p->parents[0].id, "root");
  EXPECT_EQ(p->parents[0].data_address, "root:1");

  notify.clear();
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  p = m.ParentsOf("b");
  ASSERT_TRUE(p.ok());
  // Region-aware: the second eu member hangs below the first, not the root.
  EXPECT_EQ(p->parents[0].id, "a");
  EXPECT_EQ(p->parents[0].data_address, "a:1");
  EXPECT_EQ(m.DepthOf("b"), 2u);
}

TEST(Membership, SecondJoinWithTheSameIdIsRefused) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  EXPECT_EQ(m.Join(Info("a", "us"), 0, 0, &notify).code(), Code::kAlreadyExists);
  EXPECT_EQ(m.Join(Info("root", "us"), 0, 0, &notify).code(), Code::kInvalidArgument);
  EXPECT_EQ(m.members().size(), 1u);
}

TEST(Membership, LeaveReattachesOnlyTheOrphans) {
  Membership m(Info("root", "us"), Options(2), 1000);
  std::vector<std::string> notify;
  for (auto id : {"a", "b", "c", "d", "e"}) ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  auto pa = m.ParentsOf("a");
  ASSERT_TRUE(pa.ok());
  ASSERT_EQ(pa->parents[0].id, "root");
  std::vector<std::string> orphans;
  for (const auto& [id, rec] : m.members()) {
    auto p = m.ParentsOf(id);
    if (p.ok() && p->parents[0].id == "a") orphans.push_back(id);
  }
  ASSERT_FALSE(orphans.empty());
  const uint64_t epoch = m.epoch();
  notify.clear();
  m.Leave("a", &notify);
  EXPECT_GT(m.epoch(), epoch);
  std::sort(notify.begin(), notify.end());
  EXPECT_EQ(notify, orphans);  // exactly a's children, nobody else
  EXPECT_FALSE(m.Has("a"));
  for (const auto& id : orphans) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok());
    EXPECT_NE(p->parents[0].id, "a");
  }
  EXPECT_TRUE(topology::Validate(m.plan()).ok());
}

TEST(Membership, SilentMembersAreReportedAfterTheDeadline) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  Heartbeat hb;
  hb.served_version = 7;
  ASSERT_TRUE(m.Heartbeat("b", hb, 900).ok());
  EXPECT_TRUE(m.Silent(1000).empty());
  EXPECT_EQ(m.Silent(1001), std::vector<std::string>{"a"});
  EXPECT_EQ(m.members().at("b").served_version, 7u);
  EXPECT_EQ(m.Heartbeat("zz", hb, 1).code(), Code::kNotFound);
}

TEST(Membership, StripedPlansGiveOneParentPerStripe) {
  Membership m(Info("root", "us"), Options(2, 2), 1000);
  std::vector<std::string> notify;
  for (auto id : {"a", "b", "c", "d"}) ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  for (auto id : {"a", "b", "c", "d"}) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->parents.size(), 2u);
    EXPECT_EQ(p->parents[1].stripe, 1u);
  }
}

TEST(Membership, BadPlanOptionsAreReportedByJoin) {
  Membership m(Info("root", "us"), Options(0), 1000);
  std::vector<std::string> notify;
  EXPECT_EQ(m.Join(Info("a", "eu"), 0, 0, &notify).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern::agent

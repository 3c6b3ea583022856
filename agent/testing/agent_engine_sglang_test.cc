// The agent drives an SGLang engine beside a member (docs/engines.md,
// "SGLang"). The engine here is SglangDouble (agent/engine/sglang_double.h),
// a TEST DOUBLE of SGLang's documented HTTP API, labelled as such in every
// test name: it loads nothing. No real SGLang runs in these tests (it needs
// a GPU machine).
#include <nlohmann/json.hpp>

#include "agent/engine/sglang_double.h"
#include "agent/testing/agent_test_fixture.h"

namespace tern::agent_test {
namespace {

using agent::testing::SglangDouble;
using agent::testing::SglangFault;

class SglangDoubleAgentEngineTest : public AgentSystemFixture {
 protected:
  // Member "m1" drives `engine_`; everyone logs into log_.
  void Setup(uint32_t attempts = 2, uint32_t update_timeout_ms = 5000) {
    CaptureLogs([this, attempts, update_timeout_ms](AgentOptions& o) {
      if (o.id != "m1") return;
      o.engine = "sglang";
      o.engine_url = engine_.url();
      o.engine_attempts = attempts;
      o.engine_update_timeout_ms = update_timeout_ms;
    });
  }
  std::string CurrentSlot(const std::string& name) {
    return fs::canonical(members_[name].dir + "/current").string();
  }

  SglangDouble engine_;
};

TEST_F(SglangDoubleAgentEngineTest, PublishedVersionsReachTheEngineFromTheServedSlot) {
  Setup();
  StartRoot();
  StartMember("m1", "us");
  StartMember("m2", "us");  // no engine: unaffected
  for (uint64_t v = 1; v <= 3; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
    ASSERT_TRUE(EngineServes("m1", v)) << EngineOf("m1").last_error;
    EXPECT_EQ(engine_.weight_version(), std::to_string(v));
    // SGLang reloads the model path whole: the slot DIR/current points at.
    auto body = nlohmann::json::parse(engine_.last_update());
    EXPECT_EQ(std::string(body["model_path"]), CurrentSlot("m1")) << "version " << v;
    EXPECT_EQ(body["weight_version"], std::to_string(v));
    EXPECT_FALSE(body.contains("changed"));
    EXPECT_FALSE(engine_.paused()) << "the engine was left paused";
  }
  EXPECT_EQ(engine_.pause_mode(), "in_place");  // the default policy, keep
  const AgentEngineStatus e = EngineOf("m1");
  EXPECT_EQ(e.engine, "sglang");
  EXPECT_EQ(e.state, "serving");
  EXPECT_EQ(e.updates_failed, 0u);
  EXPECT_TRUE(e.last_full);
  // GET /status's "engine" names the version the engine serves beside the
  // member's.
  auto json = nlohmann::json::parse(AgentSnapshotJson(members_["m1"].agent->Snapshot()));
  EXPECT_EQ(json["engine"]["engine"], "sglang");
  EXPECT_EQ(json["engine"]["version"], 3);
  EXPECT_EQ(json["served_version"], 3);
  EXPECT_FALSE(members_["m2"].agent->Snapshot().has_engine);
  ExpectBitwiseEqual(3);
}

TEST_F(SglangDoubleAgentEngineTest, AFailedUpdateLeavesTheOldVersionSaysSoAndIsRetried) {
  Setup(/*attempts=*/1);
  StartRoot();
  StartMember("m1", "us");
  Publish(1);
  ASSERT_TRUE(EngineServes("m1", 1)) << EngineOf("m1").last_error;
  // SGLang fails the load ({"success": false}) and rolls back, three times:
  // the driver's backoffs (1, 2, 4 s) leave the engine on version 1 for
  // about 7 s, so the checks below hold on a machine too loaded to make
  // them within the first second.
  engine_.Inject("/update_weights_from_disk", SglangFault::kFail, 3);
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ASSERT_TRUE(WaitFor([&] { return EngineOf("m1").updates_failed >= 1; }, 30));
  AgentEngineStatus e = EngineOf("m1");
  EXPECT_EQ(e.version, 1u) << "the engine stays on its old version";
  EXPECT_EQ(engine_.weight_version(), "1");
  EXPECT_EQ(e.target_version, 2u);
  EXPECT_NE(e.last_error.find("Rolling back"), std::string::npos) << e.last_error;
  EXPECT_FALSE(engine_.paused()) << "a failed update must continue the engine";
  EXPECT_GE(Logged("m1", "engine: version 2 not loaded"), 1u);
  // Retried after each backoff, then served.
  ASSERT_TRUE(EngineServes("m1", 2)) << EngineOf("m1").last_error;
  auto json = nlohmann::json::parse(AgentSnapshotJson(members_["m1"].agent->Snapshot()));
  EXPECT_EQ(json["engine"]["version"], 2);
  EXPECT_EQ(json["engine"]["updates_failed"], 3);
}

// An engine that hangs mid-update: the update's deadline detects it, the
// failure is reported, and the member goes on receiving, serving and
// relaying versions meanwhile.
TEST_F(SglangDoubleAgentEngineTest, AHungEngineMeetsTheDeadlineAndTheTreeKeepsServing) {
  Setup(/*attempts=*/1, /*update_timeout_ms=*/800);
  StartRoot();
  StartMember("m1", "us");
  StartMember("m2", "us");
  Publish(1);
  ASSERT_TRUE(EngineServes("m1", 1)) << EngineOf("m1").last_error;
  engine_.set_hang_ms(20000);
  engine_.Inject("/update_weights_from_disk", SglangFault::kHang, 2);
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  Publish(3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);  // the tree did not wait for the engine
  ASSERT_TRUE(WaitFor([&] { return EngineOf("m1").updates_failed >= 1; }, 30));
  AgentEngineStatus e = EngineOf("m1");
  EXPECT_NE(e.last_error.find("no reply within 800 ms"), std::string::npos) << e.last_error;
  EXPECT_EQ(e.version, 1u);
  // Both hangs spent, the engine answers again and gets the newest version.
  ASSERT_TRUE(EngineServes("m1", 3)) << EngineOf("m1").last_error;
  EXPECT_GE(EngineOf("m1").updates_failed, 2u);
  EXPECT_FALSE(engine_.paused());
  ExpectBitwiseEqual(3);
}

TEST_F(SglangDoubleAgentEngineTest, AnEngineThatDiesIsReportedAndTheMemberKeepsServing) {
  Setup(/*attempts=*/1);
  StartRoot();
  StartMember("m1", "us");
  Publish(1);
  ASSERT_TRUE(EngineServes("m1", 1)) << EngineOf("m1").last_error;
  engine_.Inject("/update_weights_from_disk", SglangFault::kDie, 1);
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ASSERT_TRUE(WaitFor([&] { return EngineOf("m1").updates_failed >= 2; }, 30));
  const AgentEngineStatus e = EngineOf("m1");
  EXPECT_EQ(e.version, 1u);
  EXPECT_NE(e.state, "serving");
  Publish(3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
}

}  // namespace
}  // namespace tern::agent_test

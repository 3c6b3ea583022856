// VllmAdapter against VllmDouble (a test double of vLLM's weight-update
// routes): the order of the steps, the policies, and what is left when the
// engine fails, hangs or dies. The real vLLM: tests/engine/test_tern_vllm.py.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/engine/engine_adapter.h"
#include "agent/engine/engine_http.h"
#include "agent/engine/vllm_double.h"

namespace tern::agent {
namespace {

using testing::Fault;
using testing::VllmDouble;

class VllmAdapterTest : public ::testing::Test {
 protected:
  VllmAdapterOptions Options() {
    VllmAdapterOptions o;
    o.url = engine_.url();
    o.root = "/srv/tern";
    o.step_timeout_ms = 2000;
    o.pause_timeout_ms = 2000;
    o.update_timeout_ms = 2000;
    o.retry_backoff_ms = 10;
    return o;
  }
  std::unique_ptr<VllmAdapter> Make(VllmAdapterOptions o) {
    auto a = VllmAdapter::Create(std::move(o), SteadyClock());
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? std::move(a).value() : nullptr;
  }
  static EngineUpdate Update(uint64_t version, std::vector<std::string> changed) {
    EngineUpdate u;
    u.version = version;
    u.base_version = version - 1;
    u.slot_dir = "/srv/tern/views/" + std::string(version % 2 ? "a" : "b");
    u.changed = std::move(changed);
    return u;
  }
  static int64_t MsSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t)
        .count();
  }
  VllmDouble engine_;
};

TEST_F(VllmAdapterTest, AppliesInOrderAndReadsTheVersionBack) {
  engine_.set_weight_version("6");
  auto a = Make(Options());
  auto r = a->Apply(Update(7, {"model.layers.0.self_attn.q_proj.weight"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, 7u);
  EXPECT_EQ(r->attempts, 1u);
  EXPECT_FALSE(r->full);
  EXPECT_TRUE(r->prefix_cache_reset);
  EXPECT_EQ(engine_.routes(),
            (std::vector<std::string>{
                "GET /weight_info", "POST /init_weight_transfer_engine", "POST /pause",
                "POST /start_weight_update", "POST /update_weights", "POST /finish_weight_update",
                "POST /reset_prefix_cache", "POST /resume", "GET /weight_info"}));
  EXPECT_EQ(engine_.pause_mode(), "keep");
  EXPECT_EQ(nlohmann::json::parse(engine_.last_init_info()),
            (nlohmann::json{{"root", "/srv/tern"}, {"version", 6}}));
  EXPECT_EQ(nlohmann::json::parse(engine_.last_update_info()),
            (nlohmann::json{{"slot", "/srv/tern/views/a"},
                            {"version", 7},
                            {"changed", {"model.layers.0.self_attn.q_proj.weight"}},
                            {"base", 6}}));
  EXPECT_FALSE(engine_.paused());
  EXPECT_EQ(engine_.weight_version(), "7");
  auto v = a->ServedVersion();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::optional<uint64_t>(7));
}

TEST_F(VllmAdapterTest, FullUpdateSendsNullAndNoBase) {
  auto a = Make(Options());
  EngineUpdate u = Update(3, {});
  u.changed.reset();
  auto r = a->Apply(u);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->full);
  auto info = nlohmann::json::parse(engine_.last_update_info());
  EXPECT_TRUE(info["changed"].is_null());
  EXPECT_FALSE(info.contains("base"));
  // A fresh engine names no version of ours: init carries none.
  EXPECT_FALSE(nlohmann::json::parse(engine_.last_init_info()).contains("version"));
}

TEST_F(VllmAdapterTest, PausePolicyAndCacheResetPolicy) {
  auto o = Options();
  o.pause = PauseMode::kWait;
  o.reset_prefix_cache = false;
  auto a = Make(o);
  ASSERT_TRUE(a->Apply(Update(1, {"w"})).ok());
  EXPECT_EQ(engine_.pause_mode(), "wait");
  for (const auto& r : engine_.routes()) EXPECT_NE(r, "POST /reset_prefix_cache");
  EXPECT_TRUE(ParsePauseMode("abort").ok());
  EXPECT_EQ(ParsePauseMode("drain").status().code(), Code::kInvalidArgument);
}

TEST_F(VllmAdapterTest, ABusyPrefixCacheIsReportedNotFailed) {
  engine_.cache_busy = true;
  auto a = Make(Options());
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->prefix_cache_reset);
}

TEST_F(VllmAdapterTest, ARefusedUpdateIsNotRetriedAndTheEngineResumesOnItsVersion) {
  engine_.set_weight_version("4");
  engine_.Inject("/update_weights", Fault::kBadUpdate, 5);
  auto o = Options();
  o.attempts = 3;
  auto a = Make(o);
  auto r = a->Apply(Update(5, {"w"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tern: bad update: double: tensor x is missing"),
            std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("after 1 attempt"), std::string::npos);
  EXPECT_EQ(engine_.weight_version(), "4");
  EXPECT_FALSE(engine_.paused());
  EXPECT_FALSE(engine_.session_open());
  const auto routes = engine_.routes();
  EXPECT_EQ(routes.back(), "POST /resume");
  for (const auto& route : routes) EXPECT_NE(route, "POST /finish_weight_update");
}

TEST_F(VllmAdapterTest, AFailedUpdateIsRetried) {
  engine_.Inject("/update_weights", Fault::kFail, 1);
  auto a = Make(Options());
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->attempts, 2u);
  EXPECT_EQ(engine_.weight_version(), "2");
  EXPECT_FALSE(engine_.paused());
}

TEST_F(VllmAdapterTest, RetriesRunOutAndSayWhy) {
  engine_.set_weight_version("1");
  engine_.Inject("/start_weight_update", Fault::kFail, 10);
  auto o = Options();
  o.attempts = 3;
  auto a = Make(o);
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("after 3 attempt"), std::string::npos);
  EXPECT_NE(r.status().message().find("injected failure"), std::string::npos);
  EXPECT_EQ(engine_.weight_version(), "1");
  EXPECT_FALSE(engine_.paused());
}

TEST_F(VllmAdapterTest, AHangingUpdateMeetsItsDeadlineThenTheNextUpdateIsFull) {
  engine_.set_weight_version("1");
  engine_.hang_ms = 1500;
  engine_.Inject("/update_weights", Fault::kHang, 1);
  auto o = Options();
  o.update_timeout_ms = 200;
  o.attempts = 1;
  auto a = Make(o);
  const auto t = std::chrono::steady_clock::now();
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().ToString();
  EXPECT_LT(MsSince(t), 1200);  // the deadline, not the hang
  EXPECT_FALSE(engine_.paused());
  EXPECT_EQ(engine_.weight_version(), "1");
  // vLLM runs the hung update to its end and keeps its session open: the
  // next Apply closes the session and sends every tensor, since the engine
  // may hold version 2's weights under version 1's name.
  auto r2 = a->Apply(Update(3, {"w"}));
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_TRUE(r2->full);
  EXPECT_TRUE(nlohmann::json::parse(engine_.last_update_info())["changed"].is_null());
  EXPECT_EQ(engine_.weight_version(), "3");
  // Known again: the one after is sparse.
  auto r3 = a->Apply(Update(4, {"w"}));
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_FALSE(r3->full);
}

TEST_F(VllmAdapterTest, AHangingPauseMeetsItsDeadlineAndResumes) {
  engine_.hang_ms = 3000;
  engine_.Inject("/pause", Fault::kHang, 1);
  auto o = Options();
  o.pause = PauseMode::kWait;
  o.pause_timeout_ms = 200;
  o.attempts = 1;
  auto a = Make(o);
  const auto t = std::chrono::steady_clock::now();
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().ToString();
  EXPECT_LT(MsSince(t), 2500);
  EXPECT_EQ(engine_.routes().back(), "POST /resume");
  EXPECT_EQ(engine_.updates_loaded(), 0u);
}

TEST_F(VllmAdapterTest, EveryStepHasADeadline) {
  for (const char* route : {"/weight_info", "/init_weight_transfer_engine", "/start_weight_update",
                            "/finish_weight_update", "/reset_prefix_cache", "/resume"}) {
    VllmDouble engine;
    engine.hang_ms = 3000;
    engine.Inject(route, Fault::kHang, 1);
    auto o = Options();
    o.url = engine.url();
    o.step_timeout_ms = 200;
    o.attempts = 1;
    auto a = Make(o);
    const auto t = std::chrono::steady_clock::now();
    auto r = a->Apply(Update(2, {"w"}));
    EXPECT_FALSE(r.ok()) << route;
    EXPECT_EQ(r.status().code(), Code::kTimeout) << route << ": " << r.status().ToString();
    EXPECT_LT(MsSince(t), 2500) << route;
    engine.Stop();
  }
}

TEST_F(VllmAdapterTest, ADyingEngineIsUnavailableAndBounded) {
  engine_.Inject("/update_weights", Fault::kDie, 1);
  auto o = Options();
  o.attempts = 2;
  auto a = Make(o);
  const auto t = std::chrono::steady_clock::now();
  auto r = a->Apply(Update(2, {"w"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_LT(MsSince(t), 5000);
  auto v = a->ServedVersion();
  EXPECT_EQ(v.status().code(), Code::kUnavailable);
}

TEST_F(VllmAdapterTest, AnEngineWithoutTheRoutesIsNotRetriedAndSaysWhy) {
  httplib::Server plain;  // answers 404 to everything, as vLLM without dev mode
  const int port = plain.bind_to_any_port("127.0.0.1");
  std::thread t([&] { plain.listen_after_bind(); });
  while (!plain.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto o = Options();
  o.url = "http://127.0.0.1:" + std::to_string(port);
  o.attempts = 3;
  auto a = Make(o);
  auto r = a->Apply(Update(2, {"w"}));
  plain.stop();
  t.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_NE(r.status().message().find("VLLM_SERVER_DEV_MODE=1"), std::string::npos);
  EXPECT_NE(r.status().message().find("after 1 attempt"), std::string::npos);
}

TEST_F(VllmAdapterTest, NoEngineAtAll) {
  auto o = Options();
  engine_.Stop();
  o.attempts = 1;
  auto a = Make(o);
  auto r = a->Apply(Update(2, {"w"}));
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
}

TEST_F(VllmAdapterTest, BadInputIsRefusedBeforeAnyCall) {
  auto a = Make(Options());
  EngineUpdate u = Update(2, {"w"});
  u.slot_dir = "views/a";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u = Update(2, {"w"});
  u.version = 0;
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u = Update(2, {"bad\"name"});
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u = Update(2, {std::string(2000, 'x')});
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u = Update(2, {"w"});
  u.slot_dir = "/srv/tern/views/\xff";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  auto o = Options();
  o.changed_max = 2;
  auto small = Make(o);
  EXPECT_EQ(small->Apply(Update(2, {"a", "b", "c"})).status().code(), Code::kResourceExhausted);
  EXPECT_TRUE(engine_.routes().empty());
}

TEST_F(VllmAdapterTest, OptionsAreChecked) {
  for (const char* url : {"https://x:1", "http://x", "http://x:0", "http://x:1/path", "x:1"}) {
    auto o = Options();
    o.url = url;
    EXPECT_EQ(VllmAdapter::Create(o, SteadyClock()).status().code(), Code::kInvalidArgument) << url;
  }
  auto o = Options();
  o.root = "relative";
  EXPECT_EQ(VllmAdapter::Create(o, SteadyClock()).status().code(), Code::kInvalidArgument);
  o = Options();
  o.attempts = 0;
  EXPECT_EQ(VllmAdapter::Create(o, SteadyClock()).status().code(), Code::kInvalidArgument);
  o = Options();
  o.update_timeout_ms = 0;
  EXPECT_EQ(VllmAdapter::Create(o, SteadyClock()).status().code(), Code::kInvalidArgument);
}

TEST_F(VllmAdapterTest, ServedVersionReadsNamesThatAreNotVersionsAsNone) {
  auto a = Make(Options());
  for (const char* name : {"default", "", "7b", "-1"}) {
    engine_.set_weight_version(name);
    auto v = a->ServedVersion();
    ASSERT_TRUE(v.ok()) << name;
    EXPECT_FALSE(v->has_value()) << name;
  }
  engine_.set_weight_version("18446744073709551615");
  auto v = a->ServedVersion();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(**v, UINT64_MAX);
}

// Both adapters read the served version with ServedWeightVersion: a reply
// the engine cannot have meant is kProtocol naming the route, never a
// version.
TEST(ServedWeightVersionTest, RefusesRepliesWithoutAStringVersion) {
  for (const char* body : {"", "[]", "{}", "{\"weight_version\": 7}",
                           "{\"weight_version\": [\"7\"]}", "{\"weight_version\": true}",
                           "{\"weight_version\": \"7\""}) {
    auto v = ServedWeightVersion(body, "/model_info");
    ASSERT_FALSE(v.ok()) << body;
    EXPECT_EQ(v.status().code(), Code::kProtocol) << body;
    EXPECT_NE(v.status().message().find("GET /model_info"), std::string::npos) << v.status().ToString();
  }
  auto none = ServedWeightVersion("{\"weight_version\": null}", "/weight_info");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto seven = ServedWeightVersion("{\"weight_version\": \"7\", \"x\": 1}", "/weight_info");
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(**seven, 7u);
}

}  // namespace
}  // namespace tern::agent

// SglangAdapter against SglangDouble, a TEST DOUBLE of SGLang's HTTP
// weight-update API (sglang_double.h): the calls and bodies per pause
// policy, the version read back, and what is left when the engine fails,
// hangs or dies. No real SGLang runs here (it needs a GPU machine).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/engine/sglang_adapter.h"
#include "agent/engine/sglang_double.h"

namespace tern::agent {
namespace {

namespace fs = std::filesystem;
using testing::SglangDouble;
using testing::SglangFault;
using Routes = std::vector<std::string>;

class SglangDoubleAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tern_sglang_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_ / "views" / "a");
    fs::create_directories(root_ / "views" / "b");
  }
  void TearDown() override { fs::remove_all(root_); }

  SglangAdapterOptions Options() {
    SglangAdapterOptions o;
    o.url = engine_.url();
    o.root = root_.string();
    o.step_timeout_ms = 2000;
    o.pause_timeout_ms = 2000;
    o.update_timeout_ms = 2000;
    o.retry_backoff_ms = 10;
    return o;
  }
  std::unique_ptr<SglangAdapter> Make(SglangAdapterOptions o) {
    auto a = SglangAdapter::Create(std::move(o), SteadyClock());
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? std::move(a).value() : nullptr;
  }
  EngineUpdate Update(uint64_t version) {
    EngineUpdate u;
    u.version = version;
    u.base_version = version - 1;
    u.slot_dir = (root_ / "views" / (version % 2 ? "a" : "b")).string();
    u.changed = std::vector<std::string>{"model.layers.0.mlp.up_proj.weight"};
    return u;
  }
  static int64_t MsSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t)
        .count();
  }

  fs::path root_;
  SglangDouble engine_;
};

TEST_F(SglangDoubleAdapterTest, KeepPausesInPlaceLoadsTheSlotWholeAndReadsTheVersionBack) {
  engine_.set_weight_version("6");
  auto a = Make(Options());
  const EngineUpdate u = Update(7);
  auto r = a->Apply(u);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, 7u);
  EXPECT_EQ(r->attempts, 1u);
  EXPECT_TRUE(r->full) << "SGLang reloads the model path whole";
  EXPECT_TRUE(r->prefix_cache_reset);
  EXPECT_EQ(engine_.routes(),
            (Routes{"POST /pause_generation", "POST /update_weights_from_disk",
                    "POST /flush_cache", "POST /continue_generation", "GET /model_info"}));
  EXPECT_EQ(engine_.pause_mode(), "in_place");
  // The update never asks SGLang's scheduler for a flush while requests
  // may be held in place; the changed names are not sent (not sparse).
  EXPECT_EQ(nlohmann::json::parse(engine_.last_update()),
            (nlohmann::json{{"model_path", u.slot_dir},
                            {"weight_version", "7"},
                            {"flush_cache", false},
                            {"abort_all_requests", false}}));
  EXPECT_EQ(engine_.model_path(), u.slot_dir);
  EXPECT_FALSE(engine_.paused());
  EXPECT_EQ(engine_.weight_version(), "7");
  auto v = a->ServedVersion();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::optional<uint64_t>(7));
}

TEST_F(SglangDoubleAdapterTest, KeepWithRequestsHeldReportsTheCacheNotFlushedAndKeepsThem) {
  engine_.set_running(3);
  auto a = Make(Options());
  auto r = a->Apply(Update(1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->prefix_cache_reset);  // 400 from /flush_cache: reported, not an error
  EXPECT_FALSE(engine_.dead()) << "a flush inside the update would have killed SGLang";
  EXPECT_EQ(engine_.running(), 3u) << "in_place keeps the requests";
  EXPECT_EQ(engine_.drains(), 0u);
  EXPECT_EQ(engine_.weight_version(), "1");
}

TEST_F(SglangDoubleAdapterTest, WaitDoesNotPauseTheUpdateDrainsAndFlushes) {
  engine_.set_running(2);
  SglangAdapterOptions o = Options();
  o.pause = PauseMode::kWait;
  auto a = Make(o);
  auto r = a->Apply(Update(3));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->prefix_cache_reset);
  EXPECT_EQ(engine_.routes(), (Routes{"POST /update_weights_from_disk",
                                      "POST /continue_generation", "GET /model_info"}));
  EXPECT_EQ(nlohmann::json::parse(engine_.last_update())["flush_cache"], true);
  EXPECT_EQ(engine_.drains(), 1u) << "the requests in flight finished before the load";
  EXPECT_EQ(engine_.cache_flushes(), 1u);
}

TEST_F(SglangDoubleAdapterTest, AbortPausesWithAbortAndFlushesAfterTheLoad) {
  engine_.set_running(4);
  SglangAdapterOptions o = Options();
  o.pause = PauseMode::kAbort;
  auto a = Make(o);
  auto r = a->Apply(Update(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(engine_.pause_mode(), "abort");
  EXPECT_EQ(engine_.running(), 0u);
  EXPECT_TRUE(r->prefix_cache_reset);
  auto body = nlohmann::json::parse(engine_.last_update());
  EXPECT_EQ(body["abort_all_requests"], true);
  EXPECT_EQ(body["flush_cache"], false);
  EXPECT_EQ(engine_.routes()[2], "POST /flush_cache");
}

TEST_F(SglangDoubleAdapterTest, NoCacheResetMeansNoFlushAnywhere) {
  for (PauseMode mode : {PauseMode::kKeep, PauseMode::kWait, PauseMode::kAbort}) {
    SglangDouble engine;
    SglangAdapterOptions o = Options();
    o.url = engine.url();
    o.pause = mode;
    o.reset_prefix_cache = false;
    auto a = Make(o);
    auto r = a->Apply(Update(2));
    ASSERT_TRUE(r.ok()) << PauseModeName(mode) << ": " << r.status().ToString();
    EXPECT_FALSE(r->prefix_cache_reset);
    EXPECT_EQ(engine.cache_flushes(), 0u) << PauseModeName(mode);
    for (const std::string& route : engine.routes()) EXPECT_NE(route, "POST /flush_cache");
  }
}

TEST_F(SglangDoubleAdapterTest, AFailedLoadLeavesTheOldVersionContinuesAndIsRetried) {
  engine_.set_weight_version("4");
  engine_.Inject("/update_weights_from_disk", SglangFault::kFail, 1);
  auto a = Make(Options());
  auto r = a->Apply(Update(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->attempts, 2u);
  EXPECT_EQ(engine_.weight_version(), "5");
  EXPECT_EQ(engine_.updates_loaded(), 1u);
}

TEST_F(SglangDoubleAdapterTest, RetriesRunOutAndSayWhyWithTheEngineOnItsVersion) {
  engine_.set_weight_version("4");
  engine_.Inject("/update_weights_from_disk", SglangFault::kFail, 5);
  SglangAdapterOptions o = Options();
  o.attempts = 3;
  auto a = Make(o);
  auto r = a->Apply(Update(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("Rolling back to original weights"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("after 3 attempt(s)"), std::string::npos);
  EXPECT_EQ(engine_.weight_version(), "4");
  EXPECT_FALSE(engine_.paused()) << "continue_generation after every failure";
  size_t continues = 0;
  for (const std::string& route : engine_.routes()) continues += route == "POST /continue_generation";
  EXPECT_EQ(continues, 3u);
}

TEST_F(SglangDoubleAdapterTest, AMissingSlotIsAFailedLoadNotACrash) {
  auto a = Make(Options());
  EngineUpdate u = Update(1);
  u.slot_dir = (root_ / "views" / "gone").string();
  auto r = a->Apply(u);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no such directory"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(engine_.weight_version(), "default");
}

TEST_F(SglangDoubleAdapterTest, AHangingUpdateMeetsItsDeadlineAndContinues) {
  engine_.set_hang_ms(5000);
  engine_.Inject("/update_weights_from_disk", SglangFault::kHang, 1);
  SglangAdapterOptions o = Options();
  o.update_timeout_ms = 300;
  o.attempts = 1;
  auto a = Make(o);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = a->Apply(Update(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().ToString();
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_NE(r.status().message().find("update_weights_from_disk"), std::string::npos);
}

TEST_F(SglangDoubleAdapterTest, AHangAtEveryOtherStepMeetsItsDeadline) {
  for (const char* route : {"/pause_generation", "/flush_cache", "/continue_generation",
                            "/model_info"}) {
    SglangDouble engine;
    engine.set_hang_ms(5000);
    engine.Inject(route, SglangFault::kHang, 1);
    SglangAdapterOptions o = Options();
    o.url = engine.url();
    o.step_timeout_ms = 300;
    o.attempts = 1;
    auto a = Make(o);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = a->Apply(Update(2));
    EXPECT_FALSE(r.ok()) << route;
    EXPECT_EQ(r.status().code(), Code::kTimeout) << route << ": " << r.status().ToString();
    EXPECT_LT(MsSince(t0), 3000) << route;
  }
}

TEST_F(SglangDoubleAdapterTest, AnEngineThatDiesMidUpdateIsUnavailableAndBounded) {
  engine_.Inject("/update_weights_from_disk", SglangFault::kDie, 1);
  auto a = Make(Options());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = a->Apply(Update(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("after 2 attempt(s)"), std::string::npos)
      << r.status().ToString();
  EXPECT_LT(MsSince(t0), 5000);
  EXPECT_TRUE(engine_.dead());
}

TEST_F(SglangDoubleAdapterTest, AMalformedReplyIsAProtocolErrorNotRetried) {
  // A server that answers the update with something other than SGLang's
  // {"success", "message"}: not SGLang, not retried.
  httplib::Server other;
  other.Post("/pause_generation", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{}", "application/json");
  });
  other.Post("/update_weights_from_disk", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("not json", "text/plain");
  });
  other.Post("/flush_cache", [](const httplib::Request&, httplib::Response&) {});
  other.Post("/continue_generation", [](const httplib::Request&, httplib::Response&) {});
  const int port = other.bind_to_any_port("127.0.0.1");
  std::thread t([&] { other.listen_after_bind(); });
  while (!other.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  SglangAdapterOptions o = Options();
  o.url = "http://127.0.0.1:" + std::to_string(port);
  auto a = Make(o);
  auto r = a->Apply(Update(1));
  other.stop();
  t.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kProtocol) << r.status().ToString();
  EXPECT_NE(r.status().message().find("no \"success\""), std::string::npos);
  EXPECT_NE(r.status().message().find("after 1 attempt(s)"), std::string::npos);
}

TEST_F(SglangDoubleAdapterTest, TheDoubleRejectsWhatSglangRejects) {
  httplib::Client c("127.0.0.1", std::stoi(engine_.url().substr(engine_.url().rfind(':') + 1)));
  auto r = c.Post("/pause_generation", R"({"mode": "keep"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("in_place"), std::string::npos);
  r = c.Post("/update_weights_from_disk", R"({"weight_version": "3"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("model_path"), std::string::npos);
  r = c.Get("/get_weight_version");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(engine_.updates_loaded(), 0u);
  // And dies as SGLang's scheduler does when asked to flush while requests
  // are held in place.
  engine_.set_running(1);
  ASSERT_TRUE(c.Post("/pause_generation", R"({"mode": "in_place"})", "application/json"));
  r = c.Post("/update_weights_from_disk",
             nlohmann::json{{"model_path", root_.string()}, {"flush_cache", true}}.dump(),
             "application/json");
  EXPECT_TRUE(engine_.dead());
}

TEST_F(SglangDoubleAdapterTest, AnOlderSglangIsReadAtGetModelInfo) {
  SglangDouble legacy(/*legacy=*/true);
  legacy.set_weight_version("12");
  SglangAdapterOptions o = Options();
  o.url = legacy.url();
  auto a = Make(o);
  auto v = a->ServedVersion();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::optional<uint64_t>(12));
  auto r = a->Apply(Update(13));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // (The double logs only the routes it serves: not the 404 for /model_info.)
  EXPECT_EQ(legacy.routes(),
            (Routes{"GET /get_model_info", "POST /pause_generation",
                    "POST /update_weights_from_disk", "POST /flush_cache",
                    "POST /continue_generation", "GET /get_model_info"}));
}

TEST_F(SglangDoubleAdapterTest, ServedVersionReadsNamesThatAreNotVersionsAsNone) {
  auto a = Make(Options());
  for (const char* name : {"default", "", "7a", "-1", "99999999999999999999999"}) {
    engine_.set_weight_version(name);
    auto v = a->ServedVersion();
    ASSERT_TRUE(v.ok()) << name;
    EXPECT_EQ(*v, std::nullopt) << name;
  }
}

TEST_F(SglangDoubleAdapterTest, NoEngineAtAll) {
  SglangAdapterOptions o = Options();
  engine_.Stop();
  o.attempts = 2;
  auto a = Make(o);
  auto r = a->Apply(Update(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
}

TEST_F(SglangDoubleAdapterTest, BadInputIsRefusedBeforeAnyCall) {
  auto a = Make(Options());
  EngineUpdate u = Update(1);
  u.version = 0;
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u = Update(1);
  u.slot_dir = "views/a";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u.slot_dir = "/etc";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u.slot_dir = root_.string() + "/views/../../etc";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  u.slot_dir = root_.string() + "/views/\xff";
  EXPECT_EQ(a->Apply(u).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(engine_.routes().empty());
}

TEST_F(SglangDoubleAdapterTest, OptionsAreChecked) {
  SglangAdapterOptions o = Options();
  o.url = "https://127.0.0.1:1";
  EXPECT_FALSE(SglangAdapter::Create(o, SteadyClock()).ok());
  o = Options();
  o.root = "relative";
  EXPECT_FALSE(SglangAdapter::Create(o, SteadyClock()).ok());
  o = Options();
  o.attempts = 0;
  EXPECT_FALSE(SglangAdapter::Create(o, SteadyClock()).ok());
  o = Options();
  o.update_timeout_ms = 0;
  EXPECT_FALSE(SglangAdapter::Create(o, SteadyClock()).ok());
}

}  // namespace
}  // namespace tern::agent

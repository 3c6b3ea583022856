// Publishes slower than the admin port's deadline report their real outcome
// (agent/daemon/publish_jobs.h): over a real AdminServer whose deadline is
// shorter than the publish.
#include "agent/daemon/publish_jobs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tern::agent {
namespace {

using Clock = std::chrono::steady_clock;

// A publish that takes `ms` and then answers `outcome`; counts its calls.
struct SlowPublish {
  std::atomic<int> calls{0};
  std::atomic<int> supersedes{0};
  std::atomic<uint32_t> ms{0};
  Status outcome = Status::Ok();
  PublishJobs::PublishFn Fn() {
    return [this](const std::string&, uint64_t, bool supersede) {
      ++calls;
      if (supersede) ++supersedes;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms.load()));
      return outcome;
    };
  }
};

class PublishJobsTest : public ::testing::Test {
 protected:
  // An admin port with a 400 ms deadline per exchange; POST waits 100 ms.
  void Serve(SlowPublish& p, PublishJobs::AdmitFn admit = nullptr) {
    jobs_ = std::make_unique<PublishJobs>(p.Fn());
    AdminOptions o;
    o.request_timeout_ms = 400;
    o.token = "t0ken";
    o.log = [](std::string_view) {};
    auto server = AdminServer::Start(o, jobs_->Routes(/*wait_ms=*/100, std::move(admit)));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  AdminClientOptions Auth() const {
    AdminClientOptions o;
    o.token = "t0ken";
    return o;
  }
  std::unique_ptr<PublishJobs> jobs_;
  std::unique_ptr<AdminServer> server_;
};

TEST_F(PublishJobsTest, APublishSlowerThanTheAdminDeadlineReportsSuccess) {
  SlowPublish p;
  p.ms = 1500;  // almost 4x the port's deadline
  Serve(p);
  const auto t0 = Clock::now();
  Status s = PublishAndWait(server_->address(), "/ckpt", 7, PublishFlags{}, Auth(), 30000);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 10.0);
  EXPECT_EQ(p.calls.load(), 1);
  auto jobs = jobs_->Recent();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state, PublishJobs::State::kPublished);
}

TEST_F(PublishJobsTest, ASlowFailureComesBackWithItsCodeAndReason) {
  SlowPublish p;
  p.ms = 800;
  p.outcome = Status(Code::kMismatch, "publish: tensor w has another shape");
  Serve(p);
  Status s = PublishAndWait(server_->address(), "/ckpt", 7, PublishFlags{}, Auth(), 30000);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_NE(s.message().find("another shape"), std::string::npos) << s.ToString();
}

TEST_F(PublishJobsTest, AFastPublishAnswersInTheSameExchange) {
  SlowPublish p;
  p.outcome = Status(Code::kInvalidArgument, "publish: version 3 is not newer than HEAD 5");
  Serve(p);
  auto r = AdminPost(server_->address(), "/publish", R"({"checkpoint":"/c","version":3})", Auth());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not newer than HEAD"), std::string::npos);
  p.outcome = Status::Ok();
  auto ok = AdminPost(server_->address(), "/publish", R"({"checkpoint":"/c","version":6})", Auth());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_NE(ok->find("\"published\":6"), std::string::npos) << *ok;
}

TEST_F(PublishJobsTest, TheClientsOwnTimeoutSaysTheRootIsStillPublishing) {
  SlowPublish p;
  p.ms = 2000;
  Serve(p);
  Status s = PublishAndWait(server_->address(), "/ckpt", 9, PublishFlags{}, Auth(), 700);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("still being published"), std::string::npos) << s.ToString();
  // A retry of the same publish attaches to the running job instead of
  // being refused or publishing twice.
  s = PublishAndWait(server_->address(), "/ckpt", 9, PublishFlags{}, Auth(), 30000);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(p.calls.load(), 1);
}

TEST_F(PublishJobsTest, AnotherPublishWhileOneRunsIsRefused) {
  SlowPublish p;
  p.ms = 1000;
  Serve(p);
  auto first =
      AdminPost(server_->address(), "/publish", R"({"checkpoint":"/a","version":1})", Auth());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_NE(first->find("\"publishing\":1"), std::string::npos) << *first;
  auto second =
      AdminPost(server_->address(), "/publish", R"({"checkpoint":"/b","version":2})", Auth());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("still being published"), std::string::npos)
      << second.status().ToString();
  jobs_->Join();
  EXPECT_EQ(p.calls.load(), 1);
}

TEST_F(PublishJobsTest, PublishNeedsTheTokenAndAValidBody) {
  SlowPublish p;
  Serve(p);
  auto anon = AdminPost(server_->address(), "/publish", R"({"checkpoint":"/a","version":1})");
  EXPECT_EQ(anon.status().code(), Code::kAuth);
  for (const char* bad :
       {"", "[]", R"({"checkpoint":1,"version":1})", R"({"checkpoint":"/a"})",
        R"({"checkpoint":"/a","version":-1})", R"({"checkpoint":"/a","version":"1"})",
        R"({"checkpoint":"/a","version":1,"supersede":1})",
        R"({"checkpoint":"/a","version":1,"force":"yes"})"}) {
    auto r = AdminPost(server_->address(), "/publish", bad, Auth());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_EQ(p.calls.load(), 0);
}

// "supersede" (docs/agent/board.md §4a) reaches the admission check and the
// publish, GET /publish says which job was one, and a supersede does not
// attach to an ordinary publish of the same version and path.
TEST_F(PublishJobsTest, TheSupersedeFlagReachesAdmissionAndThePublish) {
  SlowPublish p;
  std::atomic<int> admitted_supersedes{0};
  Serve(p, [&](const std::string& checkpoint, uint64_t version, const PublishFlags& flags)
               -> Result<std::string> {
    if (flags.supersede) ++admitted_supersedes;
    if (version == 13 && flags.supersede)
      return TERN_ERROR(kInvalidArgument, "publish: a supersede renumbers below HEAD 12");
    return checkpoint;
  });
  PublishFlags supersede;
  supersede.supersede = true;
  Status refused = PublishAndWait(server_->address(), "/ckpt", 13, supersede, Auth(), 30000);
  EXPECT_EQ(refused.code(), Code::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("renumbers below HEAD"), std::string::npos) << refused.ToString();
  EXPECT_EQ(p.calls.load(), 0);
  Status s = PublishAndWait(server_->address(), "/ckpt", 4, supersede, Auth(), 30000);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(admitted_supersedes.load(), 2);
  EXPECT_EQ(p.supersedes.load(), 1);
  auto jobs = AdminGet(server_->address(), "/publish", Auth());
  ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
  EXPECT_NE(jobs->find("\"supersede\":true"), std::string::npos) << *jobs;
  // A running supersede: an ordinary publish of the same version and path
  // is another publish, refused while it runs.
  p.ms = 1000;
  auto first = AdminPost(server_->address(), "/publish",
                         R"({"checkpoint":"/c","version":5,"supersede":true})", Auth());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second =
      AdminPost(server_->address(), "/publish", R"({"checkpoint":"/c","version":5})", Auth());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("still being published"), std::string::npos)
      << second.status().ToString();
  jobs_->Join();
  EXPECT_EQ(p.calls.load(), 2);
  EXPECT_EQ(p.supersedes.load(), 2);
}

// The client reads a job's outcome from the root's JSON (admin_jobs.h):
// whatever the fields hold, it gets a Status or keeps waiting, never a throw.
TEST(JobOutcomeTest, ReadsEveryShapeOfAnswerWithoutThrowing) {
  using nlohmann::json;
  EXPECT_FALSE(JobOutcomeOf(json{{"state", "running"}}, "x").has_value());
  EXPECT_FALSE(JobOutcomeOf(json::object(), "x").has_value());
  EXPECT_FALSE(JobOutcomeOf(json{{"state", 7}}, "x").has_value());
  EXPECT_FALSE(JobOutcomeOf(json::array(), "x").has_value());
  EXPECT_TRUE(JobOutcomeOf(json{{"state", "published"}}, "x")->ok());
  auto failed = JobOutcomeOf(json{{"state", "failed"}, {"code", static_cast<unsigned>(Code::kMismatch)},
                                  {"error", "rank 3 sent other bytes"}},
                             "x");
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->code(), Code::kMismatch);
  EXPECT_EQ(failed->message(), "rank 3 sent other bytes");
  // A code this build does not know, or not a number, reads as kInternal;
  // a missing or non-text reason as the fallback.
  for (const json& code : {json(9999), json("7"), json(-1), json(nullptr)}) {
    auto f = JobOutcomeOf(json{{"state", "failed"}, {"code", code}, {"error", 5}}, "fell back");
    ASSERT_TRUE(f.has_value()) << code;
    EXPECT_EQ(f->code(), Code::kInternal) << code;
    EXPECT_EQ(f->message(), "fell back") << code;
  }
  // What AddJobOutcome writes, JobOutcomeOf reads back.
  json o = json::object();
  AddJobOutcome(o, JobState::kFailed, Status(Code::kTimeout, "slow"), 1.0, 3.5);
  EXPECT_EQ(o["seconds"], 2.5);
  EXPECT_EQ(o["state"], "failed");
  auto back = JobOutcomeOf(o, "x");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->code(), Code::kTimeout);
  EXPECT_EQ(back->message(), "slow");
}

}  // namespace
}  // namespace tern::agent

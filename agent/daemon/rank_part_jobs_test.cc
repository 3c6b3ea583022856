// A rank's part whose version takes longer than the admin port's deadline
// to gather and commit still reports its real outcome
// (agent/daemon/rank_part_jobs.h): over a real AdminServer whose deadline is
// shorter than the submit. Retries, other bytes, bad bodies and the
// client's own timeout.
#include "agent/daemon/rank_part_jobs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tern::agent {
namespace {

using Clock = std::chrono::steady_clock;

// A part of rank `rank` of 2 for `version` (a one-tensor layout, no record).
std::vector<uint8_t> Part(uint64_t version, uint32_t rank, uint64_t base_version = 0) {
  RankPart p;
  p.rank = rank;
  p.world_size = 2;
  p.base_version = base_version;
  p.version = version;
  p.layout = {{"w", DType::kBF16, {8}}};
  p.shards = {{"w", rank * 4u, 4}};
  auto bytes = EncodeRankPart(p);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return std::move(bytes).value();
}

// A submit that takes `ms` and answers `outcome`; counts its calls.
struct SlowSubmit {
  std::atomic<int> calls{0};
  std::atomic<uint32_t> ms{0};
  std::atomic<uint32_t> last_timeout_ms{0};
  Status outcome = Status::Ok();
  RankPartJobs::SubmitFn Fn() {
    return [this](RankPart, uint32_t timeout_ms, bool) {
      ++calls;
      last_timeout_ms = timeout_ms;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms.load()));
      return outcome;
    };
  }
};

class RankPartJobsTest : public ::testing::Test {
 protected:
  // An admin port with a 400 ms deadline per exchange; POST waits 100 ms.
  void Serve(SlowSubmit& s) {
    jobs_ = std::make_unique<RankPartJobs>(s.Fn());
    AdminOptions o;
    o.request_timeout_ms = 400;
    o.token = "t0ken";
    o.log = [](std::string_view) {};
    auto server = AdminServer::Start(o, jobs_->Routes(/*wait_ms=*/100));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  AdminClientOptions Auth() const {
    AdminClientOptions o;
    o.token = "t0ken";
    return o;
  }
  Status Send(const std::vector<uint8_t>& part, uint64_t version, uint32_t rank,
              uint32_t timeout_ms = 30000) {
    return SendRankPartAndWait(server_->address(), part, version, rank, 5000, Auth(), timeout_ms);
  }
  std::unique_ptr<RankPartJobs> jobs_;
  std::unique_ptr<AdminServer> server_;
};

TEST_F(RankPartJobsTest, AVersionSlowerThanTheAdminDeadlineReportsItsOutcome) {
  SlowSubmit s;
  s.ms = 1200;  // three times the port's deadline
  Serve(s);
  const auto t0 = Clock::now();
  Status st = Send(Part(1, 0), 1, 0);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - t0).count(), 1.1);
  EXPECT_EQ(s.calls.load(), 1);
  EXPECT_EQ(s.last_timeout_ms.load(), 5000u);  // the query's gathering deadline
  // The same bytes again: the committed outcome, not a second submit.
  EXPECT_TRUE(Send(Part(1, 0), 1, 0).ok());
  EXPECT_EQ(s.calls.load(), 1);
}

TEST_F(RankPartJobsTest, AFailureComesBackWithItsReasonAndIsTriedAnew) {
  SlowSubmit s;
  s.ms = 600;
  s.outcome = Status(Code::kTimeout, "publish from ranks: version 1: no part from rank(s) 1");
  Serve(s);
  Status st = Send(Part(1, 0), 1, 0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no part from rank(s) 1"), std::string::npos) << st.ToString();
  s.outcome = Status::Ok();
  EXPECT_TRUE(Send(Part(1, 0), 1, 0).ok());
  EXPECT_EQ(s.calls.load(), 2);
}

TEST_F(RankPartJobsTest, OtherBytesWhileAPartRunsAreRefused) {
  SlowSubmit s;
  s.ms = 1500;
  Serve(s);
  std::thread first([&] { EXPECT_TRUE(Send(Part(2, 0, 1), 2, 0).ok()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto r = AdminPost(server_->address(), "/publish/rank-part",
                     [] {
                       auto b = Part(2, 0);  // another base: other bytes
                       return std::string(b.begin(), b.end());
                     }(),
                     Auth());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();  // 409
  EXPECT_NE(r.status().ToString().find("another part of version 2"), std::string::npos)
      << r.status().ToString();
  first.join();
  EXPECT_EQ(s.calls.load(), 1);
}

TEST_F(RankPartJobsTest, BadBodiesAndQueriesAre400AndTakeNothing) {
  SlowSubmit s;
  Serve(s);
  auto garbage = AdminPost(server_->address(), "/publish/rank-part", "garbage", Auth());
  EXPECT_EQ(garbage.status().code(), Code::kInvalidArgument);
  EXPECT_NE(garbage.status().ToString().find("rank part"), std::string::npos)
      << garbage.status().ToString();
  auto whole = Part(1, 0);
  auto truncated = AdminPost(server_->address(), "/publish/rank-part",
                             std::string(whole.begin(), whole.begin() + 100), Auth());
  EXPECT_NE(truncated.status().ToString().find("truncated"), std::string::npos)
      << truncated.status().ToString();
  auto timeout = AdminPost(server_->address(), "/publish/rank-part?timeout_ms=0",
                           std::string(whole.begin(), whole.end()), Auth());
  EXPECT_NE(timeout.status().ToString().find("timeout_ms"), std::string::npos)
      << timeout.status().ToString();
  auto no_token = AdminPost(server_->address(), "/publish/rank-part",
                            std::string(whole.begin(), whole.end()));
  EXPECT_EQ(no_token.status().code(), Code::kAuth);
  auto unknown = AdminGet(server_->address(), "/publish/rank-part?version=1&rank=0", Auth());
  EXPECT_EQ(unknown.status().code(), Code::kNotFound);
  EXPECT_EQ(s.calls.load(), 0);
}

TEST_F(RankPartJobsTest, TheClientsOwnTimeoutSaysTheOutcomeIsNotKnown) {
  SlowSubmit s;
  s.ms = 1500;
  Serve(s);
  Status st = Send(Part(1, 0), 1, 0, /*timeout_ms=*/600);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  // Asking again with the same bytes attaches to the job still running.
  EXPECT_TRUE(Send(Part(1, 0), 1, 0).ok());
  EXPECT_EQ(s.calls.load(), 1);
}

}  // namespace
}  // namespace tern::agent

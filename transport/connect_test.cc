// ConnectWait's backoff runs on the clock it is given: on a FakeClock the
// retries happen without real sleeping, and the schedule is exact.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tern/clock.h"
#include "tern/connect.h"
#include "tern/fault_transport.h"
#include "tern/loopback_transport.h"

namespace tern {
namespace {

TEST(ConnectWait, BacksOffOnTheGivenClockWithoutRealSleeping) {
  LoopbackNetwork net;
  auto server = NewLoopbackTransport(net);
  auto listener = server->Listen("svc", [](std::shared_ptr<Connection>) { return ConnectionHandlers{}; });
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  auto client = NewLoopbackTransport(net);
  FaultPolicy fp;
  fp.refuse_connects = 3;
  auto faulty = NewFaultTransport(*client, fp);

  FakeClock clock(1'000'000);
  // 10 s + 20 s + 40 s of backoff: a real sleep would blow the test's budget.
  const RetryPolicy retry{5, 10'000, 60'000};
  Result<std::shared_ptr<Connection>> got{Status(Code::kInternal, "not run")};
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> done{false};
  std::thread dialer([&] {
    got = ConnectWait(*faulty, "svc", {}, 10'000, retry, clock);
    done = true;
  });
  int wakeups = 0;
  while (!done) wakeups += clock.AdvanceToNextSleeper(/*real_wait_ms=*/10);
  dialer.join();
  const auto real = std::chrono::steady_clock::now() - t0;

  ASSERT_TRUE(got.ok()) << got.status().ToString();
  (*got)->Close();
  EXPECT_EQ(wakeups, 3);
  EXPECT_EQ(clock.sleeps_done(), 3u);
  EXPECT_EQ(clock.NowUs(), 1'000'000u + (10'000u + 20'000u + 40'000u) * 1000u);
  EXPECT_LT(real, std::chrono::seconds(10));  // 70 s of backoff took no real time
  EXPECT_EQ(faulty->stats().refused, 3u);
}

}  // namespace
}  // namespace tern

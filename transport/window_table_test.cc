// The receive-window table every backend shares: refusals, checksum,
// generations, and the waits of CancelReceive and Close for a chunk landing
// in progress (the lifetime promise of transport.h).
#include "transport/window_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "transport/internal.h"

namespace tern::transport {
namespace {

using std::chrono::milliseconds;

// How long a test lets a wait that must NOT end run before it concludes
// that it blocks; waits that must end get kDone.
constexpr milliseconds kBlocks{150};
constexpr milliseconds kDone{10000};

struct Memory {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(4096, 0);
  MemoryRegion region() { return MemoryRegion{bytes.data(), bytes.size(), MemoryKind::kHost, 7}; }
};

// Writes `fill` into the landing like a backend would; returns its checksum.
uint64_t Write(const Landing& l, uint8_t fill) {
  std::memset(l.dst, fill, l.length);
  return Xxh3(l.dst, l.length);
}

TEST(WindowTable, PostChecksTheMemoryAndTheId) {
  Memory m;
  WindowTable t("test");
  MemoryRegion unregistered = m.region();
  unregistered.handle = 0;
  EXPECT_EQ(t.Post(1, unregistered, 0, 16, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Post(1, m.region(), 4000, 97, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Post(1, m.region(), 4097, 0, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Post(1, m.region(), 8, UINT64_MAX, nullptr).code(), Code::kInvalidArgument);
  ASSERT_TRUE(t.Post(1, m.region(), 4000, 96, nullptr).ok());
  Status again = t.Post(1, m.region(), 0, 16, nullptr);
  EXPECT_EQ(again.code(), Code::kAlreadyExists);
  EXPECT_NE(again.message().find("test: window 1 already open"), std::string::npos) << again.ToString();
  t.Close();
  EXPECT_EQ(t.Post(2, m.region(), 0, 16, nullptr).code(), Code::kUnavailable);
}

TEST(WindowTable, BeginRefusesWhatTheSenderMustHear) {
  Memory m;
  WindowTable t("test");
  ASSERT_TRUE(t.Post(1, m.region(), 100, 1000, nullptr, /*handle=*/42).ok());
  EXPECT_EQ(t.Begin(2, 0, 1).status().code(), Code::kNotFound);
  EXPECT_EQ(t.Begin(1, 999, 2).status().code(), Code::kOutOfRange);
  EXPECT_EQ(t.Begin(1, 1001, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(t.Begin(1, 8, UINT64_MAX - 4).status().code(), Code::kOutOfRange);  // no wrap-around
  EXPECT_EQ(t.landings(), 0u);
  Result<Landing> l = t.Begin(1, 999, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->dst, m.bytes.data() + 100 + 999);
  EXPECT_EQ(l->handle, 42u);
  EXPECT_EQ(t.landings(), 1u);
  t.Abort(*l);
  EXPECT_EQ(t.landings(), 0u);
}

TEST(WindowTable, FinishVerifiesThenRunsOnLanded) {
  Memory m;
  WindowTable t("test");
  std::vector<std::pair<uint64_t, uint64_t>> landed;
  ASSERT_TRUE(t.Post(1, m.region(), 0, 4096, [&](uint64_t o, uint64_t n) { landed.push_back({o, n}); }).ok());
  Result<Landing> good = t.Begin(1, 64, 32);
  Result<Landing> bad = t.Begin(1, 128, 32);
  ASSERT_TRUE(good.ok() && bad.ok());
  const uint64_t sum = Write(*good, 0xab);
  EXPECT_TRUE(t.Finish(*good, Status::Ok(), sum).ok());
  Write(*bad, 0xcd);
  EXPECT_EQ(t.Finish(*bad, Status::Ok(), sum).code(), Code::kCorrupt);
  Result<Landing> failed = t.Begin(1, 0, 8);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(t.Finish(*failed, TERN_ERROR(kTimeout, "link"), 0).code(), Code::kTimeout);
  ASSERT_EQ(landed.size(), 1u);  // only the good chunk
  EXPECT_EQ(landed[0], std::make_pair(uint64_t{64}, uint64_t{32}));
  EXPECT_EQ(t.landings(), 0u);
}

TEST(WindowTable, AChunkForACancelledWindowIsNotFoundEvenWhenTheIdIsPostedAgain) {
  Memory m;
  WindowTable t("test");
  int old_calls = 0, new_calls = 0;
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&](uint64_t, uint64_t) { ++old_calls; }).ok());
  Result<Landing> l = t.Begin(1, 0, 16);
  ASSERT_TRUE(l.ok());
  const uint64_t sum = Write(*l, 1);
  // Without waiting (as a backend's own thread would), then a new window
  // under the same id: the old landing belongs to neither.
  t.Cancel(1, LandingWait{false, 0});
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&](uint64_t, uint64_t) { ++new_calls; }).ok());
  EXPECT_EQ(t.Finish(*l, Status::Ok(), sum).code(), Code::kNotFound);
  EXPECT_EQ(old_calls + new_calls, 0);
  Result<Landing> fresh = t.Begin(1, 0, 16);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(t.Finish(*fresh, Status::Ok(), Write(*fresh, 2)).ok());
  EXPECT_EQ(new_calls, 1);
}

TEST(WindowTable, CancelWaitsForTheBytesBeingWritten) {
  Memory m;
  WindowTable t("test");
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, nullptr).ok());
  Result<Landing> l = t.Begin(1, 0, 64);
  ASSERT_TRUE(l.ok());
  auto cancel = std::async(std::launch::async, [&] { t.Cancel(1, LandingWait{}); });
  EXPECT_EQ(cancel.wait_for(kBlocks), std::future_status::timeout) << "Cancel returned mid-landing";
  const uint64_t sum = Write(*l, 3);  // still ours to write
  EXPECT_EQ(t.Finish(*l, Status::Ok(), sum).code(), Code::kNotFound);
  EXPECT_EQ(cancel.wait_for(kDone), std::future_status::ready);
}

TEST(WindowTable, CancelWaitsForOnLandedOfAnotherThread) {
  Memory m;
  WindowTable t("test");
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> running{false};
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&](uint64_t, uint64_t) {
                 running = true;
                 entered.set_value();
                 released.wait();
                 running = false;
               }).ok());
  Result<Landing> l = t.Begin(1, 0, 8);
  ASSERT_TRUE(l.ok());
  const uint64_t sum = Write(*l, 4);
  auto finish = std::async(std::launch::async, [&] { return t.Finish(*l, Status::Ok(), sum); });
  ASSERT_EQ(entered.get_future().wait_for(kDone), std::future_status::ready);
  auto cancel = std::async(std::launch::async, [&] {
    t.Cancel(1, LandingWait{});
    return running.load();  // must be false: on_landed is over
  });
  EXPECT_EQ(cancel.wait_for(kBlocks), std::future_status::timeout) << "Cancel returned during on_landed";
  release.set_value();
  ASSERT_EQ(cancel.wait_for(kDone), std::future_status::ready);
  EXPECT_FALSE(cancel.get());
  EXPECT_TRUE(finish.get().ok());
}

TEST(WindowTable, CancelFromInsideOnLandedWaitsOnlyForOtherLandings) {
  Memory m;
  WindowTable t("test");
  std::atomic<bool> other_done{false};
  std::atomic<bool> saw_other_done{false};
  std::atomic<bool> inside_ended{false};
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&](uint64_t offset, uint64_t) {
                 if (offset != 0) return;
                 // Cancel in its two steps, bounded so that a wait for this
                 // very landing fails the test instead of hanging it.
                 std::optional<uint64_t> generation = t.Remove(1);
                 inside_ended = generation && t.WaitLandings(*generation, LandingWait{true, 5000});
                 saw_other_done = other_done.load();
               }).ok());
  Result<Landing> own = t.Begin(1, 0, 8);
  Result<Landing> other = t.Begin(1, 32, 8);
  ASSERT_TRUE(own.ok() && other.ok());
  const uint64_t own_sum = Write(*own, 5);
  const uint64_t other_sum = Write(*other, 6);
  auto finish = std::async(std::launch::async, [&] { return t.Finish(*own, Status::Ok(), own_sum); });
  EXPECT_EQ(finish.wait_for(kBlocks), std::future_status::timeout)
      << "Cancel inside on_landed did not wait for the other landing";
  other_done = true;
  EXPECT_EQ(t.Finish(*other, Status::Ok(), other_sum).code(), Code::kNotFound);
  ASSERT_EQ(finish.wait_for(kDone), std::future_status::ready) << "Cancel waited for its own landing";
  EXPECT_TRUE(finish.get().ok());
  EXPECT_TRUE(inside_ended) << "the wait inside on_landed waited for its own landing";
  EXPECT_TRUE(saw_other_done);
}

TEST(WindowTable, WaitsAreBoundedWhenAsked) {
  Memory m;
  WindowTable t("test");
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, nullptr).ok());
  ASSERT_TRUE(t.Post(2, m.region(), 0, 64, nullptr).ok());
  Result<Landing> l1 = t.Begin(1, 0, 8);
  Result<Landing> l2 = t.Begin(2, 0, 8);
  ASSERT_TRUE(l1.ok() && l2.ok());
  std::optional<uint64_t> g1 = t.Remove(1);
  ASSERT_TRUE(g1.has_value());
  EXPECT_FALSE(t.Remove(1).has_value());
  EXPECT_FALSE(t.WaitLandings(*g1, LandingWait{false, 0}));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(t.WaitLandings(*g1, LandingWait{true, 50}));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(50));
  t.Abort(*l1);
  EXPECT_TRUE(t.WaitLandings(*g1, LandingWait{true, 50}));  // window 2's landing does not count
  EXPECT_FALSE(t.WaitIdle(LandingWait{true, 20}));
  t.Abort(*l2);
  EXPECT_TRUE(t.WaitIdle(LandingWait{true, 20}));
}

TEST(WindowTable, AfterCloseNothingLandsButCancelStillWaits) {
  Memory m;
  WindowTable t("test");
  auto owned = std::make_shared<int>(1);
  int calls = 0;
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&calls, owned](uint64_t, uint64_t) { ++calls; }).ok());
  Result<Landing> l = t.Begin(1, 0, 8);
  ASSERT_TRUE(l.ok());
  t.Close();
  EXPECT_EQ(owned.use_count(), 1) << "Close keeps on_landed's captures alive";
  EXPECT_EQ(t.Begin(1, 0, 8).status().code(), Code::kUnavailable);
  // A stream mid-chunk when its connection failed: the caller of
  // CancelReceive may free the window only after it.
  auto cancel = std::async(std::launch::async, [&] { t.Cancel(1, LandingWait{}); });
  EXPECT_EQ(cancel.wait_for(kBlocks), std::future_status::timeout) << "Cancel after Close did not wait";
  EXPECT_EQ(t.Finish(*l, Status::Ok(), Write(*l, 7)).code(), Code::kUnavailable);
  EXPECT_EQ(cancel.wait_for(kDone), std::future_status::ready);
  EXPECT_EQ(calls, 0);
}

TEST(WindowTable, EndAllWakesWaitersAndLateFinishesDoNothing) {
  Memory m;
  WindowTable t("test");
  int calls = 0;
  ASSERT_TRUE(t.Post(1, m.region(), 0, 64, [&](uint64_t, uint64_t) { ++calls; }).ok());
  Result<Landing> l = t.Begin(1, 0, 8);
  ASSERT_TRUE(l.ok());
  auto idle = std::async(std::launch::async, [&] { return t.WaitIdle(LandingWait{}); });
  EXPECT_EQ(idle.wait_for(kBlocks), std::future_status::timeout);
  t.EndAll();  // the device is gone: nothing writes the window any more
  ASSERT_EQ(idle.wait_for(kDone), std::future_status::ready);
  EXPECT_TRUE(idle.get());
  EXPECT_EQ(t.landings(), 0u);
  // The window is still open, but the landing is over: its memory is not
  // read (a wrong checksum would say kCorrupt) and on_landed does not run.
  EXPECT_EQ(t.Finish(*l, Status::Ok(), 0).code(), Code::kUnavailable);
  t.Abort(*l);  // harmless
  EXPECT_EQ(t.landings(), 0u);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace tern::transport

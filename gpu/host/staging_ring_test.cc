// The staging ring's logic (gpu/host/staging_ring.h) with a fake copy engine that,
// like a real asynchronous copy, reads the slot's bytes only when the copy
// completes: a ring that handed out a slot whose copy was still in flight
// would let the receiver overwrite bytes not yet copied, and the destination
// would show it.
#include "gpu/host/staging_ring.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace tern::gpu {
namespace {

class FakeEngine : public CopyEngine {
 public:
  explicit FakeEngine(uint64_t dst_bytes) : dst(dst_bytes, 0) {}

  Status Start(int slot, const uint8_t* src, uint64_t n, uint64_t off) override {
    if (fail_start) return TERN_ERROR(kUnavailable, "fake: start failed");
    EXPECT_EQ(pending.count(slot), 0u) << "slot " << slot << " started twice while in flight";
    pending[slot] = {src, n, off};
    ++starts;
    max_pending = std::max<int>(max_pending, static_cast<int>(pending.size()));
    return Status::Ok();
  }
  Result<bool> Done(int slot) override {
    auto it = pending.find(slot);
    if (it == pending.end()) return true;
    if (!finished.count(slot)) return false;
    Complete(slot);
    return true;
  }
  Status Wait(int slot) override {
    ++waits;
    waited.push_back(slot);
    if (fail_wait) return TERN_ERROR(kIo, "fake: copy failed");
    if (pending.count(slot)) Complete(slot);
    return Status::Ok();
  }
  // Marks a slot's copy finished (its bytes are read now).
  void Finish(int slot) { finished[slot] = true; }

  std::vector<uint8_t> dst;
  int starts = 0, waits = 0, max_pending = 0;
  std::vector<int> waited;
  bool fail_start = false, fail_wait = false;

 private:
  struct Copy {
    const uint8_t* src;
    uint64_t n, off;
  };
  void Complete(int slot) {
    const Copy c = pending[slot];
    std::copy(c.src, c.src + c.n, dst.begin() + static_cast<std::ptrdiff_t>(c.off));
    pending.erase(slot);
    finished.erase(slot);
  }
  std::map<int, Copy> pending;
  std::map<int, bool> finished;
};

struct Buffers {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> ptrs;
  Buffers(int n, uint64_t bytes) : storage(n, std::vector<uint8_t>(bytes)) {
    for (auto& s : storage) ptrs.push_back(s.data());
  }
};

TEST(GpuStagingRing, StreamLandsInOrderAndIntactWithBoundedSlots) {
  std::mt19937_64 rng(31);
  for (int slots : {1, 2, 3, 5}) {
    for (uint64_t slot_bytes : {uint64_t{1}, uint64_t{7}, uint64_t{4096}}) {
      std::vector<uint8_t> stream(20000 + rng() % 5000);
      for (auto& b : stream) b = static_cast<uint8_t>(rng());
      FakeEngine engine(stream.size());
      Buffers buf(slots, slot_bytes);
      StagingRing ring(buf.ptrs, slot_bytes, stream.size(), &engine);
      uint64_t at = 0;
      while (at < stream.size()) {
        const uint64_t n = std::min<uint64_t>(1 + rng() % (3 * slot_bytes), stream.size() - at);
        ASSERT_TRUE(ring.Push({stream.data() + at, n}).ok());
        at += n;
        ASSERT_LE(ring.in_flight(), slots);
        ASSERT_LE(ring.bytes_done(), ring.bytes_submitted());
        // Finish some copies at random, as a copy engine would.
        if (rng() % 3 == 0)
          for (int s = 0; s < slots; ++s) engine.Finish(s);
      }
      ASSERT_TRUE(ring.Drain().ok());
      EXPECT_EQ(ring.bytes_done(), stream.size());
      EXPECT_EQ(ring.in_flight(), 0);
      EXPECT_LE(engine.max_pending, slots);
      ASSERT_EQ(engine.dst, stream) << slots << " slots of " << slot_bytes;
    }
  }
}

TEST(GpuStagingRing, AFullRingWaitsForItsOldestCopy) {
  FakeEngine engine(100);
  Buffers buf(3, 10);
  StagingRing ring(buf.ptrs, 10, 100, &engine);
  for (int i = 0; i < 3; ++i) {
    auto s = ring.Acquire();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(ring.state(i), SlotState::kFilling);
    ASSERT_TRUE(ring.Submit(10).ok());
    EXPECT_EQ(ring.state(i), SlotState::kInFlight);
  }
  EXPECT_EQ(engine.waits, 0);
  // Full: the next Acquire is slot 0 again, after waiting for slot 0's copy.
  auto s = ring.Acquire();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->data(), buf.ptrs[0]);
  ASSERT_EQ(engine.waited, std::vector<int>{0});
  EXPECT_EQ(ring.bytes_done(), 10u);
  EXPECT_EQ(ring.state(1), SlotState::kInFlight);
  ASSERT_TRUE(ring.Submit(5).ok());
  s = ring.Acquire();  // slot 1 now
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->data(), buf.ptrs[1]);
  EXPECT_EQ(engine.waited, (std::vector<int>{0, 1}));
}

TEST(GpuStagingRing, DoneCoversOnlyAFinishedPrefix) {
  FakeEngine engine(100);
  Buffers buf(3, 10);
  StagingRing ring(buf.ptrs, 10, 100, &engine);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ring.Acquire().ok());
    ASSERT_TRUE(ring.Submit(10).ok());
  }
  engine.Finish(2);
  engine.Finish(1);
  ASSERT_TRUE(ring.Poll().ok());
  EXPECT_EQ(ring.bytes_done(), 0u) << "slot 0 still in flight";
  EXPECT_EQ(ring.state(1), SlotState::kInFlight);
  engine.Finish(0);
  ASSERT_TRUE(ring.Poll().ok());
  EXPECT_EQ(ring.bytes_done(), 30u);
  EXPECT_EQ(ring.state(0), SlotState::kFree);
  EXPECT_EQ(ring.in_flight(), 0);
}

TEST(GpuStagingRing, RefusesMisuseAndBounds) {
  FakeEngine engine(25);
  Buffers buf(2, 10);
  StagingRing ring(buf.ptrs, 10, 25, &engine);
  EXPECT_EQ(ring.Submit(1).code(), Code::kInvalidArgument);  // no slot acquired
  ASSERT_TRUE(ring.Acquire().ok());
  EXPECT_EQ(ring.Acquire().status().code(), Code::kInvalidArgument);  // one slot fills at a time
  EXPECT_EQ(ring.Submit(11).code(), Code::kInvalidArgument);          // more than a slot
  ASSERT_TRUE(ring.Submit(0).ok());                                    // nothing: slot back, unused
  EXPECT_EQ(ring.state(0), SlotState::kFree);
  EXPECT_EQ(engine.starts, 0);
  ASSERT_TRUE(ring.Push(std::vector<uint8_t>(25, 1)).ok());
  ASSERT_TRUE(ring.Acquire().ok());
  EXPECT_EQ(ring.Submit(1).code(), Code::kResourceExhausted);  // past the destination
  StagingRing empty({}, 10, 10, &engine);
  EXPECT_EQ(empty.Acquire().status().code(), Code::kInvalidArgument);
}

TEST(GpuStagingRing, EngineErrorsAreSticky) {
  {
    FakeEngine engine(100);
    Buffers buf(2, 10);
    StagingRing ring(buf.ptrs, 10, 100, &engine);
    engine.fail_start = true;
    EXPECT_EQ(ring.Push(std::vector<uint8_t>(5, 1)).code(), Code::kUnavailable);
    engine.fail_start = false;
    EXPECT_EQ(ring.Acquire().status().code(), Code::kUnavailable);
    EXPECT_EQ(ring.Drain().code(), Code::kUnavailable);
  }
  {
    FakeEngine engine(100);
    Buffers buf(1, 10);
    StagingRing ring(buf.ptrs, 10, 100, &engine);
    ASSERT_TRUE(ring.Push(std::vector<uint8_t>(10, 1)).ok());
    engine.fail_wait = true;
    EXPECT_EQ(ring.Drain().code(), Code::kIo);
    engine.fail_wait = false;
    EXPECT_EQ(ring.Push(std::vector<uint8_t>(1, 1)).code(), Code::kIo);
    EXPECT_EQ(ring.bytes_done(), 0u);
  }
}

}  // namespace
}  // namespace tern::gpu

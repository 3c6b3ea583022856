#include "tern/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>

namespace tern {
namespace {

TEST(ThreadPool, RunsEveryItemOnce) {
  ThreadPool pool(4);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(1000);
    pool.ParallelFor(hits.size(), [&](uint64_t i) { hits[i]++; });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, SingleThreadAndEmpty) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1u);
  uint64_t sum = 0;
  pool.ParallelFor(0, [&](uint64_t) { sum += 1; });
  pool.ParallelFor(10, [&](uint64_t i) { sum += i; });
  EXPECT_EQ(sum, 45u);
}

}  // namespace
}  // namespace tern

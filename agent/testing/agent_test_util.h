// Helpers shared by the agent system tests (agent_test.cc, agent_edge_test.cc,
// agent_adversary_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/thread_pool.h"

namespace tern::agent_test {

// Bounded waits on real time: the agents run their own threads.
inline bool WaitFor(const std::function<bool()>& cond, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// "" when every tensor's bytes are equal (names, layouts and data), else the
// first difference.
inline std::string FirstDifference(const std::string& a_path, const std::string& b_path) {
  auto a = Checkpoint::Open(a_path);
  auto b = Checkpoint::Open(b_path);
  if (!a.ok()) return "cannot open " + a_path + ": " + a.status().ToString();
  if (!b.ok()) return "cannot open " + b_path + ": " + b.status().ToString();
  const ServeView& va = (*a)->view();
  const ServeView& vb = (*b)->view();
  if (va.tensors.size() != vb.tensors.size()) return "tensor counts differ";
  for (size_t i = 0; i < va.tensors.size(); ++i) {
    const auto& ta = va.tensors[i];
    const auto& tb = vb.tensors[i];
    if (!ta.desc->SameLayout(*tb.desc) || ta.desc->name != tb.desc->name) return "layout of " + ta.desc->name;
    if (std::memcmp(ta.data, tb.data, ta.desc->bytes()) != 0) return "bytes of " + ta.desc->name;
  }
  return "";
}

// What the system-test fixtures start from (AgentSystemFixture in
// agent_test_fixture.h, AgentEdgeTest): a datagen trace of a
// ~400k-parameter model, stepped version by version into checkpoint
// directories under a per-test temporary directory (removed at TearDown).
// A subclass that overrides TearDown stops its agents first, then calls
// TraceTest::TearDown.
class TraceTest : public ::testing::Test {
 protected:
  TraceTest(std::string dir_prefix, uint64_t seed)
      : dir_prefix_(std::move(dir_prefix)), seed_(seed) {}

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (dir_prefix_ + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "trace");
    TraceConfig config;
    auto shape = ChooseModelShape(400'000);
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    config.shape = *shape;
    config.seed = seed_;
    config.adam.lr = 1e-5;
    auto gen = TraceGenerator::Create(config, pool_);
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    gen_ = std::move(gen).value();
  }

  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The trace's next step as a checkpoint directory (also kept in steps_);
  // returns its path.
  std::string NextStep() {
    EXPECT_TRUE(gen_->Step().ok());
    const std::string path = (dir_ / "trace" / ("step-" + std::to_string(gen_->step()))).string();
    CreateOptions co;
    EXPECT_TRUE(WriteTraceCheckpoint(*gen_, path, {}, co, pool_).ok());
    steps_[gen_->step()] = path;
    return path;
  }

  std::filesystem::path dir_;
  ThreadPool pool_{1};
  std::unique_ptr<TraceGenerator> gen_;    // declared after pool_, which it runs on
  std::map<uint64_t, std::string> steps_;  // by version

 private:
  std::string dir_prefix_;
  uint64_t seed_;
};

}  // namespace tern::agent_test

// The fixture of the agent system tests (agent_test.cc,
// agent_adversary_test.cc, agent_relay_only_test.cc): one process, agents over one loopback network
// (each with its own transport, optionally behind a FaultTransport), a
// datagen trace published version by version, and bitwise checks of every
// member's DIR/current against the published checkpoint.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/fault_transport.h"
#include "tern/loopback_transport.h"
#include "tern/thread_pool.h"

namespace tern::agent_test {

namespace fs = std::filesystem;

class AgentSystemFixture : public TraceTest {
 protected:
  AgentSystemFixture() : TraceTest("tern-agent-test-", 7) {}

  void TearDown() override {
    for (auto& [id, a] : members_) a.agent.reset();
    root_.reset();
    transports_.clear();
    TraceTest::TearDown();
  }

  Transport* NewTransportFor(const std::string& name, const FaultPolicy* fault = nullptr) {
    auto& slot = transports_[name];
    slot.inner = NewLoopbackTransport(net_);
    if (fault) slot.fault = NewFaultTransport(*slot.inner, *fault);
    return slot.fault ? static_cast<Transport*>(slot.fault.get()) : slot.inner.get();
  }

  AgentOptions BaseOptions(const std::string& name) {
    AgentOptions o;
    o.listen = name;
    o.id = name;
    o.data_dir = (dir_ / name).string();
    o.heartbeat_ms = 100;
    o.dead_after_ms = 1000;
    o.threads = 1;
    o.fanout_max = 2;
    o.root_fanout_max = 3;
    o.keyframe_every = 4;
    // Every agent of the board holds it: joins, SUBSCRIBE and the root's
    // catch-up object service (LateAndLaggingMembersCatchUp) all need it.
    o.join_token = "join-token-of-this-board";
    if (tweak_) tweak_(o);
    return o;
  }

  void StartRoot(uint32_t root_fanout = 3, const FaultPolicy* fault = nullptr) {
    AgentOptions o = BaseOptions("root");
    o.root_fanout_max = root_fanout;
    o.root = true;
    o.region = "us";
    o.transport = NewTransportFor("root", fault);
    auto a = Agent::Start(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    root_ = std::move(a).value();
    root_key_ = root_->PublicKeyPem();
  }

  void StartMember(const std::string& name, const std::string& region,
                   const FaultPolicy* fault = nullptr) {
    AgentOptions o = BaseOptions(name);
    o.join = "root";
    o.region = region;
    o.trusted_keys_pem = {root_key_};
    o.spare_grace_ms = spare_grace_ms_;
    o.transport = NewTransportFor(name, fault);
    auto a = Agent::Start(o);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status().ToString();
    members_[name].agent = std::move(a).value();
    members_[name].dir = o.data_dir;
  }

  void StopMember(const std::string& name) {
    members_[name].agent->Stop();
    members_[name].agent.reset();
    transports_.erase(name);
  }

  void Publish(uint64_t version) {
    const std::string path = NextStep();
    ASSERT_EQ(gen_->step(), version);
    Status s = root_->Publish(path, version);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  bool AllServe(uint64_t version, double seconds = 60) {
    return WaitFor(
        [&] {
          for (auto& [id, m] : members_)
            if (m.agent && m.agent->Snapshot().served_version != version) return false;
          return true;
        },
        seconds);
  }

  std::string Lagging(uint64_t version) {
    std::string out;
    for (auto& [id, m] : members_)
      if (m.agent && m.agent->Snapshot().served_version != version)
        out += id + "@" + std::to_string(m.agent->Snapshot().served_version) + " ";
    return out;
  }

  // The engine a member drives (--engine): its status, and a wait until it
  // serves `version`.
  AgentEngineStatus EngineOf(const std::string& name) {
    auto s = members_[name].agent->Snapshot();
    EXPECT_TRUE(s.has_engine) << name << " drives no engine";
    return s.engine;
  }
  bool EngineServes(const std::string& name, uint64_t version, double seconds = 60) {
    return WaitFor([&] { return EngineOf(name).version == version; }, seconds);
  }

  void ExpectBitwiseEqual(uint64_t version) {
    for (auto& [id, m] : members_) {
      if (!m.agent) continue;
      EXPECT_EQ(FirstDifference(m.dir + "/current", steps_[version]), "")
          << id << " at version " << version;
    }
  }

  struct Slot {
    std::unique_ptr<Transport> inner;
    std::unique_ptr<FaultTransport> fault;
  };
  struct Member {
    std::unique_ptr<Agent> agent;
    std::string dir;
  };

  // Agents started after CaptureLogs log into log_ as "[id] line"; `also`
  // changes their options further (tweak_ is taken by the capture).
  void CaptureLogs(std::function<void(AgentOptions&)> also = nullptr) {
    tweak_ = [log = log_, also = std::move(also)](AgentOptions& o) {
      if (also) also(o);
      o.log = [log, id = o.id](std::string_view line) {
        std::lock_guard<std::mutex> lock(log->mu);
        log->lines.push_back("[" + id + "] " + std::string(line));
      };
    };
  }

  // Captured lines of agent `id` that contain `part` (and `also`, if given).
  size_t Logged(const std::string& id, const std::string& part, const std::string& also = "") {
    std::lock_guard<std::mutex> lock(log_->mu);
    size_t n = 0;
    for (const auto& l : log_->lines)
      n += l.rfind("[" + id + "] ", 0) == 0 && l.find(part) != std::string::npos &&
           l.find(also) != std::string::npos;
    return n;
  }

  struct Lines {
    std::mutex mu;
    std::vector<std::string> lines;
  };
  // Shared with the agents' log functions, which may outlive a test body.
  std::shared_ptr<Lines> log_ = std::make_shared<Lines>();

  LoopbackNetwork net_;
  std::map<std::string, Slot> transports_;
  std::unique_ptr<Agent> root_;
  std::string root_key_;
  std::map<std::string, Member> members_;
  uint32_t spare_grace_ms_ = AgentOptions{}.spare_grace_ms;
  std::function<void(AgentOptions&)> tweak_;  // applied to every agent's options
};

}  // namespace tern::agent_test

// Per-edge transports (docs/agent.md §5): edges inside one cluster run on
// the agents' intra-cluster transport, every other edge (and control) on
// the main one. One process: each cluster is its own loopback network (its
// "LAN") and the main transports share another (the "WAN"), so an edge
// dialled with the wrong transport cannot connect at all; and every
// transport counts its dials, so an edge that quietly took the main
// transport where the intra one was due is caught too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/loopback_transport.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using agent_test::FirstDifference;
using agent_test::WaitFor;

// A transport that counts the connections dialled through it, under its
// inner transport's name or another (a second "backend").
class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(std::unique_ptr<Transport> inner, std::string name = "")
      : inner_(std::move(inner)), name_(std::move(name)) {}
  std::string name() const override { return name_.empty() ? inner_->name() : name_; }
  uint32_t capabilities() const override { return inner_->capabilities(); }
  Result<MemoryRegion> RegisterMemory(void* base, uint64_t size, MemoryKind kind) override {
    return inner_->RegisterMemory(base, size, kind);
  }
  Status DeregisterMemory(const MemoryRegion& region) override {
    return inner_->DeregisterMemory(region);
  }
  Result<std::unique_ptr<Listener>> Listen(const std::string& address,
                                           AcceptHandler on_accept) override {
    return inner_->Listen(address, std::move(on_accept));
  }
  void Connect(const std::string& address, ConnectionHandlers handlers, ConnectDone done) override {
    auto ok = ok_;
    inner_->Connect(address, std::move(handlers),
                    [ok, done = std::move(done)](Result<std::shared_ptr<Connection>> r) {
                      if (r.ok()) ++*ok;
                      done(std::move(r));
                    });
  }
  uint64_t connected() const { return ok_->load(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::string name_;
  std::shared_ptr<std::atomic<uint64_t>> ok_ = std::make_shared<std::atomic<uint64_t>>(0);
};

struct Place {
  std::string region, cluster;
  bool intra = true;  // has an intra-cluster transport
  // Its intra backend's name; empty: the loopback's. Each backend of a
  // cluster is a network of its own: members of one cluster whose backends
  // differ cannot reach each other's intra listeners.
  std::string backend = "";
};

class AgentEdgeTest : public agent_test::TraceTest {
 protected:
  AgentEdgeTest() : TraceTest("tern-agent-edge-test-", 11) {}

  void TearDown() override {
    while (!agents_.empty()) agents_.pop_back();  // the root last: it was started first
    main_.clear();
    intra_.clear();
    TraceTest::TearDown();
  }

  Status Start(const std::string& name, const Place& place) {
    AgentOptions o;
    o.root = name == "root";
    o.join = o.root ? "" : "root";
    o.listen = name;
    o.id = name;
    o.region = place.region;
    o.cluster = place.cluster;
    o.data_dir = (dir_ / name).string();
    o.heartbeat_ms = 100;
    o.dead_after_ms = 1000;
    o.threads = 1;
    o.fanout_max = 2;
    o.root_fanout_max = 2;
    o.keyframe_every = 4;
    // A broken edge must show, not be planned around.
    o.parent_stall_ms = 0;
    o.join_token = "join-token";
    if (!o.root) o.trusted_keys_pem = {root_key_};
    main_[name] = std::make_unique<CountingTransport>(NewLoopbackTransport(wan_));
    o.transport = main_[name].get();
    if (place.intra) {
      intra_[name] = std::make_unique<CountingTransport>(
          NewLoopbackTransport(lans_[place.region + "/" + place.cluster + "/" + place.backend]),
          place.backend);
      o.intra_transport = intra_[name].get();
      o.listen_intra = name + "@lan";  // exists on its cluster's LAN only
    }
    places_[name] = place;
    TERN_ASSIGN_OR_RETURN(auto agent, Agent::Start(o));
    if (o.root) root_key_ = agent->PublicKeyPem();
    agents_.emplace_back(name, std::move(agent));
    return Status::Ok();
  }
  Agent& root() { return *agents_.front().second; }

  std::string Lagging(uint64_t version) {
    std::string out;
    for (auto& [id, a] : agents_)
      if (id != "root" && a->Snapshot().served_version != version)
        out += id + "@" + std::to_string(a->Snapshot().served_version) + " ";
    return out;
  }

  // Publishes versions 1..n; every member serves each bit for bit.
  void PublishAndCheck(uint64_t n) {
    for (uint64_t v = 1; v <= n; ++v) {
      const std::string step = NextStep();
      ASSERT_TRUE(root().Publish(step, v).ok());
      ASSERT_TRUE(WaitFor([&] { return Lagging(v).empty(); }, 60))
          << "version " << v << " not served by: " << Lagging(v);
      for (auto& [id, a] : agents_) {
        if (id == "root") continue;
        EXPECT_EQ(FirstDifference((dir_ / id / "current").string(), step), "") << id;
      }
    }
  }

  // Each member dialled its parent (and its probe) with the transport the
  // edge called for, and nothing with the other: the intra one exactly
  // when both ends are in one cluster and run the same intra backend. (A
  // member's main transport also dials the root's control port: compared
  // with >= 1.) Counts the edges of each kind.
  void ExpectEdgeTransports(int* intra_edges, int* main_edges) {
    const AgentSnapshot s = root().Snapshot();
    for (const auto& m : s.members) {
      const Place& child = places_[m.id];
      const Place& parent = places_[m.parent];
      const bool intra = child.intra && parent.intra && child.region == parent.region &&
                         child.cluster == parent.cluster && child.backend == parent.backend;
      (intra ? *intra_edges : *main_edges)++;
      if (child.intra) {
        EXPECT_EQ(intra_[m.id]->connected() > 0, intra) << m.id << " under " << m.parent;
      }
      EXPECT_GE(main_[m.id]->connected(), intra ? 1u : 2u) << m.id << " under " << m.parent;
    }
  }

  LoopbackNetwork wan_;
  std::map<std::string, LoopbackNetwork> lans_;  // by region/cluster/backend
  std::map<std::string, std::unique_ptr<CountingTransport>> main_, intra_;
  std::map<std::string, Place> places_;
  std::vector<std::pair<std::string, std::unique_ptr<Agent>>> agents_;
  std::string root_key_;
};

TEST_F(AgentEdgeTest, EdgesInsideAClusterUseTheIntraTransportAndTheRestTheMainOne) {
  ASSERT_TRUE(Start("root", {"us", "c0"}).ok());
  std::map<std::string, Place> members = {
      {"a0", {"us", "c0"}},
      {"a1", {"us", "c0"}},
      {"a2", {"us", "c0"}},
      {"b0", {"us", "c1"}},
      {"b1", {"us", "c1"}},
      {"b2", {"us", "c1"}},
      {"b3",
       {"us", "c1", /*intra=*/false}},  // a member of c1 without one: main transport both ways
      {"e0", {"eu", "c1"}},
      {"e1", {"eu", "c1"}},
      {"e2", {"eu", "c1"}},  // "c1" again, another region
  };
  for (const auto& [name, place] : members) ASSERT_TRUE(Start(name, place).ok()) << name;
  ASSERT_TRUE(WaitFor([&] { return root().Snapshot().members.size() == members.size(); }, 30));
  for (auto& [id, a] : agents_) {
    EXPECT_EQ(a->Snapshot().intra_address.empty(), !places_[id].intra) << id;
  }

  PublishAndCheck(3);
  // The plan must have held both kinds of edge for this to mean anything.
  int intra_edges = 0, main_edges = 0;
  ExpectEdgeTransports(&intra_edges, &main_edges);
  EXPECT_GE(intra_edges, 3) << "the plan kept few edges inside a cluster";
  EXPECT_GE(main_edges, 2);
}

// One cluster, two intra backends (two members chose another one, as a
// member whose machine lacks the cluster's backend would after its own
// choice): HELLO names each member's backend and the root gives an edge
// inside the cluster the intra transport only when both ends run the same
// one. Before, the "other" members were sent a parent's intra address their
// transport cannot reach, and stalled.
TEST_F(AgentEdgeTest, AMemberWithAnotherIntraBackendStillGetsEveryVersion) {
  ASSERT_TRUE(Start("root", {"us", "c0"}).ok());
  std::map<std::string, Place> members = {
      {"a0", {"us", "c0"}},
      {"a1", {"us", "c0"}},
      {"a2", {"us", "c0"}},
      {"x0", {"us", "c0", true, "other"}},
      {"x1", {"us", "c0", true, "other"}},
  };
  for (const auto& [name, place] : members) ASSERT_TRUE(Start(name, place).ok()) << name;
  ASSERT_TRUE(WaitFor([&] { return root().Snapshot().members.size() == members.size(); }, 30));
  PublishAndCheck(3);
  int intra_edges = 0, main_edges = 0;
  ExpectEdgeTransports(&intra_edges, &main_edges);
  // Every edge stays in c0, so each main edge is a mixed pair; one of the
  // "other" members hangs under a loopback one (or the root) at least.
  EXPECT_GE(main_edges, 1) << "no edge between backends: the test shows nothing";
  EXPECT_GE(intra_edges, 1);
}

}  // namespace
}  // namespace tern

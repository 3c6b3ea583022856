// The agent end to end, in one process over the loopback transport: a root
// and members in several regions, versions from a datagen trace, and every
// member's DIR/current compared bit for bit with what was published.
// (Multi-process runs over TCP: tests/agent/ and `tern demo`.)
#include "tern/agent.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/control/control_wire.h"
#include "agent/ops/admin_http.h"
#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/agent_test_util.h"
#include "agent/testing/etcd_test_server.h"
#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/digest.h"
#include "tern/fault_transport.h"
#include "tern/loopback_transport.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tern/version_manifest.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using agent_test::FirstDifference;
using agent_test::WaitFor;

// The fixture (agents on one loopback network, a datagen trace, bitwise
// checks) is shared with agent_adversary_test.cc: agent/agent_test_fixture.h.
class AgentSystemTest : public agent_test::AgentSystemFixture {};

TEST_F(AgentSystemTest, SixteenMembersInThreeRegionsServeTenVersionsBitForBit) {
  StartRoot();
  const char* regions[] = {"us", "eu", "ap"};
  for (int i = 0; i < 16; ++i) StartMember("m" + std::to_string(i), regions[i % 3]);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 16; }, 30));
  for (uint64_t v = 1; v <= 10; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << "version " << v << " not served by: " << Lagging(v);
    ExpectBitwiseEqual(v);
  }
  // The root saw every member serve every version (from their next
  // heartbeats: AllServe read the members' own statuses), and the tree was
  // region-aware: a member's parent is in its own region or the root.
  ASSERT_TRUE(WaitFor(
      [&] {
        const AgentSnapshot now = root_->Snapshot();
        return std::all_of(now.members.begin(), now.members.end(),
                           [](const auto& m) { return m.served_version == 10; });
      },
      30));
  const AgentSnapshot s = root_->Snapshot();
  std::map<std::string, std::string> region;
  for (const auto& m : s.members) region[m.id] = m.region;
  for (const auto& m : s.members) {
    EXPECT_EQ(m.served_version, 10u) << m.id;
    if (m.parent != "root") {
      EXPECT_EQ(region[m.parent], m.region) << m.id << " under " << m.parent;
    }
  }
  ASSERT_EQ(s.versions.size(), 10u);
  for (const auto& v : s.versions) EXPECT_GE(v.last_served_s, 0) << "version " << v.version;
}

// Status is read by other threads (the admin port, `tern status`, an
// embedding scheduler) while the work thread applies versions: every
// snapshot names a version with that version's digest, never a torn or
// mismatched pair (issue 24: Snapshot read ViewStore's state while the work
// thread assigned it; ThreadSanitizer's build runs this).
TEST_F(AgentSystemTest, StatusReadWhileVersionsApplyIsConsistent) {
  StartRoot();
  StartMember("a", "us");
  StartMember("b", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  std::mutex mu;
  std::map<uint64_t, ViewDigest> published;  // version -> the root's digest of it
  published[0] = ViewDigest{};
  std::vector<std::pair<uint64_t, ViewDigest>> seen;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      for (auto* m : {members_["a"].agent.get(), members_["b"].agent.get()}) {
        const AgentSnapshot s = m->Snapshot();
        std::lock_guard<std::mutex> lock(mu);
        seen.emplace_back(s.served_version, s.served_digest);
      }
    }
  });
  // Keyframes every 4 versions (the fixture): both kinds of apply run.
  for (uint64_t v = 1; v <= 6; ++v) {
    Publish(v);
    {
      const AgentSnapshot r = root_->Snapshot();
      std::lock_guard<std::mutex> lock(mu);
      published[r.served_version] = r.served_digest;
    }
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  done = true;
  reader.join();
  ExpectBitwiseEqual(6);
  ASSERT_FALSE(seen.empty());
  for (const auto& [version, digest] : seen) {
    ASSERT_TRUE(published.count(version)) << "version " << version;
    EXPECT_TRUE(digest == published[version]) << "version " << version;
  }
}

// The root chooses each version's patch format (docs/agent.md §6a): the
// default until a patch is published and members report apply rates, then
// predicted from them; /status says which format and why, the board's
// patch is in that format, and members serve every version bit for bit
// whatever the choice. --patch-format forces it.
class AgentFormatChoiceTest : public agent_test::AgentSystemFixture {
 protected:
  void PublishFiveAndCheck(uint16_t forced) {
    tweak_ = [forced](AgentOptions& o) { o.patch_format = forced; };
    StartRoot();
    StartMember("a", "us");
    StartMember("b", "eu");
    ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
    for (uint64_t v = 1; v <= 5; ++v) {
      Publish(v);
      ASSERT_TRUE(AllServe(v)) << Lagging(v);
      // The members' heartbeats after their apply reached the root.
      ASSERT_TRUE(WaitFor(
          [&] {
            for (const auto& m : root_->Snapshot().members)
              if (m.served_version != v) return false;
            return true;
          },
          30));
      ExpectBitwiseEqual(v);
    }
    const AgentSnapshot snap = root_->Snapshot();
    ASSERT_EQ(snap.versions.size(), 5u);
    for (const AgentVersionStatus& vs : snap.versions) {
      SCOPED_TRACE("version " + std::to_string(vs.version) + ": " + vs.format_reason);
      if (forced != 0) {
        EXPECT_EQ(vs.patch_format, forced);
        EXPECT_NE(vs.format_reason.find("forced"), std::string::npos);
      } else {
        EXPECT_TRUE(vs.patch_format == 1 || vs.patch_format == 2);
      }
      EXPECT_EQ(vs.format_reason.rfind("format " + std::to_string(vs.patch_format) + ": ", 0), 0u);
      // Versions 1 and 2: no patch to size from yet. From 3 on the members
      // have reported the rate of the previous patch's apply.
      EXPECT_EQ(vs.predicted_f1_s >= 0, vs.version >= 3);
      if (vs.version >= 3) {
        EXPECT_GT(vs.predicted_f1_s, 0);
        EXPECT_GT(vs.predicted_f2_s, 0);
        EXPECT_NE(vs.format_reason.find("predicted"), std::string::npos);
        EXPECT_NE(vs.format_reason.find("-bound on "), std::string::npos);
      } else if (forced == 0) {
        EXPECT_EQ(vs.patch_format, 2);
        EXPECT_NE(vs.format_reason.find("the default"), std::string::npos);
      }
      if (vs.version >= 2) {
        // The board's patch is in the format /status names.
        const fs::path patch = dir_ / "root" / "published" /
                               ("patch-" + std::to_string(vs.version - 1) + "-" +
                                std::to_string(vs.version));
        std::ifstream in(patch, std::ios::binary);
        ASSERT_TRUE(in.good()) << patch;
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
        auto info = Inspect(bytes);
        ASSERT_TRUE(info.ok()) << info.status().ToString();
        EXPECT_EQ(info->format_version, vs.patch_format);
      }
    }
  }
};

TEST_F(AgentFormatChoiceTest, AutoChoosesEachVersionsFormatAndSaysWhy) { PublishFiveAndCheck(0); }

TEST_F(AgentFormatChoiceTest, PatchFormatForcesIt) { PublishFiveAndCheck(1); }

// The reader rule (docs/agent/apply.md): after a switch the slot switched
// away from keeps the previous version for the grace period; then the
// member brings it up to the served version (PrepareSpare), off the next
// version's critical path.
TEST_F(AgentSystemTest, SpareIsPreparedAfterTheGracePeriod) {
  spare_grace_ms_ = 3000;
  StartRoot();
  StartMember("a", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  const std::string dir = members_["a"].dir;
  auto other_slot = [&] {
    const std::string link = fs::read_symlink(dir + "/current").string();
    return dir + "/views/" + (link == "views/a" ? "b" : "a");
  };
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  // After the keyframe the spare is made by a copy, after the grace period.
  ASSERT_TRUE(WaitFor([&] { return FirstDifference(other_slot(), steps_[1]).empty(); }, 30));
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  const auto switched = std::chrono::steady_clock::now();
  EXPECT_EQ(FirstDifference(other_slot(), steps_[1]), "");
  ASSERT_TRUE(WaitFor([&] { return FirstDifference(other_slot(), steps_[2]).empty(); }, 30))
      << "the spare was not brought to version 2";
  EXPECT_GE(std::chrono::steady_clock::now() - switched, std::chrono::milliseconds(2500));
  Publish(3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
}

// A patch of several chunks goes into each member's prepared spare record
// by record while it arrives, so that applying overlaps the transfer: the
// members log records applied before the last chunk, and serve the version
// bit for bit. With --no-stream-apply (stream_apply false) nothing streams.
TEST_F(AgentSystemTest, PatchOfManyChunksStreamsIntoTheSpare) {
  // Patches of a few MB (8 to 16 chunks) instead of the fixture's ~100 kB.
  TraceConfig config;
  auto shape = ChooseModelShape(6'000'000);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  config.shape = *shape;
  config.seed = 7;
  config.adam.lr = 1e-4;
  auto gen = TraceGenerator::Create(config, pool_);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  gen_ = std::move(gen).value();
  CaptureLogs([](AgentOptions& o) {
    o.stream_apply = o.id != "c";
    // Every send of the root waits 100 ms (below), its replies to
    // heartbeats too: at one heartbeat per 100 ms a slow build (TSan, a
    // loaded machine) queued them faster than the root answered, and Stop
    // waited minutes for the backlog.
    o.heartbeat_ms = 500;
    o.dead_after_ms = 5000;
  });
  auto count = [this](const std::string& id, const std::string& part) {
    return static_cast<long>(Logged(id, part));
  };
  spare_grace_ms_ = 50;
  // The root holds each send back 100 ms, so a patch's chunks arrive that
  // far apart whatever the machine's load: a streaming member has time to
  // apply the records of one chunk before the next (at load 65 an
  // unthrottled patch once landed whole before the apply thread ran, and
  // the " 0 of " check below failed with nothing wrong).
  FaultPolicy paced;
  paced.delay_us = 100'000;
  StartRoot(/*root_fanout=*/3, &paced);
  for (const char* name : {"a", "b", "c"}) StartMember(name, "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 3; }, 30));
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  for (uint64_t v = 2; v <= 3; ++v) {
    // The spare must be ready (the reader rule) before a stream may start.
    ASSERT_TRUE(WaitFor(
        [&] {
          for (const char* name : {"a", "b", "c"})
            if (count(name, "spare view ready") < static_cast<long>(v - 1)) return false;
          return true;
        },
        30));
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
    ExpectBitwiseEqual(v);
  }
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(count(name, "records applied while the patch arrived"), 2) << name;
    EXPECT_EQ(count(name, " 0 of "), 0) << name << ": a stream wrote nothing before the end";
  }
  EXPECT_EQ(count("c", "records applied while the patch arrived"), 0);
  EXPECT_EQ(count("c", "serving version 3 (in place)"), 1);
  {
    std::lock_guard<std::mutex> lock(log_->mu);
    for (const std::string& l : log_->lines)
      if (l.find("view_store") != std::string::npos && l.find("[root]") == std::string::npos)
        std::printf("%s\n", l.c_str());
  }
}

TEST_F(AgentSystemTest, LateAndLaggingMembersCatchUp) {
  StartRoot();
  StartMember("a", "us");
  StartMember("b", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  for (uint64_t v = 1; v <= 2; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  // b goes away for five versions; c arrives after seven.
  StopMember("b");
  for (uint64_t v = 3; v <= 7; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  StartMember("b", "eu");
  StartMember("c", "ap");
  ASSERT_TRUE(AllServe(7)) << Lagging(7);
  ExpectBitwiseEqual(7);
  Publish(8);
  ASSERT_TRUE(AllServe(8)) << Lagging(8);
  ExpectBitwiseEqual(8);
}

// A member away for longer than the relays keep objects (each keeps the
// last few versions) cannot be fed by the tree: it fetches from the root's
// object service, which requires the join token (xfer access token).
TEST_F(AgentSystemTest, MemberAwayLongerThanTheRelaysKeepCatchesUpFromTheBoard) {
  CaptureLogs();
  StartRoot();
  StartMember("a", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  StartMember("b", "eu");
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  StopMember("b");
  for (uint64_t v = 2; v <= 40; ++v) Publish(v);
  ASSERT_TRUE(AllServe(40)) << Lagging(40);
  StartMember("b", "eu");
  ASSERT_TRUE(AllServe(40)) << Lagging(40);
  ExpectBitwiseEqual(40);
  StopMember("b");
  EXPECT_GT(Logged("b", "came from the board's object service"), 0u)
      << "b was fed by the tree, not by the board's object service";
}

// Members that already hold a checkpoint start from it when its digest is
// the signed one: one a few versions back, one at HEAD (the manifest-only
// request), and one whose file is another version's (refused, caught up
// from the board anyway). Keyframes only at version 1, so the tree alone
// cannot bring a new member up: every one goes through the board.
TEST_F(AgentSystemTest, MembersSeedFromACheckpointTheyHoldOnlyIfItsDigestIsSigned) {
  CaptureLogs();
  {
    AgentOptions o = BaseOptions("root");
    o.root = true;
    o.region = "us";
    o.keyframe_every = 1000;
    o.keep_patches = 4;
    o.transport = NewTransportFor("root");
    auto a = Agent::Start(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    root_ = std::move(a).value();
    root_key_ = root_->PublicKeyPem();
  }
  StartMember("a", "us");
  for (uint64_t v = 1; v <= 12; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  auto start_seeded = [&](const std::string& name, const std::string& checkpoint, uint64_t version) {
    AgentOptions o = BaseOptions(name);
    o.join = "root";
    o.region = "eu";
    o.trusted_keys_pem = {root_key_};
    o.transport = NewTransportFor(name);
    o.seed_checkpoint = checkpoint;
    o.seed_version = version;
    auto a = Agent::Start(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    members_[name].agent = std::move(a).value();
    members_[name].dir = o.data_dir;
  };
  start_seeded("behind", steps_[10], 10);
  start_seeded("at-head", steps_[12], 12);
  start_seeded("wrong", steps_[9], 10);
  ASSERT_TRUE(AllServe(12)) << Lagging(12);
  ExpectBitwiseEqual(12);
  Publish(13);
  ASSERT_TRUE(AllServe(13)) << Lagging(13);
  ExpectBitwiseEqual(13);
  auto logged = [&](const std::string& name, const std::string& part) {
    return Logged(name, part) > 0;
  };
  EXPECT_TRUE(logged("behind", "seeded from"));
  EXPECT_TRUE(logged("at-head", "seeded from"));
  EXPECT_TRUE(logged("wrong", "refused for version 10"));
  EXPECT_FALSE(logged("wrong", "seeded from"));
  for (const std::string name : {"behind", "at-head", "wrong"}) StopMember(name);
}

TEST_F(AgentSystemTest, RootRestartLosesNothing) {
  StartRoot();
  StartMember("a", "us");
  StartMember("b", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  for (uint64_t v = 1; v <= 3; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  root_->Stop();
  root_.reset();
  transports_.erase("root");
  StartRoot();  // same DIR: same key, same board
  EXPECT_EQ(root_->Snapshot().head, 3u);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  // A stale version is refused; the next one flows.
  EXPECT_EQ(root_->Publish(steps_[3], 3).code(), Code::kInvalidArgument);
  Publish(4);
  ASSERT_TRUE(AllServe(4)) << Lagging(4);
  ExpectBitwiseEqual(4);
}

TEST_F(AgentSystemTest, RelayKilledMidTransferChildrenReattach) {
  // The root feeds one child, so the first member to join relays to all
  // the others; its sends are slowed so that it dies mid-transfer.
  StartRoot(/*root_fanout=*/1);
  FaultPolicy slow;
  slow.delay_us = 20'000;  // per send; the heartbeats (every 100 ms) must keep up
  StartMember("relay", "eu", &slow);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (int i = 0; i < 5; ++i) StartMember("m" + std::to_string(i), "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 6; }, 30));
  for (const auto& m : root_->Snapshot().members)
    if (m.id != "relay") {
      EXPECT_NE(m.parent, "root") << m.id;
    }
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  const std::string relay = "relay";
  Publish(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  StopMember(relay);
  members_.erase(relay);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
  for (const auto& m : root_->Snapshot().members) EXPECT_NE(m.parent, relay) << m.id;
}

// More versions than a relay's object table holds (64): the agents forget
// old objects as they move on, so the tree never stalls on a full table.
TEST_F(AgentSystemTest, ManyVersionsDoNotFillTheRelays) {
  StartRoot(/*root_fanout=*/1);
  StartMember("a", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  StartMember("b", "eu");  // below a
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  for (uint64_t v = 1; v <= 70; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << "version " << v << ": " << Lagging(v);
  }
  ExpectBitwiseEqual(70);
  // Nor the disk: what a member's relay forgets leaves DIR/objects too (the
  // view store keeps its own copy of the last patch). Objects of the last
  // four versions stay for children a few versions behind.
  for (const char* name : {"a", "b"}) {
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(members_[name].dir + "/objects")) {
      (void)e;
      ++files;
    }
    EXPECT_LE(files, 5u) << name << " keeps every object it ever received";
  }
}

// The board in etcd: a standby root waits for leadership, takes over when
// the root goes, and publishes on top of what the old root published; the
// members, given both addresses, follow it. Nothing published is lost.
TEST_F(AgentSystemTest, StandbyRootTakesOverThroughEtcd) {
  auto etcd = agent::EtcdTestServer::Start();
  if (etcd.status().code() == Code::kUnsupported) GTEST_SKIP() << etcd.status().ToString();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string board = "etcd://" + (*etcd)->endpoint() + "/tern/test";
  // Both roots sign with one key (a deployment's publisher key).
  const std::string key_pem = [&] {
    auto signer = ManifestSigner::Generate();
    EXPECT_TRUE(signer.ok());
    auto pem = signer->PrivateKeyPem();
    EXPECT_TRUE(pem.ok());
    return *pem;
  }();
  auto root_options = [&](const std::string& name) {
    AgentOptions o = BaseOptions(name);
    o.root = true;
    o.region = "us";
    o.board_etcd = board;
    // 5 s, not 2: a leader refreshes every lease/3, and a loaded machine
    // running sanitized agents can starve that for 2 s, letting the standby
    // lead while the test says A does. A stops with a resign (no wait).
    o.etcd_lease_s = 5;
    o.signing_key_pem = key_pem;
    o.transport = NewTransportFor(name);
    return o;
  };
  auto a = Agent::Start(root_options("root-a"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  root_key_ = (*a)->PublicKeyPem();
  // The standby blocks in Start until it leads.
  std::unique_ptr<Agent> b;
  std::atomic<bool> b_started{false};
  const AgentOptions b_options = root_options("root-b");
  std::thread standby([&] {
    auto r = Agent::Start(b_options);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) b = std::move(r).value();
    b_started = true;
  });
  for (const char* name : {"m1", "m2", "m3"}) {
    AgentOptions o = BaseOptions(name);
    o.join = "root-a,root-b";
    o.region = "eu";
    o.trusted_keys_pem = {root_key_};
    o.transport = NewTransportFor(name);
    auto m = Agent::Start(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    members_[name].agent = std::move(m).value();
    members_[name].dir = o.data_dir;
  }
  ASSERT_TRUE(WaitFor([&] { return (*a)->Snapshot().members.size() == 3; }, 30));
  for (uint64_t v = 1; v <= 2; ++v) {
    const std::string path = NextStep();
    ASSERT_TRUE((*a)->Publish(path, v).ok());
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  EXPECT_FALSE(b_started.load());
  // Fresh under the leader's beacons (docs/security.md "Freshness").
  const uint64_t incarnation_a = (*a)->Snapshot().freshness.incarnation;
  for (auto& [id, m] : members_)
    ASSERT_TRUE(WaitFor(
        [&] {
          const AgentFreshness f = m.agent->Snapshot().freshness;
          return !f.stale && f.incarnation == incarnation_a;
        },
        10))
        << id << ": " << m.agent->Snapshot().freshness.stale_reason;
  // The root goes away; the standby leads and the members follow it.
  (*a)->Stop();
  ASSERT_TRUE(WaitFor([&] { return b_started.load(); }, 30)) << "the standby never took over";
  standby.join();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->Snapshot().head, 2u);  // nothing published was lost
  ASSERT_TRUE(WaitFor([&] { return b->Snapshot().members.size() == 3; }, 30));
  EXPECT_EQ(b->Publish(steps_[2], 2).code(), Code::kInvalidArgument);  // not newer than HEAD
  const std::string path = NextStep();
  Status s = b->Publish(path, 3);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
  // The new leader's beacons start a larger incarnation at sequence 1:
  // accepted at once, nothing counted as a replay.
  EXPECT_GT(b->Snapshot().freshness.incarnation, incarnation_a);
  for (auto& [id, m] : members_) {
    ASSERT_TRUE(WaitFor(
        [&] {
          const AgentFreshness f = m.agent->Snapshot().freshness;
          return !f.stale && f.incarnation == b->Snapshot().freshness.incarnation &&
                 f.beacon_head == 3;
        },
        10))
        << id << ": " << m.agent->Snapshot().freshness.stale_reason;
    EXPECT_EQ(m.agent->Snapshot().freshness.beacons_replayed, 0u) << id;
  }
  const std::string path4 = NextStep();
  ASSERT_TRUE(b->Publish(path4, 4).ok());  // and on from there with patches
  ASSERT_TRUE(AllServe(4)) << Lagging(4);
  ExpectBitwiseEqual(4);
  for (auto& [id, m] : members_) m.agent.reset();
  b.reset();
  a->reset();
}

TEST_F(AgentSystemTest, MemberTrustingAnotherKeyAppliesNothing) {
  StartRoot();
  StartMember("a", "us");
  // A member configured with a different publisher key: every manifest the
  // tree brings fails verification, so it never serves.
  AgentOptions o = BaseOptions("x");
  o.join = "root";
  o.region = "us";
  o.trusted_keys_pem = {};
  {
    // Another root's key.
    AgentOptions other = BaseOptions("other-root");
    other.root = true;
    other.transport = NewTransportFor("other-root");
    auto other_root = Agent::Start(other);
    ASSERT_TRUE(other_root.ok());
    o.trusted_keys_pem = {(*other_root)->PublicKeyPem()};
  }
  o.transport = NewTransportFor("x");
  auto x = Agent::Start(o);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  Publish(1);
  ASSERT_TRUE(WaitFor([&] { return members_["a"].agent->Snapshot().served_version == 1; }, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ((*x)->Snapshot().served_version, 0u);
}

TEST_F(AgentSystemTest, GarbageOnTheAgentPortIsRefusedAndServiceGoesOn) {
  StartRoot();
  StartMember("a", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  Transport* t = NewTransportFor("prober");
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string("\x01\0\0\0garbage", 11),
                                  std::string(1, '\xff'), std::string()}) {
    std::promise<Result<std::shared_ptr<Connection>>> done;
    std::promise<Status> closed;
    auto closed_future = closed.get_future();
    ConnectionHandlers h;
    auto closed_once = std::make_shared<std::once_flag>();
    h.on_closed = [&closed, closed_once](Status s) { std::call_once(*closed_once, [&] { closed.set_value(s); }); };
    t->Connect("root", h, [&done](Result<std::shared_ptr<Connection>> r) { done.set_value(std::move(r)); });
    auto conn = done.get_future().get();
    ASSERT_TRUE(conn.ok());
    (*conn)->SendMessage(junk, [](Status) {});
    EXPECT_EQ(closed_future.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "the agent kept a connection that sent " << junk.size() << " junk bytes";
    (*conn)->Close();
  }
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
}

// A member of another release (control protocol 3, before HELLO named the
// intra backend) is refused with a REJECT that says why, not a bare close.
TEST_F(AgentSystemTest, AnOlderProtocolsHelloGetsARejectNamingTheProtocol) {
  StartRoot();
  Transport* t = NewTransportFor("old");
  agent::Hello hello;
  hello.member.id = "old";
  hello.member.region = "us";
  hello.member.data_address = "old";
  hello.join_token = "join-token-of-this-board";
  std::string bytes = *agent::EncodeControl(hello);
  ASSERT_EQ(bytes[4], static_cast<char>(agent::kControlProtocol));  // the u16 after the header
  bytes[4] = 3;
  std::promise<std::string> first;
  auto first_future = first.get_future();
  auto once = std::make_shared<std::once_flag>();
  ConnectionHandlers h;
  h.on_message = [&first, once](std::string m) {
    std::call_once(*once, [&] { first.set_value(m); });
  };
  h.on_closed = [&first, once](Status) { std::call_once(*once, [&] { first.set_value(""); }); };
  std::promise<Result<std::shared_ptr<Connection>>> done;
  t->Connect("root", h,
             [&done](Result<std::shared_ptr<Connection>> r) { done.set_value(std::move(r)); });
  auto conn = done.get_future().get();
  ASSERT_TRUE(conn.ok());
  (*conn)->SendMessage(bytes, [](Status) {});
  ASSERT_EQ(first_future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto reply = agent::DecodeControl(first_future.get());
  ASSERT_TRUE(reply.ok()) << "no REJECT before the close";
  auto* reject = std::get_if<agent::Reject>(&*reply);
  ASSERT_NE(reject, nullptr);
  EXPECT_NE(reject->reason.find("control protocol 3 (this agent speaks " +
                                std::to_string(agent::kControlProtocol)),
            std::string::npos)
      << reject->reason;
  (*conn)->Close();
  EXPECT_TRUE(root_->Snapshot().members.empty());
}

// Members measure their round trips (PING/PONG) to the root and to their
// parents and report them; the root shows them in /status and /metrics. A
// member whose sends are held back 30 ms sees at least that.
TEST_F(AgentSystemTest, RoundTripsAreMeasuredAndShown) {
  tweak_ = [](AgentOptions& o) {
    if (o.id == "root") o.admin_listen = "127.0.0.1:0";
    o.dead_after_ms = 5000;
  };
  StartRoot(/*root_fanout=*/1);
  FaultPolicy slow;
  slow.delay_us = 30'000;
  StartMember("head", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  StartMember("far", "eu", &slow);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  auto measured = [&] {
    for (const auto& m : root_->Snapshot().members)
      if (m.rtt_to_root_s <= 0 || m.rtt_to_parent_s <= 0) return false;
    return true;
  };
  ASSERT_TRUE(WaitFor(measured, 30));
  for (const auto& m : root_->Snapshot().members) {
    if (m.id == "far") {
      EXPECT_EQ(m.parent, "head");
      EXPECT_GE(m.rtt_to_root_s, 0.030);
      EXPECT_GE(m.rtt_to_parent_s, 0.030);
    }
    EXPECT_LT(m.rtt_to_root_s, 10.0) << m.id;
  }
  const std::string admin = root_->Snapshot().admin_address;
  auto status = AgentStatusJson(admin, {});
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"rtt_to_root_s\""), std::string::npos);
  EXPECT_NE(status->find("\"rtt_to_parent_s\""), std::string::npos);
  auto metrics = agent::AdminGet(admin, "/metrics", {});
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_NE(metrics->find("tern_agent_member_rtt_to_root_seconds{member=\"far\""),
            std::string::npos);
  EXPECT_NE(metrics->find("tern_agent_member_rtt_to_parent_seconds{member=\"far\""),
            std::string::npos);
  // After a version went head -> far, far's receive rate from head is the
  // root's measured figure for head's uplink (and the planner's).
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  auto head_measured = [&] {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == "head") return m.measured_uplink_bytes_per_s > 0;
    return false;
  };
  EXPECT_TRUE(WaitFor(head_measured, 30)) << "no measured uplink for head";
}

// A relay whose every send is held back a long time starves its children:
// they report it to the root, which plans around it (it becomes a leaf; its
// children move, nobody else does), and every member still serves every
// version bit for bit. After its probation it may relay again, and no edge
// moves for that.
// The stall time is the root's, from WELCOME: the members' own flag says
// never report.
TEST_F(AgentSystemTest, StalledParentIsReportedAndPlannedAround) {
  tweak_ = [](AgentOptions& o) {
    o.dead_after_ms = 20'000;  // the stalled relay's heartbeats are late too
    o.parent_stall_ms = o.id == "root" ? 800 : 0;
    // Long enough that the children's move (slow on a loaded machine
    // running sanitized agents) ends before the probation does.
    o.relay_probation_ms = 15'000;
  };
  StartRoot(/*root_fanout=*/1);
  FaultPolicy stall;
  stall.delay_us = 1'000'000;  // per send
  StartMember("stalled", "eu", &stall);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (int i = 0; i < 4; ++i) StartMember("m" + std::to_string(i), "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 5; }, 30));
  int below = 0;
  for (const auto& m : root_->Snapshot().members) below += m.parent == "stalled";
  ASSERT_GE(below, 1);
  Publish(1);
  auto planned_around = [&] {
    for (const auto& m : root_->Snapshot().members) {
      if (m.parent == "stalled") return false;
      if (m.id == "stalled" && !m.demoted) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitFor(planned_around, 60)) << "children still below the stalled relay";
  for (const auto& m : root_->Snapshot().members) {
    if (m.id != "stalled") continue;
    // A first stall: one quiet period (15 s) from the demotion.
    EXPECT_EQ(m.demoted_for, "stalled");
    EXPECT_EQ(m.demotions, 1u);
    EXPECT_EQ(m.strikes, 1u);
    EXPECT_GE(m.relay_again_in_s, 0);
    EXPECT_LE(m.relay_again_in_s, 15);
  }
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
  for (const auto& m : root_->Snapshot().members) EXPECT_NE(m.parent, "stalled") << m.id;
  std::map<std::string, std::string> parents;
  for (const auto& m : root_->Snapshot().members) parents[m.id] = m.parent;
  auto relays_again = [&] {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == "stalled") return !m.demoted;
    return false;
  };
  EXPECT_TRUE(WaitFor(relays_again, 60)) << "still demoted long after its probation";
  for (const auto& m : root_->Snapshot().members) {
    if (m.id != "stalled") continue;
    EXPECT_EQ(m.relay_again_in_s, -1);  // relays again: no probation left
    EXPECT_EQ(m.demotions, 1u);         // but its record stays
    EXPECT_EQ(m.demoted_for, "stalled");
  }
  for (const auto& m : root_->Snapshot().members) EXPECT_EQ(m.parent, parents[m.id]) << m.id;
}

// A member heartbeats at the root's pace (WELCOME), not its own: at its own
// 5 s the root's 1 s dead-after would drop it between any two heartbeats.
TEST_F(AgentSystemTest, MembersHeartbeatAtTheRootsPace) {
  CaptureLogs([](AgentOptions& o) {
    if (o.id == "root") return;  // 100 ms, dead after 1000 ms (BaseOptions)
    o.heartbeat_ms = 5'000;
    o.dead_after_ms = 20'000;
  });
  StartRoot();
  StartMember("m", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  EXPECT_TRUE(WaitFor(
      [&] { return Logged("m", "the root's timing rules: heartbeat every 100 ms") == 1; }, 10));
  std::this_thread::sleep_for(std::chrono::seconds(4));  // four dead-after times
  EXPECT_EQ(Logged("root", "member m silent for"), 0u);
  EXPECT_EQ(root_->Snapshot().members.size(), 1u);
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
}

// After a re-plan a member's SUBSCRIBE tells its new parent the version it
// serves, and the parent offers only newer objects: nothing old is offered
// again (before data protocol 2 the root re-offered versions 1..3 and the
// member logged a refusal for each), DIR/current is untouched (same link
// target, same bytes), and the next version arrives as usual. The lead's
// replay check (a parent that offers an old version anyway) is tested end to
// end in AgentAdversaryTest.ForgedAndReplayedManifestsAreRefused and at the
// relay in RelayTest.ForgedOrForeignManifestsAreRefused.
TEST_F(AgentSystemTest, OldVersionsNotReofferedAfterReplan) {
  CaptureLogs();
  std::mutex& mu = log_->mu;
  std::vector<std::string>& lines = log_->lines;
  StartRoot(/*root_fanout=*/1);
  StartMember("relay", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  StartMember("a", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 2; }, 30));
  for (uint64_t v = 1; v <= 3; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }
  ASSERT_EQ(members_["a"].agent->Snapshot().parent, "relay");
  const fs::path current = fs::path(members_["a"].dir) / "current";
  const fs::path target = fs::read_symlink(current);
  {
    std::lock_guard<std::mutex> lock(mu);
    lines.clear();
  }
  // a's parent goes; the root, which holds versions 1..3, takes a.
  StopMember("relay");
  members_.erase("relay");
  ASSERT_TRUE(WaitFor([&] { return members_["a"].agent->Snapshot().parent == "root"; }, 30));
  EXPECT_EQ(members_["a"].agent->Snapshot().served_version, 3u);
  EXPECT_EQ(fs::read_symlink(current), target);
  ExpectBitwiseEqual(3);
  Publish(4);
  ASSERT_TRUE(AllServe(4)) << Lagging(4);
  ExpectBitwiseEqual(4);
  // Version 4 came over the same data connection after any re-offer would
  // have (OFFERs of what a parent holds go out at SUBSCRIBE, in order).
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& l : lines) {
    EXPECT_EQ(l.find("agent a: refusing a manifest for version"), std::string::npos) << l;
    // The relay's "manifest of version N refused" (on_manifest said no).
    EXPECT_FALSE(l.find("manifest of version") != std::string::npos &&
                 l.find(" refused") != std::string::npos)
        << l;
  }
}

}  // namespace
}  // namespace tern

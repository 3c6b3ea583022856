// The order of a root's publish (docs/agent/board.md §4, "The root's
// publish, in order"): a version's objects reach the tree only after they
// and the board record are durable on the root; the root's own apply into
// DIR/current comes after the offer, so its failure does not hold the
// version back from the members.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"
#include "tern/env.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using agent_test::WaitFor;

// DefaultEnv, with failures switched on by the test: the sync of an object
// file under published/, the sync of a board record, or any file write of
// the view store (DIR/views, state.json).
class GateEnv : public EnvWrapper {
 public:
  enum class Fail { kNothing, kObjectSync, kRecordSync, kViewStoreWrite };

  GateEnv(Env& target, std::string data_dir) : EnvWrapper(target), data_dir_(std::move(data_dir)) {}

  void Set(Fail f) { fail_ = f; }

  Result<std::unique_ptr<WritableFile>> OpenWritable(const std::string& path,
                                                     CreateMode mode) override {
    const bool board_side = Under(path, "/published/") || Under(path, "/board/");
    if (fail_ == Fail::kViewStoreWrite && path.rfind(data_dir_ + "/", 0) == 0 && !board_side)
      return TERN_ERROR(kIo, "test: no writes of the view store (", path, ")");
    TERN_ASSIGN_OR_RETURN(auto file, target().OpenWritable(path, mode));
    return std::unique_ptr<WritableFile>(std::make_unique<GatedFile>(std::move(file), *this, path));
  }

 private:
  static bool Under(const std::string& path, const char* part) {
    return path.find(part) != std::string::npos;
  }
  bool SyncFails(const std::string& path) const {
    const Fail f = fail_;
    if (f == Fail::kObjectSync)
      return Under(path, "/published/patch-") || Under(path, "/published/keyframe-");
    return f == Fail::kRecordSync && Under(path, "/board/");
  }

  class GatedFile : public WritableFile {
   public:
    GatedFile(std::unique_ptr<WritableFile> inner, const GateEnv& env, std::string path)
        : inner_(std::move(inner)), env_(env), path_(std::move(path)) {}
    Status Append(std::span<const uint8_t> bytes) override { return inner_->Append(bytes); }
    Status Sync() override {
      if (env_.SyncFails(path_)) return TERN_ERROR(kIo, "test: sync of ", path_, " fails");
      return inner_->Sync();
    }
    Status Close() override { return inner_->Close(); }

   private:
    std::unique_ptr<WritableFile> inner_;
    const GateEnv& env_;
    const std::string path_;
  };

  const std::string data_dir_;
  std::atomic<Fail> fail_{Fail::kNothing};
};

class AgentPublishOrderTest : public agent_test::AgentSystemFixture {
 protected:
  void StartGatedRoot() {
    gate_ = std::make_unique<GateEnv>(DefaultEnv(), (dir_ / "root").string());
    tweak_ = [this](AgentOptions& o) {
      if (o.id == "root") o.env = gate_.get();
    };
    StartRoot();
  }

  // Files of `name` (an object's name) anywhere under the member's DIR:
  // complete, partial or temporary.
  bool MemberHolds(const std::string& member, const std::string& name) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(members_[member].dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->path().filename().string().find(name) != std::string::npos) return true;
    return false;
  }

  std::unique_ptr<GateEnv> gate_;  // outlives the root (TearDown resets it first)
};

// A publish whose object files or board record do not become durable fails
// and offers nothing: the member never sees the version, not a HEAD, not a
// chunk. (An offer moved ahead of the syncs, or of the record, fails this.)
TEST_F(AgentPublishOrderTest, NothingIsOfferedBeforeItIsDurableOnTheRoot) {
  StartGatedRoot();
  StartMember("m", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  const std::string step2 = NextStep();
  for (GateEnv::Fail f : {GateEnv::Fail::kObjectSync, GateEnv::Fail::kRecordSync}) {
    SCOPED_TRACE(f == GateEnv::Fail::kObjectSync ? "object sync fails" : "record sync fails");
    gate_->Set(f);
    Status s = root_->Publish(step2, 2);
    EXPECT_EQ(s.code(), Code::kIo) << s.ToString();
    gate_->Set(GateEnv::Fail::kNothing);
    EXPECT_EQ(root_->Snapshot().head, 1u);
    // Long enough for an offered object or a HEAD to reach the member
    // (version 1 took far less over the same loopback).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const AgentSnapshot m = members_["m"].agent->Snapshot();
    EXPECT_EQ(m.served_version, 1u);
    EXPECT_LE(m.head, 1u);
    EXPECT_FALSE(MemberHolds("m", "patch-1-2"));
    EXPECT_FALSE(MemberHolds("m", "keyframe-2-2"));
  }
  Status s = root_->Publish(step2, 2);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
}

// The root offers and announces a version before its own apply: when that
// apply fails, the publish reports it, yet the member serves the version;
// the next publish (a keyframe on top of HEAD, DIR/current being behind)
// brings the root back.
TEST_F(AgentPublishOrderTest, RootsOwnApplyFollowsTheOffer) {
  StartGatedRoot();
  StartMember("m", "us");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  Publish(1);
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  gate_->Set(GateEnv::Fail::kViewStoreWrite);
  const std::string step3 = NextStep();
  Status s = root_->Publish(step3, 3);
  gate_->Set(GateEnv::Fail::kNothing);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version 3 is published"), std::string::npos) << s.ToString();
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
  AgentSnapshot r = root_->Snapshot();
  EXPECT_EQ(r.head, 3u);
  EXPECT_EQ(r.served_version, 2u);
  Publish(4);
  ASSERT_TRUE(AllServe(4)) << Lagging(4);
  ExpectBitwiseEqual(4);
  r = root_->Snapshot();
  EXPECT_EQ(r.served_version, 4u);
  // The spans of a whole publish: offered before the apply began.
  ASSERT_FALSE(r.versions.empty());
  const AgentPublishSpans& p = r.versions.back().publish;
  EXPECT_EQ(r.versions.back().version, 4u);
  EXPECT_GT(p.offered_s, 0);
  EXPECT_GT(p.apply_s, 0);
  EXPECT_LE(p.offered_s + p.apply_s, p.total_s + 1e-6);
  // The stages before the offer account for all of it, none twice (the
  // board's spans run on its Env's clock, the rest on the agent's).
  const double stages = p.prepare_s + p.verify_prev_s + p.diff_s + p.keyframe_s + p.hash_s +
                        p.sign_s + p.write_s + p.record_s + p.handoff_s + p.announce_s;
  EXPECT_NEAR(stages, p.offered_s, 0.01);
}

}  // namespace
}  // namespace tern

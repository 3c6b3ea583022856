// A version is something an engine can load, and the agent says when it has
// one (docs/agent.md §3 "Model files", docs/agent/operations.md "Events"): the model
// files travel with every version to every member, whatever path brought it
// (keyframe, patch, catch-up, seed), a tampered file is refused, GET /events
// and WaitEvents report served versions with the tensors that changed, and
// the --on-serve hook runs for them.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "agent/ops/admin_http.h"
#include "agent/testing/agent_test_fixture.h"
#include "tests/support/files.h"

namespace tern::agent_test {
namespace {

using Files = std::map<std::string, std::string>;  // name -> bytes

void WriteFiles(const std::string& dir, const Files& files) {
  for (const auto& [name, bytes] : files)
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

// A slot's files other than its tensors.
Files ModelFilesIn(const std::string& dir) {
  Files out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") continue;
    if (name.find(".safetensors.index.json") != std::string::npos) continue;
    out[name] = tern::testing::Slurp(e.path().string());
  }
  return out;
}

// A copy of checkpoint `from` with one byte of each named tensor changed.
void CopyChanging(const std::string& from, const std::string& to,
                  const std::vector<std::string>& tensors) {
  fs::copy(from, to, fs::copy_options::recursive);
  auto c = Checkpoint::Open(to);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const std::string& name : tensors) {
    auto loc = (*c)->Locate(name);
    ASSERT_TRUE(loc.ok()) << name;
    const std::string file = to + "/" + (*c)->files()[loc->file_index];
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(loc->offset_bytes));
    char b = 0;
    f.read(&b, 1);
    f.seekp(static_cast<std::streamoff>(loc->offset_bytes));
    b = static_cast<char>(b ^ 0x01);
    f.write(&b, 1);
  }
}

class AgentEventsTest : public AgentSystemFixture {
 protected:
  // Agents with an admin port (token "admin-token") and captured logs;
  // `also` changes options further.
  void Setup(std::function<void(AgentOptions&)> also = nullptr) {
    CaptureLogs([also](AgentOptions& o) {
      o.admin_listen = "127.0.0.1:0";
      o.admin_token = "admin-token";
      if (also) also(o);
    });
  }
  std::string Admin(Agent& a) { return a.Snapshot().admin_address; }
  nlohmann::json Events(Agent& a, uint64_t after, uint32_t timeout_ms = 0) {
    agent::AdminClientOptions o;
    o.token = "admin-token";
    o.timeout_ms = 10000;
    auto body = agent::AdminGet(
        Admin(a),
        "/events?after=" + std::to_string(after) + "&timeout_ms=" + std::to_string(timeout_ms), o);
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    return body.ok() ? nlohmann::json::parse(*body) : nlohmann::json();
  }
  static std::vector<nlohmann::json> Served(const nlohmann::json& events) {
    std::vector<nlohmann::json> out;
    for (const auto& e : events["events"])
      if (e["kind"] == "version_served") out.push_back(e);
    return out;
  }
  void PublishDir(const std::string& path, uint64_t version) {
    steps_[version] = path;
    Status s = root_->Publish(path, version);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
};

TEST_F(AgentEventsTest, ModelFilesEventsAndHookEndToEnd) {
  const std::string hook_dir = (dir_ / "hook").string();
  fs::create_directories(hook_dir);
  Setup([hook_dir](AgentOptions& o) {
    if (o.id == "m1") o.on_serve_command = "cat > " + hook_dir + "/v$TERN_EVENT_VERSION.json";
  });
  StartRoot();
  StartMember("m1", "us");
  const Files v1_files = {{"config.json", "{\"model_type\": \"llama\"}\n"},
                          {"generation_config.json", "{\"top_p\": 0.9}\n"},
                          {"tokenizer.json", std::string(200000, 't')}};
  const std::string v1 = NextStep();
  WriteFiles(v1, v1_files);
  PublishDir(v1, 1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  // The keyframe-seeded first version is loadable: its files are there.
  EXPECT_EQ(ModelFilesIn(members_["m1"].dir + "/current"), v1_files);
  EXPECT_EQ(ModelFilesIn(dir_ / "root" / "current"), v1_files);

  Files v2_files = v1_files;
  v2_files["tokenizer.json"] = std::string(200000, 'u');
  const std::string v2 = NextStep();
  WriteFiles(v2, v2_files);
  fs::create_directories(v2 + "/subdir");           // not a model file
  std::ofstream(v2 + "/.hidden") << "not shipped";  // nor this
  PublishDir(v2, 2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  EXPECT_EQ(ModelFilesIn(members_["m1"].dir + "/current"), v2_files);

  // v3: two tensors change; the config changes, the generation config goes,
  // a quantization config comes.
  const std::vector<std::string> changed = {"model.layers.0.mlp.up_proj.weight",
                                            "model.norm.weight"};
  const std::string v3 = (dir_ / "trace" / "v3").string();
  {
    auto c = Checkpoint::Open(v2);
    ASSERT_TRUE(c.ok());
    for (const auto& name : changed)
      ASSERT_TRUE((*c)->Locate(name).ok()) << name << " is not in the trace's model";
  }
  CopyChanging(v2, v3, changed);
  fs::remove(v3 + "/generation_config.json");
  Files v3_files = v2_files;
  v3_files.erase("generation_config.json");
  v3_files["config.json"] = "{\"model_type\": \"llama\", \"v\": 3}\n";
  v3_files["quant_config.json"] = "{\"fmt\": \"fp8\"}\n";
  WriteFiles(v3, v3_files);
  PublishDir(v3, 3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);

  // A member that comes late catches up from the board (another path),
  // and one seeded from the checkpoint it holds (a third).
  StartMember("m2", "us");
  tweak_ = [old = tweak_, v3](AgentOptions& o) {
    old(o);
    o.seed_checkpoint = v3;
    o.seed_version = 3;
  };
  StartMember("m3", "us");
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
  for (const char* m : {"m1", "m2", "m3"})
    EXPECT_EQ(ModelFilesIn(members_[m].dir + "/current"), v3_files) << m;
  // m3 may have got v3 from the tree before its seed was adopted (either
  // way its slot holds the files: the view store's seed path is tested in
  // ViewStoreTest.TamperedModelFileSwitchesNothing).

  // GET /events on m1: its three served versions; the first a keyframe
  // (all tensors), the third naming exactly the two changed tensors.
  nlohmann::json ev = Events(*members_["m1"].agent, 0);
  EXPECT_EQ(ev["gap"], 0);
  auto served = Served(ev);
  ASSERT_EQ(served.size(), 3u) << ev.dump();
  EXPECT_EQ(served[0]["version"], 1);
  EXPECT_EQ(served[0]["all_tensors"], true);
  EXPECT_EQ(served[1]["version"], 2);
  EXPECT_EQ(served[1]["all_tensors"], false);
  EXPECT_FALSE(served[1]["changed_tensors"].empty());
  EXPECT_EQ(served[2]["version"], 3);
  EXPECT_EQ(served[2]["all_tensors"], false);
  EXPECT_EQ(served[2]["changed_tensors"], nlohmann::json(changed));
  EXPECT_EQ(served[2]["digest"], members_["m1"].agent->Snapshot().served_digest.ToString());
  EXPECT_EQ(served[2]["slot_dir"].get<std::string>(),
            fs::canonical(members_["m1"].dir + "/current").string());
  EXPECT_EQ(served[2]["member"], "m1");
  // Without the token: refused like the admin port's other private routes.
  EXPECT_EQ(agent::AdminGet(Admin(*members_["m1"].agent), "/events").status().code(), Code::kAuth);
  // Bad input: a clear 400.
  {
    agent::AdminClientOptions o;
    o.token = "admin-token";
    auto bad = agent::AdminGet(Admin(*members_["m1"].agent), "/events?after=-1", o);
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument) << bad.status().ToString();
  }

  // The late member's listener gets what its ring holds from the start.
  std::vector<AgentEvent> late;
  ASSERT_TRUE(members_["m2"].agent->WaitEvents(0, 100, 0, &late).ok());
  ASSERT_FALSE(late.empty());
  EXPECT_EQ(late.front().seq, 1u);
  EXPECT_EQ(late.back().kind, AgentEvent::Kind::kVersionServed);
  EXPECT_EQ(late.back().version, 3u);

  // The root: published versions, its own served ones, members joining.
  std::vector<AgentEvent> root_events;
  ASSERT_TRUE(root_->WaitEvents(0, 100, 0, &root_events).ok());
  std::set<std::string> joined;
  uint64_t published = 0;
  for (const auto& e : root_events) {
    if (e.kind == AgentEvent::Kind::kMemberJoined) joined.insert(e.member);
    if (e.kind == AgentEvent::Kind::kVersionPublished) {
      ++published;
      if (e.version == 3) {
        EXPECT_EQ(e.changed_tensors, changed);
      }
    }
  }
  EXPECT_EQ(published, 3u);
  EXPECT_EQ(joined, (std::set<std::string>{"m1", "m2", "m3"}));

  // A long poll waits for the next version and returns with it.
  const uint64_t last = ev["last_seq"];
  nlohmann::json polled;
  // (It returns with the first event: the long bound only covers a slow
  // publish and transfer.)
  std::thread poll([&] { polled = Events(*members_["m1"].agent, last, 60000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string v4 = (dir_ / "trace" / "v4").string();
  CopyChanging(v3, v4, {"model.norm.weight"});
  PublishDir(v4, 4);
  poll.join();
  auto polled_served = Served(polled);
  ASSERT_EQ(polled_served.size(), 1u) << polled.dump();
  EXPECT_EQ(polled_served[0]["version"], 4);
  EXPECT_EQ(polled_served[0]["changed_tensors"], nlohmann::json::array({"model.norm.weight"}));
  ASSERT_TRUE(AllServe(4)) << Lagging(4);

  // The hook ran for the newest version with its event.
  ASSERT_TRUE(WaitFor([&] { return fs::exists(hook_dir + "/v4.json"); }, 20));
  ASSERT_TRUE(WaitFor([&] { return Logged("m1", "serve hook for version 4") > 0; }, 20));
  auto hook_event = nlohmann::json::parse(tern::testing::Slurp(hook_dir + "/v4.json"));
  EXPECT_EQ(hook_event["version"], 4);
  EXPECT_EQ(hook_event["kind"], "version_served");
  agent::AdminClientOptions o;
  o.token = "admin-token";
  auto metrics = agent::AdminGet(Admin(*members_["m1"].agent), "/metrics", o);
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->find("tern_agent_serve_hook_runs_total{result=\"ok\"}"), std::string::npos)
      << *metrics;
}

// A model file whose bytes are not the signed ones is refused like a bad
// chunk: the member serves nothing of that version, tries again a second
// later (the object service may have been mended: it has), and the next
// version goes in as usual.
TEST_F(AgentEventsTest, TamperedModelFileIsRefused) {
  Setup();
  StartRoot();
  const Files files = {{"config.json", "{\"model_type\": \"llama\"}\n"}};
  const std::string v1 = NextStep();
  WriteFiles(v1, files);
  PublishDir(v1, 1);
  // What the root's object service serves for config.json, changed.
  const fs::path store = dir_ / "root" / "published" / "files";
  std::vector<fs::path> stored{fs::directory_iterator(store), fs::directory_iterator()};
  ASSERT_EQ(stored.size(), 1u);
  std::ofstream(stored[0], std::ios::binary) << "{\"model_type\": \"evil!\"}\n";  // same size
  StartMember("m1", "us");
  ASSERT_TRUE(WaitFor([&] { return Logged("m1", "does not match the SHA-256") > 0; }, 30));
  EXPECT_EQ(members_["m1"].agent->Snapshot().served_version, 0u);
  EXPECT_FALSE(fs::exists(members_["m1"].dir + "/current"));
  std::ofstream(stored[0], std::ios::binary) << files.at("config.json");
  // Tried again a second later: the good bytes go in without a new version.
  ASSERT_TRUE(AllServe(1, 15)) << Lagging(1);
  EXPECT_GE(Logged("m1", "trying again in a second"), 1u);
  EXPECT_EQ(ModelFilesIn(members_["m1"].dir + "/current"), files);
  const std::string v2 = NextStep();
  WriteFiles(v2, files);
  PublishDir(v2, 2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  EXPECT_EQ(ModelFilesIn(members_["m1"].dir + "/current"), files);
}

}  // namespace
}  // namespace tern::agent_test

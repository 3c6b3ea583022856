// `tern demo`: the transfer agent end to end on this machine. A root and
// members in three regions (real TCP sockets on 127.0.0.1, one agent per
// member, all in this process), a datagen RL trace published version by
// version, and per version: patch bytes against the full view, the time
// until the first and the last member serve it, the bytes that crossed a
// region boundary, and a bit-for-bit check of every member's DIR/current
// against what was published.
#include "tools/demo_agents.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "tern/agent.h"
#include "tern/checkpoint.h"
#include "tern/datagen.h"
#include "tern/thread_pool.h"
#include "tern/transport_registry.h"
#include "tools/cli_util.h"

namespace tern::cli {
namespace {

namespace fs = std::filesystem;

std::string FirstDifference(const std::string& a_path, const std::string& b_path) {
  auto a = Checkpoint::Open(a_path);
  auto b = Checkpoint::Open(b_path);
  if (!a.ok()) return a.status().ToString();
  if (!b.ok()) return b.status().ToString();
  const ServeView& va = (*a)->view();
  const ServeView& vb = (*b)->view();
  if (va.tensors.size() != vb.tensors.size()) return "tensor count";
  for (size_t i = 0; i < va.tensors.size(); ++i) {
    if (va.tensors[i].desc->name != vb.tensors[i].desc->name ||
        !va.tensors[i].desc->SameLayout(*vb.tensors[i].desc))
      return "layout of " + va.tensors[i].desc->name;
    if (std::memcmp(va.tensors[i].data, vb.tensors[i].data, va.tensors[i].desc->bytes()) != 0)
      return va.tensors[i].desc->name;
  }
  return "";
}

struct Node {
  std::string region;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Agent> agent;
  std::string dir;
};

}  // namespace

Status RunAgentDemo(const AgentDemoArgs& a) {
  TERN_REQUIRE(a.members >= 1 && a.members <= 64, kInvalidArgument, "--members must be 1..64");
  TERN_REQUIRE(a.versions >= 1 && a.versions <= 1000, kInvalidArgument, "--versions must be 1..1000");
  TERN_REQUIRE(a.regions >= 1 && a.regions <= 8, kInvalidArgument, "--regions must be 1..8");
  ThreadPool pool(a.threads);
  TraceConfig config = a.config;
  TERN_ASSIGN_OR_RETURN(config.shape, ChooseModelShape(a.params));
  TERN_RETURN_IF_ERROR(config.Validate());

  std::string dir = a.dir;
  bool remove_dir = false;
  if (dir.empty()) {
    dir = (fs::temp_directory_path() / ("tern-demo-" + std::to_string(::getpid()))).string();
    remove_dir = !a.keep;
  }
  std::error_code ec;
  fs::create_directories(dir + "/trace", ec);
  TERN_REQUIRE(!ec, kIo, "cannot create ", dir, ": ", ec.message());
  struct Cleanup {
    std::string dir;
    bool on;
    ~Cleanup() {
      std::error_code ec;
      if (on) fs::remove_all(dir, ec);
    }
  } cleanup{dir, remove_dir};

  static const char* kRegions[] = {"us-east", "eu-west", "ap-south", "us-west", "eu-north", "sa-east", "af-south", "me-central"};
  std::printf("tern demo: a root and %u members in %u regions on this machine (TCP on 127.0.0.1), "
              "a %llu-parameter model, %u versions\n",
              a.members, a.regions, static_cast<unsigned long long>(config.shape.parameters()), a.versions);
  std::printf("data in %s%s\n\n", dir.c_str(), remove_dir ? " (removed at the end; --keep keeps it)" : "");

  // The agents.
  TransportOptions to;
  to.tcp.log = [](std::string_view) {};  // the demo prints its own table
  auto quiet = [](std::string_view) {};
  LogFn log = a.verbose ? LogFn() : LogFn(quiet);
  std::map<std::string, Node> nodes;
  auto start = [&](const std::string& id, const std::string& region, bool root,
                   const std::string& join, const std::string& key) -> Status {
    Node& n = nodes[id];
    n.region = region;
    n.dir = dir + "/" + id;
    TERN_ASSIGN_OR_RETURN(n.transport, NewTransport("tcp", to));
    AgentOptions o;
    o.root = root;
    o.join = join;
    o.id = id;
    o.region = region;
    o.cluster = region + "-c1";
    o.listen = "127.0.0.1:0";
    o.data_dir = n.dir;
    o.transport = n.transport.get();
    o.log = log;
    o.threads = 1;
    o.stripes = a.stripes;
    o.heartbeat_ms = 100;
    o.dead_after_ms = 3000;
    o.stream_apply = !a.no_stream_apply;
    if (!key.empty()) o.trusted_keys_pem = {key};
    TERN_ASSIGN_OR_RETURN(n.agent, Agent::Start(o));
    return Status::Ok();
  };
  TERN_RETURN_IF_ERROR(start("root", kRegions[0], true, "", ""));
  Agent& root = *nodes["root"].agent;
  const std::string root_address = root.Snapshot().listen_address;
  const std::string key = root.PublicKeyPem();
  for (uint32_t i = 0; i < a.members; ++i) {
    const std::string region = kRegions[i % a.regions];
    char id[64];
    std::snprintf(id, sizeof id, "%s-%02u", region.c_str(), i / a.regions + 1);
    TERN_RETURN_IF_ERROR(start(id, region, false, root_address, key));
  }
  auto wait = [](const std::function<bool()>& cond, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!cond()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  };
  TERN_REQUIRE(wait([&] { return root.Snapshot().members.size() == a.members; }, 30), kTimeout,
               "members did not all join within 30 s");
  {
    const AgentSnapshot s = root.Snapshot();
    std::printf("relay tree (stripe 0):\n");
    for (const auto& m : s.members)
      std::printf("  %-14s <- %-14s depth %u\n", m.id.c_str(), m.parent.c_str(), m.depth);
    std::printf("\n");
  }

  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  const uint64_t view_bytes = gen->view().total_bytes();
  std::printf("%7s %8s %11s %11s %8s %9s %10s %10s %12s  %s\n", "version", "changed", "shipped",
              "full view", "smaller", "publish", "first", "last", "x-region", "verified");
  std::printf("%7s %8s %11s %11s %8s %9s %10s %10s %12s\n", "", "", "(patch)", "", "", "(s)", "serve (ms)",
              "serve (ms)", "bytes");
  uint64_t cross_before = 0;
  double worst_last_ms = 0;
  for (uint32_t v = 1; v <= a.versions; ++v) {
    if (v > 1) TERN_RETURN_IF_ERROR(gen->Step());
    const std::string path = dir + "/trace/v" + std::to_string(v);
    CreateOptions co;
    TERN_RETURN_IF_ERROR(WriteTraceCheckpoint(*gen, path, {}, co, pool));
    const double t0 = NowSeconds();
    TERN_RETURN_IF_ERROR(root.Publish(path, v));
    const double publish_s = NowSeconds() - t0;
    const bool served = wait(
        [&] {
          for (const auto& m : root.Snapshot().members)
            if (m.served_version < v) return false;
          return true;
        },
        120);
    TERN_REQUIRE(served, kTimeout, "version ", v, " not served by every member within 120 s");
    // One more heartbeat so the byte counters include this version.
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const AgentSnapshot s = root.Snapshot();
    AgentVersionStatus vs;
    for (const auto& x : s.versions)
      if (x.version == v) vs = x;
    std::map<std::string, std::string> region_of;
    region_of["root"] = kRegions[0];
    for (const auto& m : s.members) region_of[m.id] = m.region;
    uint64_t cross = 0;
    for (const auto& m : s.members)
      if (region_of[m.parent] != m.region) cross += m.bytes_in;
    uint32_t equal = 0;
    std::string differs;
    for (auto& [id, n] : nodes) {
      if (id == "root") continue;
      const std::string d = FirstDifference(n.dir + "/current", path);
      if (d.empty()) {
        ++equal;
      } else if (differs.empty()) {
        differs = id + ": " + d;
      }
    }
    const uint64_t shipped = v == 1 ? vs.keyframe_bytes : vs.patch_bytes;
    worst_last_ms = std::max(worst_last_ms, vs.last_served_s * 1e3);
    std::printf("%7u %7.3f%% %11s %11s %7.1fx %9.2f %10.1f %10.1f %12s  %u/%u bitwise%s\n", v,
                v == 1 ? 100.0 : 100.0 * gen->last_stats().changed_fraction(), HumanBytes(shipped).c_str(),
                HumanBytes(view_bytes).c_str(), static_cast<double>(view_bytes) / std::max<uint64_t>(1, shipped),
                publish_s, vs.first_served_s * 1e3, vs.last_served_s * 1e3,
                HumanBytes(cross - cross_before).c_str(), equal, a.members, v == 1 ? " (keyframe)" : "");
    std::fflush(stdout);
    cross_before = cross;
    TERN_REQUIRE(differs.empty(), kInternal, "version ", v, ": ", differs);
    std::error_code rm;
    if (v > 2) fs::remove_all(dir + "/trace/v" + std::to_string(v - 2), rm);
  }
  std::printf("\nevery member served every version bit for bit; the slowest version reached its last "
              "member %.1f ms after publish returned.\n",
              worst_last_ms);
  std::printf("shipped: the patch (version 1: the keyframe, a patch from the all-zero view); first/last "
              "serve: from publish returning to the first/last member's DIR/current switching; x-region: "
              "bytes received by members whose parent is in another region.\n");
  for (auto& [id, n] : nodes)
    if (id != "root") n.agent->Stop();
  nodes["root"].agent->Stop();
  return Status::Ok();
}

}  // namespace tern::cli

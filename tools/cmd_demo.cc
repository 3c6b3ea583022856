// tern demo: the transfer agent end to end (tools/demo_agents.cc), or with
// --codec the codec alone on a simulated RL run. A trainer-side trace
// generator takes Adam steps on FP32 master weights; each step's serve view is
// diffed against the previous one, the patch is applied to a replica (the
// "engine"), and the replica is checked bit for bit against the trainer's view
// and by its digest. One table row per step.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/datagen.h"
#include "tools/cli_util.h"
#include "tools/commands.h"
#include "tools/demo_agents.h"

namespace tern::cli {
namespace {

// The engine side: its own copy of the serve view.
struct Replica {
  std::vector<TensorDesc> descs;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  MutableServeView view;

  explicit Replica(const ServeView& source) {
    descs.reserve(source.tensors.size());
    for (const TensorRef& t : source.tensors) descs.push_back(*t.desc);
    for (size_t i = 0; i < descs.size(); ++i) {
      const uint64_t bytes = descs[i].bytes();
      buffers.emplace_back(new uint8_t[bytes ? bytes : 1]);
      std::memcpy(buffers.back().get(), source.tensors[i].data, bytes);
      view.tensors.push_back(MutableTensorRef{&descs[i], buffers.back().get()});
    }
  }
};

// First tensor whose bytes differ, or "" when identical.
std::string FirstDifference(const ServeView& a, const MutableServeView& b) {
  for (size_t i = 0; i < a.tensors.size(); ++i)
    if (std::memcmp(a.tensors[i].data, b.tensors[i].data, a.tensors[i].desc->bytes()) != 0)
      return a.tensors[i].desc->name;
  return "";
}

struct DemoArgs {
  // Flags.
  bool codec = false;
  AgentDemoArgs agents;
  unsigned threads = 0;
  uint64_t params = 0, steps = 0;
  std::string dtype;
  double link_gbps = 0;
  // From the flags, by CheckDemo.
  TraceConfig config;
  DiffOptions options;
};

Status CheckDemo(DemoArgs& a) {
  if (!a.codec) {
    a.agents.params = a.params;
    a.agents.threads = a.threads;
    a.agents.config.seed = a.config.seed;
    a.agents.config.adam.lr = a.config.adam.lr;
    TERN_ASSIGN_OR_RETURN(a.agents.config.format, ServeFormatFromName(a.dtype));
    return Status::Ok();
  }
  TERN_REQUIRE(a.steps >= 1 && a.steps <= 10000, kInvalidArgument, "--steps must be 1..10000");
  TERN_ASSIGN_OR_RETURN(a.config.shape, ChooseModelShape(a.params));
  TERN_ASSIGN_OR_RETURN(a.config.format, ServeFormatFromName(a.dtype));
  TERN_REQUIRE(a.link_gbps > 0, kInvalidArgument, "--link-gbps must be positive");
  return a.config.Validate();
}

Status Demo(const DemoArgs& a) {
  if (!a.codec) return RunAgentDemo(a.agents);
  const uint64_t steps = a.steps;
  const double link_gbps = a.link_gbps;
  const TraceConfig& config = a.config;
  DiffOptions options = a.options;
  ThreadPool pool(a.threads);
  std::printf("tern demo: %llu-parameter decoder (hidden %llu, %llu layers, vocab %llu), "
              "Adam lr %g, serve view %s, %u threads\n",
              static_cast<unsigned long long>(config.shape.parameters()),
              static_cast<unsigned long long>(config.shape.hidden_size),
              static_cast<unsigned long long>(config.shape.num_hidden_layers),
              static_cast<unsigned long long>(config.shape.vocab_size), config.adam.lr,
              std::string(ServeFormatName(config.format)).c_str(), pool.size());
  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  Replica engine(gen->view());
  const uint64_t full_bytes = gen->view().total_bytes();
  double t0 = NowSeconds();
  ViewDigest digest = ComputeDigest(AsConst(engine.view), pool);
  std::printf("version 0: %s, %s (full digest %.2f s)\n\n", HumanBytes(full_bytes).c_str(),
              digest.ToString().c_str(), NowSeconds() - t0);

  std::printf("%4s %9s %11s %9s %8s %10s %10s %10s %9s  %s\n", "step", "changed%", "patch",
              "smaller", "bits/chg", "encode_ms", "apply_ms", "scrub_ms", "wire_ms", "verified");
  uint64_t total_patch = 0, total_changed = 0;
  for (uint64_t step = 1; step <= steps; ++step) {
    TERN_RETURN_IF_ERROR(gen->Step());
    options.base_version = step - 1;
    options.target_version = step;

    t0 = NowSeconds();
    TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch,
                          Diff(AsConst(engine.view), gen->view(), options, pool, &digest));
    const double t1 = NowSeconds();
    ViewDigest new_digest;
    TERN_RETURN_IF_ERROR(Apply(engine.view, patch, digest, pool, &new_digest));
    const double t2 = NowSeconds();
    // Independent checks: the replica equals the trainer's view byte for byte,
    // and a from-scratch digest (the scrub path) equals the patch's target.
    const std::string differs = FirstDifference(gen->view(), engine.view);
    if (!differs.empty())
      return TERN_ERROR(kInternal, "step ", step, ": replica differs in ", differs);
    const ViewDigest scrub = ComputeDigest(gen->view(), pool);
    const double t3 = NowSeconds();
    if (!(scrub == new_digest))
      return TERN_ERROR(kInternal, "step ", step, ": digest after apply disagrees with scrub");
    digest = new_digest;

    TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(patch));
    total_patch += patch.size();
    total_changed += info.changed_elements;
    const double wire_ms = patch.size() * 8.0 / (link_gbps * 1e9) * 1e3;
    std::printf("%4llu %9.4f %11s %8.1fx %8.2f %10.1f %10.1f %10.1f %9.1f  bitwise+digest\n",
                static_cast<unsigned long long>(step), 100.0 * gen->last_stats().changed_fraction(),
                HumanBytes(patch.size()).c_str(), double(full_bytes) / std::max<size_t>(1, patch.size()),
                info.bits_per_changed(), (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, wire_ms);
    std::fflush(stdout);
  }
  std::printf("\n%llu steps: patches %s in all vs %s for full views (%.1fx smaller), "
              "%.2f bits per changed element\n",
              static_cast<unsigned long long>(steps), HumanBytes(total_patch).c_str(),
              HumanBytes(full_bytes * steps).c_str(),
              double(full_bytes * steps) / std::max<uint64_t>(1, total_patch),
              total_changed ? 8.0 * total_patch / total_changed : 0.0);
  std::printf("at %.0f Gb/s a step ships in %.1f ms on average vs %.1f ms for a full view\n",
              link_gbps, total_patch * 8.0 / (link_gbps * 1e9) * 1e3 / steps,
              full_bytes * 8.0 / (link_gbps * 1e9) * 1e3);
  return Status::Ok();
}

}  // namespace

void AddDemo(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<DemoArgs>();
  CLI::App* cmd = tern.add_subcommand(
      "demo", "a root and members in three regions keep their weights in sync (or --codec)");
  cmd->footer(
      "Default: a root agent and --members member agents in --regions regions on this machine\n"
      "(TCP on 127.0.0.1), a datagen RL trace published version by version, each member's\n"
      "DIR/current checked bit for bit against what was published.\n"
      "--codec: the codec alone: Adam steps on FP32 master weights, each step's serve view\n"
      "diffed against the last, the patch applied to a replica and verified bit for bit.");
  cmd->add_flag("--codec", a->codec, "run the codec alone (no agents)");
  AddUnsigned(*cmd, "--members", a->agents.members, "member agents (1..64)", "12");
  AddUnsigned(*cmd, "--regions", a->agents.regions, "regions the members are spread over (1..8)", "3");
  AddUnsigned(*cmd, "--versions", a->agents.versions, "versions to publish (1..1000)", "8");
  AddUnsigned(*cmd, "--stripes", a->agents.stripes, "relay trees a version is striped over (1..8)", "1", 8);
  cmd->add_option("--dir", a->agents.dir, "where the agents keep their data (default: a temporary directory)");
  cmd->add_flag("--keep", a->agents.keep, "keep the temporary directory");
  cmd->add_flag("--verbose", a->agents.verbose, "print the agents' log lines");
  cmd->add_flag(
      "--no-stream-apply", a->agents.no_stream_apply,
      "members apply a patch only once complete (to compare with applying while it arrives)");
  AddCount(*cmd, "--params", a->params, "model size in parameters (10M .. 1G style)", "20M");
  AddUnsigned(*cmd, "--steps", a->steps, "--codec: optimizer steps (1..10000)", "5");
  AddDouble(*cmd, "--lr", a->config.adam.lr, "Adam learning rate", "1e-6");
  AddUnsigned(*cmd, "--seed", a->config.seed, "trace seed", "1");
  cmd->add_option("--dtype", a->dtype, "serve view dtype: bf16 or fp16")->default_val("bf16");
  AddCount(*cmd, "--segment-elements", a->options.segment_elements, "elements per patch segment",
           "1048576");
  AddDouble(*cmd, "--link-gbps", a->link_gbps, "link rate for the wire-time column (Gb/s)", "10");
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {[a] { return CheckDemo(*a); }, [a] { return Demo(*a); }});
}

}  // namespace tern::cli

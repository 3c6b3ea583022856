// tern_sim: the scale simulator (docs/scale.md). Reads a scenario and the
// measured component costs (JSON), plans the fleet with the agent's own
// membership and planner, simulates every version and writes the results
// as JSON: per version the time to the first and last island holding and
// serving it, bytes per WAN link, the critical path; the physical bound,
// the planner's own estimate and the baselines (a) full checkpoint star
// over HTTP and (d) every island pulling the patch from one store.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/sim/sim.h"
#include "tools/cli_args.h"

namespace tern::sim {
namespace {

struct Args {
  std::string scenario, costs, out = "-";
  bool pretty = false, no_path = false;
  uint32_t versions = 0;
};

Result<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TERN_REQUIRE(f.good(), kNotFound, "cannot read ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  TERN_REQUIRE(ss.str().size() <= (64u << 20), kOutOfRange, path, " is larger than 64 MiB");
  return ss.str();
}

nlohmann::json ToJson(const RunResult& r, const Scenario& sc, bool with_path) {
  using json = nlohmann::json;
  json j;
  j["scenario"] = sc.name;
  j["view_bytes"] = r.view_bytes;
  j["patch_bytes"] = r.patch_bytes;
  j["encode_s"] = r.encode_s;
  j["apply_s"] = r.apply_s;
  j["bound"] = {{"s", r.bound_s},
                {"rate_bytes_per_s", r.bound_rate_bytes_per_s},
                {"narrowest", r.bound_narrowest},
                {"farthest_one_way_s", r.farthest_one_way_s}};
  j["planner_estimate_s"] = r.planner_estimate_s;
  j["plan"] = {{"members", r.members},
               {"relays", r.relays},
               {"depth_max", r.depth_max},
               {"stripes", r.stripes},
               {"fanout_max", sc.plan.fanout_max},
               {"build", sc.plan_build},
               {"root_fanout_max", sc.plan.root_fanout_max}};
  auto base = [](const BaselineResult& b) {
    return json{{"last_holding_s", b.last_holding_s},
                {"last_serving_s", b.last_serving_s},
                {"wan_bytes", b.wan_bytes}};
  };
  j["baselines"] = {{"a_full_star_http", base(r.full_star)}, {"d_store_pull", base(r.store_pull)}};
  json vs = json::array();
  std::vector<double> last;
  for (const VersionResult& v : r.versions) {
    json x = {{"version", v.version},
              {"start_s", v.start_s},
              {"islands", v.islands},
              {"failed", v.failed},
              {"replans", v.replans},
              {"first_holding_s", v.first_holding_s},
              {"last_holding_s", v.last_holding_s},
              {"first_serving_s", v.first_serving_s},
              {"last_serving_s", v.last_serving_s},
              {"last_island", v.last_island},
              {"wan_bytes", v.wan_bytes}};
    if (with_path) {
      json path = json::array();
      for (const Hop& h : v.critical_path)
        path.push_back({{"id", h.id},
                        {"region", h.region},
                        {"first_chunk_s", h.first_chunk_s},
                        {"last_chunk_s", h.last_chunk_s},
                        {"rate_bytes_per_s", h.rate_bytes_per_s}});
      x["critical_path"] = path;
    }
    vs.push_back(x);
    last.push_back(v.last_serving_s);
  }
  j["versions"] = vs;
  std::sort(last.begin(), last.end());
  auto q = [&](double p) {
    return last.empty() ? 0.0 : last[std::min(last.size() - 1, size_t(p * last.size()))];
  };
  double mean = 0;
  for (double t : last) mean += t;
  uint32_t hit = 0;
  for (const VersionResult& v : r.versions) hit += v.failed > 0;
  j["summary"] = {{"versions", last.size()},
                  {"last_serving_mean_s", last.empty() ? 0 : mean / last.size()},
                  {"last_serving_p50_s", q(0.5)},
                  {"last_serving_p99_s", q(0.99)},
                  {"last_serving_max_s", last.empty() ? 0 : last.back()},
                  {"versions_with_failures", hit}};
  return j;
}

Status Run(const Args& a) {
  TERN_ASSIGN_OR_RETURN(std::string sc_text, ReadText(a.scenario));
  TERN_ASSIGN_OR_RETURN(std::string costs_text, ReadText(a.costs));
  TERN_ASSIGN_OR_RETURN(Scenario sc, ParseScenario(sc_text));
  TERN_ASSIGN_OR_RETURN(Costs costs, ParseCosts(costs_text));
  if (a.versions) sc.versions = a.versions;
  TERN_ASSIGN_OR_RETURN(auto sim, Simulator::Create(sc, costs));
  TERN_ASSIGN_OR_RETURN(RunResult r, sim->Run());
  const std::string text = ToJson(r, sc, !a.no_path).dump(a.pretty ? 2 : -1) + "\n";
  if (a.out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::Ok();
  }
  std::ofstream f(a.out, std::ios::binary | std::ios::trunc);
  f << text;
  TERN_REQUIRE(f.good(), kIo, "cannot write ", a.out);
  return Status::Ok();
}

}  // namespace
}  // namespace tern::sim

int main(int argc, char** argv) {
  using namespace tern;
  CLI::App app(
      "Simulates tern's dissemination of versions through the agent's relay trees "
      "(docs/scale.md); JSON in, JSON out.",
      "tern_sim");
  cli::Configure(app);
  sim::Args a;
  app.add_option("--scenario", a.scenario,
                 "scenario JSON (model, topology, plan, transport, failures)")
      ->required();
  app.add_option("--costs", a.costs, "measured component costs JSON (bench/sim/costs.json)")
      ->required();
  app.add_option("--out", a.out, "where the results go ('-': stdout)")->default_val("-");
  cli::AddUnsigned(app, "--versions", a.versions, "versions to simulate (0: the scenario's)", "0",
                   100000);
  app.add_flag("--pretty", a.pretty, "indent the JSON");
  app.add_flag("--no-critical-path", a.no_path, "leave the per-version critical path out");
  cli::Dispatch dispatch;
  dispatch.On(&app, {[] { return Status::Ok(); }, [&] { return sim::Run(a); }});
  return dispatch.Run(app, argc, argv);
}

// tern-sidecar's overhead per request and per streamed event, measured in
// one run against calling the engine double (fake_engine.h) directly: the
// same requests, the same client code, 1 and 32 concurrent clients
// (docs/benchmarks.md, "Sidecar overhead").
//
//   agent_sidecar_bench [REQUESTS_PER_CLIENT]   (default 300)
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "agent/ops/admin_http.h"
#include "agent/sidecar/fake_engine.h"
#include "agent/sidecar/sidecar.h"
#include "base/text.h"

namespace {

using namespace tern;
using namespace tern::agent;
using Clock = std::chrono::steady_clock;

struct Run {
  double wall_s = 0;
  std::vector<double> latency_us;
  int failures = 0;
};

Run Drive(const std::string& address, int clients, int requests_each, const std::string& body) {
  Run run;
  std::vector<std::vector<double>> lat(clients);
  std::vector<int> failures(clients);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto hp = ParseHostPort(address);
      httplib::Client cli(hp->host, hp->port);
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);  // else Nagle and delayed ACKs cost ~40 ms a request
      for (int i = 0; i < requests_each; ++i) {
        const auto s = Clock::now();
        auto res = cli.Post("/v1/completions", body, "application/json");
        if (!res || res->status != 200) ++failures[c];
        lat[c].push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  run.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int c = 0; c < clients; ++c) {
    run.latency_us.insert(run.latency_us.end(), lat[c].begin(), lat[c].end());
    run.failures += failures[c];
  }
  std::sort(run.latency_us.begin(), run.latency_us.end());
  return run;
}

double Pct(const std::vector<double>& v, double p) {
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 300;
  testing::FakeEngine engine;
  engine.version = 1;
  VersionGate gate(CommitMode::kInPlace);
  if (!gate.Commit(1, nullptr, 1000).ok()) return 1;
  SidecarOptions o;
  o.listen = "127.0.0.1:0";
  o.engine.url = engine.url();
  o.log = [](std::string_view) {};
  auto sidecar = Sidecar::Start(std::move(o), gate);
  if (!sidecar.ok()) {
    std::fprintf(stderr, "%s\n", sidecar.status().ToString().c_str());
    return 1;
  }
  const std::string direct = engine.url().substr(7);
  const std::string proxied = (*sidecar)->address();
  const std::string whole =
      R"({"model":"m","prompt":"hello","max_tokens":16,"weight_version":{"min_version":1,"exact_version":null}})";
  const int kEvents = 64;
  const std::string stream = R"({"model":"m","prompt":"hello","stream":true,"max_tokens":)" +
                             std::to_string(kEvents) +
                             R"(,"weight_version":{"min_version":1,"exact_version":null}})";
  std::printf("%-8s %-7s %5s %9s %9s %9s %9s %9s %8s\n", "reply", "clients", "path", "req/s",
              "p50_us", "p99_us", "mean_us", "ovh_us", "ratio");
  for (const auto& [name, body] : {std::pair{"whole", whole}, std::pair{"stream64", stream}}) {
    for (int clients : {1, 32}) {
      const int each = std::max(10, clients == 1 ? requests : requests / 8);
      Drive(direct, clients, 10, body);  // warm both paths' connections
      Drive(proxied, clients, 10, body);
      Run d = Drive(direct, clients, each, body);
      Run s = Drive(proxied, clients, each, body);
      auto mean = [](const Run& r) {
        double sum = 0;
        for (double v : r.latency_us) sum += v;
        return r.latency_us.empty() ? 0 : sum / r.latency_us.size();
      };
      for (const auto& [path, r] : {std::pair{"direct", &d}, std::pair{"sidecar", &s}}) {
        std::printf("%-8s %-7d %5s %9.0f %9.0f %9.0f %9.0f %9s %8s%s\n", name, clients, path,
                    r->latency_us.size() / r->wall_s, Pct(r->latency_us, 0.5),
                    Pct(r->latency_us, 0.99), mean(*r),
                    r == &s ? std::to_string(static_cast<int>(mean(s) - mean(d))).c_str() : "",
                    r == &s ? (std::to_string(mean(s) / mean(d)).substr(0, 4) + "x").c_str() : "",
                    r->failures ? " FAILURES" : "");
      }
      if (std::string(name) == "stream64")
        std::printf("         per streamed event: %.1f us over direct\n",
                    (mean(s) - mean(d)) / (kEvents + 1));
    }
  }
  (*sidecar)->Stop();
  return 0;
}

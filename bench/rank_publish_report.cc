// Publishing from trainer ranks (include/tern/rank_publish.h): the two
// figures of docs/benchmarks.md "Publishing from ranks".
//  1. A rank's publish overhead per core: RankPublisher::Encode of a BF16
//     shard with ~1% of its elements changed, against a memcpy of the shard,
//     in the same run (goal: <= 3x).
//  2. Commit latency with 2 and 4 ranks on an in-process root (loopback, no
//     members): from the last rank's PublishRankPart call to its return
//     (the version on the board and served by the root).
// Usage: rank_publish_report [shard_mib (default 64)] [versions (default 5)]
//        [overhead-only: any third argument skips the commit latency]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "tern/agent.h"
#include "tern/loopback_transport.h"
#include "tern/rank_publish.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ~1% of BF16 elements moved by one ulp.
void Step(std::vector<uint16_t>& w, std::mt19937_64& rng) {
  for (size_t i = rng() % 100; i < w.size(); i += 50 + rng() % 100) w[i] ^= 1;
}

int OverheadPerCore(uint64_t shard_mib, int versions, uint16_t format) {
  const uint64_t rows = shard_mib * 256, cols = 2048;  // BF16: shard_mib MiB
  std::vector<tern::TensorDesc> layout{{"w", tern::DType::kBF16, {rows, cols}}};
  tern::RankPublisherOptions options;
  options.format_version = format;
  auto p = tern::RankPublisher::Create(0, 1, layout, {{"w", 0, rows * cols}}, options);
  if (!p.ok()) return std::fprintf(stderr, "%s\n", p.status().ToString().c_str()), 1;
  std::vector<uint16_t> w(rows * cols);
  std::mt19937_64 rng(7);
  for (auto& x : w) x = static_cast<uint16_t>(0x3c00 + rng() % 512);
  std::vector<uint16_t> copy(w.size());
  auto first = (*p)->Encode(1, {{{"w", 0, rows * cols}, w.data(), w.size() * 2}});
  if (!first.ok()) return std::fprintf(stderr, "%s\n", first.status().ToString().c_str()), 1;
  if (tern::Status c = (*p)->Committed(); !c.ok())
    return std::fprintf(stderr, "%s\n", c.ToString().c_str()), 1;
  std::printf("overhead per core: BF16 shard of %llu MiB, ~1%% changed, format %u\n",
              static_cast<unsigned long long>(shard_mib), static_cast<unsigned>(format));
  // The rank's whole cost per version: Encode (before the part is sent)
  // plus Committed (after the root committed: the records applied to the
  // previous view). ratio = (encode + commit) / memcpy.
  std::printf("%8s %10s %10s %10s %8s %12s\n", "version", "encode_s", "commit_s", "memcpy_s", "ratio",
              "part_bytes");
  for (int v = 2; v < 2 + versions; ++v) {
    Step(w, rng);
    const auto t0 = Clock::now();
    std::memcpy(copy.data(), w.data(), w.size() * 2);
    const auto t1 = Clock::now();
    auto part = (*p)->Encode(v, {{{"w", 0, rows * cols}, w.data(), w.size() * 2}});
    const auto t2 = Clock::now();
    if (!part.ok()) return std::fprintf(stderr, "%s\n", part.status().ToString().c_str()), 1;
    tern::Status c = (*p)->Committed();
    const auto t3 = Clock::now();
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.ToString().c_str()), 1;
    uint64_t bytes = 0;
    for (const auto& r : part->records) bytes += r.bytes.size();
    std::printf("%8d %10.4f %10.4f %10.4f %8.2f %12llu\n", v, Seconds(t1, t2), Seconds(t2, t3),
                Seconds(t0, t1), Seconds(t1, t3) / Seconds(t0, t1), static_cast<unsigned long long>(bytes));
  }
  return 0;
}

int CommitLatency(uint32_t world, uint64_t shard_mib, int versions) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("tern-rank-bench-" + std::to_string(::getpid()) + "-" + std::to_string(world));
  std::filesystem::remove_all(dir);
  tern::LoopbackNetwork net;
  auto transport = tern::NewLoopbackTransport(net);
  tern::AgentOptions o;
  o.root = true;
  o.listen = "root";
  o.id = "root";
  o.data_dir = dir;
  o.transport = transport.get();
  o.log = [](std::string_view) {};
  auto root = tern::Agent::Start(o);
  if (!root.ok()) return std::fprintf(stderr, "%s\n", root.status().ToString().c_str()), 1;
  const uint64_t rows = shard_mib * 256 * world, cols = 2048;
  std::vector<tern::TensorDesc> layout{{"w", tern::DType::kBF16, {rows, cols}}};
  std::vector<std::unique_ptr<tern::RankPublisher>> ranks;
  const uint64_t per = rows / world * cols;
  for (uint32_t r = 0; r < world; ++r)
    ranks.push_back(std::move(tern::RankPublisher::Create(r, world, layout, {{"w", r * per, per}})).value());
  std::vector<uint16_t> w(rows * cols);
  std::mt19937_64 rng(9);
  for (auto& x : w) x = static_cast<uint16_t>(0x3c00 + rng() % 512);
  std::printf("commit latency: %u ranks x %llu MiB BF16, root in process, no members\n", world,
              static_cast<unsigned long long>(shard_mib));
  std::printf("%8s %12s %12s\n", "version", "commit_s", "patch_bytes");
  for (int v = 1; v <= versions + 1; ++v) {
    if (v > 1) Step(w, rng);
    std::vector<tern::RankPart> parts;
    uint64_t bytes = 0;
    for (uint32_t r = 0; r < world; ++r) {
      parts.push_back(std::move(ranks[r]->Encode(
                                    v, {{{"w", r * per, per}, w.data() + r * per, per * 2}}))
                          .value());
      for (const auto& rec : parts.back().records) bytes += rec.bytes.size();
    }
    // Every rank but the last is waiting when the last one sends.
    std::vector<std::future<tern::Status>> waiting;
    for (uint32_t r = 0; r + 1 < world; ++r)
      waiting.push_back(std::async(std::launch::async,
                                   [&, r] { return (*root)->PublishRankPart(parts[r], 60000); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t0 = Clock::now();
    tern::Status s = (*root)->PublishRankPart(parts[world - 1], 60000);
    const auto t1 = Clock::now();
    for (auto& f : waiting)
      if (tern::Status o2 = f.get(); !o2.ok()) s = o2;
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
    for (auto& r : ranks)
      if (tern::Status c = r->Committed(); !c.ok()) return std::fprintf(stderr, "%s\n", c.ToString().c_str()), 1;
    std::printf("%8d %12.4f %12llu%s\n", v, Seconds(t0, t1), static_cast<unsigned long long>(bytes),
                v == 1 ? "  (first: a keyframe from zeros)" : "");
  }
  root->reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t shard_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  const int versions = argc > 2 ? std::atoi(argv[2]) : 5;
  if (shard_mib < 1 || shard_mib > 4096 || versions < 1 || versions > 100) {
    std::fprintf(stderr, "usage: rank_publish_report [shard_mib 1..4096] [versions 1..100]\n");
    return 2;
  }
  for (uint16_t format : {uint16_t{1}, uint16_t{2}})
    if (int rc = OverheadPerCore(shard_mib, versions, format); rc != 0) return rc;
  if (argc > 3) return 0;
  for (uint32_t world : {2u, 4u})
    if (int rc = CommitLatency(world, shard_mib, versions); rc != 0) return rc;
  return 0;
}

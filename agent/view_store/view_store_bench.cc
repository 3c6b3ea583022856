// The view store on a real trace: apply time per version and disk space, next
// to `tern apply`'s path (ApplyCheckpoint: copy the base, apply, commit) in
// the same run. Figures and the command: docs/agent/apply.md.
//
//   agent_view_store_bench TRACE_DIR DATA_DIR [threads]
//   agent_view_store_bench TRACE_DIR DATA_DIR threads compare
//
// `compare`: the switch as the agent drives it (PrepareSpare between
// versions, off the critical path), with the data sync deferred (the
// default) and with ViewStoreOptions::sync_at_switch, two stores advanced
// alternately in the same run; Advance and PrepareSpare timed apart
// (figures: docs/benchmarks.md).
//
// TRACE_DIR holds step-* checkpoint directories (`tern datagen --out`);
// DATA_DIR must not exist (it is created and removed).
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/view_store/view_store.h"
#include "tern/apply_checkpoint.h"
#include "tern/checkpoint.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace fs = std::filesystem;
using namespace tern;

namespace {

// Allocated bytes under path (holes not counted, links not followed).
uint64_t DiskBytes(const std::string& path) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    struct stat st;
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Fail(const Status& st) {
  std::fprintf(stderr, "view_store_bench: %s\n", st.ToString().c_str());
  return 1;
}

// Two stores, deferred and synced at the switch, fed the same patches.
int Compare(const std::vector<std::string>& steps,
            const std::vector<std::unique_ptr<Checkpoint>>& views, const std::string& data,
            ThreadPool& pool) {
  std::unique_ptr<agent::ViewStore> stores[2];
  std::string phases[2];
  const ViewDigest d0 = ComputeDigest(views[0]->view(), pool);
  for (int m = 0; m < 2; ++m) {
    agent::ViewStoreOptions options;
    options.sync_at_switch = m == 1;
    auto store = agent::ViewStore::Open(
        DefaultEnv(), data + (m == 0 ? "/deferred" : "/synced"), pool,
        [&phases, m](std::string_view line) {
          if (line.find(" ms = ") != std::string_view::npos) phases[m] = line;
        },
        options);
    if (!store.ok()) return Fail(store.status());
    stores[m] = std::move(*store);
    if (Status st = stores[m]->Seed(steps[0], 1, d0); !st.ok()) return Fail(st);
  }
  std::printf("%-8s %9s %13s %14s %12s %13s %7s\n", "version", "patch_MB", "deferred_adv_s",
              "deferred_prep_s", "synced_adv_s", "synced_prep_s", "ratio");
  for (size_t k = 1; k < steps.size(); ++k) {
    DiffOptions o;
    o.base_version = k;
    o.target_version = k + 1;
    auto patch = Diff(views[k - 1]->view(), views[k]->view(), o, pool);
    if (!patch.ok()) return Fail(patch.status());
    double advance_s[2], prepare_s[2];
    // Alternate which store goes first, so that neither always finds the
    // other's writeback in flight.
    for (int i = 0; i < 2; ++i) {
      const int m = (static_cast<int>(k) + i) % 2;
      auto t0 = std::chrono::steady_clock::now();
      if (Status st = stores[m]->Advance(*patch); !st.ok()) return Fail(st);
      advance_s[m] = Seconds(t0);
      t0 = std::chrono::steady_clock::now();
      if (Status st = stores[m]->PrepareSpare(); !st.ok()) return Fail(st);
      prepare_s[m] = Seconds(t0);
    }
    std::printf("%-8zu %9.2f %13.3f %14.3f %12.3f %13.3f %7.2f\n", k + 1, patch->size() / 1e6,
                advance_s[0], prepare_s[0], advance_s[1], prepare_s[1],
                advance_s[0] / advance_s[1]);
    std::printf("         deferred: %s\n         synced:   %s\n", phases[0].c_str(),
                phases[1].c_str());
  }
  bool same = true;
  const ViewDigest last = ComputeDigest(views.back()->view(), pool);
  for (auto& store : stores) {
    auto served = Checkpoint::Open(store->current_path());
    if (!served.ok()) return Fail(served.status());
    same = same && ComputeDigest((*served)->view(), pool) == last;
    store.reset();
  }
  std::printf("both stores serve the trace's last step: %s\n", same ? "yes" : "NO");
  fs::remove_all(data);
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TRACE_DIR DATA_DIR [threads]\n", argv[0]);
    return 2;
  }
  const std::string trace = argv[1], data = argv[2];
  ThreadPool pool(argc > 3 ? static_cast<unsigned>(std::stoul(argv[3])) : 0);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(trace))
    if (e.path().filename().string().starts_with("step-")) steps.push_back(e.path().string());
  std::sort(steps.begin(), steps.end());
  if (steps.size() < 2 || fs::exists(data)) {
    std::fprintf(stderr, "need >= 2 step-* dirs in %s and a new DATA_DIR\n", trace.c_str());
    return 2;
  }
  std::vector<std::unique_ptr<Checkpoint>> views;
  for (const auto& s : steps) {
    auto c = Checkpoint::Open(s);
    if (!c.ok()) return Fail(c.status());
    views.push_back(std::move(*c));
  }
  if (argc > 4 && std::string(argv[4]) == "compare") return Compare(steps, views, data, pool);
  const uint64_t model_bytes = DiskBytes(steps[0]);
  std::printf("trace %s: %zu versions, model %.1f MB on disk (%.1f MB of tensors), %u threads\n",
              trace.c_str(), steps.size(), model_bytes / 1e6, views[0]->view().total_bytes() / 1e6,
              pool.size());

  // The store's per-version phase times, printed after each row.
  std::string phases;
  auto store_or = agent::ViewStore::Open(DefaultEnv(), data, pool, [&](std::string_view line) {
    if (line.find(" ms = ") != std::string_view::npos) phases = line;
  });
  if (!store_or.ok()) return Fail(store_or.status());
  auto& store = *store_or;
  auto t0 = std::chrono::steady_clock::now();
  const ViewDigest d0 = ComputeDigest(views[0]->view(), pool);
  if (Status st = store->Seed(steps[0], 1, d0); !st.ok()) return Fail(st);
  std::printf("seed (digest + copy + fsync): %.2f s, disk %.1f MB\n", Seconds(t0),
              DiskBytes(data) / 1e6);
  std::printf("%-8s %10s %9s %10s %12s %14s %8s\n", "version", "patch_MB", "advance_s",
              "apply_ckpt_s", "disk_MB", "extra/model", "ratio");
  for (size_t k = 1; k < steps.size(); ++k) {
    DiffOptions o;
    o.base_version = k;
    o.target_version = k + 1;
    auto patch = Diff(views[k - 1]->view(), views[k]->view(), o, pool);
    if (!patch.ok()) return Fail(patch.status());
    t0 = std::chrono::steady_clock::now();
    if (Status st = store->Advance(*patch); !st.ok()) return Fail(st);
    const double advance_s = Seconds(t0);
    // The baseline: what `tern apply` does per version (a full copy).
    const std::string out = data + ".apply-baseline";
    t0 = std::chrono::steady_clock::now();
    auto r = ApplyCheckpoint(*views[k - 1], *patch, out, pool);
    const double apply_s = Seconds(t0);
    if (!r.ok()) return Fail(r.status());
    fs::remove_all(out);
    const uint64_t disk = DiskBytes(data);
    std::printf("%-8zu %10.2f %9.3f %10.3f %12.1f %14.3f %8.2f\n", k + 1, patch->size() / 1e6,
                advance_s, apply_s, disk / 1e6,
                static_cast<double>(disk - model_bytes) / static_cast<double>(model_bytes),
                advance_s / apply_s);
    std::printf("         %s\n", phases.c_str());
  }
  // Check what is served, bitwise by digest, against the last step.
  auto served = Checkpoint::Open(store->current_path());
  if (!served.ok()) return Fail(served.status());
  const bool same =
      ComputeDigest((*served)->view(), pool) == ComputeDigest(views.back()->view(), pool);
  std::printf("served version %llu digest %s the trace's last step\n",
              static_cast<unsigned long long>(store->version()), same ? "equals" : "DIFFERS FROM");
  store.reset();
  fs::remove_all(data);
  return same ? 0 : 1;
}

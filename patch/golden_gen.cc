// One-off generator of the golden patch files: `golden_gen DIR [CASE...]`.
// Run once when adding a case, naming it (existing files are never
// rewritten: a case's files are frozen once committed, see golden_test).
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "tern/thread_pool.h"
#include "patch/golden_cases.h"
#include "patch/context_codec.h"
#include "patch/test_util.h"
#include "tern/patch.h"

namespace {
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

int main(int argc, char** argv) {
  using namespace tern;
  if (argc < 2) {
    std::fprintf(stderr, "usage: golden_gen DIR [CASE...]\n");
    return 2;
  }
  ThreadPool pool(1);
  uint64_t seed = 1;
  for (const auto& c : golden::Cases()) {
    std::mt19937_64 rng(seed++);
    bool wanted = argc == 2;
    for (int i = 2; i < argc; ++i) wanted |= std::string(argv[i]) == c.file;
    if (!wanted) continue;
    testing::OwnedView a;
    for (const auto& t : c.tensors) a.Add(t.name, t.dtype, t.shape);
    auto physical = [&](size_t t) { return c.push > 0 && patchfmt::ContextFieldOf(a.descs[t].dtype).ok; };
    for (size_t t = 0; t < a.descs.size(); ++t) {
      if (physical(t)) testing::PhysicalFill(a.data[t], a.descs[t].dtype, a.descs[t].elements(), rng);
      else testing::FillRandom(a.data[t], rng);
    }
    testing::OwnedView b = a;
    for (size_t t = 0; t < b.descs.size(); ++t) {
      if (physical(t)) testing::PhysicalMutate(b.data[t], b.descs[t].dtype, b.descs[t].elements(), c.push, rng);
      else if (c.density < 0) testing::FillRandom(b.data[t], rng);
      else testing::Mutate(b.data[t], ElementBits(b.descs[t].dtype), b.descs[t].elements(), c.density, rng);
    }
    DiffOptions opt;
    opt.format_version = c.format;
    opt.segment_elements = c.segment_elements;
    opt.base_version = 100;
    opt.target_version = 101;
    auto patch = Diff(a.View(), b.View(), opt, pool);
    if (!patch.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.file, patch.status().ToString().c_str());
      return 1;
    }
    std::vector<uint8_t> base, target;
    for (const auto& d : a.data) base.insert(base.end(), d.begin(), d.end());
    for (const auto& d : b.data) target.insert(target.end(), d.begin(), d.end());
    const std::string stem = std::string(argv[1]) + "/" + c.file;
    WriteFile(stem + ".base", base);
    WriteFile(stem + ".target", target);
    WriteFile(stem + ".patch", *patch);
    std::printf("%s: %zu patch bytes\n", c.file, patch->size());
  }
  return 0;
}

// One-off generator of the golden patch files: `golden_gen DIR [CASE...]`;
// `golden_gen --fuzz-seeds tests/fuzz/corpus` writes the format-2 and -3 fuzz
// seeds.
// Run once when adding a case, naming it (existing files are never
// rewritten: a case's files are frozen once committed, see golden_test).
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <random>
#include <string>

#include "tern/thread_pool.h"
#include "patch/golden_cases.h"
#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/test_util.h"
#include "tern/patch.h"

namespace {
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

// Seeds for the format-2 fuzzers (tests/fuzz/corpus/patch_context and
// patch_roundtrip): steps with the physics of a served view, so that the
// encoder chooses CONTEXT and the fuzzers start inside its streams.
int WriteFuzzSeeds(const std::string& corpus) {
  using namespace tern;
  static constexpr DType kContextTypes[] = {DType::kBF16,   DType::kF16,    DType::kF32,    DType::kF64,
                                            DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0, DType::kF4};
  std::mt19937_64 rng(99);
  int written = 0;
  for (int t = 0; t < 8; ++t) {
    for (double push : {0.01, 0.05}) {
      const DType dt = kContextTypes[t];
      const uint64_t n = std::min<uint64_t>({6000 + 1000 * static_cast<uint64_t>(t), uint64_t{131072} / ElementBits(dt), 12288});
      testing::OwnedView a = testing::PhysicalBase(dt, n, rng);
      testing::OwnedView b = testing::PhysicalStep(a, push, rng);
      auto rec = EncodeSegment(a.View(), b.View(), 0, 0, n, 2);
      if (!rec.ok() || rec->bytes.empty()) continue;
      std::vector<uint8_t> seed = {static_cast<uint8_t>(t), static_cast<uint8_t>((n - 1) & 0xff),
                                   static_cast<uint8_t>((n - 1) >> 8)};
      seed.insert(seed.end(), a.data[0].begin(), a.data[0].end());
      seed.insert(seed.end(), rec->bytes.begin(), rec->bytes.end());
      char name[64];
      std::snprintf(name, sizeof name, "/patch_context/%s_p%03d", DTypeName(dt).data(), static_cast<int>(push * 100));
      WriteFile(corpus + name, seed);
      ++written;
    }
  }
  // patch_roundtrip: dtype index (BF16 = 2, F8_E4M3 = 5), format 2 and segment
  // 64 * 128 elements, then old and new bytes.
  for (uint8_t ti : {uint8_t{2}, uint8_t{5}}) {
    const DType dt = ti == 2 ? DType::kBF16 : DType::kF8E4M3;
    testing::OwnedView a = testing::PhysicalBase(dt, 4000, rng);
    testing::OwnedView b = testing::PhysicalStep(a, 0.03, rng);
    std::vector<uint8_t> seed = {ti, 0x80 | 63};
    seed.insert(seed.end(), a.data[0].begin(), a.data[0].end());
    seed.insert(seed.end(), b.data[0].begin(), b.data[0].end());
    WriteFile(corpus + "/patch_roundtrip/v2_" + std::string(DTypeName(dt)), seed);
    ++written;
  }
  // patch_roundtrip: packed 4-bit codes (U8 = 1, I32 = 6) moved nibble by
  // nibble, so that format 2 codes them as nibbles (version 3).
  for (uint8_t ti : {uint8_t{1}, uint8_t{6}}) {
    const DType dt = ti == 1 ? DType::kU8 : DType::kI32;
    const uint64_t n = 4000 / (ElementBits(dt) / 8);
    testing::OwnedView a;
    a.Add("t", dt, {n});
    testing::FillRandom(a.data[0], rng);
    testing::OwnedView b = a;
    testing::MutateNibbles(b.data[0], ElementBits(dt), n, 0.02, rng);
    std::vector<uint8_t> seed = {ti, 0x80 | 63};
    seed.insert(seed.end(), a.data[0].begin(), a.data[0].end());
    seed.insert(seed.end(), b.data[0].begin(), b.data[0].end());
    WriteFile(corpus + "/patch_roundtrip/v3_" + std::string(DTypeName(dt)), seed);
    ++written;
  }
  std::printf("%d fuzz seeds\n", written);
  return 0;
}

int main(int argc, char** argv) {
  using namespace tern;
  if (argc == 3 && std::string(argv[1]) == "--fuzz-seeds") return WriteFuzzSeeds(argv[2]);
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
    auto physical = [&](size_t t) {
      return c.push > 0 && patch::ContextFieldOf(a.descs[t].dtype).ok;
    };
    for (size_t t = 0; t < a.descs.size(); ++t) {
      if (physical(t)) testing::PhysicalFill(a.data[t], a.descs[t].dtype, a.descs[t].elements(), rng);
      else testing::FillRandom(a.data[t], rng);
    }
    testing::OwnedView b = a;
    for (size_t t = 0; t < b.descs.size(); ++t) {
      if (physical(t)) testing::PhysicalMutate(b.data[t], b.descs[t].dtype, b.descs[t].elements(), c.push, rng);
      else if (c.nibble_steps && patch::NibbleCodable(b.descs[t].dtype))
        testing::MutateNibbles(b.data[t], ElementBits(b.descs[t].dtype), b.descs[t].elements(), c.density, rng);
      else if (c.density < 0) testing::FillRandom(b.data[t], rng);
      else testing::Mutate(b.data[t], ElementBits(b.descs[t].dtype), b.descs[t].elements(), c.density, rng);
    }
    DiffOptions opt;
    opt.format_version = c.format == 3 ? 2 : c.format;  // version 3 is what format 2 writes for nibbles
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

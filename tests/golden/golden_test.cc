// Golden patches: files written once by patch/golden_gen.cc and committed.
// Every future build must decode them to exactly the committed target bytes,
// with the fast path (Apply, digests verified) and the reference decoder.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "tern/thread_pool.h"
#include "patch/golden_cases.h"
#include "patch/reference_decoder.h"
#include "patch/segment_codec.h"
#include "patch/test_util.h"
#include "tern/patch.h"

namespace tern {
namespace {

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

class GoldenTest : public ::testing::TestWithParam<golden::GoldenCase> {};

TEST_P(GoldenTest, DecodesToTheCommittedTarget) {
  const golden::GoldenCase& c = GetParam();
  const std::string stem = std::string(TERN_GOLDEN_DIR) + "/" + c.file;
  const std::vector<uint8_t> base = ReadFile(stem + ".base"), target = ReadFile(stem + ".target"),
                             patch = ReadFile(stem + ".patch");
  testing::OwnedView view;
  for (const auto& t : c.tensors) view.Add(t.name, t.dtype, t.shape);
  auto load = [&](const std::vector<uint8_t>& bytes) {
    size_t at = 0;
    for (auto& d : view.data) {
      ASSERT_LE(at + d.size(), bytes.size());
      std::copy(bytes.begin() + at, bytes.begin() + at + d.size(), d.begin());
      at += d.size();
    }
    ASSERT_EQ(at, bytes.size());
  };
  load(base);
  ThreadPool pool(1);
  auto info = Inspect(patch);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format_version, c.format);
  uint64_t context_segments = 0;
  for (const auto& t : info->tensors) context_segments += t.context_segments;
  if (c.format == 3) {
    bool nibbles = false;
    for (const auto& t : info->tensors) nibbles |= t.nibbles;
    EXPECT_TRUE(nibbles) << "format-3 cases exist to freeze nibble-coded tensors";
  } else {
    EXPECT_EQ(context_segments > 0, c.format == 2) << "format-2 cases exist to freeze CONTEXT segments";
  }
  EXPECT_EQ(info->base_version, 100u);
  EXPECT_EQ(info->target_version, 101u);
  const ViewDigest base_digest = ComputeDigest(view.View(), pool);
  EXPECT_EQ(base_digest, info->base_digest) << "digest definition changed";

  // Reference decoder.
  const ServeView base_view = view.View();
  auto ref = patch::ReferenceDecode(patch, &base_view);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  testing::OwnedView by_ref = view;
  for (const auto& ch : *ref) {
    const int w = ch.width;  // 4 for a nibble-coded tensor
    auto& d = by_ref.data[ch.tensor];
    testing::Set(d, w, ch.element,
                 (testing::Get(d, w, ch.element) + ch.delta) & patch::WidthMask(w));
  }
  std::vector<uint8_t> got;
  for (const auto& d : by_ref.data) got.insert(got.end(), d.begin(), d.end());
  EXPECT_TRUE(got == target) << "reference decoder output differs from the golden target";

  // Fast path.
  MutableServeView mv = view.Mutable();
  ViewDigest new_digest;
  Status s = Apply(mv, patch, base_digest, pool, &new_digest);
  ASSERT_TRUE(s.ok()) << s.ToString();
  got.clear();
  for (const auto& d : view.data) got.insert(got.end(), d.begin(), d.end());
  EXPECT_TRUE(got == target) << "Apply output differs from the golden target";
  EXPECT_EQ(new_digest, info->target_digest);
}

INSTANTIATE_TEST_SUITE_P(Files, GoldenTest, ::testing::ValuesIn(golden::Cases()),
                         [](const auto& p) { return std::string(p.param.file); });

}  // namespace
}  // namespace tern

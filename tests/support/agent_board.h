// Shared by the board's tests: a signer and verifier, a model whose
// versions the tests publish, and a member's side of a catch-up plan
// (verify every object against its signed manifest, then apply).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "agent/board/board.h"
#include "agent/board/publish.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"
#include "tests/support/owned_view.h"

namespace tern::agent::testing {

inline ManifestSigner SignerFromByte(uint8_t b) {
  std::array<uint8_t, 32> seed{};
  seed.fill(b);
  auto s = ManifestSigner::FromSeed(seed);
  TERN_ASSERT(s.ok(), "test signer");
  return std::move(s).value();
}

// A two-tensor model; version v's view is views[v] (views[0]: all zeros).
struct Model {
  std::vector<std::unique_ptr<tern::testing::OwnedView>> views;
  std::mt19937_64 rng{42};

  Model() {
    auto v = std::make_unique<tern::testing::OwnedView>();
    v->Add("a", DType::kU32, {4096});
    v->Add("b", DType::kU8, {20000});
    views.push_back(std::move(v));
  }
  const tern::testing::OwnedView& at(uint64_t v) const { return *views.at(v); }
  // Appends the next view: version 1 dense random bytes (like weights, so a
  // keyframe is about the model's size), later versions `count` random bytes
  // changed within the first `range` bytes of each tensor.
  void Next(uint64_t count, uint64_t range) {
    auto v = std::make_unique<tern::testing::OwnedView>(views.back()->View());
    if (views.size() == 1) {
      for (auto& bytes : v->data)
        for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      views.push_back(std::move(v));
      return;
    }
    for (auto& bytes : v->data)
      for (uint64_t i = 0; i < count; ++i) bytes[rng() % std::min<uint64_t>(range, bytes.size())] ^= 1 + rng() % 255;
    views.push_back(std::move(v));
  }
};

// Member side: checks each object against the manifest in the plan that
// names it (signature, board id, size, Merkle root), then applies the plan
// to `start` (version `have`, or zeros when the plan starts with a keyframe).
inline Result<std::vector<std::vector<uint8_t>>> ApplyPlan(Env& env, const Board& board,
                                                           const ManifestVerifier& verifier,
                                                           const CatchUpRoute& plan,
                                                           const tern::testing::OwnedView& start,
                                                           ThreadPool& pool) {
  tern::testing::OwnedView view(start.View());
  if (!plan.objects.empty() && plan.objects.front().kind == ObjectKind::kKeyframe)
    for (auto& bytes : view.data) std::fill(bytes.begin(), bytes.end(), 0);
  MutableServeView mv = view.Mutable();
  ViewDigest digest = ComputeDigest(AsConst(mv), pool);
  for (const ObjectRef& ref : plan.objects) {
    std::string bytes;
    TERN_RETURN_IF_ERROR(ReadFileToString(env, board.ObjectPath(ref), 1 << 30, &bytes));
    std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    bool vouched = false;
    for (const std::string& s : plan.signed_manifests) {
      TERN_ASSIGN_OR_RETURN(VersionManifest m, verifier.Verify(s));
      TERN_REQUIRE(m.board_id == board.id(), kMismatch, "manifest of another board");
      for (const ManifestObject& o : m.objects) {
        if (ObjectRef{o.kind, o.from_version, o.to_version} != ref) continue;
        TERN_ASSIGN_OR_RETURN(ManifestObject mine, DescribeObject(ref, span, o.chunk_bytes, pool));
        TERN_REQUIRE(mine == o, kAuth, ObjectName(ref), " does not match its signed manifest");
        vouched = true;
      }
    }
    TERN_REQUIRE(vouched, kAuth, ObjectName(ref), " is named by no manifest of the plan");
    TERN_RETURN_IF_ERROR(Apply(mv, span, digest, pool, &digest));
  }
  std::vector<std::vector<uint8_t>> out(view.data.begin(), view.data.end());
  return out;
}

inline std::vector<std::vector<uint8_t>> BytesOf(const tern::testing::OwnedView& v) {
  return {v.data.begin(), v.data.end()};
}

}  // namespace tern::agent::testing

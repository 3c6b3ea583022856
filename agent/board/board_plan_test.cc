// Catch-up plans (cheapest by bytes, checked against an independent
// enumeration), squashes and late keyframes made on demand, and retention.
// Every plan is applied by a "member" that verifies each object against its
// signed manifest and must end bit-identical to the published view.
#include <gtest/gtest.h>

#include <limits>

#include "tests/support/agent_board.h"

namespace tern::agent {
namespace {

using testing::ApplyPlan;
using testing::BytesOf;
using testing::Model;

class BoardPlanTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(verifier.AddTrustedKey(signer.public_key()).ok()); }

  std::unique_ptr<Board> MustOpen(BoardOptions options) {
    auto log = OpenFileBoardLog(*env, "/root/board");
    TERN_ASSERT(log.ok(), "opening the log");
    auto board = Board::Open(*env, "/root/objects", std::move(log).value(), verifier, options,
                             [this](std::string_view line) { lines.emplace_back(line); });
    EXPECT_TRUE(board.ok()) << board.status().ToString();
    TERN_ASSERT(board.ok(), "opening the board");
    return std::move(board).value();
  }
  // Publishes versions 1..n, each `count` changes within `range` bytes.
  void PublishMany(Board& board, uint64_t n, uint64_t count, uint64_t range) {
    for (uint64_t v = board.head() + 1; v <= n; ++v) {
      if (model.views.size() <= v) model.Next(count, range);
      const ServeView next = model.at(v).View();
      Result<PublishResult> r = Status(Code::kInternal, "unset");
      if (v == 1) {
        r = PublishVersion(board, signer, nullptr, {}, next, v, {}, pool);
      } else {
        const ServeView prev = model.at(v - 1).View();
        r = PublishVersion(board, signer, &prev, board.Manifest(v - 1)->target_digest, next, v,
                           {}, pool);
      }
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
  }
  MakeSquashFn Squasher(int* calls = nullptr) {
    return [this, calls](uint64_t from, uint64_t to) {
      if (calls) ++*calls;
      return MakeSquash(*board_for_squash, signer, from, to, {}, pool).status();
    };
  }
  void ExpectApplies(const Board& board, const CatchUpRoute& plan, uint64_t have, uint64_t target) {
    auto applied = ApplyPlan(*env, board, verifier, plan, model.at(have), pool);
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
    EXPECT_EQ(*applied, BytesOf(model.at(target)));
  }
  std::vector<ObjectRef> OnDisk(const Board& board, uint64_t max_version) {
    std::vector<ObjectRef> out;
    for (uint64_t to = 1; to <= max_version; ++to)
      for (uint64_t from = 0; from <= to; ++from)
        for (ObjectKind k : {ObjectKind::kPatch, ObjectKind::kKeyframe, ObjectKind::kSquash})
          if (board.HasObject({k, from, to})) out.push_back({k, from, to});
    return out;
  }

  ManifestSigner signer = testing::SignerFromByte(3);
  ManifestVerifier verifier;
  std::unique_ptr<Env> env = NewMemEnv();
  ThreadPool pool{2};
  Model model;
  std::vector<std::string> lines;
  Board* board_for_squash = nullptr;
};

// The oracle: for versions 1..head published in order with patches p(v-1->v),
// the cheapest of the chain from `have` and every keyframe k plus the chain
// from k, enumerated without the board's search.
uint64_t CheapestByEnumeration(const Board& board, uint64_t have, uint64_t head) {
  auto chain = [&](uint64_t from) -> uint64_t {
    uint64_t bytes = 0;
    for (uint64_t v = from + 1; v <= head; ++v) {
      if (!board.HasObject({ObjectKind::kPatch, v - 1, v})) return std::numeric_limits<uint64_t>::max() / 2;
      bytes += *board.ObjectBytes({ObjectKind::kPatch, v - 1, v});
    }
    return bytes;
  };
  uint64_t best = have > 0 ? chain(have) : std::numeric_limits<uint64_t>::max();
  for (uint64_t k = 1; k <= head; ++k)
    if (board.HasObject({ObjectKind::kKeyframe, k, k}))
      best = std::min(best, *board.ObjectBytes({ObjectKind::kKeyframe, k, k}) + chain(k));
  return best;
}

TEST_F(BoardPlanTest, SmallPatchesChainFromAnyVersion) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  PublishMany(*board, 6, 20, 1 << 20);
  for (uint64_t have = 0; have < 6; ++have) {
    SCOPED_TRACE(have);
    auto plan = board->PlanCatchUp(have, 6);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->bytes, CheapestByEnumeration(*board, have, 6));
    EXPECT_EQ(plan->objects.size(), have == 0 ? 6u : 6 - have);
    EXPECT_EQ(plan->objects.front().kind, have == 0 ? ObjectKind::kKeyframe : ObjectKind::kPatch);
    ExpectApplies(*board, *plan, have, 6);
  }
  EXPECT_TRUE(board->PlanCatchUp(6, 6)->objects.empty());
  EXPECT_EQ(board->PlanCatchUp(5, 4).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(board->PlanCatchUp(1, 7).status().code(), Code::kNotFound);
}

// A cheapest path longer than a route may be: cut, and continued from where
// it stopped, which ends where the whole path would.
TEST_F(BoardPlanTest, LongPathsComeInRoutesOfBoundedLength) {
  auto board = MustOpen({.keep_patches = 100, .keyframe_every = 1000});
  PublishMany(*board, 70, 2, 1 << 20);
  auto route = board->PlanCatchUp(1, 70);
  ASSERT_TRUE(route.ok()) << route.status().ToString();
  EXPECT_EQ(route->objects.size(), kMaxCatchUpObjects);
  EXPECT_EQ(route->signed_manifests.size(), kMaxCatchUpObjects);
  EXPECT_EQ(route->reaches, 1 + kMaxCatchUpObjects);
  ExpectApplies(*board, *route, 1, route->reaches);
  auto rest = board->PlanCatchUp(route->reaches, 70);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(rest->reaches, 70u);
  EXPECT_EQ(rest->objects.size(), 70 - 1 - kMaxCatchUpObjects);
  ExpectApplies(*board, *rest, route->reaches, 70);
  EXPECT_EQ(board->PlanCatchUp(69, 70)->reaches, 70u);
  EXPECT_EQ(board->PlanCatchUp(70, 70)->reaches, 70u);
}

// Large patches: a member far behind is better off with the newest keyframe.
TEST_F(BoardPlanTest, KeyframePlusPatchesBeatsALongChain) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  PublishMany(*board, 10, 4000, 1 << 20);
  int keyframe_starts = 0;
  for (uint64_t have = 0; have < 10; ++have) {
    SCOPED_TRACE(have);
    auto plan = board->PlanCatchUp(have, 10);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->bytes, CheapestByEnumeration(*board, have, 10));
    keyframe_starts += plan->objects.front().kind == ObjectKind::kKeyframe;
    ExpectApplies(*board, *plan, have, 10);
  }
  EXPECT_GT(keyframe_starts, 1);  // not only the new member
  EXPECT_LT(keyframe_starts, 10);  // and not the member one version behind
}

// Overlapping changes: squash(a -> v) is much smaller than the chain; it is
// made once, signed as a second manifest of v, survives a restart.
TEST_F(BoardPlanTest, SquashOnDemandIsSignedUsedAndKept) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  board_for_squash = board.get();
  PublishMany(*board, 6, 200, 256);
  const uint64_t chain = board->PlanCatchUp(1, 6)->bytes;
  int calls = 0;
  auto plan = board->PlanCatchUp(1, 6, Squasher(&calls));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kSquash, 1, 6}}));
  EXPECT_LT(plan->bytes, chain);
  EXPECT_EQ(board->SignedManifests(6).size(), 2u);
  ExpectApplies(*board, *plan, 1, 6);
  auto again = board->PlanCatchUp(1, 6, Squasher(&calls));
  EXPECT_EQ(calls, 1);  // reused, not remade
  EXPECT_EQ(again->objects, plan->objects);
  // A member one behind gets the patch: nothing to squash.
  EXPECT_EQ(board->PlanCatchUp(5, 6, Squasher(&calls))->objects.size(), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(MakeSquash(*board, signer, 1, 6, {}, pool).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(MakeSquash(*board, signer, 5, 6, {}, pool).status().code(), Code::kInvalidArgument);

  board_for_squash = nullptr;
  board.reset();
  board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  EXPECT_TRUE(board->HasObject({ObjectKind::kSquash, 1, 6}));
  EXPECT_EQ(board->SignedManifests(6).size(), 2u);
  EXPECT_EQ(board->PlanCatchUp(1, 6)->objects, plan->objects);
}

TEST_F(BoardPlanTest, LateKeyframeForANewMember) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  board_for_squash = board.get();
  PublishMany(*board, 5, 200, 256);
  auto plan = board->PlanCatchUp(0, 5, Squasher());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kKeyframe, 5, 5}}));
  ASSERT_EQ(plan->signed_manifests.size(), 1u);
  EXPECT_EQ(plan->signed_manifests[0], board->SignedManifests(5).at(1));
  ExpectApplies(*board, *plan, 0, 5);
  // The policy counts it: the next keyframe is due M versions after 5.
  EXPECT_FALSE(board->KeyframeDue(6, 1));
}

// BF16 weights whose changes follow the base's exponent: the board's
// patches and keyframes are format 2 with CONTEXT segments, which Squash
// cannot join without the base; MakeSquash rebuilds view(from) from the
// board's own objects and squashes on it.
class ContextModelTest : public BoardPlanTest {
 protected:
  void SetUp() override {
    BoardPlanTest::SetUp();
    model.views.clear();
    auto v0 = std::make_unique<tern::testing::OwnedView>();
    v0->Add("w", DType::kBF16, {kElements});
    model.views.push_back(std::move(v0));
    auto v1 = std::make_unique<tern::testing::OwnedView>(model.views[0]->View());
    // Exponents 100..115 at random (not periodic: the encoder samples every
    // 16th element to choose its classes).
    std::vector<uint64_t> smallest;
    for (uint64_t i = 0; i < kElements; ++i) {
      const uint64_t e = model.rng() % 16;
      Bf16(*v1, i) = static_cast<uint16_t>(((100 + e) << 7) | (model.rng() & 0x7f));
      if (e == 0) smallest.push_back(i);
    }
    model.views.push_back(std::move(v1));
    for (int v = 2; v <= 6; ++v) {
      auto next = std::make_unique<tern::testing::OwnedView>(model.views.back()->View());
      // Only the smallest exponent moves (mantissa bit 0), in overlapping steps.
      for (int k = 0; k < 300; ++k) Bf16(*next, smallest[model.rng() % smallest.size()]) ^= 1;
      model.views.push_back(std::move(next));
    }
  }
  static uint16_t& Bf16(tern::testing::OwnedView& v, uint64_t i) {
    return reinterpret_cast<uint16_t*>(v.data[0].data())[i];
  }
  uint64_t ContextSegments(const Board& board, const ObjectRef& ref) {
    std::string bytes;
    EXPECT_TRUE(ReadFileToString(*env, board.ObjectPath(ref), 1 << 30, &bytes).ok());
    auto info = Inspect({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->format_version, kDefaultPatchFormat);
    uint64_t n = 0;
    for (const auto& t : info->tensors) n += t.context_segments;
    return n;
  }
  static constexpr uint64_t kElements = 1 << 16;
};

TEST_F(ContextModelTest, SquashAndLateKeyframeOfFormat2Objects) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  board_for_squash = board.get();
  PublishMany(*board, 6, 0, 0);
  ASSERT_GT(ContextSegments(*board, {ObjectKind::kPatch, 2, 3}), 0u);
  int calls = 0;
  auto plan = board->PlanCatchUp(2, 6, Squasher(&calls));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kSquash, 2, 6}}));
  EXPECT_GT(ContextSegments(*board, plan->objects[0]), 0u);
  ExpectApplies(*board, *plan, 2, 6);
  plan = board->PlanCatchUp(0, 6, Squasher(&calls));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kKeyframe, 6, 6}}));
  ExpectApplies(*board, *plan, 0, 6);
}

// A root without the objects before `from` (one that took the board over)
// cannot rebuild the base: no squash is recorded, catch-up sends the chain.
TEST_F(ContextModelTest, Format2SquashWithoutTheBaseObjectsFallsBackToTheChain) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  board_for_squash = board.get();
  PublishMany(*board, 6, 0, 0);
  ASSERT_TRUE(env->RemoveFile(board->ObjectPath({ObjectKind::kKeyframe, 1, 1})).ok());
  EXPECT_FALSE(MakeSquash(*board, signer, 2, 6, {}, pool).ok());
  EXPECT_FALSE(board->HasObject({ObjectKind::kSquash, 2, 6}));
  auto plan = board->PlanCatchUp(2, 6, Squasher());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects.size(), 4u);
  ExpectApplies(*board, *plan, 2, 6);
}

TEST_F(BoardPlanTest, FailedSquashFallsBackToTheChain) {
  auto board = MustOpen({.keep_patches = 16, .keyframe_every = 1000});
  PublishMany(*board, 4, 200, 256);
  auto plan = board->PlanCatchUp(1, 4, [](uint64_t, uint64_t) {
    return Status(Code::kIo, "disk full");
  });
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects.size(), 3u);
  EXPECT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("disk full"), std::string::npos);
}

TEST_F(BoardPlanTest, RetentionKeepsWhatMembersNeedAndDropsTheRest) {
  const BoardOptions options{.keep_patches = 2, .keyframe_every = 4};
  auto board = MustOpen(options);
  PublishMany(*board, 10, 20, 1 << 20);  // keyframes at 1, 5, 9
  using K = ObjectKind;
  // A member at 4: six small patches beat keyframe(9) + one.
  ASSERT_TRUE(board->Retain({4}).ok());
  std::vector<ObjectRef> expect = {{K::kKeyframe, 9, 9}};
  for (uint64_t v = 5; v <= 10; ++v) expect.push_back({K::kPatch, v - 1, v});
  std::sort(expect.begin(), expect.end());
  auto on_disk = OnDisk(*board, 10);
  std::sort(on_disk.begin(), on_disk.end());
  EXPECT_EQ(on_disk, expect);
  EXPECT_EQ(board->Versions().front(), 4u);
  auto plan = board->PlanCatchUp(4, 10);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ExpectApplies(*board, *plan, 4, 10);
  EXPECT_EQ(*env->ListDir("/root/objects", 100).value().begin(), "keyframe-9-9");

  // Nobody holds 4 any more.
  ASSERT_TRUE(board->Retain({}).ok());
  on_disk = OnDisk(*board, 10);
  std::sort(on_disk.begin(), on_disk.end());
  expect = {{K::kPatch, 8, 9}, {K::kPatch, 9, 10}, {K::kKeyframe, 9, 9}};
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(on_disk, expect);
  EXPECT_EQ(env->ListDir("/root/objects", 100)->size(), 3u);
  EXPECT_EQ(board->Versions().front(), 8u);
  // A member at a dropped version starts from the keyframe.
  plan = board->PlanCatchUp(3, 10);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects.front(), (ObjectRef{K::kKeyframe, 9, 9}));
  ExpectApplies(*board, *plan, 3, 10);

  // The log lost the dropped records too: a restart sees the same board.
  board.reset();
  board = MustOpen(options);
  EXPECT_EQ(board->Versions(), (std::vector<uint64_t>{8, 9, 10}));
  on_disk = OnDisk(*board, 10);
  std::sort(on_disk.begin(), on_disk.end());
  EXPECT_EQ(on_disk, expect);
  PublishMany(*board, 11, 20, 1 << 20);
  plan = board->PlanCatchUp(9, 11);
  ASSERT_TRUE(plan.ok());
  ExpectApplies(*board, *plan, 9, 11);
}

// Retention changed while the board runs (SetOptions): later publications
// follow the new keyframe interval and the next Retain the new number of
// patches; zeros are refused and change nothing.
TEST_F(BoardPlanTest, RetentionChangedAtRunTimeAppliesToWhatFollows) {
  auto board = MustOpen({.keep_patches = 8, .keyframe_every = 1000});
  using K = ObjectKind;
  auto keyframes = [&] {
    std::vector<uint64_t> out;
    for (const auto& ref : OnDisk(*board, board->head()))
      if (ref.kind == K::kKeyframe) out.push_back(ref.to);
    std::sort(out.begin(), out.end());
    return out;
  };
  PublishMany(*board, 4, 20, 1 << 20);
  EXPECT_EQ(keyframes(), std::vector<uint64_t>{1});
  EXPECT_EQ(board->SetOptions({.keep_patches = 0, .keyframe_every = 2}).code(), Code::kInvalidArgument);
  EXPECT_EQ(board->options().keep_patches, 8u);
  ASSERT_TRUE(board->SetOptions({.keep_patches = 2, .keyframe_every = 2}).ok());
  EXPECT_EQ(board->options().keyframe_every, 2u);
  PublishMany(*board, 8, 20, 1 << 20);
  // Every second publication since the last keyframe is one now.
  std::vector<uint64_t> kf = keyframes();
  EXPECT_GT(kf.size(), 2u);
  EXPECT_EQ(kf.back(), 7u);
  ASSERT_TRUE(board->Retain({}).ok());
  std::vector<ObjectRef> patch_refs;
  for (const auto& ref : OnDisk(*board, 8))
    if (ref.kind == K::kPatch) patch_refs.push_back(ref);
  std::sort(patch_refs.begin(), patch_refs.end());
  // The last two publications' patches (and 7->8 leads from keyframe 7).
  EXPECT_EQ(patch_refs, (std::vector<ObjectRef>{{K::kPatch, 6, 7}, {K::kPatch, 7, 8}}));
}

TEST_F(BoardPlanTest, RetentionKeepsAHeldMembersSquash) {
  auto board = MustOpen({.keep_patches = 1, .keyframe_every = 1000});
  board_for_squash = board.get();
  PublishMany(*board, 6, 200, 256);
  ASSERT_TRUE(board->PlanCatchUp(2, 6, Squasher()).ok());
  ASSERT_TRUE(board->HasObject({ObjectKind::kSquash, 2, 6}));
  ASSERT_TRUE(board->PlanCatchUp(0, 6, Squasher()).ok());  // a late keyframe(6)
  ASSERT_TRUE(board->HasObject({ObjectKind::kKeyframe, 6, 6}));
  ASSERT_TRUE(board->Retain({2}).ok());
  EXPECT_TRUE(board->HasObject({ObjectKind::kSquash, 2, 6}));
  EXPECT_FALSE(board->HasObject({ObjectKind::kPatch, 3, 4}));  // the squash replaced the chain
  auto plan = board->PlanCatchUp(2, 6);
  ASSERT_TRUE(plan.ok());
  ExpectApplies(*board, *plan, 2, 6);
  ASSERT_TRUE(board->Retain({}).ok());
  EXPECT_FALSE(board->HasObject({ObjectKind::kSquash, 2, 6}));
  EXPECT_FALSE(board->HasObject({ObjectKind::kKeyframe, 1, 1}));
  EXPECT_TRUE(board->HasObject({ObjectKind::kKeyframe, 6, 6}));
  EXPECT_TRUE(board->HasObject({ObjectKind::kPatch, 5, 6}));  // keep_patches = 1
  EXPECT_EQ(env->ListDir("/root/objects", 100)->size(), 2u);
}

// Across a supersede (docs/agent/board.md §4a): chain 1, 2, 9, then 3
// (epoch 1, below 9), 4, 5. Squashes start before their parent on the
// chain, by position: from 2 (a lower number) and from the withdrawn 9 (a
// higher one) to 5; both are signed as epoch-1 manifests of 5, applied bit
// for bit, and kept over a restart. A held member at 9 pins its path.
TEST_F(BoardPlanTest, SquashesAndRetentionFollowTheChainAcrossASupersede) {
  for (int i = 0; i < 9; ++i) model.Next(20, 4000);
  auto board = MustOpen({});
  board_for_squash = board.get();
  auto publish = [&](uint64_t v, bool supersede) {
    const ServeView next = model.at(v).View();
    PublishOptions options;
    options.supersede = supersede;
    options.with_keyframe = false;
    const uint64_t head = board->head();
    if (head == 0) return PublishVersion(*board, signer, nullptr, {}, next, v, options, pool);
    const ServeView prev = model.at(head).View();
    return PublishVersion(*board, signer, &prev, board->Manifest(head)->target_digest, next, v,
                          options, pool);
  };
  for (uint64_t v : {1, 2, 9}) ASSERT_TRUE(publish(v, false).ok()) << v;
  ASSERT_TRUE(publish(3, true).ok());
  for (uint64_t v : {4, 5}) ASSERT_TRUE(publish(v, false).ok()) << v;

  int calls = 0;
  for (uint64_t have : {2, 9}) {
    SCOPED_TRACE(have);
    auto plan = board->PlanCatchUp(have, 5, Squasher(&calls));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ExpectApplies(*board, *plan, have, 5);
    EXPECT_TRUE(board->HasObject({ObjectKind::kSquash, have, 5})) << have;
    auto m = board->Manifest(5);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->epoch, 1u);
  }
  EXPECT_EQ(calls, 2);
  for (const std::string& s : board->SignedManifests(5)) {
    auto m = verifier.Verify(s);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->epoch, 1u);
    EXPECT_FALSE(m->supersede);
  }
  // Squash from 4 (the parent) or from 5 itself is no squash.
  EXPECT_EQ(MakeSquash(*board, signer, 4, 5, {}, pool).status().code(), Code::kInvalidArgument);
  board.reset();
  board = MustOpen({1, 32});
  board_for_squash = board.get();
  EXPECT_TRUE(board->HasObject({ObjectKind::kSquash, 9, 5}));
  // A member held at the withdrawn 9 keeps its squash; everything else of
  // epoch 0 goes (keyframe(3) is the newest keyframe).
  ASSERT_TRUE(board->Retain({9}).ok());
  EXPECT_TRUE(board->HasObject({ObjectKind::kSquash, 9, 5}));
  EXPECT_TRUE(board->PosOf(9).ok());
  EXPECT_FALSE(board->PosOf(2).ok());
  auto plan = board->PlanCatchUp(9, 5);
  ASSERT_TRUE(plan.ok());
  ExpectApplies(*board, *plan, 9, 5);
  ASSERT_TRUE(board->Retain({}).ok());
  EXPECT_FALSE(board->PosOf(9).ok());
  board.reset();
  board = MustOpen({1, 32});
  EXPECT_EQ(board->head_pos(), (BoardPos{1, 5}));
  plan = board->PlanCatchUp(0, 5);
  ASSERT_TRUE(plan.ok());
  ExpectApplies(*board, *plan, 0, 5);
}

}  // namespace
}  // namespace tern::agent

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "tern/thread_pool.h"
#include "patch/apply_internal.h"
#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/reference_decoder.h"
#include "patch/test_util.h"
#include "tern/patch.h"

namespace tern {
namespace {

using testing::OwnedView;

std::vector<patch::RefChange> SortedChanges(std::vector<patch::RefChange> v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.element < b.element;
  });
  return v;
}

constexpr DType kWidthTypes[] = {DType::kF64, DType::kF32, DType::kBF16, DType::kU8, DType::kF4};

// The fast decoder's change list against `base`, sorted by (tensor,
// element), for comparison with the reference decoder.
std::vector<patch::RefChange> FastChanges(std::span<const uint8_t> patch, const OwnedView& base) {
  auto p = patch::ParsePatch(patch);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::vector<patch::RefChange> out;
  if (!p.ok()) return out;
  for (const auto& r : p->records) {
    const patch::ManifestTensor& mt = p->tensors[r.h.tensor_index];
    auto emit = [&](uint64_t pos, uint64_t d) {
      out.push_back({r.h.tensor_index, r.h.first_element + pos, d, mt.code_bits});
    };
    // A nibble-coded record's changes are nibbles, as the reference reports them.
    Status s = mt.nibbles ? patch::DecodeRecord(r, 4, emit)
                          : patch::DecodeRecordOnBase(r, mt.width_bits, base.data[r.h.tensor_index].data(),
                                                      mt.context, emit);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return SortedChanges(out);
}

// Diff old->new in format `format`, then check: Apply reproduces new bitwise
// with the right digest, the reference decoder agrees with the fast one, and
// applying the reference decoder's changes also reproduces new.
std::vector<uint8_t> CheckRoundTripFormat(const OwnedView& old_view, const OwnedView& new_view,
                                          uint64_t segment_elements, ThreadPool& pool, uint16_t format) {
  SCOPED_TRACE("format " + std::to_string(format));
  DiffOptions opt;
  opt.format_version = format;
  opt.segment_elements = segment_elements;
  opt.base_version = 7;
  opt.target_version = 8;
  auto patch = Diff(old_view.View(), new_view.View(), opt, pool);
  EXPECT_TRUE(patch.ok()) << patch.status().ToString();
  if (!patch.ok()) return {};
  OwnedView work = old_view;
  MutableServeView mv = work.Mutable();
  ViewDigest got;
  Status s = Apply(mv, *patch, ComputeDigest(old_view.View(), pool), pool, &got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(work.data, new_view.data);
  EXPECT_EQ(got, ComputeDigest(new_view.View(), pool));
  // Same through the unstaged path (decode twice, O(1) memory).
  OwnedView unstaged = old_view;
  MutableServeView uv = unstaged.Mutable();
  s = patch::ApplyWithStaging(uv, *patch, ComputeDigest(old_view.View(), pool), pool, nullptr, 0);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(unstaged.data, new_view.data);
  // Same through the exclusive-view path (write while verifying).
  OwnedView exclusive = old_view;
  MutableServeView ev = exclusive.Mutable();
  ViewDigest got_exclusive;
  s = Apply(ev, *patch, ComputeDigest(old_view.View(), pool), pool, ApplyOptions{.exclusive_view = true},
            &got_exclusive);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(exclusive.data, new_view.data);
  EXPECT_EQ(got_exclusive, got);

  const ServeView base = old_view.View();
  auto ref = patch::ReferenceDecode(*patch, &base);
  EXPECT_TRUE(ref.ok()) << ref.status().ToString();
  if (ref.ok()) {
    EXPECT_EQ(SortedChanges(*ref), FastChanges(*patch, old_view));
    OwnedView by_ref = old_view;
    for (const auto& c : *ref) {
      const int w = c.width;
      auto& d = by_ref.data[c.tensor];
      testing::Set(d, w, c.element,
                   (testing::Get(d, w, c.element) + c.delta) & patch::WidthMask(w));
    }
    EXPECT_EQ(by_ref.data, new_view.data);
  }
  auto info = Inspect(*patch);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  if (info.ok()) {
    uint64_t changed = 0;
    bool nibbles = false;
    for (size_t t = 0; t < old_view.descs.size(); ++t) {
      // Elements of the dtype, however the records code them.
      const int w = ElementBits(old_view.descs[t].dtype);
      for (uint64_t i = 0; i < old_view.descs[t].elements(); ++i)
        changed += testing::Get(old_view.data[t], w, i) != testing::Get(new_view.data[t], w, i);
      nibbles |= info->tensors[t].nibbles;
    }
    EXPECT_EQ(info->changed_elements, changed);
    EXPECT_EQ(info->base_version, 7u);
    EXPECT_EQ(info->patch_bytes, patch->size());
    EXPECT_EQ(info->container_bytes + info->position_bytes + info->value_bytes + info->header_bytes, patch->size());
    EXPECT_EQ(info->format_version, nibbles ? 3 : format);
    if (format == 1) {
      EXPECT_FALSE(nibbles);
      uint64_t context = 0;
      for (const auto& t : info->tensors) context += t.context_segments;
      EXPECT_EQ(context, 0u);
    }
  }
  return std::move(patch).value();
}

// Both formats; returns the format-1 patch.
std::vector<uint8_t> CheckRoundTrip(const OwnedView& old_view, const OwnedView& new_view, uint64_t segment_elements,
                                    ThreadPool& pool) {
  CheckRoundTripFormat(old_view, new_view, segment_elements, pool, 2);
  return CheckRoundTripFormat(old_view, new_view, segment_elements, pool, 1);
}

TEST(PatchTest, RoundTripEveryWidthAndDensity) {
  ThreadPool pool(2);
  std::mt19937_64 rng(11);
  for (DType dt : kWidthTypes) {
    for (double density : {0.0, 1e-4, 0.01, 0.3, 1.0}) {
      OwnedView a;
      a.Add("t.big", dt, {10007});  // not a multiple of the segment size
      a.Add("t.empty", dt, {0, 5});
      a.Add("t.odd", dt, {3, 3});
      a.Add("t.scalar", dt, {});
      for (auto& d : a.data) testing::FillRandom(d, rng);
      OwnedView b = a;
      for (size_t t = 0; t < b.descs.size(); ++t)
        testing::Mutate(b.data[t], ElementBits(dt), b.descs[t].elements(), density, rng);
      SCOPED_TRACE(std::string(DTypeName(dt)) + " density " + std::to_string(density));
      CheckRoundTrip(a, b, 4096, pool);
      CheckRoundTrip(a, b, 1 << 20, pool);
      CheckRoundTrip(a, b, 3, pool);  // odd: F4 rounds up to stay byte aligned
    }
  }
}

TEST(PatchTest, AdversarialPatterns) {
  ThreadPool pool(2);
  std::mt19937_64 rng(12);
  for (DType dt : kWidthTypes) {
    const int w = ElementBits(dt);
    const uint64_t n = 9001, mask = patch::WidthMask(w);
    OwnedView a;
    a.Add("w", dt, {n});
    testing::FillRandom(a.data[0], rng);
    auto variant = [&](auto&& change) {
      OwnedView b = a;
      for (uint64_t i = 0; i < n; ++i)
        if (uint64_t d = change(i); d) testing::Set(b.data[0], w, i, (testing::Get(b.data[0], w, i) + d) & mask);
      CheckRoundTrip(a, b, 1000, pool);
    };
    SCOPED_TRACE(DTypeName(dt));
    variant([&](uint64_t i) { return i == 0 || i == n - 1 ? uint64_t{1} : 0; });  // first and last only
    variant([&](uint64_t i) { return i % 1000 == 999 || i % 1000 == 0 ? mask : 0; });  // segment edges
    variant([&](uint64_t i) { return i >= 4000 && i < 4500 ? uint64_t{1} : 0; });  // a run
    variant([&](uint64_t i) { return uint64_t{1}; });  // every element, same delta
    variant([&](uint64_t i) { return i % 2 ? uint64_t{1} << (w - 1) : 0; });  // sign flips, alternating
    variant([&](uint64_t i) { return (rng() & mask) | 1; });  // every element, random
  }
}

TEST(PatchTest, SquashEqualsDirectAndCancels) {
  ThreadPool pool(2);
  std::mt19937_64 rng(13);
  for (DType dt : kWidthTypes) {
    OwnedView a;
    a.Add("x", dt, {20000});
    a.Add("y", dt, {333});
    for (auto& d : a.data) testing::FillRandom(d, rng);
    OwnedView b = a, c;
    for (size_t t = 0; t < 2; ++t) testing::Mutate(b.data[t], ElementBits(dt), b.descs[t].elements(), 0.02, rng);
    c = b;
    for (size_t t = 0; t < 2; ++t) testing::Mutate(c.data[t], ElementBits(dt), c.descs[t].elements(), 0.02, rng);
    DiffOptions o1, o2;
    o1.base_version = 1, o1.target_version = 2, o2.base_version = 2, o2.target_version = 3;
    o2.segment_elements = 777;  // segmentation may differ between the inputs
    // Format 1: what squashes without the base whatever the dtype (format 2
    // may code U8 by nibbles in one patch and by elements in the next).
    o1.format_version = o2.format_version = 1;
    auto ab = Diff(a.View(), b.View(), o1, pool), bc = Diff(b.View(), c.View(), o2, pool);
    ASSERT_TRUE(ab.ok() && bc.ok());
    std::vector<std::span<const uint8_t>> chain = {*ab, *bc};
    auto ac = Squash(chain, pool);
    ASSERT_TRUE(ac.ok()) << ac.status().ToString();
    OwnedView work = a;
    MutableServeView mv = work.Mutable();
    ASSERT_TRUE(Apply(mv, *ac, ComputeDigest(a.View(), pool), pool).ok());
    EXPECT_EQ(work.data, c.data);
    auto info = Inspect(*ac);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->base_version, 1u);
    EXPECT_EQ(info->target_version, 3u);

    // a->b then b->a cancels to an empty patch that still verifies.
    auto ba = Diff(b.View(), a.View(), o2, pool);
    ASSERT_TRUE(ba.ok());
    std::vector<std::span<const uint8_t>> back = {*ab, *ba};
    auto aa = Squash(back, pool);
    ASSERT_TRUE(aa.ok()) << aa.status().ToString();
    auto aa_info = Inspect(*aa);
    ASSERT_TRUE(aa_info.ok());
    EXPECT_EQ(aa_info->changed_elements, 0u);
    EXPECT_EQ(aa_info->segments, 0u);
    work = a;
    mv = work.Mutable();
    ASSERT_TRUE(Apply(mv, *aa, ComputeDigest(a.View(), pool), pool).ok());
    EXPECT_EQ(work.data, a.data);

    // Out of order: digests do not chain.
    std::vector<std::span<const uint8_t>> wrong = {*bc, *ab};
    EXPECT_EQ(Squash(wrong, pool).status().code(), Code::kMismatch);
  }
}

struct SmallCase {
  OwnedView a, b;
  std::vector<uint8_t> patch;
  ViewDigest base;
};

SmallCase MakeSmallCase(ThreadPool& pool) {
  SmallCase c;
  c.a.Add("a", DType::kBF16, {64});
  c.a.Add("b", DType::kF4, {31});
  c.a.Add("c", DType::kF32, {16});
  std::mt19937_64 rng(14);
  for (auto& d : c.a.data) testing::FillRandom(d, rng);
  c.b = c.a;
  testing::Mutate(c.b.data[0], 16, 64, 0.1, rng);
  testing::Mutate(c.b.data[1], 4, 31, 1.0, rng);
  testing::Mutate(c.b.data[2], 32, 16, 0.5, rng);
  DiffOptions opt;
  opt.segment_elements = 16;
  c.patch = Diff(c.a.View(), c.b.View(), opt, pool).value();
  c.base = ComputeDigest(c.a.View(), pool);
  return c;
}

TEST(PatchTest, WrongBaseDigestLeavesViewUntouched) {
  ThreadPool pool(1);
  SmallCase c = MakeSmallCase(pool);
  OwnedView work = c.a;
  MutableServeView mv = work.Mutable();
  ViewDigest wrong = c.base;
  wrong.lanes[2] ^= 1;
  Status s = Apply(mv, c.patch, wrong, pool);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_EQ(work.data, c.a.data);
  // The right digest but other bytes (a stale caller) at an element the patch
  // changes: the target check fails. (Stale elements the patch does not touch
  // are invisible to an O(changes) check; that is the caller's digest's job.)
  uint64_t i = 0;
  while (testing::Get(c.a.data[2], 32, i) == testing::Get(c.b.data[2], 32, i)) ++i;
  testing::Set(work.data[2], 32, i, testing::Get(work.data[2], 32, i) ^ 0x100);
  const auto stale = work.data;
  s = Apply(mv, c.patch, c.base, pool);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
  EXPECT_EQ(work.data, stale);
}

TEST(PatchTest, EveryBitFlipAndTruncationIsRejected) {
  ThreadPool pool(1);
  SmallCase c = MakeSmallCase(pool);
  ASSERT_LT(c.patch.size(), 2000u);
  OwnedView work = c.a;
  MutableServeView mv = work.Mutable();
  const ApplyOptions exclusive{.exclusive_view = true};
  for (size_t bit = 0; bit < c.patch.size() * 8; ++bit) {
    std::vector<uint8_t> bad = c.patch;
    bad[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    Status s = patch::ApplyWithStaging(mv, bad, c.base, pool, nullptr, bit % 2 ? 0 : 1 << 20);
    ASSERT_FALSE(s.ok()) << "bit " << bit;
    EXPECT_TRUE(s.code() == Code::kCorrupt || s.code() == Code::kUnsupported) << s.ToString();
    ASSERT_EQ(work.data, c.a.data) << "bit " << bit;
    EXPECT_EQ(Apply(mv, bad, c.base, pool, exclusive).ToString(), s.ToString()) << "bit " << bit;
    ASSERT_EQ(work.data, c.a.data) << "bit " << bit;
    EXPECT_FALSE(Inspect(bad).ok());
  }
  for (size_t cut = 0; cut < c.patch.size(); ++cut) {
    std::span<const uint8_t> prefix(c.patch.data(), cut);
    EXPECT_EQ(Apply(mv, prefix, c.base, pool).code(), Code::kCorrupt) << "cut " << cut;
    ASSERT_EQ(work.data, c.a.data);
    EXPECT_EQ(Apply(mv, prefix, c.base, pool, exclusive).code(), Code::kCorrupt) << "cut " << cut;
    ASSERT_EQ(work.data, c.a.data);
    auto verified = VerifiedPrefixBytes(prefix);
    ASSERT_TRUE(verified.ok()) << verified.status().ToString();
    EXPECT_LE(*verified, cut);
  }
  EXPECT_EQ(*VerifiedPrefixBytes(c.patch), c.patch.size());
  std::vector<uint8_t> longer = c.patch;
  longer.push_back(0);
  EXPECT_FALSE(Apply(mv, longer, c.base, pool).ok());
  ASSERT_TRUE(Apply(mv, c.patch, c.base, pool).ok());
  EXPECT_EQ(work.data, c.b.data);
}

// A patch a->b assembled from per-segment records, each passed through
// `tamper` (which may forge it) before it is added.
std::vector<uint8_t> BuildForged(const OwnedView& a, const OwnedView& b, uint64_t segment_elements,
                                 const std::function<void(uint32_t, uint64_t, SegmentRecord&)>& tamper) {
  const ServeView av = a.View(), bv = b.View();
  ThreadPool pool(1);
  PatchBuilder builder(av, 1, 2, ComputeDigest(av, pool));
  for (uint32_t t = 0; t < av.tensors.size(); ++t) {
    const uint64_t n = av.tensors[t].desc->elements();
    for (uint64_t first = 0; first < n; first += segment_elements) {
      auto rec = EncodeSegment(av, bv, t, first, std::min(segment_elements, n - first));
      EXPECT_TRUE(rec.ok()) << rec.status().ToString();
      if (!rec.ok() || rec->bytes.empty()) continue;
      tamper(t, first, *rec);
      Status s = builder.Add(std::move(rec).value());
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
  }
  auto patch = builder.Finish();
  EXPECT_TRUE(patch.ok()) << patch.status().ToString();
  return patch.ok() ? std::move(patch).value() : std::vector<uint8_t>{};
}

// Rewrites a record's changed count (offset 24 of its header) and re-seals
// its checksum: a well-formed record whose streams disagree with its header,
// found only while decoding (after earlier changes may have been written).
void ForgeChangedCount(SegmentRecord& rec) {
  uint64_t count;
  std::memcpy(&count, rec.bytes.data() + 24, 8);
  count = count < rec.element_count ? count + 1 : count - 1;
  std::memcpy(rec.bytes.data() + 24, &count, 8);
  const uint64_t sum = XXH3_64bits(rec.bytes.data(), rec.bytes.size() - 8);
  std::memcpy(rec.bytes.data() + rec.bytes.size() - 8, &sum, 8);
}

// The exclusive-view path must fail exactly like the default path and leave
// the view bit-identical to before, whatever it had written by then.
TEST(PatchTest, ExclusiveViewFailsLikeDefaultAndRestoresTheView) {
  ThreadPool pool(2);
  std::mt19937_64 rng(16);
  const ApplyOptions exclusive{.exclusive_view = true};
  for (DType dt : kWidthTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const int w = ElementBits(dt);
    OwnedView a;
    a.Add("x", dt, {6000});
    a.Add("y", dt, {1001});
    for (auto& d : a.data) testing::FillRandom(d, rng);
    OwnedView b = a;
    for (size_t t = 0; t < 2; ++t) testing::Mutate(b.data[t], w, b.descs[t].elements(), 0.2, rng);
    const ViewDigest base = ComputeDigest(a.View(), pool);
    constexpr uint64_t kSeg = 512;  // many records, so failures come after others were written

    auto expect_same_failure = [&](const OwnedView& start, std::span<const uint8_t> patch, const ViewDigest& digest,
                                   const std::string& what) {
      SCOPED_TRACE(what);
      OwnedView by_default = start, by_exclusive = start;
      MutableServeView dv = by_default.Mutable(), ev = by_exclusive.Mutable();
      const Status expected = Apply(dv, patch, digest, pool);
      EXPECT_FALSE(expected.ok());
      EXPECT_EQ(by_default.data, start.data);
      const Status got = Apply(ev, patch, digest, pool, exclusive);
      EXPECT_EQ(got.ToString(), expected.ToString());
      EXPECT_EQ(by_exclusive.data, start.data);
    };

    // The honest patch first: it applies, so the forgeries below fail for
    // what was forged and nothing else.
    const auto honest = BuildForged(a, b, kSeg, [](uint32_t, uint64_t, SegmentRecord&) {});
    {
      OwnedView work = a;
      MutableServeView mv = work.Mutable();
      ASSERT_TRUE(Apply(mv, honest, base, pool, exclusive).ok());
      ASSERT_EQ(work.data, b.data);
    }
    ViewDigest wrong_base = base;
    wrong_base.lanes[3] ^= 1;
    expect_same_failure(a, honest, wrong_base, "wrong base digest");

    // A stale view: right digest claimed, but an element the patch changes
    // differs (the target check fails after every record was written).
    OwnedView stale = a;
    uint64_t i = 0;
    while (testing::Get(a.data[1], w, i) == testing::Get(b.data[1], w, i)) ++i;
    testing::Set(stale.data[1], w, i, testing::Get(a.data[1], w, i) ^ 1);
    expect_same_failure(stale, honest, base, "stale view");

    // A wrong target digest: one record (in the middle) claims a wrong
    // digest change.
    expect_same_failure(a, BuildForged(a, b, kSeg, [](uint32_t t, uint64_t first, SegmentRecord& rec) {
                          if (t == 0 && first == 5 * kSeg) rec.digest_delta.lanes[0] += 1;
                        }),
                        base, "wrong target digest");

    // A flipped value: a record re-encoded with one new value changed, still
    // claiming the honest record's digest change.
    OwnedView flipped = b;
    uint64_t j = 2 * kSeg;
    while (testing::Get(a.data[0], w, j) == testing::Get(b.data[0], w, j)) ++j;
    ASSERT_LT(j, 3 * kSeg);
    uint64_t v = testing::Get(b.data[0], w, j) ^ 1;
    if (v == testing::Get(a.data[0], w, j)) v ^= 2;
    testing::Set(flipped.data[0], w, j, v);
    expect_same_failure(a, BuildForged(a, b, kSeg, [&](uint32_t t, uint64_t first, SegmentRecord& rec) {
                          if (t != 0 || first != 2 * kSeg) return;
                          auto forged = EncodeSegment(a.View(), flipped.View(), t, first, rec.element_count);
                          ASSERT_TRUE(forged.ok());
                          forged->digest_delta = rec.digest_delta;
                          rec = std::move(forged).value();
                        }),
                        base, "flipped value");

    // A record that fails to decode, in the first, a middle and the last
    // record: the others (before and after it) may be written by then.
    for (uint64_t bad : {uint64_t{0}, 7 * kSeg, 11 * kSeg}) {
      expect_same_failure(a, BuildForged(a, b, kSeg, [&](uint32_t t, uint64_t first, SegmentRecord& rec) {
                            if (t == 0 && first == bad) ForgeChangedCount(rec);
                          }),
                          base, "bad changed count at " + std::to_string(bad));
    }
    // Two bad records: the error names the first, as on the default path.
    expect_same_failure(a, BuildForged(a, b, kSeg, [&](uint32_t t, uint64_t first, SegmentRecord& rec) {
                          if ((t == 0 && first == 9 * kSeg) || t == 1) ForgeChangedCount(rec);
                        }),
                        base, "two bad records");
  }
}

TEST(PatchTest, LayoutMismatchNamesTheTensor) {
  ThreadPool pool(1);
  SmallCase c = MakeSmallCase(pool);
  auto expect_mismatch = [&](OwnedView v, const std::string& name) {
    MutableServeView mv = v.Mutable();
    const auto before = v.data;
    Status s = Apply(mv, c.patch, ComputeDigest(v.View(), pool), pool);
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_NE(s.message().find("'" + name + "'"), std::string::npos) << s.ToString();
    EXPECT_EQ(v.data, before);
  };
  OwnedView shape = c.a;
  shape.descs[2].shape = {4, 4};
  expect_mismatch(shape, "c");
  OwnedView dtype = c.a;
  dtype.descs[0].dtype = DType::kF16;
  expect_mismatch(dtype, "a");
  OwnedView missing;
  missing.Add("a", DType::kBF16, {64});
  missing.Add("c", DType::kF32, {16});
  expect_mismatch(missing, "b");
  OwnedView extra = c.a;
  extra.Add("d", DType::kU8, {1});
  expect_mismatch(extra, "d");
  // Diff of differently laid out views.
  EXPECT_EQ(Diff(c.a.View(), shape.View(), DiffOptions{}, pool).status().code(), Code::kMismatch);
}

TEST(PatchTest, BuilderAssemblesRanksSegmentsLikeDiff) {
  ThreadPool pool(2);
  std::mt19937_64 rng(15);
  OwnedView a;
  a.Add("p", DType::kBF16, {5000});
  a.Add("q", DType::kF4, {998});
  for (auto& d : a.data) testing::FillRandom(d, rng);
  OwnedView b = a;
  testing::Mutate(b.data[0], 16, 5000, 0.05, rng);
  testing::Mutate(b.data[1], 4, 998, 0.05, rng);
  const ServeView av = a.View(), bv = b.View();
  const ViewDigest base = ComputeDigest(av, pool);
  PatchBuilder builder(av, 4, 5, base);
  // Two "ranks", records added out of order.
  for (uint64_t first : {4096, 0, 1024, 3072, 2048}) {
    auto rec = EncodeSegment(av, bv, 0, first, std::min<uint64_t>(1024, 5000 - first));
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    ASSERT_TRUE(builder.Add(std::move(rec).value()).ok());
  }
  auto q = EncodeSegment(av, bv, 1, 0, 998);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(builder.Add(std::move(q).value()).ok());
  auto built = builder.Finish();
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  DiffOptions opt;
  opt.segment_elements = 1024;
  opt.base_version = 4, opt.target_version = 5;
  auto direct = Diff(av, bv, opt, pool);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(*built, *direct);

  EXPECT_FALSE(EncodeSegment(av, bv, 1, 1, 10).ok());  // F4 segment not byte aligned
  PatchBuilder overlap(av, 0, 1, base);
  ASSERT_TRUE(overlap.Add(EncodeSegment(av, bv, 0, 0, 100).value()).ok());
  ASSERT_TRUE(overlap.Add(EncodeSegment(av, bv, 0, 50, 100).value()).ok());
  EXPECT_EQ(overlap.Finish().status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern

// ---- Format 2: CONTEXT segments --------------------------------------------

namespace tern {
namespace {

using testing::PhysicalBase;
using testing::PhysicalStep;

uint64_t ContextSegments(std::span<const uint8_t> patch) {
  auto info = Inspect(patch);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  uint64_t n = 0;
  if (info.ok())
    for (const auto& t : info->tensors) n += t.context_segments;
  return n;
}

constexpr DType kFloatTypes[] = {DType::kBF16, DType::kF16,    DType::kF32,    DType::kF64,
                                 DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0, DType::kF4};

TEST(PatchFormat2Test, ContextSegmentsRoundTripAndBeatFormat1) {
  ThreadPool pool(2);
  std::mt19937_64 rng(21);
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const OwnedView a = PhysicalBase(dt, 50001, rng);
    for (double push : {0.0005, 0.004, 0.05}) {
      SCOPED_TRACE("push " + std::to_string(push));
      const OwnedView b = PhysicalStep(a, push, rng);
      const std::vector<uint8_t> p2 = CheckRoundTripFormat(a, b, 1 << 20, pool, 2);
      const std::vector<uint8_t> p1 = CheckRoundTripFormat(a, b, 1 << 20, pool, 1);
      CheckRoundTripFormat(a, b, 4096, pool, 2);
      CheckRoundTripFormat(a, b, 333, pool, 2);  // blocks and segments do not align
      // Where classes carry information, format 2 must use it.
      if (ElementBits(dt) >= 8 && push > 0.001) {
        EXPECT_GT(ContextSegments(p2), 0u);
        EXPECT_LT(p2.size(), p1.size() * 0.9) << p2.size() << " vs " << p1.size();
      }
      EXPECT_LE(p2.size(), p1.size());  // the encoder takes CONTEXT only when it is smaller
    }
  }
}

TEST(PatchFormat2Test, WrongBaseWithItsDigestFailsAndLeavesTheView) {
  ThreadPool pool(1);
  std::mt19937_64 rng(22);
  const OwnedView a = PhysicalBase(DType::kBF16, 20000, rng);
  const OwnedView b = PhysicalStep(a, 0.004, rng);
  DiffOptions opt;
  opt.format_version = 2;
  auto patch = Diff(a.View(), b.View(), opt, pool);
  ASSERT_TRUE(patch.ok());
  ASSERT_GT(ContextSegments(*patch), 0u);
  const ViewDigest claimed = ComputeDigest(a.View(), pool);
  // Another base whose classes differ (a caller whose digest is stale): the
  // ranks land elsewhere, and the target digest or a rank check fails.
  for (int variant = 0; variant < 3; ++variant) {
    OwnedView other = variant == 0 ? PhysicalBase(DType::kBF16, 20000, rng) : a;
    if (variant == 1) testing::Set(other.data[0], 16, 10, testing::Get(a.data[0], 16, 10) ^ 0x4000);
    if (variant == 2)
      for (uint64_t i = 0; i < 20000; i += 7) testing::Set(other.data[0], 16, i, 0);
    const auto before = other.data;
    MutableServeView mv = other.Mutable();
    Status s = Apply(mv, *patch, claimed, pool);
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
    EXPECT_EQ(other.data, before);
    Status sx = Apply(mv, *patch, claimed, pool, ApplyOptions{.exclusive_view = true});
    EXPECT_EQ(sx.ToString(), s.ToString());
    EXPECT_EQ(other.data, before);
    Status su = patch::ApplyWithStaging(mv, *patch, claimed, pool, nullptr, 0);
    EXPECT_EQ(su.ToString(), s.ToString());
    EXPECT_EQ(other.data, before);
  }
}

// Every single-bit flip of `patch` (a -> b) and every truncation is refused
// by both apply paths (staged in memory or on disk, and exclusive) and by
// Inspect, leaving `a` untouched; the patch itself then applies to b.
void ExpectEveryBitFlipAndTruncationRejected(const OwnedView& a, const OwnedView& b,
                                             const std::vector<uint8_t>& patch, ThreadPool& pool) {
  const ViewDigest base = ComputeDigest(a.View(), pool);
  OwnedView work = a;
  MutableServeView mv = work.Mutable();
  for (size_t bit = 0; bit < patch.size() * 8; ++bit) {
    std::vector<uint8_t> bad = patch;
    bad[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    Status s = patch::ApplyWithStaging(mv, bad, base, pool, nullptr, bit % 2 ? 0 : 1 << 20);
    ASSERT_FALSE(s.ok()) << "bit " << bit;
    EXPECT_TRUE(s.code() == Code::kCorrupt || s.code() == Code::kUnsupported) << s.ToString();
    ASSERT_EQ(work.data, a.data) << "bit " << bit;
    EXPECT_EQ(Apply(mv, bad, base, pool, ApplyOptions{.exclusive_view = true}).ToString(), s.ToString());
    ASSERT_EQ(work.data, a.data) << "bit " << bit;
    EXPECT_FALSE(Inspect(bad).ok()) << "bit " << bit;
  }
  for (size_t cut = 0; cut < patch.size(); ++cut) {
    EXPECT_EQ(Apply(mv, std::span<const uint8_t>(patch.data(), cut), base, pool).code(), Code::kCorrupt);
    ASSERT_EQ(work.data, a.data);
  }
  ASSERT_TRUE(Apply(mv, patch, base, pool).ok());
  EXPECT_EQ(work.data, b.data);
}

TEST(PatchFormat2Test, EveryBitFlipAndTruncationIsRejected) {
  ThreadPool pool(1);
  std::mt19937_64 rng(23);
  const OwnedView a = PhysicalBase(DType::kBF16, 4000, rng);
  const OwnedView b = PhysicalStep(a, 0.03, rng);
  DiffOptions opt;
  opt.format_version = 2;
  const std::vector<uint8_t> patch = Diff(a.View(), b.View(), opt, pool).value();
  ASSERT_GT(ContextSegments(patch), 0u) << patch.size();
  ASSERT_LT(patch.size(), 1500u);
  ExpectEveryBitFlipAndTruncationRejected(a, b, patch, pool);
}

// A CONTEXT record is only valid in a format-2 patch, for a float dtype.
TEST(PatchFormat2Test, ContextRecordsNeedFormat2) {
  ThreadPool pool(1);
  std::mt19937_64 rng(24);
  const OwnedView a = PhysicalBase(DType::kBF16, 20000, rng);
  const OwnedView b = PhysicalStep(a, 0.004, rng);
  DiffOptions opt;
  opt.format_version = 2;
  std::vector<uint8_t> patch = Diff(a.View(), b.View(), opt, pool).value();
  ASSERT_GT(ContextSegments(patch), 0u);
  // Relabel the file as format 1 (header checksum fixed): the record is refused.
  patch[8] = 1;
  const uint64_t sum = XXH3_64bits(patch.data(), 24);
  std::memcpy(patch.data() + 24, &sum, 8);
  auto info = Inspect(patch);
  EXPECT_EQ(info.status().code(), Code::kCorrupt) << info.status().ToString();
  EXPECT_NE(info.status().ToString().find("unknown encoding"), std::string::npos) << info.status().ToString();
  // A format-1 builder refuses a format-2 record; a format-2 builder takes it.
  auto rec = EncodeSegment(a.View(), b.View(), 0, 0, 20000, 2);
  ASSERT_TRUE(rec.ok());
  PatchBuilder v1(a.View(), 1, 2, ComputeDigest(a.View(), pool), 1);
  EXPECT_EQ(v1.Add(*rec).code(), Code::kCorrupt);
  PatchBuilder v2(a.View(), 1, 2, ComputeDigest(a.View(), pool), 2);
  ASSERT_TRUE(v2.Add(*rec).ok());
  auto built = v2.Finish();
  ASSERT_TRUE(built.ok());
  OwnedView work = a;
  MutableServeView mv = work.Mutable();
  ASSERT_TRUE(Apply(mv, *built, ComputeDigest(a.View(), pool), pool).ok());
  EXPECT_EQ(work.data, b.data);
  DiffOptions bad;
  bad.format_version = 3;
  EXPECT_EQ(Diff(a.View(), b.View(), bad, pool).status().code(), Code::kInvalidArgument);
}

// Diff's old_digest is D(old) as the diff read it, in every width, across
// the parts a segment is hashed in (16384 elements) and their tails, and
// whatever base_digest the caller names: the root's publish relies on it to
// catch a damaged previous view.
TEST(PatchTest, DiffHashesTheOldViewInItsOwnPass) {
  ThreadPool pool(2);
  std::mt19937_64 rng(27);
  OwnedView a;
  uint64_t t = 0;
  for (DType dt : kWidthTypes) {
    for (uint64_t n : {uint64_t{1}, uint64_t{5}, uint64_t{16384}, uint64_t{3 * 16384 + 77}}) {
      a.Add("t" + std::to_string(100 + t), dt, {n});
      testing::FillRandom(a.data[t], rng);
      if (ElementBits(dt) == 4 && n % 2) a.data[t].back() &= 0x0f;  // an odd F4 tensor's pad
      ++t;
    }
  }
  OwnedView b = a;
  for (size_t i = 0; i < b.data.size(); ++i)
    testing::Mutate(b.data[i], ElementBits(b.descs[i].dtype), b.descs[i].elements(), 0.01, rng);
  const ViewDigest truth = ComputeDigest(a.View(), pool);
  const ViewDigest named = ComputeDigest(b.View(), pool);  // any digest but D(a)
  ASSERT_NE(truth, named);
  for (uint64_t segment : {uint64_t{1} << 20, uint64_t{20001}, uint64_t{7}}) {
    for (uint16_t format : {uint16_t{1}, uint16_t{2}}) {
      SCOPED_TRACE("segment " + std::to_string(segment) + ", format " + std::to_string(format));
      DiffOptions opt;
      opt.segment_elements = segment;
      opt.format_version = format;
      ViewDigest got;
      auto patch = Diff(a.View(), b.View(), opt, pool, &named, &got);
      ASSERT_TRUE(patch.ok()) << patch.status().ToString();
      EXPECT_EQ(got, truth);
      auto info = Inspect(*patch);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_EQ(info->base_digest, named);  // the patch names what it was told
      // Without a base digest the patch names the one hashed in the pass,
      // and the patch is the one a caller with D(a) gets.
      auto unnamed = Diff(a.View(), b.View(), opt, pool);
      auto told = Diff(a.View(), b.View(), opt, pool, &truth);
      ASSERT_TRUE(unnamed.ok() && told.ok());
      EXPECT_EQ(*unnamed, *told);
    }
  }
  // One flipped bit anywhere in the old view moves the digest the pass reports.
  for (size_t i : {size_t{0}, size_t{7}, a.data.size() - 1}) {
    OwnedView damaged = a;
    damaged.data[i][damaged.data[i].size() / 2] ^= 0x01;
    ViewDigest got;
    ASSERT_TRUE(Diff(damaged.View(), b.View(), DiffOptions{}, pool, &truth, &got).ok());
    EXPECT_NE(got, truth) << "tensor " << i;
    EXPECT_EQ(got, ComputeDigest(damaged.View(), pool));
  }
}

// DiffOptions::max_context_classes bounds K in every CONTEXT record.
TEST(PatchFormat2Test, MaxContextClassesBoundsK) {
  ThreadPool pool(1);
  std::mt19937_64 rng(26);
  const OwnedView a = PhysicalBase(DType::kBF16, 40000, rng);
  const OwnedView b = PhysicalStep(a, 0.01, rng);
  for (int max_classes : {2, 8, 16}) {
    DiffOptions opt;
    opt.format_version = 2;
    opt.max_context_classes = max_classes;
    auto limited = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(limited.ok());
    auto parsed = patch::ParsePatch(*limited);
    ASSERT_TRUE(parsed.ok());
    int most = 0;
    for (const auto& r : parsed->records) {
      if (r.h.encoding != patch::kContext) continue;
      patch::ContextTable t;
      ASSERT_TRUE(patch::ParseContextTable(r, &t).ok());
      most = std::max(most, t.classes);
    }
    EXPECT_EQ(most, max_classes);  // 40000 elements at ~4%: enough changes for 16 classes
    OwnedView work = a;
    MutableServeView mv = work.Mutable();
    ASSERT_TRUE(Apply(mv, *limited, ComputeDigest(a.View(), pool), pool).ok());
    EXPECT_EQ(work.data, b.data);
  }
  DiffOptions bad;
  bad.format_version = 2;
  bad.max_context_classes = 17;
  EXPECT_EQ(Diff(a.View(), b.View(), bad, pool).status().code(), Code::kInvalidArgument);
}

TEST(PatchFormat2Test, SquashNeedsTheBase) {
  ThreadPool pool(2);
  std::mt19937_64 rng(25);
  const OwnedView a = PhysicalBase(DType::kBF16, 30000, rng);
  const OwnedView b = PhysicalStep(a, 0.004, rng);
  const OwnedView c = PhysicalStep(b, 0.004, rng);
  DiffOptions o1, o2;
  o1.format_version = o2.format_version = 2;
  o1.base_version = 1, o1.target_version = 2, o2.base_version = 2, o2.target_version = 3;
  o2.segment_elements = 7777;
  auto ab = Diff(a.View(), b.View(), o1, pool), bc = Diff(b.View(), c.View(), o2, pool);
  ASSERT_TRUE(ab.ok() && bc.ok());
  std::vector<std::span<const uint8_t>> chain = {*ab, *bc};
  EXPECT_EQ(Squash(chain, pool).status().code(), Code::kUnsupported);
  for (uint16_t format : {1, 2}) {
    DiffOptions out;
    out.format_version = format;
    auto ac = SquashOnBase(a.View(), chain, out, pool);
    ASSERT_TRUE(ac.ok()) << ac.status().ToString();
    auto info = Inspect(*ac);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->format_version, format);
    EXPECT_EQ(info->base_version, 1u);
    EXPECT_EQ(info->target_version, 3u);
    OwnedView work = a;
    MutableServeView mv = work.Mutable();
    ASSERT_TRUE(Apply(mv, *ac, ComputeDigest(a.View(), pool), pool).ok());
    EXPECT_EQ(work.data, c.data);
  }
  // Out of order: the second patch's base is not the first's target.
  std::vector<std::span<const uint8_t>> wrong = {*bc, *ab};
  EXPECT_EQ(SquashOnBase(a.View(), wrong, DiffOptions{}, pool).status().code(), Code::kMismatch);
}

// ---- Format 3: packed 4-bit codes coded as nibbles -------------------------

// Packed 4-bit codes as a quantized view holds them: two a byte (NVFP4 and
// MXFP4 codes as U8), eight an I32 (INT4), and U16/U64 for the widths in
// between and at the top, random; with a BF16 tensor of physical values
// beside them (whose records take CONTEXT) unless `floats` is false. A step
// moves the codes by testing::MutateNibbles.
OwnedView PackedCodes(std::mt19937_64& rng, bool floats = true, uint64_t u8_bytes = 6000, uint64_t i32_words = 6000) {
  OwnedView v;
  if (floats) v.Add("a.scale", DType::kBF16, {20000});
  v.Add("b.weight_packed", DType::kU8, {u8_bytes});
  v.Add("c.qweight", DType::kI32, {i32_words});
  v.Add("d.u16", DType::kU16, {3000});
  v.Add("e.u64", DType::kU64, {1500});
  for (size_t t = 0; t < v.descs.size(); ++t) {
    if (v.descs[t].dtype == DType::kBF16) testing::PhysicalFill(v.data[t], DType::kBF16, v.descs[t].elements(), rng);
    else testing::FillRandom(v.data[t], rng);
  }
  return v;
}

OwnedView NibbleStep(const OwnedView& a, double density, std::mt19937_64& rng) {
  OwnedView b = a;
  for (size_t t = 0; t < b.descs.size(); ++t) {
    if (b.descs[t].dtype == DType::kBF16)
      testing::PhysicalMutate(b.data[t], DType::kBF16, b.descs[t].elements(), 0.01, rng);
    else
      testing::MutateNibbles(b.data[t], ElementBits(b.descs[t].dtype), b.descs[t].elements(), density, rng);
  }
  return b;
}

TEST(PatchFormat3Test, PackedCodesAreCodedAsNibblesAndRoundTripOnEveryPath) {
  ThreadPool pool(2);
  std::mt19937_64 rng(31);
  const OwnedView a = PackedCodes(rng);
  for (double density : {0.001, 0.01, 0.3}) {
    for (uint64_t seg : {uint64_t{64}, uint64_t{777}, uint64_t{1} << 20}) {
      SCOPED_TRACE("density " + std::to_string(density) + " segment " + std::to_string(seg));
      const OwnedView b = NibbleStep(a, density, rng);
      const std::vector<uint8_t> v1 = CheckRoundTripFormat(a, b, seg, pool, 1);
      const std::vector<uint8_t> v2 = CheckRoundTripFormat(a, b, seg, pool, 2);
      auto i1 = Inspect(v1);
      auto i2 = Inspect(v2);
      ASSERT_TRUE(i1.ok() && i2.ok());
      EXPECT_FALSE(i2->tensors[0].nibbles) << "BF16 is never coded as nibbles";
      // CONTEXT needs records with enough changes to pay for its tables.
      if (seg == uint64_t{1} << 20) {
        EXPECT_GT(i2->tensors[0].context_segments, 0u) << "CONTEXT and nibbles in one patch";
      }
      // Dense steps stay coded by elements (a segment with more than one
      // change in 16 elements is not tried).
      bool any_nibbles = false;
      for (size_t t = 1; t < i2->tensors.size(); ++t) {
        SCOPED_TRACE(i2->tensors[t].name);
        ASSERT_GT(i1->tensors[t].changed_elements, 0u);
        EXPECT_EQ(i2->tensors[t].changed_elements, i1->tensors[t].changed_elements) << "counted in elements";
        EXPECT_FALSE(i1->tensors[t].nibbles);
        // The writer's rule: tried when every segment has at most one change
        // in 16 elements (or one change), and then smaller for steps of
        // single codes; the dense steps stay coded by elements.
        const int w = ElementBits(a.descs[t].dtype);
        const uint64_t n = a.descs[t].elements();
        bool tried = true;
        for (uint64_t first = 0; first < n; first += seg) {
          const uint64_t count = std::min(seg, n - first);
          uint64_t changed = 0;
          for (uint64_t i = first; i < first + count; ++i)
            changed += testing::Get(a.data[t], w, i) != testing::Get(b.data[t], w, i);
          tried &= changed <= std::max<uint64_t>(count / 16, 1);
        }
        if (density <= 0.01 && seg == uint64_t{1} << 20) {
          EXPECT_TRUE(tried);
        }
        if (density > 0.1) {
          EXPECT_FALSE(tried);
        }
        EXPECT_EQ(i2->tensors[t].nibbles, tried);
        any_nibbles |= i2->tensors[t].nibbles;
        // Smaller than the same changes coded as bytes or words: what the
        // encoder chose it for (and what the codes gain).
        if (tried) {
          EXPECT_LT(i2->tensors[t].total_bytes(), i1->tensors[t].total_bytes());
        }
      }
      EXPECT_EQ(i2->format_version, any_nibbles ? 3 : 2);
    }
  }
  // The option leaves format 2 at version 2.
  const OwnedView b = NibbleStep(a, 0.01, rng);
  DiffOptions off;
  off.nibble_coding = false;
  auto p = Diff(a.View(), b.View(), off, pool);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Inspect(*p)->format_version, 2);
}

// The largest nibble record: a U64 segment of 2^20 elements is 2^24 nibbles,
// the record limit.
TEST(PatchFormat3Test, TheLargestNibbleRecordIsAtTheRecordLimit) {
  ThreadPool pool(2);
  std::mt19937_64 rng(36);
  OwnedView a;
  a.Add("w", DType::kU64, {uint64_t{1} << 20});
  testing::FillRandom(a.data[0], rng);
  OwnedView b = a;
  testing::MutateNibbles(b.data[0], 64, uint64_t{1} << 20, 0.002, rng);
  CheckRoundTripFormat(a, b, uint64_t{1} << 20, pool, 2);
  auto patch = Diff(a.View(), b.View(), DiffOptions{}, pool);
  ASSERT_TRUE(patch.ok());
  auto parsed = patch::ParsePatch(*patch);
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(parsed->tensors[0].nibbles);
  ASSERT_EQ(parsed->records.size(), 1u);
  EXPECT_EQ(parsed->records[0].h.element_count, patch::kMaxSegmentElements);
}

TEST(PatchFormat3Test, AStaleViewFailsOnEveryPathAndIsLeftAsItWas) {
  ThreadPool pool(2);
  std::mt19937_64 rng(32);
  // With a CONTEXT tensor the exclusive apply keeps its changes
  // (ApplyExclusiveKeepingChanges); without one it undoes nibble by nibble.
  for (bool floats : {true, false}) {
    SCOPED_TRACE(floats ? "with CONTEXT records" : "nibble records only");
    const OwnedView a = PackedCodes(rng, floats);
    const OwnedView b = NibbleStep(a, 0.02, rng);
    DiffOptions opt;
    // Several records a tensor, so a failure comes after others were
    // written; long enough for CONTEXT where there are floats.
    opt.segment_elements = floats ? 8192 : 256;
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    ASSERT_EQ(Inspect(*patch)->format_version, 3);
    ASSERT_EQ(ContextSegments(*patch) > 0, floats);
    const ViewDigest claimed = ComputeDigest(a.View(), pool);
    // The caller's view differs from a where the patch changes it (its
    // digest is stale): nibbles fold against other values, so the target
    // digest fails after records were written, and each path must restore
    // the view exactly.
    OwnedView other = a;
    for (size_t t = 0; t < other.descs.size(); ++t) {
      const int w = ElementBits(a.descs[t].dtype);
      if (a.descs[t].dtype == DType::kBF16) continue;
      for (uint64_t i = 0; i < other.descs[t].elements(); i += 3)
        if (testing::Get(a.data[t], w, i) != testing::Get(b.data[t], w, i))
          testing::Set(other.data[t], 4, i * static_cast<uint64_t>(w / 4), rng() & 15);
    }
    const auto before = other.data;
    MutableServeView mv = other.Mutable();
    const Status s = Apply(mv, *patch, claimed, pool);
    EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
    EXPECT_EQ(other.data, before);
    EXPECT_EQ(Apply(mv, *patch, claimed, pool, ApplyOptions{.exclusive_view = true}).ToString(), s.ToString());
    EXPECT_EQ(other.data, before);
    EXPECT_EQ(patch::ApplyWithStaging(mv, *patch, claimed, pool, nullptr, 0).ToString(), s.ToString());
    EXPECT_EQ(other.data, before);
    // The streaming apply discards its view on error; it fails the same way.
    OwnedView streamed = other;
    MutableServeView sv = streamed.Mutable();
    PatchStreamApply stream(sv, claimed, pool);
    Status ss = stream.Feed(std::span<const uint8_t>(patch->data(), patch->size() / 2));
    if (ss.ok()) ss = stream.Finish(*patch);
    EXPECT_EQ(ss.code(), Code::kCorrupt) << ss.ToString();
    // And on the right view, fed in pieces, it applies.
    OwnedView right = a;
    MutableServeView rv = right.Mutable();
    PatchStreamApply good(rv, claimed, pool);
    ASSERT_TRUE(good.Feed(std::span<const uint8_t>(patch->data(), patch->size() / 2)).ok());
    EXPECT_GT(good.records_written(), 0u);
    ViewDigest d;
    ASSERT_TRUE(good.Finish(*patch, &d).ok());
    EXPECT_EQ(right.data, b.data);
    EXPECT_EQ(d, ComputeDigest(b.View(), pool));
  }
}

// Re-seals record k's checksum after `forge` changed its bytes, and the
// trailer's checksum over every record's.
std::vector<uint8_t> ForgeRecord(std::vector<uint8_t> patch, size_t k,
                                 const std::function<void(uint8_t* record, uint64_t bytes)>& forge) {
  const auto parsed = patch::ParsePatch(patch).value();
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < parsed.records.size(); ++i) {
    const patch::RecordView& r = parsed.records[i];
    const uint64_t at = static_cast<uint64_t>(r.table - patch.data()) - sizeof(patch::RecordHeader);
    uint64_t sum = r.checksum;
    if (i == k) {
      forge(patch.data() + at, r.total_bytes);
      sum = XXH3_64bits(patch.data() + at, r.total_bytes - 8);
      std::memcpy(patch.data() + at + r.total_bytes - 8, &sum, 8);
    }
    sums.push_back(sum);
  }
  uint64_t manifest_bytes, manifest_sum;
  std::memcpy(&manifest_bytes, patch.data() + 16, 8);
  std::memcpy(&manifest_sum, patch.data() + 32 + manifest_bytes, 8);
  std::vector<uint8_t> buf(patch.end() - 24, patch.end() - 16);  // the trailer magic
  const uint64_t n = sums.size();
  auto put = [&](uint64_t x) {
    buf.insert(buf.end(), reinterpret_cast<const uint8_t*>(&x), reinterpret_cast<const uint8_t*>(&x) + 8);
  };
  put(n);
  put(manifest_sum);
  for (uint64_t c : sums) put(c);
  const uint64_t trailer_sum = XXH3_64bits(buf.data(), buf.size());
  std::memcpy(patch.data() + patch.size() - 8, &trailer_sum, 8);
  return patch;
}

// A nibble record whose header claims one change more or less than its
// streams hold fails while it decodes, after the ring of the exclusive path
// has written part of it: the undo must take back exactly those elements,
// nibble by nibble (and the record's last, half-folded element not at all).
TEST(PatchFormat3Test, ARecordFailingMidwayIsUndoneExactly) {
  ThreadPool pool(2);
  std::mt19937_64 rng(37);
  const OwnedView a = PackedCodes(rng, /*floats=*/false);
  const OwnedView b = NibbleStep(a, 0.04, rng);
  DiffOptions opt;
  opt.segment_elements = 4096;
  auto patch = Diff(a.View(), b.View(), opt, pool);
  ASSERT_TRUE(patch.ok());
  ASSERT_EQ(ContextSegments(*patch), 0u);
  const auto parsed = patch::ParsePatch(*patch).value();
  const ViewDigest base = ComputeDigest(a.View(), pool);
  int forged = 0;
  for (size_t k = 0; k < parsed.records.size(); ++k) {
    const patch::RecordView& r = parsed.records[k];
    if (!parsed.tensors[r.h.tensor_index].nibbles || r.h.encoding != patch::kSparse || r.h.changed_count < 100)
      continue;
    for (int more : {1, -1}) {
      SCOPED_TRACE("record " + std::to_string(k) + (more > 0 ? " +1" : " -1"));
      const auto bad = ForgeRecord(*patch, k, [&](uint8_t* rec, uint64_t) {
        uint64_t count;
        std::memcpy(&count, rec + 24, 8);
        count += more;
        std::memcpy(rec + 24, &count, 8);
      });
      OwnedView by_default = a, by_exclusive = a;
      MutableServeView dv = by_default.Mutable(), ev = by_exclusive.Mutable();
      const Status expected = Apply(dv, bad, base, pool);
      EXPECT_EQ(expected.code(), Code::kCorrupt) << expected.ToString();
      EXPECT_EQ(by_default.data, a.data);
      EXPECT_EQ(Apply(ev, bad, base, pool, ApplyOptions{.exclusive_view = true}).ToString(), expected.ToString());
      EXPECT_EQ(by_exclusive.data, a.data);
    }
    ++forged;
  }
  EXPECT_GE(forged, 3);
}

TEST(PatchFormat3Test, EveryBitFlipAndTruncationIsRejected) {
  ThreadPool pool(1);
  std::mt19937_64 rng(33);
  OwnedView a;
  a.Add("codes", DType::kU8, {400});
  a.Add("qweight", DType::kI32, {100});
  for (auto& d : a.data) testing::FillRandom(d, rng);
  OwnedView b = a;
  for (size_t t = 0; t < 2; ++t)
    testing::MutateNibbles(b.data[t], ElementBits(b.descs[t].dtype), b.descs[t].elements(), 0.03, rng);
  DiffOptions opt;
  opt.segment_elements = 128;
  const std::vector<uint8_t> patch = Diff(a.View(), b.View(), opt, pool).value();
  ASSERT_EQ(Inspect(patch)->format_version, 3);
  ASSERT_LT(patch.size(), 1500u);
  ExpectEveryBitFlipAndTruncationRejected(a, b, patch, pool);
}

// Rewrites a manifest byte (offset in the manifest) and the header's
// version, then seals the header, manifest and trailer checksums again: a
// well-formed container that breaks only the rule under test.
std::vector<uint8_t> ForgeManifest(std::vector<uint8_t> patch, uint64_t offset, uint8_t value, uint16_t version) {
  const auto parsed = patch::ParsePatch(patch).value();
  std::vector<uint64_t> sums;
  for (const auto& r : parsed.records) sums.push_back(r.checksum);
  uint64_t manifest_bytes;
  std::memcpy(&manifest_bytes, patch.data() + 16, 8);
  patch[32 + offset] = value;
  std::memcpy(patch.data() + 8, &version, 2);
  const uint64_t header_sum = XXH3_64bits(patch.data(), 24);
  std::memcpy(patch.data() + 24, &header_sum, 8);
  const uint64_t manifest_sum = XXH3_64bits(patch.data() + 32, manifest_bytes);
  std::memcpy(patch.data() + 32 + manifest_bytes, &manifest_sum, 8);
  std::vector<uint8_t> buf(patch.end() - 24, patch.end() - 16);  // the trailer magic
  const uint64_t n = sums.size();
  buf.insert(buf.end(), reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + 8);
  buf.insert(buf.end(), reinterpret_cast<const uint8_t*>(&manifest_sum),
             reinterpret_cast<const uint8_t*>(&manifest_sum) + 8);
  for (uint64_t c : sums)
    buf.insert(buf.end(), reinterpret_cast<const uint8_t*>(&c), reinterpret_cast<const uint8_t*>(&c) + 8);
  const uint64_t trailer_sum = XXH3_64bits(buf.data(), buf.size());
  std::memcpy(patch.data() + patch.size() - 8, &trailer_sum, 8);
  return patch;
}

TEST(PatchFormat3Test, TheCodingByteIsChecked) {
  ThreadPool pool(1);
  std::mt19937_64 rng(34);
  OwnedView a;
  a.Add("codes", DType::kU8, {256});
  a.Add("w", DType::kBF16, {64});
  for (auto& d : a.data) testing::FillRandom(d, rng);
  OwnedView b = a;
  testing::Set(b.data[0], 4, 5, testing::Get(b.data[0], 4, 5) ^ 1);
  testing::Set(b.data[0], 4, 100, testing::Get(b.data[0], 4, 100) ^ 8);
  testing::Set(b.data[1], 16, 3, testing::Get(b.data[1], 16, 3) + 1);
  DiffOptions opt;
  opt.segment_elements = 64;
  const std::vector<uint8_t> v3 = Diff(a.View(), b.View(), opt, pool).value();
  ASSERT_EQ(Inspect(v3)->format_version, 3);
  ASSERT_TRUE(Inspect(v3)->tensors[0].nibbles);
  opt.format_version = 1;
  opt.segment_elements = 63;  // odd: its records split "codes" mid-element when read as nibbles
  const std::vector<uint8_t> v1 = Diff(a.View(), b.View(), opt, pool).value();
  // The sealing alone changes nothing.
  EXPECT_TRUE(Inspect(ForgeManifest(v3, 92, 1, 3)).ok());
  // "codes" is entry 0: its coding byte is manifest byte 88 + 4; "w" starts
  // after entry 0's name (5 bytes), shape (8) and counts (16).
  const uint64_t w_coding = 88 + 8 + 5 + 8 + 16 + 4;
  struct Bad {
    std::vector<uint8_t> patch;
    Code code;
    const char* text;
  };
  const std::vector<Bad> bad = {
      {ForgeManifest(v3, 92, 1, 2), Code::kCorrupt, "reserved field not zero"},  // coding before version 3
      {ForgeManifest(v3, 92, 2, 3), Code::kCorrupt, "unknown coding 2"},
      {ForgeManifest(v3, 93, 1, 3), Code::kCorrupt, "reserved field not zero"},
      {ForgeManifest(v3, w_coding, 1, 3), Code::kCorrupt, "cannot be coded as nibbles"},  // BF16
      // Element records read as nibbles: the first record of "codes" covers
      // 63 of them, which as nibbles ends inside a byte.
      {ForgeManifest(v1, 92, 1, 3), Code::kCorrupt, "not aligned"},
      {ForgeManifest(v3, 92, 1, 4), Code::kUnsupported, "version 4"},
  };
  for (size_t k = 0; k < bad.size(); ++k) {
    SCOPED_TRACE(k);
    auto info = Inspect(bad[k].patch);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), bad[k].code) << info.status().ToString();
    EXPECT_NE(info.status().ToString().find(bad[k].text), std::string::npos) << info.status().ToString();
  }
  // Records of nibbles read as bytes may well parse (here both changes lie
  // in the first record, whose 128 nibbles fit the 256 bytes), but they do
  // not reach the target, and the view is left as it was.
  const std::vector<uint8_t> as_bytes = ForgeManifest(v3, 92, 0, 3);
  OwnedView work = a;
  MutableServeView mv = work.Mutable();
  const Status s = Apply(mv, as_bytes, ComputeDigest(a.View(), pool), pool);
  EXPECT_EQ(s.code(), Code::kCorrupt) << s.ToString();
  EXPECT_EQ(work.data, a.data);
}

TEST(PatchFormat3Test, SquashKeepsTheCodingOrNeedsTheBase) {
  ThreadPool pool(2);
  std::mt19937_64 rng(35);
  const OwnedView a = PackedCodes(rng, /*floats=*/false);  // no CONTEXT: squashes without the base
  const OwnedView b = NibbleStep(a, 0.01, rng);
  const OwnedView c = NibbleStep(b, 0.01, rng);
  DiffOptions o1, o2;
  o1.base_version = 1, o1.target_version = 2, o2.base_version = 2, o2.target_version = 3;
  o2.segment_elements = 4000;
  auto ab = Diff(a.View(), b.View(), o1, pool), bc = Diff(b.View(), c.View(), o2, pool);
  ASSERT_TRUE(ab.ok() && bc.ok());
  const ViewDigest da = ComputeDigest(a.View(), pool);
  auto check = [&](const std::vector<uint8_t>& ac, uint16_t version) {
    auto info = Inspect(ac);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->format_version, version);
    EXPECT_EQ(info->base_version, 1u);
    EXPECT_EQ(info->target_version, 3u);
    OwnedView work = a;
    MutableServeView mv = work.Mutable();
    ASSERT_TRUE(Apply(mv, ac, da, pool).ok());
    EXPECT_EQ(work.data, c.data);
  };
  // Both code the packed tensors as nibbles: nibble deltas add.
  std::vector<std::span<const uint8_t>> chain = {*ab, *bc};
  auto ac = Squash(chain, pool);
  ASSERT_TRUE(ac.ok()) << ac.status().ToString();
  check(*ac, 3);
  EXPECT_TRUE(Inspect(*ac)->tensors[1].nibbles);
  // With nibble coding off the same inputs need the base, which writes
  // version 2.
  auto no_nibbles = Squash(chain, pool, /*nibble_coding=*/false);
  EXPECT_EQ(no_nibbles.status().code(), Code::kUnsupported);
  EXPECT_NE(no_nibbles.status().ToString().find("nibble coding is off"), std::string::npos)
      << no_nibbles.status().ToString();
  DiffOptions plain;
  plain.nibble_coding = false;
  auto ac2 = SquashOnBase(a.View(), chain, plain, pool);
  ASSERT_TRUE(ac2.ok()) << ac2.status().ToString();
  check(*ac2, 2);
  // One codes them by elements: only the base can join the two.
  DiffOptions f1 = o2;
  f1.format_version = 1;
  auto bc1 = Diff(b.View(), c.View(), f1, pool);
  ASSERT_TRUE(bc1.ok());
  std::vector<std::span<const uint8_t>> mixed = {*ab, *bc1};
  auto refused = Squash(mixed, pool);
  EXPECT_EQ(refused.status().code(), Code::kUnsupported);
  EXPECT_NE(refused.status().ToString().find("differently"), std::string::npos) << refused.status().ToString();
  auto on_base = SquashOnBase(a.View(), mixed, DiffOptions{}, pool);
  ASSERT_TRUE(on_base.ok()) << on_base.status().ToString();
  check(*on_base, 3);
  // A patch that leaves the packed tensors alone codes them by neither: it
  // squashes with one that codes them as nibbles.
  OwnedView d = b;
  d.data[3] = c.data[3];  // only the U64 tensor moves
  auto bd = Diff(b.View(), d.View(), o2, pool);
  ASSERT_TRUE(bd.ok());
  ASSERT_FALSE(Inspect(*bd)->tensors[0].nibbles);
  ASSERT_TRUE(Inspect(*bd)->tensors[3].nibbles);
  std::vector<std::span<const uint8_t>> quiet = {*ab, *bd};
  auto ad = Squash(quiet, pool);
  ASSERT_TRUE(ad.ok()) << ad.status().ToString();
  EXPECT_TRUE(Inspect(*ad)->tensors[0].nibbles);
  OwnedView work = a;
  MutableServeView mv = work.Mutable();
  ASSERT_TRUE(Apply(mv, *ad, da, pool).ok());
  EXPECT_EQ(work.data, d.data);
}

}  // namespace
}  // namespace tern

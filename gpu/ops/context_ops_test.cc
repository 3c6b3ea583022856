// The GPU's CONTEXT decoder (gpu/ops/context_ops.h) against patch/'s
// (patch/context_codec.h): the committed golden patches, random CONTEXT
// records over every dtype with an exponent field at several densities, and
// corrupted records and wrong bases, on which both must make the same
// accept/reject decision and, when both accept, give the same changes.
#include "gpu/ops/context_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include "base/hash.h"
#include "gpu/host/patch_walk.h"
#include "patch/context_codec.h"
#include "patch/golden_cases.h"
#include "patch/test_util.h"

namespace tern::gpu {
namespace {

using Changes = std::vector<std::pair<uint64_t, uint64_t>>;

constexpr DType kContextDTypes[] = {DType::kBF16,   DType::kF16,    DType::kF32,    DType::kF64,
                                    DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0, DType::kF4};

SegmentStreams StreamsOf(const uint8_t* rec) {
  SegmentStreams s;
  std::memcpy(&s.h, rec, sizeof(RecordHeader));
  s.table = rec + sizeof(RecordHeader);
  s.positions = s.table + s.h.table_bytes;
  s.values = s.positions + s.h.position_bytes;
  return s;
}

// patch/'s decoder on the record as it stands (checksum not consulted: the
// corruption tests change payload bytes without fixing it), sorted by
// position (it emits block by block, class by class).
bool ReferenceDecode(const uint8_t* rec, int w, const uint8_t* base, DType dt, Changes* out) {
  patch::RecordView r{};
  std::memcpy(&r.h, rec, sizeof(r.h));
  r.table = rec + sizeof(r.h);
  r.positions = r.table + r.h.table_bytes;
  r.values = r.positions + r.h.position_bytes;
  out->clear();
  const Status st = patch::DecodeRecordOnBase(r, w, base, patch::ContextFieldOf(dt),
                                                 [&](uint64_t p, uint64_t d) { out->emplace_back(p, d); });
  std::sort(out->begin(), out->end());
  return st.ok();
}

int GpuDecode(const uint8_t* rec, int w, const uint8_t* base, DType dt, Changes* out) {
  out->clear();
  return DecodeRecordOnBase(StreamsOf(rec), w, base, ContextFieldOfCode(static_cast<int>(dt)),
                            [&](uint64_t p, uint64_t d) { out->emplace_back(p, d); });
}

TEST(GpuContextOps, ExponentFieldsMatchReference) {
  int with_field = 0;
  for (int code = 0; code <= 16; ++code) {
    const patch::ContextField want = patch::ContextFieldOf(static_cast<DType>(code));
    const ContextField got = ContextFieldOfCode(code);
    ASSERT_EQ(got.mask != 0, want.ok) << "dtype " << code;
    if (!want.ok) continue;
    ++with_field;
    EXPECT_EQ(got.shift, want.shift) << "dtype " << code;
    EXPECT_EQ(got.mask, want.mask) << "dtype " << code;
  }
  EXPECT_EQ(with_field, 8);
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

// Every record of every committed golden patch, format 1 and 2, decoded by
// both against the base file; the changes applied give the target file.
TEST(GpuContextOps, GoldenPatchesDecodeAsTheReference) {
  uint64_t context_records = 0, records = 0;
  for (const golden::GoldenCase& c : golden::Cases()) {
    const std::string stem = std::string(TERN_GOLDEN_DIR) + "/" + c.file;
    const std::vector<uint8_t> base = ReadFile(stem + ".base"), target = ReadFile(stem + ".target"),
                               patch = ReadFile(stem + ".patch");
    auto wp = WalkPatch(patch);
    if (c.format == 3) {
      // Nibble-coded tensors are applied on the host for now: refused, by name.
      EXPECT_EQ(wp.status().code(), Code::kUnsupported) << c.file;
      continue;
    }
    ASSERT_TRUE(wp.ok()) << c.file << ": " << wp.status().ToString();
    std::vector<uint64_t> offset;  // of each tensor in the .base/.target files
    uint64_t at = 0;
    for (const WalkedTensor& t : wp->tensors) {
      offset.push_back(at);
      at += t.desc.bytes();
    }
    ASSERT_EQ(at, base.size()) << c.file;
    std::vector<uint8_t> view = base;
    for (const WalkedRecord& r : wp->records) {
      const DType dt = wp->tensors[r.h.tensor_index].desc.dtype;
      const int w = ElementBits(dt);
      const uint8_t* tensor = base.data() + offset[r.h.tensor_index];
      Changes want, got;
      ASSERT_TRUE(ReferenceDecode(patch.data() + r.offset, w, tensor, dt, &want)) << c.file;
      ASSERT_EQ(GpuDecode(patch.data() + r.offset, w, tensor, dt, &got), kDecodeOk) << c.file;
      ASSERT_EQ(got, want) << c.file;
      ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
      for (auto [p, d] : got) {
        uint8_t* t = view.data() + offset[r.h.tensor_index];
        const uint64_t i = r.h.first_element + p;
        StoreElement(t, i, w, (LoadElement(t, i, w) + d) & WidthMask(w));
      }
      ++records;
      context_records += r.h.encoding == kContext;
    }
    EXPECT_EQ(view, target) << c.file;
  }
  EXPECT_GT(records, 10u);
  EXPECT_GE(context_records, 3u) << "the golden files must exercise CONTEXT";
}

// A CONTEXT record (header, payload, checksum) for a physical step of a
// tensor of `count` elements, made by patch/'s encoder with no size limit so
// that CONTEXT is written even where another encoding would be smaller.
struct ContextCase {
  DType dtype;
  std::vector<uint8_t> base, target, record;
};

bool MakeContextCase(DType dt, uint64_t count, double push, int max_classes, std::mt19937_64& rng,
                     ContextCase* out) {
  const int w = ElementBits(dt);
  testing::OwnedView a = testing::PhysicalBase(dt, count, rng);
  testing::OwnedView b = testing::PhysicalStep(a, push, rng);
  std::vector<uint64_t> pos, del;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t x = LoadElement(a.data[0].data(), i, w), y = LoadElement(b.data[0].data(), i, w);
    if (x != y) pos.push_back(i), del.push_back((y - x) & WidthMask(w));
  }
  if (pos.empty()) return false;
  patch::ContextPayload payload;
  if (!patch::EncodeContext(pos.data(), del.data(), pos.size(), w, a.data[0].data(), patch::ContextFieldOf(dt),
                               max_classes, 0, count, ~uint64_t{0} >> 1, &payload))
    return false;
  RecordHeader h{};
  h.encoding = kContext;
  h.element_count = count;
  h.changed_count = pos.size();
  h.table_bytes = payload.table_bytes;
  h.position_bytes = payload.position_bytes;
  h.value_bytes = payload.value_bytes;
  out->dtype = dt;
  out->record.resize(sizeof(h));
  std::memcpy(out->record.data(), &h, sizeof(h));
  out->record.insert(out->record.end(), payload.bytes.begin(), payload.bytes.end());
  const uint64_t sum = Xxh3(out->record.data(), out->record.size());
  out->record.resize(out->record.size() + 8);
  std::memcpy(out->record.data() + out->record.size() - 8, &sum, 8);
  out->base = std::move(a.data[0]);
  out->target = std::move(b.data[0]);
  return true;
}

struct Shape {
  uint64_t count;
  double push;  // density grows with it (testing::PhysicalMutate)
  int max_classes;
};
constexpr Shape kShapes[] = {{2, 0.5, 2},        {64, 0.05, 16},    {1000, 0.001, 4},  {4096, 0.01, 16},
                             {4097, 0.2, 16},    {5000, 0.9, 8},    {12289, 0.003, 16}, {65536, 0.0005, 16},
                             {65537, 0.02, 3},   {1 << 17, 0.004, 16}};

TEST(GpuContextOps, DecoderMatchesReferenceOnRandomRecords) {
  std::mt19937_64 rng(11);
  int made = 0;
  for (DType dt : kContextDTypes) {
    const int w = ElementBits(dt);
    for (Shape sh : kShapes) {
      if (w == 4 && sh.count % 2) ++sh.count;  // a whole-tensor segment may be odd, but keep bytes whole
      ContextCase c;
      if (!MakeContextCase(dt, sh.count, sh.push, sh.max_classes, rng, &c)) continue;
      ++made;
      Changes want, got;
      ASSERT_TRUE(ReferenceDecode(c.record.data(), w, c.base.data(), dt, &want));
      const int e = GpuDecode(c.record.data(), w, c.base.data(), dt, &got);
      ASSERT_EQ(e, kDecodeOk) << DTypeName(dt) << " count " << sh.count;
      ASSERT_EQ(got, want) << DTypeName(dt) << " count " << sh.count;
      std::vector<uint8_t> x = c.base;
      for (auto [p, d] : got) StoreElement(x.data(), p, w, (LoadElement(x.data(), p, w) + d) & WidthMask(w));
      ASSERT_EQ(x, c.target) << DTypeName(dt) << " count " << sh.count;
    }
  }
  EXPECT_GT(made, 60);
}

// Payload bit flips, changed_count off by one, and a wrong base (elements
// moved to another class, so ranks fall past a class's members or land on
// other elements): both decoders accept or reject alike.
TEST(GpuContextOps, DecoderAgreesWithReferenceOnCorruptedRecords) {
  std::mt19937_64 rng(12);
  int rejected = 0, accepted = 0, base_rejected = 0;
  for (DType dt : kContextDTypes) {
    const int w = ElementBits(dt);
    for (const Shape& sh : kShapes) {
      if (sh.count > 13000) continue;  // keeps the loop short; the shapes above cover size
      ContextCase c;
      if (!MakeContextCase(dt, sh.count + (w == 4 && sh.count % 2), sh.push, sh.max_classes, rng, &c)) continue;
      const size_t payload = c.record.size() - 8 - sizeof(RecordHeader);
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<uint8_t> rec = c.record;
        std::vector<uint8_t> base = c.base;
        const int kind = trial % 5;
        if (kind < 3) {  // flip 1-3 payload bits, the table's more often
          for (int f = 0; f <= kind; ++f) {
            const size_t span = (trial & 8) ? std::min<size_t>(payload, rec[32] + 1) : payload;
            const size_t at = sizeof(RecordHeader) + rng() % span;
            rec[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          }
        } else if (kind == 3) {  // changed_count off by one (still >= 1)
          uint64_t n;
          std::memcpy(&n, rec.data() + 24, 8);
          n = n > 1 && (rng() & 1) ? n - 1 : n + 1;
          std::memcpy(rec.data() + 24, &n, 8);
          if (n > sh.count) continue;  // ParseRecord's rule, not the decoders'
        } else {  // a wrong base: a few elements' exponent fields changed
          const uint64_t n = sh.count;
          for (int f = 0; f < 1 + trial % 7; ++f) {
            const uint64_t i = rng() % n;
            StoreElement(base.data(), i, w, LoadElement(base.data(), i, w) ^ (rng() & WidthMask(w)));
          }
        }
        Changes want, got;
        const bool ref_ok = ReferenceDecode(rec.data(), w, base.data(), dt, &want);
        const bool gpu_ok = GpuDecode(rec.data(), w, base.data(), dt, &got) == kDecodeOk;
        ASSERT_EQ(gpu_ok, ref_ok) << DTypeName(dt) << " count " << sh.count << " trial " << trial << " kind "
                                  << kind;
        if (gpu_ok) {
          ASSERT_EQ(got, want);
          ++accepted;
        } else {
          ++rejected;
          base_rejected += kind == 4;
        }
      }
    }
  }
  EXPECT_GT(rejected, 2000);
  EXPECT_GT(accepted, 300);  // bits flipped in unused places, bases with the same classes
  EXPECT_GT(base_rejected, 100);
}

TEST(GpuContextOps, TableRulesMatchReference) {
  // Hand-made tables on a record of 100 elements, 3 changes, one byte of
  // positions and values: each breaks one rule of §6.4 (or none: the first).
  RecordHeader h{};
  h.encoding = kContext;
  h.element_count = 100;
  h.changed_count = 3;
  h.position_bytes = 1;
  h.value_bytes = 1;
  // K=2, e0=5, class 0: 3 changes, k=0, 1 byte each, table {nsym 2: 1, 1}; class 1: 0.
  const std::vector<uint8_t> ok = {2, 5, 0, 3, 0, 1, 1, 2, 0x11, 0};
  const std::vector<std::vector<uint8_t>> bad = {
      {1, 5, 0, 3, 0, 1, 1, 2, 0x11, 0},        // K = 1
      {17, 5, 0, 3, 0, 1, 1, 2, 0x11, 0},       // K = 17
      {2, 0x00, 0x10, 3, 0, 1, 1, 2, 0x11, 0},  // e0 = 4096
      {2, 5, 0, 3, 25, 1, 1, 2, 0x11, 0},       // k = 25
      {2, 5, 0, 3, 0, 0, 1, 2, 0x11, 0},        // p_c = 0
      {2, 5, 0, 3, 0, 2, 1, 2, 0x11, 0},        // p_c past the stream
      {2, 5, 0, 0x83, 0, 0, 1, 1, 2, 0x11, 0},  // non-minimal varint
      {2, 5, 0, 2, 0, 1, 1, 2, 0x11, 0},        // counts sum to 2
      {2, 5, 0, 3, 0, 1, 1, 2, 0x11, 0, 0},     // trailing byte
      {2, 5, 0, 3, 0, 1, 1, 3, 0x11, 0},        // code table truncated
      {2, 5, 0, 3, 0, 1, 1, 3, 0x11, 1, 0},     // oversubscribed code (three of length 1)
      {2, 5, 0, 3, 0, 1, 1},                    // truncated class
  };
  auto check = [&](const std::vector<uint8_t>& table) {
    RecordHeader hh = h;
    hh.table_bytes = static_cast<uint32_t>(table.size());
    ContextTableHd t;
    const bool gpu_ok = ParseContextTable(hh, table.data(), &t) == kDecodeOk;
    patch::RecordView r{};
    std::memcpy(&r.h, &hh, sizeof(hh));
    const uint8_t streams[2] = {0, 0};
    r.table = table.data();
    r.positions = streams;
    r.values = streams + 1;
    patch::ContextTable rt;
    const bool ref_ok = patch::ParseContextTable(r, &rt).ok();
    EXPECT_EQ(gpu_ok, ref_ok);
    return gpu_ok;
  };
  EXPECT_TRUE(check(ok));
  for (const auto& t : bad) EXPECT_FALSE(check(t)) << "table of " << t.size() << " bytes";
}

}  // namespace
}  // namespace tern::gpu

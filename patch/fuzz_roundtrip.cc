// Fuzzer: diff -> apply round trip on views derived from the input bytes.
// Layout: byte 0 picks the dtype, byte 1 the segment size (low 6 bits) and
// the format (top bit: 2, else 1); the rest is split into old and new tensor
// bytes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tern/thread_pool.h"
#include "patch/reference_decoder.h"
#include "patch/test_util.h"
#include "tern/patch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  if (size < 2) return 0;
  // U8 and I32 may be coded as nibbles by format 2 (packed 4-bit codes).
  static constexpr DType kTypes[] = {DType::kF4,  DType::kU8,     DType::kBF16, DType::kF32,
                                     DType::kF64, DType::kF8E4M3, DType::kI32};
  const DType dt = kTypes[data[0] % 7];
  const uint16_t format = data[1] & 0x80 ? 2 : 1;
  // Format 2 takes CONTEXT only for records with enough changes to pay for
  // its tables: its segments are longer.
  const uint64_t seg = (1 + data[1] % 64) * (format == 2 ? 128 : 1);
  const uint64_t half = (size - 2) / 2;
  const uint64_t elem_bytes = ElementBits(dt) >= 8 ? ElementBits(dt) / 8 : 1;
  const uint64_t n = (half / elem_bytes) * (ElementBits(dt) == 4 ? 2 : 1);
  testing::OwnedView a;
  a.Add("t", dt, {n});
  // An input too short for one element gives an empty tensor, whose data()
  // may be null: memcpy must not see it even for zero bytes.
  if (!a.data[0].empty()) std::memcpy(a.data[0].data(), data + 2, a.data[0].size());
  testing::OwnedView b = a;
  if (!b.data[0].empty()) std::memcpy(b.data[0].data(), data + 2 + half, b.data[0].size());
  ThreadPool pool(1);
  DiffOptions opt;
  opt.segment_elements = seg;
  opt.format_version = format;
  auto patch = Diff(a.View(), b.View(), opt, pool);
  TERN_ASSERT(patch.ok(), patch.status().ToString());
  const testing::OwnedView old = a;
  testing::OwnedView x = a;
  MutableServeView mv = a.Mutable(), xv = x.Mutable();
  const ViewDigest base = ComputeDigest(a.View(), pool);
  Status s = Apply(mv, *patch, base, pool);
  TERN_ASSERT(s.ok(), s.ToString());
  TERN_ASSERT(a.data[0] == b.data[0], "round trip not bitwise");
  ApplyOptions exclusive;
  exclusive.exclusive_view = true;
  s = Apply(xv, *patch, base, pool, exclusive);
  TERN_ASSERT(s.ok(), s.ToString());
  TERN_ASSERT(x.data[0] == b.data[0], "exclusive round trip not bitwise");
  const ServeView base_view = old.View();
  TERN_ASSERT(patch::ReferenceDecode(*patch, &base_view).ok(),
              "reference decoder rejects a fresh patch");
  return 0;
}

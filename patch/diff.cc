// Diff, EncodeSegment and PatchBuilder: the encoding side.
#include <algorithm>
#include <bit>
#include <cstring>

#include "tern/thread_pool.h"
#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"
#include "tern/patch.h"

namespace tern {
namespace {

using patch::kMaxSegmentElements;

// Whether two 64-byte blocks are equal: two 32-byte vector compares (GCC
// vector extensions, so it stays portable and needs no intrinsics).
inline bool BlocksEqual(const uint8_t* a, const uint8_t* b) {
  using V = uint64_t __attribute__((vector_size(32)));
  V a0, a1, b0, b1;
  std::memcpy(&a0, a, 32);
  std::memcpy(&a1, a + 32, 32);
  std::memcpy(&b0, b, 32);
  std::memcpy(&b1, b + 32, 32);
  const V d = (a0 ^ b0) | (a1 ^ b1);
  return (d[0] | d[1] | d[2] | d[3]) == 0;
}

// The changes of one segment as CollectChanges finds them: positions
// (relative to the segment's first element) and deltas, n of them. The
// vectors are capacity (thread-local scratch, grown, never shrunk), so a
// segment collected in several calls appends without re-filling them.
struct ChangeList {
  std::vector<uint64_t> positions, deltas;
  uint64_t n = 0;
};

// Appends the changes of elements [first, first + count) of a segment that
// starts at segment_first. The compare loop skips equal 64-byte blocks (the
// compiler vectorizes it); in a block that differs, only the changed lanes
// of each differing 64-bit word are visited (count-trailing-zeros over the
// XOR), so the cost follows the changes, not the 32 BF16 elements of the
// block.
template <int W>
void CollectChanges(const uint8_t* old_data, const uint8_t* new_data, uint64_t segment_first,
                    uint64_t first, uint64_t count, uint64_t seed, ChangeList* changes,
                    uint64_t digest_acc[4]) {
  static_assert(std::endian::native == std::endian::little, "lane extraction assumes little-endian words");
  constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
  constexpr uint64_t kWordElements = 64 / W;
  constexpr uint64_t kBlockWords = 8;
  constexpr uint64_t kBlockBytes = kBlockWords * 8;
  constexpr uint64_t kBlockElements = kBlockBytes * 8 / W;
  uint64_t acc[4] = {digest_acc[0], digest_acc[1], digest_acc[2], digest_acc[3]};
  // Written through raw pointers (push_back in this loop re-derived the
  // vectors' address every time); grown before each block so a block's
  // changes always fit.
  std::vector<uint64_t>& positions = changes->positions;
  std::vector<uint64_t>& deltas = changes->deltas;
  uint64_t n = changes->n;
  uint64_t* pos = positions.data();
  uint64_t* del = deltas.data();
  auto reserve = [&](uint64_t more) {
    if (n + more <= positions.size()) return;
    const uint64_t size = std::max<uint64_t>(2 * positions.size(), n + more + 4096);
    positions.resize(size);
    deltas.resize(size);
    pos = positions.data();
    del = deltas.data();
  };
  const uint64_t offset = first - segment_first;
  auto changed = [&](uint64_t i, uint64_t a, uint64_t b) {  // i relative to first
    pos[n] = offset + i;
    del[n] = (b - a) & kMask;
    ++n;
    patch::AddElementChange(seed, first + i, a, b, acc);
  };
  // first is even for W == 4 (segments and their parts are byte aligned),
  // so byte offsets are exact.
  const uint64_t start_byte = first * W / 8;
  const uint64_t blocks = count / kBlockElements;
  const uint8_t* po = old_data + start_byte;
  const uint8_t* pn = new_data + start_byte;
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    __builtin_prefetch(po + (blk + 32) * kBlockBytes);
    __builtin_prefetch(pn + (blk + 32) * kBlockBytes);
    if (BlocksEqual(po + blk * kBlockBytes, pn + blk * kBlockBytes)) continue;
    reserve(kBlockElements);
    uint64_t x[kBlockWords], y[kBlockWords];
    std::memcpy(x, po + blk * kBlockBytes, kBlockBytes);
    std::memcpy(y, pn + blk * kBlockBytes, kBlockBytes);
    uint32_t words = 0;  // bit k: word k differs
    for (uint64_t k = 0; k < kBlockWords; ++k) words |= static_cast<uint32_t>(x[k] != y[k]) << k;
    do {
      const int k = std::countr_zero(words);
      words &= words - 1;
      uint64_t d = x[k] ^ y[k];
      do {
        const int lane = std::countr_zero(d) / W;
        const int shift = lane * W;
        changed(blk * kBlockElements + k * kWordElements + lane, (x[k] >> shift) & kMask,
                (y[k] >> shift) & kMask);
        if constexpr (W == 64) {
          d = 0;
        } else {
          d &= ~(kMask << shift);
        }
      } while (d != 0);
    } while (words != 0);
  }
  reserve(count - blocks * kBlockElements);
  for (uint64_t i = blocks * kBlockElements; i < count; ++i) {
    const uint64_t a = patch::LoadElement<W>(old_data, first + i);
    const uint64_t b = patch::LoadElement<W>(new_data, first + i);
    if (a != b) changed(i, a, b);
  }
  changes->n = n;
  for (int l = 0; l < 4; ++l) digest_acc[l] = acc[l];
}

Status CheckSameLayout(const ServeView& a, const ServeView& b) {
  const size_t n = std::max(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < n; ++i) {
    TERN_REQUIRE(i < a.tensors.size(), kMismatch, "tensor '", b.tensors[i].desc->name, "' is only in the new view");
    TERN_REQUIRE(i < b.tensors.size(), kMismatch, "tensor '", a.tensors[i].desc->name, "' is only in the old view");
    const TensorDesc& x = *a.tensors[i].desc;
    const TensorDesc& y = *b.tensors[i].desc;
    TERN_REQUIRE(x.SameLayout(y), kMismatch, "tensor '", x.name < y.name ? x.name : y.name,
                 "' differs between the old and new view (name, dtype or shape)");
    if (i > 0)
      TERN_REQUIRE(a.tensors[i - 1].desc->name < x.name, kInvalidArgument,
                   "view tensors must be sorted by name (SortAndCheck) at '", x.name, "'");
    auto checked = CheckedElements(x.dtype, x.shape);
    TERN_REQUIRE(checked.ok(), kOutOfRange, "tensor '", x.name, "': shape too large");
    TERN_REQUIRE(x.name.size() >= 1 && x.name.size() <= patch::kMaxNameBytes &&
                     x.shape.size() <= patch::kMaxRank,
                 kInvalidArgument, "tensor '", x.name,
                 "': name length or rank outside the format limits");
  }
  TERN_REQUIRE(a.tensors.size() <= patch::kMaxTensors, kInvalidArgument, "too many tensors");
  return Status::Ok();
}

// The nibble changes of a segment's element changes (format 3's coding of
// packed 4-bit codes): each changed element's nibbles that differ, with
// their deltas mod 16, positions relative to the segment in nibbles, still
// increasing. Reads the old value of each changed element again (the changes
// are sparse, so this costs little next to the compare).
template <int W>
void NibbleChanges(const uint8_t* old_data, uint64_t first, const ChangeList& c, ChangeList* out) {
  constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
  constexpr uint64_t kPer = W / 4;
  out->n = 0;
  if (out->positions.size() < c.n * kPer) {
    out->positions.resize(c.n * kPer);
    out->deltas.resize(c.n * kPer);
  }
  for (uint64_t j = 0; j < c.n; ++j) {
    const uint64_t a = patch::LoadElement<W>(old_data, first + c.positions[j]);
    const uint64_t b = (a + c.deltas[j]) & kMask;
    for (uint64_t q = 0; q < kPer; ++q) {
      const uint64_t x = (a >> (4 * q)) & 15, y = (b >> (4 * q)) & 15;
      if (x == y) continue;
      out->positions[out->n] = c.positions[j] * kPer + q;
      out->deltas[out->n] = (y - x) & 15;
      ++out->n;
    }
  }
}

// Nibble coding is tried for segments with at most one change in this many
// elements, or one change (EncodeRange).
constexpr uint64_t kNibbleMaxDensity = 16;

// Elements per part when a segment is compared and its old bytes hashed in
// one pass: the hash reads each part while the compare has just brought it
// into L1/L2 (32 kB of BF16), instead of a second pass over the old view
// from memory. A multiple of every width's compare block, and even.
constexpr uint64_t kHashPartElements = uint64_t{1} << 14;

// Shared by Diff (whose arguments are validated) and EncodeSegment.
// old_digest: null, or where the element terms of the old range are added
// (patch::AccumulateElements), read in the same pass as the compare.
// nibble_record: null, or where the same changes coded as nibbles go (a
// record of the segment's count * width / 4 nibbles; the caller checked that
// this fits a record and that the dtype is NibbleCodable). Only for a segment
// with at most 1 change in kNibbleMaxDensity elements, else *nibble_dense is
// set to 1: packed codes change sparsely (0.02-0.4% a step), a dense segment (a
// keyframe's) gains nothing from nibbles, and the nibble changes of a dense
// segment would take up to width / 4 times the element changes' scratch.
SegmentRecord EncodeRange(const TensorRef& old_t, const TensorRef& new_t, uint32_t tensor_index,
                          uint64_t seed, uint64_t first, uint64_t count, uint16_t format_version,
                          int max_context_classes = patch::kMaxClasses,
                          uint64_t* old_digest = nullptr, std::vector<uint8_t>* nibble_record = nullptr,
                          uint8_t* nibble_dense = nullptr) {
  thread_local ChangeList changes;  // scratch reused; CollectChanges grows it
  changes.n = 0;
  SegmentRecord rec;
  rec.tensor_index = tensor_index;
  rec.first_element = first;
  rec.element_count = count;
  const int w = ElementBits(old_t.desc->dtype);
  patch::DispatchWidth(w, [&]<int W>() {
    if (old_digest == nullptr) {
      CollectChanges<W>(old_t.data, new_t.data, first, first, count, seed, &changes,
                        rec.digest_delta.lanes.data());
      return;
    }
    for (uint64_t part = first; part < first + count; part += kHashPartElements) {
      const uint64_t part_count = std::min(kHashPartElements, first + count - part);
      CollectChanges<W>(old_t.data, new_t.data, first, part, part_count, seed, &changes,
                        rec.digest_delta.lanes.data());
      patch::AccumulateElements(old_t, seed, part, part + part_count, old_digest);
    }
  });
  patch::ContextBase base;
  if (format_version >= patch::kFormatVersion2)
    base = {old_t.data, patch::ContextFieldOf(old_t.desc->dtype), max_context_classes};
  if (changes.n != 0)
    patch::EncodeRecord(changes.positions.data(), changes.deltas.data(), changes.n, w, tensor_index,
                        first, count, &rec.bytes, base);
  // At least one change is allowed, so a short tail segment does not veto.
  if (nibble_record != nullptr && changes.n > std::max<uint64_t>(count / kNibbleMaxDensity, 1)) *nibble_dense = 1;
  if (nibble_record != nullptr && changes.n != 0 && *nibble_dense == 0) {
    thread_local ChangeList nibbles;
    patch::DispatchWidth(w, [&]<int W>() {
      if constexpr (W >= 8) NibbleChanges<W>(old_t.data, first, changes, &nibbles);
    });
    const uint64_t per = static_cast<uint64_t>(w / 4);
    patch::EncodeRecord(nibbles.positions.data(), nibbles.deltas.data(), nibbles.n, 4, tensor_index,
                        first * per, count * per, nibble_record);
  }
  return rec;
}

uint64_t SegmentSizeFor(DType dtype, uint64_t segment_elements) {
  // Packed 4-bit segments start on a byte so parallel writers never share one.
  if (ElementBits(dtype) == 4 && segment_elements % 2) return segment_elements + 1;
  return segment_elements;
}

Status CheckFormatVersion(uint16_t v) {
  TERN_REQUIRE(v == patch::kFormatVersion1 || v == patch::kFormatVersion2, kInvalidArgument,
               "patch format version ", v, " (this build writes versions 1 and 2)");
  return Status::Ok();
}

}  // namespace

Result<SegmentRecord> EncodeSegment(const ServeView& old_view, const ServeView& new_view, uint32_t tensor_index,
                                    uint64_t first_element, uint64_t element_count, uint16_t format_version) {
  TERN_RETURN_IF_ERROR(CheckFormatVersion(format_version));
  TERN_REQUIRE(tensor_index < old_view.tensors.size() && tensor_index < new_view.tensors.size(),
               kInvalidArgument, "tensor index ", tensor_index, " out of range");
  const TensorRef& a = old_view.tensors[tensor_index];
  const TensorRef& b = new_view.tensors[tensor_index];
  TERN_REQUIRE(a.desc->SameLayout(*b.desc), kMismatch, "tensor '", a.desc->name, "' differs between the views");
  const uint64_t n = a.desc->elements();
  TERN_REQUIRE(element_count >= 1 && element_count <= kMaxSegmentElements && element_count <= n &&
                   first_element <= n - element_count,
               kInvalidArgument, "segment [", first_element, ", +", element_count, ") out of range for '",
               a.desc->name, "'");
  if (ElementBits(a.desc->dtype) == 4)
    TERN_REQUIRE(first_element % 2 == 0 && (element_count % 2 == 0 || first_element + element_count == n),
                 kInvalidArgument, "packed 4-bit segments must be byte aligned");
  return EncodeRange(a, b, tensor_index, TensorSeed(*a.desc), first_element, element_count, format_version);
}

Result<std::vector<uint8_t>> Diff(const ServeView& old_view, const ServeView& new_view, const DiffOptions& options,
                                  ThreadPool& pool, const ViewDigest* base_digest,
                                  ViewDigest* old_digest) {
  TERN_REQUIRE(options.segment_elements >= 1 && options.segment_elements < kMaxSegmentElements, kInvalidArgument,
               "segment_elements must be in [1, 2^24)");
  TERN_RETURN_IF_ERROR(CheckFormatVersion(options.format_version));
  TERN_REQUIRE(
      options.max_context_classes >= 2 && options.max_context_classes <= patch::kMaxClasses,
      kInvalidArgument, "max_context_classes must be in [2, 16]");
  TERN_RETURN_IF_ERROR(CheckSameLayout(old_view, new_view));
  struct Item {
    uint32_t tensor;
    uint64_t first, count;
  };
  std::vector<Item> items;
  std::vector<uint64_t> seeds(old_view.tensors.size());
  std::vector<TensorDesc> descs;
  // D(old) is needed when the caller asks for it or gives no base digest;
  // then every item hashes its old range in the compare's pass.
  const bool hash_old = old_digest != nullptr || base_digest == nullptr;
  ViewDigest old_total;
  for (uint32_t t = 0; t < old_view.tensors.size(); ++t) {
    const TensorDesc& d = *old_view.tensors[t].desc;
    descs.push_back(d);
    seeds[t] = TensorSeed(d);
    if (hash_old) old_total += TensorTerm(seeds[t]);
    const uint64_t n = d.elements();
    const uint64_t seg = SegmentSizeFor(d.dtype, options.segment_elements);
    for (uint64_t b = 0; b < n; b += seg) items.push_back({t, b, std::min(seg, n - b)});
  }
  // Format 2 also codes each integer tensor (where packed 4-bit codes live)
  // as nibbles and keeps, per tensor, the smaller of the two codings (a
  // nibble-coded patch is format version 3, docs/format/patch.md §3.2).
  std::vector<bool> try_nibbles(descs.size(), false);
  if (options.format_version >= patch::kFormatVersion2 && options.nibble_coding)
    for (size_t t = 0; t < descs.size(); ++t)
      try_nibbles[t] = patch::NibbleCodable(descs[t].dtype) &&
                       SegmentSizeFor(descs[t].dtype, options.segment_elements) *
                               static_cast<uint64_t>(ElementBits(descs[t].dtype) / 4) <=
                           kMaxSegmentElements;
  std::vector<SegmentRecord> records(items.size());
  std::vector<std::vector<uint8_t>> nibble_records(items.size());
  std::vector<uint8_t> nibble_dense(items.size(), 0);  // not vector<bool>: written by parallel items
  std::vector<ViewDigest> old_parts(hash_old ? items.size() : 0);
  pool.ParallelFor(items.size(), [&](uint64_t k) {
    const Item& it = items[k];
    records[k] = EncodeRange(old_view.tensors[it.tensor], new_view.tensors[it.tensor], it.tensor, seeds[it.tensor],
                             it.first, it.count, options.format_version, options.max_context_classes,
                             hash_old ? old_parts[k].lanes.data() : nullptr,
                             try_nibbles[it.tensor] ? &nibble_records[k] : nullptr,
                             &nibble_dense[k]);
  });
  std::vector<uint64_t> element_bytes(descs.size(), 0), nibble_bytes(descs.size(), 0);
  for (size_t k = 0; k < items.size(); ++k) {
    element_bytes[items[k].tensor] += records[k].bytes.size();
    nibble_bytes[items[k].tensor] += nibble_records[k].size();
    if (nibble_dense[k]) try_nibbles[items[k].tensor] = false;  // one coding per tensor
  }
  std::vector<bool> nibbles(descs.size(), false);
  for (size_t t = 0; t < descs.size(); ++t)
    nibbles[t] = try_nibbles[t] && element_bytes[t] != 0 && nibble_bytes[t] < element_bytes[t];
  for (const ViewDigest& p : old_parts) old_total += p;
  if (old_digest != nullptr) *old_digest = old_total;
  const ViewDigest base = base_digest ? *base_digest : old_total;
  ViewDigest target = base;
  std::vector<std::span<const uint8_t>> spans;
  for (size_t k = 0; k < records.size(); ++k) {
    const SegmentRecord& r = records[k];
    target += r.digest_delta;
    const std::vector<uint8_t>& bytes = nibbles[items[k].tensor] ? nibble_records[k] : r.bytes;
    if (!bytes.empty()) spans.emplace_back(bytes);
  }
  return patch::WritePatch(descs, options.base_version, options.target_version, base, target, spans,
                           options.format_version, nibbles);
}

PatchBuilder::PatchBuilder(const ServeView& layout, uint64_t base_version, uint64_t target_version,
                           const ViewDigest& base_digest, uint16_t format_version)
    : format_version_(format_version),
      base_version_(base_version),
      target_version_(target_version),
      base_digest_(base_digest),
      target_digest_(base_digest) {
  for (const auto& t : layout.tensors) descs_.push_back(*t.desc);
}

Status PatchBuilder::Add(SegmentRecord record) {
  TERN_REQUIRE(record.tensor_index < descs_.size(), kInvalidArgument, "record for unknown tensor index ",
               record.tensor_index);
  const TensorDesc& d = descs_[record.tensor_index];
  const uint64_t n = d.elements();
  TERN_REQUIRE(record.element_count <= n && record.first_element <= n - record.element_count, kInvalidArgument,
               "record range outside tensor '", d.name, "'");
  if (!record.bytes.empty()) {
    auto parsed = patch::ParseRecord(
        record.bytes.data(), record.bytes.size(), ElementBits(d.dtype), nullptr,
        format_version_ >= patch::kFormatVersion2 && patch::ContextFieldOf(d.dtype).ok);
    TERN_RETURN_IF_ERROR(parsed.status());
    TERN_REQUIRE(parsed->total_bytes == record.bytes.size() && parsed->h.tensor_index == record.tensor_index &&
                     parsed->h.first_element == record.first_element &&
                     parsed->h.element_count == record.element_count,
                 kInvalidArgument, "record bytes do not match its description");
  }
  target_digest_ += record.digest_delta;
  records_.push_back(std::move(record));
  return Status::Ok();
}

Result<std::vector<uint8_t>> PatchBuilder::Finish() {
  std::sort(records_.begin(), records_.end(), [](const SegmentRecord& a, const SegmentRecord& b) {
    return a.tensor_index != b.tensor_index ? a.tensor_index < b.tensor_index : a.first_element < b.first_element;
  });
  std::vector<std::span<const uint8_t>> spans;
  for (size_t i = 0; i < records_.size(); ++i) {
    const SegmentRecord& r = records_[i];
    if (i > 0 && records_[i - 1].tensor_index == r.tensor_index)
      TERN_REQUIRE(records_[i - 1].first_element + records_[i - 1].element_count <= r.first_element,
                   kInvalidArgument, "overlapping segments in tensor '", descs_[r.tensor_index].name, "'");
    if (!r.bytes.empty()) spans.emplace_back(r.bytes);
  }
  TERN_RETURN_IF_ERROR(CheckFormatVersion(format_version_));
  return patch::WritePatch(descs_, base_version_, target_version_, base_digest_, target_digest_,
                           spans, format_version_);
}

}  // namespace tern

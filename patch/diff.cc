// Diff, EncodeSegment and PatchBuilder: the encoding side.
#include <algorithm>
#include <cstring>

#include "common/thread_pool.h"
#include "patch/container.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"
#include "tern/patch.h"

namespace tern {
namespace {

using patchfmt::kMaxSegmentElements;

// Positions (relative to the segment) and deltas of the changed elements.
// The compare loop skips equal 32-byte blocks; the compiler vectorizes it.
template <int W>
void CollectChanges(const uint8_t* old_data, const uint8_t* new_data, uint64_t first, uint64_t count,
                    uint64_t seed, std::vector<uint64_t>* positions, std::vector<uint64_t>* deltas,
                    uint64_t digest_acc[4]) {
  constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
  constexpr uint64_t kBlockBytes = 32;
  constexpr uint64_t kBlockElements = kBlockBytes * 8 / W;
  auto visit = [&](uint64_t i) {  // i relative to first
    const uint64_t a = patchfmt::LoadElement<W>(old_data, first + i);
    const uint64_t b = patchfmt::LoadElement<W>(new_data, first + i);
    if (a != b) {
      positions->push_back(i);
      deltas->push_back((b - a) & kMask);
      patchfmt::AddElementChange(seed, first + i, a, b, digest_acc);
    }
  };
  // first is even for W == 4 (segments are byte aligned), so byte offsets are exact.
  const uint64_t start_byte = first * W / 8;
  const uint64_t blocks = count / kBlockElements;
  const uint8_t* po = old_data + start_byte;
  const uint8_t* pn = new_data + start_byte;
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    uint64_t x[4], y[4];
    std::memcpy(x, po + blk * kBlockBytes, kBlockBytes);
    std::memcpy(y, pn + blk * kBlockBytes, kBlockBytes);
    if (((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0) continue;
    for (uint64_t e = 0; e < kBlockElements; ++e) visit(blk * kBlockElements + e);
  }
  for (uint64_t i = blocks * kBlockElements; i < count; ++i) visit(i);
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
    TERN_REQUIRE(x.name.size() >= 1 && x.name.size() <= patchfmt::kMaxNameBytes &&
                     x.shape.size() <= patchfmt::kMaxRank,
                 kInvalidArgument, "tensor '", x.name, "': name length or rank outside the format limits");
  }
  TERN_REQUIRE(a.tensors.size() <= patchfmt::kMaxTensors, kInvalidArgument, "too many tensors");
  return Status::Ok();
}

// Shared by Diff (whose arguments are validated) and EncodeSegment.
SegmentRecord EncodeRange(const TensorRef& old_t, const TensorRef& new_t, uint32_t tensor_index,
                          uint64_t seed, uint64_t first, uint64_t count) {
  thread_local std::vector<uint64_t> positions, deltas;  // scratch reused across segments
  positions.clear();
  deltas.clear();
  SegmentRecord rec;
  rec.tensor_index = tensor_index;
  rec.first_element = first;
  rec.element_count = count;
  const int w = ElementBits(old_t.desc->dtype);
  patchfmt::DispatchWidth(w, [&]<int W>() {
    CollectChanges<W>(old_t.data, new_t.data, first, count, seed, &positions, &deltas, rec.digest_delta.lanes.data());
  });
  if (!positions.empty())
    patchfmt::EncodeRecord(positions.data(), deltas.data(), positions.size(), w, tensor_index, first, count,
                           &rec.bytes);
  return rec;
}

uint64_t SegmentSizeFor(DType dtype, uint64_t segment_elements) {
  // Packed 4-bit segments start on a byte so parallel writers never share one.
  if (ElementBits(dtype) == 4 && segment_elements % 2) return segment_elements + 1;
  return segment_elements;
}

}  // namespace

Result<SegmentRecord> EncodeSegment(const ServeView& old_view, const ServeView& new_view, uint32_t tensor_index,
                                    uint64_t first_element, uint64_t element_count) {
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
  return EncodeRange(a, b, tensor_index, TensorSeed(*a.desc), first_element, element_count);
}

Result<std::vector<uint8_t>> Diff(const ServeView& old_view, const ServeView& new_view, const DiffOptions& options,
                                  ThreadPool& pool, const ViewDigest* base_digest) {
  TERN_REQUIRE(options.segment_elements >= 1 && options.segment_elements < kMaxSegmentElements, kInvalidArgument,
               "segment_elements must be in [1, 2^24)");
  TERN_RETURN_IF_ERROR(CheckSameLayout(old_view, new_view));
  struct Item {
    uint32_t tensor;
    uint64_t first, count;
  };
  std::vector<Item> items;
  std::vector<uint64_t> seeds(old_view.tensors.size());
  std::vector<TensorDesc> descs;
  for (uint32_t t = 0; t < old_view.tensors.size(); ++t) {
    const TensorDesc& d = *old_view.tensors[t].desc;
    descs.push_back(d);
    seeds[t] = TensorSeed(d);
    const uint64_t n = d.elements();
    const uint64_t seg = SegmentSizeFor(d.dtype, options.segment_elements);
    for (uint64_t b = 0; b < n; b += seg) items.push_back({t, b, std::min(seg, n - b)});
  }
  std::vector<SegmentRecord> records(items.size());
  pool.ParallelFor(items.size(), [&](uint64_t k) {
    const Item& it = items[k];
    records[k] = EncodeRange(old_view.tensors[it.tensor], new_view.tensors[it.tensor], it.tensor, seeds[it.tensor],
                             it.first, it.count);
  });
  const ViewDigest base = base_digest ? *base_digest : ComputeDigest(old_view, pool);
  ViewDigest target = base;
  std::vector<std::span<const uint8_t>> spans;
  for (const SegmentRecord& r : records) {
    target += r.digest_delta;
    if (!r.bytes.empty()) spans.emplace_back(r.bytes);
  }
  return patchfmt::WritePatch(descs, options.base_version, options.target_version, base, target, spans);
}

PatchBuilder::PatchBuilder(const ServeView& layout, uint64_t base_version, uint64_t target_version,
                           const ViewDigest& base_digest)
    : base_version_(base_version),
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
    auto parsed = patchfmt::ParseRecord(record.bytes.data(), record.bytes.size(), ElementBits(d.dtype));
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
  return patchfmt::WritePatch(descs_, base_version_, target_version_, base_digest_, target_digest_, spans);
}

}  // namespace tern

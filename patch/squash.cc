// Squash: joining consecutive patches a->b, b->c, ... into a->z, without the
// base (patches without CONTEXT segments or nibble-coded tensors) or with it
// (SquashOnBase).
#include <algorithm>

#include "patch/container.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {

using patch::ParsedPatch;
using patch::RecordView;

Result<std::vector<uint8_t>> Squash(std::span<const std::span<const uint8_t>> patches,
                                    ThreadPool& pool, bool nibble_coding) {
  TERN_REQUIRE(!patches.empty(), kInvalidArgument, "squash needs at least one patch");
  std::vector<ParsedPatch> parsed;
  for (size_t i = 0; i < patches.size(); ++i) {
    auto p = patch::ParsePatch(patches[i]);
    if (!p.ok()) return p.status().WithContext("patch " + std::to_string(i + 1));
    for (const RecordView& r : p->records)
      TERN_REQUIRE(r.h.encoding != patch::kContext, kUnsupported, "patch ", i + 1,
                   " codes segments given its base (format 2): squashing it needs the base view "
                   "(SquashOnBase)");
    parsed.push_back(std::move(p).value());
  }
  const ParsedPatch& first = parsed.front();
  std::vector<const TensorDesc*> descs;
  for (const auto& t : first.tensors) descs.push_back(&t.desc);
  for (size_t i = 1; i < parsed.size(); ++i) {
    Status s = patch::CheckLayout(parsed[i].tensors, descs);
    if (!s.ok()) return s.WithContext("patch " + std::to_string(i + 1) + " vs patch 1");
    TERN_REQUIRE(parsed[i - 1].target_digest == parsed[i].base_digest, kMismatch, "patch ", i + 1,
                 " does not start where patch ", i, " ends (digests do not chain)");
  }
  // Nibble deltas add per nibble and element deltas per element, but the
  // two do not add to each other without the base (the carries between
  // nibbles depend on it): a tensor squashes without the base when every
  // patch that changes it codes it the same way, and keeps that coding.
  std::vector<bool> nibbles(first.tensors.size(), false);
  bool any_nibbles = false;
  for (size_t t = 0; t < first.tensors.size(); ++t) {
    size_t coder = parsed.size();  // the first patch that changes tensor t
    for (size_t i = 0; i < parsed.size(); ++i) {
      const patch::ManifestTensor& mt = parsed[i].tensors[t];
      if (mt.segment_count == 0) continue;
      if (coder == parsed.size()) {
        coder = i;
        nibbles[t] = mt.nibbles;
        continue;
      }
      TERN_REQUIRE(mt.nibbles == nibbles[t], kUnsupported, "patch ", coder + 1, " and patch ", i + 1,
                   " code tensor '", mt.desc.name,
                   "' differently (as nibbles in one, by elements in the other): squashing them needs the "
                   "base view (SquashOnBase)");
    }
    TERN_REQUIRE(nibble_coding || !nibbles[t], kUnsupported, "tensor '", first.tensors[t].desc.name,
                 "' is coded as nibbles and nibble coding is off: squashing it to file version 2 "
                 "needs the base view (SquashOnBase)");
    any_nibbles |= nibbles[t];
  }
  // Per tensor: every patch's changes as (element, delta), summed mod 2^w.
  const size_t tensors = first.tensors.size();
  std::vector<std::vector<std::vector<uint8_t>>> out_records(tensors);
  std::vector<Status> errors(tensors);
  std::vector<std::vector<const RecordView*>> by_tensor(tensors);
  for (const auto& p : parsed)
    for (const RecordView& r : p.records) by_tensor[r.h.tensor_index].push_back(&r);
  pool.ParallelFor(tensors, [&](uint64_t t) {
    const int w = nibbles[t] ? 4 : first.tensors[t].width_bits;
    const uint64_t mask = patch::WidthMask(w);
    std::vector<std::pair<uint64_t, uint64_t>> changes;
    for (const RecordView* r : by_tensor[t]) {
      const uint64_t base = r->h.first_element;
      Status s = patch::DecodeRecord(
          *r, w, [&](uint64_t pos, uint64_t d) { changes.emplace_back(base + pos, d); });
      if (!s.ok()) {
        errors[t] = s.WithContext("tensor '" + first.tensors[t].desc.name + "'");
        return;
      }
    }
    std::sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t n = 0;  // combine equal positions in place, dropping cancelled deltas
    for (size_t i = 0; i < changes.size();) {
      uint64_t sum = 0;
      size_t j = i;
      for (; j < changes.size() && changes[j].first == changes[i].first; ++j) sum = (sum + changes[j].second) & mask;
      if (sum != 0) changes[n++] = {changes[i].first, sum};
      i = j;
    }
    changes.resize(n);
    const uint64_t seg = uint64_t{1} << 20;  // a multiple of 16: 4-bit segments start on a byte, nibble-coded ones on an element
    const uint64_t elements =  // a multiple of seg's alignment
        nibbles[t] ? first.tensors[t].elements * static_cast<uint64_t>(first.tensors[t].width_bits / 4)
                   : first.tensors[t].elements;
    std::vector<uint64_t> pos, delta;
    for (size_t i = 0; i < n;) {
      const uint64_t seg_first = changes[i].first / seg * seg;
      const uint64_t count = std::min(seg, elements - seg_first);
      pos.clear();
      delta.clear();
      for (; i < n && changes[i].first < seg_first + count; ++i) {
        pos.push_back(changes[i].first - seg_first);
        delta.push_back(changes[i].second);
      }
      out_records[t].emplace_back();
      patch::EncodeRecord(pos.data(), delta.data(), pos.size(), w, static_cast<uint32_t>(t),
                          seg_first, count, &out_records[t].back());
    }
  });
  for (const Status& s : errors) TERN_RETURN_IF_ERROR(s);
  std::vector<std::span<const uint8_t>> spans;
  for (const auto& recs : out_records)
    for (const auto& r : recs) spans.emplace_back(r);
  std::vector<TensorDesc> out_descs;
  for (const auto& t : first.tensors) out_descs.push_back(t.desc);
  // Version 1, or 3 when a tensor stays nibble-coded (WritePatch).
  return patch::WritePatch(out_descs, first.base_version, parsed.back().target_version,
                           first.base_digest, parsed.back().target_digest, spans,
                           any_nibbles ? patch::kFormatVersion2 : patch::kFormatVersion1, nibbles);
}

Result<std::vector<uint8_t>> SquashOnBase(const ServeView& base, std::span<const std::span<const uint8_t>> patches,
                                          const DiffOptions& options, ThreadPool& pool) {
  TERN_REQUIRE(!patches.empty(), kInvalidArgument, "squash needs at least one patch");
  // The base of patch k is the base plus patches 1..k-1: apply them in turn
  // to a copy (Apply checks that the digests chain), then diff the ends.
  std::vector<std::vector<uint8_t>> bytes;
  MutableServeView work;
  for (const TensorRef& t : base.tensors) {
    bytes.emplace_back(t.data, t.data + t.desc->bytes());
    work.tensors.push_back({t.desc, bytes.back().data()});
  }
  const ViewDigest base_digest = ComputeDigest(base, pool);
  ViewDigest digest = base_digest;
  uint64_t base_version = 0, target_version = 0;
  ApplyOptions exclusive;
  exclusive.exclusive_view = true;  // the copy is private
  for (size_t i = 0; i < patches.size(); ++i) {
    TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(patches[i]));
    if (i == 0) base_version = info.base_version;
    target_version = info.target_version;
    ViewDigest next;
    Status s = Apply(work, patches[i], digest, pool, exclusive, &next);
    if (!s.ok()) return s.WithContext("patch " + std::to_string(i + 1));
    digest = next;
  }
  const ServeView result = AsConst(work);
  DiffOptions d = options;
  d.base_version = base_version;
  d.target_version = target_version;
  return Diff(base, result, d, pool, &base_digest);
}

}  // namespace tern

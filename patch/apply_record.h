// The per-record steps the apply paths share (apply.cc: verify-then-write and
// the exclusive paths; apply_stream.cc: PatchStreamApply): the checks made
// before a view is touched, records run in parallel with an error that does
// not depend on thread timing, and one record read, hashed and written in a
// single visit to each change; and what both report of a patch's head.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern::patch {

// s, with the tensor and segment of record r.
inline Status RecordContext(const Status& s, const std::vector<ManifestTensor>& tensors,
                            const RecordView& r) {
  return s.WithContext("tensor '" + tensors[r.h.tensor_index].desc.name + "' segment at element " +
                       std::to_string(r.h.first_element));
}

// Runs fn(k) over records in parallel; returns the error of the lowest
// failing record, so the message does not depend on thread timing.
template <class Fn>
Status ForEachRecord(std::span<const RecordView> records,
                     const std::vector<ManifestTensor>& tensors, ThreadPool& pool, Fn&& fn) {
  std::vector<Status> errors(records.size());
  std::atomic<bool> failed{false};
  pool.ParallelFor(records.size(), [&](uint64_t k) {
    errors[k] = fn(k);
    if (!errors[k].ok()) failed.store(true, std::memory_order_relaxed);
  });
  if (failed.load())
    for (size_t k = 0; k < errors.size(); ++k)
      if (!errors[k].ok()) return RecordContext(errors[k], tensors, records[k]);
  return Status::Ok();
}
template <class Fn>
Status ForEachRecord(const ParsedPatch& p, ThreadPool& pool, Fn&& fn) {
  return ForEachRecord(p.records, p.tensors, pool, std::forward<Fn>(fn));
}

// What Inspect and InspectHead report from a patch's header and manifest:
// the versions, digests, container bytes and each tensor's layout and
// elements (the per-record counts and patch_bytes are left at zero).
PatchInfo HeadInfo(const ParsedPatch& p);

// The checks every apply path makes before touching the view (its layout is
// the manifest's, its digest the patch's base), in one place so all report
// the same errors. `p` needs its header and manifest only. Returns each
// tensor's digest seed.
Result<std::vector<uint64_t>> PrepareView(const MutableServeView& view, const ParsedPatch& p,
                                          const ViewDigest& current_digest);

// Decodes record r of tensor `mt` (whose bytes are `data`) and reads, hashes
// and writes each change as it comes: *partial gets the record's digest
// change, and kept(position in the segment, delta) sees each written change.
// At most r.h.changed_count changes are written: a corrupt stream may yield
// more, and the decoder then rejects it. On error the view holds the changes
// written so far (the caller undoes or discards them).
template <class Kept>
Status WriteRecord(const RecordView& r, const ManifestTensor& mt, uint8_t* data, uint64_t seed,
                   ViewDigest* partial, Kept&& kept) {
  return DispatchWidth(mt.width_bits, [&]<int W>() -> Status {
    constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
    const uint64_t first = r.h.first_element;
    uint64_t sum[4] = {};
    uint64_t n = 0;
    // A CONTEXT decoder reads a block's base before it emits a change
    // there, so writing each change as it comes is safe (context_codec.h).
    Status st = DecodeRecordOnBase(r, W, data, mt.context, [&](uint64_t pos, uint64_t delta) {
      if (n == r.h.changed_count) return;
      ++n;
      const uint64_t i = first + pos;
      const uint64_t old_value = LoadElement<W>(data, i);
      const uint64_t new_value = (old_value + delta) & kMask;
      AddElementChange(seed, i, old_value, new_value, sum);
      StoreElement<W>(data, i, new_value);
      kept(pos, delta);
    });
    for (int l = 0; l < 4; ++l) partial->lanes[l] = sum[l];
    return st;
  });
}

}  // namespace tern::patch

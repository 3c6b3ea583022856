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
  const ManifestTensor& mt = tensors[r.h.tensor_index];
  return s.WithContext("tensor '" + mt.desc.name + "' segment at element " +
                       std::to_string(r.h.first_element / mt.nibbles_per_element()) +
                       (mt.nibbles ? " (nibble " + std::to_string(r.h.first_element) + ")" : ""));
}

// The elements of its dtype that record r changes: its changed_count, or for
// a nibble-coded record the elements its nibbles fall in (decoded; its
// streams checked).
inline Result<uint64_t> RecordChangedElements(const RecordView& r, const ManifestTensor& mt) {
  if (!mt.nibbles) return r.h.changed_count;
  const uint64_t per = mt.nibbles_per_element();
  uint64_t elements = 0, last = ~uint64_t{0};
  TERN_RETURN_IF_ERROR(DecodeRecord(r, 4, [&](uint64_t pos, uint64_t) {
    if (pos / per != last) ++elements;
    last = pos / per;
  }));
  return elements;
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

// The first element of the dtype that record r covers (a nibble-coded
// record counts nibbles; NextRecord checked that it starts on an element).
inline uint64_t RecordFirst(const RecordView& r, const ManifestTensor& mt) {
  return r.h.first_element / mt.nibbles_per_element();
}

// Decodes record r of tensor `mt` (whose bytes are `tensor`, as they were
// before the apply) into changes of whole W-bit elements: fn(position in the
// segment, in elements of the dtype; delta mod 2^W, non-zero). Positions
// increase except in a CONTEXT record (class order within a block).
//
// A nibble-coded record's changes are nibbles in increasing order, so the
// nibbles of one element arrive together: they are folded into one change of
// that element, whose delta needs its old value (the carries between nibbles
// depend on it), read once, before the element is passed on. So a caller may
// write each element it is given (the apply paths do), and every path that
// works on element changes (digest terms, staging, undo by subtraction)
// works unchanged. At most r.h.changed_count changes are passed (fewer when
// two nibbles of an element change). On error the element being folded is
// dropped (the caller undoes or discards what it was given).
template <int W, class Fn>
Status DecodeElementChanges(const RecordView& r, const ManifestTensor& mt, const uint8_t* tensor, Fn&& fn) {
  if constexpr (W >= 8) {
    if (mt.nibbles) {
      constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
      constexpr uint64_t kPer = W / 4;
      constexpr uint64_t kNone = ~uint64_t{0};
      const uint64_t first = r.h.first_element / kPer;
      uint64_t element = kNone, old_value = 0, new_value = 0;
      Status s = DecodeRecord(r, 4, [&](uint64_t pos, uint64_t delta) {
        const uint64_t e = pos / kPer;
        const int shift = static_cast<int>(4 * (pos % kPer));
        if (e != element) {
          if (element != kNone) fn(element, (new_value - old_value) & kMask);
          element = e;
          old_value = new_value = LoadElement<W>(tensor, first + e);
        }
        const uint64_t nibble = ((new_value >> shift) + delta) & 15;
        new_value = (new_value & ~(uint64_t{15} << shift)) | (nibble << shift);
      });
      if (s.ok() && element != kNone) fn(element, (new_value - old_value) & kMask);
      return s;
    }
  }
  return DecodeRecordOnBase(r, W, tensor, mt.context, fn);
}

// Undoes the first `elements` element changes that DecodeElementChanges
// passed for nibble-coded record r and that were then written to `tensor`:
// each written nibble loses its delta again. (Decoding the record again
// would fold its nibbles against the written values, not the base.)
template <int W>
void UndoNibbleChanges(const RecordView& r, uint8_t* tensor, uint64_t elements) {
  if constexpr (W >= 8) {
    constexpr uint64_t kPer = W / 4;
    const uint64_t first = r.h.first_element / kPer;
    uint64_t element = ~uint64_t{0}, seen = 0;
    DecodeRecord(r, 4, [&](uint64_t pos, uint64_t delta) {
      const uint64_t e = pos / kPer;
      if (e != element) {
        element = e;
        ++seen;
      }
      if (seen > elements) return;
      const int shift = static_cast<int>(4 * (pos % kPer));
      const uint64_t v = LoadElement<W>(tensor, first + e);
      const uint64_t nibble = ((v >> shift) - delta) & 15;
      StoreElement<W>(tensor, first + e, (v & ~(uint64_t{15} << shift)) | (nibble << shift));
    }).IgnoreError();  // as far as it decodes: the changes written came from the same bytes
  }
}

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
    const uint64_t first = RecordFirst(r, mt);
    uint64_t sum[4] = {};
    uint64_t n = 0;
    // A CONTEXT decoder reads a block's base before it emits a change
    // there, and a nibble-coded element is read before it is passed on, so
    // writing each change as it comes is safe (context_codec.h).
    Status st = DecodeElementChanges<W>(r, mt, data, [&](uint64_t pos, uint64_t delta) {
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

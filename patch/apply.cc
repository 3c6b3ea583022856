// Decoding side: Inspect, Apply (verify-then-write, or write-while-verifying
// on an exclusive view). Squash is in squash.cc.
#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <optional>

#include <sys/mman.h>

#include "tern/thread_pool.h"
#include "patch/apply_internal.h"
#include "patch/apply_record.h"
#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"
#include "tern/patch.h"

namespace tern {
namespace {

using patch::ParsedPatch;
using patch::RecordView;

Status RecordContext(const Status& s, const ParsedPatch& p, const RecordView& r) {
  return patch::RecordContext(s, p.tensors, r);
}

using patch::ForEachRecord;

// Decoded changes are handled in batches so the view's cache lines can be
// prefetched ahead: at 1% density every change touches a new line, and
// without prefetch the loop runs at memory latency, not bandwidth.
class ChangeBatch {
 public:
  static constexpr int kSize = 256;
  static constexpr int kAhead = 16;
  template <class Addr, class Fn>
  void Flush(Addr&& address_of, Fn&& fn, bool for_write) {
    for (int i = 0; i < n_ && i < kAhead; ++i) Prefetch(address_of(pos_[i]), for_write);
    for (int i = 0; i < n_; ++i) {
      if (i + kAhead < n_) Prefetch(address_of(pos_[i + kAhead]), for_write);
      fn(pos_[i], delta_[i]);
    }
    n_ = 0;
  }
  bool Push(uint64_t pos, uint64_t delta) {
    pos_[n_] = pos;
    delta_[n_] = delta;
    return ++n_ == kSize;
  }

 private:
  static void Prefetch(const void* p, bool for_write) {
    if (for_write) __builtin_prefetch(p, 1);
    else __builtin_prefetch(p, 0);
  }
  uint64_t pos_[kSize];
  uint64_t delta_[kSize];
  int n_ = 0;
};

// How many staged changes ahead to prefetch: ~one memory latency of work.
constexpr uint64_t kPrefetchAhead = 32;

// The base digest plus every record's digest change must be the target.
constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

Status CheckTarget(const ParsedPatch& p, const std::vector<ViewDigest>& partial, ViewDigest* target) {
  ViewDigest sum = p.base_digest;
  for (const ViewDigest& d : partial) sum += d;
  TERN_REQUIRE(sum == p.target_digest, kCorrupt, "patch does not produce its target digest (", sum.ToString(),
               " instead of ", p.target_digest.ToString(), "); view left unchanged");
  *target = sum;
  return Status::Ok();
}

}  // namespace

Result<PatchInfo> Inspect(std::span<const uint8_t> patch) {
  TERN_ASSIGN_OR_RETURN(ParsedPatch p, patch::ParsePatch(patch));
  PatchInfo info = patch::HeadInfo(p);
  info.patch_bytes = p.total_bytes;
  for (const RecordView& r : p.records) {
    // CONTEXT positions are class ranks: without the base only their streams
    // can be checked (the rest is checked when the record is applied).
    const patch::ManifestTensor& mt = p.tensors[r.h.tensor_index];
    uint64_t changed = r.h.changed_count;
    Status s;
    if (r.h.encoding == patch::kContext) {
      s = patch::ValidateContextStreams(r, mt.code_bits);
    } else if (mt.nibbles) {
      auto elements = patch::RecordChangedElements(r, mt);  // decodes the streams
      s = elements.status();
      if (s.ok()) changed = *elements;
    } else {
      s = patch::DecodeRecord(r, mt.code_bits, [](uint64_t, uint64_t) {});
    }
    if (!s.ok()) return RecordContext(s, p, r);
    TensorPatchInfo& t = info.tensors[r.h.tensor_index];
    t.changed_elements += changed;
    t.segments++;
    t.sparse_segments += r.h.encoding == patch::kSparse;
    t.dense_segments += r.h.encoding == patch::kDense;
    t.raw_segments += r.h.encoding == patch::kRaw;
    t.context_segments += r.h.encoding == patch::kContext;
    t.position_bytes += r.h.position_bytes;
    t.value_bytes += r.h.value_bytes;
    t.header_bytes += sizeof(patch::RecordHeader) + r.h.table_bytes + patch::kChecksumBytes;
  }
  for (const TensorPatchInfo& t : info.tensors) {
    info.changed_elements += t.changed_elements;
    info.segments += t.segments;
    info.position_bytes += t.position_bytes;
    info.value_bytes += t.value_bytes;
    info.header_bytes += t.header_bytes;
  }
  return info;
}

Status Apply(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
             ThreadPool& pool, ViewDigest* new_digest) {
  return Apply(view, patch, current_digest, pool, ApplyOptions{}, new_digest);
}

Status Apply(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
             ThreadPool& pool, const ApplyOptions& options, ViewDigest* new_digest) {
  TERN_ASSIGN_OR_RETURN(ParsedPatch p, patch::ParsePatch(patch));
  return patch::ApplyParsed(view, p, current_digest, pool, options, new_digest);
}

namespace patch {

ChangeArena::ChangeArena(const ParsedPatch& p) : start_(p.records.size()) {
  uint64_t total = 0;
  for (size_t k = 0; k < p.records.size(); ++k) {
    start_[k] = total;
    total += p.records[k].h.changed_count;  // each <= 2^24, records <= patch bytes / 56
  }
  const uint64_t position_bytes = (total * sizeof(uint32_t) + 63) / 64 * 64;
  bytes_ = std::max<uint64_t>(64, position_bytes + total * sizeof(uint64_t));
  const bool huge = bytes_ >= kHugePageBytes;
  if (huge) bytes_ = (bytes_ + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  memory_ = static_cast<uint8_t*>(::operator new(bytes_, std::align_val_t{huge ? kHugePageBytes : 64}));
#if defined(MADV_HUGEPAGE)
  // Advice only: where the kernel has no huge page to give, 4 KiB pages.
  if (huge) ::madvise(memory_, bytes_, MADV_HUGEPAGE);
#endif
  positions_ = reinterpret_cast<uint32_t*>(memory_);
  values_ = reinterpret_cast<uint64_t*>(memory_ + position_bytes);
}

ChangeArena::~ChangeArena() {
  ::operator delete(memory_, std::align_val_t{bytes_ >= kHugePageBytes ? kHugePageBytes : 64});
}

PatchInfo HeadInfo(const ParsedPatch& p) {
  PatchInfo info;
  info.format_version = p.format_version;
  info.base_version = p.base_version;
  info.target_version = p.target_version;
  info.base_digest = p.base_digest;
  info.target_digest = p.target_digest;
  info.container_bytes = p.container_bytes;
  for (const auto& mt : p.tensors) {
    TensorPatchInfo t;
    t.name = mt.desc.name;
    t.dtype = mt.desc.dtype;
    t.shape = mt.desc.shape;
    t.elements = mt.elements;
    t.nibbles = mt.nibbles;
    info.elements += mt.elements;
    info.tensors.push_back(std::move(t));
  }
  return info;
}

Result<std::vector<uint64_t>> PrepareView(const MutableServeView& view, const ParsedPatch& p,
                                          const ViewDigest& current_digest) {
  std::vector<const TensorDesc*> descs;
  for (const auto& t : view.tensors) descs.push_back(t.desc);
  TERN_RETURN_IF_ERROR(patch::CheckLayout(p.tensors, descs));
  TERN_REQUIRE(current_digest == p.base_digest, kMismatch, "wrong base: the view is ", current_digest.ToString(),
               ", the patch applies to ", p.base_digest.ToString());
  std::vector<uint64_t> seeds(p.tensors.size());
  for (size_t t = 0; t < seeds.size(); ++t) seeds[t] = TensorSeed(p.tensors[t].desc);
  return seeds;
}

Status ApplyParsed(MutableServeView& view, const ParsedPatch& patch, const ViewDigest& current_digest,
                   ThreadPool& pool, const ApplyOptions& options, ViewDigest* new_digest) {
  if (options.exclusive_view) return ApplyExclusive(view, patch, current_digest, pool, new_digest);
  return ApplyWithStaging(view, patch, current_digest, pool, new_digest, kApplyStagingBytes);
}

Status ApplyWithStaging(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                        ThreadPool& pool, ViewDigest* new_digest, uint64_t staging_bytes_max) {
  TERN_ASSIGN_OR_RETURN(ParsedPatch p, ParsePatch(patch));
  return ApplyWithStaging(view, p, current_digest, pool, new_digest, staging_bytes_max);
}

Status ApplyWithStaging(MutableServeView& view, const ParsedPatch& p, const ViewDigest& current_digest,
                        ThreadPool& pool, ViewDigest* new_digest, uint64_t staging_bytes_max) {
  TERN_ASSIGN_OR_RETURN(const std::vector<uint64_t> seeds, PrepareView(view, p, current_digest));

  // Pass 1: decode everything and compute the target digest from the changes
  // alone. Nothing is written until it matches. When the decoded changes fit
  // the staging budget they are kept (position, new value), so pass 2 only
  // stores; otherwise pass 2 decodes again (memory stays O(1) per thread).
  uint64_t staged_changes = 0;
  for (const RecordView& r : p.records) staged_changes += r.h.changed_count;  // each <= 2^24
  const bool staging = staged_changes <= staging_bytes_max / kStagedChangeBytes;
  std::optional<ChangeArena> staged;  // each record's changes: position in the segment, new value
  if (staging) staged.emplace(p);
  std::vector<ViewDigest> partial(p.records.size());
  // Changes staged per record: its changed_count, or fewer for a
  // nibble-coded record (an element's nibbles fold into one change).
  std::vector<uint64_t> staged_count(staging ? p.records.size() : 0);
  TERN_RETURN_IF_ERROR(ForEachRecord(p, pool, [&](uint64_t k) {
    const RecordView& r = p.records[k];
    const patch::ManifestTensor& mt = p.tensors[r.h.tensor_index];
    const uint8_t* data = view.tensors[r.h.tensor_index].data;
    const uint64_t seed = seeds[r.h.tensor_index];
    const uint64_t first = patch::RecordFirst(r, mt);
    uint64_t* acc = partial[k].lanes.data();
    return patch::DispatchWidth(p.tensors[r.h.tensor_index].width_bits, [&]<int W>() -> Status {
      constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
      uint64_t sum[4] = {};
      if (staging) {
        // Fused decode and digest: each decoded change's line is prefetched
        // at once and its old value consumed kPrefetchAhead changes later,
        // so the memory latency hides behind the decoding work instead of
        // adding to it.
        const uint64_t cap = r.h.changed_count;  // a corrupt stream may yield more: the decoder rejects it
        uint32_t* pos = staged->positions(k);
        uint64_t* value = staged->values(k);
        const uint8_t* base = data + first * W / 8;
        uint64_t n = 0, done = 0;
        uintptr_t last_line = 0;
        auto consume = [&](uint64_t j) {
          const uint64_t old_value = patch::LoadElement<W>(data, first + pos[j]);
          const uint64_t new_value = (old_value + value[j]) & kMask;
          patch::AddElementChange(seed, first + pos[j], old_value, new_value, sum);
          value[j] = new_value;
        };
        TERN_RETURN_IF_ERROR(patch::DecodeElementChanges<W>(
            r, mt, data,
            [&](uint64_t p_in_seg, uint64_t delta) {
              if (n < cap) {
                pos[n] = static_cast<uint32_t>(p_in_seg);
                value[n] = delta;
                // One prefetch per cache line: repeats would only occupy
                // the miss queue that the other lines are waiting for.
                const uint8_t* line = base + p_in_seg * W / 8;
                if ((reinterpret_cast<uintptr_t>(line) >> 6) != last_line) {
                  __builtin_prefetch(line, 0);
                  last_line = reinterpret_cast<uintptr_t>(line) >> 6;
                }
                if (n >= kPrefetchAhead) consume(done++);
              }
              ++n;
            }));
        TERN_ASSERT(n == cap || (mt.nibbles && n < cap), "decoder accepted a wrong changed count");
        staged_count[k] = n;
        while (done < n) consume(done++);
        for (int l = 0; l < 4; ++l) acc[l] = sum[l];
        return Status::Ok();
      }
      ChangeBatch batch;
      auto address = [&](uint64_t pos) { return data + (first + pos) * W / 8; };
      auto add = [&](uint64_t pos, uint64_t delta) {
        const uint64_t old_value = patch::LoadElement<W>(data, first + pos);
        const uint64_t new_value = (old_value + delta) & kMask;
        patch::AddElementChange(seed, first + pos, old_value, new_value, sum);
      };
      Status s = patch::DecodeElementChanges<W>(r, mt, data, [&](uint64_t pos, uint64_t delta) {
        if (batch.Push(pos, delta)) batch.Flush(address, add, false);
      });
      batch.Flush(address, add, false);
      for (int l = 0; l < 4; ++l) acc[l] = sum[l];
      return s;
    });
  }));
  ViewDigest target;
  TERN_RETURN_IF_ERROR(CheckTarget(p, partial, &target));

  if (staging) {
    // Last in, first out: pass 1 walked the view forward, so the lines it
    // touched last are the ones still in cache. Writing from the end back to
    // the start reuses whatever of them is still in L3 (at 1% density pass 1
    // touches ~27% of a BF16 view's lines).
    const uint64_t records = p.records.size();
    pool.ParallelFor(records, [&](uint64_t rk) {
      const uint64_t k = records - 1 - rk;
      const RecordView& r = p.records[k];
      uint8_t* data = view.tensors[r.h.tensor_index].data;
      const uint64_t first = patch::RecordFirst(r, p.tensors[r.h.tensor_index]);
      patch::DispatchWidth(p.tensors[r.h.tensor_index].width_bits, [&]<int W>() {
        const uint32_t* pos = staged->positions(k);
        const uint64_t* value = staged->values(k);
        uint8_t* base = data + first * W / 8;
        for (uint64_t j = staged_count[k]; j-- > 0;) {
          if (j >= kPrefetchAhead)
            __builtin_prefetch(base + uint64_t{pos[j - kPrefetchAhead]} * W / 8, 1);
          patch::StoreElement<W>(data, first + pos[j], value[j]);
        }
      });
    });
    if (new_digest) *new_digest = target;
    return Status::Ok();
  }

  // Pass 2: the same, already validated, bytes again; now write.
  Status written = ForEachRecord(p, pool, [&](uint64_t k) {
    const RecordView& r = p.records[k];
    const patch::ManifestTensor& mt = p.tensors[r.h.tensor_index];
    uint8_t* data = view.tensors[r.h.tensor_index].data;
    const uint64_t first = patch::RecordFirst(r, mt);
    return patch::DispatchWidth(mt.width_bits, [&]<int W>() {
      constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
      ChangeBatch batch;
      auto address = [&](uint64_t pos) { return data + (first + pos) * W / 8; };
      auto write = [&](uint64_t pos, uint64_t delta) {
        const uint64_t i = first + pos;
        patch::StoreElement<W>(data, i, (patch::LoadElement<W>(data, i) + delta) & kMask);
      };
      // A CONTEXT record reads each block's base before it emits a change
      // there, and a nibble-coded element is read before it is passed on, so
      // writing the changes already passed is safe (DecodeElementChanges).
      Status s = patch::DecodeElementChanges<W>(r, mt, data, [&](uint64_t pos, uint64_t delta) {
        if (batch.Push(pos, delta)) batch.Flush(address, write, true);
      });
      batch.Flush(address, write, true);
      return s;
    });
  });
  TERN_ASSERT(written.ok(), "validated patch failed to decode on the write pass: ", written.ToString());
  if (new_digest) *new_digest = target;
  return Status::Ok();
}

namespace {

// Decodes record r and passes each change to fn(position, delta) kRing
// changes after prefetching its line for write, so the misses overlap the
// decoding instead of adding to it; the write then hits the line the read
// just brought in. At most `limit` changes are passed on; *passed counts them.
// A decode error before `limit` changes drops the changes still in the ring
// (an error after them does not matter: they decoded). O(1) memory.
template <int W, class Fn>
Status DecodePrefetched(const RecordView& r, const ManifestTensor& mt, const uint8_t* tensor, uint64_t limit,
                        uint64_t* passed, Fn&& fn) {
  const uint8_t* segment = tensor + RecordFirst(r, mt) * W / 8;
  constexpr uint64_t kRing = kPrefetchAhead;
  static_assert((kRing & (kRing - 1)) == 0);
  uint32_t ring_pos[kRing];  // relative to the segment: < 2^24
  uint64_t ring_delta[kRing];
  uint64_t n = 0, done = 0;
  uintptr_t last_line = ~uintptr_t{0};
  // Not CONTEXT (those go through ApplyExclusiveKeepingChanges). A
  // nibble-coded element is read before it is passed on, and written only
  // kRing changes later.
  Status s = DecodeElementChanges<W>(r, mt, tensor, [&](uint64_t pos, uint64_t delta) {
    if (n >= limit) return;
    if (n >= kRing) {
      fn(ring_pos[done % kRing], ring_delta[done % kRing]);
      ++done;
    }
    ring_pos[n % kRing] = static_cast<uint32_t>(pos);
    ring_delta[n % kRing] = delta;
    const uint8_t* at = segment + pos * W / 8;
    if ((reinterpret_cast<uintptr_t>(at) >> 6) != last_line) {  // one prefetch per line (see the staged path)
      __builtin_prefetch(at, 1);
      last_line = reinterpret_cast<uintptr_t>(at) >> 6;
    }
    ++n;
  });
  if (s.ok() || n == limit)
    for (; done < n; ++done) fn(ring_pos[done % kRing], ring_delta[done % kRing]);
  *passed = done;
  return s;
}

// Subtracts the first applied[k] changes of every record k from the view,
// which undoes them exactly: each element is written at most once (positions
// strictly increase within a record, records never overlap) and
// (old + delta) - delta == old mod 2^w, so the order does not matter either.
// Records are walked last to first, the lines written last being the ones
// most likely still cached. Only runs on a failing apply.
void UndoChanges(MutableServeView& view, const ParsedPatch& p, const std::vector<uint64_t>& applied,
                 ThreadPool& pool) {
  const uint64_t records = p.records.size();
  pool.ParallelFor(records, [&](uint64_t rk) {
    const uint64_t k = records - 1 - rk;
    if (applied[k] == 0) return;
    const RecordView& r = p.records[k];
    const ManifestTensor& mt = p.tensors[r.h.tensor_index];
    uint8_t* data = view.tensors[r.h.tensor_index].data;
    const uint64_t first = RecordFirst(r, mt);
    uint64_t undone = 0;
    DispatchWidth(mt.width_bits, [&]<int W>() {
      constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
      if (mt.nibbles) {
        UndoNibbleChanges<W>(r, data, applied[k]);
        undone = applied[k];
        return;
      }
      // The decode is deterministic: it yields the same leading changes that
      // were applied before it failed (if it did); that status is known.
      DecodePrefetched<W>(r, mt, data, applied[k], &undone, [&](uint64_t pos, uint64_t delta) {
        const uint64_t i = first + pos;
        StoreElement<W>(data, i, (LoadElement<W>(data, i) - delta) & kMask);
      }).IgnoreError();
    });
    TERN_ASSERT(undone == applied[k], "undo decoded ", undone, " changes, ", applied[k], " were applied");
  });
}

}  // namespace

Status ApplyExclusive(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                      ThreadPool& pool, ViewDigest* new_digest) {
  TERN_ASSIGN_OR_RETURN(ParsedPatch p, ParsePatch(patch));
  return ApplyExclusive(view, p, current_digest, pool, new_digest);
}

namespace {

// The exclusive path for patches with CONTEXT records. Undoing a CONTEXT
// record by decoding it again would need its base, which the writes changed,
// so every written change is also kept (position, delta) and a failure
// subtracts the kept deltas. Memory as the staging path's; over its budget,
// verify-then-write instead (same result and errors).
Status ApplyExclusiveKeepingChanges(MutableServeView& view, const ParsedPatch& p, const ViewDigest& current_digest,
                                    ThreadPool& pool, ViewDigest* new_digest) {
  uint64_t changes = 0;
  for (const RecordView& r : p.records) changes += r.h.changed_count;
  if (changes > kApplyStagingBytes / kStagedChangeBytes)
    return ApplyWithStaging(view, p, current_digest, pool, new_digest, kApplyStagingBytes);
  TERN_ASSIGN_OR_RETURN(const std::vector<uint64_t> seeds, PrepareView(view, p, current_digest));
  ChangeArena kept(p);  // each record's written changes: position in the segment, delta
  std::vector<uint64_t> written(p.records.size(), 0);
  std::vector<ViewDigest> partial(p.records.size());
  Status s = ForEachRecord(p, pool, [&](uint64_t k) {
    const RecordView& r = p.records[k];
    const ManifestTensor& mt = p.tensors[r.h.tensor_index];
    uint8_t* data = view.tensors[r.h.tensor_index].data;
    const uint64_t seed = seeds[r.h.tensor_index];
    uint32_t* kept_pos = kept.positions(k);
    uint64_t* kept_delta = kept.values(k);
    uint64_t& n = written[k];
    return WriteRecord(r, mt, data, seed, &partial[k], [&](uint64_t pos, uint64_t delta) {
      kept_pos[n] = static_cast<uint32_t>(pos);  // WriteRecord passes at most changed_count changes
      kept_delta[n] = delta;
      ++n;
    });
  });
  ViewDigest target;
  if (s.ok()) s = CheckTarget(p, partial, &target);
  if (!s.ok()) {
    // Each element was written at most once, so subtracting restores it, in any order.
    pool.ParallelFor(p.records.size(), [&](uint64_t k) {
      const RecordView& r = p.records[k];
      uint8_t* data = view.tensors[r.h.tensor_index].data;
      const uint64_t first = RecordFirst(r, p.tensors[r.h.tensor_index]);
      DispatchWidth(p.tensors[r.h.tensor_index].width_bits, [&]<int W>() {
        constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
        const uint32_t* pos = kept.positions(k);
        const uint64_t* delta = kept.values(k);
        for (uint64_t j = 0; j < written[k]; ++j) {
          const uint64_t i = first + pos[j];
          StoreElement<W>(data, i, (LoadElement<W>(data, i) - delta[j]) & kMask);
        }
      });
    });
    return s;
  }
  if (new_digest) *new_digest = target;
  return Status::Ok();
}

}  // namespace

Status ApplyExclusive(MutableServeView& view, const ParsedPatch& p, const ViewDigest& current_digest,
                      ThreadPool& pool, ViewDigest* new_digest) {
  for (const RecordView& r : p.records)
    if (r.h.encoding == kContext) return ApplyExclusiveKeepingChanges(view, p, current_digest, pool, new_digest);
  TERN_ASSIGN_OR_RETURN(const std::vector<uint64_t> seeds, PrepareView(view, p, current_digest));
  std::vector<ViewDigest> partial(p.records.size());
  std::vector<uint64_t> applied(p.records.size(), 0);  // changes written, per record: what a failure undoes
  Status s = ForEachRecord(p, pool, [&](uint64_t k) {
    const RecordView& r = p.records[k];
    const ManifestTensor& mt = p.tensors[r.h.tensor_index];
    uint8_t* data = view.tensors[r.h.tensor_index].data;
    const uint64_t seed = seeds[r.h.tensor_index];
    const uint64_t first = RecordFirst(r, mt);
    return DispatchWidth(mt.width_bits, [&]<int W>() -> Status {
      constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
      uint64_t sum[4] = {};
      // Read, hash and write each change in one visit to its line. A failing
      // record keeps what it wrote (counted in applied[k]) for UndoChanges.
      Status st = DecodePrefetched<W>(r, mt, data, ~uint64_t{0}, &applied[k],
                                      [&](uint64_t pos, uint64_t delta) {
                                        const uint64_t i = first + pos;
                                        const uint64_t old_value = LoadElement<W>(data, i);
                                        const uint64_t new_value = (old_value + delta) & kMask;
                                        AddElementChange(seed, i, old_value, new_value, sum);
                                        StoreElement<W>(data, i, new_value);
                                      });
      for (int l = 0; l < 4; ++l) partial[k].lanes[l] = sum[l];
      return st;
    });
  });
  ViewDigest target;
  if (s.ok()) s = CheckTarget(p, partial, &target);
  if (!s.ok()) {
    UndoChanges(view, p, applied, pool);
    return s;
  }
  if (new_digest) *new_digest = target;
  return Status::Ok();
}

}  // namespace patch

Result<uint64_t> VerifiedPrefixBytes(std::span<const uint8_t> prefix) {
  return patch::ParsePrefix(prefix);
}

}  // namespace tern

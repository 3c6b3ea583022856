// PatchStreamApply (include/tern/patch.h): records written as their bytes
// complete, the target digest checked at the end. The view is exclusive and
// discarded on error, so each change is read, hashed and written in one
// visit and nothing is kept for an undo.
#include <atomic>

#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/digest_mix.h"
#include "patch/element_access.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {

using patchfmt::NextRecordResult;
using patchfmt::ParsedPatch;
using patchfmt::RecordCursor;
using patchfmt::RecordView;

struct PatchStreamApply::Impl {
  MutableServeView& view;
  const ViewDigest base;
  ThreadPool& pool;
  Status error;  // sticky: the first error
  bool started = false;
  ParsedPatch head;  // header and manifest (records are not kept: they point into old prefixes)
  std::vector<uint64_t> seeds;  // per tensor
  RecordCursor cursor;          // the next record to write
  // Per record written: where it was and its checksum (Finish compares),
  // and its digest change (Finish sums).
  std::vector<uint64_t> offsets, checksums;
  std::vector<ViewDigest> partial;

  Impl(MutableServeView& v, const ViewDigest& d, ThreadPool& p) : view(v), base(d), pool(p) {}

  Status Start(std::span<const uint8_t> prefix) {
    uint64_t records_at = 0;
    TERN_ASSIGN_OR_RETURN(bool complete, patchfmt::ParseHead(prefix, &head, &records_at));
    if (!complete) return Status::Ok();
    std::vector<const TensorDesc*> descs;
    for (const auto& t : view.tensors) descs.push_back(t.desc);
    TERN_RETURN_IF_ERROR(patchfmt::CheckLayout(head.tensors, descs));
    TERN_REQUIRE(base == head.base_digest, kMismatch, "wrong base: the view is ", base.ToString(),
                 ", the patch applies to ", head.base_digest.ToString());
    seeds.resize(head.tensors.size());
    for (size_t t = 0; t < seeds.size(); ++t) seeds[t] = TensorSeed(head.tensors[t].desc);
    cursor.at = records_at;
    started = true;
    return Status::Ok();
  }

  // Writes `records` (complete, checked framing) in parallel; their digest
  // changes go to partial[first ...].
  Status Write(const std::vector<RecordView>& records, size_t first) {
    std::vector<Status> errors(records.size());
    std::atomic<bool> failed{false};
    pool.ParallelFor(records.size(), [&](uint64_t k) {
      const RecordView& r = records[k];
      const patchfmt::ManifestTensor& mt = head.tensors[r.h.tensor_index];
      uint8_t* data = view.tensors[r.h.tensor_index].data;
      const uint64_t seed = seeds[r.h.tensor_index];
      const uint64_t first_element = r.h.first_element;
      errors[k] = patchfmt::DispatchWidth(mt.width_bits, [&]<int W>() -> Status {
        constexpr uint64_t kMask = W == 64 ? ~uint64_t{0} : (uint64_t{1} << W) - 1;
        uint64_t sum[4] = {};
        uint64_t n = 0;
        // A CONTEXT decoder reads a block's base before it emits a change
        // there, so writing each change as it comes is safe (context_codec.h).
        Status st =
            patchfmt::DecodeRecordOnBase(r, W, data, mt.context, [&](uint64_t pos, uint64_t delta) {
              if (n++ == r.h.changed_count)
                return;  // a corrupt stream may yield more: the decoder rejects it
              const uint64_t i = first_element + pos;
              const uint64_t old_value = patchfmt::LoadElement<W>(data, i);
              const uint64_t new_value = (old_value + delta) & kMask;
              patchfmt::AddElementChange(seed, i, old_value, new_value, sum);
              patchfmt::StoreElement<W>(data, i, new_value);
            });
        for (int l = 0; l < 4; ++l) partial[first + k].lanes[l] = sum[l];
        return st;
      });
      if (!errors[k].ok()) failed.store(true, std::memory_order_relaxed);
    });
    if (failed.load())
      for (size_t k = 0; k < records.size(); ++k)
        if (!errors[k].ok())
          return errors[k].WithContext(
              "tensor '" + head.tensors[records[k].h.tensor_index].desc.name +
              "' segment at element " + std::to_string(records[k].h.first_element));
    return Status::Ok();
  }

  // Writes every record complete in `in` past the cursor; *end: all written.
  Status WriteAvailable(std::span<const uint8_t> in, bool* end) {
    std::vector<RecordView> batch;
    *end = false;
    for (;;) {
      RecordView rec;
      const uint64_t at = cursor.at;
      TERN_ASSIGN_OR_RETURN(NextRecordResult next, patchfmt::NextRecord(in, head, &cursor, &rec));
      if (next == NextRecordResult::kEnd) *end = true;
      if (next != NextRecordResult::kRecord) break;
      batch.push_back(rec);
      offsets.push_back(at);
      checksums.push_back(rec.checksum);
    }
    const size_t first = partial.size();
    partial.resize(first + batch.size());
    return Write(batch, first);
  }

  Status Feed(std::span<const uint8_t> prefix) {
    if (!started) TERN_RETURN_IF_ERROR(Start(prefix));
    if (!started) return Status::Ok();
    bool end = false;
    return WriteAvailable(prefix, &end);
  }

  Status Finish(std::span<const uint8_t> patch, ViewDigest* new_digest) {
    TERN_RETURN_IF_ERROR(Feed(patch));
    TERN_ASSIGN_OR_RETURN(ParsedPatch whole, patchfmt::ParsePatch(patch));
    TERN_REQUIRE(started, kCorrupt, "patch: header incomplete");  // ParsePatch would have said so
    TERN_REQUIRE(
        whole.base_digest == head.base_digest && whole.target_digest == head.target_digest &&
            whole.base_version == head.base_version && whole.target_version == head.target_version,
        kMismatch, "not the patch that was fed: its manifest differs");
    TERN_REQUIRE(whole.records.size() == partial.size(), kMismatch, "streamed ", partial.size(),
                 " records, the patch has ", whole.records.size());
    for (size_t k = 0; k < whole.records.size(); ++k) {
      // A record's table follows its fixed header.
      const uint64_t at = static_cast<uint64_t>(whole.records[k].table - patch.data()) -
                          sizeof(patchfmt::RecordHeader);
      TERN_REQUIRE(at == offsets[k], kMismatch, "record ", k, " is at ", at,
                   ", it was streamed from ", offsets[k]);
      TERN_REQUIRE(whole.records[k].checksum == checksums[k], kMismatch, "record ", k,
                   " differs from the one streamed: not the patch that was fed");
    }
    ViewDigest sum = head.base_digest;
    for (const ViewDigest& d : partial) sum += d;
    TERN_REQUIRE(sum == whole.target_digest, kCorrupt, "patch does not produce its target digest (",
                 sum.ToString(), " instead of ", whole.target_digest.ToString(),
                 "); the view must be discarded");
    if (new_digest) *new_digest = sum;
    return Status::Ok();
  }
};

Result<std::optional<PatchInfo>> InspectHead(std::span<const uint8_t> prefix) {
  ParsedPatch head;
  uint64_t records_at = 0;
  TERN_ASSIGN_OR_RETURN(bool complete, patchfmt::ParseHead(prefix, &head, &records_at));
  if (!complete) return std::optional<PatchInfo>();
  PatchInfo info;
  info.format_version = head.format_version;
  info.base_version = head.base_version;
  info.target_version = head.target_version;
  info.base_digest = head.base_digest;
  info.target_digest = head.target_digest;
  info.container_bytes = head.container_bytes;
  for (const auto& mt : head.tensors) {
    TensorPatchInfo t;
    t.name = mt.desc.name;
    t.dtype = mt.desc.dtype;
    t.shape = mt.desc.shape;
    t.elements = mt.elements;
    info.elements += mt.elements;
    info.tensors.push_back(std::move(t));
  }
  return std::optional<PatchInfo>(std::move(info));
}

PatchStreamApply::PatchStreamApply(MutableServeView& view, const ViewDigest& current_digest,
                                   ThreadPool& pool)
    : impl_(std::make_unique<Impl>(view, current_digest, pool)) {}
PatchStreamApply::~PatchStreamApply() = default;

Status PatchStreamApply::Feed(std::span<const uint8_t> prefix) {
  if (impl_->error.ok()) impl_->error = impl_->Feed(prefix);
  return impl_->error;
}

Status PatchStreamApply::Finish(std::span<const uint8_t> patch, ViewDigest* new_digest) {
  if (impl_->error.ok()) impl_->error = impl_->Finish(patch, new_digest);
  return impl_->error;
}

bool PatchStreamApply::started() const { return impl_->started; }
uint64_t PatchStreamApply::target_version() const { return impl_->head.target_version; }
uint64_t PatchStreamApply::records_written() const { return impl_->partial.size(); }

}  // namespace tern

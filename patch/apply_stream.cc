// PatchStreamApply (include/tern/patch.h): records written as their bytes
// complete, the target digest checked at the end. The view is exclusive and
// discarded on error, so each change is read, hashed and written in one
// visit and nothing is kept for an undo.
#include "patch/apply_record.h"
#include "patch/container.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {

using patch::NextRecordResult;
using patch::ParsedPatch;
using patch::RecordCursor;
using patch::RecordView;

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
    TERN_ASSIGN_OR_RETURN(bool complete, patch::ParseHead(prefix, &head, &records_at));
    if (!complete) return Status::Ok();
    TERN_ASSIGN_OR_RETURN(seeds, patch::PrepareView(view, head, base));
    cursor.at = records_at;
    started = true;
    return Status::Ok();
  }

  // Writes `records` (complete, checked framing) in parallel; their digest
  // changes go to partial[first ...].
  Status Write(const std::vector<RecordView>& records, size_t first) {
    return patch::ForEachRecord(records, head.tensors, pool, [&](uint64_t k) {
      const RecordView& r = records[k];
      return patch::WriteRecord(r, head.tensors[r.h.tensor_index],
                                view.tensors[r.h.tensor_index].data, seeds[r.h.tensor_index],
                                &partial[first + k], [](uint64_t, uint64_t) {});
    });
  }

  // Writes every record complete in `in` past the cursor; *end: all written.
  Status WriteAvailable(std::span<const uint8_t> in, bool* end) {
    std::vector<RecordView> batch;
    *end = false;
    for (;;) {
      RecordView rec;
      const uint64_t at = cursor.at;
      TERN_ASSIGN_OR_RETURN(NextRecordResult next, patch::NextRecord(in, head, &cursor, &rec));
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
    TERN_ASSIGN_OR_RETURN(ParsedPatch whole, patch::ParsePatch(patch));
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
                          sizeof(patch::RecordHeader);
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
  TERN_ASSIGN_OR_RETURN(bool complete, patch::ParseHead(prefix, &head, &records_at));
  if (!complete) return std::optional<PatchInfo>();
  PatchInfo info = patch::HeadInfo(head);
  // The manifest's record count per tensor: which tensors the patch changes
  // (the agent's served events name them) before any record is read.
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    info.tensors[i].segments = head.tensors[i].segment_count;
    info.segments += head.tensors[i].segment_count;
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

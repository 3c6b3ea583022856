// The tern patch codec: lossless, bit-exact patches between two serve views.
// Format: docs/format/patch.md ("tern patch format", versions 1 to 3).
//
// A patch holds, per tensor, segments (contiguous element ranges) of changes
// in bit-pattern space: delta = (new - old) mod 2^w on each element's raw
// w-bit pattern. The codec never does float math. Segments decode
// independently, so diff and apply run in parallel over a ThreadPool and
// trainer ranks can publish disjoint segments (EncodeSegment + PatchBuilder).
//
// Untrusted patch bytes are fully validated (checksums, bounds, canonical
// streams); bad input returns kCorrupt (damaged), kMismatch (well-formed but
// for another base/layout) or kUnsupported (newer format), never crashes.
//
// Thread safety: all functions are reentrant; a ThreadPool is used by one call
// at a time (see ThreadPool). PatchBuilder is not synchronized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tern/digest.h"
#include "tern/export.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

class ThreadPool;

// The format Diff, EncodeSegment and PatchBuilder write unless told otherwise.
inline constexpr uint16_t kDefaultPatchFormat = 2;

struct DiffOptions {
  // Elements per segment (the unit of parallelism and verification).
  // 1 .. 2^24 - 1; packed 4-bit tensors round an odd value up (byte-aligned
  // segments never share a byte, so parallel writers never race).
  uint64_t segment_elements = uint64_t{1} << 20;
  uint64_t base_version = 0;
  uint64_t target_version = 0;
  // Patch format to write (docs/format/patch.md): 1, or 2, whose segments
  // may code positions and values given the base view (CONTEXT), and whose
  // integer tensors are coded as nibbles where that is smaller (packed 4-bit
  // codes; the file then says version 3). Readers accept every version;
  // format 2 needs the base to squash (SquashOnBase).
  uint16_t format_version = kDefaultPatchFormat;
  // Format 2: whether integer tensors may be coded as nibbles where that is
  // smaller (version 3). False for a reader that takes versions 1 and 2
  // only (today's GPU apply, gpu/host/patch_walk.cc).
  bool nibble_coding = true;
  // Format 2: the most classes a CONTEXT segment may use, 2 .. 16. Fewer
  // decode and encode faster for a few percent more bytes (8 instead of 16
  // on datagen BF16: ~1% larger, decode ~20% faster; docs/benchmarks-journal.md).
  int max_context_classes = 16;
};

// old/new views must have identical tensor sets and layouts (kMismatch naming
// the tensor otherwise). base_digest: the old view's digest if known (trainers
// carry it forward; the patch names it as its base, unchecked), else computed
// here. old_digest: if not null, receives D(old_view) as the old bytes read
// (whatever base_digest says), so a caller can check that the view it holds
// is the one it names (the root's publish) without a second pass over it:
// each segment's old bytes are hashed as the compare reads them.
TERN_EXPORT Result<std::vector<uint8_t>> Diff(const ServeView& old_view, const ServeView& new_view,
                                              const DiffOptions& options, ThreadPool& pool,
                                              const ViewDigest* base_digest = nullptr,
                                              ViewDigest* old_digest = nullptr);

// ---- Multi-rank publishing -------------------------------------------------

// One encoded segment record plus what the builder needs to know about it.
struct SegmentRecord {
  std::vector<uint8_t> bytes;   // empty when the segment has no change
  uint32_t tensor_index = 0;    // index in the (name-sorted) view
  uint64_t first_element = 0;
  uint64_t element_count = 0;
  ViewDigest digest_delta;      // D(target) - D(base) contributed by this segment
};

// Encodes the changes of elements [first_element, first_element+element_count)
// of tensor `tensor_index` (same index in both views). Bounds as DiffOptions.
// format_version as DiffOptions; a format-2 record goes only into a
// format-2 PatchBuilder.
TERN_EXPORT Result<SegmentRecord> EncodeSegment(const ServeView& old_view, const ServeView& new_view,
                                                uint32_t tensor_index, uint64_t first_element,
                                                uint64_t element_count,
                                                uint16_t format_version = kDefaultPatchFormat);

// Assembles a patch from records produced anywhere (e.g. one per trainer
// rank). Records must be for disjoint ranges; they may arrive in any order.
// The target digest is the base digest plus every record's digest_delta.
class TERN_EXPORT PatchBuilder {
 public:
  // `layout`: the tensor table (names, dtypes, shapes); only descs are read.
  PatchBuilder(const ServeView& layout, uint64_t base_version, uint64_t target_version,
               const ViewDigest& base_digest, uint16_t format_version = kDefaultPatchFormat);
  Status Add(SegmentRecord record);
  // Sorts records, rejects overlaps (kInvalidArgument), writes the patch.
  Result<std::vector<uint8_t>> Finish();

 private:
  std::vector<TensorDesc> descs_;
  uint16_t format_version_;
  uint64_t base_version_, target_version_;
  ViewDigest base_digest_, target_digest_;
  std::vector<SegmentRecord> records_;
};

// ---- Inspection, apply, squash --------------------------------------------

struct TensorPatchInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t elements = 0;
  uint64_t changed_elements = 0;  // non-zero deltas
  uint64_t segments = 0;          // records in the patch (0: unchanged tensor)
  uint64_t sparse_segments = 0, dense_segments = 0, raw_segments = 0;
  uint64_t context_segments = 0;  // format 2: coded given the base
  // Format 3: the tensor's records code its bytes as packed 4-bit elements
  // (changed_elements still counts elements of its dtype).
  bool nibbles = false;
  uint64_t position_bytes = 0;    // positions streams
  uint64_t value_bytes = 0;       // values streams (+ RAW payloads)
  uint64_t header_bytes = 0;      // record headers, code tables, checksums
  uint64_t total_bytes() const { return position_bytes + value_bytes + header_bytes; }
  double bits_per_changed() const {
    return changed_elements ? 8.0 * static_cast<double>(total_bytes()) / changed_elements : 0.0;
  }
};

struct PatchInfo {
  uint16_t format_version = 0;
  uint64_t base_version = 0, target_version = 0;
  ViewDigest base_digest, target_digest;
  std::vector<TensorPatchInfo> tensors;  // manifest order (sorted by name)
  uint64_t container_bytes = 0;          // file header + manifest + trailer
  uint64_t patch_bytes = 0;              // the whole patch
  // Totals over tensors.
  uint64_t elements = 0, changed_elements = 0, segments = 0;
  uint64_t position_bytes = 0, value_bytes = 0, header_bytes = 0;
  double bits_per_changed() const {
    return changed_elements ? 8.0 * static_cast<double>(patch_bytes) / changed_elements : 0.0;
  }
};

// Validates the whole patch (checksums, every stream) without a view.
TERN_EXPORT Result<PatchInfo> Inspect(std::span<const uint8_t> patch);

struct ApplyOptions {
  // The caller promises that nothing else reads or writes the view's bytes
  // until Apply returns (a private staging copy: tern apply's output, an
  // agent's or a GPU's shadow buffer that is published only on success).
  // Apply then writes each change while it verifies, touching every changed
  // cache line once instead of twice, and on any error restores every element
  // it wrote before it returns: the view ends bit-identical to before and the
  // error is the one the default path returns. Meanwhile the view is partly
  // patched, which is why a shared view (read by a server while it applies)
  // must keep the default, verify-then-write. Spec: docs/format/patch.md §7.
  bool exclusive_view = false;
};

// Verifies current_digest == the patch's base digest (kMismatch), the view's
// layout against the manifest (kMismatch naming the tensor), decodes every
// segment and verifies the target digest from the changes alone, and only then
// writes the new values. On any error the view is untouched (with
// exclusive_view: unchanged once Apply returns). `new_digest` (optional)
// receives the target digest.
TERN_EXPORT Status Apply(MutableServeView& view, std::span<const uint8_t> patch,
                         const ViewDigest& current_digest, ThreadPool& pool,
                         ViewDigest* new_digest = nullptr);
TERN_EXPORT Status Apply(MutableServeView& view, std::span<const uint8_t> patch,
                         const ViewDigest& current_digest, ThreadPool& pool, const ApplyOptions& options,
                         ViewDigest* new_digest = nullptr);

// The header and manifest of a patch from its first bytes (versions,
// digests, format, tensor layout and each tensor's `segments`, the
// manifest's record count: non-zero exactly for the tensors the patch
// changes; nothing else counted): no value while
// `prefix` ends before them; kCorrupt/kUnsupported as Inspect.
TERN_EXPORT Result<std::optional<PatchInfo>> InspectHead(std::span<const uint8_t> prefix);

// Applies a patch while it arrives: each segment record is decoded and
// written as soon as its bytes are all there, so that when the last byte
// lands only the records still missing, the target-digest check and the
// caller's switch remain (the agent's cut-through apply, docs/agent/apply.md
// "Streaming apply"). Records are independent given the base: a CONTEXT
// record reads only its own segment's base.
//
// The view must be exclusive (ApplyOptions::exclusive_view) and, unlike
// Apply, it is NOT restored on error: after any error from Feed or Finish its
// bytes are unknown and the caller must discard it (the agent's spare is
// marked unusable first). Errors are sticky: every later call returns the
// first. The bytes fed must be authentic (the caller verified them, e.g. by
// SHA-256 against a signed root): each record's XXH3 still guards against
// damage, but the target digest is only checked by Finish, after the writes.
// The view, pool and patch bytes of a call are borrowed for that call; the
// view must stay the same object until Finish.
class TERN_EXPORT PatchStreamApply {
 public:
  PatchStreamApply(MutableServeView& view, const ViewDigest& current_digest, ThreadPool& pool);
  ~PatchStreamApply();
  PatchStreamApply(const PatchStreamApply&) = delete;
  PatchStreamApply& operator=(const PatchStreamApply&) = delete;

  // `prefix`: the first bytes of the patch, longer or as long as at the last
  // call, the same bytes at the same offsets (the buffer may move). Once the
  // header and manifest are in, checks the base digest and layout (kMismatch)
  // and then writes every record complete in `prefix` not yet written.
  Status Feed(std::span<const uint8_t> prefix);
  // The whole patch: parses and checks it as Apply does (trailer included),
  // checks that the records already written are its records (kMismatch),
  // writes the rest and verifies the target digest (kCorrupt).
  Status Finish(std::span<const uint8_t> patch, ViewDigest* new_digest = nullptr);
  // Header and manifest seen (base checked); what they say (only then).
  bool started() const;
  uint64_t target_version() const;
  uint64_t records_written() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// a->b, b->c, ... => a->z, exactly (deltas add mod 2^w), without the base.
// Layouts must match and digests chain (kMismatch otherwise). Writes format
// 1. A patch with CONTEXT segments (format 2) cannot be decoded without its
// base: kUnsupported, use SquashOnBase. A tensor every patch that changes
// it codes as nibbles (file version 3) stays nibble-coded, unless
// `nibble_coding` is false (readers that predate version 3): then
// kUnsupported too, and SquashOnBase with DiffOptions::nibble_coding off
// writes version 2.
TERN_EXPORT Result<std::vector<uint8_t>> Squash(std::span<const std::span<const uint8_t>> patches,
                                                ThreadPool& pool, bool nibble_coding = true);

// The same for patches of any format, given the first patch's base view:
// applies them in turn to a copy of `base` (one view of memory) and diffs the
// ends with `options` (versions are taken from the patches). Squashes are made
// where a base is held: the trainer side, or a relay that keeps a version.
TERN_EXPORT Result<std::vector<uint8_t>> SquashOnBase(const ServeView& base,
                                                      std::span<const std::span<const uint8_t>> patches,
                                                      const DiffOptions& options, ThreadPool& pool);

// For cut-through forwarding: the length of the longest prefix of `prefix`
// made of complete, checksum-verified units (file header, manifest, records,
// trailer). Forwarding only that much never passes on damaged bytes. Errors
// (kCorrupt) as soon as a complete unit fails its checks.
TERN_EXPORT Result<uint64_t> VerifiedPrefixBytes(std::span<const uint8_t> prefix);

}  // namespace tern

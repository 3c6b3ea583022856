// Publishing from trainer ranks: each rank diffs and encodes only the
// tensors (or row shards of tensors) it owns, against its own previous
// serve view of them, and hands the root a RankPart; the root commits one
// version once every rank's part is there (Agent::PublishRankPart). Full
// weights never travel. Spec: docs/agent/board.md §4b.
//
// A shard is an element range [first_element, first_element + element_count)
// of one tensor of the layout (a row shard of a row-major tensor: rows
// [r0, r1) are elements [r0 * row, r1 * row)); its bytes are that range,
// contiguous. Shards of all ranks must be disjoint and together cover every
// element of every tensor of the layout.
//
// RankPublisher keeps a copy of its shards' previous serve view (the
// all-zero view before the board's first version) and the additive digest
// terms of it (docs/format/patch.md "Digest": the sum of the element hashes
// over its shards), advanced by each committed part's digest deltas, so a
// publish hashes nothing but the changed elements. Encode cuts each shard
// into segments of segment_elements, encodes them (EncodeSegment, format 1
// or 2) and keeps the records (the changes, not a copy of the shards);
// Committed() applies them to the previous view once the root committed
// the version (a decode of the changes: cheaper than copying the shards,
// and the publisher holds one copy of its shards, not two), Abandon()
// drops them (the root refused or timed out: the previous view stays the
// root's).
//
// Errors: kInvalidArgument (rank >= world_size, a shard of an unknown
// tensor, out of the tensor's range, overlapping another of this rank's,
// bytes that are not the range's size, a null pointer, a segment_elements
// out of [1, 2^24), shards given to Encode that are not the ones Create
// named); kMismatch for a version not newer than the last committed, and
// for Resume of a publisher that has committed a version.
//
// Thread safety: one RankPublisher per rank, one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tern/digest.h"
#include "tern/export.h"
#include "tern/patch.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

struct RankShardRange {
  std::string tensor;
  uint64_t first_element = 0;
  uint64_t element_count = 0;
  bool operator==(const RankShardRange&) const = default;
};

// One shard's current serve-view bytes (Encode's input; borrowed for the call).
struct RankShard {
  RankShardRange range;
  const void* data = nullptr;  // `bytes` contiguous bytes of the range
  uint64_t bytes = 0;
};

// What a rank sends the root for one version.
struct RankPart {
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t base_version = 0;  // the version the rank's previous view is (0: the zero view)
  uint64_t version = 0;
  std::vector<TensorDesc> layout;      // the whole view's tensors, sorted by name (every rank the same)
  std::vector<RankShardRange> shards;  // what this rank owns (sorted by tensor, first element)
  std::vector<SegmentRecord> records;  // the changed segments only; tensor_index in the layout
  uint16_t format_version = kDefaultPatchFormat;
  // The sum of the element hashes over `shards` in the base and in the
  // target view (no TensorTerm): the root checks that the ranks' bases add
  // up to D(HEAD) and that each rank's target is its base plus its records'
  // deltas.
  ViewDigest base_terms, target_terms;
};

struct RankPublisherOptions {
  uint64_t segment_elements = uint64_t{1} << 20;
  uint16_t format_version = kDefaultPatchFormat;
};

class TERN_EXPORT RankPublisher {
 public:
  // `layout`: every tensor of the served view (names, dtypes, shapes), the
  // same on every rank; `shards`: the ranges this rank owns. The previous
  // view starts as zeros at version 0 (its digest terms hashed here once).
  static Result<std::unique_ptr<RankPublisher>> Create(uint32_t rank, uint32_t world_size,
                                                       std::vector<TensorDesc> layout,
                                                       std::vector<RankShardRange> shards,
                                                       const RankPublisherOptions& options = {});
  ~RankPublisher();

  // The part of `version` from the shards' current bytes (the same ranges
  // as Create's, any order). One Encode is pending at a time: a second
  // replaces the first.
  Result<RankPart> Encode(uint64_t version, const std::vector<RankShard>& shards);
  // The root committed the pending part: its records are applied to the
  // previous view, which is the part's version now. Fails (kInternal) only
  // if its own records cannot be applied (no memory, a bug); the publisher
  // then refuses every call, Resume included: make a new one and Resume
  // it from HEAD.
  Status Committed();
  // The root did not commit it: the previous view stays.
  void Abandon();
  // A rank whose process restarted mid-version rebuilds its previous view:
  // `base` holds this rank's shards (the ranges Create named, any order) as
  // of `base_version`, the board's HEAD, read from a view that serves it
  // (a member's slot, the root's DIR/current). Their digest terms are
  // hashed directly (one pass over the bytes, the view digest's vector
  // loop) and the bytes copied as the previous view; then
  // Encode(version, current) makes the part the root still gathers (the C
  // API's tern_rank_publisher_resume and Python's Publisher.resume send it
  // as a resume, which the root refuses with kMismatch when that version
  // is no longer open). Only a publisher
  // that has committed nothing (kMismatch otherwise: send its parts as
  // usual); kInvalidArgument for base_version 0 (a fresh publisher already
  // holds the zero view) or shards that are not the ones it owns.
  Status Resume(uint64_t base_version, const std::vector<RankShard>& base);
  // Resume with the base's bytes written by `fill` straight into the
  // previous view: called once per owned range, in the owned order (by
  // tensor, then first element), with the tensor's layout and a span of
  // the range's bytes to fill (what a rank fetches from the root:
  // FetchRankBase in tern/agent.h). A failed fill is returned and leaves
  // the publisher as it was (the zero view, version 0).
  using FillFn = std::function<Status(const TensorDesc& tensor, const RankShardRange& range,
                                      std::span<uint8_t> into)>;
  Status ResumeFrom(uint64_t base_version, const FillFn& fill);

  uint64_t version() const;  // of the previous view

  struct State;

 private:
  Status CanResume(uint64_t base_version) const;
  friend struct RankPublisherTestPeer;  // agent/board/rank_publish_testing.h
  explicit RankPublisher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The root's side, without the agent (agent/board/rank_parts.h wraps it):
// checks that `parts` are one part of each rank 0..world_size-1 for
// base_version -> version, that their shards are in `layout` (sorted by
// name, as a ServeView), disjoint and cover it, that the ranks' base terms
// add up to base_digest and each rank's target terms are its base plus its
// deltas; then builds the patch (PatchBuilder), whose target digest is
// returned in *target_digest. Every refusal names the rank, and the tensor
// where there is one: kInvalidArgument for an unknown rank, a rank twice,
// mixed world sizes or versions, an unknown tensor, a range out of bounds,
// overlapping shards, elements no rank covers, a record outside its rank's
// shards; kMismatch for digest terms that do not add up.
TERN_EXPORT Result<std::vector<uint8_t>> AssembleRankParts(const std::vector<TensorDesc>& layout,
                                                           uint64_t base_version, uint64_t version,
                                                           const ViewDigest& base_digest,
                                                           const std::vector<RankPart>& parts,
                                                           uint32_t world_size,
                                                           ViewDigest* target_digest);

// ---- The wire form of a RankPart (docs/format/agent.md §11): what a rank
// in another process sends the root's POST /publish/rank-part. ----

inline constexpr uint64_t kMaxRankPartBytes = uint64_t{1} << 30;

// The canonical bytes of `part`. kInvalidArgument for a part the format
// cannot carry (a field outside its rule in §11, e.g. an unsorted layout,
// overlapping shards or records, over kMaxRankPartBytes in all).
TERN_EXPORT Result<std::vector<uint8_t>> EncodeRankPart(const RankPart& part);
// Parses and checks the structure of §11 (kCorrupt naming the field: bad
// magic or format, a reserved field not zero, a count or length out of its
// bound or past the end, trailing bytes). What needs the root's state is
// left to AssembleRankParts. Untrusted input: allocates at most about the
// input's size. Thread-safe (no state).
TERN_EXPORT Result<RankPart> DecodeRankPart(std::span<const uint8_t> bytes);

// D(the all-zero view of `layout`): the base of a board's first version.
TERN_EXPORT ViewDigest ZeroViewDigest(const std::vector<TensorDesc>& layout);

}  // namespace tern

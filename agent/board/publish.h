// Publishing a version on the root's Board (agent/board/board.h), and squashes
// made on demand for catch-up (docs/agent/board.md §3).
//
// PublishVersion: diff prev -> next (prev null: the first version, a
// keyframe only), keyframe(version) = Diff(zero view, next) when the board's
// policy says so, SHA-256 chunk hashes and Merkle roots, the manifest, the
// signature; then each object file written and fsynced, and only then the
// record appended (Board::Record), so a crash never leaves a manifest without
// its bytes. On any error nothing is recorded and the files this call wrote
// are removed (a crash's leftovers are removed by the next Board::Open).
//
// MakeSquash(from, to): squash(from -> to) of the cheapest object chain, or
// with from == 0 a late keyframe(to) (the newest keyframe squashed with the
// patches after it), checked against D(to), signed as another manifest of
// version `to`, written, recorded. A chain with format-2 CONTEXT segments is
// squashed on view(from), rebuilt from the board's own objects (memory: about
// twice the view); without those objects it fails and catch-up falls back
// to the chain (docs/agent/board.md §4). Bind it into a MakeSquashFn for
// Board::PlanCatchUp.
//
// Errors: kInvalidArgument for a version not newer than HEAD (with
// supersede: not below HEAD, or no prev), prev given for an empty board or
// missing for a non-empty one, from not before parent(to) on the chain;
// kAlreadyExists for a supersede to a number the board holds;
// kMismatch when prev_digest is not D(HEAD) or (verify_prev_digest) not
// D(prev), or when views do not share a layout; kAlreadyExists for a squash
// or keyframe the board already holds; codec, Env and log errors as they come.
//
// Thread safety: PublishVersion and MakeSquash on one Board must be called
// by one thread at a time (the daemon's publisher); Board readers may run
// meanwhile. The pool is used by one call at a time (ThreadPool's rule).
// The signer's key must be trusted by the board's verifier, or Record
// refuses the manifest (kAuth).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "agent/board/board.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/status.h"
#include "tern/thread_pool.h"
#include "tern/version_manifest.h"
#include "tern/view.h"

namespace tern::agent {

struct PublishOptions {
  uint64_t segment_elements = uint64_t{1} << 20;  // DiffOptions::segment_elements
  // The patch and keyframe format (DiffOptions::format_version): 2 is
  // smaller, 1 applies ~4x faster (docs/format/patch.md, docs/agent.md §8).
  uint16_t format_version = kDefaultPatchFormat;
  // DiffOptions::nibble_coding: format 2 codes packed 4-bit codes as
  // nibbles where smaller (the file then says version 3). Off: every patch
  // and keyframe stays at version <= 2, for readers that predate version 3.
  bool nibble_coding = true;
  uint32_t chunk_bytes = 0;       // 0: DefaultChunkBytes(object size)
  uint64_t created_unix_ms = 0;   // 0: the system clock (informative only)
  // Check D(prev) against prev_digest before anything is signed: a wrong
  // prev would publish a patch no member can apply. D(prev) is computed in
  // the diff's own pass over prev (Diff's old_digest), so the check costs
  // the hashing, not a second read of prev.
  bool verify_prev_digest = true;
  // prev is null on a non-empty board: publish keyframe(version) only, on
  // top of HEAD (base_digest = D(HEAD) from HEAD's manifest). For a root
  // that took the board over without HEAD's view.
  bool keyframe_only = false;
  // Add keyframe(version) whatever Board::KeyframeDue says (after a key
  // rotation: a new member's start signed by the current key).
  bool with_keyframe = false;
  // Renumber downwards (docs/agent/board.md §4a): publish `version` below
  // HEAD as the first publication of epoch HEAD's + 1, parent = HEAD, with
  // the backwards patch(HEAD -> version) (prev = HEAD's view) and
  // keyframe(version). The version must not be a number the board holds.
  bool supersede = false;
  // The version's model files (agent/board/model_files.h), signed in its
  // manifest; empty: none (a format-1 manifest). A squash's manifest
  // carries the files of its version's publication manifest instead.
  std::vector<ManifestFile> files;
};

// Where a PublishVersion / PublishPatch / MakeSquash call spent its time,
// in seconds of the board Env's clock; 0 for a step that did not run. The
// root's publish latency breakdown (docs/agent/board.md §4, "The root's
// publish, in order") starts from these.
struct PublishSpans {
  // The checks of prev_digest against HEAD's manifest. D(prev) itself is
  // hashed inside the diff's pass since 2026-12 and counts in diff_s.
  double verify_prev_s = 0;
  double diff_s = 0;         // diff + encode of the patch, D(prev) (and Inspect)
  double keyframe_s = 0;     // diff + encode of the keyframe
  double hash_s = 0;         // chunk SHA-256 and Merkle roots (DescribeObject)
  double sign_s = 0;
  double write_s = 0;        // object files written and fsynced
  double record_s = 0;       // Board::Record: the log append and its sync
  double total_s = 0;        // the whole call
};

struct PublishResult {
  VersionManifest manifest;
  std::string signed_manifest;
  uint64_t patch_bytes = 0;     // 0: no patch (first version) / not a publication
  uint64_t keyframe_bytes = 0;  // 0: no keyframe in this manifest
  uint64_t squash_bytes = 0;    // MakeSquash: the squash (from > 0)
  PublishSpans spans;
};

// The manifest entry for an object: size, chunking, Merkle root over the
// SHA-256 of its chunks (hashed over the pool).
Result<ManifestObject> DescribeObject(const ObjectRef& ref, std::span<const uint8_t> bytes,
                                      uint32_t chunk_bytes, ThreadPool& pool);

Result<PublishResult> PublishVersion(Board& board, const ManifestSigner& signer,
                                     const ServeView* prev, const ViewDigest& prev_digest,
                                     const ServeView& next, uint64_t version,
                                     const PublishOptions& options, ThreadPool& pool);

// A version whose patch was made elsewhere (AssembleRankParts: parts of
// trainer ranks). On an empty board `patch` must start at the zero view
// (base version 0) and is recorded as keyframe(version); otherwise it must be
// HEAD -> version with base digest D(HEAD), recorded as patch(HEAD ->
// version). Inspect validates it whole first (kCorrupt); versions or a
// base that do not fit are kMismatch. No keyframe is made here (the caller
// has no full view before it applies the patch: MakeSquash(0, version)
// makes a late one).
Result<PublishResult> PublishPatch(Board& board, const ManifestSigner& signer,
                                   std::vector<uint8_t> patch, uint64_t version,
                                   const PublishOptions& options, ThreadPool& pool);

Result<PublishResult> MakeSquash(Board& board, const ManifestSigner& signer, uint64_t from,
                                 uint64_t to, const PublishOptions& options, ThreadPool& pool);

}  // namespace tern::agent

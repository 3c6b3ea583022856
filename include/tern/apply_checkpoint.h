// Applying a patch to a checkpoint on disk, all or nothing: the sequence
// `tern apply` runs and the agent will run.
//
//   check  the patch's framing and checksums, and that BASE's view digest is
//          the patch's base digest, before anything is copied;
//   stage  a copy of BASE in the same form next to OUT (CloneForWrite);
//   apply  the patch to the private copy, verifying the target digest;
//   verify optionally re-digest the whole result (a scrub);
//   commit switch the copy into place at OUT atomically.
//
// On any error OUT does not exist afterwards (or is left as it was, with
// overwrite) and the staged copy is removed. The patch is parsed once.
//
// Thread safety: reentrant; `pool` is used by one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "tern/checkpoint.h"
#include "tern/digest.h"
#include "tern/export.h"
#include "tern/status.h"

namespace tern {

class ThreadPool;

struct ApplyCheckpointOptions {
  // Replace an existing checkpoint at OUT (atomically, on commit).
  bool overwrite = false;
  // After applying, recompute the full digest of the result and compare it
  // with the target digest the patch produced (kInternal if they differ).
  bool verify_full = false;
  // Runs after the result is verified and before it is switched into place;
  // an error aborts the apply (nothing at OUT). For callers that must decide
  // at the last moment whether to publish (and for tests of that path).
  std::function<Status()> before_commit;
};

struct ApplyCheckpointResult {
  uint64_t base_version = 0, target_version = 0;
  ViewDigest base_digest, target_digest;
  uint64_t changed_elements = 0;
  // Wall times of the steps: check and stage, apply (with verify_full: and
  // the scrub), commit.
  double check_stage_s = 0, apply_s = 0, commit_s = 0;
};

// Applies `patch` to `base` and writes the target to `out`, in base's form
// (single file or sharded directory with its other files). Errors: kCorrupt
// or kUnsupported for a bad patch, kMismatch when base is not the patch's
// base (its digest or layout), kAlreadyExists when out exists and
// !overwrite, the file system's errors from staging and commit.
TERN_EXPORT Result<ApplyCheckpointResult> ApplyCheckpoint(const Checkpoint& base,
                                                          std::span<const uint8_t> patch,
                                                          const std::string& out, ThreadPool& pool,
                                                          const ApplyCheckpointOptions& options = {});

}  // namespace tern

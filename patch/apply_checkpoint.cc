// ApplyCheckpoint: check -> stage -> apply -> verify -> commit
// (include/tern/apply_checkpoint.h).
#include "tern/apply_checkpoint.h"

#include <chrono>

#include "patch/apply_internal.h"
#include "patch/apply_record.h"
#include "patch/container.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Result<ApplyCheckpointResult> ApplyCheckpoint(const Checkpoint& base, std::span<const uint8_t> patch,
                                              const std::string& out, ThreadPool& pool,
                                              const ApplyCheckpointOptions& options) {
  ApplyCheckpointResult result;
  auto t = std::chrono::steady_clock::now();
  // Framing and checksums now; the segment streams are decoded (and so
  // validated) by the apply itself, on the staged copy.
  TERN_ASSIGN_OR_RETURN(const patch::ParsedPatch parsed, patch::ParsePatch(patch));
  result.base_version = parsed.base_version;
  result.target_version = parsed.target_version;
  result.base_digest = ComputeDigest(base.view(), pool);
  if (!(result.base_digest == parsed.base_digest))
    return TERN_ERROR(kMismatch, base.path(), " is not this patch's base: its digest is ",
                      result.base_digest.ToString(), ", the patch needs ", parsed.base_digest.ToString());

  CloneOptions clone_options;
  clone_options.overwrite = options.overwrite;
  // Removes the staged files on every return before Commit.
  TERN_ASSIGN_OR_RETURN(auto staged, WritableCheckpoint::CloneForWrite(base, out, clone_options));
  result.check_stage_s = SecondsSince(t);

  t = std::chrono::steady_clock::now();
  // The staged copy is ours alone until Commit, so the apply may write while
  // it verifies: one pass over the changed lines.
  ApplyOptions apply_options;
  apply_options.exclusive_view = true;
  TERN_RETURN_IF_ERROR(patch::ApplyParsed(staged->view(), parsed, result.base_digest, pool,
                                          apply_options, &result.target_digest));
  if (options.verify_full) {
    const ViewDigest scrub = ComputeDigest(AsConst(staged->view()), pool);
    if (!(scrub == result.target_digest))
      return TERN_ERROR(kInternal, "full re-digest of the result disagrees with the patch: ", scrub.ToString(),
                        " vs ", result.target_digest.ToString());
  }
  for (const patch::RecordView& r : parsed.records)  // decoded once already: cannot fail now
    result.changed_elements += patch::RecordChangedElements(r, parsed.tensors[r.h.tensor_index]).value();
  result.apply_s = SecondsSince(t);

  t = std::chrono::steady_clock::now();
  if (options.before_commit) TERN_RETURN_IF_ERROR(options.before_commit());
  TERN_RETURN_IF_ERROR(staged->Commit());
  result.commit_s = SecondsSince(t);
  return result;
}

}  // namespace tern

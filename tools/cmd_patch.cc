// tern diff / apply / squash / digest: the patch codec on checkpoints.
//
// Files are staged and renamed into place, so an output path holds either
// nothing or a complete, verified result.
#include <cstdio>
#include <string>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/checkpoint.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tools/cli_util.h"
#include "tools/flags.h"

namespace tern::cli {
namespace {

// The version a checkpoint declares in its metadata ("tern.version", or the
// step datagen recorded), if any.
std::optional<uint64_t> DeclaredVersion(const Checkpoint& ckpt) {
  for (const std::string& file : ckpt.files()) {
    const auto& meta = ckpt.metadata(file);
    for (const char* key : {"tern.version", "tern.trace.step"}) {
      auto it = meta.find(key);
      if (it == meta.end()) continue;
      auto v = ParseCount(it->second);
      if (v.ok()) return *v;
    }
  }
  return std::nullopt;
}

Result<uint64_t> VersionFlag(const Flags& flags, const std::string& name, const Checkpoint& ckpt) {
  if (flags.Has(name)) return flags.GetU64(name);
  return DeclaredVersion(ckpt).value_or(0);
}

Status Diff(const Flags& flags) {
  const std::string old_path = flags.positional()[0], new_path = flags.positional()[1];
  const std::string out = flags.Get("o");
  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  TERN_ASSIGN_OR_RETURN(auto old_ckpt, Checkpoint::Open(old_path));
  TERN_ASSIGN_OR_RETURN(auto new_ckpt, Checkpoint::Open(new_path));
  DiffOptions options;
  TERN_ASSIGN_OR_RETURN(options.segment_elements, flags.GetU64("segment-elements"));
  TERN_ASSIGN_OR_RETURN(options.base_version, VersionFlag(flags, "base-version", *old_ckpt));
  TERN_ASSIGN_OR_RETURN(options.target_version, VersionFlag(flags, "target-version", *new_ckpt));
  ThreadPool pool(threads);

  const double t0 = NowSeconds();
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch,
                        tern::Diff(old_ckpt->view(), new_ckpt->view(), options, pool));
  const double t1 = NowSeconds();
  TERN_RETURN_IF_ERROR(WriteFileAtomic(out, patch, flags.Switch("force")));
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(patch));
  const uint64_t full = new_ckpt->view().total_bytes();
  std::fprintf(stderr,
               "tern diff: wrote %s: %s for %llu of %llu elements changed (%.3f%%), "
               "%.2f bits per changed element, %.1fx smaller than the view (%s), %.2f s\n",
               out.c_str(), HumanBytes(patch.size()).c_str(),
               static_cast<unsigned long long>(info.changed_elements),
               static_cast<unsigned long long>(info.elements),
               info.elements ? 100.0 * info.changed_elements / info.elements : 0.0,
               info.bits_per_changed(), patch.empty() ? 0.0 : double(full) / patch.size(),
               HumanBytes(full).c_str(), t1 - t0);
  std::fprintf(stderr, "  base   v%llu %s\n  target v%llu %s\n",
               static_cast<unsigned long long>(info.base_version),
               info.base_digest.ToString().c_str(),
               static_cast<unsigned long long>(info.target_version),
               info.target_digest.ToString().c_str());
  return Status::Ok();
}

Status Apply(const Flags& flags) {
  const std::string base_path = flags.positional()[0], patch_path = flags.positional()[1];
  const std::string out = flags.Get("o");
  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  TERN_ASSIGN_OR_RETURN(auto patch, MappedFile::Open(patch_path));
  TERN_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(base_path));
  ThreadPool pool(threads);

  // Check the patch and the base before staging a copy of anything.
  const double t0 = NowSeconds();
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(patch->bytes()));
  const ViewDigest base_digest = ComputeDigest(base->view(), pool);
  if (!(base_digest == info.base_digest))
    return TERN_ERROR(kMismatch, base_path, " is not this patch's base: its digest is ",
                      base_digest.ToString(), ", the patch needs ", info.base_digest.ToString());

  CloneOptions clone_options;
  clone_options.overwrite = flags.Switch("force");
  TERN_ASSIGN_OR_RETURN(auto staged, WritableCheckpoint::CloneForWrite(*base, out, clone_options));
  const double t1 = NowSeconds();
  ViewDigest new_digest;
  // The staged copy is ours alone until Commit (and removed on failure), so
  // Apply may write while it verifies: one pass over the changed lines.
  ApplyOptions apply_options;
  apply_options.exclusive_view = true;
  TERN_RETURN_IF_ERROR(tern::Apply(staged->view(), patch->bytes(), base_digest, pool, apply_options, &new_digest));
  const double t2 = NowSeconds();
  if (flags.Switch("verify-full")) {
    const ViewDigest scrub = ComputeDigest(AsConst(staged->view()), pool);
    if (!(scrub == new_digest))
      return TERN_ERROR(kInternal, "full re-digest of the result disagrees with the patch: ",
                        scrub.ToString(), " vs ", new_digest.ToString());
  }
  TERN_RETURN_IF_ERROR(staged->Commit());
  std::fprintf(stderr,
               "tern apply: wrote %s (v%llu %s): %llu elements changed; verify+stage %.2f s, "
               "apply %.3f s\n",
               out.c_str(), static_cast<unsigned long long>(info.target_version),
               new_digest.ToString().c_str(),
               static_cast<unsigned long long>(info.changed_elements), t1 - t0, t2 - t1);
  return Status::Ok();
}

Status SquashCmd(const Flags& flags) {
  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  const auto& inputs = flags.positional();
  TERN_REQUIRE(inputs.size() >= 2, kInvalidArgument, "squash needs at least two patches");
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::span<const uint8_t>> spans;
  for (const std::string& path : inputs) {
    TERN_ASSIGN_OR_RETURN(auto f, MappedFile::Open(path));
    spans.push_back(f->bytes());
    files.push_back(std::move(f));
  }
  ThreadPool pool(threads);
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> out, tern::Squash(spans, pool));
  TERN_RETURN_IF_ERROR(WriteFileAtomic(flags.Get("o"), out, flags.Switch("force")));
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(out));
  uint64_t in_bytes = 0;
  for (const auto& s : spans) in_bytes += s.size();
  std::fprintf(stderr, "tern squash: wrote %s: v%llu -> v%llu, %s (inputs %s), %llu elements changed\n",
               flags.Get("o").c_str(), static_cast<unsigned long long>(info.base_version),
               static_cast<unsigned long long>(info.target_version),
               HumanBytes(out.size()).c_str(), HumanBytes(in_bytes).c_str(),
               static_cast<unsigned long long>(info.changed_elements));
  return Status::Ok();
}

Status Digest(const Flags& flags) {
  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  TERN_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(flags.positional()[0]));
  ThreadPool pool(threads);
  const double t0 = NowSeconds();
  const ViewDigest d = ComputeDigest(ckpt->view(), pool);
  const double t1 = NowSeconds();
  std::printf("%s\n", d.ToString().c_str());
  std::fprintf(stderr, "tern digest: %zu tensors, %llu elements, %s in %.2f s\n",
               ckpt->view().tensors.size(),
               static_cast<unsigned long long>(ckpt->view().total_elements()),
               HumanBytes(ckpt->view().total_bytes()).c_str(), t1 - t0);
  return Status::Ok();
}

}  // namespace

int RunDiff(int argc, char** argv) {
  Flags flags("diff", "Make a patch that turns OLD into NEW bit for bit.");
  flags.AddPositional("OLD", "base checkpoint: a .safetensors file or a checkpoint directory");
  flags.AddPositional("NEW", "target checkpoint with the same tensors (names, dtypes, shapes)");
  flags.Add("o", "patch file to write", "", true);
  flags.Add("segment-elements", "elements per segment (unit of parallel encode/apply)", "1048576");
  flags.Add("base-version", "version number of OLD (default: its metadata, else 0)");
  flags.Add("target-version", "version number of NEW (default: its metadata, else 0)");
  flags.AddSwitch("force", "replace an existing patch file");
  AddThreadsFlag(flags);
  Status s = flags.Parse(argc, argv);
  if (s.ok()) s = Diff(flags);
  return Report("diff", s);
}

int RunApply(int argc, char** argv) {
  Flags flags("apply",
              "Apply PATCH to BASE and write the target to OUT, in BASE's form (single file or "
              "sharded directory, other files copied). BASE's digest is checked first, the "
              "target digest before anything is switched into place; on any error OUT does not "
              "exist afterwards.");
  flags.AddPositional("BASE", "the checkpoint the patch was made from");
  flags.AddPositional("PATCH", "a patch from tern diff or tern squash");
  flags.Add("o", "output checkpoint (file or directory, like BASE)", "", true);
  flags.AddSwitch("verify-full", "also recompute the full digest of the result (a scrub)");
  flags.AddSwitch("force", "replace an existing OUT");
  AddThreadsFlag(flags);
  Status s = flags.Parse(argc, argv);
  if (s.ok()) s = Apply(flags);
  return Report("apply", s);
}

int RunSquash(int argc, char** argv) {
  Flags flags("squash", "Join consecutive patches a->b, b->c, ... into one patch a->z, exactly.");
  flags.AddPositional("PATCH", "patches in version order", /*variadic=*/true);
  flags.Add("o", "patch file to write", "", true);
  flags.AddSwitch("force", "replace an existing patch file");
  AddThreadsFlag(flags);
  Status s = flags.Parse(argc, argv);
  if (s.ok()) s = SquashCmd(flags);
  return Report("squash", s);
}

int RunDigest(int argc, char** argv) {
  Flags flags("digest",
              "Print the view digest of a checkpoint: the identity patches name as their base "
              "and target (independent of sharding and file layout).");
  flags.AddPositional("CHECKPOINT", "a .safetensors file or a checkpoint directory");
  AddThreadsFlag(flags);
  Status s = flags.Parse(argc, argv);
  if (s.ok()) s = Digest(flags);
  return Report("digest", s);
}

}  // namespace tern::cli

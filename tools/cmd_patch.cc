// tern diff / apply / squash / digest: the patch codec on checkpoints.
//
// Files are staged and renamed into place, so an output path holds either
// nothing or a complete, verified result.
#include <cstdio>
#include <string>
#include <vector>

#include "tern/apply_checkpoint.h"
#include "tern/thread_pool.h"
#include "tern/checkpoint.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

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
      auto v = ParseUnsigned(it->second);
      if (v.ok()) return *v;
    }
  }
  return std::nullopt;
}

// A version flag when given, else the checkpoint's declared version, else 0.
uint64_t VersionOf(const CLI::Option* flag, uint64_t value, const Checkpoint& ckpt) {
  if (flag->count() > 0) return value;
  return DeclaredVersion(ckpt).value_or(0);
}

struct DiffArgs {
  std::string old_path, new_path, out;
  uint64_t segment_elements = 0, base_version = 0, target_version = 0;
  uint16_t format_version = kDefaultPatchFormat;
  const CLI::Option* base_version_flag = nullptr;
  const CLI::Option* target_version_flag = nullptr;
  bool no_nibbles = false;
  bool force = false;
  unsigned threads = 0;
};

Status Diff(const DiffArgs& a) {
  const std::string &old_path = a.old_path, &new_path = a.new_path, &out = a.out;
  TERN_ASSIGN_OR_RETURN(auto old_ckpt, Checkpoint::Open(old_path));
  TERN_ASSIGN_OR_RETURN(auto new_ckpt, Checkpoint::Open(new_path));
  DiffOptions options;
  options.segment_elements = a.segment_elements;
  options.format_version = a.format_version;
  options.nibble_coding = !a.no_nibbles;
  options.base_version = VersionOf(a.base_version_flag, a.base_version, *old_ckpt);
  options.target_version = VersionOf(a.target_version_flag, a.target_version, *new_ckpt);
  ThreadPool pool(a.threads);

  const double t0 = NowSeconds();
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch,
                        tern::Diff(old_ckpt->view(), new_ckpt->view(), options, pool));
  const double t1 = NowSeconds();
  TERN_RETURN_IF_ERROR(WriteFileAtomic(out, patch, a.force));
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

struct ApplyArgs {
  std::string base_path, patch_path, out;
  bool verify_full = false, force = false;
  unsigned threads = 0;
};

Status Apply(const ApplyArgs& a) {
  const std::string &base_path = a.base_path, &patch_path = a.patch_path, &out = a.out;
  TERN_ASSIGN_OR_RETURN(auto patch, MapReadOnly(patch_path));
  TERN_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(base_path));
  ThreadPool pool(a.threads);

  ApplyCheckpointOptions options;
  options.overwrite = a.force;
  options.verify_full = a.verify_full;
  TERN_ASSIGN_OR_RETURN(ApplyCheckpointResult r, ApplyCheckpoint(*base, patch->bytes(), out, pool, options));
  std::fprintf(stderr,
               "tern apply: wrote %s (v%llu %s): %llu elements changed; verify+stage %.2f s, "
               "apply %.3f s\n",
               out.c_str(), static_cast<unsigned long long>(r.target_version),
               r.target_digest.ToString().c_str(), static_cast<unsigned long long>(r.changed_elements),
               r.check_stage_s, r.apply_s);
  return Status::Ok();
}

struct SquashArgs {
  std::vector<std::string> inputs;
  std::string out, base_path;
  uint64_t segment_elements = 0;
  uint16_t format_version = kDefaultPatchFormat;
  const CLI::Option* format_version_flag = nullptr;
  bool no_nibbles = false;
  bool force = false;
  unsigned threads = 0;
};

Status SquashCmd(const SquashArgs& a) {
  const auto& inputs = a.inputs;
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::span<const uint8_t>> spans;
  for (const std::string& path : inputs) {
    TERN_ASSIGN_OR_RETURN(auto f, MapReadOnly(path));
    spans.push_back(f->bytes());
    files.push_back(std::move(f));
  }
  ThreadPool pool(a.threads);
  std::vector<uint8_t> out;
  if (a.base_path.empty()) {
    TERN_REQUIRE(
        a.format_version_flag->count() == 0, kInvalidArgument,
        "tern squash: --format-version needs --base (without the base a squash keeps its inputs' "
        "codings: format 1, or version 3 for tensors coded as nibbles)");
    // --no-nibbles: inputs with nibble-coded tensors need the base too.
    auto squashed = tern::Squash(spans, pool, /*nibble_coding=*/!a.no_nibbles);
    if (squashed.status().code() == Code::kUnsupported)
      return squashed.status().WithContext("pass the first patch's base checkpoint with --base");
    TERN_ASSIGN_OR_RETURN(out, std::move(squashed));
  } else {
    TERN_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(a.base_path));
    DiffOptions options;
    options.segment_elements = a.segment_elements;
    options.format_version = a.format_version;
    options.nibble_coding = !a.no_nibbles;
    TERN_ASSIGN_OR_RETURN(out, tern::SquashOnBase(base->view(), spans, options, pool));
  }
  TERN_RETURN_IF_ERROR(WriteFileAtomic(a.out, out, a.force));
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(out));
  uint64_t in_bytes = 0;
  for (const auto& s : spans) in_bytes += s.size();
  std::fprintf(stderr, "tern squash: wrote %s: v%llu -> v%llu, %s (inputs %s), %llu elements changed\n",
               a.out.c_str(), static_cast<unsigned long long>(info.base_version),
               static_cast<unsigned long long>(info.target_version),
               HumanBytes(out.size()).c_str(), HumanBytes(in_bytes).c_str(),
               static_cast<unsigned long long>(info.changed_elements));
  return Status::Ok();
}

struct DigestArgs {
  std::string path;
  unsigned threads = 0;
};

Status Digest(const DigestArgs& a) {
  TERN_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(a.path));
  ThreadPool pool(a.threads);
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

void AddDiff(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* cmd = tern.add_subcommand("diff", "make a patch between two checkpoints");
  cmd->footer("The patch turns OLD into NEW bit for bit.");
  cmd->add_option("OLD", a->old_path,
                  "base checkpoint: a .safetensors file or a checkpoint directory")->required();
  cmd->add_option("NEW", a->new_path,
                  "target checkpoint with the same tensors (names, dtypes, shapes)")->required();
  AddOutputFlag(*cmd, a->out, "patch file to write");
  AddCount(*cmd, "--segment-elements", a->segment_elements,
           "elements per segment (unit of parallel encode/apply)", "1048576");
  a->base_version_flag = AddUnsigned(*cmd, "--base-version", a->base_version,
                                     "version number of OLD (default: its metadata, else 0)", "");
  a->target_version_flag = AddUnsigned(*cmd, "--target-version", a->target_version,
                                       "version number of NEW (default: its metadata, else 0)", "");
  AddUnsigned(*cmd, "--format-version", a->format_version,
              "patch format: 1, or 2 (positions and values coded given the base, packed 4-bit codes "
              "as nibbles, which the file then calls version 3: smaller, slower to apply, squashed "
              "only with the base; docs/format/patch.md)",
              std::to_string(kDefaultPatchFormat))
      ->check(CLI::Range(1, 2));
  cmd->add_flag("--no-nibbles", a->no_nibbles,
                "format 2: code packed 4-bit codes by their bytes, not as nibbles, so the file "
                "stays at version 2 (for readers that predate version 3)");
  AddForceFlag(*cmd, a->force, "replace an existing patch file");
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {nullptr, [a] { return Diff(*a); }});
}

void AddApply(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<ApplyArgs>();
  CLI::App* cmd = tern.add_subcommand("apply", "apply a patch to a checkpoint (staged, verified)");
  cmd->footer(
      "Apply PATCH to BASE and write the target to OUT, in BASE's form (single file or sharded "
      "directory, other files copied). BASE's digest is checked first, the target digest before "
      "anything is switched into place; on any error OUT does not exist afterwards.");
  cmd->add_option("BASE", a->base_path, "the checkpoint the patch was made from")->required();
  cmd->add_option("PATCH", a->patch_path, "a patch from tern diff or tern squash")->required();
  AddOutputFlag(*cmd, a->out, "output checkpoint (file or directory, like BASE)");
  cmd->add_flag("--verify-full", a->verify_full,
                "also recompute the full digest of the result (a scrub)");
  AddForceFlag(*cmd, a->force, "replace an existing OUT");
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {nullptr, [a] { return Apply(*a); }});
}

void AddSquash(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<SquashArgs>();
  CLI::App* cmd = tern.add_subcommand("squash", "join consecutive patches into one");
  cmd->footer(
      "Join consecutive patches a->b, b->c, ... into one patch a->z, exactly. Format-2 patches "
      "(tern diff's default) code changes given their base: squashing them needs --base, the "
      "first patch's base checkpoint. Without --base the squash is written in format 1.");
  cmd->add_option("PATCH", a->inputs, "patches in version order (at least two)")
      ->required()
      ->expected(2, CLI::detail::expected_max_vector_size);
  AddOutputFlag(*cmd, a->out, "patch file to write");
  cmd->add_option("--base", a->base_path,
                  "the first patch's base checkpoint: needed for format-2 patches; the squash is "
                  "then re-encoded in --format-version")
      ->type_name("CHECKPOINT");
  AddCount(*cmd, "--segment-elements", a->segment_elements,
           "with --base: elements per segment of the squash", "1048576");
  a->format_version_flag = AddUnsigned(*cmd, "--format-version", a->format_version,
                                       "with --base: the squash's patch format, 1 or 2",
                                       std::to_string(kDefaultPatchFormat))
                               ->check(CLI::Range(1, 2));
  cmd->add_flag("--no-nibbles", a->no_nibbles,
                "no nibble-coded packed codes (the squash stays at file version 2; inputs "
                "that code some as nibbles then need --base)");
  AddForceFlag(*cmd, a->force, "replace an existing patch file");
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {nullptr, [a] { return SquashCmd(*a); }});
}

void AddDigest(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<DigestArgs>();
  CLI::App* cmd = tern.add_subcommand("digest", "print a checkpoint's view digest");
  cmd->footer(
      "Print the view digest of a checkpoint: the identity patches name as their base and "
      "target (independent of sharding and file layout).");
  cmd->add_option("CHECKPOINT", a->path, "a .safetensors file or a checkpoint directory")
      ->required();
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {nullptr, [a] { return Digest(*a); }});
}

}  // namespace tern::cli

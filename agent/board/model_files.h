// A checkpoint's model files — the small regular files beside its tensors
// that an engine loads (config.json, generation_config.json, the tokenizer,
// the quantization config `tern cast` writes) — gathered for publication
// (docs/agent.md §3 "Model files"; the manifest's files: docs/format/agent.md §3.1).
//
// The rule: every regular file directly in the checkpoint directory whose
// name ValidModelFileName accepts (so not *.safetensors, not the
// safetensors index, not a dot file, no subdirectory) and that is at most
// kMaxManifestFileBytes long. A longer file is not a model file (an
// optimizer state, a training log) and is skipped with a log line. More
// than kMaxManifestFiles such files, or more than
// kMaxManifestFilesTotalBytes in all, is refused (kInvalidArgument): a
// checkpoint that big in small files is not what we think it is. A
// single-file checkpoint (path is a .safetensors file) has none.
//
// Each file is read once, hashed, and stored content-addressed in
// `files_dir` (files_dir/<sha256 hex>, written atomically and synced, kept
// when already there), so what the manifest signs is what is served, even
// if the checkpoint changes afterwards.
//
// Thread safety: none needed (functions of their arguments); one publisher
// writes files_dir at a time.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "tern/env.h"
#include "tern/log.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

// The model files of `checkpoint_path`, by name, stored in files_dir.
Result<std::vector<ManifestFile>> StoreModelFiles(Env& env, const std::string& checkpoint_path,
                                                  const std::string& files_dir, const LogFn& log);

// Removes every file in files_dir whose content no name in `keep` (SHA-256
// in hex) is: the files of versions retention dropped.
Status RetainModelFiles(Env& env, const std::string& files_dir, const std::set<std::string>& keep);

}  // namespace tern::agent

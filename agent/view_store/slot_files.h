// A version's model files in a view store slot: config.json, the tokenizer,
// the quantization config — what an engine loads beside the tensors
// (docs/agent.md §3 "Model files", the manifest's files: docs/format/agent.md §3.1).
//
// WriteSlotFiles makes a slot directory hold exactly `files` besides its
// tensor files: each is read from its source, checked against its signed
// SHA-256 and size (kAuth when they differ: refused like a bad chunk, and
// the slot is left as it was for that file), written under a temporary
// name, synced and renamed over its name; a model file the slot holds that
// `files` does not name is removed; then the directory is synced. A file
// whose bytes already are the new ones is left alone (no write, no sync).
// An empty `files` changes nothing: a version published before manifests
// named files (format 1) says nothing about them, and the slot keeps what
// its checkpoint brought (the passenger files a seed or a copy carries).
// The view store calls it on the spare before the commit point, so a slot
// is served only with its version's files, complete and durable.
//
// Bounds: the manifest's (kMaxManifestFiles files, each at most
// kMaxManifestFileBytes); a source longer than its signed size is refused
// without reading past it.
//
// Thread safety: none needed (a function of its arguments and the slot).
#pragma once

#include <string>
#include <vector>

#include "tern/env.h"
#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

struct SlotFile {
  ManifestFile file;        // name, size and SHA-256, from the signed manifest
  std::string source_path;  // where its bytes are read from
};

Status WriteSlotFiles(Env& env, const std::string& slot_path, const std::vector<SlotFile>& files);

}  // namespace tern::agent

// Hugging Face safetensors checkpoints: a single `.safetensors` file or a
// directory of shards named by `model.safetensors.index.json`. Format and
// validation rules: docs/checkpoint.md.
//
// Reading maps tensor bytes (MAP_SHARED, PROT_READ); nothing is copied. Every
// header is validated strictly before any byte is exposed: bad input is
// kCorrupt with the file and tensor named. A file truncated by someone else
// while mapped raises SIGBUS, as with any mmap: files are trusted to stay put,
// their contents are not trusted.
//
// Writing stages everything under `path + ".tmp-<random>"` and Commit()
// fsyncs and renames it into place atomically, so `path` holds either nothing
// (or the previous checkpoint, with overwrite) or the complete new one.
//
// Thread safety: a Checkpoint is immutable after Open; all const methods may be
// called from many threads. A WritableCheckpoint's tensor bytes may be written
// from many threads on disjoint ranges; Commit() and the other methods must
// not race with anything.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tern/env.h"
#include "tern/export.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

// The reference reader's limit on the JSON header (bytes).
inline constexpr uint64_t kSafetensorsHeaderBytesMax = 100'000'000;
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

struct OpenOptions {
  // Pre-fault the mappings (MAP_POPULATE): slower open, no page faults later.
  bool populate = false;
  // The file system; nullptr: DefaultEnv(). Must outlive the Checkpoint.
  Env* env = nullptr;
};

// Where a tensor's bytes live inside a checkpoint.
struct TensorLocation {
  size_t file_index = 0;     // into Checkpoint::files()
  uint64_t offset_bytes = 0; // absolute offset in that file
  uint64_t size_bytes = 0;
};

class TERN_EXPORT Checkpoint {
 public:
  // path: a .safetensors file, a directory with model.safetensors.index.json,
  // or a directory with exactly one *.safetensors file.
  static Result<std::unique_ptr<Checkpoint>> Open(const std::string& path,
                                                  const OpenOptions& options = {});
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Tensors sorted by name; data points into the mappings.
  const ServeView& view() const;
  // Same order as view().tensors.
  const std::vector<TensorDesc>& tensors() const;
  const std::vector<TensorLocation>& locations() const;
  // Location of a tensor by name, or kNotFound.
  Result<TensorLocation> Locate(std::string_view name) const;

  // The path given to Open.
  const std::string& path() const;
  // True when read through model.safetensors.index.json.
  bool sharded() const;
  // The safetensors files, relative to path() for a directory (the base name
  // for a single file), sorted by name (shard order for the usual
  // model-0000k-of-0000n names).
  const std::vector<std::string>& files() const;
  // The __metadata__ of one file (by name as in files()); empty when the file
  // has none or is unknown.
  const std::map<std::string, std::string>& metadata(const std::string& file) const;
  // The whole header (8-byte length + JSON + padding) of file i, as on disk.
  std::span<const uint8_t> header_bytes(size_t file_index) const;

  struct Impl;

 private:
  explicit Checkpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class WritableCheckpoint;
};

struct CreateOptions {
  // For a directory: start a new shard before a tensor would take the current
  // one past this many data bytes (a larger tensor gets a shard of its own).
  // 0: one file, model.safetensors. A split into one shard also writes just
  // model.safetensors, with no index (as transformers does).
  uint64_t shard_bytes_max = 0;
  // Replace an existing checkpoint at path on Commit.
  bool overwrite = false;
  // The file system; nullptr: DefaultEnv(). Must outlive the WritableCheckpoint.
  Env* env = nullptr;
};

struct CloneOptions {
  bool overwrite = false;
  // Where the clone is written: the base's own Env (nullptr) or one that
  // sees the same files (a wrapper of it, such as a FaultEnv).
  Env* env = nullptr;
};

class TERN_EXPORT WritableCheckpoint {
 public:
  // Creates a staged single-file (path ends in ".safetensors") or directory
  // checkpoint with these tensors, data zero-filled (sparse). Tensors are
  // stored in the order given, back to back: the format allows no gaps, so
  // alignment of each tensor's data comes only from the order (see
  // SortLikeReferenceWriter). `metadata` becomes every file's __metadata__
  // (omitted when empty). Errors: kInvalidArgument for duplicate or reserved
  // names, invalid UTF-8, F4 tensors with an odd element count (the format
  // stores whole bytes) or shapes that overflow; kAlreadyExists when path
  // exists and !overwrite.
  static Result<std::unique_ptr<WritableCheckpoint>> Create(
      const std::string& path, std::vector<TensorDesc> tensors,
      const std::map<std::string, std::string>& metadata, const CreateOptions& options = {});

  // Stages a copy of `base` at `path` in the same form: the same files with
  // byte-identical headers, and for a directory every other file in it
  // (config.json, tokenizer, ...) too. Copies with copy_file_range, skipping
  // holes, so sparse files stay sparse.
  static Result<std::unique_ptr<WritableCheckpoint>> CloneForWrite(
      const Checkpoint& base, const std::string& path, const CloneOptions& options = {});

  // Removes the staging files unless committed.
  ~WritableCheckpoint();
  WritableCheckpoint(const WritableCheckpoint&) = delete;
  WritableCheckpoint& operator=(const WritableCheckpoint&) = delete;

  // Tensors sorted by name; data points into writable mappings of the staged
  // files. Do not write after Commit.
  MutableServeView& view();
  const std::vector<TensorDesc>& tensors() const;
  const std::string& path() const;
  // Where the files are staged until Commit.
  const std::string& staging_path() const;

  // Adds a passenger file (config.json, ...) to a directory checkpoint. `name`
  // is a plain file name; kAlreadyExists if it is taken.
  Status AddFile(const std::string& name, std::span<const uint8_t> bytes);
  Status CopyFileFrom(const std::string& source_path, const std::string& name);

  // msync + fsync every file and the staging directory, then renames the
  // staging path to path() atomically (RENAME_NOREPLACE, or an atomic exchange
  // plus removal of the old tree with overwrite). Before Commit nothing is
  // created at path(). kAlreadyExists if path() exists and overwrite is off.
  Status Commit();
  bool committed() const;

  struct Impl;

 private:
  explicit WritableCheckpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Orders tensors as the reference writer does (widest dtype first, then by
// name), which keeps every tensor's data naturally aligned and, with at most
// one metadata entry, makes our files byte-identical to the reference's.
TERN_EXPORT void SortLikeReferenceWriter(std::vector<TensorDesc>& tensors);

}  // namespace tern

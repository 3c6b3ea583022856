// State shared by Checkpoint and WritableCheckpoint (CloneForWrite reads a
// Checkpoint's layout). Internal to tern_checkpoint.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tern/env.h"
#include "tern/checkpoint.h"

namespace tern {

struct Checkpoint::Impl {
  Env* env = nullptr;
  std::string path;
  bool is_directory = false;
  bool sharded = false;
  std::vector<std::string> files;        // sorted; relative to path when a directory
  std::vector<std::unique_ptr<MappedFile>> maps;  // parallel to files
  std::vector<uint64_t> header_bytes;     // 8 + N, parallel to files
  std::map<std::string, std::map<std::string, std::string>> metadata;  // by file
  std::vector<TensorDesc> tensors;        // sorted by name
  std::vector<TensorLocation> locations;  // parallel to tensors
  ServeView view;

  std::string FilePath(size_t i) const { return is_directory ? path + "/" + files[i] : path; }
};

}  // namespace tern

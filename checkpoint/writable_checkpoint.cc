// WritableCheckpoint: staged creation and cloning, atomic commit.
#include <stdio.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "base/path.h"
#include "checkpoint/checkpoint_impl.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_index.h"

namespace tern {
namespace {

constexpr int kCloneDepthMax = 8;
constexpr size_t kCloneEntriesMax = 100'000;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string StripSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool Exists(Env& env, const std::string& path) {
  auto type = env.TypeOf(path, /*follow_links=*/false);
  return !type.ok() || *type != FileType::kMissing;  // unknown counts as there
}

Status CheckDestination(Env& env, const std::string& path, bool overwrite) {
  TERN_REQUIRE(!path.empty(), kInvalidArgument, "empty checkpoint path");
  const std::string parent = ParentDir(path);
  auto type = env.TypeOf(parent, /*follow_links=*/true);
  TERN_REQUIRE(type.ok() && *type == FileType::kDirectory, kNotFound, path,
               ": parent directory ", parent, " does not exist");
  TERN_REQUIRE(overwrite || !Exists(env, path), kAlreadyExists, path, " exists");
  return Status::Ok();
}

Status CopyTree(Env& env, const std::string& from, const std::string& to, int depth,
                size_t* entries) {
  TERN_REQUIRE(depth <= kCloneDepthMax, kResourceExhausted, from, ": directories nested deeper than ",
               kCloneDepthMax);
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(from, kCloneEntriesMax));
  for (const std::string& name : names) {
    TERN_REQUIRE(++*entries <= kCloneEntriesMax, kResourceExhausted, from, ": more than ",
                 kCloneEntriesMax, " files");
    const std::string src = from + "/" + name, dst = to + "/" + name;
    // Follows symlinks: a Hugging Face cache snapshot is a directory of links
    // into its blob store, and the clone must hold the bytes.
    TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(src, /*follow_links=*/true));
    if (type == FileType::kDirectory) {
      TERN_RETURN_IF_ERROR(env.CreateDir(dst));
      TERN_RETURN_IF_ERROR(CopyTree(env, src, dst, depth + 1, entries));
    } else if (type == FileType::kRegular) {
      TERN_RETURN_IF_ERROR(env.CopyFile(src, dst));
    }
  }
  return Status::Ok();
}

// fsync of every file and directory under dir, then dir itself.
Status SyncTree(Env& env, const std::string& dir, int depth) {
  TERN_REQUIRE(depth <= kCloneDepthMax + 1, kResourceExhausted, dir,
               ": directories nested deeper than ", kCloneDepthMax);
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(dir, kCloneEntriesMax));
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/false));
    if (type == FileType::kDirectory) {
      TERN_RETURN_IF_ERROR(SyncTree(env, path, depth + 1));
    } else if (type == FileType::kRegular) {
      TERN_RETURN_IF_ERROR(env.SyncPath(path));
    }
  }
  return env.SyncPath(dir);
}

std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

}  // namespace

struct WritableCheckpoint::Impl {
  Env* env = nullptr;
  std::string path;
  std::string staging;
  bool is_directory = false;
  bool overwrite = false;
  bool committed = false;
  std::vector<std::string> files;  // relative to staging when a directory
  std::vector<std::unique_ptr<MappedFile>> maps;
  std::vector<TensorDesc> tensors;  // sorted by name
  MutableServeView view;

  std::string FilePath(size_t i) const { return is_directory ? staging + "/" + files[i] : staging; }

  ~Impl() {
    if (committed) return;
    maps.clear();
    if (!staging.empty()) (void)RemoveTree(*env, staging);  // best effort: nothing to report to
  }
};

WritableCheckpoint::WritableCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WritableCheckpoint::~WritableCheckpoint() = default;

MutableServeView& WritableCheckpoint::view() { return impl_->view; }
const std::vector<TensorDesc>& WritableCheckpoint::tensors() const { return impl_->tensors; }
const std::string& WritableCheckpoint::path() const { return impl_->path; }
const std::string& WritableCheckpoint::staging_path() const { return impl_->staging; }
bool WritableCheckpoint::committed() const { return impl_->committed; }

Result<std::unique_ptr<WritableCheckpoint>> WritableCheckpoint::Create(
    const std::string& path_in, std::vector<TensorDesc> tensors,
    const std::map<std::string, std::string>& metadata, const CreateOptions& options) {
  const std::string path = StripSlashes(path_in);
  Env& env = options.env != nullptr ? *options.env : DefaultEnv();
  TERN_RETURN_IF_ERROR(CheckDestination(env, path, options.overwrite));
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  for (const TensorDesc& t : tensors) {
    TERN_REQUIRE(t.name != "__metadata__", kInvalidArgument, "\"__metadata__\" is reserved");
    Result<uint64_t> elements = CheckedElements(t.dtype, t.shape);
    TERN_REQUIRE(elements.ok(), kInvalidArgument, "tensor '", t.name, "': ",
                 elements.status().message());
    TERN_REQUIRE(ElementBits(t.dtype) % 8 == 0 || *elements % 2 == 0, kInvalidArgument,
                 "tensor '", t.name, "': ", DTypeName(t.dtype), " needs an even element count");
    sizes.push_back(DTypeBytes(t.dtype, *elements));
  }

  auto impl = std::make_unique<Impl>();
  impl->env = &env;
  impl->path = path;
  impl->overwrite = options.overwrite;
  impl->is_directory = !EndsWith(path, ".safetensors");
  impl->staging = path + ".tmp-" + RandomHex();

  // Shards: consecutive runs of the given order.
  std::vector<size_t> shard_of(tensors.size(), 0);
  size_t shards = 1;
  if (impl->is_directory && options.shard_bytes_max > 0) {
    uint64_t used = 0;
    bool empty = true;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!empty && sizes[i] > options.shard_bytes_max - std::min(used, options.shard_bytes_max)) {
        ++shards;
        used = 0;
      }
      shard_of[i] = shards - 1;
      used += sizes[i];
      empty = false;
    }
  }
  if (!impl->is_directory) {
    impl->files.push_back(BaseName(path));
  } else if (shards == 1) {
    impl->files.push_back("model.safetensors");
  } else {
    for (size_t k = 0; k < shards; ++k) impl->files.push_back(ShardName(k, shards));
  }

  std::vector<TensorLocation> locations(tensors.size());
  std::vector<std::string> header_texts(shards);
  std::vector<uint64_t> file_bytes(shards);
  for (size_t k = 0; k < shards; ++k) {
    std::vector<checkpoint::PlacedTensor> placed;
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shard_of[i] != k) continue;
      placed.push_back({&tensors[i], offset, offset + sizes[i]});
      locations[i] = TensorLocation{k, offset, sizes[i]};
      offset += sizes[i];
    }
    // Also where names and metadata that are not valid UTF-8 are refused.
    TERN_ASSIGN_OR_RETURN(header_texts[k], checkpoint::SerializeHeader(metadata, placed));
    TERN_REQUIRE(header_texts[k].size() - checkpoint::kLengthBytes <= kSafetensorsHeaderBytesMax,
                 kInvalidArgument, path, ": header of ", header_texts[k].size(),
                 " bytes exceeds the format's limit");
    for (size_t i = 0; i < tensors.size(); ++i)
      if (shard_of[i] == k) locations[i].offset_bytes += header_texts[k].size();
    file_bytes[k] = header_texts[k].size() + offset;
  }

  if (impl->is_directory) TERN_RETURN_IF_ERROR(env.CreateDir(impl->staging));
  for (size_t k = 0; k < shards; ++k) {
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map,
                          env.CreateMapped(impl->FilePath(k), file_bytes[k]));
    std::memcpy(map->data(), header_texts[k].data(), header_texts[k].size());
    impl->maps.push_back(std::move(map));
  }
  if (shards > 1) {
    checkpoint::WeightMap weight_map;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      weight_map.emplace_back(tensors[i].name, impl->files[shard_of[i]]);
      total += sizes[i];
    }
    std::sort(weight_map.begin(), weight_map.end());
    TERN_ASSIGN_OR_RETURN(const std::string index, checkpoint::SerializeIndex(total, weight_map));
    TERN_RETURN_IF_ERROR(WriteNewFile(
        env, impl->staging + "/" + kSafetensorsIndexName,
        {reinterpret_cast<const uint8_t*>(index.data()), index.size()}));
  }

  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  for (size_t k = 1; k < order.size(); ++k)
    TERN_REQUIRE(tensors[order[k]].name != tensors[order[k - 1]].name, kInvalidArgument,
                 "duplicate tensor name '", tensors[order[k]].name, "'");
  impl->tensors.reserve(tensors.size());
  for (size_t i : order) impl->tensors.push_back(std::move(tensors[i]));
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorLocation& loc = locations[order[k]];
    impl->view.tensors.push_back(
        MutableTensorRef{&impl->tensors[k], impl->maps[loc.file_index]->data() + loc.offset_bytes});
  }
  return std::unique_ptr<WritableCheckpoint>(new WritableCheckpoint(std::move(impl)));
}

Result<std::unique_ptr<WritableCheckpoint>> WritableCheckpoint::CloneForWrite(
    const Checkpoint& base, const std::string& path_in, const CloneOptions& options) {
  const std::string path = StripSlashes(path_in);
  const Checkpoint::Impl& b = *base.impl_;
  Env& env = options.env != nullptr ? *options.env : *b.env;
  TERN_RETURN_IF_ERROR(CheckDestination(env, path, options.overwrite));
  auto impl = std::make_unique<Impl>();
  impl->env = &env;
  impl->path = path;
  impl->overwrite = options.overwrite;
  impl->is_directory = b.is_directory;
  impl->staging = path + ".tmp-" + RandomHex();
  impl->files = b.files;
  if (b.is_directory) {
    TERN_RETURN_IF_ERROR(env.CreateDir(impl->staging));
    size_t entries = 0;
    TERN_RETURN_IF_ERROR(CopyTree(env, b.path, impl->staging, 0, &entries));
  } else {
    TERN_RETURN_IF_ERROR(env.CopyFile(b.path, impl->staging));
  }
  for (size_t i = 0; i < b.files.size(); ++i) {
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map,
                          env.Map(impl->FilePath(i), MapMode::kReadWrite));
    // The base was validated at Open; make sure the copy is of those bytes.
    const auto header = base.header_bytes(i);
    TERN_REQUIRE(map->size() == b.maps[i]->size() && map->size() >= header.size() &&
                     std::memcmp(map->data(), header.data(), header.size()) == 0,
                 kMismatch, b.FilePath(i), " changed while it was being cloned");
    impl->maps.push_back(std::move(map));
  }
  impl->tensors = b.tensors;
  impl->view.tensors.reserve(impl->tensors.size());
  for (size_t k = 0; k < impl->tensors.size(); ++k) {
    const TensorLocation& loc = b.locations[k];
    impl->view.tensors.push_back(
        MutableTensorRef{&impl->tensors[k], impl->maps[loc.file_index]->data() + loc.offset_bytes});
  }
  return std::unique_ptr<WritableCheckpoint>(new WritableCheckpoint(std::move(impl)));
}

Status WritableCheckpoint::AddFile(const std::string& name, std::span<const uint8_t> bytes) {
  TERN_REQUIRE(!impl_->committed, kInvalidArgument, "checkpoint already committed");
  TERN_REQUIRE(impl_->is_directory, kInvalidArgument, impl_->path,
               " is a single file; passenger files need a directory checkpoint");
  TERN_REQUIRE(PlainFileName(name), kInvalidArgument, "'", name, "' is not a plain file name");
  return WriteNewFile(*impl_->env, impl_->staging + "/" + name, bytes);
}

Status WritableCheckpoint::CopyFileFrom(const std::string& source_path, const std::string& name) {
  TERN_REQUIRE(!impl_->committed, kInvalidArgument, "checkpoint already committed");
  TERN_REQUIRE(impl_->is_directory, kInvalidArgument, impl_->path,
               " is a single file; passenger files need a directory checkpoint");
  TERN_REQUIRE(PlainFileName(name), kInvalidArgument, "'", name, "' is not a plain file name");
  const std::string dst = impl_->staging + "/" + name;
  TERN_REQUIRE(!Exists(*impl_->env, dst), kAlreadyExists, impl_->path, " already has a file ", name);
  return impl_->env->CopyFile(source_path, dst);
}

Status WritableCheckpoint::Commit() {
  Impl& s = *impl_;
  Env& env = *s.env;
  TERN_REQUIRE(!s.committed, kInvalidArgument, s.path, ": already committed");
  for (const auto& map : s.maps) TERN_RETURN_IF_ERROR(map->Sync());
  if (s.is_directory) TERN_RETURN_IF_ERROR(SyncTree(env, s.staging, 0));

  Status renamed = env.Rename(s.staging, s.path, RenameMode::kNoReplace);
  if (renamed.code() == Code::kAlreadyExists) {
    TERN_REQUIRE(s.overwrite, kAlreadyExists, s.path, " exists");
    if (!s.is_directory) {
      TERN_RETURN_IF_ERROR(env.Rename(s.staging, s.path, RenameMode::kReplace));
    } else {
      // rename(2) will not replace a non-empty directory: swap atomically,
      // then the old tree sits at the staging name and is removed.
      TERN_RETURN_IF_ERROR(env.Rename(s.staging, s.path, RenameMode::kExchange));
      s.committed = true;
      (void)RemoveTree(env, s.staging);  // the old tree; a leftover is only litter
    }
  } else {
    TERN_RETURN_IF_ERROR(renamed);
  }
  s.committed = true;
  return env.SyncPath(ParentDir(s.path));
}

}  // namespace tern

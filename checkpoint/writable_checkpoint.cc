// WritableCheckpoint: staged creation and cloning, atomic commit.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>

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

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

Status CheckDestination(const std::string& path, bool overwrite) {
  TERN_REQUIRE(!path.empty(), kInvalidArgument, "empty checkpoint path");
  const std::string parent = fsutil::ParentDir(path);
  struct stat st;
  TERN_REQUIRE(::stat(parent.c_str(), &st) == 0 && S_ISDIR(st.st_mode), kNotFound, path,
               ": parent directory ", parent, " does not exist");
  TERN_REQUIRE(overwrite || !Exists(path), kAlreadyExists, path, " exists");
  return Status::Ok();
}

Status CopyTree(const std::string& from, const std::string& to, int depth, size_t* entries) {
  TERN_REQUIRE(depth <= kCloneDepthMax, kResourceExhausted, from, ": directories nested deeper than ",
               kCloneDepthMax);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(from, ec)) {
    TERN_REQUIRE(++*entries <= kCloneEntriesMax, kResourceExhausted, from, ": more than ",
                 kCloneEntriesMax, " files");
    const std::string name = e.path().filename().string();
    const std::string src = from + "/" + name, dst = to + "/" + name;
    // Follows symlinks: a Hugging Face cache snapshot is a directory of links
    // into its blob store, and the clone must hold the bytes.
    if (e.is_directory(ec)) {
      if (::mkdir(dst.c_str(), 0755) != 0) return TERN_ERRNO("mkdir ", dst);
      TERN_RETURN_IF_ERROR(CopyTree(src, dst, depth + 1, entries));
    } else if (e.is_regular_file(ec)) {
      TERN_RETURN_IF_ERROR(fsutil::CopyFile(src, dst));
    }
  }
  if (ec) return TERN_ERROR(kIo, "list ", from, ": ", ec.message());
  return Status::Ok();
}

Status SyncTree(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file(ec) || e.is_directory(ec))
      TERN_RETURN_IF_ERROR(fsutil::FsyncPath(e.path().string()));
  if (ec) return TERN_ERROR(kIo, "list ", dir, ": ", ec.message());
  return fsutil::FsyncPath(dir);
}

std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

}  // namespace

struct WritableCheckpoint::Impl {
  std::string path;
  std::string staging;
  bool is_directory = false;
  bool overwrite = false;
  bool committed = false;
  std::vector<std::string> files;  // relative to staging when a directory
  std::vector<fsutil::MappedFile> maps;
  std::vector<TensorDesc> tensors;  // sorted by name
  MutableServeView view;

  std::string FilePath(size_t i) const { return is_directory ? staging + "/" + files[i] : staging; }

  ~Impl() {
    if (committed) return;
    maps.clear();
    if (!staging.empty()) fsutil::RemoveTree(staging);
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
  TERN_RETURN_IF_ERROR(CheckDestination(path, options.overwrite));
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
  impl->path = path;
  impl->overwrite = options.overwrite;
  impl->is_directory = !EndsWith(path, ".safetensors");
  impl->staging = path + ".tmp-" + fsutil::RandomHex();

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
    impl->files.push_back(fsutil::BaseName(path));
  } else if (shards == 1) {
    impl->files.push_back("model.safetensors");
  } else {
    for (size_t k = 0; k < shards; ++k) impl->files.push_back(ShardName(k, shards));
  }

  std::vector<TensorLocation> locations(tensors.size());
  std::vector<std::string> header_texts(shards);
  std::vector<uint64_t> file_bytes(shards);
  for (size_t k = 0; k < shards; ++k) {
    std::vector<safetensors::PlacedTensor> placed;
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shard_of[i] != k) continue;
      placed.push_back({&tensors[i], offset, offset + sizes[i]});
      locations[i] = TensorLocation{k, offset, sizes[i]};
      offset += sizes[i];
    }
    // Also where names and metadata that are not valid UTF-8 are refused.
    TERN_ASSIGN_OR_RETURN(header_texts[k], safetensors::SerializeHeader(metadata, placed));
    TERN_REQUIRE(header_texts[k].size() - safetensors::kLengthBytes <= kSafetensorsHeaderBytesMax,
                 kInvalidArgument, path, ": header of ", header_texts[k].size(),
                 " bytes exceeds the format's limit");
    for (size_t i = 0; i < tensors.size(); ++i)
      if (shard_of[i] == k) locations[i].offset_bytes += header_texts[k].size();
    file_bytes[k] = header_texts[k].size() + offset;
  }

  if (impl->is_directory && ::mkdir(impl->staging.c_str(), 0755) != 0)
    return TERN_ERRNO("mkdir ", impl->staging);
  for (size_t k = 0; k < shards; ++k) {
    TERN_ASSIGN_OR_RETURN(fsutil::MappedFile map,
                          fsutil::MappedFile::Create(impl->FilePath(k), file_bytes[k]));
    std::memcpy(map.data(), header_texts[k].data(), header_texts[k].size());
    impl->maps.push_back(std::move(map));
  }
  if (shards > 1) {
    safetensors::WeightMap weight_map;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      weight_map.emplace_back(tensors[i].name, impl->files[shard_of[i]]);
      total += sizes[i];
    }
    std::sort(weight_map.begin(), weight_map.end());
    TERN_ASSIGN_OR_RETURN(const std::string index, safetensors::SerializeIndex(total, weight_map));
    TERN_RETURN_IF_ERROR(fsutil::WriteNewFile(
        impl->staging + "/" + kSafetensorsIndexName,
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
        MutableTensorRef{&impl->tensors[k], impl->maps[loc.file_index].data() + loc.offset_bytes});
  }
  return std::unique_ptr<WritableCheckpoint>(new WritableCheckpoint(std::move(impl)));
}

Result<std::unique_ptr<WritableCheckpoint>> WritableCheckpoint::CloneForWrite(
    const Checkpoint& base, const std::string& path_in, const CloneOptions& options) {
  const std::string path = StripSlashes(path_in);
  TERN_RETURN_IF_ERROR(CheckDestination(path, options.overwrite));
  const Checkpoint::Impl& b = *base.impl_;
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->overwrite = options.overwrite;
  impl->is_directory = b.is_directory;
  impl->staging = path + ".tmp-" + fsutil::RandomHex();
  impl->files = b.files;
  if (b.is_directory) {
    if (::mkdir(impl->staging.c_str(), 0755) != 0) return TERN_ERRNO("mkdir ", impl->staging);
    size_t entries = 0;
    TERN_RETURN_IF_ERROR(CopyTree(b.path, impl->staging, 0, &entries));
  } else {
    TERN_RETURN_IF_ERROR(fsutil::CopyFile(b.path, impl->staging));
  }
  for (size_t i = 0; i < b.files.size(); ++i) {
    TERN_ASSIGN_OR_RETURN(fsutil::MappedFile map, fsutil::MappedFile::OpenReadWrite(impl->FilePath(i)));
    // The base was validated at Open; make sure the copy is of those bytes.
    const auto header = base.header_bytes(i);
    TERN_REQUIRE(map.size() == b.maps[i].size() && map.size() >= header.size() &&
                     std::memcmp(map.data(), header.data(), header.size()) == 0,
                 kMismatch, b.FilePath(i), " changed while it was being cloned");
    impl->maps.push_back(std::move(map));
  }
  impl->tensors = b.tensors;
  impl->view.tensors.reserve(impl->tensors.size());
  for (size_t k = 0; k < impl->tensors.size(); ++k) {
    const TensorLocation& loc = b.locations[k];
    impl->view.tensors.push_back(
        MutableTensorRef{&impl->tensors[k], impl->maps[loc.file_index].data() + loc.offset_bytes});
  }
  return std::unique_ptr<WritableCheckpoint>(new WritableCheckpoint(std::move(impl)));
}

Status WritableCheckpoint::AddFile(const std::string& name, std::span<const uint8_t> bytes) {
  TERN_REQUIRE(!impl_->committed, kInvalidArgument, "checkpoint already committed");
  TERN_REQUIRE(impl_->is_directory, kInvalidArgument, impl_->path,
               " is a single file; passenger files need a directory checkpoint");
  TERN_REQUIRE(fsutil::PlainFileName(name), kInvalidArgument, "'", name, "' is not a plain file name");
  return fsutil::WriteNewFile(impl_->staging + "/" + name, bytes);
}

Status WritableCheckpoint::CopyFileFrom(const std::string& source_path, const std::string& name) {
  TERN_REQUIRE(!impl_->committed, kInvalidArgument, "checkpoint already committed");
  TERN_REQUIRE(impl_->is_directory, kInvalidArgument, impl_->path,
               " is a single file; passenger files need a directory checkpoint");
  TERN_REQUIRE(fsutil::PlainFileName(name), kInvalidArgument, "'", name, "' is not a plain file name");
  const std::string dst = impl_->staging + "/" + name;
  TERN_REQUIRE(!Exists(dst), kAlreadyExists, impl_->path, " already has a file ", name);
  return fsutil::CopyFile(source_path, dst);
}

Status WritableCheckpoint::Commit() {
  Impl& s = *impl_;
  TERN_REQUIRE(!s.committed, kInvalidArgument, s.path, ": already committed");
  for (const auto& map : s.maps) TERN_RETURN_IF_ERROR(map.Sync());
  if (s.is_directory) TERN_RETURN_IF_ERROR(SyncTree(s.staging));

  if (::renameat2(AT_FDCWD, s.staging.c_str(), AT_FDCWD, s.path.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST) {
      TERN_REQUIRE(s.overwrite, kAlreadyExists, s.path, " exists");
      if (!s.is_directory) {
        if (::rename(s.staging.c_str(), s.path.c_str()) != 0) return TERN_ERRNO("rename to ", s.path);
      } else {
        // rename(2) will not replace a non-empty directory: swap atomically,
        // then the old tree sits at the staging name and is removed.
        if (::renameat2(AT_FDCWD, s.staging.c_str(), AT_FDCWD, s.path.c_str(), RENAME_EXCHANGE) != 0)
          return TERN_ERRNO("exchange ", s.staging, " with ", s.path);
        s.committed = true;
        fsutil::RemoveTree(s.staging);
      }
    } else if (err == EINVAL || err == ENOSYS) {
      // A file system without RENAME_NOREPLACE: check, then rename (racy, but
      // only against another writer of the same path).
      TERN_REQUIRE(s.overwrite || !Exists(s.path), kAlreadyExists, s.path, " exists");
      if (::rename(s.staging.c_str(), s.path.c_str()) != 0) return TERN_ERRNO("rename to ", s.path);
    } else {
      errno = err;
      return TERN_ERRNO("rename ", s.staging, " to ", s.path);
    }
  }
  s.committed = true;
  return fsutil::FsyncPath(fsutil::ParentDir(s.path));
}

}  // namespace tern

// Checkpoint: opening and validating single-file and sharded checkpoints.
#include <algorithm>
#include <numeric>

#include "base/path.h"
#include "checkpoint/checkpoint_impl.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_index.h"
#include "checkpoint/strict_json.h"

namespace tern {
namespace {

using checkpoint::json::Quoted;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

struct Found {
  const TensorDesc* desc;
  size_t file;
};

}  // namespace

Checkpoint::Checkpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpoint::~Checkpoint() = default;

const ServeView& Checkpoint::view() const { return impl_->view; }
const std::vector<TensorDesc>& Checkpoint::tensors() const { return impl_->tensors; }
const std::vector<TensorLocation>& Checkpoint::locations() const { return impl_->locations; }
const std::string& Checkpoint::path() const { return impl_->path; }
bool Checkpoint::sharded() const { return impl_->sharded; }
const std::vector<std::string>& Checkpoint::files() const { return impl_->files; }

const std::map<std::string, std::string>& Checkpoint::metadata(const std::string& file) const {
  static const std::map<std::string, std::string> kEmpty;
  auto it = impl_->metadata.find(file);
  return it == impl_->metadata.end() ? kEmpty : it->second;
}

std::span<const uint8_t> Checkpoint::header_bytes(size_t file_index) const {
  TERN_ASSERT(file_index < impl_->files.size());
  return impl_->maps[file_index]->bytes().first(impl_->header_bytes[file_index]);
}

Result<TensorLocation> Checkpoint::Locate(std::string_view name) const {
  const auto& t = impl_->tensors;
  auto it = std::lower_bound(t.begin(), t.end(), name,
                             [](const TensorDesc& d, std::string_view n) { return d.name < n; });
  TERN_REQUIRE(it != t.end() && it->name == name, kNotFound, impl_->path, ": no tensor ",
               Quoted(name));
  return impl_->locations[static_cast<size_t>(it - t.begin())];
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path,
                                                     const OpenOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->env = options.env != nullptr ? options.env : &DefaultEnv();
  impl->path = path;
  Env& env = *impl->env;
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/true));
  checkpoint::WeightMap weight_map;
  if (type == FileType::kMissing) {
    return TERN_ERROR(kNotFound, path, ": no such file or directory");
  } else if (type == FileType::kRegular) {
    impl->files.push_back(BaseName(path));
  } else if (type == FileType::kDirectory) {
    impl->is_directory = true;
    const std::string index_path = path + "/" + kSafetensorsIndexName;
    TERN_ASSIGN_OR_RETURN(FileType index_type, env.TypeOf(index_path, /*follow_links=*/true));
    if (index_type != FileType::kMissing) {
      impl->sharded = true;
      std::string text;
      Status read = ReadFileToString(env, index_path, checkpoint::kIndexBytesMax, &text);
      if (read.code() == Code::kResourceExhausted) return Status(Code::kCorrupt, read.message());
      TERN_RETURN_IF_ERROR(read);
      auto parsed = checkpoint::ParseIndex(text);
      if (!parsed.ok()) return parsed.status().WithContext(index_path);
      weight_map = std::move(parsed).value();
      for (const auto& [tensor, file] : weight_map) impl->files.push_back(file);
      std::sort(impl->files.begin(), impl->files.end());
      impl->files.erase(std::unique(impl->files.begin(), impl->files.end()), impl->files.end());
    } else {
      TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(path, 1'000'000));
      for (const std::string& name : names) {
        if (!EndsWith(name, ".safetensors")) continue;
        TERN_ASSIGN_OR_RETURN(FileType t, env.TypeOf(path + "/" + name, /*follow_links=*/true));
        if (t == FileType::kRegular) impl->files.push_back(name);
      }
      TERN_REQUIRE(!impl->files.empty(), kNotFound, path, ": no ", kSafetensorsIndexName,
                   " and no .safetensors file");
      TERN_REQUIRE(impl->files.size() == 1, kInvalidArgument, path, ": ", impl->files.size(),
                   " .safetensors files but no ", kSafetensorsIndexName, " to say which to use");
    }
  } else {
    return TERN_ERROR(kInvalidArgument, path, ": not a file or directory");
  }

  std::vector<Found> found;
  std::vector<checkpoint::ParsedHeader> headers;
  for (size_t i = 0; i < impl->files.size(); ++i) {
    const std::string file_path = impl->FilePath(i);
    auto opened =
        env.Map(file_path, options.populate ? MapMode::kReadOnlyPopulate : MapMode::kReadOnly);
    if (!opened.ok() && opened.status().code() == Code::kNotFound && impl->sharded)
      return TERN_ERROR(kCorrupt, path, "/", kSafetensorsIndexName, ": names shard ",
                        impl->files[i], ", which does not exist");
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, std::move(opened));
    auto header = checkpoint::ParseHeader(map->bytes(), map->size());
    if (!header.ok()) return header.status().WithContext(file_path);
    impl->header_bytes.push_back(header->data_offset_bytes());
    if (header->has_metadata) impl->metadata[impl->files[i]] = header->metadata;
    impl->maps.push_back(std::move(map));
    headers.push_back(std::move(header).value());
  }

  size_t count = 0;
  for (const auto& h : headers) count += h.tensors.size();
  impl->tensors.reserve(count);
  std::vector<TensorLocation> locations;
  locations.reserve(count);
  for (size_t i = 0; i < headers.size(); ++i) {
    for (auto& t : headers[i].tensors) {
      locations.push_back(TensorLocation{i, headers[i].data_offset_bytes() + t.begin_bytes,
                                         t.end_bytes - t.begin_bytes});
      impl->tensors.push_back(std::move(t.desc));
    }
  }
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return impl->tensors[a].name < impl->tensors[b].name;
  });
  {
    std::vector<TensorDesc> sorted;
    sorted.reserve(count);
    for (size_t k : order) {
      sorted.push_back(std::move(impl->tensors[k]));
      impl->locations.push_back(locations[k]);
    }
    impl->tensors = std::move(sorted);
  }
  for (size_t k = 1; k < count; ++k)
    TERN_REQUIRE(impl->tensors[k].name != impl->tensors[k - 1].name, kCorrupt, path,
                 ": tensor ", Quoted(impl->tensors[k].name), " is in both ",
                 impl->files[impl->locations[k - 1].file_index], " and ",
                 impl->files[impl->locations[k].file_index]);

  if (impl->sharded) {
    // The index and the shards must agree exactly: both lists are sorted by name.
    size_t k = 0;
    for (const auto& [tensor, file] : weight_map) {
      TERN_REQUIRE(k < count && impl->tensors[k].name <= tensor, kCorrupt, path, "/",
                   kSafetensorsIndexName, ": names tensor ", Quoted(tensor), " in ", file,
                   ", which has no such tensor");
      TERN_REQUIRE(impl->tensors[k].name == tensor, kCorrupt, path, "/",
                   impl->files[impl->locations[k].file_index], ": tensor ",
                   Quoted(impl->tensors[k].name), " is missing from the index weight_map");
      const std::string& actual = impl->files[impl->locations[k].file_index];
      TERN_REQUIRE(actual == file, kCorrupt, path, "/", kSafetensorsIndexName, ": maps tensor ",
                   Quoted(tensor), " to ", file, " but it is in ", actual);
      ++k;
    }
    TERN_REQUIRE(k == count, kCorrupt, path, "/", impl->files[impl->locations[k].file_index],
                 ": tensor ", Quoted(impl->tensors[k].name), " is missing from the index weight_map");
  }

  impl->view.tensors.reserve(count);
  for (size_t k = 0; k < count; ++k) {
    const TensorLocation& loc = impl->locations[k];
    impl->view.tensors.push_back(
        TensorRef{&impl->tensors[k], impl->maps[loc.file_index]->data() + loc.offset_bytes});
  }
  return std::unique_ptr<Checkpoint>(new Checkpoint(std::move(impl)));
}

void SortLikeReferenceWriter(std::vector<TensorDesc>& tensors) {
  // Position of each DType in the reference library's Dtype enum, which is in
  // increasing alignment order; its writer emits the highest first.
  auto rank = [](DType d) {
    switch (d) {
      case DType::kBool: return 0;
      case DType::kF4: return 1;
      case DType::kU8: return 4;
      case DType::kI8: return 5;
      case DType::kF8E5M2: return 6;
      case DType::kF8E4M3: return 7;
      case DType::kF8E8M0: return 8;
      case DType::kI16: return 11;
      case DType::kU16: return 12;
      case DType::kF16: return 13;
      case DType::kBF16: return 14;
      case DType::kI32: return 15;
      case DType::kU32: return 16;
      case DType::kF32: return 17;
      case DType::kF64: return 19;
      case DType::kI64: return 20;
      case DType::kU64: return 21;
    }
    return 0;
  };
  std::stable_sort(tensors.begin(), tensors.end(), [&](const TensorDesc& a, const TensorDesc& b) {
    const int ra = rank(a.dtype), rb = rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
}

}  // namespace tern

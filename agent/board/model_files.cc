// StoreModelFiles and RetainModelFiles (agent/board/model_files.h).
#include "agent/board/model_files.h"

#include <algorithm>

#include "base/text.h"

namespace tern::agent {
namespace {

// A checkpoint directory is listed with this bound (shards + files + more).
constexpr uint64_t kCheckpointEntriesMax = 100000;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

Result<std::vector<ManifestFile>> StoreModelFiles(Env& env, const std::string& checkpoint_path,
                                                  const std::string& files_dir, const LogFn& log) {
  std::vector<ManifestFile> out;
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(checkpoint_path, /*follow_links=*/true));
  if (type != FileType::kDirectory) return out;
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(checkpoint_path, kCheckpointEntriesMax));
  uint64_t total = 0;
  for (const std::string& name : names) {  // sorted: the manifest's order
    if (!ValidModelFileName(name)) continue;
    const std::string path = checkpoint_path + "/" + name;
    TERN_ASSIGN_OR_RETURN(FileType t, env.TypeOf(path, /*follow_links=*/true));
    if (t != FileType::kRegular) continue;
    TERN_ASSIGN_OR_RETURN(uint64_t size, env.FileSize(path));
    if (size > kMaxManifestFileBytes) {
      log(internal::StrCat("publish: ", path, " (", size, " bytes) is over ",
                           kMaxManifestFileBytes, " bytes: not a model file, not shipped"));
      continue;
    }
    TERN_REQUIRE(out.size() < kMaxManifestFiles, kInvalidArgument, "publish: ", checkpoint_path,
                 " holds more than ", kMaxManifestFiles,
                 " model files (small regular files beside the tensors); move the others out");
    std::string bytes;
    TERN_RETURN_IF_ERROR(ReadFileToString(env, path, kMaxManifestFileBytes, &bytes));
    total += bytes.size();
    TERN_REQUIRE(total <= kMaxManifestFilesTotalBytes, kInvalidArgument, "publish: the model files of ",
                 checkpoint_path, " hold more than ", kMaxManifestFilesTotalBytes, " bytes");
    ManifestFile f{name, bytes.size(), Sha256Of(Bytes(bytes))};
    const std::string stored = files_dir + "/" + Hex(f.sha256);
    TERN_ASSIGN_OR_RETURN(FileType there, env.TypeOf(stored, false));
    if (there == FileType::kMissing) {
      TERN_RETURN_IF_ERROR(CreateDirs(env, files_dir));
      TERN_RETURN_IF_ERROR(WriteFileAtomic(env, stored, Bytes(bytes), /*overwrite=*/false));
    }
    out.push_back(std::move(f));
  }
  return out;
}

Status RetainModelFiles(Env& env, const std::string& files_dir, const std::set<std::string>& keep) {
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(files_dir, false));
  if (type == FileType::kMissing) return Status::Ok();
  // At most kMaxManifestFiles per version the board holds, plus leftovers.
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(files_dir, kCheckpointEntriesMax));
  for (const std::string& name : names) {
    if (keep.count(name) != 0) continue;
    Status st = env.RemoveFile(files_dir + "/" + name);
    if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("retaining model files");
  }
  return Status::Ok();
}

}  // namespace tern::agent

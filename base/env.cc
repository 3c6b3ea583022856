// The Env operations that are compositions of its calls: one implementation
// for every Env, so the POSIX, in-memory and fault-injecting ones cannot
// drift apart.
#include "tern/env.h"

#include "base/path.h"

namespace tern {
namespace {

constexpr uint64_t kTreeEntriesMax = 1'000'000;
constexpr int kTreeDepthMax = 64;

Status RemoveTreeAt(Env& env, const std::string& path, int depth, uint64_t* entries) {
  TERN_REQUIRE(depth <= kTreeDepthMax, kResourceExhausted, path, ": directories nested deeper than ",
               kTreeDepthMax);
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/false));
  if (type == FileType::kMissing) return Status::Ok();
  if (type != FileType::kDirectory) {
    Status st = env.RemoveFile(path);
    return st.code() == Code::kNotFound ? Status::Ok() : st;
  }
  TERN_ASSIGN_OR_RETURN(auto names, env.ListDir(path, kTreeEntriesMax));
  for (const std::string& name : names) {
    TERN_REQUIRE(++*entries <= kTreeEntriesMax, kResourceExhausted, path, ": more than ",
                 kTreeEntriesMax, " entries");
    TERN_RETURN_IF_ERROR(RemoveTreeAt(env, path + "/" + name, depth + 1, entries));
  }
  Status st = env.RemoveDir(path);
  return st.code() == Code::kNotFound ? Status::Ok() : st;
}

}  // namespace

Status ReadFileToString(Env& env, const std::string& path, uint64_t size_max, std::string* out) {
  TERN_ASSIGN_OR_RETURN(auto file, env.OpenReadable(path));
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/true));
  TERN_REQUIRE(type == FileType::kRegular, kInvalidArgument, path, ": not a regular file");
  TERN_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  TERN_REQUIRE(size <= size_max, kResourceExhausted, path, ": ", size,
               " bytes is more than the limit of ", size_max);
  out->assign(static_cast<size_t>(size), '\0');
  TERN_ASSIGN_OR_RETURN(uint64_t got, file->ReadAt(0, out->data(), size));
  out->resize(static_cast<size_t>(got));  // the file may have shrunk meanwhile
  return Status::Ok();
}

Status WriteNewFile(Env& env, const std::string& path, std::span<const uint8_t> bytes) {
  TERN_ASSIGN_OR_RETURN(auto file, env.OpenWritable(path, CreateMode::kNew));
  Status st = file->Append(bytes);
  if (st.ok()) st = file->Close();
  if (!st.ok()) {
    file.reset();
    (void)env.RemoveFile(path);
  }
  return st;
}

Status WriteFileAtomic(Env& env, const std::string& path, std::span<const uint8_t> bytes,
                       bool overwrite, CreateMode create) {
  TERN_ASSERT(create != CreateMode::kTruncate, "WriteFileAtomic writes a fresh temporary");
  if (!overwrite) {
    TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/false));
    TERN_REQUIRE(type == FileType::kMissing, kAlreadyExists, path, " exists");
  }
  const std::string tmp = path + ".tmp-" + RandomHex();
  TERN_ASSIGN_OR_RETURN(auto file, env.OpenWritable(tmp, create));
  Status st = file->Append(bytes);
  if (st.ok()) st = file->Sync();
  if (st.ok()) st = file->Close();
  file.reset();
  if (st.ok()) st = env.Rename(tmp, path, overwrite ? RenameMode::kReplace : RenameMode::kNoReplace);
  if (!st.ok()) {
    (void)env.RemoveFile(tmp);
    return st;
  }
  // The rename is durable only once the directory entry is.
  return env.SyncPath(ParentDir(path));
}

Status CreateDirs(Env& env, const std::string& path) {
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, /*follow_links=*/true));
  if (type == FileType::kDirectory) return Status::Ok();
  TERN_REQUIRE(type == FileType::kMissing, kAlreadyExists, path, " exists and is not a directory");
  const std::string parent = ParentDir(path);
  if (parent != path) TERN_RETURN_IF_ERROR(CreateDirs(env, parent));
  Status st = env.CreateDir(path);
  if (st.code() == Code::kAlreadyExists) {  // made by someone else meanwhile
    TERN_ASSIGN_OR_RETURN(FileType now, env.TypeOf(path, /*follow_links=*/true));
    if (now == FileType::kDirectory) return Status::Ok();
  }
  return st;
}

Status RemoveTree(Env& env, const std::string& path) {
  uint64_t entries = 0;
  return RemoveTreeAt(env, path, 0, &entries);
}

}  // namespace tern

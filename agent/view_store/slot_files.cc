// WriteSlotFiles (agent/view_store/slot_files.h).
#include "agent/view_store/slot_files.h"

#include <set>

#include "base/path.h"

namespace tern::agent {
namespace {

// A slot holds its tensor files, the safetensors index when sharded, and
// the model files; nothing else is ever written there, but an operator's
// dot file is not ours to remove.
constexpr uint64_t kSlotEntriesMax = 4096;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

Status WriteSlotFiles(Env& env, const std::string& slot_path, const std::vector<SlotFile>& files) {
  if (files.empty()) return Status::Ok();  // a format-1 version: says nothing of its files
  TERN_REQUIRE(files.size() <= kMaxManifestFiles, kInvalidArgument, "slot files: ", files.size(),
               " files, more than ", kMaxManifestFiles);
  std::set<std::string> names;
  // Every source is checked before the slot is touched: a bad file leaves
  // the slot as it was.
  std::vector<std::string> contents;
  contents.reserve(files.size());
  for (const SlotFile& f : files) {
    TERN_REQUIRE(ValidModelFileName(f.file.name) && names.insert(f.file.name).second,
                 kInvalidArgument, "slot files: \"", f.file.name, "\" is not a model file name or is listed twice");
    std::string bytes;
    Status read = ReadFileToString(env, f.source_path, f.file.bytes, &bytes);
    if (read.code() == Code::kResourceExhausted)
      return TERN_ERROR(kAuth, "model file ", f.file.name, " (", f.source_path,
                        ") is longer than the ", f.file.bytes, " bytes its manifest signs");
    TERN_RETURN_IF_ERROR(read.WithContext("model file " + f.file.name));
    TERN_REQUIRE(bytes.size() == f.file.bytes && Sha256Of(Bytes(bytes)) == f.file.sha256, kAuth,
                 "model file ", f.file.name, " (", f.source_path,
                 ") does not match the SHA-256 its manifest signs");
    contents.push_back(std::move(bytes));
  }
  TERN_ASSIGN_OR_RETURN(auto present, env.ListDir(slot_path, kSlotEntriesMax));
  for (const std::string& name : present) {
    const bool leftover = name.rfind(".tmp-", 0) == 0;  // a write a crash cut short
    if (!leftover && (!ValidModelFileName(name) || names.count(name) != 0)) continue;
    TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(slot_path + "/" + name, false));
    if (type != FileType::kRegular) continue;
    TERN_RETURN_IF_ERROR(env.RemoveFile(slot_path + "/" + name));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = slot_path + "/" + files[i].file.name;
    std::string old;
    if (ReadFileToString(env, path, contents[i].size(), &old).ok() && old == contents[i]) continue;
    // A dot name, never mistaken for a model file; one a crash leaves
    // behind is removed by the next call on this slot.
    const std::string tmp = slot_path + "/.tmp-" + RandomHex();
    TERN_RETURN_IF_ERROR(WriteNewFile(env, tmp, Bytes(contents[i])));
    Status st = env.SyncPath(tmp);
    if (st.ok()) st = env.Rename(tmp, path, RenameMode::kReplace);
    if (!st.ok()) {
      (void)env.RemoveFile(tmp);
      return st;
    }
  }
  return env.SyncPath(slot_path);
}

}  // namespace tern::agent

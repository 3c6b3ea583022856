#include "agent/daemon/key_sets_file.h"

#include "agent/control/control_wire.h"
#include "base/coding.h"
#include "tern/key_set.h"

namespace tern::agent {

Result<KeySetsFile> ReadKeySetsFile(Env& env, const std::string& path) {
  KeySetsFile file;
  TERN_ASSIGN_OR_RETURN(FileType type, env.TypeOf(path, true));
  if (type == FileType::kMissing) return file;
  TERN_REQUIRE(type == FileType::kRegular, kIo, path, " is not a regular file");
  std::string bytes;
  TERN_RETURN_IF_ERROR(ReadFileToString(env, path, kMaxControlKeySets * (4 + kMaxSignedKeySetBytes), &bytes));
  std::string_view in(bytes);
  while (!in.empty()) {
    if (file.key_sets.size() == kMaxControlKeySets) {
      file.rest = TERN_ERROR(kResourceExhausted, path, ": more than ", kMaxControlKeySets, " key sets");
      break;
    }
    const uint64_t n = in.size() >= 4 ? DecodeFixedAt(in, 0, 4) : 0;
    if (n == 0 || n > kMaxSignedKeySetBytes || in.size() < 4 + n) {
      file.rest = TERN_ERROR(kCorrupt, path, ": entry ", file.key_sets.size() + 1,
                             " is truncated or malformed");
      break;
    }
    file.key_sets.emplace_back(in.substr(4, n));
    in.remove_prefix(4 + n);
  }
  return file;
}

Status WriteKeySetsFile(Env& env, const std::string& path, const std::vector<std::string>& key_sets) {
  TERN_REQUIRE(key_sets.size() <= kMaxControlKeySets, kResourceExhausted, "more than ",
               kMaxControlKeySets, " key sets");
  std::string out;
  for (const std::string& k : key_sets) {
    TERN_REQUIRE(!k.empty() && k.size() <= kMaxSignedKeySetBytes, kInvalidArgument,
                 "a signed key set of ", k.size(), " bytes");
    PutFixed32(&out, static_cast<uint32_t>(k.size()));
    out += k;
  }
  return WriteFileAtomic(env, path, {reinterpret_cast<const uint8_t*>(out.data()), out.size()}, true);
}

}  // namespace tern::agent

// A member's model files (docs/agent.md §3 "Model files"): each version's config,
// tokenizer and other non-tensor files, fetched from the root's object
// service by content (files/<sha256>), checked against the signed manifest,
// kept in DIR/files until no version this member may still apply names them,
// and handed to the view store, which writes them into the slot before the
// switch (agent/daemon/agent_impl.h).
#include <set>

#include "agent/daemon/agent_impl.h"
#include "base/text.h"

namespace tern::agent {
namespace {

// The cached copy holds exactly the signed bytes.
bool CachedFileIsGood(Env& env, const std::string& path, const ManifestFile& f) {
  std::string bytes;
  if (!ReadFileToString(env, path, f.bytes, &bytes).ok() || bytes.size() != f.bytes) return false;
  return Sha256Of({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}) == f.sha256;
}

}  // namespace

// On the work thread (it fetches: seconds at most for files this small,
// bounded by the fetch's own connect and stall deadlines).
Result<std::vector<SlotFile>> AgentImpl::MemberModelFiles(uint64_t version) {
  std::vector<ManifestFile> files;
  std::string fetch_address;
  {
    MutexLock lock(mu_);
    auto it = manifests_.find(version);
    TERN_REQUIRE(it != manifests_.end(), kNotFound, "no signed manifest of version ", version,
                 " names its model files");
    files = it->second.files;
    fetch_address = fetch_address_;
  }
  std::vector<SlotFile> out;
  if (files.empty()) return out;  // a format-1 version
  const std::string cache = opt_.data_dir + "/files";
  TERN_RETURN_IF_ERROR(CreateDirs(env_, cache));
  for (const ManifestFile& f : files) {
    const std::string name = ModelFileObjectName(f.sha256);  // "files/<hex>"
    const std::string local = opt_.data_dir + "/" + name;
    if (!CachedFileIsGood(env_, local, f)) {
      env_.RemoveFile(local).IgnoreError();
      TERN_REQUIRE(!fetch_address.empty(), kUnavailable, "model file ", f.name,
                   ": no object service address from the root yet");
      FetchOptions fo;
      fo.access_token = opt_.join_token;  // the root's object service requires it
      fo.resume = false;
      auto fetched = FetchFile(*opt_.transport, fetch_address, name, local, fo, clock_);
      if (!fetched.ok()) return fetched.status().WithContext("fetching model file " + f.name);
      // Refused like a bad chunk: the bytes go, the version is not applied.
      if (!CachedFileIsGood(env_, local, f)) {
        env_.RemoveFile(local).IgnoreError();
        return TERN_ERROR(kAuth, "model file ", f.name, " from ", fetch_address,
                          " does not match the SHA-256 its manifest signs");
      }
      Log("model file " + f.name + " (" + std::to_string(f.bytes) + " bytes) fetched for version " +
          std::to_string(version));
    }
    out.push_back({f, local});
  }
  return out;
}

// On the work thread, after a switch: files that no version from the served
// one on names go (bounded: the manifests kept, kMaxManifestFiles each).
void AgentImpl::MemberForgetModelFiles() {
  std::set<std::string> keep;
  {
    MutexLock lock(mu_);
    for (auto it = manifests_.lower_bound(store_version_); it != manifests_.end(); ++it)
      for (const ManifestFile& f : it->second.files) keep.insert(Hex(f.sha256));
  }
  const std::string cache = opt_.data_dir + "/files";
  auto names = env_.ListDir(cache, 4096);
  if (!names.ok()) return;  // none yet
  for (const std::string& name : *names)
    if (keep.count(name) == 0) env_.RemoveFile(cache + "/" + name).IgnoreError();
}

}  // namespace tern::agent

// DIR/key-sets: the signed key sets an agent applied after key set 0, in
// order, so that a restart does not bring a revoked key back (a member: what
// the root sent; the root: --key-set, POST /keys/rotate and the board in
// etcd). Each entry is a u32 length (little-endian) and the signed key set;
// at most kMaxControlKeySets entries, each at most kMaxSignedKeySetBytes.
// docs/format/agent.md §10.
#pragma once

#include <string>
#include <vector>

#include "tern/env.h"
#include "tern/status.h"

namespace tern::agent {

struct KeySetsFile {
  std::vector<std::string> key_sets;  // the well-formed entries, in order
  // Ok, or why the rest of the file was not read (a truncated or malformed
  // entry, or more than kMaxControlKeySets).
  Status rest;
};

// An absent file is an empty list. kIo and the like when it cannot be read.
Result<KeySetsFile> ReadKeySetsFile(Env& env, const std::string& path);
// Atomically (the previous list stays whole until the new one is durable).
Status WriteKeySetsFile(Env& env, const std::string& path, const std::vector<std::string>& key_sets);

}  // namespace tern::agent

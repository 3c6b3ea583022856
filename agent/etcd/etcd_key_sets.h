// The board's key-set chain kept in etcd beside its log, so that a standby
// root that takes over learns the key sets its predecessor applied (`tern
// keys push`, --key-set) without being given them again by flag
// (docs/security.md "Key rotation and revocation", docs/agent/etcd.md §3a).
// Layout:
//   <prefix>/key-sets/<seq: 20 digits>   signed key set number seq (1, 2, ...)
// etcd is not trusted with them: these are the signed bytes, and the agent
// verifies each against the key set before it (ApplyKeySet) as it would a
// chain sent by its root. What whoever writes etcd can do is withhold or
// delete entries (a standby then knows less than its predecessor: its own
// DIR/key-sets and flags still apply, and members refuse what their own
// chain revoked), never add a key set nobody with a current key signed.
//
// Errors: kUnavailable when etcd cannot be reached (a Put may or may not have
// happened: it is safe to retry); kMismatch when the fence failed (this root
// no longer leads: nothing was written) or etcd already holds other bytes
// under that number (a fork of the chain); kCorrupt, naming the key, for what
// this layout does not produce (a foreign key, a gap in the numbers, an empty
// or oversized value, more entries than the bound).
//
// Thread safety: every method may be called from any thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/etcd/etcd.h"

namespace tern::agent {

struct EtcdKeySetsOptions {
  std::string prefix;  // the board's etcd prefix ("/tern/main"): 1 .. 512 bytes, no trailing '/'
  // When set, Put also requires it (Election::Fence()): a deposed root
  // cannot extend the chain behind its successor's back.
  std::optional<EtcdCompare> fence;
  uint32_t max_key_sets = 64;              // entries Load accepts (the control wire's bound)
  size_t max_key_set_bytes = size_t{4096};  // bytes per entry (a signed key set's bound)
};

class EtcdKeySets {
 public:
  // Validates the options; connects lazily (the first request).
  static Result<std::unique_ptr<EtcdKeySets>> Open(EtcdOptions etcd, EtcdKeySetsOptions options);

  // Key sets 1..N as etcd holds them, in order (empty when none).
  Result<std::vector<std::string>> Load();
  // Writes key set `seq` (>= 1) when it is absent and key set seq - 1 is
  // present (seq 1: nothing below). Ok when etcd already holds exactly these
  // bytes under seq (a retried write). Never overwrites.
  Status Put(uint64_t seq, std::string_view signed_key_set);

 private:
  EtcdKeySets(std::unique_ptr<EtcdClient> client, EtcdKeySetsOptions options);
  std::string Key(uint64_t seq) const;

  std::unique_ptr<EtcdClient> client_;
  const EtcdKeySetsOptions options_;
};

}  // namespace tern::agent

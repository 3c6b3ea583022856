// How the sidecar learns the version its replica serves (docs/engines.md).
//
// The served version is the one the local member reports: the follower
// polls, every poll_ms, either
//  * the member's admin port: GET /status (agent/daemon/agent_status.cc),
//    "served_version" (0: none yet), or "engine"."version" when the member
//    drives the engine (tern-agent --engine: the engine's version lags the
//    member's by its update), and "head" (the newest it knows), with the
//    admin token when one is set; or
//  * a version file holding one decimal version (whoever loads the engine
//    writes it, e.g. with an atomic rename), for engines driven by other
//    tools;
// and commits each new version through the gate (VersionGate::Commit with
// nothing to apply: the engine already serves it), so requests in flight
// are attributed by the gate's rules. A failed poll keeps the last version
// and sets the sync state to "ERROR" with the reason until a poll succeeds.
//
// Thread-safe. Start runs one thread; Stop (also the destructor) joins it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "agent/sidecar/version_gate.h"
#include "tern/log.h"
#include "tern/status.h"

namespace tern::agent {

struct MemberVersions {
  // 0: none. The engine's version ("engine".version) when the member drives
  // its engine, else the member's served_version.
  uint64_t served = 0;
  bool engine = false;  // served is the engine's
  uint64_t head = 0;
  // The member's "freshness" (docs/security.md "Freshness"): it cannot show
  // that its version is fresh (cut off from the root, behind, clock skew),
  // for this reason. A /status without "freshness".stale (a root, an older
  // member) counts as not stale.
  bool stale = false;
  std::string stale_reason;
  // Board epochs (docs/agent/board.md §4a; absent from an older member's
  // /status: 0): HEAD's and the served version's (driving its engine: the
  // engine's version's, engine.epoch, when the member names it). Versions
  // are positions (epoch, version); a supersede renumbers below a
  // withdrawn HEAD.
  uint32_t head_epoch = 0, served_epoch = 0;
  // The served number was withdrawn by a supersede: it is of an epoch below
  // HEAD's, or (driving its engine, a member that names no engine.epoch)
  // the engine serves a number above HEAD's, which only a withdrawn version
  // can be.
  // Such a number must satisfy no version constraint, however large.
  bool superseded() const {
    return served_epoch < head_epoch || (engine && head != 0 && served > head);
  }
};

// The fields of a member's /status JSON: served_version and head (kCorrupt
// when absent or not non-negative integers), engine.version (optional; when
// present it is the served version), head_epoch, served_epoch and
// engine.epoch (optional; kCorrupt when not 32-bit unsigned; engine.epoch,
// when present, is the served epoch), and freshness.stale,
// freshness.stale_reason (optional; kCorrupt when of another type).
Result<MemberVersions> ParseMemberStatus(std::string_view json);
// One decimal version, surrounding whitespace allowed (kCorrupt otherwise).
Result<uint64_t> ParseVersionFile(std::string_view text);

struct FollowerOptions {
  std::string agent_admin;   // [https://]HOST:PORT of the member's admin port, or
  std::string version_file;  // a path (exactly one of the two)
  std::string admin_token;   // the member's admin token, if it has one
  std::string admin_ca_pem;  // https:// agent_admin: its CA (PEM); empty: the system's
  // https:// agent_admin that requires a client certificate
  // (--admin-tls-client-ca): ours and its key (PEM), both or neither.
  std::string admin_cert_pem, admin_key_pem;
  uint32_t poll_ms = 200;
  uint32_t drain_timeout_ms = 60000;  // per commit; a timed-out commit is retried
  LogFn log;                          // null: stderr
};

class VersionFollower {
 public:
  static Result<std::unique_ptr<VersionFollower>> Start(FollowerOptions options, VersionGate& gate);
  ~VersionFollower();
  void Stop();

  // The seed system's sync_state ("IDLE", "FETCHING" while the member knows
  // a newer version than it serves, "COMMITTING", "ERROR") and the reason
  // of the last failed poll (empty when the last poll succeeded).
  std::string sync_state() const;
  std::string last_error() const;
  // Whether the member reports itself stale, and why. Following the admin
  // port, a failed poll counts as stale (the member could not show it is
  // fresh); following a version file, never stale (a file says nothing).
  bool member_stale(std::string* reason) const;
  // Whether the last poll found the served number withdrawn by a supersede
  // (MemberVersions::superseded); false after a failed poll and for a
  // version file (it carries no epoch). Set before the gate commits the
  // polled number and cleared after, so that neither the old nor the new
  // number is ever admitted unflagged while it is withdrawn.
  bool superseded() const;

 private:
  VersionFollower(FollowerOptions options, VersionGate& gate);
  void Run();
  Result<MemberVersions> Poll();

  const FollowerOptions options_;
  VersionGate& gate_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string last_error_;
  bool stale_ = false;
  std::string stale_reason_;
  bool superseded_ = false;
  bool superseded_early_ = false;  // this poll's, while its commit runs
};

}  // namespace tern::agent

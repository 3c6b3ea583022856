// The commit point an engine driver holds open across an engine update
// (tern-agent --engine-sidecar; docs/engines.md, "The commit point").
//
// The sidecar's gate (version_gate.h) changes the served version at a
// commit: admission closes, the requests that must not cross the change
// finish, the engine loads the version, the gate flips and reopens. When
// another process loads the engine (the member's engine driver), that
// process must hold the gate between "drained" and "loaded", or a request
// stamped with the old version could run on the new weights. Begin opens a
// commit of `version` and returns once nothing that must not cross is in
// flight and admission is closed; End says whether the engine loaded it
// (the gate flips to it) or not (it stays on the version it had), and
// returns once admission has reopened.
//
// Bounds: one commit open at a time (a second Begin: kUnavailable);
// Begin waits at most the drain timeout plus kBeginSlackMs; a commit whose
// End does not come within its hold time (at most hold_ms_max) ends as not
// loaded, so a driver that died never keeps admission closed longer.
//
// Thread-safe. The destructor ends an open commit as not loaded and joins.
#pragma once

#include <cstdint>
#include <thread>

#include "agent/sidecar/version_gate.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/status.h"

namespace tern::agent {

class CommitPoint {
 public:
  static constexpr uint32_t kBeginSlackMs = 10000;

  CommitPoint(VersionGate& gate, uint32_t drain_timeout_ms, uint32_t hold_ms_max)
      : gate_(gate), drain_timeout_ms_(drain_timeout_ms), hold_ms_max_(hold_ms_max) {}
  ~CommitPoint();
  CommitPoint(const CommitPoint&) = delete;
  CommitPoint& operator=(const CommitPoint&) = delete;

  // Ok: admission is closed for `version` (> 0) and the engine may change
  // until End or hold_ms (1 .. hold_ms_max) pass. kTimeout: the requests
  // that must finish first did not (nothing changed; admission reopened).
  Status Begin(uint64_t version, uint32_t hold_ms) EXCLUDES(mu_);
  // The engine loaded `version` (true) or still serves the version it had
  // (false). kNotFound when no commit of `version` is open (never
  // begun, or already ended by its hold time: then the gate did not flip).
  Status End(uint64_t version, bool loaded) EXCLUDES(mu_);
  bool open() const EXCLUDES(mu_);

 private:
  void Run(uint64_t version, uint32_t hold_ms);
  void JoinFinishedLocked() REQUIRES(mu_);

  VersionGate& gate_;
  const uint32_t drain_timeout_ms_;
  const uint32_t hold_ms_max_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  // The open commit: its version (0: none), whether the gate holds it
  // (drained, waiting for End), whether End came and what it said, and
  // whether the gate's Commit returned (with `result_`).
  uint64_t version_ GUARDED_BY(mu_) = 0;
  bool held_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;
  bool loaded_ GUARDED_BY(mu_) = false;
  bool done_ GUARDED_BY(mu_) = true;
  Status result_ GUARDED_BY(mu_);
  std::thread thread_ GUARDED_BY(mu_);
};

}  // namespace tern::agent

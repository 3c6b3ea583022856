// EngineDriver: loads every version this member serves into the serving
// engine beside it (tern-agent --engine vllm; docs/engines.md, "The agent
// drives the engine").
//
// One thread follows the EventRing like the --on-serve hook. For the newest
// kVersionServed event it asks the EngineAdapter to load that version from
// the event's slot, naming the tensors that changed since the version the
// engine serves: the union of the events' changed tensors, when it has seen
// every served event since then, else every tensor (a gap in the ring, a
// keyframe or seed, an engine whose version it does not know, an update
// whose outcome is unknown). Versions served while an update runs are
// coalesced into the next one. A failed update leaves the engine on its old
// version (the adapter's contract), is logged and counted, and is retried
// after a backoff (1 s doubling to 30 s) or as soon as a newer version is
// served. Newer means a later position (epoch, version): after a supersede
// (docs/agent/board.md §4a) the member serves a lower number of a later
// epoch, and the engine, still on the withdrawn number, loads it. The
// status names the epoch of the engine's version (0 when the engine serves
// a number the member did not give it), which the sidecar compares with
// HEAD's.
//
// The slot lease. The engine reads the version's tensors from the slot
// DIR/current points at; the member rewrites that slot once it is the spare
// (the next switch, then PrepareSpare or the next Advance: the reader rule
// of docs/agent/apply.md). While an update reads slot S, the work thread
// calls SlotLease::WaitOffSpare before it writes the spare: when the spare
// is S it waits for the update to end, at most lease_wait_ms; past that it
// writes anyway and marks the lease overridden, and the driver then counts
// the update as failed (the engine may hold a mix) and sends the next one
// with every tensor. A slot that is no longer DIR/current's when an update
// would start is not read: a newer served event follows.
//
// The commit point. With the sidecar's commit point (tern-agent
// --engine-sidecar), every Apply runs inside a commit the sidecar holds
// open: Begin before the engine pauses (the sidecar drains the requests
// that must not cross the change), End after it, with the outcome, once
// status() names the engine's new version (a sidecar that polls /status
// then never reads a version older than the one End flipped to). A commit
// the sidecar does not open fails the update (the engine is not touched).
//
// Thread safety: Start/Stop from one thread; status() from any thread;
// SlotLease from the driver and the work thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "agent/daemon/event_ring.h"
#include "agent/engine/commit_client.h"
#include "agent/engine/engine_adapter.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/agent.h"
#include "tern/clock.h"
#include "tern/log.h"

namespace tern::agent {

class SlotLease {
 public:
  // `current_slot`: the absolute slot DIR/current points at now ("" when
  // none). Called with the lease's lock held; it must not call back here.
  explicit SlotLease(std::function<std::string()> current_slot)
      : current_slot_(std::move(current_slot)) {}

  // Driver: marks `slot` as read. False (and nothing held) when `slot` is
  // not the one DIR/current points at now: it may be the spare already.
  bool Begin(const std::string& slot) EXCLUDES(mu_);
  // Driver: the read is over. True when a writer did not wait for it (the
  // engine may have read a mix of versions).
  bool End() EXCLUDES(mu_);
  // Work thread, before writing the spare: waits while the spare is the
  // slot being read (DIR/current no longer points at it), at most
  // `max_wait_ms`; then writes anyway and marks the read overridden.
  // Returns false when it gave up waiting.
  bool WaitOffSpare(uint32_t max_wait_ms, const LogFn& log) EXCLUDES(mu_);

 private:
  const std::function<std::string()> current_slot_;
  Mutex mu_;
  CondVar cv_{&mu_};
  bool reading_ GUARDED_BY(mu_) = false;
  bool overridden_ GUARDED_BY(mu_) = false;
  std::string slot_ GUARDED_BY(mu_);
};

struct EngineDriverOptions {
  uint32_t backoff_min_ms = 1000;
  uint32_t backoff_max_ms = 30000;
  // With a commit point: how long the sidecar holds a commit open for one
  // Apply (its deadlines all together).
  uint32_t commit_hold_ms = 600000;
};

class EngineDriver {
 public:
  // `commit` (may be null): the sidecar's commit point, held open around
  // every Apply; an update it does not open is not run (failed, retried).
  EngineDriver(EventRing& ring, SlotLease& lease, std::unique_ptr<EngineAdapter> adapter,
               std::string engine_name, EngineDriverOptions options, Clock& clock, LogFn log,
               std::unique_ptr<EngineCommitPoint> commit = nullptr);
  ~EngineDriver();  // Stop()
  EngineDriver(const EngineDriver&) = delete;
  EngineDriver& operator=(const EngineDriver&) = delete;

  // Before Start: the version the member serves now (and its board epoch)
  // and its slot, loaded (every tensor) unless the engine already says it
  // serves it.
  void Prime(uint64_t version, uint32_t epoch, std::string slot_dir) EXCLUDES(mu_);
  void Start();
  // Returns once an update in flight has ended (its own deadlines bound it).
  void Stop();
  AgentEngineStatus status() const EXCLUDES(mu_);

 private:
  void Loop();
  // Folds one served event into the pending update.
  void Note(const AgentEvent& e, bool gap) EXCLUDES(mu_);
  // Runs the pending update if one is due.
  void MaybeUpdate() EXCLUDES(mu_);

  EventRing& ring_;
  SlotLease& lease_;
  const std::unique_ptr<EngineAdapter> adapter_;
  const std::unique_ptr<EngineCommitPoint> commit_;
  const EngineDriverOptions options_;
  Clock& clock_;
  LogFn log_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;

  mutable Mutex mu_;  // the status and the pending update (the driver's thread writes them)
  AgentEngineStatus status_ GUARDED_BY(mu_);
  // The newest served event not yet in the engine, and what changed since
  // the engine's version (meaningful unless full_).
  std::optional<AgentEvent> target_ GUARDED_BY(mu_);
  std::set<std::string> changed_ GUARDED_BY(mu_);
  bool full_ GUARDED_BY(mu_) = true;
  // The version of the last served event seen (the base of the next one's
  // changed tensors), and when the next attempt may run.
  uint64_t last_seen_ GUARDED_BY(mu_) = 0;
  uint64_t not_before_us_ GUARDED_BY(mu_) = 0;
  uint32_t backoff_ms_ GUARDED_BY(mu_) = 0;
};

}  // namespace tern::agent

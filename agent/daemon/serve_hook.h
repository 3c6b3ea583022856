// ServeHook: runs AgentOptions::on_serve_command when the agent serves a
// new version (docs/agent/operations.md "Events"), off the agent's threads.
//
// One thread follows the EventRing (Wait, 1 s at a time) and, for the
// newest kVersionServed event among those that arrived since its last run
// (the others are coalesced: counted, not run), forks /bin/sh -c COMMAND
// in a process group of its own with the event as one JSON line on stdin
// and as TERN_EVENT_SEQ, TERN_EVENT_VERSION, TERN_EVENT_DIGEST,
// TERN_EVENT_SLOT_DIR, TERN_EVENT_ALL_TENSORS in its environment. A run
// past timeout_ms is killed (SIGKILL to the group) and reaped. Each ending
// is logged and counted. Stop kills a run in flight and joins the thread.
//
// Bounds: one run at a time; a run's time; a gap in the ring (more than
// its capacity of events while a run lasts) loses nothing the hook needs:
// only the newest served event is run.
//
// Thread safety: the counters are atomics read from any thread; Start and
// Stop from one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "agent/daemon/event_ring.h"
#include "tern/log.h"

namespace tern::agent {

struct ServeHookCounts {
  std::atomic<uint64_t> ok{0};         // exit status 0
  std::atomic<uint64_t> failed{0};     // another exit status, a signal, or no start
  std::atomic<uint64_t> killed{0};     // past the deadline
  std::atomic<uint64_t> coalesced{0};  // served events not run: a newer one was
};

class ServeHook {
 public:
  ServeHook(EventRing& ring, std::string command, uint32_t timeout_ms, LogFn log);
  ~ServeHook();  // Stop()
  ServeHook(const ServeHook&) = delete;
  ServeHook& operator=(const ServeHook&) = delete;

  void Start();
  void Stop();
  const ServeHookCounts& counts() const { return counts_; }

 private:
  void Loop();
  // Runs the command for `e`; returns when it ended or was killed.
  void Run(const AgentEvent& e);

  EventRing& ring_;
  const std::string command_;
  const uint32_t timeout_ms_;
  LogFn log_;
  ServeHookCounts counts_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tern::agent

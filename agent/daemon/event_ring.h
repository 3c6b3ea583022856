// EventRing: an agent's recent events (include/tern/agent.h, AgentEvent) for
// Agent::WaitEvents, GET /events and the --on-serve hook
// (docs/agent/operations.md "Events").
//
// Push numbers each event (seq, consecutive from 1), stamps it with the
// clock and keeps the last `capacity`; an older one is dropped, which a
// reader sees as a gap (its next event's seq is above the one it asked
// after). Wait returns the events after a seq, waiting up to a deadline for
// the first (a zero timeout never waits); at most max_waiters wait at once
// (kResourceExhausted beyond);
// Close wakes them all (kUnavailable from then on).
//
// Bounds: capacity events (each event's tensor list is bounded by the
// caller: kMaxEventTensors names), max_waiters waiters, a wait of at most
// kMaxEventWaitMs.
//
// Thread safety: every method from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/agent.h"
#include "tern/clock.h"
#include "tern/status.h"

namespace tern::agent {

inline constexpr size_t kEventRingCapacity = 1024;
inline constexpr size_t kMaxEventWaiters = 64;
inline constexpr size_t kMaxEventsPerWait = 1024;
inline constexpr uint32_t kMaxEventWaitMs = 600000;
// A served event names at most this many changed tensors; more (a model
// with more tensors than this) is reported as all_tensors.
inline constexpr size_t kMaxEventTensors = 65536;

class EventRing {
 public:
  explicit EventRing(Clock& clock, size_t capacity = kEventRingCapacity,
                     size_t max_waiters = kMaxEventWaiters);
  EventRing(const EventRing&) = delete;
  EventRing& operator=(const EventRing&) = delete;

  // Numbers, stamps and keeps `e` (its seq and at_s are set here); wakes
  // the waiters. Returns the seq.
  uint64_t Push(AgentEvent e);
  // See Agent::WaitEvents. max_events is clamped to 1 .. kMaxEventsPerWait,
  // timeout_ms to kMaxEventWaitMs.
  Status Wait(uint64_t after_seq, size_t max_events, uint32_t timeout_ms,
              std::vector<AgentEvent>* out);
  void Close();
  uint64_t last_seq() const;
  // This ring's run: 16 random hex digits drawn at construction. Seqs
  // number events per run (GET /events' "run").
  const std::string& run() const { return run_; }
  size_t waiters() const;  // waiting in Wait now

 private:
  Clock& clock_;
  const std::string run_;
  const size_t capacity_;
  const size_t max_waiters_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  std::deque<AgentEvent> events_ GUARDED_BY(mu_);  // seq ascending, consecutive
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  size_t waiters_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace tern::agent

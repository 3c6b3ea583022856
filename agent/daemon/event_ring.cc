// EventRing (agent/daemon/event_ring.h).
#include "agent/daemon/event_ring.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

namespace tern::agent {
namespace {

// 64 bits from the system's entropy: two runs of one agent (a restart)
// never share a run id in practice.
std::string NewRunId() {
  std::random_device rd;
  const uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
  return hex;
}

}  // namespace

EventRing::EventRing(Clock& clock, size_t capacity, size_t max_waiters)
    : clock_(clock),
      run_(NewRunId()),
      capacity_(std::max<size_t>(capacity, 1)),
      max_waiters_(max_waiters) {}

uint64_t EventRing::Push(AgentEvent e) {
  MutexLock lock(mu_);
  e.seq = next_seq_++;
  e.at_s = static_cast<double>(clock_.NowUs()) * 1e-6;
  events_.push_back(std::move(e));
  while (events_.size() > capacity_) events_.pop_front();
  cv_.SignalAll();
  return events_.back().seq;
}

Status EventRing::Wait(uint64_t after_seq, size_t max_events, uint32_t timeout_ms,
                       std::vector<AgentEvent>* out) {
  out->clear();
  max_events = std::clamp<size_t>(max_events, 1, kMaxEventsPerWait);
  // Real time: the waits are a caller's, not the agent's schedule.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(std::min(timeout_ms, kMaxEventWaitMs));
  MutexLock lock(mu_);
  TERN_REQUIRE(!closed_, kUnavailable, "events: the agent is stopping");
  // A seq beyond ours: the caller outlived a restart of the agent (seqs
  // begin again at 1). It gets what is held, every seq below its own.
  if (after_seq >= next_seq_) after_seq = 0;
  auto ready = [&]() REQUIRES(mu_) { return closed_ || next_seq_ - 1 > after_seq; };
  if (!ready() && timeout_ms > 0) {
    TERN_REQUIRE(waiters_ < max_waiters_, kResourceExhausted, "events: ", waiters_,
                 " callers already wait (the bound)");
    ++waiters_;
    cv_.WaitUntil(deadline, ready);
    --waiters_;
  }
  TERN_REQUIRE(!closed_, kUnavailable, "events: the agent is stopping");
  for (const AgentEvent& e : events_) {
    if (e.seq <= after_seq) continue;
    out->push_back(e);
    if (out->size() == max_events) break;
  }
  return Status::Ok();
}

void EventRing::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  cv_.SignalAll();
}

size_t EventRing::waiters() const {
  MutexLock lock(mu_);
  return waiters_;
}

uint64_t EventRing::last_seq() const {
  MutexLock lock(mu_);
  return next_seq_ - 1;
}

}  // namespace tern::agent

namespace tern {

const char* AgentEventKindName(AgentEvent::Kind kind) {
  switch (kind) {
    case AgentEvent::Kind::kVersionPublished:
      return "version_published";
    case AgentEvent::Kind::kVersionServed:
      return "version_served";
    case AgentEvent::Kind::kMemberJoined:
      return "member_joined";
    case AgentEvent::Kind::kMemberLeft:
      return "member_left";
    case AgentEvent::Kind::kMemberFailed:
      return "member_failed";
    case AgentEvent::Kind::kMemberDemoted:
      return "member_demoted";
    case AgentEvent::Kind::kMemberDrained:
      return "member_drained";
    case AgentEvent::Kind::kMemberRemoved:
      return "member_removed";
  }
  return "unknown";
}

}  // namespace tern

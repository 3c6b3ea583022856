// AgentEventFollower (include/tern/agent.h): GET /events followed across
// an agent's restarts, with a backoff while it cannot be reached.
#include <algorithm>
#include <chrono>
#include <thread>

#include "agent/daemon/event_ring.h"
#include "tern/agent.h"

namespace tern {
namespace {

constexpr uint32_t kPollMsMax = 5000;  // the admin port's long-poll bound
constexpr uint32_t kSleepSliceMs = 50;

// Sleeps `ms`, in slices, unless `cancel` is set.
void SleepUnlessCancelled(uint32_t ms, const std::atomic<bool>& cancel) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!cancel.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, kSleepSliceMs)));
}

constexpr uint32_t kBackoffMsMax = 60000;

AgentEventFollower::Options Checked(AgentEventFollower::Options o) {
  o.poll_ms = std::min(o.poll_ms, kPollMsMax);
  o.max_events = std::clamp<uint32_t>(o.max_events, 1, agent::kMaxEventsPerWait);
  o.backoff_max_ms = std::clamp<uint32_t>(o.backoff_max_ms, 1, kBackoffMsMax);
  o.backoff_min_ms = std::clamp<uint32_t>(o.backoff_min_ms, 1, o.backoff_max_ms);
  return o;
}

}  // namespace

AgentEventFollower::AgentEventFollower(std::string admin_address, AgentClientOptions client,
                                       uint64_t after_seq, Options options)
    : address_(std::move(admin_address)),
      client_(std::move(client)),
      options_(Checked(options)),
      after_seq_(after_seq),
      backoff_ms_(options_.backoff_min_ms) {}

Result<std::vector<AgentEvent>> AgentEventFollower::Next(const std::atomic<bool>& cancel) {
  // At most two polls: a new run's answer is asked for again from seq 0,
  // which cannot be a new run a second time.
  for (int attempt = 0; attempt < 2 && !cancel.load(); ++attempt) {
    const auto asked = std::chrono::steady_clock::now();
    auto poll =
        PollAgentEvents(address_, after_seq_, options_.max_events, options_.poll_ms, client_);
    if (!poll.ok()) {
      const Code code = poll.status().code();
      if (code != Code::kUnavailable && code != Code::kTimeout) return poll.status();
      SleepUnlessCancelled(backoff_ms_, cancel);
      backoff_ms_ = std::min(backoff_ms_ * 2, options_.backoff_max_ms);
      return std::vector<AgentEvent>();
    }
    backoff_ms_ = options_.backoff_min_ms;
    if (!poll->run.empty()) {
      const bool new_run = !run_.empty() && poll->run != run_;
      run_ = poll->run;
      if (new_run && after_seq_ != 0) {
        after_seq_ = 0;  // its seqs began again: from its first event
        continue;
      }
    }
    if (!poll->events.empty()) {
      after_seq_ = poll->events.back().seq;
    } else {
      // Nothing, sooner than the long poll asked (an agent that does not
      // wait): pause the rest of it, at most a minimum backoff, rather than
      // ask again at once.
      const auto waited = std::chrono::steady_clock::now() - asked;
      const auto rest = std::chrono::milliseconds(options_.poll_ms) - waited;
      if (rest.count() > 0)
        SleepUnlessCancelled(
            static_cast<uint32_t>(std::min<int64_t>(
                std::chrono::duration_cast<std::chrono::milliseconds>(rest).count(),
                options_.backoff_min_ms)),
            cancel);
    }
    return std::move(poll->events);
  }
  return std::vector<AgentEvent>();
}

}  // namespace tern

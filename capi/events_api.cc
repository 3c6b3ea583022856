// tern_agent_wait_events, tern_events_*, tern_agent_subscribe: the agent's
// events (Agent::WaitEvents; include/tern/tern.h). A wait runs in slices of
// at most kSliceMs under the handle's shared lock, so that tern_agent_stop,
// which takes the lock alone, waits at most a slice for a waiter.
// tern_client_wait_events, tern_client_subscribe (ABI 1.6): the same over
// an agent's admin port (PollAgentEvents: GET /events parsed).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "capi/agent_handle.h"
#include "capi/client_handle.h"
#include "tern/agent.h"

// A batch: the events and, per event, the C view of its tensor names.
struct tern_events {
  static constexpr uint32_t kTag = 0x74457673;  // "tEvs"
  uint32_t tag = kTag;
  std::vector<tern::AgentEvent> events;
  std::vector<std::vector<const char*>> changed;  // per event, into events[i].changed_tensors
  std::string run;  // the answering agent process's run, over a port ("" in process)
};

// One of agent or client is set.
struct tern_subscription {
  static constexpr uint32_t kTag = 0x74537562;  // "tSub"
  uint32_t tag = kTag;
  tern_agent* agent = nullptr;
  tern_client* client = nullptr;
  tern_event_fn fn = nullptr;
  void* user = nullptr;
  std::atomic<bool> cancel{false};
  // Why the thread ended (tern_subscription_result); kOk while it runs.
  mutable tern::Mutex mu;
  bool ended GUARDED_BY(mu) = false;
  tern::Status why GUARDED_BY(mu);
  std::thread thread;

  void End(tern::Status status) {
    tern::MutexLock lock(mu);
    ended = true;
    why = std::move(status);
  }
};

namespace tern::capi {
namespace {

using Kind = AgentEvent::Kind;
static_assert(TERN_EVENT_VERSION_PUBLISHED == static_cast<int>(Kind::kVersionPublished));
static_assert(TERN_EVENT_VERSION_SERVED == static_cast<int>(Kind::kVersionServed));
static_assert(TERN_EVENT_MEMBER_JOINED == static_cast<int>(Kind::kMemberJoined));
static_assert(TERN_EVENT_MEMBER_LEFT == static_cast<int>(Kind::kMemberLeft));
static_assert(TERN_EVENT_MEMBER_FAILED == static_cast<int>(Kind::kMemberFailed));
static_assert(TERN_EVENT_MEMBER_DEMOTED == static_cast<int>(Kind::kMemberDemoted));
static_assert(TERN_EVENT_MEMBER_DRAINED == static_cast<int>(Kind::kMemberDrained));
static_assert(TERN_EVENT_MEMBER_REMOVED == static_cast<int>(Kind::kMemberRemoved));

constexpr size_t kEventBytesV1 = offsetof(tern_event, changed_tensor_count) + sizeof(size_t);
constexpr uint32_t kSliceMs = 100;
constexpr uint32_t kMaxEvents = 1024;
constexpr uint32_t kTimeoutMsMax = 600000;
// The subscription thread's batch and wait per round.
constexpr uint32_t kSubscriptionBatch = 64;
constexpr uint32_t kSubscriptionWaitMs = 1000;

// Waits as Agent::WaitEvents does, in slices; returns early (Ok, no events)
// when `cancel` is set.
Status WaitSliced(tern_agent* a, uint64_t after_seq, uint32_t max_events, uint32_t timeout_ms,
                  std::vector<AgentEvent>* out, const std::atomic<bool>* cancel) {
  TERN_REQUIRE(max_events >= 1 && max_events <= kMaxEvents, kOutOfRange, "max_events is ",
               max_events, ": want 1..", kMaxEvents);
  TERN_REQUIRE(timeout_ms <= kTimeoutMsMax, kOutOfRange, "timeout_ms is ", timeout_ms, ": at most ",
               kTimeoutMsMax);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const uint32_t slice = static_cast<uint32_t>(std::clamp<int64_t>(left.count(), 0, kSliceMs));
    out->clear();
    TERN_RETURN_IF_ERROR(WithAgent(
        a, [&](Agent& agent) { return agent.WaitEvents(after_seq, max_events, slice, out); }));
    if (!out->empty() || slice == 0 || (cancel != nullptr && cancel->load())) return Status::Ok();
  }
}

// The C view of `e`; `changed` holds the tensor names' pointers.
tern_event ToC(const AgentEvent& e, std::vector<const char*>* changed) {
  changed->clear();
  for (const std::string& name : e.changed_tensors) changed->push_back(name.c_str());
  tern_event c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.seq = e.seq;
  c.at_s = e.at_s;
  c.kind = static_cast<int>(e.kind);
  c.all_tensors = e.all_tensors ? 1 : 0;
  c.version = e.version;
  c.epoch = e.epoch;
  for (int l = 0; l < 4; ++l) c.digest[l] = e.digest.lanes[l];
  c.member = e.member.c_str();
  c.slot_dir = e.slot_dir.c_str();
  c.changed_tensors = changed->empty() ? nullptr : changed->data();
  c.changed_tensor_count = changed->size();
  return c;
}

// Delivers `events` in order; false once cancelled (the rest undelivered).
bool Deliver(tern_subscription* s, const std::vector<AgentEvent>& events) {
  std::vector<const char*> changed;
  for (const AgentEvent& e : events) {
    if (s->cancel.load()) return false;
    const tern_event c = ToC(e, &changed);
    s->fn(s->user, &c);
  }
  return true;
}

// The subscription's thread: waits, delivers, until cancelled or the agent
// stops (kUnavailable). Too many waiters at once (kResourceExhausted) is
// retried; any other error ends it, kept for tern_subscription_result.
Status RunSubscription(tern_subscription* s, uint64_t after_seq) {
  std::vector<AgentEvent> events;
  while (!s->cancel.load()) {
    const Status st = WaitSliced(s->agent, after_seq, kSubscriptionBatch, kSubscriptionWaitMs,
                                 &events, &s->cancel);
    if (st.code() == Code::kResourceExhausted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kSliceMs));
      continue;
    }
    TERN_RETURN_IF_ERROR(st);
    if (!Deliver(s, events)) break;
    if (!events.empty()) after_seq = events.back().seq;
  }
  return Status::Ok();
}

// Over the admin port: AgentEventFollower retries an agent that cannot be
// reached and follows a restarted one from its first event; any other
// error ends the thread. A poll's request waits at most
// kClientPollRequestMsMax beyond its long poll, whatever the client's
// timeout_ms: tern_subscription_free waits for the poll in flight.
constexpr uint32_t kClientPollRequestMsMax = 5000;

Status RunClientSubscription(tern_subscription* s, uint64_t after_seq) {
  AgentClientOptions options = s->client->options;
  options.timeout_ms = std::min(options.timeout_ms, kClientPollRequestMsMax);
  AgentEventFollower::Options follow;
  follow.poll_ms = kSubscriptionWaitMs;
  follow.max_events = kSubscriptionBatch;
  follow.backoff_min_ms = kSliceMs;
  AgentEventFollower follower(s->client->address, std::move(options), after_seq, follow);
  while (!s->cancel.load()) {
    TERN_ASSIGN_OR_RETURN(std::vector<AgentEvent> events, follower.Next(s->cancel));
    if (!Deliver(s, events)) break;
  }
  return Status::Ok();
}

// Starts `s`'s thread on `body`; whatever ends it is kept.
template <class Body>
void StartThread(tern_subscription* s, Body body) {
  s->thread = std::thread([s, body] {
    Status why;
    try {
      why = body();
    } catch (const std::exception& e) {
      why = Status(Code::kInternal, std::string("unexpected exception: ") + e.what());
    } catch (...) {
      why = Status(Code::kInternal, "unexpected exception of unknown type");
    }
    if (why.ok()) why = Status(Code::kCancelled, "the subscription was freed");
    s->End(std::move(why));
  });
}

// What tern_agent_subscribe and tern_client_subscribe share: the checks of
// `out` and `fn`, the subscription, `attach` naming its source (and
// refusing a bad handle before any thread starts), and its thread on
// `run(s)`.
template <class Attach, class Run>
Status Subscribe(tern_event_fn fn, void* user, tern_subscription** out, Attach attach, Run run) {
  TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
  *out = nullptr;
  TERN_REQUIRE(fn != nullptr, kInvalidArgument, "fn is NULL");
  auto s = std::make_unique<tern_subscription>();
  s->fn = fn;
  s->user = user;
  TERN_RETURN_IF_ERROR(attach(*s));
  tern_subscription* raw = s.get();
  StartThread(raw, [raw, run] { return run(raw); });
  *out = s.release();
  return Status::Ok();
}

// A batch of `events` from `run` (tern_events_run: the answering agent
// process's, "" in process), the C view of each event's names built once.
std::unique_ptr<tern_events> BatchOf(std::vector<AgentEvent> events, std::string run) {
  auto batch = std::make_unique<tern_events>();
  batch->events = std::move(events);
  batch->run = std::move(run);
  batch->changed.resize(batch->events.size());
  for (size_t i = 0; i < batch->events.size(); ++i)
    for (const std::string& name : batch->events[i].changed_tensors)
      batch->changed[i].push_back(name.c_str());
  return batch;
}

// The client's poll form: long polls of at most kPortWaitMsMax until an
// event or the deadline. Each request's own deadline is the long poll plus
// at most kClientPollRequestMsMax (the client's timeout_ms when shorter),
// so an agent that does not answer costs at most that beyond timeout_ms. A
// poll that answers with another run than the call's first (the agent
// restarted during the call) is asked again from seq 0; one that comes
// back empty sooner than it was asked to wait (an agent that does not
// wait) is followed by a pause, not at once by the next. Returns the last
// answer: its events and its run ("" from an agent older than the field).
constexpr uint32_t kPortWaitMsMax = 5000;

Result<AgentEventPoll> ClientWait(const tern_client* c, uint64_t after_seq, uint32_t max_events,
                                  uint32_t timeout_ms) {
  TERN_REQUIRE(max_events >= 1 && max_events <= kMaxEvents, kOutOfRange, "max_events is ",
               max_events, ": want 1..", kMaxEvents);
  TERN_REQUIRE(timeout_ms <= kTimeoutMsMax, kOutOfRange, "timeout_ms is ", timeout_ms, ": at most ",
               kTimeoutMsMax);
  AgentClientOptions options = c->options;
  options.timeout_ms = std::min(options.timeout_ms, kClientPollRequestMsMax);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto ms_left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
        .count();
  };
  std::string run;
  for (;;) {
    const uint32_t wait = static_cast<uint32_t>(std::clamp<int64_t>(ms_left(), 0, kPortWaitMsMax));
    const auto asked = std::chrono::steady_clock::now();
    TERN_ASSIGN_OR_RETURN(AgentEventPoll poll,
                          PollAgentEvents(c->address, after_seq, max_events, wait, options));
    if (!poll.run.empty()) {
      const bool new_run = !run.empty() && poll.run != run;
      run = poll.run;
      if (new_run && after_seq != 0) {
        after_seq = 0;  // restarted during this call: from its first event
        continue;
      }
    }
    if (!poll.events.empty() || wait == 0 || ms_left() <= 0) return poll;
    const int64_t early_ms =
        static_cast<int64_t>(wait) - std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - asked)
                                         .count();
    if (early_ms > 0)
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<int64_t>({early_ms, kSliceMs, ms_left()})));
  }
}

}  // namespace
}  // namespace tern::capi

using tern::Status;
using tern::capi::Guard;

extern "C" {

const char* tern_event_kind_name(int kind) {
  if (kind < TERN_EVENT_VERSION_PUBLISHED || kind > TERN_EVENT_MEMBER_REMOVED) return "unknown";
  return tern::AgentEventKindName(static_cast<tern::AgentEvent::Kind>(kind));
}

tern_code tern_agent_wait_events(tern_agent* a, uint64_t after_seq, uint32_t max_events,
                                 uint32_t timeout_ms, tern_events** out) {
  return Guard([&] {
    TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
    *out = nullptr;
    std::vector<tern::AgentEvent> events;
    TERN_RETURN_IF_ERROR(
        tern::capi::WaitSliced(a, after_seq, max_events, timeout_ms, &events, nullptr));
    *out = tern::capi::BatchOf(std::move(events), /*run=*/"").release();
    return Status::Ok();
  });
}

tern_code tern_client_wait_events(tern_client* c, uint64_t after_seq, uint32_t max_events,
                                  uint32_t timeout_ms, tern_events** out) {
  return Guard([&] {
    TERN_REQUIRE(out != nullptr, kInvalidArgument, "out is NULL");
    *out = nullptr;
    TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(c));
    TERN_ASSIGN_OR_RETURN(tern::AgentEventPoll poll,
                          tern::capi::ClientWait(c, after_seq, max_events, timeout_ms));
    *out = tern::capi::BatchOf(std::move(poll.events), std::move(poll.run)).release();
    return Status::Ok();
  });
}

const char* tern_events_run(const tern_events* events) {
  if (events == nullptr || events->tag != tern_events::kTag) return "";
  return events->run.c_str();
}

size_t tern_events_count(const tern_events* events) {
  if (events == nullptr || events->tag != tern_events::kTag) return 0;
  return events->events.size();
}

tern_code tern_events_get(const tern_events* events, size_t index, tern_event* out) {
  return Guard([&] {
    TERN_REQUIRE(events != nullptr, kInvalidArgument, "events is NULL");
    TERN_REQUIRE(events->tag == tern_events::kTag, kInvalidArgument, "events is not a tern_events");
    TERN_REQUIRE(index < events->events.size(), kOutOfRange, "index ", index, " of ",
                 events->events.size(), " events");
    std::vector<const char*> scratch;
    tern_event c = tern::capi::ToC(events->events[index], &scratch);
    const std::vector<const char*>& kept = events->changed[index];
    c.changed_tensors = kept.empty() ? nullptr : kept.data();
    return tern::capi::WriteVersionedStruct(&c, sizeof c, out, tern::capi::kEventBytesV1,
                                            "tern_event");
  });
}

void tern_events_free(tern_events* events) {
  if (events == nullptr || events->tag != tern_events::kTag) return;
  events->tag = 0;
  delete events;
}

tern_code tern_agent_subscribe(tern_agent* a, uint64_t after_seq, tern_event_fn fn, void* user,
                               tern_subscription** out) {
  return Guard([&] {
    return tern::capi::Subscribe(
        fn, user, out,
        [a](tern_subscription& s) {
          // Refuses a NULL, foreign or stopped agent now rather than in the thread.
          TERN_RETURN_IF_ERROR(tern::capi::WithAgent(a, [](tern::Agent&) { return Status::Ok(); }));
          s.agent = a;
          return Status::Ok();
        },
        [after_seq](tern_subscription* s) { return tern::capi::RunSubscription(s, after_seq); });
  });
}

tern_code tern_client_subscribe(tern_client* c, uint64_t after_seq, tern_event_fn fn, void* user,
                                tern_subscription** out) {
  return Guard([&] {
    return tern::capi::Subscribe(
        fn, user, out,
        [c](tern_subscription& s) {
          TERN_RETURN_IF_ERROR(tern::capi::CheckHandle(c));
          s.client = c;
          return Status::Ok();
        },
        [after_seq](tern_subscription* s) {
          return tern::capi::RunClientSubscription(s, after_seq);
        });
  });
}

tern_code tern_subscription_result(const tern_subscription* s) {
  return Guard([&] {
    TERN_REQUIRE(s != nullptr, kInvalidArgument, "subscription is NULL");
    TERN_REQUIRE(s->tag == tern_subscription::kTag, kInvalidArgument,
                 "subscription is not a tern_subscription (another handle, or one already freed)");
    tern::MutexLock lock(s->mu);
    return s->ended ? s->why : Status::Ok();
  });
}

void tern_subscription_free(tern_subscription* s) {
  if (s == nullptr || s->tag != tern_subscription::kTag) return;
  s->cancel.store(true);
  if (s->thread.joinable()) s->thread.join();
  s->tag = 0;
  delete s;
}

}  // extern "C"

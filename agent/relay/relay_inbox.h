// RelayNode's event queue (private to agent/relay/relay.cc): transport callbacks
// push here and return at once; the node's worker pops. Transport callbacks
// hold a shared_ptr to the inbox, never to the node, so a callback that runs
// after the node is gone finds a closed inbox and drops its event (closing a
// connection it carried, so none leaks open).
//
// Bound: peer messages queued at once <= messages_max; the first message past
// it queues one kOverflow for its link (the worker disconnects that peer) and
// later ones from that link are dropped. Other events are bounded by what
// the node itself started (windows it posted, chunks it sent, dials).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>

#include "agent/relay/data_wire.h"
#include "base/mutex.h"
#include "tern/clock.h"
#include "tern/transport.h"

namespace tern::agent {

struct Object;

struct Event {
  enum Kind { kStop, kAccepted, kConnected, kMessage, kOverflow, kClosed, kLanded, kSent,
              kSetParent, kOffer, kFetch, kForget, kPushed };
  Kind kind = kStop;
  uint64_t link = 0;
  std::shared_ptr<Connection> conn;
  Status status;
  std::string payload;  // a message; the address for kSetParent
  ObjectRef ref;
  uint32_t chunk = 0;
  uint64_t offset = 0, length = 0;  // kPushed: where in the push window
  uint32_t stripe = 0, stripes = 1;
  std::shared_ptr<Object> object;  // kOffer
  // kAccepted, kSetParent: the transport the link runs on (null: the
  // node's first).
  Transport* via = nullptr;
  // When it was queued (the inbox's clock): a message's arrival, which the
  // worker may reach much later (a pushed object's receive rate counts from
  // its PUSH's).
  uint64_t at_us = 0;
};

class Inbox {
 public:
  // clock stamps each event as it is queued; it outlives the inbox's
  // last push (the node's Env).
  Inbox(uint32_t messages_max, const Clock& clock) : messages_max_(messages_max), clock_(clock) {}

  uint64_t NewLinkId() { return next_link_.fetch_add(1); }

  void Push(Event e) {
    {
      MutexLock lock(mu_);
      if (!closed_) {
        if (e.kind == Event::kMessage) ++messages_;
        e.at_us = clock_.NowUs();
        events_.push_back(std::move(e));
        cv_.Signal();
        return;
      }
    }
    if (e.conn) e.conn->Close();
  }

  void PushMessage(uint64_t link, std::string payload) {
    MutexLock lock(mu_);
    if (closed_ || overflowed_.count(link)) return;
    Event e;
    e.link = link;
    e.at_us = clock_.NowUs();
    if (messages_ >= messages_max_) {
      overflowed_.insert(link);
      e.kind = Event::kOverflow;
    } else {
      e.kind = Event::kMessage;
      e.payload = std::move(payload);
      ++messages_;
    }
    events_.push_back(std::move(e));
    cv_.Signal();
  }

  // Blocks until an event is queued; kStop once closed.
  Event Pop() {
    MutexLock lock(mu_);
    cv_.Wait([&]() REQUIRES(mu_) { return closed_ || !events_.empty(); });
    if (closed_) return Event{};
    Event e = std::move(events_.front());
    events_.pop_front();
    if (e.kind == Event::kMessage) --messages_;
    return e;
  }

  void ForgetLink(uint64_t link) {
    MutexLock lock(mu_);
    overflowed_.erase(link);
  }

  // Drops what is queued (closing the connections it carried); later pushes
  // are dropped too.
  void Close() {
    std::deque<Event> left;
    {
      MutexLock lock(mu_);
      closed_ = true;
      left.swap(events_);
      cv_.SignalAll();
    }
    for (Event& e : left) {
      if (e.conn) e.conn->Close();
    }
  }

 private:
  const uint32_t messages_max_;
  const Clock& clock_;
  std::atomic<uint64_t> next_link_{1};
  Mutex mu_;
  CondVar cv_{&mu_};
  std::deque<Event> events_ GUARDED_BY(mu_);
  uint32_t messages_ GUARDED_BY(mu_) = 0;
  std::set<uint64_t> overflowed_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace tern::agent

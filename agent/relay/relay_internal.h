// RelayNode's state (private to agent/relay*.cc): the objects a node holds,
// its links, and the Impl whose worker changes them. relay.cc: the worker,
// links and the public API; relay_flow.cc: the chunk flow in both
// directions.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "agent/relay/relay.h"
#include "agent/relay/relay_inbox.h"
#include "base/mutex.h"

namespace tern::agent {

// An object this node holds: complete (served), or being received.
struct Object {
  ObjectRef ref;
  std::string signed_manifest;
  uint32_t index = 0;
  ManifestObject meta;
  std::string part_path, path;  // path: set once complete
  std::unique_ptr<MappedFile> file;
  // The mapping registered once with each transport of the node (a child
  // reads it through whichever its link runs on; the payload itself is
  // never copied for that). Deregistered before the file is unmapped.
  struct Registration {
    Transport* transport = nullptr;
    MemoryRegion region;
  };
  std::vector<Registration> regions;
  std::vector<Sha256Hash> hashes;
  bool hashes_ok = false;
  std::vector<uint8_t> verified;
  uint32_t verified_count = 0;
  uint32_t prefix_chunks = 0;            // chunks 0 .. prefix_chunks-1 all verified
  std::map<uint32_t, uint64_t> windows;  // chunk -> the parent link it has a window on
  std::set<uint32_t> requeue;            // chunks to ask for again (failed SHA-256)
  bool complete = false;

  uint32_t count() const { return meta.chunk_count; }
  uint64_t Offset(uint32_t i) const { return uint64_t{i} * meta.chunk_bytes; }
  uint64_t Length(uint32_t i) const {
    return std::min<uint64_t>(meta.chunk_bytes, meta.bytes - Offset(i));
  }
  std::span<const uint8_t> Chunk(uint32_t i) const {
    return {file->data() + Offset(i), static_cast<size_t>(Length(i))};
  }
  // The region on `t` (registered with every transport of the node before
  // the object is used).
  const MemoryRegion& RegionOn(const Transport* t) const {
    for (const auto& r : regions)
      if (r.transport == t) return r.region;
    return regions.front().region;  // unreachable: RegisterEverywhere covers every link's
  }
  ~Object() {
    for (auto& r : regions)
      if (r.region.handle) r.transport->DeregisterMemory(r.region).IgnoreError();
  }
};

// A parent link's standing push window (child side; relay_push.cc): posted
// once per connection as transfer id kPushWindowId, reused per object. The
// parent writes pushed chunks here; each is copied into the object's buffer
// and hashed there, so rewriting this window after the copy changes nothing
// verified. One PUSH at a time: PUSH_DONE frees it.
struct PushIn {
  std::unique_ptr<uint8_t[]> buf;
  uint32_t bytes = 0;
  MemoryRegion region;
  Transport* transport = nullptr;
  bool announced = false;  // a PUSH not yet answered with PUSH_DONE
  bool offered = false;    // its object's OFFER was handled (taken or not)
  ObjectRef ref;
  uint32_t count = 0;
  uint32_t consumed = 0;   // landings copied out or dropped
  std::vector<std::pair<uint64_t, uint64_t>> landed;  // (offset, length) not handled yet
  // The earliest arrival of the announced PUSH and of its chunks (they may
  // overtake it); 0: none yet.
  uint64_t first_us = 0;
  ~PushIn() {
    if (transport && region.handle) transport->DeregisterMemory(region).IgnoreError();
  }
};

// The chunks a PUSH of `count` names (stripe, stripe + stripes, ...) and
// their offsets in the push window, packed in that order. Fewer than
// `count` when the stripe has fewer chunks.
inline std::vector<std::pair<uint32_t, uint64_t>> PushLayout(const ManifestObject& m, uint32_t stripe,
                                                             uint32_t stripes, uint32_t count) {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  uint64_t off = 0;
  for (uint64_t i = stripe; i < m.chunk_count && out.size() < count; i += stripes) {
    out.emplace_back(static_cast<uint32_t>(i), off);
    off += std::min<uint64_t>(m.chunk_bytes, m.bytes - i * m.chunk_bytes);
  }
  return out;
}

// What a parent link knows of one object it offered.
struct FromParent {
  uint64_t window_base = 0;
  std::set<uint32_t> open;          // chunks with a window posted on this link
  uint32_t cursor = 0;              // next chunk of this stripe to consider
  std::vector<Sha256Hash> hashes;   // the hash list as it arrives
  // Where its receive time (last_rate_in_bytes_per_s) starts, env clock:
  // when the worker took the OFFER and asked for chunks, or, for a pushed
  // object, when its PUSH (or a chunk ahead of it) arrived, however late
  // the worker got to the OFFER behind it.
  uint64_t offered_us = 0;
  uint64_t bytes_in = 0;            // verified bytes of this object over this link
  std::set<uint32_t> pushed;        // due in the push window: not asked for with WANT
};
// What a child asked this node for, per object.
struct ToChild {
  uint64_t window_base = 0;
  bool based = false;                        // window_base set by the first WANT
  std::map<uint32_t, uint64_t> push_at;      // pushed chunk -> offset in the push window
  std::set<uint32_t> waiting;                // credited, not verified here yet
  std::map<uint32_t, uint32_t> inflight;     // chunk -> resends so far
};

struct Link {
  uint64_t id = 0;
  bool parent = false;
  Transport* transport = nullptr;  // the one conn runs on
  std::shared_ptr<Connection> conn;
  bool subscribed = false;
  uint64_t served_version = 0;  // child side: its SUBSCRIBE's; offered only newer objects
  uint64_t next_window_base = 1;
  uint32_t bad_chunks = 0;
  uint32_t credits = 0;  // child side: waiting + inflight over all objects
  std::map<ObjectRef, FromParent> from;
  std::map<ObjectRef, ToChild> to;
  LinkStats stats;
  std::unique_ptr<PushIn> push_in;  // parent link: its push window (null: none)
  uint32_t push_bytes = 0;          // child link: the window its SUBSCRIBE announced
  bool push_busy = false;           // child link: a PUSH not yet answered by PUSH_DONE
  ObjectRef push_ref;
};

struct RelayNode::Impl {
  Impl(Transport& t, Env& e, std::string d, const ManifestVerifier& v, BoardId b, LogFn l,
       RelayOptions o, RelayCallbacks c)
      : transport(t),
        env(e),
        dir(std::move(d)),
        verifier(v),
        board(b),
        log(std::move(l)),
        options(std::move(o)),
        callbacks(std::move(c)),
        inbox(std::make_shared<Inbox>(std::max<uint32_t>(1, options.inbox_messages_max),
                                      env.clock())) {
    mu.Watch(&lock_watch);
    options.window_chunks = std::clamp<uint32_t>(options.window_chunks, 1, kMaxWantChunks);
    options.bad_chunks_max = std::max<uint32_t>(1, options.bad_chunks_max);
    if (options.member_id.empty() || options.member_id.size() > kMaxMemberIdBytes) {
      options.member_id = "member";
    }
  }

  Transport& transport;                            // the first: parents dialled by default
  std::vector<Transport*> transports GUARDED_BY(mu){&transport};  // every one a link may run on
  Env& env;
  const std::string dir;
  const ManifestVerifier& verifier;
  const BoardId board;
  const LogFn log;
  RelayOptions options;
  const RelayCallbacks callbacks;
  std::shared_ptr<Inbox> inbox;
  std::thread worker;

  // The worker changes the state below with mu held, the readers (Progress,
  // Stats, Totals, address) take it; every method from Handle down runs on
  // the worker with mu held (REQUIRES(mu)).
  LockWatch lock_watch{kSlowRelayLockHoldUs};  // mu's; declared first, it outlives mu
  mutable Mutex mu;
  std::unique_ptr<Listener> listener GUARDED_BY(mu);
  std::map<ObjectRef, std::shared_ptr<Object>> objects GUARDED_BY(mu);
  // Forgotten objects whose chunks are still being sent: kept mapped until
  // the last send completes.
  std::map<ObjectRef, std::shared_ptr<Object>> retired GUARDED_BY(mu);
  std::map<uint64_t, std::unique_ptr<Link>> links GUARDED_BY(mu);
  LinkTotals closed_links GUARDED_BY(mu);  // what links closed so far moved (Totals)
  uint64_t parent_of[kMaxStripes] GUARDED_BY(mu) = {};
  std::atomic<uint64_t> served_version{0};  // SetServedVersion: sent in SUBSCRIBE
  // To the lead, made after mu is dropped.
  std::vector<std::function<void()>> calls GUARDED_BY(mu);

  void Log(const std::string& line) const {
    if (log) log(line);
  }
  bool Has(const Transport* t) const REQUIRES(mu) {
    return std::find(transports.begin(), transports.end(), t) != transports.end();
  }
  // Registers obj's mapping with every transport of the node.
  Status RegisterEverywhere(Object& obj) REQUIRES(mu);

  static ConnectionHandlers Handlers(const std::shared_ptr<Inbox>& inbox, uint64_t id) {
    ConnectionHandlers h;
    h.on_message = [in = inbox, id](std::string payload) { in->PushMessage(id, std::move(payload)); };
    h.on_closed = [in = inbox, id](Status why) {
      Event e;
      e.kind = Event::kClosed;
      e.link = id;
      e.status = std::move(why);
      in->Push(std::move(e));
    };
    return h;
  }

  void Run();
  void Handle(Event& e) REQUIRES(mu);
  // OFFER's checks that need no state: decode, signature, board, the lead.
  struct CheckedOffer {
    Status status;
    bool refused_by_lead = false;
    // kBadContent only for a signature a trusted key id does not vouch for;
    // a key this side does not trust (yet, or any more) is not the parent's
    // doing: it relays what the root signed.
    ParentLoss loss = ParentLoss::kLink;
    agent::Offer offer;
    VersionManifest manifest;
    ObjectRef ref;
  };
  CheckedOffer CheckOffer(std::string_view payload) const;

  Link* Find(uint64_t id) REQUIRES(mu) {
    auto it = links.find(id);
    return it == links.end() ? nullptr : it->second.get();
  }
  void CloseLink(Link& link) REQUIRES(mu);
  // kLink unless `loss` says the parent sent content that failed verification.
  void FailParent(Link& link, Status why, ParentLoss loss = ParentLoss::kLink) REQUIRES(mu);
  void DropPeer(Link& link, const Status& why) REQUIRES(mu);
  void Send(Link& link, std::string message) REQUIRES(mu) {
    if (link.conn) link.conn->SendMessage(std::move(message), [](Status) {});
  }

  // Parent side of a link (this node receives).
  void OnOffer(Link& link, CheckedOffer& c) REQUIRES(mu);
  void OnHashes(Link& link, std::string_view payload) REQUIRES(mu);
  void FillWindows(Link& link, Object& obj) REQUIRES(mu);
  void OnLanded(const Event& e) REQUIRES(mu);
  // A chunk now in obj's buffer, out of the parent's reach: SHA-256, then
  // verified/forwarded, or asked again. False when the parent was dropped.
  bool CheckLandedChunk(Link& link, Object& obj, FromParent& fp, uint32_t i) REQUIRES(mu);
  void OnHashListVerified(Object& obj) REQUIRES(mu);
  void Completed(Object& obj) REQUIRES(mu);

  // Child side of a link (this node sends).
  void OnSubscribe(Link& link, std::string_view payload) REQUIRES(mu);
  void OnWant(Link& link, std::string_view payload) REQUIRES(mu);
  void OnFetch(Link& link, std::string_view payload) REQUIRES(mu);
  // `push`: the object is new here since the child subscribed (it cannot
  // hold any of it), so its first chunks may go unasked; objects offered at
  // SUBSCRIBE or on FETCH may be half-held by a resuming child: WANT only.
  void OfferTo(Link& link, Object& obj, bool push = false) REQUIRES(mu);
  // Offers `obj` to a subscribed child unless the child serves its version
  // or a newer one. Numbers are unique in the board's log, and the one
  // object that runs backwards, a supersede's patch(withdrawn HEAD ->
  // version) (docs/agent/board.md §4a), starts at the child's version: it is
  // offered too. The child's own manifest check decides by (epoch, version).
  void OfferIfNewer(Link& link, Object& obj, bool push = false) REQUIRES(mu) {
    if (obj.ref.to > link.served_version ||
        (obj.ref.from == link.served_version && obj.ref.to != link.served_version))
      OfferTo(link, obj, push);
  }
  void SendChunkTo(Link& link, Object& obj, uint32_t i) REQUIRES(mu);
  void Forward(Object& obj, uint32_t i) REQUIRES(mu);
  // Memory (docs/agent.md §8): once chunk i is verified and no child has it
  // waiting or in flight, its pages leave the resident set (MappedFile::
  // DropPages), so a relay holds about its windows, not its objects. A
  // later WANT faults them back in from the page cache or the file.
  // Idle: verified and no child has it waiting or in flight.
  bool Idle(const Object& obj, uint32_t i) const REQUIRES(mu);
  void DropIfIdle(Object& obj, uint32_t i) REQUIRES(mu);
  void OnSent(const Event& e) REQUIRES(mu);
  void ForgetObject(const ObjectRef& ref) REQUIRES(mu);

  // Push (relay_push.cc). Child side of a parent link:
  void OpenPushWindow(Link& link) REQUIRES(mu);
  void OnPush(Link& link, std::string_view payload, uint64_t at_us) REQUIRES(mu);
  void OnPushed(const Event& e) REQUIRES(mu);
  // After OnOffer: marks the chunks the PUSH announced (MarkPushed), then
  // opens windows for the rest.
  void AfterOffer(uint64_t link_id, const ObjectRef& ref) REQUIRES(mu);
  void MarkPushed(Link& link) REQUIRES(mu);
  void DrainPush(Link& link) REQUIRES(mu);
  // Parent side: which chunks of `obj` go unasked to `link`, and PUSH.
  std::vector<std::pair<uint32_t, uint64_t>> PlanPush(Link& link, const Object& obj) REQUIRES(mu);
  void StartPush(Link& link, Object& obj, const std::vector<std::pair<uint32_t, uint64_t>>& push)
      REQUIRES(mu);
  void OnPushDone(Link& link, std::string_view payload) REQUIRES(mu);
  void RetireIfDrained(const ObjectRef& ref) REQUIRES(mu);
};

}  // namespace tern::agent

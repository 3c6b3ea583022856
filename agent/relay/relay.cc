// RelayNode (agent/relay/relay.h; docs/agent/relay.md). One worker thread owns
// every state change; transport callbacks only queue events (relay_inbox.h).
// mu_ guards the state against the readers (Progress, Stats); the worker
// drops it around the callbacks it makes to the lead.
#include "agent/relay/relay.h"

#include "agent/relay/relay_internal.h"

namespace tern::agent {

void RelayNode::Impl::Run() {
  for (;;) {
    Event e = inbox->Pop();
    if (e.kind == Event::kStop) return;
    std::optional<CheckedOffer> offer;
    if (e.kind == Event::kMessage && DataTypeOf(e.payload) == uint8_t(DataType::kOffer)) {
      offer = CheckOffer(e.payload);  // the worker is the only writer: no lock needed to read
    }
    std::vector<std::function<void()>> todo;
    {
      MutexLock lock(mu);
      if (offer) {
        if (Link* link = Find(e.link); link && link->parent) {
          OnOffer(*link, *offer);
          AfterOffer(e.link, offer->ref);  // the link may be gone: by id
        } else if (link) {
          DropPeer(*link, TERN_ERROR(kProtocol, "OFFER from a child"));
        }
      } else {
        Handle(e);
      }
      todo.swap(calls);
    }
    for (auto& call : todo) call();
  }
}

void RelayNode::Impl::Handle(Event& e) {
  switch (e.kind) {
    case Event::kStop:
      return;
    case Event::kAccepted: {
      size_t children = 0;
      for (auto& [id, l] : links) children += !l->parent;
      if (children >= options.max_children) {
        Log(internal::StrCat("relay: refused child ", e.conn->peer_address(), ": ", children,
                             " children already (max_children)"));
        e.conn->Close();
        return;
      }
      Transport* via = e.via ? e.via : &transport;
      if (!Has(via)) {
        Log("relay: refused child " + e.conn->peer_address() +
            ": accepted on a transport not added");
        e.conn->Close();
        return;
      }
      auto link = std::make_unique<Link>();
      link->id = e.link;
      link->transport = via;
      link->conn = std::move(e.conn);
      link->stats.peer = link->conn->peer_address();
      links[e.link] = std::move(link);
      return;
    }
    case Event::kSetParent: {
      Transport* via = e.via ? e.via : &transport;
      if (e.stripes < 1 || e.stripes > kMaxStripes || e.stripe >= e.stripes || !Has(via)) {
        Status st = !Has(via) ? TERN_ERROR(kInvalidArgument, "parent of stripe ", e.stripe,
                                           " on a transport not added (AddTransport)")
                              : TERN_ERROR(kInvalidArgument, "stripe ", e.stripe, " of ", e.stripes,
                                           " (at most ", kMaxStripes, " stripes)");
        calls.push_back([this, s = e.stripe, st] {
          if (callbacks.on_parent_failed) callbacks.on_parent_failed(s, st, ParentLoss::kLink);
        });
        return;
      }
      if (Link* old = Find(parent_of[e.stripe])) CloseLink(*old);
      auto link = std::make_unique<Link>();
      const uint64_t id = inbox->NewLinkId();
      link->id = id;
      link->parent = true;
      link->transport = via;
      link->stats.parent = true;
      link->stats.peer = e.payload;
      link->stats.stripe = e.stripe;
      link->stats.stripes = e.stripes;
      links[id] = std::move(link);
      parent_of[e.stripe] = id;
      via->Connect(e.payload, Handlers(inbox, id),
                   [in = inbox, id](Result<std::shared_ptr<Connection>> r) {
                     Event c;
                     c.kind = Event::kConnected;
                     c.link = id;
                     if (r.ok()) {
                       c.conn = std::move(*r);
                     } else {
                       c.status = r.status();
                     }
                     in->Push(std::move(c));
                   });
      return;
    }
    case Event::kConnected: {
      Link* link = Find(e.link);
      if (!link) {
        if (e.conn) e.conn->Close();  // replaced while dialing
        return;
      }
      if (!e.conn) return FailParent(*link, e.status);
      link->conn = std::move(e.conn);
      OpenPushWindow(*link);
      Subscribe s{options.member_id, static_cast<uint16_t>(link->stats.stripe),
                  static_cast<uint16_t>(link->stats.stripes), options.join_token,
                  served_version.load(), link->push_in ? link->push_in->bytes : 0};
      Send(*link, EncodeSubscribe(s));
      return;
    }
    case Event::kFetch:
      if (e.stripe < kMaxStripes) {
        if (Link* link = Find(parent_of[e.stripe]); link && link->conn) {
          return Send(*link, EncodeFetch(e.ref));
        }
      }
      Log(internal::StrCat("relay: no parent on stripe ", e.stripe, " to fetch ",
                           ObjectName(e.ref), " from"));
      return;
    case Event::kForget:
      return ForgetObject(e.ref);
    case Event::kOverflow:
      if (Link* link = Find(e.link)) {
        DropPeer(*link, TERN_ERROR(kResourceExhausted, "more than ", options.inbox_messages_max,
                                   " messages queued"));
      }
      return;
    case Event::kClosed: {
      inbox->ForgetLink(e.link);
      Link* link = Find(e.link);
      if (!link) return;
      if (link->parent) {
        return FailParent(*link, e.status.ok() ? TERN_ERROR(kUnavailable, "parent ",
                                                            link->stats.peer, " closed the link")
                                               : e.status);
      }
      return CloseLink(*link);
    }
    case Event::kMessage: {
      Link* link = Find(e.link);
      if (!link) return;
      const auto type = static_cast<DataType>(DataTypeOf(e.payload));
      if (link->parent && type == DataType::kHashes) return OnHashes(*link, e.payload);
      if (link->parent && type == DataType::kPush) return OnPush(*link, e.payload, e.at_us);
      if (!link->parent && type == DataType::kPushDone) return OnPushDone(*link, e.payload);
      if (link->parent && type == DataType::kGone) {
        auto g = DecodeGone(e.payload);
        if (!g.ok()) return DropPeer(*link, g.status());
        Log(internal::StrCat("relay: parent ", link->stats.peer, " does not serve ",
                             ObjectName(g->object), ": ", g->reason));
        return;
      }
      if (!link->parent && type == DataType::kSubscribe) return OnSubscribe(*link, e.payload);
      if (!link->parent && type == DataType::kWant) return OnWant(*link, e.payload);
      if (!link->parent && type == DataType::kFetch) return OnFetch(*link, e.payload);
      return DropPeer(*link, TERN_ERROR(kProtocol, "unexpected message type 0x", std::hex,
                                        int(DataTypeOf(e.payload)), " on a ",
                                        link->parent ? "parent" : "child", " link"));
    }
    case Event::kLanded:
      return OnLanded(e);
    case Event::kPushed:
      return OnPushed(e);
    case Event::kSent:
      return OnSent(e);
    case Event::kOffer: {
      auto it = objects.find(e.object->ref);
      if (it != objects.end() && it->second->complete) return;  // served already
      if (it == objects.end() && objects.size() >= options.max_objects) {
        Log("relay: object table full (max_objects), not serving " + ObjectName(e.object->ref));
        return;
      }
      if (it != objects.end()) {
        // Chunks of the buffer being received may be on their way to
        // children: it stays; the complete copy is not needed.
        Log("relay: " + ObjectName(e.object->ref) + " offered while being received; ignored");
        return;
      }
      it = objects.emplace(e.object->ref, e.object).first;
      for (auto& [id, l] : links) {
        if (!l->parent && l->subscribed) OfferIfNewer(*l, *it->second, /*push=*/true);
      }
      return;
    }
  }
}

// ---- Links ----

void RelayNode::Impl::CloseLink(Link& link) {
  // From the worker (never a callback of this connection): when Close
  // returns the backend no longer writes our windows nor reads our chunks,
  // so the chunks windowed here may be asked of another parent.
  if (link.conn) link.conn->Close();
  for (auto& [ref, fp] : link.from) {
    auto it = objects.find(ref);
    if (it == objects.end()) continue;
    for (uint32_t i : fp.open) {
      auto w = it->second->windows.find(i);
      if (w != it->second->windows.end() && w->second == link.id) it->second->windows.erase(w);
    }
  }
  if (link.parent && parent_of[link.stats.stripe] == link.id) parent_of[link.stats.stripe] = 0;
  // The chunks only this child still had in flight: their pages may go.
  std::vector<std::pair<ObjectRef, uint32_t>> was_sending;
  for (const auto& [ref, tc] : link.to) {
    for (const auto& [i, resends] : tc.inflight) was_sending.emplace_back(ref, i);
  }
  closed_links.Add(link.stats);
  links.erase(link.id);
  for (const auto& [ref, i] : was_sending) {
    if (auto it = objects.find(ref); it != objects.end()) DropIfIdle(*it->second, i);
  }
  // Its sends ended with the Close above: a retired object may now go.
  std::vector<ObjectRef> draining;
  for (auto& [ref, obj] : retired) draining.push_back(ref);
  for (const ObjectRef& ref : draining) RetireIfDrained(ref);
}

void RelayNode::Impl::FailParent(Link& link, Status why, ParentLoss loss) {
  const uint32_t stripe = link.stats.stripe;
  const bool current = parent_of[stripe] == link.id;
  Log(internal::StrCat("relay: parent ", link.stats.peer, " (stripe ", stripe,
                       ") failed: ", why.ToString()));
  CloseLink(link);
  if (current) {
    calls.push_back([this, stripe, why = std::move(why), loss] {
      if (callbacks.on_parent_failed) callbacks.on_parent_failed(stripe, why, loss);
    });
  }
}

void RelayNode::Impl::DropPeer(Link& link, const Status& why) {
  if (link.parent) return FailParent(link, why);
  Log(internal::StrCat("relay: dropping child ", link.stats.peer, ": ", why.ToString()));
  CloseLink(link);
}

// ---- Public API ----

RelayNode::RelayNode(Transport& transport, Env& env, std::string objects_dir,
                     const ManifestVerifier& verifier, BoardId board, LogFn log,
                     RelayOptions options, RelayCallbacks callbacks)
    : impl_(std::make_unique<Impl>(transport, env, std::move(objects_dir), verifier, board,
                                   std::move(log), std::move(options), std::move(callbacks))) {
  if (Status st = CreateDirs(env, impl_->dir); !st.ok()) {
    impl_->Log("relay: cannot create " + impl_->dir + ": " + st.ToString());
  }
  impl_->worker = std::thread([impl = impl_.get()] { impl->Run(); });
}

RelayNode::~RelayNode() {
  std::unique_ptr<Listener> listener;
  {
    MutexLock lock(impl_->mu);
    listener = std::move(impl_->listener);
  }
  if (listener) listener->Close();  // the accept handler is done and never runs again
  impl_->inbox->Close();
  impl_->worker.join();
  std::map<uint64_t, std::unique_ptr<Link>> links;
  std::map<ObjectRef, std::shared_ptr<Object>> objects, retired;
  {
    MutexLock lock(impl_->mu);
    links.swap(impl_->links);
    objects.swap(impl_->objects);
    retired.swap(impl_->retired);
  }
  // After every Close the backend no longer touches the mappings, which the
  // objects then deregister and unmap.
  for (auto& [id, link] : links) {
    if (link->conn) link->conn->Close();
  }
  links.clear();
  objects.clear();
  retired.clear();
}

Status RelayNode::Impl::RegisterEverywhere(Object& obj) {
  for (Transport* t : transports) {
    auto region = t->RegisterMemory(obj.file->data(), obj.meta.bytes, MemoryKind::kHost);
    if (!region.ok()) return region.status().WithContext("with " + t->name());
    obj.regions.push_back({t, *region});
  }
  return Status::Ok();
}

Status RelayNode::AddTransport(Transport& transport) {
  MutexLock lock(impl_->mu);
  TERN_REQUIRE(impl_->objects.empty() && impl_->retired.empty() && impl_->links.empty(),
               kInvalidArgument, "relay: AddTransport after objects or links exist");
  TERN_REQUIRE(!impl_->Has(&transport), kAlreadyExists, "relay: transport ", transport.name(),
               " added twice");
  impl_->transports.push_back(&transport);
  return Status::Ok();
}

AcceptHandler RelayNode::ChildAcceptor(Transport* via) {
  return [in = impl_->inbox, via](std::shared_ptr<Connection> conn) {
    const uint64_t id = in->NewLinkId();
    Event e;
    e.kind = Event::kAccepted;
    e.link = id;
    e.via = via;
    e.conn = std::move(conn);
    in->Push(std::move(e));  // queued before any of its messages
    return Impl::Handlers(in, id);
  };
}

Status RelayNode::Listen(const std::string& address) {
  {
    MutexLock lock(impl_->mu);
    TERN_REQUIRE(!impl_->listener, kAlreadyExists, "relay: already listening on ",
                 impl_->listener->address());
  }
  TERN_ASSIGN_OR_RETURN(auto listener, impl_->transport.Listen(address, ChildAcceptor()));
  MutexLock lock(impl_->mu);
  impl_->listener = std::move(listener);
  return Status::Ok();
}

std::string RelayNode::address() const {
  MutexLock lock(impl_->mu);
  return impl_->listener ? impl_->listener->address() : std::string();
}

void RelayNode::SetParent(uint32_t stripe, uint32_t stripes, std::string address, Transport* via) {
  Event e;
  e.kind = Event::kSetParent;
  e.via = via;
  e.stripe = stripe;
  e.stripes = stripes;
  e.payload = std::move(address);
  impl_->inbox->Push(std::move(e));
}

void RelayNode::SetServedVersion(uint64_t version) { impl_->served_version.store(version); }

void RelayNode::Forget(const ObjectRef& ref) {
  Event e;
  e.kind = Event::kForget;
  e.ref = ref;
  impl_->inbox->Push(std::move(e));
}

void RelayNode::Fetch(uint32_t stripe, const ObjectRef& ref) {
  Event e;
  e.kind = Event::kFetch;
  e.stripe = stripe;
  e.ref = ref;
  impl_->inbox->Push(std::move(e));
}

Result<ObjectProgress> RelayNode::Progress(const ObjectRef& ref) const {
  MutexLock lock(impl_->mu);
  auto it = impl_->objects.find(ref);
  TERN_REQUIRE(it != impl_->objects.end(), kNotFound, "relay: no object ", ObjectName(ref));
  const Object& o = *it->second;
  return ObjectProgress{o.count(), o.verified_count, o.hashes_ok, o.complete};
}

std::vector<LinkStats> RelayNode::Stats() const {
  MutexLock lock(impl_->mu);
  std::vector<LinkStats> out;
  for (auto& [id, link] : impl_->links) {
    out.push_back(link->stats);
    if (link->parent && link->conn) out.back().wire_bytes_in = link->conn->chunk_bytes_received();
  }
  return out;
}

const LockWatch& RelayNode::lock_watch() const { return impl_->lock_watch; }

LinkTotals RelayNode::Totals() const {
  MutexLock lock(impl_->mu);
  LinkTotals t = impl_->closed_links;
  for (auto& [id, link] : impl_->links) t.Add(link->stats);
  return t;
}

}  // namespace tern::agent

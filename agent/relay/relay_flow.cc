// The chunk flow of a RelayNode (agent/relay/relay.h): receiving from parents
// (OFFER -> HASHES -> windows + WANT -> landed -> SHA-256 -> verified) and
// serving children (SUBSCRIBE -> OFFER + HASHES; WANT -> chunks as soon as
// they are verified here: cut-through). Runs on the worker with mu held.

#include "agent/relay/relay_internal.h"
#include "base/text.h"

namespace tern::agent {

// ---- Receiving ----

RelayNode::Impl::CheckedOffer RelayNode::Impl::CheckOffer(std::string_view payload) const {
  CheckedOffer c;
  auto offer = DecodeOffer(payload);
  if (!offer.ok()) {
    c.status = offer.status();
    return c;
  }
  c.offer = std::move(*offer);
  SignerStanding signer = SignerStanding::kNotRead;
  auto m = verifier.Verify(c.offer.signed_manifest, &signer);
  if (!m.ok()) {
    c.status = m.status().WithContext("OFFER manifest");
    if (m.status().code() == Code::kAuth && signer == SignerStanding::kTrusted)
      c.loss = ParentLoss::kBadContent;
    return c;
  }
  c.manifest = std::move(*m);
  if (c.manifest.board_id != board) {
    c.status = TERN_ERROR(kMismatch, "OFFER: manifest of another board");
    return c;
  }
  if (c.offer.object_index >= c.manifest.objects.size()) {
    c.status = TERN_ERROR(kCorrupt, "OFFER: object ", c.offer.object_index, " of a manifest of ",
                          c.manifest.objects.size());
    return c;
  }
  const ManifestObject& o = c.manifest.objects[c.offer.object_index];
  c.ref = ObjectRef{o.kind, o.from_version, o.to_version};
  if (callbacks.on_manifest && !callbacks.on_manifest(c.offer.signed_manifest, c.manifest)) {
    c.refused_by_lead = true;
    c.status = TERN_ERROR(kAuth, "manifest of version ", c.manifest.version, " refused");
  }
  return c;
}

void RelayNode::Impl::OnOffer(Link& link, CheckedOffer& c) {
  if (c.refused_by_lead) {  // e.g. a replayed old version: not the parent's fault
    Log("relay: " + c.status.ToString());
    return;
  }
  // Forged, foreign, or signed by a key this side does not trust.
  if (!c.status.ok()) return FailParent(link, c.status, c.loss);
  if (retired.count(c.ref)) {
    Log("relay: " + ObjectName(c.ref) + " offered while its last sends drain; ignored");
    return;
  }
  const ManifestObject& meta = c.manifest.objects[c.offer.object_index];
  auto it = objects.find(c.ref);
  if (it != objects.end() && it->second->meta != meta) {
    return FailParent(link, TERN_ERROR(kMismatch, "OFFER: ", ObjectName(c.ref),
                                       " signed with other sizes or hashes than before"));
  }
  if (it == objects.end()) {
    if (objects.size() >= options.max_objects) {
      Log("relay: object table full (max_objects), ignoring " + ObjectName(c.ref));
      return;
    }
    auto obj = std::make_shared<Object>();
    obj->ref = c.ref;
    obj->signed_manifest = c.offer.signed_manifest;
    obj->index = c.offer.object_index;
    obj->meta = meta;
    obj->path = dir + "/" + ObjectName(c.ref);
    obj->part_path = obj->path + ".part";
    env.RemoveFile(obj->part_path).IgnoreError();  // a leftover of an earlier run
    auto file = env.CreateMapped(obj->part_path, meta.bytes);
    if (!file.ok()) {
      Log("relay: cannot receive " + ObjectName(c.ref) + ": " + file.status().ToString());
      return;
    }
    obj->file = std::move(*file);
    if (Status st = RegisterEverywhere(*obj); !st.ok()) {
      Log("relay: cannot register " + ObjectName(c.ref) + ": " + st.ToString());
      return;
    }
    obj->verified.assign(meta.chunk_count, 0);
    it = objects.emplace(c.ref, std::move(obj)).first;
  }
  if (!link.from.count(c.ref)) {
    FromParent fp;
    fp.window_base = link.next_window_base;
    link.next_window_base += kMaxManifestChunks;  // ids never reused on this connection
    fp.cursor = link.stats.stripe;
    // When its WANTs go out; a pushed object's bytes came sooner (MarkPushed).
    fp.offered_us = env.clock().NowUs();
    link.from.emplace(c.ref, std::move(fp));
  }
  // No windows yet: AfterOffer first marks the chunks this parent pushes,
  // then asks for the rest.
}

void RelayNode::Impl::OnHashes(Link& link, std::string_view payload) {
  auto h = DecodeHashes(payload);
  if (!h.ok()) return FailParent(link, h.status());
  auto fp = link.from.find(h->object);
  auto obj = objects.find(h->object);
  // After an OFFER this node refused or could not take (the lead's replay
  // check, a full object table): nothing to do, and not the parent's fault.
  if (fp == link.from.end() || obj == objects.end()) return;
  Object& o = *obj->second;
  if (o.hashes_ok) return;  // another stripe's parent was first
  std::vector<Sha256Hash>& list = fp->second.hashes;
  if (h->first != list.size() || list.size() + h->hashes.size() > o.count()) {
    return FailParent(link, TERN_ERROR(kProtocol, "HASHES ", h->first, "+", h->hashes.size(),
                                       " out of order or past ", o.count(), " chunks"));
  }
  list.insert(list.end(), h->hashes.begin(), h->hashes.end());
  if (list.size() < o.count()) return;
  if (ChunkHashRoot(list) != o.meta.chunk_hashes_root) {
    list.clear();
    return FailParent(
        link,
        TERN_ERROR(kAuth, "hash list of ", ObjectName(o.ref), " does not match its signed root"),
        ParentLoss::kBadContent);
  }
  o.hashes = std::move(list);
  list.clear();
  o.hashes_ok = true;
  OnHashListVerified(o);
}

void RelayNode::Impl::OnHashListVerified(Object& obj) {
  // Children hear of the object now, before any of its data: cut-through.
  for (auto& [id, l] : links) {
    if (!l->parent && l->subscribed) OfferIfNewer(*l, obj, /*push=*/true);
  }
  // Pushed chunks that landed before the hash list: checked now.
  std::vector<uint64_t> pushing;
  for (auto& [id, l] : links) {
    if (l->push_in && l->push_in->announced && l->push_in->ref == obj.ref) pushing.push_back(id);
  }
  for (uint64_t id : pushing) {
    if (Link* l = Find(id)) DrainPush(*l);  // may drop that parent
  }
  for (auto& [id, l] : links) {
    if (l->parent && l->from.count(obj.ref)) FillWindows(*l, obj);
  }
}

void RelayNode::Impl::FillWindows(Link& link, Object& obj) {
  if (!obj.hashes_ok || obj.complete || !link.conn) return;
  FromParent& fp = link.from.at(obj.ref);
  const uint32_t stripe = link.stats.stripe, stripes = link.stats.stripes;
  const auto usable = [&](uint32_t i) {
    return !obj.verified[i] && !obj.windows.count(i) && !fp.pushed.count(i);
  };
  std::vector<uint32_t> asked;
  uint64_t limit = options.window_chunks;
  if (options.window_bytes > 0) {
    limit = std::clamp<uint64_t>(options.window_bytes / obj.meta.chunk_bytes, 1, limit);
  }
  while (fp.open.size() < limit) {
    uint32_t i = UINT32_MAX;
    for (auto r = obj.requeue.begin(); r != obj.requeue.end();) {
      if (obj.verified[*r]) {
        r = obj.requeue.erase(r);
      } else if (*r % stripes == stripe && usable(*r)) {
        i = *r;
        obj.requeue.erase(r);
        break;
      } else {
        ++r;
      }
    }
    while (i == UINT32_MAX && fp.cursor < obj.count()) {
      if (usable(fp.cursor)) i = fp.cursor;
      fp.cursor += stripes;
    }
    if (i == UINT32_MAX) break;
    Status st = link.conn->PostReceive(
        fp.window_base + i, obj.RegionOn(link.transport), obj.Offset(i), obj.Length(i),
        [in = inbox, id = link.id, ref = obj.ref, i](uint64_t, uint64_t) {
          Event e;
          e.kind = Event::kLanded;
          e.link = id;
          e.ref = ref;
          e.chunk = i;
          in->Push(std::move(e));
        });
    if (!st.ok()) {
      obj.requeue.insert(i);
      Log("relay: cannot open a window for chunk " + std::to_string(i) + ": " + st.ToString());
      break;
    }
    obj.windows[i] = link.id;
    fp.open.insert(i);
    asked.push_back(i);
  }
  if (asked.empty()) return;
  std::sort(asked.begin(), asked.end());
  Send(link, EncodeWant(Want{obj.ref, fp.window_base, std::move(asked)}));
}

void RelayNode::Impl::OnLanded(const Event& e) {
  Link* link = Find(e.link);
  auto obj_it = objects.find(e.ref);
  if (!link || obj_it == objects.end()) return;  // the link closed: its windows were freed
  auto fp = link->from.find(e.ref);
  if (fp == link->from.end() || !fp->second.open.erase(e.chunk)) return;  // stale
  Object& obj = *obj_it->second;
  // Closed before hashing: from here on the parent cannot change these bytes.
  link->conn->CancelReceive(fp->second.window_base + e.chunk);
  obj.windows.erase(e.chunk);
  if (obj.verified[e.chunk]) return;
  if (!CheckLandedChunk(*link, obj, fp->second, e.chunk)) return;
  if (!obj.complete) FillWindows(*link, obj);
}

bool RelayNode::Impl::CheckLandedChunk(Link& link, Object& obj, FromParent& fp, uint32_t i) {
  Status st = VerifyChunk(obj.hashes[i], obj.Chunk(i));
  if (!st.ok()) {
    ++link.stats.bad_chunks;
    obj.requeue.insert(i);
    Log(internal::StrCat("relay: chunk ", i, " of ", ObjectName(obj.ref), " from ",
                         link.stats.peer, " failed SHA-256; asking again"));
    if (++link.bad_chunks >= options.bad_chunks_max) {
      FailParent(link,
                 TERN_ERROR(kAuth, "parent ", link.stats.peer, " sent ", link.bad_chunks,
                            " chunks that failed SHA-256"),
                 ParentLoss::kBadContent);
      return false;
    }
    return true;
  }
  obj.verified[i] = 1;
  ++obj.verified_count;
  ++link.stats.chunks_in;
  link.stats.bytes_in += obj.Length(i);
  fp.bytes_in += obj.Length(i);
  Forward(obj, i);
  DropIfIdle(obj, i);  // no child waits for it: not needed in memory any more
  if (obj.verified_count == obj.count()) {
    Completed(obj);
    return true;
  }
  if (i == obj.prefix_chunks) {
    while (obj.prefix_chunks < obj.count() && obj.verified[obj.prefix_chunks]) ++obj.prefix_chunks;
    calls.push_back(
        [this, ref = obj.ref, path = obj.part_path, bytes = obj.Offset(obj.prefix_chunks)] {
          if (callbacks.on_prefix_verified) callbacks.on_prefix_verified(ref, path, bytes);
        });
  }
  return true;
}

void RelayNode::Impl::Completed(Object& obj) {
  obj.complete = true;
  obj.requeue.clear();
  const uint64_t now_us = env.clock().NowUs();
  for (auto& [id, l] : links) {
    auto fp = l->from.find(obj.ref);
    if (!l->parent || fp == l->from.end() || fp->second.bytes_in == 0) continue;
    const double s = std::max<uint64_t>(1, now_us - fp->second.offered_us) / 1e6;
    l->stats.last_rate_in_bytes_per_s = double(fp->second.bytes_in) / s;
  }
  // Renamed, not synced: nothing reads a received object after a restart
  // (a new OFFER recreates it; what a member serves is the view store's,
  // which syncs what it commits), so an fsync here only delayed the apply.
  Status st = env.Rename(obj.part_path, obj.path, RenameMode::kReplace);
  if (!st.ok()) {
    // Still served from memory; the lead hears nothing, so it fetches again.
    Log("relay: cannot store " + ObjectName(obj.ref) + ": " + st.ToString());
    return;
  }
  calls.push_back([this, ref = obj.ref, path = obj.path] {
    if (callbacks.on_object_complete) callbacks.on_object_complete(ref, path);
  });
}

// ---- Serving ----

void RelayNode::Impl::OfferTo(Link& link, Object& obj, bool push_allowed) {
  // PUSH goes first so that the child knows, when the hash list checks,
  // which chunks not to ask for; the chunks follow the hash list.
  const auto push = push_allowed ? PlanPush(link, obj) : std::vector<std::pair<uint32_t, uint64_t>>{};
  if (!push.empty()) {
    Send(link, EncodePush(Push{obj.ref, static_cast<uint32_t>(push.size())}));
  }
  Send(link, EncodeOffer(agent::Offer{obj.index, obj.signed_manifest}));
  for (uint32_t first = 0; first < obj.count(); first += kMaxHashesPerMessage) {
    const uint32_t n = std::min(kMaxHashesPerMessage, obj.count() - first);
    Hashes h{obj.ref, first, {obj.hashes.begin() + first, obj.hashes.begin() + first + n}};
    Send(link, EncodeHashes(h));
  }
  if (!push.empty()) StartPush(link, obj, push);
}

void RelayNode::Impl::OnSubscribe(Link& link, std::string_view payload) {
  auto s = DecodeSubscribe(payload);
  if (!s.ok()) return DropPeer(link, s.status());
  if (link.subscribed) return DropPeer(link, TERN_ERROR(kProtocol, "second SUBSCRIBE"));
  if (!options.join_token.empty() && !SecretEquals(options.join_token, s->token)) {
    return DropPeer(link, TERN_ERROR(kAuth, "SUBSCRIBE from '", s->member_id, "' without the join token"));
  }
  link.subscribed = true;
  link.stats.peer = s->member_id;
  link.stats.stripe = s->stripe;
  link.stats.stripes = s->stripes;
  link.served_version = s->served_version;
  link.push_bytes = s->push_window_bytes;
  for (auto& [ref, obj] : objects) {
    if (obj->hashes_ok) OfferIfNewer(link, *obj);
  }
}

void RelayNode::Impl::OnWant(Link& link, std::string_view payload) {
  auto w = DecodeWant(payload);
  if (!w.ok()) return DropPeer(link, w.status());
  if (!link.subscribed) return DropPeer(link, TERN_ERROR(kProtocol, "WANT before SUBSCRIBE"));
  auto it = objects.find(w->object);
  if (it == objects.end() || !it->second->hashes_ok) {
    return Send(link, EncodeGone(Gone{w->object, Code::kNotFound, "not held here"}));
  }
  Object& obj = *it->second;
  auto tc = link.to.try_emplace(w->object).first;
  if (!tc->second.based) {  // the first WANT (pushed chunks need no base)
    tc->second.window_base = w->window_base;
    tc->second.based = true;
  }
  if (tc->second.window_base != w->window_base) {
    return DropPeer(link, TERN_ERROR(kProtocol, "WANT: window base changed"));
  }
  for (uint32_t i : w->chunks) {
    if (i >= obj.count()) {
      return DropPeer(link, TERN_ERROR(kProtocol, "WANT: chunk ", i, " of ", obj.count()));
    }
    if (tc->second.waiting.count(i) || tc->second.inflight.count(i)) continue;
    if (link.credits >= kMaxWantChunks) {
      return DropPeer(link, TERN_ERROR(kResourceExhausted, "more than ", kMaxWantChunks,
                                       " chunks asked for at once"));
    }
    ++link.credits;
    if (obj.verified[i]) {
      SendChunkTo(link, obj, i);
    } else {
      tc->second.waiting.insert(i);
    }
  }
}

void RelayNode::Impl::OnFetch(Link& link, std::string_view payload) {
  auto ref = DecodeFetch(payload);
  if (!ref.ok()) return DropPeer(link, ref.status());
  auto it = objects.find(*ref);
  if (it != objects.end() && it->second->hashes_ok) return OfferTo(link, *it->second);
  Send(link, EncodeGone(Gone{*ref, Code::kNotFound, "not held here"}));
}

void RelayNode::Impl::SendChunkTo(Link& link, Object& obj, uint32_t i) {
  ToChild& tc = link.to.at(obj.ref);
  tc.inflight.try_emplace(i, 0);
  ChunkSend c;
  c.src = obj.RegionOn(link.transport);
  c.src_offset = obj.Offset(i);
  c.length = obj.Length(i);
  if (auto p = tc.push_at.find(i); p != tc.push_at.end()) {
    c.transfer_id = kPushWindowId;
    c.dst_offset = p->second;
  } else {
    c.transfer_id = tc.window_base + i;
    c.dst_offset = 0;
  }
  link.conn->SendChunk(c, [in = inbox, id = link.id, ref = obj.ref, i](Status st) {
    Event e;
    e.kind = Event::kSent;
    e.link = id;
    e.ref = ref;
    e.chunk = i;
    e.status = std::move(st);
    in->Push(std::move(e));
  });
}

void RelayNode::Impl::Forward(Object& obj, uint32_t i) {
  for (auto& [id, l] : links) {
    if (l->parent) continue;
    auto tc = l->to.find(obj.ref);
    if (tc != l->to.end() && tc->second.waiting.erase(i)) SendChunkTo(*l, obj, i);
  }
}

bool RelayNode::Impl::Idle(const Object& obj, uint32_t i) const {
  if (!obj.verified[i]) return false;  // still being received: a window may write it
  for (const auto& [id, l] : links) {
    if (l->parent) continue;
    auto tc = l->to.find(obj.ref);
    if (tc != l->to.end() && (tc->second.waiting.count(i) || tc->second.inflight.count(i))) {
      return false;
    }
  }
  return true;
}

void RelayNode::Impl::DropIfIdle(Object& obj, uint32_t i) {
  if (!Idle(obj, i)) return;
  // A hint: on failure the pages just stay resident.
  obj.file->DropPages(obj.Offset(i), obj.Length(i)).IgnoreError();
}

void RelayNode::Impl::OnSent(const Event& e) {
  struct Drain {  // however this returns, a retired object may now be dropped
    Impl* im;
    const ObjectRef& ref;
    ~Drain() {
      if (im->retired.count(ref)) im->RetireIfDrained(ref);
    }
  } drain{this, e.ref};
  Link* link = Find(e.link);
  auto live_it = objects.find(e.ref);
  const bool live = live_it != objects.end();
  Object* obj = live ? live_it->second.get() : nullptr;
  if (!live) {
    auto r = retired.find(e.ref);
    if (r != retired.end()) obj = r->second.get();
  }
  if (!link || !obj) return;
  auto tc = link->to.find(e.ref);
  if (tc == link->to.end()) return;
  auto it = tc->second.inflight.find(e.chunk);
  if (it == tc->second.inflight.end()) return;
  if (live && e.status.code() == Code::kCorrupt && it->second < options.send_retries_max) {
    ++it->second;  // damaged on the wire (the transport's XXH3): the same bytes again
    ++link->stats.retries;
    return SendChunkTo(*link, *obj, e.chunk);
  }
  tc->second.inflight.erase(it);
  tc->second.push_at.erase(e.chunk);  // asked again later: into its own window
  --link->credits;
  if (live) DropIfIdle(*obj, e.chunk);  // the last child's send of it ended
  if (e.status.ok()) {
    ++link->stats.chunks_out;
    link->stats.bytes_out += obj->Length(e.chunk);
  } else if (live && e.status.code() == Code::kCorrupt) {
    DropPeer(*link, e.status.WithContext("chunk corrupt on every resend"));
  }
  // kNotFound/kOutOfRange: the child closed that window (it got the chunk
  // elsewhere); kUnavailable/kCancelled: on_closed follows.
}

// ---- Retention ----

void RelayNode::Impl::ForgetObject(const ObjectRef& ref) {
  auto it = objects.find(ref);
  if (it == objects.end()) return;
  std::shared_ptr<Object> obj = std::move(it->second);
  objects.erase(it);
  for (auto& [id, l] : links) {
    if (l->parent) {
      auto fp = l->from.find(ref);
      if (fp == l->from.end()) continue;
      // Off the transport's threads: when this returns nothing lands there.
      for (uint32_t i : fp->second.open) l->conn->CancelReceive(fp->second.window_base + i);
      l->from.erase(fp);
    } else if (auto tc = l->to.find(ref); tc != l->to.end()) {
      l->credits -= static_cast<uint32_t>(tc->second.waiting.size());
      tc->second.waiting.clear();
    }
  }
  if (!obj->complete) env.RemoveFile(obj->part_path).IgnoreError();
  retired[ref] = std::move(obj);
  RetireIfDrained(ref);
}

void RelayNode::Impl::RetireIfDrained(const ObjectRef& ref) {
  for (auto& [id, l] : links) {
    auto tc = l->to.find(ref);
    if (tc != l->to.end() && !tc->second.inflight.empty()) return;
  }
  for (auto& [id, l] : links) l->to.erase(ref);
  retired.erase(ref);  // unmapped and deregistered: no send reads it any more
}

// ---- Root side ----

Status RelayNode::Offer(std::string signed_manifest, const ObjectRef& ref,
                        const std::string& path) {
  Impl& im = *impl_;
  TERN_ASSIGN_OR_RETURN(VersionManifest m, im.verifier.Verify(signed_manifest));
  TERN_REQUIRE(m.board_id == im.board, kMismatch, "relay: manifest of another board");
  auto meta = std::find_if(m.objects.begin(), m.objects.end(), [&](const ManifestObject& o) {
    return ObjectRef{o.kind, o.from_version, o.to_version} == ref;
  });
  TERN_REQUIRE(meta != m.objects.end(), kNotFound, "relay: manifest of version ", m.version,
               " does not list ", ObjectName(ref));
  auto obj = std::make_shared<Object>();
  obj->ref = ref;
  obj->signed_manifest = std::move(signed_manifest);
  obj->index = static_cast<uint32_t>(meta - m.objects.begin());
  obj->meta = *meta;
  obj->path = path;
  TERN_ASSIGN_OR_RETURN(obj->file, im.env.Map(path, MapMode::kReadOnly));
  TERN_REQUIRE(obj->file->size() == meta->bytes, kMismatch, "relay: ", path, " holds ",
               obj->file->size(), " bytes, the manifest says ", meta->bytes);
  obj->hashes.resize(meta->chunk_count);
  for (uint32_t i = 0; i < meta->chunk_count; ++i) obj->hashes[i] = Sha256Of(obj->Chunk(i));
  TERN_REQUIRE(ChunkHashRoot(obj->hashes) == meta->chunk_hashes_root, kAuth, "relay: ", path,
               " does not match the signed hashes of ", ObjectName(ref));
  {
    MutexLock lock(im.mu);  // transports is read under mu
    TERN_RETURN_IF_ERROR(im.RegisterEverywhere(*obj));
  }
  obj->hashes_ok = true;
  obj->verified.assign(meta->chunk_count, 1);
  obj->verified_count = meta->chunk_count;
  obj->complete = true;
  Event e;
  e.kind = Event::kOffer;
  e.object = std::move(obj);
  im.inbox->Push(std::move(e));
  return Status::Ok();
}

}  // namespace tern::agent

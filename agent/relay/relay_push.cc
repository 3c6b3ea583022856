// Push (docs/agent/relay.md "Push"; messages docs/format/agent.md §7): a
// parent sends a new object's first chunks of the child's stripe into the
// child's standing push window together with the OFFER, so a long hop costs
// one way instead of OFFER -> WANT -> chunk. Runs on the worker with mu held.
//
// Trust is unchanged: nothing pushed counts before the signed manifest and
// the hash list check. A pushed chunk is copied from the window into the
// object's buffer (where no window of the parent is open) and hashed there;
// the parent may rewrite the window at any time without touching verified
// bytes. Memory: one window of push_window_bytes per parent link, announced
// in SUBSCRIBE; the parent never writes past it (the transport refuses).

#include <algorithm>
#include <cstring>

#include "agent/relay/relay_internal.h"
#include "base/text.h"

namespace tern::agent {

// ---- Child side (this node receives) ----

void RelayNode::Impl::OpenPushWindow(Link& link) {
  if (options.push_window_bytes == 0) return;
  const uint32_t bytes = std::min(options.push_window_bytes, kMaxPushWindowBytes);
  auto p = std::make_unique<PushIn>();
  p->buf.reset(new uint8_t[bytes]);  // not zeroed: pages are touched only by pushes
  p->bytes = bytes;
  auto region = transport.RegisterMemory(p->buf.get(), bytes, MemoryKind::kHost);
  if (!region.ok()) {
    Log("relay: no push window (register): " + region.status().ToString());
    return;
  }
  p->region = *region;
  p->transport = &transport;
  Status st = link.conn->PostReceive(
      kPushWindowId, p->region, 0, bytes, [in = inbox, id = link.id](uint64_t off, uint64_t len) {
        Event e;
        e.kind = Event::kPushed;
        e.link = id;
        e.offset = off;
        e.length = len;
        in->Push(std::move(e));
      });
  if (!st.ok()) {
    Log("relay: no push window: " + st.ToString());
    return;
  }
  link.push_in = std::move(p);
}

void RelayNode::Impl::OnPush(Link& link, std::string_view payload, uint64_t at_us) {
  auto m = DecodePush(payload);
  if (!m.ok()) return FailParent(link, m.status());
  PushIn* p = link.push_in.get();
  if (!p) return FailParent(link, TERN_ERROR(kProtocol, "PUSH without a push window"));
  if (p->announced) {
    return FailParent(link, TERN_ERROR(kProtocol, "PUSH of ", ObjectName(m->object),
                                       " before PUSH_DONE of ", ObjectName(p->ref)));
  }
  if (p->landed.size() > m->count) {
    return FailParent(link, TERN_ERROR(kProtocol, p->landed.size(), " chunks pushed before a PUSH of ",
                                       m->count));
  }
  // Chunks that overtook it came at first_us; otherwise it starts anew.
  p->first_us = p->landed.empty() || p->first_us == 0 ? at_us : std::min(p->first_us, at_us);
  p->announced = true;
  p->offered = false;
  p->ref = m->object;
  p->count = m->count;
  p->consumed = 0;
  DrainPush(link);
}

void RelayNode::Impl::OnPushed(const Event& e) {
  Link* link = Find(e.link);
  if (!link || !link->push_in) return;
  PushIn& p = *link->push_in;
  // A chunk may overtake its PUSH (a multi-stream backend): kept, bounded.
  const uint64_t due = p.announced ? p.count - p.consumed : kMaxWantChunks;
  if (p.landed.size() >= due) {
    return FailParent(*link, TERN_ERROR(kProtocol, "more chunks pushed than announced"));
  }
  // The first chunk of a push not announced yet starts its time anew.
  if (p.first_us == 0 || (!p.announced && p.landed.empty()) || e.at_us < p.first_us)
    p.first_us = e.at_us;
  p.landed.emplace_back(e.offset, e.length);
  DrainPush(*link);
}

void RelayNode::Impl::AfterOffer(uint64_t link_id, const ObjectRef& ref) {
  Link* link = Find(link_id);
  if (!link) return;
  if (link->push_in && link->push_in->announced && !link->push_in->offered &&
      link->push_in->ref == ref) {
    MarkPushed(*link);
    if (!(link = Find(link_id))) return;  // the PUSH did not fit: the parent was dropped
  }
  // Only now the windows: an object whose hash list another stripe's parent
  // already sent is asked for at once, and the chunks this parent is
  // pushing must not be asked for again (they would cross twice).
  auto obj = objects.find(ref);
  if (obj != objects.end() && link->from.count(ref) && !obj->second->complete) {
    FillWindows(*link, *obj->second);
  }
}

void RelayNode::Impl::MarkPushed(Link& link) {
  PushIn& p = *link.push_in;
  const ObjectRef ref = p.ref;
  p.offered = true;
  auto obj = objects.find(ref);
  auto fp = link.from.find(ref);
  if (obj != objects.end() && fp != link.from.end()) {
    const ManifestObject& m = obj->second->meta;
    const auto layout = PushLayout(m, link.stats.stripe, link.stats.stripes, p.count);
    const uint64_t end = layout.empty() ? 0
                                        : layout.back().second + obj->second->Length(layout.back().first);
    if (layout.size() != p.count || end > p.bytes) {
      return FailParent(
          link, TERN_ERROR(kProtocol, "PUSH of ", p.count, " chunks of ", ObjectName(ref),
                           " does not fit the stripe or the ", p.bytes, "-byte push window"));
    }
    for (const auto& [i, off] : layout) {
      if (!obj->second->verified[i]) fp->second.pushed.insert(i);
    }
    // Its bytes began to come with the PUSH (or a chunk ahead of it).
    if (p.first_us != 0) fp->second.offered_us = std::min(fp->second.offered_us, p.first_us);
  }
  DrainPush(link);
}

void RelayNode::Impl::DrainPush(Link& link) {
  PushIn& p = *link.push_in;
  if (!p.announced || !p.offered) return;
  auto obj_it = objects.find(p.ref);
  auto fp = link.from.find(p.ref);
  // Refused by the lead, not taken (table full) or forgotten: the bytes are
  // dropped as they land, and the window is freed all the same.
  Object* obj = obj_it != objects.end() && fp != link.from.end() ? obj_it->second.get() : nullptr;
  if (obj && !obj->hashes_ok) return;  // kept in the window until the hash list checks
  std::vector<std::pair<uint32_t, uint64_t>> layout;
  if (obj) layout = PushLayout(obj->meta, link.stats.stripe, link.stats.stripes, p.count);
  const uint64_t link_id = link.id;
  for (size_t k = 0; k < p.landed.size(); ++k) {
    const uint64_t off = p.landed[k].first, len = p.landed[k].second;  // (a lambda captures off)
    ++p.consumed;
    if (!obj) continue;
    auto at = std::find_if(layout.begin(), layout.end(), [&](const auto& e) { return e.second == off; });
    if (at == layout.end() || obj->Length(at->first) != len) {
      return FailParent(link, TERN_ERROR(kProtocol, "pushed chunk at offset ", off, " (", len,
                                         " bytes) is not in the PUSH of ", ObjectName(p.ref)));
    }
    const uint32_t i = at->first;
    fp->second.pushed.erase(i);
    if (obj->verified[i]) continue;
    if (fp->second.open.erase(i)) {  // a window asked for it earlier: closed, not needed
      link.conn->CancelReceive(fp->second.window_base + i);
      obj->windows.erase(i);
    }
    // The copy is what gets hashed, forwarded and applied: out of the
    // parent's reach (no window of it covers chunk i of the buffer).
    std::memcpy(obj->file->data() + obj->Offset(i), p.buf.get() + off, len);
    if (!CheckLandedChunk(link, *obj, fp->second, i)) return;  // the parent was dropped
    if (!Find(link_id)) return;
  }
  p.landed.clear();
  if (p.consumed >= p.count) {
    Send(link, EncodePushDone(p.ref));
    p.announced = false;
    p.offered = false;
    p.count = p.consumed = 0;
  }
  if (obj && !obj->complete) FillWindows(link, *obj);
}

// ---- Parent side (this node sends) ----

std::vector<std::pair<uint32_t, uint64_t>> RelayNode::Impl::PlanPush(Link& link, const Object& obj) {
  // Only to a child that announced a window, one object at a time, for an
  // object it has asked nothing of on this link (no credits to reconcile).
  if (link.push_bytes == 0 || link.push_busy || !link.subscribed || link.to.count(obj.ref) ||
      !obj.hashes_ok || obj.meta.chunk_bytes > link.push_bytes) {
    return {};
  }
  const uint32_t room = kMaxWantChunks - std::min(kMaxWantChunks, link.credits);
  auto layout = PushLayout(obj.meta, link.stats.stripe, link.stats.stripes, room);
  while (!layout.empty() &&
         layout.back().second + obj.Length(layout.back().first) > link.push_bytes) {
    layout.pop_back();
  }
  return layout;
}

void RelayNode::Impl::StartPush(Link& link, Object& obj,
                                const std::vector<std::pair<uint32_t, uint64_t>>& push) {
  link.push_busy = true;
  link.push_ref = obj.ref;
  ToChild& tc = link.to[obj.ref];
  for (const auto& [i, off] : push) {
    tc.push_at[i] = off;
    ++link.credits;
    if (obj.verified[i]) {
      SendChunkTo(link, obj, i);
    } else {
      tc.waiting.insert(i);  // sent the moment it is verified here (cut-through)
    }
  }
}

void RelayNode::Impl::OnPushDone(Link& link, std::string_view payload) {
  auto ref = DecodePushDone(payload);
  if (!ref.ok()) return DropPeer(link, ref.status());
  if (!link.push_busy || !(link.push_ref == *ref)) {
    return DropPeer(link, TERN_ERROR(kProtocol, "PUSH_DONE of ", ObjectName(*ref), " not pushed"));
  }
  link.push_busy = false;
}

}  // namespace tern::agent

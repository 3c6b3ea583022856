// A member's view of its links (agent/daemon/agent_impl.h): round trips to the root
// and to each parent (PING/PONG, docs/format/agent.md §8), and the watch on
// each parent's progress that reports a stalled or bad parent to the root
// (PARENT_REPORT), which plans around it.
#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "agent/daemon/agent_impl.h"

namespace tern::agent {
namespace {

constexpr uint64_t kProbeRedialUs = 1'000'000;  // after a failed probe dial
constexpr uint64_t kPongTooOldUs = 60'000'000;  // an echo older than this is not ours

}  // namespace

// The nonce of a PING is the sender's clock when it was sent; a PONG that
// echoes something in the future or from long ago is not from us.
double AgentImpl::RoundTripOf(uint64_t nonce) const {
  const uint64_t now = clock_.NowUs();
  if (nonce > now || now - nonce > kPongTooOldUs) return 0;
  // 1 us at least: 0 means "not measured" on the wire.
  return static_cast<double>(std::max<uint64_t>(now - nonce, 1)) * 1e-6;
}

void AgentImpl::MemberOnPong(const std::string& address, const std::shared_ptr<Connection>& conn,
                             uint64_t nonce) {
  MutexLock lock(mu_);
  auto it = probes_.find(address);
  if (it == probes_.end() || it->second.conn != conn) return;
  if (const double rtt = RoundTripOf(nonce); rtt > 0) it->second.rtt_s = rtt;
}

// One probe connection per parent address (stripes may share a parent);
// each tick sends a PING on it. Probes of former parents are closed.
void AgentImpl::MemberProbeParents() {
  std::vector<std::pair<std::string, Transport*>> dial;  // a probe takes its edge's transport
  std::vector<std::shared_ptr<Connection>> close;
  Outbox out;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    std::map<std::string, Transport*> want;
    for (const auto& p : parents_.parents) want[p.data_address] = TransportOf(p);
    for (auto it = probes_.begin(); it != probes_.end();) {
      if (want.count(it->first)) {
        ++it;
        continue;
      }
      if (it->second.conn) close.push_back(it->second.conn);
      it = probes_.erase(it);
    }
    const uint64_t now = clock_.NowUs();
    for (const auto& [address, transport] : want) {
      ParentProbe& p = probes_[address];
      if (p.conn) {
        Send(out, p.conn, Ping{now});
      } else if (!p.dialing && now >= p.next_dial_us) {
        p.dialing = true;
        dial.emplace_back(address, transport);
      }
    }
  }
  Flush(out);
  for (auto& c : close) c->Close();
  for (const auto& d : dial) {
    const std::string address = d.first;
    Transport* transport = d.second;
    auto self = std::make_shared<std::weak_ptr<Connection>>();
    ConnectionHandlers h;
    h.on_message = [this, address, self, gate = gate_](std::string payload) {
      ReaderLock open(gate->mu);
      if (!gate->open) return;
      auto conn = self->lock();
      auto m = DecodeControl(payload);
      auto* pong = m.ok() ? std::get_if<Pong>(&*m) : nullptr;
      if (!pong) {
        Log("closing the probe to " + address + ": not a PONG");
        if (conn) conn->Close();
        return;
      }
      MemberOnPong(address, conn, pong->nonce);
    };
    h.on_closed = [this, address, self, gate = gate_](Status) {
      ReaderLock open(gate->mu);
      if (!gate->open) return;
      auto conn = self->lock();
      MutexLock lock(mu_);
      auto it = probes_.find(address);
      if (it != probes_.end() && it->second.conn && it->second.conn == conn) {
        it->second.conn.reset();
        it->second.next_dial_us = clock_.NowUs() + kProbeRedialUs;
      }
    };
    transport->Connect(
        address, std::move(h),
        [this, address, self, gate = gate_](Result<std::shared_ptr<Connection>> r) {
          ReaderLock open(gate->mu);
          if (!gate->open) {
            if (r.ok()) (*r)->Close();
            return;
          }
          Outbox out;
          std::shared_ptr<Connection> unwanted;
          {
            MutexLock lock(mu_);
            auto it = probes_.find(address);
            if (it == probes_.end() || !it->second.dialing || stopping_) {
              // No longer a parent (or stopping): this probe is not wanted.
              if (r.ok()) unwanted = *r;
            } else {
              it->second.dialing = false;
              if (!r.ok()) {
                it->second.next_dial_us = clock_.NowUs() + kProbeRedialUs;
              } else {
                *self = *r;
                it->second.conn = *r;
                Send(out, *r, Ping{clock_.NowUs()});
              }
            }
          }
          Flush(out);
          if (unwanted) unwanted->Close();
        });
  }
}

// Under mu_. A version is due when HEAD is newer than what this member
// serves and nothing it holds reaches HEAD; a parent whose link brings no
// byte for the root's parent_stall_ms (WELCOME) while one is due, or bytes
// but no whole verified chunk for twice that (stall_watch.h), or that the relay dropped for
// chunks failing verification, is reported (again at most once per stall
// time: the root ignores a report on a parent that starves too, and that
// parent's own report names the one above).
void AgentImpl::MemberWatchParentsLocked(Outbox& out, const std::vector<LinkStats>& stats) {
  if (!relay_ || !root_conn_ || !joined_ || parents_.parents.empty()) return;
  const size_t n = parents_.parents.size();
  if (watch_.size() != n) watch_.assign(n, StripeWatch{});
  const uint64_t now = clock_.NowUs();
  const BoardPos head = KnownHeadLocked();
  bool due = head > PosLocked() && !catching_up_;
  for (const auto& ref : relay_held_) due &= PosOfLocked(ref.to) < head;
  for (const auto& [v, o] : ready_) due &= PosOfLocked(v) < head;
  for (uint32_t s = 0; s < n; ++s) {
    StripeWatch& w = watch_[s];
    const ParentRef& p = parents_.parents[s];
    uint64_t bytes = 0, wire = 0, bad = 0;
    for (const auto& l : stats)
      if (l.parent && l.stripe == s) {
        bytes += l.bytes_in;
        wire += l.wire_bytes_in;
        bad += l.bad_chunks;
      }
    if (w.parent_id != p.id) {
      w = StripeWatch{};
      w.parent_id = p.id;
      w.stall = StallWatch{bytes, wire, now, now};
      w.bad_chunks = bad;
      continue;
    }
    const bool bad_chunks = bad > w.bad_chunks || w.failed_auth;
    w.bad_chunks = bad;
    w.failed_auth = false;
    const bool stalled =
        ParentStalled(w.stall, bytes, wire, due, now, uint64_t{board_parent_stall_ms_} * 1000);
    std::optional<ParentFault> fault;
    if (bad_chunks) {
      fault = ParentFault::kBadChunks;
      w.stall.verified_us = w.stall.wire_us = now;
    } else if (stalled) {
      fault = ParentFault::kStalled;
    }
    if (!fault) continue;
    Log("reporting parent " + p.id + " of stripe " + std::to_string(s) +
        " to the root: " + ParentFaultName(*fault) + " (at version " +
        std::to_string(VersionLocked()) + ", HEAD " + std::to_string(known_head_) + ")");
    Send(out, root_conn_, ParentReport{s, p.id, *fault});
  }
}

}  // namespace tern::agent

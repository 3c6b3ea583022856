// Leader election over one leased key (agent/etcd/etcd.h, docs/agent/etcd.md).
#include <algorithm>

#include "agent/etcd/etcd.h"
#include "base/log.h"
#include "base/text.h"

namespace tern::agent {
namespace {

constexpr size_t kMaxCandidateIdBytes = 1024;
constexpr int64_t kMaxElectionTtlS = 3600;
constexpr uint64_t kStopCheckUs = 20'000;  // how fast Resign stops the keep-alive thread

// A txn that makes `key` ours if nobody holds it; when someone does, reads
// who. Also true when the key is already ours (a retry after a reply lost).
Result<int64_t> TryAcquire(EtcdClient& client, const std::string& key, const std::string& id,
                           int64_t lease, std::string* holder) {
  auto txn =
      client.Txn({EtcdCompare::Absent(key)}, {EtcdOp::Put(key, id, lease)}, {EtcdOp::Get(key)});
  if (!txn.ok()) return std::move(txn).take_status();
  if (txn->succeeded) return txn->revision;  // the put created the key
  TERN_REQUIRE(txn->gets.size() == 1, kProtocol, "etcd: election txn without its read");
  if (txn->gets[0].kvs.empty()) return int64_t{0};  // gone meanwhile: try again
  const EtcdKeyValue& kv = txn->gets[0].kvs[0];
  if (kv.lease == lease && kv.value == id) return kv.create_revision;
  *holder = kv.value;
  return int64_t{0};
}

}  // namespace

Result<std::unique_ptr<Election>> Election::Campaign(const EtcdOptions& etcd,
                                                     ElectionOptions options, Clock& clock,
                                                     uint64_t timeout_ms, uint32_t poll_ms) {
  TERN_REQUIRE(!options.prefix.empty(), kInvalidArgument, "election: empty prefix");
  TERN_REQUIRE(!options.id.empty() && options.id.size() <= kMaxCandidateIdBytes, kInvalidArgument,
               "election: candidate id of ", options.id.size(), " bytes (want 1..",
               kMaxCandidateIdBytes, ")");
  TERN_REQUIRE(options.lease_ttl_s >= 1 && options.lease_ttl_s <= kMaxElectionTtlS,
               kInvalidArgument, "election: lease TTL ", options.lease_ttl_s, " s not in 1..",
               kMaxElectionTtlS);
  auto client = EtcdClient::Create(etcd);
  if (!client.ok()) return std::move(client).take_status();
  const std::string key = options.prefix + "/leader";
  auto lease = (*client)->LeaseGrant(options.lease_ttl_s);
  if (!lease.ok()) return lease.status().WithContext("election: lease grant");
  // Poll at least three times per TTL so that our lease outlives the wait.
  const uint64_t poll_us =
      std::clamp<uint64_t>(uint64_t{poll_ms} * 1000, 1000, uint64_t(lease->ttl_s) * 1'000'000 / 3);
  const uint64_t deadline_us = clock.NowUs() + timeout_ms * 1000;
  std::string holder;
  Status last;
  while (true) {
    auto created = TryAcquire(**client, key, options.id, lease->id, &holder);
    if (created.ok() && *created > 0) {
      LogLine(options.log, "election: " + Printable(options.id) + " leads " + Printable(key));
      auto* e = new Election(std::move(*client), std::move(options), clock, key, lease->id,
                             lease->ttl_s, *created);
      return std::unique_ptr<Election>(e);
    }
    if (!created.ok()) {
      // etcd unreachable: keep trying until the deadline; anything else is final.
      if (created.status().code() != Code::kUnavailable) {
        (*client)->LeaseRevoke(lease->id).IgnoreError();
        return created.status().WithContext("election");
      }
      last = created.status();
    }
    if (clock.NowUs() >= deadline_us) break;
    auto ttl = (*client)->LeaseKeepAlive(lease->id);
    if (!ttl.ok() && ttl.status().code() == Code::kNotFound) {
      // Our lease expired while etcd was away: take a new one.
      auto again = (*client)->LeaseGrant(options.lease_ttl_s);
      if (again.ok()) lease = std::move(again);
    }
    const uint64_t now = clock.NowUs();
    if (now >= deadline_us) break;
    clock.SleepUs(std::min(poll_us, deadline_us - now));
  }
  (*client)->LeaseRevoke(lease->id).IgnoreError();
  if (!holder.empty()) {
    return TERN_ERROR(kTimeout, "election: ", Printable(key), " is held by '", Printable(holder),
                      "' after ", timeout_ms, " ms");
  }
  return TERN_ERROR(kTimeout, "election: no leadership of ", Printable(key), " after ", timeout_ms,
                    " ms", last.ok() ? "" : ": ", last.ok() ? "" : last.ToString());
}

Election::Election(std::unique_ptr<EtcdClient> client, ElectionOptions options, Clock& clock,
                   std::string key, int64_t lease_id, int64_t ttl_s, int64_t created_revision)
    : client_(std::move(client)),
      options_(std::move(options)),
      clock_(clock),
      key_(std::move(key)),
      lease_id_(lease_id),
      ttl_s_(ttl_s),
      created_revision_(created_revision) {
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
}

Election::~Election() {
  Resign().IgnoreError();
  if (keepalive_.joinable()) keepalive_.join();
}

Status Election::Resign() {
  // No lock held while joining: on_lost may call Resign from the thread.
  if (resigned_.exchange(true)) return Status::Ok();
  stop_ = true;
  leader_ = false;
  // From on_lost the keep-alive thread is the caller: it ends by itself.
  if (keepalive_.joinable() && keepalive_.get_id() != std::this_thread::get_id()) {
    keepalive_.join();
  }
  // Revoking deletes the key at once, so a standby need not wait a TTL.
  Status s = client_->LeaseRevoke(lease_id_);
  if (!s.ok() && s.code() == Code::kNotFound) return Status::Ok();  // already expired
  return s.WithContext("election: resign");
}

void Election::Lost(const Status& why) {
  leader_ = false;
  stop_ = true;
  LogLine(options_.log, "election: " + Printable(options_.id) + " lost " + Printable(key_) + ": " +
                            why.ToString());
  if (options_.on_lost) options_.on_lost(why);
}

void Election::KeepAliveLoop() {
  const uint64_t ttl_us = uint64_t(ttl_s_) * 1'000'000;
  const uint64_t interval_us = ttl_us / 3;
  // The lease lives at least until the start of the last successful
  // keep-alive plus the TTL. Give up at 2/3 of that, before a standby can
  // take over, so that two leaders never believe in themselves at once
  // (writes are fenced in etcd as well: Fence()).
  uint64_t last_ok_us = clock_.NowUs();
  while (!stop_) {
    for (uint64_t slept = 0; slept < interval_us && !stop_; slept += kStopCheckUs) {
      clock_.SleepUs(std::min(kStopCheckUs, interval_us - slept));
    }
    if (stop_) return;
    const uint64_t start_us = clock_.NowUs();
    auto ttl = client_->LeaseKeepAlive(lease_id_);
    if (stop_) return;
    if (ttl.ok()) {
      auto held = client_->Get(key_);
      if (stop_) return;
      if (held.ok()) {
        if (held->kvs.empty() || held->kvs[0].lease != lease_id_ ||
            held->kvs[0].create_revision != created_revision_) {
          Lost(TERN_ERROR(kMismatch, "the key ", Printable(key_),
                          held->kvs.empty() ? " was deleted" : " was taken over"));
          return;
        }
        last_ok_us = start_us;
        continue;
      }
    } else if (ttl.status().code() == Code::kNotFound) {
      Lost(ttl.status().WithContext("lease expired or revoked"));
      return;
    }
    if (clock_.NowUs() - last_ok_us >= ttl_us * 2 / 3) {
      Lost(TERN_ERROR(kUnavailable, "no keep-alive for ", (clock_.NowUs() - last_ok_us) / 1000,
                      " ms of a ", ttl_s_,
                      " s lease: ", ttl.ok() ? "cannot read the key" : ttl.status().ToString()));
      return;
    }
  }
}

Result<std::string> Election::Leader(EtcdClient& client, const std::string& prefix) {
  TERN_REQUIRE(!prefix.empty(), kInvalidArgument, "election: empty prefix");
  auto range = client.Get(prefix + "/leader");
  if (!range.ok()) return std::move(range).take_status();
  return range->kvs.empty() ? std::string() : range->kvs[0].value;
}

}  // namespace tern::agent

// EngineDriver and SlotLease (agent/daemon/engine_driver.h).
#include "agent/daemon/engine_driver.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tern::agent {

// ---- SlotLease ----

bool SlotLease::Begin(const std::string& slot) {
  MutexLock lock(mu_);
  if (current_slot_() != slot) return false;
  reading_ = true;
  overridden_ = false;
  slot_ = slot;
  return true;
}

bool SlotLease::End() {
  MutexLock lock(mu_);
  reading_ = false;
  slot_.clear();
  cv_.SignalAll();
  return overridden_;
}

bool SlotLease::WaitOffSpare(uint32_t max_wait_ms, const LogFn& log) {
  MutexLock lock(mu_);
  // The spare is the slot being read once DIR/current points elsewhere.
  auto busy = [&]() REQUIRES(mu_) { return reading_ && current_slot_() != slot_; };
  if (!busy()) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_wait_ms);
  if (cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) { return !busy(); })) return true;
  overridden_ = true;
  if (log) {
    log("engine: an update still reads " + slot_ + " after " + std::to_string(max_wait_ms) +
        " ms; the member rewrites it now and the next update loads every tensor");
  }
  return false;
}

// ---- EngineDriver ----

EngineDriver::EngineDriver(EventRing& ring, SlotLease& lease, std::unique_ptr<EngineAdapter> adapter,
                           std::string engine_name, EngineDriverOptions options, Clock& clock,
                           LogFn log, std::unique_ptr<EngineCommitPoint> commit)
    : ring_(ring),
      lease_(lease),
      adapter_(std::move(adapter)),
      commit_(std::move(commit)),
      options_(options),
      clock_(clock),
      log_(std::move(log)) {
  MutexLock lock(mu_);
  status_.engine = std::move(engine_name);
  status_.state = "starting";
}

EngineDriver::~EngineDriver() { Stop(); }

void EngineDriver::Prime(uint64_t version, uint32_t epoch, std::string slot_dir) {
  if (version == 0) return;
  MutexLock lock(mu_);
  AgentEvent e;
  e.kind = AgentEvent::Kind::kVersionServed;
  e.version = version;
  e.epoch = epoch;
  e.slot_dir = std::move(slot_dir);
  e.all_tensors = true;
  target_ = std::move(e);
  full_ = true;
  last_seen_ = version;
  status_.target_version = version;
  status_.target_epoch = epoch;
}

void EngineDriver::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void EngineDriver::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

AgentEngineStatus EngineDriver::status() const {
  MutexLock lock(mu_);
  return status_;
}

void EngineDriver::Note(const AgentEvent& e, bool gap) {
  MutexLock lock(mu_);
  // The event's changed tensors are relative to the member's previous
  // served version: they extend the pending set only when the driver saw
  // that one too and nothing was lost between.
  if (gap || e.all_tensors || last_seen_ == 0) full_ = true;
  if (!full_) changed_.insert(e.changed_tensors.begin(), e.changed_tensors.end());
  last_seen_ = e.version;
  // Compared as positions (epoch, version): a supersede renumbers below a
  // withdrawn HEAD, so a lower number of a later epoch is newer.
  const auto event_at = std::pair{e.epoch, e.version};
  const auto engine_at = std::pair{status_.epoch, status_.version};
  if (event_at <= engine_at) {
    // The engine already serves it or a newer one (older events still in
    // the ring, or an engine started from this slot): nothing to load; when
    // it is the engine's version, the next update's changes count from here.
    if (event_at == engine_at) {
      full_ = false;
      changed_.clear();
      target_.reset();
    }
    return;
  }
  target_ = e;
  status_.target_version = e.version;
  status_.target_epoch = e.epoch;
}

void EngineDriver::MaybeUpdate() {
  EngineUpdate u;
  uint32_t epoch = 0;  // the target's
  {
    MutexLock lock(mu_);
    if (!target_ || clock_.NowUs() < not_before_us_) return;
    u.version = target_->version;
    epoch = target_->epoch;
    u.base_version = status_.version;
    u.slot_dir = target_->slot_dir;
    if (!full_ && status_.version != 0) u.changed = std::vector<std::string>(changed_.begin(), changed_.end());
    status_.state = "updating";
  }
  if (!lease_.Begin(u.slot_dir)) {
    // The member moved on: a newer served event follows.
    MutexLock lock(mu_);
    status_.state = "waiting";
    return;
  }
  const uint64_t t0 = clock_.NowUs();
  Status begin = commit_ ? commit_->Begin(u.version, options_.commit_hold_ms) : Status::Ok();
  Result<EngineUpdateReport> r =
      begin.ok() ? adapter_->Apply(u)
                 : Result<EngineUpdateReport>(TERN_ERROR(
                       kUnavailable, "the sidecar did not open its commit point (the engine was "
                                     "not touched): ", begin.ToString()));
  const bool overridden = lease_.End();
  const double took_s = static_cast<double>(clock_.NowUs() - t0) * 1e-6;
  // The sidecar's commit ends after status() names the outcome (below).
  struct EndCommit {
    EngineCommitPoint* commit;
    uint64_t version;
    bool loaded = false;
    bool begun;
    const LogFn& log;
    ~EndCommit() {
      if (!commit || !begun) return;
      if (Status s = commit->End(version, loaded); !s.ok() && log)
        log("engine: the sidecar's commit of version " + std::to_string(version) +
            " did not end cleanly: " + s.ToString());
    }
  } end_commit{commit_.get(), u.version, false, begin.ok(), log_};
  end_commit.loaded = r.ok() && !overridden && r->version == u.version;
  MutexLock lock(mu_);
  if (r.ok() && !overridden && r->version == u.version) {
    status_.version = r->version;
    status_.epoch = epoch;
    status_.state = "serving";
    status_.last_error.clear();
    ++status_.updates_ok;
    status_.last_pause_ms = r->pause_ms;
    status_.last_update_ms = r->update_ms;
    status_.last_full = r->full;
    backoff_ms_ = 0;
    not_before_us_ = 0;
    // Versions served while it ran keep their changes pending (the set may
    // name more than needed, never less); otherwise nothing is.
    if (target_ && target_->version == u.version && target_->epoch == epoch) {
      target_.reset();
      changed_.clear();
      full_ = false;
    }
    if (log_) {
      log_("engine: serves version " + std::to_string(u.version) + " (" +
                                (r->full ? "every tensor" : std::to_string(u.changed->size()) + " tensors") +
                                ", pause " + std::to_string(r->pause_ms) + " ms, " +
                                std::to_string(took_s) + " s)");
    }
    return;
  }
  ++status_.updates_failed;
  status_.state = "failed";
  if (!r.ok()) {
    status_.last_error = r.status().ToString();
    if (r.status().code() == Code::kInvalidArgument || r.status().code() == Code::kNotFound) {
      full_ = true;  // a refused sparse update may succeed whole
    }
  } else if (overridden) {
    status_.last_error = "the member rewrote the slot while the engine read it";
  } else {
    status_.last_error = "the engine says it serves version " + std::to_string(r->version) +
                         " after loading " + std::to_string(u.version);
  }
  if (overridden || r.ok()) full_ = true;  // what the engine holds is not known
  if (r.ok() && !overridden) {
    status_.version = r->version;
    status_.epoch = 0;  // a number the member did not give it: epoch not known
  }
  backoff_ms_ = backoff_ms_ == 0 ? options_.backoff_min_ms
                                 : std::min(options_.backoff_max_ms, backoff_ms_ * 2);
  not_before_us_ = clock_.NowUs() + uint64_t{backoff_ms_} * 1000;
  if (log_) {
    log_("engine: version " + std::to_string(u.version) +
                                 " not loaded (" + status_.last_error + "); the engine serves " +
                                 std::to_string(status_.version) + ", retrying in " +
                                 std::to_string(backoff_ms_) + " ms");
  }
}

void EngineDriver::Loop() {
  {
    auto v = adapter_->ServedVersion();
    MutexLock lock(mu_);
    if (v.ok()) {
      status_.version = v->value_or(0);
      status_.epoch = 0;  // the engine names no epoch
      status_.state = "serving";
      if (target_ && target_->version == status_.version) {
        // Primed with the version the engine already serves: trust its
        // name (it was started from that slot or loaded it through us),
        // and so the epoch the member serves it in.
        status_.epoch = target_->epoch;
        target_.reset();
        full_ = false;
      }
    } else {
      status_.state = "unreachable";
      status_.last_error = v.status().ToString();
    }
  }
  uint64_t after = 0;
  std::vector<AgentEvent> events;
  while (!stopping_) {
    // Short waits: Stop is seen within one, and a backoff ends within one.
    Status st = ring_.Wait(after, kMaxEventsPerWait, 250, &events);
    if (!st.ok()) return;  // the agent is stopping
    for (const AgentEvent& e : events) {
      const bool gap = after != 0 && e.seq > after + 1;
      after = e.seq;
      if (e.kind == AgentEvent::Kind::kVersionServed) Note(e, gap);
    }
    if (!stopping_) MaybeUpdate();
  }
}

}  // namespace tern::agent

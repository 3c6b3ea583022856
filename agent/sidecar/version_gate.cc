#include "agent/sidecar/version_gate.h"

#include <chrono>

namespace tern::agent {

VersionGate::Ticket::Ticket(Ticket&& other) noexcept
    : gate_(other.gate_), start_(other.start_), exact_(other.exact_) {
  other.gate_ = nullptr;
}

VersionGate::Ticket& VersionGate::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    if (gate_) gate_->Release(exact_);
    gate_ = other.gate_, start_ = other.start_, exact_ = other.exact_;
    other.gate_ = nullptr;
  }
  return *this;
}

VersionGate::Ticket::~Ticket() {
  if (gate_) gate_->Release(exact_);
}

bool VersionGate::ReachableLocked(const VersionConstraint& c) const {
  auto target = c.Target();
  if (!target) return false;  // unconstrained: only "nothing applied" refuses it
  if (*target > std::max(head_, applied_.value_or(0))) return false;
  // Versions only move forward in the normal course: an exact version the
  // replica has already passed will not come back.
  if (c.exact_version && applied_ && *applied_ > *c.exact_version) return false;
  return true;
}

VersionGate::Admission VersionGate::Admit(const VersionConstraint& c, uint32_t wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  Admission out;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (closed_) break;
    if (committing_) {  // a commit is bounded (drain timeout, then apply): wait it out
      cv_.wait(lock);
      continue;
    }
    if (applied_ && c.SatisfiedBy(applied_)) {  // nothing applied: nothing served (the seed)
      ++in_flight_;
      if (c.exact_version) ++exact_in_flight_[*c.exact_version];
      out.applied = applied_;
      out.ticket.emplace(Ticket(this, *applied_, c.exact_version));
      return out;
    }
    if (!ReachableLocked(c) || std::chrono::steady_clock::now() >= deadline) break;
    out.waited = true;
    cv_.wait_until(lock, deadline);
  }
  out.applied = applied_;
  return out;
}

void VersionGate::Release(std::optional<uint64_t> exact) {
  std::lock_guard<std::mutex> lock(mu_);
  --in_flight_;
  if (exact) {
    auto it = exact_in_flight_.find(*exact);
    if (--it->second == 0) exact_in_flight_.erase(it);
  }
  cv_.notify_all();
}

Status VersionGate::Commit(uint64_t version, const std::function<Status()>& apply,
                           uint32_t drain_timeout_ms) {
  std::lock_guard<std::mutex> one(commit_mu_);
  return CommitHoldingCommitMu(version, apply, drain_timeout_ms);
}

Status VersionGate::CommitIfUnchanged(uint64_t version, uint64_t commits_seen,
                                      uint32_t drain_timeout_ms) {
  std::lock_guard<std::mutex> one(commit_mu_);
  if (commits() != commits_seen) return Status::Ok();
  return CommitHoldingCommitMu(version, nullptr, drain_timeout_ms);
}

uint64_t VersionGate::commits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return commits_;
}

Status VersionGate::CommitHoldingCommitMu(uint64_t version, const std::function<Status()>& apply,
                                          uint32_t drain_timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  committing_ = true;
  drain_all_ = mode_ == CommitMode::kQuiesce || (applied_ && version < *applied_);
  auto drained = [&] { return drain_all_ ? in_flight_ == 0 : exact_in_flight_.empty(); };
  auto reopen = [&] {
    committing_ = false;
    drain_all_ = false;
    cv_.notify_all();
  };
  if (!cv_.wait_for(lock, std::chrono::milliseconds(drain_timeout_ms), drained)) {
    reopen();
    return TERN_ERROR(kTimeout, "sidecar: commit of version ", version, ": requests still in ",
                      "flight after ", drain_timeout_ms, " ms");
  }
  // Admission is closed and nothing that must not cross is in flight: apply
  // without the lock (readers and releases go on).
  applying_ = true;
  lock.unlock();
  Status applied = apply ? apply() : Status::Ok();
  lock.lock();
  if (applied.ok() && applied_ != version) {
    applied_ = version;
    ++commits_;
  }
  applying_ = false;
  reopen();
  return applied;
}

void VersionGate::SetHead(uint64_t head, uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch > head_epoch_ || (epoch == head_epoch_ && head > head_)) {
    head_epoch_ = epoch;
    head_ = head;
    cv_.notify_all();
  }
}

void VersionGate::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

std::optional<uint64_t> VersionGate::applied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return applied_;
}

std::optional<uint64_t> VersionGate::SettledVersion() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !applying_; });
  return applied_;
}

uint64_t VersionGate::head() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(head_, applied_.value_or(0));
}

bool VersionGate::committing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committing_;
}

uint64_t VersionGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

}  // namespace tern::agent

// The sidecar's admission gate: which version a request is served on, and
// the commit point at which the served version changes (docs/engines.md).
//
// Admit checks a request's constraint against the applied version and
// captures the version it starts on, under the same lock a commit holds
// while it flips that version, so a request is never attributed to a
// version it did not start on. Commit closes admission, waits for the
// requests that must not cross the change, runs `apply` (the engine loads
// the version), makes the version the applied one, and reopens:
//  * kQuiesce: every request in flight finishes first (start == end);
//  * kInPlace: only exact-version requests finish first; the others run on
//    across the change, so their end version may be newer than their start
//    (the seed system's two modes). A commit that goes back to an older
//    version drains every request in either mode, so no request's floor is
//    crossed downwards.
// A request that is behind but reachable (its target is at most the newest
// version the member knows, and for an exact version not already passed)
// waits up to its wait bound for a commit that satisfies it.
//
// Thread-safe; Admit, Commit and the readers may be called from any thread.
// One Commit runs at a time (a second waits for the first).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "agent/sidecar/request_lane.h"
#include "tern/status.h"

namespace tern::agent {

enum class CommitMode { kQuiesce, kInPlace };

class VersionGate {
 public:
  explicit VersionGate(CommitMode mode) : mode_(mode) {}
  VersionGate(const VersionGate&) = delete;
  VersionGate& operator=(const VersionGate&) = delete;

  // One admitted request; releasing it (destruction) lets a commit proceed.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket();
    uint64_t start_version() const { return start_; }

   private:
    friend class VersionGate;
    Ticket(VersionGate* gate, uint64_t start, std::optional<uint64_t> exact)
        : gate_(gate), start_(start), exact_(exact) {}
    VersionGate* gate_;
    uint64_t start_;
    std::optional<uint64_t> exact_;
  };

  struct Admission {
    std::optional<Ticket> ticket;     // empty: refused (409)
    std::optional<uint64_t> applied;  // the applied version when decided
    bool waited = false;              // it waited for a catch-up
  };
  Admission Admit(const VersionConstraint& c, uint32_t wait_ms);

  // kTimeout when the requests that must finish first are still in flight
  // after drain_timeout_ms (nothing applied; admission reopens); apply's
  // error is returned as is (the applied version stays).
  Status Commit(uint64_t version, const std::function<Status()>& apply, uint32_t drain_timeout_ms);
  // Commit with nothing to apply, only if no commit flipped the version
  // since commits() returned `commits_seen` (else Ok, nothing done): a
  // follower that read a version before a commit point flipped past it must
  // not flip it back.
  Status CommitIfUnchanged(uint64_t version, uint64_t commits_seen, uint32_t drain_timeout_ms);
  // Commits that changed the applied version so far.
  uint64_t commits() const;

  // The newest version the member knows, as a position (epoch, head)
  // (docs/agent/board.md §4a): never lowered within an epoch; a higher
  // epoch replaces it even with a lower number (a supersede withdrew the
  // numbers above it, which must not keep raising staleness floors).
  void SetHead(uint64_t head, uint32_t epoch = 0);
  // Refuses every later admission and wakes every waiter (shutdown).
  void Close();

  std::optional<uint64_t> applied() const;
  // The version a request that ends now has run on at most: the applied
  // version, read after any commit that is applying right now has finished
  // (an in-place commit's engine may already serve the new version before
  // the gate flips). Called by a request still holding its ticket; never
  // waits on a commit that is draining.
  std::optional<uint64_t> SettledVersion() const;
  uint64_t head() const;  // max(head, applied)
  bool committing() const;
  uint64_t in_flight() const;
  CommitMode mode() const { return mode_; }

 private:
  void Release(std::optional<uint64_t> exact);
  Status CommitHoldingCommitMu(uint64_t version, const std::function<Status()>& apply,
                               uint32_t drain_timeout_ms);
  bool ReachableLocked(const VersionConstraint& c) const;

  const CommitMode mode_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::mutex commit_mu_;  // one Commit at a time
  std::optional<uint64_t> applied_;
  uint64_t head_ = 0;
  uint32_t head_epoch_ = 0;
  bool committing_ = false;
  bool applying_ = false;  // a commit's apply is running (admission closed)
  bool drain_all_ = false;
  bool closed_ = false;
  uint64_t in_flight_ = 0;
  uint64_t commits_ = 0;
  std::map<uint64_t, uint64_t> exact_in_flight_;  // exact version -> requests
};

}  // namespace tern::agent

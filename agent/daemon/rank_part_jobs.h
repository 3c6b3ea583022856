// Trainer ranks in other processes: the root's admin route that takes a
// rank's part of a version (docs/format/agent.md §11) and hands it to
// Agent::PublishRankPart, and the rank's client side
// (docs/agent/operations.md, "Publishing from trainer ranks").
//
// PublishRankPart returns only when the version has committed or failed:
// after every other rank's part came and the root published, or at the
// gathering deadline (up to 600 s), which is longer than any admin
// exchange may last (AdminOptions::request_timeout_ms). So each part runs
// as a job on its own thread, as `tern publish` does (publish_jobs.h):
//
//   POST /publish/rank-part?timeout_ms=N[&resume=1]   body: the part's bytes
//     decodes the part (400 saying why when it does not decode: nothing
//     is taken), starts its job (or, for the same bytes again, attaches to
//     the running or committed job of its version and rank: a retry after
//     a lost answer; other bytes while that job runs: 409) and waits up to
//     `wait_ms` for the version's outcome:
//       200 {"published": V}                               committed
//       4xx/5xx one line                                   failed (the reason, naming ranks)
//       202 {"publishing": V, "rank": R, "state": "running"}  still gathering or committing
//     N: the gathering deadline PublishRankPart starts with the version's
//     first part, 1..600000 ms (default 60000). resume=1: a rank that
//     restarted mid-version (AgentImpl::ResumeRankPart); a refusal is
//     409 naming what to do, nothing taken.
//   GET /publish/rank-part?version=V&rank=R
//     {"version", "rank", "state": "running"|"published"|"failed",
//      "code", "error", "seconds"}; 404 for a part the root does not know.
//
// Bounds: at most kMaxRunning parts wait at once (one thread each; more
// answer 503), the outcomes of the last kMaxKept parts are kept for GET.
//
// Thread safety: every method may be called from any thread. Join (and the
// destructor) refuses new parts and waits for the running ones; the owner
// makes PublishRankPart return first (AgentImpl::CloseRankParts).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/daemon/admin_jobs.h"
#include "agent/ops/admin_http.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/rank_publish.h"
#include "tern/status.h"

namespace tern::agent {

inline constexpr uint32_t kMaxRankPartRouteBytes = uint32_t{64} << 20;  // one POST body
inline constexpr uint32_t kDefaultRankPartTimeoutMs = 60000;

class RankPartJobs {
 public:
  // resume: the part of a rank that restarted mid-version (?resume=1),
  // which joins only an open gathering (AgentImpl::ResumeRankPart).
  using SubmitFn = std::function<Status(RankPart part, uint32_t timeout_ms, bool resume)>;
  static constexpr size_t kMaxRunning = 256;
  static constexpr size_t kMaxKept = 1024;

  using State = JobState;
  struct Job {
    uint64_t version = 0;
    uint32_t rank = 0;
    State state = State::kRunning;
    Status status;
    uint64_t part_hash = 0;  // XXH3-64 of the part's bytes: tells a retry from another part
    double started_s = 0, finished_s = 0;  // steady clock, seconds
  };

  explicit RankPartJobs(SubmitFn submit);
  ~RankPartJobs();
  RankPartJobs(const RankPartJobs&) = delete;
  RankPartJobs& operator=(const RankPartJobs&) = delete;

  // Starts submitting `part` (or, when part_hash is the same, attaches to
  // the running or committed job of its version and rank; a failed one, or
  // a committed one of other bytes, is replaced: the rank tries again),
  // then waits up to wait_ms for it to end. kAlreadyExists while a job of
  // other bytes for the same version and rank runs (kMismatch for a
  // resume, saying what to do); kResourceExhausted with kMaxRunning
  // running; kCancelled after Join.
  Result<Job> Start(RankPart part, uint64_t part_hash, uint32_t timeout_ms, uint32_t wait_ms,
                    bool resume = false);
  Result<Job> Find(uint64_t version, uint32_t rank) const;  // kNotFound
  void Join();

  std::vector<AdminRoute> Routes(uint32_t wait_ms);

 private:
  using Key = std::pair<uint64_t, uint32_t>;  // version, rank
  struct Entry {
    Job job;
    uint64_t seq = 0;  // start order: the oldest finished entries go first
    std::thread thread;
  };
  void Run(Key key, uint64_t seq, RankPart part, uint32_t timeout_ms, bool resume);
  void ReapLocked() REQUIRES(mu_);

  const SubmitFn submit_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  std::map<Key, Entry> jobs_ GUARDED_BY(mu_);
  size_t running_ GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  bool closed_ GUARDED_BY(mu_) = false;
  // Threads of finished jobs that were replaced or dropped: joined by the
  // next Start or by Join (their work is done).
  std::vector<std::thread> done_threads_ GUARDED_BY(mu_);
};

// The rank's side: POST the encoded part, then GET until its version has
// an outcome or `options.timeout_ms` has passed (kTimeout, saying the root
// is still at it). `gather_timeout_ms` is the root's gathering deadline
// (the query's timeout_ms). The root's Status comes back with its code and
// reason. resume: sent with ?resume=1, and the root's refusal of the part
// (409) comes back as kMismatch.
Status SendRankPartAndWait(const std::string& admin_address, const std::vector<uint8_t>& part,
                           uint64_t version, uint32_t rank, uint32_t gather_timeout_ms,
                           const AdminClientOptions& request, uint32_t timeout_ms,
                           bool resume = false);

}  // namespace tern::agent

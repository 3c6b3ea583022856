// Publishes that outlive the admin request that asked for them.
//
// A publish takes as long as reading, diffing and encoding the checkpoint
// takes (seconds to minutes for a large model), while every admin exchange
// has a deadline (AdminOptions::request_timeout_ms, 10 s by default: the
// port's defence against slow clients). So the root runs each publish as a
// job on its own thread, and the admin protocol reports the job's real
// outcome however long it takes (docs/agent/operations.md, "Publishing"):
//
//   POST /publish {"checkpoint": PATH, "version": N[, "force": true]
//                  [, "supersede": true]}
//     asks `admit` (which may refuse, or name the path to read instead),
//     then starts the job (or attaches to the running job for the same version
//     and path) and waits up to `wait_ms` for it:
//       200 {"published": N}                 done
//       4xx/5xx one line                     failed (the Status's reason)
//       202 {"publishing": N, "state": "running"}   still running
//     A different publish while one runs: 409.
//   GET /publish
//     {"jobs": [{"version", "checkpoint", "state": "running"|"published"|
//      "failed", "code", "error", "seconds"[, "supersede": true]}, ...]}: the
//     last kMaxJobs jobs, oldest first.
//
// PublishAndWait is the client side: it posts, then polls GET /publish
// until the job ends or its own timeout passes (kTimeout, saying that the
// root is still publishing).
//
// Thread safety: every method may be called from any thread. The destructor
// (and Join) waits for a running job.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "agent/daemon/admin_jobs.h"
#include "agent/ops/admin_http.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/status.h"

namespace tern::agent {

// What a POST /publish asks besides the checkpoint and the version.
struct PublishFlags {
  bool force = false;  // a version far beyond HEAD is meant (AgentOptions::max_version_jump)
  // Renumber downwards: `version` below HEAD opens the next board epoch
  // (docs/agent/board.md §4a, the recovery from a wrong version number).
  bool supersede = false;
};

class PublishJobs {
 public:
  using PublishFn =
      std::function<Status(const std::string& checkpoint, uint64_t version, bool supersede)>;
  static constexpr size_t kMaxJobs = 16;  // finished jobs kept for GET /publish

  using State = JobState;
  struct Job {
    uint64_t version = 0;
    std::string checkpoint;
    bool supersede = false;
    State state = State::kRunning;
    Status status;                         // the outcome once not running
    double started_s = 0, finished_s = 0;  // steady clock, seconds
  };

  explicit PublishJobs(PublishFn publish);
  ~PublishJobs();
  PublishJobs(const PublishJobs&) = delete;
  PublishJobs& operator=(const PublishJobs&) = delete;

  // Starts publishing `checkpoint` as `version` (a supersede if so), or
  // attaches to the running job when it is the same (version, checkpoint,
  // supersede), then waits up to wait_ms for it to end. Returns the job as
  // it stands. kAlreadyExists when another publish is running; kCancelled
  // after Join.
  Result<Job> Start(const std::string& checkpoint, uint64_t version, uint32_t wait_ms,
                    bool supersede = false);
  std::vector<Job> Recent() const;  // oldest first, at most kMaxJobs (+ the running one)
  // Waits for the running job and refuses new ones.
  void Join();

  // Checks a POST /publish before it starts: returns the checkpoint path to
  // publish (e.g. with links resolved) or the refusal.
  using AdmitFn = std::function<Result<std::string>(const std::string& checkpoint, uint64_t version,
                                                    const PublishFlags& flags)>;
  // The admin routes above, answering from this object.
  std::vector<AdminRoute> Routes(uint32_t wait_ms, AdmitFn admit);

 private:
  void Run(std::string checkpoint, uint64_t version, bool supersede);

  const PublishFn publish_;
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  std::deque<Job> jobs_ GUARDED_BY(mu_);  // the running one, if any, is last
  bool running_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  // The last job's thread: joined before the next starts (its work is done
  // then: running_ is false) and by Join (moved out under mu_, joined
  // without it).
  std::thread thread_ GUARDED_BY(mu_);
};

// POST /publish, then GET /publish until the job for `version` has ended or
// `timeout_ms` has passed since the call. The root's Status comes back with
// its code and reason; kTimeout when the root is still publishing.
// `flags`: force (a version far beyond HEAD is meant) and supersede.
Status PublishAndWait(const std::string& admin_address, const std::string& checkpoint,
                      uint64_t version, const PublishFlags& flags,
                      const AdminClientOptions& request, uint32_t timeout_ms);

}  // namespace tern::agent

// What the root's long admin jobs share: a publish (publish_jobs.h) and a
// trainer rank's part (rank_part_jobs.h) both outlive the admin request that
// starts them, so both answer 202 while running, show their outcome as JSON
// to a GET, and have a client that polls that GET until the job ends.
//
// The server side: the job's state and its clock, the answer to the POST
// that started (or attached to) a job, and the outcome fields of the GET.
// The client side: PollJob, the GET loop with its backoff and deadline,
// and AdminRequestOf, a client's credentials as one request's options.
//
// Thread safety: free functions on their arguments.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/ops/admin_http.h"
#include "tern/agent.h"
#include "tern/status.h"

namespace tern::agent {

enum class JobState { kRunning, kPublished, kFailed };

const char* JobStateName(JobState s);  // "running", "published", "failed"
double JobClockS();                    // the steady clock in seconds: a job's started_s/finished_s

AdminResponse TextAnswer(int status, std::string line);  // text/plain, one line

// A query parameter as a whole unsigned number in [lo, hi] (false
// otherwise); `fallback` when absent.
bool NumberParam(const AdminRequest& req, const char* name, uint64_t lo, uint64_t hi,
                 uint64_t fallback, uint64_t* out);

// The answer to the POST that started or attached to a job of `version`:
// 202 with `running` (a JSON object) while it runs, 200 {"published": V}
// once done, the failure's HTTP status and reason once failed.
AdminResponse JobAnswer(JobState state, const Status& status, uint64_t version,
                        const nlohmann::json& running);

// Adds "state" and "seconds" (so far, or until it ended), and for a failed
// job "code" and "error", to a job's JSON object.
void AddJobOutcome(nlohmann::json& o, JobState state, const Status& status, double started_s,
                   double finished_s);

// A job's outcome as the GET shows it (AddJobOutcome's fields): Ok once
// published, the root's Status (its code and reason; `fallback` when the
// reason is missing) once failed, nullopt while running.
std::optional<Status> JobOutcomeOf(const nlohmann::json& job, const char* fallback);

// Polls GET `path` on the root until `outcome` gives the job's end (a
// Status) or `deadline` passes (then `timed_out()`). The pause between
// polls starts at `first_pause_ms` and doubles up to `max_pause_ms`; each
// request's own timeout is cut to what is left. A root too busy to answer
// in time (kTimeout, kUnavailable) is asked again; other errors end the
// poll. `outcome` refuses an answer it cannot read with its own error.
struct JobPoll {
  std::string admin_address;
  std::string path;
  AdminClientOptions request;
  std::chrono::steady_clock::time_point deadline;
  uint32_t first_pause_ms = 100;
  uint32_t max_pause_ms = 1000;
};
Status PollJob(const JobPoll& poll,
               const std::function<std::optional<Status>(const std::string& reply)>& outcome,
               const std::function<Status()>& timed_out);

// The request options with the timeout cut to what is left before
// `deadline` (at least 1 ms).
AdminClientOptions UntilDeadline(const AdminClientOptions& request,
                                 std::chrono::steady_clock::time_point deadline);

// The credentials of a client of the root's admin port (token, CA,
// client certificate and key) as one request's options; the request's
// timeout stays AdminClientOptions' default for the caller to set.
AdminClientOptions AdminRequestOf(const AgentClientOptions& options);

}  // namespace tern::agent

// The admin jobs' shared answers and the client's poll (agent/daemon/admin_jobs.h).
#include "agent/daemon/admin_jobs.h"

#include <algorithm>
#include <charconv>
#include <thread>
#include <utility>

namespace tern::agent {

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kRunning:
      return "running";
    case JobState::kPublished:
      return "published";
    case JobState::kFailed:
      return "failed";
  }
  return "?";
}

double JobClockS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool NumberParam(const AdminRequest& req, const char* name, uint64_t lo, uint64_t hi,
                 uint64_t fallback, uint64_t* out) {
  auto it = req.params.find(name);
  if (it == req.params.end()) {
    *out = fallback;
    return true;
  }
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= lo && *out <= hi;
}

AdminResponse TextAnswer(int status, std::string line) {
  return AdminResponse{status, "text/plain", std::move(line) + "\n"};
}

AdminResponse JobAnswer(JobState state, const Status& status, uint64_t version,
                        const nlohmann::json& running) {
  if (state == JobState::kRunning)
    return AdminResponse{202, "application/json", running.dump() + "\n"};
  if (state == JobState::kFailed) return TextAnswer(AdminHttpStatusOf(status), status.ToString());
  nlohmann::json out = {{"published", version}};
  return AdminResponse{200, "application/json", out.dump() + "\n"};
}

void AddJobOutcome(nlohmann::json& o, JobState state, const Status& status, double started_s,
                   double finished_s) {
  o["state"] = JobStateName(state);
  o["seconds"] = (state == JobState::kRunning ? JobClockS() : finished_s) - started_s;
  if (state == JobState::kFailed) {
    o["code"] = static_cast<unsigned>(status.code());
    o["error"] = status.message();
  }
}

std::optional<Status> JobOutcomeOf(const nlohmann::json& job, const char* fallback) {
  const std::string state = job.is_object() && job.contains("state") && job["state"].is_string()
                                ? job["state"].get<std::string>()
                                : std::string();
  if (state == "published") return Status::Ok();
  if (state != "failed") return std::nullopt;
  // A code this build does not know reads as kInternal, the reason kept.
  const unsigned code =
      job.contains("code") && job["code"].is_number_unsigned() ? job["code"].get<unsigned>() : 0u;
  const Code c = code > 0 && code <= static_cast<unsigned>(Code::kAuth) ? static_cast<Code>(code)
                                                                        : Code::kInternal;
  const std::string error = job.contains("error") && job["error"].is_string()
                                ? job["error"].get<std::string>()
                                : std::string(fallback);
  return Status(c, error);
}

namespace {

// Milliseconds from now until `deadline` (negative once past).
int64_t MsUntil(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                               std::chrono::steady_clock::now())
      .count();
}

}  // namespace

AdminClientOptions UntilDeadline(const AdminClientOptions& request,
                                 std::chrono::steady_clock::time_point deadline) {
  const int64_t left = MsUntil(deadline);
  AdminClientOptions o = request;
  o.timeout_ms =
      static_cast<uint32_t>(std::clamp<int64_t>(left, 1, std::max<int64_t>(request.timeout_ms, 1)));
  return o;
}

Status PollJob(const JobPoll& poll,
               const std::function<std::optional<Status>(const std::string& reply)>& outcome,
               const std::function<Status()>& timed_out) {
  uint32_t pause_ms = poll.first_pause_ms;
  for (;;) {
    const int64_t left = MsUntil(poll.deadline);
    if (left <= 0) return timed_out();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(pause_ms, left)));
    pause_ms = std::min(pause_ms * 2, poll.max_pause_ms);
    auto state =
        AdminGet(poll.admin_address, poll.path, UntilDeadline(poll.request, poll.deadline));
    // A root busy publishing may answer slowly: keep polling until our deadline.
    if (!state.ok() &&
        (state.status().code() == Code::kTimeout || state.status().code() == Code::kUnavailable))
      continue;
    TERN_RETURN_IF_ERROR(state.status());
    if (std::optional<Status> end = outcome(*state)) return *std::move(end);
  }
}

AdminClientOptions AdminRequestOf(const AgentClientOptions& options) {
  AdminClientOptions o;
  o.token = options.token;
  o.ca_pem = options.ca_pem;
  o.cert_pem = options.cert_pem;
  o.key_pem = options.key_pem;
  return o;
}

}  // namespace tern::agent

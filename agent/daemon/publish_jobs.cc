// PublishJobs and PublishAndWait (agent/daemon/publish_jobs.h).
#include "agent/daemon/publish_jobs.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

namespace tern::agent {

PublishJobs::PublishJobs(PublishFn publish) : publish_(std::move(publish)) {}

PublishJobs::~PublishJobs() { Join(); }

void PublishJobs::Join() {
  std::thread t;
  {
    MutexLock lock(mu_);
    closed_ = true;
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

Result<PublishJobs::Job> PublishJobs::Start(const std::string& checkpoint, uint64_t version,
                                            uint32_t wait_ms, bool supersede) {
  MutexLock lock(mu_);
  TERN_REQUIRE(!closed_, kCancelled, "publish: the agent is stopping");
  if (running_) {
    const Job& r = jobs_.back();
    TERN_REQUIRE(r.version == version && r.checkpoint == checkpoint && r.supersede == supersede,
                 kAlreadyExists, "publish: version ", r.version,
                 " is still being published (GET /publish shows "
                 "when it ends); one publish at a time");
  } else {
    // The previous job's thread has finished its work; reap it before the next.
    if (thread_.joinable()) thread_.join();
    jobs_.push_back(
        Job{version, checkpoint, supersede, State::kRunning, Status::Ok(), JobClockS(), 0});
    while (jobs_.size() > kMaxJobs) jobs_.pop_front();
    running_ = true;
    thread_ = std::thread(
        [this, checkpoint, version, supersede] { Run(checkpoint, version, supersede); });
  }
  cv_.WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms),
                [&]() REQUIRES(mu_) { return !running_; });
  // The job is the newest entry with this version (it cannot have been
  // pushed out: a newer job needs this one to end and the caller to ask).
  for (auto it = jobs_.rbegin(); it != jobs_.rend(); ++it)
    if (it->version == version && it->checkpoint == checkpoint && it->supersede == supersede)
      return *it;
  return TERN_ERROR(kInternal, "publish: job for version ", version, " lost");
}

void PublishJobs::Run(std::string checkpoint, uint64_t version, bool supersede) {
  Status s = publish_(checkpoint, version, supersede);
  MutexLock lock(mu_);
  Job& j = jobs_.back();
  j.state = s.ok() ? State::kPublished : State::kFailed;
  j.status = std::move(s);
  j.finished_s = JobClockS();
  running_ = false;
  cv_.SignalAll();
}

std::vector<PublishJobs::Job> PublishJobs::Recent() const {
  MutexLock lock(mu_);
  return {jobs_.begin(), jobs_.end()};
}

std::vector<AdminRoute> PublishJobs::Routes(uint32_t wait_ms, AdmitFn admit) {
  std::vector<AdminRoute> routes;
  routes.push_back(
      {"POST", "/publish",
       [this, wait_ms, admit = std::move(admit)](const AdminRequest& req) {
         nlohmann::json j = nlohmann::json::parse(req.body, nullptr, false);
         if (!j.is_object() || !j.contains("checkpoint") || !j["checkpoint"].is_string() ||
             !j.contains("version") || !j["version"].is_number_unsigned())
           return TextAnswer(400,
                             "expected {\"checkpoint\": PATH, \"version\": N[, \"force\": true]"
                             "[, \"supersede\": true]}");
         for (const char* flag : {"force", "supersede"})
           if (j.contains(flag) && !j[flag].is_boolean())
             return TextAnswer(400, std::string("\"") + flag + "\" must be true or false");
         const uint64_t version = j["version"].get<uint64_t>();
         std::string checkpoint = j["checkpoint"].get<std::string>();
         PublishFlags flags;
         flags.force = j.value("force", false);
         flags.supersede = j.value("supersede", false);
         if (admit) {
           auto admitted = admit(checkpoint, version, flags);
           if (!admitted.ok())
             return TextAnswer(AdminHttpStatusOf(admitted.status()), admitted.status().ToString());
           checkpoint = std::move(*admitted);
         }
         auto job = Start(checkpoint, version, wait_ms, flags.supersede);
         if (!job.ok())
           return TextAnswer(job.status().code() == Code::kAlreadyExists ? 409 : 503,
                             job.status().ToString());
         return JobAnswer(job->state, job->status, version,
                          {{"publishing", version}, {"state", "running"}});
       },
       /*mutating=*/true});
  routes.push_back(
      {"GET", "/publish", [this](const AdminRequest&) {
         nlohmann::json jobs = nlohmann::json::array();
         for (const Job& job : Recent()) {
           nlohmann::json o = {{"version", job.version}, {"checkpoint", job.checkpoint}};
           AddJobOutcome(o, job.state, job.status, job.started_s, job.finished_s);
           if (job.supersede) o["supersede"] = true;
           jobs.push_back(std::move(o));
         }
         nlohmann::json out = {{"jobs", std::move(jobs)}};
         return AdminResponse{200, "application/json", out.dump() + "\n"};
       }});
  return routes;
}

Status PublishAndWait(const std::string& admin_address, const std::string& checkpoint,
                      uint64_t version, const PublishFlags& flags,
                      const AdminClientOptions& request, uint32_t timeout_ms) {
  JobPoll poll{admin_address, "/publish", request,
               std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms)};
  nlohmann::json body = {{"checkpoint", checkpoint}, {"version", version}};
  if (flags.force) body["force"] = true;
  if (flags.supersede) body["supersede"] = true;
  TERN_ASSIGN_OR_RETURN(std::string reply, AdminPost(admin_address, "/publish", body.dump(),
                                                     UntilDeadline(request, poll.deadline)));
  nlohmann::json r = nlohmann::json::parse(reply, nullptr, false);
  if (r.is_object() && r.contains("published")) return Status::Ok();
  TERN_REQUIRE(r.is_object() && r.contains("publishing"), kProtocol,
               "publish: unexpected answer from the root: ", reply.substr(0, 200));
  // Running: poll, slowly at first, at most every second.
  return PollJob(
      poll,
      [&](const std::string& answer) -> std::optional<Status> {
        nlohmann::json s = nlohmann::json::parse(answer, nullptr, false);
        if (!s.is_object() || !s.contains("jobs") || !s["jobs"].is_array())
          return TERN_ERROR(kProtocol,
                            "publish: unexpected GET /publish answer: ", answer.substr(0, 200));
        // The newest job for this version (the root may have resolved the path).
        const nlohmann::json* mine = nullptr;
        for (const auto& j : s["jobs"])
          if (j.is_object() && j.contains("version") && j["version"].is_number_unsigned() &&
              j["version"].get<uint64_t>() == version)
            mine = &j;
        if (mine == nullptr)
          return TERN_ERROR(kNotFound, "publish: the root no longer knows the job for version ",
                            version,
                            " (did it restart?); `tern status` shows whether it was "
                            "published");
        return JobOutcomeOf(*mine, "publish failed on the root");
      },
      [&] {
        return TERN_ERROR(kTimeout, "publish: version ", version, " is still being published on ",
                          admin_address, " after ", timeout_ms / 1000.0,
                          " s (`tern status` shows when it lands)");
      });
}

}  // namespace tern::agent

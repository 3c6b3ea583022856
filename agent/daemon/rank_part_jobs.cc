// RankPartJobs and SendRankPartAndWait (agent/daemon/rank_part_jobs.h).
#include "agent/daemon/rank_part_jobs.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

#include "base/hash.h"
#include "tern/agent.h"

namespace tern::agent {
RankPartJobs::RankPartJobs(SubmitFn submit) : submit_(std::move(submit)) {}

RankPartJobs::~RankPartJobs() { Join(); }

void RankPartJobs::Join() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    closed_ = true;
    for (auto& [key, e] : jobs_)
      if (e.thread.joinable()) threads.push_back(std::move(e.thread));
    for (auto& t : done_threads_) threads.push_back(std::move(t));
    done_threads_.clear();
  }
  for (auto& t : threads) t.join();
}

void RankPartJobs::ReapLocked() {
  // Finished entries over kMaxKept go, oldest first (their threads are done).
  while (jobs_.size() > kMaxKept) {
    auto oldest = jobs_.end();
    for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
      if (it->second.job.state != State::kRunning &&
          (oldest == jobs_.end() || it->second.seq < oldest->second.seq))
        oldest = it;
    if (oldest == jobs_.end()) break;
    if (oldest->second.thread.joinable()) done_threads_.push_back(std::move(oldest->second.thread));
    jobs_.erase(oldest);
  }
}

Result<RankPartJobs::Job> RankPartJobs::Start(RankPart part, uint64_t part_hash,
                                              uint32_t timeout_ms, uint32_t wait_ms, bool resume) {
  const Key key{part.version, part.rank};
  std::vector<std::thread> reap;
  MutexLock lock(mu_);
  TERN_REQUIRE(!closed_, kCancelled, "publish from ranks: the agent is stopping");
  auto it = jobs_.find(key);
  // The same part again is answered as its job stands (a retry after a lost
  // answer); a failed part, or a committed one of other bytes, is tried anew.
  const bool same = it != jobs_.end() && it->second.job.part_hash == part_hash;
  TERN_REQUIRE(!resume || it == jobs_.end() || same || it->second.job.state != State::kRunning,
               kMismatch, "resume: rank ", key.second, " sent other bytes for version ", key.first,
               " before; nothing taken: wait for the version's outcome, or resume with the same "
               "bytes");
  TERN_REQUIRE(it == jobs_.end() || same || it->second.job.state != State::kRunning, kAlreadyExists,
               "publish from ranks: rank ", key.second, " already sent another part of version ",
               key.first, ", which is being gathered");
  if (it == jobs_.end() || it->second.job.state == State::kFailed || !same) {
    TERN_REQUIRE(running_ < kMaxRunning, kResourceExhausted, "publish from ranks: ", running_,
                 " parts are waiting already (at most ", kMaxRunning, ")");
    if (it != jobs_.end()) {
      if (it->second.thread.joinable()) done_threads_.push_back(std::move(it->second.thread));
      jobs_.erase(it);
    }
    reap.swap(done_threads_);
    Entry& e = jobs_[key];
    e.job = Job{key.first, key.second, State::kRunning, Status::Ok(), part_hash, JobClockS(), 0};
    e.seq = next_seq_++;
    ++running_;
    e.thread =
        std::thread([this, key, seq = e.seq, part = std::move(part), timeout_ms, resume]() mutable {
          Run(key, seq, std::move(part), timeout_ms, resume);
        });
    ReapLocked();
  }
  const uint64_t seq = jobs_[key].seq;
  cv_.WaitUntil(
      std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms), [&]() REQUIRES(mu_) {
        auto j = jobs_.find(key);
        return j == jobs_.end() || j->second.seq != seq || j->second.job.state != State::kRunning;
      });
  auto j = jobs_.find(key);
  TERN_REQUIRE(j != jobs_.end() && j->second.seq == seq, kUnavailable, "publish from ranks: rank ",
               key.second, "'s part of version ", key.first,
               " was replaced by a newer attempt while it was answered");
  Job out = j->second.job;
  lock.Unlock();
  for (auto& t : reap) t.join();  // finished work: returns at once
  return out;
}

void RankPartJobs::Run(Key key, uint64_t seq, RankPart part, uint32_t timeout_ms, bool resume) {
  Status s = submit_(std::move(part), timeout_ms, resume);
  MutexLock lock(mu_);
  --running_;
  auto it = jobs_.find(key);
  if (it != jobs_.end() && it->second.seq == seq) {
    it->second.job.state = s.ok() ? State::kPublished : State::kFailed;
    it->second.job.status = std::move(s);
    it->second.job.finished_s = JobClockS();
  }
  cv_.SignalAll();
}

Result<RankPartJobs::Job> RankPartJobs::Find(uint64_t version, uint32_t rank) const {
  MutexLock lock(mu_);
  auto it = jobs_.find({version, rank});
  TERN_REQUIRE(it != jobs_.end(), kNotFound, "publish from ranks: no part of version ", version,
               " from rank ", rank, " (never sent, or the root restarted)");
  return it->second.job;
}

std::vector<AdminRoute> RankPartJobs::Routes(uint32_t wait_ms) {
  std::vector<AdminRoute> routes;
  routes.push_back(
      {"POST", "/publish/rank-part",
       [this, wait_ms](const AdminRequest& req) {
         uint64_t timeout_ms = 0;
         if (!NumberParam(req, "timeout_ms", 1, 600000, kDefaultRankPartTimeoutMs, &timeout_ms))
           return TextAnswer(400, "timeout_ms must be a whole number of ms from 1 to 600000");
         uint64_t resume = 0;
         if (!NumberParam(req, "resume", 0, 1, 0, &resume))
           return TextAnswer(400, "resume must be 0 or 1");
         auto part = DecodeRankPart(std::span<const uint8_t>(
             reinterpret_cast<const uint8_t*>(req.body.data()), req.body.size()));
         if (!part.ok()) return TextAnswer(400, part.status().ToString());
         auto job = Start(std::move(part).value(), Xxh3(req.body.data(), req.body.size()),
                          static_cast<uint32_t>(timeout_ms), wait_ms, resume == 1);
         if (!job.ok()) {
           const Code c = job.status().code();
           return TextAnswer(c == Code::kAlreadyExists || c == Code::kMismatch ? 409 : 503,
                             job.status().ToString());
         }
         return JobAnswer(
             job->state, job->status, job->version,
             {{"publishing", job->version}, {"rank", job->rank}, {"state", "running"}});
       },
       /*mutating=*/true, /*private_read=*/false, kMaxRankPartRouteBytes});
  routes.push_back({"GET", "/publish/rank-part",
                    [this](const AdminRequest& req) {
                      uint64_t version = 0, rank = 0;
                      if (!NumberParam(req, "version", 1, UINT64_MAX, 0, &version) ||
                          !NumberParam(req, "rank", 0, UINT32_MAX, UINT64_MAX, &rank) ||
                          version == 0 || rank == UINT64_MAX)
                        return TextAnswer(400, "want ?version=V&rank=R");
                      auto job = Find(version, static_cast<uint32_t>(rank));
                      if (!job.ok()) return TextAnswer(404, job.status().ToString());
                      nlohmann::json o = {{"version", job->version}, {"rank", job->rank}};
                      AddJobOutcome(o, job->state, job->status, job->started_s, job->finished_s);
                      return AdminResponse{200, "application/json", o.dump() + "\n"};
                    },
                    /*mutating=*/false, /*private_read=*/true});
  return routes;
}

Status SendRankPartAndWait(const std::string& admin_address, const std::vector<uint8_t>& part,
                           uint64_t version, uint32_t rank, uint32_t gather_timeout_ms,
                           const AdminClientOptions& request, uint32_t timeout_ms, bool resume) {
  JobPoll poll{
      admin_address,
      "/publish/rank-part?version=" + std::to_string(version) + "&rank=" + std::to_string(rank),
      request,
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms),
      /*first_pause_ms=*/50,
      /*max_pause_ms=*/500};
  AdminClientOptions o = UntilDeadline(request, poll.deadline);
  o.content_type = "application/octet-stream";
  const std::string_view body(reinterpret_cast<const char*>(part.data()), part.size());
  auto posted = AdminPost(admin_address,
                          "/publish/rank-part?timeout_ms=" + std::to_string(gather_timeout_ms) +
                              (resume ? "&resume=1" : ""),
                          body, o);
  // The root's 409 (AdminPost's kInvalidArgument) to a resumed part is its
  // refusal of the resume: the version is not open, or another part of the
  // rank is there; its message says what to do.
  if (resume && posted.status().code() == Code::kInvalidArgument &&
      posted.status().message().find(": 409") != std::string::npos)
    return Status(Code::kMismatch, posted.status().message());
  TERN_ASSIGN_OR_RETURN(std::string reply, std::move(posted));
  nlohmann::json r = nlohmann::json::parse(reply, nullptr, false);
  if (r.is_object() && r.contains("published")) return Status::Ok();
  TERN_REQUIRE(r.is_object() && r.contains("publishing"), kProtocol,
               "publish from ranks: unexpected answer from the root: ", reply.substr(0, 200));
  return PollJob(
      poll,
      [](const std::string& answer) -> std::optional<Status> {
        nlohmann::json s = nlohmann::json::parse(answer, nullptr, false);
        if (!s.is_object() || !s.contains("state") || !s["state"].is_string())
          return TERN_ERROR(kProtocol,
                            "publish from ranks: unexpected GET answer: ", answer.substr(0, 200));
        return JobOutcomeOf(s, "publish from ranks failed on the root");
      },
      [&] {
        return TERN_ERROR(kTimeout, "publish from ranks: version ", version,
                          " is still being gathered or published on ", admin_address, " after ",
                          timeout_ms / 1000.0, " s");
      });
}

}  // namespace tern::agent

namespace tern {

Status SendRankPart(const std::string& admin_address, const std::vector<uint8_t>& part,
                    uint64_t version, uint32_t rank, uint32_t gather_timeout_ms,
                    const AgentClientOptions& options) {
  return agent::SendRankPartAndWait(admin_address, part, version, rank, gather_timeout_ms,
                                    agent::AdminRequestOf(options), options.timeout_ms);
}

Status ResumeRankPart(const std::string& admin_address, const std::vector<uint8_t>& part,
                      uint64_t version, uint32_t rank, uint32_t gather_timeout_ms,
                      const AgentClientOptions& options) {
  return agent::SendRankPartAndWait(admin_address, part, version, rank, gather_timeout_ms,
                                    agent::AdminRequestOf(options), options.timeout_ms,
                                    /*resume=*/true);
}

}  // namespace tern

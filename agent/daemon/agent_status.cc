// What the agent tells operators: the snapshot, /status JSON, /metrics, and
// the admin routes (agent/daemon/agent_impl.h; docs/agent/operations.md).
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "agent/daemon/admin_jobs.h"
#include "agent/daemon/agent_impl.h"
#include "agent/daemon/engine_driver.h"
#include "agent/daemon/event_json.h"
#include "agent/daemon/publish_jobs.h"
#include "agent/daemon/rank_part_jobs.h"
#include "agent/daemon/serve_hook.h"
#include "agent/ops/admin_http.h"
#include "agent/ops/metrics.h"
#include "base/text.h"

namespace tern::agent {

std::string AgentImpl::PublicKeyPem() const {
  const auto signer = Signer();
  if (!signer) return {};
  auto pem = signer->PublicKeyPem();
  return pem.ok() ? *pem : std::string();
}

AgentSnapshot AgentImpl::Snapshot() const {
  AgentSnapshot s;
  s.root = opt_.root;
  s.id = id_;
  s.listen_address = listen_address_;
  s.intra_address = intra_address_;
  s.admin_address = admin_address_;
  if (engine_) {  // set in Init before any reader runs, reset in Stop after
    s.has_engine = true;
    s.engine = engine_->status();
  }
  {
    const LockWatch::Stats holds = lock_watch_.Read();
    s.lock.slow_holds = holds.slow_holds;
    s.lock.longest_s = holds.longest.held_us / 1e6;
    s.lock.longest_cpu_s = holds.longest.cpu_us / 1e6;
    s.lock.longest_at = holds.longest.site;
  }
  MutexLock lock(mu_);
  s.relay_only = opt_.relay_only;
  s.served_version = store_version_;  // 0 without a store (relay-only)
  s.served_digest = store_digest_;
  s.held_version = VersionLocked();
  s.served_epoch = ServedEpochLocked();
  if (opt_.root) {
    s.head = board_ ? board_->head() : 0;
    s.head_epoch = board_ ? board_->head_pos().epoch : 0;
    s.joined = true;
    const uint64_t now_us = clock_.NowUs();
    for (const auto& [id, rec] : membership_->members()) {
      AgentMemberStatus m;
      m.id = id;
      m.region = rec.info.region;
      m.cluster = rec.info.cluster;
      m.island = rec.info.island;
      const auto& parents = membership_->plan().parent;
      if (!parents.empty()) {
        auto p = parents[0].find(id);
        if (p != parents[0].end()) m.parent = p->second;
      }
      m.depth = membership_->DepthOf(id);
      m.served_version = rec.served_version;  // relay-only: the version it holds
      m.relay_only = rec.info.relay_only;
      m.lag = s.head > rec.served_version ? s.head - rec.served_version : 0;
      m.bytes_in = rec.last.bytes_in;
      m.bytes_out = rec.last.bytes_out;
      m.chunk_retries = rec.last.chunk_retries;
      m.rtt_to_parent_s = rec.last.rtt_to_parent_s;
      m.rtt_to_root_s = rec.last.rtt_to_root_s;
      m.measured_uplink_bytes_per_s = rec.measured_uplink_bytes_per_s;
      m.demoted = rec.demoted;
      m.draining = rec.draining;
      const RelayProbation& p = rec.probation;
      if (p.demotions_total > 0) m.demoted_for = ParentFaultName(p.last_fault);
      m.demotions = p.demotions_total;
      m.strikes = p.strikes;
      if (rec.demoted && p.relay_again_us != 0)
        m.relay_again_in_s =
            static_cast<double>(p.relay_again_us - std::min(p.relay_again_us, now_us)) * 1e-6;
      m.rate_in_bytes_per_s = rec.last.rate_in_bytes_per_s;
      m.last_apply_s = rec.last.last_apply_s;
      m.last_heartbeat_age_s = static_cast<double>(now_us - std::min(now_us, rec.last_seen_us)) * 1e-6;
      s.members.push_back(std::move(m));
    }
    for (const auto& [v, vs] : versions_) s.versions.push_back(vs);
  } else {
    s.head = known_head_;
    s.head_epoch = known_head_epoch_;
    s.joined = joined_;
    if (!parents_.parents.empty()) s.parent = parents_.parents[0].id;
  }
  FreshnessSnapshotLocked(s);
  return s;
}

namespace {

nlohmann::json PublishSpansJson(const AgentPublishSpans& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const PublishSpanField& f : kPublishSpanFields) j[std::string(f.name) + "_s"] = p.*f.seconds;
  return j;
}

nlohmann::json ToJson(const AgentSnapshot& s) {
  nlohmann::json j;
  j["role"] = s.root ? "root" : s.relay_only ? "relay-only" : "member";
  j["id"] = s.id;
  j["listen"] = s.listen_address;
  if (!s.intra_address.empty()) j["listen_intra"] = s.intra_address;
  j["head"] = s.head;
  j["served_version"] = s.served_version;
  j["head_epoch"] = s.head_epoch;
  j["served_epoch"] = s.served_epoch;
  if (s.relay_only) j["held_version"] = s.held_version;
  j["joined"] = s.joined;
  if (!s.root) j["parent"] = s.parent;
  const AgentFreshness& f = s.freshness;
  if (s.root) {
    j["freshness"] = {{"incarnation", f.incarnation},
                      {"beacon_seq", f.seq},
                      {"beacons_sent", f.beacons_sent}};
  } else {
    j["freshness"] = {{"stale", f.stale},
                      {"stale_reason", f.stale_reason},
                      {"last_beacon_age_s", f.last_beacon_age_s},
                      {"beacon_head", f.beacon_head},
                      {"lag_versions", f.lag_versions},
                      {"incarnation", f.incarnation},
                      {"beacon_seq", f.seq},
                      {"root_id", f.root_id},
                      {"clock_skew_ms", f.clock_skew_ms},
                      {"clock_skew_exceeded", f.clock_skew_exceeded},
                      {"beacons",
                       {{"accepted", f.beacons_accepted},
                        {"malformed", f.beacons_malformed},
                        {"forged", f.beacons_forged},
                        {"untrusted", f.beacons_untrusted},
                        {"foreign", f.beacons_foreign},
                        {"replayed", f.beacons_replayed},
                        {"skewed", f.beacons_skewed}}}};
  }
  j["lock"] = {{"slow_holds", s.lock.slow_holds},
               {"slow_ms", kSlowAgentLockHoldMs},
               {"longest_s", s.lock.longest_s},
               {"longest_cpu_s", s.lock.longest_cpu_s},
               {"longest_at", s.lock.longest_at}};
  if (s.has_engine) {
    const AgentEngineStatus& e = s.engine;
    j["engine"] = {{"engine", e.engine},
                   {"version", e.version},
                   {"epoch", e.epoch},
                   {"target_version", e.target_version},
                   {"target_epoch", e.target_epoch},
                   {"state", e.state},
                   {"last_error", e.last_error},
                   {"updates_ok", e.updates_ok},
                   {"updates_failed", e.updates_failed},
                   {"last_pause_ms", e.last_pause_ms},
                   {"last_update_ms", e.last_update_ms},
                   {"last_full", e.last_full}};
  }
  auto& members = j["members"] = nlohmann::json::array();
  for (const auto& m : s.members) {
    members.push_back({{"id", m.id},
                       {"region", m.region},
                       {"cluster", m.cluster},
                       {"island", m.island},
                       {"role", m.relay_only ? "relay-only" : "serving"},
                       {"parent", m.parent},
                       {"depth", m.depth},
                       {"version", m.served_version},
                       {"lag", m.lag},
                       {"bytes_in", m.bytes_in},
                       {"bytes_out", m.bytes_out},
                       {"chunk_retries", m.chunk_retries},
                       {"rtt_to_parent_s", m.rtt_to_parent_s},
                       {"rtt_to_root_s", m.rtt_to_root_s},
                       {"rate_in_bytes_per_s", m.rate_in_bytes_per_s},
                       {"measured_uplink_bytes_per_s", m.measured_uplink_bytes_per_s},
                       {"demoted", m.demoted},
                       {"draining", m.draining},
                       {"demoted_for", m.demoted_for},
                       {"demotions", m.demotions},
                       {"strikes", m.strikes},
                       {"relay_again_in_s", m.relay_again_in_s},
                       {"last_apply_s", m.last_apply_s},
                       {"heartbeat_age_s", m.last_heartbeat_age_s}});
  }
  auto& versions = j["versions"] = nlohmann::json::array();
  for (const auto& v : s.versions) {
    versions.push_back({{"version", v.version},
                        {"patch_bytes", v.patch_bytes},
                        {"keyframe_bytes", v.keyframe_bytes},
                        {"view_bytes", v.view_bytes},
                        {"first_served_s", v.first_served_s},
                        {"last_served_s", v.last_served_s},
                        {"patch_format", v.patch_format},
                        {"format_reason", v.format_reason},
                        {"predicted_f1_s", v.predicted_f1_s},
                        {"predicted_f2_s", v.predicted_f2_s},
                        {"publish", PublishSpansJson(v.publish)}});
  }
  return j;
}

}  // namespace

std::string AgentImpl::StatusJson() const { return AgentSnapshotJson(Snapshot()); }

// Built fresh on every scrape from the snapshot and the relay's link
// figures: totals come from the members' own counters (heartbeats), so
// nothing here accumulates, and a departed member's series simply vanish.
std::string AgentImpl::MetricsText() const {
  const AgentSnapshot s = Snapshot();
  MetricsRegistry r;
  auto gauge = [&](const char* name, const char* help, double v, const Labels& labels = {}) {
    if (auto g = r.GetGauge(name, help, labels); g.ok()) (*g)->Set(v);
  };
  auto counter = [&](const char* name, const char* help, uint64_t v, const Labels& labels = {}) {
    if (auto c = r.GetCounter(name, help, labels); c.ok()) (*c)->Add(v);
  };
  gauge("tern_agent_head_version", "Newest version this agent knows (root: HEAD).", static_cast<double>(s.head));
  gauge("tern_agent_served_version", "Version DIR/current serves (0: none, e.g. relay-only).",
        static_cast<double>(s.served_version));
  if (s.relay_only)
    gauge("tern_agent_held_version", "Relay-only: the newest version held completely.",
          static_cast<double>(s.held_version));
  counter("tern_agent_lock_slow_holds_total",
          "Holds of the agent's lock of 100 ms or more (each logged with where it was taken).",
          s.lock.slow_holds);
  gauge("tern_agent_lock_longest_hold_seconds", "The longest hold of the agent's lock so far.",
        s.lock.longest_s);
  if (s.has_engine) {
    const AgentEngineStatus& e = s.engine;
    gauge("tern_agent_engine_version", "Version the engine beside this member says it serves.",
          static_cast<double>(e.version));
    gauge("tern_agent_engine_lag_versions", "Served version minus the engine's (0 when not behind).",
          s.served_version > e.version ? static_cast<double>(s.served_version - e.version) : 0.0);
    // By position (epoch, version): after a supersede the engine may be on a
    // withdrawn number above the served one, which the lag shows as 0.
    gauge("tern_agent_engine_behind",
          "1 while the engine's (epoch, version) is before the served one's, else 0.",
          std::pair{e.epoch, e.version} < std::pair{s.served_epoch, s.served_version} ? 1.0 : 0.0);
    counter("tern_agent_engine_updates_total", "Engine updates by outcome.", e.updates_ok,
            {{"result", "ok"}});
    counter("tern_agent_engine_updates_total", "Engine updates by outcome.", e.updates_failed,
            {{"result", "failed"}});
    if (e.last_pause_ms >= 0)
      gauge("tern_agent_engine_pause_seconds", "The last update's pause -> resume in the engine.",
            static_cast<double>(e.last_pause_ms) * 1e-3);
  }
  const AgentFreshness& f = s.freshness;
  if (s.root) {
    counter("tern_agent_beacons_sent_total", "Signed HEAD beacons sent (one per member per interval).",
            f.beacons_sent);
  } else {
    gauge("tern_agent_stale",
          "1 when this member cannot show it is fresh: no valid HEAD beacon within stale-after, "
          "or the signed HEAD past the lag bound.",
          f.stale ? 1 : 0);
    gauge("tern_agent_beacon_age_seconds", "Age of the last accepted HEAD beacon (-1: none).",
          f.last_beacon_age_s);
    gauge("tern_agent_beacon_head_version", "HEAD named by the last accepted beacon.",
          static_cast<double>(f.beacon_head));
    gauge("tern_agent_beacon_lag_versions", "Beacon HEAD minus the version this member serves.",
          static_cast<double>(f.lag_versions));
    gauge("tern_agent_beacon_clock_skew_seconds",
          "Root wall time minus ours at the last validly signed beacon.",
          static_cast<double>(f.clock_skew_ms) * 1e-3);
    const std::pair<const char*, uint64_t> verdicts[] = {
        {"accepted", f.beacons_accepted}, {"malformed", f.beacons_malformed},
        {"forged", f.beacons_forged},     {"untrusted", f.beacons_untrusted},
        {"foreign", f.beacons_foreign},   {"replayed", f.beacons_replayed},
        {"skewed", f.beacons_skewed}};
    for (const auto& [verdict, n] : verdicts)
      counter("tern_agent_beacons_total", "HEAD beacons received, by verdict.", n,
              {{"verdict", verdict}});
  }
  counter("tern_agent_events_total", "Events this agent recorded (GET /events).", events_->last_seq());
  if (serve_hook_) {
    const ServeHookCounts& h = serve_hook_->counts();
    const char* help = "Runs of the --on-serve hook by how they ended.";
    counter("tern_agent_serve_hook_runs_total", help, h.ok.load(), {{"result", "ok"}});
    counter("tern_agent_serve_hook_runs_total", help, h.failed.load(), {{"result", "failed"}});
    counter("tern_agent_serve_hook_runs_total", help, h.killed.load(), {{"result", "killed"}});
    counter("tern_agent_serve_hook_coalesced_total",
            "Served versions the hook did not run for: a newer one came meanwhile.",
            h.coalesced.load());
  }
  if (s.root) {
    gauge("tern_agent_members", "Members joined to this root.", static_cast<double>(s.members.size()));
    for (const auto& m : s.members) {
      const Labels l = {{"member", m.id}, {"region", m.region}};
      gauge("tern_agent_member_version",
            "Version a member serves (relay-only: the newest it holds), from its heartbeat.",
            static_cast<double>(m.served_version), l);
      gauge("tern_agent_member_lag_versions", "HEAD minus tern_agent_member_version.",
            static_cast<double>(m.lag), l);
      gauge("tern_agent_member_relay_only", "1 for a member that relays and serves nothing.",
            m.relay_only ? 1 : 0, l);
      counter("tern_agent_member_bytes_in_total", "Bytes a member received (its own count).", m.bytes_in, l);
      counter("tern_agent_member_bytes_out_total", "Bytes a member forwarded to its children.", m.bytes_out, l);
      counter("tern_agent_member_chunk_retries_total", "Chunks a member had to receive or send again.",
              m.chunk_retries, l);
      gauge("tern_agent_member_apply_seconds", "Duration of a member's last apply.", m.last_apply_s, l);
      gauge("tern_agent_member_rtt_to_parent_seconds",
            "Round trip from a member to its parent (the slowest of its parents; 0: not measured).",
            m.rtt_to_parent_s, l);
      gauge("tern_agent_member_rtt_to_root_seconds",
            "Round trip from a member to the root (0: not measured).", m.rtt_to_root_s, l);
      gauge("tern_agent_member_rate_in_bytes_per_second",
            "Rate a member received its last object at from its parent.", m.rate_in_bytes_per_s, l);
      gauge("tern_agent_member_demoted",
            "1 when the root plans around a member its children reported bad.", m.demoted ? 1 : 0,
            l);
      counter("tern_agent_member_demotions_total",
              "Times a member was demoted to a leaf for its children's reports, since it joined.",
              m.demotions, l);
      if (m.demoted)
        gauge("tern_agent_member_probation_seconds",
              "Seconds until a demoted member may relay again (-1: never, until it joins again).",
              m.relay_again_in_s, l);
    }
    // The newest publish's stages (docs/agent/board.md §4, "The root's
    // publish, in order").
    if (!s.versions.empty()) {
      const nlohmann::json spans = PublishSpansJson(s.versions.back().publish);
      for (const auto& [stage, seconds] : spans.items())
        gauge("tern_agent_publish_stage_seconds",
              "Where the newest publish spent its time, by stage (offered_s: the call to the "
              "version offered and announced to the tree; total_s: to the publish returning).",
              seconds.get<double>(), {{"stage", stage}});
    }
    // The newest versions only: the label set stays bounded.
    const size_t first = s.versions.size() > 16 ? s.versions.size() - 16 : 0;
    for (size_t i = first; i < s.versions.size(); ++i) {
      const auto& v = s.versions[i];
      const Labels l = {{"version", std::to_string(v.version)}};
      gauge("tern_agent_version_patch_bytes", "Bytes of a version's patch.", static_cast<double>(v.patch_bytes), l);
      if (v.patch_format != 0)
        gauge("tern_agent_version_patch_format", "The patch format a version was published in (1 or 2).",
              v.patch_format, l);
      for (const auto& [f, p] : {std::pair{"1", v.predicted_f1_s}, std::pair{"2", v.predicted_f2_s}})
        if (p >= 0)
          gauge("tern_agent_version_predicted_serve_seconds",
                "Publish to the last member serving, as the format choice predicted it.", p,
                {{"version", std::to_string(v.version)}, {"format", f}});
      if (v.first_served_s >= 0)
        gauge("tern_agent_version_first_served_seconds", "Publish to the first member serving it.",
              v.first_served_s, l);
      if (v.last_served_s >= 0)
        gauge("tern_agent_version_last_served_seconds", "Publish to every member serving it.",
              v.last_served_s, l);
    }
  }
  RelayNode* relay = RelayNow();
  if (relay) {
    for (const auto& l : relay->Stats()) {
      const Labels labels = {{"peer", l.peer}, {"role", l.parent ? "parent" : "child"},
                             {"stripe", std::to_string(l.stripe)}};
      counter("tern_agent_link_bytes_in_total", "Bytes received on a link.", l.bytes_in, labels);
      counter("tern_agent_link_bytes_out_total", "Bytes sent on a link.", l.bytes_out, labels);
      counter("tern_agent_link_retries_total", "Chunks resent on a link.", l.retries, labels);
      counter("tern_agent_link_bad_chunks_total", "Chunks that failed SHA-256 on a link.", l.bad_chunks, labels);
    }
  }
  return r.Render();
}

// A POST /publish from the admin port (docs/security.md, "The admin port"):
// the path confined to publish_dir, the version within max_version_jump of
// HEAD unless forced. Returns the path to read: the resolved one, so that a
// link swapped after this check cannot lead outside.
Result<std::string> AgentImpl::AdmitAdminPublish(const std::string& checkpoint, uint64_t version,
                                                 const PublishFlags& flags) const {
  std::string path = checkpoint;
  if (!opt_.publish_dir.empty()) {
    char dir[PATH_MAX], real[PATH_MAX];
    TERN_REQUIRE(::realpath(opt_.publish_dir.c_str(), dir) != nullptr, kNotFound,
                 "publish: the publish directory ", opt_.publish_dir, " is not there");
    TERN_REQUIRE(::realpath(checkpoint.c_str(), real) != nullptr, kNotFound,
                 "publish: ", checkpoint, ": ", std::strerror(errno));
    const std::string d = std::string(dir) == "/" ? "/" : std::string(dir) + "/";
    TERN_REQUIRE(std::string(real).rfind(d, 0) == 0, kAuth, "publish: ", checkpoint,
                 " is outside the publish directory ", opt_.publish_dir);
    path = real;
  }
  // A supersede goes down, bounded by its own rules (docs/agent/board.md
  // §4a), checked again under the publisher's lock when it runs.
  if (flags.supersede) {
    TERN_REQUIRE(board_, kUnavailable, "supersede: the board is not open");
    TERN_RETURN_IF_ERROR(AdmitSupersede(version));
    return path;
  }
  const bool force = flags.force;
  const uint64_t head = board_ ? board_->head() : 0;
  TERN_REQUIRE(force || opt_.max_version_jump == 0 || version <= head ||
                   version - head <= opt_.max_version_jump,
               kOutOfRange, "publish: version ", version, " is ", version - head, " beyond HEAD ",
               head, " (the bound is ", opt_.max_version_jump,
               "; versions only increase, so say \"force\": true if you mean it)");
  return path;
}

Status AgentImpl::StartAdmin() {
  if (opt_.admin_listen.empty()) {
    TERN_REQUIRE(opt_.admin_tls_cert_pem.empty() && opt_.admin_tls_key_pem.empty() &&
                     opt_.admin_tls_client_ca_pem.empty(),
                 kInvalidArgument,
                 "admin: a TLS certificate, key or client CA is given but no admin address");
    return Status::Ok();
  }
  std::vector<AdminRoute> routes;
  routes.push_back(MetricsRoute([this] { return MetricsText(); }));
  routes.push_back({"GET", "/status", [this](const AdminRequest&) {
                      return AdminResponse{200, "application/json", StatusJson()};
                    }});
  routes.push_back(EventsRoute());
  if (opt_.root) {
    publish_jobs_ =
        std::make_unique<PublishJobs>(
            [this](const std::string& checkpoint, uint64_t version, bool supersede) {
              return supersede ? Supersede(checkpoint, version) : Publish(checkpoint, version);
            });
    // Half the admin deadline: a publish that ends within it answers at
    // once; a longer one answers 202 and the client polls GET /publish.
    for (AdminRoute& r :
         publish_jobs_->Routes(AdminOptions{}.request_timeout_ms / 2,
                               [this](const std::string& checkpoint, uint64_t version,
                                      const PublishFlags& flags) {
                                 return AdmitAdminPublish(checkpoint, version, flags);
                               }))
      routes.push_back(std::move(r));
    for (AdminRoute& r : OperatorRoutes()) routes.push_back(std::move(r));
    for (AdminRoute& r : KeyRoutes()) routes.push_back(std::move(r));
    rank_part_jobs_ =
        std::make_unique<RankPartJobs>([this](RankPart part, uint32_t timeout_ms, bool resume) {
          return GatherRankPart(std::move(part), timeout_ms, resume);
        });
    for (AdminRoute& r : rank_part_jobs_->Routes(AdminOptions{}.request_timeout_ms / 2))
      routes.push_back(std::move(r));
    routes.push_back(ViewRowsRoute());
  }
  // Secure by default: mutating routes are never open to the network
  // without a token, nor is the token sent over it in clear.
  const bool mutating =
      std::any_of(routes.begin(), routes.end(), [](const AdminRoute& r) { return r.mutating; });
  const bool tls = !opt_.admin_tls_cert_pem.empty();
  if (mutating && !opt_.admin_insecure && (opt_.admin_token.empty() || !tls)) {
    TERN_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(opt_.admin_listen));
    TERN_REQUIRE(IsLoopbackHost(hp.host) || !opt_.admin_token.empty(), kInvalidArgument, "admin: ",
                 opt_.admin_listen,
                 " is not a loopback address and no admin token is set, so anyone who reaches it "
                 "could publish: set an admin token (--admin-token-file) and TLS "
                 "(--admin-tls-cert, --admin-tls-key), bind the admin port to 127.0.0.1, or say "
                 "--admin-insecure");
    TERN_REQUIRE(IsLoopbackHost(hp.host) || tls, kInvalidArgument, "admin: ", opt_.admin_listen,
                 " is not a loopback address and the admin port has no TLS, so the admin token "
                 "would cross the network in clear: give --admin-tls-cert and --admin-tls-key, "
                 "bind the admin port to 127.0.0.1, or say --admin-insecure");
  }
  AdminOptions ao;
  ao.address = opt_.admin_listen;
  ao.token = opt_.admin_token;
  ao.tls_cert_pem = opt_.admin_tls_cert_pem;
  ao.tls_client_ca_pem = opt_.admin_tls_client_ca_pem;
  ao.tls_key_pem = opt_.admin_tls_key_pem;
  ao.log = log_;
  TERN_ASSIGN_OR_RETURN(admin_, AdminServer::Start(ao, std::move(routes)));
  // With TLS the address says so: it is what clients dial.
  admin_address_ = (tls ? "https://" : "") + admin_->address();
  return Status::Ok();
}

}  // namespace tern::agent

namespace tern {
namespace {

Result<std::string> Get(const std::string& admin_address, std::string_view path,
                        const AgentClientOptions& options) {
  agent::AdminClientOptions o = agent::AdminRequestOf(options);
  o.timeout_ms = options.timeout_ms;
  return agent::AdminGet(admin_address, path, o);
}

}  // namespace

Status PublishToRoot(const std::string& admin_address, const std::string& checkpoint_path,
                     uint64_t version, const AgentClientOptions& options) {
  agent::PublishFlags flags;
  flags.force = options.force;
  flags.supersede = options.supersede;
  return agent::PublishAndWait(admin_address, checkpoint_path, version, flags,
                               agent::AdminRequestOf(options), options.timeout_ms);
}

Result<std::string> AgentStatusJson(const std::string& admin_address, const AgentClientOptions& options) {
  return Get(admin_address, "/status", options);
}

Result<std::string> AgentMetricsText(const std::string& admin_address, const AgentClientOptions& options) {
  return Get(admin_address, "/metrics", options);
}

Result<std::string> AgentPublishJobsJson(const std::string& admin_address,
                                         const AgentClientOptions& options) {
  return Get(admin_address, "/publish", options);
}

Result<std::string> AgentEventsJson(const std::string& admin_address, uint64_t after_seq,
                                    uint32_t max_events, uint32_t timeout_ms,
                                    const AgentClientOptions& options) {
  agent::AdminClientOptions o = agent::AdminRequestOf(options);
  // The long poll runs inside the request: give the reply that long on top
  // (in 64 bits: a client timeout near 2^32 ms must not wrap).
  o.timeout_ms = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{options.timeout_ms} + timeout_ms,
                                                          std::numeric_limits<uint32_t>::max()));
  return agent::AdminGet(admin_address,
                         "/events?after=" + std::to_string(after_seq) + "&max=" +
                             std::to_string(max_events) + "&timeout_ms=" + std::to_string(timeout_ms),
                         o);
}

Result<AgentEventPoll> PollAgentEvents(const std::string& admin_address, uint64_t after_seq,
                                       uint32_t max_events, uint32_t timeout_ms,
                                       const AgentClientOptions& options) {
  TERN_REQUIRE(max_events >= 1 && max_events <= agent::kMaxEventsPerWait, kOutOfRange,
               "events: max_events is ", max_events, ": want 1..", agent::kMaxEventsPerWait);
  TERN_ASSIGN_OR_RETURN(std::string text,
                        AgentEventsJson(admin_address, after_seq, max_events, timeout_ms, options));
  return agent::ParseEventsReply(text, max_events);
}

std::string AgentSnapshotJson(const AgentSnapshot& snapshot) {
  return agent::ToJson(snapshot).dump(2) + "\n";
}

}  // namespace tern

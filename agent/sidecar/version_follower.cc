#include "agent/sidecar/version_follower.h"

#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent/ops/admin_http.h"

namespace tern::agent {

Result<MemberVersions> ParseMemberStatus(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  TERN_REQUIRE(j.is_object(), kCorrupt, "member /status is not a JSON object");
  MemberVersions v;
  for (auto [key, out] : {std::pair{"served_version", &v.served}, std::pair{"head", &v.head}}) {
    auto it = j.find(key);
    TERN_REQUIRE(it != j.end() && it->is_number_unsigned(), kCorrupt, "member /status has no ", key,
                 " (a non-negative integer)");
    *out = it->get<uint64_t>();
  }
  // A member that drives its engine (tern-agent --engine) reports what the
  // engine serves, which lags what the member serves by the engine update:
  // that is the version requests are served on.
  if (auto e = j.find("engine"); e != j.end()) {
    TERN_REQUIRE(e->is_object(), kCorrupt, "member /status engine is not an object");
    auto ev = e->find("version");
    TERN_REQUIRE(ev != e->end() && ev->is_number_unsigned(), kCorrupt,
                 "member /status engine has no version (a non-negative integer)");
    v.served = ev->get<uint64_t>();
    v.engine = true;
  }
  for (auto [key, out] :
       {std::pair{"head_epoch", &v.head_epoch}, std::pair{"served_epoch", &v.served_epoch}}) {
    auto it = j.find(key);
    if (it == j.end()) continue;  // a member from before epochs: epoch 0
    TERN_REQUIRE(it->is_number_unsigned() && it->get<uint64_t>() <= UINT32_MAX, kCorrupt,
                 "member /status ", key, " is not a 32-bit unsigned number");
    *out = it->get<uint32_t>();
  }
  // The engine's version is served in its own epoch (the one the member
  // served it in when the engine loaded it): a withdrawn number the engine
  // still serves is older than HEAD even when it is below HEAD's number.
  if (auto e = j.find("engine"); e != j.end()) {
    if (auto it = e->find("epoch"); it != e->end()) {
      TERN_REQUIRE(it->is_number_unsigned() && it->get<uint64_t>() <= UINT32_MAX, kCorrupt,
                   "member /status engine.epoch is not a 32-bit unsigned number");
      v.served_epoch = it->get<uint32_t>();
    }
  }
  if (auto f = j.find("freshness"); f != j.end()) {
    TERN_REQUIRE(f->is_object(), kCorrupt, "member /status freshness is not an object");
    if (auto s = f->find("stale"); s != f->end()) {
      TERN_REQUIRE(s->is_boolean(), kCorrupt, "member /status freshness.stale is not a boolean");
      v.stale = s->get<bool>();
    }
    if (auto r = f->find("stale_reason"); r != f->end()) {
      TERN_REQUIRE(r->is_string(), kCorrupt,
                   "member /status freshness.stale_reason is not a string");
      v.stale_reason = r->get<std::string>().substr(0, 256);
    }
  }
  return v;
}

Result<uint64_t> ParseVersionFile(std::string_view text) {
  size_t a = text.find_first_not_of(" \t\r\n");
  size_t b = text.find_last_not_of(" \t\r\n");
  TERN_REQUIRE(a != std::string_view::npos, kCorrupt, "version file is empty");
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data() + a, text.data() + b + 1, v);
  TERN_REQUIRE(ec == std::errc() && end == text.data() + b + 1, kCorrupt,
               "version file does not hold one decimal version");
  return v;
}

Result<std::unique_ptr<VersionFollower>> VersionFollower::Start(FollowerOptions options,
                                                                VersionGate& gate) {
  TERN_REQUIRE(options.agent_admin.empty() != options.version_file.empty(), kInvalidArgument,
               "sidecar: follow either the member's admin port or a version file, not ",
               options.agent_admin.empty() ? "neither" : "both");
  TERN_REQUIRE(options.poll_ms >= 1, kInvalidArgument, "sidecar: poll_ms must be > 0");
  if (!options.log) options.log = StderrLog();
  std::unique_ptr<VersionFollower> f(new VersionFollower(std::move(options), gate));
  f->thread_ = std::thread([p = f.get()] { p->Run(); });
  return f;
}

VersionFollower::VersionFollower(FollowerOptions options, VersionGate& gate)
    : options_(std::move(options)), gate_(gate) {}

VersionFollower::~VersionFollower() { Stop(); }

void VersionFollower::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<MemberVersions> VersionFollower::Poll() {
  if (!options_.agent_admin.empty()) {
    AdminClientOptions client;
    client.token = options_.admin_token;
    client.ca_pem = options_.admin_ca_pem;
    client.cert_pem = options_.admin_cert_pem;
    client.key_pem = options_.admin_key_pem;
    client.timeout_ms = std::max<uint32_t>(1000, options_.poll_ms * 5);
    client.max_reply_bytes = 4 << 20;
    TERN_ASSIGN_OR_RETURN(std::string body, AdminGet(options_.agent_admin, "/status", client));
    return ParseMemberStatus(body);
  }
  std::ifstream in(options_.version_file, std::ios::binary);
  TERN_REQUIRE(in, kNotFound, "cannot open version file ", options_.version_file);
  std::string text(64, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  TERN_ASSIGN_OR_RETURN(uint64_t v, ParseVersionFile(text));
  MemberVersions from_file;
  from_file.served = from_file.head = v;
  return from_file;
}

void VersionFollower::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    std::string error;
    const uint64_t commits_seen = gate_.commits();
    auto polled = Poll();
    bool stale = false, superseded = false;
    std::string stale_reason;
    if (!polled.ok()) {
      error = polled.status().ToString();
      stale = !options_.agent_admin.empty();
      stale_reason = "the member's /status could not be read";
    } else {
      stale = polled->stale;
      stale_reason = polled->stale_reason;
      superseded = polled->superseded();
      gate_.SetHead(polled->head, polled->head_epoch);
      if (superseded) {
        // Before the commit: from the moment the gate may admit on the
        // polled number, a withdrawn one must already be flagged. Cleared
        // only after the commit (below), so a withdrawn number still
        // applied is never unflagged either.
        std::lock_guard<std::mutex> early(mu_);
        superseded_early_ = true;
      }
      if (polled->served != 0 && gate_.applied() != polled->served) {
        Status s = gate_.CommitIfUnchanged(polled->served, commits_seen, options_.drain_timeout_ms);
        if (!s.ok()) error = s.ToString();
      }
    }
    lock.lock();
    if (error != last_error_ && !error.empty()) options_.log("sidecar: " + error);
    last_error_ = error;
    if (stale != stale_)
      options_.log(stale ? "sidecar: the member reports itself stale (" + stale_reason + ")"
                         : std::string("sidecar: the member is fresh again"));
    if (superseded != superseded_)
      options_.log(superseded ? "sidecar: the member serves a version a supersede withdrew; "
                                "versioned requests get 409 until it re-bases"
                              : std::string("sidecar: the member serves HEAD's epoch again"));
    stale_ = stale;
    stale_reason_ = stale_reason;
    superseded_ = superseded;
    superseded_early_ = false;
    cv_.wait_for(lock, std::chrono::milliseconds(options_.poll_ms), [&] { return stop_; });
  }
}

std::string VersionFollower::sync_state() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_error_.empty()) return "ERROR";
  }
  if (gate_.committing()) return "COMMITTING";
  auto applied = gate_.applied();
  return applied && gate_.head() > *applied ? "FETCHING" : "IDLE";
}

bool VersionFollower::member_stale(std::string* reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (reason) *reason = stale_reason_;
  return stale_;
}

bool VersionFollower::superseded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return superseded_ || superseded_early_;
}

std::string VersionFollower::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

}  // namespace tern::agent
